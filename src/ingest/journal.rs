//! The journal: the indices of the units whose bytes are durable in the store, appended one by one (a
//! little-endian u32 each) only after the bytes they vouch for were flushed. A kill mid-append leaves a torn
//! last entry, which is dropped; the journal is rewritten clean (atomically) when an ingest opens it.

use crate::store::{StoreDir, StoreFile, JOURNAL_FILE};
use std::collections::HashSet;

pub struct Journal<F> {
    file: F,
    len: u64,
}

impl<F: StoreFile> Journal<F> {
    /// The units finished so far (fewer than `n_units`; others are ignored) and the journal, open to append.
    pub async fn open<D: StoreDir<File = F>>(dir: &D, n_units: usize) -> Result<(Journal<F>, HashSet<u32>), String> {
        let mut done = HashSet::new();
        if let Some(bytes) = dir.read_all(JOURNAL_FILE).await? {
            for c in bytes.chunks_exact(4) {
                let u = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                if (u as usize) < n_units {
                    done.insert(u);
                }
            }
        }
        let mut sorted: Vec<u32> = done.iter().copied().collect();
        sorted.sort_unstable();
        let clean: Vec<u8> = sorted.iter().flat_map(|u| u.to_le_bytes()).collect();
        dir.write_atomic(JOURNAL_FILE, &clean).await?;
        let file = dir.open(JOURNAL_FILE, true).await?.ok_or_else(|| format!("{}: cannot create {JOURNAL_FILE}", dir.describe()))?;
        Ok((Journal { file, len: clean.len() as u64 }, done))
    }

    /// Drops the entries of the units `forget` picks (atomically), so the next ingest fetches them again.
    pub async fn forget<D: StoreDir<File = F>>(dir: &D, n_units: usize, forget: impl Fn(usize) -> bool) -> Result<(), String> {
        let bytes = dir.read_all(JOURNAL_FILE).await?.unwrap_or_default();
        let kept: Vec<u8> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .filter(|&u| (u as usize) < n_units && !forget(u as usize))
            .flat_map(|u| u.to_le_bytes())
            .collect();
        dir.write_atomic(JOURNAL_FILE, &kept).await
    }

    /// Records a unit as finished, durably (its bytes must already be flushed).
    pub async fn record(&mut self, unit: u32) -> Result<(), String> {
        self.file.write_at(self.len, &unit.to_le_bytes()).await?;
        self.file.flush().await?;
        self.len += 4;
        Ok(())
    }
}
