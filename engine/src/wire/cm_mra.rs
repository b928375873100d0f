//! The CM MRA message (IBTA Vol 1 12.6.6, table 107; attribute 0x0011): a "message received, more
//! time needed".
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of MRA private data (IBTA Vol 1 table 107; Linux `IB_CM_MRA_PRIVATE_DATA_SIZE`).
pub const MRA_PRIVATE_DATA_LEN: usize = 222;

cm_message! {
    CmMraPacket, CmMraRepr, "CM MRA";
    /// An MRA as values.
    fields {
        /// Local Communication ID.
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID.
        remote_comm_id / set_remote_comm_id: u32(4..8);
        /// Message MRAed (2 bits: 0 REQ, 1 REP, 2 LAP); 6 reserved bits follow.
        msg_mraed / set_msg_mraed: bits(8, 0, 2), "CM MRA message MRAed wider than 2 bits";
        /// Service timeout (5 bits: 4.096 us * 2^value); 3 reserved bits follow.
        service_timeout / set_service_timeout: bits(9, 0, 5), "CM MRA service timeout wider than 5 bits";
        /// The private data area.
        private_data / private_data_mut: area(10, MRA_PRIVATE_DATA_LEN), "CM MRA private data longer than 222 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage, CM_MSG_REP};

    // An MRA of a REP (msg 1) with service timeout 24 (Linux's IB_CM_MRA_FLAG_DELAY | 24); one
    // byte of private data to see the area.
    static MRA_BYTES: [u8; 12] = [0xdc, 0xc7, 0x10, 0x46, 0x73, 0xad, 0xc2, 0xcc, 0x40, 0xc0, 0x5a, 0x00];

    fn mra() -> CmMraRepr {
        CmMraRepr {
            local_comm_id: 0xdcc7_1046,
            remote_comm_id: 0x73ad_c2cc,
            msg_mraed: CM_MSG_REP,
            service_timeout: 24,
            private_data: captured::area(222, &[0x5a]),
        }
    }

    captured::header_tests!("CM MRA", MRA_BYTES, mra(), 0xee, bad: [CmMraRepr { service_timeout: 32, ..mra() }]);

    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = vec![0xffu8; 232];
        let mut p = CmMraPacket::new_unchecked(&mut b[..]);
        p.set_msg_mraed(0);
        p.set_service_timeout(0);
        assert_eq!((b[8], b[9]), (0x3f, 0x07));
    }

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(0x0000_000b_2975_ef71, CmMessage::Mra(mra()));
    }
}
