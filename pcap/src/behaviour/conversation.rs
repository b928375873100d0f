//! Conversations: a capture's packets grouped by the QP pair they pass between, each packet
//! annotated with its sender and direction.

use super::*;

/// Source and destination address; an IPv4-mapped GID (RoCEv1) as the IPv4 address it maps, so
/// that RoCEv1 and RoCEv2 packets between the same hosts meet.
pub(super) fn ends(ib: &IbFrame) -> (IpAddr, IpAddr) {
    (ib.src.to_canonical(), ib.dst.to_canonical())
}

/// The name of the QP a packet is sent by: a UD QP by its DETH source QP, a connected QP by the
/// flow it sends on (the BTH does not name the sender).
pub(super) fn sender(ib: &IbFrame, dest_qp: u32) -> String {
    match ib.headers.deth {
        Some(d) => format!("{} qp {:#x}", ends(ib).0, d.src_qp.value()),
        None => format!("{} > {} qp {:#x}", ends(ib).0, ends(ib).1, dest_qp),
    }
}

/// Per-packet facts that need the whole file: IPv4 ID steps.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Annotation {
    pub(super) id_step_host_pair: Option<u16>,
    pub(super) id_step_qp: Option<u16>,
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
    pub(super) psn_range: Option<(Psn, Psn)>,
    #[serde(skip)]
    /// Indices into [`Capture::packets`] of its packets, in capture order.
    pub members: Vec<usize>,
}

impl Conversation {
    pub(super) fn new(transport: &'static str, requester: IpAddr, responder: IpAddr, request_qp: Option<u32>) -> Self {
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
    pub(super) fn answers(&self, psn: Psn) -> bool {
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

/// The conversations of the usable packets (`usable`: indices of packets with a BTH that are not
/// malformed), in the order of their first packets.
pub fn conversations(cap: &Capture, usable: &[usize]) -> Vec<Conversation> {
    let mut convs = group(cap, usable);
    convs.sort_by_key(|c| c.first_frame);
    convs
}

/// IPv4 ID steps per host pair and per sending QP, in capture order.
pub(super) fn annotate(cap: &Capture, usable: &[usize]) -> Vec<Annotation> {
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
