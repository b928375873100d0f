//! The CM LAP message (IBTA Vol 1 12.8.1, table 115; attribute 0x0019): load an alternate path
//! into a connection. The answer is the [`super::cm_apr`].
//!
//! The LAP carries the same path values as a REQ path block, in its own order (the traffic class
//! shares the flow label's word, the hop limit comes before the rate); they are read into a
//! [`CmPathRepr`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm_path::CmPathRepr;

/// Bytes of LAP private data (IBTA Vol 1 table 115; Linux `IB_CM_LAP_PRIVATE_DATA_SIZE`).
pub const LAP_PRIVATE_DATA_LEN: usize = 168;

cm_message! {
    CmLapPacket, CmLapRepr, "CM LAP";
    /// A LAP as values.
    fields {
        /// Local Communication ID.
        local_comm_id / set_local_comm_id: u32(0..4);
        /// Remote Communication ID.
        remote_comm_id / set_remote_comm_id: u32(4..8);
        // Bytes 8-11 are reserved.
        /// Remote QPN/EECN (24 bits).
        remote_qpn / set_remote_qpn: u24(12..15), "CM LAP remote QPN wider than 24 bits";
        /// Remote CM response timeout (5 bits); 3 reserved bits follow.
        remote_cm_response_timeout / set_remote_cm_response_timeout: bits(15, 0, 5),
            "CM LAP remote CM response timeout wider than 5 bits";
        /// The alternate path to load (bytes 20-63, the `alt_*` fields).
        alternate_path / set_alternate_path: nested(CmPathRepr);
        /// The private data area.
        private_data / private_data_mut: area(64, LAP_PRIVATE_DATA_LEN), "CM LAP private data longer than 168 bytes";
    }
}

cm_fields! {
    impl CmLapPacket {
        // Bytes 16-19 are reserved.
        /// Alternate local port LID.
        alt_local_lid / set_alt_local_lid: u16(20..22);
        /// Alternate remote port LID.
        alt_remote_lid / set_alt_remote_lid: u16(22..24);
        /// Alternate local port GID.
        alt_local_gid / set_alt_local_gid: gid(24..40);
        /// Alternate remote port GID.
        alt_remote_gid / set_alt_remote_gid: gid(40..56);
        /// Alternate flow label (20 bits); 4 reserved bits and the traffic class follow in its word.
        alt_flow_label / set_alt_flow_label: flow_label(56..60);
        /// Alternate traffic class.
        alt_traffic_class / set_alt_traffic_class: u8(59);
        /// Alternate hop limit.
        alt_hop_limit / set_alt_hop_limit: u8(60);
        /// Alternate packet rate (6 bits, after 2 reserved ones).
        alt_packet_rate / set_alt_packet_rate: bits(61, 2, 6);
        /// Alternate SL (4 bits).
        alt_sl / set_alt_sl: bits(62, 0, 4);
        /// Alternate subnet local; 3 reserved bits follow.
        alt_subnet_local / set_alt_subnet_local: bit(62, 4);
        /// Alternate local ACK timeout (5 bits); 3 reserved bits follow.
        alt_local_ack_timeout / set_alt_local_ack_timeout: bits(63, 0, 5);
    }
}

// The LAP's alternate path as the `Repr` holds it: the `alt_*` fields, in the LAP's order (the
// traffic class shares the flow label's word, the hop limit comes before the rate).
impl<T: AsRef<[u8]>> CmLapPacket<T> {
    fn alternate_path(&self) -> CmPathRepr {
        CmPathRepr {
            local_lid: self.alt_local_lid(),
            remote_lid: self.alt_remote_lid(),
            local_gid: self.alt_local_gid(),
            remote_gid: self.alt_remote_gid(),
            flow_label: self.alt_flow_label(),
            packet_rate: self.alt_packet_rate(),
            traffic_class: self.alt_traffic_class(),
            hop_limit: self.alt_hop_limit(),
            sl: self.alt_sl(),
            subnet_local: self.alt_subnet_local(),
            local_ack_timeout: self.alt_local_ack_timeout(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmLapPacket<T> {
    fn set_alternate_path(&mut self, a: &CmPathRepr) {
        self.set_alt_local_lid(a.local_lid);
        self.set_alt_remote_lid(a.remote_lid);
        self.set_alt_local_gid(a.local_gid);
        self.set_alt_remote_gid(a.remote_gid);
        self.set_alt_flow_label(a.flow_label);
        self.set_alt_traffic_class(a.traffic_class);
        self.set_alt_hop_limit(a.hop_limit);
        self.set_alt_packet_rate(a.packet_rate);
        self.set_alt_sl(a.sl);
        self.set_alt_subnet_local(a.subnet_local);
        self.set_alt_local_ack_timeout(a.local_ack_timeout);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage};

    // A LAP loading the alternate path 192.0.2.1 -> 192.0.2.2 for QP 0x000167: flow label 0x2BBA0
    // (its word shared with traffic class 0x28), hop limit 64, rate 6, SL 3, subnet local, ACK
    // timeout 19; one private data byte.
    static LAP_BYTES: [u8; 65] = [
        0x71, 0xef, 0x75, 0x29, 0xc2, 0x5b, 0x8b, 0x76, 0, 0, 0, 0, 0x00, 0x01, 0x67, 0xb0, 0, 0, 0, 0, 0xff, 0xff,
        0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
        192, 0, 2, 2, 0x2b, 0xba, 0x00, 0x28, 0x40, 0x06, 0x38, 0x98, 0x42,
    ];

    fn lap() -> CmLapRepr {
        CmLapRepr {
            local_comm_id: 0x71ef_7529,
            remote_comm_id: 0xc25b_8b76,
            remote_qpn: 0x167,
            remote_cm_response_timeout: 22,
            alternate_path: CmPathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: captured::mapped([192, 0, 2, 1]),
                remote_gid: captured::mapped([192, 0, 2, 2]),
                flow_label: 0x2bba0,
                packet_rate: 6,
                traffic_class: 0x28,
                hop_limit: 64,
                sl: 3,
                subnet_local: true,
                local_ack_timeout: 19,
            },
            private_data: captured::area(168, &[0x42]),
        }
    }

    captured::header_tests!("CM LAP", LAP_BYTES, lap(), 0x99, bad: [
        CmLapRepr { alternate_path: CmPathRepr { sl: 16, ..lap().alternate_path }, ..lap() },
        CmLapRepr { remote_qpn: 1 << 24, ..lap() },
    ]);

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(7, CmMessage::Lap(lap()));
    }
}
