//! The one fault model: the rates of the faults a wire inflicts on datagrams ([`Faults`]), the
//! `--faults` spec string that names them, the sampler that decides each datagram's faults from a
//! seeded generator ([`Faults::sample`]), and the single decision a scripted wire makes about one
//! datagram ([`Fate`]).
//!
//! Both wires use it: the simulated wire ([`crate::sim`]) and a device's transmit path (the
//! `softrdma-device` crate's fault injector, `softrdma up --faults`). Each keeps only what is its
//! own: the simulator adds [partitions](crate::sim::Partition) and the link model, the device its
//! queue of delayed packets.
//!
//! # Spec syntax
//!
//! Comma-separated `key=value` pairs, e.g.
//! `loss=0.01,duplicate=0.01,reorder=0.02,corrupt=0.001,delay=2ms,seed=7`:
//!
//! | key             | value            | field                     |
//! |-----------------|------------------|---------------------------|
//! | `loss`          | probability      | [`Faults::loss`]          |
//! | `ack_loss`      | probability      | [`Faults::ack_loss`]      |
//! | `duplicate`     | probability      | [`Faults::duplicate`]     |
//! | `reorder`       | probability      | [`Faults::reorder`]       |
//! | `reorder_delay` | duration         | [`Faults::reorder_delay`] |
//! | `corrupt`       | probability      | [`Faults::corrupt`]       |
//! | `delay`         | duration         | [`Faults::delay`]         |
//! | `seed`          | unsigned integer | [`Faults::seed`]          |
//!
//! A probability is in `0..=1`; a duration is a number with `ns`, `us`, `ms` or `s`. `dup` is
//! accepted as an alias of `duplicate` (older command lines use it); `duplicate` is the name
//! everything else (flags, JSON, docs, [`Display`](std::fmt::Display)) uses. An empty spec, or
//! `none`, is [`Faults::default`]: no faults.

use std::fmt;

use rand::RngExt;
use softrdma_engine::rng::Rng;
use softrdma_engine::time::Duration;
use softrdma_engine::wire::{OpKind, Opcode};

/// The faults a wire inflicts, each decided per datagram by [`Faults::sample`].
///
/// Probabilities are compared against a uniform draw in `[0, 1)`: `0.0` never fires, `1.0`
/// always does, values above 1 act as 1 and negative values or NaN as 0 (the spec parser accepts
/// only `0..=1`). The default injects nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that an ACK or NAK (the ACKNOWLEDGE opcode, RC or XRC) is dropped; `None`:
    /// `loss`.
    ///
    /// An RC responder's last ACK is the one loss no transport can repair once the program on the
    /// responder's side has destroyed its QP: the requester resends into a QP that no longer
    /// exists, which drops them silently (IBTA 9.6, transport header checks), until its retry
    /// count runs out. Programs such as ibv_rc_pingpong and ibv_srq_pingpong end without a closing
    /// handshake, so under `loss` their peer may end with RETRY_EXC_ERR (or, on Linux's rxe, which
    /// reads retry_cnt 7 as "retry forever", never end); `ack_loss=0` tests them under loss of
    /// everything else.
    pub ack_loss: Option<f64>,
    /// Probability that a datagram is delivered twice (both copies carry the same, possibly
    /// corrupted, bytes and the same delay; the simulator's second copy arrives
    /// [`DUPLICATE_GAP`](crate::sim::DUPLICATE_GAP) after the first).
    pub duplicate: f64,
    /// Probability that a datagram is held back by `reorder_delay`, letting later ones overtake it.
    pub reorder: f64,
    /// How long a reordered datagram is held back.
    pub reorder_delay: Duration,
    /// Probability that one uniformly chosen bit of the datagram is flipped. The receiver is not
    /// told: it must find out through the ICRC.
    pub corrupt: f64,
    /// Delay added to every datagram (on the simulator: on top of the link's latency).
    pub delay: Duration,
    /// Seed of the generator a device's injector draws from. The simulator ignores it: it draws
    /// from the one generator seeded by [`Sim::new`](crate::sim::Sim::new)'s `seed`.
    pub seed: u64,
}

impl Default for Faults {
    /// No faults; a reordered datagram (should `reorder` be set) is held back 1 ms; seed 1.
    fn default() -> Faults {
        Faults {
            loss: 0.0,
            ack_loss: None,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_millis(1),
            corrupt: 0.0,
            delay: Duration::ZERO,
            seed: 1,
        }
    }
}

/// What a scripted wire does with one datagram (a conformance test's filter decides it, one
/// datagram at a time; [`Faults::sample`] draws a combination of these at random instead). The
/// engine defines it, so that its own tests (the CM's) script the same outcomes.
pub use softrdma_engine::fault::Fate;

/// The faults [`Faults::sample`] drew for one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Dropped: nothing is delivered and nothing else was drawn.
    pub lost: bool,
    /// Flip this bit (an index into the datagram's bits) before delivering it.
    pub flip_bit: Option<usize>,
    /// Deliver it twice.
    pub duplicate: bool,
    /// Hold it back by [`Faults::reorder_delay`].
    pub reordered: bool,
}

/// A source of the uniform draws [`Faults::sample`] makes: implemented for the simulator's
/// ChaCha generator and for the engine's small generator the device uses.
pub trait FaultRng {
    /// A uniform draw in `[0, 1)`.
    fn unit(&mut self) -> f64;
    /// A uniform draw in `[0, n)`; `n > 0`.
    fn index(&mut self, n: usize) -> usize;
}

impl FaultRng for rand_chacha::ChaCha8Rng {
    fn unit(&mut self) -> f64 {
        self.random::<f64>()
    }
    fn index(&mut self, n: usize) -> usize {
        self.random_range(0..n)
    }
}

impl FaultRng for Rng {
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
}

/// Whether a RoCE datagram (its BTH first) is an ACK or NAK: the ACKNOWLEDGE opcode, RC or XRC.
pub fn is_ack(datagram: &[u8]) -> bool {
    datagram.first().and_then(|&op| Opcode(op).info()).is_some_and(|i| i.kind == OpKind::Acknowledge)
}

impl Faults {
    /// No faults at all (the same as `Faults::default()`).
    pub fn none() -> Faults {
        Faults::default()
    }

    /// Whether any fault can fire (or every datagram is delayed).
    pub fn is_active(&self) -> bool {
        self.loss > 0.0
            || self.ack_loss.is_some_and(|p| p > 0.0)
            || self.duplicate > 0.0
            || self.reorder > 0.0
            || self.corrupt > 0.0
            || self.delay > Duration::ZERO
    }

    /// Draws the faults of one datagram (a RoCE datagram, BTH first, for [`Faults::ack_loss`])
    /// from `rng`, always in this order, which every seeded run depends on:
    /// 1. loss (`ack_loss` for an ACK or NAK when set, else `loss`); if lost, nothing more;
    /// 2. corruption, then the bit to flip if the datagram is not empty;
    /// 3. duplication;
    /// 4. reordering.
    ///
    /// Each of the four is drawn even when its probability is 0.
    pub fn sample(&self, rng: &mut impl FaultRng, datagram: &[u8]) -> Sample {
        let loss = match self.ack_loss {
            Some(ack_loss) if is_ack(datagram) => ack_loss,
            _ => self.loss,
        };
        if rng.unit() < loss {
            return Sample { lost: true, ..Sample::default() };
        }
        let len = datagram.len();
        let flip_bit = if rng.unit() < self.corrupt && len > 0 { Some(rng.index(len * 8)) } else { None };
        let duplicate = rng.unit() < self.duplicate;
        let reordered = rng.unit() < self.reorder;
        Sample { lost: false, flip_bit, duplicate, reordered }
    }

    /// How much later than without faults a datagram with faults `s` is delivered: `delay`, plus
    /// `reorder_delay` if it was reordered.
    pub fn added_delay(&self, s: &Sample) -> Duration {
        if s.reordered {
            Duration(self.delay.0.saturating_add(self.reorder_delay.0))
        } else {
            self.delay
        }
    }
}

/// Flips bit `bit` of `bytes` (bit 0 is the low bit of byte 0).
pub fn flip_bit(bytes: &mut [u8], bit: usize) {
    bytes[bit / 8] ^= 1 << (bit % 8);
}

/// A spec that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "bad --faults spec {spec:?}: {why} (expected e.g. loss=0.01,duplicate=0.01,reorder=0.01,corrupt=0.001,delay=1ms,seed=7)"
)]
pub struct FaultsError {
    spec: String,
    why: String,
}

/// A duration with a unit: `500ns`, `20us`, `2ms`, `0.5s` (under a minute).
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

impl std::str::FromStr for Faults {
    type Err = FaultsError;
    fn from_str(s: &str) -> Result<Faults, FaultsError> {
        let err = |why: String| FaultsError { spec: s.to_owned(), why };
        let mut f = Faults::default();
        if s.trim() == "none" {
            return Ok(f);
        }
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| err(format!("{part:?} is not key=value")))?;
            let prob = |key: &str| -> Result<f64, FaultsError> {
                v.parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| err(format!("{key}={v}: a probability in 0..=1")))
            };
            match k {
                "loss" => f.loss = prob("loss")?,
                "ack_loss" => f.ack_loss = Some(prob("ack_loss")?),
                // `dup`: the older spelling, still accepted.
                "duplicate" | "dup" => f.duplicate = prob("duplicate")?,
                "reorder" => f.reorder = prob("reorder")?,
                "corrupt" => f.corrupt = prob("corrupt")?,
                "delay" => f.delay = parse_duration(v).ok_or_else(|| err(format!("delay={v}: e.g. 500us or 2ms")))?,
                "reorder_delay" => {
                    f.reorder_delay = parse_duration(v).ok_or_else(|| err(format!("reorder_delay={v}: e.g. 1ms")))?
                }
                "seed" => f.seed = v.parse().map_err(|_| err(format!("seed={v}: an integer")))?,
                _ => {
                    return Err(err(format!(
                        "unknown key {k:?} (known: loss, ack_loss, duplicate, reorder, reorder_delay, corrupt, delay, seed)"
                    )))
                }
            }
        }
        Ok(f)
    }
}

/// A duration in the spec's syntax, exactly (nanoseconds unless a larger unit divides it).
fn fmt_duration(d: Duration) -> String {
    let ns = d.0;
    if ns != 0 && ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns != 0 && ns % 1_000 == 0 {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

impl fmt::Display for Faults {
    /// The spec string that parses back to these faults, naming only what differs from the
    /// default (`none` for the default itself), with the canonical key names.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = Faults::default();
        let mut parts = Vec::new();
        if self.loss != d.loss {
            parts.push(format!("loss={}", self.loss));
        }
        if let Some(p) = self.ack_loss {
            parts.push(format!("ack_loss={p}"));
        }
        if self.duplicate != d.duplicate {
            parts.push(format!("duplicate={}", self.duplicate));
        }
        if self.reorder != d.reorder {
            parts.push(format!("reorder={}", self.reorder));
        }
        if self.reorder_delay != d.reorder_delay {
            parts.push(format!("reorder_delay={}", fmt_duration(self.reorder_delay)));
        }
        if self.corrupt != d.corrupt {
            parts.push(format!("corrupt={}", self.corrupt));
        }
        if self.delay != d.delay {
            parts.push(format!("delay={}", fmt_duration(self.delay)));
        }
        if self.seed != d.seed {
            parts.push(format!("seed={}", self.seed));
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(","))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parses_both_spellings_of_duplicate_and_rejects_junk() {
        let f: Faults = "loss=0.01, dup=0.02,reorder=0.5,corrupt=0.001,delay=2ms,seed=9".parse().unwrap();
        assert_eq!(f.loss, 0.01);
        assert_eq!(f.duplicate, 0.02);
        assert_eq!(f.reorder, 0.5);
        assert_eq!(f.corrupt, 0.001);
        assert_eq!(f.delay, Duration::from_millis(2));
        assert_eq!(f.seed, 9);
        assert_eq!(f.ack_loss, None);
        let g: Faults = "loss=0.01,duplicate=0.02,reorder=0.5,corrupt=0.001,delay=2ms,seed=9".parse().unwrap();
        assert_eq!(f, g);
        assert_eq!("reorder_delay=20us".parse::<Faults>().unwrap().reorder_delay, Duration::from_micros(20));
        assert_eq!("loss=0.1,ack_loss=0".parse::<Faults>().unwrap().ack_loss, Some(0.0));
        assert_eq!("".parse::<Faults>().unwrap(), Faults::default());
        assert_eq!("none".parse::<Faults>().unwrap(), Faults::default());
        for bad in ["loss=2", "ack_loss=1.5", "loss", "jitter=1", "delay=5", "seed=x", "loss=-0.1", "delay=1e99s"] {
            assert!(bad.parse::<Faults>().is_err(), "{bad} accepted");
        }
        // The error names the spec, the culprit, and the canonical spelling.
        let e = "loss=0.1,dup=7".parse::<Faults>().unwrap_err().to_string();
        assert!(e.contains("\"loss=0.1,dup=7\"") && e.contains("duplicate=7: a probability in 0..=1"), "{e}");
        let e = "jitter=1ms".parse::<Faults>().unwrap_err().to_string();
        assert!(e.contains("unknown key \"jitter\"") && e.contains("duplicate=0.01"), "{e}");
    }

    #[test]
    fn display_is_the_canonical_spec_and_parses_back() {
        assert_eq!(Faults::default().to_string(), "none");
        let f: Faults = "dup=0.02,loss=0.01,ack_loss=0,reorder_delay=20us,delay=1500ns,seed=3".parse().unwrap();
        assert_eq!(f.to_string(), "loss=0.01,ack_loss=0,duplicate=0.02,reorder_delay=20us,delay=1500ns,seed=3");
        assert_eq!(f.to_string().parse::<Faults>().unwrap(), f);
    }

    #[test]
    fn sample_draws_in_the_documented_order() {
        // Scripted draws: loss, corrupt, bit, duplicate, reorder.
        struct Script(Vec<f64>, Vec<usize>);
        impl FaultRng for Script {
            fn unit(&mut self) -> f64 {
                self.0.remove(0)
            }
            fn index(&mut self, n: usize) -> usize {
                assert_eq!(n, 80);
                self.1.remove(0)
            }
        }
        let f = Faults { loss: 0.5, corrupt: 0.5, duplicate: 0.5, reorder: 0.5, ..Faults::none() };
        let mut s = Script(vec![0.9, 0.1, 0.1, 0.9], vec![13]);
        let got = f.sample(&mut s, &[0; 10]);
        assert_eq!(got, Sample { lost: false, flip_bit: Some(13), duplicate: true, reordered: false });
        assert!(s.0.is_empty() && s.1.is_empty());
        // A lost datagram draws nothing more.
        let mut s = Script(vec![0.1], vec![]);
        assert!(f.sample(&mut s, &[0; 10]).lost);
        assert!(s.0.is_empty());
        assert_eq!(f.added_delay(&Sample { reordered: true, ..Sample::default() }), f.reorder_delay);
    }

    #[test]
    fn ack_loss_applies_to_acks_alone() {
        let ack = [Opcode::RC_ACKNOWLEDGE.0, 0, 0, 0];
        let send = [Opcode::RC_SEND_ONLY.0, 0, 0, 0];
        let mut rng = Rng::new(1);
        let f: Faults = "loss=1,ack_loss=0".parse().unwrap();
        for _ in 0..100 {
            assert!(!f.sample(&mut rng, &ack).lost);
            assert!(f.sample(&mut rng, &send).lost);
        }
        let f: Faults = "loss=1".parse().unwrap();
        assert!(f.sample(&mut rng, &ack).lost);
        assert!(is_ack(&ack) && !is_ack(&send) && !is_ack(&[]));
    }

    #[test]
    fn rates_are_close_to_the_spec() {
        let f: Faults = "loss=0.1,duplicate=0.05,corrupt=0.02,reorder=0.3".parse().unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (mut lost, mut dup, mut corrupt, mut reordered) = (0, 0, 0, 0);
        for _ in 0..100_000 {
            let s = f.sample(&mut rng, &[0; 100]);
            lost += usize::from(s.lost);
            dup += usize::from(s.duplicate);
            corrupt += usize::from(s.flip_bit.is_some());
            reordered += usize::from(s.reordered);
            assert!(s.flip_bit.is_none_or(|b| b < 800));
        }
        assert!((9_000..11_000).contains(&lost), "{lost}");
        assert!((4_000..5_000).contains(&dup), "{dup}");
        assert!((1_500..2_100).contains(&corrupt), "{corrupt}");
        assert!((25_000..29_000).contains(&reordered), "{reordered}");
        assert!(!Faults::none().is_active());
        assert!(Faults { ack_loss: Some(0.1), ..Faults::none() }.is_active());
    }
}
