//! Behaviour profiles (`softrdma_engine::device::WireProfile`): the wire choices the IBTA leaves to
//! the implementation, under `rxe` (Linux soft-RoCE, the default) and `cx` (ConnectX, as the
//! shared hardware captures show it). One test per choice; every value is read back from the
//! bytes of the packets on the wire (`IbPacket`), not from the harness's summary.
//!
//! - BTH MigReq: IBTA 9.2 (a requester or responder not doing path migration may set M as it
//!   likes); rxe never sets it, ConnectX sets it on every packet.
//! - ACK credits: IBTA 9.7.7.2.5 and Table 44; rxe sends 0x1F ("invalid"), cx the receive WQEs
//!   the QP has left, 0x1F for a QP on an SRQ and for an XRC target.
//! - AckReq: IBTA 9.7.3 (a requester may set AckReq on any packet); cx also sets it on the first
//!   packet a QP sends.
//! - READ response AETH credits: 0x1F under rxe, 0 under cx.

use softrdma_conformance::pair::{Pair, RcOptions, Seen, Side, ADDR_A, ADDR_B, BASE, MEM, OWNER};
use softrdma_engine::device::{CqId, Device, DeviceConfig, QpCaps, QpInit, SrqAttr, WireProfile};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::verbs::{Access, Mtu, QpType, WcOpcode, WcStatus};
use softrdma_engine::wire::aeth::{credit_code, credit_count, CREDITS_INVALID};
use softrdma_engine::wire::{IbPacket, Opcode, Qpn};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const A: usize = 0;
const B: usize = 1;
const STEPS: usize = 100_000;

/// One packet as its bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wire {
    from: usize,
    opcode: Opcode,
    psn: u32,
    mig_req: bool,
    ack_req: bool,
    /// The AETH syndrome byte, if the packet has an AETH.
    aeth: Option<u8>,
}

fn parse(s: &Seen) -> Wire {
    let p = IbPacket::new_checked(&s.bytes[..]).expect("a well-formed packet");
    let bth = p.bth();
    Wire {
        from: s.from,
        opcode: p.opcode(),
        psn: bth.psn().value(),
        mig_req: bth.mig_req(),
        ack_req: bth.ack_req(),
        aeth: p.aeth().map(|a| a.syndrome_byte()),
    }
}

/// Every packet on the wire so far, parsed from its bytes.
fn wire(p: &Pair) -> Vec<Wire> {
    p.log.iter().map(parse).collect()
}

/// The packets on the wire from the `from`-th entry of the log on.
fn wire_since(p: &Pair, from: usize) -> Vec<Wire> {
    p.log[from..].iter().map(parse).collect()
}

fn device(addr: std::net::IpAddr, seed: u64, behaviour: WireProfile) -> Device<VecMemory> {
    let mut m = VecMemory::new();
    m.add(OWNER, BASE, MEM);
    Device::new(DeviceConfig { behaviour, ..DeviceConfig::new(addr, seed) }, m)
}

/// A pair whose devices run the given profiles (built as `Pair::new` builds its devices).
fn pair(seed: u64, a: WireProfile, b: WireProfile) -> Pair {
    let mut p = Pair::new(seed);
    p.a = device(ADDR_A, seed, a);
    p.b = device(ADDR_B, seed + 1, b);
    p
}

fn opts() -> RcOptions {
    RcOptions { mtu: Mtu::Mtu1024, ..RcOptions::default() }
}

fn sge(s: &Side, addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge { addr, length: len, lkey: s.mr.lkey }]
}

fn post_recvs(p: &mut Pair, side: usize, s: &Side, n: u64) {
    for i in 0..n {
        p.dev(side).post_recv(s.qpn, RecvWr { wr_id: 1000 + i, sg_list: sge(s, BASE + 0x10_0000, 4096) }).unwrap();
    }
}

fn post(p: &mut Pair, side: usize, s: &Side, wr_id: u64, op: SendOp, addr: u64, len: u32) {
    p.dev(side).post_send(s.qpn, SendWr::new(wr_id, op, sge(s, addr, len))).unwrap();
}

/// The completions of a CQ, sorted by wr_id (send and receive completions share the CQ).
fn statuses(p: &mut Pair, side: usize, cq: CqId) -> Vec<(u64, WcStatus)> {
    let mut v: Vec<(u64, WcStatus)> = p.poll(side, cq).iter().map(|w| (w.wr_id, w.status)).collect();
    v.sort_by_key(|x| x.0);
    v
}

#[test]
fn rxe_profile_sets_no_mig_req_invalid_credits_and_ack_req_only_on_last() {
    let mut p = Pair::new(11);
    assert_eq!(p.a.config().behaviour, WireProfile::RXE, "rxe is the default profile");
    let (a, b) = p.connect_rc(opts());
    p.fill(A, BASE, &[5u8; 3000]);
    p.fill(B, BASE + 0x8000, &[6u8; 3000]);
    // Receives on both sides, so a credit-counting responder would have something to count.
    post_recvs(&mut p, B, &b, 10);
    post_recvs(&mut p, A, &a, 10);
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 3000);
    p.drive(STEPS);
    let w = wire(&p);
    let a_sent: Vec<(Opcode, u32, bool)> =
        w.iter().filter(|x| x.from == A).map(|x| (x.opcode, x.psn, x.ack_req)).collect();
    assert_eq!(
        a_sent,
        vec![
            (Opcode::RC_SEND_FIRST, 100, false),
            (Opcode::RC_SEND_MIDDLE, 101, false),
            (Opcode::RC_SEND_LAST, 102, true)
        ]
    );
    let b_sent: Vec<(Opcode, u32, Option<u8>)> =
        w.iter().filter(|x| x.from == B).map(|x| (x.opcode, x.psn, x.aeth)).collect();
    assert_eq!(b_sent, vec![(Opcode::RC_ACKNOWLEDGE, 102, Some(CREDITS_INVALID))]);

    // A READ (responses from B), a WRITE and a SEND from B (requests and ACKs the other way).
    let n = p.log.len();
    post(&mut p, A, &a, 2, SendOp::Read { remote_addr: BASE + 0x8000, rkey: b.mr.rkey }, BASE + 0x2_0000, 3000);
    post(&mut p, B, &b, 3, SendOp::Write { remote_addr: BASE + 0x3_0000, rkey: a.mr.rkey }, BASE, 100);
    post(&mut p, B, &b, 4, SendOp::Send, BASE, 3000);
    p.drive(STEPS);
    assert_eq!(
        statuses(&mut p, A, a.cq),
        vec![(1, WcStatus::Success), (2, WcStatus::Success), (1000, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&mut p, B, b.cq),
        vec![(3, WcStatus::Success), (4, WcStatus::Success), (1000, WcStatus::Success)]
    );
    let later = wire_since(&p, n);
    let reads: Vec<(Opcode, Option<u8>)> = later
        .iter()
        .filter(|x| x.from == B && x.opcode.0 >= 0x0d && x.opcode.0 <= 0x0f)
        .map(|x| (x.opcode, x.aeth))
        .collect();
    assert_eq!(
        reads,
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, Some(CREDITS_INVALID)),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, None),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, Some(CREDITS_INVALID)),
        ]
    );
    // B's first request packets (a WRITE_ONLY at its sq_psn, then SEND FIRST/MIDDLE/LAST): AckReq
    // only where a message ends.
    let b_req: Vec<(Opcode, u32, bool)> = later
        .iter()
        .filter(|x| x.from == B && x.aeth.is_none())
        .map(|x| (x.opcode, x.psn, x.ack_req))
        .filter(|x| x.0 != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE)
        .collect();
    assert_eq!(
        b_req,
        vec![
            (Opcode::RC_RDMA_WRITE_ONLY, 5000, true),
            (Opcode::RC_SEND_FIRST, 5001, false),
            (Opcode::RC_SEND_MIDDLE, 5002, false),
            (Opcode::RC_SEND_LAST, 5003, true),
        ]
    );
    // Every ACK either way says "no credit information"; ACKs never ask for an ACK.
    let acks: Vec<&Wire> = w.iter().chain(later.iter()).filter(|x| x.opcode == Opcode::RC_ACKNOWLEDGE).collect();
    assert!(acks.len() >= 3, "{acks:?}");
    for x in &acks {
        assert_eq!((x.aeth, x.ack_req), (Some(CREDITS_INVALID), false), "{x:?}");
    }
    // No packet of either side has MigReq.
    let all = wire(&p);
    assert!(all.iter().any(|x| x.from == A) && all.iter().any(|x| x.from == B));
    for x in &all {
        assert!(!x.mig_req, "MigReq under rxe: {x:?}");
    }
}

#[test]
fn cx_profile_sets_mig_req_everywhere_and_ack_req_on_a_qps_first_packet() {
    let mut p = pair(12, WireProfile::CX, WireProfile::CX);
    let (a, b) = p.connect_rc(opts());
    p.fill(A, BASE, &[5u8; 3000]);
    p.fill(B, BASE + 0x8000, &[6u8; 3000]);
    post_recvs(&mut p, B, &b, 10);
    post_recvs(&mut p, A, &a, 10);
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 3000);
    post(&mut p, A, &a, 2, SendOp::Send, BASE, 3000);
    p.drive(STEPS);
    // Delivered (the responder checks the ICRC, which covers the MigReq bit).
    assert_eq!(statuses(&mut p, A, a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(statuses(&mut p, B, b.cq), vec![(1000, WcStatus::Success), (1001, WcStatus::Success)]);
    let w = wire(&p);
    let a_sent: Vec<(Opcode, u32, bool)> =
        w.iter().filter(|x| x.from == A).map(|x| (x.opcode, x.psn, x.ack_req)).collect();
    assert_eq!(
        a_sent,
        vec![
            // The QP's first packet (PSN = its sq_psn, 100) asks for an ACK although it is a FIRST.
            (Opcode::RC_SEND_FIRST, 100, true),
            (Opcode::RC_SEND_MIDDLE, 101, false),
            (Opcode::RC_SEND_LAST, 102, true),
            // The second message's FIRST does not.
            (Opcode::RC_SEND_FIRST, 103, false),
            (Opcode::RC_SEND_MIDDLE, 104, false),
            (Opcode::RC_SEND_LAST, 105, true),
        ]
    );
    // B answers each AckReq: the FIRST too.
    let b_acks: Vec<(Opcode, u32)> = w.iter().filter(|x| x.from == B).map(|x| (x.opcode, x.psn)).collect();
    assert_eq!(
        b_acks,
        vec![(Opcode::RC_ACKNOWLEDGE, 100), (Opcode::RC_ACKNOWLEDGE, 102), (Opcode::RC_ACKNOWLEDGE, 105)]
    );

    // B's own first request (PSN 5000, its sq_psn) asks for an ACK too; its READ responses and
    // A's ACKs carry MigReq as well.
    let n = p.log.len();
    post(&mut p, B, &b, 3, SendOp::Send, BASE, 3000);
    post(&mut p, A, &a, 4, SendOp::Read { remote_addr: BASE + 0x8000, rkey: b.mr.rkey }, BASE + 0x2_0000, 3000);
    p.drive(STEPS);
    assert_eq!(statuses(&mut p, B, b.cq), vec![(3, WcStatus::Success)]);
    assert_eq!(statuses(&mut p, A, a.cq), vec![(4, WcStatus::Success), (1000, WcStatus::Success)]);
    let later = wire_since(&p, n);
    let b_req: Vec<(Opcode, u32, bool)> = later
        .iter()
        .filter(|x| {
            x.from == B && matches!(x.opcode, Opcode::RC_SEND_FIRST | Opcode::RC_SEND_MIDDLE | Opcode::RC_SEND_LAST)
        })
        .map(|x| (x.opcode, x.psn, x.ack_req))
        .collect();
    assert_eq!(
        b_req,
        vec![
            (Opcode::RC_SEND_FIRST, 5000, true),
            (Opcode::RC_SEND_MIDDLE, 5001, false),
            (Opcode::RC_SEND_LAST, 5002, true)
        ]
    );
    let opcodes: std::collections::BTreeSet<(usize, u8)> = later.iter().map(|x| (x.from, x.opcode.0)).collect();
    for (from, op) in [
        (A, Opcode::RC_RDMA_READ_REQUEST),
        (A, Opcode::RC_ACKNOWLEDGE),
        (B, Opcode::RC_RDMA_READ_RESPONSE_FIRST),
        (B, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE),
        (B, Opcode::RC_RDMA_READ_RESPONSE_LAST),
    ] {
        assert!(opcodes.contains(&(from, op.0)), "side {from} sent no {op:?}: {later:?}");
    }
    // Every packet of both sides has MigReq.
    let all = wire(&p);
    for x in &all {
        assert!(x.mig_req, "no MigReq under cx: {x:?}");
    }
}

#[test]
fn profiles_are_per_device_and_interoperate() {
    // A runs cx, B rxe: each side's packets follow its own profile, and each accepts the other's.
    let mut p = pair(13, WireProfile::CX, WireProfile::RXE);
    let (a, b) = p.connect_rc(opts());
    p.fill(A, BASE, &[5u8; 3000]);
    post_recvs(&mut p, B, &b, 10);
    post_recvs(&mut p, A, &a, 10);
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 3000);
    post(&mut p, B, &b, 2, SendOp::Send, BASE, 3000);
    p.drive(STEPS);
    assert_eq!(statuses(&mut p, A, a.cq), vec![(1, WcStatus::Success), (1000, WcStatus::Success)]);
    assert_eq!(statuses(&mut p, B, b.cq), vec![(2, WcStatus::Success), (1000, WcStatus::Success)]);
    let w = wire(&p);
    for x in &w {
        assert_eq!(x.mig_req, x.from == A, "{x:?}");
        if x.opcode == Opcode::RC_ACKNOWLEDGE {
            let expect = if x.from == A { credit_code(9) } else { CREDITS_INVALID };
            assert_eq!(x.aeth, Some(expect), "{x:?}");
        }
    }
    let first = |side: usize| -> Vec<bool> {
        w.iter().filter(|x| x.from == side && x.aeth.is_none()).map(|x| x.ack_req).collect()
    };
    assert_eq!(first(A), vec![true, false, true], "cx asks on its first packet");
    assert_eq!(first(B), vec![false, false, true], "rxe only on the last");
}

#[test]
fn cx_ack_credits_count_the_receive_queue() {
    let mut p = pair(14, WireProfile::CX, WireProfile::CX);
    let (a, b) = p.connect_rc(opts());
    p.fill(A, BASE, &[5u8; 3000]);
    post_recvs(&mut p, B, &b, 10);
    // One SEND consumes one of the 10: 9 left, the largest Table 44 count not above 9 is 8.
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 100);
    p.drive(STEPS);
    assert_eq!(credit_code(9), 6);
    assert_eq!(credit_count(6), Some(8));
    let acks = |w: &[Wire]| -> Vec<(Opcode, u32, Option<u8>)> {
        w.iter().filter(|x| x.from == B).map(|x| (x.opcode, x.psn, x.aeth)).collect()
    };
    assert_eq!(acks(&wire(&p)), vec![(Opcode::RC_ACKNOWLEDGE, 100, Some(6))]);

    // A WRITE consumes none: still 9. An atomic's ACK counts them too.
    let n = p.log.len();
    post(&mut p, A, &a, 2, SendOp::Write { remote_addr: BASE + 0x4_0000, rkey: b.mr.rkey }, BASE, 100);
    post(
        &mut p,
        A,
        &a,
        3,
        SendOp::FetchAdd { remote_addr: BASE + 0x5_0000, rkey: b.mr.rkey, add: 1 },
        BASE + 0x6000,
        8,
    );
    p.drive(STEPS);
    assert_eq!(
        acks(&wire_since(&p, n)),
        vec![(Opcode::RC_ACKNOWLEDGE, 101, Some(6)), (Opcode::RC_ATOMIC_ACKNOWLEDGE, 102, Some(6))]
    );

    // 30 more: 39; a 3-packet SEND takes one at its FIRST, so its ACK says 38 -> 32 (code 10).
    post_recvs(&mut p, B, &b, 30);
    let n = p.log.len();
    post(&mut p, A, &a, 4, SendOp::Send, BASE, 3000);
    p.drive(STEPS);
    assert_eq!(credit_code(38), 10);
    assert_eq!(credit_count(10), Some(32));
    assert_eq!(acks(&wire_since(&p, n)), vec![(Opcode::RC_ACKNOWLEDGE, 105, Some(10))]);

    // Consume all but 2 (36 SENDs, one AckReq each): 2 left is code 2; then 2 more: 0 is code 0.
    for i in 0..36 {
        post(&mut p, A, &a, 10 + i, SendOp::Send, BASE, 8);
    }
    p.drive(STEPS);
    let last = wire(&p).into_iter().rfind(|x| x.from == B).unwrap();
    assert_eq!((last.opcode, last.psn, last.aeth), (Opcode::RC_ACKNOWLEDGE, 141, Some(2)));
    let n = p.log.len();
    post(&mut p, A, &a, 50, SendOp::Send, BASE, 8);
    post(&mut p, A, &a, 51, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    assert_eq!(
        acks(&wire_since(&p, n)),
        vec![(Opcode::RC_ACKNOWLEDGE, 142, Some(1)), (Opcode::RC_ACKNOWLEDGE, 143, Some(0))]
    );
    p.poll_successes(A, a.cq, 4 + 36 + 2);
    assert_eq!(p.poll(B, b.cq).len(), 1 + 1 + 36 + 2);
    // MigReq on all of them, the atomic and its ACK included.
    let w = wire(&p);
    assert!(w.iter().any(|x| x.opcode == Opcode::RC_FETCH_ADD));
    for x in &w {
        assert!(x.mig_req, "no MigReq under cx: {x:?}");
    }
}

#[test]
fn cx_rnr_nak_keeps_its_timer_code() {
    // NAKs are not credits: with no receive posted the answer is an RNR NAK with the timer code.
    let mut p = pair(15, WireProfile::CX, WireProfile::CX);
    let (a, b) = p.connect_rc(RcOptions { min_rnr_timer: 3, ..opts() });
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 100);
    while !p.log.iter().any(|s| s.from == B) {
        assert!(p.step(), "B never answered");
    }
    let nak = parse(p.log.iter().find(|s| s.from == B).unwrap());
    assert_eq!((nak.opcode, nak.psn, nak.aeth, nak.mig_req), (Opcode::RC_ACKNOWLEDGE, 100, Some(0x20 | 3), true));
    // Two receives posted: the retry is ACKed with 1 left.
    post_recvs(&mut p, B, &b, 2);
    p.drive(STEPS);
    let ack = wire(&p).into_iter().rfind(|x| x.from == B).unwrap();
    assert_eq!((ack.opcode, ack.psn, ack.aeth), (Opcode::RC_ACKNOWLEDGE, 100, Some(credit_code(1))));
    assert_eq!(credit_code(1), 1);
    assert_eq!(statuses(&mut p, A, a.cq), vec![(1, WcStatus::Success)]);
}

#[test]
fn cx_ack_credits_are_invalid_for_a_qp_on_an_srq() {
    let mut p = pair(16, WireProfile::CX, WireProfile::CX);
    let (a, b) = p.connect_rc(RcOptions { b_srq: Some(64), ..opts() });
    let srq = b.srq.expect("B is on an SRQ");
    for i in 0..10 {
        p.b.post_srq_recv(srq, RecvWr { wr_id: 100 + i, sg_list: sge(&b, BASE + 0x1000, 4096) }).unwrap();
    }
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 100);
    post(&mut p, A, &a, 2, SendOp::Write { remote_addr: BASE + 0x4_0000, rkey: b.mr.rkey }, BASE, 100);
    p.drive(STEPS);
    assert_eq!(statuses(&mut p, A, a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(statuses(&mut p, B, b.cq), vec![(100, WcStatus::Success)]);
    let b_sent: Vec<(Opcode, u32, Option<u8>, bool)> =
        wire(&p).iter().filter(|x| x.from == B).map(|x| (x.opcode, x.psn, x.aeth, x.mig_req)).collect();
    assert_eq!(
        b_sent,
        vec![
            (Opcode::RC_ACKNOWLEDGE, 100, Some(CREDITS_INVALID), true),
            (Opcode::RC_ACKNOWLEDGE, 101, Some(CREDITS_INVALID), true)
        ]
    );
}

#[test]
fn cx_ack_credits_are_invalid_for_an_xrc_target() {
    let mut p = pair(17, WireProfile::CX, WireProfile::CX);
    // Target on B: a domain, an XRC SRQ with 10 receives, a target QP.
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let xrcd = p.b.open_xrcd(OWNER, Some(9), true, false).unwrap();
    let tpd = p.b.alloc_pd(OWNER);
    let tmr = p.b.reg_mr(tpd, BASE, MEM as u64, all).unwrap();
    let tcq = p.b.create_cq(256).unwrap();
    let srqn = p.b.create_xrc_srq(xrcd, tpd, tcq, SrqAttr { max_wr: 64, max_sge: 2, srq_limit: 0 }).unwrap();
    for i in 0..10 {
        let sg_list = vec![Sge { addr: BASE + 0x1000, length: 256, lkey: tmr.lkey }];
        p.b.post_srq_recv(srqn, RecvWr { wr_id: 100 + i, sg_list }).unwrap();
    }
    let (tgt, _handle) = p.b.create_xrc_tgt_qp(OWNER, xrcd).unwrap();
    // Initiator on A.
    let ipd = p.a.alloc_pd(OWNER);
    let icq = p.a.create_cq(256).unwrap();
    let imr = p.a.reg_mr(ipd, BASE, MEM as u64, Access::LOCAL_WRITE).unwrap();
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 0, max_send_sge: 2, max_recv_sge: 0, max_inline_data: 0 };
    let ini: Qpn =
        p.a.create_qp(QpInit {
            qp_type: QpType::XrcIni,
            pd: ipd,
            send_cq: icq,
            recv_cq: icq,
            caps,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let o = RcOptions::default();
    Pair::bring_up(&mut p.a, ini, QpType::XrcIni, &o, ADDR_B, tgt, 10, 0, 0);
    Pair::bring_up(&mut p.b, tgt, QpType::XrcTgt, &o, ADDR_A, ini, 0, 10, 0);
    let xsend = |p: &mut Pair, wr_id: u64, op: SendOp, addr: u64, len: u32| {
        let mut w = SendWr::new(wr_id, op, vec![Sge { addr, length: len, lkey: imr.lkey }]);
        w.remote_srqn = srqn;
        p.a.post_send(ini, w).unwrap();
    };
    p.fill(B, BASE + 0x8000, &[6u8; 100]);
    xsend(&mut p, 1, SendOp::Send, BASE, 10);
    xsend(&mut p, 2, SendOp::Read { remote_addr: BASE + 0x8000, rkey: tmr.rkey }, BASE + 0x2_0000, 100);
    p.drive(STEPS);
    let wa = p.a.poll_cq(icq, 16);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, WcOpcode::Send), (2, WcStatus::Success, WcOpcode::RdmaRead)]
    );
    assert_eq!(p.b.poll_cq(tcq, 16).len(), 1);
    let w = wire(&p);
    let b_sent: Vec<(Opcode, u32, Option<u8>, bool)> =
        w.iter().filter(|x| x.from == B).map(|x| (x.opcode, x.psn, x.aeth, x.mig_req)).collect();
    assert_eq!(
        b_sent,
        vec![
            (Opcode::XRC_ACKNOWLEDGE, 10, Some(CREDITS_INVALID), true),
            // The READ response follows read_response_credits, not the ACK policy.
            (Opcode::XRC_RDMA_READ_RESPONSE_ONLY, 11, Some(0), true),
        ]
    );
    // The initiator's first packet (PSN 10) asks for an ACK; every packet has MigReq.
    let a_sent: Vec<(Opcode, u32, bool, bool)> =
        w.iter().filter(|x| x.from == A).map(|x| (x.opcode, x.psn, x.ack_req, x.mig_req)).collect();
    assert_eq!(a_sent, vec![(Opcode::XRC_SEND_ONLY, 10, true, true), (Opcode::XRC_RDMA_READ_REQUEST, 11, true, true)]);
}

/// READ response AETH credit codes from a responder under `behaviour` with 10 receives queued.
fn read_response_aeths(seed: u64, behaviour: WireProfile) -> Vec<(Opcode, Option<u8>)> {
    let mut p = pair(seed, behaviour, behaviour);
    let (a, b) = p.connect_rc(opts());
    post_recvs(&mut p, B, &b, 10);
    p.fill(B, BASE + 0x8000, &[6u8; 3000]);
    post(&mut p, A, &a, 1, SendOp::Read { remote_addr: BASE + 0x8000, rkey: b.mr.rkey }, BASE + 0x2_0000, 3000);
    post(&mut p, A, &a, 2, SendOp::Read { remote_addr: BASE + 0x8000, rkey: b.mr.rkey }, BASE + 0x3_0000, 100);
    p.drive(STEPS);
    assert_eq!(statuses(&mut p, A, a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.read(A, BASE + 0x2_0000, 3000), vec![6u8; 3000]);
    wire(&p).iter().filter(|x| x.from == B).map(|x| (x.opcode, x.aeth)).collect()
}

#[test]
fn read_response_credits_are_zero_under_cx_and_invalid_under_rxe() {
    let expect = |c: u8| {
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, Some(c)),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, None),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, Some(c)),
            (Opcode::RC_RDMA_READ_RESPONSE_ONLY, Some(c)),
        ]
    };
    // cx: 0, although the responder has 10 receives queued (not the ACK credit count, 8 = code 6).
    assert_eq!(read_response_aeths(18, WireProfile::CX), expect(0));
    assert_eq!(read_response_aeths(18, WireProfile::RXE), expect(CREDITS_INVALID));
}

// End-to-end credits at the requester (IBTA 9.7.7.2): whatever its own profile, a requester
// starts a message that takes a receive WQE (SEND, RDMA WRITE with immediate) only within the
// limit the responder's last ACK set (its MSN plus its credit count), or, with nothing
// unacknowledged, one message to learn a fresh count. A responder that sends the invalid count
// (rxe) sets no limit.

/// B's answers since the log's `from`-th entry: (PSN, AETH syndrome byte).
fn answers_since(p: &Pair, from: usize) -> Vec<(u32, u8)> {
    wire_since(p, from).iter().filter(|x| x.from == B).filter_map(|x| x.aeth.map(|s| (x.psn, s))).collect()
}

/// A's request PSNs since the log's `from`-th entry, in order.
fn requests_since(p: &Pair, from: usize) -> Vec<u32> {
    wire_since(p, from).iter().filter(|x| x.from == A && x.aeth.is_none()).map(|x| x.psn).collect()
}

/// Steps until B has sent an RNR NAK since the log's `from`-th entry.
fn step_to_rnr_nak(p: &mut Pair, from: usize) {
    while !answers_since(p, from).iter().any(|&(_, s)| s & 0x60 == 0x20) {
        assert!(p.step(), "B never sent an RNR NAK: {:?}", wire_since(p, from));
    }
}

#[test]
fn a_requester_sends_into_no_more_receive_wqes_than_the_responders_credits() {
    // A runs rxe (whose own ACKs carry no credits): honouring the peer's count is not a profile
    // choice. B counts (cx), with 4 receives.
    let mut p = pair(17, WireProfile::RXE, WireProfile::CX);
    let (a, b) = p.connect_rc(RcOptions { min_rnr_timer: 1, ..opts() });
    post_recvs(&mut p, B, &b, 4);
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    // MSN 1, 3 WQEs left (code 3): the limit is SSN 4.
    assert_eq!(answers_since(&p, 0), vec![(100, credit_code(3))]);
    let n = p.log.len();
    for i in 0..10 {
        post(&mut p, A, &a, 10 + i, SendOp::Send, BASE, 8);
    }
    step_to_rnr_nak(&mut p, n);
    // SSNs 2-4 leave at once; once all are acknowledged (the last ACK says 0 left), one more
    // message goes alone (PSN 104), and only it meets the empty queue. A requester blind to
    // credits sent all ten, and the responder dropped the six behind the RNR-NAKed one.
    assert_eq!(requests_since(&p, n), vec![101, 102, 103, 104]);
    assert_eq!(answers_since(&p, n), vec![(101, credit_code(2)), (102, credit_code(1)), (103, 0), (104, 0x20 | 1)]);
    // Eight receives: the resent SSN 5 takes one, its ACK counts 7 (code 5: 6 credits), the
    // limit is SSN 11, and the six left go.
    post_recvs(&mut p, B, &b, 8);
    let m = p.log.len();
    p.drive(STEPS);
    assert_eq!(requests_since(&p, m), vec![104, 105, 106, 107, 108, 109, 110]);
    let after = answers_since(&p, m);
    assert_eq!(after.first(), Some(&(104, credit_code(7))));
    assert!(after.iter().all(|&(_, s)| s & 0x60 == 0), "only ACKs after the receives: {after:?}");
    p.poll_successes(A, a.cq, 11);
    assert_eq!(p.poll(B, b.cq).len(), 11);
    // One RNR NAK in all, and no PSN sequence NAK: nothing was sent to be dropped.
    let naks: Vec<(u32, u8)> = answers_since(&p, 0).into_iter().filter(|&(_, s)| s & 0x60 != 0).collect();
    assert_eq!(naks, vec![(104, 0x20 | 1)]);
}

#[test]
fn credits_bound_only_the_messages_that_take_a_receive_wqe() {
    let mut p = pair(18, WireProfile::CX, WireProfile::CX);
    let (a, b) = p.connect_rc(opts());
    post_recvs(&mut p, B, &b, 2);
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    // MSN 1, one WQE left: the limit is SSN 2.
    assert_eq!(answers_since(&p, 0), vec![(100, credit_code(1))]);
    let n = p.log.len();
    for i in 0..5 {
        post(&mut p, A, &a, 10 + i, SendOp::Write { remote_addr: BASE + 0x4_0000, rkey: b.mr.rkey }, BASE, 64);
    }
    let imm = SendOp::WriteWithImm { remote_addr: BASE + 0x5_0000, rkey: b.mr.rkey, imm: 7 };
    post(&mut p, A, &a, 20, imm, BASE, 64);
    // Until B's first answer: the five WRITEs (SSNs 2-6) left, the WRITE with immediate (SSN 7,
    // past the limit) did not, although B has a WQE for it. The SSN counts every message, as the
    // MSN does, so the limit errs on the side of waiting.
    while !wire_since(&p, n).iter().any(|x| x.from == B) {
        assert!(p.step(), "B never answered");
    }
    let first_answer = wire_since(&p, n).iter().position(|x| x.from == B).unwrap();
    let before: Vec<(Opcode, u32)> =
        wire_since(&p, n)[..first_answer].iter().filter(|x| x.from == A).map(|x| (x.opcode, x.psn)).collect();
    let writes: Vec<(Opcode, u32)> = (101..106).map(|psn| (Opcode::RC_RDMA_WRITE_ONLY, psn)).collect();
    assert_eq!(before, writes);
    // The WRITEs' ACKs move the limit (MSN 6 + 1): the WRITE with immediate goes and takes the WQE.
    p.drive(STEPS);
    let imm_pkts: Vec<u32> = wire_since(&p, n)
        .iter()
        .filter(|x| x.opcode == Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
        .map(|x| x.psn)
        .collect();
    assert_eq!(imm_pkts, vec![106]);
    p.poll_successes(A, a.cq, 7);
    let wb = p.poll(B, b.cq);
    assert_eq!(wb.iter().map(|w| w.opcode).collect::<Vec<_>>(), vec![WcOpcode::Recv, WcOpcode::RecvRdmaWithImm]);
    assert!(answers_since(&p, 0).iter().all(|&(_, s)| s & 0x60 == 0), "no NAK of any kind");
}

#[test]
fn invalid_credits_set_no_limit() {
    // B runs rxe (0x1F in every ACK): A sends all ten at once, as rxe's requester does, and the
    // empty receive queue answers with an RNR NAK.
    let mut p = pair(19, WireProfile::CX, WireProfile::RXE);
    let (a, b) = p.connect_rc(RcOptions { min_rnr_timer: 1, ..opts() });
    post_recvs(&mut p, B, &b, 4);
    post(&mut p, A, &a, 1, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    assert_eq!(answers_since(&p, 0), vec![(100, CREDITS_INVALID)]);
    let n = p.log.len();
    for i in 0..10 {
        post(&mut p, A, &a, 10 + i, SendOp::Send, BASE, 8);
    }
    step_to_rnr_nak(&mut p, n);
    let sent = requests_since(&p, n);
    assert_eq!(sent[..10], (101..111).collect::<Vec<u32>>()[..]);
    post_recvs(&mut p, B, &b, 8);
    p.drive(STEPS);
    p.poll_successes(A, a.cq, 11);
}
