//! The watch on a device's connection: when it hangs up, the device is gone for the program.

use super::*;

/// When the device's connection hangs up (the daemon died or was stopped), makes the async event
/// fd and every completion channel's fd readable, as the kernel's uverbs does when a device is
/// removed or fails (IBV_EVENT_DEVICE_FATAL is queued, waiters wake): a program that sleeps in
/// epoll on those fds (UCX's async thread, an MPI rank) then learns of it from the next verbs
/// call instead of waiting forever. A thread of its own, blocked in poll; it ends with the
/// context.
pub(super) struct HangupWatch {
    stop: nix::sys::eventfd::EventFd,
    fds: Arc<std::sync::Mutex<Vec<OwnedFd>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The process that started the thread: a child forked since has no such thread to join.
    pid: u32,
    /// Set when the connection hung up (before the fds are woken).
    pub(super) gone: Arc<std::sync::atomic::AtomicBool>,
}

impl HangupWatch {
    pub(super) fn start(watch: BorrowedFd<'_>, event: BorrowedFd<'_>) -> std::io::Result<HangupWatch> {
        let watch = watch.try_clone_to_owned()?;
        let fds = Arc::new(std::sync::Mutex::new(vec![event.try_clone_to_owned()?]));
        let stop = nix::sys::eventfd::EventFd::from_value_and_flags(0, nix::sys::eventfd::EfdFlags::EFD_CLOEXEC)?;
        let stop_fd = stop.as_fd().try_clone_to_owned()?;
        let wake = fds.clone();
        let gone_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = gone_flag.clone();
        let thread = std::thread::Builder::new().name("softrdma-hup".into()).spawn(move || {
            // The program's signals go to the program's threads (crate::signals).
            crate::signals::keep_off_this_thread();
            loop {
                let mut p = [
                    PollFd::new(watch.as_fd(), PollFlags::empty()), // POLLHUP is always reported
                    PollFd::new(stop_fd.as_fd(), PollFlags::POLLIN),
                ];
                match nix::poll::poll(&mut p, PollTimeout::NONE) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => return,
                    Ok(_) => {}
                }
                if p[1].revents().is_some_and(|r| !r.is_empty()) {
                    return;
                }
                let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
                if p[0].revents().is_some_and(|r| r.intersects(gone)) {
                    flag.store(true, Ordering::SeqCst);
                    for fd in wake.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                        let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
                    }
                    return;
                }
            }
        })?;
        Ok(HangupWatch { stop, fds, thread: Some(thread), pid: std::process::id(), gone: gone_flag })
    }

    /// Also wakes `fd` (a completion channel's) when the device goes away.
    pub(super) fn add(&self, fd: BorrowedFd<'_>) {
        if let Ok(fd) = fd.try_clone_to_owned() {
            self.fds.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
        }
    }
}

impl Drop for HangupWatch {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child: the thread is the parent's (joining it would wait forever), and the
            // stop eventfd is shared with the parent, whose watcher must go on.
            if let Some(t) = self.thread.take() {
                std::mem::forget(t);
            }
            return;
        }
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
