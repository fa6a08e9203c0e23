//! The last word on a store's bytes: every run the data file keeps (each part's header, each dense tensor,
//! each expert's gate, up and down rows) read back in one pass in data-file order and compared with its check
//! value. A run that differs — changed on disk while an ingest was stopped, or after the store was complete
//! (cut short, zeroed) — is fetched again from its source, must then match its check value, and is written
//! back. An ingest runs this before it marks a store complete, and again when asked to ingest into a complete
//! store, so "ingest it again" repairs a damaged store by fetching only what is damaged.

use super::checks::{stored_runs, Run, READ_BACK};
use crate::source::RangeSource;
use crate::store::{Checker, StoreChecks, StoreFile, StoreLayout, DATA_FILE};

/// What the check found and mended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repair {
    /// Runs checked.
    pub runs: usize,
    /// The runs that did not match, fetched again (their descriptions).
    pub repaired: Vec<String>,
    /// Bytes fetched to repair them.
    pub bytes_fetched: u64,
}

/// Reads `len` bytes of the data file at `at` into `checker`, in pieces of at most [`READ_BACK`].
async fn check_in_pieces<F: StoreFile>(data: &F, at: u64, len: u64, checker: &mut Checker) -> Result<(), String> {
    let mut done = 0;
    while done < len {
        let n = READ_BACK.min(len - done);
        let mut buf = vec![0u8; n as usize];
        data.read_at(at + done, &mut buf).await?;
        checker.update(&buf);
        done += n;
    }
    Ok(())
}

/// The runs of the data file that do not match their check values (or have none), read in windows of about
/// [`READ_BACK`] bytes; `on_checked` hears the data-file bytes covered so far.
async fn damaged_runs<F: StoreFile>(data: &F, layout: &StoreLayout, checks: &StoreChecks, runs: &[Run], on_checked: &mut dyn FnMut(u64)) -> Result<Vec<Run>, String> {
    let mut damaged = Vec::new();
    let mut window: (u64, Vec<u8>) = (0, Vec::new());
    let mut reported = 0;
    for (i, r) in runs.iter().enumerate() {
        let value = if r.len > READ_BACK {
            let mut c = Checker::default();
            check_in_pieces(data, r.store_offset, r.len, &mut c).await?;
            c.value()
        } else {
            let (start, bytes) = &window;
            if r.store_offset < *start || r.store_offset + r.len > start + bytes.len() as u64 {
                // a new window from this run on, as far as the data file and the window size allow
                let len = READ_BACK.max(r.len).min(layout.data_len - r.store_offset);
                let mut buf = vec![0u8; len as usize];
                data.read_at(r.store_offset, &mut buf).await?;
                window = (r.store_offset, buf);
            }
            let from = (r.store_offset - window.0) as usize;
            crate::store::check_value(&window.1[from..from + r.len as usize])
        };
        if r.target.expected(checks, layout) != Some(value) {
            damaged.push(*r);
        }
        // progress every window's worth of bytes, not every run (tens of thousands of expert rows)
        let done = r.store_offset + r.len;
        if done - reported >= READ_BACK || i + 1 == runs.len() {
            on_checked(done);
            reported = done;
        }
    }
    Ok(damaged)
}

/// Checks every run of the data file against `checks` and fetches the damaged ones again from `parts` (in
/// requests of at most `unit_bytes`), checking what comes back before it is kept. `on_progress(phase, done,
/// total)`: the check over the data file's bytes, then the refetch over the damaged runs' bytes.
pub async fn check_and_repair<S: RangeSource, F: StoreFile>(
    data: &F,
    layout: &StoreLayout,
    checks: &StoreChecks,
    parts: &[S],
    unit_bytes: u64,
    store: &str,
    on_progress: &mut dyn FnMut(super::Phase, u64, u64),
) -> Result<Repair, String> {
    let size = data.size().await?;
    if size != layout.data_len {
        // cut short (or grown): back to its length, the missing bytes zeros that fail their checks below
        data.set_len(layout.data_len).await?;
        data.flush().await?;
    }
    let runs = stored_runs(layout);
    let damaged = damaged_runs(data, layout, checks, &runs, &mut |done| on_progress(super::Phase::Verify, done, layout.data_len)).await?;
    let mut repair = Repair { runs: runs.len(), ..Default::default() };
    let total: u64 = damaged.iter().map(|r| r.len).sum();
    for r in &damaged {
        let what = r.target.describe(layout);
        let Some(want) = r.target.expected(checks, layout) else {
            return Err(format!("{store}: {what} has no check value in the store's check file: the store cannot be repaired; delete it and ingest it again"));
        };
        let source = &parts[r.part];
        let mut checker = Checker::default();
        let mut done = 0;
        while done < r.len {
            let n = unit_bytes.max(1).min(r.len - done);
            let (bytes, _) = source.read_range(r.file_offset + done, n).await?;
            if bytes.len() as u64 != n {
                return Err(format!("{}: bytes {}..{}: got {} bytes", source.describe(), r.file_offset + done, r.file_offset + done + n, bytes.len()));
            }
            checker.update(&bytes);
            data.write_at(r.store_offset + done, &bytes).await?;
            done += n;
            repair.bytes_fetched += n;
            on_progress(super::Phase::Fetch, repair.bytes_fetched, total);
        }
        if checker.value() != want {
            return Err(format!(
                "{store}: {what} was changed in {DATA_FILE}, and the bytes {} sends for it again do not match the check value either: the source or the store's check file changed; delete the store and ingest it again",
                source.describe()
            ));
        }
        repair.repaired.push(what);
    }
    if !damaged.is_empty() {
        data.flush().await?;
    }
    Ok(repair)
}
