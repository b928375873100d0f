//! XRC fan-in under random faults (property test): N initiators to M SRQs of one domain, each
//! message delivered exactly once, in order per initiator, to the SRQ it names, intact; RDMA
//! WRITE, READ and FETCH_ADD through the target QPs (each atomic executed once); sizes from 0.

use proptest::prelude::*;
use softrdma_engine::verbs::Mtu;
use softrdma_workloads::services::{run_service, Service};
use softrdma_workloads::workload::Op;

mod common;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(32)
    ))]

    #[test]
    fn xrc_fan_in_and_rdma_exactly_once_in_order_to_the_right_srq(
        initiators in 1u32..5, srqs in 1u32..6, messages in 1u32..80, a in 0u32..3000, b in 0u32..3000,
        mtu in prop::sample::select(vec![Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]),
        seed in any::<u64>(), f in [0.0f64..0.05, 0.0..0.05, 0.0..0.05, 0.0..0.05],
    ) {
        let w = common::workload(vec![Op::Send, Op::Write, Op::Read, Op::Atomic], messages, (a, b), 1, mtu, seed, f);
        let r = run_service(&w, Service::Xrc { initiators, srqs }).unwrap();
        prop_assert!(r.ok(), "{:?}", r.violations);
        prop_assert_eq!((r.completed_ok, r.lost, r.duplicated, r.out_of_order, r.corrupted_delivered), (r.posted, 0, 0, 0, 0));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16)
    ))]

    /// UC SEND and WRITE under random faults: nothing delivered that was not sent, nothing
    /// corrupted; on a perfect wire every message exactly once and every WRITE whole.
    #[test]
    fn uc_sends_and_writes_deliver_nothing_foreign(
        messages in 1u32..80, a in 0u32..3000, b in 0u32..3000,
        mtu in prop::sample::select(vec![Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]),
        seed in any::<u64>(), faulty in any::<bool>(), f in [0.0f64..0.05, 0.0..0.05, 0.0..0.05, 0.0..0.05],
    ) {
        let f = if faulty { f } else { [0.0; 4] };
        let w = common::workload(vec![Op::Send, Op::Write], messages, (a, b), 2, mtu, seed, f);
        let r = run_service(&w, Service::Uc).unwrap();
        prop_assert!(r.ok(), "{:?}", r.violations);
        prop_assert_eq!(r.corrupted_delivered, 0);
        if !faulty {
            prop_assert_eq!((r.completed_ok, r.lost, r.duplicated), (r.posted, 0, 0));
        }
    }
}
