//! The unreliable services: UC (connected, no acknowledgements) and UD (datagrams), responder
//! side. Their requester side is in `req` (packets are the same, only nothing is acknowledged).

use std::net::IpAddr;

use super::packet::{recv_capacity as capacity, scatter};
use super::qp::{InMsg, Qp};
use super::{ip_udp_header, CqId, Ctx};
use crate::memory::Memory;
use crate::verbs::{Access, WcOpcode, WcStatus};
use crate::wire::{IbPacket, OpKind, Position, Qpn};
use crate::wr::{RecvWr, WorkCompletion};

/// Length of the GRH slot at the start of every UD receive buffer (IBTA 11.4.1.1).
pub const GRH_SLOT: usize = 40;

fn take_recv<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) -> Option<RecvWr> {
    let srq = qp.srq;
    qp.take_recv(ctx, srq)
}

/// Puts back a receive WQE whose message was abandoned: it was never completed, so the next
/// message uses it.
fn give_back<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, wr: RecvWr) {
    match qp.srq {
        Some(n) => {
            if let Some(s) = ctx.srqs.get_mut(&n) {
                s.queue.push_front(wr);
            }
        }
        None => qp.rq.push_front(wr),
    }
}

/// Abandons the UC message in progress (its receive WQE goes back, unused).
fn abandon<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    if let Some(m) = qp.resp.in_msg.take() {
        ctx.counters.dropped_messages += 1;
        if let Some(wr) = m.recv {
            give_back(qp, ctx, wr);
        }
    }
}

/// A UC request. No ACK, no NAK, no retry: a gap (or any error) drops the message in progress
/// and everything up to the next FIRST or ONLY, which is accepted whatever its PSN (IBTA 9.7.7,
/// as rxe's check_psn for UC).
pub(crate) fn handle_uc<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>) {
    let Some(info) = pkt.info() else { return };
    let psn = pkt.bth().psn();
    if qp.resp.drop_msg || psn != qp.resp.epsn {
        if info.position.starts() {
            abandon(qp, ctx);
            qp.resp.drop_msg = false;
        } else {
            abandon(qp, ctx);
            qp.resp.drop_msg = true;
            qp.resp.epsn = psn + 1;
            return;
        }
    }
    qp.resp.epsn = psn + 1;
    let continuing = !info.position.starts();
    let seq_ok = match (&qp.resp.in_msg, continuing) {
        (Some(m), true) => m.kind == info.kind,
        (None, false) => true,
        (Some(_), false) => {
            // A new message while one was in progress: the old one lost its LAST.
            abandon(qp, ctx);
            true
        }
        (None, true) => false,
    };
    let mtu = qp.mtu() as usize;
    let plen = pkt.payload().len();
    let exact = matches!(info.position, Position::First | Position::Middle);
    if !seq_ok || (exact && plen != mtu) || plen > mtu {
        abandon(qp, ctx);
        qp.resp.drop_msg = true;
        return;
    }
    let (pd, cq) = (qp.pd, qp.recv_cq);
    let mut m = if info.position.starts() {
        let mut m = InMsg { kind: info.kind, recv: None, offset: 0, write: None, cq };
        if info.kind == OpKind::Send {
            let Some(wr) = take_recv(qp, ctx) else {
                // No receive WQE: a UC message is silently dropped (no RNR on UC).
                ctx.counters.dropped_messages += 1;
                qp.resp.drop_msg = !info.position.ends();
                return;
            };
            m.recv = Some(wr);
        } else if let Some(reth) = pkt.reth() {
            let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
            let ok = len == 0
                || (qp.attr.qp_access_flags.contains(Access::REMOTE_WRITE)
                    && ctx.mr_by_rkey(rkey).is_some_and(|mr| {
                        Some(mr.pd) == pd && mr.access.contains(Access::REMOTE_WRITE) && mr.contains(va, u64::from(len))
                    }));
            if !ok {
                ctx.counters.dropped_messages += 1;
                qp.resp.drop_msg = !info.position.ends();
                return;
            }
            m.write = Some((va, rkey, len));
        }
        m
    } else {
        match qp.resp.in_msg.take() {
            Some(m) => m,
            None => return,
        }
    };
    let data = pkt.payload();
    match info.kind {
        OpKind::Send => {
            let Some(wr) = m.recv.take() else { return };
            if u64::from(m.offset) + data.len() as u64 > capacity(&wr) {
                qp.complete_recv(ctx, cq, wr.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0, None, None);
                qp.resp.drop_msg = !info.position.ends();
                return;
            }
            if !scatter(pd, ctx, &wr, m.offset, data) {
                qp.complete_recv(ctx, cq, wr.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0, None, None);
                qp.resp.drop_msg = !info.position.ends();
                return;
            }
            m.offset += data.len() as u32;
            if info.position.ends() {
                qp.resp.msn = qp.resp.msn.wrapping_add(1);
                ctx.counters.rdma_recvs += 1;
                qp.complete_message(ctx, pkt, cq, wr.wr_id, WcOpcode::Recv, m.offset, None);
            } else {
                m.recv = Some(wr);
                qp.resp.in_msg = Some(m);
            }
        }
        OpKind::Write => {
            let (va, rkey, len) = m.write.unwrap_or_default();
            let end = u64::from(m.offset) + data.len() as u64;
            if end > u64::from(len) || (info.position.ends() && end != u64::from(len)) {
                ctx.counters.dropped_messages += 1;
                qp.resp.drop_msg = !info.position.ends();
                return;
            }
            if !data.is_empty() {
                let owner = ctx.mr_by_rkey(rkey).map(|mr| mr.owner);
                let addr = va.wrapping_add(u64::from(m.offset));
                if owner.is_none_or(|o| ctx.mem.write(o, addr, data).is_err()) {
                    ctx.counters.dropped_messages += 1;
                    qp.resp.drop_msg = !info.position.ends();
                    return;
                }
            }
            m.offset += data.len() as u32;
            if info.position.ends() {
                qp.resp.msn = qp.resp.msn.wrapping_add(1);
                if pkt.immdt().is_some() {
                    match take_recv(qp, ctx) {
                        Some(wr) => qp.complete_message(ctx, pkt, cq, wr.wr_id, WcOpcode::RecvRdmaWithImm, len, None),
                        None => ctx.counters.dropped_messages += 1,
                    }
                }
            } else {
                qp.resp.in_msg = Some(m);
            }
        }
        _ => {}
    }
}

/// The sender's address from a UD receive buffer's GRH slot: what `ibv_create_ah_from_wc` reads
/// to answer a datagram. `None` if the slot holds neither an IPv4 header (bytes 20-39) nor an
/// IPv6 header.
pub fn ah_from_grh(slot: &[u8]) -> Option<IpAddr> {
    let slot = slot.get(..GRH_SLOT)?;
    if slot[20] >> 4 == 4 {
        let s = &slot[32..36];
        return Some(IpAddr::V4(std::net::Ipv4Addr::new(s[0], s[1], s[2], s[3])));
    }
    if slot[0] >> 4 == 6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&slot[8..24]);
        return Some(IpAddr::V6(std::net::Ipv6Addr::from(a)));
    }
    None
}

/// The 40 bytes placed in the GRH slot of a UD receive buffer: for RoCEv2 over IPv4, 20 zero bytes
/// then the IPv4 header (bytes 20-39); over IPv6, the IPv6 header (as rxe and hardware do).
fn grh_slot(src: IpAddr, dst: IpAddr, payload_len: usize) -> [u8; GRH_SLOT] {
    let mut slot = [0u8; GRH_SLOT];
    let (hdr, _) = ip_udp_header(src, dst, 0, payload_len, 0);
    match src {
        IpAddr::V4(_) => slot[20..].copy_from_slice(&hdr[..20]),
        IpAddr::V6(_) => slot.copy_from_slice(&hdr[..40]),
    }
    slot
}

/// A UD datagram: Q_Key check (IBTA 10.2.5: a mismatch is dropped and counted), no PSN check (a
/// duplicated datagram is delivered twice, as on hardware), one receive WQE per datagram with the
/// GRH slot first, no acknowledgement.
pub(crate) fn handle_ud<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, src: IpAddr, dst: IpAddr, pkt: &IbPacket<&[u8]>) {
    let Some(deth) = pkt.deth() else { return };
    if deth.qkey() != qp.attr.qkey {
        ctx.counters.qkey_violations += 1;
        return;
    }
    let Some(wr) = take_recv(qp, ctx) else {
        ctx.counters.dropped_messages += 1;
        return;
    };
    let data = pkt.payload();
    let cq: Option<CqId> = qp.recv_cq;
    if (GRH_SLOT + data.len()) as u64 > capacity(&wr) {
        qp.complete_recv(ctx, cq, wr.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0, None, None);
        return;
    }
    let slot = grh_slot(src, dst, pkt.header_len() + data.len() + usize::from(pkt.bth().pad_count()) + 4);
    if !scatter(qp.pd, ctx, &wr, 0, &slot) || !scatter(qp.pd, ctx, &wr, GRH_SLOT as u32, data) {
        qp.complete_recv(ctx, cq, wr.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0, None, None);
        return;
    }
    ctx.counters.rdma_recvs += 1;
    let Some(cq) = cq else { return };
    let wc = WorkCompletion {
        wr_id: wr.wr_id,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len: (GRH_SLOT + data.len()) as u32,
        imm: pkt.immdt().map(|i| i.imm()),
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: Qpn::new(deth.src_qp().value()),
        grh: true,
        src: Some(src),
    };
    // IBTA 11.4.2.2: a solicited-only armed CQ fires on a receive whose message had the
    // Solicited Event bit, whatever the service type (UCX's ud_verbs sleeps on exactly this).
    ctx.se = pkt.bth().solicited();
    ctx.complete(cq, wc);
    ctx.se = false;
}
