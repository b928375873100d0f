//! The requester (rxe_req.c): turns send WQEs into request packets, segmenting by path MTU,
//! assigning PSNs, placing AckReq, honouring max_rd_atomic and fences, and resending from a
//! rewound PSN after a NAK or timeout (go-back-N).

use super::packet::{emit, walk_sges};
use super::qp::{Qp, SendWqe};
use super::{Ctx, Transmit};
use crate::memory::Memory;
use crate::verbs::{Access, QpState, QpType, WcStatus};
use crate::wire::{
    AtomicEthRepr, BthRepr, DethRepr, IbRepr, IethRepr, ImmDtRepr, Opcode, Psn, Qpn, RethRepr, XrcEthRepr,
};
use crate::wr::SendOp;

/// rxe's RXE_MAX_PKT_PER_ACK: ask for an ACK at least every this many packets.
const MAX_PKT_PER_ACK: u32 = 64;

/// The end-to-end credit limit of an RC requester (IBTA 9.7.7.2, end-to-end flow control).
///
/// A responder that tracks its receive queue reports in each ACK's AETH how many receive WQEs it
/// holds (the credit count, encoded as in Table 44) beside its MSN, the number of messages it
/// has completed. The requester may start messages that take a receive WQE (SEND, RDMA WRITE
/// with immediate) up to the SSN `msn + credits` (the limit); past it, it waits for an ACK that
/// moves the limit, except that with nothing unacknowledged it may send one such message anyway:
/// its ACK brings a fresh count, or its RNR NAK says there is still no WQE. The SSN counts every
/// message, as the MSN does, so a WRITE or READ between counts as if it took a WQE: the limit
/// errs on the side of waiting. A responder that sends the "invalid" count 31 (rxe always; a
/// QP on an SRQ, whose WQEs are not its own to promise) sets no limit, nor does one that has
/// not acknowledged anything yet: the requester then sends as rxe's does, and an empty receive
/// queue answers with an RNR NAK. Honouring a ConnectX responder's counts is what keeps its
/// requester from sending into a receive queue it was told is empty (each RNR NAK is a wait of
/// the responder's `min_rnr_timer` and a go-back-N of everything sent behind it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Credits {
    /// The MSN of the acknowledgement that set the limit (24 bits, compared as PSNs are).
    pub(crate) msn: Psn,
    /// The highest SSN that may start.
    pub(crate) limit: Psn,
}

/// Whether the requester may start its next message, which takes a receive WQE at the responder
/// (see [`Credits`]).
fn credit_allows(qp: &Qp) -> bool {
    let Some(c) = qp.comp.credits else { return true };
    let ssn = Psn::new(qp.req.ssn.wrapping_add(1));
    ssn.distance(c.limit) <= 0 || qp.comp.psn == qp.req.next_psn
}

/// Copies `out.len()` bytes of the message starting at `offset` from the WQE's buffers.
fn gather<M: Memory>(ctx: &mut Ctx<'_, M>, w: &SendWqe, offset: u32, out: &mut [u8]) -> bool {
    if let Some(data) = &w.inline {
        let o = offset as usize;
        out.copy_from_slice(&data[o..o + out.len()]);
        return true;
    }
    walk_sges(&w.wr.sg_list, offset, out.len(), |sge, sge_off, at, n| {
        let Some(mr) = ctx.mr_by_lkey(sge.lkey) else { return false };
        let owner = mr.owner;
        let rest = u64::from(sge.length - sge_off);
        ctx.mem.read_ahead(owner, sge.addr.wrapping_add(u64::from(sge_off)), &mut out[at..at + n], rest).is_ok()
    })
}

/// Checks the WQE's local buffers: every SGE in a region of the QP's PD, inside it, writable when
/// the responder's data lands there (READ, atomics). A failure is a local protection error (IBV_WC_LOC_PROT_ERR; rxe's
/// copy_data).
fn check_local<M: Memory>(qp: &Qp, ctx: &Ctx<'_, M>, w: &SendWqe) -> bool {
    if w.inline.is_some() {
        return true;
    }
    let need_write = w.wr.op.is_read_or_atomic();
    w.wr.sg_list.iter().all(|s| {
        ctx.mr_by_lkey(s.lkey).is_some_and(|mr| {
            Some(mr.pd) == qp.pd
                && mr.contains(s.addr, u64::from(s.length))
                && (!need_write || mr.access.contains(Access::LOCAL_WRITE))
        })
    })
}

/// The opcode for packet `pkt` of `npkts` of an operation.
fn opcode_for(op: SendOp, pkt: u32, npkts: u32) -> Opcode {
    let first = pkt == 0;
    let last = pkt + 1 == npkts;
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => match (first, last, op) {
            (true, true, SendOp::Send) => Opcode::RC_SEND_ONLY,
            (true, true, SendOp::SendWithImm { .. }) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
            (true, true, _) => Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
            (true, false, _) => Opcode::RC_SEND_FIRST,
            (false, false, _) => Opcode::RC_SEND_MIDDLE,
            (false, true, SendOp::Send) => Opcode::RC_SEND_LAST,
            (false, true, SendOp::SendWithImm { .. }) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
            (false, true, _) => Opcode::RC_SEND_LAST_WITH_INVALIDATE,
        },
        SendOp::Write { .. } | SendOp::WriteWithImm { .. } => match (first, last, op) {
            (true, true, SendOp::Write { .. }) => Opcode::RC_RDMA_WRITE_ONLY,
            (true, true, _) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            (true, false, _) => Opcode::RC_RDMA_WRITE_FIRST,
            (false, false, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
            (false, true, SendOp::Write { .. }) => Opcode::RC_RDMA_WRITE_LAST,
            (false, true, _) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        },
        SendOp::Read { .. } => Opcode::RC_RDMA_READ_REQUEST,
        SendOp::CompareSwap { .. } => Opcode::RC_COMPARE_SWAP,
        SendOp::FetchAdd { .. } => Opcode::RC_FETCH_ADD,
        SendOp::AtomicWrite { .. } => Opcode::RC_ATOMIC_WRITE,
        // Local operations never reach the wire.
        SendOp::BindMw { .. } | SendOp::LocalInv { .. } => Opcode::RC_SEND_ONLY,
    }
}

/// Whether the WQE at `idx` may start now: max_rd_atomic outstanding READ/atomics (the QP's
/// initiator depth, IBTA 11.2.4.2 / rxe's req check) and fences wait for every earlier READ/atomic to complete.
fn may_start(qp: &Qp, idx: usize) -> bool {
    let w = &qp.sq[idx];
    let earlier = || qp.sq.iter().take(idx).filter(|e| e.started && e.done.is_none() && e.wr.op.uses_rd_atomic());
    if w.wr.fence && earlier().next().is_some() {
        return false;
    }
    if w.wr.op.uses_rd_atomic() && earlier().count() >= usize::from(qp.attr.max_rd_atomic) {
        return false;
    }
    true
}

/// Produces the next request packet, if the requester has one to send now, in rxe_req.c's
/// steps: the QP may send (RTS or SQD, no RNR wait), UD goes its own way (`ud_poll_transmit`),
/// the next WQE, the window ([`check_window`]), a message not begun starts ([`start_wqe`]),
/// then the packet: its place in the message ([`Packet::next`]), AckReq ([`ack_req`]), the
/// headers ([`init_req_packet`]), the payload ([`finish_packet`]), and the requester's state
/// once it left ([`update_state`]).
pub(crate) fn poll_transmit<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, buf: &mut [u8]) -> Option<Transmit> {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) || qp.comp.rnr_until.is_some() {
        return None;
    }
    if qp.qp_type == QpType::Ud {
        return ud_poll_transmit(qp, ctx, buf);
    }
    let idx = qp.req.idx;
    if idx >= qp.sq.len() {
        return None;
    }
    if !check_window(qp, ctx, idx) {
        return None;
    }
    if !qp.sq[idx].started {
        match start_wqe(qp, ctx, idx) {
            Start::Started => {}
            Start::Ran => return poll_transmit(qp, ctx, buf),
            Start::Wait => return None,
        }
    }
    let p = Packet::next(qp, idx);
    let ack = ack_req(qp, ctx, &p);
    let ib = init_req_packet(qp, &p, ack.set);
    let t = finish_packet(qp, ctx, &p, &ib, buf, ack.noack_before)?;
    update_state(qp, ctx, &p, &ack);
    Some(t)
}

/// The window of unacknowledged PSNs ([`Window`](super::window::Window), at most
/// [`MAX_UNACKED_PSNS`](super::MAX_UNACKED_PSNS); rxe's RXE_MAX_UNACKED_PSNS check): the next PSN
/// must lie within it, or the requester waits. UC has none (nothing acknowledges it). Whether the
/// packet may leave.
fn check_window<M: Memory>(qp: &mut Qp, ctx: &Ctx<'_, M>, idx: usize) -> bool {
    let window = qp.qp_type != QpType::Uc;
    if window {
        let next = if qp.sq[idx].started { qp.sq[idx].first_psn + qp.req.pkt } else { qp.req.next_psn };
        if next.distance(qp.comp.psn) >= qp.comp.window.limit() {
            // An ACK that moves comp_psn makes the QP ready again; if none comes, a probe
            // (Window::on_blocked).
            qp.comp.window.on_blocked(ctx.now);
            return false;
        }
    }
    true
}

/// What [`start_wqe`] did with a WQE that had not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Its message started (its PSNs assigned): its first packet goes now.
    Started,
    /// A local operation (bind, invalidate) ran in its turn: the WQE behind it is next.
    Ran,
    /// It may not start now (SQD, a fence, max_rd_atomic, credits), or it failed and the QP went
    /// to ERR: nothing to send.
    Wait,
}

/// Starts the message of the WQE at `idx` (rxe's req_next_wqe, check_init_depth,
/// rxe_do_local_ops and update_wqe_psn): SQD starts none, fences and max_rd_atomic wait
/// ([`may_start`]), end-to-end credits wait ([`credit_allows`]), a local operation runs
/// ([`run_local`]), the local buffers are checked ([`check_local`]); then the message takes its
/// SSN and its PSNs.
fn start_wqe<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, idx: usize) -> Start {
    // SQD: messages already started finish; no new one starts (IBTA 10.3.1.5).
    if qp.state == QpState::Sqd || !may_start(qp, idx) {
        return Start::Wait;
    }
    // Out of end-to-end credits (IBTA 9.7.7.2): an ACK that moves the limit makes the QP
    // ready again, and the ACK of what is outstanding always comes (its last packet asks).
    if qp.sq[idx].wr.op.consumes_recv_wqe() && !credit_allows(qp) {
        return Start::Wait;
    }
    if qp.sq[idx].wr.op.is_local() {
        run_local(qp, ctx, idx);
        return Start::Ran;
    }
    if !check_local(qp, ctx, &qp.sq[idx]) {
        qp.sq[idx].done = Some(WcStatus::LocProtErr);
        qp.fail(ctx, crate::device::AsyncEvent::QpFatal);
        return Start::Wait;
    }
    let next = qp.req.next_psn;
    qp.req.ssn = qp.req.ssn.wrapping_add(1) & Psn::MASK;
    let w = &mut qp.sq[idx];
    w.started = true;
    w.first_psn = next;
    qp.req.next_psn = next + w.npkts;
    qp.req.pkt = 0;
    Start::Started
}

/// The packet the requester sends next: its place in its WQE's message.
#[derive(Debug, Clone, Copy)]
struct Packet {
    /// The WQE's index in the send queue.
    idx: usize,
    /// The packet's index in the message.
    pkt: u32,
    psn: Psn,
    /// The message's last packet (a READ or an atomic is one request packet).
    last: bool,
    /// Where its payload lies in the message (a resent READ: where what it asks for starts).
    offset: u32,
    /// UC: nothing acknowledges it.
    unacked: bool,
    /// A SEND (`rdma_sends` counts its first packet).
    is_send: bool,
}

impl Packet {
    /// Packet `qp.req.pkt` of the started WQE at `idx`.
    fn next(qp: &Qp, idx: usize) -> Packet {
        let mtu = qp.mtu();
        let w = &qp.sq[idx];
        let pkt = qp.req.pkt;
        let psn = w.first_psn + pkt;
        let last = pkt + 1 >= w.npkts || w.wr.op.is_read_or_atomic();
        let unacked = qp.qp_type == QpType::Uc;
        let offset = pkt.saturating_mul(mtu);
        let is_send = matches!(w.wr.op, SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. });
        Packet { idx, pkt, psn, last, offset, unacked, is_send }
    }
}

/// Whether a packet asks for an ACK ([`ack_req`]).
#[derive(Debug, Clone, Copy)]
struct AckReq {
    /// The BTH's AckReq bit.
    set: bool,
    /// The packet is a window probe: beyond the window
    /// ([`Window::on_blocked`](super::window::Window::on_blocked)).
    beyond: bool,
    /// The packets sent since the last AckReq, before this one (restored when it cannot leave).
    noack_before: u32,
}

/// AckReq (rxe's init_req_packet; IBTA 9.7.3: a requester may set it on any packet): on a
/// message's last packet, at least every [`MAX_PKT_PER_ACK`] packets (fewer under a window
/// shrunk by loss), on the last packet the window lets out, and under the `cx` profile on the
/// QP's first packet. UC asks for none.
fn ack_req<M: Memory>(qp: &mut Qp, ctx: &Ctx<'_, M>, p: &Packet) -> AckReq {
    let (psn, last, unacked) = (p.psn, p.last, p.unacked);
    let noack_before = qp.req.noack_pkts;
    qp.req.noack_pkts += 1;
    // Also ask for an ACK with the last packet the window lets out, or the requester would wait
    // for the ACK timer.
    // The cx profile also asks on the first packet a QP sends (the PSN it was given at RTS).
    let first_ever = ctx.behaviour.ack_req_first_packet && psn == Psn::new(qp.attr.sq_psn);
    // Under a window shrunk by loss, ask twice per window, so that ACKs keep it moving (IBTA
    // 9.7.3: a requester may set AckReq on any packet). At the full window this is every 64
    // packets, as before.
    let cwnd = qp.comp.window.cwnd;
    // A window probe (Window::on_blocked) asks for an ACK, as the window's last packet does.
    let beyond = !unacked && psn.distance(qp.comp.psn) >= cwnd as i32;
    let ack_req = !unacked
        && (last
            || first_ever
            || qp.req.noack_pkts >= MAX_PKT_PER_ACK.min((cwnd / 2).max(1))
            || psn.distance(qp.comp.psn) + 1 >= cwnd as i32);
    if ack_req {
        qp.req.noack_pkts = 0;
    }
    AckReq { set: ack_req, beyond, noack_before }
}

/// The packet's headers (rxe's init_req_packet): the opcode of its place in the message under
/// the QP's service, the BTH, XRCETH for XRC, ImmDt or IETH on the last packet, RETH on a
/// WRITE's first packet, a READ and an ATOMIC WRITE, AtomicETH on an atomic.
fn init_req_packet(qp: &Qp, p: &Packet, ack_req: bool) -> IbRepr {
    let mtu = qp.mtu();
    let w = &qp.sq[p.idx];
    let (pkt, psn, last, offset) = (p.pkt, p.psn, p.last, p.offset);
    let mut opcode = opcode_for(w.wr.op, pkt, w.npkts);
    if p.unacked {
        // UC: the same SEND/WRITE packets under the UC opcodes (IBTA table 38).
        opcode = Opcode(0x20 | opcode.0);
    } else if qp.qp_type == QpType::XrcIni {
        // XRC: the RC operations under XRC opcodes, each request naming the target SRQ (A14).
        opcode = Opcode(0xa0 | opcode.0);
    }
    let payload_len = match w.wr.op {
        SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 0,
        _ => super::packet_payload(w.len, mtu, pkt) as usize,
    };
    let mut ib = IbRepr::new(BthRepr {
        opcode,
        solicited: last && w.wr.solicited,
        mig_req: false,
        pad_count: IbRepr::pad_for(payload_len),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: Qpn::new(qp.attr.dest_qp_num),
        ack_req,
        psn,
    });
    ib.payload_len = payload_len;
    if qp.qp_type == QpType::XrcIni {
        ib.xrceth = Some(XrcEthRepr { xrc_srqn: w.wr.remote_srqn & 0x00ff_ffff });
    }
    match w.wr.op {
        SendOp::SendWithImm { imm } | SendOp::WriteWithImm { imm, .. } if last => ib.immdt = Some(ImmDtRepr { imm }),
        SendOp::SendWithInv { rkey } if last => ib.ieth = Some(IethRepr { rkey }),
        _ => {}
    }
    match w.wr.op {
        SendOp::Write { remote_addr, rkey } | SendOp::WriteWithImm { remote_addr, rkey, .. } if pkt == 0 => {
            ib.reth = Some(RethRepr { va: remote_addr, rkey, dma_len: w.len })
        }
        SendOp::Read { remote_addr, rkey } => {
            // A resent READ asks only for what is still missing (IBTA 9.4.4: the requester may
            // reissue a READ from the PSN of the first missing response).
            ib.reth = Some(RethRepr {
                va: remote_addr.wrapping_add(u64::from(offset)),
                rkey,
                dma_len: w.len - offset.min(w.len),
            })
        }
        SendOp::CompareSwap { remote_addr, rkey, compare, swap } => {
            ib.atomiceth = Some(AtomicEthRepr { va: remote_addr, rkey, swap_add: swap, compare })
        }
        SendOp::FetchAdd { remote_addr, rkey, add } => {
            ib.atomiceth = Some(AtomicEthRepr { va: remote_addr, rkey, swap_add: add, compare: 0 })
        }
        SendOp::AtomicWrite { remote_addr, rkey } => ib.reth = Some(RethRepr { va: remote_addr, rkey, dma_len: 8 }),
        _ => {}
    }
    ib
}

/// Writes the packet into `buf` with its payload gathered from the WQE's buffers (rxe's
/// finish_packet). When it cannot leave, the AckReq count goes back to `noack_before` (rxe's
/// rollback_state), and buffers that cannot be read fail the WQE and the QP.
fn finish_packet<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    p: &Packet,
    ib: &IbRepr,
    buf: &mut [u8],
    noack_before: u32,
) -> Option<Transmit> {
    let (idx, offset) = (p.idx, p.offset);
    let w = &qp.sq[idx];
    let blocked = ctx.mem.would_block_count();
    let mut gathered = true;
    let Some(t) = emit(ctx, qp.qpn, qp.attr.dest, buf, ib, |ctx, out| {
        gathered = gather(ctx, w, offset, out);
        gathered
    }) else {
        qp.req.noack_pkts = noack_before;
        if !gathered && ctx.mem.would_block_count() == blocked {
            // The buffers cannot be read (the owner unmapped them, or its memory became
            // unreachable): a local protection error, as rxe's requester reports a failed copy,
            // and the QP goes to the error state (IBTA 10.7.3.1, C10-104).
            qp.sq[idx].done = Some(WcStatus::LocProtErr);
            qp.fail(ctx, crate::device::AsyncEvent::QpFatal);
        }
        // Otherwise the data is on its way (Memory::would_block_count): the same packet later.
        return None;
    };
    Some(t)
}

/// The packet left (rxe's update_wqe_state and update_state): the window hears of it, a resend
/// is counted (a first transmission moves the highest PSN sent), the next packet or WQE is next;
/// UC completes the WQE with its last packet, RC and XRC start the transport timer if it is not
/// running (IBTA 9.7.6.1.3).
fn update_state<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, p: &Packet, ack: &AckReq) {
    let (pkt, psn, last, unacked) = (p.pkt, p.psn, p.last, p.unacked);
    let first_sent = psn.distance(qp.req.sent_high) >= 0;
    if !unacked {
        qp.comp.window.on_sent(psn, ctx.now, ack.beyond, ack.set, first_sent);
    }
    if !first_sent {
        ctx.counters.retransmitted_pkts += 1;
    } else {
        qp.req.sent_high = psn + 1;
        if pkt == 0 && p.is_send {
            ctx.counters.rdma_sends += 1;
        }
    }
    if last {
        qp.req.idx += 1;
        qp.req.pkt = 0;
    } else {
        qp.req.pkt += 1;
    }
    if unacked {
        // UC: nothing acknowledges it; the WQE completes once its last packet is out.
        if last {
            complete_sent(qp, ctx);
        }
        return;
    }
    if qp.comp.retrans_at.is_none() {
        qp.comp.retrans_at = super::ack_timeout(qp.attr.timeout).map(|d| ctx.now + d);
    }
}

/// Rewinds the requester to resend from `psn` (go-back-N, IBTA 9.7.5.2.8 / 9.7.6.1.3).
pub(crate) fn rewind(qp: &mut Qp, psn: Psn) {
    for (i, w) in qp.sq.iter().enumerate() {
        if !w.started || w.done.is_some() {
            continue;
        }
        if psn.distance(w.first_psn) >= 0 && w.last_psn().distance(psn) >= 0 {
            qp.req.idx = i;
            qp.req.pkt = (psn - w.first_psn) as u32;
            qp.req.noack_pkts = 0;
            return;
        }
    }
}

/// Completes the oldest WQE as sent (UC and UD: nothing acknowledges them).
fn complete_sent<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    if let Some(w) = qp.sq.pop_front() {
        if w.wr.signaled || qp.sq_sig_all {
            qp.complete_send(ctx, &w, WcStatus::Success);
        }
        qp.req.idx = qp.req.idx.saturating_sub(1);
        qp.req.pkt = 0;
    }
}

/// UD: one packet per work request, to the address the request names, with a DETH.
fn ud_poll_transmit<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, buf: &mut [u8]) -> Option<Transmit> {
    loop {
        let w = qp.sq.front()?;
        if qp.state == QpState::Sqd {
            return None;
        }
        let Some(ud) = w.wr.ud else {
            complete_sent(qp, ctx);
            continue;
        };
        if w.len as usize > ctx.port_mtu.bytes() {
            // Longer than the port MTU: no packet and no error (IBTA C10-93.1.1, as rxe).
            ctx.counters.dropped_messages += 1;
            complete_sent(qp, ctx);
            continue;
        }
        if !check_local(qp, ctx, w) {
            qp.sq[0].done = Some(WcStatus::LocProtErr);
            qp.fail(ctx, crate::device::AsyncEvent::QpFatal);
            return None;
        }
        let opcode = match w.wr.op {
            SendOp::SendWithImm { .. } => Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
            _ => Opcode::UD_SEND_ONLY,
        };
        let psn = qp.req.next_psn;
        qp.req.next_psn = psn + 1;
        // A Q_Key with the high bit set means "the QP's own Q_Key" (IBTA 10.2.5).
        let qkey = if ud.remote_qkey & 0x8000_0000 != 0 { qp.attr.qkey } else { ud.remote_qkey };
        let len = w.len as usize;
        let mut ib = IbRepr::new(BthRepr {
            opcode,
            solicited: w.wr.solicited,
            mig_req: false,
            pad_count: IbRepr::pad_for(len),
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(ud.remote_qpn),
            ack_req: false,
            psn,
        });
        ib.payload_len = len;
        ib.deth = Some(DethRepr { qkey, src_qp: qp.qpn });
        if let SendOp::SendWithImm { imm } = w.wr.op {
            ib.immdt = Some(ImmDtRepr { imm });
        }
        let blocked = ctx.mem.would_block_count();
        let t = emit(ctx, qp.qpn, ud.dest, buf, &ib, |ctx, out| gather(ctx, w, 0, out));
        if t.is_none() && ctx.mem.would_block_count() != blocked {
            // The data is on its way (Memory::would_block_count): the same datagram later.
            qp.req.next_psn = psn;
            return None;
        }
        ctx.counters.rdma_sends += 1;
        complete_sent(qp, ctx);
        if t.is_some() {
            return t;
        }
    }
}

/// Executes a local work request (memory window bind, local invalidate) in send-queue order; it
/// completes when every earlier request has (completions stay in order).
fn run_local<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, idx: usize) {
    let op = qp.sq[idx].wr.op;
    let ok = match op {
        SendOp::BindMw { mw_rkey, new_rkey, mr_lkey, addr, length, access } => {
            ctx.bind_mw(qp.pd, qp.qpn, mw_rkey, new_rkey, mr_lkey, addr, length, access)
        }
        SendOp::LocalInv { rkey } => ctx.invalidate(qp.pd, rkey),
        _ => true,
    };
    let next = qp.req.next_psn;
    let w = &mut qp.sq[idx];
    w.started = true;
    w.first_psn = next;
    w.npkts = 1;
    qp.req.idx += 1;
    qp.req.pkt = 0;
    if ok {
        w.done = Some(WcStatus::Success);
        qp.retire_local_front(ctx);
    } else {
        // IBTA 10.6.7.2.2 / 10.7.2: a failed bind is MW_BIND_ERR, a failed invalidate a local
        // operation error; either moves the QP to ERR.
        w.done = Some(if matches!(op, SendOp::BindMw { .. }) { WcStatus::MwBindErr } else { WcStatus::LocQpOpErr });
        qp.fail(ctx, crate::device::AsyncEvent::QpFatal);
    }
}
