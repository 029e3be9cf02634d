//! One writing process per data directory. `engram serve`, `rag`, `chat` and the writing
//! `cache` commands hold an exclusive advisory lock on `<data dir>/engram.lock` for their
//! lifetime (`std::fs::File::try_lock`: `flock` on Unix), so a second process cannot write the
//! same session files, facts, RAG banks or trees beside the first. The OS releases the lock
//! when the process exits, crashes included, so a stale lock file never blocks a start.
//!
//! Invariant: while a [`DataDirLock`] lives, no other process holds one on the same
//! directory. A directory the process cannot write (read-only mount, no permission) is not
//! locked: the process cannot change it either, and it starts with a warning.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::ErrorKind;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "engram.lock";

/// The held lock (released when dropped or when the process ends).
pub struct DataDirLock {
    _file: Option<File>,
}

/// Takes the exclusive lock on `dir` for `command` (named in the error), creating `dir` if
/// needed. Errors: another process holds it (naming the directory and what to do).
pub fn lock_data_dir(dir: &Path, command: &str) -> Result<DataDirLock> {
    let path = dir.join(LOCK_FILE);
    let opened = std::fs::create_dir_all(dir)
        .and_then(|_| OpenOptions::new().append(true).create(true).open(&path))
        // A lock file left read-only (or a read-only directory that already has one) still locks.
        .or_else(|e| if path.exists() { File::open(&path) } else { Err(e) });
    let file = match opened {
        Ok(f) => f,
        Err(e) if matches!(e.kind(), ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem) => {
            eprintln!("warning: cannot create {} ({e}); running without the data-directory lock", path.display());
            return Ok(DataDirLock { _file: None });
        }
        Err(e) => return Err(e).with_context(|| format!("opening the data-directory lock {}", path.display())),
    };
    match file.try_lock() {
        Ok(()) => Ok(DataDirLock { _file: Some(file) }),
        Err(TryLockError::WouldBlock) => bail!(
            "`engram {command}`: the data directory {} is in use by another engram process (it holds {LOCK_FILE}); \
             stop that process, or pass another --data-dir",
            dir.display()
        ),
        Err(TryLockError::Error(e)) if e.kind() == ErrorKind::Unsupported => {
            eprintln!("warning: {} cannot be locked on this file system ({e}); running without the data-directory lock", path.display());
            Ok(DataDirLock { _file: None })
        }
        Err(TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = lock_data_dir(&data, "serve").unwrap();
        let e = lock_data_dir(&data, "rag").err().expect("a second lock is refused").to_string();
        assert!(e.contains("engram rag") && e.contains("in use by another engram process") && e.contains("--data-dir"), "{e}");
        drop(first);
        let _again = lock_data_dir(&data, "rag").expect("free again once the first holder is gone");
        // Another directory is independent.
        let _other = lock_data_dir(&dir.path().join("other"), "serve").unwrap();
    }

    #[test]
    fn a_lock_file_left_read_only_still_locks() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        drop(lock_data_dir(dir.path(), "serve").unwrap());
        let path = dir.path().join(LOCK_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        let _held = lock_data_dir(dir.path(), "serve").unwrap();
        assert!(lock_data_dir(dir.path(), "chat").is_err(), "still exclusive");
    }
}
