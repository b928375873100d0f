//! Listeners (rdma_listen): the late-listener grace, the backlog, and the port conflicts between
//! listeners.

use super::*;

/// With a late-listener grace (softrdma's devices: a listen is a few calls to the daemon), a REQ
/// that finds no listener waits for one: a listen within the grace takes it, as if the listen
/// had come first; a resent REQ meanwhile is the same request.
#[test]
fn a_late_listener_takes_the_req_that_waited_for_it() {
    let mut p = Pair::new();
    let mut cfg = CmConfig::new(B_IP, B_GUID, Mtu::Mtu1024, 2);
    cfg.late_listener_grace = Duration::from_millis(50);
    p.b = Cm::new(cfg);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"late"));
    p.drive_with(&mut |_| Fate::Duplicate);
    assert!(p.sent(CmAttr::Rej).is_empty(), "no REJ while the REQ waits");
    assert!(p.events(Side::B).is_empty());
    p.advance(Duration::from_millis(10));
    let l = p.listen(PS_TCP, QpType::Rc, 0);
    p.advance(Duration::from_millis(1));
    let req = p.event(Side::B);
    assert_eq!((req.kind, req.listen_id), (CmEventKind::ConnectRequest, Some(l)));
    assert!(req.param.private_data.starts_with(b"late"));
    p.b.accept(p.now, req.id, rep_param(0x200)).unwrap();
    p.drive();
    assert_eq!(p.event(Side::A).kind, CmEventKind::ConnectResponse);
    assert_eq!(p.a.state(a), Some(IdState::RepRcvd));
    assert!(p.sent(CmAttr::Rej).is_empty());
}

/// Without a listener by the end of the grace, the REQ gets its REJ 8 then.
#[test]
fn a_req_that_no_listener_takes_is_rejected_when_the_grace_ends() {
    let mut p = Pair::new();
    let mut cfg = CmConfig::new(B_IP, B_GUID, Mtu::Mtu1024, 2);
    cfg.late_listener_grace = Duration::from_millis(50);
    p.b = Cm::new(cfg);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"x"));
    p.drive();
    p.advance(Duration::from_millis(49));
    assert!(p.sent(CmAttr::Rej).is_empty());
    p.advance(Duration::from_millis(2));
    let rej = p.sent(CmAttr::Rej);
    assert_eq!(rej.len(), 1);
    assert_eq!(rej[0].at, Instant::ZERO + Duration::from_millis(50));
    let CmMessage::Rej(r) = &rej[0].repr.msg else { unreachable!() };
    assert_eq!(r.reason, 8);
    assert_eq!(p.event(Side::A).kind, CmEventKind::Rejected);
    assert_eq!(p.a.state(a), Some(IdState::Closed));
    assert_eq!(p.b.poll_timeout(), None, "nothing waits any more");
}

/// rdma_listen's backlog: REQs beyond it are dropped (not rejected); the active side resends,
/// and once a request leaves REQ_RCVD the resent REQ is taken.
#[test]
fn backlog_drops_and_resent_req_is_taken() {
    let mut p = Pair::new();
    let l = p.listen(PS_TCP, QpType::Rc, 2);
    let a1 = p.dial(PS_TCP, QpType::Rc, SPORT + 1, req_param(0x101, b"1"));
    let _a2 = p.dial(PS_TCP, QpType::Rc, SPORT + 2, req_param(0x102, b"2"));
    let a3 = p.dial(PS_TCP, QpType::Rc, SPORT + 3, req_param(0x103, b"3"));
    p.drive();
    let reqs = p.events(Side::B);
    let qpns: Vec<u32> = reqs.iter().map(|e| e.param.qp_num).collect();
    assert_eq!(qpns, [0x101, 0x102]);
    assert!(reqs.iter().all(|e| e.kind == CmEventKind::ConnectRequest && e.listen_id == Some(l)));
    assert_eq!(p.b.counters().reqs_dropped, 1);
    assert!(p.sent(CmAttr::Rej).is_empty(), "a dropped REQ is not rejected");
    assert_eq!(p.b.id_count(), 3);
    assert_eq!(p.a.state(a3), Some(IdState::ReqSent));

    p.b.accept(p.now, reqs[0].id, rep_param(0x201)).unwrap();
    p.drive();
    assert_eq!(p.event(Side::A).id, a1);
    p.a.establish(p.now, a1).unwrap();
    p.drive();
    assert_eq!(p.event(Side::B).kind, CmEventKind::Established);

    // 6144 ms: the second and third REQs are resent; the second is a duplicate (MRA), the third
    // now fits the backlog.
    p.advance(REQ_TIMEOUT);
    assert_eq!(p.sent(CmAttr::Req).len(), 5);
    let ev = p.event(Side::B);
    assert_eq!((ev.kind, ev.param.qp_num, ev.listen_id), (CmEventKind::ConnectRequest, 0x103, Some(l)));
    assert!(ev.param.private_data.starts_with(b"3"));
    assert_eq!(p.b.counters().reqs_dropped, 1);
    assert_eq!(p.b.counters().mras_sent, 1);
    // And it connects.
    p.b.accept(p.now, ev.id, rep_param(0x203)).unwrap();
    p.drive();
    let rep = p.event(Side::A);
    assert_eq!((rep.id, rep.kind, rep.param.qp_num), (a3, CmEventKind::ConnectResponse, 0x203));
}

/// rdma_listen / cma_check_port: a listener on the wildcard address holds the port for every
/// address; two listeners on distinct specific addresses share it; port spaces are separate.
#[test]
fn listen_conflicts() {
    let mut cm = Cm::new(CmConfig::new(B_IP, B_GUID, Mtu::Mtu1024, 3));
    fn bound(cm: &mut Cm, ps: u16, ip: [u8; 4], port: u16) -> IdHandle {
        let h = cm.create_id(ps, QpType::Rc);
        cm.set_addrs(h, Some(sa(IpAddr::V4(Ipv4Addr::from(ip)), port)), None, 0).unwrap();
        h
    }
    let any = bound(&mut cm, PS_TCP, [0, 0, 0, 0], PORT);
    cm.listen(any, 0).unwrap();
    let spec = bound(&mut cm, PS_TCP, [10, 0, 0, 2], PORT);
    assert_eq!(cm.listen(spec, 0), Err(CmError::AddrInUse), "specific after wildcard");
    assert_eq!(cm.state(spec), Some(IdState::Idle));
    let any2 = bound(&mut cm, PS_TCP, [0, 0, 0, 0], PORT);
    assert_eq!(cm.listen(any2, 0), Err(CmError::AddrInUse), "wildcard after wildcard");
    // Another port, or another port space on the same port, is free.
    let other_port = bound(&mut cm, PS_TCP, [10, 0, 0, 2], PORT + 1);
    assert_eq!(cm.listen(other_port, 0), Ok(()));
    let other_ps = bound(&mut cm, PS_IB, [10, 0, 0, 2], PORT);
    assert_eq!(cm.listen(other_ps, 0), Ok(()));

    let s1 = bound(&mut cm, PS_TCP, [10, 0, 0, 2], 9000);
    let s2 = bound(&mut cm, PS_TCP, [10, 0, 0, 3], 9000);
    assert_eq!(cm.listen(s1, 0), Ok(()));
    assert_eq!(cm.listen(s2, 0), Ok(()), "two specific addresses on one port");
    let s3 = bound(&mut cm, PS_TCP, [10, 0, 0, 2], 9000);
    assert_eq!(cm.listen(s3, 0), Err(CmError::AddrInUse), "the same specific address twice");
    let w = bound(&mut cm, PS_TCP, [0, 0, 0, 0], 9000);
    assert_eq!(cm.listen(w, 0), Err(CmError::AddrInUse), "wildcard after specific");
    // Destroying the wildcard listener frees its port.
    cm.destroy(Instant::ZERO, any).unwrap();
    assert_eq!(cm.listen(spec, 0), Ok(()));
    assert_eq!(cm.listen(spec, 5), Ok(()), "listen again only changes the backlog");
}
