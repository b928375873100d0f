//! The CM DREQ message (IBTA Vol 1 12.6.10, table 112; attribute 0x0015): a disconnection
//! request. Its reply is the [`super::cm_drep`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of DREQ private data (IBTA Vol 1 table 112; Linux `IB_CM_DREQ_PRIVATE_DATA_SIZE`).
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;

cm_message! {
    CmDreqPacket, CmDreqRepr, "CM DREQ";
    /// A DREQ as values.
    fields {
        /// Local Communication ID (the sender's).
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID.
        remote_comm_id / set_remote_comm_id: u32(4..8);
        /// Remote QPN/EECN (24 bits): the receiver's QP. Linux drops a DREQ whose value is not its QPN.
        remote_qpn / set_remote_qpn: u24(8..11), "CM DREQ remote QPN wider than 24 bits";
        // Byte 11 is reserved.
        /// The private data area.
        private_data / private_data_mut: area(12, DREQ_PRIVATE_DATA_LEN), "CM DREQ private data longer than 220 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMadRepr, CmMessage};

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

    captured::header_tests!("CM DREQ", DREQ_BYTES, dreq(), 0x11, bad: [
        CmDreqRepr { remote_qpn: 1 << 24, ..dreq() },
        CmDreqRepr { private_data: vec![0; 221], ..dreq() },
    ]);

    #[test]
    fn emit_short_private_data() {
        let mut b = vec![0x11u8; 232];
        let with_data = CmDreqRepr { private_data: vec![0xaa], ..dreq() };
        with_data.emit(&mut CmDreqPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!((b[11], b[12], b[13]), (0, 0xaa, 0));
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
