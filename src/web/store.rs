//! The JavaScript API of stores: a model's GGUF parts ingested into OPFS once (over HTTP Range requests, or
//! from files the user already has), then loaded from there without the network.
//!
//! ```js
//! const summary = await ingest({ model: "https://…-00001-of-00002.gguf", store: "ling-flash", onProgress, signal });
//! const engine = await Engine.load({ store: "ling-flash" });
//! ```

use super::{get, js_error, to_js};
use crate::ingest::{IngestOptions, PartHint, Progress};
use crate::source::{BlobSource, HttpSource, RangeSource, Tracked};
use crate::store::{open_complete, read_checks, read_manifest, Access, Manifest, OpfsDir, OpfsFile, OpfsReaders, ReadersError, StoreChecks, StoreDir, StoreFile, StorePartView, StoreState, DATA_FILE, JOURNAL_FILE};
use serde::Serialize;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = r#"
/** Where to ingest a model from and into which store. */
export interface IngestOptions {
  /** URL of the first GGUF part (the others are found by their -0000N-of-0000M names), or every part's URL. */
  model?: string | string[];
  /** The GGUF parts as files the user picked (read from disk, not downloaded), instead of `model`. */
  files?: File[] | FileList;
  /** Name of the store (an OPFS folder); an unfinished ingest into it is resumed. */
  store: string;
  /** Expected sha256 of each part (lowercase hex), in order; otherwise a sha256 ETag is used when sent. */
  sha256?: string[];
  /** Called as the ingest goes. */
  onProgress?: (progress: IngestProgress) => void;
  /** Aborts the ingest; what is finished stays, and the next ingest into the store resumes from it. */
  signal?: AbortSignal;
  /** Bytes per request (default 16 MiB): the most an interruption refetches per request in flight. */
  unitBytes?: number;
  /** Requests in flight (default 6). */
  inFlight?: number;
  /** Milliseconds an answer, or the next chunk of its body, may take before that request is retried
   *  (default 30000): a server that stalls is left, not waited on forever. */
  stallTimeoutMs?: number;
  /** When another tab or worker is ingesting into this store (or an engine loaded from it is alive), wait for
   *  it to end instead of failing at once (the signal aborts the wait). Default false. */
  wait?: boolean;
}

export interface IngestProgress {
  /** "headers": reading the parts' headers; "verify": hashing bytes already stored (a resumed ingest), and
   *  reading the whole store back against its check values before it is complete (or when ingesting into a
   *  complete store, which fetches again only what is damaged); "fetch": downloading (and hashing in file order);
   *  "done". */
  phase: "headers" | "verify" | "fetch" | "done";
  bytesDone: number;
  bytesTotal: number;
  /** Bytes per second in this phase. */
  rate: number;
  /** Seconds left in this phase at the current rate (null before it is known). */
  etaSeconds: number | null;
}

export interface StorePart {
  /** The URL or file name the part came from. */
  source: string;
  size: number;
  /** Checked against the bytes before the store became complete. */
  sha256: string | null;
  etag: string | null;
}

export interface StoreSummary {
  name: string;
  /** "empty": a folder without a manifest (an ingest stopped before it began). */
  state: "ingesting" | "complete" | "empty";
  /** Where the model came from (the first part's URL or file name). */
  model: string | null;
  /** Bytes the store takes on disk. */
  bytes: number;
  /** Bytes of GGUF it holds the model of. */
  modelBytes: number;
  /** Bytes of GGUF already in the store: for an ingesting store, the finished units (from its journal; what a
   *  resume does not fetch again), null while an ingest running elsewhere holds the journal; `bytesTotal` when
   *  complete, 0 when empty. */
  bytesDone: number | null;
  /** Bytes of GGUF the store holds when complete (`modelBytes`; 0 when empty). */
  bytesTotal: number;
  parts: StorePart[];
  /** Whether the browser agreed to keep this site's storage under pressure (ingest only; null if unknown). */
  persisted?: boolean | null;
}

/** Ingests a model's GGUF parts into an OPFS store: resumable, every byte checked against each part's size
 *  and sha256 (where known); resolves when the store is complete. Best run in a worker (`WorkerEngine.ingest`),
 *  where OPFS offers sync access handles. */
export function ingest(options: IngestOptions): Promise<StoreSummary>;
/** Every store in this origin's OPFS. */
export function listStores(): Promise<StoreSummary[]>;
/** One store, or null when there is none by that name. */
export function storeInfo(name: string): Promise<StoreSummary | null>;
/** Deletes a store and its files; false when there was none. Fails while an ingest into it or an engine loaded
 *  from it (in any tab) is alive. */
export function deleteStore(name: string): Promise<boolean>;
"#;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartSummary {
    source: String,
    size: u64,
    sha256: Option<String>,
    etag: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StoreSummary {
    name: String,
    state: &'static str,
    model: Option<String>,
    bytes: u64,
    model_bytes: u64,
    bytes_done: Option<u64>,
    bytes_total: u64,
    parts: Vec<PartSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    persisted: Option<Option<bool>>,
}

/// A store's summary; `journal` is its journal's bytes when ingesting (`None`: unreadable now).
fn summary(name: &str, manifest: Option<&Manifest>, journal: Option<&[u8]>) -> StoreSummary {
    let Some(m) = manifest else {
        return StoreSummary { name: name.into(), state: "empty", model: None, bytes: 0, model_bytes: 0, bytes_done: Some(0), bytes_total: 0, parts: Vec::new(), persisted: None };
    };
    let model_bytes = m.parts.iter().map(|p| p.size).sum();
    let bytes_done = match m.state {
        StoreState::Complete => Some(model_bytes),
        StoreState::Ingesting => journal.map(|j| m.journaled_bytes(j)),
    };
    let (state, bytes) = match m.state {
        StoreState::Complete => ("complete", m.data_len),
        // the data and tail files have their full lengths from the start
        StoreState::Ingesting => ("ingesting", m.ingest_len),
    };
    StoreSummary {
        name: name.into(),
        state,
        model: m.parts.first().map(|p| p.url.clone()),
        bytes,
        model_bytes,
        bytes_done,
        bytes_total: model_bytes,
        parts: m.parts.iter().map(|p| PartSummary { source: p.url.clone(), size: p.size, sha256: p.sha256.clone(), etag: p.etag.clone() }).collect(),
        persisted: None,
    }
}

/// Reads a store's manifest without taking its files' locks (an engine may be using the store).
async fn info(name: &str) -> Result<Option<StoreSummary>, String> {
    let Some(dir) = OpfsDir::open(name, false).await? else { return Ok(None) };
    let dir = dir.with_access(Access::Async);
    let manifest = read_manifest(&dir).await?;
    // an ingest in progress (another worker) may hold the journal: then how far it is is not known here
    let journal = match &manifest {
        Some(m) if m.state == StoreState::Ingesting => dir.read_all(JOURNAL_FILE).await.map(|j| j.unwrap_or_default()).ok(),
        _ => None,
    };
    Ok(Some(summary(name, manifest.as_ref(), journal.as_deref())))
}

/// A whole number in [1, max], or the default.
fn count(options: &JsValue, name: &str, default: u64, max: u64) -> Result<u64, JsError> {
    match get(options, name).map(|v| v.as_f64()) {
        None => Ok(default),
        Some(Some(x)) if x.is_finite() && x >= 1.0 && x <= max as f64 && x.fract() == 0.0 => Ok(x as u64),
        Some(_) => Err(js_error(format!("ingest: options.{name} must be a whole number from 1 to {max}"))),
    }
}

/// The part number in a `-0000N-of-0000M` name, if it has one.
fn part_number(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(".gguf")?;
    let (head, _of) = stem.rsplit_once("-of-")?;
    head.rsplit_once('-')?.1.parse().ok()
}

fn progress_event(p: &Progress) -> JsValue {
    let ev = js_sys::Object::new();
    let set = |k: &str, v: JsValue| {
        let _ = js_sys::Reflect::set(&ev, &k.into(), &v);
    };
    set("phase", p.phase.as_str().into());
    set("bytesDone", (p.bytes_done as f64).into());
    set("bytesTotal", (p.bytes_total as f64).into());
    set("rate", p.rate.into());
    set("etaSeconds", p.eta_s.map(JsValue::from).unwrap_or(JsValue::NULL));
    ev.into()
}

async fn run<S: RangeSource>(dir: &OpfsDir, parts: Vec<S>, hints: &[PartHint], options: &IngestOptions, signal: &Option<web_sys::AbortSignal>, on_progress: Option<js_sys::Function>) -> Result<Manifest, String> {
    let signal = signal.clone();
    let check: Rc<dyn Fn(u64) -> Result<(), String>> = Rc::new(move |_| match &signal {
        Some(s) if s.aborted() => Err("ingest was aborted (what is finished is kept: ingest into the same store again to resume)".into()),
        _ => Ok(()),
    });
    let parts: Vec<Tracked<S>> = parts.into_iter().map(|inner| Tracked { inner, on_read: check.clone() }).collect();
    let mut report = |p: &Progress| {
        if let Some(f) = &on_progress {
            let _ = f.call1(&JsValue::NULL, &progress_event(p));
        }
    };
    crate::ingest::ingest(dir, &parts, hints, options, &mut report).await
}

/// Ingests a model's GGUF parts into an OPFS store (see `IngestOptions` in the TypeScript types).
#[wasm_bindgen(js_name = ingest, skip_typescript)]
pub async fn ingest_js(options: JsValue) -> Result<JsValue, JsError> {
    let store = get(&options, "store").and_then(|v| v.as_string()).ok_or_else(|| js_error("ingest: options.store (the name of the store to make or resume) is required"))?;
    let signal: Option<web_sys::AbortSignal> = match get(&options, "signal") {
        None => None,
        Some(s) => Some(s.dyn_into().map_err(|_| js_error("ingest: options.signal must be an AbortSignal"))?),
    };
    let on_progress = match get(&options, "onProgress") {
        None => None,
        Some(f) => Some(f.dyn_into::<js_sys::Function>().map_err(|_| js_error("ingest: options.onProgress must be a function"))?),
    };
    let defaults = IngestOptions::default();
    let ingest_options = IngestOptions {
        unit_bytes: count(&options, "unitBytes", defaults.unit_bytes, 256 << 20)?,
        in_flight: count(&options, "inFlight", defaults.in_flight as u64, 64)? as usize,
    };
    let stall_ms = count(&options, "stallTimeoutMs", crate::source::DEFAULT_STALL_TIMEOUT_MS as u64, 3_600_000)? as u32;
    let sha256: Vec<String> = match get(&options, "sha256") {
        None => Vec::new(),
        Some(v) => serde_wasm_bindgen::from_value(v).map_err(|_| js_error("ingest: options.sha256 must be an array of hex strings, one per part"))?,
    };
    if signal.as_ref().is_some_and(|s| s.aborted()) {
        return Err(js_error("ingest was aborted before it began"));
    }
    let wait = match get(&options, "wait") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| js_error("ingest: options.wait must be true or false"))?,
    };
    // one ingest of a store at a time, and none while an engine reads it (any tab or worker of this origin)
    let lock = super::lock::lock_store(&store, super::lock::LockMode::Exclusive, wait, signal.as_ref(), "ingest into it when that ends, or pass wait: true to wait for it")
        .await
        .map_err(|e| js_error(format!("ingest: {e}")))?;
    let request = Request { store, signal, on_progress, ingest_options, stall_ms, sha256 };
    let result = ingest_locked(&request, &options).await;
    lock.release().await;
    result
}

/// An ingest's options, checked.
struct Request {
    store: String,
    signal: Option<web_sys::AbortSignal>,
    on_progress: Option<js_sys::Function>,
    ingest_options: IngestOptions,
    stall_ms: u32,
    sha256: Vec<String>,
}

/// The ingest itself, with the store's lock held.
async fn ingest_locked(request: &Request, options: &JsValue) -> Result<JsValue, JsError> {
    let Request { store, signal, on_progress, ingest_options, stall_ms, sha256 } = request;
    let (store, stall_ms) = (store.as_str(), *stall_ms);
    let persisted = crate::store::persist().await.ok().flatten();
    let dir = OpfsDir::open(store, true).await.map_err(js_error)?.expect("created");

    let manifest = match (get(options, "files"), get(options, "model")) {
        (Some(_), Some(_)) => return Err(js_error("ingest: give options.model (URLs) or options.files (picked files), not both")),
        (None, None) => return Err(js_error("ingest: options.model (the URL of the first GGUF part) or options.files (the GGUF parts, picked by the user) is required")),
        (Some(files), None) => {
            let mut parts: Vec<BlobSource> = js_sys::Array::from(&files)
                .iter()
                .map(|f| f.dyn_into::<web_sys::File>().map(BlobSource::from_file).map_err(|_| js_error("ingest: options.files must hold File objects")))
                .collect::<Result<_, _>>()?;
            if parts.is_empty() {
                return Err(js_error("ingest: options.files is empty"));
            }
            // a file picker gives files in any order: put -0000N-of-0000M names in part order
            if parts.iter().all(|p| part_number(p.name()).is_some()) {
                parts.sort_by_key(|p| part_number(p.name()));
            }
            let hints = hints_from(&sha256, parts.len(), |i| PartHint { size: Some(parts[i].size()), ..Default::default() })?;
            run(&dir, parts, &hints, ingest_options, signal, on_progress.clone()).await
        }
        (None, Some(model)) => {
            let urls: Vec<String> = if let Some(s) = model.as_string() {
                crate::gguf::split_part_names(&s).map_err(|e| js_error(format!("ingest: {e}")))?
            } else {
                serde_wasm_bindgen::from_value(model).map_err(|_| js_error("ingest: options.model must be a URL or an array of URLs"))?
            };
            if urls.is_empty() {
                return Err(js_error("ingest: options.model lists no URL"));
            }
            let parts: Vec<HttpSource> = urls.iter().map(|u| HttpSource::new(u.clone()).with_signal(signal.clone()).with_stall_timeout_ms(stall_ms)).collect();
            // the first answer pins each part's size and ETag; a sha256 ETag (Hugging Face's LFS files) is checked
            let mut ids = Vec::new();
            for p in &parts {
                ids.push(p.probe().await.map_err(js_error)?);
            }
            let hints = hints_from(&sha256, parts.len(), |i| PartHint { etag: ids[i].etag.clone(), size: Some(ids[i].size), sha256: ids[i].sha256.clone() })?;
            run(&dir, parts, &hints, ingest_options, signal, on_progress.clone()).await
        }
    }
    .map_err(js_error)?;
    let mut s = summary(store, Some(&manifest), None);
    s.persisted = Some(persisted);
    to_js(&s)
}

/// One hint per part, with the given sha256s (when given) over what the source said.
fn hints_from(sha256: &[String], n: usize, base: impl Fn(usize) -> PartHint) -> Result<Vec<PartHint>, JsError> {
    if !sha256.is_empty() && sha256.len() != n {
        return Err(js_error(format!("ingest: options.sha256 has {} entries for {n} parts", sha256.len())));
    }
    Ok((0..n)
        .map(|i| {
            let mut h = base(i);
            if let Some(s) = sha256.get(i) {
                h.sha256 = Some(s.to_ascii_lowercase());
            }
            h
        })
        .collect())
}

/// Every store in this origin's OPFS.
#[wasm_bindgen(js_name = listStores, skip_typescript)]
pub async fn list_stores() -> Result<JsValue, JsError> {
    let mut out = Vec::new();
    for name in OpfsDir::list().await.map_err(js_error)? {
        // a store another tab is deleting may vanish between the listing and the read
        if let Some(s) = info(&name).await.map_err(js_error)? {
            out.push(s);
        }
    }
    to_js(&out)
}

/// One store's summary, or null.
#[wasm_bindgen(js_name = storeInfo, skip_typescript)]
pub async fn store_info(name: String) -> Result<JsValue, JsError> {
    match info(&name).await.map_err(js_error)? {
        Some(s) => to_js(&s),
        None => Ok(JsValue::NULL),
    }
}

/// Deletes a store; false when there was none.
#[wasm_bindgen(js_name = deleteStore, skip_typescript)]
pub async fn delete_store(name: String) -> Result<bool, JsError> {
    let lock = super::lock::lock_store(&name, super::lock::LockMode::Exclusive, false, None, "delete it when that ends").await.map_err(|e| js_error(format!("deleteStore: {e}")))?;
    let deleted = OpfsDir::delete(&name).await.map_err(js_error);
    lock.release().await;
    deleted
}

/// A store's data file as an engine reads it: through a pool of reader workers (several reads at once), or
/// through one sync access handle in this worker where reader workers are not available.
pub enum StoreData {
    Readers(OpfsReaders),
    Handle(OpfsFile),
}

impl StoreFile for StoreData {
    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        match self {
            StoreData::Readers(r) => r.read_at(offset, buf).await,
            StoreData::Handle(f) => f.read_at(offset, buf).await,
        }
    }
    async fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        match self {
            StoreData::Readers(r) => r.write_at(offset, data).await,
            StoreData::Handle(f) => f.write_at(offset, data).await,
        }
    }
    async fn size(&self) -> Result<u64, String> {
        match self {
            StoreData::Readers(r) => r.size().await,
            StoreData::Handle(f) => f.size().await,
        }
    }
    async fn set_len(&self, len: u64) -> Result<(), String> {
        match self {
            StoreData::Readers(r) => r.set_len(len).await,
            StoreData::Handle(f) => f.set_len(len).await,
        }
    }
    async fn flush(&self) -> Result<(), String> {
        match self {
            StoreData::Readers(r) => r.flush().await,
            StoreData::Handle(f) => f.flush().await,
        }
    }
}

/// A complete store's model and one source per part reading from it (for `Engine.load({ store })`), through
/// `readers` reader workers (0: one handle in this worker; also where reader workers are not available, with a
/// note in the console).
pub async fn open_store(name: &str, readers: usize) -> Result<(crate::gguf::SplitModel, Vec<StorePartView<StoreData>>), JsError> {
    let dir = OpfsDir::open(name, false)
        .await
        .map_err(js_error)?
        .ok_or_else(|| js_error(format!("Engine.load: there is no store named {name:?} (make it with ingest({{ store: {name:?}, model }}))")))?;
    if readers > 0 {
        match OpfsReaders::open(name, DATA_FILE, readers).await {
            Ok(pool) => {
                // the readers' handles keep writers out from here on; the manifest and headers are read without
                // a handle of this worker's own
                let (model, views) = open_complete(&dir.with_access(Access::Async)).await.map_err(|e| js_error(format!("Engine.load: {e}")))?;
                let data_len = views.first().map(|v| v.layout().data_len).unwrap_or(0);
                if pool.file_size() != data_len {
                    return Err(js_error(format!("Engine.load: {}: the readers see {} bytes, the store has {data_len}", pool.describe(), pool.file_size())));
                }
                return Ok((model, views.into_iter().map(|v| v.map_file(|_| StoreData::Readers(pool.clone()))).collect()));
            }
            Err(ReadersError::Unavailable(why)) => {
                web_sys::console::warn_1(&format!("lingtab: store {name:?} is read by one reader in the engine's worker, not {readers}: {why}").into());
            }
            Err(ReadersError::Failed(e)) => {
                // no data file is the store's fault: the store names it, with how to repair it
                let unlocked = dir.with_access(Access::Async);
                if unlocked.open(DATA_FILE, false).await.map_err(js_error)?.is_none() {
                    open_complete(&unlocked).await.map_err(|store| js_error(format!("Engine.load: {store}")))?;
                }
                return Err(js_error(format!("Engine.load: {e}")));
            }
        }
    }
    // read-only, so other engines' readers can share the file (where the browser knows the mode)
    let (model, views) = open_complete(&dir.read_only()).await.map_err(|e| js_error(format!("Engine.load: {e}")))?;
    Ok((model, views.into_iter().map(|v| v.map_file(StoreData::Handle)).collect()))
}

/// A store's check values (for `Engine.load({ store })`: every dense tensor and expert record read is checked
/// before it reaches the GPU); `None` for a store made before stores had them.
pub(super) async fn store_checks(name: Option<&str>) -> Result<Option<StoreChecks>, JsError> {
    let Some(name) = name else { return Ok(None) };
    let Some(dir) = OpfsDir::open(name, false).await.map_err(js_error)? else { return Ok(None) };
    // read without taking a lock: the engine's views hold the data file's
    read_checks(&dir.with_access(Access::Async)).await.map_err(|e| js_error(format!("Engine.load: {e}")))
}
