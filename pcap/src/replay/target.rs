//! The engine side of a virtual-time replay: the device, its sparse memory, QP bring-up.

use super::*;
use softrdma_engine::connect::{self, ConnectParams, Remote};

// ---------------------------------------------------------------------------------------------
// Memory: sparse, remembering which bytes the trace itself defined

pub(super) const PAGE: u64 = 4096;
/// At most this many 4 KiB pages per replay (256 MiB); beyond, accesses fail (the engine NAKs).
pub(super) const MAX_PAGES: usize = 1 << 16;

pub(super) struct Page {
    pub(super) data: Box<[u8; PAGE as usize]>,
    pub(super) known: Box<[bool; PAGE as usize]>,
}

/// Memory of the replayed device: pages made on first touch; each byte knows whether the trace
/// defined it (written by a replayed WRITE/SEND/atomic, or set from a recorded payload).
#[derive(Default)]
pub(super) struct SparseMemory {
    pub(super) pages: HashMap<u64, Page>,
}

impl SparseMemory {
    pub(super) fn page(&mut self, n: u64) -> Option<&mut Page> {
        if !self.pages.contains_key(&n) && self.pages.len() >= MAX_PAGES {
            return None;
        }
        Some(
            self.pages.entry(n).or_insert_with(|| Page {
                data: Box::new([0; PAGE as usize]),
                known: Box::new([false; PAGE as usize]),
            }),
        )
    }

    pub(super) fn each(&mut self, addr: u64, len: usize, mut f: impl FnMut(&mut Page, usize, usize, usize)) -> bool {
        let mut done = 0usize;
        while done < len {
            let a = addr.wrapping_add(done as u64);
            let off = (a % PAGE) as usize;
            let n = (PAGE as usize - off).min(len - done);
            let Some(p) = self.page(a / PAGE) else { return false };
            f(p, off, done, n);
            done += n;
        }
        true
    }

    /// Whether every byte of the range was defined by the trace.
    pub(super) fn known(&self, addr: u64, len: usize) -> bool {
        (0..len as u64).all(|i| {
            let a = addr.wrapping_add(i);
            self.pages.get(&(a / PAGE)).is_some_and(|p| p.known[(a % PAGE) as usize])
        })
    }

    pub(super) fn set(&mut self, addr: u64, data: &[u8]) -> bool {
        self.each(addr, data.len(), |p, off, at, n| {
            p.data[off..off + n].copy_from_slice(&data[at..at + n]);
            p.known[off..off + n].iter_mut().for_each(|k| *k = true);
        })
    }

    pub(super) fn get(&mut self, addr: u64, out: &mut [u8]) -> bool {
        let len = out.len();
        self.each(addr, len, |p, off, at, n| out[at..at + n].copy_from_slice(&p.data[off..off + n]))
    }
}

impl Memory for SparseMemory {
    fn read(&mut self, _owner: Owner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let len = buf.len();
        self.get(addr, buf).then_some(()).ok_or(MemoryError { addr, len })
    }

    fn write(&mut self, _owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.set(addr, data).then_some(()).ok_or(MemoryError { addr, len: data.len() })
    }
}

/// The engine side of one replay.
pub(super) struct Engine {
    pub(super) dev: Device<SparseMemory>,
    pub(super) cq: CqId,
    pub(super) qpn: Qpn,
    pub(super) now: Instant,
    pub(super) sent: Vec<Sent>,
    pub(super) buf: Vec<u8>,
    pub(super) completions: u64,
    /// The local ACK timeout code the engine's QPs get at RTS (0: no transport timer).
    pub(super) ack_timeout: u8,
}

impl Engine {
    pub(super) fn run_until(&mut self, t: Instant) {
        loop {
            self.drain();
            match self.dev.poll_timeout() {
                Some(d) if d <= t => {
                    self.now = self.now.max(d);
                    self.dev.handle_timeout(self.now);
                }
                _ => break,
            }
        }
        self.now = self.now.max(t);
        self.drain();
    }

    pub(super) fn drain(&mut self) {
        while let Some(t) = self.dev.poll_transmit(self.now, &mut self.buf) {
            self.sent.push(Sent { bytes: self.buf[..t.len].to_vec(), at: self.now });
        }
        loop {
            let n = self.dev.poll_cq(self.cq, 64).len();
            if n == 0 {
                break;
            }
            self.completions += n as u64;
        }
    }

    pub(super) fn feed(&mut self, src: IpAddr, sport: u16, bytes: &[u8]) {
        let meta = RecvMeta { src, src_port: sport, ip_id: None, dst: None };
        // The analysis checked the recorded ICRC; the bytes were then rewritten (QPN, keys).
        self.dev.handle_internal_packet(self.now, meta, bytes);
        self.drain();
    }
}

/// The engine device of a virtual-time replay, as a [`Target`].
pub(super) struct VirtualTarget {
    pub(super) e: Engine,
    pub(super) pd: PdId,
    pub(super) recv_lkey: u32,
    pub(super) srq: Option<u32>,
    pub(super) posted: u64,
    pub(super) xrcd: Option<softrdma_engine::device::XrcdId>,
}

impl VirtualTarget {
    pub(super) fn new(addr: IpAddr, behaviour: WireProfile, mtu: Mtu) -> Result<VirtualTarget, String> {
        let mut e = make_engine(addr, behaviour, mtu);
        let pd = e.dev.alloc_pd(OWNER);
        let recv = e
            .dev
            .reg_mr(pd, LOCAL_BASE, LOCAL_LEN, Access::LOCAL_WRITE)
            .map_err(|err| format!("reg_mr for receive buffers: {err}"))?;
        Ok(VirtualTarget { e, pd, recv_lkey: recv.lkey, srq: None, posted: 0, xrcd: None })
    }
}

impl VirtualTarget {
    pub(super) fn domain(&mut self) -> Result<softrdma_engine::device::XrcdId, String> {
        if let Some(x) = self.xrcd {
            return Ok(x);
        }
        let x = self.e.dev.open_xrcd(OWNER, None, true, false).map_err(|err| format!("open_xrcd: {err}"))?;
        self.xrcd = Some(x);
        Ok(x)
    }
}

impl Target for VirtualTarget {
    fn reg_region(&mut self, lo: u64, len: u64) -> Result<(u64, u32), String> {
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let k = self.e.dev.reg_mr(self.pd, lo, len, access).map_err(|err| format!("reg_mr: {err}"))?;
        Ok((lo, k.rkey))
    }

    fn create_qp(&mut self, q: &QpSetup) -> Result<u32, String> {
        if q.qp_type == QpType::XrcTgt {
            let xrcd = self.domain()?;
            let (qpn, _) =
                self.e.dev.create_xrc_tgt_qp(OWNER, xrcd).map_err(|err| format!("create XRC target QP: {err}"))?;
            self.e.qpn = qpn;
            bring_to_rts(
                &mut self.e,
                qpn,
                q.qp_type,
                q.peer,
                q.peer_qpn,
                q.mtu,
                q.rq_psn,
                Psn::new(0),
                q.rd_atomic,
                q.min_rnr_timer,
                q.qkey,
            )?;
            return Ok(qpn.value());
        }
        if let Some(d) = q.srq_depth {
            let srq = self
                .e
                .dev
                .create_srq(self.pd, SrqAttr { max_wr: d, max_sge: 1, srq_limit: 0 })
                .map_err(|err| format!("create_srq: {err}"))?;
            self.srq = Some(srq);
        }
        bring_up(
            &mut self.e,
            self.pd,
            q.qp_type,
            self.srq,
            q.peer,
            q.peer_qpn,
            q.mtu,
            q.rq_psn,
            Psn::new(0),
            q.depth,
            q.rd_atomic,
            q.min_rnr_timer,
            q.qkey,
        )?;
        Ok(self.e.qpn.value())
    }

    fn post_recv(&mut self) -> Result<(), String> {
        let wr = RecvWr {
            wr_id: self.posted,
            sg_list: vec![Sge { addr: LOCAL_BASE, length: u32::MAX >> 1, lkey: self.recv_lkey }],
        };
        self.posted += 1;
        match self.srq {
            Some(s) => self.e.dev.post_srq_recv(s, wr),
            None => self.e.dev.post_recv(self.e.qpn, wr),
        }
        .map_err(|err| format!("post_recv: {err}"))
    }

    fn queued_recvs(&mut self) -> usize {
        match self.srq {
            Some(s) => self.e.dev.queued_srq_recvs_mut(s).map_or(0, |q| q.len()),
            None => self.e.dev.queued_recvs_mut(self.e.qpn).map_or(0, |q| q.len()),
        }
    }

    fn advance(&mut self, t: Instant) {
        let t = t.max(self.e.now);
        self.e.run_until(t);
    }

    fn feed(&mut self, src: IpAddr, sport: u16, bytes: &[u8]) {
        self.e.feed(src, sport, bytes);
    }

    fn finish(&mut self, t: Instant) -> Vec<Sent> {
        self.advance(t);
        std::mem::take(&mut self.e.sent)
    }

    fn known(&self, addr: u64, len: usize) -> bool {
        self.e.dev.memory_ref().known(addr, len)
    }

    fn xrc_srq(&mut self, depth: u32) -> Result<u32, String> {
        let xrcd = self.domain()?;
        let cq = self.e.cq;
        self.e
            .dev
            .create_xrc_srq(xrcd, self.pd, cq, SrqAttr { max_wr: depth, max_sge: 1, srq_limit: 0 })
            .map_err(|err| format!("create XRC SRQ: {err}"))
    }

    fn post_srq_recv(&mut self, srqn: u32) -> Result<(), String> {
        let wr = RecvWr {
            wr_id: self.posted,
            sg_list: vec![Sge { addr: LOCAL_BASE, length: u32::MAX >> 1, lkey: self.recv_lkey }],
        };
        self.posted += 1;
        self.e.dev.post_srq_recv(srqn, wr).map_err(|err| format!("post_srq_recv: {err}"))
    }

    fn queued_srq_recvs(&mut self, srqn: u32) -> usize {
        self.e.dev.queued_srq_recvs_mut(srqn).map_or(0, |q| q.len())
    }

    fn completions(&self) -> u64 {
        self.e.completions
    }

    fn now(&self) -> Instant {
        self.e.now
    }
}

pub(super) fn make_engine(addr: IpAddr, behaviour: WireProfile, mtu: Mtu) -> Engine {
    let mut cfg = DeviceConfig::new(addr, 1);
    cfg.mtu = mtu;
    cfg.behaviour = behaviour;
    let mut dev = Device::new(cfg, SparseMemory::default());
    let cq = dev.create_cq(32767).expect("a CQ on a new device");
    Engine {
        dev,
        cq,
        qpn: Qpn::new(0),
        now: Instant::ZERO,
        sent: Vec::new(),
        buf: vec![0; 8192],
        completions: 0,
        ack_timeout: 14,
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn bring_up(
    e: &mut Engine,
    pd: PdId,
    qp_type: QpType,
    srq: Option<u32>,
    peer: IpAddr,
    peer_qpn: u32,
    mtu: Mtu,
    rq_psn: Psn,
    sq_psn: Psn,
    depth: u32,
    rd_atomic: u8,
    min_rnr_timer: u8,
    qkey: u32,
) -> Result<(), String> {
    let caps = QpCaps { max_send_wr: 0x4000, max_recv_wr: depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qpn = e
        .dev
        .create_qp(QpInit { qp_type, pd, send_cq: e.cq, recv_cq: e.cq, caps, sq_sig_all: false, srq })
        .map_err(|err| format!("create_qp: {err}"))?;
    bring_to_rts(e, qpn, qp_type, peer, peer_qpn, mtu, rq_psn, sq_psn, rd_atomic, min_rnr_timer, qkey)?;
    e.qpn = qpn;
    Ok(())
}

/// Moves a QP from RESET to RTS with the attributes the kernel's table requires per transition.
#[allow(clippy::too_many_arguments)]
pub(super) fn bring_to_rts(
    e: &mut Engine,
    qpn: Qpn,
    qp_type: QpType,
    peer: IpAddr,
    peer_qpn: u32,
    mtu: Mtu,
    rq_psn: Psn,
    sq_psn: Psn,
    rd_atomic: u8,
    min_rnr_timer: u8,
    qkey: u32,
) -> Result<(), String> {
    let p = ConnectParams {
        mtu,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        qkey,
        timeout: e.ack_timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer,
        max_rd_atomic: rd_atomic,
        max_dest_rd_atomic: rd_atomic,
    };
    let remote = Remote { addr: peer, qpn: Qpn::new(peer_qpn), psn: rq_psn.value() };
    connect::bring_up(&mut e.dev, qpn, qp_type, &p, sq_psn.value(), &remote)
        .map_err(|err| format!("modify_qp to {:?}: {}", err.to, err.error))?;
    Ok(())
}
