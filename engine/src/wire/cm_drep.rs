//! The CM DREP message (IBTA Vol 1 12.6.11, table 113; attribute 0x0016): the reply to a
//! [`super::cm_dreq`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, Result};

/// Bytes of DREP private data (IBTA Vol 1 table 113; Linux `IB_CM_DREP_PRIVATE_DATA_SIZE`).
pub const DREP_PRIVATE_DATA_LEN: usize = 224;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    pub(super) const PRIVATE_DATA: Rest = 8..;
}

cm_message_packet!(CmDrepPacket, "CM DREP", "A view of a CM DREP (the MAD data area).");

impl<T: AsRef<[u8]>> CmDrepPacket<T> {
    /// Local Communication ID (the sender's).
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// The private data area (224 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..DREP_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmDrepPacket<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::LOCAL_COMM_ID, v)
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REMOTE_COMM_ID, v)
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..DREP_PRIVATE_DATA_LEN]
    }
}

/// A DREP as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmDrepRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Private data: the whole 224-byte area on parse; on emit at most 224 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmDrepRepr {
    /// Reads a DREP.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmDrepPacket<&T>) -> Result<CmDrepRepr> {
        p.check_len()?;
        Ok(CmDrepRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Writes the DREP over the whole data area. Fails, writing nothing, when the private data is
    /// longer than 224 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmDrepPacket<T>) -> Result<()> {
        check_area(&self.private_data, DREP_PRIVATE_DATA_LEN, "CM DREP private data longer than 224 bytes")?;
        p.check_len()?;
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::captured;

    // The DREP of nvme-discover2.pcap (../shared/reference/cm/nvme-discover2.cm.hex, frame 31): the
    // host's answer to the target's DREQ, the comm IDs swapped.
    static DREP_BYTES: [u8; 8] = [0x73, 0xad, 0xc2, 0xcc, 0xdc, 0xc7, 0x10, 0x46];

    fn drep() -> CmDrepRepr {
        CmDrepRepr { local_comm_id: 0x73ad_c2cc, remote_comm_id: 0xdcc7_1046, private_data: vec![0; 224] }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&DREP_BYTES);
        let p = CmDrepPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id()), (0x73ad_c2cc, 0xdcc7_1046));
        assert_eq!(p.private_data().len(), DREP_PRIVATE_DATA_LEN);
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmDrepPacket::new_unchecked(&mut b[..]);
        p.set_local_comm_id(0x73ad_c2cc);
        p.set_remote_comm_id(0xdcc7_1046);
        assert_eq!(b, captured::data_area(&DREP_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&DREP_BYTES);
        assert_eq!(CmDrepRepr::parse(&CmDrepPacket::new_checked(&b[..]).unwrap()), Ok(drep()));
    }

    #[test]
    fn emit() {
        let mut b = vec![0x11u8; 232];
        drep().emit(&mut CmDrepPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&DREP_BYTES));
        assert!(CmDrepRepr { private_data: vec![0; 225], ..drep() }
            .emit(&mut CmDrepPacket::new_unchecked(&mut b[..]))
            .is_err());
    }
}
