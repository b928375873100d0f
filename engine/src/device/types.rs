//! The device's value types: its configuration and limits, object handles, events, what a
//! received datagram says of itself, what a transmit call returns, and the counters.

use std::net::IpAddr;

use super::WireProfile;
use crate::memory::Owner;
use crate::verbs::Mtu;
use crate::wire::Qpn;

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
    /// If the ICRC does not hold for that ID, accept it when some ID makes it hold
    /// (docs/architecture.md D5: rxe and hardware change the ID per packet); a corrupted packet
    /// then passes with probability about 2^-16. IPv6 is always exact.
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
    /// The wire choices the IBTA leaves open (`rxe` by default; [`profile`](super::profile)).
    pub behaviour: WireProfile,
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
            behaviour: WireProfile::RXE,
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

/// A CQ's counts (see [`Device::cq_counts`](super::Device::cq_counts)).
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

/// How [`Device::poll_transmit_with`](super::Device::poll_transmit_with) writes a packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmitOptions {
    /// The IPv4 Identification the ICRC is computed for (0 unless set). A transport that sends
    /// several packets in one UDP GSO send, whose segments Linux numbers 0, 1, 2, ..., gives the
    /// number this packet will get, so that its ICRC need not be computed twice
    /// (docs/architecture.md D5).
    pub ip_id: u16,
    /// Whether a packet to the device's own address gets an ICRC (the default): one for a QP of
    /// this engine (internal loopback), and one for a QP of another engine of the same device
    /// (another process's, reached through the device's port on this host). A transport that
    /// neither captures such packets nor injects faults into them may leave it out, and the
    /// receiving engine, told the same, takes them with [`Device::handle_internal_packet`](super::Device::handle_internal_packet): an
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

/// Metadata of a packet [`Device::poll_transmit`](super::Device::poll_transmit) wrote.
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
    /// Responses (ACK, NAK, READ response, atomic ACK) for a PSN this requester has not sent,
    /// dropped (IBTA 9.7.5.1.1: a response outside the outstanding PSNs answers nothing).
    pub unsent_psn_responses: u64,
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
            unsent_psn_responses,
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
        self.unsent_psn_responses += unsent_psn_responses;
        self.local_ack_timeout_err += local_ack_timeout_err;
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
