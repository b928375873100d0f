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

mod accumulate;
mod conversation;
mod stats;
mod text;

use conversation::annotate;
pub use conversation::{conversations, Conversation};
pub use stats::*;
pub use text::text;

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
        accumulate::accumulate(cap, &annotations, c, &mut t.stats);
        let mut own = Stats::default();
        accumulate::accumulate(cap, &annotations, c, &mut own);
        c.stats = own;
    }
    r.conversations = convs;
    r
}

#[cfg(test)]
mod tests;
