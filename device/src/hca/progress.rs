//! Who moves a device's work (design D2 revised, the data path in the application): the device
//! thread of a daemon or embedded device, and for [`Progress::Application`] devices the calls of
//! the application's threads ([`Hca::drive`], [`Hca::drive_post`]) with a progress thread that
//! serves what no call drives.

use super::*;

/// Who makes a device progress (design D2 revised: the data path in the application).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// The device thread does everything: it spins for a while after activity (1 ms,
    /// `$SOFTRDMA_SPIN_US`) and sleeps in poll otherwise. A process of its own (the daemon) has to
    /// work this way; every message then passes through the device's thread besides the
    /// application's.
    #[default]
    DeviceThread,
    /// The application's threads drive the device in the calls they make anyway, as a user-space
    /// provider over a NIC does: posting runs the engine and sends ([`Hca::drive`]), polling an
    /// empty CQ receives, runs the timers and writes completions. The device thread becomes a
    /// *progress thread* that never spins: it serves what no call drives (one-sided targets,
    /// timers, completion-channel sleepers) from a blocking poll on the socket, the doorbell and
    /// the engine's next timer; it can be told to keep off the socket for a while after an
    /// application thread read it ([`PARK`], `$SOFTRDMA_PARK_US`; off by default, measured).
    Application,
}

impl Progress {
    /// `$SOFTRDMA_PROGRESS`: `application` or `device` (the default; anything else too).
    pub fn from_env() -> Progress {
        match std::env::var("SOFTRDMA_PROGRESS").as_deref() {
            Ok("application") => Progress::Application,
            _ => Progress::DeviceThread,
        }
    }
}

/// How long the progress thread of a [`Progress::Application`] device stays off the socket after
/// an application thread last read it (and how often it looks again meanwhile). 0 by default:
/// measured (BENCHMARKS.md, "The data path in the application"), parking for 500 us made
/// ib_write_lat wait for the park to end (perftest polls its CQ, then spins on memory that only
/// the progress thread can fill): 275 us typical against 22-25 us without; 20 and 50 us were no
/// better than 0 for ib_send_lat either.
pub const PARK: std::time::Duration = std::time::Duration::from_micros(0);

/// The longest a [`Progress::Application`] device's progress thread sleeps (50 ms).
const APPLICATION_TICK_NS: u64 = 50_000_000;

/// [`PARK`], or `$SOFTRDMA_PARK_US` (read once; a tuning knob, BENCHMARKS.md compares values).
fn park_time() -> std::time::Duration {
    static S: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::env::var("SOFTRDMA_PARK_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(PARK, std::time::Duration::from_micros)
    })
}

/// The device thread; `udp` is a descriptor of the state's receive socket (`RoceUdp`), polled
/// while the state's lock is released.
pub(super) fn run(sh: &Shared, udp: &OwnedFd) {
    // Adaptive polling (design D4): after ring or wire activity the device keeps looking at the rings
    // for a short while with the clients' doorbells suppressed, then clears the flag, fences,
    // looks once more (a post that saw the flag set is found here) and sleeps.
    let mut spin_until: Option<std::time::Instant> = None;
    // Datagrams arrived in the last round: an answer (or the next request) tends to follow.
    let mut received = false;
    let application = sh.progress == Progress::Application;
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        // An application thread drives the device: stay off the socket until it stops (it looks
        // at the socket itself; two threads taking turns per packet would only add wake-ups).
        let driven_for = application
            .then(|| {
                let until = sh.driven_until.load(Ordering::Relaxed);
                let now = sh.epoch.elapsed().as_nanos() as u64;
                (until > now).then(|| std::time::Duration::from_nanos(until - now))
            })
            .flatten();
        let (timeout, spinning_now, groups) = {
            let mut st = sh.lock();
            let before = st.io.ring_wqes + st.io.udp_rcvd;
            st.pump();
            // Spin after activity: the device thread for spin_time(); a progress thread for
            // progress_spin_time() and only while no application thread reads the socket.
            let spin_for = if application { progress_spin_time() } else { spin_time() };
            if driven_for.is_some() {
                spin_until = None;
            } else if !spin_for.is_zero() && (st.io.ring_wqes + st.io.udp_rcvd != before || received) {
                if spin_until.is_none() {
                    st.set_polling(true);
                }
                spin_until = Some(std::time::Instant::now() + spin_for);
            }
            let spinning = spin_until.is_some_and(|t| std::time::Instant::now() < t);
            if !spinning && spin_until.take().is_some() {
                st.set_polling(false);
                std::sync::atomic::fence(Ordering::SeqCst);
                st.pump();
            }
            let now = st.now();
            // A CM channel whose pipe was full is looked at again every millisecond.
            let cm_retry = st.cm.has_backlog().then(|| now + softrdma_engine::time::Duration::from_millis(1));
            let next = [st.dev.poll_timeout(), st.delayed.peek().map(|d| d.0.at), cm_retry].into_iter().flatten().min();
            let mut t = if spinning { Some(0) } else { next.map(|t| t.saturating_since(now).as_nanos()) };
            if let Some(d) = driven_for {
                t = Some(t.map_or(d.as_nanos() as u64, |t| t.min(d.as_nanos() as u64)));
            }
            if application {
                // Wakes at least every 50 ms: an application thread arming a later timer (a
                // send's transport timer, 67 ms and more) need not wake it, one arming an earlier
                // timer does ([`Hca::wake_for_timers`]), and neither happens once per post.
                t = Some(t.map_or(APPLICATION_TICK_NS, |t| t.min(APPLICATION_TICK_NS)));
            }
            // The application's calls arm timers while this thread sleeps: they wake it when they
            // arm one earlier than this ([`Hca::wake_for_timers`]).
            sh.sleep_until.store(t.map_or(u64::MAX, |t| now.0.saturating_add(t)), Ordering::SeqCst);
            (t, spinning, st.groups.sockets())
        };
        let ts = timeout.map(|ns| nix::sys::time::TimeSpec::from_duration(std::time::Duration::from_nanos(ns)));
        // The group sockets are shared with the state: one that a leave drops meanwhile stays open
        // (and a member) until this poll returns and `groups` goes, as the kernel would keep it
        // for a poll in progress anyway.
        if driven_for.is_some() {
            // Parked: not on the socket's wait queue at all (a poll asking for no event still
            // sits there, and every datagram would wake this thread for nothing).
            let mut fds = [PollFd::new(sh.wake.as_fd(), PollFlags::POLLIN)];
            let _ = nix::poll::ppoll(&mut fds, ts, None);
            if fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)) {
                let _ = sh.wake.read();
            }
            received = false;
            continue;
        }
        let mut fds =
            vec![PollFd::new(udp.as_fd(), PollFlags::POLLIN), PollFd::new(sh.wake.as_fd(), PollFlags::POLLIN)];
        fds.extend(groups.iter().map(|g| PollFd::new(g.as_fd(), PollFlags::POLLIN)));
        let _ = nix::poll::ppoll(&mut fds, ts, None);
        let group_readable = fds[2..].iter().any(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)));
        if spinning_now && spin_yields() {
            // While spinning, let the other runnable threads (the clients' pollers, the peer
            // device) have the CPU between two looks: on a machine with fewer cores than busy
            // threads, a spin that does not yield delays the very work it waits for.
            std::thread::yield_now();
        }
        let wake = fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        let readable = fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        if wake {
            let _ = sh.wake.read();
        }
        received = false;
        if group_readable {
            let mut st = sh.lock();
            if st.receive_groups() > 0 {
                st.pump();
                received = true;
            }
        }
        if readable {
            // Batch by batch, releasing the lock in between so clients' calls get in.
            for _ in 0..64 {
                let mut st = sh.lock();
                let n = st.receive();
                st.pump();
                if n == 0 {
                    break;
                }
                received = true;
            }
        }
    }
}

/// How long the device keeps polling the rings and the socket after the last work it found:
/// 1 ms, or $SOFTRDMA_SPIN_US (a tuning knob, read once; BENCHMARKS.md compares settings).
fn spin_time() -> std::time::Duration {
    static S: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::time::Duration::from_micros(
            std::env::var("SOFTRDMA_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        )
    })
}

/// How long a progress thread ([`Progress::Application`]) keeps looking at the socket after
/// work it found itself, while no application thread reads it: $SOFTRDMA_PROGRESS_SPIN_US
/// (read once), default 0 (it blocks in poll at once).
fn progress_spin_time() -> std::time::Duration {
    static S: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::time::Duration::from_micros(
            std::env::var("SOFTRDMA_PROGRESS_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
        )
    })
}

/// Whether the device yields the CPU between two looks while it spins: yes, unless
/// $SOFTRDMA_SPIN_YIELD=0 (a tuning knob, read once).
fn spin_yields() -> bool {
    static S: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *S.get_or_init(|| std::env::var("SOFTRDMA_SPIN_YIELD").map_or(true, |v| v != "0"))
}

impl Hca {
    /// Drives the device from the calling thread (a [`Progress::Application`] device's clients
    /// call this after posting and when a poll finds nothing): moves posted work into the engine,
    /// runs due timers, sends, writes completions, and with `receive` also reads what the socket
    /// holds (batch by batch) and answers it. Returns the datagrams received. On a
    /// [`Progress::DeviceThread`] device it does the same work, which the device thread would
    /// have done a little later.
    pub fn drive(&self, receive: bool) -> usize {
        let sh = &self.shared;
        if receive {
            // Only a thread that reads the socket keeps the progress thread off it: one that
            // posts and then spins on memory (an RDMA WRITE's last byte) needs it there.
            let until = sh.epoch.elapsed() + park_time();
            sh.driven_until.store(until.as_nanos() as u64, Ordering::Relaxed);
        }
        let mut st = sh.lock();
        st.pump();
        let mut received = 0;
        if receive {
            for _ in 0..64 {
                let n = st.receive();
                if n == 0 {
                    break;
                }
                received += n;
                st.pump();
            }
        }
        Hca::wake_for_timers(sh, &st);
        received
    }

    /// Wakes the device thread if the engine (or the fault injector's delay queue) now has a
    /// timer earlier than the one it sleeps for: an application thread armed it (a send's
    /// transport timer, IBTA 9.7.6.1.3) while that thread slept. Once per earlier deadline, not
    /// per call: later posts arm later timers.
    pub(super) fn wake_for_timers(sh: &Shared, st: &State) {
        let next = [st.dev.poll_timeout(), st.delayed.peek().map(|d| d.0.at)].into_iter().flatten().min();
        if let Some(t) = next {
            if t.0 < sh.sleep_until.load(Ordering::SeqCst) {
                sh.sleep_until.store(t.0, Ordering::SeqCst);
                let _ = sh.wake.write(1);
            }
        }
    }

    /// After a post to QP `qpn`'s send queue on a [`Progress::Application`] device: moves the
    /// work into the engine and sends it now, unless the post is part of a `stream` (the
    /// application's previous call was a post too) and the QP still waits for an answer to
    /// what it sent before (an ACK, READ response or RNR timer is due). Then the new packets stay
    /// for the next pump, which that answer brings (the progress thread reads it, or the
    /// application's next poll; the transport timer bounds it), and leave together in GSO
    /// sends: an application that posts a stream of small messages makes one send syscall per
    /// batch instead of one per post. A post after a poll (a ping-pong, a latency test) or to
    /// an idle QP leaves at once.
    pub fn drive_post(&self, qpn: Qpn, stream: bool) {
        let mut st = self.shared.lock();
        if stream && st.dev.awaiting_response(qpn) {
            let moved = st.service_rings();
            st.io.ring_wqes += moved as u64;
        } else {
            st.pump();
        }
        Hca::wake_for_timers(&self.shared, &st);
    }
}
