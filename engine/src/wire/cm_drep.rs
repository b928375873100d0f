//! The CM DREP message (IBTA Vol 1 12.6.11, table 113; attribute 0x0016): the reply to a
//! [`super::cm_dreq`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of DREP private data (IBTA Vol 1 table 113; Linux `IB_CM_DREP_PRIVATE_DATA_SIZE`).
pub const DREP_PRIVATE_DATA_LEN: usize = 224;

cm_message! {
    CmDrepPacket, CmDrepRepr, "CM DREP";
    /// A DREP as values.
    fields {
        /// Local Communication ID (the sender's).
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID.
        remote_comm_id / set_remote_comm_id: u32(4..8);
        /// The private data area.
        private_data / private_data_mut: area(8, DREP_PRIVATE_DATA_LEN), "CM DREP private data longer than 224 bytes";
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

    captured::header_tests!("CM DREP", DREP_BYTES, drep(), 0x11, bad: [
        CmDrepRepr { private_data: vec![0; 225], ..drep() },
    ]);
}
