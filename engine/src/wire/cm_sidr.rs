//! The CM SIDR_REQ and SIDR_REP messages (IBTA Vol 1 12.11, tables 119 and 120; attributes
//! 0x0017 and 0x0018): service ID resolution, which gives a UD client the QPN and Q_Key of a
//! service. rdma_cm uses it for UD port spaces; the SIDR_REQ private data opens with a
//! [`super::cma_hdr`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, check_width, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, Result};

/// Bytes of SIDR_REQ private data (IBTA Vol 1 table 119; Linux `IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE`).
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Bytes of SIDR_REP private data (IBTA Vol 1 table 120; Linux `IB_CM_SIDR_REP_PRIVATE_DATA_SIZE`).
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of the SIDR_REP additional information area.
pub const SIDR_REP_ADD_INFO_LEN: usize = 72;

mod field {
    use super::super::{Field, Rest};
    pub(super) const REQUEST_ID: Field = 0..4;

    pub(super) const REQ_PKEY: Field = 4..6;
    // Bytes 6-7 are reserved.
    pub(super) const REQ_SERVICE_ID: Field = 8..16;
    pub(super) const REQ_PRIVATE_DATA: Rest = 16..;

    pub(super) const REP_STATUS: usize = 4;
    pub(super) const REP_ADD_INFO_LEN: usize = 5;
    // Bytes 6-7 are reserved.
    pub(super) const REP_QPN: Field = 8..11;
    // Byte 11 is reserved.
    pub(super) const REP_SERVICE_ID: Field = 12..20;
    pub(super) const REP_QKEY: Field = 20..24;
    pub(super) const REP_ADD_INFO: Field = 24..96;
    pub(super) const REP_PRIVATE_DATA: Rest = 96..;
}

cm_message_packet!(CmSidrReqPacket, "CM SIDR_REQ", "A view of a CM SIDR_REQ (the MAD data area).");
cm_message_packet!(CmSidrRepPacket, "CM SIDR_REP", "A view of a CM SIDR_REP (the MAD data area).");

impl<T: AsRef<[u8]>> CmSidrReqPacket<T> {
    /// Request ID.
    pub fn request_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REQUEST_ID)
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::REQ_PKEY)
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::REQ_SERVICE_ID)
    }
    /// The private data area (216 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::REQ_PRIVATE_DATA][..SIDR_REQ_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmSidrReqPacket<T> {
    /// Sets the Request ID.
    pub fn set_request_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REQUEST_ID, v)
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::REQ_PKEY, v)
    }
    /// Sets the Service ID.
    pub fn set_service_id(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::REQ_SERVICE_ID, v)
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::REQ_PRIVATE_DATA][..SIDR_REQ_PRIVATE_DATA_LEN]
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
        p.buffer.as_mut()[..field::REQ_PRIVATE_DATA.start].fill(0);
        p.set_request_id(self.request_id);
        p.set_pkey(self.pkey);
        p.set_service_id(self.service_id);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

impl<T: AsRef<[u8]>> CmSidrRepPacket<T> {
    /// Request ID (echoed from the SIDR_REQ).
    pub fn request_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REQUEST_ID)
    }
    /// Status (IBTA Vol 1 table 121: 0 valid, 1 service ID not supported, 2 rejected, 3 no QP,
    /// 4 redirect, 5 unsupported version).
    pub fn status(&self) -> u8 {
        self.buffer.as_ref()[field::REP_STATUS]
    }
    /// Additional information length.
    pub fn add_info_len(&self) -> u8 {
        self.buffer.as_ref()[field::REP_ADD_INFO_LEN]
    }
    /// QPN (24 bits).
    pub fn qpn(&self) -> u32 {
        be::u24(self.buffer.as_ref(), field::REP_QPN)
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::REP_SERVICE_ID)
    }
    /// Q_Key.
    pub fn qkey(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REP_QKEY)
    }
    /// The additional information area (72 bytes).
    pub fn add_info(&self) -> &[u8] {
        &self.buffer.as_ref()[field::REP_ADD_INFO]
    }
    /// The private data area (136 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::REP_PRIVATE_DATA][..SIDR_REP_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmSidrRepPacket<T> {
    /// Sets the Request ID.
    pub fn set_request_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REQUEST_ID, v)
    }
    /// Sets the status.
    pub fn set_status(&mut self, v: u8) {
        self.buffer.as_mut()[field::REP_STATUS] = v;
    }
    /// Sets the additional information length.
    pub fn set_add_info_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::REP_ADD_INFO_LEN] = v;
    }
    /// Sets the QPN (low 24 bits of `v`; the reserved byte after it is left alone).
    pub fn set_qpn(&mut self, v: u32) {
        be::set_u24(self.buffer.as_mut(), field::REP_QPN, v)
    }
    /// Sets the Service ID.
    pub fn set_service_id(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::REP_SERVICE_ID, v)
    }
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REP_QKEY, v)
    }
    /// The additional information area, writable.
    pub fn add_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::REP_ADD_INFO]
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::REP_PRIVATE_DATA][..SIDR_REP_PRIVATE_DATA_LEN]
    }
}

/// A SIDR_REP as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmSidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: u8,
    /// Additional information length, kept as sent: it is not checked against `add_info`.
    pub add_info_len: u8,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional information: the whole 72-byte area on parse; on emit at most 72 bytes, zero-padded.
    pub add_info: Vec<u8>,
    /// Private data: the whole 136-byte area on parse; on emit at most 136 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmSidrRepRepr {
    /// Reads a SIDR_REP.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmSidrRepPacket<&T>) -> Result<CmSidrRepRepr> {
        p.check_len()?;
        Ok(CmSidrRepRepr {
            request_id: p.request_id(),
            status: p.status(),
            add_info_len: p.add_info_len(),
            qpn: p.qpn(),
            service_id: p.service_id(),
            qkey: p.qkey(),
            add_info: p.add_info().to_vec(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Fails when the QPN is wider than 24 bits or an area is too long.
    pub fn check(&self) -> Result<()> {
        check_width(self.qpn, 24, "CM SIDR_REP QPN wider than 24 bits")?;
        check_area(&self.add_info, SIDR_REP_ADD_INFO_LEN, "CM SIDR_REP additional information longer than 72 bytes")?;
        check_area(&self.private_data, SIDR_REP_PRIVATE_DATA_LEN, "CM SIDR_REP private data longer than 136 bytes")
    }
    /// Writes the SIDR_REP over the whole data area, reserved bytes zero. Fails, writing nothing,
    /// when [`CmSidrRepRepr::check`] does.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmSidrRepPacket<T>) -> Result<()> {
        self.check()?;
        p.check_len()?;
        p.buffer.as_mut()[..field::REP_ADD_INFO.start].fill(0);
        p.set_request_id(self.request_id);
        p.set_status(self.status);
        p.set_add_info_len(self.add_info_len);
        p.set_qpn(self.qpn);
        p.set_service_id(self.service_id);
        p.set_qkey(self.qkey);
        write_area(p.add_info_mut(), &self.add_info);
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
    // Its SIDR_REP: status 0, QPN 0x000abc, the service ID echoed, Q_Key RDMA_UDP_QKEY 0x01234567;
    // one byte of additional information and of private data to see the areas.
    static SIDR_REP_BYTES: [u8; 98] = [
        0x12, 0x34, 0x56, 0x78, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0a, 0xbc, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11,
        0x1c, 0x06, 0x01, 0x23, 0x45, 0x67, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x77, 0,
    ];

    fn sidr_req() -> CmSidrReqRepr {
        CmSidrReqRepr {
            request_id: 0x1234_5678,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_1c06,
            private_data: captured::data_area(&SIDR_REQ_BYTES)[16..].to_vec(),
        }
    }
    fn sidr_rep() -> CmSidrRepRepr {
        let mut add_info = vec![0; 72];
        add_info[0] = 0xee;
        let mut private_data = vec![0; 136];
        private_data[0] = 0x77;
        CmSidrRepRepr {
            request_id: 0x1234_5678,
            status: 0,
            add_info_len: 1,
            qpn: 0xabc,
            service_id: 0x0000_0000_0111_1c06,
            qkey: 0x0123_4567,
            add_info,
            private_data,
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

        let b = captured::data_area(&SIDR_REP_BYTES);
        let p = CmSidrRepPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.request_id(), p.status(), p.add_info_len()), (0x1234_5678, 0, 1));
        assert_eq!((p.qpn(), p.service_id(), p.qkey()), (0xabc, 0x0111_1c06, 0x0123_4567));
        assert_eq!((p.add_info().len(), p.add_info()[0]), (72, 0xee));
        assert_eq!((p.private_data().len(), p.private_data()[0]), (136, 0x77));
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

        let mut b = vec![0u8; 232];
        let mut p = CmSidrRepPacket::new_unchecked(&mut b[..]);
        p.set_request_id(0x1234_5678);
        p.set_status(0);
        p.set_add_info_len(1);
        p.set_qpn(0xabc);
        p.set_service_id(0x0111_1c06);
        p.set_qkey(0x0123_4567);
        p.add_info_mut()[0] = 0xee;
        p.private_data_mut()[0] = 0x77;
        assert_eq!(b, captured::data_area(&SIDR_REP_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&SIDR_REQ_BYTES);
        assert_eq!(CmSidrReqRepr::parse(&CmSidrReqPacket::new_checked(&b[..]).unwrap()), Ok(sidr_req()));
        assert_eq!(CmSidrReqPacket::new_checked(&b[..52]), Err(Error::Truncated("CM SIDR_REQ")));
        let b = captured::data_area(&SIDR_REP_BYTES);
        assert_eq!(CmSidrRepRepr::parse(&CmSidrRepPacket::new_checked(&b[..]).unwrap()), Ok(sidr_rep()));
        assert_eq!(CmSidrRepPacket::new_checked(&b[..231]), Err(Error::Truncated("CM SIDR_REP")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0xcdu8; 232];
        sidr_req().emit(&mut CmSidrReqPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&SIDR_REQ_BYTES));
        let too_long = CmSidrReqRepr { private_data: vec![0; 217], ..sidr_req() };
        assert!(too_long.emit(&mut CmSidrReqPacket::new_unchecked(&mut b[..])).is_err());

        let mut b = vec![0xcdu8; 232];
        sidr_rep().emit(&mut CmSidrRepPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&SIDR_REP_BYTES));
        for bad in [
            CmSidrRepRepr { qpn: 1 << 24, ..sidr_rep() },
            CmSidrRepRepr { add_info: vec![0; 73], ..sidr_rep() },
            CmSidrRepRepr { private_data: vec![0; 137], ..sidr_rep() },
        ] {
            assert!(bad.emit(&mut CmSidrRepPacket::new_unchecked(&mut b[..])).is_err());
        }
    }
}
