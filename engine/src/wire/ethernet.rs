//! Ethernet II frames (no FCS), as captured with LINKTYPE_ETHERNET.

use core::fmt;

use super::{be, Field, Rest, Result};

/// A 48-bit Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Address(pub [u8; 6]);

impl Address {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Address = Address([0xff; 6]);

    /// Reads an address from the first six bytes of `data` (which must hold them).
    pub fn from_bytes(data: &[u8]) -> Address {
        let mut a = [0u8; 6];
        a.copy_from_slice(&data[..6]);
        Address(a)
    }

    /// The address as bytes.
    pub const fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

enum_with_unknown! {
    /// The EtherType field.
    pub enum EtherType(u16) {
        /// IPv4 (RoCEv2 over IPv4).
        Ipv4 = 0x0800,
        /// ARP.
        Arp = 0x0806,
        /// An IEEE 802.1Q VLAN tag follows.
        Vlan = 0x8100,
        /// IPv6 (RoCEv2 over IPv6).
        Ipv6 = 0x86dd,
        /// RoCE (v1): a GRH follows directly (IBTA Annex A16).
        Roce = 0x8915,
        /// An IEEE 802.1ad service tag follows.
        QinQ = 0x88a8,
    }
}

mod field {
    use super::{Field, Rest};
    pub(super) const DESTINATION: Field = 0..6;
    pub(super) const SOURCE: Field = 6..12;
    pub(super) const ETHERTYPE: Field = 12..14;
    pub(super) const PAYLOAD: Rest = 14..;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = field::PAYLOAD.start;

header_view!(Frame, HEADER_LEN, "Ethernet header", "the 14-byte header", "A view of an Ethernet II frame.");

impl<T: AsRef<[u8]>> Frame<T> {
    /// The destination address.
    pub fn dst_addr(&self) -> Address {
        Address::from_bytes(&self.buffer.as_ref()[field::DESTINATION])
    }

    /// The source address.
    pub fn src_addr(&self) -> Address {
        Address::from_bytes(&self.buffer.as_ref()[field::SOURCE])
    }

    /// The EtherType.
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(be::u16(self.buffer.as_ref(), field::ETHERTYPE))
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Frame<&'a T> {
    /// The bytes after the header.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Address) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&a.0)
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Address) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&a.0)
    }

    /// Sets the EtherType.
    pub fn set_ethertype(&mut self, t: EtherType) {
        be::set_u16(self.buffer.as_mut(), field::ETHERTYPE, t.into())
    }

    /// The bytes after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

/// An Ethernet II header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source MAC address.
    pub src_addr: Address,
    /// Destination MAC address.
    pub dst_addr: Address,
    /// What the payload is.
    pub ethertype: EtherType,
}

impl Repr {
    /// Reads the header of a checked frame.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&T>) -> Result<Repr> {
        frame.check_len()?;
        Ok(Repr { src_addr: frame.src_addr(), dst_addr: frame.dst_addr(), ethertype: frame.ethertype() })
    }

    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into a frame of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) {
        frame.set_src_addr(self.src_addr);
        frame.set_dst_addr(self.dst_addr);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::Error;

    static FRAME_BYTES: [u8; 18] =
        [0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0xaa, 0xbb, 0xcc, 0xdd];

    fn repr() -> Repr {
        Repr {
            dst_addr: Address([2, 0, 0, 0, 0, 2]),
            src_addr: Address([2, 0, 0, 0, 0, 1]),
            ethertype: EtherType::Ipv4,
        }
    }

    #[test]
    fn deconstruct() {
        let f = Frame::new_checked(&FRAME_BYTES[..]).unwrap();
        assert_eq!(f.dst_addr(), Address([2, 0, 0, 0, 0, 2]));
        assert_eq!(f.src_addr().to_string(), "02:00:00:00:00:01");
        assert_eq!(f.ethertype(), EtherType::Ipv4);
        assert_eq!(f.payload(), &[0xaa, 0xbb, 0xcc, 0xdd]);
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 18];
        let mut f = Frame::new_unchecked(&mut buf[..]);
        f.set_dst_addr(Address([2, 0, 0, 0, 0, 2]));
        f.set_src_addr(Address([2, 0, 0, 0, 0, 1]));
        f.set_ethertype(EtherType::Ipv4);
        f.payload_mut().copy_from_slice(&[0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(buf, FRAME_BYTES);
    }

    #[test]
    fn parse() {
        let f = Frame::new_checked(&FRAME_BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&f).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut buf = FRAME_BYTES;
        buf[..14].fill(0);
        repr().emit(&mut Frame::new_unchecked(&mut buf[..]));
        assert_eq!(buf, FRAME_BYTES);
    }

    #[test]
    fn unknown_ethertype_round_trips() {
        assert_eq!(EtherType::from(0x1234), EtherType::Unknown(0x1234));
        assert_eq!(u16::from(EtherType::Unknown(0x1234)), 0x1234);
        assert_eq!(u16::from(EtherType::Roce), 0x8915);
    }

    #[test]
    fn short_buffer_is_an_error() {
        assert_eq!(Frame::new_checked(&FRAME_BYTES[..13]), Err(Error::Truncated("Ethernet header")));
    }
}
