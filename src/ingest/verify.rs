//! Hashing every part in file order while units arrive in any order. The frontier is the first unit not yet
//! hashed; when the unit there is in, it and every finished unit after it are fed to the part's running
//! sha256 — from memory when their bytes are still held (a few units at most), else read back from the
//! store. The running state is saved (atomically) whenever the frontier moves, so a resumed ingest goes on
//! hashing where it stopped: never refetching, and reading back only units finished past the frontier — and
//! the prefix of the check-value run at the frontier, hashed again from the sha256 state saved at that run's
//! start, so no check value is computed from bytes the sha256 did not see. The same bytes, in the same order,
//! give the store's check values ([`RunChecks`]).

use super::checks::{read_back, RunChecks};
use super::plan::Unit;
use super::sha::ResumableSha256;
use crate::store::{IngestFiles, StoreChecks, StoreDir, StoreFile, StoreLayout, HASH_FILE};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Saved {
    /// The unit size the indices count in.
    unit_bytes: u64,
    /// Units before this one are hashed.
    next_unit: usize,
    /// The sha256 of every part wholly before the frontier.
    finished: Vec<String>,
    /// The running hash of the frontier's part.
    current: ResumableSha256,
    /// The frontier part's running hash at the start of the latest check-value run begun in it (file
    /// offset, state): where a resume hashes that run again from, when it straddles the frontier.
    #[serde(default)]
    run_start: Option<(u64, ResumableSha256)>,
}

/// A part whose bytes do not hash to what was expected.
pub struct Mismatch {
    pub part: usize,
    pub got: String,
    pub want: String,
}

pub enum VerifyError {
    Io(String),
    Mismatch(Mismatch),
}

impl From<String> for VerifyError {
    fn from(e: String) -> Self {
        VerifyError::Io(e)
    }
}

pub struct Verifier<F> {
    saved: Saved,
    checks: RunChecks<F>,
    /// Bytes of finished units past the frontier, kept to hash without reading them back.
    held: HashMap<usize, Vec<u8>>,
    hold_at_most: usize,
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl<F: StoreFile> Verifier<F> {
    /// Picks up the saved state when it agrees with the journal (every unit it claims hashed is finished)
    /// and with what is expected; anything else starts hashing from the first byte (read back, not
    /// refetched).
    #[allow(clippy::too_many_arguments)]
    pub async fn resume<D: StoreDir<File = F>>(
        dir: &D,
        files: &IngestFiles<F>,
        layout: &StoreLayout,
        units: &[Unit],
        unit_bytes: u64,
        done: &HashSet<u32>,
        expected: &[Option<String>],
        hold_at_most: usize,
    ) -> Result<Verifier<F>, String> {
        let fresh = || Saved { unit_bytes, next_unit: 0, finished: Vec::new(), current: ResumableSha256::new(), run_start: None };
        let saved = match dir.read_all(HASH_FILE).await? {
            Some(bytes) => serde_json::from_slice::<Saved>(&bytes).ok().filter(|s| Self::agrees(s, layout, units, unit_bytes, done, expected)).unwrap_or_else(fresh),
            None => fresh(),
        };
        let position = |s: &Saved| match units.get(s.next_unit) {
            Some(u) => (u.part, u.start),
            None => (layout.part_lens.len(), 0),
        };
        let from_start = || async { RunChecks::resume(dir, layout, (0, 0)).await.map(|c| c.expect("nothing is finished before the first byte")) };
        let mut verifier = match RunChecks::resume(dir, layout, position(&saved)).await? {
            Some(checks) => Verifier { saved, checks, held: HashMap::new(), hold_at_most: hold_at_most.max(1) },
            // the log lacks a value: every value is recomputed with the sha256, from the first byte
            None => Verifier { saved: fresh(), checks: from_start().await?, held: HashMap::new(), hold_at_most: hold_at_most.max(1) },
        };
        let (part, at) = position(&verifier.saved);
        if let Some((run_part, run_from)) = verifier.checks.unfinished_start().filter(|&(p, o)| p == part && o < at) {
            debug_assert_eq!(run_part, part);
            match verifier.saved.run_start.take() {
                Some((offset, state)) if offset == run_from && state.len() == run_from && state.is_consistent() => {
                    // the run's hashed prefix, read back and hashed again into both
                    verifier.saved.current = state.clone();
                    verifier.saved.run_start = Some((offset, state));
                    let Verifier { saved, checks, .. } = &mut verifier;
                    read_back(files, layout, part, run_from, at, &mut |from, bytes| {
                        saved.current.update(bytes);
                        checks.feed(part, from, bytes);
                    })
                    .await?;
                }
                // no state at that run's start (a state saved by an older build): hash from the first byte
                _ => verifier = Verifier { saved: fresh(), checks: from_start().await?, held: HashMap::new(), hold_at_most: hold_at_most.max(1) },
            }
        }
        Ok(verifier)
    }

    fn agrees(s: &Saved, layout: &StoreLayout, units: &[Unit], unit_bytes: u64, done: &HashSet<u32>, expected: &[Option<String>]) -> bool {
        if s.unit_bytes != unit_bytes || s.next_unit > units.len() || !s.current.is_consistent() {
            return false;
        }
        if !(0..s.next_unit).all(|u| done.contains(&(u as u32))) {
            return false;
        }
        let (parts_before, hashed_in_part) = match units.get(s.next_unit) {
            Some(u) => (u.part, u.start),
            None => (layout.part_lens.len(), 0),
        };
        s.finished.len() == parts_before
            && s.current.len() == hashed_in_part
            && s.finished.iter().zip(expected).all(|(got, want)| is_sha256(got) && want.as_ref().is_none_or(|w| w == got))
    }

    /// The first unit not hashed yet.
    pub fn frontier(&self) -> usize {
        self.saved.next_unit
    }

    /// Offers a finished unit's bytes: kept when it is next in line or there is room.
    pub fn offer(&mut self, unit: usize, bytes: Vec<u8>) {
        if unit == self.saved.next_unit || self.held.len() < self.hold_at_most {
            self.held.insert(unit, bytes);
        }
    }

    /// Hashes every finished unit from the frontier on, in order, stopping at the first unfinished one; a part
    /// whose last unit is hashed is checked against its expected sha256. `on_hashed` hears each unit's bytes.
    #[allow(clippy::too_many_arguments)]
    pub async fn advance<D: StoreDir>(
        &mut self,
        dir: &D,
        files: &IngestFiles<F>,
        layout: &StoreLayout,
        units: &[Unit],
        done: &HashSet<u32>,
        expected: &[Option<String>],
        on_hashed: &mut dyn FnMut(u64),
    ) -> Result<(), VerifyError> {
        let began = self.saved.next_unit;
        while let Some(u) = units.get(self.saved.next_unit).copied() {
            let i = self.saved.next_unit;
            if !done.contains(&(i as u32)) {
                break;
            }
            let bytes = match self.held.remove(&i) {
                Some(b) => b,
                None => files.read_part_range(layout, u.part, u.start, u.len).await?,
            };
            self.feed(u.part, u.start, &bytes);
            self.saved.next_unit += 1;
            on_hashed(u.len);
            if u.ends_part(layout) {
                self.saved.run_start = None;
                let got = std::mem::take(&mut self.saved.current).finish_hex();
                if let Some(want) = expected.get(u.part).and_then(|w| w.as_ref()) {
                    if &got != want {
                        return Err(VerifyError::Mismatch(Mismatch { part: u.part, got, want: want.clone() }));
                    }
                }
                self.saved.finished.push(got);
            }
        }
        self.held.retain(|&k, _| k >= self.saved.next_unit);
        if self.saved.next_unit != began {
            // the check values of the runs finished, then the state that counts their bytes as hashed
            self.checks.save().await?;
            let bytes = serde_json::to_vec(&self.saved).map_err(|e| e.to_string())?;
            dir.write_atomic(HASH_FILE, &bytes).await?;
        }
        Ok(())
    }

    /// Feeds the next bytes in file order to the part's sha256 and the check values, keeping the sha256 state
    /// at each check-value run's start.
    fn feed(&mut self, part: usize, start: u64, bytes: &[u8]) {
        let starts: Vec<u64> = self.checks.run_starts(part, start, start + bytes.len() as u64).collect();
        let mut at = 0usize;
        for s in starts {
            let cut = (s - start) as usize;
            self.saved.current.update(&bytes[at..cut]);
            self.saved.run_start = Some((s, self.saved.current.clone()));
            at = cut;
        }
        self.saved.current.update(&bytes[at..]);
        self.checks.feed(part, start, bytes);
    }

    /// Moves the frontier back to the first unit of `part` (saved), forgetting that part's hash and later ones.
    pub async fn rewind_to_part<D: StoreDir>(&mut self, dir: &D, units: &[Unit], part: usize) -> Result<(), String> {
        let first = units.iter().position(|u| u.part == part).unwrap_or(units.len());
        self.saved.next_unit = first.min(self.saved.next_unit);
        self.saved.finished.truncate(part);
        self.saved.current = ResumableSha256::new();
        self.saved.run_start = None;
        self.held.clear();
        self.checks.rewind_to_part(part).await?;
        let bytes = serde_json::to_vec(&self.saved).map_err(|e| e.to_string())?;
        dir.write_atomic(HASH_FILE, &bytes).await
    }

    /// The store's check values, once every unit is hashed.
    pub fn checks(&self, layout: &StoreLayout) -> Option<StoreChecks> {
        self.checks.checks(layout)
    }

    /// The sha256 of every part, once every unit is hashed.
    pub fn digests(&self, units: &[Unit]) -> Option<&[String]> {
        (self.saved.next_unit == units.len()).then_some(&self.saved.finished[..])
    }
}
