//! A process under a file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`, a container's) is
//! killed by `SIGXFSZ` at its first write past the limit, by default: every call in flight
//! lost with its connection, nothing logged (found by helper-110). With the signal ignored,
//! the write fails with `EFBIG` instead, an I/O error that the store answers as it answers a
//! full disk (`IDEMPOTENCY_STORE_UNAVAILABLE`, counted, logged, and service resumes by itself
//! once there is room), as PostgreSQL's server does.

/// Ignores `SIGXFSZ` for the process, unless the application set its own disposition.
/// Called as the store opens its file, before it writes a byte of it, and by the admin tool.
#[cfg(unix)]
pub(crate) fn ignore_the_signal() {
    // SAFETY: `sigaction` with a null new action only reads the current one into a zeroed
    // struct of its own type; `signal` then sets the one disposition, `SIG_IGN`, which runs no
    // code of ours in a handler. Another thread that sets the signal between the two calls is
    // overridden with an ignore, the safe side for a process that writes files.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        let read = libc::sigaction(libc::SIGXFSZ, std::ptr::null(), &mut current);
        if read == 0 && current.sa_sigaction == libc::SIG_DFL {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        }
    }
}

#[cfg(not(unix))]
pub(crate) fn ignore_the_signal() {}

#[cfg(all(test, unix))]
mod tests {
    #[test]
    fn the_signal_is_ignored_once_a_store_opens_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::IdempotencyConfig::default();
        let _store = crate::store::SqliteStore::open(dir.path().join("a.db"), &config).unwrap();
        // SAFETY: reads the current disposition only.
        let current = unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGXFSZ, std::ptr::null(), &mut current);
            current.sa_sigaction
        };
        assert_eq!(current, libc::SIG_IGN);
    }
}
