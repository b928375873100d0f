//! The CM REJ message (IBTA Vol 1 12.6.7, table 108; attribute 0x0012): a reject of a REQ or REP.
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of REJ private data (IBTA Vol 1 table 108; Linux `IB_CM_REJ_PRIVATE_DATA_SIZE`).
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of the REJ Additional Rejection Information area.
pub const REJ_ARI_LEN: usize = 72;

cm_message! {
    CmRejPacket, CmRejRepr, "CM REJ";
    /// A REJ as values.
    fields {
        /// Local Communication ID (the rejecter's; 0 when it has none).
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID.
        remote_comm_id / set_remote_comm_id: u32(4..8);
        /// Message rejected (2 bits: [`CM_MSG_REQ`](super::cm::CM_MSG_REQ), [`CM_MSG_REP`](super::cm::CM_MSG_REP),
        /// [`CM_MSG_OTHER`](super::cm::CM_MSG_OTHER)); 6 reserved bits follow.
        msg_rejected / set_msg_rejected: bits(8, 0, 2), "CM REJ message rejected wider than 2 bits";
        /// Reject info length (7 bits): the bytes of ARI that are meaningful, kept as sent (not
        /// checked against `ari`); a reserved bit follows.
        reject_info_len / set_reject_info_len: bits(9, 0, 7), "CM REJ reject info length wider than 7 bits";
        /// Reason (IBTA Vol 1 table 109; 8 invalid service ID, 28 consumer defined, ...).
        reason / set_reason: u16(10..12);
        /// The Additional Rejection Information (ARI) area.
        ari / ari_mut: area(12, REJ_ARI_LEN), "CM REJ ARI longer than 72 bytes";
        /// The private data area.
        private_data / private_data_mut: area(84, REJ_PRIVATE_DATA_LEN), "CM REJ private data longer than 148 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage, CM_MSG_REQ};

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
        CmRejRepr {
            local_comm_id: 0,
            remote_comm_id: 0x71ef_7529,
            msg_rejected: CM_MSG_REQ,
            reject_info_len: 2,
            reason: 8,
            ari: captured::area(72, &[0xab, 0xcd]),
            private_data: captured::area(148, &[0x12, 0x34]),
        }
    }

    captured::header_tests!("CM REJ", REJ_BYTES, rej(), 0xee, bad: [
        CmRejRepr { ari: vec![0; 73], ..rej() },
        CmRejRepr { private_data: vec![0; 149], ..rej() },
        CmRejRepr { reject_info_len: 128, ..rej() },
        CmRejRepr { msg_rejected: 4, ..rej() },
    ]);

    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = vec![0xffu8; 232];
        let mut p = CmRejPacket::new_unchecked(&mut b[..]);
        p.set_msg_rejected(0);
        p.set_reject_info_len(0);
        assert_eq!((b[8], b[9]), (0x3f, 0x01));
    }

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(0x0000_000b_2975_ef71, CmMessage::Rej(rej()));
    }
}
