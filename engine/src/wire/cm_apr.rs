//! The CM APR message (IBTA Vol 1 12.8.2, table 116; attribute 0x001A): the answer to a
//! [`super::cm_lap`], whether the alternate path was loaded.
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of APR private data (IBTA Vol 1 table 116; Linux `IB_CM_APR_PRIVATE_DATA_SIZE`).
pub const APR_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of the APR additional information area.
pub const APR_ADD_INFO_LEN: usize = 72;

cm_message! {
    CmAprPacket, CmAprRepr, "CM APR";
    /// An APR as values.
    fields {
        /// Local Communication ID.
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID.
        remote_comm_id / set_remote_comm_id: u32(4..8);
        /// Additional information length, kept as sent: it is not checked against `add_info`.
        add_info_len / set_add_info_len: u8(8);
        /// AP status (IBTA Vol 1 table 117: 0 loaded, 1 invalid comm ID, ...).
        status / set_status: u8(9);
        // Bytes 10-11 are reserved.
        /// The additional information area.
        add_info / add_info_mut: area(12, APR_ADD_INFO_LEN), "CM APR additional information longer than 72 bytes";
        /// The private data area.
        private_data / private_data_mut: area(84, APR_PRIVATE_DATA_LEN), "CM APR private data longer than 148 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage};

    // The APR to a LAP of QP 0x000167's connection (comm IDs 0x71ef7529 and 0xc25b8b76): status 0
    // (alternate path loaded), 1 byte of additional information, 1 of private data.
    static APR_BYTES: [u8; 85] = [
        0xc2, 0x5b, 0x8b, 0x76, 0x71, 0xef, 0x75, 0x29, 0x01, 0x00, 0x00, 0x00, 0x5c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa1,
    ];

    fn apr() -> CmAprRepr {
        CmAprRepr {
            local_comm_id: 0xc25b_8b76,
            remote_comm_id: 0x71ef_7529,
            add_info_len: 1,
            status: 0,
            add_info: captured::area(72, &[0x5c]),
            private_data: captured::area(148, &[0xa1]),
        }
    }

    captured::header_tests!("CM APR", APR_BYTES, apr(), 0x99, bad: [CmAprRepr { add_info: vec![0; 73], ..apr() }]);

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(7, CmMessage::Apr(apr()));
    }
}
