//! Disconnection (IBTA Vol 1 12.9.7; Linux cm_dreq_handler, cm_drep_handler, cm_destroy_id):
//! DREQ, DREP, timewait, and the DREQ's TID and resends.

use super::*;
use crate::wire::CmDreqRepr;

/// IBTA 12.9.7 / cm_dreq_handler, cm_drep_handler: DREQ -> DISCONNECTED on the passive side;
/// its rdma_disconnect sends DREP -> DISCONNECTED on the active side; both wait in timewait for
/// 2^(19-8) ms, then TIMEWAIT_EXIT.
#[test]
fn disconnect_and_timewait() {
    let mut p = Pair::new();
    let (a, b, _) = p.connected();
    let t0 = p.now;
    p.a.disconnect(p.now, a).unwrap();
    assert_eq!(p.a.state(a), Some(IdState::DreqSent));
    p.drive();
    let dreq = p.sent(CmAttr::Dreq);
    assert_eq!(dreq.len(), 1);
    let CmMessage::Dreq(d) = &dreq[0].repr.msg else { unreachable!() };
    let (a_comm, b_comm) = p.comm_ids();
    assert_eq!((d.local_comm_id, d.remote_comm_id, d.remote_qpn), (a_comm, b_comm, 0x200));
    let ev = p.event(Side::B);
    assert_eq!((ev.id, ev.kind, ev.status), (b, CmEventKind::Disconnected, 0));
    assert_eq!(p.b.state(b), Some(IdState::DreqRcvd));
    assert!(p.sent(CmAttr::Drep).is_empty(), "K sends DREP only on rdma_disconnect or destroy");

    p.b.disconnect(p.now, b).unwrap();
    p.drive();
    let drep = p.sent(CmAttr::Drep);
    assert_eq!(drep.len(), 1);
    assert_eq!(drep[0].repr.tid, dreq[0].repr.tid, "DREP echoes the DREQ's TID");
    let CmMessage::Drep(r) = &drep[0].repr.msg else { unreachable!() };
    assert_eq!((r.local_comm_id, r.remote_comm_id), (b_comm, a_comm));
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.status), (a, CmEventKind::Disconnected, 0));
    assert_eq!(p.a.state(a), Some(IdState::Timewait));
    assert_eq!(p.b.state(b), Some(IdState::Timewait));
    // A second rdma_disconnect changes nothing.
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.sent(CmAttr::Dreq).len(), 1);
    // cm_dreq_handler: a DREQ reaching an ID in timewait is answered with a DREP, even on the
    // side whose last MAD was its own DREQ.
    let dreq_b = CmDreqRepr { local_comm_id: b_comm, remote_comm_id: a_comm, remote_qpn: 0x100, private_data: vec![] };
    let now = p.now;
    p.a.handle_mad(now, B_IP, &mad(0x77, CmMessage::Dreq(dreq_b)));
    p.drive();
    let dreps = p.sent(CmAttr::Drep);
    assert_eq!(dreps.len(), 2, "one DREP more");
    let CmMessage::Drep(r) = &dreps[1].repr.msg else { unreachable!() };
    assert_eq!((r.local_comm_id, r.remote_comm_id, dreps[1].repr.tid), (a_comm, b_comm, 0x77));
    assert_eq!(p.sent(CmAttr::Dreq).len(), 1, "not our DREQ again");

    p.advance(ms(2047));
    assert!(p.events(Side::A).is_empty() && p.events(Side::B).is_empty());
    p.advance(ms(1));
    assert_eq!(p.now, t0 + TIMEWAIT);
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind), (a, CmEventKind::TimewaitExit));
    let ev = p.event(Side::B);
    assert_eq!((ev.id, ev.kind), (b, CmEventKind::TimewaitExit));
    assert_eq!(p.a.state(a), Some(IdState::Closed));
    assert_eq!(p.b.state(b), Some(IdState::Closed));
    assert_eq!((p.a.poll_timeout(), p.b.poll_timeout()), (None, None));
    assert_eq!(p.a.counters().mads_resent + p.b.counters().mads_resent, 0);
}

/// cm_format_dreq / cm_form_tid (cm.c:1288-1303, :2645-2646): a DREQ's TID is its sender's MAD
/// agent half and its own comm ID, as in the REQ (the active side sends the REQ's TID again; the
/// passive side its own, not the REQ's). ConnectX (write.pcap: DREQ TID 0xb_2975ef71 = the
/// REQ's; nvme-discover2.pcap: the target's DREQ carries its own comm ID) and rxe do this.
#[test]
fn dreq_tid_is_the_senders_form_tid() {
    for active_disconnects in [true, false] {
        let mut p = Pair::new();
        let (a, b, _) = p.connected();
        let (a_comm, b_comm) = p.comm_ids();
        let req_tid = p.sent(CmAttr::Req)[0].repr.tid;
        let (from, h, comm) = if active_disconnects { (Side::A, a, a_comm) } else { (Side::B, b, b_comm) };
        let now = p.now;
        p.cm(from).disconnect(now, h).unwrap();
        p.drive();
        let dreq = p.sent(CmAttr::Dreq);
        assert_eq!(dreq.len(), 1);
        let tid = dreq[0].repr.tid;
        assert_eq!(tid as u32, comm.swap_bytes(), "the low half is the sender's comm ID as the kernel holds it");
        if active_disconnects {
            assert_eq!(tid, req_tid, "the active side's DREQ repeats the REQ's TID");
        } else {
            assert_ne!(tid >> 32, req_tid >> 32, "the passive side's own agent half, not the REQ sender's");
        }
    }
}

/// IBTA 12.9.8.6 / cm_dreq_handler: a DREQ whose Remote QPN is not the receiver's QP is dropped.
#[test]
fn dreq_naming_another_qpn_is_dropped() {
    let mut p = Pair::new();
    let (a, b, _) = p.connected();
    let (a_comm, b_comm) = p.comm_ids();
    let unmatched = p.b.counters().mads_unmatched;
    let bad = CmDreqRepr { local_comm_id: a_comm, remote_comm_id: b_comm, remote_qpn: 0x201, private_data: vec![] };
    p.b.handle_mad(p.now, A_IP, &mad(0x1234, CmMessage::Dreq(bad)));
    assert!(p.events(Side::B).is_empty());
    assert!(p.b.poll_mad().is_none(), "no DREP");
    assert_eq!(p.b.state(b), Some(IdState::Established));
    assert_eq!(p.b.counters().mads_unmatched, unmatched + 1);
    // The same DREQ naming the right QP disconnects.
    let good = CmDreqRepr { local_comm_id: a_comm, remote_comm_id: b_comm, remote_qpn: 0x200, private_data: vec![] };
    p.b.handle_mad(p.now, A_IP, &mad(0x1235, CmMessage::Dreq(good)));
    assert_eq!(p.event(Side::B).kind, CmEventKind::Disconnected);
    assert_eq!(p.a.state(a), Some(IdState::Established));
}

/// cm_dreq_handler / cm_issue_drep: a DREQ for an unknown comm ID still gets a DREP (comm IDs
/// swapped, the TID echoed), so its sender stops resending.
#[test]
fn dreq_for_an_unknown_comm_id_gets_a_drep() {
    let mut p = Pair::new();
    let dreq =
        CmDreqRepr { local_comm_id: 0x1111_2222, remote_comm_id: 0x3333_4444, remote_qpn: 0x55, private_data: vec![] };
    p.b.handle_mad(p.now, A_IP, &mad(0x0000_0007_dead_beef, CmMessage::Dreq(dreq)));
    let out = p.b.poll_mad().expect("a DREP");
    assert_eq!(out.dst, A_IP);
    let repr = CmMadRepr::parse(&out.mad).unwrap();
    assert_eq!(repr.tid, 0x0000_0007_dead_beef);
    assert_eq!(
        repr.msg,
        CmMessage::Drep(CmDrepRepr {
            local_comm_id: 0x3333_4444,
            remote_comm_id: 0x1111_2222,
            private_data: vec![0; crate::wire::DREP_PRIVATE_DATA_LEN]
        })
    );
    assert!(p.b.poll_mad().is_none());
    assert!(p.events(Side::B).is_empty());
    assert_eq!(p.b.id_count(), 0);
    assert_eq!(p.b.counters().mads_unmatched, 1);
}

/// cm_destroy_id in ESTABLISHED: DREQ; the peer hears DISCONNECTED; the destroyed ID finishes
/// its protocol (DREP, timewait) without events and is then gone.
#[test]
fn destroy_established_sends_dreq() {
    let mut p = Pair::new();
    let (a, b, _) = p.connected();
    p.a.destroy(p.now, a).unwrap();
    assert_eq!(p.a.state(a), None, "the consumer's handle is gone");
    assert_eq!(p.a.destroy(p.now, a), Err(CmError::NoEnt));
    p.drive();
    assert_eq!(p.sent(CmAttr::Dreq).len(), 1);
    let ev = p.event(Side::B);
    assert_eq!((ev.id, ev.kind), (b, CmEventKind::Disconnected));
    p.b.disconnect(p.now, b).unwrap();
    p.drive();
    assert_eq!(p.sent(CmAttr::Drep).len(), 1);
    assert!(p.events(Side::A).is_empty(), "a destroyed ID has no events");
    assert_eq!(p.a.id_count(), 1, "it lives on in timewait");
    p.advance(TIMEWAIT);
    assert!(p.events(Side::A).is_empty());
    assert_eq!(p.event(Side::B).kind, CmEventKind::TimewaitExit);
    assert_eq!(p.a.id_count(), 0);
    assert_eq!(p.a.poll_timeout(), None);
}

/// A lost DREQ is resent after the ID's timeout_ms (cm_send_dreq_locked): on the active side the
/// REQ's response timeout (6144 ms, ib_send_cm_req), on the passive side 2^(the REQ's local CM
/// response timeout - 8) = 4096 ms (cm_req_handler); 15 resends, then DISCONNECTED -ETIMEDOUT.
#[test]
fn dreq_resend_interval_is_the_ids_timeout() {
    for (side, interval) in [(Side::A, REQ_TIMEOUT), (Side::B, REP_TIMEOUT)] {
        let mut p = Pair::new();
        let (a, b, _) = p.connected();
        let h = if side == Side::A { a } else { b };
        let mut lose_dreqs = |s: &Sent| if s.attr() == CmAttr::Dreq { Fate::Drop } else { Fate::Deliver };
        let now = p.now;
        p.cm(side).disconnect(now, h).unwrap();
        p.drive_with(&mut lose_dreqs);
        assert_eq!(p.sent(CmAttr::Dreq).len(), 1);
        p.advance_with(Duration::from_nanos(interval.as_nanos() - 1_000_000), &mut lose_dreqs);
        assert_eq!(p.sent(CmAttr::Dreq).len(), 1, "{side:?}: resent before {interval:?}");
        p.advance_with(ms(1), &mut lose_dreqs);
        assert_eq!(p.sent(CmAttr::Dreq).len(), 2, "{side:?}: not resent at {interval:?}");
        p.advance_with(times(interval, 15), &mut lose_dreqs);
        assert_eq!(p.sent(CmAttr::Dreq).len(), 16, "{side:?}");
        let ev = p.events(side);
        assert!(ev.iter().any(|e| e.id == h && e.kind == CmEventKind::Disconnected && e.status == -110), "{ev:?}");
    }
}
