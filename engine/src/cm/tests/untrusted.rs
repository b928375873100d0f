//! Bad input from the network (IBTA Vol 1 13.4; Linux mad.c): malformed MADs, MADs for no
//! connection, and a REQ flood, all counted and dropped without a panic or lasting state.

use super::*;
use crate::wire::{CmRepRepr, CmRtuRepr};

/// MADs from the network are untrusted (IBTA 13.4 / mad.c): truncated or foreign MADs and random
/// bytes are counted and dropped, never panic; well-formed MADs for no connection are counted as
/// unmatched and change nothing.
#[test]
fn untrusted_mads_never_panic() {
    let mut p = Pair::new();
    let (a, b, l) = p.connected();
    let req = mad(p.wire[0].repr.tid, p.wire[0].repr.msg.clone());
    let before = p.b.counters().clone();
    let mut bad: Vec<Vec<u8>> = vec![vec![], req[..24].to_vec(), req[..255].to_vec()];
    for (at, v) in [(0, 2u8), (1, 0x03), (2, 1), (3, 0x81), (3, 0x83), (17, 0x01), (17, 0x1b)] {
        let mut m = req.clone();
        m[at] = v;
        bad.push(m);
    }
    for m in &bad {
        p.b.handle_mad(p.now, A_IP, m);
    }
    assert_eq!(p.b.counters().mads_malformed, before.mads_malformed + bad.len() as u64);
    assert_eq!(p.b.counters().mads_rcvd, before.mads_rcvd);

    // Random bytes of random length: none is a CM MAD.
    let mut rng = crate::rng::Rng::new(0x5eed);
    for _ in 0..1000 {
        let len = rng.below(300) as usize;
        let m: Vec<u8> = (0..len).map(|_| rng.next_u32() as u8).collect();
        p.b.handle_mad(p.now, A_IP, &m);
    }
    assert_eq!(p.b.counters().mads_malformed, before.mads_malformed + bad.len() as u64 + 1000);
    assert_eq!(p.b.counters().mads_rcvd, before.mads_rcvd);

    // A valid CM header with a random attribute and body: whatever parses is handled.
    let mut handled = 0u64;
    for i in 0..1000u32 {
        let mut m: Vec<u8> = (0..MAD_LEN).map(|_| rng.next_u32() as u8).collect();
        m[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        m[16..18].copy_from_slice(&(0x10 + rng.below(11) as u16).to_be_bytes());
        if i % 4 == 0 && m[17] == 0x10 {
            // Some REQs for the listener's service ID, to reach the REQ handler's checks.
            m[24 + 8..24 + 16].copy_from_slice(&service_id(PS_TCP, PORT).to_be_bytes());
        }
        let (side, src) = if i % 2 == 0 { (Side::B, A_IP) } else { (Side::A, B_IP) };
        let (rcvd, malformed) = (p.cm(side).counters().mads_rcvd, p.cm(side).counters().mads_malformed);
        let now = p.now;
        p.cm(side).handle_mad(now, src, &m);
        let c = p.cm(side).counters();
        assert_eq!(c.mads_rcvd + c.mads_malformed, rcvd + malformed + 1);
        handled += c.mads_rcvd - rcvd;
        // Whatever they answer goes out (to random peers too) without a panic.
        while p.a.poll_mad().is_some() {}
        while p.b.poll_mad().is_some() {}
        let _ = std::iter::from_fn(|| p.a.poll_event()).count();
        let _ = std::iter::from_fn(|| p.b.poll_event()).count();
    }
    assert!(handled > 100, "the fuzz reached the handlers ({handled})");
    p.advance(ms(200_000));
    assert_eq!(p.a.state(a), Some(IdState::Established));
    assert_eq!(p.b.state(b), Some(IdState::Established));
    assert_eq!(p.b.state(l), Some(IdState::Listen));
}

/// IBTA 12.9 / cm_rep_handler, cm_rtu_handler, cm_drep_handler: a REP, RTU or DREP for a comm ID
/// the CM does not know is unmatched: counted, no answer, no event, no state change.
#[test]
fn rep_rtu_drep_for_unknown_comm_ids_change_nothing() {
    let mut p = Pair::new();
    let (a, b, _) = p.connected();
    let (a_comm, b_comm) = p.comm_ids();
    let rep =
        CmRepRepr { local_comm_id: 0xabcd_0001, remote_comm_id: 0xabcd_0002, local_qpn: 0x300, ..Default::default() };
    let rtu = CmRtuRepr { local_comm_id: 0xabcd_0003, remote_comm_id: 0xabcd_0004, private_data: vec![] };
    let drep = CmDrepRepr { local_comm_id: 0xabcd_0005, remote_comm_id: 0xabcd_0006, private_data: vec![] };
    // An RTU naming B's comm ID but from a stranger's comm ID is not B's either.
    let rtu2 = CmRtuRepr { local_comm_id: a_comm ^ 1, remote_comm_id: b_comm, private_data: vec![] };
    let before_a = p.a.counters().clone();
    let before_b = p.b.counters().clone();
    for (side, msg) in [
        (Side::A, CmMessage::Rep(rep.clone())),
        (Side::B, CmMessage::Rep(rep)),
        (Side::A, CmMessage::Rtu(rtu.clone())),
        (Side::B, CmMessage::Rtu(rtu)),
        (Side::B, CmMessage::Rtu(rtu2)),
        (Side::A, CmMessage::Drep(drep.clone())),
        (Side::B, CmMessage::Drep(drep)),
    ] {
        let src = ip_of(if side == Side::A { Side::B } else { Side::A });
        let now = p.now;
        p.cm(side).handle_mad(now, src, &mad(0x42, msg));
    }
    assert!(p.a.poll_mad().is_none() && p.b.poll_mad().is_none());
    assert!(p.events(Side::A).is_empty() && p.events(Side::B).is_empty());
    let expect_a =
        CmCounters { mads_rcvd: before_a.mads_rcvd + 3, mads_unmatched: before_a.mads_unmatched + 3, ..before_a };
    let expect_b =
        CmCounters { mads_rcvd: before_b.mads_rcvd + 4, mads_unmatched: before_b.mads_unmatched + 4, ..before_b };
    assert_eq!(p.a.counters(), &expect_a);
    assert_eq!(p.b.counters(), &expect_b);
    assert_eq!(p.a.state(a), Some(IdState::Established));
    assert_eq!(p.b.state(b), Some(IdState::Established));
    assert_eq!((p.a.poll_timeout(), p.b.poll_timeout()), (None, None));
}

/// A REQ flood from one source (bad input: bounded pending state). Ten thousand REQs, each a new
/// connection (its own comm ID and QPN), to a listener whose backlog would take them all: the CM
/// holds at most `max_pending` requests and drops the rest, counted and not rejected (the kernel
/// drops beyond the backlog, and a real peer resends); REPs, RTUs and DREQs naming nobody leave
/// no state; and the CM still connects once the consumer works through its requests.
#[test]
fn req_flood_is_bounded_counted_and_harmless() {
    const FLOOD: u32 = 10_000;
    let mut p = Pair::new();
    let max = p.b.cfg.max_pending;
    let l = p.listen(PS_TCP, QpType::Rc, 1 << 20);
    p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b""));
    let sent = p.a.poll_mad().expect("the REQ");
    let CmMadRepr { tid, msg: CmMessage::Req(req), .. } = CmMadRepr::parse(&sent.mad).unwrap() else {
        panic!("not a REQ")
    };
    for k in 0..FLOOD {
        let r = crate::wire::CmReqRepr { local_comm_id: 0x1000_0000 + k, local_qpn: 0x1000 + k, ..req.clone() };
        p.b.handle_mad(p.now, A_IP, &mad(tid + u64::from(k), CmMessage::Req(r)));
    }
    assert_eq!(p.b.counters().reqs_dropped, u64::from(FLOOD) - max as u64);
    assert_eq!(p.b.id_count(), max + 1, "the listener and max_pending requests");
    assert!(p.b.poll_mad().is_none(), "a dropped REQ is not answered");
    let reqs = p.events(Side::B);
    assert_eq!(reqs.len(), max);
    // Messages for connections that do not exist: counted, nothing kept, nothing sent.
    for k in 0..1000u32 {
        let rep = CmRepRepr { local_comm_id: k, remote_comm_id: 0xdead_0000 + k, ..Default::default() };
        p.b.handle_mad(p.now, A_IP, &mad(u64::from(k), CmMessage::Rep(rep)));
        let rtu = CmRtuRepr { local_comm_id: k, remote_comm_id: 0xdead_0000 + k, private_data: vec![] };
        p.b.handle_mad(p.now, A_IP, &mad(u64::from(k), CmMessage::Rtu(rtu)));
    }
    assert_eq!(p.b.id_count(), max + 1);
    assert!(p.b.counters().mads_unmatched >= 2000, "{:?}", p.b.counters());

    // The consumer rejects what it does not want; a new request is then taken and connects.
    for e in &reqs {
        p.b.reject(p.now, e.id, &[], reject::CONSUMER_DEFINED).unwrap();
    }
    while p.b.poll_mad().is_some() {}
    p.wire.clear();
    let a = p.dial(PS_TCP, QpType::Rc, SPORT + 1, req_param(0x101, b"after"));
    p.drive();
    let ev = p.event(Side::B);
    assert_eq!((ev.kind, ev.listen_id, ev.param.qp_num), (CmEventKind::ConnectRequest, Some(l), 0x101));
    p.b.accept(p.now, ev.id, rep_param(0x201)).unwrap();
    p.drive();
    let rep = p.event(Side::A);
    assert_eq!((rep.id, rep.kind), (a, CmEventKind::ConnectResponse));
}
