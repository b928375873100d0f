//! The CM REJ message (IBTA Vol 1 12.6.7, table 108; attribute 0x0012): a reject of a REQ or REP.
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, check_width, write_area};
use super::mad::MAD_DATA_LEN;
use super::{be, bits, Result};

/// Bytes of REJ private data (IBTA Vol 1 table 108; Linux `IB_CM_REJ_PRIVATE_DATA_SIZE`).
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of the REJ Additional Rejection Information area.
pub const REJ_ARI_LEN: usize = 72;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    /// Message rejected (2 bits), reserved (6).
    pub(super) const MSG_REJECTED: usize = 8;
    /// Reject info length (7 bits), reserved (1).
    pub(super) const REJECT_INFO_LEN: usize = 9;
    pub(super) const REASON: Field = 10..12;
    pub(super) const ARI: Field = 12..84;
    pub(super) const PRIVATE_DATA: Rest = 84..;
}

cm_message_packet!(CmRejPacket, "CM REJ", "A view of a CM REJ (the MAD data area).");

impl<T: AsRef<[u8]>> CmRejPacket<T> {
    /// Local Communication ID (the rejecter's; 0 when it has none).
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Message rejected (2 bits: 0 REQ, 1 REP, 2 other).
    pub fn msg_rejected(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::MSG_REJECTED, 0, 2)
    }
    /// Reject info length (7 bits): the bytes of ARI that are meaningful.
    pub fn reject_info_len(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::REJECT_INFO_LEN, 0, 7)
    }
    /// Reason (IBTA Vol 1 table 109; 8 invalid service ID, 28 consumer defined, ...).
    pub fn reason(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::REASON)
    }
    /// The Additional Rejection Information area (72 bytes).
    pub fn ari(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ARI]
    }
    /// The private data area (148 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..REJ_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmRejPacket<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::LOCAL_COMM_ID, v)
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REMOTE_COMM_ID, v)
    }
    /// Sets message rejected (low 2 bits of `v`).
    pub fn set_msg_rejected(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::MSG_REJECTED, 0, 2, v)
    }
    /// Sets the reject info length (low 7 bits of `v`).
    pub fn set_reject_info_len(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::REJECT_INFO_LEN, 0, 7, v)
    }
    /// Sets the reason.
    pub fn set_reason(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::REASON, v)
    }
    /// The ARI area, writable.
    pub fn ari_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ARI]
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..REJ_PRIVATE_DATA_LEN]
    }
}

/// A REJ as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmRejRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message rejected (2 bits: [`CM_MSG_REQ`](super::cm::CM_MSG_REQ), [`CM_MSG_REP`](super::cm::CM_MSG_REP),
    /// [`CM_MSG_OTHER`](super::cm::CM_MSG_OTHER)).
    pub msg_rejected: u8,
    /// Reject info length (7 bits), kept as sent: it is not checked against `ari`.
    pub reject_info_len: u8,
    /// Reason.
    pub reason: u16,
    /// ARI: the whole 72-byte area on parse; on emit at most 72 bytes, zero-padded.
    pub ari: Vec<u8>,
    /// Private data: the whole 148-byte area on parse; on emit at most 148 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmRejRepr {
    /// Reads a REJ.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmRejPacket<&T>) -> Result<CmRejRepr> {
        p.check_len()?;
        Ok(CmRejRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            msg_rejected: p.msg_rejected(),
            reject_info_len: p.reject_info_len(),
            reason: p.reason(),
            ari: p.ari().to_vec(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Fails when a value does not fit its field or an area is too long.
    pub fn check(&self) -> Result<()> {
        check_width(self.msg_rejected, 2, "CM REJ message rejected wider than 2 bits")?;
        check_width(self.reject_info_len, 7, "CM REJ reject info length wider than 7 bits")?;
        check_area(&self.ari, REJ_ARI_LEN, "CM REJ ARI longer than 72 bytes")?;
        check_area(&self.private_data, REJ_PRIVATE_DATA_LEN, "CM REJ private data longer than 148 bytes")
    }
    /// Writes the REJ over the whole data area, reserved bits zero. Fails, writing nothing, when
    /// [`CmRejRepr::check`] does.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmRejPacket<T>) -> Result<()> {
        self.check()?;
        p.check_len()?;
        p.buffer.as_mut()[..field::REASON.start].fill(0);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_msg_rejected(self.msg_rejected);
        p.set_reject_info_len(self.reject_info_len);
        p.set_reason(self.reason);
        write_area(p.ari_mut(), &self.ari);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage, CM_MSG_REQ};
    use crate::wire::Error;

    // A REJ as Linux's cm_issue_rej sends it for a REQ nobody listens to (reason 8, invalid service
    // ID; ib_cm.h): no local ID, the REQ's local ID as remote, message rejected 0 (REQ); ARI of 2
    // bytes and 2 bytes of private data to see the areas.
    static REJ_BYTES: [u8; 88] = [
        0x00, 0x00, 0x00, 0x00, 0x71, 0xef, 0x75, 0x29, 0x00, 0x04, 0x00, 0x08, 0xab, 0xcd, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00,
    ];

    fn rej() -> CmRejRepr {
        let mut ari = vec![0; 72];
        ari[..2].copy_from_slice(&[0xab, 0xcd]);
        let mut private_data = vec![0; 148];
        private_data[..2].copy_from_slice(&[0x12, 0x34]);
        CmRejRepr {
            local_comm_id: 0,
            remote_comm_id: 0x71ef_7529,
            msg_rejected: CM_MSG_REQ,
            reject_info_len: 2,
            reason: 8,
            ari,
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&REJ_BYTES);
        let p = CmRejPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id()), (0, 0x71ef_7529));
        assert_eq!((p.msg_rejected(), p.reject_info_len(), p.reason()), (0, 2, 8));
        assert_eq!((p.ari().len(), &p.ari()[..2]), (72, &[0xab, 0xcd][..]));
        assert_eq!((p.private_data().len(), &p.private_data()[..2]), (148, &[0x12, 0x34][..]));
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmRejPacket::new_unchecked(&mut b[..]);
        p.set_remote_comm_id(0x71ef_7529);
        p.set_msg_rejected(0);
        p.set_reject_info_len(2);
        p.set_reason(8);
        p.ari_mut()[..2].copy_from_slice(&[0xab, 0xcd]);
        p.private_data_mut()[..2].copy_from_slice(&[0x12, 0x34]);
        assert_eq!(b, captured::data_area(&REJ_BYTES));
    }

    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = vec![0xffu8; 232];
        let mut p = CmRejPacket::new_unchecked(&mut b[..]);
        p.set_msg_rejected(0);
        p.set_reject_info_len(0);
        assert_eq!((b[8], b[9]), (0x3f, 0x01));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&REJ_BYTES);
        assert_eq!(CmRejRepr::parse(&CmRejPacket::new_checked(&b[..]).unwrap()), Ok(rej()));
        assert_eq!(CmRejPacket::new_checked(&b[..84]), Err(Error::Truncated("CM REJ")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0xeeu8; 232];
        rej().emit(&mut CmRejPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&REJ_BYTES));
        let short = CmRejRepr { ari: vec![0xab, 0xcd], private_data: vec![0x12, 0x34], ..rej() };
        short.emit(&mut CmRejPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&REJ_BYTES), "short areas are zero-padded");
        for bad in [
            CmRejRepr { ari: vec![0; 73], ..rej() },
            CmRejRepr { private_data: vec![0; 149], ..rej() },
            CmRejRepr { reject_info_len: 128, ..rej() },
            CmRejRepr { msg_rejected: 4, ..rej() },
        ] {
            assert!(bad.emit(&mut CmRejPacket::new_unchecked(&mut b[..])).is_err());
        }
    }

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(0x0000_000b_2975_ef71, CmMessage::Rej(rej()));
    }
}
