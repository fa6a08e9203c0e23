//! Ingest: a model's GGUF parts (from any [`RangeSource`]) into a store, resumable and verified.
//!
//! The parts are cut into units (runs of `unit_bytes` of one part file); several units are fetched at once and
//! each is written where the layout says (the bytes the store does not keep go to a tail of the data file). A
//! unit's index is appended to the journal only after its bytes are flushed, so a killed ingest resumes from the
//! journal, refetching only the units that were in flight. When every unit is in, every part is hashed in file
//! order from the store and checked against its size and (where known) sha256; only then is the tail cut off and
//! the manifest marked `complete`.

use crate::gguf::SplitModel;
use crate::source::{read_header, RangeSource};
use crate::store::{read_manifest, write_manifest, Manifest, PartIdentity, StoreDir, StoreFile, StoreLayout, StoreState, DATA_FILE, JOURNAL_FILE};
use futures_util::stream::{FuturesUnordered, StreamExt};
use sha2::{Digest, Sha256};
use std::collections::HashSet;

/// The pinned Ling 3.0 Flash Q4_K_M parts (Hugging Face, fixed revision).
pub const LING_FLASH_BASE: &str = "https://huggingface.co/inclusionAI/Ling-3.0-flash-GGUF/resolve/29edce5130491e638f3e5ebec91fa0a5ed4f780e/Q4_K_M/";
pub const LING_FLASH_PARTS: [(&str, u64, &str); 2] = [
    ("Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf", 49_995_534_208, "24ff06f1ab74546a91f7c07bd725b3015896bbe9dd82ab0e5838be9ed06a6dcf"),
    ("Ling-3.0-flash-Q4_K_M-00002-of-00002.gguf", 27_014_610_464, "1a6a8c91562b817fd8ec5b250453be696b0fc209ed8f2acdb6c13f4e17f7e188"),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Headers,
    Fetch,
    Verify,
    Done,
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

#[derive(Clone, Copy, Debug)]
struct Unit {
    part: usize,
    start: u64,
    len: u64,
}

fn plan_units(layout: &StoreLayout, unit_bytes: u64) -> Vec<Unit> {
    let mut units = Vec::new();
    for (part, &len) in layout.part_lens.iter().enumerate() {
        let mut start = 0;
        while start < len {
            let n = unit_bytes.min(len - start);
            units.push(Unit { part, start, len: n });
            start += n;
        }
    }
    units
}

/// Seconds on a monotonic-enough clock (`Instant` panics in wasm32-unknown-unknown).
fn now_s() -> f64 {
    #[cfg(target_arch = "wasm32")]
    return js_sys::Date::now() / 1000.0;
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<std::time::Instant> = OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
    }
}

struct Meter {
    began: f64,
    base: u64,
}

impl Meter {
    fn new(base: u64) -> Meter {
        Meter { began: now_s(), base }
    }
    fn progress(&self, phase: Phase, done: u64, total: u64) -> Progress {
        let secs = (now_s() - self.began).max(1e-3);
        let rate = done.saturating_sub(self.base) as f64 / secs;
        let eta_s = (rate > 0.0).then(|| (total - done) as f64 / rate);
        Progress { phase, bytes_done: done, bytes_total: total, rate, eta_s }
    }
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
    on_progress(&Progress { phase: Phase::Headers, bytes_done: 0, bytes_total: 0, rate: 0.0, eta_s: None });
    let mut headers = Vec::new();
    for (i, s) in parts.iter().enumerate() {
        let (h, size) = read_header(s).await?;
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

    // resume or start over
    let mut done: HashSet<u32> = HashSet::new();
    let existing = read_manifest(dir).await?;
    let mut resumable = false;
    if let Some(old) = &existing {
        let same_source = old.parts.iter().zip(&manifest.parts).all(|(a, b)| a.size == b.size && a.etag == b.etag && a.header_len == b.header_len && (a.sha256.is_none() || b.sha256.is_none() || a.sha256 == b.sha256))
            && old.parts.len() == manifest.parts.len();
        if !same_source {
            return Err(format!(
                "{}: the store holds another source (or the source changed: size or ETag differ); remove the store or use another folder",
                dir.describe()
            ));
        }
        if old.state == StoreState::Complete {
            on_progress(&Progress { phase: Phase::Done, bytes_done: total, bytes_total: total, rate: 0.0, eta_s: Some(0.0) });
            return Ok(old.clone());
        }
        // a resumed ingest keeps the unit size its journal counts in
        resumable = old.ingest_len == manifest.ingest_len && old.unit_bytes > 0;
        if resumable {
            manifest.unit_bytes = old.unit_bytes;
        }
    }
    let units = plan_units(&layout, manifest.unit_bytes);
    let data = dir.open(DATA_FILE, true).await?.expect("created");
    if resumable && data.size().await? == layout.ingest_len {
        if let Some(j) = dir.read_all(JOURNAL_FILE).await? {
            // a torn last entry (killed mid-write) is dropped
            for c in j.chunks_exact(4) {
                let u = u32::from_le_bytes(c.try_into().unwrap());
                if (u as usize) < units.len() {
                    done.insert(u);
                }
            }
        }
    } else {
        dir.remove(JOURNAL_FILE).await?;
        write_manifest(dir, &manifest).await?;
        data.set_len(0).await?;
        data.set_len(layout.ingest_len).await?;
        data.flush().await?;
    }
    // rewrite the journal clean (drops a torn tail and duplicates), atomically
    let clean: Vec<u8> = done.iter().flat_map(|u| u.to_le_bytes()).collect();
    dir.write_atomic(JOURNAL_FILE, &clean).await?;
    let journal = dir.open(JOURNAL_FILE, true).await?.expect("created");
    let mut journal_len = clean.len() as u64;

    // fetch
    let mut bytes_done: u64 = units.iter().enumerate().filter(|(i, _)| done.contains(&(*i as u32))).map(|(_, u)| u.len).sum();
    let meter = Meter::new(bytes_done);
    on_progress(&meter.progress(Phase::Fetch, bytes_done, total));
    let todo: Vec<usize> = (0..units.len()).filter(|i| !done.contains(&(*i as u32))).collect();
    let mut next = 0;
    let mut running = FuturesUnordered::new();
    let fetch_one = |i: usize| {
        let u = units[i];
        let (layout, data, src) = (&layout, &data, &parts[u.part]);
        async move {
            let (bytes, size) = src.read_range(u.start, u.len).await?;
            if size != layout.part_lens[u.part] {
                return Err(format!("{}: the file is now {size} bytes, it was {}: the source changed", src.describe(), layout.part_lens[u.part]));
            }
            if bytes.len() as u64 != u.len {
                return Err(format!("{}: bytes {}..{}: got {} bytes", src.describe(), u.start, u.start + u.len, bytes.len()));
            }
            for p in layout.pieces_in(u.part, u.start, u.len) {
                let at = (p.file_offset - u.start) as usize;
                data.write_at(p.store_offset, &bytes[at..at + p.len as usize]).await?;
            }
            Ok::<(usize, u64), String>((i, u.len))
        }
    };
    while next < todo.len() || !running.is_empty() {
        while next < todo.len() && running.len() < options.in_flight {
            running.push(fetch_one(todo[next]));
            next += 1;
        }
        let (i, n) = running.next().await.expect("not empty")?;
        // the data first, then the journal entry that vouches for it
        data.flush().await?;
        journal.write_at(journal_len, &(i as u32).to_le_bytes()).await?;
        journal.flush().await?;
        journal_len += 4;
        bytes_done += n;
        on_progress(&meter.progress(Phase::Fetch, bytes_done, total));
    }

    // verify every byte, part by part in file order, from the store
    let meter = Meter::new(0);
    let mut checked = 0u64;
    const CHUNK: u64 = 8 << 20;
    for part in 0..manifest.parts.len() {
        let id = manifest.parts[part].clone();
        let mut hasher = Sha256::new();
        let mut start = 0;
        while start < id.size {
            let n = CHUNK.min(id.size - start);
            let mut buf = vec![0u8; n as usize];
            for p in layout.pieces_in(part, start, n) {
                let at = (p.file_offset - start) as usize;
                data.read_at(p.store_offset, &mut buf[at..at + p.len as usize]).await?;
            }
            hasher.update(&buf);
            start += n;
            checked += n;
            on_progress(&meter.progress(Phase::Verify, checked, total));
        }
        let got = format!("{:x}", hasher.finalize());
        if let Some(want) = &id.sha256 {
            if &got != want {
                // the journal cannot say which units are bad: start this store over next time
                dir.remove(JOURNAL_FILE).await?;
                return Err(format!("{}: sha256 {got}, expected {want}: the downloaded bytes are corrupt; the store was reset", id.url));
            }
        }
        if manifest.parts[part].sha256.is_none() {
            manifest.parts[part].sha256 = Some(got);
        }
    }
    data.set_len(layout.data_len).await?;
    data.flush().await?;
    manifest.state = StoreState::Complete;
    write_manifest(dir, &manifest).await?;
    dir.remove(JOURNAL_FILE).await?;
    on_progress(&Progress { phase: Phase::Done, bytes_done: total, bytes_total: total, rate: 0.0, eta_s: Some(0.0) });
    Ok(manifest)
}
