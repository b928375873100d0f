//! A queue pair: its attributes, its state machine (`modify_qp`), its queues and their completions
//! (the dispatch of packets and timers to the roles is in `dispatch`).

use std::collections::VecDeque;
use std::net::IpAddr;

use super::{ack_timeout, AsyncEvent, CqId, Ctx, Limits, PdId};
use crate::memory::Memory;
use crate::time::Instant;
use crate::verbs::{Access, AttrMask, Mtu, QpState, QpType, VerbsError, WcStatus};
use crate::wire::{IbPacket, OpKind, Psn, Qpn};
use crate::wr::{RecvWr, SendWr, WorkCompletion};

/// Queue capacities requested at creation (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// What `create_qp` takes (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpInit {
    /// Transport service.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Capacities.
    pub caps: QpCaps,
    /// Complete every send WR, signaled or not (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// Take receive WQEs from this SRQ (by SRQ number) instead of an RQ of its own.
    pub srq: Option<u32>,
}

/// QP attributes (`struct ibv_qp_attr`, the fields the engine uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpAttr {
    /// Requested state (with AttrMask::STATE).
    pub qp_state: QpState,
    /// Asserted current state (with AttrMask::CUR_STATE).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN: the first PSN the responder expects.
    pub rq_psn: u32,
    /// Send PSN: the first PSN the requester sends.
    pub sq_psn: u32,
    /// Remote QPN.
    pub dest_qp_num: u32,
    /// What remote peers may do through this QP (REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC).
    pub qp_access_flags: Access,
    /// P_Key index (0 only).
    pub pkey_index: u16,
    /// Port (1 only).
    pub port_num: u8,
    /// Remote address (the address vector's GID, as an IP address).
    pub dest: IpAddr,
    /// Local ACK timeout code (4.096 us x 2^timeout; 0: none).
    pub timeout: u8,
    /// Transport retries (0-7).
    pub retry_cnt: u8,
    /// RNR retries (0-7; 7: infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code the responder sends.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests as requester.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests as responder.
    pub max_dest_rd_atomic: u8,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: Access::EMPTY,
            pkey_index: 0,
            port_num: 1,
            dest: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            min_rnr_timer: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
        }
    }
}

/// A send WQE and the requester/completer state of its progress.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub(crate) wr: SendWr,
    /// Inline data copied at post time.
    pub(crate) inline: Option<Vec<u8>>,
    /// Message length.
    pub(crate) len: u32,
    /// PSN of its first packet (valid once started).
    pub(crate) first_psn: Psn,
    /// Packets it takes (READ: response packets).
    pub(crate) npkts: u32,
    /// Whether the requester has assigned PSNs to it.
    pub(crate) started: bool,
    /// Completed (the status), waiting for earlier WQEs to retire.
    pub(crate) done: Option<WcStatus>,
}

impl SendWqe {
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn + (self.npkts - 1)
    }
}

/// A responder output waiting to be sent.
#[derive(Debug, Clone)]
pub(crate) enum RespOut {
    /// ACK or NAK for `psn`.
    Ack { psn: Psn, syndrome: crate::wire::Syndrome, msn: u32 },
    /// An RDMA READ response being generated packet by packet. `fresh`: the answer to a new
    /// request, holding a responder resource until it is sent (a duplicate's answer holds none).
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        remaining: u32,
        first: bool,
        total: u32,
        msn: u32,
        pd: Option<PdId>,
        fresh: bool,
    },
    /// An atomic acknowledge: its original value, or the ticket it comes under (a memory that
    /// answers later: the acknowledge waits for it). `fresh` as for `Read`.
    Atomic { psn: Psn, orig: crate::memory::AtomicStart, msn: u32, fresh: bool },
}

/// A cached READ/atomic request, for duplicates (IBTA 9.7.5.1.6, max_dest_rd_atomic entries).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RdAtomic {
    pub(crate) first_psn: Psn,
    pub(crate) last_psn: Psn,
    pub(crate) atomic_orig: Option<u64>,
    /// A CmpSwap/FetchAdd whose original value is still on its way (`atomic_orig` is set when
    /// it comes; until then a duplicate gets no second answer: the first is coming).
    pub(crate) atomic_pending: bool,
    /// An ATOMIC WRITE (executed once; a duplicate is acknowledged, not executed again).
    pub(crate) atomic_write: bool,
}

/// The message the responder is in the middle of.
#[derive(Debug, Clone)]
pub(crate) struct InMsg {
    pub(crate) kind: OpKind,
    pub(crate) recv: Option<RecvWr>,
    /// Bytes received so far.
    pub(crate) offset: u32,
    /// RDMA WRITE target: va, rkey, dma length.
    pub(crate) write: Option<(u64, u32, u32)>,
    /// The CQ the message's receive completion goes to.
    pub(crate) cq: Option<CqId>,
}

pub(crate) struct Qp {
    pub(crate) qpn: Qpn,
    pub(crate) qp_type: QpType,
    pub(crate) state: QpState,
    pub(crate) pd: Option<PdId>,
    pub(crate) send_cq: Option<CqId>,
    pub(crate) recv_cq: Option<CqId>,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    /// The SRQ (by number) receive WQEs come from, if any.
    pub(crate) srq: Option<u32>,
    /// XRC target QPs: their domain.
    pub(crate) xrcd: Option<super::XrcdId>,
    /// XRC target QPs: the open handles and their owners (`ibv_open_qp`).
    pub(crate) handles: Vec<(u32, crate::memory::Owner)>,
    /// XRC target QPs made with their own lifetime rule (OFED's XRC verbs), which then holds
    /// whatever the device's policy is; `None` follows the device.
    pub(crate) tgt_lifetime: Option<super::XrcPolicy>,
    /// UD: IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, its own multicast sends are not delivered to it.
    pub(crate) block_self_mcast_lb: bool,
    pub(crate) attr: QpAttr,
    /// The owner of the QP's PD (whose memory inline data comes from).
    pub(crate) owner: crate::memory::Owner,
    /// The send queue: the requester sends from it, the completer retires from its front.
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWr>,
    /// The requester's state (`req`).
    pub(crate) req: ReqState,
    /// The completer's state (`comp`): acknowledgements, timers and retries.
    pub(crate) comp: CompState,
    /// The responder's state (`resp`, and `unreliable` for UC).
    pub(crate) resp: RespState,
}

/// The requester's state (rxe's `qp->req`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReqState {
    /// Index into `sq` of the WQE the requester sends next.
    pub(crate) idx: usize,
    /// Packet index within that WQE.
    pub(crate) pkt: u32,
    /// PSN of the next new packet.
    pub(crate) next_psn: Psn,
    /// Packets sent since the last AckReq.
    pub(crate) noack_pkts: u32,
    /// One past the highest PSN sent so far (what lies below it and is sent again is a
    /// retransmission).
    pub(crate) sent_high: Psn,
    /// Whether the SQ_DRAINED event was raised for the current SQD period.
    pub(crate) drained_reported: bool,
    /// The send sequence number (SSN) of the last message started on the wire: the first is 1
    /// (IBTA 9.7.7.2: the requester's count that the responder's MSN follows), 24 bits.
    pub(crate) ssn: u32,
}

/// The completer's state (rxe's `qp->comp`).
#[derive(Debug, Clone, Default)]
pub(crate) struct CompState {
    /// Oldest PSN not yet acknowledged.
    pub(crate) psn: Psn,
    /// Retransmission timer deadline.
    pub(crate) retrans_at: Option<Instant>,
    /// The requester waits for an RNR NAK's timer until then.
    pub(crate) rnr_until: Option<Instant>,
    /// Transport retries left (retry_cnt, reloaded on progress).
    pub(crate) retry_left: u8,
    /// RNR retries left (rnr_retry; 7 is "forever").
    pub(crate) rnr_left: u8,
    /// A resend was started because of a gap or implicit NAK; further gaps are ignored until
    /// progress (one retry per loss, as rxe's comp.started_retry).
    pub(crate) started_retry: bool,
    /// The PSN that resend started from.
    pub(crate) retry_psn: Option<Psn>,
    /// How many PSNs may be unacknowledged (shrinks on loss, grows on ACKs).
    pub(crate) window: super::window::Window,
    /// The end-to-end credit limit the responder's last ACK set (IBTA 9.7.7.2), or `None`
    /// while it sent none (the "invalid" count, as rxe always does) or sent nothing yet.
    pub(crate) credits: Option<super::req::Credits>,
}

/// The responder's state (rxe's `qp->resp`).
#[derive(Debug, Clone, Default)]
pub(crate) struct RespState {
    /// The PSN expected next.
    pub(crate) epsn: Psn,
    /// Messages completed (the MSN of the AETH).
    pub(crate) msn: u32,
    /// The message in progress.
    pub(crate) in_msg: Option<InMsg>,
    /// A PSN sequence NAK was sent for the current gap (one per gap, as rxe's resp.sent_psn_nak).
    pub(crate) seq_nak_sent: bool,
    /// What the responder sends next: ACKs and NAKs, READ responses, atomic acknowledges.
    pub(crate) out: VecDeque<RespOut>,
    /// The READ and atomic requests kept for duplicates (max_dest_rd_atomic).
    pub(crate) rd_atomic: VecDeque<RdAtomic>,
    /// Writes of requests the responder handled that are not known to be in place yet
    /// ([`crate::memory::Memory::write_fence`] tokens, one per memory owner): its answers wait.
    pub(crate) fences: Vec<u64>,
    /// UC: the message being dropped after a gap.
    pub(crate) drop_msg: bool,
    /// COMM_EST was raised (the first packet arrived in RTR).
    pub(crate) comm_est_sent: bool,
}

impl Qp {
    pub(crate) fn new(qpn: Qpn, init: QpInit, owner: crate::memory::Owner) -> Qp {
        Qp {
            owner,
            qpn,
            qp_type: init.qp_type,
            state: QpState::Reset,
            pd: Some(init.pd),
            send_cq: Some(init.send_cq),
            recv_cq: Some(init.recv_cq),
            caps: init.caps,
            sq_sig_all: init.sq_sig_all,
            srq: init.srq,
            xrcd: None,
            handles: Vec::new(),
            tgt_lifetime: None,
            block_self_mcast_lb: false,
            attr: QpAttr::default(),
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: ReqState::default(),
            comp: CompState::default(),
            resp: RespState::default(),
        }
    }

    pub(crate) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes() as u32
    }

    /// The next receive WQE: from the given SRQ, else from the QP's own queue.
    pub(crate) fn take_recv<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>, srq: Option<u32>) -> Option<RecvWr> {
        match srq {
            Some(n) => ctx.srq_pop(n),
            None => self.rq.pop_front(),
        }
    }

    /// Retires the oldest WQE with `status` and its completion (successes only when signaled).
    pub(crate) fn retire<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>, status: WcStatus) {
        let Some(w) = self.sq.pop_front() else { return };
        if status != WcStatus::Success || w.wr.signaled || self.sq_sig_all {
            self.complete_send(ctx, &w, status);
        }
        if self.req.idx > 0 {
            self.req.idx -= 1;
        } else {
            self.req.pkt = 0;
        }
        let next = w.last_psn() + 1;
        if !w.wr.op.is_local() && next.distance(self.comp.psn) > 0 {
            self.comp.psn = next;
        }
    }

    /// Retires local operations (binds, invalidates) that are done and at the front: nothing earlier
    /// is outstanding.
    pub(crate) fn retire_local_front<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>) {
        while let Some(w) = self.sq.front() {
            match (w.wr.op.is_local(), w.done) {
                (true, Some(status)) => self.retire(ctx, status),
                _ => break,
            }
        }
    }

    /// Checks and applies `ibv_modify_qp`.
    pub(crate) fn modify<M: Memory>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        attr: &QpAttr,
        mask: AttrMask,
        limits: &Limits,
        port_mtu: Mtu,
    ) -> Result<(), VerbsError> {
        if mask.contains(AttrMask::CUR_STATE) && attr.cur_qp_state != self.state {
            return Err(VerbsError::Inval);
        }
        let next = if mask.contains(AttrMask::STATE) { attr.qp_state } else { self.state };
        crate::modify::check(self.qp_type, self.state, next, mask)?;
        // Values (ib_modify_qp / rxe_qp_chk_attr).
        // A Q_Key with the high bit set is privileged: user space may not set it (IBTA 10.2.5;
        // the kernel's uverbs returns EPERM).
        if mask.contains(AttrMask::QKEY) && attr.qkey & 0x8000_0000 != 0 {
            return Err(VerbsError::Perm);
        }
        if mask.contains(AttrMask::PORT) && attr.port_num != 1 {
            return Err(VerbsError::Inval);
        }
        if mask.contains(AttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(VerbsError::Inval);
        }
        if mask.contains(AttrMask::PATH_MTU) && attr.path_mtu > port_mtu {
            return Err(VerbsError::Inval);
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > limits.max_qp_init_rd_atom {
            return Err(VerbsError::Inval);
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > limits.max_qp_rd_atom {
            return Err(VerbsError::Inval);
        }
        if (mask.contains(AttrMask::TIMEOUT) && attr.timeout > 31)
            || (mask.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7)
            || (mask.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7)
            || (mask.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31)
        {
            return Err(VerbsError::Inval);
        }
        // Apply.
        let a = &mut self.attr;
        macro_rules! set {
            ($flag:ident, $field:ident) => {
                if mask.contains(AttrMask::$flag) {
                    a.$field = attr.$field;
                }
            };
        }
        set!(PATH_MTU, path_mtu);
        set!(QKEY, qkey);
        set!(DEST_QPN, dest_qp_num);
        set!(ACCESS_FLAGS, qp_access_flags);
        set!(PKEY_INDEX, pkey_index);
        set!(PORT, port_num);
        set!(AV, dest);
        set!(TIMEOUT, timeout);
        set!(RETRY_CNT, retry_cnt);
        set!(RNR_RETRY, rnr_retry);
        set!(MIN_RNR_TIMER, min_rnr_timer);
        set!(MAX_QP_RD_ATOMIC, max_rd_atomic);
        set!(MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        if mask.contains(AttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn & Psn::MASK;
            self.resp.epsn = Psn::new(attr.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn & Psn::MASK;
            self.req.next_psn = Psn::new(attr.sq_psn);
            self.comp.psn = self.req.next_psn;
            self.req.sent_high = self.req.next_psn;
            self.comp.window = super::window::Window::default();
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            self.comp.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            self.comp.rnr_left = attr.rnr_retry;
        }
        if next != self.state {
            self.enter(ctx, next);
        }
        Ok(())
    }

    /// Enters a state: RESET clears everything and purges the QP's completions; ERR flushes.
    pub(crate) fn enter<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>, next: QpState) {
        let prev = self.state;
        self.state = next;
        match next {
            QpState::Reset => {
                let keep =
                    (self.qpn, self.qp_type, self.pd, self.send_cq, self.recv_cq, self.caps, self.sq_sig_all, self.srq);
                let owner = self.owner;
                *self = Qp::new(
                    keep.0,
                    super::QpInit {
                        qp_type: keep.1,
                        pd: keep.2.unwrap_or(PdId(0)),
                        send_cq: keep.3.unwrap_or(CqId(0)),
                        recv_cq: keep.4.unwrap_or(CqId(0)),
                        caps: keep.5,
                        sq_sig_all: keep.6,
                        srq: keep.7,
                    },
                    owner,
                );
                // Resetting a QP removes its completions from its CQs (IBTA 10.3.1; as the kernel's uverbs cleanup).
                for cq in [self.send_cq, self.recv_cq].into_iter().flatten() {
                    if let Some(c) = ctx.cqs.get_mut(&cq) {
                        c.entries.retain(|w| w.qp_num != self.qpn);
                    }
                }
            }
            QpState::Err => {
                self.flush(ctx);
                // IBTA 11.6.3: a QP on an SRQ reports that no more of its WQEs will complete.
                if self.srq.is_some() {
                    self.raise(ctx, AsyncEvent::LastWqeReached(self.qpn));
                }
            }
            QpState::Sqd => self.req.drained_reported = false,
            QpState::Rts if prev == QpState::Rtr => {
                self.comp.retry_left = self.attr.retry_cnt;
                self.comp.rnr_left = self.attr.rnr_retry;
            }
            _ => {}
        }
    }

    /// Raises an affiliated async event: once for the device, and for an XRC target QP once for
    /// every open handle (`ibv_open_qp`: every opener gets the QP's events).
    pub(crate) fn raise<M: Memory>(&self, ctx: &mut Ctx<'_, M>, event: AsyncEvent) {
        ctx.events.push_back(event);
        for &(handle, owner) in &self.handles {
            ctx.handle_events.push_back(super::HandleEvent { handle, owner, event });
        }
    }

    /// Moves the QP to ERR because of an error, raising `event`.
    pub(crate) fn fail<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>, event: fn(Qpn) -> AsyncEvent) {
        if self.state != QpState::Err {
            self.raise(ctx, event(self.qpn));
            self.enter(ctx, QpState::Err);
        }
    }

    /// Completes every outstanding WQE with WR_FLUSH_ERR (IBTA 10.3.1: in ERR, work requests
    /// complete flushed, signaled or not).
    pub(crate) fn flush<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>) {
        while let Some(w) = self.sq.pop_front() {
            let status = w.done.unwrap_or(WcStatus::WrFlushErr);
            if status != WcStatus::Success || w.wr.signaled || self.sq_sig_all {
                self.complete_send(ctx, &w, status);
            }
        }
        // The receive a message in progress had taken (from the RQ or the SRQ) is outstanding
        // too, and older than the ones still queued: it completes flushed first (IBTA 10.3.1;
        // without this it was never completed at all).
        if let Some(m) = self.resp.in_msg.take() {
            if let Some(r) = m.recv {
                let cq = m.cq.or(self.recv_cq);
                self.complete_recv(ctx, cq, r.wr_id, WcStatus::WrFlushErr, crate::verbs::WcOpcode::Recv, 0, None, None);
            }
        }
        while let Some(r) = self.rq.pop_front() {
            self.complete_recv(
                ctx,
                self.recv_cq,
                r.wr_id,
                WcStatus::WrFlushErr,
                crate::verbs::WcOpcode::Recv,
                0,
                None,
                None,
            );
        }
        self.resp.in_msg = None;
        self.req.idx = 0;
        self.req.pkt = 0;
        self.comp.retrans_at = None;
        self.comp.rnr_until = None;
        self.comp.window.on_resend();
    }

    pub(crate) fn complete_send<M: Memory>(&self, ctx: &mut Ctx<'_, M>, w: &SendWqe, status: WcStatus) {
        let Some(cq) = self.send_cq else { return };
        let wc = WorkCompletion {
            wr_id: w.wr.wr_id,
            status,
            opcode: w.wr.op.wc_opcode(),
            byte_len: if status == WcStatus::Success { w.len } else { 0 },
            imm: None,
            invalidated_rkey: None,
            qp_num: self.qpn,
            src_qp: Qpn::new(self.attr.dest_qp_num),
            grh: false,
            src: None,
        };
        ctx.complete(cq, wc);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn complete_recv<M: Memory>(
        &self,
        ctx: &mut Ctx<'_, M>,
        cq: Option<CqId>,
        wr_id: u64,
        status: WcStatus,
        opcode: crate::verbs::WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        inv: Option<u32>,
    ) {
        let Some(cq) = cq else { return };
        let wc = WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm,
            invalidated_rkey: inv,
            qp_num: self.qpn,
            src_qp: Qpn::new(self.attr.dest_qp_num),
            grh: false,
            src: None,
        };
        ctx.complete(cq, wc);
    }

    /// The successful receive completion of the message whose last packet is `pkt`: its
    /// immediate data, and the Solicited Event bit for completion channels (IBTA 11.4.2.2).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn complete_message<M: Memory>(
        &self,
        ctx: &mut Ctx<'_, M>,
        pkt: &IbPacket<&[u8]>,
        cq: Option<CqId>,
        wr_id: u64,
        opcode: crate::verbs::WcOpcode,
        byte_len: u32,
        inv: Option<u32>,
    ) {
        let imm = pkt.immdt().map(|i| i.imm());
        ctx.se = pkt.bth().solicited();
        self.complete_recv(ctx, cq, wr_id, WcStatus::Success, opcode, byte_len, imm, inv);
        ctx.se = false;
    }

    /// `ibv_post_send`.
    pub(crate) fn post_send<M: Memory>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        wr: SendWr,
        given: Option<Vec<u8>>,
        limits: &Limits,
    ) -> Result<(), VerbsError> {
        if self.state == QpState::Reset || self.state == QpState::Init || self.state == QpState::Rtr {
            // libibverbs/rxe: posting to a QP that cannot send is EINVAL.
            return Err(VerbsError::Inval);
        }
        if self.sq.len() >= self.caps.max_send_wr as usize {
            return Err(VerbsError::NoMem);
        }
        // Operations the service has (IBTA 9.8 table: UC has no READ or atomics; UD only SENDs,
        // to an address; an XRC target QP sends nothing).
        let op_ok = match self.qp_type {
            QpType::Rc | QpType::XrcIni => true,
            QpType::Uc => !wr.op.is_read_or_atomic(),
            QpType::Ud => {
                matches!(wr.op, crate::wr::SendOp::Send | crate::wr::SendOp::SendWithImm { .. }) && wr.ud.is_some()
            }
            QpType::XrcTgt => false,
        };
        if !op_ok {
            return Err(VerbsError::Inval);
        }
        if wr.sg_list.len() > self.caps.max_send_sge as usize {
            return Err(VerbsError::Inval);
        }
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if len > u64::from(limits.max_msg_size) {
            return Err(VerbsError::Inval);
        }
        let len = len as u32;
        if wr.op.is_atomic() && (len < 8 || wr.sg_list.is_empty()) {
            return Err(VerbsError::Inval);
        }
        // ATOMIC WRITE carries exactly 8 bytes (IBTA 1.5 9.4.6; rxe takes 8), RC and XRC only.
        if matches!(wr.op, crate::wr::SendOp::AtomicWrite { .. })
            && (len != 8 || !matches!(self.qp_type, QpType::Rc | QpType::XrcIni))
        {
            return Err(VerbsError::Inval);
        }
        let mut inline = None;
        if wr.inline {
            // (ATOMIC WRITE's 8 bytes travel in the WR whatever max_inline_data is: rxe copies
            // them into the WQE.)
            let atomic_write = matches!(wr.op, crate::wr::SendOp::AtomicWrite { .. });
            if (len > self.caps.max_inline_data && !atomic_write) || wr.op.is_read_or_atomic() {
                return Err(VerbsError::Inval);
            }
            // Inline data is copied now, without lkey checks (IBV_SEND_INLINE), unless the
            // caller copied it already (a client that gathers at post).
            let data = match given {
                Some(d) if d.len() == len as usize => d,
                Some(_) => return Err(VerbsError::Inval),
                None => {
                    let mut data = Vec::with_capacity(len as usize);
                    let owner = self.owner;
                    for s in &wr.sg_list {
                        let mut chunk = vec![0u8; s.length as usize];
                        ctx.mem.read(owner, s.addr, &mut chunk).map_err(|_| VerbsError::Inval)?;
                        data.extend_from_slice(&chunk);
                    }
                    data
                }
            };
            inline = Some(data);
        } else if let Some(d) = given {
            // Data a client gathered at post time, after its own lkey checks
            // (docs/architecture.md D3): only for operations that send it, and exactly as long as
            // the SGEs say.
            if d.len() != len as usize
                || wr.op.is_read_or_atomic()
                || matches!(wr.op, crate::wr::SendOp::BindMw { .. } | crate::wr::SendOp::LocalInv { .. })
            {
                return Err(VerbsError::Inval);
            }
            inline = Some(d);
        }
        let npkts = match wr.op {
            crate::wr::SendOp::CompareSwap { .. }
            | crate::wr::SendOp::FetchAdd { .. }
            | crate::wr::SendOp::AtomicWrite { .. } => 1,
            _ => super::packets_for(len, self.mtu()),
        };
        let w = SendWqe { wr, inline, len, first_psn: Psn::new(0), npkts, started: false, done: None };
        if self.state == QpState::Err {
            // Work posted in ERR completes flushed (IBTA 10.3.1: in ERR, WRs complete with WR_FLUSH_ERR; rxe does so).
            self.complete_send(ctx, &w, WcStatus::WrFlushErr);
            return Ok(());
        }
        self.sq.push_back(w);
        Ok(())
    }

    /// `ibv_post_recv`.
    pub(crate) fn post_recv<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>, wr: RecvWr) -> Result<(), VerbsError> {
        // A QP on an SRQ has no receive queue of its own; XRC QPs receive through SRQs only.
        if self.state == QpState::Reset || self.srq.is_some() || matches!(self.qp_type, QpType::XrcIni | QpType::XrcTgt)
        {
            return Err(VerbsError::Inval);
        }
        if self.rq.len() >= self.caps.max_recv_wr as usize {
            return Err(VerbsError::NoMem);
        }
        if wr.sg_list.len() > self.caps.max_recv_sge as usize {
            return Err(VerbsError::Inval);
        }
        if self.state == QpState::Err {
            self.complete_recv(
                ctx,
                self.recv_cq,
                wr.wr_id,
                WcStatus::WrFlushErr,
                crate::verbs::WcOpcode::Recv,
                0,
                None,
                None,
            );
            return Ok(());
        }
        self.rq.push_back(wr);
        Ok(())
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        [self.comp.retrans_at, self.comp.rnr_until, self.comp.window.probe_at].into_iter().flatten().min()
    }

    /// Restarts the retransmission timer if anything is unacknowledged.
    pub(crate) fn rearm<M: Memory>(&mut self, ctx: &Ctx<'_, M>) {
        let outstanding = self.sq.iter().any(|w| w.started && w.done.is_none());
        self.comp.retrans_at = match (outstanding, ack_timeout(self.attr.timeout)) {
            (true, Some(t)) => Some(ctx.now + t),
            _ => None,
        };
    }
}
