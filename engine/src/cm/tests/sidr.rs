//! UD connections through SIDR (IBTA Vol 1 12.11; Linux cm.c / cma.c's SIDR paths): the two
//! CMs of `super::Pair`, A active and B passive.

use super::*;
use crate::wire::{CmSidrRepRepr, CmSidrReqRepr};

/// 2^(20-8) ms: the SIDR_REQ resend interval (cma_resolve_ib_udp).
const SIDR_TIMEOUT: Duration = ms(4096);

fn sidr_req(s: &Sent) -> CmSidrReqRepr {
    match &s.repr.msg {
        CmMessage::SidrReq(r) => r.clone(),
        m => panic!("not a SIDR_REQ: {m:?}"),
    }
}

fn sidr_rep(s: &Sent) -> CmSidrRepRepr {
    match &s.repr.msg {
        CmMessage::SidrRep(r) => r.clone(),
        m => panic!("not a SIDR_REP: {m:?}"),
    }
}

fn ud_param(qp: u32, data: &[u8]) -> ConnParam {
    ConnParam { private_data: data.to_vec(), qp_num: qp, ..Default::default() }
}

#[test]
fn sidr_resolves_the_peers_qpn_and_qkey() {
    let mut p = Pair::new();
    let l = p.listen(PS_UDP, QpType::Ud, 0);
    let a = p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b"who serves 7174?"));
    p.drive();
    // cm_format_sidr_req: request ID = the local ID, P_Key 0xFFFF, the service ID of
    // RDMA_PS_UDP and the port, the IP header then the consumer's data.
    let req = sidr_req(&p.sent(CmAttr::SidrReq)[0]);
    assert_eq!(req.pkey, 0xffff);
    assert_eq!(req.service_id, service_id(PS_UDP, PORT));
    let hdr = CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&req.private_data[..]).unwrap()).unwrap();
    assert_eq!((hdr.src, hdr.dst, hdr.port), (A_IP, B_IP, SPORT));
    assert_eq!(&req.private_data[CmaHdrRepr::LEN..CmaHdrRepr::LEN + 16], b"who serves 7174?");
    let ev = p.event(Side::B);
    assert_eq!((ev.kind, ev.listen_id), (CmEventKind::ConnectRequest, Some(l)));
    assert!(ev.param.private_data.starts_with(b"who serves 7174?"));
    assert_eq!(p.b.state(ev.id), Some(IdState::ReqRcvd));
    let now = p.now;
    p.b.accept(now, ev.id, ud_param(0x345, b"me")).unwrap();
    p.drive();
    // cma_send_sidr_rep: status 0, the QPN, the port space's Q_Key, the service ID echoed.
    let rep = sidr_rep(&p.sent(CmAttr::SidrRep)[0]);
    assert_eq!(rep.request_id, req.request_id);
    assert_eq!((rep.status, rep.qpn, rep.qkey), (sidr_status::OK, 0x345, RDMA_UDP_QKEY));
    assert_eq!(rep.service_id, req.service_id);
    let est = p.event(Side::A);
    assert_eq!((est.id, est.kind, est.status), (a, CmEventKind::Established, 0));
    assert_eq!((est.param.qp_num, est.param.qkey), (0x345, RDMA_UDP_QKEY));
    assert!(est.param.private_data.starts_with(b"me"));
    // No connection follows: two MADs in all, and nothing when either side goes.
    assert_eq!(p.wire.len(), 2);
    assert_eq!(p.a.state(a), Some(IdState::Established));
    let now = p.now;
    p.a.disconnect(now, a).unwrap();
    p.a.destroy(now, a).unwrap();
    p.b.destroy(now, ev.id).unwrap();
    p.advance(ms(60_000));
    assert_eq!(p.wire.len(), 2, "{:?}", p.wire);
    assert!(p.events(Side::A).is_empty() && p.events(Side::B).is_empty());
}

#[test]
fn sidr_for_a_service_nobody_serves_is_unsupported() {
    // cm_sidr_req_handler with no listener: cm_reject_sidr_req(IB_SIDR_UNSUPPORTED); the active
    // side hears UNREACHABLE with the status (cma_sidr_rep_handler).
    let mut p = Pair::new();
    let a = p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    p.drive();
    assert_eq!(sidr_rep(&p.sent(CmAttr::SidrRep)[0]).status, sidr_status::UNSUPPORTED);
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Unreachable, 1));
    // A TCP listener on the same port is another service: still unsupported.
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    p.drive();
    assert_eq!(p.event(Side::A).status, i32::from(sidr_status::UNSUPPORTED));
}

#[test]
fn sidr_reject_answers_status_2_with_the_private_data() {
    let mut p = Pair::new();
    p.listen(PS_UDP, QpType::Ud, 0);
    let a = p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    p.drive();
    let ev = p.event(Side::B);
    let now = p.now;
    p.b.reject(now, ev.id, b"busy", reject::CONSUMER_DEFINED).unwrap();
    p.drive();
    let rep = sidr_rep(&p.sent(CmAttr::SidrRep)[0]);
    assert_eq!((rep.status, rep.qpn, rep.qkey), (sidr_status::REJECT, 0, 0));
    assert!(rep.private_data.starts_with(b"busy"));
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Unreachable, 2));
}

#[test]
fn a_held_sidr_req_is_rejected_when_its_id_is_destroyed() {
    // cm_destroy_id in IB_CM_SIDR_REQ_RCVD: cm_reject_sidr_req(IB_SIDR_REJECT).
    let mut p = Pair::new();
    p.listen(PS_UDP, QpType::Ud, 0);
    p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    p.drive();
    let ev = p.event(Side::B);
    let now = p.now;
    p.b.destroy(now, ev.id).unwrap();
    p.drive();
    assert_eq!(sidr_rep(&p.sent(CmAttr::SidrRep)[0]).status, sidr_status::REJECT);
    assert_eq!(p.event(Side::A).status, 2);
    assert_eq!(p.b.pending_count(), 0);
}

#[test]
fn an_unanswered_sidr_req_is_sent_16_times_then_unreachable() {
    // cma_resolve_ib_udp: timeout 2^(20-8) ms, CMA_MAX_CM_RETRIES (15) retries.
    let mut p = Pair::new();
    let a = p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    let mut drop_all = |_: &Sent| Fate::Drop;
    p.drive_with(&mut drop_all);
    p.advance_with(times(SIDR_TIMEOUT, 15), &mut drop_all);
    let reqs = p.sent(CmAttr::SidrReq);
    assert_eq!(reqs.len(), 16);
    assert!(reqs.windows(2).all(|w| w[1].at - w[0].at == SIDR_TIMEOUT));
    assert!(reqs.windows(2).all(|w| sidr_req(&w[0]) == sidr_req(&w[1])), "resends are the same SIDR_REQ");
    assert!(p.events(Side::A).is_empty(), "not before the last timeout");
    p.advance_with(SIDR_TIMEOUT, &mut drop_all);
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Unreachable, -110));
    assert_eq!(p.sent(CmAttr::SidrReq).len(), 16);
}

#[test]
fn a_lost_sidr_rep_is_recovered_by_the_resent_request() {
    // The first SIDR_REP is lost: the resent SIDR_REQ reaches a passive side that has already
    // answered and forgotten the request, so it is a new request (cm_send_sidr_rep_locked
    // removes it); the consumer answers again and the active side is established once.
    let mut p = Pair::new();
    p.listen(PS_UDP, QpType::Ud, 0);
    let a = p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    p.drive();
    let first = p.event(Side::B);
    let now = p.now;
    p.b.accept(now, first.id, ud_param(0x345, b"")).unwrap();
    let mut drop_reps = |s: &Sent| if s.attr() == CmAttr::SidrRep { Fate::Drop } else { Fate::Deliver };
    p.drive_with(&mut drop_reps);
    // A duplicate of a request still held is dropped, not reported twice.
    assert!(p.events(Side::A).is_empty());
    p.advance(SIDR_TIMEOUT);
    let again = p.event(Side::B);
    assert_ne!(again.id, first.id);
    let now = p.now;
    p.b.accept(now, again.id, ud_param(0x345, b"")).unwrap();
    p.drive();
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.param.qp_num), (a, CmEventKind::Established, 0x345));
}

#[test]
fn a_duplicate_sidr_req_while_the_consumer_decides_is_dropped() {
    let mut p = Pair::new();
    p.listen(PS_UDP, QpType::Ud, 0);
    p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    let mut dup = |_: &Sent| Fate::Duplicate;
    p.drive_with(&mut dup);
    assert_eq!(p.events(Side::B).len(), 1);
    assert!(p.sent(CmAttr::SidrRep).is_empty());
}

#[test]
fn a_sidr_rep_with_a_foreign_qkey_is_an_address_error() {
    // cma_set_qkey: the ID holds RDMA_UDP_QKEY; a SIDR_REP naming another Q_Key is -EINVAL
    // (RDMA_CM_EVENT_ADDR_ERROR).
    let mut p = Pair::new();
    let a = p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
    answer_a(&mut p, sidr_status::OK, 0x1111);
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::AddrError, -22));
    // A SIDR_REP for no request is counted, not acted on.
    let before = p.a.counters().mads_unmatched;
    let rep = CmSidrRepRepr { request_id: 0x0bad, status: 0, qpn: 9, qkey: RDMA_UDP_QKEY, ..Default::default() };
    let mut mad = vec![0u8; MAD_LEN];
    CmMadRepr { tid: 1, attr_mod: 0, msg: CmMessage::SidrRep(rep) }.emit(&mut mad).unwrap();
    let now = p.now;
    p.a.handle_mad(now, B_IP, &mad);
    assert_eq!(p.a.counters().mads_unmatched, before + 1);
    assert!(p.events(Side::A).is_empty());
}

#[test]
fn an_ipoib_id_has_no_qp_attributes_on_roce() {
    // cma_set_qkey for RDMA_PS_IPOIB asks the SA for the broadcast group's Q_Key; a RoCE port
    // has none: rdma_init_qp_attr (and so rdma_create_qp) fails with -ENODEV.
    let mut p = Pair::new();
    let h = p.a.create_id(PS_IPOIB, QpType::Ud);
    assert_eq!(p.a.init_qp_attr(h, QpState::Init), Err(CmError::NoDev));
    assert_eq!(CmError::NoDev.errno(), 19);
    let u = p.a.create_id(PS_UDP, QpType::Ud);
    let a = p.a.init_qp_attr(u, QpState::Init).unwrap();
    assert_eq!((a.attr.qkey, a.mask.contains(AttrMask::QKEY)), (RDMA_UDP_QKEY, true));
}

/// Sends `rep` to A as if from B, for A's outstanding SIDR_REQ.
fn answer_a(p: &mut Pair, status: u8, qkey: u32) {
    let m = p.a.poll_mad().expect("A's SIDR_REQ");
    let req = match CmMadRepr::parse(&m.mad).unwrap().msg {
        CmMessage::SidrReq(r) => r,
        m => panic!("not a SIDR_REQ: {m:?}"),
    };
    let rep = CmSidrRepRepr { request_id: req.request_id, status, qpn: 9, qkey, ..Default::default() };
    let mut mad = vec![0u8; MAD_LEN];
    CmMadRepr { tid: 1, attr_mod: 0, msg: CmMessage::SidrRep(rep) }.emit(&mut mad).unwrap();
    let now = p.now;
    p.a.handle_mad(now, B_IP, &mad);
}

#[test]
fn every_sidr_failure_status_reaches_the_consumer_as_unreachable() {
    // cma_sidr_rep_handler: any status but 0 is UNREACHABLE with the status itself (no QP 3,
    // redirect 4, unsupported class version 5, as other CMs may send them).
    for status in [sidr_status::NO_QP, sidr_status::REDIRECT, sidr_status::UNSUPPORTED_VERSION] {
        let mut p = Pair::new();
        let a = p.dial(PS_UDP, QpType::Ud, SPORT, ud_param(0x11, b""));
        answer_a(&mut p, status, 0);
        let ev = p.event(Side::A);
        assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Unreachable, i32::from(status)));
        assert_eq!(p.a.state(a), Some(IdState::Closed));
        assert_eq!(p.a.poll_timeout(), None, "no more resends");
    }
}

#[test]
fn a_sidr_req_without_a_valid_ip_header_is_rejected() {
    // cma_ib_req_handler cannot read the IP header (cma_save_net_info fails): the IB CM ID is
    // destroyed, which rejects the request (status 2); the consumer hears nothing.
    let mut p = Pair::new();
    p.listen(PS_UDP, QpType::Ud, 0);
    let req = CmSidrReqRepr {
        request_id: 77,
        pkey: 0xffff,
        service_id: service_id(PS_UDP, PORT),
        private_data: vec![0x55; 40], // version byte 0x55: not rdma_cm's header
    };
    let mut mad = vec![0u8; MAD_LEN];
    CmMadRepr { tid: 5, attr_mod: 0, msg: CmMessage::SidrReq(req) }.emit(&mut mad).unwrap();
    let now = p.now;
    p.b.handle_mad(now, A_IP, &mad);
    p.drive();
    let rep = sidr_rep(&p.sent(CmAttr::SidrRep)[0]);
    assert_eq!((rep.request_id, rep.status), (77, sidr_status::REJECT));
    assert!(p.events(Side::B).is_empty());
    // A truncated SIDR_REQ is counted malformed and answered by nothing.
    let before = p.b.counters().mads_malformed;
    p.b.handle_mad(now, A_IP, &mad[..40]);
    assert_eq!(p.b.counters().mads_malformed, before + 1);
}
