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
}
