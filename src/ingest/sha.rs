//! SHA-256 whose running state can be saved and restored, so a resumed ingest goes on hashing a 50 GB part
//! where it stopped instead of reading it all again. `sha2::Sha256` keeps its state private; this keeps the
//! eight state words, the byte count and the unfinished block in the open and feeds whole blocks to
//! `sha2::compress256` (the same compression function `Sha256` uses), so the digests are the same.

use serde::{Deserialize, Serialize};
use sha2::digest::consts::U64;
use sha2::digest::generic_array::GenericArray;

const H0: [u32; 8] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumableSha256 {
    /// The state words after every whole block hashed so far.
    state: [u32; 8],
    /// Bytes fed in all (whole blocks and the partial one).
    len: u64,
    /// Bytes of the unfinished block (fewer than 64), as lowercase hex in the saved form.
    #[serde(with = "hex_bytes")]
    partial: Vec<u8>,
}

impl Default for ResumableSha256 {
    fn default() -> Self {
        ResumableSha256 { state: H0, len: 0, partial: Vec::with_capacity(64) }
    }
}

fn compress(state: &mut [u32; 8], blocks: &[u8]) {
    debug_assert_eq!(blocks.len() % 64, 0);
    for block in blocks.chunks_exact(64) {
        sha2::compress256(state, std::slice::from_ref(GenericArray::<u8, U64>::from_slice(block)));
    }
}

impl ResumableSha256 {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A saved state is usable only if it is self-consistent (the file could have been edited or be from a
    /// bug): the partial block is shorter than a block and matches the byte count.
    pub fn is_consistent(&self) -> bool {
        self.partial.len() < 64 && self.partial.len() as u64 == self.len % 64
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.partial.is_empty() {
            let take = (64 - self.partial.len()).min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.partial.len() < 64 {
                return;
            }
            let block = std::mem::take(&mut self.partial);
            compress(&mut self.state, &block);
            self.partial = block;
            self.partial.clear();
        }
        let whole = data.len() / 64 * 64;
        compress(&mut self.state, &data[..whole]);
        self.partial.extend_from_slice(&data[whole..]);
    }

    /// The digest as lowercase hex (the state itself is left as it is).
    pub fn finish_hex(&self) -> String {
        let mut state = self.state;
        let mut tail = self.partial.clone();
        tail.push(0x80);
        while tail.len() % 64 != 56 {
            tail.push(0);
        }
        tail.extend_from_slice(&(self.len * 8).to_be_bytes());
        compress(&mut state, &tail);
        state.iter().map(|w| format!("{w:08x}")).collect()
    }
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(serde::de::Error::custom("expected an even number of hex digits"));
        }
        Ok((0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("checked")).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn xorshift(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn equals_sha2_on_random_splits_through_save_and_restore() {
        let mut seed = 0x2545f4914f6cdd1d;
        for round in 0..200 {
            let n = (xorshift(&mut seed) % 5000) as usize + if round < 130 { round } else { 0 };
            let data: Vec<u8> = (0..n).map(|_| xorshift(&mut seed) as u8).collect();
            let want = format!("{:x}", Sha256::digest(&data));
            let mut h = ResumableSha256::new();
            let mut at = 0;
            while at < n {
                let step = ((xorshift(&mut seed) % 200) as usize).min(n - at);
                h.update(&data[at..at + step]);
                at += step;
                if xorshift(&mut seed) % 3 == 0 {
                    // what a resumed ingest does: save, throw away, load
                    let saved = serde_json::to_string(&h).unwrap();
                    h = serde_json::from_str(&saved).unwrap();
                    assert!(h.is_consistent());
                }
            }
            assert_eq!(h.len(), n as u64);
            assert_eq!(h.finish_hex(), want, "{n} bytes");
        }
    }

    #[test]
    fn known_digests() {
        assert_eq!(ResumableSha256::new().finish_hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let mut h = ResumableSha256::new();
        h.update(b"abc");
        assert_eq!(h.finish_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn an_inconsistent_saved_state_is_recognised() {
        let bad: ResumableSha256 = serde_json::from_str(r#"{"state":[0,0,0,0,0,0,0,0],"len":5,"partial":"0102"}"#).unwrap();
        assert!(!bad.is_consistent());
        assert!(serde_json::from_str::<ResumableSha256>(r#"{"state":[0,0,0,0,0,0,0,0],"len":1,"partial":"0"}"#).is_err());
    }
}
