//! One process per SQLite file: claims in flight live in the serving process's memory, so a
//! second process on the same file would run concurrent duplicates twice. The store takes an
//! OS lock on `<database>.lock` for as long as it is open; the kernel releases it when the
//! process dies, however it dies, so a crash never leaves a stale lock behind. The file itself
//! only names the holder, for the error a second process gets, and it stays when the store
//! closes or fails to open: deleting it would let a process that opened it just before and one
//! that creates a new one each hold a lock of its own. The admin tool asks the lock,
//! not the file, whether a process serves the database ([`holder`]).
//!
//! The lock is the file's, not the name's: it sits beside the file that the name resolves to,
//! symlinks and `..` followed (as SQLite follows them to name the log), so a second process
//! that names the file another way is refused too. A file with two names (a hard link) is
//! refused outright: SQLite would keep a log per name over one file. And the database file
//! itself is locked as well (on Unix, with `flock`, which SQLite's own `fcntl` locks do not
//! see): a file renamed while served keeps that lock, so a second process on its new name,
//! whose lock file is another, is refused too. The serving process no longer commits once its
//! path names another file (`file_identity.rs`); the second one would have opened the file
//! without the log its name no longer matches, and served it without the commits in there.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
#[cfg(unix)]
use std::sync::Mutex;
use std::time::Duration;

use crate::store::sqlite::connection::naming;
use crate::store::StoreError;

/// Held while a store serves its database file; dropping it releases the lock. Dropped after
/// the store's connections are closed: closing a descriptor of the database file releases
/// the process's `fcntl` locks on it, SQLite's included.
pub(crate) struct ServingLock {
    _file: File,
    _database: Option<DatabaseLock>,
}

/// The database file's own lock, and its place among the files this process serves.
struct DatabaseLock {
    _file: File,
    /// (device, inode).
    id: (u64, u64),
}

/// The database files this process serves, by (device, inode). A second store of this process
/// on one (by another name) is refused before the file is opened: closing a descriptor of it
/// would drop the first store's SQLite locks (a review).
#[cfg(unix)]
static SERVED: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

#[cfg(unix)]
impl Drop for DatabaseLock {
    fn drop(&mut self) {
        let mut served = SERVED.lock().expect("served files lock");
        served.retain(|id| *id != self.id);
    }
}

impl ServingLock {
    /// Takes the lock of `database`, or fails naming the process that holds it.
    pub(crate) fn acquire(database: &Path) -> Result<Self, StoreError> {
        refuse_hard_links(database)?;
        let path = lock_path(database);
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path).map_err(|e| naming(&path, e))?;
        if !locked_past_probes(&file)? {
            return Err(StoreError::InUse {
                path: database.to_path_buf(),
                lock: path,
                pid: read_pid(&mut file)?,
            });
        }
        let database = lock_database(database)?;
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        Ok(Self {
            _file: file,
            _database: database,
        })
    }
}

/// The database file's own lock, or the refusal of a file another process serves under
/// another name.
#[cfg(unix)]
fn lock_database(database: &Path) -> Result<Option<DatabaseLock>, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(database)?;
    let id = (metadata.dev(), metadata.ino());
    let elsewhere = || StoreError::ServedElsewhere {
        path: database.to_path_buf(),
    };
    let mut served = SERVED.lock().expect("served files lock");
    if served.contains(&id) {
        return Err(elsewhere());
    }
    let file = File::open(database)?;
    match locked_past_probes(&file)? {
        true => {
            served.push(id);
            Ok(Some(DatabaseLock { _file: file, id }))
        }
        // Another process's: this one holds no lock on the file that closing could drop.
        false => Err(elsewhere()),
    }
}

/// Takes `file`'s exclusive lock; `false` where another process holds it. The admin's probes
/// (`holder`, `served_unseen`) hold a shared one for an instant: not a server, so it is
/// tried again.
fn locked_past_probes(file: &File) -> std::io::Result<bool> {
    let mut attempts = PROBE_RETRIES;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) if attempts > 0 => {
                attempts -= 1;
                std::thread::sleep(PROBE_RETRY_AFTER);
            }
            Err(TryLockError::WouldBlock) => return Ok(false),
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// None where locks are mandatory (Windows): SQLite could not read a file locked so.
#[cfg(not(unix))]
fn lock_database(_database: &Path) -> Result<Option<DatabaseLock>, StoreError> {
    Ok(None)
}

/// How often, and how long apart, a server tries again a lock an admin's probe may hold.
const PROBE_RETRIES: u32 = 3;
const PROBE_RETRY_AFTER: Duration = Duration::from_millis(10);

/// The process serving `database` right now, as it wrote itself in the lock file; `None`
/// when none does.
pub(crate) fn holder(database: &Path) -> std::io::Result<Option<String>> {
    match locked_elsewhere(&lock_path(database))? {
        Some(mut file) => read_pid(&mut file).map(Some),
        None => Ok(None),
    }
}

/// `path`, opened, where another process holds its lock; `None` where none does, or no such
/// file exists. Takes, and drops at once, a shared lock that no server holds.
fn locked_elsewhere(path: &Path) -> std::io::Result<Option<File>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(None),
        Err(TryLockError::WouldBlock) => Ok(Some(file)),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Whether a process serves `database` although no lock file beside that name says so: the
/// file was renamed while served (the lock file beside its new name is none, or another's),
/// or its lock file was deleted. The admin tool then cannot see that process's log, nor wait
/// for it to forget a purged key: it answered "purged" while the server still replayed the
/// key (found by helper-89). Asked only before this process opens the file: closing the
/// probe's descriptor drops the process's `fcntl` locks on it, SQLite's included.
#[cfg(unix)]
pub(crate) fn served_unseen(database: &Path) -> std::io::Result<bool> {
    Ok(holder(database)?.is_none() && locked_elsewhere(database)?.is_some())
}

#[cfg(not(unix))]
pub(crate) fn served_unseen(_database: &Path) -> std::io::Result<bool> {
    Ok(false)
}

fn read_pid(file: &mut File) -> std::io::Result<String> {
    let mut pid = String::new();
    file.read_to_string(&mut pid)?;
    Ok(pid.trim().to_owned())
}

/// The lock file beside the file that `database` names (`a2a.db` → `a2a.db.lock`), symlinks
/// resolved; beside the name itself while no such file exists.
fn lock_path(database: &Path) -> PathBuf {
    let file = std::fs::canonicalize(database).unwrap_or_else(|_| database.to_path_buf());
    let mut name = file.into_os_string();
    name.push(".lock");
    PathBuf::from(name)
}

/// Refuses a database file with more than one name, a directory (whose links are its
/// entries: it was taken for a file of several names), and whatever else is not a regular
/// file (a named pipe's open waited for a writer for ever: helper-110).
#[cfg(unix)]
pub(crate) fn refuse_hard_links(database: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(database)?;
    if metadata.is_dir() {
        let kind = std::io::ErrorKind::IsADirectory;
        let message = format!("{} is a directory, not a database file", database.display());
        return Err(std::io::Error::new(kind, message).into());
    }
    if !metadata.is_file() {
        let kind = std::io::ErrorKind::InvalidInput;
        let message = format!(
            "{} is not a regular file (a pipe, a socket or a device): give a database file",
            database.display()
        );
        return Err(std::io::Error::new(kind, message).into());
    }
    match metadata.nlink() {
        0 | 1 => Ok(()),
        links => Err(StoreError::HardLinked {
            path: database.to_path_buf(),
            links,
        }),
    }
}

#[cfg(not(unix))]
pub(crate) fn refuse_hard_links(_database: &Path) -> Result<(), StoreError> {
    Ok(())
}
