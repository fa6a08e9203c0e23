//! Web Locks (`navigator.locks`) on stores, so that the tabs and workers of one origin — which share OPFS —
//! never write a store another one reads or writes: an ingest into a store or its deletion holds the store's
//! lock exclusively, an engine loaded from a store holds it shared until it is disposed. A request does not
//! wait unless asked to: a store held elsewhere is a clear error at once, saying what holds it. The browser
//! releases the locks of a tab or worker that goes away.

use crate::js;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

/// The lock's name for store `store`.
pub fn lock_name(store: &str) -> String {
    format!("lingtab-store:{store}")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Engines reading a store: any number at once.
    Shared,
    /// An ingest or a delete: alone.
    Exclusive,
}

/// A held lock, released when dropped (the lock manager lets go a moment later) or by [`StoreLock::release`].
pub struct StoreLock {
    /// Resolves the promise the lock's callback returned, which ends the hold.
    release: Option<js_sys::Function>,
    /// The request's promise: it settles once the lock is let go.
    released: Option<js_sys::Promise>,
}

impl StoreLock {
    /// Lets go of the lock and waits until the lock manager has (so a request right after finds it free).
    pub async fn release(mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.call0(&JsValue::NULL);
        }
        if let Some(p) = self.released.take() {
            let _ = JsFuture::from(p).await;
        }
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.call0(&JsValue::NULL);
        }
    }
}

fn lock_manager() -> Option<JsValue> {
    let navigator = js_sys::Reflect::get(&js_sys::global(), &"navigator".into()).ok()?;
    js_sys::Reflect::get(&navigator, &"locks".into()).ok().filter(|l| !l.is_undefined() && !l.is_null())
}

/// How store `store` is held now (from `navigator.locks.query()`): `Some(Exclusive)` when an ingest or a delete
/// holds it, `Some(Shared)` when only engines do, `None` when nothing does.
pub async fn holder(store: &str) -> Option<LockMode> {
    let locks = lock_manager()?;
    let query: js_sys::Function = js_sys::Reflect::get(&locks, &"query".into()).ok()?.dyn_into().ok()?;
    let snapshot = JsFuture::from(js_sys::Promise::from(query.call0(&locks).ok()?)).await.ok()?;
    let held = js_sys::Array::from(&js_sys::Reflect::get(&snapshot, &"held".into()).ok()?);
    let name = lock_name(store);
    let mut found = None;
    for lock in held.iter() {
        if js_sys::Reflect::get(&lock, &"name".into()).ok().and_then(|n| n.as_string()).as_deref() == Some(name.as_str()) {
            match js_sys::Reflect::get(&lock, &"mode".into()).ok().and_then(|m| m.as_string()).as_deref() {
                Some("exclusive") => return Some(LockMode::Exclusive),
                _ => found = Some(LockMode::Shared),
            }
        }
    }
    found
}

/// What a request that found the store held says, then what to do (`advice`).
async fn busy(store: &str, advice: &str) -> String {
    match holder(store).await {
        Some(LockMode::Shared) => format!("store {store:?} is in use by an engine loaded from it (in this or another tab or worker): {advice}"),
        _ => format!("store {store:?} is being downloaded or deleted in this or another tab or worker: {advice}"),
    }
}

/// Takes store `store`'s lock in `mode`. With `wait`, waits for the holders to let go (until `signal` aborts);
/// else fails at once when it is held, saying by what, then `advice`.
pub async fn lock_store(store: &str, mode: LockMode, wait: bool, signal: Option<&web_sys::AbortSignal>, advice: &str) -> Result<StoreLock, String> {
    let Some(locks) = lock_manager() else {
        // no Web Locks here (an old browser, or not a secure context): nothing to coordinate with
        web_sys::console::warn_1(&"lingtab: navigator.locks is not available; stores are not protected from other tabs".into());
        return Ok(StoreLock { release: None, released: None });
    };
    // a lock let go of a moment ago is released by the lock manager shortly after (an engine disposed, an
    // ingest ended: at once; a worker terminated, as a closed tab's: within a second or so): a second of
    // retries before the store counts as held
    let mut attempt = 0;
    loop {
        match request_lock(&locks, store, mode, wait, signal).await? {
            Some(lock) => return Ok(lock),
            None if attempt < 20 => {
                attempt += 1;
                js::sleep_ms(if attempt < 5 { 10 } else { 60 }).await;
            }
            None => return Err(busy(store, advice).await),
        }
    }
}

/// One request: the lock, or `None` when it is held (only without `wait`).
async fn request_lock(locks: &JsValue, store: &str, mode: LockMode, wait: bool, signal: Option<&web_sys::AbortSignal>) -> Result<Option<StoreLock>, String> {
    let options = js_sys::Object::new();
    let set = |k: &str, v: &JsValue| js_sys::Reflect::set(&options, &k.into(), v).map(|_| ()).map_err(|e| js::message(&e));
    set("mode", &(if mode == LockMode::Exclusive { "exclusive" } else { "shared" }).into())?;
    if wait {
        if let Some(s) = signal {
            set("signal", s)?;
        }
    } else {
        set("ifAvailable", &true.into())?;
    }
    let (granted_tx, granted_rx) = futures_channel::oneshot::channel::<Option<js_sys::Function>>();
    let callback = Closure::once_into_js(move |lock: JsValue| -> JsValue {
        if lock.is_null() {
            let _ = granted_tx.send(None);
            return js_sys::Promise::resolve(&JsValue::UNDEFINED).into();
        }
        let mut release = None;
        let held = js_sys::Promise::new(&mut |resolve, _| release = Some(resolve));
        let _ = granted_tx.send(release);
        held.into()
    });
    let request: js_sys::Function = js_sys::Reflect::get(locks, &"request".into()).and_then(|f| f.dyn_into().map_err(JsValue::from)).map_err(|e| js::message(&e))?;
    let done = request.call3(locks, &lock_name(store).into(), &options, &callback).map_err(|e| format!("navigator.locks.request: {}", js::message(&e)))?;
    // the request's promise rejects when the wait is aborted (the callback then never runs); it otherwise
    // settles when the lock is let go, which nobody waits for
    let done = js_sys::Promise::from(done);
    let aborted = JsFuture::from(done.clone());
    let granted = futures_util::future::select(granted_rx, Box::pin(aborted)).await;
    match granted {
        futures_util::future::Either::Left((Ok(Some(release)), _)) => Ok(Some(StoreLock { release: Some(release), released: Some(done) })),
        futures_util::future::Either::Left((Ok(None), _)) => Ok(None),
        futures_util::future::Either::Left((Err(_), _)) => Err(format!("store {store:?}: the lock request ended without an answer")),
        futures_util::future::Either::Right((Err(e), _)) if js::error_name(&e).as_deref() == Some("AbortError") => {
            Err(format!("waiting for store {store:?} (held by another tab or worker) was aborted"))
        }
        futures_util::future::Either::Right((r, _)) => Err(format!("store {store:?}: the lock request failed: {}", r.err().map(|e| js::message(&e)).unwrap_or_default())),
    }
}
