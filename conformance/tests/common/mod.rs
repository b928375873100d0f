//! What the property tests share: the workloads they draw, on a simulated 25 Gb/s link with faults.

use softrdma_engine::time::Duration;
use softrdma_engine::verbs::Mtu;
use softrdma_transport::faults::Faults;
use softrdma_transport::sim::LinkConfig;
use softrdma_workloads::workload::{Op, Workload};

/// `messages` messages of `ops` on `qps` QPs, sized between `a` and `b` in either order, over
/// [`link`] with [`faults`]; 7 retries, ACK timeout 10.
pub fn workload(
    ops: Vec<Op>,
    messages: u32,
    (a, b): (u32, u32),
    qps: u32,
    mtu: Mtu,
    seed: u64,
    f: [f64; 4],
) -> Workload {
    Workload {
        ops,
        messages,
        size: (a.min(b), a.max(b)),
        qps,
        mtu,
        seed,
        faults: faults(f),
        link: link(),
        retry_cnt: 7,
        timeout: 10,
    }
}

/// A wire that loses, duplicates, reorders (by 20 us) and corrupts packets at these rates, in
/// that order.
pub fn faults([loss, duplicate, reorder, corrupt]: [f64; 4]) -> Faults {
    Faults { loss, duplicate, reorder, reorder_delay: Duration::from_micros(20), corrupt, ..Faults::none() }
}

/// A 25 Gb/s link of 5 us, without jitter.
pub fn link() -> LinkConfig {
    LinkConfig { latency: Duration::from_micros(5), jitter: Duration::ZERO, bandwidth_bits_per_sec: 25_000_000_000 }
}
