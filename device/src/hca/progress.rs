//! Who moves a device's work (docs/architecture.md D2 revised, the data path in the application):
//! the device thread of a daemon or embedded device, and for [`Progress::Application`] devices the
//! calls of the application's threads ([`Hca::drive`], [`Hca::drive_post`]) with a progress thread
//! that serves what no call drives.

use super::*;

use std::os::fd::BorrowedFd;

use nix::sys::epoll::{EpollEvent, EpollFlags};

/// Who makes a device progress (docs/architecture.md D2 revised: the data path in the application).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// The device thread does everything: it spins for a while after activity
    /// ([`super::config::Tuning::spin`]) and sleeps in poll otherwise. A process of its own (the daemon) has to
    /// work this way; every message then passes through the device's thread besides the
    /// application's.
    #[default]
    DeviceThread,
    /// The application's threads drive the device in the calls they make anyway, as a user-space
    /// provider over a NIC does: posting runs the engine and sends ([`Hca::drive`]), polling an
    /// empty CQ receives, runs the timers and writes completions. The device thread becomes a
    /// *progress thread*: it serves what no call drives (one-sided targets, timers,
    /// completion-channel sleepers) from a blocking poll on the socket, the doorbell and the
    /// engine's next timer, and keeps looking after work only while a CQ is armed or the
    /// application makes no call (see [`PROGRESS_SPIN`]). While an application thread polls the socket itself (its CQ is
    /// empty and it keeps looking), the socket leaves the progress thread's wait set, so that
    /// the datagrams that thread is about to read do not wake a second one (see [`HANDOFF_IDLE`]).
    Application,
}

impl Progress {
    /// What `$SOFTRDMA_PROGRESS` says (read once: [`super::config::Tuning::progress`]).
    pub fn from_env() -> Progress {
        super::tuning().progress
    }
}

/// How long a [`Progress::Application`] device's socket stays handed off to the application
/// after its last read by an application thread, when no poll ended the handoff before: a
/// thread that polled an empty CQ and then went elsewhere without a completion (it sleeps on a
/// channel it armed before, it spins on memory after giving up) has its device thread back on
/// the socket within this time, and the time to the progress thread's next look (at first
/// within this time too, up to [`HANDOFF_LOOK_MAX`] after a long run of polls). The handoff
/// ends at once when a poll returns completions (the application got what it waited for and may
/// now spin on memory that only the device thread can fill: ib_write_lat's shape) and when a CQ
/// is armed for a channel.
pub const HANDOFF_IDLE: std::time::Duration = std::time::Duration::from_micros(200);

/// The longest a [`Progress::Application`] device's progress thread sleeps between two looks at
/// a socket handed off to an application thread that keeps reading it (4 ms;
/// [`super::config::Tuning::handoff_look_max`]). Each look that finds the thread still at it doubles the
/// sleep from `min(handoff_idle, HELD_ANSWER_WAIT)` up to this; the look that finds it gone starts again
/// from there. Every look wakes this thread, which on a machine whose cores the application's
/// threads keep busy preempts one of them: at a look every 200 us, ib_send_lat's p99 was 6-8x
/// its median, and the p99 fell with the looks' spacing (BENCHMARKS.md, "The looks at a
/// handed-off socket"). What a look bounds (the handoff's idle end, answers held back, a
/// deferred end: see [`HANDOFF_IDLE`], [`HELD_ANSWER_WAIT`], [`END_AFTER_POST_WAIT`]) is then bounded by
/// this instead for an application thread that polled without a pause and then stopped without
/// a completion, or after a message without answering: the socket, and with it every other QP
/// of the process, waits that long for the progress thread. That is why this is not longer: 16
/// ms lowered the p99 of the latency tests further but let that wait grow fourfold
/// (BENCHMARKS.md, "The looks, further apart: tried").
pub const HANDOFF_LOOK_MAX: std::time::Duration = std::time::Duration::from_millis(4);

/// The longest a [`Progress::Application`] device's progress thread sleeps (50 ms).
const APPLICATION_TICK_NS: u64 = 50_000_000;

/// The longest a [`Progress::Application`] device's progress thread sleeps: while answers a
/// poll held back are owed, [`HELD_ANSWER_WAIT`]; while the application drives the device
/// (its last call `since_drive_ns` ago, within [`ACTIVE_WINDOW`]), [`DRIVEN_SLEEP_MAX`]; else
/// [`APPLICATION_TICK_NS`].
fn application_sleep_ns(tx_owed: bool, since_drive_ns: u64) -> u64 {
    if tx_owed {
        HELD_ANSWER_WAIT.as_nanos() as u64
    } else if since_drive_ns < ACTIVE_WINDOW.as_nanos() as u64 {
        DRIVEN_SLEEP_MAX.as_nanos() as u64
    } else {
        APPLICATION_TICK_NS
    }
}

/// Puts the device thread's descriptor of the socket back into its wait set (or takes it out):
/// with the state's lock held (`_st`), so that `handed_off` and the set agree. If datagrams are
/// waiting when it goes back, epoll wakes the device thread at once: nothing waits unseen.
fn set_handoff(sh: &Shared, _st: &State, on: bool) {
    sh.end_after_post.store(false, Ordering::Relaxed);
    // A thread asleep on a completion channel waits on the socket itself (`Hca::sleep_on_channel`):
    // the socket stays with the application's threads until that thread wakes.
    if !on && sh.channel_sleepers.load(Ordering::Relaxed) > 0 {
        return;
    }
    if sh.handed_off.load(Ordering::Relaxed) == on {
        return;
    }
    let flags = if on { EpollFlags::empty() } else { EpollFlags::EPOLLIN };
    // A forked child's copy of the descriptor is another socket, unknown to the set (ENOENT):
    // it has no device thread to hand anything to.
    if sh.poll_set.modify(&sh.udp_poll, &mut EpollEvent::new(flags, 0)).is_ok() {
        sh.handed_off.store(on, Ordering::Relaxed);
        if on {
            sh.handoffs.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The device thread: it waits on `poll_set` (the receive socket, unless handed off), the
/// doorbell, the multicast groups and the next timer, with the state's lock released.
pub(super) fn run(sh: &Shared) {
    // Adaptive polling (docs/architecture.md D4): after ring or wire activity the device keeps
    // looking at the rings for a short while with the clients' doorbells suppressed, then clears
    // the flag, fences, looks once more (a post that saw the flag set is found here) and sleeps.
    let mut spin_until: Option<std::time::Instant> = None;
    // Datagrams arrived in the last round: an answer (or the next request) tends to follow.
    let mut received = false;
    let application = sh.progress == Progress::Application;
    // The multicast group sockets as of the last look at the state, and whether the last wait
    // ended for something to do (not only a timeout).
    let mut groups_seen: Vec<Arc<softrdma_transport::GroupSocket>> = Vec::new();
    // The relay links as of the last look (their datagrams are rare: always in the wait set).
    let mut links_seen: Vec<Arc<softrdma_transport::relay::Link>> = Vec::new();
    let mut woken = true;
    // Acknowledgements this (progress) thread received and holds back for the application's
    // next post, until this deadline (see `State::hold_for_post`).
    let mut holding: Option<softrdma_engine::time::Instant> = None;
    // How long this thread sleeps between two looks at a handed-off socket (see HANDOFF_LOOK_MAX).
    let look_base = (sh.handoff_idle.min(HELD_ANSWER_WAIT).as_nanos() as u64).max(1);
    let mut look_every = look_base;
    // The application's call count as last seen, and when it last changed.
    let mut calls_seen = (0u64, std::time::Instant::now());
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        // The socket is handed off to an application thread that polls it: take it back once
        // that thread has not read it for `handoff_idle`; until then wake when that is due.
        let handed_back_in = (application && sh.handed_off.load(Ordering::Relaxed))
            .then(|| {
                let idle = sh.handoff_idle.as_nanos() as u64;
                let since =
                    (sh.epoch.elapsed().as_nanos() as u64).saturating_sub(sh.last_drive_ns.load(Ordering::Relaxed));
                // A handoff whose end waits for a post that did not come (`Hca::end_handoff_after_poll`)
                // ends at this thread's next look after END_AFTER_POST_WAIT.
                let deferred = sh.end_after_post.load(Ordering::Relaxed);
                let wait = END_AFTER_POST_WAIT.as_nanos() as u64;
                // A thread asleep on a completion channel with the socket in its wait set reads
                // it when a datagram comes: the socket stays with it however long it sleeps.
                let sleeper = sh.channel_sleepers.load(Ordering::Relaxed) > 0;
                if !sleeper && (since >= idle || (deferred && since >= wait)) {
                    set_handoff(sh, &sh.lock(), false);
                    look_every = look_base;
                    None
                } else {
                    // The application thread still reads the socket: look again later, each
                    // time twice as late up to HANDOFF_LOOK_MAX (the first looks come within
                    // handoff_idle, at most HELD_ANSWER_WAIT: the bound on answers a poll held back).
                    let rest = look_every;
                    if !woken {
                        look_every = (look_every * 2).min(tuning().handoff_look_max.as_nanos() as u64).max(look_base);
                    }
                    Some(if deferred { rest.min(wait - since) } else { rest })
                }
            })
            .flatten();
        // While a thread sleeps on a completion channel with the socket (`Hca::sleep_on_channel`),
        // the state's lock is free and the timers other threads arm meanwhile (a post's
        // transport timer) are this thread's to run: the main path below, without the socket.
        let sleeper = sh.channel_sleepers.load(Ordering::Relaxed) > 0;
        if let Some(rest) = handed_back_in.filter(|_| !woken && !sleeper) {
            // The application thread that reads the socket also runs the timers and writes the
            // completions: stay away from the state's lock (it holds it most of the time) and
            // wait for the doorbell, a group's datagram, the socket's return or the idle check.
            let mut fds = vec![
                PollFd::new(sh.poll_set.0.as_fd(), PollFlags::POLLIN),
                PollFd::new(sh.wake.as_fd(), PollFlags::POLLIN),
            ];
            fds.extend(groups_seen.iter().map(|g| PollFd::new(g.as_fd(), PollFlags::POLLIN)));
            fds.extend(links_seen.iter().map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN)));
            // A report an application thread's pump left (`State::publish`), sent unlocked.
            send_unsent(sh.state.try_lock().ok().and_then(|mut st| st.take_unsent()));
            let ts = nix::sys::time::TimeSpec::from_duration(std::time::Duration::from_nanos(rest));
            let _ = nix::poll::ppoll(&mut fds, Some(ts), None);
            woken = fds.iter().any(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)));
            // Answers a poll held back and no call sent since: the main path's pump sends them,
            // unless the application thread read the socket within END_AFTER_POST_WAIT. That
            // thread is at work and sends them with its next call (in a ping-pong answers are
            // owed most of the time, between a poll and the post after it). Taking the lock and
            // pumping then only preempts it: a look that pumped ran ~12 us (median) on a core a
            // spinning program needed, 1,800 times a second (`perf sched timehist`), the source
            // of ib_send_lat's p99.
            let since = (sh.epoch.elapsed().as_nanos() as u64).saturating_sub(sh.last_drive_ns.load(Ordering::Relaxed));
            woken |= sh.tx_owed.load(Ordering::Relaxed) && since >= END_AFTER_POST_WAIT.as_nanos() as u64;
            continue;
        }
        // The sockets of the last look go before this wait: one that a leave dropped meanwhile
        // must not stay a member of its IP group while this thread sleeps.
        groups_seen.clear();
        links_seen.clear();
        let (timeout, spinning_now, groups, links, report) = {
            let mut st = sh.lock();
            let before = st.io.ring_wqes + st.io.udp_rcvd;
            // Held acknowledgements stay until their deadline (a call of the application's
            // sends them before it, with its post), then go.
            holding = holding.filter(|until| st.tx_owed && st.now() < *until);
            if holding.is_some() {
                st.pump_with(false);
            } else {
                st.pump();
            }
            // Spin after activity: the device thread for `Tuning::spin`; a progress thread for
            // `Tuning::progress_spin`, only while no application thread reads the socket and a
            // thread of the application waits for a completion event (a CQ is armed): then no
            // call of the application drives the device, and this thread is the one to answer
            // the next packet (an RDMA READ's next request, the next ACK of a chained list).
            // A program that spins on memory instead (ib_write_lat) arms nothing: there two
            // spinning threads already hold the two cores, and a third would only preempt them.
            // The same look after work serves a program that makes no call at all (none for
            // IDLE_LOOK_AFTER): it sleeps elsewhere, as the target of ib_write_bw or ib_read_bw
            // does in its TCP exchange, and every request of the peer's next burst waits for
            // this thread alone. Blocking in poll there cost a wake-up per burst (ib_write_bw
            // 64 B across: 0.76-0.82 M msg/s against 1.0-1.06 with the look, BENCHMARKS.md
            // "The target's progress thread").
            let t = std::time::Instant::now();
            if st.app_calls != calls_seen.0 {
                calls_seen = (st.app_calls, t);
            }
            let idle_application = t.duration_since(calls_seen.1) >= sh.idle_look_after && tuning().idle_look;
            let spin_for = if !application {
                tuning().spin
            } else if st.armed_cqs > 0 || idle_application {
                tuning().progress_spin
            } else {
                std::time::Duration::ZERO
            };
            if handed_back_in.is_some() {
                spin_until = None;
            } else if !spin_for.is_zero() && (st.io.ring_wqes + st.io.udp_rcvd != before || received) {
                if spin_until.is_none() {
                    st.set_polling(true);
                    if application {
                        st.io.progress_looks += 1;
                    }
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
            // (A sleeper on a channel keeps the socket however long it sleeps: no look is due.)
            let look = handed_back_in.filter(|_| !sleeper);
            if let Some(d) = look.into_iter().chain(holding.map(|u| u.saturating_since(now).as_nanos())).min() {
                t = Some(t.map_or(d, |t| t.min(d)));
            }
            if application {
                // Wakes at least every 50 ms: an application thread arming a later timer (a
                // send's transport timer, 67 ms and more) need not wake it, one arming an earlier
                // timer does ([`Hca::wake_for_timers`]), and neither happens once per post.
                // While the application drives the device, at least every DRIVEN_SLEEP_MAX (every
                // HELD_ANSWER_WAIT while answers are owed): its polls may hold answers back
                // (`Hca::drive`) that no call of its sends.
                sh.tx_owed.store(st.tx_owed, Ordering::Relaxed);
                let since =
                    (sh.epoch.elapsed().as_nanos() as u64).saturating_sub(sh.last_drive_ns.load(Ordering::Relaxed));
                let tick = application_sleep_ns(st.tx_owed, since);
                t = Some(t.map_or(tick, |t| t.min(tick)));
            }
            // The application's calls arm timers while this thread sleeps: they wake it when they
            // arm one earlier than this ([`Hca::wake_for_timers`]).
            sh.sleep_until.store(t.map_or(u64::MAX, |t| now.0.saturating_add(t)), Ordering::SeqCst);
            (t, spinning, st.groups.sockets(), st.relay.links(), st.take_unsent())
        };
        send_unsent(report);
        let ts = timeout.map(|ns| nix::sys::time::TimeSpec::from_duration(std::time::Duration::from_nanos(ns)));
        // The group sockets are shared with the state: one that a leave drops meanwhile stays open
        // (and a member) until this poll returns and `groups` goes, as the kernel would keep it
        // for a poll in progress anyway.
        let mut fds = vec![
            PollFd::new(sh.poll_set.0.as_fd(), PollFlags::POLLIN),
            PollFd::new(sh.wake.as_fd(), PollFlags::POLLIN),
        ];
        fds.extend(groups.iter().map(|g| PollFd::new(g.as_fd(), PollFlags::POLLIN)));
        fds.extend(links.iter().map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN)));
        let _ = nix::poll::ppoll(&mut fds, ts, None);
        let readable_in = |r: std::ops::Range<usize>| {
            fds[r].iter().any(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
        };
        let group_readable = readable_in(2..2 + groups.len());
        let link_readable = readable_in(2 + groups.len()..fds.len());
        if spinning_now && tuning().spin_yield {
            // While spinning, let the other runnable threads (the clients' pollers, the peer
            // device) have the CPU between two looks: on a machine with fewer cores than busy
            // threads, a spin that does not yield delays the very work it waits for.
            std::thread::yield_now();
        }
        let wake = fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        let readable = fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        drop(fds);
        woken = wake || readable || group_readable || link_readable;
        groups_seen = groups;
        links_seen = links;
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
        if link_readable {
            let mut st = sh.lock();
            if st.receive_relay() > 0 {
                st.pump();
                received = true;
            }
        }
        if readable {
            // Batch by batch, releasing the lock in between so clients' calls get in.
            for _ in 0..64 {
                let mut st = sh.lock();
                // The socket went to an application thread since the wait ended (a thread that
                // sleeps on a channel took it): that thread reads it.
                if application && sh.handed_off.load(Ordering::Relaxed) {
                    break;
                }
                let n = st.receive();
                if application {
                    st.io.progress_rcvd += n as u64;
                }
                if n > 0 && holding.is_none() && st.hold_for_post() {
                    let cqes = st.cqes_written;
                    // The application posted a send a moment ago and does not read the socket
                    // now (it spins on memory, as ib_write_lat does, or computes). If this run
                    // completed no work (one-sided: memory the application can only watch) and
                    // needs only acknowledgements sent, they wait for that post's successor,
                    // likely near (at most HELD_ANSWER_WAIT), to leave behind it in one GSO send: the
                    // peer's poll then finds its completion and the new request together and
                    // handles both itself. A lone acknowledgement would end the peer's poll
                    // before the request came, which then only its progress thread, woken
                    // while both programs spin, could serve (ib_write_lat's slow mode:
                    // BENCHMARKS.md). A run that completes work is left alone: the
                    // application's poll is about to find it, and a hold there cost a wake-up
                    // of this thread per hold (measured on ib_send_lat).
                    st.pump_with(false);
                    if st.cqes_written == cqes && st.dev.only_acks_pending() {
                        st.posted_send = false;
                        st.tx_owed = true;
                        sh.tx_owed.store(true, Ordering::Relaxed);
                        holding = Some(
                            st.now() + softrdma_engine::time::Duration::from_nanos(HELD_ANSWER_WAIT.as_nanos() as u64),
                        );
                        received = true;
                        break;
                    }
                }
                st.pump();
                if n == 0 {
                    break;
                }
                received = true;
            }
        }
    }
}

/// Sends a provider's report to its daemon (`State::take_unsent`), with the state unlocked.
fn send_unsent(report: Option<(Publisher, softrdma_protocol::proto::Published)>) {
    if let Some((p, r)) = report {
        (p.0)(r);
    }
}

/// How long a [`Progress::Application`] device's progress thread keeps looking (yielding the CPU
/// between two looks) after work it found, while the application sleeps on a completion
/// channel or makes no call at all (200 us). A wake-up from a blocking poll costs tens of microseconds on a busy
/// machine (UDP blocking ping-pong: 59 us round trip against 3.2 busy-polling, BENCHMARKS.md),
/// and an event-driven program's transfers are chains of such hops that only the progress
/// threads serve: lnet_bulk's GET (one RDMA READ in flight, `initiator_depth` 1) waited one
/// wake-up per 4 KiB page. Measured in BENCHMARKS.md ("Progress threads that keep looking while
/// the application sleeps").
pub const PROGRESS_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// After how long without a call (a poll or a post) a [`Progress::Application`] device's
/// progress thread takes its application for one that makes none (10 ms; `HcaConfig`'s
/// `idle_look_after`): a program that posts and polls calls far more often (a stream's polls,
/// a ping-pong's post per round trip), and one that computes between calls for longer has its
/// progress thread serve its targets in the meantime.
pub const IDLE_LOOK_AFTER: std::time::Duration = std::time::Duration::from_millis(10);

impl Hca {
    /// Drives the device from the calling thread (a [`Progress::Application`] device's clients
    /// call this after posting and when a poll finds nothing): moves posted work into the engine,
    /// runs due timers, sends, writes completions, and with `receive` also reads what the socket
    /// holds (batch by batch) and answers it. Returns the datagrams received. On a
    /// [`Progress::DeviceThread`] device it does the same work, which the device thread would
    /// have done a little later.
    pub fn drive(&self, receive: bool) -> usize {
        self.drive_locked(&mut self.shared.lock(), receive, receive, receive)
    }

    /// [`Hca::drive`] with the state's lock held; with `take_socket` (and `receive`) the socket
    /// is handed off to the calling thread; with `defer`, answers may wait for the thread's next
    /// post (see below).
    fn drive_locked(&self, st: &mut State, receive: bool, take_socket: bool, defer: bool) -> usize {
        let sh = &self.shared;
        // One clock read for the call (between receive batches, one more each).
        let (now, held) = st.hold_clock();
        if receive && take_socket && sh.progress == Progress::Application && !sh.handoff_idle.is_zero() {
            // This thread reads the socket now (and, its CQ empty, again soon): the device thread
            // keeps off it until a poll returns completions or this thread stops looking. Only a
            // thread that reads the socket takes it: one that posts and then spins on memory (an
            // RDMA WRITE's last byte) needs the device thread there.
            sh.last_drive_ns.store(now.as_nanos(), Ordering::Relaxed);
            set_handoff(sh, st, true);
        }
        st.pump();
        let mut received = 0;
        if receive {
            // A poll: when what it received completes work and the application posted a send
            // since its last completions (a ping-pong), the completions come first and the
            // answers the engine owes (the ACKs, IBTA 9.7.5.1 ties neither to the other) wait
            // for this application's next call, which sends them after what it posts, in the
            // same GSO send (a ping-pong's answer then pays one send system call instead of
            // two), or for the progress thread (within DRIVEN_SLEEP_MAX). Only where one is.
            // Not for a poll that leaves the socket (its thread is about to sleep: nothing of it
            // would send them).
            let defer = sh.progress == Progress::Application && defer;
            for batch in 0..64 {
                if batch > 0 {
                    st.refresh_clock();
                }
                // The first read of a spinning poll (it keeps the socket) is a short one.
                let n = if batch == 0 && take_socket { st.receive_spin() } else { st.receive() };
                if n == 0 {
                    break;
                }
                received += n;
                if defer {
                    let before = st.cqes_written;
                    st.pump_with(false);
                    if st.cqes_written != before && st.dev.answers_pending() && std::mem::take(&mut st.posted_send) {
                        st.tx_owed = true;
                        break;
                    }
                }
                st.pump();
            }
        }
        sh.tx_owed.store(st.tx_owed, Ordering::Relaxed);
        if !receive && sh.end_after_post.load(Ordering::Relaxed) {
            // A send after a poll that deferred the handoff's end: it has left, the end is due.
            set_handoff(sh, st, false);
        }
        Hca::wake_for_timers(sh, st);
        st.release_clock(held);
        received
    }

    /// A thread of the application's that blocks on a completion channel (`ibv_get_cq_event`,
    /// its eventfd `fd`) of a [`Progress::Application`] device sleeps here: on the channel, the
    /// device's socket and the engine's next timer at once, for at most `timeout`. When the
    /// socket or a timer wakes it, this thread does the device's work itself (receives, answers
    /// at once, runs the timers, writes the completions and with them the channel's events),
    /// then returns for the caller to look at the channel's queue. Otherwise the progress thread
    /// received the datagram, wrote the completion and the event, and the event woke this
    /// thread: two wake-ups for one message, where a NIC wakes the sleeper once, through the
    /// channel's fd, when it writes the completion (issue 54: `ibv_rc_pingpong -e` at 1.9x a
    /// blocking UDP ping-pong's round trip; a wake-up here costs tens of microseconds). While
    /// such a thread sleeps the socket stays handed off (`Shared::channel_sleepers`): the
    /// progress thread serves the doorbell, the multicast groups, the relay links and the timers
    /// other threads arm, and gets the socket back when the last sleeper wakes.
    ///
    /// None where it does not apply (a device the device thread drives, a forked child's copy,
    /// `SOFTRDMA_EVENT_SOCKET=0`): the caller waits on the channel alone. `Some(Err(EINTR))` when a
    /// signal handler ran during the wait (poll(2) is never restarted: the caller decides).
    pub fn sleep_on_channel(
        &self,
        fd: BorrowedFd<'_>,
        hangup: Option<BorrowedFd<'_>>,
        timeout: Option<std::time::Duration>,
    ) -> Option<nix::Result<()>> {
        let sh = &self.shared;
        if sh.progress != Progress::Application || !tuning().event_socket || in_forked_child() {
            return None;
        }
        let timer_ns = {
            let mut st = sh.lock();
            sh.channel_sleepers.fetch_add(1, Ordering::Relaxed);
            set_handoff(sh, &st, true);
            // What the engine owes (answers a poll held back for a post that does not come now)
            // leaves before this thread sleeps.
            st.pump();
            sh.tx_owed.store(st.tx_owed, Ordering::Relaxed);
            let now = st.now();
            [st.dev.poll_timeout(), st.delayed.peek().map(|d| d.0.at)]
                .into_iter()
                .flatten()
                .min()
                .map(|t| t.saturating_since(now).as_nanos())
        };
        let wait = [timer_ns.map(std::time::Duration::from_nanos), timeout].into_iter().flatten().min();
        let mut fds = vec![PollFd::new(fd, PollFlags::POLLIN), PollFd::new(sh.udp_poll.as_fd(), PollFlags::POLLIN)];
        if let Some(h) = hangup {
            fds.push(PollFd::new(h, PollFlags::empty())); // POLLHUP is always reported
        }
        let r = nix::poll::ppoll(&mut fds, wait.map(nix::sys::time::TimeSpec::from_duration), None);
        let socket = fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        drop(fds);
        let mut st = sh.lock();
        sh.channel_sleepers.fetch_sub(1, Ordering::Relaxed);
        // Woken by a datagram or for a timer (a timeout of the caller's own runs nothing).
        let timer_due =
            matches!(r, Ok(0)) && timer_ns.is_some_and(|t| timeout.is_none_or(|d| t <= d.as_nanos() as u64));
        if socket || timer_due {
            // Answered at once, as a NIC does. (Holding the ACKs for the thread's next post, as
            // a poll does, so that they leave with the answer, was tried: it hung ib_send_lat
            // -s 1048576 -e, both sides asleep with nothing in flight and no timer armed; cause
            // not found. Without it, ibv_rc_pingpong -e is at the blocking UDP round trip.)
            self.drive_locked(&mut st, true, false, false);
        }
        // Awake, the thread takes its event and may then make no call for a while (or spin on
        // memory only the progress thread can fill): the socket goes back to the progress
        // thread now, unless another thread still sleeps on it. A poll that finds its CQ empty
        // takes it again, as always.
        set_handoff(sh, &st, false);
        drop(st);
        Some(r.map(|_| ()))
    }

    /// `ibv_poll_cq` on a [`Progress::Application`] device: up to `max` completions of
    /// `owner`'s CQ `cq`, straight from the engine's CQ (no ring between: the provider and the
    /// engine share the process). None when `cq` is not such a CQ of `owner`'s. Data that the
    /// packets behind them wrote is in place first (the pump flushes it too, before it looks at
    /// CQs). With them, whether another of `owner`'s CQs holds completions now (its next poll
    /// is then most likely near: see [`Hca::end_handoff_after_poll`]; only asked of owners with
    /// a few CQs).
    ///
    /// With `drive`, a poll that finds the CQ empty drives the device ([`Hca::drive`] with
    /// receive) and looks again, all under one taking of the state's lock.
    pub fn poll_cq(
        &self,
        owner: u32,
        cq: CqId,
        max: usize,
        drive: bool,
    ) -> Option<(Vec<softrdma_engine::wr::WorkCompletion>, bool)> {
        let mut st = self.shared.lock();
        st.app_calls += 1;
        if !st.clients.get(&owner).is_some_and(|c| c.direct_cqs.contains_key(&cq))
            || st.dev.memory_ref().has_helper(owner)
        {
            return None;
        }
        st.dev.memory().flush();
        let mut out = st.dev.poll_cq(cq, max);
        if out.is_empty() && drive {
            // A poll of an armed CQ is the one that closes the race between arming and sleeping
            // (ibv_req_notify_cq(3): arm, poll again, then wait for the event): its thread is
            // about to sleep on the channel, not to keep polling. It reads the socket but does not
            // take it: taken, the socket stayed with the sleeper until the progress thread's next
            // look (up to HANDOFF_LOOK_MAX), and an event-driven program's next packet waited
            // that long (lnet_bulk's slow runs: BENCHMARKS.md, "Progress threads that keep
            // looking while the application sleeps").
            let armed = st.cqs.get(&cq).is_some_and(|w| w.armed);
            self.drive_locked(&mut st, true, !armed, !armed);
            st.dev.memory().flush();
            out = st.dev.poll_cq(cq, max);
        }
        let mut more = false;
        if !out.is_empty() {
            if let Some(c) = st.clients.get(&owner).filter(|c| c.direct_cqs.len() <= 8) {
                more = c.direct_cqs.keys().any(|&other| st.dev.cq_counts(other).is_some_and(|n| n.held > 0));
            }
        }
        Some((out, more))
    }

    /// An application thread stops polling for now (its poll returned completions, or it arms a
    /// CQ for a channel and will sleep): the socket goes back to the device thread (see
    /// [`HANDOFF_IDLE`]). Cheap when nothing is handed off.
    pub fn end_handoff(&self) {
        let sh = &self.shared;
        if sh.handed_off.load(Ordering::Relaxed) {
            set_handoff(sh, &sh.lock(), false);
        }
    }

    /// An application thread's poll returned completions. With `answer_likely` (it got a
    /// message, or more completions wait in its other CQs, or the poll held answers back for
    /// its next post) and a send posted since its last
    /// completions or a deferral pending (a ping-pong: it answers what it gets), the handoff
    /// ends after that thread's next send has left (`Hca::drive_post`, `Hca::post_send`), so
    /// that the `epoll_ctl` giving the socket back to the progress thread is not between the
    /// message and its answer (0.5-0.7 us of a provider one-way: BENCHMARKS.md, "Where a
    /// provider one-way goes"). A thread that polls again first keeps the socket (no system
    /// call at all); one that does neither has the progress thread back on the socket after
    /// [`END_AFTER_POST_WAIT`] at its next look (within [`HANDOFF_LOOK_MAX`]). A poll that
    /// `received` a message as part of a stream (no send posted since, and the poll before also
    /// returned one: see `Hca::streams_in`) keeps the socket. Otherwise as [`Hca::end_handoff`].
    pub fn end_handoff_after_poll(&self, answer_likely: bool, received: bool) {
        let sh = &self.shared;
        // A deferral pending from the poll before (the send's completion, then the message, on
        // two CQs) stays.
        let posted = sh.posted_since_poll.swap(false, Ordering::Relaxed) || sh.end_after_post.load(Ordering::Relaxed);
        // Answers this poll held back for the thread's next post (`Hca::drive`: the run that
        // completed its work also brought a request of the peer, which only needs an ACK): an
        // answer is likely too. ib_write_lat's poll returns only its send's completion, while
        // the run also held the peer's RDMA WRITE, already in the memory the program then finds
        // changed before it posts again; ending the handoff at once put an `epoll_ctl` (~0.45
        // us) between that WRITE and the answer (BENCHMARKS.md, "The handoff's end in
        // ib_write_lat").
        let answer_likely = answer_likely || sh.tx_owed.load(Ordering::Relaxed);
        if answer_likely && posted && tuning().end_after_post && sh.handed_off.load(Ordering::Relaxed) {
            sh.end_after_post.store(true, Ordering::Relaxed);
        } else if received && !posted && self.streams_in(sh) {
            // A stream's receiver: it polls again for the next message (and reads the socket
            // itself when its CQ is empty), so the socket stays with it.
        } else {
            self.end_handoff();
        }
    }

    /// Whether a poll that returned a message, with no send posted since the poll before, is
    /// part of a stream: the poll before it that returned a message was at most `handoff_idle`
    /// ago, with no send between. Such a receiver polls again for the next message and keeps the
    /// socket; the progress thread takes it back once its reads stop (`handoff_idle`, at its
    /// next look). Without this, each such poll ended the handoff (an `epoll_ctl`) and the
    /// next datagrams woke the progress thread, which took the state's lock from under the
    /// receiver's calls: ib_send_bw's 64 B rate was ~25% lower (BENCHMARKS.md, "A stream's
    /// receiver keeps the socket"). The first message after a pause ends the handoff as
    /// before: a program that waited for one message may now spin on memory that only the
    /// progress thread can fill.
    fn streams_in(&self, sh: &Shared) -> bool {
        let now = sh.epoch.elapsed().as_nanos() as u64;
        let before = sh.last_message_ns.swap(now, Ordering::Relaxed);
        tuning().recv_keep && before <= now && now - before <= sh.handoff_idle.as_nanos() as u64
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
    /// batch instead of one per post. Such a post also takes the socket for the application's
    /// threads, as a poll that finds its CQ empty does: the stream's answers wait for the
    /// thread's next poll rather than wake the progress thread. A post after a poll (a
    /// ping-pong, a latency test) or to an idle QP leaves at once.
    pub fn drive_post(&self, qpn: Qpn, stream: bool) {
        let mut st = self.shared.lock();
        let (now, held) = st.hold_clock();
        self.posted(&mut st, now, qpn, stream);
        st.release_clock(held);
    }

    /// A provider's `ibv_post_send` of checked requests (each with the payload gathered at post
    /// time, if any) straight into the engine, without the rings a daemon's clients write: then
    /// as [`Hca::drive_post`]. On a request the engine refuses (ENOMEM: its send queue is full;
    /// EINVAL) the ones before it stay posted; returns that error and the request's index.
    pub fn post_send(
        &self,
        qpn: Qpn,
        wrs: Vec<(softrdma_engine::wr::SendWr, Option<Vec<u8>>)>,
        stream: bool,
    ) -> Result<(), (VerbsError, usize)> {
        let mut st = self.shared.lock();
        let (now, held) = st.hold_clock();
        // New requests come after completions their owner saw: it may have refilled buffers.
        st.dev.memory().forget_read_ahead();
        let mut r = Ok(());
        for (index, (wr, data)) in wrs.into_iter().enumerate() {
            if let Err(e) = st.dev.post_send_inline(qpn, wr, data) {
                r = Err((e, index));
                break;
            }
            st.io.ring_wqes += 1;
        }
        self.posted(&mut st, now, qpn, stream);
        st.release_clock(held);
        r
    }

    /// A provider's `ibv_post_recv` for QP `qpn` of client `owner` straight into the engine
    /// (the receives' checks and staging requests made): no ring, nothing sent (as with
    /// [`Hca::drive_post`]'s receives, the next pump answers what they let in). On a request the
    /// engine refuses the ones before it stay posted; returns that error and its index.
    pub fn post_recv(&self, owner: u32, qpn: Qpn, entries: Vec<RecvEntry>) -> Result<(), (VerbsError, usize)> {
        let mut st = self.shared.lock();
        st.app_calls += 1;
        st.post_recv_direct(owner, qpn, entries)
    }

    /// After a post to QP `qpn`'s send queue: sends now, or leaves the new work for the next
    /// pump when the post is part of a `stream` and the QP waits for an answer (see
    /// [`Hca::drive_post`]).
    fn posted(&self, st: &mut State, now: softrdma_engine::time::Instant, qpn: Qpn, stream: bool) {
        st.posted_send = true;
        st.app_calls += 1;
        self.shared.posted_since_poll.store(true, Ordering::Relaxed);
        self.shared.last_message_ns.store(u64::MAX, Ordering::Relaxed);
        st.last_post = Some(now);
        if stream && st.dev.awaiting_response(qpn) {
            let moved = st.service_rings();
            st.io.ring_wqes += moved as u64;
            // A stream: this thread polls for the completions of what it keeps posting, and
            // its polls that find the CQ empty read the socket. It takes the socket now (as a
            // poll does), so that the answers meanwhile (the ACKs of the stream) wait in the
            // socket for that poll instead of waking the progress thread, which then took the
            // state's lock from under the posts and sent their packets itself: 5-6 thousand
            // wake-ups a second, each a context switch on a core the posting thread needs
            // (BENCHMARKS.md, "A stream's poster keeps the socket"). A thread that stops
            // calling has the progress thread back on the socket as after its polls (within
            // HANDOFF_IDLE, at most HANDOFF_LOOK_MAX); one that arms a CQ, at once.
            let sh = &self.shared;
            if tuning().stream_take && sh.progress == Progress::Application && !sh.handoff_idle.is_zero() {
                sh.last_drive_ns.store(now.as_nanos(), Ordering::Relaxed);
                set_handoff(sh, st, true);
            }
        } else {
            st.pump();
        }
        self.shared.tx_owed.store(st.tx_owed, Ordering::Relaxed);
        if self.shared.end_after_post.load(Ordering::Relaxed) {
            // The answer to what the last poll returned has left (or waits in the stream for
            // the next pump): the socket goes back to the progress thread now. What came
            // meanwhile is taken first (the rest of a run the poll read in part: the peer's
            // GSO send arrives segment by segment), so that the socket's return does not wake
            // the progress thread at once to race this thread for it.
            if st.receive() > 0 {
                st.pump();
            }
            set_handoff(&self.shared, st, false);
        }
        Hca::wake_for_timers(&self.shared, st);
    }
}

/// How long answers that an application's poll held back ([`Hca::drive`]) wait for that
/// application's next call before the progress thread sends them, once the progress thread has
/// seen them owed. A NIC acknowledges at once; an application that calls again (a ping-pong's
/// post, the next poll of a stream) sends them itself within microseconds. (A one-shot timer
/// armed per held-back answer bounded it at 20 us, but arming and disarming it cost more than
/// the held-back `sendto` saved: BENCHMARKS.md.)
pub const HELD_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_micros(200);

/// How long after its last read of the socket a thread whose poll deferred the handoff's end
/// ([`Hca::end_handoff_after_poll`]) may go without a post before the progress thread takes the
/// socket back at its next look.
pub const END_AFTER_POST_WAIT: std::time::Duration = std::time::Duration::from_micros(20);

/// How recently an application thread must have posted a send for the progress thread to hold
/// back the acknowledgements it receives for that thread's next post (`State::hold_for_post`):
/// longer than a round trip whose far end needed its progress thread woken (tens of
/// microseconds here).
pub(crate) const HOLD_AFTER_POST: std::time::Duration = std::time::Duration::from_millis(1);

/// The longest a [`Progress::Application`] device's progress thread sleeps while an
/// application thread drives the device (it did within [`ACTIVE_WINDOW`]): the bound on held-back
/// answers when the progress thread went to sleep before they were held back. (200 us here
/// cost a fifth of the 64-byte message rate and doubled the latency tests' p99: BENCHMARKS.md.)
pub(crate) const DRIVEN_SLEEP_MAX: std::time::Duration = std::time::Duration::from_millis(1);

/// How recently an application thread must have driven the device for the progress thread to
/// keep its sleeps within [`DRIVEN_SLEEP_MAX`].
pub(crate) const ACTIVE_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

/// The application-driven devices of this process, whose held-back answers
/// ([`Hca::drive`]) an exiting process sends (and, a provider, its last report to its daemon):
/// a program that exits right after its last poll
/// (ibv_rc_pingpong's server does, without destroying its QP first when it fails) would
/// otherwise leave its peer retrying, where a NIC had answered at once.
static EXIT_FLUSH: Mutex<Vec<(u32, std::sync::Weak<Shared>)>> = Mutex::new(Vec::new());

pub(super) fn send_owed_at_exit(sh: &Arc<Shared>) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    let mut list = EXIT_FLUSH.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|(_, w)| w.strong_count() > 0);
    list.push((std::process::id(), Arc::downgrade(sh)));
    drop(list);
    REGISTERED.call_once(|| {
        // SAFETY: atexit(3) with a function that lives as long as the program.
        unsafe { libc::atexit(at_exit) };
    });
}

/// How long an exiting process waits for a device's state lock to send what it holds back.
const EXIT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

fn lock_for_exit(sh: &Shared) -> Option<std::sync::MutexGuard<'_, State>> {
    let t0 = std::time::Instant::now();
    loop {
        match sh.state.try_lock() {
            Ok(st) => return Some(st),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if t0.elapsed() < EXIT_LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_micros(50))
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

extern "C" fn at_exit() {
    let Ok(list) = EXIT_FLUSH.try_lock() else { return };
    let me = std::process::id();
    for (pid, w) in list.iter() {
        // A forked child's copies are its parent's devices: not its to answer for.
        let Some(sh) = w.upgrade().filter(|_| *pid == me) else { continue };
        // The progress thread may hold the lock at this moment (it woke for a datagram or its
        // tick) without sending what is held back for a post: it dies with the process, so
        // wait for the lock, but boundedly (`EXIT_LOCK_WAIT`): the exiting thread itself may
        // hold it (exit(3) called from a callback), and exit never hangs.
        if let Some(mut st) = lock_for_exit(&sh) {
            st.send_owed();
            st.send_delayed_now();
            // A provider's last report, as when it closes: what its QPs did in their last
            // moments (a retry exhausted just before the program gave up) counts in the device's
            // counters too (`softrdma stat`).
            st.publish(true);
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers a poll held back leave within HELD_ANSWER_WAIT when no call of the application's
    /// sends them, however long ago it last called; a driven device's thread looks every
    /// millisecond; an idle one's at the 50 ms tick.
    #[test]
    fn the_progress_thread_sleeps_briefly_while_answers_are_owed() {
        for since in [0, 5_000_000, 60_000_000, u64::MAX] {
            assert_eq!(application_sleep_ns(true, since), HELD_ANSWER_WAIT.as_nanos() as u64);
        }
        assert_eq!(application_sleep_ns(false, 0), DRIVEN_SLEEP_MAX.as_nanos() as u64);
        assert_eq!(application_sleep_ns(false, ACTIVE_WINDOW.as_nanos() as u64 - 1), 1_000_000);
        assert_eq!(application_sleep_ns(false, ACTIVE_WINDOW.as_nanos() as u64), APPLICATION_TICK_NS);
        assert!(HELD_ANSWER_WAIT < DRIVEN_SLEEP_MAX);
    }
}
