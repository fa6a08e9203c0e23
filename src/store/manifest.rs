//! The store's manifest: format, where the bytes came from, every offset, and whether the store is complete.

use super::layout::{DenseTensor, ExpertRecords, StoreLayout};
use serde::{Deserialize, Serialize};

pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreState {
    /// Being written: the data and tail files may hold unfinished units (the journal says which are finished).
    Ingesting,
    /// Every unit written and every byte checked against the source's sizes (and sha256 where known).
    Complete,
}

/// Where one part came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartIdentity {
    pub url: String,
    pub size: u64,
    pub etag: Option<String>,
    /// Expected sha256 (lowercase hex), when known; checked before the store is marked complete.
    pub sha256: Option<String>,
    pub header_len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub state: StoreState,
    pub parts: Vec<PartIdentity>,
    /// Bytes of part file per ingest unit.
    pub unit_bytes: u64,
    pub header_offsets: Vec<u64>,
    pub dense: Vec<DenseTensor>,
    pub experts: Vec<ExpertRecords>,
    /// Data file length when complete.
    pub data_len: u64,
    /// Data file length plus the tail file's (while ingesting).
    pub ingest_len: u64,
    /// Whether the store has check values (`checks.json`, written before the store is complete); stores made
    /// before check values existed have none, and a store that should have them but does not is refused.
    #[serde(default)]
    pub checks: bool,
}

/// Why a manifest's bytes are not a manifest this build can use.
#[derive(Clone, Debug, PartialEq)]
pub enum ManifestError {
    /// Not a manifest at all (not JSON, cut short, fields missing or of the wrong kind).
    Unreadable(String),
    /// A manifest of another store format (another version of lingtab made it).
    Version(u64),
}

impl Manifest {
    /// Parses a manifest, its format version first, so a store of another format is named as such rather
    /// than as unreadable.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ManifestError::Unreadable(e.to_string()))?;
        match value.get("format_version").and_then(|v| v.as_u64()) {
            None => return Err(ManifestError::Unreadable("no format_version".into())),
            Some(v) if v != FORMAT_VERSION as u64 => return Err(ManifestError::Version(v)),
            Some(_) => {}
        }
        serde_json::from_value(value).map_err(|e| ManifestError::Unreadable(e.to_string()))
    }
}

impl Manifest {
    pub fn new(layout: &StoreLayout, parts: Vec<PartIdentity>, unit_bytes: u64) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            state: StoreState::Ingesting,
            parts,
            unit_bytes,
            header_offsets: layout.header_offsets.clone(),
            dense: layout.dense.clone(),
            experts: layout.experts.clone(),
            data_len: layout.data_len,
            ingest_len: layout.ingest_len,
            checks: true,
        }
    }

    /// Bytes of GGUF in the units a journal (little-endian u32 unit indices, as [`super::JOURNAL_FILE`] holds)
    /// marks finished: each part cut into units of `unit_bytes`, the last of a part shorter. Repeated, torn
    /// or out-of-range entries count nothing.
    pub fn journaled_bytes(&self, journal: &[u8]) -> u64 {
        if self.unit_bytes == 0 {
            return 0;
        }
        let counts: Vec<u64> = self.parts.iter().map(|p| p.size.div_ceil(self.unit_bytes)).collect();
        let mut seen = std::collections::HashSet::new();
        let mut sum = 0;
        for c in journal.chunks_exact(4) {
            let mut u = u32::from_le_bytes(c.try_into().expect("4 bytes")) as u64;
            if !seen.insert(u) {
                continue;
            }
            for (p, &n) in self.parts.iter().zip(&counts) {
                if u < n {
                    sum += self.unit_bytes.min(p.size - u * self.unit_bytes);
                    break;
                }
                u -= n;
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journaled_bytes_count_each_finished_unit_once_with_the_short_last_ones() {
        let part = |size| PartIdentity { url: String::new(), size, etag: None, sha256: None, header_len: 0 };
        let m = Manifest {
            format_version: FORMAT_VERSION,
            state: StoreState::Ingesting,
            parts: vec![part(250), part(100)],
            unit_bytes: 100,
            header_offsets: vec![],
            dense: vec![],
            experts: vec![],
            data_len: 0,
            ingest_len: 0,
            checks: true,
        };
        // units: part 1 → 100, 100, 50; part 2 → 100
        let journal = |units: &[u32]| units.iter().flat_map(|u| u.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(m.journaled_bytes(&journal(&[])), 0);
        assert_eq!(m.journaled_bytes(&journal(&[2])), 50);
        assert_eq!(m.journaled_bytes(&journal(&[0, 2, 2, 3, 9])), 250);
        assert_eq!(m.journaled_bytes(&journal(&[0, 1, 2, 3])), 350);
        let mut torn = journal(&[1]);
        torn.extend_from_slice(&[3, 0]);
        assert_eq!(m.journaled_bytes(&torn), 100);
    }

    #[test]
    fn a_manifest_of_another_version_is_named_and_garbage_is_unreadable() {
        let m = Manifest {
            format_version: FORMAT_VERSION,
            state: StoreState::Complete,
            parts: vec![],
            unit_bytes: 1,
            header_offsets: vec![],
            dense: vec![],
            experts: vec![],
            data_len: 0,
            ingest_len: 0,
            checks: true,
        };
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(Manifest::parse(&bytes), Ok(m.clone()));
        // another version, even with fields this build does not know
        let other = br#"{"format_version": 7, "layout": "something new"}"#;
        assert_eq!(Manifest::parse(other), Err(ManifestError::Version(7)));
        for bad in [&bytes[..bytes.len() / 2], &b""[..], &b"\0\0\0\0"[..], &br#"{"format_version": 1}"#[..], &br#"[1, 2]"#[..]] {
            assert!(matches!(Manifest::parse(bad), Err(ManifestError::Unreadable(_))), "{:?}", String::from_utf8_lossy(bad));
        }
        // a manifest from before check values: no checks flag
        let mut old: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        old.as_object_mut().unwrap().remove("checks");
        assert!(!Manifest::parse(&serde_json::to_vec(&old).unwrap()).unwrap().checks);
    }
}
