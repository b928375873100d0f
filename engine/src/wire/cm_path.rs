//! The path block of a CM REQ (IBTA Vol 1 12.6.5, table 106, bytes 52-95 for the primary path and
//! 96-139 for the alternate one): the 44 bytes that tell the passive side how to reach the active
//! side. On RoCE the LIDs are 0xFFFF (permissive) and the GIDs are the IPv4-mapped addresses.
//!
//! The LAP message carries the same values in a different order (IBTA Vol 1 12.8.1, table 115);
//! [`super::cm_lap`] reads it into a [`CmPathRepr`] too.

use super::be;

/// Bytes of one path block in a REQ.
pub const CM_PATH_LEN: usize = 44;

cm_header! {
    view CmPathPacket(CM_PATH_LEN, "CM path", "the whole 44-byte block", "A view of a REQ path block.");
    /// One path of a REQ (or the alternate path of a LAP) as values.
    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    repr CmPathRepr;
    fields {
        /// Local port LID (0xFFFF, permissive, on RoCE).
        local_lid / set_local_lid: u16(0..2);
        /// Remote port LID.
        remote_lid / set_remote_lid: u16(2..4);
        /// Local port GID.
        local_gid / set_local_gid: gid(4..20);
        /// Remote port GID.
        remote_gid / set_remote_gid: gid(20..36);
        /// Flow label (20 bits); 6 reserved bits and the packet rate follow in its word.
        flow_label / set_flow_label: flow_label(36..40), "CM path flow label wider than 20 bits";
        /// Packet rate (6 bits, IBTA Vol 1 table 225 encoding).
        packet_rate / set_packet_rate: bits(39, 2, 6), "CM path packet rate wider than 6 bits";
        /// Traffic class.
        traffic_class / set_traffic_class: u8(40);
        /// Hop limit.
        hop_limit / set_hop_limit: u8(41);
        /// Service level (4 bits).
        sl / set_sl: bits(42, 0, 4), "CM path SL wider than 4 bits";
        /// Subnet local: the path stays in the local subnet; 3 reserved bits follow.
        subnet_local / set_subnet_local: bit(42, 4);
        /// Local ACK timeout (5 bits: 4.096 us * 2^value); 3 reserved bits follow (in the alternate
        /// path of a REQ bit 5 is SAP-supported, which this implementation leaves zero).
        local_ack_timeout / set_local_ack_timeout: bits(43, 0, 5), "CM path local ACK timeout wider than 5 bits";
    }
}

/// Reads a 16-byte GID.
pub(super) fn gid(b: &[u8], f: super::Field) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[f]);
    g
}

/// Writes a 20-bit flow label into the top of the 32-bit word `f`, keeping its low 12 bits.
pub(super) fn set_flow_label(b: &mut [u8], f: super::Field, v: u32) {
    let word = be::u32(b, f.clone());
    be::set_u32(b, f, (word & 0xfff) | ((v & 0xf_ffff) << 12))
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::captured;

    // The primary path of the REQ in nvme-discover2.pcap (../shared/reference/cm/nvme-discover2.cm.hex,
    // MAD bytes 76-119): flow label 0x2BBA0, rate 6, hop limit 64, ACK timeout 19.
    static PATH_BYTES: [u8; 44] = [
        0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xac, 0x10, 0x00, 0x6e, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0xff, 0xff, 0xac, 0x10, 0x00, 0x67, 0x2b, 0xba, 0x00, 0x06, 0x00, 0x40, 0x00, 0x98,
    ];

    fn repr() -> CmPathRepr {
        CmPathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 172, 16, 0, 110],
            remote_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 172, 16, 0, 103],
            flow_label: 0x2bba0,
            packet_rate: 6,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        }
    }

    captured::header_tests!("CM path", PATH_BYTES, repr(), 0x5a, bad: [CmPathRepr { flow_label: 0x10_0000, ..repr() }]);

    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = [0xffu8; 44];
        let mut p = CmPathPacket::new_unchecked(&mut b[..]);
        p.set_flow_label(0);
        p.set_packet_rate(0);
        p.set_sl(0);
        p.set_local_ack_timeout(0);
        // The 6 reserved bits between flow label and rate, the subnet-local bit and the 3 bits
        // after the ACK timeout survive.
        assert_eq!(&b[36..40], &[0x00, 0x00, 0x0f, 0xc0]);
        assert_eq!((b[42], b[43]), (0x0f, 0x07));
    }
}
