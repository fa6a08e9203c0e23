//! Small helpers for the browser code (wasm32 only): JS errors as messages, timers, the global scope.

use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// The name of a `DOMException` (or `Error`) — "QuotaExceededError", "NotFoundError", "AbortError", … — if
/// it is one.
pub fn error_name(e: &JsValue) -> Option<String> {
    js_sys::Reflect::get(e, &"name".into()).ok().and_then(|n| n.as_string())
}

/// A JS exception as text: `Name: message` where it has both.
pub fn message(e: &JsValue) -> String {
    if let Some(s) = e.as_string() {
        return s;
    }
    let msg = js_sys::Reflect::get(e, &"message".into()).ok().and_then(|m| m.as_string());
    match (error_name(e), msg) {
        (Some(n), Some(m)) if !m.is_empty() => format!("{n}: {m}"),
        (Some(n), _) => n,
        (None, Some(m)) => m,
        (None, None) => e.dyn_ref::<js_sys::Object>().map(|o| String::from(o.to_string())).unwrap_or_else(|| format!("{e:?}")),
    }
}

/// Waits `ms` milliseconds (setTimeout, in a window or a worker).
pub async fn sleep_ms(ms: u32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let global = js_sys::global();
        if let Ok(f) = js_sys::Reflect::get(&global, &"setTimeout".into()).and_then(|f| f.dyn_into::<js_sys::Function>().map_err(JsValue::from)) {
            let _ = f.call2(&global, &resolve, &JsValue::from(ms));
        } else {
            let _ = resolve.call0(&JsValue::NULL);
        }
    });
    let _ = JsFuture::from(promise).await;
}

/// A `setTimeout` as a future that resolves when it fires; dropping it clears the timer, so racing one
/// against every read of a long download leaves no timers behind.
pub struct Timeout {
    id: JsValue,
    fired: futures_channel::oneshot::Receiver<()>,
    _callback: wasm_bindgen::closure::Closure<dyn FnMut()>,
}

impl Timeout {
    pub fn new(ms: u32) -> Timeout {
        let (tx, fired) = futures_channel::oneshot::channel();
        let mut tx = Some(tx);
        let callback = wasm_bindgen::closure::Closure::<dyn FnMut()>::new(move || {
            if let Some(tx) = tx.take() {
                let _ = tx.send(());
            }
        });
        let global = js_sys::global();
        let id = js_sys::Reflect::get(&global, &"setTimeout".into())
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
            .and_then(|f| f.call2(&global, callback.as_ref(), &JsValue::from(ms)).ok())
            .unwrap_or(JsValue::UNDEFINED);
        Timeout { id, fired, _callback: callback }
    }
}

impl std::future::Future for Timeout {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        // a dropped sender (never: the callback owns it) counts as fired
        std::pin::Pin::new(&mut self.fired).poll(cx).map(|_| ())
    }
}

impl Drop for Timeout {
    fn drop(&mut self) {
        let global = js_sys::global();
        if let Ok(f) = js_sys::Reflect::get(&global, &"clearTimeout".into()).and_then(|f| f.dyn_into::<js_sys::Function>().map_err(JsValue::from)) {
            let _ = f.call1(&global, &self.id);
        }
    }
}

/// `future`, or `None` when `ms` milliseconds pass first (the future is dropped then).
pub async fn within<F: std::future::Future>(ms: u32, future: F) -> Option<F::Output> {
    let future = std::pin::pin!(future);
    match futures_util::future::select(future, Timeout::new(ms)).await {
        futures_util::future::Either::Left((v, _)) => Some(v),
        futures_util::future::Either::Right(_) => None,
    }
}

/// The page's or the worker's `navigator.storage`.
pub fn storage_manager() -> Result<web_sys::StorageManager, String> {
    let global = js_sys::global();
    if let Some(w) = global.dyn_ref::<web_sys::Window>() {
        Ok(w.navigator().storage())
    } else if let Some(w) = global.dyn_ref::<web_sys::WorkerGlobalScope>() {
        Ok(w.navigator().storage())
    } else {
        Err("no navigator.storage here (neither a window nor a worker)".into())
    }
}

/// `fetch` in a window or a worker.
pub async fn fetch(request: &web_sys::Request) -> Result<web_sys::Response, JsValue> {
    let global = js_sys::global();
    let promise = if let Some(w) = global.dyn_ref::<web_sys::Window>() {
        w.fetch_with_request(request)
    } else {
        global.unchecked_ref::<web_sys::WorkerGlobalScope>().fetch_with_request(request)
    };
    Ok(JsFuture::from(promise).await?.unchecked_into())
}
