//! The connection manager (IBTA Vol 1 chapter 12) as the Linux kernel's ib_cm + rdma_cm run it
//! over RoCEv2 (docs/architecture.md D10): communication IDs, listeners by service ID, the active
//! and passive connection state machines (REQ -> REP -> RTU; REJ; MRA for duplicates; DREQ/DREP;
//! timewait), response timeouts and retries, and the QP attributes each side's QP needs
//! (`init_qp_attr`).
//!
//! Sans-IO like the rest of the engine: MADs come in through [`Cm::handle_mad`] (the device hands
//! it what QP1 received), go out through [`Cm::poll_mad`] (the device sends them from QP1 as UD
//! SEND_ONLY, Q_Key 0x80010000), time is an argument, and what the consumer must hear comes out
//! of [`Cm::poll_event`]. Addresses and routes are resolved by the caller (they need the host's
//! routing table); the CM is given the resolved source and destination.
//!
//! Values follow Linux 6.1 unless the configuration says otherwise (`reference/cm/README.md`):
//! CM response timeout 20, 15 CM retries, packet lifetime 18 (local ACK timeout 19), target ACK
//! delay 15 (rxe's), timewait 2^(lifetime + 1 - 8) ms.

mod conn;
mod sidr;
pub use conn::REQ_USER_DATA_LEN;
pub use sidr::{sidr_status, SIDR_REQ_USER_DATA_LEN};
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::device::QpAttr;
use crate::rng::Rng;
use crate::time::{Duration, Instant};
use crate::verbs::{Access, AttrMask, Mtu, QpState, QpType};
use crate::wire::{CmPath, MAD_LEN};

/// RDMA_PS_TCP: RC connections.
pub const PS_TCP: u16 = 0x0106;
/// RDMA_PS_UDP: UD (SIDR).
pub const PS_UDP: u16 = 0x0111;
/// RDMA_PS_IB: any QP type the caller sets (XRC among them).
pub const PS_IB: u16 = 0x013f;
/// RDMA_PS_IPOIB.
pub const PS_IPOIB: u16 = 0x0002;

/// The Q_Key of UD IDs of RDMA_PS_UDP and RDMA_PS_IB (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The service ID of a port in a port space (kernel `cma_get_service_id`).
pub const fn service_id(ps: u16, port: u16) -> u64 {
    ((ps as u64) << 16) | port as u64
}

/// REJ reasons (IBTA Vol 1 table 112; kernel `enum ib_cm_rej_reason`).
pub mod reject {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// The ID was destroyed while its REQ was outstanding ("timeout").
    pub const TIMEOUT: u16 = 4;
    /// No listener for the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// The (CA GUID, QPN) pair is already connected or in timewait.
    pub const STALE_CONN: u16 = 10;
    /// The passive side cannot build an address vector from the REQ's path.
    pub const INVALID_GID: u16 = 12;
    /// The consumer rejected (rdma_reject), or rdma_cm refused what the IB CM matched.
    pub const CONSUMER_DEFINED: u16 = 28;
    /// rdma_reject_ece: the ECE options were rejected.
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// How the CM is set up.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// The device's address (the GID is its `::ffff:` form for IPv4).
    pub addr: IpAddr,
    /// The node/CA GUID put in REQ and REP.
    pub ca_guid: u64,
    /// The port's active MTU (the REQ's path MTU).
    pub mtu: Mtu,
    /// The CM response timeout the REQ asks for (`CMA_CM_RESPONSE_TIMEOUT`: 20 in Linux, 22 in
    /// Mellanox OFED).
    pub cm_response_timeout: u8,
    /// Retries of REQ, REP and DREQ (`CMA_MAX_CM_RETRIES`: 15).
    pub max_cm_retries: u8,
    /// The packet lifetime of the path (`CMA_IBOE_PACKET_LIFETIME`: 18); the local ACK timeout
    /// is one more (19).
    pub packet_lifetime: u8,
    /// The target ACK delay this device reports in REP (rxe: 15).
    pub target_ack_delay: u8,
    /// The static rate put in the REQ's path without a resolved route (0 "port current", as the
    /// kernel's rdma_cm on RoCE; a ConnectX host under Mellanox OFED reports the link's rate).
    pub path_rate: u8,
    /// Scale of every CM timer, in 1/1000 (1000: the real values). Tests shorten them.
    pub timer_scale_permille: u32,
    /// Most connections waiting in REQ_RCVD (not yet accepted or rejected) on this device, all
    /// listeners together: what a REQ flood can make the CM hold. Beyond it, REQs are dropped.
    pub max_pending: usize,
    /// Seed of comm IDs and starting PSNs.
    pub seed: u64,
    /// How long a REQ for a service ID nobody listens on waits for a listener before its REJ 8
    /// (zero: rejected at once, as the kernel's cm_match_req does). A software device's listen
    /// is a few calls to its daemon where the kernel's is one system call; programs that send
    /// their port to the peer before they call rdma_listen (qperf 0.4.11's cm_open_server)
    /// count on the listen winning that race. Unscaled by `timer_scale_permille`.
    pub late_listener_grace: Duration,
}

/// Most REQs waiting for a late listener at once ([`CmConfig::late_listener_grace`]); more are
/// rejected at once.
pub(super) const MAX_PARKED_REQS: usize = 256;

impl CmConfig {
    /// The kernel's values for a device at `addr`.
    pub fn new(addr: IpAddr, ca_guid: u64, mtu: Mtu, seed: u64) -> CmConfig {
        CmConfig {
            addr,
            ca_guid,
            mtu,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_lifetime: 18,
            target_ack_delay: 15,
            path_rate: 0,
            timer_scale_permille: 1000,
            max_pending: 4096,
            seed,
            late_listener_grace: Duration::ZERO,
        }
    }

    /// `cm_convert_to_ms`: 4.096 us x 2^t, as the kernel rounds it (2^(t-8) ms), scaled.
    fn timer(&self, t: u8) -> Duration {
        let ms = if t >= 8 { 1u64 << (t.min(31) - 8) } else { 1 };
        Duration::from_micros(ms * 1000 * self.timer_scale_permille as u64 / 1000)
    }
}

/// Why a CM call failed; each maps to the errno the kernel's rdma_cm gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CmError {
    /// EINVAL: the ID is not in a state for this call, or an argument is out of range.
    #[error("invalid argument or state (EINVAL)")]
    Inval,
    /// ENOENT: no such ID.
    #[error("no such ID (ENOENT)")]
    NoEnt,
    /// EADDRINUSE: a listener already holds that service ID and address.
    #[error("address in use (EADDRINUSE)")]
    AddrInUse,
    /// ENOMEM: too much state.
    #[error("out of resources (ENOMEM)")]
    NoMem,
    /// EOPNOTSUPP.
    #[error("operation not supported (EOPNOTSUPP)")]
    NotSupp,
    /// ENODEV: what needs an IB subnet administrator on a RoCE port (RDMA_PS_IPOIB's Q_Key).
    #[error("no subnet administrator on a RoCE port (ENODEV)")]
    NoDev,
}

impl CmError {
    /// The errno value.
    pub const fn errno(self) -> i32 {
        match self {
            CmError::Inval => 22,
            CmError::NoEnt => 2,
            CmError::AddrInUse => 98,
            CmError::NoMem => 12,
            CmError::NotSupp => 95,
            CmError::NoDev => 19,
        }
    }
}

/// A communication ID's handle on this device.
pub type IdHandle = u32;

/// What the consumer hears (`enum rdma_cm_event_type` values, for the connection events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CmEventKind {
    /// RDMA_CM_EVENT_ADDR_ERROR (1): here, a SIDR_REP with a Q_Key the ID cannot take.
    AddrError,
    /// RDMA_CM_EVENT_CONNECT_REQUEST (4): a REQ for a listener; the event's ID is new.
    ConnectRequest,
    /// RDMA_CM_EVENT_CONNECT_RESPONSE (5): a REP on the active side.
    ConnectResponse,
    /// RDMA_CM_EVENT_CONNECT_ERROR (6).
    ConnectError,
    /// RDMA_CM_EVENT_UNREACHABLE (7): no answer (status -ETIMEDOUT).
    Unreachable,
    /// RDMA_CM_EVENT_REJECTED (8): status is the REJ reason.
    Rejected,
    /// RDMA_CM_EVENT_ESTABLISHED (9).
    Established,
    /// RDMA_CM_EVENT_DISCONNECTED (10).
    Disconnected,
    /// RDMA_CM_EVENT_TIMEWAIT_EXIT (15).
    TimewaitExit,
}

impl CmEventKind {
    /// The `rdma_cm_event_type` value.
    pub const fn to_rdma(self) -> u32 {
        match self {
            CmEventKind::AddrError => 1,
            CmEventKind::ConnectRequest => 4,
            CmEventKind::ConnectResponse => 5,
            CmEventKind::ConnectError => 6,
            CmEventKind::Unreachable => 7,
            CmEventKind::Rejected => 8,
            CmEventKind::Established => 9,
            CmEventKind::Disconnected => 10,
            CmEventKind::TimewaitExit => 15,
        }
    }
}

/// Connection parameters: what `rdma_connect`/`rdma_accept` give (`struct rdma_conn_param`) and
/// what a CONNECT_REQUEST / CONNECT_RESPONSE / ESTABLISHED event reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConnParam {
    /// Private data (the consumer's; the CM adds the IP header to a REQ itself).
    pub private_data: Vec<u8>,
    /// Responder resources (incoming READ/atomic depth).
    pub responder_resources: u8,
    /// Initiator depth (outgoing READ/atomic depth).
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (0-7).
    pub retry_count: u8,
    /// RNR retries (0-7).
    pub rnr_retry_count: u8,
    /// Whether the QP uses an SRQ.
    pub srq: bool,
    /// The QP number (the local one in a call, the remote one in an event).
    pub qp_num: u32,
    /// Enhanced Connection Establishment: what this side sends in a REQ or REP (a call), what
    /// the peer's carried (an event).
    pub ece: Ece,
    /// UD (SIDR): the peer's Q_Key in an ESTABLISHED event (`param.ud.qkey`).
    pub qkey: u32,
}

/// ECE on the wire (Linux `struct ib_cm_ece`): the vendor in the REQ's and REP's Vendor ID
/// field (24 bits), the options in the MAD header's attribute modifier (cm_format_mad_ece_hdr).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Ece {
    /// The vendor (IEEE OUI, 24 bits; 0: no ECE).
    pub vendor_id: u32,
    /// The options (the MAD attribute modifier).
    pub attr_mod: u32,
}

/// One event for the consumer of an ID.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CmEvent {
    /// The ID the event is for (for CONNECT_REQUEST: the new ID).
    pub id: IdHandle,
    /// What happened.
    pub kind: CmEventKind,
    /// 0, a REJ reason (REJECTED), or a negative errno (-110 ETIMEDOUT).
    pub status: i32,
    /// For CONNECT_REQUEST: the listener.
    pub listen_id: Option<IdHandle>,
    /// The parameters the peer sent.
    pub param: ConnParam,
}

/// A CM MAD to send from QP1: 256 bytes to `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutMad {
    /// The peer's address.
    pub dst: IpAddr,
    /// The MAD.
    pub mad: Vec<u8>,
}

/// One ID as `softrdma cm-ids` lists it (what iproute2's `rdma resource show cm_id` shows).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct IdInfo {
    /// The ID.
    pub id: IdHandle,
    /// Port space (`RDMA_PS_*`).
    pub ps: u16,
    /// The QP type it connects.
    pub qp_type: QpType,
    /// Its state.
    pub state: IdState,
    /// Destroyed by its consumer, finishing its protocol.
    pub orphan: bool,
    /// Bound address.
    pub local: Option<SocketAddr>,
    /// Peer's address.
    pub remote: Option<SocketAddr>,
    /// The local QP number once connecting.
    pub qpn: u32,
    /// A listener's backlog and its requests waiting for accept or reject.
    pub backlog: u32,
    /// See `backlog`.
    pub pending: u32,
}

/// A communication ID's connection state (IBTA 12.9.6's states, rdma_cm's view of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum IdState {
    /// Created, bound or resolved: nothing on the wire yet.
    Idle,
    /// Listening.
    Listen,
    /// Active: REQ sent, waiting for REP/REJ.
    ReqSent,
    /// Passive: REQ received, waiting for the consumer's accept or reject.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, waiting for the consumer (RTU goes with establish/accept).
    RepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, DREP not yet sent (the consumer disconnects or destroys).
    DreqRcvd,
    /// Disconnected: waiting out stray packets before the QP number may be reused.
    Timewait,
    /// Over (rejected, timed out, timewait done).
    Closed,
}

/// What `init_qp_attr` returns: the attributes and the mask for `ibv_modify_qp`, and the address
/// vector's global route fields the engine's `QpAttr` does not carry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct InitQpAttr {
    /// Attributes.
    pub attr: QpAttr,
    /// Which ones are set.
    pub mask: AttrMask,
    /// AV hop limit.
    pub hop_limit: u8,
    /// AV traffic class.
    pub traffic_class: u8,
    /// AV flow label.
    pub flow_label: u32,
    /// AV service level.
    pub sl: u8,
}

/// The route of an active ID: the path record `rdma_resolve_route` produced (on RoCE the device
/// builds it from the routing and neighbour tables, cma_resolve_iboe_route) or the application set
/// (`RDMA_OPTION_IB_PATH`, rdma_set_ib_path). Its REQ carries it as the primary path, its MADs go
/// to `dgid`, and the QP gets its MTU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Route {
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Path MTU (`enum ibv_mtu`, 1-5).
    pub mtu: u8,
    /// Static rate (`enum ibv_rate`; 0: the port's).
    pub rate: u8,
    /// Packet lifetime (4.096 us x 2^N): the REQ's local ACK timeout is one more, unless the ID's
    /// RDMA_OPTION_ID_ACK_TIMEOUT says otherwise.
    pub packet_life_time: u8,
}

impl Route {
    /// The REQ's primary path for this route.
    fn path(&self, local_ack_timeout: u8) -> CmPath {
        CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: self.sgid,
            remote_gid: self.dgid,
            flow_label: self.flow_label & 0xf_ffff,
            packet_rate: self.rate & 0x3f,
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            sl: self.sl & 0xf,
            subnet_local: false,
            local_ack_timeout: local_ack_timeout.min(31),
        }
    }
}

/// What a REQ or REP told us about the path and the peer (kept for `init_qp_attr`; the depths
/// and flags are what the peer offered, kept for inspection in tests and debugging).
#[derive(Debug, Clone, Default)]
#[allow(dead_code)]
struct Peer {
    qpn: u32,
    psn: u32,
    ca_guid: u64,
    /// Responder resources the peer offers / initiator depth it will use.
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
}

/// A communication ID.
#[derive(Debug)]
struct Id {
    ps: u16,
    qp_type: QpType,
    state: IdState,
    /// Destroyed by its consumer: it lives on only to finish the protocol (DREQ retries,
    /// timewait), and its events are dropped.
    orphan: bool,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    tos: u8,
    /// RDMA_OPTION_ID_ACK_TIMEOUT.
    ack_timeout: Option<u8>,
    /// The route (rdma_resolve_route, RDMA_OPTION_IB_PATH).
    route: Option<Route>,
    /// Listener: its backlog and how many of its connections wait in REQ_RCVD.
    backlog: u32,
    pending: u32,
    /// A connection made from a listener's REQ.
    parent: Option<IdHandle>,
    local_comm_id: u32,
    remote_comm_id: u32,
    tid: u64,
    local_qpn: u32,
    local_psn: u32,
    /// The parameters this side gave (connect/accept).
    mine: ConnParam,
    peer: Peer,
    path: CmPath,
    path_mtu: Mtu,
    /// The peer's CM response timeout (REQ: remote/local CM response timeout fields).
    peer_response_timeout: u8,
    /// Made by a REQ (the passive side): its resend interval is 2^(the REQ's local CM response
    /// timeout - 8) ms, the active side's that of its REQ (ib_cm's timeout_ms).
    passive: bool,
    /// The last MAD this ID sent that may need resending, and where.
    last: Option<OutMad>,
    retries_left: u8,
    deadline: Option<Instant>,
}

impl Id {
    /// Where this ID's MADs go: the peer's GID of the connection's path (ib_cm sends the REP,
    /// DREQ and DREP through the address vector cm_init_av_by_path makes from the path, which
    /// on the passive side is the REQ's primary path, swapped), else the peer's IP address.
    fn mad_dst(&self) -> Option<IpAddr> {
        let gid = self.path.remote_gid;
        if gid != [0; 16] {
            let ip = gid_to_ip(&gid);
            if !ip.is_unspecified() && !ip.is_multicast() {
                return Some(ip);
            }
        }
        self.remote.map(|r| r.ip())
    }

    fn new(ps: u16, qp_type: QpType, mtu: Mtu) -> Id {
        Id {
            ps,
            qp_type,
            state: IdState::Idle,
            orphan: false,
            local: None,
            remote: None,
            tos: 0,
            ack_timeout: None,
            route: None,
            backlog: 0,
            pending: 0,
            parent: None,
            local_comm_id: 0,
            remote_comm_id: 0,
            tid: 0,
            local_qpn: 0,
            local_psn: 0,
            mine: ConnParam::default(),
            peer: Peer::default(),
            path: CmPath::default(),
            path_mtu: mtu,
            peer_response_timeout: 20,
            passive: false,
            last: None,
            retries_left: 0,
            deadline: None,
        }
    }
}

/// CM counters (`softrdma stat`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CmCounters {
    /// MADs sent (resends included).
    pub mads_sent: u64,
    /// MADs received and handled.
    pub mads_rcvd: u64,
    /// MADs resent after a response timeout.
    pub mads_resent: u64,
    /// MADs that did not parse (truncated, wrong class/version/method, unknown attribute).
    pub mads_malformed: u64,
    /// MADs for no known connection, or that the connection's state does not take.
    pub mads_unmatched: u64,
    /// REQs dropped because a listener's backlog, or the device's pending limit, was full.
    pub reqs_dropped: u64,
    /// REJs sent, any reason.
    pub rejs_sent: u64,
    /// Duplicates answered with MRA.
    pub mras_sent: u64,
    /// Connections established.
    pub established: u64,
}

/// One device's connection manager.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    rng: Rng,
    ids: HashMap<IdHandle, Id>,
    next_id: IdHandle,
    /// Listeners by service ID: (address or wildcard, ID).
    listeners: HashMap<u64, Vec<(Option<IpAddr>, IdHandle)>>,
    /// IDs by local comm ID.
    by_comm: HashMap<u32, IdHandle>,
    /// Connections by the peer's (address, comm ID): duplicate REQs.
    by_remote: HashMap<(IpAddr, u32), IdHandle>,
    /// Live and timewait connections by the peer's (CA GUID, QPN): stale-connection REJ 10.
    by_peer_qp: HashMap<(u64, u32), IdHandle>,
    timers: BTreeSet<(Instant, IdHandle)>,
    out: VecDeque<OutMad>,
    events: VecDeque<CmEvent>,
    pending: usize,
    counters: CmCounters,
    /// REQs waiting for a listener ([`CmConfig::late_listener_grace`]): until when, from whom.
    parked: Vec<ParkedReq>,
}

/// A REQ that found no listener, waiting for one.
#[derive(Debug)]
pub(super) struct ParkedReq {
    pub(super) until: Instant,
    pub(super) src: IpAddr,
    pub(super) tid: u64,
    pub(super) attr_mod: u32,
    pub(super) req: crate::wire::CmReqRepr,
}

impl Cm {
    /// A CM with no IDs.
    pub fn new(cfg: CmConfig) -> Cm {
        let rng = Rng::new(cfg.seed ^ 0x636d_5f63_6f6d_6d69);
        Cm {
            cfg,
            rng,
            ids: HashMap::new(),
            next_id: 1,
            listeners: HashMap::new(),
            by_comm: HashMap::new(),
            by_remote: HashMap::new(),
            by_peer_qp: HashMap::new(),
            timers: BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            pending: 0,
            counters: CmCounters::default(),
            parked: Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// The configuration, to change (the device sets its CA GUID and timer values).
    pub fn config_mut(&mut self) -> &mut CmConfig {
        &mut self.cfg
    }

    /// Changes the timer scale (tests; `softrdma daemon --cm-timer-scale`).
    pub fn set_timer_scale(&mut self, permille: u32) {
        self.cfg.timer_scale_permille = permille.max(1);
    }

    /// The counters.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// Every ID, ordered by handle.
    pub fn ids(&self) -> Vec<IdInfo> {
        let mut v: Vec<IdInfo> = self
            .ids
            .iter()
            .map(|(&h, i)| IdInfo {
                id: h,
                ps: i.ps,
                qp_type: i.qp_type,
                state: i.state,
                orphan: i.orphan,
                local: i.local,
                remote: i.remote,
                qpn: i.local_qpn,
                backlog: i.backlog,
                pending: i.pending,
            })
            .collect();
        v.sort_by_key(|i| i.id);
        v
    }

    /// Connection requests waiting in REQ_RCVD (not yet accepted or rejected).
    pub fn pending_count(&self) -> usize {
        self.pending
    }

    /// How many IDs exist (orphans finishing their protocol included).
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    /// A new ID in a port space for a QP type.
    pub fn create_id(&mut self, ps: u16, qp_type: QpType) -> IdHandle {
        let h = self.alloc_handle();
        let mut id = Id::new(ps, qp_type, self.cfg.mtu);
        // rdma_cm picks an ID's starting PSN when the ID is made (`__rdma_create_id`): the
        // passive QP reaches RTR with it (its receive PSN) before the REP that carries it leaves.
        id.local_psn = self.rng.next_u32() & 0xff_ffff;
        self.ids.insert(h, id);
        h
    }

    fn alloc_handle(&mut self) -> IdHandle {
        loop {
            let h = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.ids.contains_key(&h) {
                return h;
            }
        }
    }

    fn alloc_comm_id(&mut self) -> u32 {
        loop {
            let c = self.rng.next_u32();
            if c != 0 && !self.by_comm.contains_key(&c) {
                return c;
            }
        }
    }

    fn id(&mut self, h: IdHandle) -> Result<&mut Id, CmError> {
        match self.ids.get_mut(&h) {
            Some(id) if !id.orphan => Ok(id),
            _ => Err(CmError::NoEnt),
        }
    }

    /// The ID's state.
    pub fn state(&self, h: IdHandle) -> Option<IdState> {
        self.ids.get(&h).filter(|i| !i.orphan).map(|i| i.state)
    }

    /// The ID's addresses (local, remote) as the CM knows them.
    pub fn addrs(&self, h: IdHandle) -> Option<(Option<SocketAddr>, Option<SocketAddr>)> {
        self.ids.get(&h).filter(|i| !i.orphan).map(|i| (i.local, i.remote))
    }

    /// Sets the addresses a resolved (or bound) ID uses, and its type of service.
    pub fn set_addrs(
        &mut self,
        h: IdHandle,
        local: Option<SocketAddr>,
        remote: Option<SocketAddr>,
        tos: u8,
    ) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.state != IdState::Idle {
            return Err(CmError::Inval);
        }
        id.local = local;
        id.remote = remote;
        id.tos = tos;
        Ok(())
    }

    /// The path a passive ID took from its REQ, as `id->route.path_rec` shows it (the kernel's
    /// cma_ib_new_conn_id copies cm_format_paths_from_req's primary path): the GIDs seen from this
    /// end, the REQ's hop limit, traffic class, SL, flow label, rate and MTU, and the packet
    /// lifetime one below its local ACK timeout. None for an ID that did not come from a REQ.
    pub fn passive_route(&self, h: IdHandle) -> Option<Route> {
        let id = self.ids.get(&h).filter(|i| !i.orphan && i.passive)?;
        let p = &id.path;
        Some(Route {
            sgid: p.local_gid,
            dgid: p.remote_gid,
            hop_limit: p.hop_limit,
            traffic_class: p.traffic_class,
            sl: p.sl,
            flow_label: p.flow_label,
            mtu: id.path_mtu as u8,
            rate: p.packet_rate,
            packet_life_time: p.local_ack_timeout.saturating_sub(1),
        })
    }

    /// What a route lookup for the ID needs: its local and remote addresses and its ToS (the
    /// addresses resolved, not yet connecting).
    pub fn route_key(&self, h: IdHandle) -> Result<(SocketAddr, SocketAddr, u8), CmError> {
        let id = self.ids.get(&h).filter(|i| !i.orphan).ok_or(CmError::NoEnt)?;
        match (id.state, id.local, id.remote) {
            (IdState::Idle, Some(l), Some(r)) => Ok((l, r, id.tos)),
            _ => Err(CmError::Inval),
        }
    }

    /// Gives an ID whose addresses are resolved its route (rdma_resolve_route, or the path an
    /// application set with RDMA_OPTION_IB_PATH: rdma_set_ib_path requires ADDR_RESOLVED, else
    /// EINVAL). An MTU outside 256-4096 is EINVAL.
    pub fn set_route(&mut self, h: IdHandle, route: Route) -> Result<(), CmError> {
        if Mtu::from_ibv(u32::from(route.mtu)).is_none() {
            return Err(CmError::Inval);
        }
        let id = self.id(h)?;
        if id.state != IdState::Idle || id.remote.is_none() || id.local.is_none() {
            return Err(CmError::Inval);
        }
        id.route = Some(route);
        Ok(())
    }

    /// RDMA_OPTION_ID_ACK_TIMEOUT: the local ACK timeout the QP gets (and the REQ's path carries).
    pub fn set_ack_timeout(&mut self, h: IdHandle, timeout: u8) -> Result<(), CmError> {
        if timeout > 31 {
            return Err(CmError::Inval);
        }
        self.id(h)?.ack_timeout = Some(timeout);
        Ok(())
    }

    /// Starts listening on the bound address (`None`: every address of the device) and port.
    /// A second listener on the same service ID and an overlapping address is EADDRINUSE.
    pub fn listen(&mut self, h: IdHandle, backlog: u32) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.state == IdState::Listen {
            // rdma_listen again changes the backlog (kernel cma: "already listening").
            id.backlog = backlog_of(backlog);
            return Ok(());
        }
        if id.state != IdState::Idle {
            return Err(CmError::Inval);
        }
        let Some(local) = id.local else { return Err(CmError::Inval) };
        let sid = service_id(id.ps, local.port());
        let addr = (!local.ip().is_unspecified()).then_some(local.ip());
        let list = self.listeners.entry(sid).or_default();
        if list.iter().any(|(a, _)| a.is_none() || addr.is_none() || *a == addr) {
            return Err(CmError::AddrInUse);
        }
        list.push((addr, h));
        let id = self.ids.get_mut(&h).expect("checked");
        id.state = IdState::Listen;
        id.backlog = backlog_of(backlog);
        // REQs that came for this service ID before the listen are taken now (at the next
        // timer run: `poll_timeout` says it is due).
        for p in self.parked.iter_mut().filter(|p| p.req.service_id == sid) {
            p.until = Instant(0);
        }
        Ok(())
    }

    /// The QP attributes for moving the ID's QP to `state` (`rdma_init_qp_attr`).
    pub fn init_qp_attr(&self, h: IdHandle, state: QpState) -> Result<InitQpAttr, CmError> {
        let id = self.ids.get(&h).filter(|i| !i.orphan).ok_or(CmError::NoEnt)?;
        if id.ps == PS_IPOIB {
            // cma_set_qkey: an RDMA_PS_IPOIB ID's Q_Key is the IPoIB broadcast group's, which
            // only the IB SA knows (ib_sa_get_mcmember_rec); a RoCE port has no SA client, so
            // the kernel fails with -ENODEV, and with it rdma_create_qp (cma.c:1233-1237).
            return Err(CmError::NoDev);
        }
        let mut a = QpAttr { qp_state: state, ..QpAttr::default() };
        let mut mask = AttrMask::STATE;
        let connected = id.local_comm_id != 0;
        let mut r = InitQpAttr { attr: QpAttr::default(), mask, hop_limit: 0, traffic_class: 0, flow_label: 0, sl: 0 };
        match state {
            QpState::Init => {
                a.pkey_index = 0;
                a.port_num = 1;
                mask = mask | AttrMask::PKEY_INDEX | AttrMask::PORT;
                if id.qp_type == QpType::Ud {
                    // cma_ib_init_qp_attr: UD QPs get the port space's Q_Key.
                    a.qkey = RDMA_UDP_QKEY;
                    mask = mask | AttrMask::QKEY;
                } else {
                    // Before a connection exists the kernel grants nothing; once the CM has one,
                    // cm_init_qp_init_attr: REMOTE_WRITE, plus READ and ATOMIC when this side
                    // offers responder resources.
                    a.qp_access_flags = if !connected {
                        Access::EMPTY
                    } else if id.mine.responder_resources > 0 {
                        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
                    } else {
                        Access::REMOTE_WRITE
                    };
                    mask = mask | AttrMask::ACCESS_FLAGS;
                }
            }
            QpState::Rtr => {
                if !connected
                    || !matches!(
                        id.state,
                        IdState::RepSent | IdState::RepRcvd | IdState::Established | IdState::ReqRcvd
                    )
                {
                    return Err(CmError::Inval);
                }
                // cm_init_qp_rtr_attr. The receive PSN is the Starting PSN this side announced
                // (its REQ or REP), not the peer's: a CM message's Starting PSN is where its
                // sender's receive queue begins, and the peer's send queue starts there
                // (rdma_init_qp_attr sets rq_psn = seq_num, cma.c:1261-1262; cm_send_req and
                // ib_send_cm_rep keep their own PSN as rq_psn, cm.c:1574, :2319). The ConnectX
                // capture write.pcap shows it: the passive QP's first packet carries the REQ's PSN.
                a.path_mtu = id.path_mtu;
                a.dest_qp_num = id.peer.qpn;
                a.rq_psn = id.local_psn;
                a.dest = gid_to_ip(&id.path.remote_gid);
                mask = mask | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
                if matches!(id.qp_type, QpType::Rc | QpType::XrcTgt) {
                    a.max_dest_rd_atomic = id.mine.responder_resources;
                    a.min_rnr_timer = 0;
                    mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
                }
                r.hop_limit = id.path.hop_limit;
                r.traffic_class = id.path.traffic_class;
                r.flow_label = id.path.flow_label;
                r.sl = id.path.sl;
            }
            QpState::Rts => {
                if !connected
                    || !matches!(
                        id.state,
                        IdState::RepSent | IdState::RepRcvd | IdState::Established | IdState::ReqRcvd
                    )
                {
                    return Err(CmError::Inval);
                }
                // cm_init_qp_rts_attr: the send PSN is the peer's Starting PSN (the passive side
                // takes the REQ's, cm_req_handler, cm.c:2111; the active side the REP's,
                // cm_rep_handler, cm.c:2564).
                a.sq_psn = id.peer.psn;
                mask = mask | AttrMask::SQ_PSN;
                if matches!(id.qp_type, QpType::Rc | QpType::XrcIni) {
                    a.timeout = id.path.local_ack_timeout;
                    a.retry_cnt = id.mine.retry_count.min(7);
                    a.rnr_retry = id.peer.rnr_retry_count.min(7);
                    a.max_rd_atomic = id.mine.initiator_depth;
                    mask = mask
                        | AttrMask::TIMEOUT
                        | AttrMask::RETRY_CNT
                        | AttrMask::RNR_RETRY
                        | AttrMask::MAX_QP_RD_ATOMIC;
                }
                if id.qp_type == QpType::XrcTgt {
                    // cm_init_qp_rts_attr: a target QP sends no requests, but the transition
                    // still takes the ACK timeout with the PSN (qp_state_table[RTR][RTS]).
                    a.timeout = id.path.local_ack_timeout;
                    mask = mask | AttrMask::TIMEOUT;
                }
            }
            _ => return Err(CmError::Inval),
        }
        r.attr = a;
        r.mask = mask;
        Ok(r)
    }

    /// The earliest CM timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let parked = self.parked.iter().map(|p| p.until).min();
        [self.timers.first().map(|(t, _)| *t), parked].into_iter().flatten().min()
    }

    /// The next MAD to send.
    pub fn poll_mad(&mut self) -> Option<OutMad> {
        self.out.pop_front()
    }

    /// The next event for a consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    fn event(&mut self, h: IdHandle, kind: CmEventKind, status: i32, listen_id: Option<IdHandle>, param: ConnParam) {
        if self.ids.get(&h).is_some_and(|i| i.orphan) {
            return;
        }
        self.events.push_back(CmEvent { id: h, kind, status, listen_id, param });
    }

    fn set_timer(&mut self, h: IdHandle, at: Option<Instant>) {
        let Some(id) = self.ids.get_mut(&h) else { return };
        if let Some(old) = id.deadline.take() {
            self.timers.remove(&(old, h));
        }
        id.deadline = at;
        if let Some(t) = at {
            self.timers.insert((t, h));
        }
    }

    /// Forgets an ID entirely (its lookups and timer).
    fn remove(&mut self, h: IdHandle) {
        self.set_timer(h, None);
        if self.ids.get(&h).is_some_and(|i| i.state == IdState::ReqRcvd) {
            self.leave_pending(h);
        }
        let Some(id) = self.ids.remove(&h) else { return };
        if id.local_comm_id != 0 && self.by_comm.get(&id.local_comm_id) == Some(&h) {
            self.by_comm.remove(&id.local_comm_id);
        }
        if let Some(r) = id.remote {
            if self.by_remote.get(&(r.ip(), id.remote_comm_id)) == Some(&h) {
                self.by_remote.remove(&(r.ip(), id.remote_comm_id));
            }
        }
        if self.by_peer_qp.get(&(id.peer.ca_guid, id.peer.qpn)) == Some(&h) {
            self.by_peer_qp.remove(&(id.peer.ca_guid, id.peer.qpn));
        }
        if id.state == IdState::Listen {
            if let Some(local) = id.local {
                let sid = service_id(id.ps, local.port());
                if let Some(l) = self.listeners.get_mut(&sid) {
                    l.retain(|(_, x)| *x != h);
                    if l.is_empty() {
                        self.listeners.remove(&sid);
                    }
                }
            }
        }
    }

    /// A connection leaves REQ_RCVD: its listener's backlog and the device's pending count drop
    /// (once: the connection forgets its listener).
    fn leave_pending(&mut self, h: IdHandle) {
        let parent = self.ids.get_mut(&h).and_then(|i| i.parent.take());
        self.pending = self.pending.saturating_sub(1);
        if let Some(p) = parent.and_then(|p| self.ids.get_mut(&p)) {
            p.pending = p.pending.saturating_sub(1);
        }
    }
}

/// The kernel's backlog: a non-positive value means the default (`cma_listen`: 1024 when 0).
fn backlog_of(b: u32) -> u32 {
    if b == 0 || b > 1 << 20 {
        1024
    } else {
        b
    }
}

/// The GID of an address: IPv4 as `::ffff:a.b.c.d` (RoCEv2).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address of a GID (`::ffff:a.b.c.d` is IPv4).
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The flow label the kernel hashes from the rdma_cm ports (`rdma_calc_flow_label` use in
/// `cma_resolve_iboe_route`): (src port x 31 + dst port) & 0xFFFFF.
pub fn flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port).wrapping_mul(31).wrapping_add(u32::from(dst_port))) & 0xF_FFFF
}

/// The path a RoCE route has (`cma_resolve_iboe_route`): GIDs from the IPs, P_Key 0xFFFF, hop
/// limit 64, traffic class = ToS, SL 0 (no VLAN priority map), the flow-label hash, rate 0,
/// permissive LIDs (`cm_format_req` with hop limit > 1), local ACK timeout = packet lifetime + 1
/// (or the ID's ACK timeout option).
pub fn roce_path(local: SocketAddr, remote: SocketAddr, tos: u8, ack_timeout: u8) -> CmPath {
    CmPath {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: ip_to_gid(local.ip()),
        remote_gid: ip_to_gid(remote.ip()),
        flow_label: flow_label(local.port(), remote.port()),
        packet_rate: 0,
        traffic_class: tos,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: ack_timeout,
    }
}

/// The unspecified address of the family of `ip`.
pub fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// A MAD buffer.
fn mad_buf() -> Vec<u8> {
    vec![0u8; MAD_LEN]
}
