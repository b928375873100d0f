//! Fault injection on a device's transmit path (wire and internal loopback alike): loss,
//! duplication, reordering, corruption and delay, from a seeded generator.
//!
//! Spec syntax (`--faults`): comma-separated `key=value`, e.g.
//! `loss=0.01,dup=0.01,reorder=0.02,corrupt=0.001,delay=2ms,seed=7`. `reorder` holds a packet back
//! by `reorder_delay` (default 1 ms) so later ones overtake it; `delay` delays every packet.
//! `ack_loss` is the loss rate of ACK/NAK packets alone (default: `loss`): `ack_loss=0` keeps every
//! acknowledgement, for programs that end without a closing handshake (see [`FaultSpec::ack_loss`]).

use softrdma_engine::rng::Rng;
use softrdma_engine::time::{Duration, Instant};

/// What to inject.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultSpec {
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability an ACK or NAK (the ACKNOWLEDGE opcode, RC or XRC) is dropped; `None`: `loss`.
    ///
    /// An RC responder's last ACK is the one loss no transport can repair once the program on the
    /// responder's side has destroyed its QP: the requester resends into a QP that no longer
    /// exists, which drops them silently (IBTA 9.6, transport header checks), until its retry
    /// count runs out. Programs such as ibv_rc_pingpong and ibv_srq_pingpong end without a closing
    /// handshake, so under `loss` their peer may end with RETRY_EXC_ERR (or, on Linux's rxe, which
    /// reads retry_cnt 7 as "retry forever", never end); `ack_loss=0` tests them under loss of
    /// everything else.
    pub ack_loss: Option<f64>,
    /// Probability a packet is sent twice.
    pub dup: f64,
    /// Probability a packet is held back by `reorder_delay`.
    pub reorder: f64,
    /// How long a reordered packet is held back.
    pub reorder_delay: Duration,
    /// Probability one bit of the packet is flipped (the receiver's ICRC check must catch it).
    pub corrupt: f64,
    /// Delay added to every packet.
    pub delay: Duration,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for FaultSpec {
    fn default() -> FaultSpec {
        FaultSpec {
            loss: 0.0,
            ack_loss: None,
            dup: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_millis(1),
            corrupt: 0.0,
            delay: Duration::ZERO,
            seed: 1,
        }
    }
}

/// A spec that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "bad --faults spec {spec:?}: {why} (expected e.g. loss=0.01,dup=0.01,reorder=0.01,corrupt=0.001,delay=1ms,seed=7)"
)]
pub struct FaultSpecError {
    spec: String,
    why: String,
}

fn parse_duration(v: &str) -> Option<Duration> {
    let (num, mul) = if let Some(n) = v.strip_suffix("us") {
        (n, 1_000.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1_000_000.0)
    } else if let Some(n) = v.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e9)
    } else {
        return None;
    };
    let x: f64 = num.parse().ok()?;
    (x.is_finite() && x >= 0.0 && x * mul < 60e9).then(|| Duration::from_nanos((x * mul) as u64))
}

impl std::str::FromStr for FaultSpec {
    type Err = FaultSpecError;
    fn from_str(s: &str) -> Result<FaultSpec, FaultSpecError> {
        let err = |why: String| FaultSpecError { spec: s.to_owned(), why };
        let mut f = FaultSpec::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| err(format!("{part:?} is not key=value")))?;
            let prob = || -> Result<f64, FaultSpecError> {
                v.parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| err(format!("{k}={v}: a probability in 0..=1")))
            };
            match k {
                "loss" => f.loss = prob()?,
                "ack_loss" => f.ack_loss = Some(prob()?),
                "dup" | "duplicate" => f.dup = prob()?,
                "reorder" => f.reorder = prob()?,
                "corrupt" => f.corrupt = prob()?,
                "delay" => f.delay = parse_duration(v).ok_or_else(|| err(format!("delay={v}: e.g. 500us or 2ms")))?,
                "reorder_delay" => {
                    f.reorder_delay = parse_duration(v).ok_or_else(|| err(format!("reorder_delay={v}: e.g. 1ms")))?
                }
                "seed" => f.seed = v.parse().map_err(|_| err(format!("seed={v}: an integer")))?,
                _ => return Err(err(format!("unknown key {k:?}"))),
            }
        }
        Ok(f)
    }
}

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

/// Decides each packet's fate.
#[derive(Debug)]
pub struct FaultInjector {
    spec: FaultSpec,
    rng: Rng,
    /// What was injected so far.
    pub counts: FaultCounts,
}

impl FaultInjector {
    /// An injector for a spec.
    pub fn new(spec: FaultSpec) -> FaultInjector {
        FaultInjector { rng: Rng::new(spec.seed), spec, counts: FaultCounts::default() }
    }

    /// Whether it injects anything at all.
    pub fn is_active(&self) -> bool {
        let s = &self.spec;
        s.loss > 0.0
            || s.ack_loss.is_some_and(|p| p > 0.0)
            || s.dup > 0.0
            || s.reorder > 0.0
            || s.corrupt > 0.0
            || s.delay > Duration::ZERO
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// The copies of a `len`-byte packet sent at `now` (none: dropped); `is_ack`: an ACK or NAK.
    pub fn decide(&mut self, now: Instant, len: usize, is_ack: bool, out: &mut Vec<Copy>) {
        out.clear();
        if !self.is_active() {
            out.push(Copy { at: now, flip_bit: None });
            return;
        }
        let loss = if is_ack { self.spec.ack_loss.unwrap_or(self.spec.loss) } else { self.spec.loss };
        if self.chance(loss) {
            self.counts.dropped += 1;
            return;
        }
        let n = if self.chance(self.spec.dup) {
            self.counts.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..n {
            let mut at = now + self.spec.delay;
            if self.chance(self.spec.reorder) {
                self.counts.reordered += 1;
                at += self.spec.reorder_delay;
            }
            let flip_bit = (len > 0 && self.chance(self.spec.corrupt)).then(|| {
                self.counts.corrupted += 1;
                self.rng.below(len as u64 * 8) as usize
            });
            out.push(Copy { at, flip_bit });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let f: FaultSpec = "loss=0.01, dup=0.02,reorder=0.5,corrupt=0.001,delay=2ms,seed=9".parse().unwrap();
        assert_eq!(f.loss, 0.01);
        assert_eq!(f.dup, 0.02);
        assert_eq!(f.delay, Duration::from_millis(2));
        assert_eq!(f.seed, 9);
        assert_eq!(f.ack_loss, None);
        assert_eq!("loss=0.1,ack_loss=0".parse::<FaultSpec>().unwrap().ack_loss, Some(0.0));
        assert_eq!("".parse::<FaultSpec>().unwrap(), FaultSpec::default());
        for bad in ["loss=2", "ack_loss=1.5", "loss", "jitter=1", "delay=5", "seed=x", "loss=-0.1", "delay=1e99s"] {
            assert!(bad.parse::<FaultSpec>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn rates_are_close_to_the_spec() {
        let mut f = FaultInjector::new("loss=0.1,dup=0.05,corrupt=0.02,seed=3".parse().unwrap());
        let mut out = Vec::new();
        let (mut delivered, n) = (0usize, 100_000);
        for _ in 0..n {
            f.decide(Instant::ZERO, 100, false, &mut out);
            delivered += out.len();
            assert!(out.iter().all(|c| c.flip_bit.is_none_or(|b| b < 800)));
        }
        let c = f.counts;
        assert!((9_000..11_000).contains(&c.dropped), "{c:?}");
        assert!((4_000..5_000).contains(&c.duplicated), "{c:?}");
        assert!((1_500..2_500).contains(&c.corrupted), "{c:?}");
        assert_eq!(delivered as u64, n - c.dropped + c.duplicated);
        let mut none = FaultInjector::new(FaultSpec::default());
        none.decide(Instant(5), 10, false, &mut out);
        assert_eq!(out, vec![Copy { at: Instant(5), flip_bit: None }]);
    }

    #[test]
    fn ack_loss_applies_to_acks_alone() {
        let mut out = Vec::new();
        // Everything but acknowledgements is lost; every acknowledgement survives.
        let mut f = FaultInjector::new("loss=1,ack_loss=0".parse().unwrap());
        for _ in 0..1000 {
            f.decide(Instant::ZERO, 64, true, &mut out);
            assert_eq!(out.len(), 1);
            f.decide(Instant::ZERO, 64, false, &mut out);
            assert!(out.is_empty());
        }
        // Only acknowledgements are lost (an injector with ack_loss alone is active).
        let mut f = FaultInjector::new("ack_loss=1".parse().unwrap());
        assert!(f.is_active());
        f.decide(Instant::ZERO, 64, true, &mut out);
        assert!(out.is_empty());
        f.decide(Instant::ZERO, 64, false, &mut out);
        assert_eq!(out.len(), 1);
        // Without ack_loss, loss covers acknowledgements too.
        let mut f = FaultInjector::new("loss=1".parse().unwrap());
        f.decide(Instant::ZERO, 64, true, &mut out);
        assert!(out.is_empty());
        assert_eq!(f.counts.dropped, 1);
    }
}
