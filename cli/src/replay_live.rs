//! `softrdma pcap replay FILE --to DEVICE`: the responder side of each recorded conversation is
//! played by a running device, over the real wire.
//!
//! For each conversation, a [`LiveTarget`] opens the device as a client (the Rust verbs API),
//! registers its own memory for each recorded region, creates the responder QP with the
//! recorded requester's QPN as its destination and this process's address as its peer, and
//! binds a UDP socket on that address and the device's port. The recorded requests are then sent
//! from that socket at their recorded times (gaps longer than [`MAX_GAP`] shortened), rewritten:
//! destination QP, RETH/AtomicETH keys and addresses to the device's, and the ICRC recomputed
//! over the new IP/UDP header (IBTA A17.4.3). Whatever the device sends back is collected and
//! compared as in a virtual-time replay.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration as StdDuration;

use softrdma_device::verbs::{CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, SharedReceiveQueue};
use softrdma_engine::device::{ip_udp_header, QpAttr, QpCaps, SrqAttr, WireProfile};
use softrdma_engine::time::{Duration, Instant};
use softrdma_engine::verbs::{Access, AttrMask, Mtu, QpState, WcOpcode};
use softrdma_engine::wire::{icrc, IbPacket};
use softrdma_engine::wr::RecvWr;
use softrdma_pcap::replay::{QpSetup, Sent, Target};

/// Idle gaps of a trace longer than this are shortened to it (a live replay of a capture with
/// seconds between requests would otherwise take that long; the responder has no timer that a
/// shorter gap changes).
pub(crate) const MAX_GAP: StdDuration = StdDuration::from_millis(100);

/// The largest region a live replay registers (its bytes are allocated in this process).
const MAX_REGION: u64 = 1 << 30;

/// Where the replayer sends from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Local {
    /// This process's address (the device answers to it).
    pub(crate) addr: IpAddr,
    /// The device's UDP port (the replayer binds the same port on its own address).
    pub(crate) port: u16,
}

/// A running device as a replay target.
pub(crate) struct LiveTarget {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: Option<QueuePair>,
    srq: Option<SharedReceiveQueue>,
    regions: Vec<MemoryRegion>,
    recv: Option<MemoryRegion>,
    sock: UdpSocket,
    device: SocketAddr,
    local: Local,
    start: std::time::Instant,
    /// Replay time already skipped by shortening gaps.
    skipped: StdDuration,
    sent: Vec<Sent>,
    posted: u64,
    consumed: u64,
    completions: u64,
    buf: Vec<u8>,
}

impl LiveTarget {
    /// Opens `device` and binds the replayer's socket.
    pub(crate) fn new(device: &str, local: Local) -> Result<LiveTarget, String> {
        let ctx = Context::open(device).map_err(|e| format!("cannot open device {device}: {e}"))?;
        let dev_addr = ctx.info().addr;
        if dev_addr == local.addr {
            return Err(format!("--from {} is the device's own address: give the replayer another one", local.addr));
        }
        let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
        let cq = ctx.create_cq(4096, None).map_err(|e| format!("create_cq: {e}"))?;
        let sock = UdpSocket::bind((local.addr, local.port))
            .map_err(|e| format!("cannot bind the replayer's socket {}:{}: {e}", local.addr, local.port))?;
        sock.set_read_timeout(Some(StdDuration::from_millis(2))).map_err(|e| e.to_string())?;
        Ok(LiveTarget {
            ctx,
            pd,
            cq,
            qp: None,
            srq: None,
            regions: Vec::new(),
            recv: None,
            sock,
            device: SocketAddr::new(dev_addr, local.port),
            local,
            start: std::time::Instant::now(),
            skipped: StdDuration::ZERO,
            sent: Vec::new(),
            posted: 0,
            consumed: 0,
            completions: 0,
            buf: vec![0; 65536],
        })
    }

    fn elapsed(&self) -> Instant {
        let ns = self.start.elapsed().saturating_add(self.skipped).as_nanos();
        Instant::ZERO + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Takes what arrived on the socket (until `wait` passes without a datagram) and polls the CQ.
    fn collect(&mut self, wait: StdDuration) {
        let until = std::time::Instant::now() + wait;
        loop {
            match self.sock.recv_from(&mut self.buf) {
                Ok((n, from)) if from.ip() == self.device.ip() => {
                    let at = self.elapsed();
                    self.sent.push(Sent { bytes: self.buf[..n].to_vec(), at });
                    continue;
                }
                Ok(_) => continue,
                Err(_) => {}
            }
            if std::time::Instant::now() >= until {
                break;
            }
        }
        while let Ok(wcs) = self.cq.poll(64) {
            if wcs.is_empty() {
                break;
            }
            self.completions += wcs.len() as u64;
            self.consumed +=
                wcs.iter().filter(|w| matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)).count() as u64;
        }
    }
}

impl Target for LiveTarget {
    fn reg_region(&mut self, lo: u64, len: u64) -> Result<(u64, u32), String> {
        if len > MAX_REGION {
            return Err(format!("{len} bytes at {lo:#x}: larger than a live replay registers ({MAX_REGION})"));
        }
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let mr = self.pd.alloc_mr(len as usize, access).map_err(|e| format!("reg_mr: {e}"))?;
        let out = (mr.addr(), mr.rkey());
        self.regions.push(mr);
        Ok(out)
    }

    fn create_qp(&mut self, q: &QpSetup) -> Result<u32, String> {
        let port_mtu = self.ctx.info().active_mtu;
        if port_mtu.bytes() < q.mtu.bytes() {
            return Err(format!(
                "the device's active MTU {} is smaller than the trace's path MTU {} (start it with --mtu {})",
                port_mtu.bytes(),
                q.mtu.bytes(),
                q.mtu.bytes()
            ));
        }
        let recv_len = q.max_recv_len.max(64) as usize;
        self.recv = Some(self.pd.alloc_mr(recv_len, Access::LOCAL_WRITE).map_err(|e| format!("reg_mr: {e}"))?);
        if let Some(d) = q.srq_depth {
            self.srq = Some(
                self.pd
                    .create_srq(SrqAttr { max_wr: d, max_sge: 1, srq_limit: 0 })
                    .map_err(|e| format!("create_srq: {e}"))?,
            );
        }
        let qp_type = q.qp_type;
        let caps =
            QpCaps { max_send_wr: 16, max_recv_wr: q.depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let mut b = self.pd.qp_builder(qp_type, &self.cq).caps(caps);
        if let Some(srq) = &self.srq {
            b = b.srq(srq);
        }
        let qp = b.build().map_err(|e| format!("create_qp: {e}"))?;
        let attr = QpAttr {
            port_num: 1,
            pkey_index: 0,
            qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            path_mtu: q.mtu,
            // The answers come to the replayer, standing for the recorded requester.
            dest: self.local.addr,
            dest_qp_num: q.peer_qpn,
            rq_psn: q.rq_psn.value(),
            max_dest_rd_atomic: q.rd_atomic,
            min_rnr_timer: q.min_rnr_timer,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: q.rd_atomic,
            qkey: q.qkey,
            ..QpAttr::default()
        };
        for (from, to) in [(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr), (QpState::Rtr, QpState::Rts)]
        {
            let mask =
                AttrMask::STATE | softrdma_engine::modify::required(qp_type, from, to).unwrap_or(AttrMask::STATE);
            qp.modify(&QpAttr { qp_state: to, ..attr }, mask).map_err(|e| format!("modify_qp to {to:?}: {e}"))?;
        }
        let qpn = qp.qpn();
        self.qp = Some(qp);
        self.start = std::time::Instant::now();
        Ok(qpn)
    }

    fn post_recv(&mut self) -> Result<(), String> {
        let Some(mr) = &self.recv else { return Err("no receive buffer".into()) };
        let wr = RecvWr { wr_id: self.posted, sg_list: vec![mr.sge(0..mr.len())] };
        let r = match (&self.srq, &self.qp) {
            (Some(srq), _) => srq.post_recv(vec![wr]),
            (None, Some(qp)) => qp.post_recv(vec![wr]),
            (None, None) => return Err("no QP".into()),
        };
        r.map_err(|e| format!("post_recv: {e}"))?;
        self.posted += 1;
        Ok(())
    }

    fn queued_recvs(&mut self) -> usize {
        self.collect(StdDuration::ZERO);
        (self.posted - self.consumed.min(self.posted)) as usize
    }

    fn advance(&mut self, t: Instant) {
        // Shorten idle gaps: never wait more than MAX_GAP for one step.
        let wait = StdDuration::from_nanos(t.as_nanos().saturating_sub(self.elapsed().as_nanos()));
        if wait > MAX_GAP {
            self.skipped += wait - MAX_GAP;
        }
        loop {
            let now = self.elapsed();
            if now >= t {
                break;
            }
            let left = StdDuration::from_nanos(t.as_nanos() - now.as_nanos());
            self.collect(left.min(StdDuration::from_millis(2)));
        }
        self.collect(StdDuration::ZERO);
    }

    fn feed(&mut self, _src: IpAddr, _sport: u16, bytes: &[u8]) {
        // The ICRC over the header this datagram will really have (the replayer's address and
        // port; IPv4 ID 0, the device solving for it as for any IPv4 sender).
        let mut b = bytes.to_vec();
        if b.len() >= icrc::LEN {
            let (hdr, n) = ip_udp_header(self.local.addr, self.device.ip(), self.local.port, b.len(), 0);
            if let Ok(crc) = icrc::roce_v2_parts(&hdr[..n], &b[..b.len() - icrc::LEN]) {
                IbPacket::new_unchecked(&mut b[..]).set_icrc(crc);
            }
        }
        let _ = self.sock.send_to(&b, self.device);
        self.collect(StdDuration::ZERO);
    }

    fn finish(&mut self, t: Instant) -> Vec<Sent> {
        let t = t.min(self.elapsed() + Duration::from_millis(200));
        self.advance(t);
        self.collect(StdDuration::from_millis(50));
        std::mem::take(&mut self.sent)
    }

    fn known(&self, _addr: u64, _len: usize) -> bool {
        // The device writes this process's memory; the replay does not follow it.
        false
    }

    fn completions(&self) -> u64 {
        self.completions
    }

    fn now(&self) -> Instant {
        self.elapsed()
    }
}

/// The factory `replay_on` calls for each conversation.
pub(crate) fn targets(
    device: String,
    local: Local,
) -> impl FnMut(IpAddr, WireProfile, Mtu) -> Result<Box<dyn Target>, String> {
    move |_recorded_responder, _behaviour, _mtu| Ok(Box::new(LiveTarget::new(&device, local)?) as Box<dyn Target>)
}
