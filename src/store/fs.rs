//! The store on the native file system: a folder, positioned I/O, atomic replace by rename. A process that
//! writes a store holds the folder's OS lock (`flock`) exclusively, one that reads it holds it shared
//! ([`FsDir::hold`]): the system lets go of it when the process ends, killed or not.

use super::{StoreDir, StoreFile};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::rc::Rc;

pub struct FsDir {
    pub path: PathBuf,
    /// The folder, locked (see [`FsDir::hold`]); every file opened here keeps it, so the lock lasts as long
    /// as anything reads or writes the store.
    held: Option<Rc<File>>,
}

/// How a process holds a store folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Engines reading the store: any number at once.
    Shared,
    /// An ingest writing it: alone.
    Exclusive,
}

impl FsDir {
    /// Opens (and creates) the folder.
    pub fn new(path: impl Into<PathBuf>) -> Result<FsDir, String> {
        let path = path.into();
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(FsDir { path, held: None })
    }

    /// Locks the folder for `hold`, at once or not at all: a store held otherwise by another process is an
    /// error saying by what.
    pub fn hold(mut self, hold: Hold) -> Result<FsDir, String> {
        let err = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let dir = File::open(&self.path).map_err(err)?;
        let taken = match hold {
            Hold::Shared => dir.try_lock_shared(),
            Hold::Exclusive => dir.try_lock(),
        };
        match taken {
            Ok(()) => {
                self.held = Some(Rc::new(dir));
                Ok(self)
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                // engines hold it shared, an ingest exclusively: a shared hold that succeeds says which
                let engines_only = hold == Hold::Exclusive && File::open(&self.path).map_err(err)?.try_lock_shared().is_ok();
                Err(if engines_only {
                    format!("{}: a lingtab engine (another process) is running from this store: stop it first", self.path.display())
                } else {
                    format!("{}: another lingtab process is ingesting into this store: wait for it to finish, or stop it", self.path.display())
                })
            }
            Err(std::fs::TryLockError::Error(e)) => Err(err(e)),
        }
    }
}

#[derive(Clone)]
pub struct FsFile {
    file: Rc<File>,
    name: String,
    _held: Option<Rc<File>>,
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
            Ok(f) => Ok(Some(FsFile { file: Rc::new(f), name: path.display().to_string(), _held: self.held.clone() })),
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
