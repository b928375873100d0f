//! The shared-memory arena of one client (docs/architecture.md D4): the rings of its send, receive
//! and shared receive queues and of its completion queues live in one memfd that the device
//! creates, sizes and seals (`F_SEAL_SHRINK | F_SEAL_GROW`, so the client cannot truncate it under
//! the device), and that both map. One arena per client, not one memfd per queue: 10k QPs would
//! exhaust the fd limit long before memory.
//!
//! A ring is a header (producer index and consumer index, each on its own cache line; a send
//! queue's ring also has the device's retired count beside the consumer index) and
//! `cap` slots of `slot` bytes; the indices run freely and wrap, a slot is `index & (cap - 1)`.
//! Headers and slots live apart: the headers packed together at the start of the arena (an idle
//! queue touches 128 bytes of it, not a page of its own), the slots in a large sparse region
//! after them (a memfd page costs memory only once it is touched, so ring space is virtual and an
//! idle ring's slots cost nothing).
//! A slot holds a little-endian u32 length and a postcard-encoded work request or completion.
//! Either side may be hostile to the other: the reader copies a slot out before decoding it, bounds
//! every length, and trusts no index further than `cap` entries.
//!
//! The arena's first page holds the doorbell suppression flag: while the device is polling the
//! rings it sets `polling`, and a client that sees it set after publishing its producer index
//! skips the doorbell (an eventfd write). Both sides put a SeqCst fence between their store and
//! their load, and the device scans once more after clearing the flag, so no post is missed.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};

use nix::fcntl::{fallocate, fcntl, FallocateFlags, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{madvise, mmap, munmap, MapFlags, MmapAdvise, ProtFlags};
use serde::{Deserialize, Serialize};

/// Bytes of one client's arena (virtual: memfd pages are allocated only as they are touched, so
/// an idle QP costs the 256 bytes of its two ring headers, not its ring space).
pub const ARENA_LEN: usize = STAGING_OFF + (32 << 20);
/// Where the ring headers are: after the arena's own header page, 128 bytes each, packed; room
/// for 524,256 rings (the device's 131,072 QPs have at most two each, CQs and SRQs one).
pub const HEADERS_OFF: usize = HEADER;
/// Where ring slots start (the end of the header region).
pub const SLOTS_OFF: usize = 64 << 20;
/// The ring slots live from 64 MiB to 32 GiB (virtual; sparse): room for 1,046,000 QPs of 16
/// send and 16 receive slots, or 52,000 of perftest's default depths (128 send, 512 receive) in
/// one process, beyond the device's max_qp. After them comes the receive staging area (32 MiB), where the device puts received
/// SEND data for the client to scatter into its buffers when it polls.
pub const STAGING_OFF: usize = 32 << 30;
/// Bytes of the staging area.
pub const STAGING_LEN: usize = ARENA_LEN - STAGING_OFF;

const MAGIC: u32 = 0x5352_4441; // "SRDA"
const HEADER: usize = 4096;
const POLLING_OFF: usize = 64;
const POSTED_OFF: usize = 128;
const RING_HEADER: usize = 128;
/// The retired count's place in a ring header (in the consumer's cache line: the device writes
/// both).
const RETIRED_OFF: usize = 68;
/// The page size `discard` rounds to (a larger real page only makes it zero whole pages it could
/// not free: still inside the released ring).
const PAGE: usize = 4096;

/// Slot size of send and receive queue rings (a work request with 32 SGEs fits).
pub const WQE_SLOT: u32 = 1024;
/// Slot size of completion queue rings.
pub const CQE_SLOT: u32 = 128;

/// Where a ring is in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingDesc {
    /// Offset of its header (in the header region).
    pub off: u64,
    /// Offset of its first slot (in the slot region).
    pub slots: u64,
    /// Slots (a power of two).
    pub cap: u32,
    /// Bytes per slot.
    pub slot: u32,
}

impl RingDesc {
    /// Bytes the ring's slots take.
    pub fn bytes(&self) -> usize {
        self.cap as usize * self.slot as usize
    }
}

/// A mapped arena.
pub struct Arena {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is shared memory reached only through atomics and byte copies; it stays
// mapped as long as the Arena lives.
unsafe impl Send for Arena {}
// SAFETY: as above; no method hands out references that outlive a call.
unsafe impl Sync for Arena {}

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from(e)
}

impl Arena {
    /// Creates, sizes, seals and maps a new arena (the device side).
    pub fn create() -> io::Result<Arena> {
        let fd = memfd_create("softrdma-arena", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).map_err(errno)?;
        nix::unistd::ftruncate(&fd, ARENA_LEN as i64).map_err(errno)?;
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(errno)?;
        let a = Arena::map_fd(fd, ARENA_LEN)?;
        a.u32_at(0).store(MAGIC, Ordering::Release);
        Ok(a)
    }

    /// Maps an arena the device passed (the client side): checks that it is sealed against
    /// shrinking and has the expected size and magic; asks the kernel not to copy it into forked
    /// children (MADV_DONTFORK, as libibverbs does for its queues).
    pub fn open(fd: OwnedFd) -> io::Result<Arena> {
        let seals = fcntl(&fd, FcntlArg::F_GET_SEALS).map_err(errno)?;
        let seals = SealFlag::from_bits_truncate(seals);
        let len = nix::sys::stat::fstat(&fd).map_err(errno)?.st_size as usize;
        if !seals.contains(SealFlag::F_SEAL_SHRINK) || len != ARENA_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the device's arena is not sealed or has the wrong size",
            ));
        }
        let a = Arena::map_fd(fd, len)?;
        if a.u32_at(0).load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the device's arena has no header"));
        }
        // SAFETY: the range is our own mapping.
        unsafe { madvise(a.ptr.cast(), a.len, MmapAdvise::MADV_DONTFORK) }.map_err(errno)?;
        Ok(a)
    }

    fn map_fd(fd: OwnedFd, len: usize) -> io::Result<Arena> {
        let n = std::num::NonZeroUsize::new(len).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a new shared mapping of the whole memfd; nothing else is at that address.
        let p =
            unsafe { mmap(None, n, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd.as_fd(), 0) }
                .map_err(errno)?;
        Ok(Arena { ptr: p.cast(), len, fd })
    }

    /// The memfd (to pass to the client).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= self.len, "arena offset out of range");
        // SAFETY: in bounds and aligned (checked); AtomicU32 has the layout of u32, and the
        // mapping lives as long as &self.
        unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU32) }
    }

    /// The device's polling flag (doorbell suppression).
    pub fn polling(&self) -> &AtomicU32 {
        self.u32_at(POLLING_OFF)
    }

    /// Bumped by the client after it publishes work on any of its rings, so the device skips
    /// the rings of clients that posted nothing since it last looked.
    pub fn posted(&self) -> &AtomicU32 {
        self.u32_at(POSTED_OFF)
    }

    fn check(&self, r: &RingDesc) -> bool {
        r.cap.is_power_of_two()
            && (4..=WQE_SLOT).contains(&r.slot)
            && r.off as usize >= HEADERS_OFF
            && r.off % 64 == 0
            && (r.off as usize).checked_add(RING_HEADER).is_some_and(|e| e <= SLOTS_OFF)
            && r.slots as usize >= SLOTS_OFF
            && r.slots % 64 == 0
            && (r.cap as usize)
                .checked_mul(r.slot as usize)
                .is_some_and(|b| (r.slots as usize).checked_add(b).is_some_and(|e| e <= STAGING_OFF && e <= self.len))
    }

    /// Producer and consumer indices of a ring.
    fn indices(&self, r: &RingDesc) -> (&AtomicU32, &AtomicU32) {
        (self.u32_at(r.off as usize), self.u32_at(r.off as usize + 64))
    }

    fn slot_ptr(&self, r: &RingDesc, idx: u32) -> *mut u8 {
        let i = (idx & (r.cap - 1)) as usize;
        // SAFETY: `check` bounded the ring's slots inside the mapping; i < cap.
        unsafe { self.ptr.as_ptr().add(r.slots as usize + i * r.slot as usize) }
    }

    /// Producer side: appends one encoded entry; `Ok(false)` when the ring is full.
    pub fn produce<T: Serialize>(&self, r: &RingDesc, v: &T) -> io::Result<bool> {
        if !self.check(r) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let (prod, cons) = self.indices(r);
        let p = prod.load(Ordering::Relaxed);
        let c = cons.load(Ordering::Acquire);
        if p.wrapping_sub(c) >= r.cap {
            return Ok(false);
        }
        // Encoded straight into the slot, after its length word: the slot is the producer's
        // until the index below publishes it (a consumer that writes into it meanwhile only
        // garbles its own entry, which it copies out and checks before use).
        let slot = self.slot_ptr(r, p);
        // SAFETY: check() bounded the slot inside the mapping for r.slot >= 4 bytes.
        let writer = SlotWriter { at: unsafe { slot.add(4) }, left: r.slot as usize - 4, written: 0 };
        let n = postcard::serialize_with_flavor(v, writer)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "entry larger than a ring slot"))?;
        // SAFETY: the length word is the slot's first 4 bytes.
        unsafe { std::ptr::copy_nonoverlapping((n as u32).to_le_bytes().as_ptr(), slot, 4) };
        prod.store(p.wrapping_add(1), Ordering::Release);
        Ok(true)
    }

    /// Consumer side: takes up to `max` entries (never more than `cap` at once, whatever the
    /// producer's index says), calling `f` with each decoded one (`None`: a malformed slot).
    /// `f` returns false to stop before consuming that entry (backpressure). Returns how many
    /// were consumed.
    pub fn consume<T: for<'de> Deserialize<'de>>(
        &self,
        r: &RingDesc,
        max: usize,
        mut f: impl FnMut(Option<T>) -> bool,
    ) -> usize {
        if !self.check(r) {
            return 0;
        }
        let (prod, cons) = self.indices(r);
        let c = cons.load(Ordering::Relaxed);
        let p = prod.load(Ordering::Acquire);
        let n = (p.wrapping_sub(c)).min(r.cap) as usize;
        let mut done = 0;
        // Only the bytes copied in are ever read (not zeroed first: a poll of an empty CQ ring
        // would pay a 1 KiB memset).
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); WQE_SLOT as usize];
        while done < n.min(max) {
            let idx = c.wrapping_add(done as u32);
            // Copy the entry out before looking at it: the producer may change it meanwhile. Only
            // its length word first, then as many bytes as it says (bounded by the slot), not the
            // whole slot: most entries are a few dozen bytes of a 1 KiB slot.
            let slot = self.slot_ptr(r, idx);
            let mut word = [0u8; 4];
            // SAFETY: slot_ptr is in bounds for r.slot bytes (at least 4).
            unsafe { std::ptr::copy_nonoverlapping(slot, word.as_mut_ptr(), 4) };
            let len = u32::from_le_bytes(word) as usize;
            let v = if len + 4 <= r.slot as usize {
                // SAFETY: 4 + len <= r.slot <= WQE_SLOT bytes are in bounds of the slot and buf;
                // the `len` bytes read back are the ones just copied in.
                let body = unsafe {
                    std::ptr::copy_nonoverlapping(slot.add(4), buf.as_mut_ptr().cast::<u8>(), len);
                    std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len)
                };
                postcard::from_bytes(body).ok()
            } else {
                None
            };
            if !f(v) {
                break;
            }
            done += 1;
        }
        cons.store(c.wrapping_add(done as u32), Ordering::Release);
        done
    }

    /// Entries ever put into a ring (its producer index, free-running).
    pub fn produced(&self, r: &RingDesc) -> u32 {
        if !self.check(r) {
            return 0;
        }
        self.indices(r).0.load(Ordering::Relaxed)
    }

    /// Entries ever taken from a ring (its consumer index, free-running).
    pub fn consumed(&self, r: &RingDesc) -> u32 {
        if !self.check(r) {
            return 0;
        }
        self.indices(r).1.load(Ordering::Acquire)
    }

    /// The retired count of a send queue's ring: how many of the requests ever posted on it
    /// have left the queue (completed, flushed, or refused by the device), free-running. The
    /// device publishes it, before it writes the completion that retired them, so that a
    /// client counts `produced - retired` requests outstanding against max_send_wr (unsignaled
    /// requests leave with the next completion written, as the slots of a hardware queue are
    /// freed when a later completion is seen).
    pub fn retired(&self, r: &RingDesc) -> u32 {
        if !self.check(r) {
            return 0;
        }
        self.u32_at(r.off as usize + RETIRED_OFF).load(Ordering::Acquire)
    }

    /// Publishes a send queue ring's retired count (the device; see [`Arena::retired`]).
    pub fn set_retired(&self, r: &RingDesc, n: u32) {
        if self.check(r) {
            self.u32_at(r.off as usize + RETIRED_OFF).store(n, Ordering::Release);
        }
    }

    /// Entries waiting in a ring (bounded by its capacity).
    pub fn pending(&self, r: &RingDesc) -> u32 {
        if !self.check(r) {
            return 0;
        }
        let (prod, cons) = self.indices(r);
        prod.load(Ordering::Acquire).wrapping_sub(cons.load(Ordering::Acquire)).min(r.cap)
    }

    /// Free slots of a ring, as its producer sees them.
    pub fn free(&self, r: &RingDesc) -> u32 {
        if !self.check(r) {
            return 0;
        }
        let (prod, cons) = self.indices(r);
        r.cap.saturating_sub(prod.load(Ordering::Relaxed).wrapping_sub(cons.load(Ordering::Acquire)))
    }

    /// Copies `data` into the staging area at `off` (the device, receiving); false when the
    /// range is not inside the staging area.
    pub fn stage_write(&self, off: usize, data: &[u8]) -> bool {
        if off < STAGING_OFF || off.checked_add(data.len()).is_none_or(|e| e > ARENA_LEN) {
            return false;
        }
        // SAFETY: in bounds (checked); byte copy into shared memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len()) };
        true
    }

    /// Copies from the staging area at `off` into `buf` (the client, scattering at poll); false
    /// when the range is not inside the staging area.
    pub fn stage_read(&self, off: usize, buf: &mut [u8]) -> bool {
        if off < STAGING_OFF || off.checked_add(buf.len()).is_none_or(|e| e > ARENA_LEN) {
            return false;
        }
        fence(Ordering::Acquire);
        // SAFETY: in bounds (checked); byte copy out of shared memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), buf.as_mut_ptr(), buf.len()) };
        true
    }

    /// Gives the memory of a released ring's slots back to the system (the whole pages among
    /// them: a page shared with a live neighbour stays); they read as zeros until touched again.
    /// The device, after the ring's queue is destroyed: no live ring has a slot there.
    pub fn discard(&self, r: &RingDesc) {
        if !self.check(r) {
            return;
        }
        let start = (r.slots as usize).next_multiple_of(PAGE);
        let end = (r.slots as usize + r.bytes()) / PAGE * PAGE;
        if end > start {
            let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
            // Best effort: a kernel that cannot punch keeps the pages, as before.
            let _ = fallocate(&self.fd, flags, start as i64, (end - start) as i64);
        }
    }

    /// Resets a ring's indices (the device, when it hands a ring out).
    pub fn reset(&self, r: &RingDesc) {
        if self.check(r) {
            let (p, c) = self.indices(r);
            p.store(0, Ordering::Relaxed);
            c.store(0, Ordering::Relaxed);
            self.u32_at(r.off as usize + RETIRED_OFF).store(0, Ordering::Relaxed);
            fence(Ordering::Release);
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// The device's allocator of space in one arena (ring slots, staging): first fit over a sorted
/// free list.
#[derive(Debug)]
pub struct Allocator {
    free: Vec<(usize, usize)>,
}

/// The device's allocator of rings in one arena: a header from the header region, slots from
/// the slot region.
#[derive(Debug)]
pub struct RingAllocator {
    headers: Allocator,
    slots: Allocator,
}

impl Default for RingAllocator {
    /// The ring space of an arena.
    fn default() -> RingAllocator {
        RingAllocator {
            headers: Allocator::span(HEADERS_OFF, SLOTS_OFF - HEADERS_OFF),
            slots: Allocator::span(SLOTS_OFF, STAGING_OFF - SLOTS_OFF),
        }
    }
}

impl RingAllocator {
    /// A ring of at least `entries` slots of `slot` bytes; `None` when the arena has no room
    /// for its header or its slots (the caller's ENOMEM).
    pub fn ring(&mut self, entries: u32, slot: u32) -> Option<RingDesc> {
        let cap = entries.max(1).checked_next_power_of_two()?;
        let bytes = (cap as usize).checked_mul(slot as usize)?;
        let off = self.headers.alloc(RING_HEADER)?;
        let Some(slots) = self.slots.alloc(bytes) else {
            self.headers.free(off, RING_HEADER);
            return None;
        };
        Some(RingDesc { off: off as u64, slots: slots as u64, cap, slot })
    }

    /// Gives a ring's header and slots back.
    pub fn release(&mut self, r: &RingDesc) {
        self.headers.free(r.off as usize, RING_HEADER);
        self.slots.free(r.slots as usize, r.bytes());
    }
}

impl Allocator {
    /// An allocator of `[start, start + len)`.
    pub fn span(start: usize, len: usize) -> Allocator {
        Allocator { free: vec![(start, len)] }
    }

    /// `bytes` (rounded up to 64), first fit; `None` when nothing is free enough.
    pub fn alloc(&mut self, bytes: usize) -> Option<usize> {
        let want = bytes.max(1).next_multiple_of(64);
        let i = self.free.iter().position(|&(_, len)| len >= want)?;
        let (off, len) = self.free[i];
        if len == want {
            self.free.remove(i);
        } else {
            self.free[i] = (off + want, len - want);
        }
        Some(off)
    }

    /// Gives `bytes` at `off` back (what `alloc` returned for that size).
    pub fn free(&mut self, off: usize, bytes: usize) {
        let len = bytes.max(1).next_multiple_of(64);
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the neighbours.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

/// A postcard output that writes into a ring slot in the mapping, byte range by byte range,
/// refusing to pass its end: no staging buffer to zero and copy.
struct SlotWriter {
    at: *mut u8,
    left: usize,
    written: usize,
}

impl postcard::ser_flavors::Flavor for SlotWriter {
    type Output = usize;

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() > self.left {
            return Err(postcard::Error::SerializeBufferFull);
        }
        // SAFETY: `left` bytes from `at` lie in the slot (Arena::produce); data.len() <= left.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.at, data.len());
            self.at = self.at.add(data.len());
        }
        self.left -= data.len();
        self.written += data.len();
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn finalize(self) -> postcard::Result<usize> {
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn produce_consume_across_two_mappings() {
        let dev = Arena::create().unwrap();
        let client = Arena::open(dev.fd().as_fd().try_clone_to_owned().unwrap()).unwrap();
        let mut al = RingAllocator::default();
        let r = al.ring(3, WQE_SLOT).unwrap();
        assert_eq!(r.cap, 4);
        dev.reset(&r);
        for i in 0..4u64 {
            assert!(client.produce(&r, &(i, "wqe")).unwrap());
        }
        assert!(!client.produce(&r, &(9u64, "full")).unwrap(), "a full ring refuses");
        let mut got = Vec::new();
        // Backpressure: stop after two.
        let n = dev.consume::<(u64, String)>(&r, 16, |v| {
            got.push(v.unwrap().0);
            got.len() < 3
        });
        assert_eq!((n, got.clone()), (2, vec![0, 1, 2]));
        got.clear();
        let n = dev.consume::<(u64, String)>(&r, 16, |v| {
            got.push(v.unwrap().0);
            true
        });
        assert_eq!(n, 2);
        assert_eq!(got, vec![2, 3]);
        assert_eq!(client.free(&r), 4);
    }

    #[test]
    fn hostile_indices_and_slots_are_bounded() {
        let dev = Arena::create().unwrap();
        let mut al = RingAllocator::default();
        let r = al.ring(8, 64).unwrap();
        dev.reset(&r);
        // A producer index far ahead: at most `cap` entries are looked at; garbage slots decode
        // to None.
        dev.indices(&r).0.store(1_000_000, Ordering::Release);
        let mut seen = 0;
        let n = dev.consume::<u64>(&r, usize::MAX, |v| {
            seen += 1;
            v.is_none() || v.is_some()
        });
        assert_eq!((n, seen), (8, 8));
        // A slot claiming a length beyond the slot is malformed, not an overrun.
        dev.reset(&r);
        // SAFETY: writing the first slot of a ring inside the arena.
        unsafe { std::ptr::copy_nonoverlapping([0xff, 0xff, 0, 0].as_ptr(), dev.slot_ptr(&r, 0), 4) };
        dev.indices(&r).0.store(1, Ordering::Release);
        let mut bad = false;
        dev.consume::<u64>(&r, 1, |v| {
            bad = v.is_none();
            true
        });
        assert!(bad);
        // Descriptors outside the arena are refused.
        let outside = RingDesc { off: ARENA_LEN as u64, slots: SLOTS_OFF as u64, cap: 4, slot: 64 };
        assert!(dev.produce(&outside, &1u64).is_err());
        assert_eq!(dev.consume::<u64>(&outside, 4, |_| true), 0);
        // Slots in the header region, in the staging area or beyond the arena are refused, and
        // so is a header among the slots.
        for (off, slots) in [
            (r.off, HEADERS_OFF as u64),
            (r.off, (STAGING_OFF - 128) as u64),
            (r.off, u64::MAX - 63),
            (SLOTS_OFF as u64, r.slots),
            (HEADER as u64 - 64, r.slots),
        ] {
            let bad = RingDesc { off, slots, cap: 4, slot: 64 };
            assert!(dev.produce(&bad, &1u64).is_err(), "{bad:?}");
            assert_eq!(dev.pending(&bad), 0);
        }
    }

    #[test]
    fn allocator_reuses_and_merges() {
        let mut al = RingAllocator::default();
        let a = al.ring(16, WQE_SLOT).unwrap();
        let b = al.ring(16, WQE_SLOT).unwrap();
        let c = al.ring(16, CQE_SLOT).unwrap();
        assert!(a.off < b.off && b.off < c.off);
        al.release(&b);
        al.release(&a);
        let d = al.ring(32, WQE_SLOT).unwrap();
        assert_eq!(d.slots, a.slots, "a and b merged into one hole");
        assert!(d.off < c.off, "headers are reused too");
        al.release(&c);
        al.release(&d);
        assert_eq!(al.headers.free, vec![(HEADERS_OFF, SLOTS_OFF - HEADERS_OFF)]);
        assert_eq!(al.slots.free, vec![(SLOTS_OFF, STAGING_OFF - SLOTS_OFF)]);
        assert!(al.ring(u32::MAX, WQE_SLOT).is_none());
        assert!(al.ring(1 << 25, WQE_SLOT).is_none(), "32 GiB of slots do not fit");
        assert_eq!(al.headers.free, vec![(HEADERS_OFF, SLOTS_OFF - HEADERS_OFF)], "a refused ring frees its header");
    }

    #[test]
    fn headers_are_packed_and_the_ring_space_holds_100k_idle_qps() {
        let mut al = RingAllocator::default();
        let mut last = None;
        for _ in 0..200_000 {
            let r = al.ring(16, WQE_SLOT).expect("room for 100,000 QPs of two rings of 16");
            if let Some(l) = last {
                assert_eq!(r.off, l + RING_HEADER as u64, "headers are contiguous");
            }
            last = Some(r.off);
        }
        // 200,000 headers in 25.6 MB: an idle ring touches 128 bytes of arena, not a page.
        assert!(last.unwrap() < 26 << 20);
    }

    #[test]
    fn the_header_region_is_a_real_limit() {
        let mut al = RingAllocator::default();
        let n = (SLOTS_OFF - HEADERS_OFF) / RING_HEADER;
        for _ in 0..n {
            al.ring(1, 64).unwrap();
        }
        assert!(al.ring(1, 64).is_none(), "no header left: the caller's ENOMEM");
    }

    #[test]
    fn a_discarded_ring_gives_its_pages_back_and_spares_its_neighbours() {
        let dev = Arena::create().unwrap();
        let client = Arena::open(dev.fd().as_fd().try_clone_to_owned().unwrap()).unwrap();
        let mut al = RingAllocator::default();
        let (a, b, c) = (al.ring(8, 64).unwrap(), al.ring(64, WQE_SLOT).unwrap(), al.ring(8, 64).unwrap());
        for r in [&a, &b, &c] {
            dev.reset(r);
            for i in 0..r.cap {
                assert!(client.produce(r, &(u64::from(i), [7u8; 32])).unwrap());
            }
        }
        let resident = || {
            let st = nix::sys::stat::fstat(dev.fd()).unwrap();
            st.st_blocks as u64 * 512
        };
        let before = resident();
        al.release(&b);
        dev.discard(&b);
        assert!(before - resident() >= 60 * 1024, "b's 64 KiB of slots are given back: {before} -> {}", resident());
        // The neighbours keep their entries.
        for r in [&a, &c] {
            let mut got = Vec::new();
            dev.consume::<(u64, [u8; 32])>(r, usize::MAX, |v| {
                got.push(v.unwrap().0);
                true
            });
            assert_eq!(got, (0..8).collect::<Vec<_>>());
        }
        // The space is handed out again and works.
        let d = al.ring(64, WQE_SLOT).unwrap();
        assert_eq!(d.slots, b.slots);
        dev.reset(&d);
        assert!(client.produce(&d, &1u64).unwrap());
        assert_eq!(dev.pending(&d), 1);
    }

    #[test]
    fn an_unsealed_fd_is_refused() {
        let fd = memfd_create("x", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, ARENA_LEN as i64).unwrap();
        assert!(Arena::open(fd).is_err());
    }
}
