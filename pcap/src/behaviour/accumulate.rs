//! Adding one conversation's packets to its transport's statistics (opcodes and message shapes,
//! AckReq, ACK coalescing, AETH, timers and retransmissions, headers).

use super::conversation::{sender, Annotation};
use super::text::duration;
use softrdma_engine::wire::{BthRepr, OpcodeInfo};

use super::*;

/// An opcode name without its transport prefix and without `RDMA_`: `RC_RDMA_WRITE_ONLY` ->
/// `WRITE_ONLY`.
pub(super) fn short_name(name: &str) -> &str {
    let rest = match name.split_once('_') {
        Some((t, rest)) if ["RC", "UC", "RD", "UD", "XRC"].contains(&t) => rest,
        _ => name,
    };
    rest.strip_prefix("RDMA_").unwrap_or(rest)
}

pub(super) fn short_opcode(op: Opcode) -> String {
    short_name(&op.to_string()).to_string()
}

/// Builds message shapes (`SEND_FIRST MIDDLE*2 LAST`) from a packet sequence.
#[derive(Debug, Default)]
pub(super) struct ShapeBuilder {
    /// The open message: its first packet's name and the MIDDLE packets since.
    pub(super) open: Option<(String, u64)>,
}

impl ShapeBuilder {
    pub(super) fn shape(first: &str, middles: u64, last: &str) -> String {
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
    pub(super) fn push(&mut self, position: Position, name: &str, done: &mut Vec<String>) {
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
    pub(super) fn finish(&mut self, done: &mut Vec<String>) {
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
/// The steps: index the requests' PSNs ([`Walk::new`]), then per packet its headers
/// ([`Walk::headers`]) and by role a request ([`Walk::request`]), an ACK or NAK
/// ([`Walk::acknowledge`]), an atomic ACK ([`Walk::atomic_ack`]) or a READ response
/// ([`Walk::read_response`]), and last the messages left open ([`Walk::finish`]).
pub(super) fn accumulate(cap: &Capture, annotations: &[Annotation], conv: &Conversation, s: &mut Stats) {
    let mut walk = Walk::new(cap, conv);
    for &i in &conv.members {
        let p = &cap.packets[i];
        let Some(b) = p.ib.headers.bth else { continue };
        walk.headers(p, &b, annotations[i], s);
        let Some(info) = b.opcode.info() else {
            s.other += 1;
            continue;
        };
        match role(b.opcode) {
            Role::Other => s.other += 1,
            Role::Request => walk.request(&b, info, p.ts_ns, s),
            Role::Response => {
                s.responses += 1;
                match info.kind {
                    OpKind::Acknowledge => walk.acknowledge(p, b.psn, s),
                    OpKind::AtomicAcknowledge => walk.atomic_ack(&b, p.ts_ns, s),
                    _ => walk.read_response(&b, info, p.ts_ns, s),
                }
            }
        }
    }
    walk.finish(s);
}

/// The state of one conversation's walk through its packets ([`accumulate`]).
struct Walk {
    /// PSNs of the requests that end a message.
    message_ends: BTreeSet<u32>,
    /// PSNs of the AckReq-marked requests.
    ackreq_psns: BTreeSet<u32>,
    requests: ShapeBuilder,
    responses: ShapeBuilder,
    /// The PSN of the READ response that opened the response message under way.
    response_first_psn: Option<Psn>,
    /// Message shapes finished so far.
    shapes: Vec<String>,
    /// READ and atomic requests waiting for their answer (PSN, time, name).
    pending_answers: Vec<(Psn, u64, String)>,
    /// Answers that came before their request (PSN, shape).
    early_answers: Vec<(Psn, String)>,
    /// AckReq-marked requests (other than READs) waiting for an ACK: PSN, time.
    pending_acks: Vec<(Psn, u64)>,
    /// AckReq-marked requests seen since the last positive ACK: their PSNs.
    ackreq_since_ack: Vec<Psn>,
    /// Requests seen, and the index of the last AckReq-marked one.
    request_index: u64,
    last_ackreq_at: Option<u64>,
    /// The highest PSN a response acknowledged.
    acked_to: Option<Psn>,
    prev_msn: Option<u32>,
    /// When each request PSN was first sent.
    first_sent: HashMap<u32, u64>,
    prev_was_resend: bool,
    /// The NAK that may explain the next resend.
    nak_seen: Option<NakSeen>,
}

impl Walk {
    /// Indexes the conversation's requests: the PSNs that end a message and the AckReq-marked
    /// ones.
    fn new(cap: &Capture, conv: &Conversation) -> Walk {
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
        Walk {
            message_ends,
            ackreq_psns,
            requests: ShapeBuilder::default(),
            responses: ShapeBuilder::default(),
            response_first_psn: None,
            shapes: Vec::new(),
            pending_answers: Vec::new(),
            early_answers: Vec::new(),
            pending_acks: Vec::new(),
            ackreq_since_ack: Vec::new(),
            request_index: 0,
            last_ackreq_at: None,
            acked_to: conv.psn_range.map(|(lo, _)| lo - 1),
            prev_msn: None,
            first_sent: HashMap::new(),
            prev_was_resend: false,
            nak_seen: None,
        }
    }

    /// What every packet with a BTH adds: its opcode, the BTH's fields, the ICRC, the UDP and
    /// network headers, and its AETH.
    fn headers(&mut self, p: &Packet, b: &BthRepr, a: Annotation, s: &mut Stats) {
        let ib = &p.ib;
        s.packets += 1;
        s.truncated += u64::from(p.truncated);
        bump(&mut s.opcodes.0, b.opcode.0);
        bump(&mut s.bth.pkeys, format!("{:#06x}", b.pkey));
        s.bth.mig_req += u64::from(b.mig_req);
        s.bth.solicited += u64::from(b.solicited);
        s.bth.fecn += u64::from(b.fecn);
        s.bth.becn += u64::from(b.becn);
        s.icrc.add(ib);
        add_headers(p, b.dest_qp.value(), a, s);
        if let Some(aeth) = ib.headers.aeth {
            add_aeth(aeth.syndrome, aeth.msn.value(), &mut self.prev_msn, &mut s.aeth);
        }
    }

    /// A request: AckReq placement and spacing, a resend (and the NAK it follows), its message
    /// shape, and what now waits for an ACK or an answer.
    fn request(&mut self, b: &BthRepr, info: &OpcodeInfo, ts: u64, s: &mut Stats) {
        let psn = b.psn;
        s.requests += 1;
        self.request_index += 1;
        if info.position.ends() {
            s.ackreq.only_last += 1;
            s.ackreq.only_last_marked += u64::from(b.ack_req);
        } else {
            s.ackreq.first_middle += 1;
            s.ackreq.first_middle_marked += u64::from(b.ack_req);
        }
        if b.ack_req {
            if let Some(prev) = self.last_ackreq_at {
                s.ackreq.spacing.push(self.request_index - prev);
            }
            self.last_ackreq_at = Some(self.request_index);
            self.ackreq_since_ack.push(psn);
        }
        let mut answered_already = self.resend(psn, ts, s);
        let name = short_opcode(b.opcode);
        if matches!(info.kind, OpKind::ReadRequest | OpKind::CompareSwap | OpKind::FetchAdd) {
            if let Some(at) = self.early_answers.iter().position(|r| r.0 == psn) {
                let (_, answer) = self.early_answers.remove(at);
                self.shapes.push(format!("{name} -> {answer}"));
                answered_already = true;
            } else if !self.pending_answers.iter().any(|r| r.0 == psn) {
                self.pending_answers.push((psn, ts, name));
            }
        } else {
            self.requests.push(info.position, &name, &mut self.shapes);
        }
        if answered_already {
            s.timers.responses_before_request += 1;
        } else if b.ack_req && info.kind != OpKind::ReadRequest && !self.pending_acks.iter().any(|r| r.0 == psn) {
            self.pending_acks.push((psn, ts));
        }
    }

    /// Whether the request at `psn` is a resend (counted with its gap and burst in `s`); for a
    /// first sending, whether a response already covered its PSN (it was captured after its
    /// answer).
    fn resend(&mut self, psn: Psn, ts: u64, s: &mut Stats) -> bool {
        if let Some(&first) = self.first_sent.get(&psn.value()) {
            s.timers.retransmitted += 1;
            s.timers.resend_gap_ns.push(ts.saturating_sub(first));
            if !self.prev_was_resend {
                s.timers.resend_bursts += 1;
                match self.nak_seen.take() {
                    Some(NakSeen::Nak) => s.timers.bursts_after_nak += 1,
                    Some(NakSeen::Rnr) => s.timers.bursts_after_rnr += 1,
                    None => {}
                }
            }
            self.prev_was_resend = true;
            false
        } else {
            self.first_sent.insert(psn.value(), ts);
            self.prev_was_resend = false;
            self.acked_to.is_some_and(|a| a.distance(psn) >= 0)
        }
    }

    /// An ACK or NAK: for a positive ACK, how far it moved the acknowledged PSN, how many
    /// messages it completed, whether an AckReq asked for it, and the ACK times it answers; a
    /// NAK is kept to explain the next resend.
    fn acknowledge(&mut self, p: &Packet, psn: Psn, s: &mut Stats) {
        s.acks.ack_packets += 1;
        match p.ib.headers.aeth.map(|a| a.syndrome) {
            Some(Syndrome::Ack { .. }) => {
                s.acks.positive += 1;
                let mut asked = self.ackreq_since_ack.iter().any(|&r| psn.distance(r) >= 0);
                if let Some(prev) = self.acked_to {
                    let advance = psn.distance(prev).max(0);
                    s.acks.psn_advance.push(advance as u64);
                    if advance > 0 {
                        asked |= count_in(&self.ackreq_psns, prev, psn) > 0;
                    }
                    let messages = if advance > 0 { count_in(&self.message_ends, prev, psn) } else { 0 };
                    bump(&mut s.acks.messages_per_ack, messages as u64);
                }
                if !asked {
                    s.acks.without_ackreq += 1;
                }
                self.ackreq_since_ack.clear();
                self.acknowledged(psn, p.ts_ns, s);
            }
            Some(Syndrome::RnrNak { .. }) => self.nak_seen = Some(NakSeen::Rnr),
            Some(Syndrome::Nak(_)) => self.nak_seen = Some(NakSeen::Nak),
            _ => {}
        }
    }

    /// An atomic ACK: it answers its request (or waits for it) and acknowledges its PSN.
    fn atomic_ack(&mut self, b: &BthRepr, ts: u64, s: &mut Stats) {
        let answer = short_opcode(b.opcode);
        self.answer(b.psn, answer);
        self.acknowledged(b.psn, ts, s);
    }

    /// A READ response packet: the READ's time at its first, the response message's shape, and
    /// at its last the acknowledgement of its PSN.
    fn read_response(&mut self, b: &BthRepr, info: &OpcodeInfo, ts: u64, s: &mut Stats) {
        let psn = b.psn;
        if info.position.starts() {
            self.response_first_psn = Some(psn);
            if let Some(r) = self.pending_answers.iter().find(|r| r.0 == psn) {
                s.timers.read_time_ns.push(ts.saturating_sub(r.1));
            }
        }
        let mut done = Vec::new();
        self.responses.push(info.position, &short_opcode(b.opcode), &mut done);
        for answer in done {
            let first = self.response_first_psn.unwrap_or(psn);
            self.answer(first, answer);
        }
        if info.position.ends() {
            self.acknowledged(psn, ts, s);
        }
    }

    /// An answer to the READ or atomic at `psn`: its shape if the request was seen, else it
    /// waits for it.
    fn answer(&mut self, psn: Psn, answer: String) {
        match self.pending_answers.iter().position(|r| r.0 == psn) {
            Some(at) => self.shapes.push(format!("{} -> {answer}", self.pending_answers.remove(at).2)),
            None => self.early_answers.push((psn, answer)),
        }
    }

    /// Everything up to `psn` is acknowledged at `ts`.
    fn acknowledged(&mut self, psn: Psn, ts: u64, s: &mut Stats) {
        answer_acks(psn, ts, s, &mut self.pending_acks);
        self.acked_to = Some(later(self.acked_to, psn));
    }

    /// The messages still open, answers without requests and requests without answers become
    /// shapes of their own; the shapes go to `s`.
    fn finish(mut self, s: &mut Stats) {
        self.requests.finish(&mut self.shapes);
        let mut done = Vec::new();
        self.responses.finish(&mut done);
        let mut shapes = self.shapes;
        shapes.extend(done.into_iter().map(|d| format!("? -> {d}")));
        shapes.extend(self.early_answers.into_iter().map(|(_, a)| format!("? -> {a}")));
        shapes.extend(self.pending_answers.into_iter().map(|(_, _, n)| format!("{n} -> (no response)")));
        for shape in shapes {
            bump(&mut s.shapes, shape);
        }
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
