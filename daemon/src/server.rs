//! Serving client processes on a device's unix socket (docs/architecture.md D2, D4): one thread per
//! client.
//!
//! The peer's uid must be ours (SO_PEERCRED; other users are refused). The client is watched
//! through a pidfd of its SO_PEERCRED pid, not through the socket: a forked child inherits the
//! socket, so it may stay open after the client died. When the client dies, or its connection
//! ends or sends a malformed message, its objects are destroyed ([`Hca::detach`]); no other
//! client is affected.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use softrdma_engine::verbs::VerbsError;

use softrdma_device::hca::Hca;
use softrdma_device::proto::{self, Request, Response, VERSION};

/// A pidfd for a process (Linux 5.3+).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// When a serving device ends by itself (besides `stop`).
#[derive(Debug, Clone, Default)]
pub struct Watch {
    /// The device's socket file and its (device, inode): when the file is gone or another one is
    /// in its place (its runtime dir was removed, a new device took the name), no client can
    /// reach this device any more and it ends.
    pub socket: Option<(std::path::PathBuf, (u64, u64))>,
    /// End after this long with no client attached (an autostarted device: `--idle-exit`).
    pub idle_exit: Option<std::time::Duration>,
}

/// Why `serve` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// `stop` was set (SIGTERM, SIGINT).
    Stopped,
    /// The socket file was removed or replaced.
    SocketGone,
    /// No client for the idle time.
    Idle,
}

/// The (device, inode) of a file, to tell it from a later one at the same path.
pub fn file_id(path: &std::path::Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Accepts clients until `stop` is set (checked every 100 ms) or `watch` ends it (checked every
/// second).
pub fn serve(hca: Arc<Hca>, listener: UnixListener, stop: &AtomicBool, watch: &Watch) -> io::Result<Ended> {
    listener.set_nonblocking(true)?;
    let mut last_check = std::time::Instant::now();
    let mut idle_since: Option<std::time::Instant> = None;
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(Ended::Stopped);
        }
        let now = std::time::Instant::now();
        if now.duration_since(last_check) >= std::time::Duration::from_secs(1) {
            last_check = now;
            if let Some((path, id)) = &watch.socket {
                if file_id(path).ok() != Some(*id) {
                    tracing::warn!(path = %path.display(), "the device's socket was removed or replaced: no client can reach it, ending");
                    return Ok(Ended::SocketGone);
                }
            }
            if let Some(limit) = watch.idle_exit {
                if hca.client_count() == 0 {
                    let since = *idle_since.get_or_insert(now);
                    if now.duration_since(since) >= limit {
                        tracing::info!(secs = limit.as_secs(), "no client for the idle time: ending");
                        return Ok(Ended::Idle);
                    }
                } else {
                    idle_since = None;
                }
            }
        }
        match listener.accept() {
            Ok((sock, _)) => {
                sock.set_nonblocking(false)?;
                let h = hca.clone();
                std::thread::Builder::new().name("client".into()).spawn(move || serve_client(&h, sock))?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                let _ = nix::poll::poll(&mut fds, PollTimeout::from(100u8));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// One client's connection, from Hello to the end.
pub fn serve_client(hca: &Hca, sock: UnixStream) {
    let Ok(cred) = getsockopt(&sock, PeerCredentials) else { return };
    if cred.uid() != nix::unistd::getuid().as_raw() {
        tracing::warn!(uid = cred.uid(), "refused a client of another user");
        let _ = proto::send(&sock, &Response::Err(VerbsError::Access), &[]);
        return;
    }
    let probe = match proto::recv::<Request>(&sock) {
        Ok((Request::Hello { version, probe, .. }, _)) if version == VERSION => probe,
        Ok((Request::Hello { version, .. }, _)) => {
            tracing::warn!(version, "refused a client speaking another protocol version");
            let _ = proto::send(&sock, &Response::Err(VerbsError::NotSupp), &[]);
            return;
        }
        _ => return,
    };
    let pid = cred.pid();
    // The device reaches one-sided RDMA targets and receive buffers in the client's memory with
    // process_vm_readv/writev; where the kernel refuses (Yama ptrace_scope 2/3, a non-dumpable
    // process, seccomp), the client serves its memory itself from a helper thread on a socket
    // pair (docs/architecture.md D3's fallback; slower: a round trip per access).
    let helper = !softrdma_device::memory::can_reach(pid, probe);
    let Ok(pidfd) = pidfd_open(pid) else { return };
    let Ok(a) = hca.attach(pid) else { return };
    let owner = a.owner;
    let mut fds = vec![a.event_fd.as_raw_fd(), a.arena.as_raw_fd(), a.doorbell.as_raw_fd()];
    let mut client_end = None;
    if helper {
        let Ok((mine, theirs)) = UnixStream::pair() else {
            hca.detach(owner);
            return;
        };
        tracing::info!(pid, "the kernel refuses cross-process access to this client: using its memory helper");
        hca.use_memory_helper(owner, mine);
        fds.push(theirs.as_raw_fd());
        client_end = Some(theirs);
    }
    let hello = Response::Hello { owner, info: hca.info().clone(), release: a.release, memory_helper: helper };
    if proto::send(&sock, &hello, &fds).is_ok() {
        drop(client_end);
        drop(a);
        serve_calls(hca, owner, &sock, &pidfd);
    }
    hca.detach(owner);
}

fn serve_calls(hca: &Hca, owner: u32, sock: &UnixStream, pidfd: &OwnedFd) {
    loop {
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN), PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
        let has = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
        if has(1) || !hca.is_attached(owner) {
            return; // the client process exited, or the device cut it off
        }
        if !has(0) {
            continue;
        }
        let (req, in_fds) = match proto::recv::<Request>(sock) {
            Ok(m) => m,
            Err(e) => {
                if !matches!(e, proto::ProtoError::Closed) {
                    tracing::warn!(owner, error = %e, "disconnecting a client");
                }
                return;
            }
        };
        let (resp, out) = hca.call(owner, req, in_fds);
        let raw: Vec<_> = out.iter().map(|f| f.as_fd().as_raw_fd()).collect();
        if proto::send(sock, &resp, &raw).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_device::hca::HcaConfig;

    #[test]
    fn another_protocol_version_is_refused_and_nothing_is_attached() {
        let mut c = HcaConfig::new("v1", "127.0.0.1".parse().unwrap());
        c.port = 47941;
        let hca = Arc::new(Hca::start(c).unwrap());
        let (a, b) = UnixStream::pair().unwrap();
        let h = hca.clone();
        let t = std::thread::spawn(move || serve_client(&h, b));
        proto::send(&a, &Request::Hello { version: VERSION + 1, pid: 0, probe: 0 }, &[]).unwrap();
        let (r, _) = proto::recv::<Response>(&a).unwrap();
        assert!(matches!(r, Response::Err(VerbsError::NotSupp)), "{r:?}");
        t.join().unwrap();
        assert_eq!(hca.stats().1.clients, 0);
        // A first message that is not Hello ends the connection without an answer.
        let (a, b) = UnixStream::pair().unwrap();
        let h = hca.clone();
        let t = std::thread::spawn(move || serve_client(&h, b));
        proto::send(&a, &Request::AllocPd, &[]).unwrap();
        t.join().unwrap();
        assert!(matches!(proto::recv::<Response>(&a), Err(proto::ProtoError::Closed)));
        static P: u64 = proto::PROBE;
        let probe = std::ptr::addr_of!(P) as u64;
        // A probe address the device cannot read: the client gets a memory helper socket.
        let (a, b) = UnixStream::pair().unwrap();
        let h = hca.clone();
        let t = std::thread::spawn(move || serve_client(&h, b));
        proto::send(&a, &Request::Hello { version: VERSION, pid: 0, probe: 8 }, &[]).unwrap();
        let (r, fds) = proto::recv::<Response>(&a).unwrap();
        assert!(matches!(r, Response::Hello { memory_helper: true, .. }) && fds.len() == 4, "{r:?}");
        drop(a);
        t.join().unwrap();
        // The right version with a readable probe is served.
        let (a, b) = UnixStream::pair().unwrap();
        let h = hca.clone();
        let t = std::thread::spawn(move || serve_client(&h, b));
        proto::send(&a, &Request::Hello { version: VERSION, pid: 0, probe }, &[]).unwrap();
        let (r, fds) = proto::recv::<Response>(&a).unwrap();
        assert!(matches!(r, Response::Hello { memory_helper: false, .. }) && fds.len() == 3, "{r:?}");
        proto::send(&a, &Request::AllocPd, &[]).unwrap();
        assert!(matches!(proto::recv::<Response>(&a).unwrap().0, Response::Pd(_)));
        assert_eq!(hca.stats().1.clients, 1);
        drop(a);
        t.join().unwrap();
        assert_eq!(hca.stats().1.clients, 0, "a closed connection detaches its client");
    }
}
