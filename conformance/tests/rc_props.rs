//! Property tests of the RC engine over the simulated wire (docs/architecture.md D7): random
//! workloads under random fault schedules. Within the retry budget every work request completes
//! exactly once, in order, with the right data; beyond it, the first failing request gets
//! RETRY_EXC_ERR (or RNR_RETRY_EXC_ERR) and every later one WR_FLUSH_ERR. The runner in
//! `softrdma_workloads::workload` checks all of this against what was posted; a failing seed is
//! kept by proptest in `rc_props.proptest-regressions`.

use proptest::prelude::*;
use softrdma_engine::verbs::Mtu;
use softrdma_transport::faults::Faults;
use softrdma_workloads::workload::{run, Op, Workload};

mod common;

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::sample::subsequence(vec![Op::Send, Op::Write, Op::Read, Op::Atomic], 1..=4)
}

fn mtu() -> impl Strategy<Value = Mtu> {
    prop::sample::select(vec![Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096])
}

fn workload(max_fault: f64) -> impl Strategy<Value = Workload> {
    (
        ops(),
        1u32..60,
        0u32..3000,
        0u32..6000,
        1u32..4,
        mtu(),
        any::<u64>(),
        [0.0..max_fault, 0.0..max_fault, 0.0..max_fault, 0.0..max_fault],
    )
        .prop_map(|(ops, messages, a, b, qps, mtu, seed, faults)| {
            common::workload(ops, messages, (a, b), qps, mtu, seed, faults)
        })
}

proptest! {
    // 64 cases in the suite; PROPTEST_CASES=N for a longer hunt.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    ))]

    /// Faults within the retry budget: nothing lost, duplicated, reordered or corrupted, and
    /// every request completes successfully.
    #[test]
    fn every_request_completes_once_in_order_with_the_right_data(w in workload(0.05)) {
        let r = run(&w).unwrap();
        prop_assert!(r.ok(), "violations: {:?}\n{:?}", r.violations, w);
        prop_assert_eq!(r.completed_ok, r.posted, "{:?}", r.completed_err);
        prop_assert_eq!((r.lost, r.duplicated, r.out_of_order, r.corrupted_delivered), (0, 0, 0, 0));
    }

    /// Heavy loss with few retries: errors are allowed, but only as the IBTA orders them.
    #[test]
    fn beyond_the_retry_budget_the_first_failure_is_retry_exc_err_and_the_rest_flush(
        w in workload(0.05), loss in 0.3f64..0.9
    ) {
        let w = Workload { retry_cnt: 1, faults: Faults { loss, ..w.faults }, ..w };
        let r = run(&w).unwrap();
        // The runner checks the order of statuses per QP; here: no invariant broke, and every
        // request is accounted for.
        prop_assert!(r.ok(), "violations: {:?}\n{:?}", r.violations, w);
        let errs: u64 = r.completed_err.values().sum();
        prop_assert_eq!(r.completed_ok + errs, r.posted);
        for k in r.completed_err.keys() {
            prop_assert!(["RetryExcErr", "RnrRetryExcErr", "WrFlushErr"].contains(&k.as_str()), "{}", k);
        }
    }
}

/// A fixed, larger run (the example scale) as a regression case.
#[test]
fn thousand_messages_under_two_percent_faults() {
    let w = Workload {
        messages: 1000,
        qps: 4,
        seed: 3,
        faults: common::faults([0.02, 0.02, 0.02, 0.01]),
        link: common::link(),
        ..Workload::default()
    };
    let r = run(&w).unwrap();
    assert!(r.ok(), "{:?}", r.violations);
    assert_eq!(r.completed_ok, 1000);
    assert!(r.icrc_dropped > 0, "corrupted packets were caught by the ICRC");
    assert!(r.bytes_verified > 1_000_000);
}
