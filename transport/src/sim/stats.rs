//! What the simulated wire counts, what one run reports, and how a run fails.

use softrdma_engine::time::Instant;

/// Counters of everything the wire did since the [`Sim`](super::Sim) was built.
///
/// Every sent datagram ends in exactly one of `partitioned`, `unroutable`, `lost`, or delivery
/// (`delivered` also counts the second copies of duplicated datagrams). Once the simulation is
/// idle: `delivered == sent - partitioned - unroutable - lost + duplicated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireStats {
    /// Datagrams endpoints handed to the wire.
    pub sent: u64,
    /// Payload bytes endpoints handed to the wire.
    pub bytes_sent: u64,
    /// Datagrams handed to a receiving endpoint, duplicate copies included.
    pub delivered: u64,
    /// Payload bytes handed to receiving endpoints, duplicate copies included.
    pub bytes_delivered: u64,
    /// Datagrams dropped by the `loss` fault.
    pub lost: u64,
    /// Datagrams delivered twice by the `duplicate` fault (counted once each).
    pub duplicated: u64,
    /// Datagrams held back by the `reorder` fault.
    pub reordered: u64,
    /// Datagrams with one bit flipped by the `corrupt` fault (counted once even if duplicated).
    pub corrupted: u64,
    /// Datagrams dropped by a partition window.
    pub partitioned: u64,
    /// Datagrams whose destination address belongs to no endpoint.
    pub unroutable: u64,
}

/// What one [`Sim::run`](super::Sim::run) or [`Sim::run_until`](super::Sim::run_until) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunStats {
    /// Events processed: datagram arrivals plus timer wake-ups.
    pub steps: u64,
    /// Datagrams handed to endpoints.
    pub arrivals: u64,
    /// Calls to [`Endpoint::handle_timeout`](super::Endpoint::handle_timeout).
    pub timeouts: u64,
    /// Virtual time when the run started.
    pub started_at: Instant,
    /// Virtual time when the run stopped.
    pub ended_at: Instant,
}

/// Why a run stopped before the simulation went idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The run processed `max_steps` events and still had work: likely a livelock.
    #[error("simulation still busy after {} steps (virtual time {})", .0.steps, .0.ended_at)]
    StepLimit(RunStats),
    /// The next event lies beyond the run's `max_time`.
    #[error("simulation still busy at virtual time {} (time limit reached after {} steps)", .0.ended_at, .0.steps)]
    TimeLimit(RunStats),
}

impl SimError {
    /// What the run had done when it stopped.
    pub fn stats(&self) -> &RunStats {
        match self {
            SimError::StepLimit(stats) | SimError::TimeLimit(stats) => stats,
        }
    }
}
