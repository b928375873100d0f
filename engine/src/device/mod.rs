//! The device model: one emulated HCA's objects (PDs, MRs, CQs, QPs) and its transport engine,
//! driven from outside with verbs calls and the quinn-proto style sans-IO loop:
//!
//! - inputs: verbs calls (`alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify_qp`,
//!   `post_send`, `post_recv`), [`Device::handle_packet`] for every datagram that arrives, and
//!   [`Device::handle_timeout`] when [`Device::poll_timeout`] has passed;
//! - outputs: [`Device::poll_transmit`] writes the next UDP payload (BTH to ICRC) into the caller's
//!   buffer, [`Device::poll_cq`] returns completions, [`Device::poll_event`] async events.
//!
//! The reliable-connected machinery follows Linux rxe's split: the requester (`req`) turns send
//! WQEs into request packets, the completer (`comp`) matches responses to WQEs and completes
//! them, the responder (`resp`) executes incoming requests and answers them; `unrel` is the
//! responder of UC and UD. The modules form a tree: `dispatch` hands a QP's packets, timers and
//! transmit turns to the roles; the roles work on the QP's state (`qp`: the shared part, and one
//! state per role, as rxe's `qp->req`, `->comp`, `->resp`) and share `packet` (writing packets,
//! scatter/gather); the only call between roles is the completer rewinding the requester.

mod comp;
mod dispatch;
mod keys;
mod mw;
mod packet;
pub mod profile;
mod qp;
mod qpns;
mod req;
pub use self::req::MAX_UNACKED_PSNS;
mod resp;
mod srq;
mod unrel;

use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;

pub use self::keys::{key_block, KEY_BLOCK_SHIFT};
pub use self::profile::{Behaviour, CreditPolicy, ProfileName};
pub use self::qp::{QpAttr, QpCaps, QpInit};
use self::qpns::QpnSpace;
pub use self::qpns::{qpn_block, QPN_BLOCK_SHIFT};
pub use self::srq::{SrqAttr, XrcPolicy, XrcdId};
pub use self::unrel::{ah_from_grh, GRH_SLOT};

use crate::cm::{Cm, CmConfig};
use crate::memory::{Memory, Owner};
use crate::rng::Rng;
use crate::time::{Duration, Instant};
use crate::verbs::{Access, AttrMask, Mtu, QpState, QpType, VerbsError, WcOpcode, WcStatus};
use crate::wire::{
    icrc, ipv4, ipv6, udp, BthPacket, BthRepr, DethRepr, IbPacket, IbRepr, IpProtocol, Ipv4Packet, Ipv4Repr,
    Ipv6Packet, Ipv6Repr, Opcode, Psn, Qpn, UdpPacket, UdpRepr, ROCE_V2_PORT,
};
use crate::wr::{RecvWr, SendWr, WorkCompletion};

use self::qp::Qp;

/// A fast hasher for the device's small integer keys (QPNs, key indexes, object ids). The keys
/// are the device's own, so SipHash's flooding resistance buys nothing here; packets choose which
/// QPN to look up, but the table grows only by verbs calls.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(v)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A map keyed by small integers, hashed with [`IdHasher`].
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Device limits, as `ibv_query_device` reports them; verbs calls beyond them fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Limits {
    /// Most QPs.
    pub max_qp: u32,
    /// Most work requests in one send or receive queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather elements per work request.
    pub max_sge: u32,
    /// Most bytes of inline data per send work request.
    pub max_inline: u32,
    /// Most CQ entries.
    pub max_cqe: u32,
    /// Most outstanding RDMA READ/atomic requests a QP may initiate (max_rd_atomic).
    pub max_qp_init_rd_atom: u8,
    /// Most outstanding RDMA READ/atomic requests a QP accepts as responder (max_dest_rd_atomic).
    pub max_qp_rd_atom: u8,
    /// Largest message (2^31 bytes, as IB allows).
    pub max_msg_size: u32,
}

impl Default for Limits {
    /// rxe's limits (drivers/infiniband/sw/rxe/rxe_param.h), except where noted.
    fn default() -> Limits {
        Limits {
            max_qp: 1 << 17,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_inline: 400,
            max_cqe: (1 << 15) - 1,
            max_qp_init_rd_atom: 128,
            max_qp_rd_atom: 128,
            max_msg_size: 1 << 31,
        }
    }
}

/// How the receiver checks the ICRC of RoCEv2 over IPv4, whose IPv4 ID it may not see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum IcrcPolicy {
    /// The ID is the one `RecvMeta::ip_id` gives, or 0 (what a Linux sender with DF on an
    /// unconnected socket uses, and the simulated wire): a 2^-32 check.
    #[default]
    Exact,
    /// If the ICRC does not hold for that ID, accept it when some ID makes it hold (design D5: rxe
    /// and hardware change the ID per packet); a corrupted packet then passes with probability
    /// about 2^-16. IPv6 is always exact.
    AnyIpv4Id,
}

/// How a device is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceConfig {
    /// The device's IP address (its RoCEv2 GID).
    pub addr: IpAddr,
    /// The port's active MTU.
    pub mtu: Mtu,
    /// Seed of the device's RNG (key bits, PSNs chosen by the device).
    pub seed: u64,
    /// Limits.
    pub limits: Limits,
    /// ICRC check for IPv4 senders.
    pub icrc: IcrcPolicy,
    /// UDP source ports.
    pub flow_ports: FlowPorts,
    /// The wire choices the IBTA leaves open (`rxe` by default; [`profile`]).
    pub behaviour: Behaviour,
}

impl DeviceConfig {
    /// A device at `addr` with MTU 4096, rxe's limits and the exact ICRC check.
    pub fn new(addr: IpAddr, seed: u64) -> DeviceConfig {
        DeviceConfig {
            addr,
            mtu: Mtu::Mtu4096,
            seed,
            limits: Limits::default(),
            icrc: IcrcPolicy::Exact,
            flow_ports: FlowPorts::default(),
            behaviour: Behaviour::RXE,
        }
    }
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PdId(pub u32);

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CqId(pub u32);

/// A CQ's counts (see [`Device::cq_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqCounts {
    /// Completions ever added.
    pub added: u64,
    /// Of those, solicited receives and unsuccessful completions.
    pub solicited: u64,
    /// Completions waiting to be polled.
    pub held: usize,
}

/// A registered memory region's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MrKeys {
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// An asynchronous event (`enum ibv_event_type`, the ones the engine raises).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum AsyncEvent {
    /// IBV_EVENT_COMM_EST: the first packet arrived while the QP was in RTR.
    CommEst(Qpn),
    /// IBV_EVENT_SQ_DRAINED: a QP in SQD has no outstanding send work.
    SqDrained(Qpn),
    /// IBV_EVENT_QP_FATAL: a local error moved the QP to ERR.
    QpFatal(Qpn),
    /// IBV_EVENT_QP_REQ_ERR: the QP received an invalid request and went to ERR.
    QpReqErr(Qpn),
    /// IBV_EVENT_QP_ACCESS_ERR: a remote access violation moved the QP to ERR.
    QpAccessErr(Qpn),
    /// IBV_EVENT_CQ_ERR: the CQ overflowed.
    CqErr(CqId),
    /// IBV_EVENT_SRQ_LIMIT_REACHED: the SRQ (by number) fell below its armed limit.
    SrqLimitReached(u32),
    /// IBV_EVENT_QP_LAST_WQE_REACHED: a QP attached to an SRQ went to ERR; no more WQEs of the
    /// SRQ will complete on it.
    LastWqeReached(Qpn),
}

/// An async event of an XRC target QP, for one of its open handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleEvent {
    /// The handle (from `create_xrc_tgt_qp` or `open_qp`).
    pub handle: u32,
    /// The handle's owner (the process to deliver it to).
    pub owner: Owner,
    /// The event.
    pub event: AsyncEvent,
}

/// Where a packet came from, as the socket saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// Source IP address.
    pub src: IpAddr,
    /// Source UDP port.
    pub src_port: u16,
    /// The IPv4 identification the receiver knows (raw sockets) or expects (the segment's place
    /// in a GRO buffer: Linux numbers GSO segments 0, 1, 2, ...); `None`: 0, what an unconnected
    /// Linux UDP socket with DF sends. Checked exactly under [`IcrcPolicy::Exact`].
    pub ip_id: Option<u16>,
    /// The destination IP address, when it is not the device's own (a multicast group).
    pub dst: Option<IpAddr>,
}

/// How [`Device::poll_transmit_with`] writes a packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmitOptions {
    /// The IPv4 Identification the ICRC is computed for (0 unless set). A transport that sends
    /// several packets in one UDP GSO send, whose segments Linux numbers 0, 1, 2, ..., gives the
    /// number this packet will get, so that its ICRC need not be computed twice (design D5).
    pub ip_id: u16,
    /// Whether a packet to the device's own address gets an ICRC (the default): one for a QP of
    /// this engine (internal loopback), and one for a QP of another engine of the same device
    /// (another process's, reached through the device's port on this host). A transport that
    /// neither captures such packets nor injects faults into them may leave it out, and the
    /// receiving engine, told the same, takes them with [`Device::handle_internal_packet`]: an
    /// HCA loops back traffic between its own QPs without putting it on a wire (IBTA A17.4.3.1's
    /// ICRC protects a packet on the wire), so no CRC can go wrong, and a packet saves two CRCs
    /// of its length (~8% of each side of a bulk transfer within one device: BENCHMARKS.md).
    pub loopback_icrc: bool,
    /// Whether a QP's requester packets go before its responder packets (ACKs, READ responses)
    /// in this call: off by default (a responder answers first). A transport that held back the
    /// answers to what it received until the application's next post sets it, so that the new
    /// request leaves first and the answers can follow in the same GSO send. IBTA orders each
    /// direction's packets by PSN and leaves the two directions of a QP independent.
    pub requester_first: bool,
}

impl Default for TransmitOptions {
    fn default() -> TransmitOptions {
        TransmitOptions { ip_id: 0, loopback_icrc: true, requester_first: false }
    }
}

/// Metadata of a packet [`Device::poll_transmit`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination IP address.
    pub dst: IpAddr,
    /// UDP source port (flow entropy: 0xC000 | a hash of the source QPN, as rxe).
    pub src_port: u16,
    /// Bytes written (BTH to ICRC).
    pub len: usize,
}

/// NAKs a responder sent, by AETH syndrome (IBTA 9.7.5.2.8, table 47).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NaksSent {
    /// PSN sequence error NAKs (one per gap: IBTA 9.7.5.1.2).
    pub psn_sequence: u64,
    /// Invalid request NAKs.
    pub invalid_request: u64,
    /// Remote access error NAKs.
    pub remote_access: u64,
    /// Remote operational error NAKs.
    pub remote_operational: u64,
}

impl NaksSent {
    /// All NAKs sent (RNR NAKs aside).
    pub fn total(&self) -> u64 {
        self.psn_sequence + self.invalid_request + self.remote_access + self.remote_operational
    }

    /// The counter of NAK code `code` (class C/B errors; PSN sequence errors count apart).
    pub(crate) fn of(&mut self, code: crate::wire::NakCode) -> &mut u64 {
        match code {
            crate::wire::NakCode::PsnSequenceError => &mut self.psn_sequence,
            crate::wire::NakCode::InvalidRequest => &mut self.invalid_request,
            crate::wire::NakCode::RemoteAccessError => &mut self.remote_access,
            _ => &mut self.remote_operational,
        }
    }
}

/// Counters with rxe's names (`/sys/class/infiniband/rxe0/ports/1/hw_counters`) plus ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Counters {
    /// Packets sent.
    pub sent_pkts: u64,
    /// Packets received and accepted by a QP.
    pub rcvd_pkts: u64,
    /// Duplicate requests received.
    pub duplicate_request: u64,
    /// Requests received ahead of the expected PSN.
    pub out_of_seq_request: u64,
    /// RNR NAKs received.
    pub rcvd_rnr_err: u64,
    /// RNR NAKs sent.
    pub send_rnr_err: u64,
    /// PSN sequence NAKs received.
    pub rcvd_seq_err: u64,
    /// Transport retries exhausted.
    pub retry_exceeded_err: u64,
    /// RNR retries exhausted.
    pub retry_rnr_exceeded_err: u64,
    /// Requester retransmissions started (timeouts, NAKs, implicit NAKs).
    pub completer_retry_err: u64,
    /// Packets retransmitted.
    pub retransmitted_pkts: u64,
    /// Work requests that completed in error.
    pub send_err: u64,
    /// SENDs received.
    pub rdma_recvs: u64,
    /// SENDs sent.
    pub rdma_sends: u64,
    /// NAKs sent, by kind (RNR NAKs are `send_rnr_err`).
    pub naks_sent: NaksSent,
    /// Packets dropped for a bad ICRC.
    pub icrc_err: u64,
    /// Packets whose ICRC held only for an IPv4 ID other than the assumed one (IcrcPolicy::AnyIpv4Id).
    pub icrc_id_solved: u64,
    /// Packets dropped as malformed (layout, wrong transport, wrong P_Key).
    pub malformed: u64,
    /// Well-formed packets with a valid ICRC dropped because no QP takes them (IBTA 9.6, the
    /// transport header checks: an unknown or destroyed destination QP is discarded silently; or
    /// a multicast group with no QP attached). Late retransmissions to a QP that has just been
    /// destroyed land here, not in `malformed`.
    pub unknown_qp: u64,
    /// XRC requests naming an SRQ that is not in the target QP's domain.
    pub xrc_srq_err: u64,
    /// UD datagrams dropped for a Q_Key that is not the QP's.
    pub qkey_violations: u64,
    /// UD/UC messages dropped (no receive WQE, gap, too long, bad key).
    pub dropped_messages: u64,
    /// Times a QP's local ACK timer expired with requests outstanding (mlx5's
    /// `local_ack_timeout_err`); each also counts in `completer_retry_err`.
    pub local_ack_timeout_err: u64,
}

impl std::ops::AddAssign for NaksSent {
    fn add_assign(&mut self, o: NaksSent) {
        let NaksSent { psn_sequence, invalid_request, remote_access, remote_operational } = o;
        self.psn_sequence += psn_sequence;
        self.invalid_request += invalid_request;
        self.remote_access += remote_access;
        self.remote_operational += remote_operational;
    }
}

/// A device's totals over several engines (a daemon's and its providers', each running QPs of
/// the one device). Every field is named, so a new counter cannot be left out of the sum.
impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, o: Counters) {
        let Counters {
            sent_pkts,
            rcvd_pkts,
            duplicate_request,
            out_of_seq_request,
            rcvd_rnr_err,
            send_rnr_err,
            rcvd_seq_err,
            retry_exceeded_err,
            retry_rnr_exceeded_err,
            completer_retry_err,
            retransmitted_pkts,
            send_err,
            rdma_recvs,
            rdma_sends,
            naks_sent,
            icrc_err,
            icrc_id_solved,
            malformed,
            unknown_qp,
            xrc_srq_err,
            qkey_violations,
            dropped_messages,
            local_ack_timeout_err,
        } = o;
        self.sent_pkts += sent_pkts;
        self.rcvd_pkts += rcvd_pkts;
        self.duplicate_request += duplicate_request;
        self.out_of_seq_request += out_of_seq_request;
        self.rcvd_rnr_err += rcvd_rnr_err;
        self.send_rnr_err += send_rnr_err;
        self.rcvd_seq_err += rcvd_seq_err;
        self.retry_exceeded_err += retry_exceeded_err;
        self.retry_rnr_exceeded_err += retry_rnr_exceeded_err;
        self.completer_retry_err += completer_retry_err;
        self.retransmitted_pkts += retransmitted_pkts;
        self.send_err += send_err;
        self.rdma_recvs += rdma_recvs;
        self.rdma_sends += rdma_sends;
        self.naks_sent += naks_sent;
        self.icrc_err += icrc_err;
        self.icrc_id_solved += icrc_id_solved;
        self.malformed += malformed;
        self.unknown_qp += unknown_qp;
        self.xrc_srq_err += xrc_srq_err;
        self.qkey_violations += qkey_violations;
        self.dropped_messages += dropped_messages;
        self.local_ack_timeout_err += local_ack_timeout_err;
    }
}

pub(crate) struct Pd {
    owner: Owner,
}

pub(crate) struct Mr {
    pub(crate) pd: PdId,
    pub(crate) owner: Owner,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

impl Mr {
    /// Whether `[addr, addr+len)` lies inside the region.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr.saturating_add(self.len))
    }
}

pub(crate) struct Cq {
    capacity: usize,
    entries: VecDeque<WorkCompletion>,
    overflowed: bool,
    /// Completions ever added (a completion channel compares it with what it last saw).
    added: u64,
    /// Of those, the ones a solicited-only notification fires for: receives of a message with
    /// the Solicited Event bit, and every unsuccessful completion (IBTA 11.4.2.2).
    solicited: u64,
}

/// The shared state QP code needs besides the QP itself (split from [`Device`] to satisfy the
/// borrow checker without reference counting).
pub(crate) struct Ctx<'a, M: Memory> {
    pub(crate) now: Instant,
    pub(crate) mrs: &'a mut HashMap<u32, Mr>,
    pub(crate) rkey_aliases: &'a HashMap<u32, Mr>,
    pub(crate) srqs: &'a mut HashMap<u32, srq::Srq>,
    pub(crate) mws: &'a mut HashMap<u32, mw::Mw>,
    pub(crate) cqs: &'a mut HashMap<CqId, Cq>,
    pub(crate) mem: &'a mut M,
    pub(crate) events: &'a mut VecDeque<AsyncEvent>,
    pub(crate) handle_events: &'a mut VecDeque<HandleEvent>,
    pub(crate) counters: &'a mut Counters,
    pub(crate) local: IpAddr,
    pub(crate) flow_ports: FlowPorts,
    /// The packet being completed carried the Solicited Event bit.
    pub(crate) se: bool,
    /// The port's active MTU (UD datagrams may not exceed it).
    pub(crate) port_mtu: Mtu,
    /// The destination address of the packet being handled (the device's, or a multicast group).
    pub(crate) dst: IpAddr,
    /// The IPv4 Identification a packet emitted now will carry (its ICRC covers it).
    pub(crate) ip_id: u16,
    /// Whether a packet to the device's own address gets an ICRC.
    pub(crate) loopback_icrc: bool,
    /// The device's wire choices.
    pub(crate) behaviour: Behaviour,
}

impl<M: Memory> Ctx<'_, M> {
    /// Looks up a memory region by local key.
    pub(crate) fn mr_by_lkey(&self, lkey: u32) -> Option<&Mr> {
        self.mrs.get(&(lkey >> 8)).filter(|m| m.lkey == lkey)
    }

    /// Looks up a memory region by remote key (its own, or an alias it was given).
    pub(crate) fn mr_by_rkey(&self, rkey: u32) -> Option<&Mr> {
        self.mrs.get(&(rkey >> 8)).filter(|m| m.rkey == rkey).or_else(|| self.rkey_aliases.get(&rkey))
    }

    /// Adds a completion to a CQ; an overflow raises CQ_ERR (IBTA 11.4.2.1: CQ overrun) and drops it.
    pub(crate) fn complete(&mut self, cq: CqId, wc: WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.counters.send_err += u64::from(!matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm));
        }
        let Some(c) = self.cqs.get_mut(&cq) else { return };
        if c.entries.len() >= c.capacity {
            if !c.overflowed {
                c.overflowed = true;
                self.events.push_back(AsyncEvent::CqErr(cq));
            }
            return;
        }
        c.entries.push_back(wc);
        c.added += 1;
        c.solicited += u64::from(self.se || wc.status != WcStatus::Success);
    }
}

/// The UDP source ports a device sends from (flow entropy; the ICRC covers the source port, so a
/// transport must send each packet from exactly the port the engine chose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FlowPorts {
    /// First port.
    pub base: u16,
    /// How many ports from `base`; a QP uses `base + hash(QPN) % count`. 0: every packet leaves
    /// from `base` itself (a transport that sends from its 4791 socket).
    pub count: u16,
}

impl Default for FlowPorts {
    /// rxe's choice: 0xC000 | 14 bits of a hash of the QPN.
    fn default() -> FlowPorts {
        FlowPorts { base: 0xc000, count: 0x4000 }
    }
}

impl FlowPorts {
    /// Whether `port` is one of these (a datagram from this device's address and such a port
    /// is this engine's own, looped back).
    pub fn contains(self, port: u16) -> bool {
        if self.count == 0 {
            port == self.base
        } else {
            port.wrapping_sub(self.base) < self.count
        }
    }

    /// The UDP source port of a QP's packets.
    pub fn port(self, qpn: Qpn) -> u16 {
        if self.count == 0 {
            return self.base;
        }
        // 14 bits of a multiplicative hash (rxe's default is exactly 0xC000 | these bits).
        let h = qpn.value().wrapping_mul(0x9e37_79b1) >> 18;
        self.base.wrapping_add((h % u32::from(self.count)) as u16)
    }
}

/// The IPv4/IPv6 and UDP headers the ICRC of a datagram covers, as the sender's kernel writes
/// them: IPv4 with DF, the given ID, TTL 64; TOS, TTL and checksums are masked by the ICRC anyway.
/// Returns the bytes and their length (28 for IPv4, 48 for IPv6).
pub fn ip_udp_header(src: IpAddr, dst: IpAddr, sport: u16, udp_payload_len: usize, ip_id: u16) -> ([u8; 48], usize) {
    let mut h = [0u8; 48];
    let udp = UdpRepr { src_port: sport, dst_port: ROCE_V2_PORT, payload_len: udp_payload_len };
    let l4_len = udp::HEADER_LEN + udp_payload_len;
    // What a Linux sender of RoCEv2 writes: IPv4 with DF, TTL 64 and the given ID; otherwise
    // IPv6 (an IPv4 address as IPv4-mapped) with hop limit 64. A length beyond what the IP
    // header holds is not a RoCE packet: the header is then left as far as it was written.
    let n = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let r = Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                protocol: IpProtocol::Udp,
                payload_len: l4_len,
                dscp_ecn: 0,
                ident: ip_id,
                dont_frag: true,
                ttl: 64,
            };
            let _ = r.emit(&mut Ipv4Packet::new_unchecked(&mut h[..]));
            ipv4::HEADER_LEN
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            let r = Ipv6Repr {
                src_addr: to6(s),
                dst_addr: to6(d),
                next_header: IpProtocol::Udp,
                payload_len: l4_len,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            };
            let _ = r.emit(&mut Ipv6Packet::new_unchecked(&mut h[..]));
            ipv6::HEADER_LEN
        }
    };
    let _ = udp.emit(&mut UdpPacket::new_unchecked(&mut h[n..]));
    (h, n + udp::HEADER_LEN)
}

/// One emulated HCA.
pub struct Device<M: Memory> {
    config: DeviceConfig,
    rng: Rng,
    mem: M,
    pds: HashMap<PdId, Pd>,
    mrs: HashMap<u32, Mr>,
    /// Remote keys another engine of this device gave out for memory that a region here also
    /// covers ([`Device::alias_rkey`]), by the full key.
    rkey_aliases: HashMap<u32, Mr>,
    cqs: HashMap<CqId, Cq>,
    qps: HashMap<Qpn, Qp>,
    srqs: HashMap<u32, srq::Srq>,
    mws: HashMap<u32, mw::Mw>,
    mcast: HashMap<IpAddr, Vec<Qpn>>,
    xrcds: HashMap<XrcdId, srq::Xrcd>,
    xrc_policy: XrcPolicy,
    next_id: u32,
    next_qpn: u32,
    /// Which QPN blocks are this engine's (a steered port shares the QPN space among processes).
    qpns: QpnSpace,
    /// Which key indexes this engine allocates from (`keys.rs`).
    keys: keys::KeySpace,
    /// QPs that may have a packet to send, in round-robin order (a QP appears at most once:
    /// `in_ready` says which are queued).
    ready: VecDeque<Qpn>,
    in_ready: std::collections::HashSet<Qpn, BuildHasherDefault<IdHasher>>,
    /// QPs that stopped sending because the memory is fetching their data
    /// ([`Memory::would_block_count`]): ready again at [`Device::memory_ready`].
    mem_waiters: Vec<Qpn>,
    /// Every QP's next timer deadline, ordered (poll_timeout is the first), and what is filed
    /// for each QP.
    timers: std::collections::BTreeSet<(Instant, Qpn)>,
    armed: HashMap<Qpn, Instant>,
    events: VecDeque<AsyncEvent>,
    handle_events: VecDeque<HandleEvent>,
    counters: Counters,
    /// The connection manager behind QP1 (design D10).
    cm: Cm,
    /// QP1's send PSN: one per MAD, carried across connections (kernel mad.c starts it at 0).
    gsi_psn: Psn,
}

/// QP1's Q_Key (IB_QP1_QKEY, IBTA 13.4.6.2).
pub const GSI_QKEY: u32 = 0x8001_0000;

macro_rules! ctx {
    ($d:expr, $now:expr) => {
        Ctx {
            now: $now,
            mrs: &mut $d.mrs,
            rkey_aliases: &$d.rkey_aliases,
            srqs: &mut $d.srqs,
            mws: &mut $d.mws,
            cqs: &mut $d.cqs,
            mem: &mut $d.mem,
            events: &mut $d.events,
            handle_events: &mut $d.handle_events,
            counters: &mut $d.counters,
            local: $d.config.addr,
            flow_ports: $d.config.flow_ports,
            se: false,
            port_mtu: $d.config.mtu,
            dst: $d.config.addr,
            ip_id: 0,
            loopback_icrc: true,
            behaviour: $d.config.behaviour,
        }
    };
}

impl<M: Memory> Device<M> {
    /// A device with no objects.
    pub fn new(config: DeviceConfig, mem: M) -> Device<M> {
        let mut rng = Rng::new(config.seed);
        // QPNs start at a random point above the reserved QP0/QP1, as hardware does.
        let next_qpn = 0x11 + (rng.next_u32() & 0xfff);
        Device {
            rng,
            mem,
            pds: HashMap::default(),
            mrs: HashMap::default(),
            rkey_aliases: HashMap::default(),
            cqs: HashMap::default(),
            qps: HashMap::default(),
            srqs: HashMap::default(),
            mws: HashMap::default(),
            mcast: HashMap::default(),
            xrcds: HashMap::default(),
            xrc_policy: XrcPolicy::default(),
            next_id: 1,
            next_qpn,
            qpns: QpnSpace::default(),
            keys: Default::default(),
            ready: VecDeque::new(),
            in_ready: Default::default(),
            mem_waiters: Vec::new(),
            timers: Default::default(),
            armed: HashMap::default(),
            events: VecDeque::new(),
            handle_events: VecDeque::new(),
            counters: Counters::default(),
            cm: Cm::new(CmConfig::new(config.addr, 0, config.mtu, config.seed)),
            gsi_psn: Psn::new(0),
            config,
        }
    }

    /// The connection manager (QP1's consumer).
    pub fn cm(&mut self) -> &mut Cm {
        &mut self.cm
    }

    /// The connection manager, to read.
    pub fn cm_ref(&self) -> &Cm {
        &self.cm
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The memory the device reaches, to read (counters).
    pub fn memory_ref(&self) -> &M {
        &self.mem
    }

    /// The memory the device reaches (tests look at it).
    pub fn memory(&mut self) -> &mut M {
        &mut self.mem
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn next_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Allocates a protection domain for `owner`.
    pub fn alloc_pd(&mut self, owner: Owner) -> PdId {
        let id = PdId(self.next_id());
        self.pds.insert(id, Pd { owner });
        id
    }

    /// Destroys a protection domain; EBUSY while MRs, MWs, QPs or SRQs use it (as uverbs counts
    /// a PD's users).
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        if !self.pds.contains_key(&pd) {
            return Err(VerbsError::Inval);
        }
        if self.pd_busy(pd, None) {
            return Err(VerbsError::Busy);
        }
        self.pds.remove(&pd);
        Ok(())
    }

    /// Whether objects other than the region `but` use `pd`: regions, windows, QPs, SRQs.
    pub fn pd_busy(&self, pd: PdId, but: Option<u32>) -> bool {
        self.mrs.values().any(|m| m.pd == pd && Some(m.lkey) != but)
            || self.mws.values().any(|w| w.pd == pd)
            || self.qps.values().any(|q| q.pd == Some(pd))
            || self.srqs.values().any(|s| s.pd == pd)
    }

    /// Registers `len` bytes at `addr` of the PD owner's memory. Remote write or atomic access
    /// needs local write too (IBTA 10.6.3.1, `ibv_reg_mr` EINVAL).
    pub fn reg_mr(&mut self, pd: PdId, addr: u64, len: u64, access: Access) -> Result<MrKeys, VerbsError> {
        let owner = self.pds.get(&pd).ok_or(VerbsError::Inval)?.owner;
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::Inval);
        }
        if addr.checked_add(len).is_none() {
            return Err(VerbsError::Inval);
        }
        // An index of this engine's and a random low byte (`keys.rs`).
        let lkey = self.new_key()?;
        let rkey = lkey;
        self.mrs.insert(lkey >> 8, Mr { pd, owner, addr, len, access, lkey, rkey });
        Ok(MrKeys { lkey, rkey })
    }

    /// `ibv_rereg_mr`: changes a region's PD, range or access in place, keeping its keys (as
    /// rxe and hardware do for these changes); `None` keeps what it was.
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdId>,
        range: Option<(u64, u64)>,
        access: Option<Access>,
    ) -> Result<(), VerbsError> {
        if let Some(p) = pd {
            if !self.pds.contains_key(&p) {
                return Err(VerbsError::Inval);
            }
        }
        let m = match self.mrs.get_mut(&(lkey >> 8)) {
            Some(m) if m.lkey == lkey => m,
            _ => return Err(VerbsError::Inval),
        };
        let acc = access.unwrap_or(m.access);
        if acc.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !acc.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::Inval);
        }
        if let Some((addr, len)) = range {
            if addr.checked_add(len).is_none() {
                return Err(VerbsError::Inval);
            }
            m.addr = addr;
            m.len = len;
        }
        if let Some(p) = pd {
            m.pd = p;
        }
        m.access = acc;
        self.drop_rkey_aliases(lkey);
        Ok(())
    }

    /// The receive WQEs queued on a QP's own receive queue (the device rewrites staged ones).
    pub fn queued_recvs_mut(&mut self, qpn: Qpn) -> Option<&mut VecDeque<RecvWr>> {
        self.qps.get_mut(&qpn).map(|q| &mut q.rq)
    }

    /// The receive WQEs queued on an SRQ.
    pub fn queued_srq_recvs_mut(&mut self, srqn: u32) -> Option<&mut VecDeque<RecvWr>> {
        self.srqs.get_mut(&srqn).map(|s| &mut s.queue)
    }

    /// Deregisters a memory region (and the remote keys aliased to it).
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), VerbsError> {
        match self.mrs.get(&(lkey >> 8)) {
            Some(m) if m.lkey == lkey => {
                self.mrs.remove(&(lkey >> 8));
                self.drop_rkey_aliases(lkey);
                Ok(())
            }
            _ => Err(VerbsError::Inval),
        }
    }

    /// Lets a region also answer to `rkey`, a remote key another engine of this device gave out
    /// for the same memory (a provider process's region, whose twin here serves RDMA that
    /// arrives through an XRC target QP of this engine). The alias has the region's PD, range
    /// and access as they are now; it goes when the region is deregistered or changed. EINVAL
    /// for an unknown region, or a key that already names a region or alias here: a key of
    /// this engine always wins.
    pub fn alias_rkey(&mut self, lkey: u32, rkey: u32) -> Result<(), VerbsError> {
        let m = self.mrs.get(&(lkey >> 8)).filter(|m| m.lkey == lkey).ok_or(VerbsError::Inval)?;
        if self.mrs.get(&(rkey >> 8)).is_some_and(|o| o.rkey == rkey) || self.rkey_aliases.contains_key(&rkey) {
            return Err(VerbsError::Inval);
        }
        let alias = Mr { pd: m.pd, owner: m.owner, addr: m.addr, len: m.len, access: m.access, lkey, rkey };
        self.rkey_aliases.insert(rkey, alias);
        Ok(())
    }

    fn drop_rkey_aliases(&mut self, lkey: u32) {
        if !self.rkey_aliases.is_empty() {
            self.rkey_aliases.retain(|_, a| a.lkey != lkey);
        }
    }

    /// Creates a CQ of at least `cqe` entries; EINVAL beyond the device limit.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqId, VerbsError> {
        if cqe == 0 || cqe > self.config.limits.max_cqe {
            return Err(VerbsError::Inval);
        }
        let id = CqId(self.next_id());
        self.cqs.insert(
            id,
            Cq { capacity: cqe as usize, entries: VecDeque::new(), overflowed: false, added: 0, solicited: 0 },
        );
        Ok(id)
    }

    /// `ibv_resize_cq`: the CQ holds `cqe` entries from now on; EINVAL beyond the device limit or
    /// below what it holds now plus `elsewhere` (completions already handed on but not yet polled).
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32, elsewhere: usize) -> Result<(), VerbsError> {
        let max = self.config.limits.max_cqe;
        let c = self.cqs.get_mut(&cq).ok_or(VerbsError::Inval)?;
        if cqe == 0 || cqe > max || c.entries.len() + elsewhere > cqe as usize {
            return Err(VerbsError::Inval);
        }
        c.capacity = cqe as usize;
        Ok(())
    }

    /// Destroys a CQ; EBUSY while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        if !self.cqs.contains_key(&cq) {
            return Err(VerbsError::Inval);
        }
        // An XRC SRQ completes into its CQ: busy too.
        if self.qps.values().any(|q| q.send_cq == Some(cq) || q.recv_cq == Some(cq))
            || self.srqs.values().any(|s| s.xrc.is_some_and(|(_, c)| c == cq))
        {
            return Err(VerbsError::Busy);
        }
        self.cqs.remove(&cq);
        Ok(())
    }

    /// Takes up to `max` completions from a CQ, oldest first.
    pub fn poll_cq(&mut self, cq: CqId, max: usize) -> Vec<WorkCompletion> {
        let Some(c) = self.cqs.get_mut(&cq) else { return Vec::new() };
        let n = max.min(c.entries.len());
        c.entries.drain(..n).collect()
    }

    /// Whether a local SGE lies in a memory region of `pd` that grants `access`: the check the
    /// engine makes when it uses the SGE (a device that redirects a receive checks it first).
    pub fn sge_ok(&self, pd: PdId, sge: &crate::wr::Sge, access: Access) -> bool {
        self.mrs
            .get(&(sge.lkey >> 8))
            .filter(|m| m.lkey == sge.lkey)
            .is_some_and(|m| m.pd == pd && m.contains(sge.addr, u64::from(sge.length)) && m.access.contains(access))
    }

    /// What a completion channel needs to know about a CQ: completions added since it was
    /// created, how many of those a solicited-only request fires for, and how many it holds now.
    pub fn cq_counts(&self, cq: CqId) -> Option<CqCounts> {
        self.cqs.get(&cq).map(|c| CqCounts { added: c.added, solicited: c.solicited, held: c.entries.len() })
    }

    /// Creates a QP in RESET. Capacities beyond the device limits are EINVAL (as rxe_qp_chk_cap).
    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn, VerbsError> {
        let l = self.config.limits;
        if !self.pds.contains_key(&init.pd) {
            return Err(VerbsError::Inval);
        }
        if !self.cqs.contains_key(&init.send_cq) || !self.cqs.contains_key(&init.recv_cq) {
            return Err(VerbsError::Inval);
        }
        let c = init.caps;
        if c.max_send_wr > l.max_qp_wr
            || c.max_recv_wr > l.max_qp_wr
            || c.max_send_sge > l.max_sge
            || c.max_recv_sge > l.max_sge
            || c.max_inline_data > l.max_inline
        {
            return Err(VerbsError::Inval);
        }
        if init.qp_type == QpType::XrcTgt {
            // Target QPs are made with create_xrc_tgt_qp: they belong to a domain, not a PD.
            return Err(VerbsError::Inval);
        }
        if let Some(n) = init.srq {
            match self.srqs.get(&n) {
                Some(s) if s.xrc.is_none() => {}
                _ => return Err(VerbsError::Inval),
            }
        }
        let qpn = self.alloc_qpn()?;
        let owner = self.pds[&init.pd].owner;
        self.qps.insert(qpn, Qp::new(qpn, init, owner));
        Ok(qpn)
    }

    /// Destroys a QP and removes its completions from its CQs.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let qp = self.qps.remove(&qpn).ok_or(VerbsError::Inval)?;
        for cq in [qp.send_cq, qp.recv_cq].into_iter().flatten() {
            if let Some(c) = self.cqs.get_mut(&cq) {
                c.entries.retain(|w| w.qp_num != qpn);
            }
        }
        self.ready.retain(|q| *q != qpn);
        self.in_ready.remove(&qpn);
        if let Some(t) = self.armed.remove(&qpn) {
            self.timers.remove(&(t, qpn));
        }
        for m in self.mcast.values_mut() {
            m.retain(|q| *q != qpn);
        }
        Ok(())
    }

    /// Attaches a UD QP to a multicast group (`ibv_attach_mcast`; the group's GID as an IP
    /// address). EINVAL for other QP types or a non-multicast address.
    pub fn attach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::Inval)?;
        if qp.qp_type != QpType::Ud || !group.is_multicast() {
            return Err(VerbsError::Inval);
        }
        let m = self.mcast.entry(group).or_default();
        if !m.contains(&qpn) {
            m.push(qpn);
        }
        Ok(())
    }

    /// Sets IBV_QP_CREATE_BLOCK_SELF_MCAST_LB on a UD QP (EINVAL for other types).
    pub fn set_block_self_mcast_lb(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbsError::Inval);
        }
        qp.block_self_mcast_lb = true;
        Ok(())
    }

    /// Detaches a QP from a group (`ibv_detach_mcast`); EINVAL if it was not attached.
    pub fn detach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), VerbsError> {
        let m = self.mcast.get_mut(&group).ok_or(VerbsError::Inval)?;
        let i = m.iter().position(|q| *q == qpn).ok_or(VerbsError::Inval)?;
        m.remove(i);
        Ok(())
    }

    /// Send work requests posted and not yet retired (completed) on a QP.
    pub fn send_queue_len(&self, qpn: Qpn) -> Option<usize> {
        self.qps.get(&qpn).map(|q| q.sq.len())
    }

    /// Whether QP `qpn` waits for an answer to packets it sent (its transport timer or an RNR
    /// wait is armed): the answer, or the timer, will run the QP again.
    pub fn awaiting_response(&self, qpn: Qpn) -> bool {
        self.qps.get(&qpn).is_some_and(|q| q.comp.retrans_at.is_some() || q.comp.rnr_until.is_some())
    }

    /// The QP's current attributes and state.
    pub fn query_qp(&self, qpn: Qpn) -> Result<(QpState, QpAttr), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::Inval)?;
        Ok((qp.state, qp.attr))
    }

    /// Modifies a QP (`ibv_modify_qp`): the attribute mask must suit the transition and QP type
    /// (EINVAL otherwise, state unchanged).
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        let now = Instant::ZERO;
        let limits = self.config.limits;
        let port_mtu = self.config.mtu;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let mut ctx = ctx!(self, now);
        qp.modify(&mut ctx, attr, mask, &limits, port_mtu)?;
        self.touched(qpn);
        Ok(())
    }

    /// Posts a send work request (`ibv_post_send`). ENOMEM when the send queue is full, EINVAL for
    /// a bad request; in ERR the request completes flushed.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        self.post_send_inline(qpn, wr, None)
    }

    /// Posts a send work request whose data the caller already copied (`data`, as many bytes as
    /// the SGEs say): IBV_SEND_INLINE data, which the application may reuse as soon as the post
    /// returns, or the payload of a SEND/WRITE that a client gathered at post time after its own
    /// lkey checks (design D3), so the device need not reach into the client to send it.
    pub fn post_send_inline(&mut self, qpn: Qpn, wr: SendWr, data: Option<Vec<u8>>) -> Result<(), VerbsError> {
        let limits = self.config.limits;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let mut ctx = ctx!(self, Instant::ZERO);
        qp.post_send(&mut ctx, wr, data, &limits)?;
        self.touched(qpn);
        Ok(())
    }

    /// Posts a receive work request (`ibv_post_recv`).
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let mut ctx = ctx!(self, Instant::ZERO);
        qp.post_recv(&mut ctx, wr)
    }

    /// The next async event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        let e = self.events.pop_front()?;
        if let AsyncEvent::CommEst(q) = e {
            // The CM hears of it as ib_cm does through rdma_notify: a passive connection whose
            // RTU was lost is established by the first packet on its QP.
            self.cm.notify_qp(q.value());
        }
        Some(e)
    }

    /// The next async event of an XRC target QP for one of its handles (every handle gets each).
    pub fn poll_handle_event(&mut self) -> Option<HandleEvent> {
        self.handle_events.pop_front()
    }

    /// Takes one datagram's UDP payload (BTH to ICRC). Untrusted: a malformed packet, a bad ICRC,
    /// an unknown QP or a packet for a QP that cannot take it is counted and dropped.
    pub fn handle_packet(&mut self, now: Instant, meta: RecvMeta, payload: &[u8]) {
        self.handle(now, meta, payload, true);
    }

    /// Takes a packet this device sent to itself through internal loopback (never on a wire)
    /// without an ICRC ([`TransmitOptions::loopback_icrc`] off): its ICRC was not computed, so it is not
    /// checked; everything else is, as for [`Device::handle_packet`].
    pub fn handle_internal_packet(&mut self, now: Instant, meta: RecvMeta, payload: &[u8]) {
        self.handle(now, meta, payload, false);
    }

    fn handle(&mut self, now: Instant, meta: RecvMeta, payload: &[u8], verify: bool) {
        let Ok(pkt) = IbPacket::new_checked(payload) else {
            self.counters.malformed += 1;
            return;
        };
        // IBTA A17.4.3.1: verify the ICRC over the headers as the sender wrote them.
        let dst = meta.dst.unwrap_or(self.config.addr);
        let (hdr, n) = ip_udp_header(meta.src, dst, meta.src_port, payload.len(), meta.ip_id.unwrap_or(0));
        match verify.then(|| icrc::roce_v2_parts(&hdr[..n], pkt.body())) {
            None => {}
            Some(Ok(c)) if c == pkt.icrc() => {}
            Some(_) => {
                // The given ID is what the receiver knows or guesses (a raw socket's real ID, a
                // segment's place in a GRO buffer); under AnyIpv4Id a mismatch is solved anyway.
                let solved = self.config.icrc == IcrcPolicy::AnyIpv4Id
                    && matches!(dst, IpAddr::V4(_))
                    && icrc::solve_ipv4_id(&hdr[..n], payload).is_some();
                if !solved {
                    self.counters.icrc_err += 1;
                    return;
                }
                self.counters.icrc_id_solved += 1;
            }
        }
        let bth = BthPacket::new_unchecked(payload);
        let qpn = bth.dest_qp();
        if qpn == Qpn::GSI {
            self.handle_gsi(now, meta.src, &pkt);
            return;
        }
        if qpn == Qpn::MULTICAST {
            // A multicast datagram goes to every UD QP attached to the group (IBTA 10.5).
            let members = self.mcast.get(&dst).cloned().unwrap_or_default();
            if members.is_empty() {
                self.counters.unknown_qp += 1;
            }
            // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: a QP that asked for it does not hear its own
            // sends (this device's address and the QP as DETH's source QP).
            let own = (meta.src == self.config.addr).then(|| pkt.deth().map(|d| d.src_qp())).flatten();
            for q in members {
                if let Some(qp) = self.qps.get_mut(&q) {
                    if qp.block_self_mcast_lb && own == Some(q) {
                        continue;
                    }
                    let mut ctx = ctx!(self, now);
                    ctx.dst = dst;
                    if qp.handle_packet(&mut ctx, meta.src, &pkt) {
                        self.counters.rcvd_pkts += 1;
                    }
                }
                self.touched(q);
            }
            return;
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.counters.unknown_qp += 1;
            return;
        };
        let mut ctx = ctx!(self, now);
        if qp.handle_packet(&mut ctx, meta.src, &pkt) {
            self.counters.rcvd_pkts += 1;
        }
        self.touched(qpn);
    }

    /// A datagram for QP1, the GSI: a CM MAD. IBTA 13.4.6 / rxe_recv.c: UD SEND_ONLY, P_Key
    /// 0xFFFF (the default partition; rxe checks it with pkey_match), Q_Key 0x80010000
    /// (IB_QP1_QKEY); anything else is dropped and counted.
    fn handle_gsi(&mut self, now: Instant, src: IpAddr, pkt: &IbPacket<&[u8]>) {
        let bth = pkt.bth();
        let qkey_ok = pkt.deth().is_some_and(|d| d.qkey() == GSI_QKEY);
        if pkt.opcode() != Opcode::UD_SEND_ONLY || bth.pkey() & 0x7fff != 0x7fff || !qkey_ok {
            self.counters.malformed += 1;
            return;
        }
        self.counters.rcvd_pkts += 1;
        self.cm.handle_mad(now, src, pkt.payload());
    }

    /// The next MAD of the CM as a QP1 packet: UD SEND_ONLY to QP1, DETH Q_Key 0x80010000 and
    /// source QP 1, one PSN per MAD (IBTA 13.5; the kernel's MAD layer over rxe).
    fn poll_gsi(&mut self, now: Instant, buf: &mut [u8], opts: TransmitOptions) -> Option<Transmit> {
        let m = self.cm.poll_mad()?;
        let psn = self.gsi_psn;
        self.gsi_psn = psn + 1;
        let mut ib = IbRepr::new(BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: IbRepr::pad_for(m.mad.len()),
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::GSI,
            ack_req: false,
            psn,
        });
        ib.payload_len = m.mad.len();
        ib.deth = Some(DethRepr { qkey: GSI_QKEY, src_qp: Qpn::GSI });
        let mut ctx = ctx!(self, now);
        (ctx.ip_id, ctx.loopback_icrc) = (opts.ip_id, opts.loopback_icrc);
        let t = packet::emit(&mut ctx, Qpn::GSI, m.dst, buf, &ib, |_, out| {
            out.copy_from_slice(&m.mad);
            true
        });
        if t.is_some() {
            self.counters.sent_pkts += 1;
        }
        t
    }

    /// After a QP ran: queue it to transmit, and refile its timer.
    fn touched(&mut self, qpn: Qpn) {
        if self.in_ready.insert(qpn) {
            self.ready.push_back(qpn);
        }
        self.sync_timer(qpn);
    }

    fn sync_timer(&mut self, qpn: Qpn) {
        let new = self.qps.get(&qpn).and_then(|q| q.poll_timeout());
        let old = self.armed.get(&qpn).copied();
        if new == old {
            return;
        }
        if let Some(t) = old {
            self.timers.remove(&(t, qpn));
            self.armed.remove(&qpn);
        }
        if let Some(t) = new {
            self.timers.insert((t, qpn));
            self.armed.insert(qpn, t);
        }
    }

    /// Writes the next packet to send into `buf` (at least MTU + 64 bytes) and says where it goes,
    /// with the default [`TransmitOptions`].
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.poll_transmit_with(now, buf, TransmitOptions::default())
    }

    /// [`Device::poll_transmit`], the packet's ICRC written as `opts` say.
    pub fn poll_transmit_with(&mut self, now: Instant, buf: &mut [u8], opts: TransmitOptions) -> Option<Transmit> {
        if let Some(t) = self.poll_gsi(now, buf, opts) {
            return Some(t);
        }
        while let Some(qpn) = self.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                self.in_ready.remove(&qpn);
                continue;
            };
            let blocked = self.mem.would_block_count();
            let mut ctx = ctx!(self, now);
            (ctx.ip_id, ctx.loopback_icrc) = (opts.ip_id, opts.loopback_icrc);
            let sent = qp.poll_transmit(&mut ctx, buf, opts.requester_first);
            self.sync_timer(qpn);
            if let Some(t) = sent {
                self.counters.sent_pkts += 1;
                self.ready.push_back(qpn);
                return Some(t);
            }
            self.in_ready.remove(&qpn);
            if self.mem.would_block_count() != blocked && !self.mem_waiters.contains(&qpn) {
                self.mem_waiters.push(qpn);
            }
        }
        None
    }

    /// The memory has news for accesses that would have blocked ([`Memory::would_block_count`]):
    /// the QPs that waited for them try again.
    pub fn memory_ready(&mut self) {
        for qpn in std::mem::take(&mut self.mem_waiters) {
            if self.qps.contains_key(&qpn) && self.in_ready.insert(qpn) {
                self.ready.push_back(qpn);
            }
        }
    }

    /// Whether a QP has responder packets to send (ACKs, NAKs, READ responses, atomic ACKs):
    /// answers to what it received.
    pub fn answers_pending(&self) -> bool {
        self.ready.iter().any(|q| self.qps.get(q).is_some_and(|qp| !qp.resp.out.is_empty()))
    }

    /// Whether all this device would send now is acknowledgements (ACKs and NAKs): no READ
    /// response or atomic acknowledge (a requester waits for its data), no requester packet (no
    /// QP has posted work left to send). What a host may let wait a little for the
    /// application's next post, to leave in the same send as it (IBTA 9.7.5.1 fixes no time
    /// for an acknowledgement, only that it comes before the requester's transport timer).
    pub fn only_acks_pending(&self) -> bool {
        let mut acks = false;
        for q in &self.ready {
            let Some(qp) = self.qps.get(q) else { continue };
            if qp.req.idx < qp.sq.len() || !qp.resp.out.iter().all(|o| matches!(o, qp::RespOut::Ack { .. })) {
                return false;
            }
            acks |= !qp.resp.out.is_empty();
        }
        acks
    }

    /// The earliest timer deadline of any QP.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.timers.first().map(|(t, _)| *t), self.cm.poll_timeout()].into_iter().flatten().min()
    }

    /// Fires QP `qpn`'s transport timer at `now` whether or not it was due (IBTA 9.7.6.1.3: go
    /// back to the oldest unacknowledged PSN, the window shrinks as on any timeout). A trace
    /// replay uses it to re-enact the timeouts a recorded requester took, whose timer value is
    /// not on the wire. Nothing happens when no sent request is outstanding.
    pub fn expire_transport_timer(&mut self, qpn: Qpn, now: Instant) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            let mut ctx = ctx!(self, now);
            comp::retransmit_timeout(qp, &mut ctx);
        }
        self.touched(qpn);
    }

    /// Runs every timer that is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
        }
        let due: Vec<Qpn> = self.timers.iter().take_while(|(t, _)| *t <= now).map(|(_, q)| *q).collect();
        for qpn in due {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                let mut ctx = ctx!(self, now);
                qp.handle_timeout(&mut ctx);
            }
            self.touched(qpn);
        }
    }
}

/// Packets a message of `len` bytes takes at path MTU `mtu` (a zero-length message takes one).
/// Lengths go up to 2^31 (IBTA's largest message), so this is done in u64.
pub fn packets_for(len: u32, mtu: u32) -> u32 {
    (u64::from(len).div_ceil(u64::from(mtu.max(1)))).max(1) as u32
}

/// The payload of packet `index` (from 0) of a `len`-byte message at path MTU `mtu`.
pub fn packet_payload(len: u32, mtu: u32, index: u32) -> u32 {
    let start = u64::from(index) * u64::from(mtu);
    (u64::from(len).saturating_sub(start)).min(u64::from(mtu)) as u32
}

/// The local ACK timeout for the 5-bit attribute: 4.096 us x 2^timeout; 0 means no timer
/// (IBTA 11.2.4.2, the Local ACK Timeout attribute).
pub fn ack_timeout(code: u8) -> Option<Duration> {
    if code == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << code.min(31)))
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn two_gib_minus_one_message_arithmetic() {
        let len = (1u32 << 31) - 1;
        assert_eq!(packets_for(len, 4096), 524_288);
        assert_eq!(packet_payload(len, 4096, 0), 4096);
        assert_eq!(packet_payload(len, 4096, 524_287), 4095);
        assert_eq!(packets_for(len, 256), 8_388_608);
        assert_eq!(packet_payload(len, 256, 8_388_607), 255);
        assert_eq!(packets_for(1 << 31, 256), 8_388_608);
        assert_eq!(packet_payload(1 << 31, 256, 8_388_607), 256);
        assert_eq!(packets_for(0, 1024), 1);
        assert_eq!(packet_payload(0, 1024, 0), 0);
        // The PSN of the last packet of such a message wraps correctly.
        let first = crate::wire::Psn::new(0xff_fff0);
        assert_eq!((first + (packets_for(len, 4096) - 1)).value(), (0xff_fff0 + 524_287) & 0xff_ffff);
    }

    #[test]
    fn ack_timeout_table() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
    }
}
