//! The responder (rxe_resp.c): checks each incoming request's PSN, opcode sequence, length,
//! resources and keys, executes it (placing SEND and WRITE data, answering READs and atomics),
//! and acknowledges.
//!
//! Credits: under the `rxe` profile every ACK carries the "invalid" credit code 0x1F ("no credit
//! information"), as rxe does (IBTA 9.7.7.2.5 lets a responder not track credits; the requester
//! then sends as if it had unlimited credits); under `cx` an ACK carries the receive WQEs the QP
//! has left when it is sent ([`super::profile::CreditPolicy`]). RNR NAKs cover an empty receive
//! queue.

use super::packet::{emit, recv_capacity, scatter};
use super::qp::{InMsg, Qp, RdAtomic, RespOut};
use super::{AsyncEvent, Ctx, Transmit};
use super::{CqId, PdId};
use crate::memory::{AtomicOp, AtomicStart, Memory};
use crate::verbs::{Access, QpState, QpType, WcOpcode, WcStatus};
use crate::wire::aeth::CREDITS_INVALID;
use crate::wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, IbPacket, IbRepr, Msn, NakCode, OpKind, Opcode, OpcodeInfo, Position, Psn,
    Qpn, Syndrome,
};

const ACK: Syndrome = Syndrome::Ack { credits: CREDITS_INVALID };

fn queue_ack(qp: &mut Qp, psn: Psn, syndrome: Syndrome) {
    // ACK coalescing: a newer ACK replaces one still waiting to be sent (IBTA 9.7.5.1.2 lets one
    // ACK acknowledge every earlier request).
    if syndrome.is_ack() {
        if let Some(RespOut::Ack { syndrome: s, .. }) = qp.resp.out.back() {
            if s.is_ack() {
                qp.resp.out.pop_back();
            }
        }
    }
    qp.resp.out.push_back(RespOut::Ack { psn, syndrome, msn: qp.resp.msn });
}

/// A class C (or B) error: NAK, then the QP goes to ERR (IBTA 9.9.3: responder errors).
fn nak_and_fail<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn, code: NakCode, event: fn(Qpn) -> AsyncEvent) {
    *ctx.counters.naks_sent.of(code) += 1;
    queue_ack(qp, psn, Syndrome::Nak(code));
    // The NAK still goes out: keep it across the flush.
    let out = std::mem::take(&mut qp.resp.out);
    qp.fail(ctx, event);
    qp.resp.out = out;
}

/// Validates a remote access: the region exists with this rkey, belongs to the QP's PD, allows
/// `access` and covers the range, and the QP itself allows `access` (IBTA 10.6.3, memory access keys; rxe's check_rkey).
fn remote_ok<M: Memory>(
    qp: &Qp,
    ctx: &Ctx<'_, M>,
    pd: Option<PdId>,
    rkey: u32,
    va: u64,
    len: u64,
    access: Access,
) -> Option<u32> {
    if !qp.attr.qp_access_flags.contains(access) {
        return None;
    }
    // A region or a bound window (a type 2 window only through the QP it is bound to).
    let r = ctx.region_by_rkey(rkey)?;
    if Some(r.pd) != pd || !r.access.contains(access) || !r.contains(va, len) || r.qpn.is_some_and(|q| q != qp.qpn) {
        return None;
    }
    Some(r.owner)
}

/// Where a request lands: the PD that governs access, the CQ that takes its receive completion,
/// the SRQ its receive WQE comes from.
#[derive(Debug, Clone, Copy)]
struct Landing {
    pd: Option<PdId>,
    cq: Option<CqId>,
    srq: Option<u32>,
}

/// After a request executed: the common acknowledgement follows (the expected PSN moves on, an
/// ACK if the packet asked for one), or the stage answered (or refused) it itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Acknowledge,
    Done,
}

/// NAKs `psn` with `code` and moves the QP to ERR: the stage refuses the request.
fn refuse<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn, code: NakCode, event: fn(Qpn) -> AsyncEvent) -> Flow {
    nak_and_fail(qp, ctx, psn, code, event);
    Flow::Done
}

/// Handles one request packet addressed to this QP, in the responder's stages (IBTA 9.7.5.1,
/// as rxe's responder runs them): the PSN check, where the request lands, the opcode sequence,
/// the length, the execution (keys, bounds, resources and the memory access of each operation),
/// the acknowledgement.
pub(crate) fn handle_request<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>) {
    let psn = pkt.bth().psn();
    let Some(info) = pkt.opcode().info() else { return };
    if !check_psn(qp, ctx, pkt, psn, info.kind) {
        return;
    }
    let Some(to) = landing(qp, ctx, pkt, psn) else { return };
    if !check_op_sequence(qp, ctx, info, psn) || !check_length(qp, ctx, pkt, info, psn) {
        return;
    }
    let flow = match info.kind {
        OpKind::Send => execute_send(qp, ctx, pkt, info, psn, &to),
        OpKind::Write => execute_write(qp, ctx, pkt, info, psn, &to),
        OpKind::ReadRequest => execute_read(qp, ctx, pkt, psn, to.pd),
        OpKind::CompareSwap | OpKind::FetchAdd => execute_atomic(qp, ctx, pkt, info, psn, to.pd),
        OpKind::AtomicWrite => execute_atomic_write(qp, ctx, pkt, psn, to.pd),
        _ => Flow::Done,
    };
    if flow == Flow::Acknowledge {
        acknowledge(qp, pkt, psn);
    }
}

/// The PSN check (IBTA 9.7.5.1.2, C9-93): the expected PSN goes on; ahead of it, one PSN sequence
/// NAK per gap (rxe: resp.sent_psn_nak); behind it, a duplicate (9.7.5.1.4). Whether to go on.
fn check_psn<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>, psn: Psn, kind: OpKind) -> bool {
    let d = psn.distance(qp.resp.epsn);
    if d > 0 {
        ctx.counters.out_of_seq_request += 1;
        if !qp.resp.seq_nak_sent {
            qp.resp.seq_nak_sent = true;
            ctx.counters.naks_sent.psn_sequence += 1;
            let epsn = qp.resp.epsn;
            queue_ack(qp, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
        }
        return false;
    }
    if d < 0 {
        duplicate(qp, ctx, pkt, psn, kind);
        return false;
    }
    qp.resp.seq_nak_sent = false;
    true
}

/// Where the request lands: an XRC target QP names an SRQ of its domain in XRCETH, whose PD
/// governs access and whose CQ takes the completion (Annex A14); other QPs use their own. An SRQ
/// of another domain, or none, is an invalid request, never a delivery.
fn landing<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>, psn: Psn) -> Option<Landing> {
    if qp.qp_type != QpType::XrcTgt {
        return Some(Landing { pd: qp.pd, cq: qp.recv_cq, srq: qp.srq });
    }
    let n = pkt.xrceth().map_or(0, |x| x.xrc_srqn());
    match ctx.srqs.get(&n) {
        Some(s) if s.xrc.is_some_and(|(x, _)| Some(x) == qp.xrcd) => {
            Some(Landing { pd: Some(s.pd), cq: s.xrc.map(|(_, c)| c), srq: Some(n) })
        }
        // (The XRC annex's exact statement could not be checked here; invalid request is what
        // hardware reports as IBV_WC_REM_INV_REQ_ERR.)
        _ => {
            ctx.counters.xrc_srq_err += 1;
            nak_and_fail(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
            None
        }
    }
}

/// The opcode sequence (IBTA 9.7.5.1.3, C9-96): a MIDDLE/LAST continues a FIRST of the same kind;
/// a FIRST or ONLY may not interrupt one (invalid request, as rxe's check_op_seq).
fn check_op_sequence<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, info: &OpcodeInfo, psn: Psn) -> bool {
    let continuing = !info.position.starts();
    match (&qp.resp.in_msg, continuing) {
        (Some(m), true) if m.kind == info.kind => true,
        (None, false) => true,
        _ => {
            nak_and_fail(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
            false
        }
    }
}

/// The length (IBTA 9.7.5.1.3, C9-98): FIRST and MIDDLE carry exactly one MTU; LAST and ONLY at
/// most one, and a LAST is not empty (rxe's check_length).
fn check_length<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &IbPacket<&[u8]>,
    info: &OpcodeInfo,
    psn: Psn,
) -> bool {
    let mtu = qp.mtu() as usize;
    let plen = pkt.payload().len();
    let exact = matches!(info.position, Position::First | Position::Middle);
    let empty_last = info.position == Position::Last && plen == 0;
    if (exact && plen != mtu) || plen > mtu || empty_last {
        nak_and_fail(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
        return false;
    }
    true
}

/// The acknowledgement of a SEND or WRITE packet (IBTA 9.7.5.1.6): the expected PSN moves on; an
/// ACK when the packet asks for one (the ACK then covers the packets before it).
fn acknowledge(qp: &mut Qp, pkt: &IbPacket<&[u8]>, psn: Psn) {
    qp.resp.epsn = psn + 1;
    if pkt.bth().ack_req() {
        queue_ack(qp, psn, ACK);
    }
}

/// A SEND packet: the first takes a receive WQE (none: RNR NAK, IBTA 9.7.5.2.8), its data is
/// scattered into it (too long: LOC_LEN_ERR and an invalid request), the last completes it.
fn execute_send<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &IbPacket<&[u8]>,
    info: &OpcodeInfo,
    psn: Psn,
    to: &Landing,
) -> Flow {
    let Landing { pd, cq, srq } = *to;
    if info.position.starts() {
        let Some(wr) = qp.take_recv(ctx, srq) else {
            // No receive WQE: RNR NAK with the QP's min_rnr_timer (IBTA 9.7.5.2.8).
            ctx.counters.send_rnr_err += 1;
            let t = qp.attr.min_rnr_timer;
            queue_ack(qp, psn, Syndrome::RnrNak { timer: t });
            return Flow::Done;
        };
        qp.resp.in_msg = Some(InMsg { kind: OpKind::Send, recv: Some(wr), offset: 0, write: None, cq });
    }
    let Some(mut m) = qp.resp.in_msg.take() else { return Flow::Done };
    let data = pkt.payload();
    let wr = m.recv.take().expect("a SEND in progress holds its receive WQE");
    if u64::from(m.offset) + data.len() as u64 > recv_capacity(&wr) {
        // The message does not fit: LOC_LEN_ERR locally, invalid request to the sender.
        qp.complete_recv(ctx, m.cq, wr.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0, None, None);
        return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
    }
    if !scatter(pd, ctx, &wr, m.offset, data) {
        qp.complete_recv(ctx, m.cq, wr.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0, None, None);
        return refuse(qp, ctx, psn, NakCode::RemoteOperationalError, AsyncEvent::QpFatal);
    }
    m.offset += data.len() as u32;
    if info.position.ends() {
        let inv = pkt.ieth().map(|i| i.rkey());
        // SEND with invalidate: the named type 2 window of this PD is invalidated
        // (IBTA 10.6.7.2.4); an R_Key naming none is an invalid request (as rxe).
        if let Some(r) = inv {
            if !ctx.invalidate(pd, r) {
                qp.rq.push_front(wr);
                return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
            }
        }
        qp.resp.msn = qp.resp.msn.wrapping_add(1);
        ctx.counters.rdma_recvs += 1;
        qp.complete_message(ctx, pkt, m.cq, wr.wr_id, WcOpcode::Recv, m.offset, inv);
    } else {
        m.recv = Some(wr);
        qp.resp.in_msg = Some(m);
    }
    Flow::Acknowledge
}

/// An RDMA WRITE packet: the first checks the RETH's key and range (a zero-length WRITE checks
/// none, IBTA 9.4.4.1), each places its data; a WRITE with immediate consumes a receive WQE.
fn execute_write<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &IbPacket<&[u8]>,
    info: &OpcodeInfo,
    psn: Psn,
    to: &Landing,
) -> Flow {
    let Landing { pd, cq, srq } = *to;
    let mut m = if info.position.starts() {
        let Some(reth) = pkt.reth() else { return Flow::Done };
        let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
        // A zero-length WRITE checks no key (IBTA 9.4.4.1: R_Key is not validated when the
        // DMA length is zero).
        if len > 0 && remote_ok(qp, ctx, pd, rkey, va, u64::from(len), Access::REMOTE_WRITE).is_none() {
            return refuse(qp, ctx, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessErr);
        }
        InMsg { kind: OpKind::Write, recv: None, offset: 0, write: Some((va, rkey, len)), cq }
    } else {
        match qp.resp.in_msg.take() {
            Some(m) => m,
            None => return Flow::Done,
        }
    };
    let (va, rkey, len) = m.write.unwrap_or_default();
    let data = pkt.payload();
    let end = u64::from(m.offset) + data.len() as u64;
    if end > u64::from(len) || (info.position.ends() && end != u64::from(len)) {
        // More or less data than the RETH announced.
        return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
    }
    // A WRITE with immediate needs a receive WQE for its completion.
    let needs_recv = pkt.immdt().is_some();
    let recv_empty = match srq {
        Some(n) => ctx.srqs.get(&n).is_none_or(|s| s.queue.is_empty()),
        None => qp.rq.is_empty(),
    };
    if needs_recv && recv_empty {
        ctx.counters.send_rnr_err += 1;
        let t = qp.attr.min_rnr_timer;
        queue_ack(qp, psn, Syndrome::RnrNak { timer: t });
        qp.resp.in_msg = if info.position.starts() { None } else { Some(m) };
        return Flow::Done;
    }
    if !data.is_empty() {
        let Some(owner) =
            remote_ok(qp, ctx, pd, rkey, va.wrapping_add(u64::from(m.offset)), data.len() as u64, Access::REMOTE_WRITE)
        else {
            return refuse(qp, ctx, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessErr);
        };
        if ctx.mem.write(owner, va.wrapping_add(u64::from(m.offset)), data).is_err() {
            return refuse(qp, ctx, psn, NakCode::RemoteOperationalError, AsyncEvent::QpFatal);
        }
    }
    m.offset += data.len() as u32;
    if info.position.ends() {
        qp.resp.msn = qp.resp.msn.wrapping_add(1);
        if needs_recv {
            if let Some(wr) = qp.take_recv(ctx, srq) {
                qp.complete_message(ctx, pkt, cq, wr.wr_id, WcOpcode::RecvRdmaWithImm, len, None);
            }
        }
    } else {
        qp.resp.in_msg = Some(m);
    }
    Flow::Acknowledge
}

/// An RDMA READ request: key and range, a responder resource (max_dest_rd_atomic), then the
/// responses queue (poll_transmit sends them).
fn execute_read<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &IbPacket<&[u8]>,
    psn: Psn,
    pd: Option<PdId>,
) -> Flow {
    let Some(reth) = pkt.reth() else { return Flow::Done };
    let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
    if len > 0 && remote_ok(qp, ctx, pd, rkey, va, u64::from(len), Access::REMOTE_READ).is_none() {
        return refuse(qp, ctx, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessErr);
    }
    if !rd_atomic_slot(qp) {
        return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
    }
    let npkts = super::packets_for(len, qp.mtu());
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    qp.resp.rd_atomic.push_back(RdAtomic {
        first_psn: psn,
        last_psn: psn + (npkts - 1),
        atomic_orig: None,
        atomic_pending: false,
        atomic_write: false,
    });
    let msn = qp.resp.msn;
    qp.resp.out.push_back(RespOut::Read {
        psn,
        va,
        rkey,
        remaining: len,
        first: true,
        total: len,
        msn,
        pd,
        fresh: true,
    });
    qp.resp.epsn = psn + npkts;
    Flow::Done
}

/// A CmpSwap or FetchAdd (IBTA 9.4.5): alignment, key, a responder resource, then the atomic
/// (executed once: a duplicate replays its result).
fn execute_atomic<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &IbPacket<&[u8]>,
    info: &OpcodeInfo,
    psn: Psn,
    pd: Option<PdId>,
) -> Flow {
    let Some(a) = pkt.atomiceth() else { return Flow::Done };
    let va = a.va();
    // Atomics need 8-byte alignment (IBTA 9.4.5); otherwise invalid request.
    if va % 8 != 0 {
        return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
    }
    let Some(owner) = remote_ok(qp, ctx, pd, a.rkey(), va, 8, Access::REMOTE_ATOMIC) else {
        return refuse(qp, ctx, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessErr);
    };
    if !rd_atomic_slot(qp) {
        return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
    }
    let op = if info.kind == OpKind::CompareSwap {
        AtomicOp::CompareSwap { compare: a.compare(), swap: a.swap_add() }
    } else {
        AtomicOp::FetchAdd { add: a.swap_add() }
    };
    // Executed now, or (a memory that answers later) in order with the memory's other
    // accesses, its acknowledge waiting for the original value (poll_transmit).
    let Ok(orig) = ctx.mem.start_atomic(owner, va, op) else {
        return refuse(qp, ctx, psn, NakCode::RemoteOperationalError, AsyncEvent::QpFatal);
    };
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    let done = match orig {
        AtomicStart::Done(v) => Some(v),
        AtomicStart::Later(_) => None,
    };
    qp.resp.rd_atomic.push_back(RdAtomic {
        first_psn: psn,
        last_psn: psn,
        atomic_orig: done,
        atomic_pending: done.is_none(),
        atomic_write: false,
    });
    let msn = qp.resp.msn;
    qp.resp.out.push_back(RespOut::Atomic { psn, orig, msn, fresh: true });
    qp.resp.epsn = psn + 1;
    Flow::Done
}

/// An ATOMIC WRITE.
fn execute_atomic_write<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &IbPacket<&[u8]>,
    psn: Psn,
    pd: Option<PdId>,
) -> Flow {
    // IBTA 1.5 9.4.6 (ATOMIC WRITE), as rxe (rxe_resp.c) applies it: the QP and the
    // region must allow REMOTE_WRITE; the RETH names exactly 8 bytes and 8 bytes follow;
    // the address is 8-byte aligned (else an invalid request, as a misaligned atomic);
    // it takes a responder resource (max_dest_rd_atomic) so that a duplicate is
    // acknowledged without writing again; the answer is a plain ACK.
    let Some(reth) = pkt.reth() else { return Flow::Done };
    let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
    let data = pkt.payload();
    if len != 8 || data.len() != 8 || va % 8 != 0 {
        return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
    }
    let Some(owner) = remote_ok(qp, ctx, pd, rkey, va, 8, Access::REMOTE_WRITE) else {
        return refuse(qp, ctx, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessErr);
    };
    if !rd_atomic_slot(qp) {
        return refuse(qp, ctx, psn, NakCode::InvalidRequest, AsyncEvent::QpReqErr);
    }
    if ctx.mem.write(owner, va, data).is_err() {
        return refuse(qp, ctx, psn, NakCode::RemoteOperationalError, AsyncEvent::QpFatal);
    }
    qp.resp.msn = qp.resp.msn.wrapping_add(1);
    qp.resp.rd_atomic.push_back(RdAtomic {
        first_psn: psn,
        last_psn: psn,
        atomic_orig: None,
        atomic_pending: false,
        atomic_write: true,
    });
    qp.resp.epsn = psn + 1;
    queue_ack(qp, psn, ACK);
    Flow::Done
}

/// Makes room for one more outstanding READ/atomic: the oldest cached one is dropped once the
/// requester must have seen it; more than max_dest_rd_atomic at once is an invalid request.
/// A resource is held by a new request from its execution until its answer is sent; answers
/// to duplicates hold none (IBTA 9.7.5.1.4: a duplicate reuses what its first execution
/// saved). So a requester that goes back N and resends a whole window of READs/atomics, then
/// goes on with new ones, stays within its max_rd_atomic however many answers are queued.
fn rd_atomic_slot(qp: &mut Qp) -> bool {
    let max = usize::from(qp.attr.max_dest_rd_atomic);
    let active = qp
        .resp
        .out
        .iter()
        .filter(|o| matches!(o, RespOut::Read { fresh: true, .. } | RespOut::Atomic { fresh: true, .. }))
        .count();
    if active >= max {
        return false;
    }
    while qp.resp.rd_atomic.len() >= max.max(1) {
        qp.resp.rd_atomic.pop_front();
    }
    true
}

/// A request with an old PSN (IBTA 9.7.5.1.4, duplicate requests).
fn duplicate<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>, psn: Psn, kind: OpKind) {
    ctx.counters.duplicate_request += 1;
    match kind {
        OpKind::Send | OpKind::Write => {
            // IBTA C9-105 (cited by rxe): re-acknowledge, with the PSN of the most recent
            // request.
            let last = qp.resp.epsn - 1;
            queue_ack(qp, last, ACK);
        }
        OpKind::ReadRequest => {
            // Re-execute the READ from the duplicate's RETH, if it lies in a READ we
            // executed.
            let Some(reth) = pkt.reth() else { return };
            let Some((first, last)) = qp
                .resp
                .rd_atomic
                .iter()
                .find(|r| {
                    r.atomic_orig.is_none()
                        && !r.atomic_pending
                        && !r.atomic_write
                        && psn.distance(r.first_psn) >= 0
                        && r.last_psn.distance(psn) >= 0
                })
                .map(|r| (r.first_psn, r.last_psn))
            else {
                return;
            };
            let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
            let pd = if qp.qp_type == QpType::XrcTgt {
                let n = pkt.xrceth().map_or(0, |x| x.xrc_srqn());
                match ctx.srqs.get(&n) {
                    Some(s) if s.xrc.is_some_and(|(x, _)| Some(x) == qp.xrcd) => Some(s.pd),
                    _ => return,
                }
            } else {
                qp.pd
            };
            if len > 0 && remote_ok(qp, ctx, pd, rkey, va, u64::from(len), Access::REMOTE_READ).is_none() {
                return nak_and_fail(qp, ctx, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessErr);
            }
            // A resent READ supersedes what is still queued of the same READ, and takes its
            // place; responses queued for other READs stay, in PSN order (a requester that goes
            // back N resends several READs at once, and each needs its answer).
            let same = |o: &RespOut| matches!(o, RespOut::Read { psn: p, .. } if p.distance(first) >= 0 && last.distance(*p) >= 0);
            // It holds the responder resource of the answer it replaces, if that was still
            // unsent; otherwise none (its resource was freed when the answer went out).
            let at = qp.resp.out.iter().position(same);
            let fresh = qp.resp.out.iter().any(|o| same(o) && matches!(o, RespOut::Read { fresh: true, .. }));
            qp.resp.out.retain(|o| !same(o));
            let msn = qp.resp.msn;
            let r = RespOut::Read { psn, va, rkey, remaining: len, first: true, total: len, msn, pd, fresh };
            match at {
                Some(i) => qp.resp.out.insert(i.min(qp.resp.out.len()), r),
                None => qp.resp.out.push_back(r),
            }
        }
        OpKind::AtomicWrite => {
            // Executed once already (IBTA 9.7.5.1.4: never twice): acknowledge it again, as
            // rxe replays its resource with an ACK.
            let last = qp.resp.epsn - 1;
            queue_ack(qp, last, ACK);
        }
        OpKind::CompareSwap | OpKind::FetchAdd => {
            // Replay the saved result; never execute an atomic twice (IBTA 9.7.5.1.4).
            // (One whose original value is still on its way answers once it comes.)
            if let Some(orig) = qp.resp.rd_atomic.iter().find(|r| r.first_psn == psn).and_then(|r| r.atomic_orig) {
                let msn = qp.resp.msn;
                qp.resp.out.push_back(RespOut::Atomic { psn, orig: AtomicStart::Done(orig), msn, fresh: false });
            }
        }
        _ => {}
    }
}

/// A positive ACK's credit field under the device's credit policy (IBTA 9.7.7.2.5): the receive
/// WQEs the QP has left now, or 0x1F. NAKs keep their codes.
fn with_credits<M: Memory>(qp: &Qp, ctx: &Ctx<'_, M>, syndrome: Syndrome) -> Syndrome {
    match (syndrome, ctx.behaviour.credits) {
        (Syndrome::Ack { .. }, super::profile::CreditPolicy::Count)
            if qp.srq.is_none() && qp.qp_type != QpType::XrcTgt =>
        {
            Syndrome::Ack { credits: super::profile::credit_code(qp.rq.len()) }
        }
        _ => syndrome,
    }
}

fn bth(qp: &Qp, opcode: Opcode, psn: Psn, payload: usize) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: IbRepr::pad_for(payload),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: Qpn::new(qp.attr.dest_qp_num),
        ack_req: false,
        psn,
    }
}

/// Produces the next responder packet (ACK/NAK, READ response, atomic ACK), if any.
pub(crate) fn poll_transmit<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, buf: &mut [u8]) -> Option<Transmit> {
    if qp.state == QpState::Reset {
        qp.resp.out.clear();
        return None;
    }
    if qp.resp.out.is_empty() {
        return None;
    }
    // Nothing is answered before the data it answers for is in place.
    let fences = std::mem::take(&mut qp.resp.fences);
    for f in fences {
        if !ctx.mem.fence_passed(f) {
            qp.resp.fences.push(f);
        }
    }
    if !qp.resp.fences.is_empty() {
        return None;
    }
    let out = qp.resp.out.pop_front()?;
    let dest = qp.attr.dest;
    // An XRC target answers with XRC opcodes (Annex A14), the same operations as RC.
    let xrc = |o: Opcode| if qp.qp_type == QpType::XrcTgt { Opcode(0xa0 | o.0) } else { o };
    match out {
        RespOut::Ack { psn, syndrome, msn } => {
            let mut ib = IbRepr::new(bth(qp, xrc(Opcode::RC_ACKNOWLEDGE), psn, 0));
            ib.aeth = Some(AethRepr { syndrome: with_credits(qp, ctx, syndrome), msn: Msn::new(msn) });
            emit(ctx, qp.qpn, dest, buf, &ib, |_, _| true)
        }
        RespOut::Atomic { psn, orig, msn, fresh } => {
            let orig = match orig {
                AtomicStart::Done(v) => v,
                AtomicStart::Later(ticket) => match ctx.mem.atomic_result(ticket) {
                    // Not yet: the acknowledge (and what queues behind it) waits.
                    None => {
                        qp.resp.out.push_front(RespOut::Atomic { psn, orig, msn, fresh });
                        return None;
                    }
                    Some(Ok(v)) => {
                        if let Some(r) = qp.resp.rd_atomic.iter_mut().find(|r| r.first_psn == psn && r.atomic_pending) {
                            r.atomic_orig = Some(v);
                            r.atomic_pending = false;
                        }
                        v
                    }
                    Some(Err(_)) => {
                        nak_and_fail(qp, ctx, psn, NakCode::RemoteOperationalError, AsyncEvent::QpFatal);
                        return None;
                    }
                },
            };
            let mut ib = IbRepr::new(bth(qp, xrc(Opcode::RC_ATOMIC_ACKNOWLEDGE), psn, 0));
            ib.aeth = Some(AethRepr { syndrome: with_credits(qp, ctx, ACK), msn: Msn::new(msn) });
            ib.atomicacketh = Some(AtomicAckEthRepr { orig_rem_data: orig });
            emit(ctx, qp.qpn, dest, buf, &ib, |_, _| true)
        }
        RespOut::Read { psn, va, rkey, remaining, first, total, msn, pd, fresh } => {
            let mtu = qp.mtu();
            let n = remaining.min(mtu);
            let last = remaining <= mtu;
            let opcode = match (first, last) {
                (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
            };
            let mut ib = IbRepr::new(bth(qp, xrc(opcode), psn, n as usize));
            ib.payload_len = n as usize;
            if first || last {
                let credits = ctx.behaviour.read_response_credits.unwrap_or(CREDITS_INVALID);
                ib.aeth = Some(AethRepr { syndrome: Syndrome::Ack { credits }, msn: Msn::new(msn) });
            }
            let offset = total - remaining;
            let addr = va.wrapping_add(u64::from(offset));
            let owner =
                if n > 0 { remote_ok(qp, ctx, pd, rkey, addr, u64::from(n), Access::REMOTE_READ) } else { Some(0) };
            let blocked = ctx.mem.would_block_count();
            let mut unreadable = false;
            let t = emit(ctx, qp.qpn, dest, buf, &ib, |ctx, out| match owner {
                Some(o) => {
                    // The first packet reads afresh; the rest of the response may come from
                    // what a memory reads ahead for it (never beyond this READ): a READ of
                    // memory its owner changes meanwhile returns indeterminate data anyway, as an
                    // HCA reads it at its own pace, packet by packet.
                    let ok = out.is_empty()
                        || if first {
                            ctx.mem.read(o, addr, out).is_ok()
                        } else {
                            ctx.mem.read_ahead(o, addr, out, u64::from(remaining)).is_ok()
                        };
                    unreadable = !ok;
                    ok
                }
                None => false,
            });
            if t.is_none() && ctx.mem.would_block_count() != blocked {
                // The data is on its way (Memory::would_block_count): this response, and what
                // queues behind it, waits for it.
                qp.resp.out.push_front(RespOut::Read { psn, va, rkey, remaining, first, total, msn, pd, fresh });
                return None;
            }
            if t.is_none() && (owner.is_none() || unreadable) {
                // The region went away between the request and the response, or its memory can
                // no longer be read (its owner unmapped or protected it after registering it):
                // a remote access error NAK for this PSN (IBTA 9.7.5.2.8), as rxe's read_reply
                // answers a failed copy, never a response that is silently left out (the
                // requester would retry into the same hole until RETRY_EXC_ERR).
                nak_and_fail(qp, ctx, psn, NakCode::RemoteAccessError, AsyncEvent::QpAccessErr);
                return None;
            }
            if !last {
                qp.resp.out.push_front(RespOut::Read {
                    pd,
                    psn: psn + 1,
                    va,
                    rkey,
                    remaining: remaining - n,
                    first: false,
                    total,
                    msn,
                    fresh,
                });
            }
            t
        }
    }
}
