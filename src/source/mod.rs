//! Where model bytes come from: HTTP Range requests (natively and in the browser), a local file natively, a
//! user-picked `File`/`Blob` in the browser. Every source answers the same question — "bytes
//! [start, start+len) and the file's total length" — so the header reader and ingest do not care which
//! platform they run on.

#[cfg(target_arch = "wasm32")]
mod blob;
#[cfg(not(target_arch = "wasm32"))]
mod file;
#[cfg(all(not(target_arch = "wasm32"), feature = "runtime"))]
mod http_native;
#[cfg(target_arch = "wasm32")]
mod http_web;
// (its checks serve the HTTP sources, which a build without `runtime` lacks natively)
#[cfg_attr(all(not(target_arch = "wasm32"), not(feature = "runtime")), allow(dead_code))]
mod remote;

#[cfg(target_arch = "wasm32")]
pub use blob::BlobSource;
#[cfg(not(target_arch = "wasm32"))]
pub use file::{read_exact_at, FileSource};
#[cfg(all(not(target_arch = "wasm32"), feature = "runtime"))]
pub use http_native::{HttpSource, DEFAULT_STALL_TIMEOUT};
#[cfg(target_arch = "wasm32")]
pub use http_web::{HttpSource, DEFAULT_STALL_TIMEOUT_MS};
pub use remote::RemoteIdentity;

use crate::gguf::{parse_header, split_part_names, GgufError, Header, SplitModel};

/// A readable, fixed-length run of bytes (one GGUF part).
#[allow(async_fn_in_trait)]
pub trait RangeSource {
    /// Where the bytes come from, for error messages.
    fn describe(&self) -> String;
    /// Reads `len` bytes at `start` (fewer only at the end of the file) and returns them with the total length.
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String>;
}

/// A borrowed source reads like the source itself (so a slice of parts can be read without moving them).
impl<S: RangeSource> RangeSource for &S {
    fn describe(&self) -> String {
        (**self).describe()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        (**self).read_range(start, len).await
    }
}

/// First read of a header: enough for the tiny model and most of a real one's vocabulary.
const FIRST_READ: u64 = 1 << 20;
/// The longest header read: about 40 times a 157k-token vocabulary's. A longer one is a corrupt length field,
/// which would otherwise have the whole file fetched into memory (beyond a wasm tab's 4 GiB) before it fails.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;

/// Reads a GGUF header from a source, fetching a longer prefix whenever the parser asks for one.
pub async fn read_header<S: RangeSource>(source: &S) -> Result<(Header, u64), String> {
    read_header_bytes(source).await.map(|(h, total, _)| (h, total))
}

/// [`read_header`], with the bytes read (at least the header's `data_start` of them, unless the file is shorter).
pub async fn read_header_bytes<S: RangeSource>(source: &S) -> Result<(Header, u64, Vec<u8>), String> {
    let (mut prefix, total) = source.read_range(0, FIRST_READ).await?;
    loop {
        match parse_header(&prefix, Some(total)) {
            Ok(h) if h.data_start > prefix.len() as u64 && h.data_start <= total => {
                // the header's padding up to the first tensor: part of what the store keeps of it. An alignment
                // may be up to 2^31, so the padding is read as the header is (doubling, never a request longer
                // than the bytes already received) and refused past the header limit.
                if h.data_start > MAX_HEADER_BYTES {
                    return Err(format!(
                        "{}: corrupt GGUF: the header claims to be longer than {} MiB (its tensor data starts at byte {})",
                        source.describe(),
                        MAX_HEADER_BYTES >> 20,
                        h.data_start
                    ));
                }
                while (prefix.len() as u64) < h.data_start {
                    let start = prefix.len() as u64;
                    let (got, asked) = read_more(source, &mut prefix, h.data_start).await?;
                    if got != asked {
                        return Err(format!("{}: the source returned {got} of {asked} bytes at offset {start}", source.describe()));
                    }
                }
                return Ok((h, total, prefix));
            }
            Ok(h) => return Ok((h, total, prefix)),
            Err(GgufError::NeedMoreBytes { needed }) if needed > MAX_HEADER_BYTES && needed <= total => {
                return Err(format!(
                    "{}: corrupt GGUF: the header claims to be longer than {} MiB (at least {needed} bytes)",
                    source.describe(),
                    MAX_HEADER_BYTES >> 20
                ));
            }
            Err(GgufError::NeedMoreBytes { needed }) if needed <= total && (prefix.len() as u64) < total => {
                let start = prefix.len() as u64;
                if read_more(source, &mut prefix, total).await?.0 == 0 {
                    return Err(format!("{}: the source returned no bytes at offset {start}", source.describe()));
                }
            }
            Err(GgufError::NeedMoreBytes { needed }) => {
                return Err(format!("{}: truncated GGUF: the header needs {needed} bytes, the file has {total}", source.describe()))
            }
            Err(e) => return Err(format!("{}: {e}", source.describe())),
        }
    }
}

/// Doubles `prefix` from the source, up to byte `limit`: a 150k-token vocabulary costs a handful of requests, and
/// no request (a source allocates what it is asked for) is longer than the bytes already received, whatever length
/// the header claims. Returns the bytes received and asked for.
async fn read_more<S: RangeSource>(source: &S, prefix: &mut Vec<u8>, limit: u64) -> Result<(u64, u64), String> {
    let start = prefix.len() as u64;
    let asked = (start * 2).max(FIRST_READ).min(limit) - start;
    let (more, _) = source.read_range(start, asked).await?;
    prefix.extend_from_slice(&more);
    Ok((more.len() as u64, asked))
}

/// Opens every part of a model from the name (path or URL) of its first part; `open` makes a source for a name.
pub async fn open_model<S: RangeSource>(first: &str, open: impl Fn(&str) -> Result<S, String>) -> Result<SplitModel, String> {
    let names = split_part_names(first).map_err(|e| e.to_string())?;
    let mut parts = Vec::with_capacity(names.len());
    for name in &names {
        parts.push(read_header(&open(name)?).await?);
    }
    SplitModel::new(parts).map_err(|e| format!("{first}: {e}"))
}

/// Bytes already in memory as a source (a model made on the fly, a file the user picked and read).
pub struct MemorySource {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl RangeSource for MemorySource {
    fn describe(&self) -> String {
        self.name.clone()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let total = self.bytes.len() as u64;
        if start > total {
            return Err(format!("{}: offset {start} is past the end ({total} bytes)", self.name));
        }
        let end = start.saturating_add(len).min(total);
        Ok((self.bytes[start as usize..end as usize].to_vec(), total))
    }
}

/// A source that reports every read to `on_read(bytes)` (progress bars) and stops when it returns an error
/// (an abort signal).
pub struct Tracked<S> {
    pub inner: S,
    pub on_read: std::rc::Rc<dyn Fn(u64) -> Result<(), String>>,
}

impl<S: RangeSource> RangeSource for Tracked<S> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let out = self.inner.read_range(start, len).await?;
        (self.on_read)(out.0.len() as u64)?;
        Ok(out)
    }
}
