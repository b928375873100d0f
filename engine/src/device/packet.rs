//! What every role does with packets and buffers: writes a transport packet (headers, payload,
//! ICRC) and moves bytes between a packet and the buffers of a scatter/gather list.

use super::{ip_udp_header, Ctx, PdId, Transmit};
use crate::memory::Memory;
use crate::verbs::Access;
use crate::wire::{icrc, IbPacket, IbRepr, Qpn};
use crate::wr::{RecvWr, Sge};

/// Writes one transport packet: headers from `ib`, the payload through `fill`, pad, ICRC.
pub(crate) fn emit<M: Memory>(
    ctx: &mut Ctx<'_, M>,
    qp_num: Qpn,
    dest: std::net::IpAddr,
    buf: &mut [u8],
    ib: &IbRepr,
    fill: impl FnOnce(&mut Ctx<'_, M>, &mut [u8]) -> bool,
) -> Option<Transmit> {
    let len = ib.buffer_len();
    if buf.len() < len || ib.emit(buf).is_err() {
        return None;
    }
    let mut p = IbPacket::new_unchecked(&mut buf[..len]);
    if !fill(ctx, p.payload_mut()) {
        return None;
    }
    if ctx.behaviour.mig_req {
        // The profile's MigReq (before the ICRC, which covers it).
        crate::wire::bth::Packet::new_unchecked(&mut buf[..len]).set_mig_req(true);
    }
    let sport = ctx.flow_ports.port(qp_num);
    // A packet to this device's own address without an ICRC when the transport asked for none
    // (the receiving engine, of this process or another on the same device, takes it with
    // handle_internal_packet, which does not check it).
    if dest != ctx.local || ctx.loopback_icrc {
        let (hdr, n) = ip_udp_header(ctx.local, dest, sport, len, ctx.ip_id);
        let crc = icrc::roce_v2_parts(&hdr[..n], &buf[..len - icrc::LEN]).ok()?;
        IbPacket::new_unchecked(&mut buf[..len]).set_icrc(crc);
    }
    Some(Transmit { dst: dest, src_port: sport, len })
}

/// Calls `f(sge, offset in sge, offset in the run, length)` for each piece of the byte run
/// `[offset, offset + len)` of a scatter/gather list.
pub(crate) fn walk_sges(
    sges: &[Sge],
    offset: u32,
    len: usize,
    mut f: impl FnMut(&Sge, u32, usize, usize) -> bool,
) -> bool {
    let mut skip = offset as u64;
    let mut at = 0usize;
    for s in sges {
        if at == len {
            break;
        }
        let l = u64::from(s.length);
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(len - at);
        if !f(s, skip as u32, at, n) {
            return false;
        }
        at += n;
        skip = 0;
    }
    at == len
}

/// Scatters `data` into a receive WQE's buffers at `offset`; false on a bad lkey or bounds.
pub(crate) fn scatter<M: Memory>(
    pd: Option<PdId>,
    ctx: &mut Ctx<'_, M>,
    wr: &RecvWr,
    offset: u32,
    data: &[u8],
) -> bool {
    walk_sges(&wr.sg_list, offset, data.len(), |sge, sge_off, at, n| {
        let Some(mr) = ctx.mr_by_lkey(sge.lkey) else { return false };
        if Some(mr.pd) != pd
            || !mr.access.contains(Access::LOCAL_WRITE)
            || !mr.contains(sge.addr, u64::from(sge.length))
        {
            return false;
        }
        let owner = mr.owner;
        ctx.mem.write_local(owner, sge.addr.wrapping_add(u64::from(sge_off)), &data[at..at + n]).is_ok()
    })
}

pub(crate) fn recv_capacity(wr: &RecvWr) -> u64 {
    wr.sg_list.iter().map(|s| u64::from(s.length)).sum()
}
