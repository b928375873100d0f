//! What every role does with packets and buffers: writes a transport packet (headers, payload,
//! ICRC) and moves bytes between a packet and the buffers of a scatter/gather list.

use std::net::IpAddr;

use super::{Ctx, PdId, Transmit};
use crate::memory::Memory;
use crate::verbs::Access;
use crate::wire::{
    icrc, ipv4, ipv6, udp, IbPacket, IbRepr, IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, Qpn, UdpPacket,
    UdpRepr, ROCE_V2_PORT,
};
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

/// The IPv4/IPv6 and UDP headers the ICRC of a datagram covers, as the sender's kernel writes
/// them: IPv4 with DF, the given ID, TTL 64; TOS, TTL and checksums are masked by the ICRC anyway.
/// Returns the bytes and their length (28 for IPv4, 48 for IPv6).
pub fn ip_udp_header(src: IpAddr, dst: IpAddr, sport: u16, udp_payload_len: usize, ip_id: u16) -> ([u8; 48], usize) {
    let mut h = [0u8; 48];
    let udp = UdpRepr { src_port: sport, dst_port: ROCE_V2_PORT, payload_len: udp_payload_len };
    let l4_len = udp::HEADER_LEN + udp_payload_len;
    // What a Linux sender of RoCEv2 writes: IPv4 with DF, TTL 64 and the given ID; otherwise
    // IPv6 (an IPv4 address as IPv4-mapped) with hop limit 64. A length beyond what the IP
    // header holds is not a RoCE packet: the header is then left as far as it was written.
    let n = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let r = Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                protocol: IpProtocol::Udp,
                payload_len: l4_len,
                dscp_ecn: 0,
                ident: ip_id,
                dont_frag: true,
                ttl: 64,
            };
            let _ = r.emit(&mut Ipv4Packet::new_unchecked(&mut h[..]));
            ipv4::HEADER_LEN
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            let r = Ipv6Repr {
                src_addr: to6(s),
                dst_addr: to6(d),
                next_header: IpProtocol::Udp,
                payload_len: l4_len,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            };
            let _ = r.emit(&mut Ipv6Packet::new_unchecked(&mut h[..]));
            ipv6::HEADER_LEN
        }
    };
    let _ = udp.emit(&mut UdpPacket::new_unchecked(&mut h[n..]));
    (h, n + udp::HEADER_LEN)
}
