//! The CM RTU message (IBTA Vol 1 12.6.9, table 111; attribute 0x0014): the active side's "ready
//! to use", its answer to the [`super::cm_rep`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, Result};

/// Bytes of RTU private data (IBTA Vol 1 table 111; Linux `IB_CM_RTU_PRIVATE_DATA_SIZE`).
pub const RTU_PRIVATE_DATA_LEN: usize = 224;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    pub(super) const PRIVATE_DATA: Rest = 8..;
}

cm_message_packet!(CmRtuPacket, "CM RTU", "A view of a CM RTU (the MAD data area).");

impl<T: AsRef<[u8]>> CmRtuPacket<T> {
    /// Local Communication ID (the REQ sender's).
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID (the REP sender's).
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// The private data area (224 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..RTU_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmRtuPacket<T> {
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
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..RTU_PRIVATE_DATA_LEN]
    }
}

/// An RTU as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmRtuRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Private data: the whole 224-byte area on parse; on emit at most 224 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmRtuRepr {
    /// Reads an RTU.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmRtuPacket<&T>) -> Result<CmRtuRepr> {
        p.check_len()?;
        Ok(CmRtuRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Writes the RTU over the whole data area. Fails, writing nothing, when the private data is
    /// longer than 224 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmRtuPacket<T>) -> Result<()> {
        check_area(&self.private_data, RTU_PRIVATE_DATA_LEN, "CM RTU private data longer than 224 bytes")?;
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
    use crate::wire::Error;

    // The RTU of nvme-discover2.pcap (../shared/reference/cm/nvme-discover2.cm.hex, frame 3).
    static RTU_BYTES: [u8; 8] = [0x73, 0xad, 0xc2, 0xcc, 0xdc, 0xc7, 0x10, 0x46];

    fn rtu() -> CmRtuRepr {
        CmRtuRepr { local_comm_id: 0x73ad_c2cc, remote_comm_id: 0xdcc7_1046, private_data: vec![0; 224] }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&RTU_BYTES);
        let p = CmRtuPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id()), (0x73ad_c2cc, 0xdcc7_1046));
        assert_eq!(p.private_data().len(), RTU_PRIVATE_DATA_LEN);
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmRtuPacket::new_unchecked(&mut b[..]);
        p.set_local_comm_id(0x73ad_c2cc);
        p.set_remote_comm_id(0xdcc7_1046);
        assert_eq!(b, captured::data_area(&RTU_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&RTU_BYTES);
        assert_eq!(CmRtuRepr::parse(&CmRtuPacket::new_checked(&b[..]).unwrap()), Ok(rtu()));
        assert_eq!(CmRtuPacket::new_checked(&b[..8]), Err(Error::Truncated("CM RTU")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0x33u8; 232];
        let with_data = CmRtuRepr { private_data: vec![9, 8], ..rtu() };
        with_data.emit(&mut CmRtuPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..11], &[0x73, 0xad, 0xc2, 0xcc, 0xdc, 0xc7, 0x10, 0x46, 9, 8, 0]);
        assert!(b[10..].iter().all(|&x| x == 0));
        let too_long = CmRtuRepr { private_data: vec![1; 225], ..rtu() };
        assert!(too_long.emit(&mut CmRtuPacket::new_unchecked(&mut b[..])).is_err());
    }
}
