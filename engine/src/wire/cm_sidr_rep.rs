//! The CM SIDR_REP message (IBTA Vol 1 12.11, table 120; attribute 0x0018): the answer to a
//! [`super::cm_sidr_req`], which gives a UD client the QPN and Q_Key of a service.
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

/// Bytes of SIDR_REP private data (IBTA Vol 1 table 120; Linux `IB_CM_SIDR_REP_PRIVATE_DATA_SIZE`).
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of the SIDR_REP additional information area.
pub const SIDR_REP_ADD_INFO_LEN: usize = 72;

cm_message! {
    CmSidrRepPacket, CmSidrRepRepr, "CM SIDR_REP";
    /// A SIDR_REP as values.
    fields {
        /// Request ID (echoed from the SIDR_REQ).
        request_id / set_request_id: u32(0..4);
        /// Status (IBTA Vol 1 table 121: 0 valid, 1 service ID not supported, 2 rejected, 3 no QP,
        /// 4 redirect, 5 unsupported version).
        status / set_status: u8(4);
        /// Additional information length, kept as sent: it is not checked against `add_info`.
        add_info_len / set_add_info_len: u8(5);
        // Bytes 6-7 are reserved.
        /// QPN (24 bits); byte 11 after it is reserved.
        qpn / set_qpn: u24(8..11), "CM SIDR_REP QPN wider than 24 bits";
        /// Service ID.
        service_id / set_service_id: u64(12..20);
        /// Q_Key.
        qkey / set_qkey: u32(20..24);
        /// The additional information area.
        add_info / add_info_mut: area(24, SIDR_REP_ADD_INFO_LEN),
            "CM SIDR_REP additional information longer than 72 bytes";
        /// The private data area.
        private_data / private_data_mut: area(96, SIDR_REP_PRIVATE_DATA_LEN),
            "CM SIDR_REP private data longer than 136 bytes";
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::captured;

    // The SIDR_REP to udaddy's SIDR_REQ (request ID 0x12345678, service ID RDMA_PS_UDP port 7174):
    // status 0, QPN 0x000abc, the service ID echoed, Q_Key RDMA_UDP_QKEY 0x01234567; one byte of
    // additional information and of private data to see the areas.
    static SIDR_REP_BYTES: [u8; 98] = [
        0x12, 0x34, 0x56, 0x78, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0a, 0xbc, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11,
        0x1c, 0x06, 0x01, 0x23, 0x45, 0x67, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x77, 0,
    ];

    fn sidr_rep() -> CmSidrRepRepr {
        CmSidrRepRepr {
            request_id: 0x1234_5678,
            status: 0,
            add_info_len: 1,
            qpn: 0xabc,
            service_id: 0x0000_0000_0111_1c06,
            qkey: 0x0123_4567,
            add_info: captured::area(72, &[0xee]),
            private_data: captured::area(136, &[0x77]),
        }
    }

    captured::header_tests!("CM SIDR_REP", SIDR_REP_BYTES, sidr_rep(), 0xcd, bad: [
        CmSidrRepRepr { qpn: 1 << 24, ..sidr_rep() },
        CmSidrRepRepr { add_info: vec![0; 73], ..sidr_rep() },
        CmSidrRepRepr { private_data: vec![0; 137], ..sidr_rep() },
    ]);
}
