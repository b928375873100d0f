//! IPv4 headers (RFC 791), as RoCEv2 uses them.

use core::net::Ipv4Addr;

use super::{be, checksum, Error, Field, Result};

enum_with_unknown! {
    /// The IP protocol / IPv6 next header number.
    pub enum IpProtocol(u8) {
        /// ICMP.
        Icmp = 1,
        /// TCP.
        Tcp = 6,
        /// UDP: RoCEv2 runs over it.
        Udp = 17,
        /// IPv6 no next header.
        Ipv6NoNxt = 59,
        /// The IBA transport (BTH) follows: the GRH next-header value (IBTA Vol 1 8.3.1).
        IbaTransport = 0x1b,
    }
}

mod field {
    use super::Field;
    pub(super) const VER_IHL: usize = 0;
    pub(super) const DSCP_ECN: usize = 1;
    pub(super) const LENGTH: Field = 2..4;
    pub(super) const IDENT: Field = 4..6;
    pub(super) const FLG_OFF: Field = 6..8;
    pub(super) const TTL: usize = 8;
    pub(super) const PROTOCOL: usize = 9;
    pub(super) const CHECKSUM: Field = 10..12;
    pub(super) const SRC_ADDR: Field = 12..16;
    pub(super) const DST_ADDR: Field = 16..20;
}

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

packet_view!(Packet, "A view of an IPv4 packet.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the header (with options) is present and sane, without requiring the
    /// payload: enough to read every header field, not [`payload`](Packet::payload).
    pub fn check_header_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated("IPv4 header"));
        }
        if self.header_len() < HEADER_LEN {
            return Err(Error::Malformed("IPv4 header length below 20 bytes"));
        }
        if len < self.header_len() {
            return Err(Error::Truncated("IPv4 options"));
        }
        if (self.total_len() as usize) < self.header_len() {
            return Err(Error::Malformed("IPv4 total length below the header length"));
        }
        Ok(())
    }

    /// Checks the header and that the buffer holds the whole packet its total length declares.
    pub fn check_len(&self) -> Result<()> {
        self.check_header_len()?;
        if self.buffer.as_ref().len() < self.total_len() as usize {
            return Err(Error::Truncated("IPv4 packet"));
        }
        Ok(())
    }

    /// The version field (4 for IPv4).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// The header length in bytes (IHL x 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// The TOS byte: DSCP (6 bits) and ECN (2 bits).
    pub fn dscp_ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN]
    }

    /// The total length field.
    pub fn total_len(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// The identification field (covered by the RoCEv2 ICRC).
    pub fn ident(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::IDENT)
    }

    /// The Don't Fragment flag.
    pub fn dont_frag(&self) -> bool {
        be::u16(self.buffer.as_ref(), field::FLG_OFF) & 0x4000 != 0
    }

    /// The More Fragments flag.
    pub fn more_frags(&self) -> bool {
        be::u16(self.buffer.as_ref(), field::FLG_OFF) & 0x2000 != 0
    }

    /// The fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::FLG_OFF) & 0x1fff
    }

    /// The time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// The protocol of the payload.
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::PROTOCOL])
    }

    /// The header checksum field.
    pub fn checksum(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// The destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Whether the header checksum is right.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(0, &self.buffer.as_ref()[..self.header_len()])) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload, as long as the total length says (after [`check_len`](Packet::check_len)).
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        &b[self.header_len()..self.total_len() as usize]
    }

    /// The payload bytes present in the buffer, up to the total length: what a cut-off capture
    /// holds (needs only [`check_header_len`](Packet::check_header_len)).
    pub fn payload_present(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = (self.total_len() as usize).min(b.len());
        &b[self.header_len()..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length (a multiple of 4 between 20 and 60).
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets the TOS byte.
    pub fn set_dscp_ecn(&mut self, v: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = v;
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::LENGTH, v)
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::IDENT, v)
    }

    /// Sets the flags and the fragment offset.
    pub fn set_flags_and_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let v = (u16::from(dont_frag) << 14) | (u16::from(more_frags) << 13) | (offset & 0x1fff);
        be::set_u16(self.buffer.as_mut(), field::FLG_OFF, v)
    }

    /// Sets the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    /// Sets the protocol.
    pub fn set_protocol(&mut self, p: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = p.into();
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::CHECKSUM, v)
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets())
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets())
    }

    /// Computes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::checksum(&self.buffer.as_ref()[..hl]);
        self.set_checksum(c)
    }

    /// The payload bytes, writable (up to the total length).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, tl) = (self.header_len(), self.total_len() as usize);
        &mut self.buffer.as_mut()[hl..tl]
    }
}

/// An IPv4 header (without options) as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: IpProtocol,
    /// Payload length in bytes.
    pub payload_len: usize,
    /// DSCP and ECN (the TOS byte).
    pub dscp_ecn: u8,
    /// Identification (covered by the RoCEv2 ICRC).
    pub ident: u16,
    /// Don't Fragment (RoCEv2 senders set it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
}

impl Repr {
    /// Reads a checked packet. Options are skipped; fragments and a version other than 4 are
    /// rejected; the header checksum is not enforced (captures of offloaded sends hold
    /// garbage there): see [`Packet::verify_checksum`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_header_len()?;
        if packet.version() != 4 {
            return Err(Error::Malformed("IPv4 version is not 4"));
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(Error::Malformed("IPv4 fragment"));
        }
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: packet.total_len() as usize - packet.header_len(),
            dscp_ecn: packet.dscp_ecn(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
            ttl: packet.ttl(),
        })
    }

    /// Bytes the header takes (no options).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header (with its checksum) into a buffer of at least [`HEADER_LEN`] bytes.
    /// Fails when the payload is too long for the 16-bit total length.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let total = HEADER_LEN + self.payload_len;
        let total = u16::try_from(total).map_err(|_| Error::Malformed("IPv4 payload over 65515 bytes"))?;
        packet.set_version_and_header_len(HEADER_LEN);
        packet.set_dscp_ecn(self.dscp_ecn);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_flags_and_offset(self.dont_frag, false, 0);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The IPv4 header of golden packet g2 (TOS 0x6a, DF, TTL 64, UDP) and 4 payload bytes.
    static PACKET_BYTES: [u8; 24] = [
        0x45, 0x6a, 0x00, 0x18, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0x00, 0x02, 0x01, 0xc0, 0x00,
        0x02, 0x02, 0xde, 0xad, 0xbe, 0xef,
    ];

    fn bytes() -> [u8; 24] {
        let mut b = PACKET_BYTES;
        let c = checksum::checksum(&b[..20]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        b
    }

    fn repr() -> Repr {
        Repr {
            src_addr: Ipv4Addr::new(192, 0, 2, 1),
            dst_addr: Ipv4Addr::new(192, 0, 2, 2),
            protocol: IpProtocol::Udp,
            payload_len: 4,
            dscp_ecn: 0x6a,
            ident: 0,
            dont_frag: true,
            ttl: 64,
        }
    }

    #[test]
    fn deconstruct() {
        let b = bytes();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.dscp_ecn(), 0x6a);
        assert_eq!(p.total_len(), 24);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), IpProtocol::Udp);
        assert_eq!(p.src_addr(), Ipv4Addr::new(192, 0, 2, 1));
        assert!(p.verify_checksum());
        assert_eq!(p.payload(), &[0xde, 0xad, 0xbe, 0xef]);
    }

    #[test]
    fn construct() {
        let mut b = [0u8; 24];
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_version_and_header_len(20);
        p.set_dscp_ecn(0x6a);
        p.set_total_len(24);
        p.set_flags_and_offset(true, false, 0);
        p.set_ttl(64);
        p.set_protocol(IpProtocol::Udp);
        p.set_src_addr(Ipv4Addr::new(192, 0, 2, 1));
        p.set_dst_addr(Ipv4Addr::new(192, 0, 2, 2));
        p.fill_checksum();
        p.payload_mut().copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(b, bytes());
    }

    #[test]
    fn parse() {
        let b = bytes();
        assert_eq!(Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut b = [0u8; 24];
        repr().emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        b[20..].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(b, bytes());
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut b = bytes();
        b[0] = 0x44; // IHL 4
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed("IPv4 header length below 20 bytes"));
        let b = bytes();
        assert_eq!(Packet::new_checked(&b[..23]).unwrap_err(), Error::Truncated("IPv4 packet"));
        assert!(Packet::new_unchecked(&b[..23]).check_header_len().is_ok());
        assert_eq!(Packet::new_unchecked(&b[..23]).payload_present(), &[0xde, 0xad, 0xbe]);
        let mut b = bytes();
        b[2..4].copy_from_slice(&10u16.to_be_bytes());
        assert!(matches!(Packet::new_checked(&b[..]), Err(Error::Malformed(_))));
    }

    #[test]
    fn rejects_fragments_and_other_versions() {
        let mut b = bytes();
        b[6] = 0x20; // MF
        assert_eq!(Repr::parse(&Packet::new_checked(&b[..]).unwrap()), Err(Error::Malformed("IPv4 fragment")));
        let mut b = bytes();
        b[0] = 0x65;
        assert!(Repr::parse(&Packet::new_checked(&b[..]).unwrap()).is_err());
    }
}
