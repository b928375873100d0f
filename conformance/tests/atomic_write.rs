//! ATOMIC WRITE (IBTA 1.5 9.4.6, opcode RC 0x1D / XRC 0xBD; Linux rxe since 6.2, rdma-core's
//! `ibv_wr_atomic_write`, IBV_WR_ATOMIC_WRITE), one test per rule: 8 bytes written at an 8-byte
//! aligned address as one store, a RETH plus exactly 8 bytes of payload, REMOTE_WRITE access on
//! the QP and the region, a responder resource per operation so a duplicate is acknowledged and
//! not executed again, a plain ACK as the answer, and IBV_WC_ATOMIC_WRITE in the completion.

use softrdma_conformance::pair::{lose_first, Pair, RcOptions, Side, BASE};
use softrdma_engine::verbs::{Access, VerbsError, WcOpcode, WcStatus};
use softrdma_engine::wire::Opcode;
use softrdma_engine::wr::{SendOp, SendWr, Sge};

const A: usize = 0;
const B: usize = 1;
const STEPS: usize = 100_000;

fn setup(o: RcOptions) -> (Pair, Side, Side) {
    let mut p = Pair::new(7);
    let (a, b) = p.connect_rc(o);
    (p, a, b)
}

/// Posts an ATOMIC WRITE of the 8 bytes at A's `BASE` to B's `remote_addr`.
fn atomic_write(p: &mut Pair, a: &Side, wr_id: u64, remote_addr: u64, rkey: u32) {
    let wr = SendWr::new(
        wr_id,
        SendOp::AtomicWrite { remote_addr, rkey },
        vec![Sge { addr: BASE, length: 8, lkey: a.mr.lkey }],
    );
    p.dev(A).post_send(a.qpn, wr).unwrap();
}

fn value(p: &mut Pair, side: usize, addr: u64) -> u64 {
    u64::from_ne_bytes(p.read(side, addr, 8).try_into().unwrap())
}

#[test]
fn atomic_write_stores_8_bytes_and_is_acknowledged_by_an_ack() {
    let (mut p, a, b) = setup(RcOptions::default());
    let target = BASE + 0x8000;
    p.fill(A, BASE, &0x1122_3344_5566_7788u64.to_ne_bytes());
    p.fill(B, target - 8, &[0xAA; 24]);
    atomic_write(&mut p, &a, 1, target, b.mr.rkey);
    p.drive(STEPS);
    assert_eq!(value(&mut p, B, target), 0x1122_3344_5566_7788);
    // Exactly the 8 bytes: its neighbours are untouched.
    assert_eq!(p.read(B, target - 8, 8), vec![0xAA; 8]);
    assert_eq!(p.read(B, target + 8, 8), vec![0xAA; 8]);
    let wa = p.poll(A, a.cq);
    assert_eq!((wa[0].wr_id, wa[0].status, wa[0].opcode), (1, WcStatus::Success, WcOpcode::AtomicWrite));
    assert_eq!(p.sent(A), vec![Opcode::RC_ATOMIC_WRITE]);
    // A plain ACK answers it (rxe's atomic_write_reply -> RESPST_ACKNOWLEDGE), not an atomic ACK.
    assert_eq!(p.sent(B), vec![Opcode::RC_ACKNOWLEDGE]);
    // Nothing completes on the responder's side.
    assert!(p.poll(B, b.cq).is_empty());
}

#[test]
fn atomic_write_to_a_misaligned_address_is_an_invalid_request() {
    let (mut p, a, b) = setup(RcOptions::default());
    atomic_write(&mut p, &a, 1, BASE + 4, b.mr.rkey);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemInvReqErr);
    assert!(p.log.iter().any(|s| s.from == B && s.syndrome == Some(0x61)), "NAK invalid request");
}

#[test]
fn atomic_write_needs_remote_write_on_the_qp() {
    // REMOTE_ATOMIC alone does not allow it: ATOMIC WRITE is checked as a WRITE (rxe's
    // check_qp_attr_access and check_rkey).
    let (mut p, a, b) = setup(RcOptions {
        access: Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..RcOptions::default()
    });
    atomic_write(&mut p, &a, 1, BASE + 0x8000, b.mr.rkey);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemAccessErr);
    assert!(p.log.iter().any(|s| s.from == B && s.syndrome == Some(0x62)), "NAK remote access error");
}

#[test]
fn atomic_write_with_a_bad_rkey_is_a_remote_access_error() {
    let (mut p, a, b) = setup(RcOptions::default());
    atomic_write(&mut p, &a, 1, BASE + 0x8000, b.mr.rkey ^ 0x55);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn duplicate_atomic_write_is_acknowledged_not_executed_again() {
    let (mut p, a, b) = setup(RcOptions { timeout: 10, ..RcOptions::default() });
    let target = BASE + 0x8000;
    p.fill(A, BASE, &7u64.to_ne_bytes());
    // Lose B's first ACK; after the write lands, B's memory changes locally: the resent ATOMIC
    // WRITE must not store 7 again over it (IBTA 9.7.5.1.4).
    p.set_filter(lose_first(1, |s| s.from == 1 && s.opcode == Opcode::RC_ACKNOWLEDGE));
    atomic_write(&mut p, &a, 1, target, b.mr.rkey);
    // Until B has executed it.
    for _ in 0..STEPS {
        if value(&mut p, B, target) == 7 || !p.step() {
            break;
        }
    }
    assert_eq!(value(&mut p, B, target), 7);
    p.fill(B, target, &99u64.to_ne_bytes());
    p.drive(STEPS);
    assert_eq!(p.sent(A), vec![Opcode::RC_ATOMIC_WRITE, Opcode::RC_ATOMIC_WRITE], "resent once");
    assert_eq!(value(&mut p, B, target), 99, "executed once");
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn atomic_write_takes_an_initiator_depth_slot() {
    // max_rd_atomic 1: the ATOMIC WRITE waits for the READ before it (rxe's check_init_depth).
    let (mut p, a, b) = setup(RcOptions { max_rd_atomic: 1, ..RcOptions::default() });
    let read = SendWr::new(
        1,
        SendOp::Read { remote_addr: BASE + 0x1000, rkey: b.mr.rkey },
        vec![Sge { addr: BASE + 0x100, length: 64, lkey: a.mr.lkey }],
    );
    p.dev(A).post_send(a.qpn, read).unwrap();
    atomic_write(&mut p, &a, 2, BASE + 0x8000, b.mr.rkey);
    p.drive(STEPS);
    let sent = p.sent(A);
    assert_eq!(sent, vec![Opcode::RC_RDMA_READ_REQUEST, Opcode::RC_ATOMIC_WRITE]);
    // The ATOMIC WRITE left A only after the READ response came back.
    let read_resp = p.log.iter().position(|s| s.from == B && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY).unwrap();
    let aw = p.log.iter().position(|s| s.from == A && s.opcode == Opcode::RC_ATOMIC_WRITE).unwrap();
    assert!(aw > read_resp, "{:?}", p.log);
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.iter().map(|w| w.opcode).collect::<Vec<_>>(), vec![WcOpcode::RdmaRead, WcOpcode::AtomicWrite]);
}

#[test]
fn atomic_write_of_other_than_8_bytes_is_einval() {
    let (mut p, a, b) = setup(RcOptions::default());
    let op = SendOp::AtomicWrite { remote_addr: BASE + 0x8000, rkey: b.mr.rkey };
    for len in [0u32, 4, 16] {
        let wr = SendWr::new(1, op, vec![Sge { addr: BASE, length: len, lkey: a.mr.lkey }]);
        assert_eq!(p.dev(A).post_send(a.qpn, wr), Err(VerbsError::Inval), "{len} bytes");
    }
    // (UC has no ATOMIC WRITE: services.rs, uc_has_no_read_or_atomic.)
}
