//! Signals and this library's code: which signals a program's handlers may take while the
//! library runs, on the program's threads and on the library's own.
//!
//! Programs install handlers that are not async-signal-safe (perftest's duration mode ends its
//! run from a SIGALRM handler that calls stdio, which allocates). A handler that lands while the
//! interrupted thread is inside malloc or free waits forever on the allocator's lock. A NIC's
//! provider posts and polls without allocating and runs no threads of its own, so such programs
//! work there; here posting and polling allocate, and the library has threads (progress,
//! hang-up watch, memory helper, rdma_cm watch). So the data-path calls run with the caller's
//! asynchronous signals held ([`hold`]; a signal that arrives meanwhile is delivered when the
//! call returns, microseconds later), and the library's threads never take them
//! ([`keep_off_this_thread`]): the kernel hands a process-directed signal to a thread that does
//! not block it, one of the program's.

/// The asynchronous signals: every signal but the ones a fault raises synchronously in the
/// faulting thread (which must stay deliverable: blocking them turns a fault into a kill).
fn asynchronous() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset(3) initialises it before sigdelset(3) edits it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS, libc::SIGABRT] {
            libc::sigdelset(&mut set, s);
        }
        set
    }
}

/// The calling thread's signal mask from before [`hold`]; put back when dropped (also when the
/// call unwinds).
pub struct Held(libc::sigset_t);

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: pthread_sigmask(3) on this thread, restoring the mask `hold` saved.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Holds the calling thread's asynchronous signals until the returned guard drops. For calls
/// that never block (a signal that should interrupt a wait must not be held).
pub fn hold() -> Held {
    let set = asynchronous();
    // SAFETY: sigset_t is plain data, written by pthread_sigmask(3) below.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: pthread_sigmask(3) on this thread with valid pointers.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
    Held(old)
}

/// Blocks the asynchronous signals in the calling thread for good: the first call of each of
/// the library's threads.
pub fn keep_off_this_thread() {
    std::mem::forget(hold());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(sig: libc::c_int) -> bool {
        // SAFETY: reading this thread's mask into a local set.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, sig) == 1
        }
    }

    #[test]
    fn hold_blocks_asynchronous_signals_until_dropped_and_leaves_faults_deliverable() {
        std::thread::spawn(|| {
            assert!(!blocked(libc::SIGALRM));
            {
                let _h = hold();
                assert!(blocked(libc::SIGALRM) && blocked(libc::SIGINT) && blocked(libc::SIGUSR1));
                assert!(!blocked(libc::SIGSEGV) && !blocked(libc::SIGBUS));
            }
            assert!(!blocked(libc::SIGALRM) && !blocked(libc::SIGINT));
            keep_off_this_thread();
            assert!(blocked(libc::SIGALRM));
        })
        .join()
        .unwrap();
    }
}
