//! Check values of a store's bytes, so a record (or dense tensor, or header) changed on disk after ingest is
//! caught when it is read, before it reaches the GPU: an xxh3-64 of each part's header, of every dense tensor
//! and of every expert's gate, up and down rows. Computed by ingest as the bytes go by in file order (no extra
//! reads; the headers from the bytes the source sent for them), kept in `checks.json` beside the manifest.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Name of the check file inside a store.
pub const CHECKS_FILE: &str = "checks.json";

/// The check value of a run of bytes.
pub fn check_value(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// A check value computed over bytes that arrive in pieces.
#[derive(Clone, Default)]
pub struct Checker(xxhash_rust::xxh3::Xxh3);

impl Checker {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    pub fn value(&self) -> u64 {
        self.0.digest()
    }
}

/// The checks of one store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreChecks {
    /// Dense tensor name → check value of its bytes.
    pub dense: HashMap<String, u64>,
    /// Per trunk layer (None for dense layers): per expert, the check values of its [gate, up, down] rows.
    pub experts: Vec<Option<Vec<[u64; 3]>>>,
    /// Per part, the check value of its header bytes (empty in stores made before headers had one).
    #[serde(default)]
    pub headers: Vec<u64>,
}

impl StoreChecks {
    /// The check of expert `expert`'s matrix `which` (0 gate, 1 up, 2 down) in `layer`.
    pub fn expert(&self, layer: usize, expert: u32, which: usize) -> Option<u64> {
        Some(self.experts.get(layer)?.as_ref()?.get(expert as usize)?[which])
    }

    /// Checks `bytes` as expert `expert`'s matrix `which` of `layer`: a clear error when they differ.
    pub fn verify_expert(&self, layer: usize, expert: u32, which: usize, bytes: &[u8]) -> Result<(), String> {
        match self.expert(layer, expert, which) {
            None => Err(format!("layer {layer} expert {expert}: no check value in the store's {CHECKS_FILE}")),
            Some(want) if want == check_value(bytes) => Ok(()),
            Some(_) => Err(format!(
                "layer {layer} expert {expert}: its {} rows in the store do not match their check value: the store was changed on disk after it was ingested; ingest it again",
                ["gate", "up", "down"][which]
            )),
        }
    }

    /// Checks part `part`'s stored header bytes (a store without header check values passes).
    pub fn verify_header(&self, part: usize, bytes: &[u8]) -> Result<(), String> {
        match self.headers.get(part) {
            None => Ok(()),
            Some(&want) if want == check_value(bytes) => Ok(()),
            Some(_) => Err(format!("the header of part {} in the store does not match its check value: the store was changed on disk after it was ingested; ingest it again", part + 1)),
        }
    }

    /// Checks a dense tensor's bytes.
    pub fn verify_dense(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        match self.dense.get(name) {
            None => Err(format!("{name}: no check value in the store's {CHECKS_FILE}")),
            Some(&want) if want == check_value(bytes) => Ok(()),
            Some(_) => Err(format!("{name}: its bytes in the store do not match their check value: the store was changed on disk after it was ingested; ingest it again")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_in_pieces_is_the_value_of_the_whole() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for cut in [0, 1, 31, 32, 33, 4096, 99_999] {
            let mut c = Checker::default();
            c.update(&bytes[..cut]);
            c.update(&bytes[cut..]);
            assert_eq!(c.value(), check_value(&bytes), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[5000] ^= 1;
        assert_ne!(check_value(&flipped), check_value(&bytes));
    }
}
