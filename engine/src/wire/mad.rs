//! The MAD common header (IBTA Vol 1 13.4.2), the first 24 bytes of every 256-byte management
//! datagram, and the attribute IDs of the Communication Management class (IBTA Vol 1 12.6, table 104).
//!
//! A CM message travels as a MAD of class 0x07, class version 2, method Send, sent by QP1 to QP1
//! (on RoCEv2 a UD SEND_ONLY with DestQP 1). [`super::cm`] reads and writes whole CM MADs.

use super::be;

/// Bytes of a MAD sent on QP0/QP1 (IBTA Vol 1 13.4.1: MADs are exactly 256 bytes).
pub const MAD_LEN: usize = 256;
/// Bytes of the MAD common header (IBTA Vol 1 13.4.2, figure 146).
pub const MAD_HEADER_LEN: usize = 24;
/// Bytes after the common header: the MAD data area every CM message fills (IBTA Vol 1 12.6).
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// Management class of Communication Management (IBTA Vol 1 13.4.4, table 148).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// Class version of the CM class this implementation speaks (IBTA Vol 1 12.6.1; Linux `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;
/// The Send method, the only one the CM class uses (IBTA Vol 1 12.6.1).
pub const MAD_METHOD_SEND: u8 = 0x03;
/// Base version of the MAD format (IBTA Vol 1 13.4.2).
pub const MAD_BASE_VERSION: u8 = 1;

enum_with_unknown! {
    /// The attribute ID of a CM MAD: which message it carries (IBTA Vol 1 12.6, table 104).
    pub enum CmAttr(u16) {
        /// REQ, a connection request.
        Req = 0x10,
        /// MRA, message receipt acknowledgement ("more time needed").
        Mra = 0x11,
        /// REJ, a reject.
        Rej = 0x12,
        /// REP, the reply to a REQ.
        Rep = 0x13,
        /// RTU, ready to use.
        Rtu = 0x14,
        /// DREQ, a disconnection request.
        Dreq = 0x15,
        /// DREP, the reply to a DREQ.
        Drep = 0x16,
        /// SIDR_REQ, a service ID resolution request.
        SidrReq = 0x17,
        /// SIDR_REP, its reply.
        SidrRep = 0x18,
        /// LAP, load alternate path.
        Lap = 0x19,
        /// APR, alternate path response.
        Apr = 0x1a,
    }
}

impl CmAttr {
    /// The attribute's name as Wireshark's InfiniBand dissector shows it ("CM ConnectRequest").
    pub fn name(self) -> &'static str {
        match self {
            CmAttr::Req => "ConnectRequest",
            CmAttr::Mra => "MsgRcptAck",
            CmAttr::Rej => "ConnectReject",
            CmAttr::Rep => "ConnectReply",
            CmAttr::Rtu => "ReadyToUse",
            CmAttr::Dreq => "DisconnectRequest",
            CmAttr::Drep => "DisconnectReply",
            CmAttr::SidrReq => "ServiceIDResReq",
            CmAttr::SidrRep => "ServiceIDResReqResp",
            CmAttr::Lap => "LoadAlternatePath",
            CmAttr::Apr => "AlternatePathResponse",
            CmAttr::Unknown(_) => "Unknown",
        }
    }
}

mod field {
    use super::super::Field;
    pub(super) const ATTR_ID: Field = 16..18;
    // Bytes 18-19 are reserved.
    pub(super) const RESERVED: Field = 18..20;
}

cm_header! {
    view MadPacket(MAD_HEADER_LEN, "MAD header", "the 24-byte common header",
        "A view of a MAD: the common header and the data area after it.");
    /// The MAD common header as values. The reserved 16 bits after the attribute ID are not kept.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    repr MadRepr;
    fields {
        /// BaseVersion (1).
        base_version / set_base_version: u8(0);
        /// MgmtClass (0x07 for CM).
        mgmt_class / set_mgmt_class: u8(1);
        /// ClassVersion (2 for CM).
        class_version / set_class_version: u8(2);
        /// The method byte: the R (response) bit on top of the 7-bit method (0x03 Send for CM).
        method / set_method: u8(3);
        /// Status.
        status / set_status: u16(4..6);
        /// ClassSpecific.
        class_specific / set_class_specific: u16(6..8);
        /// TransactionID.
        tid / set_tid: u64(8..16);
        /// AttributeID.
        attr_id / set_attr_id: by_hand(u16);
        /// AttributeModifier.
        attr_mod / set_attr_mod: u32(20..24);
    }
}

impl<T: AsRef<[u8]>> MadPacket<T> {
    /// AttributeID (bytes 16-17).
    pub fn attr_id(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::ATTR_ID)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> MadPacket<&'a T> {
    /// The bytes after the common header (for a CM MAD, the message; see [`MAD_DATA_LEN`]).
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[MAD_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MadPacket<T> {
    /// Sets AttributeID (and zeroes the reserved 16 bits after it).
    pub fn set_attr_id(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::ATTR_ID, v);
        be::set_u16(self.buffer.as_mut(), field::RESERVED, 0);
    }
    /// The bytes after the common header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[MAD_HEADER_LEN..]
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::captured;
    use crate::wire::Error;

    // The MAD header of the REQ in write.pcap (../shared/reference/cm/write.cm.hex, frame 1).
    static HEADER_BYTES: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0b, 0x29, 0x75, 0xef, 0x71, 0x00, 0x10,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    const REPR: MadRepr = MadRepr {
        base_version: 1,
        mgmt_class: MGMT_CLASS_CM,
        class_version: 2,
        method: MAD_METHOD_SEND,
        status: 0,
        class_specific: 0,
        tid: 0x0000_000b_2975_ef71,
        attr_id: 0x0010,
        attr_mod: 0,
    };

    captured::header_tests!("MAD header", HEADER_BYTES, REPR, 0xa5);

    #[test]
    fn a_req_and_no_payload() {
        let p = MadPacket::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(CmAttr::from(p.attr_id()), CmAttr::Req);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn setters_zero_the_reserved_bytes() {
        let mut b = [0xffu8; 24];
        let mut p = MadPacket::new_unchecked(&mut b[..]);
        p.set_base_version(1);
        p.set_mgmt_class(7);
        p.set_class_version(2);
        p.set_method(3);
        p.set_status(0);
        p.set_class_specific(0);
        p.set_tid(0x0000_000b_2975_ef71);
        p.set_attr_id(0x10);
        p.set_attr_mod(0);
        assert_eq!(b, HEADER_BYTES);
    }

    #[test]
    fn emit_into_a_short_buffer() {
        let mut b = [0xa5u8; 24];
        assert_eq!(REPR.emit(&mut MadPacket::new_unchecked(&mut b[..23])), Err(Error::Truncated("MAD header")));
    }

    #[test]
    fn attr_names_and_unknown_round_trip() {
        assert_eq!(CmAttr::from(0x1a).name(), "AlternatePathResponse");
        assert_eq!(CmAttr::from(0x18).name(), "ServiceIDResReqResp");
        assert_eq!(CmAttr::from(0x01), CmAttr::Unknown(0x01));
        assert_eq!(u16::from(CmAttr::Unknown(0x01)), 0x01);
        assert_eq!(u16::from(CmAttr::Apr), 0x1a);
    }
}
