//! `softrdma pcap replay`: would softrdma have answered a recorded conversation the way the
//! recorded implementation did?
//!
//! Each conversation of a capture (grouped as `pcap behaviour` groups them: the requests one
//! address sends to one QP, with the responses coming back) is replayed in virtual time against a
//! softrdma engine device set up to match it:
//!
//! - **as responder**: the engine plays the recorded responder. The recorded requests are fed to
//!   it at their recorded times (relative to the conversation's first packet), and what it sends
//!   back is compared with the recorded responses: READ responses and atomic ACKs packet by packet
//!   (opcode, length, AETH, header fields, and the payload or original value where the trace
//!   itself wrote those bytes); ACKs by what they acknowledge, since coalescing depends on timing:
//!   a recorded ACK of PSN p matches when softrdma acknowledged p too (its MSN and credits are
//!   compared when softrdma's ACK names the same PSN); a NAK matches a softrdma NAK of the same PSN
//!   and code.
//! - **as requester**: the engine plays the recorded requester. The work requests are inferred
//!   from the recorded messages (boundaries, opcodes, lengths, RETH/AtomicETH operands and the
//!   payload bytes), posted at the time of each message's first packet, the recorded responses are
//!   fed back at their times, and the request packets softrdma sends are compared with the
//!   recorded ones PSN by PSN (opcode, length, AckReq, header fields, operands, payload).
//!
//! RC, UC, UD and XRC conversations replay (UC and UD have no answers: as responder the report
//! counts the packets delivered and the receives completed; an XRC responder is an XRC target QP
//! with an XRC SRQ per SRQ number the XRCETHs name, an XRC requester an initiator QP). The CM
//! messages replay too (`replay_cm`). A responder runs on a [`Target`]: the
//! engine device in virtual time, or a running device over the real wire (the command's `--to`).
//!
//! The setup is read from the trace and every value says where it came from: QPNs from the
//! packets (and the CM REQ/REP when captured), the starting PSN from the CM or from the first
//! packet that starts a message, the path MTU from the CM REQ, else from the sizes of FIRST/MIDDLE
//! packets, memory regions from the RETHs and AtomicETHs (the CM carries no keys), the receive
//! queue depth from the recorded ACK credits.
//!
//! A conversation that cannot be replayed says why (RoCEv1, frames cut by the capture, a
//! transport the engine does not model, one direction only, every request with a bad ICRC). A
//! capture that lost request packets its responder did receive (the recorded responder
//! acknowledged past them without a sequence NAK) is replayed up to the first such gap.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;

use crate::analyze::L3Kind;
use serde::Serialize;
use softrdma_engine::device::{
    CqId, CreditPolicy, Device, DeviceConfig, PdId, QpCaps, QpInit, RecvMeta, SrqAttr, WireProfile,
};
use softrdma_engine::memory::{Memory, MemoryError, Owner};
use softrdma_engine::time::{Duration, Instant};
use softrdma_engine::verbs::{Access, Mtu, QpType};
use softrdma_engine::wire::{
    aeth, atomiceth, bth, reth, xrceth, Headers, IbPacket, OpKind, Opcode, Position, Psn, Qpn, Syndrome,
};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

use crate::behaviour::{self, role, Capture, Conversation, Packet, Role};

mod credits;
mod requester;
mod responder;
mod target;

use self::requester::requester;
use self::responder::responder;
use self::target::{bring_up, make_engine, VirtualTarget};

/// Which side softrdma plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// softrdma answers the recorded requests.
    Responder,
    /// softrdma sends the recorded messages.
    Requester,
    /// Both, one after the other.
    Both,
}

/// How to replay.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Which side softrdma plays.
    pub side: Side,
    /// softrdma's wire choices.
    pub behaviour: WireProfile,
    /// Receive WQEs kept posted for SENDs (`None`: inferred from the recorded credits).
    pub recv_depth: Option<usize>,
}

/// One difference between the recording and softrdma.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Mismatch {
    /// The recorded packet's frame number (`None`: a packet softrdma sent that the recording
    /// does not have).
    pub frame: Option<u64>,
    /// The PSN the difference is about.
    pub psn: u32,
    /// What differs.
    pub field: String,
    /// The recorded value.
    pub recorded: String,
    /// softrdma's value.
    pub softrdma: String,
}

/// The replay of one conversation in one role.
#[derive(Debug, Clone, Serialize)]
pub struct ConversationReport {
    /// Transport name (`RC`, `UC`, ...).
    pub transport: &'static str,
    /// The side softrdma played.
    pub role: &'static str,
    /// The address sending the requests.
    pub requester: IpAddr,
    /// The address answering.
    pub responder: IpAddr,
    /// The destination QP of the requests.
    pub request_qp: Option<u32>,
    /// The destination QP of the responses (the requester's QP).
    pub response_qp: Option<u32>,
    /// Frame number of its first packet.
    pub first_frame: u64,
    /// Recorded packets fed to softrdma.
    pub packets_replayed: u64,
    /// Packets softrdma sent.
    pub packets_sent: u64,
    /// Recorded answers compared.
    pub answers_expected: u64,
    /// Of those, the ones softrdma gave the same way.
    pub answers_matched: u64,
    /// Every difference.
    pub mismatches: Vec<Mismatch>,
    /// How the replay was set up: each value and where it came from.
    pub setup: Vec<String>,
    /// What was not compared, and why.
    pub not_compared: Vec<String>,
    /// Why the conversation could not be replayed at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_replayable: Option<String>,
}

/// The replay of a capture.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The file as given.
    pub file: String,
    /// softrdma's profile.
    pub profile: String,
    /// Frames read.
    pub frames: u64,
    /// RoCE packets among them.
    pub roce_packets: u64,
    /// Why the file ended early, if it did.
    pub read_error: Option<String>,
    /// Recorded answers compared, over all conversations.
    pub answers_expected: u64,
    /// Of those, the ones softrdma gave the same way.
    pub answers_matched: u64,
    /// Mismatches counted by field, over all conversations.
    pub mismatch_fields: BTreeMap<String, u64>,
    /// Per conversation and role.
    pub conversations: Vec<ConversationReport>,
}

impl ConversationReport {
    /// A report with nothing replayed yet: `ends` are (requester, responder), `qps` the requests'
    /// and the responses' destination QPs.
    pub(crate) fn new(
        transport: &'static str,
        role: &'static str,
        ends: (IpAddr, IpAddr),
        qps: (Option<u32>, Option<u32>),
        first_frame: u64,
    ) -> ConversationReport {
        ConversationReport {
            transport,
            role,
            requester: ends.0,
            responder: ends.1,
            request_qp: qps.0,
            response_qp: qps.1,
            first_frame,
            packets_replayed: 0,
            packets_sent: 0,
            answers_expected: 0,
            answers_matched: 0,
            mismatches: Vec::new(),
            setup: Vec::new(),
            not_compared: Vec::new(),
            not_replayable: None,
        }
    }
}

impl ReplayReport {
    /// Mismatches over all conversations.
    pub fn mismatches(&self) -> usize {
        self.conversations.iter().map(|c| c.mismatches.len()).sum()
    }
}

/// Replays a capture file.
pub fn replay_file(path: &Path, opts: &Options) -> Result<ReplayReport, crate::Error> {
    let cap = behaviour::load(path)?;
    Ok(replay(&path.display().to_string(), &cap, opts))
}

/// Makes the [`Target`] a responder replay runs on: given the recorded responder's address,
/// softrdma's profile and the path MTU.
pub type TargetFactory<'a> = dyn FnMut(IpAddr, WireProfile, Mtu) -> Result<Box<dyn Target>, String> + 'a;

/// Replays a loaded capture against engine devices in virtual time.
pub fn replay(file: &str, cap: &Capture, opts: &Options) -> ReplayReport {
    let mut virtual_targets = |addr: IpAddr, behaviour: WireProfile, mtu: Mtu| -> Result<Box<dyn Target>, String> {
        Ok(Box::new(VirtualTarget::new(addr, behaviour, mtu)?))
    };
    replay_on(file, cap, opts, &mut virtual_targets, true)
}

/// Replays a loaded capture, each responder on a target `targets` makes; `requesters`: whether
/// requester replays run too (they need an engine device in virtual time; a live target plays
/// the responder only).
pub fn replay_on(
    file: &str,
    cap: &Capture,
    opts: &Options,
    targets: &mut TargetFactory<'_>,
    requesters: bool,
) -> ReplayReport {
    let usable: Vec<usize> = cap
        .packets
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.ib.is_malformed() && p.ib.headers.bth.is_some())
        .map(|(i, _)| i)
        .collect();
    let convs = behaviour::conversations(cap, &usable);
    let cm = CmFacts::gather(cap);
    let mut out = Vec::new();
    for c in &convs {
        // QP1 traffic (CM MADs) sets replays up; it is not replayed itself.
        if c.request_qp == Some(1) {
            continue;
        }
        let sides: &[&'static str] = match opts.side {
            Side::Responder => &["responder"],
            Side::Requester => &["requester"],
            Side::Both => &["responder", "requester"],
        };
        for &side in sides {
            if side == "requester" && !requesters {
                let mut r = report(c, side);
                r.not_replayable =
                    Some("live replay plays the responder only (requester replay runs in virtual time)".into());
                out.push(r);
                continue;
            }
            out.push(replay_conversation(cap, c, &cm, opts, side, targets));
        }
    }
    // The CM messages (virtual time only: a live device's CM is reached through rdma_cm).
    if requesters {
        let cx = opts.behaviour.name == softrdma_engine::device::ProfileName::Cx;
        let sides: &[&'static str] = match opts.side {
            Side::Responder => &["responder"],
            Side::Requester => &["requester"],
            Side::Both => &["responder", "requester"],
        };
        for &side in sides {
            out.extend(crate::replay_cm::replay_cm(cap, cx, side));
        }
    }
    let answers_expected = out.iter().map(|c| c.answers_expected).sum();
    let answers_matched = out.iter().map(|c| c.answers_matched).sum();
    let mut mismatch_fields = BTreeMap::new();
    for m in out.iter().flat_map(|c| &c.mismatches) {
        *mismatch_fields.entry(m.field.clone()).or_insert(0) += 1;
    }
    ReplayReport {
        mismatch_fields,
        file: file.to_string(),
        profile: opts.behaviour.name.to_string(),
        frames: cap.frames,
        roce_packets: cap.packets.len() as u64,
        read_error: cap.read_error.clone(),
        answers_expected,
        answers_matched,
        conversations: out,
    }
}

// ---------------------------------------------------------------------------------------------
// What the CM messages of the capture say

/// The REQ and REP of one connection: (requester address, requester QPN) -> facts.
#[derive(Debug, Default)]
struct CmFacts {
    by_requester_qp: HashMap<(IpAddr, u32), CmConn>,
}

#[derive(Debug, Clone, Default)]
struct CmConn {
    req_frame: u64,
    /// The REQ's starting PSN (the requester's first PSN).
    req_psn: u32,
    /// The REQ's path MTU code (IBTA: 1 = 256 ... 5 = 4096).
    mtu: u8,
    /// The REQ's initiator depth (the requester's outstanding READs/atomics).
    initiator_depth: u8,
    /// The REP's frame, QPN and starting PSN.
    rep: Option<(u64, u32, u32)>,
}

impl CmFacts {
    fn gather(cap: &Capture) -> CmFacts {
        use softrdma_engine::wire::cm::CmMessage;
        let mut f = CmFacts::default();
        // REQ local comm ID -> key, for the REP to find its REQ.
        let mut by_comm: HashMap<u32, (IpAddr, u32)> = HashMap::new();
        for p in &cap.packets {
            let Some(Ok(mad)) = &p.ib.cm else { continue };
            match &mad.msg {
                CmMessage::Req(r) => {
                    let key = (p.ib.src.to_canonical(), r.local_qpn);
                    by_comm.insert(r.local_comm_id, key);
                    f.by_requester_qp.insert(
                        key,
                        CmConn {
                            req_frame: p.frame,
                            req_psn: r.starting_psn,
                            mtu: r.path_mtu,
                            initiator_depth: r.initiator_depth,
                            rep: None,
                        },
                    );
                }
                CmMessage::Rep(r) => {
                    if let Some(conn) = by_comm.get(&r.remote_comm_id).and_then(|k| f.by_requester_qp.get_mut(k)) {
                        conn.rep = Some((p.frame, r.local_qpn, r.starting_psn));
                        // The passive side's sends are a conversation of their own.
                        let conn = conn.clone();
                        f.by_requester_qp.insert((p.ib.src.to_canonical(), r.local_qpn), conn);
                    }
                }
                _ => {}
            }
        }
        f
    }
}

// ---------------------------------------------------------------------------------------------
// One conversation

const OWNER: Owner = 1;
/// Where the replay's own buffers live (receive buffers, a requester's message data): far from
/// the addresses applications use.
const LOCAL_BASE: u64 = 0x7e00_0000_0000;
const LOCAL_LEN: u64 = 1 << 32;
/// The requester's message buffers: a ring this long from LOCAL_BASE.
const RING: u64 = 64 << 20;

/// A recorded packet of the conversation.
struct RecordedPacket<'a> {
    p: &'a Packet,
    opcode: Opcode,
    psn: Psn,
    kind: Option<OpKind>,
    position: Option<Position>,
}

impl<'a> RecordedPacket<'a> {
    fn new(p: &'a Packet) -> Option<RecordedPacket<'a>> {
        let b = p.ib.headers.bth?;
        let info = b.opcode.info();
        Some(RecordedPacket {
            p,
            opcode: b.opcode,
            psn: b.psn,
            kind: info.map(|i| i.kind),
            position: info.map(|i| i.position),
        })
    }

    fn frame(&self) -> u64 {
        self.p.frame
    }

    fn payload(&self) -> &[u8] {
        let b = &self.p.ib_bytes[..];
        match IbPacket::new_checked(b) {
            Ok(p) => {
                let start = p.header_len();
                &b[start..start + p.payload().len()]
            }
            Err(_) => &[],
        }
    }
}

/// A packet softrdma sent (BTH to ICRC), with its send time from the replay's start.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The transport bytes.
    pub bytes: Vec<u8>,
    /// When, from the start of the replay (virtual, or measured by a live target).
    pub at: Instant,
}

impl Sent {
    fn packet(&self) -> IbPacket<&[u8]> {
        IbPacket::new_unchecked(&self.bytes[..])
    }
}

fn report(c: &Conversation, role: &'static str) -> ConversationReport {
    let response_qp = c.response_qps.iter().next().copied();
    ConversationReport::new(c.transport, role, (c.requester, c.responder), (c.request_qp, response_qp), c.first_frame)
}

fn replay_conversation(
    cap: &Capture,
    c: &Conversation,
    cm: &CmFacts,
    opts: &Options,
    role: &'static str,
    targets: &mut TargetFactory<'_>,
) -> ConversationReport {
    let mut r = report(c, role);
    if let Err(why) = replayable(cap, c) {
        r.not_replayable = Some(why);
        return r;
    }
    let all: Vec<RecordedPacket<'_>> = c.members.iter().filter_map(|&i| RecordedPacket::new(&cap.packets[i])).collect();
    let (reqs, resps): (Vec<RecordedPacket<'_>>, Vec<RecordedPacket<'_>>) =
        all.into_iter().filter(|x| x.kind.is_some()).partition(|x| role_of(x) == Role::Request);
    if let Err(why) = replay_role(&mut r, c, cm, opts, role, reqs, resps, targets) {
        r.not_replayable = Some(why);
    }
    r
}

fn role_of(x: &RecordedPacket<'_>) -> Role {
    role(x.opcode)
}

/// Why a conversation cannot be replayed at all, if it cannot.
fn replayable(cap: &Capture, c: &Conversation) -> Result<(), String> {
    let members: Vec<&Packet> = c.members.iter().map(|&i| &cap.packets[i]).collect();
    if members.iter().any(|p| p.ib.l3 == L3Kind::Grh) {
        return Err("RoCEv1 (GRH over Ethernet): the engine speaks RoCEv2 only".into());
    }
    match c.transport {
        "RC" | "UC" | "UD" | "XRC" => {}
        t => {
            return Err(format!(
                "transport {t}: replay models RC, UC, UD and XRC conversations (DC and RD are not modelled)"
            ))
        }
    }
    if c.request_qp.is_none() {
        return Err("one direction only: responses whose requests are not in the capture".into());
    }
    let cut = members.iter().filter(|p| p.truncated).count();
    if cut > 0 {
        return Err(format!("{cut} of {} frames were cut by the capture's snap length", members.len()));
    }
    let requests: Vec<&&Packet> =
        members.iter().filter(|p| p.ib.headers.bth.is_some_and(|b| role(b.opcode) == Role::Request)).collect();
    if !requests.is_empty() && requests.iter().all(|p| p.ib.has_bad_icrc()) {
        return Err(format!(
            "every request ({}) has a bad ICRC: the capture was altered after it was recorded (a receiver drops them all)",
            requests.len()
        ));
    }
    Ok(())
}

/// How a replayed responder QP is set up (see [`Target::create_qp`]).
#[derive(Debug, Clone, Copy)]
pub struct QpSetup {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// The Q_Key (UD).
    pub qkey: u32,
    /// Take receives from an SRQ of this depth instead of the QP's own queue.
    pub srq_depth: Option<u32>,
    /// The requester's address (where answers go).
    pub peer: IpAddr,
    /// The requester's QPN (the answers' destination QP).
    pub peer_qpn: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// The first request PSN.
    pub rq_psn: Psn,
    /// Receive queue depth.
    pub depth: u32,
    /// Responder resources (READs and atomics in flight).
    pub rd_atomic: u8,
    /// Minimum RNR timer code.
    pub min_rnr_timer: u8,
    /// The longest SEND message (receive buffers must hold it).
    pub max_recv_len: u32,
}

/// Where a responder replay runs: an engine device in virtual time ([`replay`]), or a running
/// device reached over the real wire (the command's `--to`).
pub trait Target {
    /// Registers memory standing for the recorded range `lo..lo + len`; returns where the
    /// target's memory for it starts and its rkey.
    fn reg_region(&mut self, lo: u64, len: u64) -> Result<(u64, u32), String>;
    /// Creates the responder QP and brings it to RTS; returns its QPN.
    fn create_qp(&mut self, setup: &QpSetup) -> Result<u32, String>;
    /// Posts one receive (to the SRQ if the QP has one).
    fn post_recv(&mut self) -> Result<(), String>;
    /// Receives queued and not yet consumed.
    fn queued_recvs(&mut self) -> usize;
    /// Lets time pass up to `t` from the replay's start (timers run, answers go out).
    fn advance(&mut self, t: Instant);
    /// Delivers one recorded request (already rewritten for the target).
    fn feed(&mut self, src: IpAddr, sport: u16, bytes: &[u8]);
    /// Lets time pass up to `t`, then returns every packet the target sent.
    fn finish(&mut self, t: Instant) -> Vec<Sent>;
    /// Whether the trace defined the bytes at a recorded address (for payload checks).
    fn known(&self, addr: u64, len: usize) -> bool;
    /// XRC: creates an XRC SRQ of the target QP's domain (before [`Target::create_qp`] makes
    /// the XRC target QP); returns its number.
    fn xrc_srq(&mut self, depth: u32) -> Result<u32, String> {
        let _ = depth;
        Err("XRC is not built for this target".into())
    }
    /// XRC: posts one receive to an XRC SRQ.
    fn post_srq_recv(&mut self, srqn: u32) -> Result<(), String> {
        let _ = srqn;
        Err("XRC is not built for this target".into())
    }
    /// XRC: receives queued on an XRC SRQ.
    fn queued_srq_recvs(&mut self, srqn: u32) -> usize {
        let _ = srqn;
        0
    }
    /// Work completions the target produced.
    fn completions(&self) -> u64;
    /// The current time from the replay's start.
    fn now(&self) -> Instant;
}

/// The path MTU: from the CM REQ, else from the FIRST/MIDDLE packets (they are exactly one MTU),
/// else the smallest MTU the largest packet fits.
fn infer_mtu(conn: Option<&CmConn>, reqs: &[RecordedPacket<'_>], resps: &[RecordedPacket<'_>]) -> (Mtu, String) {
    if let Some(m) = conn.and_then(|c| Mtu::from_ibv(u32::from(c.mtu)).map(|m| (m, c.req_frame))) {
        return (m.0, format!("path MTU {} from the CM REQ (frame {})", m.0.bytes(), m.1));
    }
    let multi = reqs
        .iter()
        .chain(resps)
        .filter(|x| matches!(x.position, Some(Position::First | Position::Middle)))
        .map(|x| (x.payload().len(), x.frame()))
        .max();
    if let Some((len, frame)) = multi {
        let m = Mtu::at_most(len.max(256));
        return (m, format!("path MTU {} from the FIRST/MIDDLE packet sizes (frame {frame})", m.bytes()));
    }
    let largest = reqs.iter().chain(resps).map(|x| x.payload().len()).max().unwrap_or(0);
    let m = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096]
        .into_iter()
        .find(|m| m.bytes() >= largest)
        .unwrap_or(Mtu::Mtu4096);
    (m, format!("path MTU {} assumed: no multi-packet message; the largest payload is {largest} bytes", m.bytes()))
}

/// The 24-bit PSN order of two PSNs near each other.
fn after(a: Psn, b: Psn) -> bool {
    a.distance(b) > 0
}

fn name(op: Opcode) -> String {
    op.info().map_or_else(|| format!("{:#04x}", op.0), |i| i.name.to_string())
}

fn syndrome_text(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { credits } => format!("ACK credits {credits:#04x}"),
        Syndrome::RnrNak { timer } => format!("RNR NAK timer {timer}"),
        Syndrome::Nak(code) => format!("NAK {code:?}"),
        Syndrome::Reserved(b) => format!("reserved {b:#04x}"),
    }
}

/// Byte offsets of extension headers in a packet's bytes.
fn header_at(bytes: &[u8], h: Headers) -> Option<usize> {
    let op = Opcode(*bytes.first()?);
    Some(bth::HEADER_LEN + op.info()?.offset_of(h)?)
}

/// A recorded rkey's region in the target: (the target's rkey, the recorded start, the
/// target's start).
type KeyMap = HashMap<u32, (u32, u64, u64)>;

/// Rewrites a recorded packet for the target: destination QP, and each key and address through
/// `keys`.
fn rewrite(bytes: &[u8], dest_qp: Qpn, keys: &KeyMap, srqns: &HashMap<u32, u32>) -> Vec<u8> {
    let mut b = bytes.to_vec();
    bth::Packet::new_unchecked(&mut b[..]).set_dest_qp(dest_qp);
    if let Some(at) = header_at(&b, Headers::XRCETH).filter(|&at| b.len() >= at + xrceth::HEADER_LEN) {
        let mut p = xrceth::Packet::new_unchecked(&mut b[at..]);
        if let Some(&n) = srqns.get(&p.xrc_srqn()) {
            p.set_xrc_srqn(n);
        }
    }
    for h in [Headers::RETH, Headers::ATOMICETH] {
        if let Some(at) = header_at(&b, h) {
            if h == Headers::RETH && b.len() >= at + reth::HEADER_LEN {
                let mut p = reth::Packet::new_unchecked(&mut b[at..]);
                if let Some(&(k, lo, base)) = keys.get(&p.rkey()) {
                    p.set_rkey(k);
                    p.set_va(p.va().wrapping_sub(lo).wrapping_add(base));
                }
            }
            if h == Headers::ATOMICETH && b.len() >= at + atomiceth::HEADER_LEN {
                let mut p = atomiceth::Packet::new_unchecked(&mut b[at..]);
                if let Some(&(k, lo, base)) = keys.get(&p.rkey()) {
                    p.set_rkey(k);
                    p.set_va(p.va().wrapping_sub(lo).wrapping_add(base));
                }
            }
        }
    }
    b
}

/// The header fields both sides' packets are compared on, named.
/// The header fields compared for equality, each one the protocol (or the profile) fixes, never
/// the application's timing (issue 55's review: the fields that depend on when the application
/// acted are judged by consistency instead: the ACK credit count by a posting schedule,
/// replay/credits.rs; RNR NAKs by the receives posted, responder.rs; which PSN an ACK names by
/// coalescing, `compare_answers`; READ payloads and atomic values only where the trace wrote that
/// memory):
/// - opcode: the answer the request calls for (IBTA 9.4.4, 9.4.5, 9.7.4);
/// - MigReq: a profile's choice (the BTH's path migration state, IBTA 9.2; rxe sends 0,
///   ConnectX 1);
/// - AckReq and SE: requesters' flags, 0 on every response (IBTA 9.2);
/// - PadCnt and the payload length: the request's length and the path MTU (IBTA 9.2, 9.7.1);
/// - TVer: 0, and P_Key: the QP's partition (IBTA 9.2, 9.6).
fn header_fields(p: &IbPacket<&[u8]>) -> Vec<(&'static str, String)> {
    let b = p.bth();
    vec![
        ("opcode", name(p.opcode())),
        ("MigReq", u8::from(b.mig_req()).to_string()),
        ("AckReq", u8::from(b.ack_req()).to_string()),
        ("SE", u8::from(b.solicited()).to_string()),
        ("PadCnt", b.pad_count().to_string()),
        ("TVer", b.tver().to_string()),
        ("P_Key", format!("{:#06x}", b.pkey())),
        ("payload length", p.payload().len().to_string()),
    ]
}

fn compare_fields(
    r: &mut ConversationReport,
    frame: Option<u64>,
    psn: Psn,
    rec: &[(&'static str, String)],
    ours: &[(&'static str, String)],
) -> bool {
    let mut same = true;
    for ((field, a), (_, b)) in rec.iter().zip(ours) {
        if a != b {
            same = false;
            r.mismatches.push(Mismatch {
                frame,
                psn: psn.value(),
                field: (*field).to_string(),
                recorded: a.clone(),
                softrdma: b.clone(),
            });
        }
    }
    same
}

fn recorded_packet<'a>(x: &'a RecordedPacket<'_>) -> Option<IbPacket<&'a [u8]>> {
    IbPacket::new_checked(&x.p.ib_bytes[..]).ok()
}

#[allow(clippy::too_many_arguments)]
fn replay_role(
    r: &mut ConversationReport,
    c: &Conversation,
    cm: &CmFacts,
    opts: &Options,
    role: &'static str,
    reqs: Vec<RecordedPacket<'_>>,
    resps: Vec<RecordedPacket<'_>>,
    targets: &mut TargetFactory<'_>,
) -> Result<(), String> {
    let request_qp = c.request_qp.ok_or("no request QP")?;
    if reqs.is_empty() {
        return Err("one direction only: no requests captured".into());
    }
    if matches!(c.transport, "RC" | "XRC") && resps.is_empty() {
        return Err("one direction only: the responder's packets are not in the capture".into());
    }
    let response_qp = r.response_qp;
    let conn = response_qp.and_then(|q| cm.by_requester_qp.get(&(c.requester, q)));
    // Requests with a bad ICRC: a receiver drops them, so the replay does too.
    let bad = reqs.iter().filter(|x| x.p.ib.has_bad_icrc()).count();
    if bad > 0 {
        r.setup.push(format!("{bad} request packets with a bad ICRC left out, as a receiver drops them"));
    }
    let reqs: Vec<RecordedPacket<'_>> = reqs.into_iter().filter(|x| !x.p.ib.has_bad_icrc()).collect();
    // Where the replay starts: the first packet that starts a message.
    let start =
        reqs.iter().position(|x| x.position.is_some_and(|p| p.starts())).ok_or("no message starts in the capture")?;
    if start > 0 {
        r.setup.push(format!(
            "the capture starts mid-message: {start} request packets before frame {} left out",
            reqs[start].frame()
        ));
    }
    let reqs = &reqs[start..];
    let first_psn = reqs[0].psn;
    // The connection's two starting PSNs (REQ and REP); the first request carrying one of them
    // means the capture holds the conversation from its start.
    let setup_psn = conn.and_then(|k| {
        if Psn::new(k.req_psn) == first_psn {
            Some(("REQ", k.req_frame))
        } else {
            k.rep.filter(|rep| Psn::new(rep.2) == first_psn).map(|rep| ("REP", rep.0))
        }
    });
    let from_start = setup_psn.is_some();
    match setup_psn {
        Some((msg, frame)) => r.setup.push(format!(
            "requester QP {:#x}, starting PSN {} as in the CM {msg} (frame {frame}): the capture holds the conversation from its start",
            response_qp.unwrap_or(0),
            first_psn.value(),
        )),
        _ => r.setup.push(format!(
            "starting PSN {} from the first packet that starts a message (frame {}){}",
            first_psn.value(),
            reqs[0].frame(),
            if conn.is_some() { "; neither CM starting PSN: the capture misses the start" } else { "" }
        )),
    }
    let (mtu, why) = infer_mtu(conn, reqs, &resps);
    r.setup.push(why);
    // Capture gaps: a request PSN beyond the next one expected, which the recorded responder
    // did not NAK as a sequence error, was lost by the capture, not by the wire.
    let seq_naks: Vec<Psn> = resps
        .iter()
        .filter_map(|x| x.p.ib.headers.aeth.filter(|a| matches!(a.syndrome, Syndrome::Nak(_))).map(|_| x.psn))
        .collect();
    let mut expect = first_psn;
    let mut end = reqs.len();
    // (UD datagrams are messages of their own: a gap loses nothing the others need.)
    let ud = c.transport == "UD";
    for (i, x) in reqs.iter().enumerate() {
        if !ud && after(x.psn, expect) && !seq_naks.contains(&expect) {
            r.not_compared.push(format!(
                "the capture misses request PSNs {}..{} before frame {} (the recorded responder received them: no sequence NAK), so the replay stops there",
                expect.value(),
                (x.psn + u32::MAX).value(),
                x.frame()
            ));
            end = i;
            break;
        }
        let span = match (x.kind, x.p.ib.headers.reth) {
            (Some(OpKind::ReadRequest), Some(h)) => (h.dma_len as usize).div_ceil(mtu.bytes()).max(1) as u32,
            _ => 1,
        };
        if !after(expect, x.psn + span) {
            expect = x.psn + span;
        }
    }
    let reqs = &reqs[..end];
    if reqs.is_empty() {
        return Err("the capture misses the packets before its first message".into());
    }
    let last_psn = expect;
    // Answers to requests before the first one replayed answer nothing replayed.
    let before = resps.iter().filter(|x| after(first_psn, x.psn)).count();
    if before > 0 {
        r.not_compared.push(format!("{before} responses to requests before the replay's first one"));
    }
    let resps: Vec<RecordedPacket<'_>> = resps.into_iter().filter(|x| !after(first_psn, x.psn)).collect();
    let resps = &resps[..];
    // Without the CM, the first recorded acknowledgement tells whether the responder counted its
    // messages from the replay's first packet: its MSN equals the messages ending at or before
    // its PSN (MSN starts at 0 when a connection starts, IBTA 9.7.5.1.1).
    let from_start = from_start
        || resps.iter().find_map(|x| x.p.ib.headers.aeth.map(|a| (x, a.msn.value()))).is_some_and(|(x, msn)| {
            let ended = reqs
                .iter()
                .filter(|q| !after(q.psn, x.psn) && q.position.is_some_and(|p| p.ends()))
                .map(|q| q.psn.value())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            let ok = ended == msn as usize;
            if ok {
                r.setup.push(format!(
                    "the capture holds the connection from its start: the first acknowledgement's MSN {msn} (frame {}) counts the messages from frame {}",
                    x.frame(),
                    reqs[0].frame()
                ));
            }
            ok
        });
    let mut opts = *opts;
    if !from_start && opts.behaviour.ack_req_first_packet && role == "requester" {
        opts.behaviour.ack_req_first_packet = false;
        r.setup.push(
            "the profile's AckReq on a QP's first packet is off: the capture does not hold the connection's first packet"
                .into(),
        );
    }
    let recorded = Recorded { c, opts: &opts, mtu, reqs, resps, request_qp, response_qp, last_psn };
    match role {
        "responder" => responder(r, recorded, from_start, targets),
        _ => requester(r, recorded, conn),
    }
}

/// The type of the replaying QP for the conversation's transport; `xrc`, the XRC side it plays
/// (initiator or target).
fn qp_type(c: &Conversation, xrc: QpType) -> QpType {
    match c.transport {
        "XRC" => xrc,
        "UD" => QpType::Ud,
        "UC" => QpType::Uc,
        _ => QpType::Rc,
    }
}

/// What both replays take from the conversation's analysis: the conversation and the options,
/// the path MTU, the recorded requests and answers to replay, the QPs they went to, and the PSN
/// after the last request.
#[derive(Clone, Copy)]
struct Recorded<'a> {
    c: &'a Conversation,
    opts: &'a Options,
    mtu: Mtu,
    reqs: &'a [RecordedPacket<'a>],
    resps: &'a [RecordedPacket<'a>],
    request_qp: u32,
    response_qp: Option<u32>,
    last_psn: Psn,
}

/// The memory regions the requests name (RETH and AtomicETH keys): per recorded rkey the range
/// its operations cover.
fn regions(reqs: &[RecordedPacket<'_>]) -> BTreeMap<u32, (u64, u64)> {
    let mut m: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for x in reqs {
        let h = &x.p.ib.headers;
        let span = h.reth.map(|t| (t.rkey, t.va, u64::from(t.dma_len))).or(h.atomiceth.map(|t| (t.rkey, t.va, 8)));
        if let Some((rkey, va, len)) = span {
            let e = m.entry(rkey).or_insert((va, va.saturating_add(len.max(1))));
            e.0 = e.0.min(va);
            e.1 = e.1.max(va.saturating_add(len.max(1)));
        }
    }
    m
}

fn time_of(x: &RecordedPacket<'_>, t0: u64) -> Instant {
    Instant::ZERO + Duration::from_nanos(x.p.ts_ns.saturating_sub(t0))
}

fn digest(b: &[u8]) -> String {
    let crc = crc32fast::hash(b);
    format!("{} bytes, crc32 {crc:08x}", b.len())
}

// ---------------------------------------------------------------------------------------------
// Text

/// The report as text: a line per conversation and role, its mismatches, then the summary line.
pub fn text(rep: &ReplayReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: {} frames, {} RoCE packets; softrdma profile {}{}",
        rep.file,
        rep.frames,
        rep.roce_packets,
        rep.profile,
        rep.read_error.as_ref().map(|e| format!("; the file ends early: {e}")).unwrap_or_default()
    );
    for c in &rep.conversations {
        let qp = c.request_qp.map_or("-".into(), |q| format!("{q:#x}"));
        let _ = write!(s, "  {} {} > {} qp {qp}, softrdma as {}: ", c.transport, c.requester, c.responder, c.role);
        match &c.not_replayable {
            Some(why) => {
                let _ = writeln!(s, "not replayable: {why}");
                continue;
            }
            None => {
                let _ = writeln!(
                    s,
                    "{} packets replayed, {} sent; {} of {} answers match",
                    c.packets_replayed, c.packets_sent, c.answers_matched, c.answers_expected
                );
            }
        }
        for line in &c.setup {
            let _ = writeln!(s, "    setup: {line}");
        }
        for line in &c.not_compared {
            let _ = writeln!(s, "    not compared: {line}");
        }
        for m in c.mismatches.iter().take(20) {
            let frame = m.frame.map_or("softrdma only".into(), |f| format!("frame {f}"));
            let _ = writeln!(
                s,
                "    mismatch: {frame} psn {} {}: recorded {}, softrdma {}",
                m.psn, m.field, m.recorded, m.softrdma
            );
        }
        if c.mismatches.len() > 20 {
            let _ = writeln!(s, "    ... {} more mismatches (--json lists all)", c.mismatches.len() - 20);
        }
    }
    if !rep.mismatch_fields.is_empty() {
        let by: Vec<String> = rep.mismatch_fields.iter().map(|(f, n)| format!("{f} {n}")).collect();
        let _ = writeln!(s, "mismatches by field: {}", by.join(", "));
    }
    let _ = writeln!(
        s,
        "replay: {} of {} answers match ({} conversations)",
        rep.answers_matched,
        rep.answers_expected,
        rep.conversations.len()
    );
    s
}

#[cfg(test)]
mod tests;
