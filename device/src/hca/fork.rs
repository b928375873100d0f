//! A forked child and the steered port: the descriptors of this process's member sockets (and its
//! relay link) are filed here, and a child replaces its copies with fresh unbound sockets before
//! it runs anything, so that it never takes its parent's datagrams (the data-path issue, item 2).

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

/// Descriptors of steered-port members in this process (-1: free slot). A forked child replaces
/// each with a fresh unbound socket ([`forget_members_in_child`]): the child never takes its
/// parent's datagrams, and its copy of the device fails quietly instead of stealing them.
static MEMBER_FDS: [std::sync::atomic::AtomicI32; 64] = [const { std::sync::atomic::AtomicI32::new(-1) }; 64];

/// Set in a forked child: its copies of this process's devices write no capture (the rings
/// are shared with the parent, which alone produces into them).
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is a forked child of the one that made its devices.
pub(crate) fn in_forked_child() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// Registers the child handler (once per process): before a device's capture or member sockets.
pub(crate) fn watch_fork() {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: pthread_atfork(3) with a handler that lives for the whole program.
        unsafe { libc::pthread_atfork(None, None, Some(forget_members_in_child)) };
    });
}

/// `pthread_atfork` child handler: only async-signal-safe calls (socket, dup2, close) and an
/// atomic store.
extern "C" fn forget_members_in_child() {
    FORKED.store(true, Ordering::Relaxed);
    for slot in &MEMBER_FDS {
        let fd = slot.load(Ordering::Relaxed);
        if fd < 0 {
            continue;
        }
        // SAFETY: plain syscalls on descriptor numbers; `fd` is this process's (inherited) copy
        // of a member socket, replaced in place so no other code's descriptor number changes.
        unsafe {
            // The socket system call itself: under rdma-core's librspreload, socket() makes an
            // rsocket, not a kernel socket.
            let s = libc::syscall(
                libc::SYS_socket,
                libc::AF_INET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            ) as libc::c_int;
            if s >= 0 {
                libc::dup2(s, fd);
                libc::close(s);
            }
        }
    }
}

/// Files the descriptors of a member socket for [`forget_members_in_child`] (registered once).
pub(super) fn register_member_fds(fds: &[RawFd]) {
    watch_fork();
    for &fd in fds {
        if let Some(slot) =
            MEMBER_FDS.iter().find(|s| s.compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst).is_ok())
        {
            let _ = slot;
        } else {
            tracing::warn!("more than {} member sockets: a forked child keeps a copy of fd {fd}", MEMBER_FDS.len());
        }
    }
}

pub(super) fn unregister_member_fds(fds: &[RawFd]) {
    for &fd in fds {
        if let Some(slot) = MEMBER_FDS.iter().find(|s| s.load(Ordering::SeqCst) == fd) {
            slot.store(-1, Ordering::SeqCst);
        }
    }
}
