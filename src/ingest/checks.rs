//! The store's check values ([`StoreChecks`]), computed while the verifier hashes every part in file order:
//! each dense tensor and each expert's gate, up or down rows is a contiguous run of one part's bytes, so one
//! running [`Checker`] (for the run in progress) sees each run's bytes whole and in order — no extra reads.
//!
//! Every value must come from bytes the part's sha256 also saw, so that bytes changed on disk while an ingest
//! was stopped fail that sha256 rather than becoming check values. Resuming: the value of every finished run is
//! appended to [`CHECKS_LOG`] (index, value, and a check of the two) before the hash state that counts its
//! bytes as hashed is saved, so a resumed ingest finds the value of every run before the saved frontier in the
//! log. The run that straddles the frontier is hashed again from its start (the verifier keeps the sha256
//! state at the start of the latest run). A log that lacks a finished run's value (lost, cut short, zeroed)
//! makes the verifier start hashing from the first byte (read back, never refetched): [`RunChecks::resume`]
//! says so by returning `None`.

use crate::store::{Checker, IngestFiles, StoreChecks, StoreDir, StoreFile, StoreLayout, CHECKS_LOG};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Part `n`'s header.
    Header(usize),
    Dense(usize),
    Expert { layer: usize, expert: usize, which: usize },
}

impl Target {
    /// The check value `checks` holds for this run.
    pub fn expected(&self, checks: &StoreChecks, layout: &StoreLayout) -> Option<u64> {
        match *self {
            Target::Header(part) => checks.headers.get(part).copied(),
            Target::Dense(i) => checks.dense.get(&layout.dense[i].name).copied(),
            Target::Expert { layer, expert, which } => checks.expert(layer, expert as u32, which),
        }
    }

    pub fn describe(&self, layout: &StoreLayout) -> String {
        match *self {
            Target::Header(part) => format!("the header of part {}", part + 1),
            Target::Dense(i) => layout.dense[i].name.clone(),
            Target::Expert { layer, expert, which } => format!("layer {layer} expert {expert}'s {} rows", ["gate", "up", "down"][which]),
        }
    }
}

/// A run of one part's bytes with a check value, and where it lies in the data file.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub part: usize,
    pub file_offset: u64,
    pub len: u64,
    pub store_offset: u64,
    pub target: Target,
}

impl Run {
    fn end(&self) -> (usize, u64) {
        (self.part, self.file_offset + self.len)
    }
}

/// The runs of the dense tensors and expert rows in file order (headers have their check values from the
/// bytes the source sent for them, not from this pass), and the number of experts per layer.
pub fn runs_of(layout: &StoreLayout) -> (Vec<Run>, usize) {
    let header = |p: &crate::store::Piece| p.file_offset == 0 && layout.header_offsets.get(p.part) == Some(&p.store_offset);
    let mut n_expert = 0;
    let mut runs = Vec::new();
    for p in &layout.pieces {
        if p.store_offset >= layout.data_len || header(p) {
            continue;
        }
        let target = if let Some(i) = layout.dense.iter().position(|d| d.offset == p.store_offset) {
            Target::Dense(i)
        } else {
            // records come after the dense tensors, layer after layer: the last layer starting at or before it
            let r = layout.experts.iter().rev().find(|r| r.offset <= p.store_offset).expect("a stored piece is a header, a dense tensor or expert rows");
            let (expert, within) = ((p.store_offset - r.offset) / r.stride, (p.store_offset - r.offset) % r.stride);
            let which = [r.gate, r.up, r.down].iter().position(|&o| o == within).expect("rows start at gate, up or down");
            n_expert = n_expert.max(expert as usize + 1);
            Target::Expert { layer: r.layer, expert: expert as usize, which }
        };
        runs.push(Run { part: p.part, file_offset: p.file_offset, len: p.len, store_offset: p.store_offset, target });
    }
    (runs, n_expert)
}

/// Every run the data file keeps, headers included, in data-file order.
pub fn stored_runs(layout: &StoreLayout) -> Vec<Run> {
    let mut runs = runs_of(layout).0;
    for (part, (&store_offset, &len)) in layout.header_offsets.iter().zip(&layout.header_lens).enumerate() {
        runs.push(Run { part, file_offset: 0, len, store_offset, target: Target::Header(part) });
    }
    runs.sort_by_key(|r| r.store_offset);
    runs
}

/// Bytes read back from the store at a time.
pub const READ_BACK: u64 = 16 << 20;

/// Feeds bytes [from, to) of `part`, read back from the store, to `feed`.
pub async fn read_back<F: StoreFile>(files: &IngestFiles<F>, layout: &StoreLayout, part: usize, from: u64, to: u64, feed: &mut dyn FnMut(u64, &[u8])) -> Result<(), String> {
    let mut at = from;
    while at < to {
        let n = READ_BACK.min(to - at);
        feed(at, &files.read_part_range(layout, part, at, n).await?);
        at += n;
    }
    Ok(())
}

/// A log entry: run index, check value, and the low half of a check value of those twelve bytes — so an
/// entry cut short or zeroed is recognised and dropped, never taken for a value.
const ENTRY: usize = 16;

fn entry(index: u32, value: u64) -> [u8; ENTRY] {
    let mut e = [0u8; ENTRY];
    e[..4].copy_from_slice(&index.to_le_bytes());
    e[4..12].copy_from_slice(&value.to_le_bytes());
    let tag = crate::store::check_value(&e[..12]) as u32;
    e[12..].copy_from_slice(&tag.to_le_bytes());
    e
}

fn parse_entry(e: &[u8]) -> Option<(usize, u64)> {
    let tag = u32::from_le_bytes(e[12..16].try_into().ok()?);
    (tag == crate::store::check_value(&e[..12]) as u32).then(|| (u32::from_le_bytes(e[..4].try_into().unwrap()) as usize, u64::from_le_bytes(e[4..12].try_into().unwrap())))
}

pub struct RunChecks<F> {
    runs: Vec<Run>,
    values: Vec<Option<u64>>,
    /// The first run not finished.
    next: usize,
    /// The running value of `runs[next]` (its bytes so far).
    current: Checker,
    /// Finished runs not yet in the log.
    fresh: Vec<u32>,
    log: F,
    log_len: u64,
    n_layer: usize,
    n_expert: usize,
}

impl<F: StoreFile> RunChecks<F> {
    /// Check values with every part hashed up to `position` (part, byte offset; `(n_parts, 0)` when all is):
    /// the finished runs' values from the log, the run at the frontier empty (its hashed prefix is to be fed
    /// again). `None` when the log lacks a finished run's value: hash from the first byte then.
    pub async fn resume<D: StoreDir<File = F>>(dir: &D, layout: &StoreLayout, position: (usize, u64)) -> Result<Option<RunChecks<F>>, String> {
        let (runs, n_expert) = runs_of(layout);
        let mut values = vec![None; runs.len()];
        let next = runs.partition_point(|r| r.end() <= position);
        if let Some(bytes) = dir.read_all(CHECKS_LOG).await? {
            for (i, v) in bytes.chunks_exact(ENTRY).filter_map(parse_entry) {
                if i < next {
                    values[i] = Some(v);
                }
            }
        }
        if values[..next].iter().any(Option::is_none) {
            return Ok(None);
        }
        let clean: Vec<u8> = values[..next].iter().enumerate().flat_map(|(i, v)| entry(i as u32, v.expect("checked"))).collect();
        // the log rewritten clean (no torn entry, no stale values past the frontier), then opened to append
        dir.write_atomic(CHECKS_LOG, &clean).await?;
        let log = dir.open(CHECKS_LOG, true).await?.ok_or_else(|| format!("{}: cannot create {CHECKS_LOG}", dir.describe()))?;
        Ok(Some(RunChecks { runs, values, next, current: Checker::default(), fresh: Vec::new(), log, log_len: clean.len() as u64, n_layer: layout.n_layer, n_expert }))
    }

    /// Where the first unfinished run starts (part, file offset).
    pub fn unfinished_start(&self) -> Option<(usize, u64)> {
        self.runs.get(self.next).map(|r| (r.part, r.file_offset))
    }

    /// The file offsets in [start, end) of `part` where an unfinished run begins.
    pub fn run_starts(&self, part: usize, start: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        self.runs[self.next..].iter().skip_while(move |r| (r.part, r.file_offset) < (part, start)).take_while(move |r| (r.part, r.file_offset) < (part, end)).map(|r| r.file_offset)
    }

    /// Feeds bytes `start..start + bytes.len()` of `part`, the next bytes in file order.
    pub fn feed(&mut self, part: usize, start: u64, bytes: &[u8]) {
        let end = start + bytes.len() as u64;
        while let Some(r) = self.runs.get(self.next).copied() {
            if (r.part, r.file_offset) >= (part, end) {
                break;
            }
            debug_assert!(r.part == part && r.end() > (part, start), "runs are fed in file order");
            let from = r.file_offset.max(start);
            let to = (r.file_offset + r.len).min(end);
            self.current.update(&bytes[(from - start) as usize..(to - start) as usize]);
            if r.file_offset + r.len > end {
                break;
            }
            self.values[self.next] = Some(std::mem::take(&mut self.current).value());
            self.fresh.push(self.next as u32);
            self.next += 1;
        }
    }

    /// Appends the runs finished since the last save to the log, durably (before the hash state that counts
    /// them is saved).
    pub async fn save(&mut self) -> Result<(), String> {
        if self.fresh.is_empty() {
            return Ok(());
        }
        let bytes: Vec<u8> = self.fresh.iter().flat_map(|&i| entry(i, self.values[i as usize].expect("finished"))).collect();
        self.log.write_at(self.log_len, &bytes).await?;
        self.log.flush().await?;
        self.log_len += bytes.len() as u64;
        self.fresh.clear();
        Ok(())
    }

    /// Goes back to the start of `part` (its bytes are to be hashed again): its runs and later ones forgotten.
    pub async fn rewind_to_part(&mut self, part: usize) -> Result<(), String> {
        let first = self.runs.partition_point(|r| r.part < part).min(self.next);
        self.fresh.retain(|&i| (i as usize) < first);
        for v in &mut self.values[first..] {
            *v = None;
        }
        self.next = first;
        self.current = Checker::default();
        self.save().await
    }

    /// The store's checks (without the headers'), once every run is finished.
    pub fn checks(&self, layout: &StoreLayout) -> Option<StoreChecks> {
        if self.next != self.runs.len() {
            return None;
        }
        let mut checks = StoreChecks { dense: Default::default(), experts: vec![None; self.n_layer], headers: Vec::new() };
        for r in &layout.experts {
            if r.layer >= checks.experts.len() {
                checks.experts.resize(r.layer + 1, None);
            }
            checks.experts[r.layer] = Some(vec![[0; 3]; self.n_expert]);
        }
        for (r, v) in self.runs.iter().zip(&self.values) {
            let v = (*v)?;
            match r.target {
                Target::Header(_) => {}
                Target::Dense(i) => {
                    checks.dense.insert(layout.dense[i].name.clone(), v);
                }
                Target::Expert { layer, expert, which } => checks.experts[layer].as_mut().expect("made above")[expert][which] = v,
            }
        }
        Some(checks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_entries_cut_short_or_zeroed_are_dropped() {
        let e = entry(7, 0x1234_5678_9abc_def0);
        assert_eq!(parse_entry(&e), Some((7, 0x1234_5678_9abc_def0)));
        assert_eq!(parse_entry(&[0u8; ENTRY]), None);
        for i in 0..ENTRY {
            let mut bad = e;
            bad[i] = 0;
            if bad != e {
                assert_eq!(parse_entry(&bad), None, "byte {i} zeroed");
            }
        }
    }
}
