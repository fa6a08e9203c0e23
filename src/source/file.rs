//! A local file as a range source (native). Large reads run on a thread of their own, so the expert cache's
//! misses (several records read at once) become parallel positioned reads.

use super::RangeSource;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct FileSource {
    path: PathBuf,
    file: Arc<File>,
    len: u64,
}

impl FileSource {
    pub fn open(path: &Path) -> Result<FileSource, String> {
        let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        Ok(FileSource { path: path.to_path_buf(), file: Arc::new(file), len })
    }
}

/// Below this a read is done in place: a thread costs more than it saves.
const THREAD_READ_MIN: usize = 256 << 10;

/// Fills `len` bytes at `offset` of `file`; reads of [`THREAD_READ_MIN`] or more on their own thread, so
/// reads awaited together (e.g. with `try_join_all`) overlap.
pub async fn read_exact_at(file: &Arc<File>, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    if len < THREAD_READ_MIN {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset)?;
        return Ok(buf);
    }
    let (tx, rx) = futures_channel::oneshot::channel();
    let file = file.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; len];
        let _ = tx.send(file.read_exact_at(&mut buf, offset).map(|_| buf));
    });
    rx.await.unwrap_or_else(|_| Err(std::io::Error::other("the reading thread died")))
}

impl RangeSource for FileSource {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let end = start.saturating_add(len).min(self.len);
        let buf = read_exact_at(&self.file, start, end.saturating_sub(start) as usize).await.map_err(|e| format!("{}: {e}", self.describe()))?;
        Ok((buf, self.len))
    }
}
