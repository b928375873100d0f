//! The capture file's writer: a thread of the process that owns the device's file (its daemon,
//! or the process a device runs in) that merges the device's capture rings in time order and
//! appends their records to the file, repairing what the data path left for it (a received
//! packet's IPv4 ID, an IPv6 UDP checksum). The data path never waits for it.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::path::Path;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use softrdma_engine::wire::{ethernet, icrc, ipv4, ipv6, udp, Ipv4Packet, Ipv6Packet, UdpPacket};
use softrdma_pcap::{PcapWriter, Resolution};

use super::ring::{self, Record, Ring, BUSY, IDLE, PCAP_HDR};
use super::sink::Sink;

/// A producer that read its clock this long ago and still has not published the record (a
/// process stopped or descheduled in the middle of it) no longer holds the others back: a frame
/// it publishes later may then land out of order.
const STALL_NS: u64 = 200_000_000;
/// How long the thread sleeps after a round that found nothing, and after one that did.
const IDLE_SLEEP: Duration = Duration::from_millis(2);
const BUSY_SLEEP: Duration = Duration::from_micros(300);
/// A write that took this long, or a wake-up this late, is logged (at 2 GB/s a 128 MiB ring
/// lasts ~30 ms).
const SLOW: Duration = Duration::from_millis(10);
/// Records per batch (one `writev` on a plain file).
const IOV_BATCH: usize = 512;
/// Bytes per batch: ring space is given back after each batch, so a batch is what a producer
/// waiting on a full ring waits for. A fresh machine's memory is slow to touch the first time
/// (a virtual machine's host backs its pages on first use: 3 GB written into tmpfs took 17 s the
/// first time, 3-4 s again), and a file in memory gets new pages: there a batch of 512 frames
/// at 64 KiB messages (2 MB) took 10-25 ms to write, as long as a producer's wait for room
/// (ring.rs `FULL_WAIT`), and frames were dropped from the capture behind it (qperf at 64 KiB in
/// the matrix, 521 and 2,852 frames). 256 KiB gives room back every ~1-3 ms at that pace.
const BATCH_BYTES: usize = 256 << 10;

/// One ring the writer drains.
struct Source {
    ring: Arc<Ring>,
    /// Who produces into it: `None` the writer's own process, `Some(owner)` a provider.
    owner: Option<u32>,
    /// Where parsing has reached (absolute position).
    scan: u64,
    /// Parsed frames not written yet, in order.
    pending: VecDeque<Record>,
    /// Every later record of the ring is stamped at or after this.
    bound: u64,
    /// The producer has gone: what is in the ring is all there will be.
    closed: bool,
    /// The producer broke the format: the ring is no longer read.
    broken: bool,
}

#[derive(Default)]
struct Sources {
    list: Vec<Source>,
    /// `dropped` of rings that have been let go.
    dropped_gone: u64,
}

struct Shared {
    sources: Mutex<Sources>,
    stop: AtomicBool,
    /// Frames written to the file.
    frames: AtomicU64,
    /// Frames lost on the way: unwritable (the file's errors) or in a broken ring.
    lost: AtomicU64,
    /// The last round wrote something.
    wrote: AtomicBool,
    /// The rings' `dropped`, summed, when last looked at.
    dropped_seen: AtomicU64,
}

/// A device's capture file and the thread that writes it.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    /// Creates (truncates) the file, writes the pcap header (Ethernet frames, nanosecond
    /// times since `epoch_mono_ns`) and starts the thread.
    pub(crate) fn create(path: &Path, epoch_mono_ns: u64) -> io::Result<Writer> {
        let header = PcapWriter::new(Vec::new(), Resolution::Nano)?.finish()?;
        let file = Sink::create(path, &header)?;
        let shared = Arc::new(Shared {
            sources: Mutex::new(Sources::default()),
            stop: AtomicBool::new(false),
            frames: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            wrote: AtomicBool::new(false),
            dropped_seen: AtomicU64::new(0),
        });
        let s = shared.clone();
        let mut out = Output { file, epoch_mono_ns, warned: false };
        let thread = std::thread::Builder::new().name("softrdma-capture".into()).spawn(move || {
            loop {
                let stopping = s.stop.load(Ordering::Acquire);
                s.round(&mut out, stopping);
                if stopping {
                    break;
                }
                let nap = if s.wrote.swap(false, Ordering::Relaxed) { BUSY_SLEEP } else { IDLE_SLEEP };
                let t = std::time::Instant::now();
                std::thread::sleep(nap);
                // A writer kept off the CPU long enough for a ring to fill says so.
                let slept = t.elapsed();
                if slept > nap + SLOW {
                    tracing::info!(late_ms = (slept - nap).as_secs_f64() * 1e3, "capture: the writer woke late");
                }
            }
            out.flush(&s, true);
        })?;
        Ok(Writer { shared, thread: Mutex::new(Some(thread)) })
    }

    /// Drains `ring` too; `owner` names the provider whose it is.
    pub(crate) fn add(&self, ring: Arc<Ring>, owner: Option<u32>) {
        let tail = ring.tail();
        let mut s = self.shared.sources.lock().unwrap_or_else(|e| e.into_inner());
        s.list.push(Source {
            ring,
            owner,
            scan: tail,
            pending: VecDeque::new(),
            bound: 0,
            closed: false,
            broken: false,
        });
    }

    /// Provider `owner` has gone: its rings are drained and let go.
    pub(crate) fn close_owner(&self, owner: u32) {
        let mut s = self.shared.sources.lock().unwrap_or_else(|e| e.into_inner());
        for src in s.list.iter_mut().filter(|s| s.owner == Some(owner)) {
            src.closed = true;
        }
    }

    /// Frames written, and frames the capture lost (no room in a ring, or not writable).
    pub(crate) fn stats(&self) -> (u64, u64) {
        let s = self.shared.sources.lock().unwrap_or_else(|e| e.into_inner());
        let dropped: u64 = s.list.iter().map(|r| r.ring.dropped()).sum::<u64>() + s.dropped_gone;
        (self.shared.frames.load(Ordering::Relaxed), dropped + self.shared.lost.load(Ordering::Relaxed))
    }

    /// Writes everything the rings hold and stops the thread (the device stops).
    pub(crate) fn finish(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.finish();
    }
}

struct Output {
    file: Sink,
    epoch_mono_ns: u64,
    warned: bool,
}

impl Output {
    /// Counts what a write of the file did: frames written, or lost with its error.
    fn count(&mut self, shared: &Shared, r: Result<u64, (io::Error, u64)>) {
        match r {
            Ok(n) => {
                shared.frames.fetch_add(n, Ordering::Relaxed);
            }
            Err((e, n)) => {
                shared.lost.fetch_add(n, Ordering::Relaxed);
                if !self.warned {
                    self.warned = true;
                    tracing::warn!("capture file: {e}: frames are dropped from the capture");
                }
            }
        }
    }

    /// Writes what is staged (`all`: the last partial block too; see [`Sink::flush`]).
    fn flush(&mut self, shared: &Shared, all: bool) {
        let r = self.file.flush(all);
        self.count(shared, r);
    }
}

impl Shared {
    /// One round: reads every ring, writes what no ring can still precede (everything when
    /// `all`), releases what was written. Says whether it wrote anything.
    fn round(&self, out: &mut Output, all: bool) -> bool {
        let mut guard = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *guard;
        fence(Ordering::SeqCst);
        let now = super::monotonic_ns();
        fence(Ordering::SeqCst);
        let mut watermark = u64::MAX;
        for src in s.list.iter_mut().filter(|s| !s.broken) {
            let busy = src.ring.busy();
            let head = src.ring.head();
            if src.scan_to(head).is_err() {
                self.break_ring(src);
                continue;
            }
            let last = src.pending.back().map_or(0, |r| r.ts);
            let b = match busy {
                _ if src.closed || all => u64::MAX,
                IDLE => now,
                BUSY => last,
                t => t,
            };
            src.bound = src.bound.max(b).max(last).max(now.saturating_sub(STALL_NS));
            if src.closed || all {
                src.bound = u64::MAX;
            }
            watermark = watermark.min(src.bound);
        }
        let wrote = self.write_merged(s, out, watermark);
        self.wrote.fetch_or(wrote, Ordering::Relaxed);
        let dropped: u64 = s.list.iter().map(|r| r.ring.dropped()).sum::<u64>() + s.dropped_gone;
        let before = self.dropped_seen.swap(dropped, Ordering::Relaxed);
        if dropped > before {
            let fill: Vec<u64> = s.list.iter().map(|r| r.ring.head().wrapping_sub(r.ring.tail()) >> 20).collect();
            tracing::info!(
                dropped = dropped - before,
                ?fill,
                "capture: rings were full: frames dropped from the capture"
            );
        }
        // Rings of providers that have gone, once written out.
        let mut gone = 0;
        s.list.retain(|src| {
            let keep = !(src.closed && (src.broken || src.pending.is_empty()));
            if !keep {
                gone += src.ring.dropped();
            }
            keep
        });
        s.dropped_gone += gone;
        wrote
    }

    fn break_ring(&self, src: &mut Source) {
        tracing::warn!(owner = ?src.owner, "a capture ring broke its format: its frames are dropped from the capture");
        self.lost.fetch_add(src.pending.len() as u64 + 1, Ordering::Relaxed);
        src.pending.clear();
        src.broken = true;
        src.ring.release(src.ring.head());
    }

    /// Writes, in time order across rings, every pending frame stamped at or before
    /// `watermark`, in batches repaired in their rings and handed to the file together
    /// (`sink`), and releases the ring space behind them.
    fn write_merged(&self, s: &mut Sources, out: &mut Output, watermark: u64) -> bool {
        let mut wrote = false;
        loop {
            // One batch: the next IOV_BATCH frames in merged order.
            let mut batch: Vec<(usize, Record)> = Vec::new();
            let mut taken = vec![0usize; s.list.len()];
            let mut bytes = 0usize;
            while batch.len() < IOV_BATCH && bytes < BATCH_BYTES {
                let next = (0..s.list.len())
                    .filter_map(|i| s.list[i].pending.get(taken[i]).map(|r| (r.ts, i)))
                    .filter(|&(ts, _)| ts <= watermark)
                    .min();
                let Some((_, i)) = next else { break };
                bytes += s.list[i].pending[taken[i]].caplen;
                batch.push((i, s.list[i].pending[taken[i]]));
                taken[i] += 1;
            }
            if batch.is_empty() {
                // Nothing pending before the watermark: release what parsing passed over (pads);
                // the staged whole blocks go now, the last partial block too once the writer is
                // idle.
                for src in s.list.iter().filter(|s| s.pending.is_empty() && !s.broken) {
                    src.ring.release(src.scan);
                }
                out.flush(self, !wrote);
                return wrote;
            }
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(batch.len());
            for &(i, r) in &batch {
                let rec = s.list[i].ring.pcap_record(&r);
                repair(rec, r.kind, r.ts.saturating_sub(out.epoch_mono_ns));
                slices.push(IoSlice::new(rec));
            }
            let t = std::time::Instant::now();
            let w = out.file.write_batch(&mut slices, batch.len() as u64);
            out.count(self, w);
            // The batch's whole blocks go to the file now, before its ring space is given back:
            // ring space then comes back a batch at a time, as fast as the file takes it, so a
            // producer waiting at its ring's mark sees a slow file as a slow writer, not as a
            // stalled one. (Staged up to the buffer's 4 MiB, a direct write took 25-66 ms on a
            // disk other writers shared, longer than a producer waits before it takes the
            // writer for stalled.)
            out.flush(self, false);
            // Timed with the flush: with O_DIRECT that is where the file's write is.
            if t.elapsed() > SLOW {
                tracing::info!(
                    ms = t.elapsed().as_secs_f64() * 1e3,
                    frames = batch.len(),
                    "capture: a write of the file was slow"
                );
            }
            wrote = true;
            for (i, src) in s.list.iter_mut().enumerate() {
                let mut end = None;
                for _ in 0..taken[i] {
                    end = src.pending.pop_front().map(|r| r.end());
                }
                if let Some(e) = end {
                    src.ring.release(if src.pending.is_empty() { src.scan } else { e });
                }
            }
        }
    }
}

impl Source {
    /// Parses the records between `scan` and `head` into `pending`.
    fn scan_to(&mut self, head: u64) -> Result<(), ring::Broken> {
        if head.wrapping_sub(self.scan) > self.ring.capacity() as u64 {
            return Err(ring::Broken);
        }
        while self.scan != head {
            let r = self.ring.record_at(self.scan, head)?;
            if !r.is_pad() {
                self.pending.push_back(r);
            }
            self.scan = r.end();
        }
        Ok(())
    }
}

/// Fills in the record's time and makes the repairs its kind asks for.
fn repair(rec: &mut [u8], kind: u32, t_ns: u64) {
    let secs = u32::try_from(t_ns / 1_000_000_000).unwrap_or(u32::MAX);
    rec[0..4].copy_from_slice(&secs.to_le_bytes());
    rec[4..8].copy_from_slice(&((t_ns % 1_000_000_000) as u32).to_le_bytes());
    let frame = &mut rec[PCAP_HDR..];
    let l3 = ethernet::HEADER_LEN;
    if kind & ring::FIX_IPV4_ID != 0 {
        let l4 = l3 + ipv4::HEADER_LEN;
        let body = l4 + udp::HEADER_LEN;
        if frame.len() >= body + icrc::LEN {
            let (hdr, payload) = frame.split_at_mut(body);
            if let Some(id) = icrc::solve_ipv4_id(&hdr[l3..], payload) {
                let mut ip = Ipv4Packet::new_unchecked(&mut hdr[l3..l4]);
                ip.set_ident(id);
                ip.fill_checksum();
            }
        }
    }
    if kind & ring::FIX_UDP6 != 0 {
        let l4 = l3 + ipv6::HEADER_LEN;
        if frame.len() >= l4 + udp::HEADER_LEN {
            let (hdr, rest) = frame.split_at_mut(l4);
            let ip = Ipv6Packet::new_unchecked(&hdr[l3..]);
            let (s6, d6) = (ip.src_addr(), ip.dst_addr());
            UdpPacket::new_unchecked(rest).fill_checksum_v6(s6, d6);
        }
    }
}
