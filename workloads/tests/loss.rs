//! Goodput under loss (issue 21): 64 KiB RDMA WRITEs on the simulated 25 Gbit/s wire with 1%
//! of packets lost, as `softrdma sim --transport rc --ops write --size 65536 --loss 0.01` runs
//! them.
//!
//! Go-back-N stays the wire behaviour (IBTA 9.7.5.1.2: the responder accepts only the expected
//! PSN; 9.7.5.2: the requester resends from the NAKed PSN), so each loss resends what the
//! requester had sent after it. With the window of 128 PSNs kept whatever the loss, that was
//! about 51 packets per drop here; the window halving on loss (engine device/window.rs, Window)
//! keeps it near the window 1% loss sustains.

use softrdma_engine::time::Duration;
use softrdma_engine::verbs::Mtu;
use softrdma_transport::faults::Faults;
use softrdma_transport::sim::LinkConfig;
use softrdma_workloads::workload::{run, Op, Workload};

fn writes(loss: f64, seed: u64) -> Workload {
    Workload {
        ops: vec![Op::Write],
        messages: 400,
        size: (65536, 65536),
        qps: 4,
        mtu: Mtu::Mtu1024,
        seed,
        faults: Faults { loss, ..Faults::none() },
        link: LinkConfig {
            latency: Duration::from_micros(5),
            jitter: Duration::ZERO,
            bandwidth_bits_per_sec: 25_000_000_000,
        },
        retry_cnt: 7,
        timeout: 12,
    }
}

#[test]
fn one_percent_loss_resends_a_small_window_per_drop() {
    for seed in 1..=2 {
        let r = run(&writes(0.01, seed)).unwrap();
        assert!(r.ok(), "{:?}", r.violations);
        assert_eq!(r.completed_ok, 400);
        assert!(r.wire.lost > 100, "seed {seed}: only {} drops", r.wire.lost);
        let per_drop = r.retransmitted_packets as f64 / r.wire.lost as f64;
        // Under 1% loss a window that halves per loss and grows by one PSN per window
        // acknowledged settles near sqrt(2 / 0.01) = 14 PSNs; go-back-N resends about that
        // per loss. A fixed 128-PSN window resent ~51.
        assert!(per_drop <= 16.0, "seed {seed}: {per_drop:.1} packets resent per drop ({r:?})");
    }
}

#[test]
fn without_loss_nothing_is_resent_and_the_link_is_full() {
    let r = run(&writes(0.0, 1)).unwrap();
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.retransmitted_packets, 0);
    // 400 x 64 KiB at 25 Gbit/s is 8.4 ms of payload alone; headers and ACKs add ~5%.
    let gbit = r.bytes_verified as f64 * 8.0 / r.virtual_time_ns as f64;
    assert!(gbit > 23.0, "{gbit:.2} Gbit/s without loss");
}
