//! QP numbers: which QPN an engine gives a new QP.
//!
//! A QPN is 24 bits; QP0 and QP1 are the special QPs and 0xFFFFFF is the multicast QPN (IBTA
//! 10.2.4.1, 10.5.2.1). New QPNs start at a random point above QP1 and go on cyclically, as an
//! HCA's do. When a device's UDP port is steered (docs/architecture.md D2: each client process that
//! runs its own QPs gets the datagrams for its QPs from the kernel, `softrdma_transport::steer`),
//! the QPN space is shared among the daemon's engine and the client processes' engines by blocks of
//! 2^12: the daemon reserves a block for each such process ([`Device::reserve_qpn_block`]) and
//! never allocates from it; the process's engine allocates only from its blocks
//! ([`Device::restrict_qpns_to`]).

use super::Device;
use crate::memory::Memory;
use crate::verbs::VerbsError;
use crate::wire::Qpn;

/// QPNs come in blocks of 2^12 when a device's port is steered (a block is the unit that steers
/// to one process; `softrdma_transport::steer`).
pub const QPN_BLOCK_SHIFT: u32 = 12;

/// The block of a QPN.
pub fn qpn_block(qpn: u32) -> u32 {
    (qpn & Qpn::MASK) >> QPN_BLOCK_SHIFT
}

/// Which QPNs an engine runs, when a steered port shares a device's QPN space among processes.
#[derive(Debug, Default)]
pub(crate) struct QpnSpace {
    /// QPN blocks ([`QPN_BLOCK_SHIFT`]) this engine may not allocate from (the daemon's: the
    /// blocks given to client processes that run their own QPs).
    reserved: std::collections::BTreeSet<u32>,
    /// The only QPN blocks this engine allocates from (a client process's share); `None`: the
    /// whole QPN space.
    only: Option<Vec<u32>>,
}

impl QpnSpace {
    /// Whether `qpn` is one this engine runs.
    pub(crate) fn owns(&self, qpn: u32) -> bool {
        let b = qpn_block(qpn);
        match &self.only {
            Some(blocks) => blocks.contains(&b),
            None => !self.reserved.contains(&b),
        }
    }
}

impl<M: Memory> Device<M> {
    /// A free QPN (random start, never 0 or 1, as hardware), outside the reserved blocks and,
    /// when the device has only some blocks, inside them (ENOMEM when they are full).
    pub(super) fn alloc_qpn(&mut self) -> Result<Qpn, VerbsError> {
        if self.qps.len() >= self.config.limits.max_qp as usize {
            return Err(VerbsError::NoMem);
        }
        if let Some(blocks) = &self.qpns.only {
            let span = blocks.len() << QPN_BLOCK_SHIFT;
            let at = |i: usize| {
                (blocks[i >> QPN_BLOCK_SHIFT] << QPN_BLOCK_SHIFT) | (i as u32 & ((1 << QPN_BLOCK_SHIFT) - 1))
            };
            // Resume after the last QPN handed out (its index among the blocks' QPNs).
            let start = (0..span).find(|&i| at(i) == self.next_qpn).unwrap_or(0);
            for k in 0..span {
                let q = at((start + k) % span);
                if q >= 0x11 && q != Qpn::MASK && !self.qps.contains_key(&Qpn::new(q)) {
                    self.next_qpn = at((start + k + 1) % span);
                    return Ok(Qpn::new(q));
                }
            }
            return Err(VerbsError::NoMem);
        }
        Ok(loop {
            let q = Qpn::new(self.next_qpn);
            self.next_qpn = (self.next_qpn + 1) & Qpn::MASK;
            if self.next_qpn < 0x11 {
                self.next_qpn = 0x11;
            }
            if self.qpns.reserved.contains(&qpn_block(q.value())) {
                // Skip the rest of a block that is someone else's.
                self.next_qpn = ((qpn_block(q.value()) + 1) << QPN_BLOCK_SHIFT) & Qpn::MASK;
                continue;
            }
            if q.value() >= 0x11 && !self.qps.contains_key(&q) {
                break q;
            }
        })
    }

    /// Keeps QPN block `block` out of this device's allocation (its port steers that block to
    /// another process, which runs those QPs). `false`, and nothing reserved, if a QP of this
    /// device already has a QPN there, or the block is 0 (QP0/QP1) or the last (multicast).
    pub fn reserve_qpn_block(&mut self, block: u32) -> bool {
        let last = Qpn::MASK >> QPN_BLOCK_SHIFT;
        if block == 0 || block >= last || self.qps.keys().any(|q| qpn_block(q.value()) == block) {
            return false;
        }
        self.qpns.reserved.insert(block);
        true
    }

    /// Gives a reserved block back to this device's allocation.
    pub fn release_qpn_block(&mut self, block: u32) {
        self.qpns.reserved.remove(&block);
    }

    /// Makes this device allocate QPNs only from `blocks` (a client process's share of a steered
    /// port; see [`Device::reserve_qpn_block`] for the other side), cyclically from `first` (the
    /// daemon's cursor of the block, so that a process given a block its predecessor used does
    /// not reuse that one's QPNs at once: a peer's CM still holds those in timewait and would
    /// reject a new connection from them as stale, REJ 10, IBTA 12.9.8.3.1). A `first` outside
    /// the blocks starts at the first block's beginning.
    pub fn restrict_qpns_to(&mut self, blocks: Vec<u32>, first: u32) {
        if blocks.contains(&qpn_block(first)) {
            self.next_qpn = first & Qpn::MASK;
        } else if let Some(&b) = blocks.first() {
            self.next_qpn = b << QPN_BLOCK_SHIFT;
        }
        self.qpns.only = Some(blocks);
    }

    /// The QPN the allocator looks at first for the next QP (cyclic allocation).
    pub fn next_qpn(&self) -> u32 {
        self.next_qpn
    }

    /// Whether `qpn` is one this device allocates (in its blocks, or not in a reserved block).
    pub fn owns_qpn(&self, qpn: u32) -> bool {
        self.qpns.owns(qpn)
    }
}
