//! Tests of the device's access to its clients' memory.

use super::*;

#[test]
fn reads_and_writes_own_process() {
    let mut buf = vec![7u8; 64];
    let mut m = ProcessMemory::default();
    m.attach(1, std::process::id() as i32);
    let addr = buf.as_mut_ptr() as u64;
    m.write(1, addr + 8, &[1, 2, 3]).unwrap();
    let mut out = [0u8; 4];
    m.read(1, addr + 7, &mut out).unwrap();
    assert_eq!(out, [7, 1, 2, 3]);
    assert_eq!(m.fetch_add(1, addr + 16, 5).unwrap(), u64::from_ne_bytes([7; 8]));
    assert_eq!(m.compare_swap(1, addr + 16, 1, 9).unwrap(), u64::from_ne_bytes([7; 8]) + 5);
    assert!(m.read(2, addr, &mut out).is_err(), "unknown owner");
    assert!(m.read(1, 8, &mut out).is_err(), "unmapped address");
    assert_eq!(m.faults, 1);
    std::hint::black_box(&buf);
}

/// This process's own memory is reached by guarded copies: a peer's WRITE, a READ's or a
/// send's read and a posted buffer's write make no system call, and each of them fails on
/// memory the program unmapped (or made read-only) instead of crashing it (a peer's WRITE is
/// lost and counted).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn this_process_memory_is_reached_by_guarded_copies_that_fail_on_unmapped_pages() {
    // SAFETY: a fresh anonymous mapping of three pages, this test's; its last page is
    // unmapped at once and its middle one made read-only.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            3 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap(p.cast::<u8>().add(2 * 4096).cast(), 4096);
        p as u64
    };
    let mut m = ProcessMemory::default();
    m.attach(1, std::process::id() as i32);
    m.write(1, base + 100, &[5; 3000]).unwrap();
    assert!(m.pending.is_empty(), "written at once, not behind");
    let mut out = vec![0u8; 3002];
    m.read_ahead(1, base + 99, &mut out, 1 << 20).unwrap();
    assert!(out[0] == 0 && out[1..3001].iter().all(|&b| b == 5) && out[3001] == 0);
    m.write_local(1, base + 4000, &[6; 50]).unwrap();
    m.read(1, base + 4000, &mut out[..50]).unwrap();
    assert!(out[..50].iter().all(|&b| b == 6));
    assert_eq!((m.reads, m.writes, m.faults), (0, 0, 0), "no system call");
    // SAFETY: the middle page of this test's mapping becomes read-only.
    unsafe { libc::mprotect((base + 4096) as *mut libc::c_void, 4096, libc::PROT_READ) };
    let gone = base + 2 * 4096;
    // A peer's WRITE there is lost and counted, as one written behind that fails at its flush.
    m.write(1, gone + 8, &[1; 10]).unwrap();
    m.write(1, base + 4096, &[1; 10]).unwrap();
    assert_eq!(m.faults, 2, "a WRITE into an unmapped and into a read-only page");
    assert!(m.write_local(1, gone, &[1; 10]).is_err(), "a receive into an unmapped page");
    assert!(m.read(1, gone - 10, &mut out[..20]).is_err(), "a READ that runs off the mapping");
    assert!(m.read_ahead(1, gone, &mut out[..64], 4096).is_err(), "a send's read");
    assert_eq!(m.faults, 5);
    m.read(1, base + 4096, &mut out[..8]).unwrap();
    assert_eq!((m.reads, m.writes), (0, 0));
    // Another process's owner still goes by system call.
    m.attach(2, 1);
    m.write(2, base, &[1; 8]).unwrap();
    assert_eq!(m.pending.len(), 1, "written behind");
    m.pending.clear();
    m.pending_data.clear();
    // SAFETY: unmapping the rest of this test's mapping.
    unsafe { libc::munmap(base as *mut libc::c_void, 2 * 4096) };
}

/// A plain read is a fresh look and drops what was read ahead: the first packet of a READ
/// response reads afresh, so a READ after its owner changed the memory never gets the bytes a
/// READ before it left in the read-ahead buffer.
#[test]
fn a_read_drops_what_was_read_ahead() {
    let mut buf = vec![1u8; 16384];
    let addr = buf.as_ptr() as u64;
    let mut m = ProcessMemory::default();
    m.attach(1, std::process::id() as i32);
    let mut out = vec![0u8; 4096];
    m.read_ahead(1, addr, &mut out, 16384).unwrap();
    let reads = m.reads;
    m.read_ahead(1, addr + 4096, &mut out, 12288).unwrap();
    assert_eq!(m.reads, reads, "served from what was read ahead");
    // The owner changes its memory; the next READ starts with a plain read.
    buf.fill(2);
    std::hint::black_box(&mut buf);
    m.read(1, addr, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 2));
    m.read_ahead(1, addr + 4096, &mut out, 12288).unwrap();
    assert!(out.iter().all(|&b| b == 2), "stale bytes from before the read");
}

/// Writes into buffers an owner of this very process posted go straight to memory (no
/// system call), after the writes still waiting for a flush; another process's owner, a
/// staging address and an unknown owner go the usual way.
#[test]
fn local_writes_of_this_process_are_direct_and_keep_their_order() {
    let mut buf = vec![0u8; 8192];
    let addr = buf.as_mut_ptr() as u64;
    let mut m = ProcessMemory::default();
    m.set_guarded(false);
    m.attach(1, std::process::id() as i32);
    // A write behind (an RDMA WRITE), then a local write over part of it: the local one is
    // last, as it came.
    m.write(1, addr, &[1; 100]).unwrap();
    let writes = m.writes;
    m.write_local(1, addr + 50, &[2; 3000]).unwrap();
    assert_eq!(m.writes, writes + 1, "the pending write was flushed first (one call)");
    assert!(m.pending.is_empty());
    assert!(buf[..50].iter().all(|&b| b == 1) && buf[50..3050].iter().all(|&b| b == 2), "order");
    // No system call of its own.
    m.write_local(1, addr + 4000, &[3; 100]).unwrap();
    assert_eq!(m.writes, writes + 1);
    assert!(buf[4000..4100].iter().all(|&b| b == 3));
    // The same owner as another process's (a daemon's client): the usual way.
    m.attach(1, 1);
    m.write_local(1, addr, &[4; 8]).unwrap();
    assert_eq!(m.pending.len(), 1, "written behind, not directly");
    m.pending.clear();
    m.pending_data.clear();
    assert!(buf[..8].iter().all(|&b| b == 1), "not written directly");
    assert!(m.write_local(9, addr, &[5; 8]).is_err(), "unknown owner");
    std::hint::black_box(&mut buf);
}

/// Writes behind that continue one another (a message's packets) leave in one remote range
/// of one call; a page among them that the owner made inaccessible loses only the write on
/// it (each is retried alone), and writes that do not continue one another stay apart.
#[test]
fn continuing_writes_flush_as_one_range_and_fail_alone() {
    let page = 4096;
    // SAFETY: a fresh anonymous mapping of four pages, this test's until the munmap below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let addr = base as u64;
    let mut m = ProcessMemory::default();
    m.set_guarded(false);
    m.attach(1, std::process::id() as i32);
    // Three packets that continue one another, and one elsewhere: one call.
    for (k, v) in [(0u64, 1u8), (1, 2), (2, 3)] {
        m.write(1, addr + 100 + k * 1000, &[v; 1000]).unwrap();
    }
    m.write(1, addr + 3 * page as u64, &[4; 10]).unwrap();
    let ranges: Vec<(usize, usize)> = remote_ranges(&m.pending).iter().map(|r| (r.base, r.len)).collect();
    assert_eq!(ranges, [(addr as usize + 100, 3000), (addr as usize + 3 * page, 10)]);
    let writes = m.writes;
    m.flush();
    assert_eq!(m.writes, writes + 1, "one call for the run");
    // SAFETY: the mapping is readable and this test's.
    let mem = unsafe { std::slice::from_raw_parts(base as *const u8, 4 * page) };
    assert!(mem[..100].iter().all(|&b| b == 0));
    assert!(mem[100..1100].iter().all(|&b| b == 1) && mem[1100..2100].iter().all(|&b| b == 2));
    assert!(mem[2100..3100].iter().all(|&b| b == 3) && mem[3100..3200].iter().all(|&b| b == 0));
    assert!(mem[3 * page..3 * page + 10].iter().all(|&b| b == 4));
    // The second page made inaccessible: three writes that continue one another across it.
    // SAFETY: the second page of the mapping above.
    assert_eq!(unsafe { libc::mprotect(base.cast::<u8>().add(page).cast(), page, libc::PROT_NONE) }, 0);
    let faults = m.faults;
    m.write(1, addr + page as u64 - 100, &[5; 100]).unwrap();
    m.write(1, addr + page as u64, &[6; 4096]).unwrap();
    m.write(1, addr + 2 * page as u64, &[7; 100]).unwrap();
    m.flush();
    assert_eq!(m.faults, faults + 1, "only the write on the inaccessible page is lost");
    // SAFETY: the first and third pages stay readable.
    let mem = unsafe { std::slice::from_raw_parts(base as *const u8, page) };
    assert!(mem[page - 100..].iter().all(|&b| b == 5));
    // SAFETY: as above.
    let third = unsafe { std::slice::from_raw_parts(base.cast::<u8>().add(2 * page), page) };
    assert!(third[..100].iter().all(|&b| b == 7));
    // SAFETY: the mapping made above; nothing refers to it any more.
    unsafe { libc::munmap(base, 4 * page) };
}

/// Read-ahead and write-behind with their lead-ins (kept out of `rep movsb`'s slow
/// distances): every source alignment, packet after packet, gives the bytes of the buffer.
#[test]
fn reads_ahead_and_writes_behind_at_every_alignment() {
    let src: Vec<u8> = (0..40_000u32).map(|i| (i * 13 + i / 256) as u8).collect();
    let mut dst = vec![0u8; 40_000];
    let mut m = ProcessMemory::default();
    m.set_guarded(false);
    m.attach(1, std::process::id() as i32);
    let (mut leads_in, mut leads_out) = (0, 0);
    for shift in 0..4096 {
        m.forget_read_ahead();
        let (addr, len) = (src.as_ptr() as u64 + shift as u64, 2 * 4096 + 300);
        let mut got = Vec::new();
        let mut packet = vec![0u8; 4096];
        let mut at = 0;
        while at < len {
            let n = packet.len().min(len - at);
            m.read_ahead(1, addr + at as u64, &mut packet[..n], (len - at) as u64).unwrap();
            got.extend_from_slice(&packet[..n]);
            at += n;
        }
        assert_eq!(&got[..], &src[shift..shift + len], "read ahead, shift {shift}");
        leads_in += usize::from(m.ahead.is_some_and(|(_, _, lead)| lead > 0));
        dst.fill(0);
        let out = dst.as_mut_ptr() as u64 + shift as u64;
        for (k, chunk) in got.chunks(4096).enumerate() {
            m.write(1, out + (k * 4096) as u64, chunk).unwrap();
        }
        leads_out += usize::from(m.pending.first().is_some_and(|(_, _, r)| r.start > 0));
        m.flush();
        assert_eq!(&dst[shift..shift + len], &src[shift..shift + len], "write behind, shift {shift}");
        assert!(dst[..shift].iter().chain(&dst[shift + len..]).all(|b| *b == 0), "wrote outside, shift {shift}");
    }
    assert_eq!(m.faults, 0);
    // 63 of the 4,096 placements need a lead-in, each way.
    assert!(leads_in > 0 && leads_out > 0, "lead-ins {leads_in} out {leads_out}");
    std::hint::black_box(&mut dst);
}

#[test]
fn mapped_ranges() {
    let v = vec![0u8; 1 << 16];
    let pid = std::process::id() as i32;
    assert!(range_mapped(pid, v.as_ptr() as u64, v.len() as u64, true));
    assert!(!range_mapped(pid, 4096, 4096, false));
    assert!(!range_mapped(pid, u64::MAX - 1, 4, false));
    // Code is mapped but not writable.
    let f = mapped_ranges as fn() as usize as u64;
    assert!(range_mapped(pid, f, 16, false));
    assert!(!range_mapped(pid, f, 16, true));
}
