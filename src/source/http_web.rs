//! HTTP Range requests with the browser's `fetch` (window or worker), checked like the native source's: 206
//! with a `Content-Range` naming exactly the bytes asked for, a body of exactly that length, and the size and
//! validator (`ETag`, …) of the first answer on every later one (a changed file is refused, never mixed in).
//! Network errors, 5xx/429 and short bodies are retried a few times with a growing pause; the rest are not.
//! Requests bypass the HTTP cache (`no-store`): tens of GB of model must not evict the rest of the cache.
//!
//! `fetch` has no timeout of its own, and a server that sends part of an answer and then nothing would hold
//! an ingest forever: the answer and every chunk of its body (read from the body's stream) must come within
//! the stall timeout ([`DEFAULT_STALL_TIMEOUT_MS`], [`HttpSource::with_stall_timeout_ms`]), else that attempt
//! is aborted (its own `AbortController`, joined to the caller's signal) and retried. Silence is bounded,
//! not the length of a download.

use super::remote::{check_identity, check_range, parse_content_range, validator, RemoteIdentity};
use super::RangeSource;
use crate::js;
use std::cell::RefCell;
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;

/// How long an answer, or the next chunk of its body, may take before the request is retried.
pub const DEFAULT_STALL_TIMEOUT_MS: u32 = 30_000;

pub struct HttpSource {
    pub url: String,
    identity: RefCell<Option<RemoteIdentity>>,
    signal: Option<web_sys::AbortSignal>,
    pub retries: u32,
    stall_ms: u32,
}

enum Failure {
    Retry(String),
    Fatal(String),
}

impl HttpSource {
    pub fn new(url: impl Into<String>) -> HttpSource {
        HttpSource { url: url.into(), identity: RefCell::new(None), signal: None, retries: 4, stall_ms: DEFAULT_STALL_TIMEOUT_MS }
    }

    /// Retries a request whose answer, or the next chunk of whose body, takes longer than `ms`.
    pub fn with_stall_timeout_ms(mut self, ms: u32) -> HttpSource {
        self.stall_ms = ms.max(1);
        self
    }

    fn stalled(&self, what: &str) -> Failure {
        Failure::Retry(format!("{}: {what}: no bytes from the server for {} (it stalled)", self.url, super::remote::describe_timeout_ms(self.stall_ms as u64)))
    }

    /// Requests in flight stop at once when `signal` aborts.
    pub fn with_signal(mut self, signal: Option<web_sys::AbortSignal>) -> HttpSource {
        self.signal = signal;
        self
    }

    /// Pins the identity (from a manifest being resumed): an answer with another size or ETag is refused.
    pub fn expect(&self, identity: RemoteIdentity) {
        *self.identity.borrow_mut() = Some(identity);
    }

    /// The identity from the first answer (None before any).
    pub fn identity(&self) -> Option<RemoteIdentity> {
        self.identity.borrow().clone()
    }

    /// Asks for the first byte to learn the size and ETag.
    pub async fn probe(&self) -> Result<RemoteIdentity, String> {
        self.fetch(0, 1).await?;
        self.identity().ok_or_else(|| format!("{}: no answer", self.url))
    }

    async fn fetch_once(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), Failure> {
        let url = &self.url;
        let end = start + len - 1;
        let fatal = |e: JsValue| Failure::Fatal(format!("{url}: {}", js::message(&e)));
        let init = web_sys::RequestInit::new();
        let headers = web_sys::Headers::new().map_err(fatal)?;
        headers.set("Range", &format!("bytes={start}-{end}")).map_err(fatal)?;
        init.set_headers(&headers);
        init.set_cache(web_sys::RequestCache::NoStore);
        // this attempt's own controller, so a stall can end it without aborting the caller's signal
        let attempt = web_sys::AbortController::new().map_err(fatal)?;
        let signal = match &self.signal {
            Some(outer) => web_sys::AbortSignal::any(&js_sys::Array::of2(outer, &attempt.signal())),
            None => attempt.signal(),
        };
        init.set_signal(Some(&signal));
        let request = web_sys::Request::new_with_str_and_init(url, &init).map_err(fatal)?;
        let aborted = |e: &JsValue| js::error_name(e).as_deref() == Some("AbortError");
        let response = match js::within(self.stall_ms, js::fetch(&request)).await {
            None => {
                attempt.abort();
                return Err(self.stalled(&format!("bytes {start}-{end}: waiting for the answer")));
            }
            Some(Ok(r)) => r,
            Some(Err(e)) if aborted(&e) => return Err(Failure::Fatal(format!("{url}: aborted"))),
            // a TypeError: the network failed (or CORS refused, which a retry does not mend, but cannot be told apart)
            Some(Err(e)) => return Err(Failure::Retry(format!("{url}: {}", js::message(&e)))),
        };
        let status = response.status();
        match status {
            206 => {}
            429 | 500..=599 => return Err(Failure::Retry(format!("{url}: HTTP {status} for bytes {start}-{end}"))),
            200 => {
                return Err(Failure::Fatal(format!(
                    "{url}: the server answered 200 (the whole file) to a Range request for bytes {start}-{end}: it does not support Range requests"
                )))
            }
            416 => return Err(Failure::Fatal(format!("{url}: bytes {start}-{end} are past the end of the file (HTTP 416)"))),
            s => return Err(Failure::Fatal(format!("{url}: HTTP {s} for bytes {start}-{end} (a Range request expects 206 Partial Content)"))),
        }
        let header = |name: &str| response.headers().get(name).ok().flatten();
        let cr = header("content-range")
            .ok_or_else(|| Failure::Fatal(format!("{url}: a 206 answer without a Content-Range the page may read (CORS: Access-Control-Expose-Headers)")))?;
        let total = parse_content_range(&cr).ok_or_else(|| Failure::Fatal(format!("{url}: unreadable Content-Range {cr:?}")))?.2;
        let tag = validator(header("x-linked-etag"), header("etag"), header("last-modified"));
        check_identity(&mut self.identity.borrow_mut(), url, total, tag).map_err(Failure::Fatal)?;
        let want_end = check_range(url, start, end, &cr, total).map_err(Failure::Fatal)?;
        let n = want_end + 1 - start;
        let body = self.read_body(&response, n, &attempt, &format!("bytes {start}-{want_end}")).await;
        attempt.abort(); // nothing more is read from this answer (a longer body than asked for stops here)
        let bytes = body?;
        if bytes.len() as u64 != n {
            return Err(Failure::Retry(format!("{url}: bytes {start}-{want_end}: got {} bytes of {n}", bytes.len())));
        }
        Ok((bytes, total))
    }

    /// Reads at most `n + 1` bytes of the body, chunk by chunk, each within the stall timeout.
    async fn read_body(&self, response: &web_sys::Response, n: u64, attempt: &web_sys::AbortController, what: &str) -> Result<Vec<u8>, Failure> {
        use wasm_bindgen::JsCast;
        let url = &self.url;
        let aborted = |e: &JsValue| js::error_name(e).as_deref() == Some("AbortError");
        let Some(stream) = response.body() else { return Ok(Vec::new()) };
        let reader: web_sys::ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
        let mut bytes = Vec::with_capacity(n as usize);
        while (bytes.len() as u64) <= n {
            let chunk = match js::within(self.stall_ms, JsFuture::from(reader.read())).await {
                None => {
                    attempt.abort();
                    return Err(self.stalled(&format!("{what}: after {} of {n} bytes", bytes.len())));
                }
                Some(Ok(c)) => c,
                Some(Err(e)) if aborted(&e) => return Err(Failure::Fatal(format!("{url}: aborted"))),
                Some(Err(e)) => return Err(Failure::Retry(format!("{url}: {what}: the body broke off after {} bytes: {}", bytes.len(), js::message(&e)))),
            };
            if js_sys::Reflect::get(&chunk, &"done".into()).ok().and_then(|d| d.as_bool()).unwrap_or(true) {
                break;
            }
            let value = js_sys::Reflect::get(&chunk, &"value".into()).map_err(|e| Failure::Retry(format!("{url}: {what}: {}", js::message(&e))))?;
            let chunk = js_sys::Uint8Array::new(&value);
            let at = bytes.len();
            bytes.resize(at + chunk.length() as usize, 0);
            chunk.copy_to(&mut bytes[at..]);
        }
        Ok(bytes)
    }

    async fn fetch(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let mut attempt = 0;
        loop {
            match self.fetch_once(start, len).await {
                Ok(v) => return Ok(v),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(e)) if attempt >= self.retries => return Err(format!("{e} (after {} tries)", attempt + 1)),
                Err(Failure::Retry(_)) => {
                    js::sleep_ms(200 << attempt.min(5)).await;
                    attempt += 1;
                }
            }
        }
    }
}

impl RangeSource for HttpSource {
    fn describe(&self) -> String {
        self.url.clone()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        if let Some(id) = self.identity() {
            if start >= id.size || len == 0 {
                return Ok((Vec::new(), id.size));
            }
        }
        if len == 0 {
            return Ok((Vec::new(), self.probe().await?.size));
        }
        self.fetch(start, len).await
    }
}
