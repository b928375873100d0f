//! What the simulated wire is told: the link every datagram crosses, the partitions that cut it
//! (the faults it suffers are the shared model, [`crate::faults::Faults`]), and the limits that
//! stop a run which never goes idle.

use std::net::IpAddr;

use softrdma_engine::time::{Duration, Instant};

/// The one link model every datagram crosses: a per-sender transmit queue of a given bandwidth,
/// followed by a propagation delay with jitter.
///
/// The default is an ideal wire: no latency, no jitter, infinite bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkConfig {
    /// Propagation delay added to every datagram once it has left its sender's link.
    pub latency: Duration,
    /// Extra delay drawn uniformly in `[0, jitter]` for every datagram. Non-zero jitter can
    /// reorder datagrams of one sender, as netem's does.
    pub jitter: Duration,
    /// Bits per second of each sender's link; `0` means infinite (no serialization delay). Only
    /// payload bytes are counted: Ethernet, IP and UDP headers are not modelled.
    pub bandwidth_bits_per_sec: u64,
}

impl LinkConfig {
    /// The time `len` payload bytes occupy a sender's link: `ceil(len * 8 / bandwidth)`.
    pub fn serialization_time(&self, len: usize) -> Duration {
        if self.bandwidth_bits_per_sec == 0 {
            return Duration::ZERO;
        }
        let bits = len as u128 * 8 * 1_000_000_000;
        let bw = u128::from(self.bandwidth_bits_per_sec);
        Duration(u64::try_from(bits.div_ceil(bw)).unwrap_or(u64::MAX))
    }
}

/// A time window in which the wire drops the datagrams its [`PartitionScope`] names.
///
/// Partitions exist only on the simulated wire (a device's transmit path has no virtual clock to
/// open and close them by), so they are not part of [`Faults`](crate::faults::Faults): a
/// [`Sim`](super::Sim) holds them next to its faults ([`Sim::partitions_mut`](super::Sim::partitions_mut)).
///
/// A datagram is dropped when it leaves its sender's link (the end of its serialization; the
/// send time on an infinite-bandwidth link) at a time `t` with `start <= t < end`. Datagrams
/// already in flight when the window opens still arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// First instant of the window.
    pub start: Instant,
    /// First instant after the window.
    pub end: Instant,
    /// Which datagrams the window drops.
    pub scope: PartitionScope,
}

/// Which datagrams a [`Partition`] drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionScope {
    /// Every datagram.
    All,
    /// Datagrams from either address to the other (both directions).
    Between(IpAddr, IpAddr),
    /// Datagrams from `from` to `to` only (for example, lose only the ACKs).
    OneWay {
        /// Source address of the dropped datagrams.
        from: IpAddr,
        /// Destination address of the dropped datagrams.
        to: IpAddr,
    },
}

impl Partition {
    /// The end of time, for a window that never closes.
    pub const FOREVER: Instant = Instant(u64::MAX);

    /// Drop every datagram leaving in `[start, end)`.
    pub fn all(start: Instant, end: Instant) -> Partition {
        Partition { start, end, scope: PartitionScope::All }
    }

    /// Drop datagrams between `a` and `b`, both ways, leaving in `[start, end)`.
    pub fn between(a: IpAddr, b: IpAddr, start: Instant, end: Instant) -> Partition {
        Partition { start, end, scope: PartitionScope::Between(a, b) }
    }

    /// Drop datagrams from `from` to `to`, leaving in `[start, end)`.
    pub fn one_way(from: IpAddr, to: IpAddr, start: Instant, end: Instant) -> Partition {
        Partition { start, end, scope: PartitionScope::OneWay { from, to } }
    }

    /// Whether this window drops a datagram from `src` to `dst` leaving at `at`.
    pub fn drops(&self, src: IpAddr, dst: IpAddr, at: Instant) -> bool {
        if at < self.start || at >= self.end {
            return false;
        }
        match self.scope {
            PartitionScope::All => true,
            PartitionScope::Between(a, b) => (src == a && dst == b) || (src == b && dst == a),
            PartitionScope::OneWay { from, to } => src == from && dst == to,
        }
    }
}

/// Bounds on one [`Sim::run`](super::Sim::run), both counted from the start of that run, that
/// turn a livelock into an error instead of a hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most events (arrivals and timer wake-ups) the run may process.
    pub max_steps: u64,
    /// Most virtual time the run may cover; an event later than this is not processed.
    pub max_time: Duration,
}

impl Default for Limits {
    /// Ten million steps and one hour of virtual time.
    fn default() -> Limits {
        Limits { max_steps: 10_000_000, max_time: Duration::from_millis(3_600_000) }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn serialization_time_rounds_up_and_is_zero_for_infinite_bandwidth() {
        let ten_mbit = LinkConfig { bandwidth_bits_per_sec: 10_000_000, ..LinkConfig::default() };
        assert_eq!(ten_mbit.serialization_time(1250), Duration::from_millis(1));
        assert_eq!(ten_mbit.serialization_time(1), Duration(800));
        let three_bps = LinkConfig { bandwidth_bits_per_sec: 3, ..LinkConfig::default() };
        assert_eq!(three_bps.serialization_time(1), Duration(2_666_666_667));
        assert_eq!(LinkConfig::default().serialization_time(1 << 20), Duration::ZERO);
    }

    #[test]
    fn partition_window_is_half_open_and_scoped() {
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let c = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
        let (t0, t1) = (Instant(100), Instant(200));
        let both = Partition::between(a, b, t0, t1);
        assert!(!both.drops(a, b, Instant(99)));
        assert!(both.drops(a, b, Instant(100)));
        assert!(both.drops(b, a, Instant(199)));
        assert!(!both.drops(a, b, Instant(200)));
        assert!(!both.drops(a, c, Instant(150)));
        let acks = Partition::one_way(b, a, t0, t1);
        assert!(acks.drops(b, a, Instant(150)));
        assert!(!acks.drops(a, b, Instant(150)));
        assert!(Partition::all(t0, t1).drops(c, c, Instant(150)));
    }
}
