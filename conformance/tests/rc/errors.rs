//! Errors: NAK codes for access and invalid requests, local errors, verbs calls that fail,
//! QPs entering the error, SQD and reset states, CQ overflow, bad ICRCs (IBTA Vol 1 9.7.5.2 for
//! the NAKs, chapter 10 for QP states, chapter 11 for the verbs).

use super::*;

#[test]
fn bad_rkey_is_remote_access_error_and_responder_goes_to_error() {
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
fn sends_posted_in_error_complete_flushed() {
    let (mut p, a, _b) = setup(RcOptions::default());
    let attr = softrdma_engine::device::QpAttr { qp_state: QpState::Err, ..Default::default() };
    p.dev(A).modify_qp(a.qpn, &attr, softrdma_engine::verbs::AttrMask::STATE).unwrap();
    let mut w = SendWr::new(5, SendOp::Send, vec![]);
    w.signaled = false;
    p.dev(A).post_send(a.qpn, w).unwrap();
    assert_eq!(p.statuses(A, a.cq), vec![(5, WcStatus::WrFlushErr)]);
}

#[test]
fn a_receive_taken_by_a_message_in_progress_completes_flushed_when_the_qp_enters_error() {
    // IBTA 10.3.1: in the Error state every outstanding receive WQE completes with
    // WR_FLUSH_ERR, including the one the first packets of a multi-packet SEND consumed.
    let (mut p, a, b) = setup(RcOptions { mtu: Mtu::Mtu1024, ..RcOptions::default() });
    p.fill(A, BASE, &pattern(5000, 3));
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 8192);
    post_recv(&mut p, B, &b, 8, BASE + 0x20000, 8192);
    // Only the SEND FIRST reaches B: the message stays in progress there.
    p.set_filter(|s| if s.from == A && s.opcode != Opcode::RC_SEND_FIRST { Fate::Drop } else { Fate::Deliver });
    send(&mut p, &a, 1, SendOp::Send, BASE, 5000);
    p.drive(1_000);
    assert!(p.poll(B, b.cq).is_empty());
    let attr = softrdma_engine::device::QpAttr { qp_state: QpState::Err, ..Default::default() };
    p.dev(B).modify_qp(b.qpn, &attr, softrdma_engine::verbs::AttrMask::STATE).unwrap();
    assert_eq!(p.statuses(B, b.cq), vec![(7, WcStatus::WrFlushErr), (8, WcStatus::WrFlushErr)]);
}

#[test]
fn modify_qp_with_a_wrong_mask_is_einval_and_the_state_stays() {
    use softrdma_engine::device::QpAttr;
    use softrdma_engine::verbs::{AttrMask, VerbsError};
    let mut p = Pair::new(1);
    let (a, _b) = p.connect_rc(RcOptions::default());
    // RTS -> RTS may not set the path MTU (kernel qp_state_table, IBTA 11.2.4.2).
    let attr = QpAttr { qp_state: QpState::Rts, ..QpAttr::default() };
    assert_eq!(p.a.modify_qp(a.qpn, &attr, AttrMask::STATE | AttrMask::PATH_MTU), Err(VerbsError::Inval));
    assert_eq!(p.a.query_qp(a.qpn).unwrap().0, QpState::Rts);
    // RTS -> INIT is not a transition at all.
    let attr = QpAttr { qp_state: QpState::Init, ..QpAttr::default() };
    assert_eq!(p.a.modify_qp(a.qpn, &attr, AttrMask::STATE), Err(VerbsError::Inval));
    // A CUR_STATE that is not the current state.
    let attr = QpAttr { qp_state: QpState::Rts, cur_qp_state: QpState::Rtr, ..QpAttr::default() };
    assert_eq!(p.a.modify_qp(a.qpn, &attr, AttrMask::STATE | AttrMask::CUR_STATE), Err(VerbsError::Inval));
    assert_eq!(p.a.query_qp(a.qpn).unwrap().0, QpState::Rts);
}

#[test]
fn create_qp_beyond_the_device_limits_is_einval() {
    use softrdma_engine::device::{QpCaps, QpInit};
    use softrdma_engine::verbs::{QpType, VerbsError};
    let mut p = Pair::new(1);
    let pd = p.a.alloc_pd(7);
    let cq = p.a.create_cq(16).unwrap();
    let init = |caps| QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None };
    let ok = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    assert!(p.a.create_qp(init(ok)).is_ok());
    for bad in [
        QpCaps { max_send_wr: 1 << 20, ..ok },
        QpCaps { max_recv_sge: 1000, ..ok },
        QpCaps { max_inline_data: 1 << 20, ..ok },
    ] {
        assert_eq!(p.a.create_qp(init(bad)), Err(VerbsError::Inval));
    }
    assert_eq!(p.a.create_cq(1 << 20), Err(VerbsError::Inval));
    assert_eq!(p.a.destroy_cq(cq), Err(VerbsError::Busy), "a QP uses it");
}

#[test]
fn post_send_beyond_queue_depth_is_enomem() {
    use softrdma_engine::verbs::VerbsError;
    let (mut p, a, _b) = setup(RcOptions { depth: 2, ..RcOptions::default() });
    p.dev(A).post_send(a.qpn, SendWr::new(1, SendOp::Send, vec![])).unwrap();
    p.dev(A).post_send(a.qpn, SendWr::new(2, SendOp::Send, vec![])).unwrap();
    assert_eq!(p.dev(A).post_send(a.qpn, SendWr::new(3, SendOp::Send, vec![])), Err(VerbsError::NoMem));
}

#[test]
fn qp_without_remote_write_access_naks_writes() {
    // The responder checks the QP's own access flags, not only the region's (as rxe's check_op_valid does).
    let (mut p, a, b) = setup(RcOptions {
        access: softrdma_engine::verbs::Access::LOCAL_WRITE | softrdma_engine::verbs::Access::REMOTE_READ,
        ..RcOptions::default()
    });
    send(&mut p, &a, 1, SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn misaligned_atomic_is_an_invalid_request() {
    let (mut p, a, b) = setup(RcOptions::default());
    send(&mut p, &a, 1, SendOp::FetchAdd { remote_addr: BASE + 4, rkey: b.mr.rkey, add: 1 }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemInvReqErr);
    assert!(p.log.iter().any(|s| s.from == B && s.syndrome == Some(0x61)));
}

#[test]
fn message_longer_than_the_receive_buffer_is_loc_len_err_and_invalid_request() {
    let (mut p, a, b) = setup(RcOptions::default());
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 16);
    send(&mut p, &a, 1, SendOp::Send, BASE, 32);
    p.drive(STEPS);
    let wb = p.poll(B, b.cq);
    assert_eq!((wb[0].wr_id, wb[0].status), (7, WcStatus::LocLenErr));
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn bad_local_key_is_loc_prot_err() {
    let (mut p, a, _b) = setup(RcOptions::default());
    let wr = SendWr::new(1, SendOp::Send, vec![Sge { addr: BASE, length: 8, lkey: a.mr.lkey ^ 1 }]);
    p.dev(A).post_send(a.qpn, wr).unwrap();
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::LocProtErr);
    assert_eq!(p.a.query_qp(a.qpn).unwrap().0, QpState::Err);
}

#[test]
fn cq_overflow_raises_cq_error() {
    let (mut p, a, _b) = setup(RcOptions { cqe: 2, depth: 8, ..RcOptions::default() });
    for i in 0..4 {
        p.dev(A).post_send(a.qpn, SendWr::new(i, SendOp::Write { remote_addr: 0, rkey: 0 }, vec![])).unwrap();
    }
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq).len(), 2);
    assert_eq!(p.a.poll_event(), Some(AsyncEvent::CqErr(a.cq)));
}

#[test]
fn destroying_a_qp_removes_its_completions() {
    let (mut p, a, _b) = setup(RcOptions::default());
    p.dev(A).post_send(a.qpn, SendWr::new(1, SendOp::Write { remote_addr: 0, rkey: 0 }, vec![])).unwrap();
    p.drive(STEPS);
    p.a.destroy_qp(a.qpn).unwrap();
    assert!(p.poll(A, a.cq).is_empty());
}

#[test]
fn corrupted_packets_fail_the_icrc_and_are_dropped() {
    let (mut p, a, b) = setup(RcOptions { timeout: 10, ..RcOptions::default() });
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    p.fill(A, BASE, b"payload!");
    let dev_b_seen = std::rc::Rc::new(std::cell::Cell::new(0));
    let mut first = true;
    p.set_filter(move |s| {
        let _ = &dev_b_seen;
        if s.from == 0 && first {
            first = false;
            Fate::Corrupt
        } else {
            Fate::Deliver
        }
    });
    send(&mut p, &a, 1, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.b.counters().icrc_err, 1);
    assert_eq!(p.read(B, BASE + 0x1000, 8), b"payload!".to_vec());
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn sqd_finishes_started_work_then_raises_sq_drained() {
    use softrdma_engine::device::QpAttr;
    use softrdma_engine::verbs::AttrMask;
    let (mut p, a, b) = setup(RcOptions::default());
    p.fill(A, BASE, &pattern(64, 14));
    send(&mut p, &a, 1, SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey }, BASE, 64);
    p.drive(STEPS);
    let attr = QpAttr { qp_state: QpState::Sqd, ..QpAttr::default() };
    p.a.modify_qp(a.qpn, &attr, AttrMask::STATE).unwrap();
    // Work posted in SQD waits: nothing new starts (IBTA 10.3.1, send queue drained state).
    send(&mut p, &a, 2, SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey }, BASE, 64);
    p.drive(STEPS);
    assert_eq!(p.sent(A).len(), 1);
    assert!(std::iter::from_fn(|| p.a.poll_event()).any(|e| e == AsyncEvent::SqDrained(a.qpn)));
    // Back to RTS: the waiting WRITE goes.
    let attr = QpAttr { qp_state: QpState::Rts, ..QpAttr::default() };
    p.a.modify_qp(a.qpn, &attr, AttrMask::STATE).unwrap();
    p.drive(STEPS);
    assert_eq!(p.sent(A).len(), 2);
    assert_eq!(p.poll(A, a.cq).len(), 2);
}

#[test]
fn resetting_a_qp_removes_its_completions() {
    use softrdma_engine::device::QpAttr;
    use softrdma_engine::verbs::AttrMask;
    let (mut p, a, _b) = setup(RcOptions::default());
    p.dev(A).post_send(a.qpn, SendWr::new(1, SendOp::Write { remote_addr: 0, rkey: 0 }, vec![])).unwrap();
    p.drive(STEPS);
    p.a.modify_qp(a.qpn, &QpAttr { qp_state: QpState::Reset, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    assert!(p.poll(A, a.cq).is_empty());
    assert_eq!(p.a.query_qp(a.qpn).unwrap().0, QpState::Reset);
}

#[test]
fn receive_buffer_with_a_bad_key_is_loc_prot_err_and_remote_operational_error() {
    let (mut p, a, b) = setup(RcOptions::default());
    let bad = RecvWr { wr_id: 7, sg_list: vec![Sge { addr: BASE, length: 64, lkey: b.mr.lkey ^ 0x80 }] };
    p.b.post_recv(b.qpn, bad).unwrap();
    send(&mut p, &a, 1, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    let wb = p.poll(B, b.cq);
    assert_eq!((wb[0].wr_id, wb[0].status), (7, WcStatus::LocProtErr));
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::RemOpErr);
    assert!(p.log.iter().any(|s| s.from == B && s.syndrome == Some(0x63)));
}

#[test]
fn icrc_with_an_unseen_ipv4_id_is_accepted_only_when_the_policy_allows() {
    use softrdma_engine::device::{Device, DeviceConfig, IcrcPolicy, RecvMeta};
    use softrdma_engine::memory::VecMemory;
    use softrdma_engine::wire::{icrc, IbPacket};
    // A request as a sender whose IPv4 ID was 0x4d2 would checksum it (rxe changes its IDs).
    let (mut p, a, b) = setup(RcOptions::default());
    p.fill(A, BASE, b"id!!");
    post_recv(&mut p, B, &b, 1, BASE + 0x1000, 64);
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    let mut buf = vec![0u8; 512];
    let t = p.a.poll_transmit(p.now, &mut buf).unwrap();
    let mut pkt = buf[..t.len].to_vec();
    let (hdr, n) = softrdma_engine::device::ip_udp_header(
        softrdma_conformance::pair::ADDR_A,
        softrdma_conformance::pair::ADDR_B,
        t.src_port,
        pkt.len(),
        0x4d2,
    );
    let body = pkt.len() - icrc::LEN;
    let crc = icrc::roce_v2_parts(&hdr[..n], &pkt[..body]).unwrap();
    IbPacket::new_unchecked(&mut pkt[..]).set_icrc(crc);
    let meta = RecvMeta { src: softrdma_conformance::pair::ADDR_A, src_port: t.src_port, ip_id: None, dst: None };
    // Exact (the default): dropped as a bad ICRC.
    p.b.handle_packet(p.now, meta, &pkt);
    assert_eq!(p.b.counters().icrc_err, 1);
    // Told the ID: accepted.
    p.b.handle_packet(p.now, RecvMeta { ip_id: Some(0x4d2), ..meta }, &pkt);
    assert_eq!(p.b.counters().rcvd_pkts, 1);
    // A device with AnyIpv4Id accepts it without being told, and counts the solve.
    let mut d = Device::new(
        DeviceConfig { icrc: IcrcPolicy::AnyIpv4Id, ..DeviceConfig::new(softrdma_conformance::pair::ADDR_B, 1) },
        VecMemory::new(),
    );
    d.handle_packet(p.now, meta, &pkt);
    assert_eq!((d.counters().icrc_err, d.counters().icrc_id_solved), (0, 1));
}
