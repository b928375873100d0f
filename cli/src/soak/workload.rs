//! The soak's workload: what operation k of QP q is, derived from the seed alone, so the
//! requester that posts it and the responder that checks it agree without talking; and what the
//! workers count.

use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// The workload: what operation k of QP q is, derived from the seed alone (both sides agree).

/// splitmix64: the operation of any (stream, index) without stepping through the ones before.
pub(super) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
    AtomicWrite,
}

impl Kind {
    /// It takes a receive at the responder.
    pub(super) fn consumes_recv(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::WriteImm)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Op {
    pub(super) kind: Kind,
    pub(super) len: usize,
    /// READ: where in the responder's read area.
    pub(super) offset: usize,
    /// Atomics: the add, the swap value, the value written.
    pub(super) value: u64,
}

/// The stream of one QP: `stream` names (seed, pair generation, QP index).
#[derive(Debug, Clone, Copy)]
pub(super) struct Workload {
    pub(super) stream: u64,
    pub(super) max: usize,
}

impl Workload {
    pub(super) fn new(seed: u64, generation: u64, qp: usize, max: usize) -> Workload {
        Workload { stream: mix(mix(seed ^ 0x50a4) ^ mix(generation << 8 | qp as u64)), max }
    }

    /// Sizes from 0 to max, most of them small, as real traffic is.
    pub(super) fn size(&self, r: u64) -> usize {
        let m = self.max;
        let pick = |lo: usize, hi: usize| {
            let hi = hi.min(m);
            let lo = lo.min(hi);
            lo + ((r >> 8) as usize) % (hi - lo + 1)
        };
        match r % 100 {
            0..=4 => 0,
            5..=29 => pick(1, 64),
            30..=64 => pick(65, 4096),
            65..=89 => pick(4097, 65536),
            _ => pick(65537, m),
        }
    }

    pub(super) fn op(&self, k: u64) -> Op {
        let r = mix(self.stream ^ k.wrapping_mul(0xd6e8_feb8_6659_fd93));
        let r2 = mix(r);
        let kind = match r % 16 {
            0..=3 => Kind::Send,
            4..=5 => Kind::SendImm,
            6..=7 => Kind::Write,
            8..=9 => Kind::WriteImm,
            10..=11 => Kind::Read,
            12 => Kind::FetchAdd,
            13 => Kind::CmpSwap,
            14 => Kind::AtomicWrite,
            _ => Kind::Send,
        };
        let len = match kind {
            Kind::FetchAdd | Kind::CmpSwap | Kind::AtomicWrite => 8,
            _ => self.size(r2),
        };
        let offset = if kind == Kind::Read { (mix(r2) as usize) % (self.max - len + 1) } else { 0 };
        Op { kind, len, offset, value: mix(r2 ^ 0xa7) }
    }

    /// The bytes of message k: its index (little-endian, as much of it as fits), then a pattern.
    pub(super) fn content(&self, k: u64, buf: &mut [u8]) {
        let head = k.to_le_bytes();
        let n = buf.len().min(8);
        buf[..n].copy_from_slice(&head[..n]);
        fill(&mut buf[n..], self.stream ^ k);
    }

    /// The message index a received buffer names, if it is long enough to name one.
    pub(super) fn named(buf: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(buf.get(..8)?.try_into().ok()?))
    }

    /// The responder's READ area of this QP.
    pub(super) fn read_area(&self, buf: &mut [u8]) {
        fill(buf, !self.stream);
    }
}

pub(super) fn fill(buf: &mut [u8], seed: u64) {
    let mut x = mix(seed) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// A worker's findings on stderr: the first 20 of them (the counts say how many there were).
macro_rules! note {
    ($($arg:tt)*) => {{
        static SAID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        if SAID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 20 {
            eprintln!($($arg)*);
        }
    }};
}

pub(super) fn imm_of(k: u64) -> u32 {
    k as u32 ^ 0x5eed_0000
}

// ---------------------------------------------------------------------------------------------
// What the workers report.

/// One worker's findings (the requester's and the responder's add up).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(super) struct Tally {
    /// Reliable messages checked (received and matched, or completed and verified).
    pub(super) messages: u64,
    pub(super) bytes: u64,
    pub(super) lost: u64,
    pub(super) duplicated: u64,
    pub(super) corrupted: u64,
    pub(super) wrong_status: u64,
    /// Completions out of posting order, or for a request never posted.
    pub(super) misordered: u64,
    /// Work requests still without a completion when the drain ended.
    pub(super) unfinished: u64,
    /// Completions with an error status after the peer died (allowed ones).
    pub(super) flushed: u64,
    pub(super) ud_sent: u64,
    pub(super) ud_received: u64,
    pub(super) ud_duplicated: u64,
}

impl Tally {
    pub(super) fn add(&mut self, o: &Tally) {
        let Tally {
            messages,
            bytes,
            lost,
            duplicated,
            corrupted,
            wrong_status,
            misordered,
            unfinished,
            flushed,
            ud_sent,
            ud_received,
            ud_duplicated,
        } = o;
        self.messages += messages;
        self.bytes += bytes;
        self.lost += lost;
        self.duplicated += duplicated;
        self.corrupted += corrupted;
        self.wrong_status += wrong_status;
        self.misordered += misordered;
        self.unfinished += unfinished;
        self.flushed += flushed;
        self.ud_sent += ud_sent;
        self.ud_received += ud_received;
        self.ud_duplicated += ud_duplicated;
    }

    pub(super) fn violations(&self) -> u64 {
        self.lost + self.duplicated + self.corrupted + self.wrong_status + self.misordered + self.unfinished
    }
}
