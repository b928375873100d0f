//! rpoll and rselect over rsockets and ordinary descriptors together, and the sleeping the
//! blocking calls do.
//!
//! An rsocket is ready when its state says so (data received, room and credits to send, a
//! connection to accept, the connection over), which only processing its completions tells:
//! rpoll polls each rsocket's CQ, spins for the configured polling time, then arms the CQs and
//! sleeps in poll(2) on what can change them: the completion channels, the CM channels (a
//! disconnect), a listener's queue, a background connect's end. Ordinary descriptors are
//! polled as they are.
//!
//! Several threads may wait on one rsocket; the one that takes a completion event wakes the
//! others (each sleeping thread also polls an eventfd of its own), so none sleeps on an event
//! another has taken (rdma-core gates its pollers with one shared eventfd for the same reason).

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::defaults;
use super::data::State;
use super::stream::*;
use super::{lookup, Sock};
use crate::cma::lock;
use crate::Errno;

thread_local! {
    /// This thread's wake-up eventfd (made on first use).
    static MINE: c_int = {
        // SAFETY: a new descriptor, kept for the thread's life.
        unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }
    };
}

/// The wake-up descriptors of the threads sleeping now.
static SLEEPERS: Mutex<Vec<c_int>> = Mutex::new(Vec::new());

fn mine() -> c_int {
    MINE.with(|f| *f)
}

/// Wakes the other sleeping threads (after this one changed an rsocket's state).
pub(super) fn notify_others() {
    let me = mine();
    let g = lock(&SLEEPERS);
    for &fd in g.iter().filter(|&&fd| fd != me) {
        let one = 1u64;
        // SAFETY: another thread's eventfd, open while it is listed.
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

/// poll(2) on `fds` and this thread's wake-up eventfd, for at most `timeout_ms` (-1: no limit).
/// Returns whether another thread woke it.
pub(super) fn block_on(fds: &mut [libc::pollfd], timeout_ms: c_int) -> Result<bool, Errno> {
    let me = mine();
    let mut all: Vec<libc::pollfd> = fds.to_vec();
    if me >= 0 {
        all.push(libc::pollfd { fd: me, events: libc::POLLIN, revents: 0 });
        lock(&SLEEPERS).push(me);
    }
    // SAFETY: a vector of pollfds.
    let n = unsafe { libc::poll(all.as_mut_ptr(), all.len() as libc::nfds_t, timeout_ms) };
    let err = crate::last_errno();
    let mut woken = false;
    if me >= 0 {
        let mut g = lock(&SLEEPERS);
        if let Some(p) = g.iter().position(|&f| f == me) {
            g.swap_remove(p);
        }
        drop(g);
        if all.last().is_some_and(|p| p.revents != 0) {
            let mut v = 0u64;
            // SAFETY: our eventfd.
            unsafe { libc::read(me, (&mut v as *mut u64).cast(), 8) };
            woken = true;
        }
    }
    for (f, a) in fds.iter_mut().zip(&all) {
        f.revents = a.revents;
    }
    if n < 0 && err != libc::EINTR {
        return Err(Errno(err));
    }
    if n < 0 {
        return Err(Errno(libc::EINTR));
    }
    Ok(woken)
}

/// What a stream rsocket reports for `events` (rdma-core's rs_poll_rs). `arm`: arm its CQ and
/// look once more (before sleeping), instead of only looking.
fn stream_revents(s: &Stream, events: i16, arm: bool) -> i16 {
    let state = lock(&s.st).state;
    if state & (S_CONNECTED | S_ERROR) != 0 || state == S_DISCONNECTED {
        let _ = if arm { s.process(false, State::is_armed) } else { s.process(true, State::any) };
        let st = lock(&s.st);
        let mut r = 0;
        if events & libc::POLLIN != 0 && st.conn_have_rdata() {
            r |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && st.can_send() {
            r |= libc::POLLOUT;
        }
        // The peer's disconnect is a hang-up once everything it sent has been read: before
        // that the socket is readable, as a TCP socket with the peer's FIN queued behind its data
        // is. rdma-core reports POLLHUP at once, and rstream -T a, which takes any POLLHUP for an
        // error, then fails whenever its client reads behind the server's last send.
        if st.state & S_CONNECTED == 0 {
            r |= if st.state == S_DISCONNECTED {
                if st.have_rdata() {
                    0
                } else {
                    libc::POLLHUP
                }
            } else {
                libc::POLLERR
            };
        }
        return r;
    }
    if state == S_LISTENING {
        let g = lock(&s.listener);
        let ready = g.as_ref().is_some_and(|l| !lock(&l.queue).is_empty());
        return if ready { events & libc::POLLIN } else { 0 };
    }
    if state == S_CONNECT_ERROR {
        return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
    }
    0
}

/// The descriptors whose readiness can change the rsocket's state.
fn stream_waits(s: &Stream, out: &mut Vec<libc::pollfd>) {
    let st = lock(&s.st);
    let pfd = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    if st.state & S_OPENING != 0 {
        out.push(pfd(s.wake.as_raw_fd()));
    } else if st.state == S_LISTENING {
        if let Some(l) = lock(&s.listener).as_ref() {
            out.push(pfd(l.ready.as_raw_fd()));
        }
    } else if !st.channel.is_null() {
        // SAFETY: our completion channel.
        out.push(pfd(unsafe { (*st.channel).fd }));
        if st.cm_nonblock {
            out.push(pfd(s.fd));
        }
    }
}

fn revents_of(s: &Sock, events: i16, arm: bool) -> i16 {
    match s {
        Sock::Stream(st) => stream_revents(st, events, arm),
        Sock::Dgram(d) => d.revents(events, arm),
    }
}

/// One look at every entry, without sleeping: the number ready.
fn check(fds: &mut [libc::pollfd], socks: &[Option<Arc<Sock>>]) -> c_int {
    let mut n = 0;
    for (f, s) in fds.iter_mut().zip(socks) {
        f.revents = match s {
            Some(s) => revents_of(s, f.events, false),
            None => {
                let mut p = libc::pollfd { fd: f.fd, events: f.events, revents: 0 };
                // SAFETY: one pollfd.
                unsafe { libc::poll(&mut p, 1, 0) };
                p.revents
            }
        };
        if f.revents != 0 {
            n += 1;
        }
    }
    n
}

/// `SOFTRDMA_RSOCKET_TRACE=1`: each rpoll, rrecv and rsend's result on stderr (for finding out
/// what a program waits for).
pub(super) fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("SOFTRDMA_RSOCKET_TRACE").is_some_and(|v| v != "0"))
}

pub(super) fn rpoll(fds: &mut [libc::pollfd], timeout: c_int) -> Result<c_int, Errno> {
    let r = rpoll_inner(fds, timeout);
    if trace() {
        let v: Vec<String> = fds.iter().map(|f| format!("{}:{:#x}->{:#x}", f.fd, f.events, f.revents)).collect();
        eprintln!("softrdma rpoll({}, {timeout}) = {r:?}", v.join(" "));
    }
    r
}

fn rpoll_inner(fds: &mut [libc::pollfd], timeout: c_int) -> Result<c_int, Errno> {
    let socks: Vec<Option<Arc<Sock>>> = fds.iter().map(|f| if f.fd < 0 { None } else { lookup(f.fd) }).collect();
    let start = Instant::now();
    let spin = Duration::from_micros(defaults().polling_time_us as u64);
    loop {
        let n = check(fds, &socks);
        if n > 0 || timeout == 0 {
            return Ok(n);
        }
        if start.elapsed() > spin {
            break;
        }
        std::hint::spin_loop();
    }
    loop {
        // Arm every rsocket's CQ and look once more: an rsocket that became ready meanwhile
        // ends the wait.
        let mut waits = vec![];
        let mut owners = vec![];
        let mut plain_at = vec![0usize; fds.len()];
        let mut ready = false;
        for (i, (f, s)) in fds.iter_mut().zip(&socks).enumerate() {
            match s {
                Some(s) => {
                    f.revents = revents_of(s, f.events, true);
                    ready |= f.revents != 0;
                    let k = waits.len();
                    match &**s {
                        Sock::Stream(st) => stream_waits(st, &mut waits),
                        Sock::Dgram(d) => d.waits(&mut waits),
                    }
                    owners.extend(std::iter::repeat_n(Some(i), waits.len() - k));
                }
                None => {
                    plain_at[i] = waits.len();
                    waits.push(libc::pollfd { fd: f.fd, events: f.events, revents: 0 });
                    owners.push(None);
                }
            }
        }
        if ready {
            return Ok(check(fds, &socks));
        }
        let sleep = if timeout < 0 {
            defaults().wake_up_interval_ms
        } else {
            let left = timeout as i64 - start.elapsed().as_millis() as i64;
            if left <= 0 {
                return Ok(0);
            }
            left.min(defaults().wake_up_interval_ms as i64) as c_int
        };
        block_on(&mut waits, sleep)?;
        let mut took = false;
        for (w, o) in waits.iter().zip(&owners) {
            if let (Some(i), true) = (o, w.revents != 0) {
                if let Some(s) = &socks[*i] {
                    took |= match &**s {
                        Sock::Stream(st) => st.take_cq_event() | st.take_cm_events(),
                        Sock::Dgram(d) => d.take_events(),
                    };
                }
            }
        }
        if took {
            notify_others();
        }
        let mut n = 0;
        for (i, (f, s)) in fds.iter_mut().zip(&socks).enumerate() {
            f.revents = match s {
                Some(s) => revents_of(s, f.events, false),
                None => waits[plain_at[i]].revents,
            };
            if f.revents != 0 {
                n += 1;
            }
        }
        if n > 0 {
            return Ok(n);
        }
    }
}

/// rselect: select(2)'s sets as rpoll entries, and back.
pub(super) unsafe fn rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> Result<c_int, Errno> {
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        return Err(Errno(libc::EINVAL));
    }
    let mut fds = vec![];
    // SAFETY: select(2): each set NULL or valid for fds below nfds.
    unsafe {
        for fd in 0..nfds {
            let mut ev = 0;
            if !r.is_null() && libc::FD_ISSET(fd, r) {
                ev |= libc::POLLIN;
            }
            if !w.is_null() && libc::FD_ISSET(fd, w) {
                ev |= libc::POLLOUT;
            }
            if ev != 0 || (!e.is_null() && libc::FD_ISSET(fd, e)) {
                fds.push(libc::pollfd { fd, events: ev, revents: 0 });
            }
        }
    }
    // SAFETY: NULL or a timeval.
    let to = match unsafe { timeout.as_ref() } {
        None => -1,
        Some(t) => (t.tv_sec.max(0) * 1000 + t.tv_usec.max(0) / 1000).min(c_int::MAX as i64) as c_int,
    };
    let ret = rpoll(&mut fds, to)?;
    let mut cnt = 0;
    // SAFETY: as above.
    unsafe {
        for set in [r, w, e] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
        if ret > 0 {
            for f in &fds {
                if !r.is_null() && f.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                    libc::FD_SET(f.fd, r);
                    cnt += 1;
                }
                if !w.is_null() && f.revents & libc::POLLOUT != 0 {
                    libc::FD_SET(f.fd, w);
                    cnt += 1;
                }
                if !e.is_null() && f.revents & !(libc::POLLIN | libc::POLLOUT | libc::POLLHUP) != 0 {
                    libc::FD_SET(f.fd, e);
                    cnt += 1;
                }
            }
        }
    }
    Ok(cnt)
}
