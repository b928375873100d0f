//! The CM SIDR_REQ message (IBTA Vol 1 12.11, table 119; attribute 0x0017): service ID
//! resolution, which asks for the QPN and Q_Key of a service for a UD client; the answer is the
//! [`super::cm_sidr_rep`]. rdma_cm uses it for UD port spaces; the private data opens with a
//! [`super::cma_hdr`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of SIDR_REQ private data (IBTA Vol 1 table 119; Linux `IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE`).
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;

cm_message! {
    CmSidrReqPacket, CmSidrReqRepr, "CM SIDR_REQ";
    /// A SIDR_REQ as values.
    fields {
        /// Request ID (Linux: the sender's local ID).
        request_id / set_request_id: u32(0..4);
        /// Partition key.
        pkey / set_pkey: u16(4..6);
        // Bytes 6-7 are reserved.
        /// Service ID.
        service_id / set_service_id: u64(8..16);
        /// The private data area.
        private_data / private_data_mut: area(16, SIDR_REQ_PRIVATE_DATA_LEN),
            "CM SIDR_REQ private data longer than 216 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::captured;
    use crate::wire::cma_hdr::{CmaHdrPacket, CmaHdrRepr};
    use core::net::{IpAddr, Ipv4Addr};

    // A SIDR_REQ as udaddy's client sends it (Linux cm.c cm_format_sidr_req): request ID, P_Key
    // 0xFFFF, service ID RDMA_PS_UDP (0x0111) port 7174, then a cma_hdr 192.0.2.1:40000 -> 192.0.2.2.
    static SIDR_REQ_BYTES: [u8; 52] = [
        0x12, 0x34, 0x56, 0x78, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x1c, 0x06, 0x00, 0x40,
        0x9c, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 0, 2, 2,
    ];

    fn sidr_req() -> CmSidrReqRepr {
        CmSidrReqRepr {
            request_id: 0x1234_5678,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_1c06,
            private_data: captured::data_area(&SIDR_REQ_BYTES)[16..].to_vec(),
        }
    }

    captured::header_tests!("CM SIDR_REQ", SIDR_REQ_BYTES, sidr_req(), 0xcd, bad: [
        CmSidrReqRepr { private_data: vec![0; 217], ..sidr_req() },
    ]);

    #[test]
    fn private_data_opens_with_a_cma_hdr() {
        let b = captured::data_area(&SIDR_REQ_BYTES);
        let p = CmSidrReqPacket::new_checked(&b[..]).unwrap();
        let hdr = CmaHdrRepr::parse(&CmaHdrPacket::new_checked(p.private_data()).unwrap()).unwrap();
        assert_eq!((hdr.port, hdr.src), (40000, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
    }
}
