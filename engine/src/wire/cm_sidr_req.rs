//! The CM SIDR_REQ message (IBTA Vol 1 12.11, table 119; attribute 0x0017): service ID
//! resolution, which asks for the QPN and Q_Key of a service for a UD client; the answer is the
//! [`super::cm_sidr_rep`]. rdma_cm uses it for UD port spaces; the private data opens with a
//! [`super::cma_hdr`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, Result};

/// Bytes of SIDR_REQ private data (IBTA Vol 1 table 119; Linux `IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE`).
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;

mod field {
    use super::super::{Field, Rest};
    pub(super) const REQUEST_ID: Field = 0..4;
    pub(super) const PKEY: Field = 4..6;
    // Bytes 6-7 are reserved.
    pub(super) const SERVICE_ID: Field = 8..16;
    pub(super) const PRIVATE_DATA: Rest = 16..;
}

cm_message_packet!(CmSidrReqPacket, "CM SIDR_REQ", "A view of a CM SIDR_REQ (the MAD data area).");

impl<T: AsRef<[u8]>> CmSidrReqPacket<T> {
    /// Request ID.
    pub fn request_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REQUEST_ID)
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::PKEY)
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::SERVICE_ID)
    }
    /// The private data area (216 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..SIDR_REQ_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmSidrReqPacket<T> {
    /// Sets the Request ID.
    pub fn set_request_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REQUEST_ID, v)
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::PKEY, v)
    }
    /// Sets the Service ID.
    pub fn set_service_id(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::SERVICE_ID, v)
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..SIDR_REQ_PRIVATE_DATA_LEN]
    }
}

/// A SIDR_REQ as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmSidrReqRepr {
    /// Request ID (Linux: the sender's local ID).
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data: the whole 216-byte area on parse; on emit at most 216 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmSidrReqRepr {
    /// Reads a SIDR_REQ.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmSidrReqPacket<&T>) -> Result<CmSidrReqRepr> {
        p.check_len()?;
        Ok(CmSidrReqRepr {
            request_id: p.request_id(),
            pkey: p.pkey(),
            service_id: p.service_id(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Writes the SIDR_REQ over the whole data area, reserved bytes zero. Fails, writing nothing,
    /// when the private data is longer than 216 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmSidrReqPacket<T>) -> Result<()> {
        check_area(&self.private_data, SIDR_REQ_PRIVATE_DATA_LEN, "CM SIDR_REQ private data longer than 216 bytes")?;
        p.check_len()?;
        p.buffer.as_mut()[..field::PRIVATE_DATA.start].fill(0);
        p.set_request_id(self.request_id);
        p.set_pkey(self.pkey);
        p.set_service_id(self.service_id);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::captured;
    use crate::wire::cma_hdr::{CmaHdrPacket, CmaHdrRepr};
    use crate::wire::Error;
    use core::net::{IpAddr, Ipv4Addr};

    // A SIDR_REQ as udaddy's client sends it (Linux cm.c cm_format_sidr_req): request ID, P_Key
    // 0xFFFF, service ID RDMA_PS_UDP (0x0111) port 7174, then a cma_hdr 192.0.2.1:40000 -> 192.0.2.2.
    static SIDR_REQ_BYTES: [u8; 52] = [
        0x12, 0x34, 0x56, 0x78, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x1c, 0x06, 0x00, 0x40,
        0x9c, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 0, 2, 2,
    ];

    fn sidr_req() -> CmSidrReqRepr {
        CmSidrReqRepr {
            request_id: 0x1234_5678,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_1c06,
            private_data: captured::data_area(&SIDR_REQ_BYTES)[16..].to_vec(),
        }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&SIDR_REQ_BYTES);
        let p = CmSidrReqPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.request_id(), p.pkey(), p.service_id()), (0x1234_5678, 0xffff, 0x0111_1c06));
        assert_eq!(p.private_data().len(), SIDR_REQ_PRIVATE_DATA_LEN);
        let hdr = CmaHdrRepr::parse(&CmaHdrPacket::new_checked(p.private_data()).unwrap()).unwrap();
        assert_eq!((hdr.port, hdr.src), (40000, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmSidrReqPacket::new_unchecked(&mut b[..]);
        p.set_request_id(0x1234_5678);
        p.set_pkey(0xffff);
        p.set_service_id(0x0111_1c06);
        p.private_data_mut()[..36].copy_from_slice(&SIDR_REQ_BYTES[16..]);
        assert_eq!(b, captured::data_area(&SIDR_REQ_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&SIDR_REQ_BYTES);
        assert_eq!(CmSidrReqRepr::parse(&CmSidrReqPacket::new_checked(&b[..]).unwrap()), Ok(sidr_req()));
        assert_eq!(CmSidrReqPacket::new_checked(&b[..52]), Err(Error::Truncated("CM SIDR_REQ")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0xcdu8; 232];
        sidr_req().emit(&mut CmSidrReqPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&SIDR_REQ_BYTES));
        let too_long = CmSidrReqRepr { private_data: vec![0; 217], ..sidr_req() };
        assert!(too_long.emit(&mut CmSidrReqPacket::new_unchecked(&mut b[..])).is_err());
    }
}
