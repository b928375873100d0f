//! The CM against itself: two devices (10.0.0.1 active, 10.0.0.2 passive) on a virtual wire
//! in virtual time. Each test names the IBTA Vol 1 chapter 12 rule, or the Linux 6.1 ib_cm /
//! rdma_cm behaviour (`reference/cm/README.md`), it checks.
//!
//! This file holds what they share, [`Pair`] and the parameters and timeouts of rping and the
//! kernel; the tests are in one file by concern: [`connect`], [`rejection`], [`listen`],
//! [`resend`], [`disconnect`], [`untrusted`] (bad input), [`route`] (paths and routes) and
//! [`sidr`] (UD).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::*;
use crate::time::{Duration, Instant};
use crate::verbs::{Mtu, QpType};
use crate::wire::{CmAttr, CmDrepRepr, CmMadRepr, CmMessage, CmaHdrPacket, CmaHdrRepr, MAD_LEN};

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

mod connect;
mod disconnect;
mod listen;
mod rejection;
mod resend;
mod route;
mod sidr;
mod untrusted;
