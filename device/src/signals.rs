//! Signals and this library's threads: a program's signal handlers run on the program's
//! threads, never on the library's own.
//!
//! Programs install handlers that are not async-signal-safe (perftest's duration mode ends its
//! run from a SIGALRM handler that calls stdio, which allocates). A NIC's provider runs no
//! threads of its own; this library has some (progress, hang-up watch, memory helper, rdma_cm
//! watch), and a process-directed signal may be delivered to any thread that does not block
//! it. So each of them blocks the asynchronous signals for good ([`keep_off_this_thread`]): the
//! kernel hands such a signal to one of the program's threads. (That a handler which allocates
//! never waits on an allocator lock held by the call it interrupted is the shim's business: it
//! allocates from an allocator of its own, not from the C library's malloc.)

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

/// Blocks the asynchronous signals in the calling thread for good: the first call of each of
/// the library's threads.
pub fn keep_off_this_thread() {
    let set = asynchronous();
    // SAFETY: pthread_sigmask(3) on this thread with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
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
    fn a_library_thread_blocks_asynchronous_signals_and_leaves_faults_deliverable() {
        std::thread::spawn(|| {
            assert!(!blocked(libc::SIGALRM) && !blocked(libc::SIGINT));
            keep_off_this_thread();
            assert!(blocked(libc::SIGALRM) && blocked(libc::SIGINT) && blocked(libc::SIGUSR1));
            assert!(!blocked(libc::SIGSEGV) && !blocked(libc::SIGBUS));
        })
        .join()
        .unwrap();
    }
}
