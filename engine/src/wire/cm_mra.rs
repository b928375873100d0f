//! The CM MRA message (IBTA Vol 1 12.6.6, table 107; attribute 0x0011): a "message received, more
//! time needed".
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, check_width, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, bits, Result};

/// Bytes of MRA private data (IBTA Vol 1 table 107; Linux `IB_CM_MRA_PRIVATE_DATA_SIZE`).
pub const MRA_PRIVATE_DATA_LEN: usize = 222;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    /// Message MRAed (2 bits), reserved (6).
    pub(super) const MSG_MRAED: usize = 8;
    /// Service timeout (5 bits), reserved (3).
    pub(super) const SERVICE_TIMEOUT: usize = 9;
    pub(super) const PRIVATE_DATA: Rest = 10..;
}

cm_message_packet!(CmMraPacket, "CM MRA", "A view of a CM MRA (the MAD data area).");

impl<T: AsRef<[u8]>> CmMraPacket<T> {
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Message MRAed (2 bits: 0 REQ, 1 REP, 2 LAP).
    pub fn msg_mraed(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::MSG_MRAED, 0, 2)
    }
    /// Service timeout (5 bits: 4.096 us * 2^value).
    pub fn service_timeout(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::SERVICE_TIMEOUT, 0, 5)
    }
    /// The private data area (222 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..MRA_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmMraPacket<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::LOCAL_COMM_ID, v)
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REMOTE_COMM_ID, v)
    }
    /// Sets message MRAed (low 2 bits of `v`).
    pub fn set_msg_mraed(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::MSG_MRAED, 0, 2, v)
    }
    /// Sets the service timeout (low 5 bits of `v`).
    pub fn set_service_timeout(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::SERVICE_TIMEOUT, 0, 5, v)
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..MRA_PRIVATE_DATA_LEN]
    }
}

/// An MRA as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmMraRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message MRAed (2 bits).
    pub msg_mraed: u8,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data: the whole 222-byte area on parse; on emit at most 222 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmMraRepr {
    /// Reads an MRA.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmMraPacket<&T>) -> Result<CmMraRepr> {
        p.check_len()?;
        Ok(CmMraRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            msg_mraed: p.msg_mraed(),
            service_timeout: p.service_timeout(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Fails when a value does not fit its field or the private data is longer than 222 bytes.
    pub fn check(&self) -> Result<()> {
        check_width(self.msg_mraed, 2, "CM MRA message MRAed wider than 2 bits")?;
        check_width(self.service_timeout, 5, "CM MRA service timeout wider than 5 bits")?;
        check_area(&self.private_data, MRA_PRIVATE_DATA_LEN, "CM MRA private data longer than 222 bytes")
    }
    /// Writes the MRA over the whole data area, reserved bits zero. Fails, writing nothing, when
    /// [`CmMraRepr::check`] does.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmMraPacket<T>) -> Result<()> {
        self.check()?;
        p.check_len()?;
        p.buffer.as_mut()[..field::PRIVATE_DATA.start].fill(0);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_msg_mraed(self.msg_mraed);
        p.set_service_timeout(self.service_timeout);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage, CM_MSG_REP};
    use crate::wire::Error;

    // An MRA of a REP (msg 1) with service timeout 24 (Linux's IB_CM_MRA_FLAG_DELAY | 24); one
    // byte of private data to see the area.
    static MRA_BYTES: [u8; 12] = [0xdc, 0xc7, 0x10, 0x46, 0x73, 0xad, 0xc2, 0xcc, 0x40, 0xc0, 0x5a, 0x00];

    fn mra() -> CmMraRepr {
        let mut private_data = vec![0; 222];
        private_data[0] = 0x5a;
        CmMraRepr {
            local_comm_id: 0xdcc7_1046,
            remote_comm_id: 0x73ad_c2cc,
            msg_mraed: CM_MSG_REP,
            service_timeout: 24,
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&MRA_BYTES);
        let p = CmMraPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id()), (0xdcc7_1046, 0x73ad_c2cc));
        assert_eq!((p.msg_mraed(), p.service_timeout()), (1, 24));
        assert_eq!((p.private_data().len(), p.private_data()[0]), (222, 0x5a));
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmMraPacket::new_unchecked(&mut b[..]);
        p.set_local_comm_id(0xdcc7_1046);
        p.set_remote_comm_id(0x73ad_c2cc);
        p.set_msg_mraed(1);
        p.set_service_timeout(24);
        p.private_data_mut()[0] = 0x5a;
        assert_eq!(b, captured::data_area(&MRA_BYTES));
    }

    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = vec![0xffu8; 232];
        let mut p = CmMraPacket::new_unchecked(&mut b[..]);
        p.set_msg_mraed(0);
        p.set_service_timeout(0);
        assert_eq!((b[8], b[9]), (0x3f, 0x07));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&MRA_BYTES);
        assert_eq!(CmMraRepr::parse(&CmMraPacket::new_checked(&b[..]).unwrap()), Ok(mra()));
        assert_eq!(CmMraPacket::new_checked(&b[..10]), Err(Error::Truncated("CM MRA")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0xeeu8; 232];
        mra().emit(&mut CmMraPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&MRA_BYTES));
        let bad = CmMraRepr { service_timeout: 32, ..mra() };
        assert!(bad.emit(&mut CmMraPacket::new_unchecked(&mut b[..])).is_err());
    }

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(0x0000_000b_2975_ef71, CmMessage::Mra(mra()));
    }
}
