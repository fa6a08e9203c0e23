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
}
