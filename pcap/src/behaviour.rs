//! `softrdma pcap behaviour`: what a RoCE implementation *does* on the wire, measured from a
//! capture, so that two implementations' traces of the same workloads (Linux rdma_rxe and
//! softrdma, say) can be laid side by side.
//!
//! The frames are decoded by the existing analysis ([`softrdma_pcap::analyze::summarize`], which
//! `pcap decode` and `pcap check` print); the network-layer fields the summary does not keep (IPv4
//! ID, TTL, DF, DSCP/ECN, UDP checksum) come from the engine's dissector over the same bytes.
//! Nothing here parses a packet by hand.
//!
//! Packets are grouped into *conversations*: the request packets one requester address sends to
//! one destination QP of one responder address, with the responses travelling back (READ
//! responses, ACKs/NAKs, atomic ACKs). Responses carry the requester's QP, which the requests do
//! not, so a response flow (B to A, destination QP y) is paired with the request flow (A to B,
//! destination QP x) whose PSN range its PSNs fall in; responses that answer no request in the
//! capture form a conversation of their own. CNPs and packets of unknown opcodes are kept in a
//! conversation keyed like requests.
//!
//! For each conversation, and summed per transport (RC, UC, UD, XRC, RD, CNP, ...) for the file:
//! 1. opcode counts and message shapes (`SEND_FIRST MIDDLE*2 LAST`,
//!    `READ_REQUEST -> READ_RESPONSE_FIRST MIDDLE*6 LAST`, `FETCH_ADD -> ATOMIC_ACKNOWLEDGE`);
//! 2. AckReq placement (ONLY/LAST vs FIRST/MIDDLE packets) and the spacing, in request packets,
//!    between AckReq-marked packets;
//! 3. ACK coalescing: ACKNOWLEDGE packets against request packets, the PSN advance of each
//!    positive ACK, how many messages each one completes, ACKs that answer no AckReq;
//! 4. AETH syndromes: ACK credit codes, NAK codes, RNR timers, how the MSN steps;
//! 5. UDP source ports per sending QP (a connected QP is named by the flow it sends on, a UD QP by
//!    its DETH source QP) and destination ports;
//! 6. IP header fields: IPv4 ID steps (per host pair and per sending QP), TTL, DF, DSCP/ECN, zero
//!    or non-zero UDP checksums;
//! 7. timers: AckReq-to-ACK time, READ-request-to-first-response time, retransmissions (a request
//!    PSN sent again) with the gap from the first sending, and whether a NAK came before;
//! 8. ICRC: valid, invalid, not checkable (frame cut by the capture);
//!
//! and the other BTH fields (P_Key, MigReq, SE, FECN, BECN).
//!
//! Captures are not always causal: one taken on the bridge between two virtual machines can hold
//! an ACK before the request it answers. Which messages an ACK completes, and whether an AckReq
//! asked for it, is therefore read from PSNs rather than from capture order; requests captured
//! after a response that covers them are counted and left out of the timings. An IPv4-mapped GID
//! (RoCEv1) counts as the IPv4 address it maps, so RoCEv1 requests and RoCEv2 answers pair up.
//!
//! Odd input is counted, never fatal: frames that are not RoCE, packets without a readable BTH,
//! malformed packets (skipped), frames cut by the snap length (analysed as far as their headers
//! go), unknown opcodes.
//!
//! [`text`] prints one section per file: a header line, then per transport aligned `key: value`
//! lines (the same keys for every transport and file, so two runs line up) and one line per
//! conversation. The [`FileReport`] serialises to the JSON object `--json` prints, with every
//! conversation in full.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::path::Path;

use crate::analyze::{FrameSummary, IbFrame};
use crate::Record;
use serde::{Serialize, Serializer};
use softrdma_engine::wire::roce::{Dissection, L3Repr};
use softrdma_engine::wire::{aeth, NakCode, OpKind, Opcode, Position, Psn, Syndrome};

/// The network-layer header fields of one packet, as its bytes hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetHeader {
    /// RoCEv2 over IPv4.
    Ipv4 {
        /// Identification.
        ident: u16,
        /// Time to live.
        ttl: u8,
        /// Don't Fragment.
        dont_frag: bool,
        /// The TOS byte (DSCP and ECN).
        tos: u8,
    },
    /// RoCEv2 over IPv6, or RoCEv1 (GRH).
    Ipv6 {
        /// Hop limit.
        hop_limit: u8,
        /// Traffic class (DSCP and ECN).
        traffic_class: u8,
    },
}

/// One RoCE packet of a capture.
#[derive(Debug, Clone)]
pub struct Packet {
    /// Frame number, from 1.
    pub frame: u64,
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Whether the capture cut the frame short.
    pub truncated: bool,
    /// What `pcap decode` knows of it.
    pub ib: IbFrame,
    /// Network-layer fields, when the header was read.
    pub net: Option<NetHeader>,
    /// The UDP checksum field (RoCEv2 only).
    pub udp_checksum: Option<u16>,
    /// The transport bytes the capture holds (BTH to ICRC; fewer when the frame was cut).
    pub ib_bytes: Vec<u8>,
}

/// The RoCE packets of one capture file, with counts of everything else.
#[derive(Debug, Clone, Default)]
pub struct Capture {
    /// Frames read.
    pub frames: u64,
    /// Frames that are not RoCE.
    pub not_roce: u64,
    /// The RoCE packets, in capture order.
    pub packets: Vec<Packet>,
    /// Why the file ended early, if it did.
    pub read_error: Option<String>,
}

impl Capture {
    /// Adds one frame, already summarised by the `pcap` analysis.
    pub fn add(&mut self, rec: &Record, s: &FrameSummary) {
        self.frames += 1;
        let Some(ib) = &s.ib else {
            self.not_roce += 1;
            return;
        };
        let (net, udp_checksum, ib_bytes) = match crate::analyze::dissect_linktype(rec.linktype, &rec.data) {
            Some(d) => (net_header(&d), d.udp_checksum, d.ib_bytes.to_vec()),
            None => (None, None, Vec::new()),
        };
        self.packets.push(Packet {
            frame: s.frame,
            ts_ns: rec.timestamp_ns,
            truncated: s.truncated,
            ib: ib.clone(),
            net,
            udp_checksum,
            ib_bytes,
        });
    }
}

/// Reads a capture file. A file damaged part-way yields what came before the damage, with the
/// reason in [`Capture::read_error`].
/// A file that cannot be opened, or is no capture at all, is an error.
pub fn load(path: &Path) -> Result<Capture, crate::Error> {
    let reader = crate::Reader::open(path)?;
    let mut cap = Capture::default();
    for rec in reader {
        match rec {
            Ok(r) => {
                let s = crate::analyze::summarize(r.index, r.linktype, &r.data, r.is_truncated());
                cap.add(&r, &s);
            }
            Err(e) => {
                cap.read_error = Some(e.to_string());
                break;
            }
        }
    }
    Ok(cap)
}

fn net_header(d: &Dissection<'_>) -> Option<NetHeader> {
    Some(match d.l3? {
        L3Repr::Ipv4(r) => NetHeader::Ipv4 { ident: r.ident, ttl: r.ttl, dont_frag: r.dont_frag, tos: r.dscp_ecn },
        L3Repr::Ipv6(r) => NetHeader::Ipv6 { hop_limit: r.hop_limit, traffic_class: r.traffic_class },
        L3Repr::Grh(r) => NetHeader::Ipv6 { hop_limit: r.hop_limit, traffic_class: r.traffic_class },
    })
}

// ---------------------------------------------------------------------------------------------
// Statistics

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
    fn push(&mut self, v: u64) {
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

fn bump<K: Ord>(m: &mut BTreeMap<K, u64>, k: K) {
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
    fn add(&mut self, step: Option<u16>) {
        match step {
            Some(1) => self.plus_one += 1,
            Some(0) => self.same += 1,
            Some(_) => self.other += 1,
            None => {}
        }
    }

    fn total(&self) -> u64 {
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
    fn add(&mut self, ib: &IbFrame) {
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

/// What a packet is to the conversation analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A request (SEND, WRITE, READ request, atomics).
    Request,
    /// A READ response, ACK/NAK or atomic ACK.
    Response,
    /// Neither (CNP, unknown opcodes).
    Other,
}

/// What a packet of this opcode is to the conversation analysis.
pub fn role(op: Opcode) -> Role {
    match op.info().map(|i| i.kind) {
        Some(k) if k.is_request() => Role::Request,
        Some(OpKind::ReadResponse | OpKind::Acknowledge | OpKind::AtomicAcknowledge) => Role::Response,
        _ => Role::Other,
    }
}

/// Source and destination address; an IPv4-mapped GID (RoCEv1) as the IPv4 address it maps, so
/// that RoCEv1 and RoCEv2 packets between the same hosts meet.
fn ends(ib: &IbFrame) -> (IpAddr, IpAddr) {
    (ib.src.to_canonical(), ib.dst.to_canonical())
}

/// The name of the QP a packet is sent by: a UD QP by its DETH source QP, a connected QP by the
/// flow it sends on (the BTH does not name the sender).
fn sender(ib: &IbFrame, dest_qp: u32) -> String {
    match ib.headers.deth {
        Some(d) => format!("{} qp {:#x}", ends(ib).0, d.src_qp.value()),
        None => format!("{} > {} qp {:#x}", ends(ib).0, ends(ib).1, dest_qp),
    }
}

/// Per-packet facts that need the whole file: IPv4 ID steps.
#[derive(Debug, Clone, Copy, Default)]
struct Annotation {
    id_step_host_pair: Option<u16>,
    id_step_qp: Option<u16>,
}

/// One conversation of a file.
#[derive(Debug, Clone, Serialize)]
pub struct Conversation {
    /// Transport name (`RC`, `UD`, ...).
    pub transport: &'static str,
    /// The address that sends the requests.
    pub requester: IpAddr,
    /// The address that answers.
    pub responder: IpAddr,
    /// The destination QP of the requests (`None`: responses whose requests are not in the
    /// capture).
    pub request_qp: Option<u32>,
    /// The destination QPs of the responses (the requester's QP).
    pub response_qps: BTreeSet<u32>,
    /// Frame number of its first packet.
    pub first_frame: u64,
    /// The measurements.
    pub stats: Stats,
    #[serde(skip)]
    psn_range: Option<(Psn, Psn)>,
    #[serde(skip)]
    /// Indices into [`Capture::packets`] of its packets, in capture order.
    pub members: Vec<usize>,
}

impl Conversation {
    fn new(transport: &'static str, requester: IpAddr, responder: IpAddr, request_qp: Option<u32>) -> Self {
        Conversation {
            transport,
            requester,
            responder,
            request_qp,
            response_qps: BTreeSet::new(),
            first_frame: 0,
            stats: Stats::default(),
            psn_range: None,
            members: Vec::new(),
        }
    }

    /// Widens the PSN range of the requests to hold `first..first + span`.
    fn extend_psns(&mut self, first: Psn, span: u32) {
        let last = first + span.saturating_sub(1);
        self.psn_range = Some(match self.psn_range {
            None => (first, last),
            Some((lo, hi)) => {
                (if first.distance(lo) < 0 { first } else { lo }, if last.distance(hi) > 0 { last } else { hi })
            }
        });
    }

    /// Whether a response PSN answers one of the requests (one past the range counts: a NAK
    /// names the PSN it expected).
    fn answers(&self, psn: Psn) -> bool {
        self.psn_range.is_some_and(|(lo, hi)| psn.distance(lo) >= 0 && (hi + 1).distance(psn) >= 0)
    }
}

/// The PSNs a request occupies: a READ request one per response packet (at most, for the
/// smallest path MTU), anything else one.
fn psn_span(ib: &IbFrame) -> u32 {
    match (ib.headers.bth.and_then(|b| b.opcode.info()).map(|i| i.kind), ib.headers.reth) {
        (Some(OpKind::ReadRequest), Some(r)) => r.dma_len.div_ceil(256).clamp(1, 1 << 16),
        _ => 1,
    }
}

/// One transport of a file: its conversation count and summed measurements.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TransportReport {
    /// Conversations.
    pub conversations: usize,
    /// The measurements over all of them.
    pub stats: Stats,
}

/// The behaviour of one capture file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FileReport {
    /// File name as given.
    pub file: String,
    /// Frames read.
    pub frames: u64,
    /// RoCE packets among them.
    pub roce_packets: u64,
    /// Frames that are not RoCE.
    pub not_roce: u64,
    /// RoCE frames the capture cut short.
    pub truncated: u64,
    /// Malformed packets (counted, not analysed).
    pub skipped_malformed: u64,
    /// Packets without a readable BTH (counted, not analysed).
    pub skipped_no_bth: u64,
    /// Packets whose opcode is in no table (analysed as "other").
    pub unknown_opcodes: u64,
    /// ICRC over every RoCE packet, skipped ones included.
    pub icrc: IcrcStats,
    /// Why the file ended early, if it did.
    pub read_error: Option<String>,
    /// Per transport.
    pub transports: BTreeMap<&'static str, TransportReport>,
    /// Per conversation, in the order of their first packets.
    pub conversations: Vec<Conversation>,
}

/// Analyses a capture.
pub fn analyse(file: &str, cap: &Capture) -> FileReport {
    let mut r = FileReport {
        file: file.to_string(),
        frames: cap.frames,
        roce_packets: cap.packets.len() as u64,
        not_roce: cap.not_roce,
        read_error: cap.read_error.clone(),
        ..FileReport::default()
    };
    // Which packets are analysed.
    let mut usable = Vec::new();
    for (i, p) in cap.packets.iter().enumerate() {
        r.icrc.add(&p.ib);
        r.truncated += u64::from(p.truncated);
        match p.ib.headers.bth {
            _ if p.ib.is_malformed() => r.skipped_malformed += 1,
            None => r.skipped_no_bth += 1,
            Some(b) => {
                r.unknown_opcodes += u64::from(b.opcode.info().is_none());
                usable.push(i);
            }
        }
    }
    let annotations = annotate(cap, &usable);
    let mut convs = conversations(cap, &usable);
    for c in &mut convs {
        let t = r.transports.entry(c.transport).or_default();
        t.conversations += 1;
        accumulate(cap, &annotations, c, &mut t.stats);
        let mut own = Stats::default();
        accumulate(cap, &annotations, c, &mut own);
        c.stats = own;
    }
    r.conversations = convs;
    r
}

/// The conversations of the usable packets (`usable`: indices of packets with a BTH that are not
/// malformed), in the order of their first packets.
pub fn conversations(cap: &Capture, usable: &[usize]) -> Vec<Conversation> {
    let mut convs = group(cap, usable);
    convs.sort_by_key(|c| c.first_frame);
    convs
}

/// IPv4 ID steps per host pair and per sending QP, in capture order.
fn annotate(cap: &Capture, usable: &[usize]) -> Vec<Annotation> {
    let mut out = vec![Annotation::default(); cap.packets.len()];
    let mut by_hosts: HashMap<(IpAddr, IpAddr), u16> = HashMap::new();
    let mut by_qp: HashMap<String, u16> = HashMap::new();
    for &i in usable {
        let p = &cap.packets[i];
        let (Some(NetHeader::Ipv4 { ident, .. }), Some(b)) = (p.net, p.ib.headers.bth) else { continue };
        let a = &mut out[i];
        a.id_step_host_pair = by_hosts.insert(ends(&p.ib), ident).map(|prev| ident.wrapping_sub(prev));
        a.id_step_qp = by_qp.insert(sender(&p.ib, b.dest_qp.value()), ident).map(|prev| ident.wrapping_sub(prev));
    }
    out
}

/// Sorts the usable packets into conversations.
fn group(cap: &Capture, usable: &[usize]) -> Vec<Conversation> {
    type FlowKey = (&'static str, IpAddr, IpAddr, u32);
    let mut convs: Vec<Conversation> = Vec::new();
    let mut by_request_flow: HashMap<FlowKey, usize> = HashMap::new();
    // Response flows, in order of their first packet, with their packets.
    let mut response_flows: Vec<(FlowKey, Vec<usize>)> = Vec::new();
    let mut response_flow_index: HashMap<FlowKey, usize> = HashMap::new();
    let mut owner = vec![usize::MAX; cap.packets.len()];
    for &i in usable {
        let ib = &cap.packets[i].ib;
        let Some(b) = ib.headers.bth else { continue };
        let (src, dst) = ends(ib);
        let key = (b.opcode.transport().name(), src, dst, b.dest_qp.value());
        if role(b.opcode) == Role::Response {
            let f = *response_flow_index.entry(key).or_insert_with(|| {
                response_flows.push((key, Vec::new()));
                response_flows.len() - 1
            });
            response_flows[f].1.push(i);
            continue;
        }
        let c = *by_request_flow.entry(key).or_insert_with(|| {
            convs.push(Conversation::new(key.0, src, dst, Some(key.3)));
            convs.len() - 1
        });
        if role(b.opcode) == Role::Request {
            convs[c].extend_psns(b.psn, psn_span(ib));
        }
        owner[i] = c;
    }
    // Each response flow B->A (destination QP y) joins the request flow A->B whose PSNs it
    // answers best; without one, it is a conversation of its own.
    let mut orphans: HashMap<FlowKey, usize> = HashMap::new();
    for ((transport, src, dst, qp), members) in response_flows {
        let psns: Vec<Psn> = members.iter().filter_map(|&i| cap.packets[i].ib.headers.bth.map(|b| b.psn)).collect();
        let best = convs
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.transport == transport && c.requester == dst && c.responder == src && c.request_qp.is_some()
            })
            .map(|(ci, c)| (psns.iter().filter(|&&p| c.answers(p)).count(), ci))
            .filter(|&(score, _)| score > 0)
            // The highest score; among equals the first conversation.
            .min_by_key(|&(score, ci)| (std::cmp::Reverse(score), ci))
            .map(|(_, ci)| ci);
        let c = best.unwrap_or_else(|| {
            *orphans.entry((transport, dst, src, qp)).or_insert_with(|| {
                convs.push(Conversation::new(transport, dst, src, None));
                convs.len() - 1
            })
        });
        convs[c].response_qps.insert(qp);
        for i in members {
            owner[i] = c;
        }
    }
    for &i in usable {
        if let Some(c) = convs.get_mut(owner[i]) {
            if c.members.is_empty() {
                c.first_frame = cap.packets[i].frame;
            }
            c.members.push(i);
        }
    }
    convs
}

// ---------------------------------------------------------------------------------------------
// Per-conversation measurement

/// An opcode name without its transport prefix and without `RDMA_`: `RC_RDMA_WRITE_ONLY` ->
/// `WRITE_ONLY`.
fn short_name(name: &str) -> &str {
    let rest = match name.split_once('_') {
        Some((t, rest)) if ["RC", "UC", "RD", "UD", "XRC"].contains(&t) => rest,
        _ => name,
    };
    rest.strip_prefix("RDMA_").unwrap_or(rest)
}

fn short_opcode(op: Opcode) -> String {
    short_name(&op.to_string()).to_string()
}

/// Builds message shapes (`SEND_FIRST MIDDLE*2 LAST`) from a packet sequence.
#[derive(Debug, Default)]
struct ShapeBuilder {
    /// The open message: its first packet's name and the MIDDLE packets since.
    open: Option<(String, u64)>,
}

impl ShapeBuilder {
    fn shape(first: &str, middles: u64, last: &str) -> String {
        let mut s = first.to_string();
        match middles {
            0 => {}
            1 => s.push_str(" MIDDLE"),
            n => {
                let _ = write!(s, " MIDDLE*{n}");
            }
        }
        if !last.is_empty() {
            s.push(' ');
            s.push_str(last);
        }
        s
    }

    /// Feeds one packet; returns the message shapes it finished (a FIRST or ONLY while a message
    /// is open ends that one as unfinished).
    fn push(&mut self, position: Position, name: &str, done: &mut Vec<String>) {
        if position.starts() {
            if let Some((first, m)) = self.open.take() {
                done.push(Self::shape(&first, m, "(unfinished)"));
            }
        }
        match position {
            Position::First => self.open = Some((name.to_string(), 0)),
            Position::Middle => match &mut self.open {
                Some((_, m)) => *m += 1,
                None => self.open = Some(("?".to_string(), 1)),
            },
            Position::Last => {
                let (first, m) = self.open.take().unwrap_or_else(|| ("?".to_string(), 0));
                let last = name.find("LAST").map_or(name, |at| &name[at..]);
                done.push(Self::shape(&first, m, last));
            }
            Position::Only => done.push(name.to_string()),
        }
    }

    /// Ends the sequence: an open message is unfinished.
    fn finish(&mut self, done: &mut Vec<String>) {
        if let Some((first, m)) = self.open.take() {
            done.push(Self::shape(&first, m, "(unfinished)"));
        }
    }
}

/// The state of a NAK that may explain the next resend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NakSeen {
    Nak,
    Rnr,
}

fn nak_name(code: NakCode) -> String {
    match code {
        NakCode::PsnSequenceError => "psn-sequence-error".into(),
        NakCode::InvalidRequest => "invalid-request".into(),
        NakCode::RemoteAccessError => "remote-access-error".into(),
        NakCode::RemoteOperationalError => "remote-operational-error".into(),
        NakCode::InvalidRdRequest => "invalid-rd-request".into(),
        NakCode::Unknown(c) => format!("reserved-{c:#04x}"),
    }
}

/// The signed step between two 24-bit sequence numbers.
fn step24(cur: u32, prev: u32) -> i32 {
    Psn::new(cur).distance(Psn::new(prev))
}

/// Adds one conversation's packets to `s`. Called once per conversation for its own
/// [`Stats`] and once for its transport's sum.
///
/// Which messages an ACK completes, and whether an AckReq asked for it, is read from PSNs (the
/// message ends and AckReq-marked PSNs between the previous acknowledged PSN and the ACK's), so
/// it holds where the capture shows a response before its request. Times follow capture order.
fn accumulate(cap: &Capture, annotations: &[Annotation], conv: &Conversation, s: &mut Stats) {
    // PSNs of the requests that end a message, and of the AckReq-marked ones.
    let mut message_ends = BTreeSet::new();
    let mut ackreq_psns = BTreeSet::new();
    for &i in &conv.members {
        let Some(b) = cap.packets[i].ib.headers.bth else { continue };
        if role(b.opcode) == Role::Request {
            if b.opcode.info().is_some_and(|info| info.position.ends()) {
                message_ends.insert(b.psn.value());
            }
            if b.ack_req {
                ackreq_psns.insert(b.psn.value());
            }
        }
    }
    let mut requests = ShapeBuilder::default();
    let mut responses = ShapeBuilder::default();
    let mut response_first_psn: Option<Psn> = None;
    let mut shapes = Vec::new();
    // READ and atomic requests waiting for their answer (PSN, time, name), and answers that
    // came before their request (PSN, shape).
    let mut pending_answers: Vec<(Psn, u64, String)> = Vec::new();
    let mut early_answers: Vec<(Psn, String)> = Vec::new();
    // AckReq-marked requests (other than READs) waiting for an ACK: PSN, time.
    let mut pending_acks: Vec<(Psn, u64)> = Vec::new();
    // AckReq-marked requests seen since the last positive ACK: their PSNs.
    let mut ackreq_since_ack: Vec<Psn> = Vec::new();
    let mut request_index = 0u64;
    let mut last_ackreq_at: Option<u64> = None;
    let mut acked_to: Option<Psn> = conv.psn_range.map(|(lo, _)| lo - 1);
    let mut prev_msn: Option<u32> = None;
    let mut first_sent: HashMap<u32, u64> = HashMap::new();
    let mut prev_was_resend = false;
    let mut nak_seen: Option<NakSeen> = None;

    for &i in &conv.members {
        let p = &cap.packets[i];
        let ib = &p.ib;
        let Some(b) = ib.headers.bth else { continue };
        let (psn, ts) = (b.psn, p.ts_ns);
        s.packets += 1;
        s.truncated += u64::from(p.truncated);
        bump(&mut s.opcodes.0, b.opcode.0);
        bump(&mut s.bth.pkeys, format!("{:#06x}", b.pkey));
        s.bth.mig_req += u64::from(b.mig_req);
        s.bth.solicited += u64::from(b.solicited);
        s.bth.fecn += u64::from(b.fecn);
        s.bth.becn += u64::from(b.becn);
        s.icrc.add(ib);
        add_headers(p, b.dest_qp.value(), annotations[i], s);
        if let Some(a) = ib.headers.aeth {
            add_aeth(a.syndrome, a.msn.value(), &mut prev_msn, &mut s.aeth);
        }
        let Some(info) = b.opcode.info() else {
            s.other += 1;
            continue;
        };
        match role(b.opcode) {
            Role::Other => s.other += 1,
            Role::Request => {
                s.requests += 1;
                request_index += 1;
                if info.position.ends() {
                    s.ackreq.only_last += 1;
                    s.ackreq.only_last_marked += u64::from(b.ack_req);
                } else {
                    s.ackreq.first_middle += 1;
                    s.ackreq.first_middle_marked += u64::from(b.ack_req);
                }
                if b.ack_req {
                    if let Some(prev) = last_ackreq_at {
                        s.ackreq.spacing.push(request_index - prev);
                    }
                    last_ackreq_at = Some(request_index);
                    ackreq_since_ack.push(psn);
                }
                // A first sending whose PSN a response already covered: captured after its answer.
                let mut answered_already = false;
                if let Some(&first) = first_sent.get(&psn.value()) {
                    s.timers.retransmitted += 1;
                    s.timers.resend_gap_ns.push(ts.saturating_sub(first));
                    if !prev_was_resend {
                        s.timers.resend_bursts += 1;
                        match nak_seen.take() {
                            Some(NakSeen::Nak) => s.timers.bursts_after_nak += 1,
                            Some(NakSeen::Rnr) => s.timers.bursts_after_rnr += 1,
                            None => {}
                        }
                    }
                    prev_was_resend = true;
                } else {
                    first_sent.insert(psn.value(), ts);
                    prev_was_resend = false;
                    answered_already = acked_to.is_some_and(|a| a.distance(psn) >= 0);
                }
                let name = short_opcode(b.opcode);
                if matches!(info.kind, OpKind::ReadRequest | OpKind::CompareSwap | OpKind::FetchAdd) {
                    if let Some(at) = early_answers.iter().position(|r| r.0 == psn) {
                        let (_, answer) = early_answers.remove(at);
                        shapes.push(format!("{name} -> {answer}"));
                        answered_already = true;
                    } else if !pending_answers.iter().any(|r| r.0 == psn) {
                        pending_answers.push((psn, ts, name));
                    }
                } else {
                    requests.push(info.position, &name, &mut shapes);
                }
                if answered_already {
                    s.timers.responses_before_request += 1;
                } else if b.ack_req && info.kind != OpKind::ReadRequest && !pending_acks.iter().any(|r| r.0 == psn) {
                    pending_acks.push((psn, ts));
                }
            }
            Role::Response => {
                s.responses += 1;
                match info.kind {
                    OpKind::Acknowledge => {
                        s.acks.ack_packets += 1;
                        match ib.headers.aeth.map(|a| a.syndrome) {
                            Some(Syndrome::Ack { .. }) => {
                                s.acks.positive += 1;
                                let mut asked = ackreq_since_ack.iter().any(|&r| psn.distance(r) >= 0);
                                if let Some(prev) = acked_to {
                                    let advance = psn.distance(prev).max(0);
                                    s.acks.psn_advance.push(advance as u64);
                                    if advance > 0 {
                                        asked |= count_in(&ackreq_psns, prev, psn) > 0;
                                    }
                                    let messages = if advance > 0 { count_in(&message_ends, prev, psn) } else { 0 };
                                    bump(&mut s.acks.messages_per_ack, messages as u64);
                                }
                                if !asked {
                                    s.acks.without_ackreq += 1;
                                }
                                ackreq_since_ack.clear();
                                answer_acks(psn, ts, s, &mut pending_acks);
                                acked_to = Some(later(acked_to, psn));
                            }
                            Some(Syndrome::RnrNak { .. }) => nak_seen = Some(NakSeen::Rnr),
                            Some(Syndrome::Nak(_)) => nak_seen = Some(NakSeen::Nak),
                            _ => {}
                        }
                    }
                    OpKind::AtomicAcknowledge => {
                        let answer = short_opcode(b.opcode);
                        match pending_answers.iter().position(|r| r.0 == psn) {
                            Some(at) => shapes.push(format!("{} -> {answer}", pending_answers.remove(at).2)),
                            None => early_answers.push((psn, answer)),
                        }
                        answer_acks(psn, ts, s, &mut pending_acks);
                        acked_to = Some(later(acked_to, psn));
                    }
                    _ => {
                        // A READ response.
                        if info.position.starts() {
                            response_first_psn = Some(psn);
                            if let Some(r) = pending_answers.iter().find(|r| r.0 == psn) {
                                s.timers.read_time_ns.push(ts.saturating_sub(r.1));
                            }
                        }
                        let mut done = Vec::new();
                        responses.push(info.position, &short_opcode(b.opcode), &mut done);
                        for answer in done {
                            let first = response_first_psn.unwrap_or(psn);
                            match pending_answers.iter().position(|r| r.0 == first) {
                                Some(at) => shapes.push(format!("{} -> {answer}", pending_answers.remove(at).2)),
                                None => early_answers.push((first, answer)),
                            }
                        }
                        if info.position.ends() {
                            answer_acks(psn, ts, s, &mut pending_acks);
                            acked_to = Some(later(acked_to, psn));
                        }
                    }
                }
            }
        }
    }
    requests.finish(&mut shapes);
    let mut done = Vec::new();
    responses.finish(&mut done);
    shapes.extend(done.into_iter().map(|d| format!("? -> {d}")));
    shapes.extend(early_answers.into_iter().map(|(_, a)| format!("? -> {a}")));
    shapes.extend(pending_answers.into_iter().map(|(_, _, n)| format!("{n} -> (no response)")));
    for shape in shapes {
        bump(&mut s.shapes, shape);
    }
}

/// How many PSNs of `set` lie in `(after, upto]`, modulo 2^24 (`upto` ahead of `after`).
fn count_in(set: &BTreeSet<u32>, after: Psn, upto: Psn) -> usize {
    let (from, to) = ((after + 1).value(), upto.value());
    if from <= to {
        set.range(from..=to).count()
    } else {
        set.range(from..).count() + set.range(..=to).count()
    }
}

/// Everything up to `psn` is acknowledged at `ts`: the AckReq-marked requests it covers are
/// answered (their ACK times go to `s`).
fn answer_acks(psn: Psn, ts: u64, s: &mut Stats, pending_acks: &mut Vec<(Psn, u64)>) {
    pending_acks.retain(|&(p, sent)| {
        let covered = psn.distance(p) >= 0;
        if covered {
            s.timers.ack_time_ns.push(ts.saturating_sub(sent));
        }
        !covered
    });
}

/// The later of two PSNs (the second when there is no first).
fn later(a: Option<Psn>, b: Psn) -> Psn {
    match a {
        Some(a) if a.distance(b) > 0 => a,
        _ => b,
    }
}

fn add_aeth(syndrome: Syndrome, msn: u32, prev_msn: &mut Option<u32>, a: &mut AethStats) {
    match syndrome {
        Syndrome::Ack { credits } => {
            a.ack += 1;
            bump(&mut a.credits, format!("{credits:#04x}"));
        }
        Syndrome::RnrNak { timer } => {
            a.rnr_nak += 1;
            bump(&mut a.rnr_timers, format!("{timer:#04x} ({})", duration(aeth::rnr_timer_ns(timer))));
        }
        Syndrome::Nak(code) => {
            a.nak += 1;
            bump(&mut a.nak_codes, nak_name(code));
        }
        Syndrome::Reserved(_) => a.reserved += 1,
    }
    match *prev_msn {
        None => bump(&mut a.first_msn, msn),
        Some(prev) => bump(&mut a.msn_steps, step24(msn, prev)),
    }
    *prev_msn = Some(msn);
}

/// Items 5 and 6: UDP and network-layer header fields.
fn add_headers(p: &Packet, dest_qp: u32, a: Annotation, s: &mut Stats) {
    let ib = &p.ib;
    if let (Some(sport), Some(dport)) = (ib.sport, ib.dport) {
        s.udp.sports.entry(sender(ib, dest_qp)).or_default().insert(sport);
        if sport >= 0xc000 {
            s.udp.sport_in_c000_ffff += 1;
        } else {
            s.udp.sport_below_c000 += 1;
        }
        bump(&mut s.udp.dports, dport);
    }
    match p.udp_checksum {
        Some(0) => s.ip.udp_checksum_zero += 1,
        Some(_) => s.ip.udp_checksum_nonzero += 1,
        None => {}
    }
    let (ttl, tos) = match p.net {
        Some(NetHeader::Ipv4 { ident, ttl, dont_frag, tos }) => {
            s.ip.ipv4 += 1;
            s.ip.ipv4_id_zero += u64::from(ident == 0);
            s.ip.dont_frag += u64::from(dont_frag);
            s.ip.ipv4_id_step_host_pair.add(a.id_step_host_pair);
            s.ip.ipv4_id_step_qp.add(a.id_step_qp);
            (ttl, tos)
        }
        Some(NetHeader::Ipv6 { hop_limit, traffic_class }) => {
            s.ip.ipv6 += 1;
            (hop_limit, traffic_class)
        }
        None => return,
    };
    bump(&mut s.ip.ttl, ttl);
    bump(&mut s.ip.dscp, tos >> 2);
    bump(&mut s.ip.ecn, tos & 3);
}

// ---------------------------------------------------------------------------------------------
// Text

/// Transports in the order the text shows them.
const TRANSPORT_ORDER: [&str; 7] = ["RC", "UC", "UD", "XRC", "RD", "CNP", "MANUFACTURER"];

/// Nanoseconds as a short human duration.
fn duration(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}us", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.2}s", ns as f64 / 1e9),
    }
}

/// `median M (min A, max B, n N)`, or `none`.
fn samples_text(s: &Samples, unit: fn(u64) -> String) -> String {
    match s.summary() {
        None => "none".to_string(),
        Some(x) => format!("median {} (min {}, max {}, n={})", unit(x.median), unit(x.min), unit(x.max), x.n),
    }
}

/// `k:v k:v` of a map (the first ten entries), or `none`.
fn map_text<K: fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    const MAX: usize = 10;
    if m.is_empty() {
        return "none".to_string();
    }
    let mut parts = m.iter().take(MAX).map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>();
    if m.len() > MAX {
        parts.push(format!("... {} more", m.len() - MAX));
    }
    parts.join(" ")
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "-".to_string()
    } else {
        format!("{:.2}", a as f64 / b as f64)
    }
}

/// At most this many message shapes are listed in the text (all are in the JSON).
const MAX_SHAPES: usize = 8;

/// The lines of one set of measurements, as `(key, value)`.
fn stats_lines(s: &Stats) -> Vec<(&'static str, String)> {
    let mut l = Vec::new();
    let opcodes = s.opcodes.0.iter().map(|(op, n)| format!("{}:{n}", short_opcode(Opcode(*op)))).collect::<Vec<_>>();
    l.push(("opcodes", opcodes.join(" ")));
    let mut shapes: Vec<_> = s.shapes.iter().collect();
    shapes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut shown = shapes.iter().take(MAX_SHAPES).map(|(k, n)| format!("{n}x {k}")).collect::<Vec<_>>();
    if shapes.len() > MAX_SHAPES {
        shown.push(format!("... {} more", shapes.len() - MAX_SHAPES));
    }
    l.push(("shapes", if shown.is_empty() { "none".into() } else { shown.join(", ") }));
    let b = &s.bth;
    l.push((
        "bth",
        format!(
            "P_Key {}; MigReq {}, SE {}, FECN {}, BECN {} of {}",
            map_text(&b.pkeys),
            b.mig_req,
            b.solicited,
            b.fecn,
            b.becn,
            s.packets
        ),
    ));
    let a = &s.ackreq;
    l.push((
        "ackreq",
        format!(
            "ONLY/LAST {}/{}, FIRST/MIDDLE {}/{}; spacing {}",
            a.only_last_marked,
            a.only_last,
            a.first_middle_marked,
            a.first_middle,
            samples_text(&a.spacing, |n| n.to_string())
        ),
    ));
    let k = &s.acks;
    l.push((
        "acks",
        format!(
            "{} ACK packets ({} positive) for {} requests ({} requests/ACK); without AckReq {}",
            k.ack_packets,
            k.positive,
            s.requests,
            ratio(s.requests, k.ack_packets),
            k.without_ackreq
        ),
    ));
    l.push((
        "ack cover",
        format!(
            "messages/ACK {}; PSN advance {}",
            map_text(&k.messages_per_ack),
            samples_text(&k.psn_advance, |n| n.to_string())
        ),
    ));
    let e = &s.aeth;
    l.push((
        "aeth",
        format!(
            "ACK {} (credits {}), RNR NAK {} (timers {}), NAK {} ({}){}",
            e.ack,
            map_text(&e.credits),
            e.rnr_nak,
            map_text(&e.rnr_timers),
            e.nak,
            map_text(&e.nak_codes),
            if e.reserved > 0 { format!(", reserved {}", e.reserved) } else { String::new() }
        ),
    ));
    let mut steps = [0u64; 4];
    for (&d, &n) in &e.msn_steps {
        steps[match d {
            ..0 => 3,
            0 => 0,
            1 => 1,
            _ => 2,
        }] += n;
    }
    let steps = ["+0", "+1", ">+1", "<0"]
        .iter()
        .zip(steps)
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k}:{n}"))
        .collect::<Vec<_>>();
    l.push((
        "msn",
        format!(
            "first {}; steps {}",
            map_text(&e.first_msn),
            if steps.is_empty() { "none".to_string() } else { steps.join(" ") }
        ),
    ));
    let u = &s.udp;
    let one_port = u.sports.values().filter(|p| p.len() == 1).count();
    let distinct: BTreeSet<u16> = u.sports.values().flatten().copied().collect();
    let range = match (u.sport_in_c000_ffff, u.sport_below_c000) {
        (0, 0) => "no UDP".to_string(),
        (_, 0) => "all in 0xC000-0xFFFF".to_string(),
        (0, _) => "none in 0xC000-0xFFFF".to_string(),
        (i, o) => format!("{i} in 0xC000-0xFFFF, {o} below"),
    };
    l.push((
        "udp sport",
        format!(
            "{} sending QPs, {} on one port, {} distinct ports, {range}; dport {}",
            u.sports.len(),
            one_port,
            distinct.len(),
            map_text(&u.dports)
        ),
    ));
    let ip = &s.ip;
    let steps = |x: &Steps| format!("+1 {}/{} (same {}, other {})", x.plus_one, x.total(), x.same, x.other);
    l.push((
        "ipv4 id",
        if ip.ipv4 == 0 {
            "no IPv4".to_string()
        } else {
            format!(
                "per host pair {}; per QP {}; zero {}/{}",
                steps(&ip.ipv4_id_step_host_pair),
                steps(&ip.ipv4_id_step_qp),
                ip.ipv4_id_zero,
                ip.ipv4
            )
        },
    ));
    l.push((
        "ip",
        format!(
            "IPv4 {}, IPv6/GRH {}; TTL {}; DF {}/{}; DSCP {}; ECN {}; UDP csum zero {}, non-zero {}",
            ip.ipv4,
            ip.ipv6,
            map_text(&ip.ttl),
            ip.dont_frag,
            ip.ipv4,
            map_text(&ip.dscp),
            map_text(&ip.ecn),
            ip.udp_checksum_zero,
            ip.udp_checksum_nonzero
        ),
    ));
    let t = &s.timers;
    l.push((
        "ack time",
        format!(
            "{}; {} requests captured after their answer",
            samples_text(&t.ack_time_ns, duration),
            t.responses_before_request
        ),
    ));
    l.push(("read time", samples_text(&t.read_time_ns, duration)));
    l.push((
        "retransmit",
        format!(
            "{} packets in {} bursts ({} after NAK, {} after RNR NAK); gap {}",
            t.retransmitted,
            t.resend_bursts,
            t.bursts_after_nak,
            t.bursts_after_rnr,
            samples_text(&t.resend_gap_ns, duration)
        ),
    ));
    l.push((
        "icrc",
        format!(
            "valid {}, invalid {}, unchecked {}{}",
            s.icrc.valid,
            s.icrc.invalid,
            s.icrc.unchecked,
            if s.truncated > 0 { format!(" ({} truncated frames)", s.truncated) } else { String::new() }
        ),
    ));
    l
}

/// At most this many conversations are listed per transport in the text.
const MAX_CONVERSATION_LINES: usize = 12;

fn conversation_line(c: &Conversation) -> String {
    let qp = |q: Option<u32>| q.map_or_else(|| "?".to_string(), |q| format!("{q:#x}"));
    let resp_qps = if c.response_qps.is_empty() {
        "-".to_string()
    } else {
        c.response_qps.iter().map(|q| format!("{q:#x}")).collect::<Vec<_>>().join(",")
    };
    let mut shapes: Vec<_> = c.stats.shapes.iter().collect();
    shapes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let top = shapes.iter().take(2).map(|(k, n)| format!("{n}x {k}")).collect::<Vec<_>>().join(", ");
    format!(
        "{} > {} qp {} (back to qp {}): {} req, {} resp; {}",
        c.requester,
        c.responder,
        qp(c.request_qp),
        resp_qps,
        c.stats.requests,
        c.stats.responses,
        if top.is_empty() { "no messages".to_string() } else { top }
    )
}

/// The text section of one file.
pub fn text(r: &FileReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} frames, {} RoCE packets ({} not RoCE, {} truncated, {} malformed and {} without BTH skipped, {} unknown opcodes); ICRC valid {}, invalid {}, unchecked {}",
        r.file,
        r.frames,
        r.roce_packets,
        r.not_roce,
        r.truncated,
        r.skipped_malformed,
        r.skipped_no_bth,
        r.unknown_opcodes,
        r.icrc.valid,
        r.icrc.invalid,
        r.icrc.unchecked
    );
    if let Some(e) = &r.read_error {
        let _ = writeln!(out, "  file damaged after frame {}: {e}", r.frames);
    }
    let mut names: Vec<&str> = r.transports.keys().copied().collect();
    names.sort_by_key(|n| TRANSPORT_ORDER.iter().position(|t| t == n).unwrap_or(TRANSPORT_ORDER.len()));
    for name in names {
        let t = &r.transports[name];
        let s = &t.stats;
        let _ = writeln!(
            out,
            "{name}: {} packets ({} requests, {} responses, {} other), {} conversations",
            s.packets, s.requests, s.responses, s.other, t.conversations
        );
        for (k, v) in stats_lines(s) {
            let _ = writeln!(out, "  {:<12}{v}", format!("{k}:"));
        }
        let convs: Vec<_> = r.conversations.iter().filter(|c| c.transport == name).collect();
        for c in convs.iter().take(MAX_CONVERSATION_LINES) {
            let _ = writeln!(out, "  {:<12}{}", "conv:", conversation_line(c));
        }
        if convs.len() > MAX_CONVERSATION_LINES {
            let _ = writeln!(out, "  {:<12}... {} more (see --json)", "conv:", convs.len() - MAX_CONVERSATION_LINES);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn capture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures").join(name)
    }

    fn report(name: &str) -> FileReport {
        let cap = load(&capture(name)).expect("capture readable");
        analyse(name, &cap)
    }

    #[test]
    fn shapes_are_built_from_positions() {
        let mut b = ShapeBuilder::default();
        let mut done = Vec::new();
        for (pos, name) in [
            (Position::First, "SEND_FIRST"),
            (Position::Middle, "SEND_MIDDLE"),
            (Position::Middle, "SEND_MIDDLE"),
            (Position::Last, "SEND_LAST_WITH_IMMEDIATE"),
            (Position::Only, "WRITE_ONLY"),
            (Position::First, "WRITE_FIRST"),
            (Position::Middle, "WRITE_MIDDLE"),
            (Position::First, "WRITE_FIRST"),
            (Position::Last, "WRITE_LAST"),
            (Position::Middle, "WRITE_MIDDLE"),
        ] {
            b.push(pos, name, &mut done);
        }
        b.finish(&mut done);
        assert_eq!(
            done,
            [
                "SEND_FIRST MIDDLE*2 LAST_WITH_IMMEDIATE",
                "WRITE_ONLY",
                "WRITE_FIRST MIDDLE (unfinished)",
                "WRITE_FIRST LAST",
                "? MIDDLE (unfinished)",
            ]
        );
        assert_eq!(short_name("RC_RDMA_READ_RESPONSE_MIDDLE"), "READ_RESPONSE_MIDDLE");
        assert_eq!(short_name("XRC_SEND_ONLY"), "SEND_ONLY");
        assert_eq!(short_name("CNP"), "CNP");
    }

    #[test]
    fn samples_summarise() {
        let mut s = Samples::default();
        assert_eq!(s.summary(), None);
        for v in [5, 1, 9, 3] {
            s.push(v);
        }
        assert_eq!(s.summary(), Some(Summary { n: 4, min: 1, median: 3, max: 9 }));
        assert_eq!(duration(999), "999ns");
        assert_eq!(duration(1_500), "1.5us");
        assert_eq!(duration(2_500_000), "2.50ms");
    }

    /// rxe-2guests-all.pcap: perftest and the pingpong examples between two rxe guests.
    #[test]
    fn rxe_all_workloads() {
        let r = report("rxe-2guests-all.pcap");
        assert_eq!((r.frames, r.roce_packets, r.not_roce), (824, 800, 24));
        assert_eq!((r.skipped_malformed, r.skipped_no_bth, r.truncated), (0, 0, 0));
        assert_eq!((r.icrc.valid, r.icrc.invalid, r.icrc.unchecked), (800, 0, 0));
        assert_eq!(r.transports.keys().copied().collect::<Vec<_>>(), ["RC", "UD"]);
        let rc = &r.transports["RC"].stats;
        let ud = &r.transports["UD"].stats;
        assert_eq!(rc.packets + ud.packets, 800);
        assert_eq!(ud.packets, 60);

        // 1. Shapes (PMTU 1024): 4 KiB pingpong SENDs in both directions, 8 KiB WRITEs and
        //    READs, FETCH_ADD answered by ATOMIC_ACKNOWLEDGE, 2 KiB SENDs, 32-byte WRITE_ONLYs.
        assert_eq!(rc.opcodes.get("RC_FETCH_ADD"), 20);
        assert_eq!(rc.opcodes.get("RC_ATOMIC_ACKNOWLEDGE"), 20);
        assert_eq!(rc.shapes["FETCH_ADD -> ATOMIC_ACKNOWLEDGE"], 20);
        assert_eq!(rc.shapes["READ_REQUEST -> READ_RESPONSE_FIRST MIDDLE*6 LAST"], 20);
        assert_eq!(rc.shapes["SEND_FIRST MIDDLE*2 LAST"], 40);
        assert_eq!(rc.shapes["WRITE_FIRST MIDDLE*6 LAST"], 20);
        assert_eq!(rc.shapes["SEND_FIRST LAST"], 20);
        assert_eq!(rc.shapes["WRITE_ONLY"], 40);
        assert_eq!(rc.shapes.len(), 6, "{:?}", rc.shapes);
        assert_eq!(ud.shapes["SEND_ONLY"], 60);

        // 2. rxe asks for an ACK on every message-ending packet and on no other.
        assert_eq!(rc.ackreq.only_last_marked, rc.ackreq.only_last);
        assert_eq!(rc.ackreq.first_middle_marked, 0);
        assert!(rc.ackreq.first_middle > 0);

        // 3. One ACK per message, each answering an AckReq (nothing coalesced, no duplicates).
        assert_eq!(rc.acks.messages_per_ack.keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(rc.acks.without_ackreq, 0);
        assert_eq!(rc.acks.ack_packets, rc.acks.positive);

        // 4. ACK syndrome 0x1f ("no credit information") on every AETH; no NAK of any kind.
        assert_eq!(rc.aeth.credits.keys().collect::<Vec<_>>(), ["0x1f"]);
        assert_eq!((rc.aeth.nak, rc.aeth.rnr_nak, rc.aeth.reserved), (0, 0, 0));
        assert_eq!(rc.aeth.first_msn.keys().copied().collect::<Vec<_>>(), [1]);

        // 5. One stable source port per sending QP, all in 0xC000-0xFFFF; destination 4791.
        for s in [rc, ud] {
            assert!(s.udp.sports.values().all(|p| p.len() == 1), "{:?}", s.udp.sports);
            assert_eq!(s.udp.sport_below_c000, 0);
            assert_eq!(s.udp.dports.keys().copied().collect::<Vec<_>>(), [4791]);
        }

        // 6. IPv4 IDs step by one per host pair; TTL 64, DF, DSCP/ECN 0, UDP checksum 0.
        let all_ip = [&rc.ip, &ud.ip];
        let steps: u64 = all_ip.iter().map(|ip| ip.ipv4_id_step_host_pair.total()).sum();
        let plus_one: u64 = all_ip.iter().map(|ip| ip.ipv4_id_step_host_pair.plus_one).sum();
        assert_eq!(steps, 798);
        assert!(plus_one * 10 >= steps * 9, "{plus_one}/{steps}");
        for ip in all_ip {
            assert_eq!(ip.ttl.keys().copied().collect::<Vec<_>>(), [64]);
            assert_eq!(ip.dont_frag, ip.ipv4);
            assert_eq!(ip.udp_checksum_nonzero, 0);
            assert_eq!(ip.dscp.keys().copied().collect::<Vec<_>>(), [0]);
        }

        // 7. No retransmission; every AckReq and every READ answered.
        assert_eq!(rc.timers.retransmitted, 0);
        assert_eq!(rc.timers.read_time_ns.summary().map(|s| s.n), Some(20));
        // The bridge capture shows five responses before the request they answer (four ACKs of
        // ib_write_bw's WRITE_LASTs, one ATOMIC_ACKNOWLEDGE): those are not timed.
        assert_eq!(rc.timers.responses_before_request, 5);
        assert_eq!(
            rc.timers.ack_time_ns.summary().map(|s| s.n as u64 + 5),
            Some(rc.ackreq.only_last_marked - rc.opcodes.get("RC_RDMA_READ_REQUEST"))
        );
    }

    /// rxe-rc-ud-pingpong-n20.pcap: one RC message (4 packets) sent again under emulation
    /// jitter, after its ACK; rxe re-ACKs each duplicate packet.
    #[test]
    fn rxe_pingpong_retransmission() {
        let r = report("rxe-rc-ud-pingpong-n20.pcap");
        assert_eq!((r.roce_packets, r.icrc.valid), (248, 248));
        let rc = &r.transports["RC"].stats;
        assert_eq!(rc.timers.retransmitted, 4);
        assert_eq!(rc.timers.resend_bursts, 1);
        assert_eq!((rc.timers.bursts_after_nak, rc.timers.bursts_after_rnr), (0, 0));
        // The resent message is counted as a message again.
        assert_eq!(rc.shapes["SEND_FIRST MIDDLE*2 LAST"], 41);
        // Four duplicate ACKs (PSN advance 0), three of them answering packets without AckReq.
        assert_eq!(rc.acks.messages_per_ack.get(&0), Some(&4));
        assert_eq!(rc.acks.without_ackreq, 3);
        assert_eq!(rc.aeth.msn_steps.get(&0), Some(&4));
        // The resends are all in one conversation (192.168.77.10 > 192.168.77.11, qp 0x11).
        let resent: Vec<_> = r.conversations.iter().filter(|c| c.stats.timers.retransmitted > 0).collect();
        assert_eq!(resent.len(), 1);
        assert_eq!(resent[0].requester.to_string(), "192.168.77.10");
        assert_eq!(resent[0].request_qp, Some(0x11));
        assert!(resent[0].response_qps.contains(&0x11));
    }

    /// One packet of every opcode (the project's own encoder, random field values): every
    /// transport is recognised and nothing breaks on packets that make no conversation sense.
    #[test]
    fn every_opcode_is_classified() {
        let dir = tempfile::tempdir().expect("temp dir");
        for seed in 1..=5 {
            let path = dir.path().join(format!("every-{seed}.pcap"));
            let mut w = crate::PcapWriter::new(std::fs::File::create(&path).expect("create"), crate::Resolution::Micro)
                .expect("writer");
            for (i, s) in crate::samples::every_opcode(seed).iter().enumerate() {
                w.write_packet(1_767_225_600_000_000_000 + i as u64 * 1000, &s.frame, s.frame.len() as u32)
                    .expect("write");
            }
            w.finish().expect("finish");
            let r = analyse("every", &load(&path).expect("capture readable"));
            assert_eq!(r.transports.keys().copied().collect::<Vec<_>>(), ["CNP", "RC", "RD", "UC", "UD", "XRC"]);
            assert_eq!(r.transports["CNP"].stats.other, 1);
            assert_eq!(r.transports["UD"].stats.shapes.values().sum::<u64>(), 2);
            let analysed: u64 = r.transports.values().map(|t| t.stats.packets).sum();
            assert_eq!(analysed, r.roce_packets);
            assert!(r.unknown_opcodes >= 1);
            text(&r);
        }
    }

    /// Every reference capture goes through without error, whatever it holds (truncated frames,
    /// bad ICRCs, Mellanox-only opcodes, RoCEv1), and the counts add up.
    #[test]
    fn every_capture_is_analysed() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("captures directory") {
            let path = entry.expect("directory entry").path();
            if !matches!(path.extension().and_then(|e| e.to_str()), Some("pcap" | "pcapng")) {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let cap = load(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let r = analyse(&name, &cap);
            let analysed: u64 = r.transports.values().map(|t| t.stats.packets).sum();
            assert_eq!(analysed + r.skipped_malformed + r.skipped_no_bth, r.roce_packets, "{name}");
            assert_eq!(r.frames, r.roce_packets + r.not_roce, "{name}");
            let per_conv: u64 = r.conversations.iter().map(|c| c.stats.packets).sum();
            assert_eq!(per_conv, analysed, "{name}");
            assert!(text(&r).starts_with(&name));
            serde_json::to_string(&r).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen += 1;
        }
        assert!(seen >= 15, "only {seen} captures in {}", dir.display());
        // The truncated one is still analysed from its headers.
        let nccl = report("rdma-nccl2.pcap");
        assert_eq!(nccl.truncated, 489);
        assert!(nccl.transports.contains_key("UC"));
    }
}
