//! The verbs shim this binary carries (built and embedded by build.rs), and its unpacked copy.
//!
//! `softrdma exec` puts a directory holding libibverbs.so.1, librdmacm.so.1, libmlx5.so.1 and
//! libefa.so.1 (and their unversioned names, which NCCL and some middleware dlopen first) first
//! on the program's LD_LIBRARY_PATH. That directory is `SOFTRDMA_SHIM_DIR` when set, else the
//! embedded libraries unpacked on first use into the per-user cache:
//! `$SOFTRDMA_CACHE_DIR`, else `$XDG_CACHE_HOME/softrdma`, else `~/.cache/softrdma`, else
//! `/tmp/softrdma-cache-UID`; one subdirectory per build (`shim-ID`, ID a hash of the
//! libraries), so binaries of different builds never share a copy. The cache directory is
//! checked as the runtime directory is (a real directory of this user, mode 0700). Concurrent
//! first uses race safely: each unpacks into a directory of its own and renames it into place;
//! a loser uses the winner's copy.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The files of the shim directory: libraries (mode 0755) and the OFED XRC header.
const FILES: [(&str, &[u8], u32); 5] = [
    ("libibverbs.so.1", include_bytes!(concat!(env!("OUT_DIR"), "/shim/libibverbs.so.1")), 0o755),
    ("librdmacm.so.1", include_bytes!(concat!(env!("OUT_DIR"), "/shim/librdmacm.so.1")), 0o755),
    ("libmlx5.so.1", include_bytes!(concat!(env!("OUT_DIR"), "/shim/libmlx5.so.1")), 0o755),
    ("libefa.so.1", include_bytes!(concat!(env!("OUT_DIR"), "/shim/libefa.so.1")), 0o755),
    ("include/softrdma/ofed_xrc.h", include_bytes!("../../verbs-shim/include/softrdma/ofed_xrc.h"), 0o644),
];

/// The unversioned names, as symlinks to the versioned ones.
const LINKS: [(&str, &str); 4] = [
    ("libibverbs.so", "libibverbs.so.1"),
    ("librdmacm.so", "librdmacm.so.1"),
    ("libmlx5.so", "libmlx5.so.1"),
    ("libefa.so", "libefa.so.1"),
];

/// Marks a complete copy (written last, before the rename).
const COMPLETE: &str = ".complete";

/// This build's shim: a hash of what is embedded (build.rs).
pub(crate) const ID: &str = env!("SOFTRDMA_SHIM_ID");

/// The per-user cache directory (not created or checked).
fn cache_root() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = env("SOFTRDMA_CACHE_DIR") {
        return d;
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("softrdma");
    }
    if let Some(h) = env("HOME") {
        return h.join(".cache/softrdma");
    }
    PathBuf::from(format!("/tmp/softrdma-cache-{}", nix::unistd::getuid()))
}

/// The shim directory `softrdma exec` uses: `SOFTRDMA_SHIM_DIR`, or the unpacked embedded copy.
pub(crate) fn dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("SOFTRDMA_SHIM_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        if !d.join("libibverbs.so.1").is_file() {
            bail!("SOFTRDMA_SHIM_DIR={} holds no libibverbs.so.1", d.display());
        }
        return Ok(d);
    }
    unpack(&cache_root())
}

/// Unpacks the embedded shim under `root` (created 0700 and checked), once per build.
pub(crate) fn unpack(root: &Path) -> Result<PathBuf> {
    match fs::DirBuilder::new().recursive(false).mode(0o700).create(root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Its parent (e.g. ~/.cache) is missing: make it as mkdir -p would, then this one 0700.
            let parent = root.parent().context("the shim cache directory has no parent")?;
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
            match fs::DirBuilder::new().mode(0o700).create(root) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).with_context(|| format!("creating {}", root.display())),
            }
        }
        Err(e) => return Err(e).with_context(|| format!("creating {}", root.display())),
    }
    softrdma_device::runtime::check_private_dir(root).context("the shim cache directory")?;
    let dir = root.join(format!("shim-{ID}"));
    if dir.join(COMPLETE).is_file() {
        return Ok(dir);
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = root.join(format!(".shim-{ID}.{}.{nanos}", std::process::id()));
    let r = write_copy(&tmp).and_then(|()| match fs::rename(&tmp, &dir) {
        Ok(()) => Ok(()),
        // Another process put its copy there first (a non-empty directory is not replaced).
        Err(_) if dir.join(COMPLETE).is_file() => Ok(()),
        Err(e) => Err(e).with_context(|| format!("moving the shim into {}", dir.display())),
    });
    let _ = fs::remove_dir_all(&tmp);
    r?;
    Ok(dir)
}

fn write_copy(tmp: &Path) -> Result<()> {
    fs::DirBuilder::new().mode(0o700).create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
    for (name, bytes, mode) in FILES {
        let path = tmp.join(name);
        if let Some(p) = path.parent() {
            fs::DirBuilder::new().recursive(true).mode(0o755).create(p)?;
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        f.write_all(bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    for (link, to) in LINKS {
        std::os::unix::fs::symlink(to, tmp.join(link))?;
    }
    fs::write(tmp.join(COMPLETE), ID)?;
    // Others are kept out by the cache directory (0700) it sits in.
    fs::set_permissions(tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpacks_once_with_every_file_and_refuses_an_open_cache() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("cache");
        let d = unpack(&root).unwrap();
        for (name, bytes, _) in FILES {
            assert_eq!(fs::read(d.join(name)).unwrap(), bytes, "{name}");
        }
        for (link, to) in LINKS {
            assert_eq!(fs::read_link(d.join(link)).unwrap(), Path::new(to));
        }
        // The ELF magic: what is embedded is a shared library.
        assert_eq!(&fs::read(d.join("libibverbs.so.1")).unwrap()[..4], b"\x7fELF");
        // Second use: the same directory, nothing left behind.
        assert_eq!(unpack(&root).unwrap(), d);
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1);
        // A cache others can enter is refused.
        fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let e = format!("{:#}", unpack(&root).unwrap_err());
        assert!(e.contains("0700"), "{e}");
    }

    #[test]
    fn concurrent_first_uses_agree() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("cache");
        let dirs: Vec<PathBuf> = std::thread::scope(|s| {
            let h: Vec<_> = (0..6).map(|_| s.spawn(|| unpack(&root).unwrap())).collect();
            h.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(dirs.iter().all(|d| *d == dirs[0]));
        assert!(dirs[0].join(COMPLETE).is_file());
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1, "no temporary copy left");
    }
}
