//! The engine's own store: a model's bytes rearranged for streaming — each part's header, the dense tensors,
//! and one record per (layer, expert) holding that expert's gate, up and down rows — in one data file beside a
//! manifest. The layout is derived from the GGUF headers alone ([`StoreLayout::from_model`]), so ingest and
//! load agree. Files are reached through [`StoreDir`]/[`StoreFile`], the one place where platforms differ
//! (the native file system, OPFS in the browser).

mod checks;
mod files;
#[cfg(not(target_arch = "wasm32"))]
mod fs;
mod layout;
mod manifest;
#[cfg(target_arch = "wasm32")]
mod opfs;
#[cfg(target_arch = "wasm32")]
mod opfs_readers;

pub use checks::{check_value, Checker, StoreChecks, CHECKS_FILE};
pub use files::IngestFiles;
#[cfg(not(target_arch = "wasm32"))]
pub use fs::{FsDir, FsFile, Hold};
pub use layout::{Piece, StoreLayout, StorePartView};
pub use manifest::{Manifest, ManifestError, PartIdentity, StoreState, FORMAT_VERSION};
#[cfg(target_arch = "wasm32")]
pub use opfs::{check_quota, estimate, estimate_may_be_capped, persist, space_verdict, Access, OpfsDir, OpfsFile, STORES_FOLDER};
#[cfg(target_arch = "wasm32")]
pub use opfs_readers::{OpfsReaders, ReaderCounts, ReadersError};

/// Name of the data file inside a store: headers, dense tensors, expert records (`data_len` bytes, always).
pub const DATA_FILE: &str = "data.bin";
/// Name of the manifest inside a store.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Name of the ingest journal (finished unit indices, little-endian u32 each).
pub const JOURNAL_FILE: &str = "journal.bin";
/// Bytes of the parts that the store does not keep (MTP block, padding), held only while ingesting so every
/// byte can be hashed in file order; at `store_offset - data_len` (the layout numbers them after the data).
pub const TAIL_FILE: &str = "tail.bin";
/// The ingest's running sha256 (how far in file order every part is hashed), so a resume goes on from there.
pub const HASH_FILE: &str = "hash.json";
/// The check values of the runs (dense tensors, expert rows) hashed so far while ingesting: entries of a
/// little-endian u32 run index and u64 value, appended before the hash state that counts them is saved.
pub const CHECKS_LOG: &str = "checks.log";
/// Files that exist only while ingesting; a complete store has none of them.
pub const INGEST_FILES: [&str; 4] = [JOURNAL_FILE, TAIL_FILE, HASH_FILE, CHECKS_LOG];

/// Where [`StoreDir::write_atomic`] writes a file's next contents before they replace it (a kill can leave
/// one behind; [`remove_ingest_files`] clears them).
pub fn temporary_name(name: &str) -> String {
    format!("{name}.tmp")
}

/// Removes what an ingest leaves beside a complete store (the journal, the tail, the hash state and
/// unfinished atomic writes): a kill between marking the store complete and cleaning up leaves them.
pub async fn remove_ingest_files<D: StoreDir>(dir: &D) -> Result<(), String> {
    for name in INGEST_FILES {
        dir.remove(name).await?;
        dir.remove(&temporary_name(name)).await?;
    }
    dir.remove(&temporary_name(MANIFEST_FILE)).await
}

/// A file of a store: positioned reads and writes.
#[allow(async_fn_in_trait)]
pub trait StoreFile {
    /// Reads exactly `buf.len()` bytes at `offset` (an error when the file is shorter).
    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String>;
    async fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), String>;
    async fn size(&self) -> Result<u64, String>;
    /// Sets the length (grows with zeros or cuts).
    async fn set_len(&self, len: u64) -> Result<(), String>;
    /// Makes every write so far durable.
    async fn flush(&self) -> Result<(), String>;
}

/// A folder holding a store's files.
#[allow(async_fn_in_trait)]
pub trait StoreDir {
    type File: StoreFile;
    fn describe(&self) -> String;
    /// Opens a file; `create` makes it (empty) when it does not exist. `None` when absent and not created.
    async fn open(&self, name: &str, create: bool) -> Result<Option<Self::File>, String>;
    async fn remove(&self, name: &str) -> Result<(), String>;
    /// Writes a whole small file atomically: a reader sees the old contents or the new, never a mix.
    async fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<(), String>;
    /// Reads a whole small file; `None` when absent (or, where the platform makes a file before its first
    /// atomic write commits, empty — OPFS).
    async fn read_all(&self, name: &str) -> Result<Option<Vec<u8>>, String>;
    /// Fails with a clear error when fewer than `bytes` more can be stored here (checked before an ingest
    /// writes anything). Where the platform cannot tell, it lets the writes find out.
    async fn ensure_space(&self, bytes: u64) -> Result<(), String> {
        let _ = bytes;
        Ok(())
    }
}

/// What to do about a damaged store, said after the damage (ingest repairs what it can verify).
pub const REPAIR_HINT: &str = "ingest into it again to repair it (what is intact is kept)";

/// What to do about a store whose check values are lost.
pub const UNCHECKABLE_HINT: &str = "ingest into it again (with nothing to check its bytes against, it is fetched anew)";

/// A manifest error as a message naming the store and what to do.
pub fn manifest_message(describe: &str, e: &ManifestError) -> String {
    match e {
        ManifestError::Unreadable(why) => {
            format!("{describe}: {MANIFEST_FILE} is unreadable ({why}): the store was damaged; ingest into it again to make it anew")
        }
        ManifestError::Version(v) => format!(
            "{describe}: the store is of format version {v}, this build of lingtab reads version {FORMAT_VERSION}: another version of lingtab made it; use that version, or delete the store and ingest it again"
        ),
    }
}

/// Reads a store's manifest: `None` when there is none, `Some(Err)` when it is not one this build can use.
pub async fn find_manifest<D: StoreDir>(dir: &D) -> Result<Option<Result<Manifest, ManifestError>>, String> {
    Ok(dir.read_all(MANIFEST_FILE).await?.map(|bytes| Manifest::parse(&bytes)))
}

/// Reads a store's manifest; `None` when there is none, an error naming the problem when it is damaged or of
/// another format version.
pub async fn read_manifest<D: StoreDir>(dir: &D) -> Result<Option<Manifest>, String> {
    match find_manifest(dir).await? {
        None => Ok(None),
        Some(Ok(m)) => Ok(Some(m)),
        Some(Err(e)) => Err(manifest_message(&dir.describe(), &e)),
    }
}

pub async fn write_manifest<D: StoreDir>(dir: &D, m: &Manifest) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(m).map_err(|e| e.to_string())?;
    dir.write_atomic(MANIFEST_FILE, &bytes).await
}

/// Opens a complete store for loading: the model (from the stored headers) and one range source per part that
/// reads the part's bytes from the store (dense tensors and expert records), never the network.
pub async fn open_complete<D: StoreDir>(dir: &D) -> Result<(crate::gguf::SplitModel, Vec<StorePartView<D::File>>), String>
where
    D::File: Clone,
{
    let m = read_manifest(dir).await?.ok_or_else(|| format!("{}: no store here (no {MANIFEST_FILE})", dir.describe()))?;
    if m.state != StoreState::Complete {
        return Err(format!("{}: the store is not complete (an ingest into it was interrupted or failed): ingest into it again to finish it", dir.describe()));
    }
    let data = dir.open(DATA_FILE, false).await?.ok_or_else(|| format!("{}: {DATA_FILE} is missing: {REPAIR_HINT}", dir.describe()))?;
    let size = data.size().await?;
    if size != m.data_len {
        return Err(format!("{}: {DATA_FILE} is {size} bytes, the manifest says {}: the store was changed on disk; {REPAIR_HINT}", dir.describe(), m.data_len));
    }
    // the headers are checked before they are parsed: a changed byte there could change the model silently
    let checks = read_checks(dir).await?;
    let mut headers = Vec::new();
    for (i, p) in m.parts.iter().enumerate() {
        let mut buf = vec![0u8; p.header_len as usize];
        data.read_at(m.header_offsets[i], &mut buf).await?;
        if let Some(c) = &checks {
            c.verify_header(i, &buf).map_err(|e| format!("{} ({DATA_FILE}): {e}", dir.describe()))?;
        }
        let h = crate::gguf::parse_header(&buf, Some(p.size)).map_err(|e| format!("{}: stored header of part {}: {e}: {REPAIR_HINT}", dir.describe(), i + 1))?;
        headers.push((h, p.size));
    }
    let model = crate::gguf::SplitModel::new(headers).map_err(|e| format!("{}: {e}", dir.describe()))?;
    let layout = std::rc::Rc::new(StoreLayout::from_model(&model)?);
    if layout.data_len != m.data_len {
        return Err(format!("{}: the layout from the headers ({} bytes) disagrees with the manifest ({})", dir.describe(), layout.data_len, m.data_len));
    }
    // a kill after the store was marked complete can leave the ingest's files; loading does not need them gone
    let _ = remove_ingest_files(dir).await;
    let views = (0..model.parts.len()).map(|i| StorePartView::new(layout.clone(), i, data.clone(), dir.describe())).collect();
    Ok((model, views))
}

/// Reads a store's check values; `None` for a store without them (made before they existed). A store whose
/// manifest says it has them and whose check file is gone or unreadable is an error.
pub async fn read_checks<D: StoreDir>(dir: &D) -> Result<Option<StoreChecks>, String> {
    let expected = matches!(find_manifest(dir).await?, Some(Ok(m)) if m.checks);
    match dir.read_all(CHECKS_FILE).await? {
        None if expected => Err(format!("{}: {CHECKS_FILE} is missing: the store's bytes cannot be checked; {UNCHECKABLE_HINT}", dir.describe())),
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("{}: {CHECKS_FILE} is unreadable ({e}): the store's bytes cannot be checked; {UNCHECKABLE_HINT}", dir.describe())),
    }
}

pub async fn write_checks<D: StoreDir>(dir: &D, checks: &StoreChecks) -> Result<(), String> {
    let bytes = serde_json::to_vec(checks).map_err(|e| e.to_string())?;
    dir.write_atomic(CHECKS_FILE, &bytes).await
}
