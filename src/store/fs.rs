//! The store on the native file system: a folder, positioned I/O, atomic replace by rename.

use super::{StoreDir, StoreFile};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::rc::Rc;

pub struct FsDir {
    pub path: PathBuf,
}

impl FsDir {
    /// Opens (and creates) the folder.
    pub fn new(path: impl Into<PathBuf>) -> Result<FsDir, String> {
        let path = path.into();
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(FsDir { path })
    }
}

#[derive(Clone)]
pub struct FsFile {
    file: Rc<File>,
    name: String,
}

impl StoreFile for FsFile {
    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.file.read_exact_at(buf, offset).map_err(|e| format!("{}: read {} bytes at {offset}: {e}", self.name, buf.len()))
    }
    async fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.file.write_all_at(data, offset).map_err(|e| format!("{}: write {} bytes at {offset}: {e}", self.name, data.len()))
    }
    async fn size(&self) -> Result<u64, String> {
        Ok(self.file.metadata().map_err(|e| format!("{}: {e}", self.name))?.len())
    }
    async fn set_len(&self, len: u64) -> Result<(), String> {
        self.file.set_len(len).map_err(|e| format!("{}: {e}", self.name))
    }
    async fn flush(&self) -> Result<(), String> {
        self.file.sync_data().map_err(|e| format!("{}: {e}", self.name))
    }
}

impl StoreDir for FsDir {
    type File = FsFile;
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    async fn open(&self, name: &str, create: bool) -> Result<Option<FsFile>, String> {
        let path = self.path.join(name);
        match OpenOptions::new().read(true).write(true).create(create).truncate(false).open(&path) {
            Ok(f) => Ok(Some(FsFile { file: Rc::new(f), name: path.display().to_string() })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }
    async fn remove(&self, name: &str) -> Result<(), String> {
        let path = self.path.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("{}: {e}", path.display())),
            _ => Ok(()),
        }
    }
    async fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        let path = self.path.join(name);
        let tmp = self.path.join(super::temporary_name(name));
        let err = |e: std::io::Error| format!("{}: {e}", tmp.display());
        {
            let mut f = File::create(&tmp).map_err(err)?;
            std::io::Write::write_all(&mut f, bytes).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Ok(d) = File::open(&self.path) {
            let _ = d.sync_all();
        }
        Ok(())
    }
    async fn read_all(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let path = self.path.join(name);
        match std::fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }
}
