//! The CM REQ message (IBTA Vol 1 12.6.5, table 106; attribute 0x0010): the active side's
//! connection request. 140 fixed bytes, then 92 bytes of private data (for rdma_cm over IP, a
//! [`super::cma_hdr`] and up to 56 bytes of user data).
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of REQ private data (IBTA Vol 1 table 106; Linux `IB_CM_REQ_PRIVATE_DATA_SIZE`).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;

cm_message! {
    CmReqPacket, CmReqRepr, "CM REQ";
    /// A REQ as values. Reserved bits (and the SAP-supported bit of the alternate path) are not kept.
    fields {
        /// Local Communication ID.
        local_comm_id / set_local_comm_id: u32(0..4);
        // Byte 4 is reserved.
        /// Vendor ID (24 bits; Linux puts the ECE vendor here, 0 otherwise).
        vendor_id / set_vendor_id: u24(5..8), "CM REQ vendor ID wider than 24 bits";
        /// Service ID (for rdma_cm: `(port space << 16) | port`).
        service_id / set_service_id: u64(8..16);
        /// Local CA GUID.
        local_ca_guid / set_local_ca_guid: u64(16..24);
        // Bytes 24-27 are reserved.
        /// Local Q_Key (UD/RD only; 0 for RC).
        local_qkey / set_local_qkey: u32(28..32);
        /// Local QPN (24 bits).
        local_qpn / set_local_qpn: u24(32..35), "CM REQ local QPN wider than 24 bits";
        /// Responder resources: RDMA READ/atomic requests the sender accepts in flight.
        responder_resources / set_responder_resources: u8(35);
        /// Local EECN (24 bits).
        local_eecn / set_local_eecn: u24(36..39), "CM REQ local EECN wider than 24 bits";
        /// Initiator depth: RDMA READ/atomic requests the sender issues in flight.
        initiator_depth / set_initiator_depth: u8(39);
        /// Remote EECN (24 bits; RD only, 0 otherwise).
        remote_eecn / set_remote_eecn: u24(40..43), "CM REQ remote EECN wider than 24 bits";
        /// Remote CM response timeout (5 bits: 4.096 us * 2^value).
        remote_cm_response_timeout / set_remote_cm_response_timeout: bits(43, 0, 5),
            "CM REQ remote CM response timeout wider than 5 bits";
        /// Transport service type (2 bits: 0 RC, 1 UC, 2 RD, 3 with extended transport 1: XRC).
        transport / set_transport: bits(43, 5, 2), "CM REQ transport wider than 2 bits";
        /// End-to-end flow control.
        e2e_flow_control / set_e2e_flow_control: bit(43, 7);
        /// Starting PSN (24 bits).
        starting_psn / set_starting_psn: u24(44..47), "CM REQ starting PSN wider than 24 bits";
        /// Local CM response timeout (5 bits).
        local_cm_response_timeout / set_local_cm_response_timeout: bits(47, 0, 5),
            "CM REQ local CM response timeout wider than 5 bits";
        /// Retry count (3 bits).
        retry_count / set_retry_count: bits(47, 5, 3), "CM REQ retry count wider than 3 bits";
        /// Partition key.
        pkey / set_pkey: u16(48..50);
        /// Path packet payload MTU (4 bits: 1 = 256 ... 5 = 4096).
        path_mtu / set_path_mtu: bits(50, 0, 4), "CM REQ path MTU wider than 4 bits";
        /// RDC exists.
        rdc_exists / set_rdc_exists: bit(50, 4);
        /// RNR retry count (3 bits; 7 = infinite).
        rnr_retry_count / set_rnr_retry_count: bits(50, 5, 3), "CM REQ RNR retry count wider than 3 bits";
        /// Max CM retries (4 bits).
        max_cm_retries / set_max_cm_retries: bits(51, 0, 4), "CM REQ max CM retries wider than 4 bits";
        /// SRQ: the sender's QP uses a shared receive queue.
        srq / set_srq: bit(51, 4);
        /// Extended transport type (3 bits; 1 = XRC with transport 3).
        extended_transport / set_extended_transport: bits(51, 5, 3), "CM REQ extended transport wider than 3 bits";
        /// The primary path block.
        primary_path / primary_path_mut: path(52..96);
        /// The alternate path block (all zero when there is none).
        alternate_path / alternate_path_mut: path(96..140);
        /// The private data area (for rdma_cm over IP, a [`super::cma_hdr`] and up to 56 bytes of
        /// user data).
        private_data / private_data_mut: area(140, REQ_PRIVATE_DATA_LEN), "CM REQ private data longer than 92 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMadRepr, CmMessage};
    use crate::wire::cm_path::CmPathRepr;
    use crate::wire::cma_hdr::{CmaHdrPacket, CmaHdrRepr};
    use core::net::{IpAddr, Ipv4Addr};

    // The REQ of write.pcap (../shared/reference/cm/write.cm.hex, frame 1): the 140 fixed bytes and
    // the 36-byte cma_hdr that opens its private data; the rest of the 232-byte area is zero.
    static MESSAGE_BYTES: [u8; 176] = [
        0x71, 0xef, 0x75, 0x29, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x00, 0xac, 0x08, 0xc0,
        0xeb, 0x03, 0x00, 0xda, 0xe2, 0xe6, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x37, 0x01,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0xb0, 0x9f, 0x93, 0x1b, 0xb0, 0xff, 0xff, 0x37, 0xf0, 0xff, 0xff,
        0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xac, 0x11, 0xf2, 0x2f,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xac, 0x11, 0xf2, 0x38, 0x00, 0x00,
        0x00, 0x07, 0x00, 0x40, 0x00, 0x98, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0xc6, 0x57,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xac, 0x11, 0xf2, 0x2f, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xac, 0x11, 0xf2, 0x38,
    ];

    fn repr() -> CmReqRepr {
        CmReqRepr {
            local_comm_id: 0x71ef_7529,
            vendor_id: 0,
            service_id: 0x0000_0000_0106_00ac,
            local_ca_guid: 0x08c0_eb03_00da_e2e6,
            local_qkey: 0,
            local_qpn: 0x137,
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_cm_response_timeout: 22,
            transport: 0,
            e2e_flow_control: false,
            starting_psn: 0x9f_931b,
            local_cm_response_timeout: 22,
            retry_count: 0,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport: 0,
            primary_path: CmPathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: captured::mapped([172, 17, 242, 47]),
                remote_gid: captured::mapped([172, 17, 242, 56]),
                flow_label: 0,
                // Raw byte 91 is 0x07: rate 7 (40 Gb/s). tshark 4.0.17 shows 0 here: it reads the
                // rate from byte 88 (see ../shared/reference/cm/README.md, "tshark bug").
                packet_rate: 7,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: 19,
            },
            alternate_path: CmPathRepr::default(),
            private_data: captured::data_area(&MESSAGE_BYTES)[140..].to_vec(),
            remote_eecn: 0,
        }
    }

    captured::header_tests!("CM REQ", MESSAGE_BYTES, repr(), 0xa5, bad: [
        CmReqRepr { private_data: vec![0; 93], ..repr() },
        CmReqRepr { local_qpn: 1 << 24, ..repr() },
        CmReqRepr { transport: 4, ..repr() },
        CmReqRepr { retry_count: 8, ..repr() },
        CmReqRepr { max_cm_retries: 16, ..repr() },
    ]);

    #[test]
    fn emit_short_private_data() {
        let mut b = vec![0xa5u8; 232];
        let short = CmReqRepr { private_data: vec![7; 3], ..repr() };
        short.emit(&mut CmReqPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[140..144], &[7, 7, 7, 0], "short private data is zero-padded");
    }

    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = vec![0xffu8; 232];
        let mut p = CmReqPacket::new_unchecked(&mut b[..]);
        p.set_transport(0);
        p.set_retry_count(0);
        p.set_rdc_exists(false);
        p.set_srq(false);
        p.set_local_qpn(0);
        // Timeout and E2E around the transport, the local timeout before the retry count, MTU and
        // RNR around RDC, max retries and extended transport around SRQ, responder resources.
        assert_eq!((b[43], b[47], b[50], b[51], b[35]), (0xf9, 0xf8, 0xf7, 0xf7, 0xff));
        let mut p = CmReqPacket::new_unchecked(&mut b[..]);
        p.set_transport(3);
        p.set_extended_transport(1);
        assert_eq!((p.transport(), p.extended_transport(), p.e2e_flow_control()), (3, 1, true));
    }

    fn captured_req(name: &str) -> (Vec<u8>, CmReqRepr, CmaHdrRepr) {
        let mad = captured::mads(name).remove(0);
        let CmMessage::Req(req) = CmMadRepr::parse(&mad).unwrap().msg else { panic!("{name}: not a REQ") };
        let hdr = CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&req.private_data[..]).unwrap()).unwrap();
        (mad, req, hdr)
    }

    // The values of ../shared/reference/cm/README.md ("Captured values") and the tshark decodes beside it.
    #[test]
    fn write_capture() {
        let (mad, req, hdr) = captured_req("write.cm.hex");
        assert_eq!(req, repr());
        assert_eq!((req.local_qpn, req.starting_psn), (0x137, 0x9f_931b));
        assert_eq!((hdr.port, hdr.src, hdr.dst), (50775, ip([172, 17, 242, 47]), ip([172, 17, 242, 56])));
        let mut out = vec![0u8; 256];
        CmMadRepr::parse(&mad).unwrap().emit(&mut out).unwrap();
        assert_eq!(out, mad);
    }

    #[test]
    fn read2_and_send_captures() {
        let (_, req, hdr) = captured_req("read2.cm.hex");
        assert_eq!(req.service_id, 0x0000_0000_0106_3039);
        assert_eq!((req.local_qpn, req.starting_psn), (0x139, 0xf0_45d0));
        assert_eq!((req.responder_resources, req.initiator_depth), (3, 3));
        assert_eq!((req.retry_count, req.rnr_retry_count, req.max_cm_retries), (3, 0, 15));
        assert_eq!(hdr.port, 51198);
        let (_, req, hdr) = captured_req("send.cm.hex");
        assert_eq!((req.local_qpn, req.starting_psn, req.responder_resources), (0x13a, 0xb2_ef85, 0));
        assert_eq!((req.retry_count, req.rnr_retry_count), (0, 0));
        assert_eq!(hdr.port, 50219);
    }

    #[test]
    fn nvme_capture() {
        let (_, req, hdr) = captured_req("nvme-discover2.cm.hex");
        assert_eq!((req.local_comm_id, req.service_id), (0x73ad_c2cc, 0x0000_0000_0106_1144));
        assert_eq!((req.local_qpn, req.starting_psn), (0x106, 0x53_757f));
        assert_eq!((req.responder_resources, req.initiator_depth), (16, 0));
        assert_eq!((req.remote_cm_response_timeout, req.local_cm_response_timeout), (22, 22));
        assert_eq!((req.retry_count, req.rnr_retry_count, req.max_cm_retries), (7, 7, 15));
        assert!(req.e2e_flow_control);
        assert_eq!((req.primary_path.flow_label, req.primary_path.packet_rate), (0x2bba0, 6));
        assert_eq!(req.local_ca_guid, 0xb859_9f03_001e_f41a);
        assert_eq!((hdr.port, hdr.src, hdr.dst), (39460, ip([172, 16, 0, 110]), ip([172, 16, 0, 103])));
        // NVMe-oF private data after the cma_hdr: recfmt 0, qid 0, hrqsize 32, hsqsize 31 (LE16s).
        assert_eq!(&req.private_data[36..44], &[0, 0, 0, 0, 0x20, 0x00, 0x1f, 0x00]);
    }

    fn ip(a: [u8; 4]) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(a))
    }
}
