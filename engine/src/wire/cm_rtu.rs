//! The CM RTU message (IBTA Vol 1 12.6.9, table 111; attribute 0x0014): the active side's "ready
//! to use", its answer to the [`super::cm_rep`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of RTU private data (IBTA Vol 1 table 111; Linux `IB_CM_RTU_PRIVATE_DATA_SIZE`).
pub const RTU_PRIVATE_DATA_LEN: usize = 224;

cm_message! {
    CmRtuPacket, CmRtuRepr, "CM RTU";
    /// An RTU as values.
    fields {
        /// Local Communication ID (the REQ sender's).
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID (the REP sender's).
        remote_comm_id / set_remote_comm_id: u32(4..8);
        /// The private data area.
        private_data / private_data_mut: area(8, RTU_PRIVATE_DATA_LEN), "CM RTU private data longer than 224 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::captured;

    // The RTU of nvme-discover2.pcap (../shared/reference/cm/nvme-discover2.cm.hex, frame 3).
    static RTU_BYTES: [u8; 8] = [0x73, 0xad, 0xc2, 0xcc, 0xdc, 0xc7, 0x10, 0x46];

    fn rtu() -> CmRtuRepr {
        CmRtuRepr { local_comm_id: 0x73ad_c2cc, remote_comm_id: 0xdcc7_1046, private_data: vec![0; 224] }
    }

    captured::header_tests!("CM RTU", RTU_BYTES, rtu(), 0x33, bad: [CmRtuRepr { private_data: vec![1; 225], ..rtu() }]);

    #[test]
    fn emit_short_private_data() {
        let mut b = vec![0x33u8; 232];
        let with_data = CmRtuRepr { private_data: vec![9, 8], ..rtu() };
        with_data.emit(&mut CmRtuPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..11], &[0x73, 0xad, 0xc2, 0xcc, 0xdc, 0xc7, 0x10, 0x46, 9, 8, 0]);
        assert!(b[10..].iter().all(|&x| x == 0));
    }
}
