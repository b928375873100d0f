//! The statistics a capture's conversations add up to (per transport), and their JSON form.

use super::*;

/// A set of measurements (packet counts, PSN distances, nanoseconds); serialised as its summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Samples(Vec<u64>);

/// Count, minimum, median and maximum of some [`Samples`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// How many.
    pub n: usize,
    /// Smallest.
    pub min: u64,
    /// Median.
    pub median: u64,
    /// Largest.
    pub max: u64,
}

impl Samples {
    pub(super) fn push(&mut self, v: u64) {
        self.0.push(v);
    }

    /// The summary; `None` without samples. The median of an even count is the lower middle.
    pub fn summary(&self) -> Option<Summary> {
        let mut v = self.0.clone();
        v.sort_unstable();
        let (&min, &max) = (v.first()?, v.last()?);
        Some(Summary { n: v.len(), min, median: v[(v.len() - 1) / 2], max })
    }
}

impl Serialize for Samples {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.summary().serialize(s)
    }
}

/// Opcode counts, serialised as a map from name to count, in opcode order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpcodeCounts(pub BTreeMap<u8, u64>);

impl OpcodeCounts {
    /// The count of the opcode named `name` (e.g. `RC_FETCH_ADD`).
    #[cfg(test)]
    pub fn get(&self, name: &str) -> u64 {
        self.0.iter().find(|(op, _)| Opcode(**op).to_string() == name).map_or(0, |(_, n)| *n)
    }
}

impl Serialize for OpcodeCounts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(op, n)| (Opcode(*op).to_string(), n)))
    }
}

pub(super) fn bump<K: Ord>(m: &mut BTreeMap<K, u64>, k: K) {
    *m.entry(k).or_default() += 1;
}

/// BTH fields other than opcode, QP and PSN.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BthStats {
    /// P_Key values.
    pub pkeys: BTreeMap<String, u64>,
    /// Packets with MigReq set.
    pub mig_req: u64,
    /// Packets with the Solicited Event bit set.
    pub solicited: u64,
    /// Packets with FECN set.
    pub fecn: u64,
    /// Packets with BECN set.
    pub becn: u64,
}

/// Item 2: where the AckReq bit is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AckReqStats {
    /// Request packets that end a message (ONLY, LAST).
    pub only_last: u64,
    /// ... of which carry AckReq.
    pub only_last_marked: u64,
    /// Request packets that do not end a message (FIRST, MIDDLE).
    pub first_middle: u64,
    /// ... of which carry AckReq.
    pub first_middle_marked: u64,
    /// Request packets from one AckReq-marked packet to the next.
    pub spacing: Samples,
}

/// Item 3: how ACKs relate to requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AckStats {
    /// ACKNOWLEDGE packets (any syndrome).
    pub ack_packets: u64,
    /// Positive ACKs among them.
    pub positive: u64,
    /// PSN advance of each positive ACK over what was acknowledged before (0: a duplicate).
    pub psn_advance: Samples,
    /// Positive ACKs by the number of messages they complete.
    pub messages_per_ack: BTreeMap<u64, u64>,
    /// Positive ACKs that answer no AckReq-marked request packet (duplicates included).
    pub without_ackreq: u64,
}

/// Item 4: the AETH of every packet that carries one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AethStats {
    /// Positive ACK syndromes.
    pub ack: u64,
    /// RNR NAK syndromes.
    pub rnr_nak: u64,
    /// NAK syndromes.
    pub nak: u64,
    /// Reserved syndromes.
    pub reserved: u64,
    /// ACK credit count codes (`0x1f`: no credit information).
    pub credits: BTreeMap<String, u64>,
    /// NAK codes.
    pub nak_codes: BTreeMap<String, u64>,
    /// RNR NAK timer codes, with the time they stand for.
    pub rnr_timers: BTreeMap<String, u64>,
    /// The first MSN of each conversation.
    pub first_msn: BTreeMap<u32, u64>,
    /// MSN change from one AETH to the next (1: the next message, 0: the same, ...).
    pub msn_steps: BTreeMap<i32, u64>,
}

/// Item 5: UDP ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UdpStats {
    /// Source ports per sending QP.
    pub sports: BTreeMap<String, BTreeSet<u16>>,
    /// Packets whose source port is in 0xC000-0xFFFF.
    pub sport_in_c000_ffff: u64,
    /// Packets whose source port is below 0xC000.
    pub sport_below_c000: u64,
    /// Destination ports.
    pub dports: BTreeMap<u16, u64>,
}

/// Counts of the step of a sequence number between consecutive packets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Steps {
    /// By one.
    pub plus_one: u64,
    /// Not at all.
    pub same: u64,
    /// By anything else.
    pub other: u64,
}

impl Steps {
    pub(super) fn add(&mut self, step: Option<u16>) {
        match step {
            Some(1) => self.plus_one += 1,
            Some(0) => self.same += 1,
            Some(_) => self.other += 1,
            None => {}
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.plus_one + self.same + self.other
    }
}

/// Item 6: network-layer header fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IpStats {
    /// RoCEv2 over IPv4.
    pub ipv4: u64,
    /// RoCEv2 over IPv6 and RoCEv1.
    pub ipv6: u64,
    /// IPv4 packets whose Identification is 0.
    pub ipv4_id_zero: u64,
    /// IPv4 ID step from the previous RoCE packet between the same two addresses.
    pub ipv4_id_step_host_pair: Steps,
    /// IPv4 ID step from the previous packet of the same sending QP.
    pub ipv4_id_step_qp: Steps,
    /// TTL (IPv4) or hop limit (IPv6, GRH).
    pub ttl: BTreeMap<u8, u64>,
    /// IPv4 packets with DF set.
    pub dont_frag: u64,
    /// DSCP values.
    pub dscp: BTreeMap<u8, u64>,
    /// ECN values.
    pub ecn: BTreeMap<u8, u64>,
    /// RoCEv2 packets whose UDP checksum is 0.
    pub udp_checksum_zero: u64,
    /// RoCEv2 packets whose UDP checksum is not 0.
    pub udp_checksum_nonzero: u64,
}

/// Item 7: timing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TimerStats {
    /// From an AckReq-marked request packet to the first ACK (or atomic ACK) covering its PSN, ns.
    pub ack_time_ns: Samples,
    /// From a READ request to its first response packet, ns.
    pub read_time_ns: Samples,
    /// Request packets whose PSN was sent before.
    pub retransmitted: u64,
    /// Requests first captured after a response that covers them (capture order, not causality).
    pub responses_before_request: u64,
    /// Runs of consecutive retransmitted packets.
    pub resend_bursts: u64,
    /// Bursts that followed a NAK (other than RNR) of the conversation.
    pub bursts_after_nak: u64,
    /// Bursts that followed an RNR NAK.
    pub bursts_after_rnr: u64,
    /// From the first sending of a PSN to each resend, ns.
    pub resend_gap_ns: Samples,
}

/// Item 8: ICRC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IcrcStats {
    /// Checked and right.
    pub valid: u64,
    /// Checked and wrong.
    pub invalid: u64,
    /// Not checkable (the capture cut the frame).
    pub unchecked: u64,
}

impl IcrcStats {
    pub(super) fn add(&mut self, ib: &IbFrame) {
        match ib.icrc {
            Some(_) if ib.icrc_ok => self.valid += 1,
            Some(_) => self.invalid += 1,
            None => self.unchecked += 1,
        }
    }
}

/// Everything measured over a set of packets (one conversation, or one transport of a file).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Packets.
    pub packets: u64,
    /// Request packets (SEND, WRITE, READ request, atomics).
    pub requests: u64,
    /// Response packets (READ responses, ACKs, atomic ACKs).
    pub responses: u64,
    /// Others (CNP, unknown opcodes).
    pub other: u64,
    /// Packets the capture cut short (analysed as far as their headers go).
    pub truncated: u64,
    /// Item 1: packets per opcode.
    pub opcodes: OpcodeCounts,
    /// Item 1: messages per shape.
    pub shapes: BTreeMap<String, u64>,
    /// Other BTH fields.
    pub bth: BthStats,
    /// Item 2.
    pub ackreq: AckReqStats,
    /// Item 3.
    pub acks: AckStats,
    /// Item 4.
    pub aeth: AethStats,
    /// Item 5.
    pub udp: UdpStats,
    /// Item 6.
    pub ip: IpStats,
    /// Item 7.
    pub timers: TimerStats,
    /// Item 8.
    pub icrc: IcrcStats,
}

// ---------------------------------------------------------------------------------------------
// Grouping
