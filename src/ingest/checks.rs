//! The store's check values ([`StoreChecks`]), computed while the verifier hashes every part in file order:
//! each dense tensor and each expert's gate, up or down rows is a contiguous run of one part's bytes, so one
//! running [`Checker`] (for the run in progress) sees each run's bytes whole and in order — no extra reads.
//!
//! Resuming: the value of every finished run is appended to [`CHECKS_LOG`] (index, value) before the hash
//! state that counts its bytes as hashed is saved, so a resumed ingest finds the value of every run before the
//! saved frontier in the log. The running xxh3 state is not saved; instead the one run that straddles the
//! frontier has its hashed prefix read back from the store (at most one tensor, all of it journaled), and a
//! finished run missing from the log (a log lost or cut short) is read back whole. The log is thus only a
//! cache: whatever it lacks is recomputed from the same store bytes the sha256 was computed from.

use crate::store::{Checker, IngestFiles, StoreChecks, StoreDir, StoreFile, StoreLayout, CHECKS_LOG};

#[derive(Clone, Copy, Debug)]
enum Target {
    Dense(usize),
    Expert { layer: usize, expert: usize, which: usize },
}

#[derive(Clone, Copy, Debug)]
struct Run {
    part: usize,
    file_offset: u64,
    len: u64,
    target: Target,
}

impl Run {
    fn end(&self) -> (usize, u64) {
        (self.part, self.file_offset + self.len)
    }
}

/// Bytes read back from the store at a time when recomputing.
const READ_BACK: u64 = 16 << 20;

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

fn runs_of(layout: &StoreLayout) -> (Vec<Run>, usize) {
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
        runs.push(Run { part: p.part, file_offset: p.file_offset, len: p.len, target });
    }
    (runs, n_expert)
}

async fn read_back<F: StoreFile>(files: &IngestFiles<F>, layout: &StoreLayout, part: usize, from: u64, to: u64, checker: &mut Checker) -> Result<(), String> {
    let mut at = from;
    while at < to {
        let n = READ_BACK.min(to - at);
        checker.update(&files.read_part_range(layout, part, at, n).await?);
        at += n;
    }
    Ok(())
}

impl<F: StoreFile> RunChecks<F> {
    /// Check values with every part hashed up to `position` (part, byte offset; `(n_parts, 0)` when all is):
    /// finished runs' values from the log (or read back), the straddling run's prefix read back.
    pub async fn resume<D: StoreDir<File = F>>(dir: &D, files: &IngestFiles<F>, layout: &StoreLayout, position: (usize, u64)) -> Result<RunChecks<F>, String> {
        let (runs, n_expert) = runs_of(layout);
        let mut values = vec![None; runs.len()];
        let next = runs.partition_point(|r| r.end() <= position);
        let mut clean = Vec::new();
        if let Some(bytes) = dir.read_all(CHECKS_LOG).await? {
            for c in bytes.chunks_exact(12) {
                let i = u32::from_le_bytes(c[..4].try_into().expect("4 bytes")) as usize;
                if i < next {
                    values[i] = Some(u64::from_le_bytes(c[4..].try_into().expect("8 bytes")));
                }
            }
        }
        let mut fresh = Vec::new();
        for i in 0..next {
            if values[i].is_none() {
                let r = runs[i];
                let mut c = Checker::default();
                read_back(files, layout, r.part, r.file_offset, r.file_offset + r.len, &mut c).await?;
                values[i] = Some(c.value());
            }
            clean.extend_from_slice(&(i as u32).to_le_bytes());
            clean.extend_from_slice(&values[i].expect("set").to_le_bytes());
        }
        let mut current = Checker::default();
        if let Some(r) = runs.get(next) {
            if r.part == position.0 && r.file_offset < position.1 {
                read_back(files, layout, r.part, r.file_offset, position.1, &mut current).await?;
            }
        }
        // the log rewritten clean (no torn entry, no stale values past the frontier), then opened to append
        dir.write_atomic(CHECKS_LOG, &clean).await?;
        let log = dir.open(CHECKS_LOG, true).await?.ok_or_else(|| format!("{}: cannot create {CHECKS_LOG}", dir.describe()))?;
        fresh.clear();
        Ok(RunChecks { runs, values, next, current, fresh, log, log_len: clean.len() as u64, n_layer: layout.n_layer, n_expert })
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
        let mut bytes = Vec::with_capacity(self.fresh.len() * 12);
        for &i in &self.fresh {
            bytes.extend_from_slice(&i.to_le_bytes());
            bytes.extend_from_slice(&self.values[i as usize].expect("finished").to_le_bytes());
        }
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

    /// The store's checks, once every run is finished.
    pub fn checks(&self, layout: &StoreLayout) -> Option<StoreChecks> {
        if self.next != self.runs.len() {
            return None;
        }
        let mut checks = StoreChecks { dense: Default::default(), experts: vec![None; self.n_layer] };
        for r in &layout.experts {
            if r.layer >= checks.experts.len() {
                checks.experts.resize(r.layer + 1, None);
            }
            checks.experts[r.layer] = Some(vec![[0; 3]; self.n_expert]);
        }
        for (r, v) in self.runs.iter().zip(&self.values) {
            let v = (*v)?;
            match r.target {
                Target::Dense(i) => {
                    checks.dense.insert(layout.dense[i].name.clone(), v);
                }
                Target::Expert { layer, expert, which } => checks.experts[layer].as_mut().expect("made above")[expert][which] = v,
            }
        }
        Some(checks)
    }
}
