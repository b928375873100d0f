//! The CM DREQ message (IBTA Vol 1 12.6.10, table 112; attribute 0x0015): a disconnection
//! request. Its reply is the [`super::cm_drep`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, check_width, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, Result};

/// Bytes of DREQ private data (IBTA Vol 1 table 112; Linux `IB_CM_DREQ_PRIVATE_DATA_SIZE`).
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    pub(super) const REMOTE_QPN: Field = 8..11;
    // Byte 11 is reserved.
    pub(super) const PRIVATE_DATA: Rest = 12..;
}

cm_message_packet!(CmDreqPacket, "CM DREQ", "A view of a CM DREQ (the MAD data area).");

impl<T: AsRef<[u8]>> CmDreqPacket<T> {
    /// Local Communication ID (the sender's).
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Remote QPN/EECN (24 bits): the receiver's QP. Linux drops a DREQ whose value is not its QPN.
    pub fn remote_qpn(&self) -> u32 {
        be::u24(self.buffer.as_ref(), field::REMOTE_QPN)
    }
    /// The private data area (220 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..DREQ_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmDreqPacket<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::LOCAL_COMM_ID, v)
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REMOTE_COMM_ID, v)
    }
    /// Sets the Remote QPN/EECN (low 24 bits of `v`; the reserved byte after it is left alone).
    pub fn set_remote_qpn(&mut self, v: u32) {
        be::set_u24(self.buffer.as_mut(), field::REMOTE_QPN, v)
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..DREQ_PRIVATE_DATA_LEN]
    }
}

/// A DREQ as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmDreqRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits).
    pub remote_qpn: u32,
    /// Private data: the whole 220-byte area on parse; on emit at most 220 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmDreqRepr {
    /// Reads a DREQ.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmDreqPacket<&T>) -> Result<CmDreqRepr> {
        p.check_len()?;
        Ok(CmDreqRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn: p.remote_qpn(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Writes the DREQ over the whole data area, the reserved byte zero. Fails, writing nothing,
    /// when the QPN is wider than 24 bits or the private data longer than 220 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmDreqPacket<T>) -> Result<()> {
        check_width(self.remote_qpn, 24, "CM DREQ remote QPN wider than 24 bits")?;
        check_area(&self.private_data, DREQ_PRIVATE_DATA_LEN, "CM DREQ private data longer than 220 bytes")?;
        p.check_len()?;
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_remote_qpn(self.remote_qpn);
        p.buffer.as_mut()[field::REMOTE_QPN.end] = 0;
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMadRepr, CmMessage};
    use crate::wire::Error;

    // The DREQ of nvme-discover2.pcap (../shared/reference/cm/nvme-discover2.cm.hex, frame 28), sent
    // by the target: remote QPN 0x106, the host's QP.
    static DREQ_BYTES: [u8; 12] = [0xdc, 0xc7, 0x10, 0x46, 0x73, 0xad, 0xc2, 0xcc, 0x00, 0x01, 0x06, 0x00];

    fn dreq() -> CmDreqRepr {
        CmDreqRepr {
            local_comm_id: 0xdcc7_1046,
            remote_comm_id: 0x73ad_c2cc,
            remote_qpn: 0x106,
            private_data: vec![0; 220],
        }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&DREQ_BYTES);
        let p = CmDreqPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id(), p.remote_qpn()), (0xdcc7_1046, 0x73ad_c2cc, 0x106));
        assert_eq!(p.private_data().len(), DREQ_PRIVATE_DATA_LEN);
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmDreqPacket::new_unchecked(&mut b[..]);
        p.set_local_comm_id(0xdcc7_1046);
        p.set_remote_comm_id(0x73ad_c2cc);
        p.set_remote_qpn(0x106);
        assert_eq!(b, captured::data_area(&DREQ_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&DREQ_BYTES);
        assert_eq!(CmDreqRepr::parse(&CmDreqPacket::new_checked(&b[..]).unwrap()), Ok(dreq()));
        assert_eq!(CmDreqPacket::new_checked(&b[..12]), Err(Error::Truncated("CM DREQ")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0x11u8; 232];
        dreq().emit(&mut CmDreqPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&DREQ_BYTES));
        let with_data = CmDreqRepr { private_data: vec![0xaa], ..dreq() };
        with_data.emit(&mut CmDreqPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!((b[11], b[12], b[13]), (0, 0xaa, 0));
        assert!(CmDreqRepr { remote_qpn: 1 << 24, ..dreq() }
            .emit(&mut CmDreqPacket::new_unchecked(&mut b[..]))
            .is_err());
        assert!(CmDreqRepr { private_data: vec![0; 221], ..dreq() }
            .emit(&mut CmDreqPacket::new_unchecked(&mut b[..]))
            .is_err());
    }

    #[test]
    fn captured_dreqs() {
        // (capture, DREQ remote QPN): write/read2/send: the initiator disconnects, naming the REP's
        // QP; nvme: the target disconnects, naming the REQ's QP. The DREP after each swaps the IDs.
        for (name, qpn) in
            [("write.cm.hex", 0x167), ("read2.cm.hex", 0x169), ("send.cm.hex", 0x16a), ("nvme-discover2.cm.hex", 0x106)]
        {
            let mads = captured::mads(name);
            let dreq_mad = CmMadRepr::parse(&mads[3]).unwrap();
            let CmMessage::Dreq(d) = &dreq_mad.msg else { panic!("{name}: not a DREQ") };
            assert_eq!(d.remote_qpn, qpn, "{name}");
            let drep_mad = CmMadRepr::parse(&mads[4]).unwrap();
            let CmMessage::Drep(r) = &drep_mad.msg else { panic!("{name}: not a DREP") };
            assert_eq!((r.local_comm_id, r.remote_comm_id), (d.remote_comm_id, d.local_comm_id), "{name}");
            assert_eq!(drep_mad.tid, dreq_mad.tid, "{name}: a DREP echoes the DREQ's TID");
        }
    }
}
