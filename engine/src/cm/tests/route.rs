//! Paths and routes (IBTA Vol 1 12.6.5; Linux cm_init_av_by_path, cm_format_paths_from_req,
//! rdma_set_ib_path): where the REQ and the REP go, and each ID's route.

use super::*;

/// The passive side's REP goes where the REQ's primary path says the requester is (its Local
/// GID: ib_cm's cm_init_av_by_path over cm_format_paths_from_req), not to the address in the
/// rdma_cm IP header, which only names the ID's peer address (cma_ib_req_handler).
#[test]
fn rep_goes_to_the_paths_gid_not_the_ip_headers_address() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b""));
    let sent = p.a.poll_mad().expect("the REQ");
    let CmMadRepr { tid, msg: CmMessage::Req(mut req), .. } = CmMadRepr::parse(&sent.mad).unwrap() else {
        panic!("not a REQ")
    };
    let elsewhere = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
    CmaHdrRepr { port: SPORT, src: elsewhere, dst: B_IP }
        .emit(&mut CmaHdrPacket::new_unchecked(&mut req.private_data[..CmaHdrRepr::LEN]))
        .unwrap();
    p.b.handle_mad(p.now, A_IP, &mad(tid, CmMessage::Req(req)));
    let ev = p.event(Side::B);
    assert_eq!(p.b.addrs(ev.id), Some((Some(sa(B_IP, PORT)), Some(sa(elsewhere, SPORT)))));
    p.b.accept(p.now, ev.id, rep_param(0x200)).unwrap();
    let rep = p.b.poll_mad().expect("the REP");
    assert_eq!(rep.dst, A_IP, "the REP follows the path's GID");
}

/// rdma_resolve_route / RDMA_OPTION_IB_PATH (rdma_set_ib_path): the ID's route is the REQ's
/// primary path (GIDs, hop limit, traffic class, SL, flow label, rate, local ACK timeout =
/// packet lifetime + 1), its MTU caps the connection's (never above the port's), and the REQ goes
/// where the path's DGID leads (cm_init_av_by_path).
#[test]
fn a_routes_path_is_the_reqs_primary_path() {
    let mut p = Pair::new();
    let h = p.a.create_id(PS_TCP, QpType::Rc);
    let route = Route {
        sgid: gid([10, 0, 0, 1]),
        dgid: gid([10, 0, 0, 2]),
        hop_limit: 7,
        traffic_class: 0x48,
        sl: 3,
        flow_label: 0x12345,
        mtu: Mtu::Mtu512 as u8,
        rate: 6,
        packet_life_time: 12,
    };
    // Only once the addresses are resolved (ADDR_RESOLVED), and only with an IB MTU.
    assert_eq!(p.a.set_route(h, route.clone()), Err(CmError::Inval));
    p.a.set_addrs(h, Some(sa(A_IP, SPORT)), Some(sa(B_IP, PORT)), 0).unwrap();
    assert_eq!(p.a.route_key(h), Ok((sa(A_IP, SPORT), sa(B_IP, PORT), 0)));
    assert_eq!(p.a.set_route(h, Route { mtu: 6, ..route.clone() }), Err(CmError::Inval));
    p.a.set_route(h, route.clone()).unwrap();
    p.a.connect(Instant::ZERO, h, req_param(0x100, b"")).unwrap();
    let out = p.a.poll_mad().unwrap();
    assert_eq!(out.dst, B_IP);
    let CmMessage::Req(req) = CmMadRepr::parse(&out.mad).unwrap().msg else { panic!() };
    let path = &req.primary_path;
    assert_eq!((path.local_gid, path.remote_gid), (route.sgid, route.dgid));
    assert_eq!((path.hop_limit, path.traffic_class, path.sl), (7, 0x48, 3));
    assert_eq!((path.flow_label, path.packet_rate, path.local_ack_timeout), (0x12345, 6, 13));
    assert_eq!(req.path_mtu, Mtu::Mtu512 as u8);
    // A route's MTU above the port's gets the port's; the ACK timeout option wins over the
    // lifetime; a DGID elsewhere takes the REQ there.
    let h2 = p.a.create_id(PS_TCP, QpType::Rc);
    p.a.set_addrs(h2, Some(sa(A_IP, SPORT + 1)), Some(sa(B_IP, PORT)), 0).unwrap();
    p.a.set_ack_timeout(h2, 20).unwrap();
    let elsewhere = Route { mtu: Mtu::Mtu4096 as u8, dgid: gid([10, 0, 0, 9]), ..route };
    p.a.set_route(h2, elsewhere).unwrap();
    p.a.connect(Instant::ZERO, h2, req_param(0x101, b"")).unwrap();
    let out = p.a.poll_mad().unwrap();
    assert_eq!(out.dst, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)));
    let CmMessage::Req(req) = CmMadRepr::parse(&out.mad).unwrap().msg else { panic!() };
    assert_eq!((req.path_mtu, req.primary_path.local_ack_timeout), (Mtu::Mtu1024 as u8, 20));
    // Connecting, the ID takes no new route.
    assert_eq!(p.a.route_key(h2), Err(CmError::Inval));
}

/// cma_ib_new_conn_id / cm_format_paths_from_req: a passive ID's route is its REQ's primary path
/// seen from its end (GIDs swapped), the packet lifetime one below the REQ's local ACK timeout;
/// an active ID has none of this kind.
#[test]
fn a_passive_ids_route_is_its_reqs_path() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    let h = p.a.create_id(PS_TCP, QpType::Rc);
    p.a.set_addrs(h, Some(sa(A_IP, SPORT)), Some(sa(B_IP, PORT)), 0).unwrap();
    let route = Route {
        sgid: gid([10, 0, 0, 1]),
        dgid: gid([10, 0, 0, 2]),
        hop_limit: 5,
        traffic_class: 0x10,
        sl: 1,
        flow_label: 0x777,
        mtu: Mtu::Mtu512 as u8,
        rate: 0,
        packet_life_time: 14,
    };
    p.a.set_route(h, route.clone()).unwrap();
    let now = p.now;
    p.a.connect(now, h, req_param(0x100, b"")).unwrap();
    p.drive();
    let req = p.event(Side::B);
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    let seen = p.b.passive_route(req.id).expect("a passive ID has its REQ's path");
    assert_eq!(seen, Route { sgid: route.dgid, dgid: route.sgid, ..route });
    assert_eq!(p.a.passive_route(h), None);
}
