//! Fault injection on a device's transmit path (wire and internal loopback alike): the device's
//! side of the shared fault model ([`softrdma_transport::faults`], which holds the rates, the
//! `--faults` spec syntax and the sampler). Here: the seeded generator, the copies of each packet
//! to deliver and when, and the counts of what was injected; the queue of delayed packets is the
//! device's ([`crate::hca`]).
//!
//! Spec syntax (`--faults`): comma-separated `key=value`, e.g.
//! `loss=0.01,duplicate=0.01,reorder=0.02,corrupt=0.001,delay=2ms,seed=7` (see
//! [`softrdma_transport::faults`] for every key; `dup` still works for `duplicate`).

use softrdma_engine::rng::Rng;
use softrdma_engine::time::Instant;
pub use softrdma_transport::faults::Faults;

/// One copy of a packet to deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    /// When (now, or later for delayed and reordered copies).
    pub at: Instant,
    /// Flip this bit (an index into the packet's bits) first.
    pub flip_bit: Option<usize>,
}

/// Counts of what was injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Dropped.
    pub dropped: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Reordered.
    pub reordered: u64,
    /// Corrupted.
    pub corrupted: u64,
}

/// Decides each packet's faults, with the shared sampler ([`Faults::sample`]), from a generator
/// seeded by [`Faults::seed`].
///
/// Both copies of a duplicated packet carry the same (possibly corrupted) bytes and leave at the
/// same time; a reordered packet (both copies, if duplicated) leaves `reorder_delay` late, and
/// every packet `delay` late.
#[derive(Debug)]
pub struct FaultInjector {
    faults: Faults,
    rng: Rng,
    /// What was injected so far.
    pub counts: FaultCounts,
}

impl FaultInjector {
    /// An injector for `faults`.
    pub fn new(faults: Faults) -> FaultInjector {
        FaultInjector { rng: Rng::new(faults.seed), faults, counts: FaultCounts::default() }
    }

    /// What it injects.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Whether it injects anything at all.
    pub fn is_active(&self) -> bool {
        self.faults.is_active()
    }

    /// The copies of `packet` (BTH first) sent at `now` (none: dropped).
    pub fn decide(&mut self, now: Instant, packet: &[u8], out: &mut Vec<Copy>) {
        out.clear();
        if !self.is_active() {
            out.push(Copy { at: now, flip_bit: None });
            return;
        }
        let s = self.faults.sample(&mut self.rng, packet);
        if s.lost {
            self.counts.dropped += 1;
            return;
        }
        self.counts.corrupted += u64::from(s.flip_bit.is_some());
        self.counts.duplicated += u64::from(s.duplicate);
        self.counts.reordered += u64::from(s.reordered);
        let copy = Copy { at: now + self.faults.added_delay(&s), flip_bit: s.flip_bit };
        out.push(copy);
        if s.duplicate {
            out.push(copy);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_engine::time::Duration;
    use softrdma_engine::wire::Opcode;

    fn packet(op: Opcode, len: usize) -> Vec<u8> {
        let mut p = vec![0; len];
        p[0] = op.0;
        p
    }

    #[test]
    fn rates_are_close_to_the_spec() {
        let mut f = FaultInjector::new("loss=0.1,duplicate=0.05,corrupt=0.02,seed=3".parse().unwrap());
        let mut out = Vec::new();
        let p = packet(Opcode::RC_SEND_ONLY, 100);
        let (mut delivered, n) = (0usize, 100_000);
        for _ in 0..n {
            f.decide(Instant::ZERO, &p, &mut out);
            delivered += out.len();
            assert!(out.iter().all(|c| c.flip_bit.is_none_or(|b| b < 800)));
        }
        let c = f.counts;
        assert!((9_000..11_000).contains(&c.dropped), "{c:?}");
        assert!((4_000..5_000).contains(&c.duplicated), "{c:?}");
        assert!((1_500..2_500).contains(&c.corrupted), "{c:?}");
        assert_eq!(delivered as u64, n - c.dropped + c.duplicated);
        let mut none = FaultInjector::new(Faults::default());
        none.decide(Instant(5), &p, &mut out);
        assert_eq!(out, vec![Copy { at: Instant(5), flip_bit: None }]);
    }

    #[test]
    fn delay_and_reorder_delay_add_up_and_duplicates_are_alike() {
        let mut f = FaultInjector::new("duplicate=1,reorder=1,reorder_delay=3us,delay=2us,corrupt=1".parse().unwrap());
        let mut out = Vec::new();
        f.decide(Instant(10), &packet(Opcode::RC_SEND_ONLY, 64), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], out[1]);
        assert_eq!(out[0].at, Instant(10) + Duration::from_micros(5));
        assert!(out[0].flip_bit.is_some());
        assert_eq!((f.counts.duplicated, f.counts.reordered, f.counts.corrupted), (1, 1, 1));
    }

    #[test]
    fn ack_loss_applies_to_acks_alone() {
        let mut out = Vec::new();
        let (ack, send) = (packet(Opcode::RC_ACKNOWLEDGE, 64), packet(Opcode::RC_SEND_ONLY, 64));
        // Everything but acknowledgements is lost; every acknowledgement survives.
        let mut f = FaultInjector::new("loss=1,ack_loss=0".parse().unwrap());
        for _ in 0..1000 {
            f.decide(Instant::ZERO, &ack, &mut out);
            assert_eq!(out.len(), 1);
            f.decide(Instant::ZERO, &send, &mut out);
            assert!(out.is_empty());
        }
        // Only acknowledgements are lost (an injector with ack_loss alone is active).
        let mut f = FaultInjector::new("ack_loss=1".parse().unwrap());
        assert!(f.is_active());
        f.decide(Instant::ZERO, &ack, &mut out);
        assert!(out.is_empty());
        f.decide(Instant::ZERO, &send, &mut out);
        assert_eq!(out.len(), 1);
        // Without ack_loss, loss covers acknowledgements too.
        let mut f = FaultInjector::new("loss=1".parse().unwrap());
        f.decide(Instant::ZERO, &ack, &mut out);
        assert!(out.is_empty());
        assert_eq!(f.counts.dropped, 1);
    }
}
