//! The store in the browser: a folder per store in the origin-private file system (OPFS), under
//! `lingtab-stores/`.
//!
//! Two ways to reach a file's bytes:
//! - [`Access::Sync`] (dedicated workers): a `FileSystemSyncAccessHandle` per file — reads and writes at
//!   offsets, `truncate`, `flush`, `getSize` — the fast way, and the only one fit for tens of GB.
//! - [`Access::Async`] (windows, where sync handles do not exist): reads are
//!   `getFile().slice(a, b).arrayBuffer()`; writes go to one `createWritable({ keepExistingData: true })`
//!   stream (`seek`, `write`, `truncate`) that `flush` closes, which commits them. Reads and `size` see what was
//!   flushed. Chromium copies the file into the stream's swap file when it opens one, so every flush of a big
//!   file costs a copy of it: ingest the real model in a worker (`WorkerEngine.ingest`).
//!
//! Small files are replaced atomically with `createWritable()` (no `keepExistingData`): the new bytes go to a
//! swap file and `close()` puts them in place at once, so a killed worker leaves the old contents or the new —
//! the same promise as write-then-rename natively, without needing `move()`. OPFS makes the file itself
//! (empty) before the first such write commits, so an empty small file reads as absent.
//!
//! A sync access handle locks its file; handles are kept per store folder and shared (one per file), and are
//! closed when the last user lets go, before a file is removed and before it is replaced.

use super::{StoreDir, StoreFile};
use crate::js;
use futures_util::lock::Mutex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// The OPFS folder that holds one folder per store.
pub const STORES_FOLDER: &str = "lingtab-stores";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `FileSystemSyncAccessHandle` (dedicated workers only).
    Sync,
    /// `getFile()` and `createWritable()` (anywhere).
    Async,
}

impl Access {
    /// Sync handles where this global offers them (a dedicated worker), else the async file API.
    pub fn best_here() -> Access {
        let has_sync = js_sys::Reflect::get(&js_sys::global(), &"FileSystemFileHandle".into())
            .and_then(|c| js_sys::Reflect::get(&c, &"prototype".into()))
            .and_then(|p| js_sys::Reflect::has(p.unchecked_ref::<js_sys::Object>(), &"createSyncAccessHandle".into()))
            .unwrap_or(false);
        if has_sync {
            Access::Sync
        } else {
            Access::Async
        }
    }
}

/// What a write refused for want of room says (QuotaExceededError, or a write that stored fewer bytes than
/// given): the store keeps every finished unit, so an ingest resumes after space is freed.
fn out_of_space(what: &str, detail: &str) -> String {
    format!(
        "{what}: not enough storage: {detail}; free space (other stores, site data, the disk) and ingest again: \
         the store keeps every finished unit and resumes where it stopped"
    )
}

fn quota_message(e: &JsValue, what: &str) -> Option<String> {
    (js::error_name(e).as_deref() == Some("QuotaExceededError"))
        .then(|| out_of_space(what, &format!("the browser's storage quota for this site is exhausted ({})", js::message(e))))
}

/// A JS error from an OPFS call on `what`, quota errors spelled out.
fn opfs_err(what: &str) -> impl Fn(JsValue) -> String + '_ {
    move |e| quota_message(&e, what).unwrap_or_else(|| format!("{what}: {}", js::message(&e)))
}

async fn call(promise: js_sys::Promise, what: &str) -> Result<JsValue, String> {
    JsFuture::from(promise).await.map_err(opfs_err(what))
}

/// The checked store name: a single OPFS entry name.
pub(super) fn check_name(store: &str) -> Result<(), String> {
    if store.is_empty() || store.len() > 200 || store == "." || store == ".." || store.contains(['/', '\\', '\0']) {
        return Err(format!("{store:?} is not a usable store name (1 to 200 characters, no slashes, not . or ..)"));
    }
    Ok(())
}

async fn opfs_root() -> Result<web_sys::FileSystemDirectoryHandle, String> {
    let storage = js::storage_manager()?;
    Ok(call(storage.get_directory(), "navigator.storage.getDirectory() (OPFS)").await?.unchecked_into())
}

/// The folder of all stores; `None` when it does not exist and `create` is false.
async fn stores_folder(create: bool) -> Result<Option<web_sys::FileSystemDirectoryHandle>, String> {
    let root = opfs_root().await?;
    let options = web_sys::FileSystemGetDirectoryOptions::new();
    options.set_create(create);
    match JsFuture::from(root.get_directory_handle_with_options(STORES_FOLDER, &options)).await {
        Ok(h) => Ok(Some(h.unchecked_into())),
        Err(e) if js::error_name(&e).as_deref() == Some("NotFoundError") => Ok(None),
        Err(e) => Err(opfs_err(STORES_FOLDER)(e)),
    }
}

/// `navigator.storage.estimate()`: (quota, usage) in bytes.
pub async fn estimate() -> Result<(u64, u64), String> {
    let storage = js::storage_manager()?;
    let promise = storage.estimate().map_err(opfs_err("navigator.storage.estimate()"))?;
    let est: web_sys::StorageEstimate = call(promise, "navigator.storage.estimate()").await?.unchecked_into();
    Ok((est.get_quota().unwrap_or(0.0) as u64, est.get_usage().unwrap_or(0.0) as u64))
}

/// Asks that the site's storage not be evicted under pressure (`navigator.storage.persist()`); `None` where
/// the browser does not offer it here (workers have only `persisted()`, which this reports instead).
pub async fn persist() -> Result<Option<bool>, String> {
    let storage = js::storage_manager()?;
    let has = |name: &str| js_sys::Reflect::get(&storage, &name.into()).map(|f| f.is_function()).unwrap_or(false);
    let promise = if has("persist") {
        storage.persist()
    } else if has("persisted") {
        storage.persisted()
    } else {
        return Ok(None);
    };
    let promise = promise.map_err(opfs_err("navigator.storage.persist()"))?;
    Ok(call(promise, "navigator.storage.persist()").await?.as_bool())
}

const GIB: u64 = 1 << 30;

/// Whether `quota - usage` may be Chrome's static figure rather than the real room: since Chrome 138,
/// `estimate()` reports `usage + min(10 GiB, disk)` to every site whatever its real quota, so a whole number
/// of GiB up to 10 GiB says nothing about how much more fits.
pub fn estimate_may_be_capped(quota: u64, usage: u64) -> bool {
    let free = quota.saturating_sub(usage);
    free > 0 && free <= 10 * GIB && free % GIB == 0
}

/// The space check before an ingest writes: `Ok(None)` when `needed` fits, `Ok(Some(warning))` when it does not
/// fit the estimate but the estimate may be Chrome's capped figure (then the writes find out, with a clear
/// error at the real quota), `Err` when the estimate (or `limit`, a budget set on the store) is authoritative.
pub fn space_verdict(needed: u64, quota: u64, usage: u64, limit: Option<u64>) -> Result<Option<String>, String> {
    let limited = limit.map(|l| quota.min(usage.saturating_add(l))).filter(|&q| q < quota);
    if let Some(q) = limited {
        return check_quota(needed, q, usage).map(|()| None);
    }
    match check_quota(needed, quota, usage) {
        Ok(()) => Ok(None),
        Err(_) if estimate_may_be_capped(quota, usage) => Ok(Some(format!(
            "the store needs {needed} more bytes and navigator.storage.estimate() allows {} more, but that is the \
             figure Chrome reports to every site (usage + min(10 GiB, disk)), not the real quota: ingesting anyway; a \
             write past the real quota stops the ingest with a clear error, and it resumes after space is freed",
            quota.saturating_sub(usage)
        ))),
        Err(e) => Err(e),
    }
}

/// Whether `needed` more bytes fit in what the browser allows this site (`quota - usage`).
pub fn check_quota(needed: u64, quota: u64, usage: u64) -> Result<(), String> {
    let available = quota.saturating_sub(usage);
    if needed > available {
        let gb = |x: u64| x as f64 / 1e9;
        return Err(format!(
            "not enough storage: the store needs {needed} more bytes ({:.2} GB) and the browser allows this site {available} more \
             ({:.2} GB; quota {quota}, used {usage}); free space (other stores, site data, the disk) and try again",
            gb(needed),
            gb(available)
        ));
    }
    Ok(())
}

enum Kind {
    Sync(RefCell<Option<web_sys::FileSystemSyncAccessHandle>>),
    Async { handle: web_sys::FileSystemFileHandle, writable: Mutex<Option<web_sys::FileSystemWritableFileStream>> },
}

struct FileInner {
    label: String,
    kind: Kind,
}

impl FileInner {
    fn close(&self) {
        match &self.kind {
            Kind::Sync(h) => {
                if let Some(h) = h.borrow_mut().take() {
                    h.close();
                }
            }
            Kind::Async { writable, .. } => {
                // unflushed writes are not durable by contract: drop them and release the file
                if let Some(mut w) = writable.try_lock() {
                    if let Some(w) = w.take() {
                        let _ = w.abort();
                    }
                }
            }
        }
    }
}

impl Drop for FileInner {
    fn drop(&mut self) {
        self.close();
    }
}

/// A file of an OPFS store (cheap to clone: clones share the handle).
#[derive(Clone)]
pub struct OpfsFile(Rc<FileInner>);

impl OpfsFile {
    fn sync(&self) -> Result<Option<web_sys::FileSystemSyncAccessHandle>, String> {
        match &self.0.kind {
            Kind::Sync(h) => h.borrow().clone().map(Some).ok_or_else(|| format!("{}: the file was closed (replaced or removed)", self.0.label)),
            Kind::Async { .. } => Ok(None),
        }
    }

    fn at(offset: u64) -> web_sys::FileSystemReadWriteOptions {
        let o = web_sys::FileSystemReadWriteOptions::new();
        o.set_at(offset as f64);
        o
    }

    /// The async kind's write stream (opened, keeping the data, when none is), locked for one operation.
    async fn writable(&self) -> Result<futures_util::lock::MutexGuard<'_, Option<web_sys::FileSystemWritableFileStream>>, String> {
        let Kind::Async { handle, writable } = &self.0.kind else { unreachable!("async files only") };
        let mut w = writable.lock().await;
        if w.is_none() {
            let options = web_sys::FileSystemCreateWritableOptions::new();
            options.set_keep_existing_data(true);
            *w = Some(call(handle.create_writable_with_options(&options), &format!("{}: createWritable", self.0.label)).await?.unchecked_into());
        }
        Ok(w)
    }

    async fn file(&self) -> Result<web_sys::File, String> {
        let Kind::Async { handle, .. } = &self.0.kind else { unreachable!("async files only") };
        Ok(call(handle.get_file(), &format!("{}: getFile", self.0.label)).await?.unchecked_into())
    }
}

impl StoreFile for OpfsFile {
    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let what = format!("{}: read {} bytes at {offset}", self.0.label, buf.len());
        if let Some(h) = self.sync()? {
            let n = h.read_with_u8_array_and_options(buf, &Self::at(offset)).map_err(opfs_err(&what))? as usize;
            if n != buf.len() {
                return Err(format!("{what}: the file ends after {n} of them"));
            }
            return Ok(());
        }
        let file = self.file().await?;
        let end = offset + buf.len() as u64;
        if end as f64 > file.size() {
            return Err(format!("{what}: the file is {} bytes", file.size()));
        }
        let slice = file.slice_with_f64_and_f64(offset as f64, end as f64).map_err(opfs_err(&what))?;
        let bytes = call(slice.array_buffer(), &what).await?;
        js_sys::Uint8Array::new(&bytes).copy_to(buf);
        Ok(())
    }

    async fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        let what = format!("{}: write {} bytes at {offset}", self.0.label, data.len());
        if let Some(h) = self.sync()? {
            // at the quota Chromium has answered 4294967288 (2^32 - 8) instead of throwing QuotaExceededError: any
            // count but the length is a write that did not happen as asked; the journal does not vouch for it
            let n = h.write_with_u8_array_and_options(data, &Self::at(offset)).map_err(opfs_err(&what))?;
            if n != data.len() as f64 {
                return Err(out_of_space(&what, &format!("the browser wrote {n} of the {} bytes (its storage quota for this site or the disk is full)", data.len())));
            }
            return Ok(());
        }
        let guard = self.writable().await?;
        let w = guard.as_ref().expect("opened");
        call(w.seek_with_f64(offset as f64).map_err(opfs_err(&what))?, &what).await?;
        call(w.write_with_u8_array(data).map_err(opfs_err(&what))?, &what).await?;
        Ok(())
    }

    async fn size(&self) -> Result<u64, String> {
        if let Some(h) = self.sync()? {
            return Ok(h.get_size().map_err(opfs_err(&format!("{}: getSize", self.0.label)))? as u64);
        }
        Ok(self.file().await?.size() as u64)
    }

    async fn set_len(&self, len: u64) -> Result<(), String> {
        let what = format!("{}: truncate to {len} bytes", self.0.label);
        if let Some(h) = self.sync()? {
            return h.truncate_with_f64(len as f64).map_err(opfs_err(&what));
        }
        let guard = self.writable().await?;
        let w = guard.as_ref().expect("opened");
        call(w.truncate_with_f64(len as f64).map_err(opfs_err(&what))?, &what).await?;
        Ok(())
    }

    async fn flush(&self) -> Result<(), String> {
        let what = format!("{}: flush", self.0.label);
        if let Some(h) = self.sync()? {
            return h.flush().map_err(opfs_err(&what));
        }
        let Kind::Async { writable, .. } = &self.0.kind else { unreachable!() };
        let stream = writable.lock().await.take();
        if let Some(w) = stream {
            // closing commits every write since the stream was opened, at once
            call(w.close(), &what).await?;
        }
        Ok(())
    }
}

/// Aborts a write stream when dropped (an error or a dropped future before its commit), so it never commits
/// and lets go of the file at once: an open stream keeps a sync access handle off the file until it is
/// garbage-collected.
struct AbortOnDrop(Option<web_sys::FileSystemWritableFileStream>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = s.abort();
        }
    }
}

/// Runs the OPFS call `start` makes, again while it fails with NoModificationAllowedError for up to a second: a
/// worker terminated a moment ago (a reader of a disposed engine, a closed tab) lets go of its sync access
/// handles shortly after, not at once.
async fn released_shortly(mut start: impl FnMut() -> Result<js_sys::Promise, JsValue>) -> Result<JsValue, JsValue> {
    let mut attempt = 0;
    loop {
        match JsFuture::from(start()?).await {
            Err(e) if js::error_name(&e).as_deref() == Some("NoModificationAllowedError") && attempt < 10 => {
                attempt += 1;
                js::sleep_ms(100).await;
            }
            done => return done,
        }
    }
}

/// `handle.createSyncAccessHandle({ mode: "read-only" })` (web-sys has no binding for the options yet).
fn sync_handle_read_only(handle: &web_sys::FileSystemFileHandle) -> Result<js_sys::Promise, JsValue> {
    let create: js_sys::Function = js_sys::Reflect::get(handle, &"createSyncAccessHandle".into())?.dyn_into()?;
    let options = js_sys::Object::new();
    js_sys::Reflect::set(&options, &"mode".into(), &"read-only".into())?;
    create.call1(handle, &options)?.dyn_into()
}

/// One store's folder in OPFS.
pub struct OpfsDir {
    name: String,
    dir: web_sys::FileSystemDirectoryHandle,
    access: Access,
    files: RefCell<HashMap<String, OpfsFile>>,
    /// At most this many more bytes may be used, whatever the browser's quota (see [`OpfsDir::limit_space`]).
    space_limit: Option<u64>,
    /// Sync handles are opened read-only (see [`OpfsDir::read_only`]).
    read_only: bool,
}

impl OpfsDir {
    /// Opens the folder of store `name` (making it when `create`); `None` when it does not exist.
    pub async fn open(name: &str, create: bool) -> Result<Option<OpfsDir>, String> {
        check_name(name)?;
        let Some(stores) = stores_folder(create).await? else { return Ok(None) };
        let options = web_sys::FileSystemGetDirectoryOptions::new();
        options.set_create(create);
        match JsFuture::from(stores.get_directory_handle_with_options(name, &options)).await {
            Ok(h) => Ok(Some(OpfsDir { name: name.to_string(), dir: h.unchecked_into(), access: Access::best_here(), files: RefCell::default(), space_limit: None, read_only: false })),
            Err(e) if js::error_name(&e).as_deref() == Some("NotFoundError") => Ok(None),
            Err(e) => Err(opfs_err(&format!("store {name:?}"))(e)),
        }
    }

    /// Uses the given way to the files instead of the best one here.
    pub fn with_access(mut self, access: Access) -> OpfsDir {
        self.access = access;
        self
    }

    /// Opens sync access handles read-only (`mode: "read-only"`): any number of them share a file (an engine's
    /// reader workers, another tab's engine), and no writer gets it meanwhile. Writes through them fail.
    pub fn read_only(mut self) -> OpfsDir {
        self.read_only = true;
        self
    }

    /// Lets this store grow by at most `bytes` more, on top of the browser's quota — a budget a page can set,
    /// checked the same way as the quota.
    pub fn limit_space(mut self, bytes: u64) -> OpfsDir {
        self.space_limit = Some(bytes);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn access(&self) -> Access {
        self.access
    }

    /// The names of every store folder.
    pub async fn list() -> Result<Vec<String>, String> {
        let Some(stores) = stores_folder(false).await? else { return Ok(Vec::new()) };
        let entries = stores.values();
        let mut names = Vec::new();
        loop {
            let next = entries.next().map_err(opfs_err(STORES_FOLDER))?;
            let step = call(next, STORES_FOLDER).await?;
            if js_sys::Reflect::get(&step, &"done".into()).ok().and_then(|d| d.as_bool()).unwrap_or(true) {
                break;
            }
            let handle: web_sys::FileSystemHandle = js_sys::Reflect::get(&step, &"value".into()).map_err(opfs_err(STORES_FOLDER))?.unchecked_into();
            if handle.kind() == web_sys::FileSystemHandleKind::Directory {
                names.push(handle.name());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Deletes store `name` with every file in it; false when there was none.
    pub async fn delete(name: &str) -> Result<bool, String> {
        check_name(name)?;
        let Some(stores) = stores_folder(false).await? else { return Ok(false) };
        let options = web_sys::FileSystemRemoveOptions::new();
        options.set_recursive(true);
        match released_shortly(|| Ok(stores.remove_entry_with_options(name, &options))).await {
            Ok(_) => Ok(true),
            Err(e) if js::error_name(&e).as_deref() == Some("NotFoundError") => Ok(false),
            Err(e) if matches!(js::error_name(&e).as_deref(), Some("NoModificationAllowedError" | "InvalidModificationError" | "InvalidStateError")) => Err(format!(
                "store {name:?} is in use (an engine loaded from it, or an ingest into it, holds its files): dispose of it first ({})",
                js::message(&e)
            )),
            Err(e) => Err(opfs_err(&format!("deleting store {name:?}"))(e)),
        }
    }

    fn label(&self, file: &str) -> String {
        format!("{STORES_FOLDER}/{}/{file}", self.name)
    }

    async fn file_handle(&self, name: &str, create: bool) -> Result<Option<web_sys::FileSystemFileHandle>, String> {
        let options = web_sys::FileSystemGetFileOptions::new();
        options.set_create(create);
        match JsFuture::from(self.dir.get_file_handle_with_options(name, &options)).await {
            Ok(h) => Ok(Some(h.unchecked_into())),
            Err(e) if js::error_name(&e).as_deref() == Some("NotFoundError") => Ok(None),
            Err(e) => Err(opfs_err(&self.label(name))(e)),
        }
    }

    /// Closes the shared handle of `name` (if open) so the file can be replaced or removed.
    fn close(&self, name: &str) {
        if let Some(f) = self.files.borrow_mut().remove(name) {
            f.0.close();
        }
    }
}

impl StoreDir for OpfsDir {
    type File = OpfsFile;

    fn describe(&self) -> String {
        format!("OPFS store {:?}", self.name)
    }

    async fn open(&self, name: &str, create: bool) -> Result<Option<OpfsFile>, String> {
        if let Some(f) = self.files.borrow().get(name) {
            return Ok(Some(f.clone()));
        }
        let Some(handle) = self.file_handle(name, create).await? else { return Ok(None) };
        let label = self.label(name);
        let kind = match self.access {
            Access::Sync => {
                let created = released_shortly(|| if self.read_only { sync_handle_read_only(&handle) } else { Ok(handle.create_sync_access_handle()) }).await;
                let h = match created {
                    Ok(h) => h,
                    Err(e) if js::error_name(&e).as_deref() == Some("NoModificationAllowedError") => {
                        return Err(format!("{label}: the file is open elsewhere (another tab or worker using this store?): {}", js::message(&e)));
                    }
                    Err(e) => return Err(opfs_err(&label)(e)),
                };
                Kind::Sync(RefCell::new(Some(h.unchecked_into())))
            }
            Access::Async => Kind::Async { handle, writable: Mutex::new(None) },
        };
        // another open of the same name may have finished while this one waited: keep one handle per file
        let mut files = self.files.borrow_mut();
        if let Some(f) = files.get(name) {
            return Ok(Some(f.clone()));
        }
        let file = OpfsFile(Rc::new(FileInner { label, kind }));
        files.insert(name.to_string(), file.clone());
        Ok(Some(file))
    }

    async fn remove(&self, name: &str) -> Result<(), String> {
        self.close(name);
        match JsFuture::from(self.dir.remove_entry(name)).await {
            Ok(_) => Ok(()),
            Err(e) if js::error_name(&e).as_deref() == Some("NotFoundError") => Ok(()),
            Err(e) => Err(opfs_err(&format!("{}: remove", self.label(name)))(e)),
        }
    }

    async fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        self.close(name);
        let what = format!("{}: write {} bytes", self.label(name), bytes.len());
        let handle = self.file_handle(name, true).await?.expect("created");
        // no keepExistingData: the stream starts empty, and close() swaps it in whole
        let stream: web_sys::FileSystemWritableFileStream = released_shortly(|| Ok(handle.create_writable())).await.map_err(opfs_err(&what))?.unchecked_into();
        // if this future is dropped before the commit, abort the stream so it neither commits nor holds the file
        let mut pending = AbortOnDrop(Some(stream.clone()));
        call(stream.write_with_u8_array(bytes).map_err(opfs_err(&what))?, &what).await?;
        call(stream.close(), &what).await?;
        pending.0 = None;
        Ok(())
    }

    async fn read_all(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let cached = self.files.borrow().get(name).cloned();
        if let Some(f) = cached {
            let n = f.size().await?;
            let mut buf = vec![0u8; n as usize];
            f.read_at(0, &mut buf).await?;
            return Ok((!buf.is_empty()).then_some(buf));
        }
        let Some(handle) = self.file_handle(name, false).await? else { return Ok(None) };
        let what = format!("{}: read", self.label(name));
        let file: web_sys::File = call(handle.get_file(), &what).await?.unchecked_into();
        let bytes = js_sys::Uint8Array::new(&call(file.array_buffer(), &what).await?).to_vec();
        Ok((!bytes.is_empty()).then_some(bytes))
    }

    async fn ensure_space(&self, bytes: u64) -> Result<(), String> {
        let (quota, usage) = estimate().await?;
        match space_verdict(bytes, quota, usage, self.space_limit) {
            Ok(None) => Ok(()),
            Ok(Some(warning)) => {
                web_sys::console::warn_1(&format!("{}: {warning}", self.describe()).into());
                Ok(())
            }
            Err(e) => Err(format!("{}: {e}", self.describe())),
        }
    }
}
