//! IPv6 fixed headers (RFC 8200), as RoCEv2 uses them. The IB GRH has the same layout and reuses
//! this view (see [`super::grh`]).

use core::net::Ipv6Addr;

use super::{be, Error, Field, IpProtocol, Result};

mod field {
    use super::Field;
    pub(super) const VER_TC_FLOW: Field = 0..4;
    pub(super) const LENGTH: Field = 4..6;
    pub(super) const NXT_HDR: usize = 6;
    pub(super) const HOP_LIMIT: usize = 7;
    pub(super) const SRC_ADDR: Field = 8..24;
    pub(super) const DST_ADDR: Field = 24..40;
}

/// Length of the IPv6 fixed header (and of the GRH).
pub const HEADER_LEN: usize = field::DST_ADDR.end;

packet_view!(Packet, "A view of an IPv6 packet (or of a GRH and what follows it).");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the 40-byte header is present (enough for every header field).
    pub fn check_header_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated("IPv6 header"))
        } else {
            Ok(())
        }
    }

    /// Checks the header and that the buffer holds the payload length it declares.
    pub fn check_len(&self) -> Result<()> {
        self.check_header_len()?;
        if self.buffer.as_ref().len() < HEADER_LEN + self.payload_len() as usize {
            return Err(Error::Truncated("IPv6 payload"));
        }
        Ok(())
    }

    fn ver_tc_flow(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::VER_TC_FLOW)
    }

    /// The version field (6 for IPv6 and for a GRH).
    pub fn version(&self) -> u8 {
        (self.ver_tc_flow() >> 28) as u8
    }

    /// The traffic class (DSCP and ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.ver_tc_flow() >> 20) as u8
    }

    /// The 20-bit flow label.
    pub fn flow_label(&self) -> u32 {
        self.ver_tc_flow() & 0x000f_ffff
    }

    /// The payload length.
    pub fn payload_len(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// The next header.
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::NXT_HDR])
    }

    /// The hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// The source address (SGID in a GRH).
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC_ADDR]);
        Ipv6Addr::from(a)
    }

    /// The destination address (DGID in a GRH).
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST_ADDR]);
        Ipv6Addr::from(a)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload, as long as the payload length says (after [`check_len`](Packet::check_len)).
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }

    /// The payload bytes present in the buffer, up to the declared length (needs only
    /// [`check_header_len`](Packet::check_header_len)).
    pub fn payload_present(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = (HEADER_LEN + self.payload_len() as usize).min(b.len());
        &b[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version, traffic class and flow label together.
    pub fn set_version_tc_flow(&mut self, version: u8, traffic_class: u8, flow_label: u32) {
        let v = (u32::from(version & 0xf) << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000f_ffff);
        be::set_u32(self.buffer.as_mut(), field::VER_TC_FLOW, v)
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::LENGTH, v)
    }

    /// Sets the next header.
    pub fn set_next_header(&mut self, p: IpProtocol) {
        self.buffer.as_mut()[field::NXT_HDR] = p.into();
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets())
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets())
    }

    /// The payload bytes, writable (up to the payload length).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + self.payload_len() as usize;
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// An IPv6 fixed header as values (extension headers are not used by RoCEv2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Next header.
    pub next_header: IpProtocol,
    /// Payload length in bytes.
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
}

impl Repr {
    /// Reads a packet whose header is present; rejects a version other than 6.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_header_len()?;
        if packet.version() != 6 {
            return Err(Error::Malformed("IPv6 version is not 6"));
        }
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: packet.payload_len() as usize,
            hop_limit: packet.hop_limit(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
        })
    }

    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into a buffer of at least [`HEADER_LEN`] bytes; fails when the payload
    /// is too long for the 16-bit payload length.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let len = u16::try_from(self.payload_len).map_err(|_| Error::Malformed("IPv6 payload over 65535 bytes"))?;
        packet.set_version_tc_flow(6, self.traffic_class, self.flow_label);
        packet.set_payload_len(len);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The IPv6 header of golden packet g5 (TC 0x6a, flow 0x12345, UDP, hop limit 64), 4 payload bytes.
    static PACKET_BYTES: [u8; 44] = [
        0x66, 0xa1, 0x23, 0x45, 0x00, 0x04, 0x11, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 1, 2, 3, 4,
    ];

    fn repr() -> Repr {
        Repr {
            src_addr: "2001:db8::1".parse().unwrap(),
            dst_addr: "2001:db8::2".parse().unwrap(),
            next_header: IpProtocol::Udp,
            payload_len: 4,
            hop_limit: 64,
            traffic_class: 0x6a,
            flow_label: 0x12345,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&PACKET_BYTES[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0x6a);
        assert_eq!(p.flow_label(), 0x12345);
        assert_eq!(p.payload_len(), 4);
        assert_eq!(p.next_header(), IpProtocol::Udp);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.dst_addr(), "2001:db8::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.payload(), &[1, 2, 3, 4]);
    }

    #[test]
    fn construct() {
        let mut b = [0u8; 44];
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_version_tc_flow(6, 0x6a, 0x12345);
        p.set_payload_len(4);
        p.set_next_header(IpProtocol::Udp);
        p.set_hop_limit(64);
        p.set_src_addr("2001:db8::1".parse().unwrap());
        p.set_dst_addr("2001:db8::2".parse().unwrap());
        p.payload_mut().copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(b, PACKET_BYTES);
    }

    #[test]
    fn parse() {
        assert_eq!(Repr::parse(&Packet::new_checked(&PACKET_BYTES[..]).unwrap()).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut b = [0u8; 44];
        repr().emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        b[40..].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(b, PACKET_BYTES);
    }

    #[test]
    fn truncated_payload() {
        assert_eq!(Packet::new_checked(&PACKET_BYTES[..43]).unwrap_err(), Error::Truncated("IPv6 payload"));
        assert_eq!(Packet::new_checked(&PACKET_BYTES[..39]).unwrap_err(), Error::Truncated("IPv6 header"));
    }
}
