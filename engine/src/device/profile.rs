//! Behaviour profiles: the legal choices where RoCE implementations differ on the wire, named
//! after the implementation whose choices they are (issue 20, found by `softrdma pcap replay`).
//!
//! Every field is something the IBTA leaves to the implementation, so a device under either
//! profile is conformant; a profile only makes softrdma's packets look like those of the
//! implementation a trace was recorded on, so that replaying that trace compares what matters.
//!
//! | choice | `rxe` (Linux soft-RoCE, the default) | `cx` (ConnectX, from the shared hardware captures) |
//! |---|---|---|
//! | BTH MigReq on every packet sent | 0 (rxe_hdr.h never sets it) | 1 (every packet of write.pcap, read2.pcap, send.pcap, nvme-discover2.pcap, rocev2_test.pcap) |
//! | ACK credit field | 0x1F, "invalid" (rxe_resp.c) | the receive WQEs left, encoded as IBTA Table 44 (nvme-discover2.pcap: 0x09; write.pcap: 0x00); 0x1F for a QP on an SRQ |
//! | AckReq on the first packet a QP sends | no: AckReq only on a message's last packet (and every 64 packets) | yes (rocev2_test.pcap: the SEND_FIRST opening each of the 32 QPs has AckReq, later FIRST/MIDDLE packets do not) |
//! | AETH credits of READ responses | 0x1F | 0 (nvme-discover2.pcap, the READ_RESPONSE_ONLY) |
//!
//! IP-level choices (IPv4 ID, DSCP/ECN, UDP checksum) belong to whoever writes the IP header
//! (the kernel, under a UDP socket) and are not part of the engine's profile.

/// How the AETH credit field of an ACK is filled (IBTA 9.7.7.2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CreditPolicy {
    /// Always 0x1F ("invalid": the responder does not track credits, which 9.7.7.2.5 allows; the
    /// requester then sends as if it had unlimited credits). rxe.
    #[default]
    Invalid,
    /// The number of receive WQEs the QP has left, encoded as Table 44 (the largest code whose
    /// count does not exceed it); a QP attached to an SRQ sends 0x1F, since an SRQ's WQEs are
    /// not the QP's own to promise (IBTA 10.2.9, shared receive queues: no end-to-end credits).
    Count,
}

/// The name of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ProfileName {
    /// [`WireProfile::RXE`].
    Rxe,
    /// [`WireProfile::CX`].
    Cx,
    /// A profile whose fields were set one by one.
    Custom,
}

impl ProfileName {
    /// `rxe`, `cx` or `custom`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileName::Rxe => "rxe",
            ProfileName::Cx => "cx",
            ProfileName::Custom => "custom",
        }
    }
}

impl std::fmt::Display for ProfileName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named set of wire choices (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct WireProfile {
    /// The profile's name.
    pub name: ProfileName,
    /// BTH MigReq on every packet the device sends.
    pub mig_req: bool,
    /// ACK credits.
    pub credits: CreditPolicy,
    /// AckReq on the first packet a connected QP sends (the PSN it was given at RTS).
    pub ack_req_first_packet: bool,
    /// The credit code of the AETH in READ responses (`None`: 0x1F, as in ACKs without credits).
    pub read_response_credits: Option<u8>,
}

impl Default for WireProfile {
    fn default() -> WireProfile {
        WireProfile::RXE
    }
}

impl WireProfile {
    /// Linux's soft-RoCE (rdma_rxe).
    pub const RXE: WireProfile = WireProfile {
        name: ProfileName::Rxe,
        mig_req: false,
        credits: CreditPolicy::Invalid,
        ack_req_first_packet: false,
        read_response_credits: None,
    };

    /// NVIDIA/Mellanox ConnectX, as the shared hardware captures show it.
    pub const CX: WireProfile = WireProfile {
        name: ProfileName::Cx,
        mig_req: true,
        credits: CreditPolicy::Count,
        ack_req_first_packet: true,
        read_response_credits: Some(0),
    };

    /// The profile names [`WireProfile::by_name`] knows.
    pub const NAMES: [&'static str; 2] = ["rxe", "cx"];

    /// A profile by name.
    pub fn by_name(name: &str) -> Option<WireProfile> {
        match name {
            "rxe" => Some(WireProfile::RXE),
            "cx" => Some(WireProfile::CX),
            _ => None,
        }
    }
}

/// The credit code for `wqes` receive WQEs (IBTA Table 44: the largest code whose count does not
/// overstate them).
pub fn credit_code(wqes: usize) -> u8 {
    crate::wire::aeth::credit_code(u32::try_from(wqes).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_codes_follow_table_44() {
        assert_eq!(credit_code(0), 0);
        assert_eq!(credit_code(4), 4);
        assert_eq!(credit_code(5), 4);
        assert_eq!(credit_code(6), 5);
        assert_eq!(credit_code(31), 9);
        assert_eq!(credit_code(32), 10);
        assert_eq!(credit_code(1 << 20), 30);
        assert_eq!(credit_code(usize::MAX), 30);
    }

    #[test]
    fn profiles_by_name() {
        assert_eq!(WireProfile::by_name("rxe"), Some(WireProfile::RXE));
        assert_eq!(WireProfile::by_name("cx"), Some(WireProfile::CX));
        assert_eq!(WireProfile::by_name("mlx"), None);
        assert_eq!(WireProfile::default(), WireProfile::RXE);
    }
}
