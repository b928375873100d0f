//! The CM APR message (IBTA Vol 1 12.8.2, table 116; attribute 0x001A): the answer to a
//! [`super::cm_lap`], whether the alternate path was loaded.
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, Result};

/// Bytes of APR private data (IBTA Vol 1 table 116; Linux `IB_CM_APR_PRIVATE_DATA_SIZE`).
pub const APR_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of the APR additional information area.
pub const APR_ADD_INFO_LEN: usize = 72;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    pub(super) const ADD_INFO_LEN: usize = 8;
    pub(super) const STATUS: usize = 9;
    // Bytes 10-11 are reserved.
    pub(super) const ADD_INFO: Field = 12..84;
    pub(super) const PRIVATE_DATA: Rest = 84..;
}

cm_message_packet!(CmAprPacket, "CM APR", "A view of a CM APR (the MAD data area).");

impl<T: AsRef<[u8]>> CmAprPacket<T> {
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Additional information length.
    pub fn add_info_len(&self) -> u8 {
        self.buffer.as_ref()[field::ADD_INFO_LEN]
    }
    /// AP status (IBTA Vol 1 table 117: 0 loaded, 1 invalid comm ID, ...).
    pub fn status(&self) -> u8 {
        self.buffer.as_ref()[field::STATUS]
    }
    /// The additional information area (72 bytes).
    pub fn add_info(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ADD_INFO]
    }
    /// The private data area (148 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..APR_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmAprPacket<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::LOCAL_COMM_ID, v)
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REMOTE_COMM_ID, v)
    }
    /// Sets the additional information length.
    pub fn set_add_info_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::ADD_INFO_LEN] = v;
    }
    /// Sets the AP status.
    pub fn set_status(&mut self, v: u8) {
        self.buffer.as_mut()[field::STATUS] = v;
    }
    /// The additional information area, writable.
    pub fn add_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ADD_INFO]
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..APR_PRIVATE_DATA_LEN]
    }
}

/// An APR as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmAprRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Additional information length, kept as sent: it is not checked against `add_info`.
    pub add_info_len: u8,
    /// AP status.
    pub status: u8,
    /// Additional information: the whole 72-byte area on parse; on emit at most 72 bytes, zero-padded.
    pub add_info: Vec<u8>,
    /// Private data: the whole 148-byte area on parse; on emit at most 148 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmAprRepr {
    /// Reads an APR.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmAprPacket<&T>) -> Result<CmAprRepr> {
        p.check_len()?;
        Ok(CmAprRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            add_info_len: p.add_info_len(),
            status: p.status(),
            add_info: p.add_info().to_vec(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Writes the APR over the whole data area, reserved bytes zero. Fails, writing nothing, when
    /// an area is too long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmAprPacket<T>) -> Result<()> {
        check_area(&self.add_info, APR_ADD_INFO_LEN, "CM APR additional information longer than 72 bytes")?;
        check_area(&self.private_data, APR_PRIVATE_DATA_LEN, "CM APR private data longer than 148 bytes")?;
        p.check_len()?;
        p.buffer.as_mut()[..field::ADD_INFO.start].fill(0);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_add_info_len(self.add_info_len);
        p.set_status(self.status);
        write_area(p.add_info_mut(), &self.add_info);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage};
    use crate::wire::Error;

    // The APR to a LAP of QP 0x000167's connection (comm IDs 0x71ef7529 and 0xc25b8b76): status 0
    // (alternate path loaded), 1 byte of additional information, 1 of private data.
    static APR_BYTES: [u8; 85] = [
        0xc2, 0x5b, 0x8b, 0x76, 0x71, 0xef, 0x75, 0x29, 0x01, 0x00, 0x00, 0x00, 0x5c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa1,
    ];

    fn apr() -> CmAprRepr {
        let mut add_info = vec![0; 72];
        add_info[0] = 0x5c;
        let mut private_data = vec![0; 148];
        private_data[0] = 0xa1;
        CmAprRepr {
            local_comm_id: 0xc25b_8b76,
            remote_comm_id: 0x71ef_7529,
            add_info_len: 1,
            status: 0,
            add_info,
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&APR_BYTES);
        let p = CmAprPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id()), (0xc25b_8b76, 0x71ef_7529));
        assert_eq!((p.add_info_len(), p.status(), p.add_info()[0]), (1, 0, 0x5c));
        assert_eq!((p.private_data().len(), p.private_data()[0]), (148, 0xa1));
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmAprPacket::new_unchecked(&mut b[..]);
        p.set_local_comm_id(0xc25b_8b76);
        p.set_remote_comm_id(0x71ef_7529);
        p.set_add_info_len(1);
        p.set_status(0);
        p.add_info_mut()[0] = 0x5c;
        p.private_data_mut()[0] = 0xa1;
        assert_eq!(b, captured::data_area(&APR_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&APR_BYTES);
        assert_eq!(CmAprRepr::parse(&CmAprPacket::new_checked(&b[..]).unwrap()), Ok(apr()));
        assert_eq!(CmAprPacket::new_checked(&b[..84]), Err(Error::Truncated("CM APR")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0x99u8; 232];
        apr().emit(&mut CmAprPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&APR_BYTES));
        assert!(CmAprRepr { add_info: vec![0; 73], ..apr() }
            .emit(&mut CmAprPacket::new_unchecked(&mut b[..]))
            .is_err());
    }

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(7, CmMessage::Apr(apr()));
    }
}
