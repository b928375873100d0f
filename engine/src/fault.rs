//! What a wire does with one datagram: the outcome of the fault model. The transport's
//! `softrdma_transport::faults` draws these at random (loss, duplication, reordering by delay,
//! corruption); scripted tests choose them one datagram at a time.

use crate::time::Duration;

/// What a wire does with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Deliver it after the link latency.
    Deliver,
    /// Lose it.
    Drop,
    /// Deliver it twice.
    Duplicate,
    /// Deliver it after the latency plus this much.
    Delay(Duration),
    /// Deliver it with one bit flipped.
    Corrupt,
}
