//! The connection manager's values: port spaces and service IDs, REJ reasons, the configuration,
//! errors, events and their kinds, connection parameters, an ID's state and the routes it is
//! given, the QP attributes it hands out; and the address helpers (GIDs, flow labels, RoCE paths).

use super::*;

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
    pub(super) fn timer(&self, t: u8) -> Duration {
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
    pub(super) fn path(&self, local_ack_timeout: u8) -> CmPathRepr {
        CmPathRepr {
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
pub fn roce_path(local: SocketAddr, remote: SocketAddr, tos: u8, ack_timeout: u8) -> CmPathRepr {
    CmPathRepr {
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
