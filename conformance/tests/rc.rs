//! RC transport rules, one test per rule, named after the IBTA compliance statement (or section)
//! it checks. Two engine devices on a scripted wire in virtual time (`softrdma_conformance::pair`).

use softrdma_conformance::pair::{Fate, Pair, RcOptions, Side, BASE};
use softrdma_engine::device::AsyncEvent;
use softrdma_engine::verbs::{Mtu, QpState, WcOpcode, WcStatus};
use softrdma_engine::wire::{Opcode, Psn};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const A: usize = 0;
const B: usize = 1;
const STEPS: usize = 100_000;

fn sge(s: &Side, addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge { addr, length: len, lkey: s.mr.lkey }]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn setup(o: RcOptions) -> (Pair, Side, Side) {
    let mut p = Pair::new(42);
    let (a, b) = p.connect_rc(o);
    (p, a, b)
}

fn post_recv(p: &mut Pair, side: usize, s: &Side, wr_id: u64, addr: u64, len: u32) {
    p.dev(side).post_recv(s.qpn, RecvWr { wr_id, sg_list: sge(s, addr, len) }).unwrap();
}

fn send(p: &mut Pair, s: &Side, wr_id: u64, op: SendOp, addr: u64, len: u32) {
    p.dev(A).post_send(s.qpn, SendWr::new(wr_id, op, sge(s, addr, len))).unwrap();
}

#[test]
fn send_only_delivers_data_and_both_completions() {
    let (mut p, a, b) = setup(RcOptions::default());
    let msg = pattern(100, 1);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 4096);
    send(&mut p, &a, 1, SendOp::Send, BASE, 100);
    p.drive(STEPS);
    assert_eq!(p.read(B, BASE + 0x1000, 100), msg);
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.len(), 1);
    assert_eq!((wa[0].wr_id, wa[0].status, wa[0].opcode, wa[0].byte_len), (1, WcStatus::Success, WcOpcode::Send, 100));
    let wb = p.poll(B, b.cq);
    assert_eq!(wb.len(), 1);
    assert_eq!((wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len), (7, WcStatus::Success, WcOpcode::Recv, 100));
    assert_eq!(p.sent(A), vec![Opcode::RC_SEND_ONLY]);
    assert_eq!(p.sent(B), vec![Opcode::RC_ACKNOWLEDGE]);
    // IBTA 11.6.2: COMM_EST at B's first packet in RTR? B was already RTS, so no event.
    assert_eq!(p.b.poll_event(), None);
}

#[test]
fn c9_segmentation_by_path_mtu_first_middle_last() {
    let (mut p, a, b) = setup(RcOptions { mtu: Mtu::Mtu1024, ..RcOptions::default() });
    let msg = pattern(5000, 2);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 8192);
    send(&mut p, &a, 1, SendOp::Send, BASE, 5000);
    p.drive(STEPS);
    assert_eq!(
        p.sent(A),
        vec![
            Opcode::RC_SEND_FIRST,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_LAST
        ]
    );
    let psns: Vec<u32> = p.log.iter().filter(|s| s.from == A).map(|s| s.psn.value()).collect();
    assert_eq!(psns, vec![100, 101, 102, 103, 104]);
    // AckReq only on the last packet of the message (rxe's placement).
    let acks: Vec<bool> = p.log.iter().filter(|s| s.from == A).map(|s| s.ack_req).collect();
    assert_eq!(acks, vec![false, false, false, false, true]);
    assert_eq!(p.read(B, BASE + 0x10000, 5000), msg);
    assert_eq!(p.poll(B, b.cq)[0].byte_len, 5000);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn write_and_write_with_immediate() {
    let (mut p, a, b) = setup(RcOptions::default());
    let msg = pattern(3000, 3);
    p.fill(A, BASE, &msg);
    send(&mut p, &a, 1, SendOp::Write { remote_addr: BASE + 0x20000, rkey: b.mr.rkey }, BASE, 3000);
    p.drive(STEPS);
    assert_eq!(p.read(B, BASE + 0x20000, 3000), msg);
    assert!(p.poll(B, b.cq).is_empty(), "a WRITE consumes no receive WQE");
    post_recv(&mut p, B, &b, 9, BASE + 0x30000, 16);
    send(&mut p, &a, 2, SendOp::WriteWithImm { remote_addr: BASE + 0x21000, rkey: b.mr.rkey, imm: 0xabcd }, BASE, 10);
    p.drive(STEPS);
    let wb = p.poll(B, b.cq);
    assert_eq!(wb.len(), 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].opcode, wb[0].imm, wb[0].byte_len),
        (9, WcOpcode::RecvRdmaWithImm, Some(0xabcd), 10)
    );
    assert_eq!(p.read(B, BASE + 0x21000, 10), msg[..10].to_vec());
    let wa = p.poll(A, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn read_multi_packet() {
    let (mut p, a, b) = setup(RcOptions::default());
    let data = pattern(4500, 4);
    p.fill(B, BASE + 0x40000, &data);
    send(&mut p, &a, 1, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 4500);
    p.drive(STEPS);
    assert_eq!(p.read(A, BASE + 0x50000, 4500), data);
    assert_eq!(
        p.sent(B),
        vec![
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_LAST
        ]
    );
    let wa = p.poll(A, a.cq);
    assert_eq!((wa[0].status, wa[0].opcode, wa[0].byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 4500));
    // The READ consumed 5 PSNs: the next request uses PSN 105.
    send(&mut p, &a, 2, SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.log.iter().rfind(|s| s.from == A).unwrap().psn, Psn::new(105));
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    let (mut p, a, b) = setup(RcOptions::default());
    let target = BASE + 0x8000;
    p.fill(B, target, &5u64.to_ne_bytes());
    let op = SendOp::FetchAdd { remote_addr: target, rkey: b.mr.rkey, add: 10 };
    send(&mut p, &a, 1, op, BASE + 0x100, 8);
    let op = SendOp::CompareSwap { remote_addr: target, rkey: b.mr.rkey, compare: 15, swap: 99 };
    send(&mut p, &a, 2, op, BASE + 0x108, 8);
    let op = SendOp::CompareSwap { remote_addr: target, rkey: b.mr.rkey, compare: 15, swap: 1 };
    send(&mut p, &a, 3, op, BASE + 0x110, 8);
    p.drive(STEPS);
    let get = |p: &mut Pair, side, addr| u64::from_ne_bytes(p.read(side, addr, 8).try_into().unwrap());
    assert_eq!(get(&mut p, A, BASE + 0x100), 5);
    assert_eq!(get(&mut p, A, BASE + 0x108), 15);
    assert_eq!(get(&mut p, A, BASE + 0x110), 99, "compare failed: original returned, no swap");
    assert_eq!(get(&mut p, B, target), 99);
    let wa = p.poll(A, a.cq);
    assert_eq!(
        wa.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        vec![WcOpcode::FetchAdd, WcOpcode::CompSwap, WcOpcode::CompSwap]
    );
}

#[test]
fn c9_109_one_psn_sequence_nak_per_gap_then_go_back_n() {
    let (mut p, a, b) = setup(RcOptions::default());
    let msg = pattern(4096, 5);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 8192);
    // Lose the first transmission of PSN 101 (the second of four packets).
    let mut lost = false;
    p.set_filter(move |s| {
        if s.from == 0 && s.psn == Psn::new(101) && !lost {
            lost = true;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    send(&mut p, &a, 1, SendOp::Send, BASE, 4096);
    p.drive(STEPS);
    let naks: Vec<_> = p.log.iter().filter(|s| s.from == B && s.syndrome == Some(0x60)).collect();
    assert_eq!(naks.len(), 1, "exactly one PSN sequence NAK for the gap");
    assert_eq!(naks[0].psn, Psn::new(101), "the NAK carries the expected PSN");
    assert_eq!(p.read(B, BASE + 0x10000, 4096), msg);
    assert_eq!(p.poll(B, b.cq).len(), 1);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
    assert!(p.b.counters().out_of_seq_request >= 2);
    assert_eq!(p.a.counters().rcvd_seq_err, 1);
}

#[test]
fn c9_105_duplicate_send_is_reacked_not_redelivered() {
    let (mut p, a, b) = setup(RcOptions { timeout: 10, ..RcOptions::default() });
    p.fill(A, BASE, b"hello");
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    post_recv(&mut p, B, &b, 8, BASE + 0x2000, 64);
    // Lose B's first ACK: A times out and resends; B sees a duplicate.
    let mut lost = false;
    p.set_filter(move |s| {
        if s.from == 1 && !lost {
            lost = true;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    send(&mut p, &a, 1, SendOp::Send, BASE, 5);
    p.drive(STEPS);
    assert_eq!(p.sent(A), vec![Opcode::RC_SEND_ONLY, Opcode::RC_SEND_ONLY]);
    assert_eq!(p.sent(B), vec![Opcode::RC_ACKNOWLEDGE, Opcode::RC_ACKNOWLEDGE]);
    let wb = p.poll(B, b.cq);
    assert_eq!(wb.len(), 1, "delivered once");
    assert_eq!(p.b.counters().duplicate_request, 1);
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.len(), 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    // The retransmission waited for the local ACK timeout: 4.096 us x 2^10.
    let resend = p.log.iter().filter(|s| s.from == A).nth(1).unwrap().at;
    assert!(resend.as_nanos() >= 4096 << 10, "resent at {resend}");
}

#[test]
fn c9_140_retry_exhausted_is_retry_exc_err_and_the_rest_flush() {
    let (mut p, a, _b) = setup(RcOptions { timeout: 8, retry_cnt: 2, ..RcOptions::default() });
    p.set_filter(|s| if s.from == 0 { Fate::Drop } else { Fate::Deliver });
    p.fill(A, BASE, b"x");
    let mut w = SendWr::new(1, SendOp::Write { remote_addr: BASE, rkey: 0 }, sge(&a, BASE, 1));
    w.signaled = false;
    p.dev(A).post_send(a.qpn, w.clone()).unwrap();
    w.wr_id = 2;
    p.dev(A).post_send(a.qpn, w).unwrap();
    p.drive(STEPS);
    // One transmission plus retry_cnt retries of the first packet.
    let tries = p.log.iter().filter(|s| s.from == A && s.psn == Psn::new(100)).count();
    assert_eq!(tries, 3);
    let wa = p.poll(A, a.cq);
    // Error and flush completions appear although the WRs were unsignaled.
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.query_qp(a.qpn).unwrap().0, QpState::Err);
    assert_eq!(p.a.counters().retry_exceeded_err, 1);
}

#[test]
fn rnr_nak_then_success_when_a_receive_is_posted() {
    let (mut p, a, b) = setup(RcOptions { min_rnr_timer: 14, ..RcOptions::default() });
    p.fill(A, BASE, b"wait");
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    // Let the first attempt arrive with no receive WQE posted.
    for _ in 0..3 {
        p.step();
    }
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    p.drive(STEPS);
    let rnr: Vec<_> = p.log.iter().filter(|s| s.from == B && s.syndrome == Some(0x20 | 14)).collect();
    assert_eq!(rnr.len(), 1, "one RNR NAK with the responder's min_rnr_timer");
    assert_eq!(p.poll(B, b.cq).len(), 1);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
    // The retry waited the RNR timer of code 14: 1.28 ms.
    let retry = p.log.iter().filter(|s| s.from == A).nth(1).unwrap().at;
    assert!(retry.as_nanos() >= 1_280_000, "retried at {retry}");
}

#[test]
fn rnr_retry_zero_exhausts_at_once() {
    let (mut p, a, _b) = setup(RcOptions { rnr_retry: 0, ..RcOptions::default() });
    p.fill(A, BASE, b"wait");
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    send(&mut p, &a, 2, SendOp::Send, BASE, 4);
    p.drive(STEPS);
    let wa = p.poll(A, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn c9_bad_rkey_is_remote_access_error_and_responder_goes_to_error() {
    let (mut p, a, b) = setup(RcOptions::default());
    send(&mut p, &a, 1, SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey ^ 0x55 }, BASE, 8);
    p.drive(STEPS);
    let wa = p.poll(A, a.cq);
    assert_eq!(wa[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.a.query_qp(a.qpn).unwrap().0, QpState::Err);
    assert_eq!(p.b.query_qp(b.qpn).unwrap().0, QpState::Err, "class C error: responder to ERR");
    assert_eq!(p.b.poll_event(), Some(AsyncEvent::QpAccessErr(b.qpn)));
    assert!(p.log.iter().any(|s| s.from == B && s.syndrome == Some(0x62)));
}

#[test]
fn write_beyond_the_region_is_remote_access_error() {
    let (mut p, a, b) = setup(RcOptions::default());
    let end = BASE + softrdma_conformance::pair::MEM as u64;
    send(&mut p, &a, 1, SendOp::Write { remote_addr: end - 4, rkey: b.mr.rkey }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn c9_107_duplicate_atomic_is_replayed_not_reexecuted() {
    let (mut p, a, b) = setup(RcOptions { timeout: 10, ..RcOptions::default() });
    let target = BASE + 0x8000;
    // Lose the first atomic ACK: A resends the FETCH_ADD, B answers from its cache.
    let mut lost = false;
    p.set_filter(move |s| {
        if s.from == 1 && s.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE && !lost {
            lost = true;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    send(&mut p, &a, 1, SendOp::FetchAdd { remote_addr: target, rkey: b.mr.rkey, add: 1 }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.sent(A), vec![Opcode::RC_FETCH_ADD, Opcode::RC_FETCH_ADD]);
    assert_eq!(u64::from_ne_bytes(p.read(B, target, 8).try_into().unwrap()), 1, "added once");
    assert_eq!(u64::from_ne_bytes(p.read(A, BASE, 8).try_into().unwrap()), 0, "the original value");
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn read_response_gap_is_an_implicit_nak_and_the_read_resumes() {
    let (mut p, a, b) = setup(RcOptions::default());
    let data = pattern(4096, 6);
    p.fill(B, BASE + 0x40000, &data);
    // Lose the second READ response packet once.
    let mut lost = false;
    p.set_filter(move |s| {
        if s.from == 1 && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE && !lost {
            lost = true;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    send(&mut p, &a, 1, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 4096);
    p.drive(STEPS);
    assert_eq!(p.read(A, BASE + 0x50000, 4096), data);
    // The READ was reissued from the missing PSN (101) for the remaining 3 KiB.
    let reqs: Vec<_> = p.log.iter().filter(|s| s.from == A && s.opcode == Opcode::RC_RDMA_READ_REQUEST).collect();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].psn, Psn::new(101));
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn psn_wraps_around_mid_message() {
    let (mut p, a, b) = setup(RcOptions { psn_a: 0xff_fffe, ..RcOptions::default() });
    let msg = pattern(4000, 7);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 8192);
    send(&mut p, &a, 1, SendOp::Send, BASE, 4000);
    p.drive(STEPS);
    let psns: Vec<u32> = p.log.iter().filter(|s| s.from == A).map(|s| s.psn.value()).collect();
    assert_eq!(psns, vec![0xff_fffe, 0xff_ffff, 0, 1]);
    assert_eq!(p.read(B, BASE + 0x10000, 4000), msg);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn zero_length_send_and_write() {
    let (mut p, a, b) = setup(RcOptions::default());
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    p.dev(A).post_send(a.qpn, SendWr::new(1, SendOp::Send, vec![])).unwrap();
    p.dev(A).post_send(a.qpn, SendWr::new(2, SendOp::Write { remote_addr: 0, rkey: 0 }, vec![])).unwrap();
    p.drive(STEPS);
    let wb = p.poll(B, b.cq);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 0));
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::Success, WcStatus::Success]);
}

#[test]
fn max_rd_atomic_one_keeps_one_read_outstanding() {
    let (mut p, a, b) = setup(RcOptions { max_rd_atomic: 1, ..RcOptions::default() });
    p.fill(B, BASE + 0x40000, &pattern(64, 8));
    for i in 0..5u64 {
        let op = SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey };
        send(&mut p, &a, i, op, BASE + 0x50000 + i * 64, 64);
    }
    p.drive(STEPS);
    // Requests and responses alternate: never two READs in flight.
    let order: Vec<usize> = p.log.iter().map(|s| s.from).collect();
    assert_eq!(order, vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
    assert_eq!(p.poll(A, a.cq).len(), 5);
}

#[test]
fn sends_posted_in_error_complete_flushed() {
    let (mut p, a, _b) = setup(RcOptions::default());
    let attr = softrdma_engine::device::QpAttr { qp_state: QpState::Err, ..Default::default() };
    p.dev(A).modify_qp(a.qpn, &attr, softrdma_engine::verbs::AttrMask::STATE).unwrap();
    let mut w = SendWr::new(5, SendOp::Send, vec![]);
    w.signaled = false;
    p.dev(A).post_send(a.qpn, w).unwrap();
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(5, WcStatus::WrFlushErr)]);
}
