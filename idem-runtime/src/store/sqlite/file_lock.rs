//! One process per SQLite file: claims in flight live in the serving process's memory, so a
//! second process on the same file would run concurrent duplicates twice. The store takes an
//! OS lock on `<database>.lock` for as long as it is open; the kernel releases it when the
//! process dies, however it dies, so a crash never leaves a stale lock behind. The file itself
//! only names the holder, for the error a second process gets.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// Held while a store serves its database file; dropping it releases the lock.
pub(crate) struct ServingLock {
    _file: File,
}

impl ServingLock {
    /// Takes the lock of `database`, or fails naming the process that holds it.
    pub(crate) fn acquire(database: &Path) -> Result<Self, StoreError> {
        let path = lock_path(database);
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path)?;
        match file.try_lock() {
            Ok(()) => {
                file.set_len(0)?;
                file.rewind()?;
                writeln!(file, "{}", std::process::id())?;
                Ok(Self { _file: file })
            }
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                file.read_to_string(&mut pid)?;
                Err(StoreError::InUse {
                    path: database.to_path_buf(),
                    lock: path,
                    pid: pid.trim().to_owned(),
                })
            }
            Err(TryLockError::Error(e)) => Err(e.into()),
        }
    }
}

/// The lock file beside the database (`a2a.db` → `a2a.db.lock`).
fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}
