//! Connection establishment (IBTA Vol 1 12.6, 12.9.5; Linux cm.c / cma.c): REQ -> REP -> RTU
//! and what each carries, the QP attributes each side gets from them (PSNs, retry counts), XRC
//! and ECE.

use super::*;
use crate::verbs::{Access, QpState};

/// IBTA 12.6 / 12.9.5: REQ -> REP -> RTU; rdma_cm's events CONNECT_REQUEST (with the listener and
/// the user private data after the 36-byte cma_hdr), CONNECT_RESPONSE, ESTABLISHED; and
/// cm_init_qp_*_attr: each side's RTR expects the PSN the other's RTS starts at.
#[test]
fn connect_accept_establish() {
    let mut p = Pair::new();
    let l = p.listen(PS_TCP, QpType::Rc, 0);
    assert_eq!(p.b.state(l), Some(IdState::Listen));
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    assert_eq!(p.a.state(a), Some(IdState::ReqSent));
    p.drive();

    let req = p.event(Side::B);
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    assert_eq!(req.status, 0);
    assert_eq!(req.listen_id, Some(l));
    assert_ne!(req.id, l, "a CONNECT_REQUEST comes with a new ID");
    assert!(req.param.private_data.starts_with(b"hello"), "{:?}", req.param.private_data);
    assert_eq!(req.param.private_data.len(), REQ_USER_DATA_LEN);
    assert_eq!((req.param.qp_num, req.param.responder_resources, req.param.initiator_depth), (0x100, 1, 1));
    assert_eq!((req.param.retry_count, req.param.rnr_retry_count), (7, 7));
    let b = req.id;
    assert_eq!(p.b.state(b), Some(IdState::ReqRcvd));
    // cma_ib_req_handler: the new ID's addresses are the cma_hdr's, swapped.
    assert_eq!(p.b.addrs(b), Some((Some(sa(B_IP, PORT)), Some(sa(A_IP, SPORT)))));

    p.b.accept(p.now, b, rep_param(0x200)).unwrap();
    assert_eq!(p.b.state(b), Some(IdState::RepSent));
    p.drive();
    let rep = p.event(Side::A);
    assert_eq!((rep.kind, rep.status, rep.id), (CmEventKind::ConnectResponse, 0, a));
    assert_eq!(rep.param.qp_num, 0x200);
    assert_eq!(p.a.state(a), Some(IdState::RepRcvd));
    assert!(p.events(Side::B).is_empty(), "no ESTABLISHED before the RTU");

    // librdmacm moves the active QP to RTS, then rdma_establish sends the RTU.
    let (ai, ar, at) = (
        p.a.init_qp_attr(a, QpState::Init).unwrap(),
        p.a.init_qp_attr(a, QpState::Rtr).unwrap(),
        p.a.init_qp_attr(a, QpState::Rts).unwrap(),
    );
    let (bi, br, bt) = (
        p.b.init_qp_attr(b, QpState::Init).unwrap(),
        p.b.init_qp_attr(b, QpState::Rtr).unwrap(),
        p.b.init_qp_attr(b, QpState::Rts).unwrap(),
    );
    p.a.establish(p.now, a).unwrap();
    p.drive();
    let est = p.event(Side::B);
    assert_eq!((est.kind, est.status, est.id), (CmEventKind::Established, 0, b));
    assert_eq!(p.a.state(a), Some(IdState::Established));
    assert_eq!(p.b.state(b), Some(IdState::Established));
    assert_eq!(p.a.counters().established, 1);
    assert_eq!(p.b.counters().established, 1);
    let attrs: Vec<CmAttr> = p.wire.iter().map(Sent::attr).collect();
    assert_eq!(attrs, [CmAttr::Req, CmAttr::Rep, CmAttr::Rtu]);
    // REP and RTU reuse the REQ's TID (cm.c).
    assert!(p.wire.iter().all(|s| s.repr.tid == p.wire[0].repr.tid));

    // INIT: P_Key index 0, port 1, REMOTE_WRITE and (responder resources > 0) READ/ATOMIC.
    for i in [&ai, &bi] {
        assert_eq!(i.attr.qp_state, QpState::Init);
        assert_eq!((i.attr.pkey_index, i.attr.port_num), (0, 1));
        assert!(i.mask.contains(AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT));
        assert!(i.attr.qp_access_flags.contains(Access::REMOTE_WRITE | Access::REMOTE_READ));
    }
    // RTR: the peer's QPN; each side receives from the Starting PSN it announced and sends from
    // the one its peer announced (cm.c:1574, :2111, :2319, :2564; cma.c:1261-1262).
    assert_eq!((ar.attr.qp_state, ar.attr.dest_qp_num), (QpState::Rtr, 0x200));
    assert_eq!((br.attr.qp_state, br.attr.dest_qp_num), (QpState::Rtr, 0x100));
    assert_eq!(ar.attr.rq_psn, bt.attr.sq_psn, "active RTR rq_psn == passive RTS sq_psn");
    assert_eq!(br.attr.rq_psn, at.attr.sq_psn, "passive RTR rq_psn == active RTS sq_psn");
    let req_psn = match &p.wire[0].repr.msg {
        CmMessage::Req(r) => r.starting_psn,
        m => panic!("{m:?}"),
    };
    let rep_psn = match &p.wire[1].repr.msg {
        CmMessage::Rep(r) => r.starting_psn,
        m => panic!("{m:?}"),
    };
    assert_eq!(ar.attr.rq_psn, req_psn, "the active QP receives from the REQ's Starting PSN");
    assert_eq!(bt.attr.sq_psn, req_psn, "the passive QP sends from the REQ's Starting PSN");
    assert_eq!(br.attr.rq_psn, rep_psn, "the passive QP receives from the REP's Starting PSN");
    assert_eq!(at.attr.sq_psn, rep_psn, "the active QP sends from the REP's Starting PSN");
    for r in [&ar, &br] {
        assert_eq!(r.attr.path_mtu, Mtu::Mtu1024);
        assert_eq!(r.attr.max_dest_rd_atomic, 1);
        assert_eq!(r.hop_limit, 64);
        assert!(r.mask.contains(AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN));
        assert_eq!(r.flow_label, flow_label(SPORT, PORT));
    }
    assert_eq!(ar.attr.dest, B_IP);
    assert_eq!(br.attr.dest, A_IP);
    // RTS: local ACK timeout 19, retry 7, RNR retry 7, initiator depth 1.
    for t in [&at, &bt] {
        assert_eq!(t.attr.qp_state, QpState::Rts);
        assert_eq!((t.attr.timeout, t.attr.retry_cnt, t.attr.rnr_retry, t.attr.max_rd_atomic), (19, 7, 7, 1));
        assert!(t.mask.contains(AttrMask::SQ_PSN | AttrMask::TIMEOUT | AttrMask::RETRY_CNT));
    }
    assert_ne!(at.attr.sq_psn, bt.attr.sq_psn);
    assert!(at.attr.sq_psn <= 0xff_ffff && bt.attr.sq_psn <= 0xff_ffff, "PSNs are 24 bits");
    // Before a connection the kernel grants no remote access; RTR needs one.
    let idle = p.a.create_id(PS_TCP, QpType::Rc);
    assert_eq!(p.a.init_qp_attr(idle, QpState::Init).unwrap().attr.qp_access_flags, Access::EMPTY);
    assert_eq!(p.a.init_qp_attr(idle, QpState::Rtr), Err(CmError::Inval));
}

/// IBTA 12.6.5 and cm_format_req / cma_connect_ib: the REQ's fields on RoCEv2.
#[test]
fn req_on_the_wire() {
    let mut p = Pair::new();
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    let out = p.a.poll_mad().expect("connect sends the REQ at once");
    assert_eq!(out.dst, B_IP);
    assert_eq!(out.mad.len(), 256);
    // The MAD header: base version 1, class CM 0x07, class version 2, method Send, attr 0x0010.
    assert_eq!(&out.mad[..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&out.mad[16..18], &[0x00, 0x10]);
    let repr = CmMadRepr::parse(&out.mad).unwrap();
    let CmMessage::Req(req) = &repr.msg else { panic!("{:?}", repr.msg) };
    assert_eq!(req.service_id, 0x0000_0000_0106_1C06, "(RDMA_PS_TCP << 16) | 7174");
    assert_eq!(req.local_ca_guid, A_GUID);
    assert_eq!((req.local_qpn, req.local_qkey), (0x100, 0));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.remote_cm_response_timeout, req.local_cm_response_timeout), (20, 20));
    assert_eq!(req.max_cm_retries, 15);
    assert_eq!(req.pkey, 0xffff);
    assert_eq!((req.transport, req.extended_transport), (0, 0));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(req.path_mtu, Mtu::Mtu1024 as u8);
    assert!(req.starting_psn <= 0xff_ffff);
    let path = &req.primary_path;
    assert_eq!(path.local_ack_timeout, 19, "packet lifetime 18 + 1");
    assert_eq!(path.hop_limit, 64);
    assert_eq!((path.local_lid, path.remote_lid), (0xffff, 0xffff), "permissive LIDs");
    assert_eq!(path.local_gid, gid([10, 0, 0, 1]));
    assert_eq!(path.remote_gid, gid([10, 0, 0, 2]));
    assert_eq!(path.flow_label, (40000 * 31 + 7174) & 0xF_FFFF);
    assert_eq!((path.traffic_class, path.sl, path.packet_rate), (0, 0, 0));
    assert_eq!(req.alternate_path, CmPathRepr::default());
    // The private data: cma_hdr (version 0, IPv4, the source port, zero-padded addresses), then
    // the consumer's bytes.
    assert_eq!(req.private_data.len(), 92);
    assert_eq!(&req.private_data[..4], &[0x00, 0x40, 0x9c, 0x40]);
    let hdr = CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&req.private_data[..]).unwrap()).unwrap();
    assert_eq!((hdr.port, hdr.src, hdr.dst), (SPORT, A_IP, B_IP));
    assert_eq!(&req.private_data[36..41], b"hello");
    assert!(req.private_data[41..].iter().all(|&b| b == 0));
    // cm_form_tid: the low half is the comm ID as the kernel holds it (its bytes swapped).
    assert_eq!(repr.tid as u32, req.local_comm_id.swap_bytes());
    assert_ne!(req.local_comm_id, 0);
    assert_eq!(repr.attr_mod, 0);
    assert_eq!(p.a.state(a), Some(IdState::ReqSent));
    assert_eq!(p.a.poll_timeout(), Some(Instant::ZERO + REQ_TIMEOUT));
    assert_eq!(p.a.counters().mads_sent, 1);
}

/// XRC (cm.c:1359-1366, :2257-2268, cm_msgs.h): an XRC_INI REQ has transport 3 with extended
/// transport 1 and no responder-side values; the XRC_TGT REP carries the target QPN in the Local
/// EECN field, and the initiator reads it from there.
#[test]
fn xrc_initiator_to_target() {
    let mut p = Pair::new();
    let l = p.listen(PS_IB, QpType::XrcTgt, 0);
    let a = p.dial(PS_IB, QpType::XrcIni, SPORT, req_param(0x100, b"x"));
    p.drive();
    let CmMessage::Req(req) = &p.wire[0].repr.msg else { panic!() };
    assert_eq!(req.service_id, 0x0000_0000_013F_1C06);
    assert_eq!((req.transport, req.extended_transport), (3, 1));
    assert_eq!((req.responder_resources, req.retry_count, req.rnr_retry_count, req.srq), (0, 0, 0, false));
    assert_eq!(req.local_qpn, 0x100);
    let ev = p.event(Side::B);
    assert_eq!((ev.kind, ev.listen_id, ev.param.qp_num), (CmEventKind::ConnectRequest, Some(l), 0x100));
    let b = ev.id;
    p.b.accept(p.now, b, rep_param(0x300)).unwrap();
    p.drive();
    let CmMessage::Rep(rep) = &p.sent(CmAttr::Rep)[0].repr.msg else { panic!() };
    assert_eq!((rep.local_eecn, rep.local_qpn, rep.srq), (0x300, 0, true));
    let ev = p.event(Side::A);
    assert_eq!((ev.id, ev.kind, ev.param.qp_num), (a, CmEventKind::ConnectResponse, 0x300));
    let rtr = p.a.init_qp_attr(a, QpState::Rtr).unwrap();
    assert_eq!(rtr.attr.dest_qp_num, 0x300);
    // cm_init_qp_rtr_attr: an initiator gets the RC set without the responder's values.
    assert_eq!(rtr.mask, AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN);
    let rts = p.a.init_qp_attr(a, QpState::Rts).unwrap();
    assert!(rts.mask.contains(AttrMask::SQ_PSN | AttrMask::TIMEOUT));
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.event(Side::B).kind, CmEventKind::Established);
    assert_eq!(p.b.init_qp_attr(b, QpState::Rtr).map(|r| r.attr.dest_qp_num), Ok(0x100));
    // Each side's masks carry what qp_state_table requires of its QP type (rdma_xserver -c x
    // moves its target QP to RTS with exactly what rdma_init_qp_attr gives).
    for (cm, h, ty) in [(&p.a, a, QpType::XrcIni), (&p.b, b, QpType::XrcTgt)] {
        let mut from = QpState::Reset;
        for to in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let need = crate::modify::required(ty, from, to).expect("a legal transition");
            let got = cm.init_qp_attr(h, to).unwrap().mask;
            assert!(got.contains(need), "{ty:?} {from:?}->{to:?}: {got:?} lacks {need:?}");
            from = to;
        }
    }
}

/// librdmacm's rdma_accept (and the shim's, `qp_to_rts`) moves the passive QP to RTR and RTS
/// *before* the REP is sent; the RTR's receive PSN must be the Starting PSN that REP then
/// announces (rdma_cm picks it in `__rdma_create_id`; rdma_init_qp_attr, cma.c:1261-1262), and
/// the active side sends from it (cm_rep_handler, cm.c:2564). The RTS's send PSN is the REQ's.
/// The kernel and hardware read the field this way (ConnectX write.pcap: the passive QP's first
/// packet carries the REQ's PSN, the active QP's the REP's); rdma_rxe drops as duplicates the
/// packets of a peer that reads it the other way.
#[test]
fn starting_psn_is_where_the_senders_receive_queue_begins() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    let a = p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    let CmMessage::Req(req) = &p.sent(CmAttr::Req)[0].repr.msg else { panic!() };
    let req_psn = req.starting_psn;
    let b = p.event(Side::B).id;
    let rtr = p.b.init_qp_attr(b, QpState::Rtr).unwrap();
    let rts = p.b.init_qp_attr(b, QpState::Rts).unwrap();
    assert_eq!(rts.attr.sq_psn, req_psn);
    p.b.accept(p.now, b, rep_param(0x200)).unwrap();
    p.drive();
    let CmMessage::Rep(rep) = &p.sent(CmAttr::Rep)[0].repr.msg else { panic!() };
    assert_eq!(rtr.attr.rq_psn, rep.starting_psn);
    assert_eq!(p.a.init_qp_attr(a, QpState::Rts).unwrap().attr.sq_psn, rep.starting_psn);
    assert_eq!(p.a.init_qp_attr(a, QpState::Rtr).unwrap().attr.rq_psn, req_psn);
}

/// cm_req_handler / cm_init_qp_rts_attr: the passive QP's retry count is the REQ's; ib_cm's REP
/// parameters have no retry count, so what rdma_accept passes (rping's server: 0) does not
/// change it.
#[test]

fn passive_retry_count_is_the_reqs() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
    p.drive();
    let b = p.event(Side::B).id;
    assert_eq!(p.b.init_qp_attr(b, QpState::Rts).unwrap().attr.retry_cnt, 7, "before accept");
    let rping_server = ConnParam { responder_resources: 1, initiator_depth: 1, qp_num: 0x200, ..Default::default() };
    p.b.accept(p.now, b, rping_server).unwrap();
    assert_eq!(p.b.init_qp_attr(b, QpState::Rts).unwrap().attr.retry_cnt, 7, "after accept");
}

/// ECE (Linux 5.8+ ib_cm, cm_format_mad_ece_hdr / CM_REQ_VENDOR_ID / CM_REP_VENDOR_ID_H,M,L):
/// the REQ carries the active side's vendor and options (Vendor ID field, MAD attribute
/// modifier) and CONNECT_REQUEST reports them; the REP carries what the passive side answers and
/// CONNECT_RESPONSE reports it. Without ECE both are 0 on the wire, as in every capture.
#[test]
fn ece_travels_in_the_vendor_id_and_attribute_modifier() {
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    let ece = Ece { vendor_id: 0x02c9, attr_mod: 0x8000_0011 };
    p.dial(PS_TCP, QpType::Rc, SPORT, ConnParam { ece, ..req_param(0x100, b"") });
    p.drive();
    let req = p.event(Side::B);
    assert_eq!(req.param.ece, ece);
    let sent = &p.wire[0];
    let CmMessage::Req(r) = &sent.repr.msg else { panic!("not a REQ: {:?}", sent.repr) };
    assert_eq!((r.vendor_id, sent.repr.attr_mod), (0x02c9, 0x8000_0011));

    let answer = Ece { vendor_id: 0x02c9, attr_mod: 0x5 };
    p.b.accept(p.now, req.id, ConnParam { ece: answer, ..rep_param(0x200) }).unwrap();
    p.drive();
    let rep = p.event(Side::A);
    assert_eq!((rep.kind, rep.param.ece), (CmEventKind::ConnectResponse, answer));
    let sent = &p.wire[1];
    let CmMessage::Rep(r) = &sent.repr.msg else { panic!("not a REP: {:?}", sent.repr) };
    assert_eq!((r.vendor_id, sent.repr.attr_mod), (0x02c9, 0x5));

    // No ECE: zeros on the wire and in the events.
    let mut p = Pair::new();
    p.listen(PS_TCP, QpType::Rc, 0);
    p.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b""));
    p.drive();
    let req = p.event(Side::B);
    assert_eq!(req.param.ece, Ece::default());
    assert_eq!(p.wire[0].repr.attr_mod, 0);
}
