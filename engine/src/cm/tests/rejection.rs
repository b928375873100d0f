//! REJ (IBTA Vol 1 12.6.7; Linux cm_issue_rej, cm_rej_handler, rdma_reject): the requests a
//! CM rejects, and how a REJ reaches the other side.

use super::*;

/// cm_match_req / cm_issue_rej: no listener for the service ID is REJ 8 at once, echoing the
/// REQ's TID and comm ID; rdma_cm reports REJECTED with the reason as status.
#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut p = Pair::new();
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    let rej = p.sent(CmAttr::Rej);
    assert_eq!(rej.len(), 1);
    assert_eq!((rej[0].at, rej[0].from, rej[0].dst), (Instant::ZERO, Side::B, A_IP));
    let (req_tid, req_comm) = (p.wire[0].repr.tid, p.wire[0].repr.msg.local_comm_id());
    assert_eq!(rej[0].repr.tid, req_tid);
    let CmMessage::Rej(r) = &rej[0].repr.msg else { unreachable!() };
    assert_eq!((r.reason, r.msg_rejected, r.remote_comm_id, r.local_comm_id), (8, 0, req_comm, 0));
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Rejected, 8));
    assert_eq!(p.a.state(a), Some(IdState::Closed));
    assert_eq!(p.a.poll_timeout(), None, "the REQ is not resent");
    assert_eq!(p.b.counters().rejs_sent, 1);
    assert!(p.events(Side::B).is_empty());
    assert_eq!(p.b.id_count(), 0);
}

/// rdma_reject: REJ reason 28 (consumer defined) with the consumer's private data.
#[test]
fn consumer_reject_reaches_the_active_side() {
    let mut p = Pair::new();
    let l = p.listen(PS_TCP, QpType::Rc, 0);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    let b = p.event(Side::B).id;
    p.b.reject(p.now, b, b"no thanks", reject::CONSUMER_DEFINED).unwrap();
    assert_eq!(p.b.state(b), Some(IdState::Closed));
    p.drive();
    let CmMessage::Rej(r) = &p.sent(CmAttr::Rej)[0].repr.msg else { unreachable!() };
    assert_eq!((r.reason, r.msg_rejected), (28, 0));
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Rejected, 28));
    assert!(ev.param.private_data.starts_with(b"no thanks"), "{:?}", ev.param.private_data);
    assert_eq!(p.a.state(a), Some(IdState::Closed));
    assert_eq!(p.a.poll_timeout(), None);
    // The rejected request no longer holds the listener: a reject of it again is EINVAL.
    assert_eq!(p.b.reject(p.now, b, &[], reject::CONSUMER_DEFINED), Err(CmError::Inval));
    assert_eq!(p.b.state(l), Some(IdState::Listen));
}

/// cm_destroy_id in REQ_SENT: REJ reason 4 (timeout), message rejected "other", our CA GUID as
/// the additional information; the active ID is gone at once.
#[test]
fn destroy_in_req_sent_sends_rej_timeout() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    assert_eq!(p.event(Side::B).kind, CmEventKind::ConnectRequest);
    p.a.destroy(p.now, a).unwrap();
    p.drive();
    let rej = p.sent(CmAttr::Rej);
    assert_eq!((rej.len(), rej[0].from, rej[0].dst), (1, Side::A, B_IP));
    assert_eq!(rej[0].repr.tid, p.wire[0].repr.tid);
    let CmMessage::Rej(r) = &rej[0].repr.msg else { unreachable!() };
    assert_eq!((r.reason, r.msg_rejected, r.reject_info_len), (4, 2, 8));
    assert_eq!((r.local_comm_id, r.remote_comm_id), (p.wire[0].repr.msg.local_comm_id(), 0));
    assert_eq!(&r.ari[..8], &A_GUID.to_be_bytes());
    assert_eq!(p.a.counters().rejs_sent, 1);
    assert_eq!(p.a.id_count(), 0);
    assert_eq!(p.a.poll_timeout(), None, "no REQ resend after destroy");
    assert!(p.events(Side::A).is_empty());
}

/// cm_rej_handler / cm_acquire_rejected_id: a REJ "timeout" carries no Remote Comm ID; the
/// receiver finds the connection by (the ARI's CA GUID, the REJ's Local Comm ID), so the passive
/// side's request in REQ_RCVD is rejected (REJECTED, status 4) and leaves the backlog.
#[test]

fn rej_timeout_reaches_the_passive_request() {
    let mut p = Pair::new();
    let l = p.listen(PS_TCP, QpType::Rc, 1);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    let b = p.event(Side::B).id;
    p.a.destroy(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.b.counters().mads_unmatched, 0, "the REJ matched");
    let ev = p.event(Side::B);
    assert_eq!((ev.id, ev.kind, ev.status), (b, CmEventKind::Rejected, 4));
    assert_eq!(p.b.state(b), Some(IdState::Closed));
    // The listener's single backlog slot is free again.
    p.dial(PS_TCP, QpType::Rc, SPORT + 1, req_param(0x101, b""));
    p.drive();
    let ev = p.event(Side::B);
    assert_eq!((ev.kind, ev.listen_id), (CmEventKind::ConnectRequest, Some(l)));
}

/// IBTA 12.9.8.3.1 / cm_match_req: a REQ from a (CA GUID, QPN) that is already connected is a
/// stale connection: REJ 10.
#[test]
fn second_req_from_a_connected_qp_is_stale() {
    let mut p = Pair::new();
    let (_a, _b, _) = p.connected();
    let a2 = p.dial(PS_TCP, QpType::Rc, SPORT + 1, req_param(0x100, b"again"));
    p.drive();
    assert!(p.events(Side::B).is_empty(), "no CONNECT_REQUEST");
    let rej = p.sent(CmAttr::Rej);
    assert_eq!(rej.len(), 1);
    let CmMessage::Rej(r) = &rej[0].repr.msg else { unreachable!() };
    let req2 = p.sent(CmAttr::Req)[1].repr.msg.local_comm_id();
    assert_eq!((r.reason, r.msg_rejected, r.remote_comm_id), (10, 0, req2));
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a2, CmEventKind::Rejected, 10));
    assert_eq!(p.a.state(a2), Some(IdState::Closed));
    // Another QP of the same CA is a new connection.
    let a3 = p.dial(PS_TCP, QpType::Rc, SPORT + 2, req_param(0x101, b""));
    p.drive();
    let ev = p.event(Side::B);
    assert_eq!((ev.kind, ev.param.qp_num), (CmEventKind::ConnectRequest, 0x101));
    assert_eq!(p.a.state(a3), Some(IdState::ReqSent));
}
