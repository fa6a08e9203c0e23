//! Progress events: phase, bytes done of the phase's total, rate and time left.

use crate::clock::now_s;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reading the parts' headers (to plan the layout).
    Headers,
    /// Hashing bytes already in the store (a resumed ingest catching up in file order), and checking every
    /// stored run against its check value before the store is marked complete (or when ingesting into a
    /// complete store).
    Verify,
    /// Fetching units (hashing them as they arrive).
    Fetch,
    Done,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Headers => "headers",
            Phase::Verify => "verify",
            Phase::Fetch => "fetch",
            Phase::Done => "done",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Progress {
    pub phase: Phase,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Bytes per second in this phase (this run).
    pub rate: f64,
    /// Seconds left in this phase, at the current rate.
    pub eta_s: Option<f64>,
}

impl Progress {
    pub fn at_rest(phase: Phase, done: u64, total: u64) -> Progress {
        Progress { phase, bytes_done: done, bytes_total: total, rate: 0.0, eta_s: (done == total).then_some(0.0) }
    }
}

/// Rate and ETA of one phase, counted from the bytes already done when it began (a resumed ingest's
/// earlier bytes do not inflate the rate).
pub struct Meter {
    phase: Phase,
    began: f64,
    base: u64,
    total: u64,
}

impl Meter {
    pub fn new(phase: Phase, base: u64, total: u64) -> Meter {
        Meter { phase, began: now_s(), base, total }
    }
    pub fn at(&self, done: u64) -> Progress {
        let secs = (now_s() - self.began).max(1e-3);
        let rate = done.saturating_sub(self.base) as f64 / secs;
        let eta_s = (rate > 0.0).then(|| self.total.saturating_sub(done) as f64 / rate);
        Progress { phase: self.phase, bytes_done: done, bytes_total: self.total, rate, eta_s }
    }
}
