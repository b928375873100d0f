//! A capture ring: one producer (the data path of one process's device) lays its captured
//! frames out as pcap records in shared memory, one consumer (the [`super::Writer`] of the
//! process that writes the device's file) appends them to the file. The data path pays a copy
//! of the packet into memory it already has mapped and no system call; when the ring is full
//! the frame is dropped from the capture (never from the wire) and counted, as libpcap's
//! TPACKET ring counts `tp_drops`.
//!
//! Layout (a memfd, so that a provider's ring can be handed to its daemon):
//!
//! ```text
//! 0      magic "SRCAPRG1"        8   capacity (data bytes, a power of two)
//! 64     head (producer, bytes produced since the start)
//! 128    tail (consumer, bytes released)
//! 192    dropped (producer: frames that found no room)
//! 256    busy: IDLE, BUSY, or the timestamp of the record being written (see below)
//! 4096   data: records, each 16-byte aligned, never wrapping (a PAD record fills the end)
//! ```
//!
//! A record: `len: u32` (the whole record, a multiple of 16), `kind: u32`, `mono_ns: u64`, then
//! a classic pcap record header (16 bytes: the consumer fills in the timestamp) and the frame.
//!
//! Time order across rings: the consumer merges rings by timestamp and may only write a frame
//! once no ring can still produce an earlier one. `busy` tells it: the producer stores BUSY,
//! reads the clock, stores the time it read, writes the record and publishes `head`, then stores
//! IDLE. A consumer that reads the clock, then `busy`, knows every later record of that ring is
//! stamped at or after: its own clock reading (IDLE), the stored time, or the last record it saw
//! (BUSY: the clock is being read; it is monotonic).
//!
//! The consumer trusts nothing in a ring another process maps: every length is checked against
//! the ring before it is used, and a ring that breaks the format is dropped and counted.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

const MAGIC: u64 = u64::from_le_bytes(*b"SRCAPRG1");
const HEADER: usize = 4096;
const OFF_CAP: usize = 8;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const OFF_DROPPED: usize = 192;
const OFF_BUSY: usize = 256;

/// `busy`: no record is being written.
pub(crate) const IDLE: u64 = u64::MAX;
/// `busy`: a record is being started; its time is not read yet.
pub(crate) const BUSY: u64 = u64::MAX - 1;

/// A record's own header.
pub(crate) const REC_HDR: usize = 16;
/// The pcap record header that follows it.
pub(crate) const PCAP_HDR: usize = 16;

/// Record kinds (low byte) and the repairs the consumer makes before writing (bits above).
pub(crate) const KIND_FRAME: u32 = 1;
pub(crate) const KIND_PAD: u32 = 2;
/// A received IPv4 packet: its IPv4 ID is recovered from the ICRC (a UDP socket does not show
/// the sender's), and the header checksum refilled.
pub(crate) const FIX_IPV4_ID: u32 = 1 << 8;
/// An IPv6 packet: its UDP checksum is filled in (RFC 8200 8.1: mandatory over IPv6).
pub(crate) const FIX_UDP6: u32 = 1 << 9;
const KNOWN_FLAGS: u32 = 0xff | FIX_IPV4_ID | FIX_UDP6;

/// Smallest and largest data areas a ring may have (a provider's ring is checked against them).
pub(crate) const MIN_CAPACITY: usize = 1 << 16;
pub(crate) const MAX_CAPACITY: usize = 1 << 32;

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn align16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

/// How long a producer waits for room before it takes the writer for stalled and goes on into
/// the ring's slack: long enough for a writer the file held up (a disk throttled to 100 MB/s held
/// each of its writes 75-80 ms, and with 25 ms each stall spent the slack until the ring was full
/// and frames dropped); a wait ends as soon as the writer frees room. A data path held this long
/// may have its peer time out once and retransmit (RC timeout 14 is 67 ms), as over a link that
/// paused: a retry, never a retry count spent, and the capture shows it.
const FULL_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A ring's mark: past `capacity / MARK_DIVISOR` bytes in use, a producer waits for the writer
/// ([`FULL_WAIT`]); the rest of the ring is the slack for a writer that stalls. A writer that
/// keeps up, only more slowly than the programs send (a capture's disk takes less than the wire
/// brings), holds the ring at the mark, and a producer that waited at the very end of the ring
/// lost frames whenever the writer then stalled for longer than one wait: a write of the file
/// or a wake-up 25-31 ms late on a 2-core machine (qperf at 64 KiB, ~800 MB/s a device, into a
/// disk that takes ~1 GB/s for both: CI lost 121 frames so). At the mark (a quarter of 128 MiB)
/// the producer waits, then goes on into the 96 MiB past it: ~120 ms more at that rate.
const MARK_DIVISOR: usize = 4;

/// `stalled_at`: no wait for the writer has run out since it last freed room.
const NOT_STALLED: u64 = u64::MAX;

/// The most a producer waits for room in long waits ([`LONG_WAIT`] or more), per
/// [`WAIT_WINDOW`] of time, while the writer keeps less than [`PACE_FLOOR`] over the window: half.
/// A writer that keeps up, only more slowly than the programs send (a disk slower than the wire:
/// a cloud disk throttled to a hundred or a few hundred MB/s takes a 64 KiB WRITE stream of
/// ~800 MB/s at a fraction, in bursts), frees room batch after batch: the producer's waits pace
/// the protocol at the writer's speed, as a link is paced by its capture's buffer, and nothing is
/// lost, however long that goes on. (Before, every wait of 5 ms or more counted, and such a disk
/// spent the budget in half a second, after which frames dropped for the rest of the second:
/// 78,211 of qperf at 64 KiB into a disk throttled to 150 MB/s, 178,865 once in CI.) A writer
/// that frees next to nothing (stalled in a write, kept off the CPU, a record every 20 ms) would
/// pace the protocol a frame per wait, until the programs' own timeouts fired (qperf's
/// synchronisation after a test, at 1 MiB on a loaded machine): with the budget spent, frames
/// drop from the capture at once (counted) for the rest of the window, and the programs keep at
/// least half their time.
const WAIT_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

/// A wait for room this long or longer counts against [`WAIT_BUDGET`]: longer than a writer that
/// keeps up takes to write a batch (256 KiB: ~0.3 ms into memory, ~1.5 ms where each page is
/// touched for the first time).
const LONG_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// The writer's pace over the window below which long waits count against [`WAIT_BUDGET`]:
/// 16 MiB/s, well under any disk, far above a writer that frees a record a wait. Over the window,
/// not per wait: a throttled disk's writes come in bursts (a block cgroup throttled to 100 MB/s
/// let the writer write for a few ms, then held it 75-80 ms), so a single wait may see next to
/// nothing freed while the writer's pace is a hundred MB/s.
const PACE_FLOOR: u64 = 16 << 20;

/// The window over which [`WAIT_BUDGET`] counts.
const WAIT_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// A producer's account of its long waits for room ([`WAIT_BUDGET`] per [`WAIT_WINDOW`]), in ns
/// of the monotonic clock, and of what the writer freed in the window (the ring's tail).
#[derive(Debug, Default)]
pub(crate) struct WaitBudget {
    window_start: std::sync::atomic::AtomicU64,
    spent: std::sync::atomic::AtomicU64,
    /// The ring's tail when the window started.
    tail_start: std::sync::atomic::AtomicU64,
}

impl WaitBudget {
    /// How long the producer may wait now (`now` in ns, the ring's `tail`): what is left of the
    /// window's budget, at most [`FULL_WAIT`]. A window that has ended starts a new one.
    pub(crate) fn allowed(&self, now: u64, tail: u64) -> std::time::Duration {
        let start = self.window_start.load(Ordering::Relaxed);
        if now.saturating_sub(start) >= WAIT_WINDOW.as_nanos() as u64 {
            self.window_start.store(now, Ordering::Relaxed);
            self.spent.store(0, Ordering::Relaxed);
            self.tail_start.store(tail, Ordering::Relaxed);
        }
        let left = (WAIT_BUDGET.as_nanos() as u64).saturating_sub(self.spent.load(Ordering::Relaxed));
        std::time::Duration::from_nanos(left).min(FULL_WAIT)
    }

    /// Counts a wait of `waited` that ended at `now` with the ring's tail at `tail`, if it was a
    /// long one ([`LONG_WAIT`]) and the writer has kept less than [`PACE_FLOOR`] since the window
    /// started.
    pub(crate) fn spend(&self, waited: std::time::Duration, now: u64, tail: u64) {
        if waited < LONG_WAIT {
            return;
        }
        let elapsed = now.saturating_sub(self.window_start.load(Ordering::Relaxed)).max(waited.as_nanos() as u64);
        let freed = tail.wrapping_sub(self.tail_start.load(Ordering::Relaxed));
        let paced = freed as u128 * 1_000_000_000 >= PACE_FLOOR as u128 * elapsed as u128;
        if !paced {
            self.spent.fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// A mapped capture ring (either side).
pub(crate) struct Ring {
    base: NonNull<u8>,
    cap: usize,
    fd: OwnedFd,
    /// The producer's: the tail its last wait for the writer ran out at ([`NOT_STALLED`]: the
    /// writer has freed room since, or no wait ran out).
    stalled_at: AtomicU64,
    /// The producer's: the use of the ring (bytes) up to which it goes on without waiting for
    /// the writer: the mark, or more after the writer stalled ([`Ring::produce`]).
    hold: AtomicU64,
    /// The producer's: its waits for room in the current window.
    waits: WaitBudget,
}

// SAFETY: the mapping is shared memory reached only through atomics (the header) and through
// the regions the ring's protocol gives one side at a time (see the producer and consumer).
unsafe impl Send for Ring {}
// SAFETY: as above; `produce` takes the producer's position by `&mut`, so one thread produces.
unsafe impl Sync for Ring {}

impl Ring {
    /// A new ring with `capacity` data bytes (rounded up to a power of two, at least
    /// [`MIN_CAPACITY`]).
    pub(crate) fn create(capacity: usize) -> io::Result<Ring> {
        let cap = capacity.clamp(MIN_CAPACITY, MAX_CAPACITY).next_power_of_two();
        let fd = memfd_create("softrdma-capture", MFdFlags::MFD_CLOEXEC).map_err(errno)?;
        nix::unistd::ftruncate(&fd, (HEADER + cap) as i64).map_err(errno)?;
        let r = Ring::map(fd, cap)?;
        r.word(0).store(MAGIC, Ordering::Relaxed);
        r.word(OFF_CAP).store(cap as u64, Ordering::Relaxed);
        r.word(OFF_BUSY).store(IDLE, Ordering::Release);
        Ok(r)
    }

    /// Maps a ring another process made (its memfd, received over its connection). The size
    /// is the file's, checked against the header: a ring that does not describe itself
    /// truthfully is refused.
    pub(crate) fn open(fd: OwnedFd) -> io::Result<Ring> {
        let len = nix::sys::stat::fstat(fd.as_fd()).map_err(errno)?.st_size;
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "not a capture ring");
        let len = usize::try_from(len).map_err(|_| bad())?;
        let cap = len.checked_sub(HEADER).ok_or_else(bad)?;
        if !cap.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&cap) {
            return Err(bad());
        }
        let r = Ring::map(fd, cap)?;
        if r.word(0).load(Ordering::Relaxed) != MAGIC || r.word(OFF_CAP).load(Ordering::Relaxed) != cap as u64 {
            return Err(bad());
        }
        Ok(r)
    }

    fn map(fd: OwnedFd, cap: usize) -> io::Result<Ring> {
        let len = std::num::NonZeroUsize::new(HEADER + cap).expect("not zero");
        // SAFETY: a new shared mapping of the whole memfd; nothing else is at that address.
        let p = unsafe {
            mmap(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd.as_fd(), 0)
        }
        .map_err(errno)?;
        Ok(Ring {
            base: p.cast(),
            cap,
            fd,
            stalled_at: AtomicU64::new(NOT_STALLED),
            hold: AtomicU64::new(0),
            waits: WaitBudget::default(),
        })
    }

    /// The memfd (to hand to the daemon).
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Data bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the header's 8-byte aligned fields, inside the mapping, which
        // lives as long as `self`; the header is only ever accessed through atomics.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU64) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data area starts HEADER bytes into the mapping.
        unsafe { self.base.as_ptr().add(HEADER) }
    }

    pub(crate) fn head(&self) -> u64 {
        self.word(OFF_HEAD).load(Ordering::Acquire)
    }

    pub(crate) fn tail(&self) -> u64 {
        self.word(OFF_TAIL).load(Ordering::Acquire)
    }

    pub(crate) fn busy(&self) -> u64 {
        self.word(OFF_BUSY).load(Ordering::SeqCst)
    }

    /// The producer's long waits for the writer in the current window, in ns.
    #[cfg(test)]
    pub(crate) fn waited_ns(&self) -> u64 {
        self.waits.spent.load(Ordering::Relaxed)
    }

    /// Frames the producer found no room for.
    pub(crate) fn dropped(&self) -> u64 {
        self.word(OFF_DROPPED).load(Ordering::Relaxed)
    }

    /// The consumer gives bytes up to `pos` back to the producer.
    pub(crate) fn release(&self, pos: u64) {
        self.word(OFF_TAIL).store(pos, Ordering::Release);
    }

    /// Producer: one frame of `caplen` bytes, which `fill` writes, of kind [`KIND_FRAME`] with
    /// repairs `flags`; `head` is the producer's own position (it alone writes it). Past the
    /// ring's mark ([`MARK_DIVISOR`]) the producer waits for the writer, up to [`FULL_WAIT`] (within
    /// [`WAIT_BUDGET`]); a writer that freed nothing in that wait is taken as stalled, and the
    /// producer goes on into the rest of the ring without waiting until the writer frees
    /// something, and from then on at the writer's pace wherever the ring's use then stands
    /// (`hold`), back down to the mark as the writer catches up. False when the ring had no room
    /// at all: the frame is counted in `dropped`.
    pub(crate) fn produce(&self, head: &mut u64, caplen: usize, flags: u32, fill: impl FnOnce(&mut [u8])) -> bool {
        let busy = self.word(OFF_BUSY);
        busy.store(BUSY, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let ts = super::monotonic_ns();
        busy.store(ts.min(BUSY - 1), Ordering::SeqCst);
        let cap = self.cap;
        let need = align16(REC_HDR + PCAP_HDR + caplen);
        let mut off = (*head % cap as u64) as usize;
        let pad = if cap - off < need { cap - off } else { 0 };
        // The ring's use once this frame is in, or None if the tail is not behind the head.
        let after = |tail: u64| {
            let used = head.wrapping_sub(tail);
            (used <= cap as u64).then(|| used + (pad + need) as u64)
        };
        let room = |tail: u64| after(tail).is_some_and(|u| u <= cap as u64);
        let mark = (cap / MARK_DIVISOR).max(pad + need) as u64;
        let sane = need <= cap / 2 && caplen <= u32::MAX as usize;
        let mut tail = self.tail();
        // The use up to which the producer goes on without waiting: the mark, or where the ring
        // stood when a stalled writer started writing again.
        let mut hold = self.hold.load(Ordering::Relaxed).max(mark);
        // A stalled writer that has freed something since is writing again: the producer goes on
        // at its pace from the ring's use now, rather than waiting (a transport's timeouts long)
        // for the writer to bring the ring back down to its mark.
        let stalled_at = self.stalled_at.load(Ordering::Relaxed);
        let stalled = stalled_at != NOT_STALLED && stalled_at == tail;
        if stalled_at != NOT_STALLED && !stalled {
            self.stalled_at.store(NOT_STALLED, Ordering::Relaxed);
            hold = after(tail).map_or(hold, |u| u.max(mark));
        }
        // A writer ahead of the producer takes the hold back down with the ring's use.
        if let Some(u) = after(tail) {
            hold = hold.min(u.max(mark));
        }
        let within = |tail: u64, hold: u64| after(tail).is_some_and(|u| u <= hold);
        if sane && !stalled && !within(tail, hold) {
            // Past the hold: the writer is behind. Wait for it a little (the protocol slows down,
            // as a link does when its capture's buffer fills), leaving it the CPU it needs. A
            // writer that did not free anything within the wait is stalled (the kernel kept it
            // off the CPU, a write of the file took long): the frame and the ones after it go
            // into the room left past the hold without waiting (no wait per frame piles up into
            // a transport timeout) until it frees something, and they are dropped only when
            // the whole ring is full. Long waits in which the writer kept less than PACE_FLOOR
            // take at most WAIT_BUDGET a second together.
            let start = std::time::Instant::now();
            let from = tail;
            let allowed = self.waits.allowed(ts, tail);
            while !within(tail, hold) && start.elapsed() < allowed {
                // Sleep, not spin: on a machine whose cores the programs keep busy, the writer
                // needs the very CPU a spinning producer would hold.
                std::thread::sleep(std::time::Duration::from_micros(50));
                tail = self.tail();
            }
            let freed = tail.wrapping_sub(from);
            self.waits.spend(start.elapsed(), super::monotonic_ns(), tail);
            if within(tail, hold) {
                // The writer made room: the ring goes back down towards its mark at a quarter
                // of the writer's pace (the programs keep the rest), so that it has its slack
                // again for the writer's next stall.
                hold = hold.saturating_sub(freed / 4).max(mark);
            } else if !allowed.is_zero() {
                if freed == 0 {
                    self.stalled_at.store(tail, Ordering::Relaxed);
                } else {
                    // Writing, but more slowly than this wait: the ring holds here.
                    hold = after(tail).map_or(hold, |u| u.max(mark));
                }
            }
        }
        self.hold.store(hold, Ordering::Relaxed);
        if !(sane && room(tail)) {
            self.word(OFF_DROPPED).fetch_add(1, Ordering::Relaxed);
            busy.store(IDLE, Ordering::SeqCst);
            return false;
        }
        // SAFETY: the bytes from `head` to `tail + cap` are the producer's until it publishes
        // `head`: the consumer reads only below it. `off + pad` and `off + need` stay inside the
        // data area (checked above).
        unsafe {
            if pad > 0 {
                let p = self.data().add(off);
                (p as *mut u32).write_unaligned((pad as u32).to_le());
                (p.add(4) as *mut u32).write_unaligned(KIND_PAD.to_le());
                *head += pad as u64;
                off = 0;
            }
            let p = self.data().add(off);
            (p as *mut u32).write_unaligned((need as u32).to_le());
            (p.add(4) as *mut u32).write_unaligned((KIND_FRAME | flags).to_le());
            (p.add(8) as *mut u64).write_unaligned(ts.to_le());
            // The pcap record header: the lengths now, the time by the consumer (the file's epoch).
            let rec = std::slice::from_raw_parts_mut(p.add(REC_HDR), PCAP_HDR + caplen);
            rec[..8].fill(0);
            rec[8..12].copy_from_slice(&(caplen as u32).to_le_bytes());
            rec[12..16].copy_from_slice(&(caplen as u32).to_le_bytes());
            fill(&mut rec[PCAP_HDR..]);
        }
        *head += need as u64;
        self.word(OFF_HEAD).store(*head, Ordering::Release);
        busy.store(IDLE, Ordering::SeqCst);
        true
    }

    /// Consumer: the record at absolute position `pos` (below a `head` it read), checked.
    pub(crate) fn record_at(&self, pos: u64, head: u64) -> Result<Record, Broken> {
        let cap = self.cap;
        let avail = head.wrapping_sub(pos);
        let off = (pos % cap as u64) as usize;
        if avail < REC_HDR as u64 || avail > cap as u64 || off % 16 != 0 {
            return Err(Broken);
        }
        // SAFETY: `off + REC_HDR` is inside the data area (off is 16-aligned, cap a multiple of
        // 16); the bytes below `head` are the consumer's to read.
        let (len, kind, ts) = unsafe {
            let p = self.data().add(off);
            (
                u32::from_le((p as *const u32).read_unaligned()) as usize,
                u32::from_le((p.add(4) as *const u32).read_unaligned()),
                u64::from_le((p.add(8) as *const u64).read_unaligned()),
            )
        };
        if len < REC_HDR || len % 16 != 0 || len > cap - off || len as u64 > avail || kind & !KNOWN_FLAGS != 0 {
            return Err(Broken);
        }
        match kind & 0xff {
            KIND_PAD => Ok(Record { pos, len, kind, ts, caplen: 0 }),
            KIND_FRAME if len >= REC_HDR + PCAP_HDR => {
                // SAFETY: inside the record, checked above.
                let caplen = unsafe {
                    u32::from_le((self.data().add(off + REC_HDR + 8) as *const u32).read_unaligned()) as usize
                };
                if REC_HDR + PCAP_HDR + caplen > len {
                    return Err(Broken);
                }
                Ok(Record { pos, len, kind, ts, caplen })
            }
            _ => Err(Broken),
        }
    }

    /// Consumer: the pcap record (header and frame) of a checked frame record, to repair and
    /// write. The consumer owns it until it releases the ring past the record.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn pcap_record(&self, r: &Record) -> &mut [u8] {
        let off = (r.pos % self.cap as u64) as usize;
        // SAFETY: `record_at` checked that the record lies inside the data area; the bytes
        // between `tail` and `head` are the consumer's (a producer that breaks the protocol
        // can only garble its own frames' bytes, which are plain bytes to us).
        unsafe { std::slice::from_raw_parts_mut(self.data().add(off + REC_HDR), PCAP_HDR + r.caplen) }
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("capacity", &self.cap).finish_non_exhaustive()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of that length; nothing refers to it any more.
        unsafe {
            let _ = munmap(self.base.cast(), HEADER + self.cap);
        }
    }
}

/// A checked record of a ring.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record {
    /// Its absolute position.
    pub pos: u64,
    /// Its length in the ring.
    pub len: usize,
    pub kind: u32,
    /// When it was captured (CLOCK_MONOTONIC, ns).
    pub ts: u64,
    /// Frame bytes.
    pub caplen: usize,
}

impl Record {
    pub(crate) fn is_pad(&self) -> bool {
        self.kind & 0xff == KIND_PAD
    }

    pub(crate) fn end(&self) -> u64 {
        self.pos + self.len as u64
    }
}

/// A ring whose contents break the format.
#[derive(Debug)]
pub(crate) struct Broken;
