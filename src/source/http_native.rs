//! HTTP Range reads natively, through `ureq` (a maintained blocking client). Each request runs on its own
//! thread and its answer comes back through a channel, so the async [`RangeSource`] contract holds and several
//! requests can be in flight at once.
//!
//! Every answer is checked: 206 with a `Content-Range` naming exactly the bytes asked for and the size known
//! from the first answer, a body of exactly that length, and the same validator (`X-Linked-Etag`, `ETag`, or
//! failing both `Last-Modified`) as the first answer (a changed file is refused, never mixed in). Transport errors, 5xx/429 and short bodies are retried; the rest are not.
//!
//! A server that stalls (accepts the connection, or sends part of an answer, then nothing) must not hang an
//! ingest: every read of the connection — the answer's headers, each piece of its body — has to bring bytes
//! within the stall timeout ([`DEFAULT_STALL_TIMEOUT`], [`HttpSource::with_stall_timeout`]), else the request
//! is abandoned and retried. It bounds silence, not the length of a download, so slow links still work.

use super::remote::{check_identity, check_range, validator, RemoteIdentity};
use super::RangeSource;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a connection may stay silent (no header or body bytes) before the request is retried.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct HttpSource {
    url: String,
    agent: ureq::Agent,
    identity: Arc<Mutex<Option<RemoteIdentity>>>,
    pub retries: u32,
    stall_timeout: Duration,
}

enum Failure {
    Retry(String),
    Fatal(String),
}

impl HttpSource {
    pub fn new(url: &str) -> HttpSource {
        HttpSource { url: url.to_string(), agent: Self::agent(DEFAULT_STALL_TIMEOUT), identity: Arc::new(Mutex::new(None)), retries: 4, stall_timeout: DEFAULT_STALL_TIMEOUT }
    }

    fn agent(stall: Duration) -> ureq::Agent {
        // per read, not per body: a 16 MiB unit on a slow link may take minutes, but never a silent minute
        ureq::Agent::config_builder().http_status_as_error(false).timeout_connect(Some(stall)).timeout_per_read(Some(stall)).build().into()
    }

    /// Retries a request whose connection stays silent this long (connecting, waiting for the answer, or
    /// between pieces of its body).
    pub fn with_stall_timeout(mut self, stall: Duration) -> HttpSource {
        self.agent = Self::agent(stall);
        self.stall_timeout = stall;
        self
    }

    /// What a transport error says, a timeout spelled out as a stall.
    fn transport_error(&self, e: impl std::fmt::Display, timed_out: bool) -> String {
        if timed_out {
            format!("no bytes from the server for {} (it stalled; {e})", super::remote::describe_timeout_ms(self.stall_timeout.as_millis() as u64))
        } else {
            e.to_string()
        }
    }

    pub fn describe_url(&self) -> &str {
        &self.url
    }

    /// Pins the identity (from a manifest being resumed): an answer with another size or ETag is refused.
    pub fn expect(&self, identity: RemoteIdentity) {
        *self.identity.lock().unwrap() = Some(identity);
    }

    /// The identity from the first answer (None before any).
    pub fn identity(&self) -> Option<RemoteIdentity> {
        self.identity.lock().unwrap().clone()
    }

    /// Asks for the first byte to learn the size and ETag.
    pub async fn probe(&self) -> Result<RemoteIdentity, String> {
        self.fetch_async(0, 1).await?;
        Ok(self.identity().expect("set by the first answer"))
    }

    async fn fetch_async(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let (tx, rx) = futures_channel::oneshot::channel();
        let me = self.clone();
        std::thread::spawn(move || {
            let _ = tx.send(me.fetch(start, len));
        });
        rx.await.map_err(|_| format!("{}: the request thread died", self.url))?
    }

    fn fetch_once(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), Failure> {
        let url = &self.url;
        let end = start + len - 1;
        let mut resp = match self.agent.get(url).header("Range", &format!("bytes={start}-{end}")).call() {
            Ok(r) => r,
            Err(e) => {
                let timed_out = matches!(e, ureq::Error::Timeout(_));
                return Err(Failure::Retry(format!("{url}: bytes {start}-{end}: {}", self.transport_error(e, timed_out))));
            }
        };
        let status = resp.status().as_u16();
        if status == 429 || status >= 500 {
            return Err(Failure::Retry(format!("{url}: HTTP {status} for bytes {start}-{end}")));
        }
        if status == 200 {
            return Err(Failure::Fatal(format!("{url}: the server answered 200 (the whole file) to a Range request for bytes {start}-{end}: it does not support Range requests")));
        }
        if status == 416 {
            return Err(Failure::Fatal(format!("{url}: bytes {start}-{end} are past the end of the file (HTTP 416)")));
        }
        if status != 206 {
            return Err(Failure::Fatal(format!("{url}: HTTP {status} for bytes {start}-{end}")));
        }
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let cr = header("content-range").ok_or_else(|| Failure::Fatal(format!("{url}: a 206 answer without Content-Range")))?;
        let total = super::remote::parse_content_range(&cr).ok_or_else(|| Failure::Fatal(format!("{url}: unreadable Content-Range {cr:?}")))?.2;
        let tag = validator(header("x-linked-etag"), header("etag"), header("last-modified"));
        check_identity(&mut self.identity.lock().unwrap(), url, total, tag).map_err(Failure::Fatal)?;
        let want_end = check_range(url, start, end, &cr, total).map_err(Failure::Fatal)?;
        let n = want_end + 1 - start;
        let mut body = Vec::with_capacity(n as usize);
        let read = resp.body_mut().as_reader().take(n + 1).read_to_end(&mut body);
        if let Err(e) = read {
            let timed_out = e.kind() == std::io::ErrorKind::TimedOut || e.to_string().contains("timeout");
            return Err(Failure::Retry(format!("{url}: bytes {start}-{want_end}: the body broke off after {} bytes: {}", body.len(), self.transport_error(e, timed_out))));
        }
        if body.len() as u64 != n {
            return Err(Failure::Retry(format!("{url}: bytes {start}-{want_end}: got {} bytes of {n}", body.len())));
        }
        Ok((body, total))
    }

    fn fetch(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let mut attempt = 0;
        loop {
            match self.fetch_once(start, len) {
                Ok(v) => return Ok(v),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(e)) if attempt >= self.retries => return Err(format!("{e} (after {} tries)", attempt + 1)),
                Err(Failure::Retry(_)) => {
                    std::thread::sleep(Duration::from_millis(200 << attempt.min(5)));
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
        self.fetch_async(start, len).await
    }
}
