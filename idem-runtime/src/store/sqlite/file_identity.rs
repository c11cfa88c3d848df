//! The database file the store opened, and its log and shared-memory index, by identity. A
//! file deleted (or replaced) under a serving process keeps taking its writes through the open
//! descriptors, and they are lost with the last one: a restart opens another file, where every
//! answered call is new again. A deleted log (`-wal`) loses what was committed since the last
//! checkpoint the same way, and a deleted index (`-shm`) lets another process write the same
//! log unaware of this one (an `idem-admin purge`, reported done, came back after a restart:
//! helper-75). So the writer checks, before each commit, that each path still names the file
//! it opened, and refuses to commit (so to acknowledge) anything once one does not.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// Each path and the (device, inode) it named when the store opened it.
pub(crate) struct FileIdentity {
    /// The database first, then its companions found; `true` for the log.
    files: Vec<(PathBuf, (u64, u64), bool)>,
}

impl FileIdentity {
    /// The database at `path`, with its `-wal` and `-shm` files where they exist (a WAL
    /// database has both while any connection is open: from the first, the store's own).
    pub(crate) fn of(path: &Path) -> std::io::Result<Self> {
        let mut files = vec![(path.to_path_buf(), identity(path)?, false)];
        for suffix in ["-wal", "-shm"] {
            let mut name = OsString::from(path.as_os_str());
            name.push(suffix);
            let companion = PathBuf::from(name);
            if let Ok(id) = identity(&companion) {
                files.push((companion, id, suffix == "-wal"));
            }
        }
        Ok(Self { files })
    }

    /// `Ok` while each path names the file opened; a stat costs a microsecond, three a batch.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match self.files.iter().find(|(path, id, _)| !names(path, id)) {
            Some((path, ..)) => Err(StoreError::Vanished(path.clone())),
            None => Ok(()),
        }
    }

    /// Whether a checkpoint may still copy the log back: not once the database or its index
    /// is another file. Another process may then write the log under an index this one does
    /// not see, and a checkpoint from here would start the log over beneath its frames. A log
    /// deleted alone is still this process's to copy back, and what was answered before the
    /// deletion is saved so.
    pub(crate) fn may_checkpoint(&self) -> bool {
        let mut others = self.files.iter().filter(|(.., log)| !log);
        others.all(|(path, id, _)| names(path, id))
    }
}

fn names(path: &Path, id: &(u64, u64)) -> bool {
    identity(path).ok().as_ref() == Some(id)
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
