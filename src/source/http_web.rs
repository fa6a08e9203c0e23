//! HTTP Range requests with the browser's `fetch` (window or worker).

use super::RangeSource;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

pub struct HttpSource {
    pub url: String,
}

fn js_err(e: JsValue) -> String {
    e.as_string().or_else(|| e.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message()))).unwrap_or_else(|| format!("{e:?}"))
}

async fn fetch(request: &web_sys::Request) -> Result<web_sys::Response, JsValue> {
    let global = js_sys::global();
    let promise = if let Some(w) = global.dyn_ref::<web_sys::Window>() {
        w.fetch_with_request(request)
    } else {
        global.unchecked_ref::<web_sys::WorkerGlobalScope>().fetch_with_request(request)
    };
    Ok(JsFuture::from(promise).await?.unchecked_into())
}

/// `bytes a-b/total` → total.
fn content_range_total(header: &str) -> Option<u64> {
    header.trim().strip_prefix("bytes ")?.split('/').nth(1)?.trim().parse().ok()
}

impl RangeSource for HttpSource {
    fn describe(&self) -> String {
        self.url.clone()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let init = web_sys::RequestInit::new();
        let headers = web_sys::Headers::new().map_err(js_err)?;
        headers.set("Range", &format!("bytes={}-{}", start, start + len.max(1) - 1)).map_err(js_err)?;
        init.set_headers(&headers);
        let request = web_sys::Request::new_with_str_and_init(&self.url, &init).map_err(js_err)?;
        let response = fetch(&request).await.map_err(|e| format!("{}: {}", self.url, js_err(e)))?;
        match response.status() {
            206 => {}
            416 => return Err(format!("{}: range {start}+{len} is past the end of the file", self.url)),
            s => return Err(format!("{}: expected 206 Partial Content for a Range request, got HTTP {s}", self.url)),
        }
        let total = response
            .headers()
            .get("Content-Range")
            .map_err(js_err)?
            .and_then(|h| content_range_total(&h))
            .ok_or_else(|| format!("{}: the 206 answer has no usable Content-Range header", self.url))?;
        let buffer = JsFuture::from(response.array_buffer().map_err(js_err)?).await.map_err(js_err)?;
        let bytes = js_sys::Uint8Array::new(&buffer).to_vec();
        let expected = len.min(total.saturating_sub(start));
        if bytes.len() as u64 != expected {
            return Err(format!("{}: asked for {expected} bytes at {start}, got {}", self.url, bytes.len()));
        }
        Ok((bytes, total))
    }
}
