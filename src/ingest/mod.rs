//! Ingest: a model's GGUF parts (from any [`RangeSource`]) into a store, resumable and verified.
//!
//! The parts are cut into units (runs of `unit_bytes` of one part file); several units are fetched at once and
//! each is written where the layout says (the data file; the bytes the store does not keep go to the tail
//! file). A unit's index is appended to the journal only after its bytes are flushed, so a killed ingest
//! resumes from the journal, refetching only the units that were in flight. Every part is hashed in file order
//! as the units arrive ([`verify`]), with the running hash saved so a resume goes on from it; a part is
//! checked against its sha256 (where known) when its last byte is hashed. The same bytes in the same order give
//! the store's check values (`checks.json`, see `checks.rs`), written before the store is marked `complete` —
//! only when every unit is in and every byte hashed, one atomic manifest write — and only then are the journal,
//! the tail, the hash state and the checks log removed (a kill before that leaves them for the next run).
//!
//! Before the store is marked complete, every run it keeps is read back once more and compared with its check
//! value ([`repair`]): bytes changed on disk while the ingest was stopped, in a region already hashed, are
//! found there and fetched again. Ingesting into a complete store runs the same check (and repair), so a store
//! damaged later is mended by fetching only what is damaged. A store whose manifest is unreadable is made
//! anew; one of another format version is refused.
//!
//! No step leaves the files in a state a resume does not recognise: the data and tail files get their full
//! lengths once, right after the manifest that describes them, and keep them; the journal and the hash state
//! are only ever appended to or replaced atomically, and each is checked against the other on resume.

mod checks;
mod journal;
mod plan;
mod progress;
pub mod repair;
pub mod sha;
mod verify;

pub use progress::{Phase, Progress};
use crate::gguf::SplitModel;
use crate::source::{read_header_bytes, RangeSource};
use crate::store::{
    check_value, find_manifest, manifest_message, read_checks, remove_ingest_files, write_checks, write_manifest, IngestFiles, Manifest, ManifestError, PartIdentity, StoreDir,
    StoreFile, StoreLayout, StoreState, DATA_FILE, CHECKS_FILE, CHECKS_LOG, HASH_FILE, JOURNAL_FILE, TAIL_FILE,
};
use futures_util::stream::{FuturesUnordered, StreamExt};
use journal::Journal;
use plan::{plan_units, Unit};
use progress::Meter;
use verify::{Mismatch, Verifier, VerifyError};

/// The pinned Ling 3.0 Flash Q4_K_M parts (Hugging Face, fixed revision).
pub const LING_FLASH_BASE: &str = "https://huggingface.co/inclusionAI/Ling-3.0-flash-GGUF/resolve/29edce5130491e638f3e5ebec91fa0a5ed4f780e/Q4_K_M/";
pub const LING_FLASH_PARTS: [(&str, u64, &str); 2] = [
    ("Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf", 49_995_534_208, "24ff06f1ab74546a91f7c07bd725b3015896bbe9dd82ab0e5838be9ed06a6dcf"),
    ("Ling-3.0-flash-Q4_K_M-00002-of-00002.gguf", 27_014_610_464, "1a6a8c91562b817fd8ec5b250453be696b0fc209ed8f2acdb6c13f4e17f7e188"),
];

#[derive(Clone, Debug)]
pub struct IngestOptions {
    pub unit_bytes: u64,
    pub in_flight: usize,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions { unit_bytes: 16 << 20, in_flight: 6 }
    }
}

/// What the caller knows about a part besides its bytes.
#[derive(Clone, Debug, Default)]
pub struct PartHint {
    pub etag: Option<String>,
    /// Expected size (refused when the source says otherwise).
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// Turns a hashing failure into the ingest's error. A part that hashed wrong cannot say which of its units are
/// bad, so they are all forgotten (hash state rewound to the part's start, then its journal entries dropped):
/// the next ingest fetches that part again and keeps the others' units.
async fn settle<D: StoreDir>(dir: &D, manifest: &Manifest, verifier: &mut Verifier<D::File>, units: &[Unit], result: Result<(), VerifyError>) -> Result<(), String> {
    let Mismatch { part, got, want } = match result {
        Ok(()) => return Ok(()),
        Err(VerifyError::Io(e)) => return Err(e),
        Err(VerifyError::Mismatch(m)) => m,
    };
    let reset = async {
        verifier.rewind_to_part(dir, units, part).await?;
        Journal::forget(dir, units.len(), |u| units[u].part == part).await
    };
    let what = match reset.await {
        Ok(()) => "the store was reset for this part (the next ingest fetches it again)".to_string(),
        Err(e) => format!("resetting the store failed too ({e})"),
    };
    Err(format!(
        "part {} ({}): sha256 {got}, expected {want}: the downloaded bytes are corrupt or the file is another one; {what}; the store is not complete",
        part + 1,
        manifest.parts[part].url
    ))
}

async fn file_size<F: StoreFile>(file: &Option<F>) -> Result<Option<u64>, String> {
    match file {
        Some(f) => f.size().await.map(Some),
        None => Ok(None),
    }
}

/// Ingesting into a complete store: its runs checked against its check values and the damaged ones fetched
/// again; the manifest when that leaves it whole, `None` when it cannot be checked (no usable check values, no
/// data file) and must be made anew.
#[allow(clippy::too_many_arguments)]
async fn check_complete<S: RangeSource, D: StoreDir>(
    dir: &D,
    old: &Manifest,
    layout: &StoreLayout,
    parts: &[S],
    header_checks: &[u64],
    options: &IngestOptions,
    total: u64,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<Option<Manifest>, String> {
    let mut checks = match read_checks(dir).await {
        Ok(Some(c)) => c,
        _ => return Ok(None),
    };
    // a store from before headers had check values: the headers are held to what the (same) source sends
    let add_headers = checks.headers.is_empty();
    if add_headers {
        checks.headers = header_checks.to_vec();
    }
    let Some(data) = dir.open(DATA_FILE, false).await? else { return Ok(None) };
    let meter = Meter::new(Phase::Verify, 0, layout.data_len);
    let mut report = |phase: Phase, done: u64, of: u64| on_progress(&if phase == Phase::Verify { meter.at(done) } else { Progress::at_rest(phase, done, of) });
    let unit = if old.unit_bytes > 0 { old.unit_bytes } else { options.unit_bytes };
    repair::check_and_repair(&data, layout, &checks, parts, unit, &dir.describe(), &mut report).await?;
    drop(data);
    if add_headers {
        write_checks(dir, &checks).await?;
    }
    remove_ingest_files(dir).await?;
    on_progress(&Progress::at_rest(Phase::Done, total, total));
    Ok(Some(old.clone()))
}

/// Ingests `parts` (the model's parts, in order) into the store in `dir`; returns the manifest of the complete
/// store. `hints` (one per part, or empty) carry what is known besides the bytes: ETag, size, sha256.
pub async fn ingest<S: RangeSource, D: StoreDir>(
    dir: &D,
    parts: &[S],
    hints: &[PartHint],
    options: &IngestOptions,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<Manifest, String> {
    if options.unit_bytes == 0 || options.in_flight == 0 {
        return Err("unit size and requests in flight must be positive".into());
    }
    if parts.is_empty() {
        return Err("no parts to ingest".into());
    }
    on_progress(&Progress::at_rest(Phase::Headers, 0, 0));
    let mut headers = Vec::new();
    // the headers' check values, from the bytes the sources send for them
    let mut header_checks = Vec::new();
    for (i, s) in parts.iter().enumerate() {
        let (h, size, prefix) = read_header_bytes(s).await?;
        header_checks.push(check_value(&prefix[..(h.data_start as usize).min(prefix.len())]));
        if let Some(want) = hints.get(i).and_then(|h| h.size) {
            if want != size {
                return Err(format!("{}: the part is {size} bytes, expected {want}: wrong or changed file", s.describe()));
            }
        }
        headers.push((h, size));
    }
    let model = SplitModel::new(headers).map_err(|e| e.to_string())?;
    let layout = StoreLayout::from_model(&model)?;
    let identities: Vec<PartIdentity> = parts
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let hint = hints.get(i).cloned().unwrap_or_default();
            PartIdentity { url: s.describe(), size: model.part_lens[i], etag: hint.etag, sha256: hint.sha256.map(|h| h.to_ascii_lowercase()), header_len: model.parts[i].data_start }
        })
        .collect();
    let mut manifest = Manifest::new(&layout, identities, options.unit_bytes);
    let total: u64 = layout.part_lens.iter().sum();

    // resume, check a complete store, or start over
    let mut resumable = false;
    let old = match find_manifest(dir).await? {
        None => None,
        Some(Ok(m)) => Some(m),
        // nothing in a store whose manifest is unreadable can be trusted: it is made anew
        Some(Err(ManifestError::Unreadable(_))) => None,
        Some(Err(e)) => return Err(manifest_message(&dir.describe(), &e)),
    };
    if let Some(old) = old {
        let same_source = old.parts.len() == manifest.parts.len()
            && old.parts.iter().zip(&manifest.parts).all(|(a, b)| a.size == b.size && a.etag == b.etag && a.header_len == b.header_len && (a.sha256.is_none() || b.sha256.is_none() || a.sha256 == b.sha256));
        if !same_source {
            return Err(format!(
                "{}: the store holds another source (or the source changed: size or ETag differ); remove the store or use another folder",
                dir.describe()
            ));
        }
        if old.state == StoreState::Complete {
            if let Some(done) = check_complete(dir, &old, &layout, parts, &header_checks, options, total, on_progress).await? {
                return Ok(done);
            }
            // no check values to hold the bytes to (lost, or a store from before them): fetched anew
        } else {
            // a resumed ingest keeps the unit size its journal and hash state count in
            resumable = old.data_len == layout.data_len && old.ingest_len == layout.ingest_len && old.unit_bytes > 0;
            if resumable {
                manifest.unit_bytes = old.unit_bytes;
            }
        }
    }
    let units = plan_units(&layout, manifest.unit_bytes);
    if units.len() > u32::MAX as usize {
        return Err(format!("{} units of {} bytes: too many; use larger units", units.len(), manifest.unit_bytes));
    }
    let tail_len = layout.ingest_len - layout.data_len;
    let data_size = file_size(&dir.open(DATA_FILE, false).await?).await?;
    let tail_size = file_size(&dir.open(TAIL_FILE, false).await?).await?;
    let in_place = resumable && data_size == Some(layout.data_len) && tail_size == Some(tail_len);
    // the space the files still have to grow by (starting over frees what they held), before writing anything
    let needed = if in_place { 0 } else { layout.data_len.saturating_sub(data_size.unwrap_or(0)) + tail_len.saturating_sub(tail_size.unwrap_or(0)) };
    dir.ensure_space(needed).await?;
    if !in_place {
        // nothing here can be trusted: forget what vouched for old bytes, then describe the new files
        dir.remove(JOURNAL_FILE).await?;
        dir.remove(HASH_FILE).await?;
        dir.remove(CHECKS_LOG).await?;
        dir.remove(CHECKS_FILE).await?;
        write_manifest(dir, &manifest).await?;
    }
    let open = |name: &'static str| async move { dir.open(name, true).await?.ok_or_else(|| format!("{}: cannot create {name}", dir.describe())) };
    let files = IngestFiles { data: open(DATA_FILE).await?, tail: open(TAIL_FILE).await?, data_len: layout.data_len };
    if !in_place {
        for (file, len) in [(&files.data, layout.data_len), (&files.tail, tail_len)] {
            file.set_len(0).await?;
            file.set_len(len).await?;
            file.flush().await?;
        }
    }
    let (mut journal, mut done) = Journal::open(dir, units.len()).await?;
    let expected: Vec<Option<String>> = manifest.parts.iter().map(|p| p.sha256.clone()).collect();
    let mut verifier = Verifier::resume(dir, &files, &layout, &units, manifest.unit_bytes, &done, &expected, options.in_flight).await?;

    // a resumed ingest first hashes what it finds finished past the saved frontier (read back, not refetched)
    if units.get(verifier.frontier()).is_some_and(|_| done.contains(&(verifier.frontier() as u32))) {
        let mut hashed: u64 = units[..verifier.frontier()].iter().map(|u| u.len).sum();
        let meter = Meter::new(Phase::Verify, hashed, total);
        on_progress(&meter.at(hashed));
        let result = verifier
            .advance(dir, &files, &layout, &units, &done, &expected, &mut |n| {
                hashed += n;
                on_progress(&meter.at(hashed));
            })
            .await;
        settle(dir, &manifest, &mut verifier, &units, result).await?;
    }

    // fetch
    let mut bytes_done: u64 = done.iter().map(|&i| units[i as usize].len).sum();
    let meter = Meter::new(Phase::Fetch, bytes_done, total);
    on_progress(&meter.at(bytes_done));
    let todo: Vec<usize> = (0..units.len()).filter(|i| !done.contains(&(*i as u32))).collect();
    let fetch_one = |i: usize| {
        let u = units[i];
        let (layout, files, src) = (&layout, &files, &parts[u.part]);
        async move {
            let (bytes, size) = src.read_range(u.start, u.len).await?;
            if size != layout.part_lens[u.part] {
                return Err(format!("{}: the file is now {size} bytes, it was {}: the source changed", src.describe(), layout.part_lens[u.part]));
            }
            if bytes.len() as u64 != u.len {
                return Err(format!("{}: bytes {}..{}: got {} bytes", src.describe(), u.start, u.start + u.len, bytes.len()));
            }
            files.write_part_range(layout, u.part, u.start, &bytes).await?;
            Ok::<(usize, Vec<u8>), String>((i, bytes))
        }
    };
    let mut next = 0;
    let mut running = FuturesUnordered::new();
    while next < todo.len() || !running.is_empty() {
        while next < todo.len() && running.len() < options.in_flight {
            running.push(fetch_one(todo[next]));
            next += 1;
        }
        let (i, bytes) = running.next().await.expect("not empty")?;
        // the bytes first, then the journal entry that vouches for them
        files.flush().await?;
        journal.record(i as u32).await?;
        done.insert(i as u32);
        bytes_done += units[i].len;
        verifier.offer(i, bytes);
        let result = verifier.advance(dir, &files, &layout, &units, &done, &expected, &mut |_| {}).await;
        settle(dir, &manifest, &mut verifier, &units, result).await?;
        on_progress(&meter.at(bytes_done));
    }
    drop(running);

    // every byte is in and hashed: mark the store complete (one atomic write), then clean up
    let digests = verifier.digests(&units).ok_or_else(|| format!("{}: every unit is in but not every byte was hashed (a bug)", dir.describe()))?;
    for (p, got) in manifest.parts.iter_mut().zip(digests) {
        p.sha256.get_or_insert_with(|| got.clone());
    }
    let mut checks = verifier.checks(&layout).ok_or_else(|| format!("{}: every byte was hashed but not every check value computed (a bug)", dir.describe()))?;
    checks.headers = header_checks;
    let size = files.data.size().await?;
    if size != layout.data_len {
        return Err(format!("{}: {DATA_FILE} is {size} bytes, expected {}: the store was changed while ingesting", dir.describe(), layout.data_len));
    }
    // every kept run once more against its check value: bytes changed on disk while the ingest was stopped,
    // after they were hashed, are fetched again here
    let checking = Meter::new(Phase::Verify, 0, layout.data_len);
    let mut report = |phase: Phase, done: u64, of: u64| on_progress(&if phase == Phase::Verify { checking.at(done) } else { Progress::at_rest(phase, done, of) });
    repair::check_and_repair(&files.data, &layout, &checks, parts, manifest.unit_bytes, &dir.describe(), &mut report).await?;
    drop((journal, files, verifier));
    // the check values first: a complete store always has them
    write_checks(dir, &checks).await?;
    manifest.state = StoreState::Complete;
    write_manifest(dir, &manifest).await?;
    remove_ingest_files(dir).await?;
    // the last event keeps the fetch's average rate
    on_progress(&Progress { phase: Phase::Done, eta_s: Some(0.0), ..meter.at(total) });
    Ok(manifest)
}
