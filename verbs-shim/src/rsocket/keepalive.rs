//! SO_KEEPALIVE (rdma-core's keep-alive service): every `keepalive_time` seconds (TCP_KEEPIDLE,
//! else the system's tcp_keepalive_time) an idle connection sends a zero-length RDMA WRITE,
//! which the peer's HCA acknowledges without waking its application; a dead peer makes it fail,
//! and the connection ends (ECONNRESET, EIO in SO_ERROR).

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::data::{msg, CTRL_KEEPALIVE, OP_CTRL};
use super::stream::S_CONNECTED;
use super::Sock;
use crate::cma::lock;

struct Table {
    socks: BTreeMap<c_int, (Weak<Sock>, Instant)>,
    running: bool,
}

static TABLE: Mutex<Table> = Mutex::new(Table { socks: BTreeMap::new(), running: false });
static WAKE: Condvar = Condvar::new();

/// The system's default idle time (seconds), as rdma-core reads it.
pub(super) fn system_time() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(7200)
}

/// Starts (or restarts the clock of) keep-alives for the socket.
pub(super) fn watch(fd: c_int, s: &Arc<Sock>, secs: u32) {
    let mut t = lock(&TABLE);
    t.socks.insert(fd, (Arc::downgrade(s), Instant::now() + Duration::from_secs(secs.max(1) as u64)));
    if !t.running {
        t.running = true;
        let _ = std::thread::Builder::new().name("rsocket-keepalive".into()).spawn(run);
    }
    WAKE.notify_all();
}

pub(super) fn forget(fd: c_int) {
    lock(&TABLE).socks.remove(&fd);
}

fn run() {
    softrdma_device::signals::keep_off_this_thread();
    let mut t = lock(&TABLE);
    loop {
        let now = Instant::now();
        let mut next = now + Duration::from_secs(3600);
        let mut gone = vec![];
        for (fd, (w, at)) in t.socks.iter_mut() {
            let Some(s) = w.upgrade() else {
                gone.push(*fd);
                continue;
            };
            let Sock::Stream(st) = &*s else { continue };
            if *at <= now {
                let mut g = lock(&st.st);
                if g.state & S_CONNECTED != 0 && g.ctrl_avail() {
                    g.ctrl_seqno = g.ctrl_seqno.wrapping_add(1);
                    let _ = g.post_write(&mut [], msg(OP_CTRL, CTRL_KEEPALIVE), 0, 0, 0);
                }
                *at = now + Duration::from_secs(g.keepalive_time.max(1) as u64);
            }
            next = next.min(*at);
        }
        for fd in gone {
            t.socks.remove(&fd);
        }
        t = WAKE.wait_timeout(t, next.saturating_duration_since(Instant::now())).unwrap_or_else(|e| e.into_inner()).0;
    }
}
