//! The IP CM header `cma_hdr` that opens the private data of an rdma_cm REQ or SIDR_REQ over IP
//! (IBTA Vol 1 Annex A11, "RDMA IP CM Service"; Linux `drivers/infiniband/core/cma.c`,
//! `struct cma_hdr`): 36 bytes.
//!
//! | byte | field |
//! |---|---|
//! | 0 | CM version: 0 (major and minor nibbles) |
//! | 1 | IP version in the high nibble (4 or 6), low nibble reserved |
//! | 2-3 | the active side's source port |
//! | 4-19 | source address |
//! | 20-35 | destination address |
//!
//! An IPv4 address is zero-padded (12 zero bytes, then the 4 address bytes), not `::ffff:`-mapped
//! as the GIDs are (checked against the hardware captures in ../shared/reference/cm/).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Error, Result};

/// Bytes of a `cma_hdr`.
pub const CMA_HDR_LEN: usize = 36;
/// The only CM version a receiver accepts (Linux `CMA_VERSION`; `cma.c` rejects others).
pub const CMA_VERSION: u8 = 0;

/// Offset of the IP version byte.
const IP_VERSION: usize = 1;

header_view!(
    CmaHdrPacket,
    CMA_HDR_LEN,
    "cma_hdr",
    "the whole 36-byte header",
    "A view of a `cma_hdr` (the start of the private data)."
);

cm_fields! {
    impl CmaHdrPacket {
        /// The CM version byte (0).
        cma_version / set_cma_version: u8(0);
        // Byte 1, the IP version: below.
        /// The active side's source port.
        port / set_port: u16(2..4);
        /// The 16 source address bytes.
        src_addr / set_src_addr: gid(4..20);
        /// The 16 destination address bytes.
        dst_addr / set_dst_addr: gid(20..36);
    }
}

impl<T: AsRef<[u8]>> CmaHdrPacket<T> {
    /// The IP version (the high nibble of byte 1).
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[IP_VERSION] >> 4
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmaHdrPacket<T> {
    /// Sets the IP version (low 4 bits of `v`, into the high nibble; the low nibble becomes 0).
    pub fn set_ip_version(&mut self, v: u8) {
        self.buffer.as_mut()[IP_VERSION] = (v & 0xf) << 4;
    }
}

/// A `cma_hdr` as values. Both addresses have the same family: the IP version says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdrRepr {
    /// The active side's source port.
    pub port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The passive side's address.
    pub dst: IpAddr,
}

impl Default for CmaHdrRepr {
    fn default() -> CmaHdrRepr {
        CmaHdrRepr { port: 0, src: Ipv4Addr::UNSPECIFIED.into(), dst: Ipv4Addr::UNSPECIFIED.into() }
    }
}

impl CmaHdrRepr {
    /// Bytes of the header.
    pub const LEN: usize = CMA_HDR_LEN;

    /// Reads a `cma_hdr`. Rejects a CM version other than 0 and an IP version other than 4 or 6,
    /// as Linux does (`cma.c`, `cma_get_ip_ver` / `cma_save_ip_info`); for IPv4, the 12 bytes
    /// before the address are not looked at (Linux reads only the last 4).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmaHdrPacket<&T>) -> Result<CmaHdrRepr> {
        p.check_len()?;
        if p.cma_version() != CMA_VERSION {
            return Err(Error::Malformed("cma_hdr version is not 0"));
        }
        let (src, dst) = match p.ip_version() {
            4 => (IpAddr::V4(v4(p.src_addr())), IpAddr::V4(v4(p.dst_addr()))),
            6 => (IpAddr::V6(Ipv6Addr::from(p.src_addr())), IpAddr::V6(Ipv6Addr::from(p.dst_addr()))),
            _ => return Err(Error::Malformed("cma_hdr IP version is not 4 or 6")),
        };
        Ok(CmaHdrRepr { port: p.port(), src, dst })
    }

    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        CMA_HDR_LEN
    }

    /// Writes the header into the first 36 bytes. Fails, writing nothing, when the two addresses
    /// are of different families or the buffer is short.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmaHdrPacket<T>) -> Result<()> {
        let (version, src, dst) = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4, padded(s), padded(d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6, s.octets(), d.octets()),
            _ => return Err(Error::Malformed("cma_hdr addresses of different families")),
        };
        p.check_len()?;
        p.set_cma_version(CMA_VERSION);
        p.set_ip_version(version);
        p.set_port(self.port);
        p.set_src_addr(src);
        p.set_dst_addr(dst);
        Ok(())
    }
}

fn v4(a: [u8; 16]) -> Ipv4Addr {
    Ipv4Addr::new(a[12], a[13], a[14], a[15])
}

fn padded(a: Ipv4Addr) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[12..].copy_from_slice(&a.octets());
    b
}

#[cfg(test)]
mod test {
    use super::*;

    // The cma_hdr of the write.pcap REQ (../shared/reference/cm/write.cm.hex, MAD bytes 164-199).
    static HEADER_BYTES: [u8; 36] = [
        0x00, 0x40, 0xc6, 0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xac, 0x11, 0xf2, 0x2f, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0xac, 0x11, 0xf2, 0x38,
    ];

    fn repr() -> CmaHdrRepr {
        CmaHdrRepr {
            port: 50775,
            src: IpAddr::V4(Ipv4Addr::new(172, 17, 242, 47)),
            dst: IpAddr::V4(Ipv4Addr::new(172, 17, 242, 56)),
        }
    }

    #[test]
    fn deconstruct() {
        let p = CmaHdrPacket::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!((p.cma_version(), p.ip_version(), p.port()), (0, 4, 0xc657));
        assert_eq!(&p.src_addr()[12..], &[172, 17, 242, 47]);
        assert_eq!(&p.dst_addr()[..12], &[0; 12], "zero-padded, not ::ffff:-mapped");
    }
    #[test]
    fn construct() {
        let mut b = [0u8; 36];
        let mut p = CmaHdrPacket::new_unchecked(&mut b[..]);
        p.set_cma_version(0);
        p.set_ip_version(4);
        p.set_port(50775);
        p.set_src_addr(padded(Ipv4Addr::new(172, 17, 242, 47)));
        p.set_dst_addr(padded(Ipv4Addr::new(172, 17, 242, 56)));
        assert_eq!(b, HEADER_BYTES);
    }
    #[test]
    fn parse() {
        assert_eq!(CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&HEADER_BYTES[..]).unwrap()), Ok(repr()));
        assert_eq!(CmaHdrPacket::new_checked(&HEADER_BYTES[..35]), Err(Error::Truncated("cma_hdr")));
        let mut b = HEADER_BYTES;
        b[0] = 0x10;
        assert_eq!(
            CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&b[..]).unwrap()),
            Err(Error::Malformed("cma_hdr version is not 0"))
        );
        for bad_ip_version in [0x00, 0x50, 0xf0] {
            let mut b = HEADER_BYTES;
            b[1] = bad_ip_version;
            assert!(CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&b[..]).unwrap()).is_err());
        }
        let mut b = HEADER_BYTES;
        b[1] = 0x60;
        let v6 = CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(v6.src, IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0xac11, 0xf22f)));
    }
    #[test]
    fn emit() {
        let mut b = [0xffu8; 36];
        repr().emit(&mut CmaHdrPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, HEADER_BYTES);
        let v6 = CmaHdrRepr { port: 1, src: Ipv6Addr::LOCALHOST.into(), dst: "fe80::1".parse().unwrap() };
        v6.emit(&mut CmaHdrPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!((b[1], b[19], b[20], b[35]), (0x60, 1, 0xfe, 1));
        assert_eq!(CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&b[..]).unwrap()), Ok(v6));
        let mixed = CmaHdrRepr { dst: Ipv6Addr::LOCALHOST.into(), ..repr() };
        assert!(mixed.emit(&mut CmaHdrPacket::new_unchecked(&mut b[..])).is_err());
    }
}
