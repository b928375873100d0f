//! UDP headers (RFC 768). RoCEv2 runs on destination port 4791 (IBTA Annex A17.2.3).

use core::net::{Ipv4Addr, Ipv6Addr};

use super::{be, checksum, Error, Field, IpProtocol, Result};

/// The IANA-assigned RoCEv2 destination port.
pub const ROCE_V2_PORT: u16 = 4791;

mod field {
    use super::Field;
    pub(super) const SRC_PORT: Field = 0..2;
    pub(super) const DST_PORT: Field = 2..4;
    pub(super) const LENGTH: Field = 4..6;
    pub(super) const CHECKSUM: Field = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;

packet_view!(Packet, "A view of a UDP datagram.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the header is present and its length field is at least 8 (enough for every
    /// header field, not for the payload).
    pub fn check_header_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated("UDP header"));
        }
        if (self.len() as usize) < HEADER_LEN {
            return Err(Error::Malformed("UDP length below 8"));
        }
        Ok(())
    }

    /// Checks the header and that the buffer holds the whole datagram its length declares.
    pub fn check_len(&self) -> Result<()> {
        self.check_header_len()?;
        if self.buffer.as_ref().len() < self.len() as usize {
            return Err(Error::Truncated("UDP datagram"));
        }
        Ok(())
    }

    /// The source port.
    pub fn src_port(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    /// The destination port.
    pub fn dst_port(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::DST_PORT)
    }

    /// The length field (header and payload).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// The checksum field (0: none, allowed over IPv4 only).
    pub fn checksum(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    fn pseudo_sum(&self, src: &[u8], dst: &[u8]) -> u32 {
        let mut acc = checksum::sum(0, src);
        acc = checksum::sum(acc, dst);
        acc += u32::from(u8::from(IpProtocol::Udp));
        acc += u32::from(self.len());
        checksum::sum(acc, &self.buffer.as_ref()[..self.len() as usize])
    }

    /// Whether the checksum is right over IPv4 (a zero checksum means "none" and passes).
    pub fn verify_checksum_v4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        self.checksum() == 0 || checksum::fold(self.pseudo_sum(&src.octets(), &dst.octets())) == 0xffff
    }

    /// Whether the checksum is right over IPv6 (where zero is not allowed, RFC 8200 8.1).
    pub fn verify_checksum_v6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        self.checksum() != 0 && checksum::fold(self.pseudo_sum(&src.octets(), &dst.octets())) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload, as long as the length field says (after [`check_len`](Packet::check_len)).
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.len() as usize]
    }

    /// The payload bytes present, up to the declared length (needs only
    /// [`check_header_len`](Packet::check_header_len)).
    pub fn payload_present(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = (self.len() as usize).min(b.len());
        &b[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::SRC_PORT, v)
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::DST_PORT, v)
    }

    /// Sets the length field.
    pub fn set_len(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::LENGTH, v)
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::CHECKSUM, v)
    }

    fn fill(&mut self, src: &[u8], dst: &[u8]) {
        self.set_checksum(0);
        let c = !checksum::fold(self.pseudo_sum(src, dst));
        // RFC 768: a computed zero is sent as all ones.
        self.set_checksum(if c == 0 { 0xffff } else { c })
    }

    /// Computes the checksum over the IPv4 pseudo-header and the whole datagram (write the
    /// payload first).
    pub fn fill_checksum_v4(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.fill(&src.octets(), &dst.octets())
    }

    /// Computes the checksum over the IPv6 pseudo-header and the whole datagram.
    pub fn fill_checksum_v6(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.fill(&src.octets(), &dst.octets())
    }

    /// The payload bytes, writable (up to the length field).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.len() as usize;
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// A UDP header as values. The checksum is not part of it: emit writes zero, and the caller
/// fills it with `fill_checksum_v4/v6` once the payload is in place, if it wants one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source port (RoCEv2: flow entropy).
    pub src_port: u16,
    /// Destination port (RoCEv2: 4791).
    pub dst_port: u16,
    /// Payload length in bytes.
    pub payload_len: usize,
}

impl Repr {
    /// Reads a datagram whose header is present.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_header_len()?;
        Ok(Repr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: packet.len() as usize - HEADER_LEN,
        })
    }

    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header (checksum zero); fails when the payload is too long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let len = u16::try_from(HEADER_LEN + self.payload_len)
            .map_err(|_| Error::Malformed("UDP payload over 65527 bytes"))?;
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len);
        packet.set_checksum(0);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    static PACKET_BYTES: [u8; 12] = [0xc0, 0x00, 0x12, 0xb7, 0x00, 0x0c, 0x00, 0x00, 0xaa, 0xbb, 0xcc, 0xdd];

    fn repr() -> Repr {
        Repr { src_port: 49152, dst_port: ROCE_V2_PORT, payload_len: 4 }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&PACKET_BYTES[..]).unwrap();
        assert_eq!(p.src_port(), 49152);
        assert_eq!(p.dst_port(), 4791);
        assert_eq!(p.len(), 12);
        assert_eq!(p.checksum(), 0);
        assert_eq!(p.payload(), &[0xaa, 0xbb, 0xcc, 0xdd]);
    }

    #[test]
    fn construct() {
        let mut b = [0u8; 12];
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_src_port(49152);
        p.set_dst_port(4791);
        p.set_len(12);
        p.set_checksum(0);
        p.payload_mut().copy_from_slice(&[0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(b, PACKET_BYTES);
    }

    #[test]
    fn parse() {
        assert_eq!(Repr::parse(&Packet::new_checked(&PACKET_BYTES[..]).unwrap()).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut b = [0u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        b[8..].copy_from_slice(&[0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(b, PACKET_BYTES);
    }

    #[test]
    fn checksums_verify() {
        let (s4, d4) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut b = PACKET_BYTES;
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.fill_checksum_v4(s4, d4);
        assert_ne!(p.checksum(), 0);
        assert!(p.verify_checksum_v4(s4, d4));
        assert!(!p.verify_checksum_v4(s4, Ipv4Addr::new(10, 0, 0, 3)));
        let (s6, d6): (Ipv6Addr, Ipv6Addr) = ("::1".parse().unwrap(), "::2".parse().unwrap());
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.fill_checksum_v6(s6, d6);
        assert!(p.verify_checksum_v6(s6, d6));
        p.set_checksum(0);
        assert!(!p.verify_checksum_v6(s6, d6));
    }

    #[test]
    fn bad_lengths() {
        let mut b = PACKET_BYTES;
        b[5] = 7;
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed("UDP length below 8"));
        assert_eq!(Packet::new_checked(&PACKET_BYTES[..11]).unwrap_err(), Error::Truncated("UDP datagram"));
    }
}
