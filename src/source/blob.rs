//! A user-picked `File` (or any `Blob`) as a source: a user who already downloaded the GGUF parts ingests
//! them from disk instead of downloading them again. Reads are `blob.slice(a, b).arrayBuffer()`.

use super::RangeSource;
use crate::js;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

pub struct BlobSource {
    blob: web_sys::Blob,
    name: String,
}

impl BlobSource {
    /// `name` says where the bytes came from in errors and the manifest (a `File`'s name, say).
    pub fn new(blob: web_sys::Blob, name: impl Into<String>) -> BlobSource {
        BlobSource { blob, name: name.into() }
    }

    /// A picked file, named by its file name.
    pub fn from_file(file: web_sys::File) -> BlobSource {
        let name = file.name();
        BlobSource { blob: file.unchecked_into(), name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size(&self) -> u64 {
        self.blob.size() as u64
    }
}

impl RangeSource for BlobSource {
    fn describe(&self) -> String {
        self.name.clone()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let total = self.size();
        if start > total {
            return Err(format!("{}: offset {start} is past the end ({total} bytes)", self.name));
        }
        let end = start.saturating_add(len).min(total);
        let err = |e: wasm_bindgen::JsValue| {
            // a picked file that changed on disk since it was picked can no longer be read (NotReadableError)
            format!("{}: reading bytes {start}..{end}: {} (was the file changed or moved after it was picked?)", self.name, js::message(&e))
        };
        let slice = self.blob.slice_with_f64_and_f64(start as f64, end as f64).map_err(err)?;
        let buffer = JsFuture::from(slice.array_buffer()).await.map_err(err)?;
        let bytes = js_sys::Uint8Array::new(&buffer).to_vec();
        if bytes.len() as u64 != end - start {
            return Err(format!("{}: asked for {} bytes at {start}, got {}", self.name, end - start, bytes.len()));
        }
        Ok((bytes, total))
    }
}
