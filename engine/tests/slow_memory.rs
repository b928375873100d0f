//! The engine over a memory that answers later (`Memory::would_block_count`, `write_fence`,
//! `start_atomic`): a client's memory helper in the device, or an HCA faulting in an
//! on-demand-paging page. What waits for the memory waits; nothing is lost, repeated or
//! answered before the data it answers for is in place; other QPs are not held up.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use softrdma_engine::connect::{connect_pair, ConnectParams, End};
use softrdma_engine::device::{Device, DeviceConfig, QpCaps, QpInit, RecvMeta};
use softrdma_engine::memory::{AtomicOp, AtomicStart, Memory, MemoryError, Owner, VecMemory};
use softrdma_engine::time::Instant;
use softrdma_engine::verbs::{Access, Mtu, QpType, WcStatus};
use softrdma_engine::wire::Qpn;
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const OWNER: Owner = 1;
const BASE: u64 = 0x10_0000;
const MEM: usize = 1 << 20;

/// A memory whose reads and atomics are answered, and whose writes land, only at `answer()`.
#[derive(Default)]
struct SlowMemory {
    inner: VecMemory,
    blocked: u64,
    /// Reads asked for, and those answered (usable until the next answer).
    asked: Vec<(Owner, u64, usize)>,
    answered: Vec<(Owner, u64, Vec<u8>)>,
    writes: Vec<(Owner, u64, Vec<u8>)>,
    issued: u64,
    applied: u64,
    last_write: Option<u64>,
    atomics: HashMap<u64, (Owner, u64, AtomicOp, Option<u64>)>,
    next_ticket: u64,
    /// Bytes written through `write_local` (buffers the owner posted itself) and `write`.
    local_bytes: usize,
    remote_bytes: usize,
}

impl SlowMemory {
    fn new() -> SlowMemory {
        let mut m = SlowMemory::default();
        m.inner.add(OWNER, BASE, MEM);
        m
    }

    /// Whether anything is waiting to be answered.
    fn busy(&self) -> bool {
        !self.asked.is_empty() || !self.writes.is_empty() || self.atomics.values().any(|a| a.3.is_none())
    }

    /// Lands the writes, answers the reads and runs the atomics, in the order they came.
    fn answer(&mut self) {
        for (o, a, d) in std::mem::take(&mut self.writes) {
            self.inner.write(o, a, &d).unwrap();
        }
        self.applied = self.issued;
        self.answered.clear();
        for (o, a, n) in std::mem::take(&mut self.asked) {
            self.answered.push((o, a, self.inner.get(o, a, n)));
        }
        let mut tickets: Vec<u64> = self.atomics.iter().filter(|(_, v)| v.3.is_none()).map(|(k, _)| *k).collect();
        tickets.sort_unstable();
        for t in tickets {
            let (o, a, op, _) = self.atomics[&t];
            let orig = self.inner.start_atomic(o, a, op).unwrap();
            let AtomicStart::Done(v) = orig else { unreachable!() };
            self.atomics.get_mut(&t).unwrap().3 = Some(v);
        }
    }
}

impl Memory for SlowMemory {
    fn read(&mut self, owner: Owner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let n = buf.len();
        for (o, a, d) in &self.answered {
            if *o == owner && addr >= *a && addr + n as u64 <= a + d.len() as u64 {
                let off = (addr - a) as usize;
                buf.copy_from_slice(&d[off..off + n]);
                return Ok(());
            }
        }
        if !self.asked.contains(&(owner, addr, n)) {
            self.asked.push((owner, addr, n));
        }
        self.blocked += 1;
        Err(MemoryError { addr, len: n })
    }

    fn write_local(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        // The same write, counted as local.
        self.write(owner, addr, data)?;
        self.remote_bytes -= data.len();
        self.local_bytes += data.len();
        Ok(())
    }

    fn write(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.remote_bytes += data.len();
        self.answered.retain(|(o, a, d)| *o != owner || a + d.len() as u64 <= addr || *a >= addr + data.len() as u64);
        self.writes.push((owner, addr, data.to_vec()));
        self.issued += 1;
        self.last_write = Some(self.issued);
        Ok(())
    }

    fn would_block_count(&self) -> u64 {
        self.blocked
    }

    fn write_fence(&mut self) -> u64 {
        self.last_write.take().unwrap_or(0)
    }

    fn fence_passed(&mut self, token: u64) -> bool {
        let passed = self.applied >= token;
        self.blocked += u64::from(!passed);
        passed
    }

    fn start_atomic(&mut self, owner: Owner, addr: u64, op: AtomicOp) -> Result<AtomicStart, MemoryError> {
        self.next_ticket += 1;
        self.atomics.insert(self.next_ticket, (owner, addr, op, None));
        Ok(AtomicStart::Later(self.next_ticket))
    }

    fn atomic_result(&mut self, ticket: u64) -> Option<Result<u64, MemoryError>> {
        match self.atomics.get(&ticket) {
            Some((_, _, _, Some(v))) => {
                let v = *v;
                self.atomics.remove(&ticket);
                Some(Ok(v))
            }
            Some(_) => {
                self.blocked += 1;
                None
            }
            None => Some(Err(MemoryError { addr: 0, len: 8 })),
        }
    }
}

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const S: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

struct World {
    a: Device<VecMemory>,
    s: Device<SlowMemory>,
    now: Instant,
}

struct Q {
    qpn: Qpn,
    cq: softrdma_engine::device::CqId,
    lkey: u32,
    rkey: u32,
}

fn qp<M: Memory>(d: &mut Device<M>) -> Q {
    let pd = d.alloc_pd(OWNER);
    let cq = d.create_cq(64).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = d.reg_mr(pd, BASE, MEM as u64, all).unwrap();
    let caps = QpCaps { max_send_wr: 32, max_recv_wr: 32, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qpn = d
        .create_qp(QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None })
        .unwrap();
    Q { qpn, cq, lkey: mr.lkey, rkey: mr.rkey }
}

impl World {
    fn new() -> (World, Q, Q) {
        let mut a = VecMemory::new();
        a.add(OWNER, BASE, MEM);
        let mut w = World {
            a: Device::new(DeviceConfig::new(A, 1), a),
            s: Device::new(DeviceConfig::new(S, 2), SlowMemory::new()),
            now: Instant::ZERO,
        };
        let (qa, qs) = (qp(&mut w.a), qp(&mut w.s));
        let p = ConnectParams { mtu: Mtu::Mtu1024, ..ConnectParams::default() };
        connect_pair(
            End { dev: &mut w.a, qpn: qa.qpn, qp_type: QpType::Rc, psn: 100 },
            End { dev: &mut w.s, qpn: qs.qpn, qp_type: QpType::Rc, psn: 900 },
            &p,
        )
        .unwrap();
        (w, qa, qs)
    }

    /// Moves packets both ways until neither side has one; returns how many moved from S.
    fn run(&mut self) -> usize {
        let mut buf = vec![0u8; 4096 + 256];
        let mut from_s = 0;
        loop {
            let mut moved = 0;
            while let Some(t) = self.a.poll_transmit(self.now, &mut buf) {
                let meta = RecvMeta { src: A, src_port: t.src_port, ip_id: None, dst: None };
                self.s.handle_packet(self.now, meta, &buf[..t.len]);
                moved += 1;
            }
            while let Some(t) = self.s.poll_transmit(self.now, &mut buf) {
                let meta = RecvMeta { src: S, src_port: t.src_port, ip_id: None, dst: None };
                self.a.handle_packet(self.now, meta, &buf[..t.len]);
                moved += 1;
                from_s += 1;
            }
            if moved == 0 {
                return from_s;
            }
        }
    }

    /// Answers S's memory until it has nothing waiting (telling the engine each time).
    fn settle(&mut self) {
        for _ in 0..10_000 {
            self.run();
            if !self.s.memory_ref().busy() {
                self.run();
                return;
            }
            self.s.memory().answer();
            self.s.memory_ready();
        }
        panic!("the memory never settled");
    }
}

fn sge(q: &Q, off: u64, len: u32) -> Vec<Sge> {
    vec![Sge { addr: BASE + off, length: len, lkey: q.lkey }]
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn a_send_waits_for_its_data_and_arrives_whole() {
    let (mut w, qa, qs) = World::new();
    let data = pattern(5000, 3);
    w.s.memory().inner.set(OWNER, BASE, &data);
    w.a.post_recv(qa.qpn, RecvWr { wr_id: 1, sg_list: sge(&qa, 0, 8192) }).unwrap();
    w.s.post_send(qs.qpn, SendWr::new(2, SendOp::Send, sge(&qs, 0, 5000))).unwrap();
    // The data is not there yet: nothing leaves, nothing fails.
    assert_eq!(w.run(), 0, "a packet left before its data was read");
    assert!(w.s.poll_cq(qs.cq, 4).is_empty());
    w.settle();
    let c = w.a.poll_cq(qa.cq, 4);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].status, c[0].byte_len), (WcStatus::Success, 5000));
    assert_eq!(w.a.memory().get(OWNER, BASE, 5000), data);
    let c = w.s.poll_cq(qs.cq, 4);
    assert_eq!((c.len(), c[0].wr_id, c[0].status), (1, 2, WcStatus::Success));
}

#[test]
fn a_write_is_acknowledged_only_once_it_has_landed() {
    let (mut w, qa, qs) = World::new();
    let data = pattern(3000, 9);
    w.a.memory().set(OWNER, BASE, &data);
    let op = SendOp::Write { remote_addr: BASE + 4096, rkey: qs.rkey };
    w.a.post_send(qa.qpn, SendWr::new(1, op, sge(&qa, 0, 3000))).unwrap();
    // The WRITE's packets arrive; the writes wait in the memory: no ACK yet.
    assert_eq!(w.run(), 0, "S acknowledged a WRITE whose data had not landed");
    assert!(w.a.poll_cq(qa.cq, 4).is_empty());
    w.s.memory().answer();
    w.s.memory_ready();
    assert!(w.run() > 0, "no ACK once the data landed");
    let c = w.a.poll_cq(qa.cq, 4);
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
    assert_eq!(w.s.memory().inner.get(OWNER, BASE + 4096, 3000), data);
}

#[test]
fn reads_and_atomics_are_answered_once_and_in_order() {
    let (mut w, qa, qs) = World::new();
    let data = pattern(6000, 5);
    w.s.memory().inner.set(OWNER, BASE + 8192, &data);
    w.s.memory().inner.set(OWNER, BASE, &40u64.to_ne_bytes());
    let read = SendOp::Read { remote_addr: BASE + 8192, rkey: qs.rkey };
    w.a.post_send(qa.qpn, SendWr::new(1, read, sge(&qa, 8192, 6000))).unwrap();
    for i in 0..5u64 {
        let fa = SendOp::FetchAdd { remote_addr: BASE, rkey: qs.rkey, add: 2 };
        w.a.post_send(qa.qpn, SendWr::new(10 + i, fa, sge(&qa, 64 + 8 * i, 8))).unwrap();
    }
    assert_eq!(w.run(), 0, "an answer left before the memory gave it");
    w.settle();
    let c = w.a.poll_cq(qa.cq, 16);
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![1, 10, 11, 12, 13, 14]);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(w.a.memory().get(OWNER, BASE + 8192, 6000), data);
    for i in 0..5u64 {
        let got = u64::from_ne_bytes(w.a.memory().get(OWNER, BASE + 64 + 8 * i, 8).try_into().unwrap());
        assert_eq!(got, 40 + 2 * i, "FETCH_ADD {i} saw its predecessors exactly once");
    }
    let end = u64::from_ne_bytes(w.s.memory().inner.get(OWNER, BASE, 8).try_into().unwrap());
    assert_eq!(end, 50);
}

/// The engine says which writes go into buffers their owner posted itself (a receive's scatter
/// list, a READ's or atomic's local destination: `Memory::write_local`, which a device in the
/// owner's process copies directly) and which a remote peer asked for (an RDMA WRITE:
/// `Memory::write`, which must fail rather than crash on memory the program unmapped).
#[test]
fn local_and_remote_writes_are_told_apart() {
    let (mut w, qa, qs) = World::new();
    // A SEND into S's receive buffer: local.
    w.a.memory().set(OWNER, BASE, &pattern(5000, 1));
    w.s.post_recv(qs.qpn, RecvWr { wr_id: 1, sg_list: sge(&qs, 0, 8192) }).unwrap();
    w.a.post_send(qa.qpn, SendWr::new(2, SendOp::Send, sge(&qa, 0, 5000))).unwrap();
    w.settle();
    let m = w.s.memory_ref();
    assert_eq!((m.local_bytes, m.remote_bytes), (5000, 0));
    // A's RDMA WRITE into S: remote.
    let op = SendOp::Write { remote_addr: BASE + 8192, rkey: qs.rkey };
    w.a.post_send(qa.qpn, SendWr::new(3, op, sge(&qa, 0, 3000))).unwrap();
    w.settle();
    let m = w.s.memory_ref();
    assert_eq!((m.local_bytes, m.remote_bytes), (5000, 3000));
    // S's READ from A lands in S's own buffer, and a fetch-and-add's original value too: local.
    let op = SendOp::Read { remote_addr: BASE, rkey: qa.rkey };
    w.s.post_send(qs.qpn, SendWr::new(4, op, sge(&qs, 16_384, 2000))).unwrap();
    let op = SendOp::FetchAdd { remote_addr: BASE + 4096, rkey: qa.rkey, add: 1 };
    w.s.post_send(qs.qpn, SendWr::new(5, op, sge(&qs, 20_000, 8))).unwrap();
    w.settle();
    let m = w.s.memory_ref();
    assert_eq!((m.local_bytes, m.remote_bytes), (5000 + 2000 + 8, 3000));
    assert_eq!(w.s.memory().inner.get(OWNER, BASE + 16_384, 2000), pattern(5000, 1)[..2000]);
    let c: Vec<_> = w.s.poll_cq(qs.cq, 8).into_iter().map(|c| (c.wr_id, c.status)).collect();
    assert!(c.contains(&(1, WcStatus::Success)) && c.contains(&(5, WcStatus::Success)), "{c:?}");
}
