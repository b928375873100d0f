//! Where devices live on a node: the runtime directory, one unix socket and one lock file per
//! device (docs/architecture.md D2).
//!
//! The directory is `$SOFTRDMA_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/softrdma`, else
//! `/tmp/softrdma-$UID`. Another user could create the `/tmp` one first and watch or replace our
//! sockets, so it must be a directory (not a symlink) owned by us with mode 0700; anything else is
//! refused with an error that says what is wrong.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// Errors about the runtime directory and device names.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The directory exists but is not safe to use.
    #[error("runtime directory {path}: {why}")]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A device name that cannot be a file name.
    #[error("invalid device name {0:?}: use 1-32 characters from [A-Za-z0-9_-]")]
    BadName(String),
    /// An I/O error on a path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io { path: path.to_owned(), source }
}

/// The runtime directory as the environment names it (not created or checked).
pub fn runtime_dir_path() -> PathBuf {
    if let Some(d) = std::env::var_os("SOFTRDMA_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("softrdma");
    }
    PathBuf::from(format!("/tmp/softrdma-{}", nix::unistd::getuid()))
}

/// The runtime directory, created (mode 0700) if missing, and checked: a real directory, owned by
/// this user, not accessible to anyone else.
pub fn runtime_dir() -> Result<PathBuf, RuntimeError> {
    let path = runtime_dir_path();
    match fs::DirBuilder::new().mode(0o700).create(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(&path)(e)),
    }
    check_private_dir(&path)?;
    Ok(path)
}

/// Checks a private directory: a real directory (not a symlink), owned by this user, mode 0700
/// (no access for group or others). The runtime dir and the shim cache are such directories.
pub fn check_private_dir(path: &Path) -> Result<(), RuntimeError> {
    let md = fs::symlink_metadata(path).map_err(io_err(path))?;
    let unsafe_dir = |why: String| RuntimeError::Unsafe { path: path.to_owned(), why };
    if !md.file_type().is_dir() {
        return Err(unsafe_dir("not a directory (a symlink or file is refused)".into()));
    }
    let uid = nix::unistd::getuid().as_raw();
    if md.uid() != uid {
        return Err(unsafe_dir(format!("owned by uid {}, not by this user (uid {uid})", md.uid())));
    }
    if md.permissions().mode() & 0o077 != 0 {
        return Err(unsafe_dir(format!(
            "mode {:o} lets other users in; it must be 0700 (chmod 700 it or remove it)",
            md.permissions().mode() & 0o777
        )));
    }
    Ok(())
}

/// Checks a device name (it becomes a file name).
pub fn check_name(name: &str) -> Result<(), RuntimeError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::BadName(name.to_owned()))
    }
}

/// The socket path of a device.
pub fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

/// The lock file path of a device.
pub fn lock_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.lock"))
}

/// Takes a device's lock file (exclusive, waiting for it when `wait`): whoever holds it is
/// starting or running that device. `Ok(None)`: someone else holds it and `wait` is false.
pub fn lock_device(dir: &Path, name: &str, wait: bool) -> Result<Option<Flock<File>>, RuntimeError> {
    check_name(name)?;
    let path = lock_path(dir, name);
    let f =
        OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&path).map_err(io_err(&path))?;
    let arg = if wait { FlockArg::LockExclusive } else { FlockArg::LockExclusiveNonblock };
    match Flock::lock(f, arg) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(io_err(&path)(io::Error::from(e))),
    }
}

/// Whether a device answers on its socket.
pub fn is_live(dir: &Path, name: &str) -> bool {
    UnixStream::connect(socket_path(dir, name)).is_ok()
}

/// The devices whose sockets answer, sorted by name.
pub fn list_devices(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".sock")).map(str::to_owned))
        .filter(|n| check_name(n).is_ok() && is_live(dir, n))
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("srdma0").is_ok());
        assert!(check_name("a-b_c9").is_ok());
        for bad in ["", "../x", "a/b", "x.sock", &"a".repeat(33)] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn unsafe_dirs_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("rt");
        fs::DirBuilder::new().mode(0o755).create(&d).unwrap();
        let e = check_private_dir(&d).unwrap_err().to_string();
        assert!(e.contains("0700"), "{e}");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        check_private_dir(&d).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(check_private_dir(&link).unwrap_err().to_string().contains("symlink"));
    }

    #[test]
    fn lock_is_exclusive() {
        let t = tempfile::tempdir().unwrap();
        let a = lock_device(t.path(), "srdma9", false).unwrap();
        assert!(a.is_some());
        assert!(lock_device(t.path(), "srdma9", false).unwrap().is_none());
        drop(a);
        assert!(lock_device(t.path(), "srdma9", false).unwrap().is_some());
    }
}
