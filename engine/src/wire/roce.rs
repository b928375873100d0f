//! Whole RoCE frames: Ethernet II (with an optional 802.1Q tag), then either IPv4 or IPv6 and UDP
//! to port 4791 (RoCEv2, IBTA Annex A17) or a GRH (RoCEv1, ethertype 0x8915, Annex A16), then the
//! IB transport packet and its ICRC.
//!
//! Two ways in:
//! - [`dissect`] never fails: it reads layer after layer as far as the bytes allow and records
//!   the first problem. Capture analysis uses it, since capture files hold cut-off and broken
//!   frames.
//! - [`FrameRepr::parse`] is strict: a frame that is not a complete, well-formed RoCE packet is an
//!   error. [`FrameRepr::emit`] builds one, ICRC and checksums included.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{
    ethernet, grh, ib, icrc, ipv4, ipv6, udp, Error, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, GrhRepr,
    IpProtocol, Ipv4Repr, Ipv6Repr, Result, UdpRepr, ROCE_V2_PORT,
};

/// The layer under the IB transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L3Repr {
    /// RoCEv2 over IPv4.
    Ipv4(Ipv4Repr),
    /// RoCEv2 over IPv6.
    Ipv6(Ipv6Repr),
    /// RoCEv1: a GRH right after the Ethernet header.
    Grh(GrhRepr),
}

impl L3Repr {
    /// Source address (the SGID for RoCEv1).
    pub fn src_addr(&self) -> IpAddr {
        match self {
            L3Repr::Ipv4(r) => IpAddr::V4(r.src_addr),
            L3Repr::Ipv6(r) => IpAddr::V6(r.src_addr),
            L3Repr::Grh(r) => IpAddr::V6(r.sgid.to_ipv6()),
        }
    }

    /// Destination address (the DGID for RoCEv1).
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            L3Repr::Ipv4(r) => IpAddr::V4(r.dst_addr),
            L3Repr::Ipv6(r) => IpAddr::V6(r.dst_addr),
            L3Repr::Grh(r) => IpAddr::V6(r.dgid.to_ipv6()),
        }
    }

    fn header_len(&self) -> usize {
        match self {
            L3Repr::Ipv4(_) => ipv4::HEADER_LEN,
            L3Repr::Ipv6(_) => ipv6::HEADER_LEN,
            L3Repr::Grh(_) => grh::HEADER_LEN,
        }
    }
}

/// What a frame holds, layer by layer, as far as it could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dissection<'a> {
    /// The Ethernet header, if the frame holds one; behind VLAN tags, its ethertype is the one
    /// after the innermost tag.
    pub eth: Option<EthernetRepr>,
    /// The TCI of an 802.1Q/802.1ad tag, if there was one (the innermost).
    pub vlan_tci: Option<u16>,
    /// The network layer (IPv4, IPv6 or GRH), if read.
    pub l3: Option<L3Repr>,
    /// The UDP header (RoCEv2), if read.
    pub udp: Option<UdpRepr>,
    /// The UDP checksum field as received.
    pub udp_checksum: Option<u16>,
    /// Whether this is RoCE: UDP destination port 4791, or ethertype 0x8915.
    pub roce: bool,
    /// The network-layer bytes present: from the IP header (or GRH) to the end the headers
    /// declare, or to the end of the frame if it stops earlier.
    pub l3_bytes: &'a [u8],
    /// The transport bytes present (BTH to ICRC), cut the same way.
    pub ib_bytes: &'a [u8],
    /// The transport length the UDP length (or GRH PayLen) declares.
    pub ib_declared_len: usize,
    /// The first problem met below the transport layer (the transport packet itself is checked
    /// with [`ib::Packet::new_checked`] on `ib_bytes`).
    pub error: Option<Error>,
}

impl<'a> Dissection<'a> {
    fn new() -> Dissection<'a> {
        Dissection {
            eth: None,
            vlan_tci: None,
            l3: None,
            udp: None,
            udp_checksum: None,
            roce: false,
            l3_bytes: &[],
            ib_bytes: &[],
            ib_declared_len: 0,
            error: None,
        }
    }

    /// Whether the frame holds the whole transport packet its headers declare.
    pub fn is_complete(&self) -> bool {
        self.roce && self.error.is_none() && self.ib_bytes.len() == self.ib_declared_len
    }

    /// Checks the ICRC, when the whole packet is present and long enough to hold a BTH and an
    /// ICRC; `None` when it cannot be checked.
    pub fn icrc_ok(&self) -> Option<bool> {
        if !self.is_complete() {
            return None;
        }
        match self.l3? {
            L3Repr::Grh(_) => icrc::verify_roce_v1(self.l3_bytes).ok(),
            _ => icrc::verify_roce_v2(self.l3_bytes).ok(),
        }
    }

    /// The ICRC the packet carries, when the whole packet is present.
    pub fn stored_icrc(&self) -> Option<u32> {
        if !self.is_complete() || self.ib_bytes.len() < icrc::LEN {
            return None;
        }
        icrc::stored(self.ib_bytes)
    }
}

/// Reads a frame (starting at the Ethernet header) as far as it goes. Never panics, never fails.
pub fn dissect(frame: &[u8]) -> Dissection<'_> {
    let mut d = Dissection::new();
    if let Err(e) = dissect_into(frame, &mut d) {
        d.error = Some(e);
    }
    d
}

fn dissect_into<'a>(frame: &'a [u8], d: &mut Dissection<'a>) -> Result<()> {
    let eth = EthernetFrame::new_checked(frame)?;
    let mut repr = EthernetRepr::parse(&eth)?;
    let mut rest = eth.payload();
    // Up to two VLAN tags (802.1ad outer, 802.1Q inner).
    for _ in 0..2 {
        if !matches!(repr.ethertype, EtherType::Vlan | EtherType::QinQ) {
            break;
        }
        if rest.len() < 4 {
            return Err(Error::Truncated("VLAN tag"));
        }
        d.vlan_tci = Some(u16::from_be_bytes([rest[0], rest[1]]));
        repr.ethertype = EtherType::from(u16::from_be_bytes([rest[2], rest[3]]));
        rest = &rest[4..];
    }
    // The Ethernet header as values names what follows the tags.
    d.eth = Some(repr);
    dissect_network(repr.ethertype, rest, d)
}

/// Reads what follows a link-layer header that announced `ethertype` (for captures whose link
/// type is not Ethernet: Linux cooked capture, raw IP). Never panics, never fails.
pub fn dissect_network_layer(ethertype: EtherType, bytes: &[u8]) -> Dissection<'_> {
    let mut d = Dissection::new();
    if let Err(e) = dissect_network(ethertype, bytes, &mut d) {
        d.error = Some(e);
    }
    d
}

fn dissect_network<'a>(ethertype: EtherType, rest: &'a [u8], d: &mut Dissection<'a>) -> Result<()> {
    match ethertype {
        EtherType::Ipv4 => {
            let p = ipv4::Packet::new_unchecked(rest);
            p.check_header_len()?;
            let r = Ipv4Repr::parse(&p)?;
            d.l3 = Some(L3Repr::Ipv4(r));
            if r.protocol != IpProtocol::Udp {
                return Ok(());
            }
            d.l3_bytes = &rest[..(p.total_len() as usize).min(rest.len())];
            dissect_udp(p.payload_present(), r.payload_len, d)
        }
        EtherType::Ipv6 => {
            let p = ipv6::Packet::new_unchecked(rest);
            p.check_header_len()?;
            let r = Ipv6Repr::parse(&p)?;
            d.l3 = Some(L3Repr::Ipv6(r));
            if r.next_header != IpProtocol::Udp {
                return Ok(());
            }
            d.l3_bytes = &rest[..(ipv6::HEADER_LEN + r.payload_len).min(rest.len())];
            dissect_udp(p.payload_present(), r.payload_len, d)
        }
        EtherType::Roce => {
            d.roce = true;
            let p = grh::Packet::new_unchecked(rest);
            let r = GrhRepr::parse(&p)?;
            d.l3 = Some(L3Repr::Grh(r));
            d.l3_bytes = &rest[..(grh::HEADER_LEN + r.payload_len).min(rest.len())];
            d.ib_bytes = p.payload_present();
            d.ib_declared_len = r.payload_len;
            // IBTA Vol 1 ch. 8 (GRH): the IBA transport follows a GRH whose next header is 0x1B.
            if r.next_header != IpProtocol::IbaTransport {
                return Err(Error::Malformed("GRH next header is not the IBA transport (0x1b)"));
            }
            if d.ib_bytes.len() < d.ib_declared_len {
                return Err(Error::Truncated("GRH payload"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn dissect_udp<'a>(ip_payload: &'a [u8], ip_payload_len: usize, d: &mut Dissection<'a>) -> Result<()> {
    let p = udp::Packet::new_unchecked(ip_payload);
    p.check_header_len()?;
    let r = UdpRepr::parse(&p)?;
    d.udp = Some(r);
    d.udp_checksum = Some(p.checksum());
    if r.dst_port != ROCE_V2_PORT {
        return Ok(());
    }
    d.roce = true;
    d.ib_bytes = p.payload_present();
    d.ib_declared_len = r.payload_len;
    // The ICRC covers the IP header through the end of the transport packet, so the UDP datagram
    // must fill the IP payload exactly; bytes beyond it would be covered by nothing.
    if udp::HEADER_LEN + r.payload_len != ip_payload_len {
        return Err(Error::Malformed("UDP length differs from the IP payload length"));
    }
    if d.ib_bytes.len() < d.ib_declared_len {
        return Err(Error::Truncated("UDP datagram"));
    }
    Ok(())
}

/// A checked RoCE frame as zero-copy views: the receive hot path. Accepts exactly the frames
/// [`FrameRepr::parse`] accepts, without building any header values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceView<'a> {
    /// From the first byte of the IP header (or GRH) to the end of the ICRC.
    pub l3: &'a [u8],
    /// The transport packet.
    pub ib: ib::Packet<&'a [u8]>,
    /// Whether this is RoCEv1 (a GRH, no IP/UDP).
    pub v1: bool,
}

impl<'a> RoceView<'a> {
    /// Checks a frame (from its Ethernet header) and returns views of its layers.
    pub fn new_checked(frame: &'a [u8]) -> Result<RoceView<'a>> {
        let eth = EthernetFrame::new_checked(frame)?;
        let mut ethertype = eth.ethertype();
        let mut rest = eth.payload();
        for _ in 0..2 {
            if !matches!(ethertype, EtherType::Vlan | EtherType::QinQ) {
                break;
            }
            if rest.len() < 4 {
                return Err(Error::Truncated("VLAN tag"));
            }
            ethertype = EtherType::from(u16::from_be_bytes([rest[2], rest[3]]));
            rest = &rest[4..];
        }
        let (l3_len, ip_payload, v1) = match ethertype {
            EtherType::Ipv4 => {
                let p = ipv4::Packet::new_checked(rest)?;
                if p.version() != 4 {
                    return Err(Error::Malformed("IPv4 version is not 4"));
                }
                if p.more_frags() || p.frag_offset() != 0 {
                    return Err(Error::Malformed("IPv4 fragment"));
                }
                if p.protocol() != IpProtocol::Udp {
                    return Err(Error::Malformed("not a RoCE frame"));
                }
                (p.total_len() as usize, p.header_len(), false)
            }
            EtherType::Ipv6 => {
                let p = ipv6::Packet::new_checked(rest)?;
                if p.version() != 6 {
                    return Err(Error::Malformed("IPv6 version is not 6"));
                }
                if p.next_header() != IpProtocol::Udp {
                    return Err(Error::Malformed("not a RoCE frame"));
                }
                (ipv6::HEADER_LEN + p.payload_len() as usize, ipv6::HEADER_LEN, false)
            }
            EtherType::Roce => {
                let p = grh::Packet::new_unchecked(rest);
                p.check_header_len().map_err(|_| Error::Truncated("GRH"))?;
                if p.version() != grh::IP_VERSION {
                    return Err(Error::Malformed("GRH IP version is not 6"));
                }
                if p.next_header() != IpProtocol::IbaTransport {
                    return Err(Error::Malformed("GRH next header is not the IBA transport (0x1b)"));
                }
                p.check_len().map_err(|_| Error::Truncated("GRH payload"))?;
                (grh::HEADER_LEN + p.payload_len() as usize, grh::HEADER_LEN, true)
            }
            _ => return Err(Error::Malformed("not a RoCE frame")),
        };
        let l3 = &rest[..l3_len];
        let ib_bytes = if v1 {
            &l3[ip_payload..]
        } else {
            let u = udp::Packet::new_unchecked(&l3[ip_payload..]);
            u.check_header_len()?;
            if u.dst_port() != ROCE_V2_PORT {
                return Err(Error::Malformed("not a RoCE frame"));
            }
            if u.len() as usize != l3_len - ip_payload {
                return Err(Error::Malformed("UDP length differs from the IP payload length"));
            }
            u.payload()
        };
        Ok(RoceView { l3, ib: ib::Packet::new_checked(ib_bytes)?, v1 })
    }

    /// Whether the ICRC is right.
    pub fn icrc_ok(&self) -> bool {
        let body = &self.l3[..self.l3.len() - icrc::LEN];
        let crc = if self.v1 { icrc::roce_v1(body) } else { icrc::roce_v2(body) };
        crc.is_ok_and(|c| c == self.ib.icrc())
    }
}

/// A complete RoCE frame as values (the payload bytes are separate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// The Ethernet header. Its ethertype is set by [`emit`](Self::emit) from `l3` (and the tag).
    pub eth: EthernetRepr,
    /// The TCI of an 802.1Q tag, if the frame carries one.
    pub vlan_tci: Option<u16>,
    /// The network layer. Its length fields are set by [`emit`](Self::emit).
    pub l3: L3Repr,
    /// UDP source port (RoCEv2 flow entropy; ignored for RoCEv1).
    pub udp_src_port: u16,
    /// The IB transport headers and payload length.
    pub ib: ib::Repr,
}

/// A frame read by [`FrameRepr::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// The headers as values.
    pub repr: FrameRepr,
    /// A view of the transport packet (payload, pad, ICRC).
    pub ib: ib::Packet<&'a [u8]>,
    /// The UDP checksum as received (0: none; RoCEv1: 0).
    pub udp_checksum: u16,
    /// Whether the ICRC is right.
    pub icrc_ok: bool,
}

/// Options for [`FrameRepr::emit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EmitOptions {
    /// Compute the UDP checksum (needed with UDP GSO and always over IPv6, RFC 8200 8.1); when
    /// false an IPv4 frame carries 0, as rxe sends.
    pub udp_checksum: bool,
}

impl FrameRepr {
    /// Reads a complete, well-formed RoCE frame.
    pub fn parse(frame: &[u8]) -> Result<ParsedFrame<'_>> {
        let d = dissect(frame);
        if let Some(e) = d.error {
            return Err(e);
        }
        if !d.roce {
            return Err(Error::Malformed("not a RoCE frame"));
        }
        let packet = ib::Packet::new_checked(d.ib_bytes)?;
        let ib = ib::Repr::parse(&packet)?;
        let (Some(eth), Some(l3)) = (d.eth, d.l3) else {
            return Err(Error::Malformed("not a RoCE frame"));
        };
        Ok(ParsedFrame {
            repr: FrameRepr { eth, vlan_tci: d.vlan_tci, l3, udp_src_port: d.udp.map_or(0, |u| u.src_port), ib },
            ib: packet,
            udp_checksum: d.udp_checksum.unwrap_or(0),
            icrc_ok: d.icrc_ok().unwrap_or(false),
        })
    }

    fn l2_len(&self) -> usize {
        ethernet::HEADER_LEN + if self.vlan_tci.is_some() { 4 } else { 0 }
    }

    fn l4_len(&self) -> usize {
        match self.l3 {
            L3Repr::Grh(_) => 0,
            _ => udp::HEADER_LEN,
        }
    }

    /// Bytes the whole frame takes (no FCS).
    pub fn buffer_len(&self) -> usize {
        self.l2_len() + self.l3.header_len() + self.l4_len() + self.ib.buffer_len()
    }

    /// Writes the whole frame into `buf`: headers (length fields and ethertype derived),
    /// `payload` (exactly `ib.payload_len` bytes), zero pad, ICRC, UDP checksum if asked, IPv4
    /// header checksum. Returns the frame length.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8], opts: EmitOptions) -> Result<usize> {
        if payload.len() != self.ib.payload_len {
            return Err(Error::Malformed("payload length differs from the transport header's"));
        }
        self.ib.check()?;
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(Error::Truncated("buffer for the frame"));
        }
        let buf = &mut buf[..len];
        let l3_type = match self.l3 {
            L3Repr::Ipv4(_) => EtherType::Ipv4,
            L3Repr::Ipv6(_) => EtherType::Ipv6,
            L3Repr::Grh(_) => EtherType::Roce,
        };
        let mut eth = self.eth;
        eth.ethertype = if self.vlan_tci.is_some() { EtherType::Vlan } else { l3_type };
        eth.emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
        if let Some(tci) = self.vlan_tci {
            buf[14..16].copy_from_slice(&tci.to_be_bytes());
            buf[16..18].copy_from_slice(&u16::from(l3_type).to_be_bytes());
        }
        let l3_start = self.l2_len();
        let ib_len = self.ib.buffer_len();
        let l4_len = self.l4_len() + ib_len;
        let ib_start = l3_start + self.l3.header_len() + self.l4_len();
        match self.l3 {
            L3Repr::Ipv4(mut r) => {
                r.payload_len = l4_len;
                r.protocol = IpProtocol::Udp;
                r.emit(&mut ipv4::Packet::new_unchecked(&mut buf[l3_start..]))?;
            }
            L3Repr::Ipv6(mut r) => {
                r.payload_len = l4_len;
                r.next_header = IpProtocol::Udp;
                r.emit(&mut ipv6::Packet::new_unchecked(&mut buf[l3_start..]))?;
            }
            L3Repr::Grh(mut r) => {
                r.payload_len = l4_len;
                r.next_header = IpProtocol::IbaTransport;
                r.emit(&mut grh::Packet::new_unchecked(&mut buf[l3_start..]))?;
            }
        }
        if self.l4_len() != 0 {
            let u = UdpRepr { src_port: self.udp_src_port, dst_port: ROCE_V2_PORT, payload_len: ib_len };
            u.emit(&mut udp::Packet::new_unchecked(&mut buf[ib_start - udp::HEADER_LEN..]))?;
        }
        self.ib.emit(&mut buf[ib_start..])?;
        let mut p = ib::Packet::new_unchecked(&mut buf[ib_start..]);
        p.payload_mut().copy_from_slice(payload);
        let body = &buf[l3_start..len - icrc::LEN];
        let crc = match self.l3 {
            L3Repr::Grh(_) => icrc::roce_v1(body)?,
            _ => icrc::roce_v2(body)?,
        };
        ib::Packet::new_unchecked(&mut buf[ib_start..]).set_icrc(crc);
        if opts.udp_checksum {
            let mut u = udp::Packet::new_unchecked(&mut buf[ib_start - udp::HEADER_LEN..]);
            match self.l3 {
                L3Repr::Ipv4(r) => u.fill_checksum_v4(r.src_addr, r.dst_addr),
                L3Repr::Ipv6(r) => u.fill_checksum_v6(r.src_addr, r.dst_addr),
                L3Repr::Grh(_) => {}
            }
        }
        Ok(len)
    }
}

/// A convenient default Ethernet header between two locally administered MACs.
pub fn default_eth(src: EthernetAddress, dst: EthernetAddress) -> EthernetRepr {
    EthernetRepr { src_addr: src, dst_addr: dst, ethertype: EtherType::Ipv4 }
}

/// An IPv4 header as RoCEv2 senders write it: DF set, TTL 64, ID 0 (what an unconnected Linux UDP
/// socket with IP_PMTUDISC_DO sends), the given TOS.
pub fn ipv4_default(src: Ipv4Addr, dst: Ipv4Addr, dscp_ecn: u8) -> L3Repr {
    L3Repr::Ipv4(Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        protocol: IpProtocol::Udp,
        payload_len: 0,
        dscp_ecn,
        ident: 0,
        dont_frag: true,
        ttl: 64,
    })
}

/// An IPv6 header with hop limit 64 and the given traffic class and flow label.
pub fn ipv6_default(src: Ipv6Addr, dst: Ipv6Addr, traffic_class: u8, flow_label: u32) -> L3Repr {
    L3Repr::Ipv6(Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Udp,
        payload_len: 0,
        hop_limit: 64,
        traffic_class,
        flow_label,
    })
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::{bth, Opcode, Psn, Qpn};

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    const G1: &str = "02000000000202000000000108004500003c000040004011b6adc0000201c0000202c00012b7002800000400ffff000000128000000148656c6c6f2c20526f43457632212121aae4f0d2";

    #[test]
    fn parse_and_reemit_golden_g1() {
        let f = hex(G1);
        let p = FrameRepr::parse(&f).unwrap();
        assert!(p.icrc_ok);
        assert_eq!(p.repr.ib.bth.opcode, Opcode::RC_SEND_ONLY);
        assert_eq!(p.repr.udp_src_port, 49152);
        assert_eq!(p.ib.payload(), b"Hello, RoCEv2!!!");
        let mut out = vec![0u8; p.repr.buffer_len()];
        let n = p.repr.emit(&mut out, p.ib.payload(), EmitOptions::default()).unwrap();
        assert_eq!(&out[..n], &f[..]);
    }

    #[test]
    fn vlan_tagged_frame_round_trips() {
        let f = hex(G1);
        let p = FrameRepr::parse(&f).unwrap();
        let mut r = p.repr;
        r.vlan_tci = Some(0x2005);
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out, p.ib.payload(), EmitOptions { udp_checksum: true }).unwrap();
        assert_eq!(out.len(), f.len() + 4);
        let q = FrameRepr::parse(&out).unwrap();
        assert!(q.icrc_ok, "the ICRC ignores the UDP checksum and the tag");
        assert_eq!(q.repr.vlan_tci, Some(0x2005));
        assert_ne!(q.udp_checksum, 0);
        assert_eq!(q.repr, r);
        assert_eq!(q.ib.icrc(), p.ib.icrc());
    }

    #[test]
    fn dissect_never_fails_on_prefixes() {
        let f = hex(G1);
        for n in 0..f.len() {
            let d = dissect(&f[..n]);
            assert!(d.error.is_some() || !d.roce, "prefix {n} read as complete");
            assert_eq!(d.icrc_ok(), None);
        }
        assert_eq!(dissect(&f).icrc_ok(), Some(true));
    }

    #[test]
    fn grh_frame() {
        let mut r = FrameRepr {
            eth: default_eth(EthernetAddress([2, 0, 0, 0, 0, 1]), EthernetAddress([2, 0, 0, 0, 0, 2])),
            vlan_tci: None,
            l3: L3Repr::Grh(GrhRepr {
                traffic_class: 0,
                flow_label: 0,
                payload_len: 0,
                next_header: IpProtocol::IbaTransport,
                hop_limit: 64,
                sgid: "fe80::1".parse::<Ipv6Addr>().unwrap().into(),
                dgid: "fe80::2".parse::<Ipv6Addr>().unwrap().into(),
            }),
            udp_src_port: 0,
            ib: ib::Repr::new(bth::Repr {
                pad_count: 1,
                ack_req: true,
                ..bth::Repr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x12), Psn::new(7))
            }),
        };
        r.ib.payload_len = 3;
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out, b"abc", EmitOptions::default()).unwrap();
        let p = FrameRepr::parse(&out).unwrap();
        assert!(p.icrc_ok);
        assert_eq!(p.ib.payload(), b"abc");
        assert_eq!(p.ib.pad(), &[0]);
        assert!(matches!(p.repr.l3, L3Repr::Grh(g) if g.payload_len == 12 + 3 + 1 + 4));
    }

    #[test]
    fn non_roce_frames() {
        let mut f = hex(G1);
        f[36] = 0x12; // UDP dport 0x12b7 -> 0x12b7 stays? change high byte
        f[37] = 0x34;
        let d = dissect(&f);
        assert!(!d.roce);
        assert!(d.error.is_none());
        assert!(FrameRepr::parse(&f).is_err());
        let d = dissect(&[0u8; 10]);
        assert_eq!(d.error, Some(Error::Truncated("Ethernet header")));
    }
}
