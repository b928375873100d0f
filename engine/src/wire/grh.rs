//! The InfiniBand Global Route Header (IBTA Vol 1 8.3), carried over Ethernet by RoCEv1
//! (ethertype 0x8915). It is laid out exactly as an IPv6 header, so it reuses that view.

use core::fmt;
use core::net::{Ipv4Addr, Ipv6Addr};

use super::{ipv6, Error, IpProtocol, Result};

/// A 128-bit Global Identifier. RoCE GIDs are IPv6 addresses, or IPv4-mapped ones
/// (`::ffff:a.b.c.d`) for RoCEv2 over IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID of an IPv4 address (RoCEv2 GID type for IPv4).
    pub fn from_ipv4(a: Ipv4Addr) -> Gid {
        Gid(a.to_ipv6_mapped().octets())
    }

    /// The GID as an IPv6 address.
    pub fn to_ipv6(self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address this GID maps, if it is IPv4-mapped.
    pub fn to_ipv4_mapped(self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_ipv6().fmt(f)
    }
}

/// Length of the GRH.
pub const HEADER_LEN: usize = ipv6::HEADER_LEN;

/// IP version field value a GRH carries.
pub const IP_VERSION: u8 = 6;

/// A view of a GRH and what follows it (the IPv6 view, whose addresses are the GIDs).
pub type Packet<T> = ipv6::Packet<T>;

/// A GRH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// PayLen: bytes after the GRH, from the BTH to the ICRC (RoCEv1 has no VCRC).
    pub payload_len: usize,
    /// Next header: 0x1B (IBA transport) for every IB packet (IBTA Vol 1 ch. 8, GRH NxtHdr).
    pub next_header: IpProtocol,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: Gid,
    /// Destination GID.
    pub dgid: Gid,
}

impl Repr {
    /// Reads a GRH whose 40 bytes are present. The IP version must be 6 (IBTA Vol 1 ch. 8, GRH IPVer).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_header_len().map_err(|_| Error::Truncated("GRH"))?;
        if packet.version() != IP_VERSION {
            return Err(Error::Malformed("GRH IP version is not 6"));
        }
        Ok(Repr {
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
            payload_len: packet.payload_len() as usize,
            next_header: packet.next_header(),
            hop_limit: packet.hop_limit(),
            sgid: packet.src_addr().into(),
            dgid: packet.dst_addr().into(),
        })
    }

    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the GRH into a buffer of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let len = u16::try_from(self.payload_len).map_err(|_| Error::Malformed("GRH PayLen over 65535 bytes"))?;
        packet.set_version_tc_flow(IP_VERSION, self.traffic_class, self.flow_label);
        packet.set_payload_len(len);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.sgid.to_ipv6());
        packet.set_dst_addr(self.dgid.to_ipv6());
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The GRH of coverage.pcap frame 21 (RoCEv1 SEND_ONLY): link-local GIDs, next header 0x1b.
    static HEADER_BYTES: [u8; 40] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x1b, 0x40, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xfe,
        0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02,
    ];

    fn repr() -> Repr {
        Repr {
            traffic_class: 0,
            flow_label: 0,
            payload_len: 32,
            next_header: IpProtocol::IbaTransport,
            hop_limit: 64,
            sgid: "fe80::1".parse::<Ipv6Addr>().unwrap().into(),
            dgid: "fe80::2".parse::<Ipv6Addr>().unwrap().into(),
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_unchecked(&HEADER_BYTES[..]);
        assert!(p.check_header_len().is_ok());
        assert_eq!(p.version(), 6);
        assert_eq!(p.next_header(), IpProtocol::IbaTransport);
        assert_eq!(Gid::from(p.src_addr()).to_string(), "fe80::1");
    }

    #[test]
    fn parse() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&HEADER_BYTES[..])).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut b = [0u8; 40];
        repr().emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, HEADER_BYTES);
    }

    #[test]
    fn construct_gid_from_ipv4() {
        let g = Gid::from_ipv4(Ipv4Addr::new(192, 0, 2, 1));
        assert_eq!(g.to_string(), "::ffff:192.0.2.1");
        assert_eq!(g.to_ipv4_mapped(), Some(Ipv4Addr::new(192, 0, 2, 1)));
    }

    #[test]
    fn short_grh() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&HEADER_BYTES[..39])), Err(Error::Truncated("GRH")));
    }
}
