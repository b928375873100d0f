//! Port spaces per host (the kernel's `cma_ps_*` tables are per network namespace, not per
//! device): a bound port is an open-file-description lock in the runtime directory, on one file
//! per port space. Each port owns a range of 2^34 bytes of the file: a specific address locks one
//! byte of its port's range (its own offset), a wildcard locks the whole range, so a wildcard and
//! any specific bind of the same port conflict, two different addresses do not. The lock goes
//! with the descriptor: when the ID is destroyed or the process dies, the port is free again.
//! (One file per port space, made once, keeps a bind to an open(2) and a fcntl(2).)

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::Errno;

/// A held port.
pub(crate) struct Reservation {
    _fd: OwnedFd,
}

/// The bytes of the lock file each port owns: offset 0 of the range stands for nothing, IPv4
/// addresses take 1..2^32, IPv6 addresses (hashed) 2^33..2^33+2^32.
const PORT_RANGE: i64 = 1 << 34;

/// The byte range `addr` locks: (start, length).
fn range_of(addr: SocketAddr) -> (i64, i64) {
    let base = i64::from(addr.port()) * PORT_RANGE;
    match addr.ip() {
        a if a.is_unspecified() => (base, PORT_RANGE),
        IpAddr::V4(v4) => (base + 1 + i64::from(u32::from(v4)), 1),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let h = o.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
            (base + (1 << 33) + (h & 0xffff_ffff) as i64, 1)
        }
    }
}

/// The lock directory, made once per process.
fn lock_dir() -> Result<&'static std::path::Path, Errno> {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = softrdma_device::runtime::runtime_dir().ok()?.join("cm-ports");
        let _ = std::fs::create_dir_all(&dir);
        Some(dir)
    })
    .as_deref()
    .ok_or(Errno(libc::EACCES))
}

fn try_lock(ps: u16, addr: SocketAddr) -> Result<Option<Reservation>, Errno> {
    let path = lock_dir()?.join(format!("ps-{ps:04x}"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|_| Errno(libc::EACCES))?;
    let fd = OwnedFd::from(f);
    let (start, len) = range_of(addr);
    // SAFETY: a zeroed flock is a valid argument once its fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: F_OFD_SETLK with a flock we own.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r == 0 {
        Ok(Some(Reservation { _fd: fd }))
    } else {
        Ok(None)
    }
}

/// Reserves `addr` in port space `ps`; port 0 picks a free ephemeral port (the kernel's
/// ip_local_port_range, 32768-60999, from a random start). EADDRINUSE when taken.
pub(crate) fn reserve(ps: u16, addr: SocketAddr) -> Result<(Reservation, u16), Errno> {
    if addr.port() != 0 {
        return match try_lock(ps, addr)? {
            Some(r) => Ok((r, addr.port())),
            None => Err(Errno(libc::EADDRINUSE)),
        };
    }
    let (lo, hi) = (32768u32, 60999u32);
    let n = hi - lo + 1;
    let mut seed = [0u8; 4];
    // SAFETY: getrandom into our buffer.
    unsafe { libc::getrandom(seed.as_mut_ptr().cast(), 4, 0) };
    let start = u32::from_ne_bytes(seed) % n;
    for i in 0..n {
        let port = (lo + (start + i) % n) as u16;
        let a = SocketAddr::new(addr.ip(), port);
        if let Some(r) = try_lock(ps, a)? {
            return Ok((r, port));
        }
    }
    Err(Errno(libc::EADDRNOTAVAIL))
}
