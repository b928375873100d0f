//! Lost, resent and duplicated REQs, REPs and RTUs: the CM's resend timers and MRA (IBTA Vol 1
//! 12.6.6; Linux cm.c's REQ and REP timers, cm_dup_req_handler, cm_dup_rep_handler,
//! cm_mra_handler).

use super::*;

/// cm_send_req + cma: a REQ nobody answers is sent 16 times (1 + max CM retries 15), every
/// 2 x 2^(18-8) + 2^(20-8) = 6144 ms, then REQ_ERROR: UNREACHABLE with -ETIMEDOUT.
#[test]
fn req_to_a_silent_peer_is_unreachable() {
    let mut p = Pair::new();
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    let mut silent = |_: &Sent| Fate::Drop;
    p.drive_with(&mut silent);
    p.advance_with(Duration::from_nanos(times(REQ_TIMEOUT, 16).as_nanos() - ms(1).as_nanos()), &mut silent);
    let req_times: Vec<u64> = p.sent(CmAttr::Req).iter().map(|s| s.at.as_nanos()).collect();
    let expected: Vec<u64> = (0..16).map(|i| times(REQ_TIMEOUT, i).as_nanos()).collect();
    assert_eq!(req_times, expected);
    assert!(p.sent(CmAttr::Req).iter().all(|s| s.repr == p.wire[0].repr), "resends are the same MAD");
    assert!(p.events(Side::A).is_empty(), "nothing before the last timeout");
    assert_eq!(p.a.state(a), Some(IdState::ReqSent));
    p.advance_with(ms(1), &mut silent);
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Unreachable, -110));
    assert_eq!(p.a.state(a), Some(IdState::Closed));
    assert_eq!(p.a.counters().mads_resent, 15);
    assert_eq!(p.a.counters().mads_sent, 16);
    assert_eq!(p.a.poll_timeout(), None);
    assert_eq!(p.wire.len(), 16);
}

/// cm_rep_handler / REP timer: a lost REP is resent after 2^(REQ local CM response timeout - 8)
/// = 4096 ms, before the active side's REQ timer (6144 ms) fires.
#[test]
fn lost_rep_is_resent() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    let b = p.event(Side::B).id;
    p.b.accept(p.now, b, rep_param(0x200)).unwrap();
    let mut reps = 0;
    let mut lose_first_rep = |s: &Sent| {
        if s.attr() == CmAttr::Rep {
            reps += 1;
            if reps == 1 {
                return Fate::Drop;
            }
        }
        Fate::Deliver
    };
    p.drive_with(&mut lose_first_rep);
    assert!(p.events(Side::A).is_empty());
    assert_eq!(p.b.poll_timeout(), Some(p.now + REP_TIMEOUT));
    p.advance_with(REP_TIMEOUT, &mut lose_first_rep);
    let rep_times: Vec<Instant> = p.sent(CmAttr::Rep).iter().map(|s| s.at).collect();
    assert_eq!(rep_times, [Instant::ZERO, Instant::ZERO + REP_TIMEOUT]);
    assert_eq!(p.sent(CmAttr::Req).len(), 1, "the REP came before the REQ timer");
    let ev = p.event(Side::A);
    assert_eq!((ev.kind, ev.param.qp_num), (CmEventKind::ConnectResponse, 0x200));
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.event(Side::B).kind, CmEventKind::Established);
    assert_eq!(p.b.counters().mads_resent, 1);
    assert_eq!(p.b.poll_timeout(), None);
    assert_eq!(p.a.poll_timeout(), None);
}

/// cm_dup_rep_handler: a lost RTU leaves the passive side in REP_SENT; it resends the REP, and
/// the active side, already established, answers the duplicate REP with its RTU again.
#[test]
fn lost_rtu_is_recovered_through_a_duplicate_rep() {
    let mut p = Pair::new();
    let (a, b, _) = p.replied();
    p.a.establish(p.now, a).unwrap();
    let mut rtus = 0;
    let mut lose_first_rtu = |s: &Sent| {
        if s.attr() == CmAttr::Rtu {
            rtus += 1;
            if rtus == 1 {
                return Fate::Drop;
            }
        }
        Fate::Deliver
    };
    p.drive_with(&mut lose_first_rtu);
    assert!(p.events(Side::B).is_empty());
    assert_eq!(p.b.state(b), Some(IdState::RepSent));
    p.advance_with(REP_TIMEOUT, &mut lose_first_rtu);
    let attrs: Vec<(Side, CmAttr)> = p.wire.iter().map(|s| (s.from, s.attr())).collect();
    assert_eq!(
        attrs,
        [
            (Side::A, CmAttr::Req),
            (Side::B, CmAttr::Rep),
            (Side::A, CmAttr::Rtu),
            (Side::B, CmAttr::Rep),
            (Side::A, CmAttr::Rtu)
        ]
    );
    assert_eq!(p.wire[4].at, Instant::ZERO + REP_TIMEOUT);
    assert_eq!(p.wire[4].repr, p.wire[2].repr, "the same RTU again");
    let ev = p.event(Side::B);
    assert_eq!((ev.id, ev.kind), (b, CmEventKind::Established));
    assert!(p.events(Side::A).is_empty(), "no second CONNECT_RESPONSE for the duplicate REP");
    assert_eq!(p.b.state(b), Some(IdState::Established));
    assert_eq!(p.a.state(a), Some(IdState::Established));
    assert_eq!(p.b.poll_timeout(), None);
}

/// cm_dup_req_handler + CMA_CM_MRA_SETTING: a duplicate REQ while the consumer has not decided
/// is answered with MRA (service timeout 24); cm_mra_handler then holds the active side's REQ
/// resend for 2^(24-8) + 2^(19-8) ms.
#[test]
fn duplicate_req_gets_mra_and_holds_the_req_timer() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    let b = p.event(Side::B).id;
    assert!(p.sent(CmAttr::Mra).is_empty(), "K sends MRA only for a duplicate");
    // The consumer takes its time: the active side resends its REQ after 6144 ms.
    p.advance(REQ_TIMEOUT);
    assert_eq!(p.sent(CmAttr::Req).len(), 2);
    assert_eq!(p.b.counters().mras_sent, 1);
    let mra = p.sent(CmAttr::Mra);
    assert_eq!((mra.len(), mra[0].at, mra[0].dst), (1, Instant::ZERO + REQ_TIMEOUT, A_IP));
    let CmMessage::Mra(m) = &mra[0].repr.msg else { unreachable!() };
    let a_comm = p.wire[0].repr.msg.local_comm_id();
    assert_eq!((m.msg_mraed, m.service_timeout, m.remote_comm_id), (0, 24, a_comm));
    assert!(p.events(Side::B).is_empty(), "a duplicate REQ is not a second CONNECT_REQUEST");
    assert_eq!(p.b.id_count(), 2);
    assert_eq!(p.a.poll_timeout(), Some(Instant::ZERO + REQ_TIMEOUT + MRA_WAIT));
    // Nothing is resent before the MRA's time is up, though 6144 ms passes many times.
    p.advance(Duration::from_nanos(MRA_WAIT.as_nanos() - ms(1).as_nanos()));
    assert_eq!(p.sent(CmAttr::Req).len(), 2);
    assert_eq!(p.a.counters().mads_resent, 1);
    // The consumer accepts at last.
    p.b.accept(p.now, b, rep_param(0x200)).unwrap();
    p.drive();
    assert_eq!(p.event(Side::A).kind, CmEventKind::ConnectResponse);
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.event(Side::B).kind, CmEventKind::Established);
    assert_eq!(p.a.poll_timeout(), None);
}

/// cm_dup_rep_handler in MRA_REP_SENT (rdma_cm arms the MRA when it hands the REP to its
/// consumer, cma.c:2163-2169): a REP resent while the active consumer has not established is
/// answered with MRA (message MRAed 1 = REP, service timeout 24), which holds the passive side's
/// REP resend; the RTU then completes the connection.
#[test]
fn rep_resent_while_the_consumer_decides_gets_mra() {
    let mut p = Pair::new();
    let (a, _, _) = p.replied();
    assert_eq!(p.a.state(a), Some(IdState::RepRcvd));
    // The active consumer is slow: the REP is resent once its timer runs out.
    p.advance(REP_TIMEOUT);
    assert_eq!(p.sent(CmAttr::Rep).len(), 2);
    let mra = p.sent(CmAttr::Mra);
    assert_eq!((mra.len(), mra[0].dst, mra[0].repr.tid), (1, B_IP, p.sent(CmAttr::Req)[0].repr.tid));
    let CmMessage::Mra(m) = &mra[0].repr.msg else { unreachable!() };
    let (a_comm, b_comm) = p.comm_ids();
    assert_eq!((m.local_comm_id, m.remote_comm_id, m.msg_mraed, m.service_timeout), (a_comm, b_comm, 1, 24));
    assert_eq!(p.a.counters().mras_sent, 1);
    // The passive side now waits 2^(24-8) + 2^(19-8) ms before resending.
    assert_eq!(p.b.poll_timeout(), Some(p.now + MRA_WAIT));
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.event(Side::B).kind, CmEventKind::Established);
    assert_eq!(p.b.poll_timeout(), None);
}

/// cm_dup_req_handler: a REQ the network delivers twice is one request; the duplicate, found
/// by the peer's (address, comm ID), is answered with MRA, which holds the REQ resend.
#[test]
fn req_duplicated_by_the_network_is_one_request() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    let mut dup_req = |s: &Sent| if s.attr() == CmAttr::Req { Fate::Duplicate } else { Fate::Deliver };
    p.drive_with(&mut dup_req);
    let ev = p.event(Side::B);
    assert_eq!((ev.kind, ev.param.qp_num), (CmEventKind::ConnectRequest, 0x100));
    assert_eq!(p.b.id_count(), 2, "the listener and one connection");
    assert_eq!(p.b.counters().mras_sent, 1);
    assert_eq!(p.sent(CmAttr::Mra).len(), 1);
    assert_eq!(p.a.poll_timeout(), Some(Instant::ZERO + MRA_WAIT));
}
