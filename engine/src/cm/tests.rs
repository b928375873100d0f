//! The CM against itself: two devices (10.0.0.1 active, 10.0.0.2 passive) on a virtual wire
//! in virtual time. Each test names the IBTA Vol 1 chapter 12 rule, or the Linux 6.1 ib_cm /
//! rdma_cm behaviour (`reference/cm/README.md`), it checks.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::*;
use crate::time::{Duration, Instant};
use crate::verbs::{Access, Mtu, QpState, QpType};
use crate::wire::{
    CmAttr, CmDrepRepr, CmDreqRepr, CmMadRepr, CmMessage, CmRepRepr, CmRtuRepr, CmaHdrPacket, CmaHdrRepr, MAD_LEN,
};

const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const A_GUID: u64 = 0x0002_c9ff_fe00_0001;
const B_GUID: u64 = 0x0002_c9ff_fe00_0002;
/// rping's port.
const PORT: u16 = 7174;
const SPORT: u16 = 40000;

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `d` times `n`.
const fn times(d: Duration, n: u64) -> Duration {
    Duration::from_nanos(d.as_nanos() * n)
}

/// 2 x 2^(18-8) + 2^(20-8) ms: the REQ (and DREQ) response timeout (cm.c:1539-1543).
const REQ_TIMEOUT: Duration = ms(2 * 1024 + 4096);
/// 2^(20-8) ms: the REP resend, from the REQ's local CM response timeout (cm.c:2100).
const REP_TIMEOUT: Duration = ms(4096);
/// 2^(19-8) ms: timewait, the AV's local ACK timeout (cm.c:974-1000).
const TIMEWAIT: Duration = ms(2048);
/// 2^(24-8) + 2^(19-8) ms: how long an MRA with service timeout 24 holds the REQ resend
/// (cm.c:3204-3205).
const MRA_WAIT: Duration = ms(65536 + 2048);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

// What the wire does with one MAD: the fault model's outcome.
use crate::fault::Fate;

/// One MAD put on the wire.
#[derive(Debug, Clone)]
struct Sent {
    at: Instant,
    from: Side,
    dst: IpAddr,
    repr: CmMadRepr,
    fate: Fate,
}

impl Sent {
    fn attr(&self) -> CmAttr {
        self.repr.msg.attr()
    }
}

/// Two CMs, a wire between them, and a clock.
struct Pair {
    a: Cm,
    b: Cm,
    now: Instant,
    /// Every MAD either side sent, in order.
    wire: Vec<Sent>,
}

fn ip_of(s: Side) -> IpAddr {
    match s {
        Side::A => A_IP,
        Side::B => B_IP,
    }
}

fn deliver_all(_: &Sent) -> Fate {
    Fate::Deliver
}

impl Pair {
    fn new() -> Pair {
        Pair {
            a: Cm::new(CmConfig::new(A_IP, A_GUID, Mtu::Mtu1024, 1)),
            b: Cm::new(CmConfig::new(B_IP, B_GUID, Mtu::Mtu1024, 2)),
            now: Instant::ZERO,
            wire: Vec::new(),
        }
    }

    fn cm(&mut self, s: Side) -> &mut Cm {
        match s {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Moves every MAD to the CM its destination names until both are quiet.
    fn drive(&mut self) {
        self.drive_with(&mut deliver_all);
    }

    /// As `drive`, with `fate` choosing what happens to each MAD.
    fn drive_with(&mut self, fate: &mut dyn FnMut(&Sent) -> Fate) {
        loop {
            let mut moved = false;
            for from in [Side::A, Side::B] {
                while let Some(m) = self.cm(from).poll_mad() {
                    moved = true;
                    assert_eq!(m.mad.len(), MAD_LEN);
                    let repr = CmMadRepr::parse(&m.mad).expect("the CM sends MADs that parse");
                    let mut sent = Sent { at: self.now, from, dst: m.dst, repr, fate: Fate::Deliver };
                    sent.fate = fate(&sent);
                    let to = [Side::A, Side::B].into_iter().find(|s| ip_of(*s) == m.dst);
                    let times = match sent.fate {
                        Fate::Deliver => 1,
                        Fate::Drop => 0,
                        Fate::Duplicate => 2,
                        Fate::Delay(_) | Fate::Corrupt => panic!("the CM tests' wire delivers, drops or duplicates"),
                    };
                    self.wire.push(sent);
                    if let Some(to) = to {
                        let now = self.now;
                        for _ in 0..times {
                            self.cm(to).handle_mad(now, ip_of(from), &m.mad);
                        }
                    }
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// Lets `d` pass, running each timer when it is due and delivering what it sends.
    fn advance(&mut self, d: Duration) {
        self.advance_with(d, &mut deliver_all);
    }

    fn advance_with(&mut self, d: Duration, fate: &mut dyn FnMut(&Sent) -> Fate) {
        let end = self.now + d;
        loop {
            let next = [self.a.poll_timeout(), self.b.poll_timeout()].into_iter().flatten().min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    let now = self.now;
                    self.a.handle_timeout(now);
                    self.b.handle_timeout(now);
                    self.drive_with(fate);
                }
                _ => break,
            }
        }
        self.now = end;
    }

    fn events(&mut self, s: Side) -> Vec<CmEvent> {
        std::iter::from_fn(|| self.cm(s).poll_event()).collect()
    }

    /// The one event `s` has; panics unless there is exactly one.
    fn event(&mut self, s: Side) -> CmEvent {
        let mut ev = self.events(s);
        assert_eq!(ev.len(), 1, "{s:?} events: {ev:?}");
        ev.remove(0)
    }

    /// Every MAD of an attribute that went on the wire.
    fn sent(&self, attr: CmAttr) -> Vec<Sent> {
        self.wire.iter().filter(|s| s.attr() == attr).cloned().collect()
    }

    /// A listener on B's 0.0.0.0:7174.
    fn listen(&mut self, ps: u16, qp_type: QpType, backlog: u32) -> IdHandle {
        let l = self.b.create_id(ps, qp_type);
        self.b.set_addrs(l, Some(sa(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT)), None, 0).unwrap();
        self.b.listen(l, backlog).unwrap();
        l
    }

    /// An active ID on A, from 10.0.0.1:`sport` to 10.0.0.2:7174, connecting.
    fn dial(&mut self, ps: u16, qp_type: QpType, sport: u16, p: ConnParam) -> IdHandle {
        let h = self.a.create_id(ps, qp_type);
        self.a.set_addrs(h, Some(sa(A_IP, sport)), Some(sa(B_IP, PORT)), 0).unwrap();
        let now = self.now;
        self.a.connect(now, h, p).unwrap();
        h
    }

    /// A whole RC connection: (active ID, passive ID, listener).
    fn connected(&mut self) -> (IdHandle, IdHandle, IdHandle) {
        let (a, b, l) = self.replied();
        let now = self.now;
        self.a.establish(now, a).unwrap();
        self.drive();
        assert_eq!(self.event(Side::B).kind, CmEventKind::Established);
        assert_eq!(self.a.state(a), Some(IdState::Established));
        assert_eq!(self.b.state(b), Some(IdState::Established));
        (a, b, l)
    }

    /// An RC connection up to the active side's CONNECT_RESPONSE (REQ and REP delivered, no RTU
    /// yet): (active ID, passive ID, listener).
    fn replied(&mut self) -> (IdHandle, IdHandle, IdHandle) {
        let l = self.listen(PS_TCP, QpType::Rc, 0);
        let a = self.dial(PS_TCP, QpType::Rc, SPORT, req_param(0x100, b"hello"));
        self.drive();
        let req = self.event(Side::B);
        assert_eq!(req.kind, CmEventKind::ConnectRequest);
        let now = self.now;
        self.b.accept(now, req.id, rep_param(0x200)).unwrap();
        self.drive();
        assert_eq!(self.event(Side::A).kind, CmEventKind::ConnectResponse);
        (a, req.id, l)
    }

    /// The comm IDs of the first connection on the wire: (active's, passive's).
    fn comm_ids(&self) -> (u32, u32) {
        (self.sent(CmAttr::Req)[0].repr.msg.local_comm_id(), self.sent(CmAttr::Rep)[0].repr.msg.local_comm_id())
    }
}

fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// rping's client: rr = id = 1, retry = RNR = 7.
fn req_param(qp: u32, data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: data.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        qp_num: qp,
        ..Default::default()
    }
}

fn rep_param(qp: u32) -> ConnParam {
    ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        qp_num: qp,
        ..Default::default()
    }
}

fn mad(tid: u64, msg: CmMessage) -> Vec<u8> {
    let mut buf = vec![0u8; MAD_LEN];
    CmMadRepr { tid, attr_mod: 0, msg }.emit(&mut buf).unwrap();
    buf
}

fn gid(ip: [u8; 4]) -> [u8; 16] {
    Ipv4Addr::from(ip).to_ipv6_mapped().octets()
}

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

mod sidr;

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
