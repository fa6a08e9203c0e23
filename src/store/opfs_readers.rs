//! Several readers of one OPFS store file, read at once: one sync access handle reads far below what the disk
//! gives, so the engine's expert reads are spread over a pool of small workers, each with its own
//! *read-only* sync access handle on the file (Chromium lets any number of those share a file, and none of
//! them share it with a writer). The workers run a few lines of JS (`opfs_reader.js`) started from a Blob
//! URL, so they need no file of their own in a package; they inherit this context's origin, hence its OPFS.
//!
//! A read is cut into chunks spread over the readers with the fewest bytes queued, and the chunks land in the
//! caller's buffer in order. The pool is a read-only [`StoreFile`], so the store's part views (and the engine's
//! record reader over them, which checks every record against the store's check values) read through it
//! unchanged. A reader that stops (its worker failed or was ended) fails its reads in flight with a clear error
//! and is started again at the next read; dropping the last clone of the pool ends every reader.

use super::opfs::{check_name, STORES_FOLDER};
use super::StoreFile;
use crate::js;
use futures_channel::oneshot;
use futures_util::lock::Mutex;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

const READER_SOURCE: &str = include_str!("opfs_reader.js");

/// Reads are cut into chunks of at least this many bytes (smaller ones cost more in messages than they gain).
const MIN_CHUNK: u64 = 512 << 10;

/// Why a pool could not be opened.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadersError {
    /// Reader workers or read-only sync access handles are not available here (no `Worker`, a page policy
    /// that forbids blob: workers, a browser without `mode: "read-only"`): read the file another way.
    Unavailable(String),
    /// The readers could not open the file (it is being written elsewhere, it is missing, …).
    Failed(String),
}

impl ReadersError {
    pub fn message(&self) -> &str {
        match self {
            ReadersError::Unavailable(m) | ReadersError::Failed(m) => m,
        }
    }
}

/// A reply from a reader (its message's `data`), or why there was none.
type Reply = Result<JsValue, String>;

/// What a reader and its event handlers share.
#[derive(Default)]
struct ReaderState {
    /// Requests sent and not answered: where the answer goes, and the bytes asked.
    pending: RefCell<HashMap<u32, (oneshot::Sender<Reply>, u64)>>,
    /// Bytes asked of this reader and not answered yet (the pool gives new chunks to the least loaded).
    queued: Cell<u64>,
    /// Why the reader stopped, once it has.
    stopped: RefCell<Option<String>>,
    reads: Cell<u64>,
    bytes: Cell<u64>,
}

impl ReaderState {
    /// Marks the reader stopped and fails every read waiting on it.
    fn stop(&self, why: String) {
        if self.stopped.borrow().is_none() {
            *self.stopped.borrow_mut() = Some(why.clone());
        }
        let pending: Vec<_> = self.pending.borrow_mut().drain().collect();
        for (_, (tx, _)) in pending {
            let _ = tx.send(Err(why.clone()));
        }
        self.queued.set(0);
    }
}

fn field(data: &JsValue, key: &str) -> Option<JsValue> {
    js_sys::Reflect::get(data, &key.into()).ok().filter(|v| !v.is_undefined() && !v.is_null())
}

/// One worker with its handle.
struct Reader {
    worker: web_sys::Worker,
    state: Rc<ReaderState>,
    _on_message: Closure<dyn FnMut(web_sys::MessageEvent)>,
    _on_error: Closure<dyn FnMut(web_sys::Event)>,
}

impl Reader {
    fn spawn(url: &str) -> Result<Reader, String> {
        let worker = web_sys::Worker::new(url).map_err(|e| js::message(&e))?;
        let state = Rc::new(ReaderState::default());
        let on_message = {
            let state = state.clone();
            Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
                let data = ev.data();
                let Some(id) = field(&data, "id").and_then(|v| v.as_f64()) else { return };
                let Some((tx, bytes)) = state.pending.borrow_mut().remove(&(id as u32)) else { return };
                state.queued.set(state.queued.get().saturating_sub(bytes));
                let reply = match field(&data, "error") {
                    Some(e) => {
                        let name = field(&data, "name").and_then(|n| n.as_string()).unwrap_or_default();
                        Err(format!("{name}: {}", e.as_string().unwrap_or_default()))
                    }
                    None => Ok(data),
                };
                let _ = tx.send(reply);
            })
        };
        // an uncaught error in the worker, or its script refused (a page policy): nothing it has been asked will
        // be answered
        let on_error = {
            let state = state.clone();
            Closure::<dyn FnMut(web_sys::Event)>::new(move |ev: web_sys::Event| {
                ev.prevent_default();
                let detail = ev.dyn_ref::<web_sys::ErrorEvent>().map(|e| e.message()).filter(|m| !m.is_empty());
                state.stop(match detail {
                    Some(m) => format!("its worker failed: {m}"),
                    None => "its worker failed (its script did not start, or it crashed)".into(),
                });
            })
        };
        worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        worker.set_onmessageerror(Some(on_error.as_ref().unchecked_ref()));
        Ok(Reader { worker, state, _on_message: on_message, _on_error: on_error })
    }

    /// Sends `message` (its `id` set to `id`) and waits for the answer.
    fn ask(&self, id: u32, message: &js_sys::Object, bytes: u64) -> impl std::future::Future<Output = Reply> {
        let (tx, rx) = oneshot::channel();
        let state = self.state.clone();
        let sent = match &*state.stopped.borrow() {
            Some(why) => Err(why.clone()),
            None => {
                let _ = js_sys::Reflect::set(message, &"id".into(), &id.into());
                self.worker.post_message(message).map_err(|e| js::message(&e))
            }
        };
        if sent.is_ok() {
            state.pending.borrow_mut().insert(id, (tx, bytes));
            state.queued.set(state.queued.get() + bytes);
        }
        async move {
            sent?;
            rx.await.unwrap_or_else(|_| Err("the readers were closed".into()))
        }
    }

    /// Hands `buffer` back to the reader for its next reads (nothing to do if it has stopped).
    fn recycle(&self, buffer: &JsValue) {
        if self.state.stopped.borrow().is_some() {
            return;
        }
        let message = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&message, &"recycle".into(), buffer);
        let _ = self.worker.post_message_with_transfer(&message, &js_sys::Array::of1(buffer));
    }

    fn end(&self, why: &str) {
        self.worker.terminate();
        self.state.stop(why.to_string());
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.end("the readers were closed");
        // no events reach the handlers once they are gone
        self.worker.set_onmessage(None);
        self.worker.set_onerror(None);
        self.worker.set_onmessageerror(None);
    }
}

struct Pool {
    folder: String,
    store: String,
    file: String,
    label: String,
    url: String,
    size: Cell<u64>,
    readers: RefCell<Vec<Rc<Reader>>>,
    next_id: Cell<u32>,
    /// Where the search for the least loaded reader starts (ties go round).
    turn: Cell<usize>,
    /// Held while stopped readers are replaced, so two reads do not both replace one.
    restarting: Mutex<()>,
    restarts: Cell<u64>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.readers.borrow_mut().clear();
        let _ = web_sys::Url::revoke_object_url(&self.url);
    }
}

/// A pool of readers of one store file (cheap to clone: clones share the readers).
#[derive(Clone)]
pub struct OpfsReaders(Rc<Pool>);

/// Reads served by one reader so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderCounts {
    pub reads: u64,
    pub bytes: u64,
}

impl OpfsReaders {
    /// Starts `n` readers of `file` in store `store`, each with its own read-only sync access handle. Fails
    /// while a writer holds the file (an ingest into the store elsewhere).
    pub async fn open(store: &str, file: &str, n: usize) -> Result<OpfsReaders, ReadersError> {
        check_name(store).map_err(ReadersError::Failed)?;
        let folder = STORES_FOLDER;
        if n == 0 {
            return Err(ReadersError::Failed("a pool of readers needs at least one reader".into()));
        }
        let label = format!("{folder}/{store}/{file}");
        let unavailable = |why: String| ReadersError::Unavailable(format!("{label}: no reader workers here ({why})"));
        let options = web_sys::BlobPropertyBag::new();
        options.set_type("text/javascript");
        let blob = web_sys::Blob::new_with_str_sequence_and_options(&js_sys::Array::of1(&READER_SOURCE.into()), &options).map_err(|e| unavailable(js::message(&e)))?;
        let url = web_sys::Url::create_object_url_with_blob(&blob).map_err(|e| unavailable(js::message(&e)))?;
        let pool = OpfsReaders(Rc::new(Pool {
            folder: folder.into(),
            store: store.into(),
            file: file.into(),
            label: label.clone(),
            url,
            size: Cell::new(0),
            readers: RefCell::new(Vec::new()),
            next_id: Cell::new(1),
            turn: Cell::new(0),
            restarting: Mutex::new(()),
            restarts: Cell::new(0),
        }));
        let mut readers = Vec::new();
        for _ in 0..n {
            readers.push(Reader::spawn(&pool.0.url).map_err(|e| unavailable(format!("new Worker: {e}")))?);
        }
        let opened = futures_util::future::join_all(readers.iter().map(|r| pool.open_one(r))).await;
        for result in opened {
            let size = result?;
            pool.0.size.set(size);
        }
        *pool.0.readers.borrow_mut() = readers.into_iter().map(Rc::new).collect();
        Ok(pool)
    }

    fn id(&self) -> u32 {
        let id = self.0.next_id.get();
        self.0.next_id.set(id.wrapping_add(1).max(1));
        id
    }

    /// Has `reader` open the file; its size.
    async fn open_one(&self, reader: &Reader) -> Result<u64, ReadersError> {
        let p = &self.0;
        let open = js_sys::Object::new();
        for (k, v) in [("folder", &p.folder), ("store", &p.store), ("file", &p.file)] {
            let _ = js_sys::Reflect::set(&open, &k.into(), &v.into());
        }
        let message = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&message, &"open".into(), &open);
        let reply = match reader.ask(self.id(), &message, 0).await {
            Ok(reply) => reply,
            // the worker never answered: it could not start here
            Err(why) if reader.state.stopped.borrow().is_some() => return Err(ReadersError::Unavailable(format!("{}: no reader workers here ({why})", p.label))),
            Err(e) if e.starts_with("NoModificationAllowedError") => {
                return Err(ReadersError::Failed(format!(
                    "{}: the file is being written elsewhere (an ingest into this store in another tab or worker?), so the engine's readers cannot open it: wait for that to finish ({e})",
                    p.label
                )))
            }
            Err(e) if e.starts_with("NotFoundError") => return Err(ReadersError::Failed(format!("{}: there is no such file ({e})", p.label))),
            Err(e) => return Err(ReadersError::Failed(format!("{}: a reader could not open the file: {e}", p.label))),
        };
        if field(&reply, "unsupported").is_some() {
            return Err(ReadersError::Unavailable(format!("{}: this browser has no read-only sync access handles (createSyncAccessHandle({{ mode: \"read-only\" }})), which several readers need", p.label)));
        }
        Ok(field(&reply, "size").and_then(|s| s.as_f64()).unwrap_or(0.0) as u64)
    }

    pub fn describe(&self) -> String {
        self.0.label.clone()
    }

    pub fn len(&self) -> usize {
        self.0.readers.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's size when the readers opened it (no writer can change it while they hold it).
    pub fn file_size(&self) -> u64 {
        self.0.size.get()
    }

    /// Reads and bytes each reader has served.
    pub fn counts(&self) -> Vec<ReaderCounts> {
        self.0.readers.borrow().iter().map(|r| ReaderCounts { reads: r.state.reads.get(), bytes: r.state.bytes.get() }).collect()
    }

    /// Readers started again after they stopped.
    pub fn restarts(&self) -> u64 {
        self.0.restarts.get()
    }

    /// Ends reader `i`'s worker at once, as a crash would: its reads in flight fail, and it is started again at
    /// the next read.
    pub fn end_reader(&self, i: usize) {
        if let Some(r) = self.0.readers.borrow().get(i) {
            r.end("its worker was ended");
        }
    }

    /// Replaces every stopped reader with a new one.
    async fn restart_stopped(&self) -> Result<(), String> {
        let stopped = |p: &Pool| p.readers.borrow().iter().any(|r| r.state.stopped.borrow().is_some());
        if !stopped(&self.0) {
            return Ok(());
        }
        let _guard = self.0.restarting.lock().await;
        let n = self.len();
        for i in 0..n {
            if self.0.readers.borrow()[i].state.stopped.borrow().is_none() {
                continue;
            }
            let fresh = Reader::spawn(&self.0.url).map_err(|e| format!("{}: restarting reader {} of {n}: new Worker: {e}", self.0.label, i + 1))?;
            self.open_one(&fresh).await.map_err(|e| format!("restarting reader {} of {n}: {}", i + 1, e.message()))?;
            self.0.readers.borrow_mut()[i] = Rc::new(fresh);
            self.0.restarts.set(self.0.restarts.get() + 1);
        }
        Ok(())
    }

    /// Fills `buf` with the bytes at `offset`, in chunks read by several readers at once.
    pub async fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let len = buf.len() as u64;
        let what = |detail: &str| format!("{}: read {len} bytes at {offset}: {detail}", self.0.label);
        if offset.checked_add(len).is_none_or(|end| end > self.file_size()) {
            return Err(what(&format!("the file is {} bytes", self.file_size())));
        }
        if len == 0 {
            return Ok(());
        }
        self.restart_stopped().await?;
        let readers = self.0.readers.borrow().clone();
        let n = readers.len();
        let pieces = (len.div_ceil(MIN_CHUNK)).clamp(1, n as u64);
        let chunk = len.div_ceil(pieces).next_multiple_of(4096) as usize;
        let mut asks = Vec::new();
        // each chunk's bytes are copied into its own part of `buf` as they arrive, while other readers still read
        for (k, part) in buf.chunks_mut(chunk).enumerate() {
            let bytes = part.len() as u64;
            // the least loaded reader; ties go round the pool, so reads one at a time do not all land on one
            let turn = self.0.turn.get();
            self.0.turn.set(turn.wrapping_add(1));
            let (i, reader) = readers.iter().enumerate().min_by_key(|(i, r)| (r.state.queued.get(), (i + n - turn % n) % n)).expect("at least one reader");
            let message = js_sys::Object::new();
            let _ = js_sys::Reflect::set(&message, &"at".into(), &((offset + (k * chunk) as u64) as f64).into());
            let _ = js_sys::Reflect::set(&message, &"len".into(), &(bytes as f64).into());
            let reader = reader.clone();
            let reply = reader.ask(self.id(), &message, bytes);
            asks.push(async move {
                let state = &reader.state;
                let data = reply.await.map_err(|e| {
                    if state.stopped.borrow().is_some() {
                        format!("reader {} of {n} stopped before answering ({e}); it is started again at the next read", i + 1)
                    } else {
                        e
                    }
                })?;
                let buffer: js_sys::ArrayBuffer = field(&data, "buffer").and_then(|b| b.dyn_into().ok()).ok_or_else(|| "a reader answered without bytes".to_string())?;
                if (buffer.byte_length() as u64) < bytes {
                    return Err(format!("a reader answered {} bytes for {bytes}", buffer.byte_length()));
                }
                js_sys::Uint8Array::new_with_byte_offset_and_length(&buffer, 0, bytes as u32).copy_to(part);
                reader.recycle(&buffer);
                state.reads.set(state.reads.get() + 1);
                state.bytes.set(state.bytes.get() + bytes);
                Ok::<_, String>(())
            });
        }
        futures_util::future::try_join_all(asks).await.map_err(|e| what(&e))?;
        Ok(())
    }
}

impl StoreFile for OpfsReaders {
    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.read_into(offset, buf).await
    }
    async fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        Err(format!("{}: cannot write {} bytes at {offset}: the engine's readers open it read-only", self.0.label, data.len()))
    }
    async fn size(&self) -> Result<u64, String> {
        Ok(self.file_size())
    }
    async fn set_len(&self, len: u64) -> Result<(), String> {
        Err(format!("{}: cannot cut it to {len} bytes: the engine's readers open it read-only", self.0.label))
    }
    async fn flush(&self) -> Result<(), String> {
        Ok(())
    }
}
