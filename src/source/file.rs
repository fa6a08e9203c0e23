//! A local file as a range source (native).

use super::RangeSource;
use std::fs::File;
use std::path::{Path, PathBuf};

pub struct FileSource {
    path: PathBuf,
    file: File,
    len: u64,
}

impl FileSource {
    pub fn open(path: &Path) -> Result<FileSource, String> {
        let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        Ok(FileSource { path: path.to_path_buf(), file, len })
    }
}

impl RangeSource for FileSource {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        use std::os::unix::fs::FileExt;
        let end = start.saturating_add(len).min(self.len);
        let mut buf = vec![0u8; end.saturating_sub(start) as usize];
        self.file.read_exact_at(&mut buf, start).map_err(|e| format!("{}: {e}", self.describe()))?;
        Ok((buf, self.len))
    }
}
