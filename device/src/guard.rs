//! Copies to and from this process's own memory that fail instead of crashing it.
//!
//! A provider runs the transport in the program's process (docs/architecture.md D2), so the memory
//! a peer's RDMA WRITE lands in, a READ is served from and a send gathers from is the program's
//! own. The program may unmap a registered buffer (its mistake), and the copy must then fail, never
//! take the process down. What the device then does is `crate::memory`'s: a peer's WRITE is lost
//! and counted (as a NIC's DMA into pinned pages their owner gave up), a READ ends in a remote
//! access error NAK (IBTA 9.7.5.2.8), a receive in a local protection error completion. A NIC pins
//! registered pages and so never meets an unmapped one; a user-space device does.
//!
//! `process_vm_readv`/`process_vm_writev` on the own pid fail cleanly but cost a system call and
//! a page pin per call (ib_write_lat 2 B: ~0.6 us of a ~4.2 us one-way, BENCHMARKS.md). This
//! module copies with an ordinary load/store loop instead, whose every instruction lies between
//! two known addresses. The process's SIGSEGV and SIGBUS handler (installed once, chaining to the
//! handler it replaced) looks at the faulting instruction: inside the loop, it moves the thread
//! on to the loop's failure exit, and the copy returns `false`; anywhere else, the fault goes to
//! the handler that was there before, or, if there was none, kills the process as it would have
//! without this module. The kernel's own `copy_from_user` works the same way (its exception
//! table).
//!
//! Limits: x86-64 Linux only (elsewhere [`available`] is false and the callers keep to the
//! system calls); a program that later installs a SIGSEGV handler of its own without chaining
//! to ours takes the guard away (a fault in a copy then reaches the program's handler, as any
//! fault of its own would).

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::OnceLock;

    // softrdma_guarded_copy(dst: rdi, src: rsi, len: rdx) -> eax: 0 copied, 1 faulted.
    // A long copy (512 bytes and more) goes by `rep movsb` but for its last 64 bytes: on CPUs
    // with fast strings it writes whole lines without reading them first (cold destination:
    // 8.5 GB/s against 7.1 for the loop here), unless the destination lies 1-63 bytes above the
    // source modulo 4 KiB, where it runs at a twentieth of its speed on AMD Zen
    // (`softrdma_engine::copy`). The rest, and a copy at those distances, goes 64 bytes a round
    // through four SSE2 registers, then 8 bytes, then 1 at a time. Plain stores after the string
    // (front to back: x86 makes them visible in program order, and after the string's, which
    // may be reordered among themselves) put the last byte of a WRITE, which programs poll,
    // last. Every instruction
    // that touches memory lies in [_start, _end); the signal handler sends a fault there to
    // _fixup. The symbols are hidden: each shared object that links this crate has its own.
    std::arch::global_asm!(
        ".pushsection .text.softrdma_guarded_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl softrdma_guarded_copy",
        ".hidden softrdma_guarded_copy",
        ".type softrdma_guarded_copy,@function",
        "softrdma_guarded_copy:",
        ".globl softrdma_guarded_copy_start",
        ".hidden softrdma_guarded_copy_start",
        "softrdma_guarded_copy_start:",
        "cmp rdx, 512",
        "jb .Lsoftrdma_guarded_copy_vector",
        "mov rax, rdi",
        "sub rax, rsi",
        "and eax, 4095",
        "dec eax",
        "cmp eax, 63",
        "jb .Lsoftrdma_guarded_copy_vector",
        "mov rcx, rdx",
        "sub rcx, 64",
        "mov rdx, 64",
        "rep movsb",
        ".Lsoftrdma_guarded_copy_vector:",
        "cmp rdx, 64",
        "jb .Lsoftrdma_guarded_copy_tail",
        ".Lsoftrdma_guarded_copy_loop:",
        "movdqu xmm0, [rsi]",
        "movdqu xmm1, [rsi + 16]",
        "movdqu xmm2, [rsi + 32]",
        "movdqu xmm3, [rsi + 48]",
        "movdqu [rdi], xmm0",
        "movdqu [rdi + 16], xmm1",
        "movdqu [rdi + 32], xmm2",
        "movdqu [rdi + 48], xmm3",
        "add rsi, 64",
        "add rdi, 64",
        "sub rdx, 64",
        "cmp rdx, 64",
        "jae .Lsoftrdma_guarded_copy_loop",
        ".Lsoftrdma_guarded_copy_tail:",
        "cmp rdx, 8",
        "jb .Lsoftrdma_guarded_copy_bytes",
        ".Lsoftrdma_guarded_copy_quads:",
        "mov rax, [rsi]",
        "mov [rdi], rax",
        "add rsi, 8",
        "add rdi, 8",
        "sub rdx, 8",
        "cmp rdx, 8",
        "jae .Lsoftrdma_guarded_copy_quads",
        ".Lsoftrdma_guarded_copy_bytes:",
        "test rdx, rdx",
        "jz softrdma_guarded_copy_end",
        "mov al, [rsi]",
        "mov [rdi], al",
        "inc rsi",
        "inc rdi",
        "dec rdx",
        "jmp .Lsoftrdma_guarded_copy_bytes",
        ".globl softrdma_guarded_copy_end",
        ".hidden softrdma_guarded_copy_end",
        "softrdma_guarded_copy_end:",
        "xor eax, eax",
        "ret",
        ".globl softrdma_guarded_copy_fixup",
        ".hidden softrdma_guarded_copy_fixup",
        "softrdma_guarded_copy_fixup:",
        "mov eax, 1",
        "ret",
        ".size softrdma_guarded_copy, . - softrdma_guarded_copy",
        ".popsection",
    );

    extern "C" {
        fn softrdma_guarded_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        static softrdma_guarded_copy_start: u8;
        static softrdma_guarded_copy_end: u8;
        static softrdma_guarded_copy_fixup: u8;
    }

    fn addresses() -> (usize, usize, usize) {
        // The addresses of the labels above; nothing reads through them.
        (
            std::ptr::addr_of!(softrdma_guarded_copy_start) as usize,
            std::ptr::addr_of!(softrdma_guarded_copy_end) as usize,
            std::ptr::addr_of!(softrdma_guarded_copy_fixup) as usize,
        )
    }

    /// The handlers ours replaced, for SIGSEGV and SIGBUS (set before ours is installed).
    static PREVIOUS: [AtomicPtr<libc::sigaction>; 2] =
        [AtomicPtr::new(std::ptr::null_mut()), AtomicPtr::new(std::ptr::null_mut())];

    const SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let (start, end, fixup) = addresses();
        // SAFETY: the kernel passes this handler (SA_SIGINFO) the interrupted thread's
        // ucontext_t, whose registers it restores when the handler returns.
        unsafe {
            let uc = ctx.cast::<libc::ucontext_t>();
            let rip = (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
            if (start..end).contains(&rip) {
                (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] = fixup as i64;
                return;
            }
        }
        // Not a guarded copy's: the handler that was there before.
        let i = usize::from(sig == libc::SIGBUS);
        let prev = PREVIOUS[i].load(Ordering::Acquire);
        // SAFETY: `prev` was leaked (never freed) before this handler was installed;
        // sigaction(2), raise(3) and the previous handler are what a signal handler may call.
        unsafe {
            let handler = if prev.is_null() { libc::SIG_DFL } else { (*prev).sa_sigaction };
            if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
                // Back to the default action. A fault re-executes the instruction and the
                // process dies of it, as it would have without us; a signal sent by kill(2)
                // is raised again.
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                if info.is_null() || (*info).si_code <= 0 {
                    libc::raise(sig);
                }
                return;
            }
            if (*prev).sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(handler);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                f(sig);
            }
        }
    }

    fn install() -> bool {
        for (i, &sig) in SIGNALS.iter().enumerate() {
            // SAFETY: sigaction(2) with valid, zero-initialised structures; the previous action
            // is kept (leaked) before ours replaces it, so the handler never sees it missing.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    return false;
                }
                PREVIOUS[i].store(Box::into_raw(Box::new(old)), Ordering::Release);
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_fault as *const () as usize;
                new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
                libc::sigemptyset(&mut new.sa_mask);
                if libc::sigaction(sig, &new, std::ptr::null_mut()) != 0 {
                    return false;
                }
            }
        }
        true
    }

    pub(super) fn available() -> bool {
        static INSTALLED: OnceLock<bool> = OnceLock::new();
        *INSTALLED.get_or_init(install)
    }

    /// # Safety
    /// `dst` and `src` must not overlap; the caller has called [`available`] and got `true`.
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
        softrdma_guarded_copy(dst, src, len) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    pub(super) fn available() -> bool {
        false
    }

    pub(super) unsafe fn copy(_dst: *mut u8, _src: *const u8, _len: usize) -> bool {
        false
    }
}

/// Whether guarded copies work here (x86-64 Linux): the first call installs the fault handler.
pub fn available() -> bool {
    imp::available()
}

/// Copies `src` into this process's memory at `addr`. `false` (and some bytes written, or none)
/// when part of the range is not mapped writable. Call only after [`available`] said `true`.
pub fn write(addr: u64, src: &[u8]) -> bool {
    if src.is_empty() {
        return true;
    }
    if addr == 0 || addr.checked_add(src.len() as u64).is_none_or(|e| e > isize::MAX as u64) {
        return false;
    }
    // SAFETY: the copy's faults are caught (`available`); `src` is a slice of ours, which a
    // range of the program's memory (its registered buffer, given us by a key) does not overlap.
    unsafe { imp::copy(addr as *mut u8, src.as_ptr(), src.len()) }
}

/// Copies this process's memory at `addr` into `dst`. `false` when part of the range is not
/// mapped readable (then `dst` holds some of the bytes, or none).
pub fn read(addr: u64, dst: &mut [u8]) -> bool {
    if dst.is_empty() {
        return true;
    }
    if addr == 0 || addr.checked_add(dst.len() as u64).is_none_or(|e| e > isize::MAX as u64) {
        return false;
    }
    // SAFETY: as in `write`.
    unsafe { imp::copy(dst.as_mut_ptr(), addr as *const u8, dst.len()) }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;

    /// A page that is mapped, and the address of one that is not (mapped, then unmapped).
    fn pages() -> (u64, u64) {
        // SAFETY: anonymous mappings of our own; the second is unmapped at once.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p.cast::<u8>().add(4096).cast(), 4096);
            (p as u64, p as u64 + 4096)
        }
    }

    #[test]
    fn copies_every_length_and_alignment_and_nothing_beyond() {
        assert!(available());
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in (0..300).chain([1023, 1024, 4096, 4097, 8191]) {
            for off in [0usize, 1, 12, 63] {
                let mut dst = vec![0xEEu8; len + 200];
                assert!(read(src[off..].as_ptr() as u64, &mut dst[5..5 + len]));
                assert_eq!(&dst[5..5 + len], &src[off..off + len], "len {len} off {off}");
                assert!(dst[..5].iter().chain(&dst[5 + len..]).all(|&b| b == 0xEE), "wrote outside");
                let mut back = vec![0u8; len + 64];
                assert!(write(back[off..].as_mut_ptr() as u64, &dst[5..5 + len]));
                assert_eq!(&back[off..off + len], &src[off..off + len]);
            }
        }
    }

    #[test]
    fn a_copy_into_or_out_of_unmapped_or_read_only_memory_fails_and_the_process_lives_on() {
        assert!(available());
        let (good, gone) = pages();
        let data = [7u8; 6000];
        assert!(!write(gone, &data[..10]), "a write into an unmapped page");
        assert!(!write(good + 100, &data), "a write that runs off the mapped page");
        // The bytes before the hole were written: a DMA that stops at a bad page.
        // SAFETY: `good` is our mapped page.
        assert_eq!(unsafe { *((good + 100) as *const u8) }, 7);
        let mut buf = [0u8; 5000];
        assert!(!read(gone + 8, &mut buf[..64]));
        assert!(!read(good + 4000, &mut buf), "a read that runs off the mapped page");
        assert!(read(good, &mut buf[..4096]));
        // SAFETY: making our page read-only.
        unsafe { libc::mprotect(good as *mut libc::c_void, 4096, libc::PROT_READ) };
        assert!(!write(good, &data[..1]), "a write into a read-only page");
        assert!(read(good, &mut buf[..8]));
        assert!(!write(0, &data[..1]) && !read(u64::MAX - 4, &mut buf[..8]));
        // Again, from another thread: the handler is the process's.
        assert!(std::thread::spawn(move || !write(gone, &[1u8; 100])).join().unwrap());
    }

    /// A fault outside a guarded copy still kills the process (run as a child of this test).
    #[test]
    fn a_fault_elsewhere_still_kills_the_process() {
        if std::env::var_os("SOFTRDMA_GUARD_CHILD").is_some() {
            assert!(available());
            let (_, gone) = pages();
            // SAFETY: deliberately not safe: the child is meant to die here.
            let v = unsafe { std::ptr::read_volatile(gone as *const u8) };
            println!("survived with {v}");
            std::process::exit(0);
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "guard::tests::a_fault_elsewhere_still_kills_the_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SOFTRDMA_GUARD_CHILD", "1")
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("survived"));
    }
}
