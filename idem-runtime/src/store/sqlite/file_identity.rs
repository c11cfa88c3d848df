//! The database file the store opened, by identity. A file deleted (or replaced) under a
//! serving process keeps taking its writes through the open descriptors, and they are lost
//! with the last one: a restart opens another file, where every answered call is new again.
//! So the writer checks, before each commit, that the path still names the file it opened,
//! and refuses to commit (so to acknowledge) anything once it does not.

use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// The path and the (device, inode) it named when the store opened it.
pub(crate) struct FileIdentity {
    path: PathBuf,
    id: (u64, u64),
}

impl FileIdentity {
    pub(crate) fn of(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            path: path.to_path_buf(),
            id: identity(path)?,
        })
    }

    /// `Ok` while the path names the file opened; a stat costs a microsecond, once a batch.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match identity(&self.path) {
            Ok(id) if id == self.id => Ok(()),
            _ => Err(StoreError::Vanished(self.path.clone())),
        }
    }
}

#[cfg(unix)]
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path)?;
    Ok((metadata.dev(), metadata.ino()))
}

#[cfg(not(unix))]
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|_| (0, 0))
}
