//! The CM SIDR_REP message (IBTA Vol 1 12.11, table 120; attribute 0x0018): the answer to a
//! [`super::cm_sidr_req`], which gives a UD client the QPN and Q_Key of a service.
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, check_width, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, Result};

/// Bytes of SIDR_REP private data (IBTA Vol 1 table 120; Linux `IB_CM_SIDR_REP_PRIVATE_DATA_SIZE`).
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of the SIDR_REP additional information area.
pub const SIDR_REP_ADD_INFO_LEN: usize = 72;

mod field {
    use super::super::{Field, Rest};
    pub(super) const REQUEST_ID: Field = 0..4;
    pub(super) const STATUS: usize = 4;
    pub(super) const ADD_INFO_LEN: usize = 5;
    // Bytes 6-7 are reserved.
    pub(super) const QPN: Field = 8..11;
    // Byte 11 is reserved.
    pub(super) const SERVICE_ID: Field = 12..20;
    pub(super) const QKEY: Field = 20..24;
    pub(super) const ADD_INFO: Field = 24..96;
    pub(super) const PRIVATE_DATA: Rest = 96..;
}

cm_message_packet!(CmSidrRepPacket, "CM SIDR_REP", "A view of a CM SIDR_REP (the MAD data area).");

impl<T: AsRef<[u8]>> CmSidrRepPacket<T> {
    /// Request ID (echoed from the SIDR_REQ).
    pub fn request_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REQUEST_ID)
    }
    /// Status (IBTA Vol 1 table 121: 0 valid, 1 service ID not supported, 2 rejected, 3 no QP,
    /// 4 redirect, 5 unsupported version).
    pub fn status(&self) -> u8 {
        self.buffer.as_ref()[field::STATUS]
    }
    /// Additional information length.
    pub fn add_info_len(&self) -> u8 {
        self.buffer.as_ref()[field::ADD_INFO_LEN]
    }
    /// QPN (24 bits).
    pub fn qpn(&self) -> u32 {
        be::u24(self.buffer.as_ref(), field::QPN)
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::SERVICE_ID)
    }
    /// Q_Key.
    pub fn qkey(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::QKEY)
    }
    /// The additional information area (72 bytes).
    pub fn add_info(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ADD_INFO]
    }
    /// The private data area (136 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..SIDR_REP_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmSidrRepPacket<T> {
    /// Sets the Request ID.
    pub fn set_request_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REQUEST_ID, v)
    }
    /// Sets the status.
    pub fn set_status(&mut self, v: u8) {
        self.buffer.as_mut()[field::STATUS] = v;
    }
    /// Sets the additional information length.
    pub fn set_add_info_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::ADD_INFO_LEN] = v;
    }
    /// Sets the QPN (low 24 bits of `v`; the reserved byte after it is left alone).
    pub fn set_qpn(&mut self, v: u32) {
        be::set_u24(self.buffer.as_mut(), field::QPN, v)
    }
    /// Sets the Service ID.
    pub fn set_service_id(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::SERVICE_ID, v)
    }
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::QKEY, v)
    }
    /// The additional information area, writable.
    pub fn add_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ADD_INFO]
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..SIDR_REP_PRIVATE_DATA_LEN]
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
        p.buffer.as_mut()[..field::ADD_INFO.start].fill(0);
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
    use crate::wire::Error;

    // The SIDR_REP to udaddy's SIDR_REQ (request ID 0x12345678, service ID RDMA_PS_UDP port 7174):
    // status 0, QPN 0x000abc, the service ID echoed, Q_Key RDMA_UDP_QKEY 0x01234567; one byte of
    // additional information and of private data to see the areas.
    static SIDR_REP_BYTES: [u8; 98] = [
        0x12, 0x34, 0x56, 0x78, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0a, 0xbc, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11,
        0x1c, 0x06, 0x01, 0x23, 0x45, 0x67, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x77, 0,
    ];

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
        let b = captured::data_area(&SIDR_REP_BYTES);
        assert_eq!(CmSidrRepRepr::parse(&CmSidrRepPacket::new_checked(&b[..]).unwrap()), Ok(sidr_rep()));
        assert_eq!(CmSidrRepPacket::new_checked(&b[..231]), Err(Error::Truncated("CM SIDR_REP")));
    }

    #[test]
    fn emit() {
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
