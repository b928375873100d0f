//! Waiting on a context's event fds (completion channels, async events) the way the kernel's
//! are used: readable exactly while events may wait, and woken when the device goes away.

use super::*;

/// Waits until `fd` is readable, or the device connection (`hangup`) closes, or `timeout`.
pub(super) fn wait_readable(fd: BorrowedFd<'_>, hangup: Option<BorrowedFd<'_>>, timeout: Option<Duration>) -> bool {
    let mut fds = vec![PollFd::new(fd, PollFlags::POLLIN)];
    if let Some(h) = hangup {
        fds.push(PollFd::new(h, PollFlags::empty())); // POLLHUP is always reported
    }
    let t = match timeout {
        None => PollTimeout::NONE,
        Some(d) => PollTimeout::try_from(d.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX),
    };
    matches!(nix::poll::poll(&mut fds, t), Ok(n) if n > 0)
}

/// Whether the device connection `fd` has hung up (the daemon is gone). Only the hang-up counts:
/// the socket is readable whenever another thread's call has its answer waiting.
pub(super) fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut p = [PollFd::new(fd, PollFlags::empty())];
    let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    matches!(nix::poll::poll(&mut p, PollTimeout::ZERO), Ok(n) if n > 0)
        && p[0].revents().is_some_and(|r| r.intersects(gone))
}

/// Whether `fd` is readable right now (an eventfd drained only then never blocks).
pub(super) fn readable_now(fd: BorrowedFd<'_>) -> bool {
    wait_readable(fd, None, Some(Duration::ZERO))
}

pub(super) fn drain_eventfd(fd: BorrowedFd<'_>) {
    let mut b = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut b);
}

/// The next event of a queue the device keeps (`next` asks for it), waiting up to `timeout`
/// (`None`: forever) on the queue's eventfd. The fd is kept readable exactly while events may
/// wait, as the kernel's completion channel and async event fds are: programs put it in epoll
/// (UCX's async thread does) and call the verbs only when it is readable, so an fd left readable
/// with an empty queue would make them spin, and one drained with events left would make them
/// sleep through those.
///
/// `sleep(fd, wait)` is the wait of a device the application's threads drive
/// (`Hca::sleep_on_channel`: the calling thread sleeps on the socket too and receives itself);
/// where it returns None the wait is on `fd` alone.
pub(super) fn next_event<T>(
    fd: BorrowedFd<'_>,
    hangup: Option<BorrowedFd<'_>>,
    timeout: Option<Duration>,
    mut next: impl FnMut() -> Result<Option<T>>,
    mut sleep: impl FnMut(BorrowedFd<'_>, Option<Duration>) -> Option<nix::Result<()>>,
) -> Result<Option<T>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    // The device went away (its daemon's connection hung up): the event to report is that one
    // (IBV_EVENT_DEVICE_FATAL), even where the queue runs in this process (a provider).
    let gone = || hangup.is_some_and(hung_up);
    let lost = || Err(Error::Device(ClientError::Lost(crate::proto::ProtoError::Closed)));
    loop {
        if gone() {
            return lost();
        }
        if let Some(e) = next()? {
            return Ok(Some(e));
        }
        // A non-blocking call (the fd is in the program's epoll set) that finds the queue empty:
        // the fd must not stay readable. An event queued between the question and the drain
        // lost its wake-up, so ask once more; if there was one, others may follow it, so the fd
        // is made readable again (at worst one spurious wake-up). Blocking calls drain below,
        // after their wait, as they always did (draining them here too made lnet_bulk's
        // event threads stall the rxe interop run).
        if timeout == Some(Duration::ZERO) && readable_now(fd) {
            drain_eventfd(fd);
            if let Some(e) = next()? {
                let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
                return Ok(Some(e));
            }
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return Ok(None);
        }
        if let Some(r) = sleep(fd, left) {
            // The device's socket woke this thread (it did the device's work), or the channel,
            // or a timer. A signal handler that ran ends a blocking wait as it ends the read(2)
            // below unless every handler the program installed restarts (SA_RESTART): poll(2)
            // is never restarted, and which signal came is not known here. (A program with
            // both kinds of handler sees EINTR for a restarting one too; the kernel's read
            // would have restarted.)
            if r == Err(nix::errno::Errno::EINTR) && left.is_none() && !every_handler_restarts() {
                return Err(Error::Verbs(VerbsError::Intr));
            }
            if readable_now(fd) {
                drain_eventfd(fd);
            }
            continue;
        }
        if left.is_none() {
            // A blocking wait is a read(2) of the channel's eventfd, as libibverbs' is of the
            // kernel's channel fd: a signal whose handler was installed with SA_RESTART restarts
            // it, any other ends it with EINTR, which the program sees (qperf ends a test from
            // its SIGALRM handler and expects ibv_get_cq_event to return). A device that goes
            // away wakes it (the hang-up watch writes every channel's fd).
            let mut b = [0u8; 8];
            match nix::unistd::read(fd, &mut b) {
                Err(nix::errno::Errno::EINTR) => return Err(Error::Verbs(VerbsError::Intr)),
                // An fd that does not block (an async event fd): wait in poll instead.
                Err(nix::errno::Errno::EAGAIN) if wait_readable(fd, hangup, None) && readable_now(fd) => {
                    drain_eventfd(fd);
                }
                _ => {}
            }
            continue;
        }
        if wait_readable(fd, hangup, left) && readable_now(fd) {
            drain_eventfd(fd);
        }
    }
}

/// Whether every signal handler the process has installed restarts the system calls it
/// interrupts (`SA_RESTART`), as `read(2)` on the kernel's channel fd would then be.
fn every_handler_restarts() -> bool {
    // Signals a fault raises in the faulting thread (Rust's runtime and the guarded copy handle
    // SIGSEGV and SIGBUS) do not come while a thread sleeps in poll(2).
    let synchronous = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP];
    (1..=libc::SIGRTMAX()).filter(|s| !synchronous.contains(s)).all(|sig| {
        // SAFETY: sigaction(2) with a null new action only reads the current one into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        r != 0
            || old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}
