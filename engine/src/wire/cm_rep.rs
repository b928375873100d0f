//! The CM REP message (IBTA Vol 1 12.6.8, table 110; attribute 0x0013): the passive side's reply
//! to a REQ. The active side answers it with the [`super::cm_rtu`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of REP private data (IBTA Vol 1 table 110; Linux `IB_CM_REP_PRIVATE_DATA_SIZE`).
pub const REP_PRIVATE_DATA_LEN: usize = 196;

cm_message! {
    CmRepPacket, CmRepRepr, "CM REP";
    /// A REP as values. Reserved bits are not kept.
    fields {
        /// Local Communication ID (the replier's).
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID (the REQ's Local Communication ID).
        remote_comm_id / set_remote_comm_id: u32(4..8);
        /// Local Q_Key.
        local_qkey / set_local_qkey: u32(8..12);
        /// Local QPN (24 bits).
        local_qpn / set_local_qpn: u24(12..15), "CM REP local QPN wider than 24 bits";
        /// Local EE context number (24 bits; Linux puts an XRC target's QPN here, in an XRC_TGT REP).
        local_eecn / set_local_eecn: u24(16..19), "CM REP local EECN wider than 24 bits";
        /// Starting PSN (24 bits).
        starting_psn / set_starting_psn: u24(20..23), "CM REP starting PSN wider than 24 bits";
        /// Vendor ID (24 bits; ECE's vendor, 0 without ECE), in the three bytes after the QPN, EECN
        /// and PSN: high, middle and low (IBTA 1.4 table 110; Linux `CM_REP_VENDOR_ID_H`/`_M`/`_L`).
        vendor_id / set_vendor_id: u24[15, 19, 23], "CM REP vendor ID wider than 24 bits";
        /// Responder resources.
        responder_resources / set_responder_resources: u8(24);
        /// Initiator depth.
        initiator_depth / set_initiator_depth: u8(25);
        /// Target ACK delay (5 bits).
        target_ack_delay / set_target_ack_delay: bits(26, 0, 5), "CM REP target ACK delay wider than 5 bits";
        /// Failover accepted (2 bits).
        failover_accepted / set_failover_accepted: bits(26, 5, 2), "CM REP failover accepted wider than 2 bits";
        /// End-to-end flow control.
        e2e_flow_control / set_e2e_flow_control: bit(26, 7);
        /// RNR retry count (3 bits).
        rnr_retry_count / set_rnr_retry_count: bits(27, 0, 3), "CM REP RNR retry count wider than 3 bits";
        /// SRQ; 4 reserved bits follow.
        srq / set_srq: bit(27, 3);
        /// Local CA GUID.
        local_ca_guid / set_local_ca_guid: u64(28..36);
        /// The private data area.
        private_data / private_data_mut: area(36, REP_PRIVATE_DATA_LEN), "CM REP private data longer than 196 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMadRepr, CmMessage};

    // The REP of nvme-discover2.pcap (../shared/reference/cm/nvme-discover2.cm.hex, frame 2): the 36
    // fixed bytes and the first 4 of the private data (NVMe-oF: recfmt 0, crqsize 33).
    static REP_BYTES: [u8; 40] = [
        0xdc, 0xc7, 0x10, 0x46, 0x73, 0xad, 0xc2, 0xcc, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0xca, 0x00, 0x00, 0x00,
        0x00, 0x00, 0xe3, 0x2e, 0x52, 0x00, 0x00, 0x08, 0x81, 0xe0, 0xb8, 0x59, 0x9f, 0x03, 0x00, 0x27, 0x65, 0x09,
        0x00, 0x00, 0x21, 0x00,
    ];

    fn rep() -> CmRepRepr {
        CmRepRepr {
            local_comm_id: 0xdcc7_1046,
            remote_comm_id: 0x73ad_c2cc,
            local_qkey: 0,
            local_qpn: 0x8ca,
            local_eecn: 0,
            starting_psn: 0xe3_2e52,
            vendor_id: 0,
            responder_resources: 0,
            initiator_depth: 8,
            target_ack_delay: 16,
            failover_accepted: 0,
            e2e_flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0xb859_9f03_0027_6509,
            private_data: captured::data_area(&REP_BYTES)[36..].to_vec(),
        }
    }

    captured::header_tests!("CM REP", REP_BYTES, rep(), 0x33, bad: [
        CmRepRepr { private_data: vec![1; 197], ..rep() },
        CmRepRepr { target_ack_delay: 32, ..rep() },
    ]);

    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = vec![0xffu8; 232];
        let mut p = CmRepPacket::new_unchecked(&mut b[..]);
        p.set_failover_accepted(0);
        p.set_srq(false);
        p.set_local_qpn(0);
        assert_eq!((b[26], b[27], b[15]), (0xf9, 0xef, 0xff));
        let mut p = CmRepPacket::new_unchecked(&mut b[..]);
        p.set_target_ack_delay(0);
        p.set_rnr_retry_count(0);
        assert_eq!((b[26], b[27]), (0x01, 0x0f));
    }

    #[test]
    fn vendor_id_sits_in_the_bytes_after_qpn_eecn_and_psn() {
        // Linux cm_msgs: CM_REP_VENDOR_ID_H/M/L at bytes 15, 19, 23 (ECE's vendor).
        let mut b = vec![0u8; 232];
        let r = CmRepRepr { vendor_id: 0x02_c9ab, local_qpn: 0xff_ffff, local_eecn: 0xff_ffff, ..rep() };
        r.emit(&mut CmRepPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!((b[15], b[19], b[23]), (0x02, 0xc9, 0xab));
        let p = CmRepPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.vendor_id(), p.local_qpn(), p.local_eecn()), (0x02_c9ab, 0xff_ffff, 0xff_ffff));
        assert_eq!(CmRepRepr::parse(&p), Ok(r));
        let wide = CmRepRepr { vendor_id: 1 << 24, ..rep() };
        assert!(wide.emit(&mut CmRepPacket::new_unchecked(&mut b[..])).is_err());
    }

    // The REP values of ../shared/reference/cm/README.md ("Captured values").
    #[test]
    fn captured_reps() {
        for (name, qpn, psn, rr_id, rnr) in [
            ("write.cm.hex", 0x167, 0xbe_e37a, (1, 1), 7),
            ("read2.cm.hex", 0x169, 0x6a_f7e4, (3, 3), 0),
            ("send.cm.hex", 0x16a, 0x42_4b71, (0, 0), 0),
            ("nvme-discover2.cm.hex", 0x8ca, 0xe3_2e52, (0, 8), 7),
        ] {
            let mads = captured::mads(name);
            let CmMessage::Rep(r) = CmMadRepr::parse(&mads[1]).unwrap().msg else { panic!("{name}: not a REP") };
            assert_eq!((r.local_qpn, r.starting_psn), (qpn, psn), "{name}");
            assert_eq!((r.responder_resources, r.initiator_depth), rr_id, "{name}");
            assert_eq!((r.target_ack_delay, r.rnr_retry_count), (16, rnr), "{name}");
            let CmMessage::Rtu(t) = CmMadRepr::parse(&mads[2]).unwrap().msg else { panic!("{name}: not an RTU") };
            assert_eq!((t.local_comm_id, t.remote_comm_id), (r.remote_comm_id, r.local_comm_id), "{name}");
        }
        let mads = captured::mads("write.cm.hex");
        let CmMessage::Rep(r) = CmMadRepr::parse(&mads[1]).unwrap().msg else { panic!("not a REP") };
        assert_eq!(r.local_ca_guid, 0x08c0_eb03_00da_e2ca, "the MAC 08:c0:eb:da:e2:ca with 03:00 inserted");
        assert_eq!(rep().emit(&mut CmRepPacket::new_unchecked(&mut vec![0; 232][..])), Ok(()));
    }
}
