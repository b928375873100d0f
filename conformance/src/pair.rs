//! Two engine devices joined by a scripted wire, in virtual time: the harness of the rule tests.
//! Like quinn-proto's test `Pair`: every datagram passes a filter that can deliver, drop,
//! duplicate or delay it, so a test can lose exactly the packet a rule is about.

use std::net::{IpAddr, Ipv4Addr};

use softrdma_engine::connect::{bring_up, connect_pair, ConnectParams, End, Remote};
use softrdma_engine::device::{CqId, Device, DeviceConfig, MrKeys, PdId, QpCaps, QpInit, RecvMeta, Transmit};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::time::{Duration, Instant};
use softrdma_engine::verbs::{Access, Mtu, QpType, WcStatus};
use softrdma_engine::wire::{IbPacket, Opcode, Psn, Qpn};
use softrdma_engine::wr::WorkCompletion;
/// What the scripted wire does with one datagram: the shared fault model's per-datagram decision.
pub use softrdma_transport::faults::Fate;

/// A datagram as the filter and the log see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// 0: sent by A, 1: sent by B.
    pub from: usize,
    /// When it was sent.
    pub at: Instant,
    /// Opcode.
    pub opcode: Opcode,
    /// PSN.
    pub psn: Psn,
    /// The AETH syndrome byte, if any.
    pub syndrome: Option<u8>,
    /// AckReq.
    pub ack_req: bool,
    /// The UDP payload.
    pub bytes: Vec<u8>,
}

impl Seen {
    /// The packet `from` sent at `at`, read from its bytes (a packet the engine emitted: it panics
    /// on a malformed one).
    pub fn new(from: usize, at: Instant, bytes: Vec<u8>) -> Seen {
        let p = IbPacket::new_checked(&bytes[..]).expect("the engine emits well-formed packets");
        Seen {
            from,
            at,
            opcode: p.opcode(),
            psn: p.bth().psn(),
            syndrome: p.aeth().map(|a| a.syndrome_byte()),
            ack_req: p.bth().ack_req(),
            bytes,
        }
    }
}

type Filter = Box<dyn FnMut(&Seen) -> Fate>;

/// A filter for [`Pair::set_filter`] that loses the first `n` datagrams `matches` selects and
/// delivers every other.
pub fn lose_first(n: usize, matches: impl Fn(&Seen) -> bool + 'static) -> impl FnMut(&Seen) -> Fate + 'static {
    let mut lost = 0;
    move |s| {
        if lost < n && matches(s) {
            lost += 1;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    }
}

/// Two devices, A at 10.0.0.1 and B at 10.0.0.2, each with one owner's memory at `BASE`.
pub struct Pair {
    /// Device A.
    pub a: Device<VecMemory>,
    /// Device B.
    pub b: Device<VecMemory>,
    /// Virtual time.
    pub now: Instant,
    /// One-way latency.
    pub latency: Duration,
    in_flight: Vec<(Instant, u64, usize, RecvMeta, Vec<u8>)>,
    seq: u64,
    filter: Filter,
    /// Every datagram sent, in order.
    pub log: Vec<Seen>,
}

/// Base address of each side's test memory.
pub const BASE: u64 = 0x1_0000;
/// Bytes of test memory per side.
pub const MEM: usize = 1 << 22;
/// The owner id of each side's memory.
pub const OWNER: u32 = 7;

/// One side of a connected RC QP pair, with a registered buffer covering all its memory.
#[derive(Debug, Clone, Copy)]
pub struct Side {
    /// PD.
    pub pd: PdId,
    /// CQ (send and receive).
    pub cq: CqId,
    /// QP number.
    pub qpn: Qpn,
    /// Keys of the region over all of the side's memory.
    pub mr: MrKeys,
    /// The SRQ the QP receives from, if any.
    pub srq: Option<u32>,
}

/// Options of [`Pair::connect_rc`].
#[derive(Debug, Clone, Copy)]
pub struct RcOptions {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// RNR timer code the responders send.
    pub min_rnr_timer: u8,
    /// Initiator depth.
    pub max_rd_atomic: u8,
    /// Responder depth.
    pub max_dest_rd_atomic: u8,
    /// A's first send PSN (= B's expected PSN).
    pub psn_a: u32,
    /// B's first send PSN.
    pub psn_b: u32,
    /// QP access flags on both sides.
    pub access: Access,
    /// Queue depths.
    pub depth: u32,
    /// CQ size.
    pub cqe: u32,
    /// B's QP takes its receive WQEs from a new SRQ of this many entries.
    pub b_srq: Option<u32>,
}

impl RcOptions {
    /// The attributes both QPs take, with Q_Key `qkey`.
    pub fn params(&self, qkey: u32) -> ConnectParams {
        ConnectParams {
            mtu: self.mtu,
            access: self.access,
            qkey,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
        }
    }
}

impl Default for RcOptions {
    fn default() -> RcOptions {
        RcOptions {
            mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            psn_a: 100,
            psn_b: 5000,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            depth: 256,
            cqe: 4096,
            b_srq: None,
        }
    }
}

/// The two devices' addresses.
pub const ADDR_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
/// B's address.
pub const ADDR_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

impl Pair {
    /// Two devices with MTU 4096 ports, seeded `seed` and `seed + 1`.
    pub fn new(seed: u64) -> Pair {
        let dev = |addr, seed| {
            let mut m = VecMemory::new();
            m.add(OWNER, BASE, MEM);
            Device::new(DeviceConfig::new(addr, seed), m)
        };
        Pair {
            a: dev(ADDR_A, seed),
            b: dev(ADDR_B, seed + 1),
            now: Instant::ZERO,
            latency: Duration::from_micros(5),
            in_flight: Vec::new(),
            seq: 0,
            filter: Box::new(|_| Fate::Deliver),
            log: Vec::new(),
        }
    }

    /// Sets the wire's filter.
    pub fn set_filter(&mut self, f: impl FnMut(&Seen) -> Fate + 'static) {
        self.filter = Box::new(f);
    }

    /// The device of side `i`.
    pub fn dev(&mut self, i: usize) -> &mut Device<VecMemory> {
        if i == 0 {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    /// Creates, connects and moves to RTS one RC QP on each side.
    pub fn connect_rc(&mut self, o: RcOptions) -> (Side, Side) {
        let mk = |d: &mut Device<VecMemory>, srq_depth: Option<u32>| {
            let pd = d.alloc_pd(OWNER);
            let cq = d.create_cq(o.cqe).unwrap();
            let mr = d
                .reg_mr(
                    pd,
                    BASE,
                    MEM as u64,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
                )
                .unwrap();
            let caps = QpCaps {
                max_send_wr: o.depth,
                max_recv_wr: o.depth,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            };
            let srq = srq_depth.map(|n| {
                let attr = softrdma_engine::device::SrqAttr { max_wr: n, max_sge: 4, srq_limit: 0 };
                d.create_srq(pd, attr).unwrap()
            });
            let qpn = d
                .create_qp(QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq })
                .unwrap();
            Side { pd, cq, qpn, mr, srq }
        };
        let sa = mk(&mut self.a, None);
        let sb = mk(&mut self.b, o.b_srq);
        connect_pair(
            End { dev: &mut self.a, qpn: sa.qpn, qp_type: QpType::Rc, psn: o.psn_a },
            End { dev: &mut self.b, qpn: sb.qpn, qp_type: QpType::Rc, psn: o.psn_b },
            &o.params(0),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (sa, sb)
    }

    /// Moves a QP of any type from RESET to RTS, setting exactly the attributes the kernel's
    /// table requires for each transition ([`softrdma_engine::connect::bring_up`]).
    #[allow(clippy::too_many_arguments)]
    pub fn bring_up(
        d: &mut Device<VecMemory>,
        qpn: Qpn,
        qp_type: QpType,
        o: &RcOptions,
        peer: IpAddr,
        peer_qpn: Qpn,
        my_psn: u32,
        peer_psn: u32,
        qkey: u32,
    ) {
        let remote = Remote { addr: peer, qpn: peer_qpn, psn: peer_psn };
        bring_up(d, qpn, qp_type, &o.params(qkey), my_psn, &remote).unwrap_or_else(|e| panic!("{e}"));
    }

    fn collect(&mut self) {
        let mut buf = vec![0u8; 4096 + 256];
        for from in 0..2 {
            loop {
                let now = self.now;
                let t: Option<Transmit> = self.dev(from).poll_transmit(now, &mut buf);
                let Some(t) = t else { break };
                let bytes = buf[..t.len].to_vec();
                let seen = Seen::new(from, now, bytes.clone());
                let fate = (self.filter)(&seen);
                self.log.push(seen);
                let src = if from == 0 { ADDR_A } else { ADDR_B };
                let meta = RecvMeta { src, src_port: t.src_port, ip_id: None, dst: Some(t.dst) };
                let to = 1 - from;
                let at = now + self.latency;
                match fate {
                    Fate::Deliver => self.push(at, to, meta, bytes),
                    Fate::Drop => {}
                    Fate::Duplicate => {
                        self.push(at, to, meta, bytes.clone());
                        self.push(at + Duration::from_micros(1), to, meta, bytes);
                    }
                    Fate::Delay(d) => self.push(at + d, to, meta, bytes),
                    Fate::Corrupt => {
                        let mut b = bytes;
                        let i = b.len() / 2;
                        b[i] ^= 0x10;
                        self.push(at, to, meta, b);
                    }
                }
            }
        }
    }

    fn push(&mut self, at: Instant, to: usize, meta: RecvMeta, bytes: Vec<u8>) {
        self.seq += 1;
        self.in_flight.push((at, self.seq, to, meta, bytes));
    }

    /// Runs until nothing is in flight and no timer is armed, or `max_steps` events passed.
    /// Returns the number of events; panics on livelock (the bound reached).
    pub fn drive(&mut self, max_steps: usize) -> usize {
        for step in 0..max_steps {
            if !self.step() {
                return step;
            }
        }
        panic!("livelock: {max_steps} events without quiescence");
    }

    /// Sends what the devices have to send, then processes the next event (a delivery or a
    /// timer). False when nothing is pending.
    pub fn step(&mut self) -> bool {
        {
            self.collect();
            let next_pkt = self.in_flight.iter().map(|x| (x.0, x.1)).min();
            let next_timer = [self.a.poll_timeout(), self.b.poll_timeout()].into_iter().flatten().min();
            let pkt_first = match (next_pkt, next_timer) {
                (None, None) => return false,
                (Some((t, _)), Some(x)) => t <= x,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            match (next_pkt, next_timer) {
                (Some((_, seq)), _) if pkt_first => {
                    let i = self.in_flight.iter().position(|x| x.1 == seq).expect("present");
                    let (at, _, to, meta, bytes) = self.in_flight.swap_remove(i);
                    self.now = self.now.max(at);
                    let now = self.now;
                    self.dev(to).handle_packet(now, meta, &bytes);
                }
                (_, Some(t)) => {
                    self.now = self.now.max(t);
                    let now = self.now;
                    self.a.handle_timeout(now);
                    self.b.handle_timeout(now);
                }
                _ => unreachable!("handled above"),
            }
        }
        self.collect();
        true
    }

    /// Completions of side `i`'s CQ.
    pub fn poll(&mut self, i: usize, cq: CqId) -> Vec<WorkCompletion> {
        self.dev(i).poll_cq(cq, usize::MAX)
    }

    /// Polls side `i`'s CQ: each completion's wr_id and status, in the CQ's order.
    pub fn statuses(&mut self, i: usize, cq: CqId) -> Vec<(u64, WcStatus)> {
        self.poll(i, cq).iter().map(|w| (w.wr_id, w.status)).collect()
    }

    /// Polls side `i`'s CQ and asserts that it held `n` completions, every one successful.
    #[track_caller]
    pub fn poll_successes(&mut self, i: usize, cq: CqId, n: usize) -> Vec<WorkCompletion> {
        let wcs = self.poll(i, cq);
        assert_eq!(wcs.len(), n);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        wcs
    }

    /// Writes test data into side `i`'s memory.
    pub fn fill(&mut self, i: usize, addr: u64, data: &[u8]) {
        self.dev(i).memory().set(OWNER, addr, data);
    }

    /// Reads side `i`'s memory.
    pub fn read(&mut self, i: usize, addr: u64, len: usize) -> Vec<u8> {
        self.dev(i).memory().get(OWNER, addr, len)
    }

    /// The opcodes sent by side `from`, in order.
    pub fn sent(&self, from: usize) -> Vec<Opcode> {
        self.log.iter().filter(|s| s.from == from).map(|s| s.opcode).collect()
    }
}
