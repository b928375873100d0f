//! The client protocol on a device's unix socket: versioned, request/response, postcard-encoded,
//! one frame per message (a 4-byte little-endian length, then the body), file descriptors passed
//! with SCM_RIGHTS on the frame's first byte.
//!
//! A frame larger than [`MAX_FRAME`], a body that does not decode, or a request before `Hello`
//! ends that client's connection only.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use softrdma_engine::cm::{CmCounters, ConnParam, IdInfo, InitQpAttr};
use softrdma_engine::device::{
    AsyncEvent, Counters, CqId, IcrcPolicy, Limits, MrKeys, PdId, QpAttr, QpInit, SrqAttr, WireProfile, XrcPolicy,
    XrcdId,
};
use softrdma_engine::verbs::{Access, AttrMask, Mtu, QpState, QpType, VerbsError};
use softrdma_engine::wire::Qpn;
use softrdma_engine::wr::{RecvWr, SendWr, WorkCompletion};

pub use crate::arena::RingDesc;

/// One group as `softrdma stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The group.
    pub group: std::net::Ipv4Addr,
    /// Full members (joins that receive).
    pub full: u32,
    /// Send-only full members.
    pub send_only: u32,
    /// Whether the device is a member of the IP group.
    pub ip_member: bool,
    /// Provider processes with QPs attached to the group, to which the daemon passes its
    /// datagrams.
    pub providers: u32,
}

/// One `softrdma stat` row per counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStats {
    /// Entries held now.
    pub entries: u64,
    /// Route steps answered from the cache.
    pub hits: u64,
    /// Route steps that looked the path up (no entry, or an expired one).
    pub misses: u64,
    /// Entries found expired.
    pub expired: u64,
    /// Entries dropped because a route, address, link or neighbour changed.
    pub invalidated: u64,
    /// Lookups whose next hop had no neighbour answer yet (not cached).
    pub unresolved: u64,
    /// Lookups that failed (no route: the route step's error).
    pub failed: u64,
    /// Paths applications set themselves (RDMA_OPTION_IB_PATH).
    pub explicit: u64,
}

/// The protocol version; `Hello` with another one is refused.
pub const VERSION: u32 = 12;

/// A request of the device to a client's memory helper (the fallback of docs/architecture.md D3
/// where the kernel refuses cross-process access: the client serves its own memory on a socket
/// pair).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MemOp {
    /// Read `len` bytes at `addr`.
    Read {
        /// Address.
        addr: u64,
        /// Bytes.
        len: u32,
    },
    /// Write bytes at `addr`.
    Write {
        /// Address.
        addr: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// An 8-byte atomic at `addr`: CmpSwap (store `value` if the word equals `compare`) or,
    /// without `compare`, FetchAdd of `value`. The answer is the original word.
    Atomic {
        /// Address (8-byte aligned).
        addr: u64,
        /// CmpSwap's compare value.
        compare: Option<u64>,
        /// CmpSwap's swap value, or FetchAdd's addend.
        value: u64,
    },
}

/// The helper's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MemReply {
    /// Done (the bytes read, or nothing for a write).
    Ok(Vec<u8>),
    /// The address is not this process's.
    Fault,
}

/// What a client's probe word holds.
pub const PROBE: u64 = 0x7072_6f62_6553_5244;

/// The largest frame either side accepts (a post of many WRs stays far below).
pub const MAX_FRAME: usize = 16 << 20;

/// Most file descriptors in one frame.
pub const MAX_FDS: usize = 4;

/// What a client asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// First message: the protocol version and the client's pid (checked against SO_PEERCRED).
    Hello {
        /// [`VERSION`].
        version: u32,
        /// The client's pid.
        pid: i32,
        /// The address of [`PROBE`] in the client: the device reads it to check that it can
        /// reach the client's memory (process_vm_readv) before it accepts the client.
        probe: u64,
    },
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_dealloc_pd`.
    DeallocPd(PdId),
    /// `ibv_reg_mr` of the client's own memory.
    RegMr {
        /// Protection domain.
        pd: PdId,
        /// Start address in the client.
        addr: u64,
        /// Length.
        len: u64,
        /// Access flags.
        access: Access,
    },
    /// `ibv_dereg_mr`.
    DeregMr(u32),
    /// `ibv_rereg_mr`: a new PD, range or access for a region, keeping its keys.
    ReregMr {
        /// The region's L_Key.
        lkey: u32,
        /// New protection domain.
        pd: Option<PdId>,
        /// New start address and length.
        range: Option<(u64, u64)>,
        /// New access flags.
        access: Option<Access>,
    },
    /// `ibv_alloc_mw` (type 1 or 2); bound with a BIND_MW work request.
    AllocMw {
        /// Protection domain.
        pd: PdId,
        /// IBV_MW_TYPE_1 or IBV_MW_TYPE_2.
        mw_type: u8,
    },
    /// `ibv_dealloc_mw` by its current R_Key.
    DeallocMw(u32),
    /// `ibv_create_comp_channel`: answered with an fd that is readable while events wait.
    CreateCompChannel,
    /// `ibv_destroy_comp_channel`.
    DestroyCompChannel(u32),
    /// `ibv_create_cq`, optionally bound to a completion channel.
    CreateCq {
        /// Entries.
        cqe: u32,
        /// Completion channel id.
        channel: Option<u32>,
    },
    /// `ibv_destroy_cq`.
    DestroyCq(CqId),
    /// `ibv_resize_cq`: the CQ gets a new ring of `cqe` entries (answered with `Response::Cq`);
    /// the client has taken `unpolled` completions off the old one that it has not handed out.
    ResizeCq {
        /// The CQ.
        cq: CqId,
        /// New size.
        cqe: u32,
        /// Completions the client holds, taken off the ring but not yet polled.
        unpolled: u32,
    },
    /// `ibv_req_notify_cq`.
    ReqNotifyCq {
        /// The CQ.
        cq: CqId,
        /// Only solicited (and error) completions.
        solicited_only: bool,
    },
    /// `ibv_get_cq_event` without blocking: the next CQ event of the channel, if any.
    GetCqEvent(u32),
    /// `ibv_create_qp`.
    CreateQp(QpInit),
    /// `ibv_destroy_qp`.
    DestroyQp(Qpn),
    /// `ibv_modify_qp`.
    ModifyQp {
        /// The QP.
        qpn: Qpn,
        /// Attributes.
        attr: QpAttr,
        /// Which ones.
        mask: AttrMask,
    },
    /// `ibv_query_qp`.
    QueryQp(Qpn),
    /// `ibv_create_srq`.
    CreateSrq {
        /// Protection domain.
        pd: PdId,
        /// Attributes.
        attr: SrqAttr,
    },
    /// `ibv_create_srq_ex` of type XRC.
    CreateXrcSrq {
        /// Domain.
        xrcd: XrcdId,
        /// Protection domain.
        pd: PdId,
        /// CQ.
        cq: CqId,
        /// Attributes.
        attr: SrqAttr,
    },
    /// `ibv_modify_srq` (limit only).
    ModifySrq {
        /// SRQ number.
        srqn: u32,
        /// New limit.
        limit: u32,
    },
    /// `ibv_query_srq`.
    QuerySrq(u32),
    /// `ibv_destroy_srq`.
    DestroySrq(u32),
    /// `ibv_open_xrcd`; the domain file's fd travels with the frame (none: a private domain).
    OpenXrcd {
        /// O_CREAT.
        create: bool,
        /// O_EXCL.
        exclusive: bool,
    },
    /// `ibv_close_xrcd`.
    CloseXrcd(XrcdId),
    /// `ibv_create_qp_ex` of type XRC_RECV.
    CreateXrcTgtQp(XrcdId),
    /// `ibv_open_qp`.
    OpenQp {
        /// Domain.
        xrcd: XrcdId,
        /// The target QP.
        qpn: Qpn,
    },
    /// `ibv_destroy_qp` on a target QP handle.
    DestroyQpHandle {
        /// The QP.
        qpn: Qpn,
        /// The handle.
        handle: u32,
    },
    /// `ibv_attach_mcast`.
    AttachMcast {
        /// UD QP.
        qpn: Qpn,
        /// Group address.
        group: IpAddr,
    },
    /// `ibv_detach_mcast`.
    DetachMcast {
        /// UD QP.
        qpn: Qpn,
        /// Group address.
        group: IpAddr,
    },
    /// `rdma_create_event_channel`: the first fd is the write end of the channel's pipe, where
    /// the device writes one [`CmRecord`] frame per event.
    CmCreateChannel,
    /// `rdma_destroy_event_channel`.
    CmDestroyChannel(u32),
    /// `rdma_create_id` once the ID has a device (bind or resolve): a communication ID in a port
    /// space, reporting to a channel, tagged with the client's handle for it.
    CmCreateId {
        /// Channel.
        channel: u32,
        /// Port space (RDMA_PS_*).
        ps: u16,
        /// QP type.
        qp_type: QpType,
        /// The client's handle, echoed in every record.
        user: u64,
    },
    /// `rdma_destroy_id`.
    CmDestroyId(u32),
    /// `rdma_migrate_id`, and naming a connection ID the client learnt of in a CONNECT_REQUEST.
    CmMigrate {
        /// ID.
        id: u32,
        /// The new channel.
        channel: u32,
        /// The client's handle.
        user: u64,
    },
    /// The addresses a bound or resolved ID uses (the client resolved them), and its ToS.
    CmSetAddrs {
        /// ID.
        id: u32,
        /// Local address and port.
        local: Option<SocketAddr>,
        /// Remote address and port.
        remote: Option<SocketAddr>,
        /// Type of service.
        tos: u8,
    },
    /// `rdma_listen` on the bound address.
    CmListen {
        /// ID.
        id: u32,
        /// Backlog.
        backlog: u32,
    },
    /// `rdma_connect`.
    CmConnect {
        /// ID.
        id: u32,
        /// Parameters (qp_num: the local QP).
        param: ConnParam,
    },
    /// `rdma_accept` on the passive side.
    CmAccept {
        /// ID.
        id: u32,
        /// Parameters.
        param: ConnParam,
    },
    /// `rdma_reject`.
    CmReject {
        /// ID.
        id: u32,
        /// Private data.
        private_data: Vec<u8>,
        /// REJ reason (28; 35 for ECE).
        reason: u16,
    },
    /// RTU on the active side (after its QP reached RTS, or `rdma_establish`).
    CmEstablish(u32),
    /// `rdma_disconnect`.
    CmDisconnect(u32),
    /// `rdma_notify` (COMM_EST).
    CmNotify(u32),
    /// RDMA_OPTION_ID_ACK_TIMEOUT.
    CmSetAckTimeout {
        /// ID.
        id: u32,
        /// Timeout code.
        timeout: u8,
    },
    /// `rdma_init_qp_attr`.
    CmInitQpAttr {
        /// ID.
        id: u32,
        /// The state to move to.
        state: QpState,
    },
    /// `rdma_resolve_route`: the device looks the ID's path up (or finds it in its path
    /// cache) and gives the ID that route; answered with `Response::CmRoute`.
    CmResolveRoute(u32),
    /// `RDMA_OPTION_IB_PATH`: the application's own path record becomes the ID's route.
    CmSetRoute {
        /// ID.
        id: u32,
        /// The route.
        route: softrdma_engine::cm::Route,
    },
    /// The CM's counters.
    CmStats,
    /// Every rdma_cm ID of the device (`softrdma cm-ids`).
    CmList,
    /// `ibv_get_async_event` without blocking.
    GetAsyncEvent,
    /// Counters (`softrdma stat`).
    Stats,
    /// OFED's XRC receive QPs: a target QP with its own lifetime rule (`ibv_create_xrc_rcv_qp`:
    /// the registrations'; `ibv_alloc_xrc_rcv_qp`: the domain's).
    CreateXrcRcvQp {
        /// Domain.
        xrcd: XrcdId,
        /// The lifetime rule.
        lifetime: XrcPolicy,
    },
    /// Lets go of a target QP handle as an exiting process does (`ibv_unreg_xrc_rcv_qp`; the
    /// creating handle of `ibv_alloc_xrc_rcv_qp`), so the QP's lifetime rule decides.
    ReleaseQpHandle {
        /// The QP.
        qpn: Qpn,
        /// The handle.
        handle: u32,
    },
    /// `rdma_join_multicast_ex`: the ID joins an IPv4 group; the device joins the IP group for
    /// the first full member and answers with RDMA_CM_EVENT_MULTICAST_JOIN on the ID's channel.
    CmJoin {
        /// ID.
        id: u32,
        /// The group.
        group: IpAddr,
        /// A send-only full member (no IP membership, no attach).
        send_only: bool,
        /// The client's handle of the join (it comes back in the event's `listen_user`).
        user: u64,
    },
    /// The multicast groups (`softrdma stat`).
    McastGroups,
    /// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB on a UD QP just created.
    BlockSelfMcastLb(Qpn),
    /// `rdma_leave_multicast`.
    CmLeave {
        /// ID.
        id: u32,
        /// The group.
        group: IpAddr,
    },
    /// The client runs its own QPs (`SOFTRDMA_DATAPATH=provider`): it asks for a socket of the
    /// device's steered port and a block of QPNs whose datagrams the port steers to that socket.
    JoinSteering,
    /// A provider whose key blocks are full (its engine answered a registration with ENOMEM)
    /// asks for one more (`Response::KeyBlock`).
    KeyBlock,
    /// A provider (a client that joined the steered port) reports what its own QPs did, so that
    /// the device's counters (`softrdma stat`) cover them as a NIC's cover every QP (the
    /// data-path issue's item 5): its totals so far.
    Publish(Box<Published>),
    /// A provider of a device that captures hands the daemon its capture ring (a memfd, the
    /// message's descriptor): the daemon drains it into the device's file for as long as the
    /// provider stays attached (device/src/capture).
    CaptureRing,
    /// A provider's CQ has a second half on the device's own data path, where the completions of
    /// the XRC SRQs it serves land (XRC domains, their SRQs and target QPs are the daemon's):
    /// that half's channel fired, so the CQ's channel fires if the CQ is armed (as for one of
    /// its own completions).
    RaiseCqEvent(CqId),
    /// A provider's async event that came from its objects on the device's own data path (an
    /// XRC target QP handle, an XRC SRQ): queued for the client as the device's own.
    QueueEvent(ClientEvent),
    /// A provider's region has a twin here (registered by the provider's XRC side): the twin
    /// also answers to the provider's own rkey for it, so RDMA through an XRC target QP finds it.
    AliasRkey {
        /// The twin's local key.
        lkey: u32,
        /// The key the provider gave out.
        rkey: u32,
    },
    /// A provider's QP attached to (`on`) or detached from a multicast group: the daemon, which
    /// receives the device's group datagrams, passes each on to the providers with QPs attached
    /// (multicast fan-out is the daemon's: the data-path issue's item 5).
    McastRelay {
        /// The group.
        group: IpAddr,
        /// Attached (true) or detached.
        on: bool,
    },
}

/// What a provider reports ([`Request::Publish`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Published {
    /// Its engine's counters since it joined (totals: each report replaces the last).
    pub counters: Counters,
    /// Its device layer's counters since it joined (totals; `clients` and `providers` unused).
    pub io: IoStats,
    /// The QPN its allocator looks at next (the block's next holder starts after it).
    pub next_qpn: u32,
}

/// The device's settings a provider applies to its own QPs, as the daemon applies them to its
/// own (`Response::Steering`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProviderSettings {
    /// Fault injection on transmit (`--faults` syntax; `none`), applied by whoever sends.
    pub faults: String,
    /// The behaviour profile (the engine's wire choices).
    pub behaviour: WireProfile,
    /// The ICRC check of IPv4 senders.
    pub icrc: IcrcPolicy,
    /// `max_cqe`.
    pub max_cqe: u32,
    /// The device captures: the provider reports every packet it sends and receives.
    pub capture: bool,
}

/// A send queue ring entry: the work request and, for IBV_SEND_INLINE, its data, copied by the
/// client at post time (the application may reuse the buffer as soon as the post returns).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendEntry {
    /// The work request.
    pub wr: SendWr,
    /// The inline data.
    pub data: Option<Vec<u8>>,
}

/// A receive queue ring entry: the work request and whether the client asks the device to
/// stage the received data (docs/architecture.md D3: the device puts it in the arena's staging area
/// and the client scatters it into the posted buffers when it polls the completion). The client
/// asks only when every SGE lies in one of its registered regions; `wr_id` is then the client's
/// token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecvEntry {
    /// The work request.
    pub wr: RecvWr,
    /// Stage the data.
    pub stage: bool,
}

/// A completion ring entry: the completion and, for a staged receive, where its data is in the
/// staging area (offset in the arena, bytes reserved), for the client to scatter and release.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CqEntry {
    /// The completion.
    pub wc: WorkCompletion,
    /// Staged data.
    pub stage: Option<(u64, u32)>,
    /// For a client with a memory helper: the writes the helper must have made before this
    /// completion is seen (the device sends them without waiting; 0 otherwise).
    pub helper_writes: u64,
}

/// What the device describes about itself at `Hello`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (srdma0).
    pub name: String,
    /// The address (GID index 0 is its RoCEv2 GID).
    pub addr: IpAddr,
    /// The port's active MTU.
    pub active_mtu: Mtu,
    /// The interface's MTU the active MTU derives from.
    pub iface_mtu: u32,
    /// Limits.
    pub limits: Limits,
    /// Node GUID (derived from the address, as an EUI-64 from a made-up MAC).
    pub node_guid: u64,
    /// IEEE OUI of the vendor (a locally administered one: not Mellanox's 0x02c9).
    pub vendor_id: u32,
    /// The device's pid.
    pub pid: i32,
    /// GID index 0: the RoCEv2 GID of the address (IPv4-mapped, ::ffff:a.b.c.d, for IPv4).
    /// The port's link layer is Ethernet and its state ACTIVE while the device runs.
    pub gid: [u8; 16],
}

/// The RoCEv2 GID of an address: IPv4 addresses map into IPv6 (::ffff:a.b.c.d).
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    softrdma_engine::cm::ip_to_gid(addr)
}

/// An async event addressed to a client.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClientEvent {
    /// The event.
    pub event: AsyncEvent,
    /// For an XRC target QP event: the client's handle on the QP.
    pub handle: Option<u32>,
}

/// What the device answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// Success with nothing to return.
    Ok,
    /// The verbs error (errno).
    Err(VerbsError),
    /// Hello accepted: the client's owner id, the device. Three fds travel with it: the async
    /// event fd, the client's ring arena (a sealed memfd) and the doorbell (an eventfd).
    Hello {
        /// The client's owner id on the device.
        owner: u32,
        /// The device.
        info: DeviceInfo,
        /// The ring on which the client gives staging space back (entries `(offset, bytes)`).
        release: RingDesc,
        /// The device cannot reach this client's memory (the kernel refused process_vm_readv):
        /// a fourth fd travels with the answer, a socket on which the client must serve
        /// [`MemOp`]s from a thread of its own.
        memory_helper: bool,
    },
    /// A PD.
    Pd(PdId),
    /// An MR's keys.
    Mr(MrKeys),
    /// A memory window's R_Key.
    Mw(u32),
    /// A completion channel's id (its fd travels with the frame).
    Channel(u32),
    /// A CQ and its completion ring.
    Cq {
        /// The CQ.
        cq: CqId,
        /// Its ring in the arena (the device produces, the client consumes).
        ring: RingDesc,
    },
    /// A CQ event, if one was waiting.
    CqEvent(Option<CqId>),
    /// A QP and its work queue rings (none for a queue it does not have).
    Qp {
        /// QP number.
        qpn: Qpn,
        /// Send queue ring.
        sq: Option<RingDesc>,
        /// Receive queue ring (none with an SRQ).
        rq: Option<RingDesc>,
    },
    /// A QP's state and attributes.
    QpAttr(QpState, QpAttr),
    /// An SRQ and its receive ring.
    Srq {
        /// SRQ number.
        srqn: u32,
        /// Its ring.
        ring: RingDesc,
    },
    /// SRQ attributes and outstanding WQEs.
    SrqAttr(SrqAttr, u32),
    /// An XRC domain.
    Xrcd(XrcdId),
    /// A target QP handle.
    QpHandle(Qpn, u32),
    /// An async event, if one was waiting.
    Event(Option<ClientEvent>),
    /// Counters: the engine's and the device layer's.
    Stats(Counters, IoStats),
    /// A CM call failed with this errno.
    CmErr(i32),
    /// A CM event channel.
    CmChannel(u32),
    /// A communication ID.
    CmId(u32),
    /// QP attributes from the CM.
    CmQpAttr(InitQpAttr),
    /// The CM's counters and the device's CM bookkeeping.
    CmStats(CmCounters, CmDeskStats),
    /// The route `CmResolveRoute` found: the path record, whether the path cache had it, and the
    /// neighbour's link-layer address.
    CmRoute {
        /// The route the ID got.
        route: softrdma_engine::cm::Route,
        /// From the cache (no lookup).
        cached: bool,
        /// The next hop's link-layer address (the path record's DMAC).
        lladdr: Vec<u8>,
    },
    /// The device's rdma_cm IDs, each with its owner's process ID (-1: none, or gone).
    CmIds(Vec<(IdInfo, i32)>),
    /// The device's multicast groups and their members (`softrdma stat`).
    McastGroups(Vec<GroupInfo>),
    /// `KeyBlock` granted: one more key block.
    KeyBlock(u32),
    /// `JoinSteering` granted: the client's member of the steered port (its socket travels with
    /// the answer, then its end of the relay link to the daemon) and the QPN blocks it allocates
    /// from.
    Steering {
        /// The member index.
        index: u32,
        /// QPN blocks (`softrdma_engine::device::QPN_BLOCK_SHIFT`).
        blocks: Vec<u32>,
        /// Key blocks (`softrdma_engine::device::KEY_BLOCK_SHIFT`): the provider's memory keys
        /// come from these, which the device's own never do, so the device can serve RDMA
        /// through XRC target QPs under a provider's key.
        key_blocks: Vec<u32>,
        /// The device's settings for the provider's QPs.
        settings: Box<ProviderSettings>,
        /// The QPN to allocate first (cyclically through the blocks): where the block's last
        /// holder stopped, so that its QPNs are not reused at once.
        first_qpn: u32,
    },
}

/// The device's side of the CM, for `softrdma stat`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CmDeskStats {
    /// rdma_cm IDs the device holds (listeners, connections, and destroyed ones finishing their
    /// protocol: a DREQ waiting for its DREP, timewait).
    pub ids: u64,
    /// Connection requests waiting for their accept or reject (bounded: a REQ flood is dropped
    /// beyond the listeners' backlogs and the device's limit).
    pub pending: u64,
    /// Event channels.
    pub channels: u64,
    /// Events lost because a channel's client did not read them (its pipe and backlog full).
    pub events_dropped: u64,
    /// CM calls refused: an ID that does not exist or belongs to another client, or a call the
    /// ID's state does not allow.
    pub calls_refused: u64,
    /// The path record cache (rdma_resolve_route).
    pub paths: PathStats,
}

/// The device layer's counters (`softrdma stat`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct IoStats {
    /// Datagrams sent on the UDP socket.
    pub udp_sent: u64,
    /// Datagrams received from the UDP socket.
    pub udp_rcvd: u64,
    /// Packets moved through internal loopback.
    pub loopback: u64,
    /// UDP send errors (the packet is lost; the transport retransmits).
    pub send_errors: u64,
    /// Packets the fault injector dropped.
    pub dropped_by_fault: u64,
    /// Packets it duplicated.
    pub duplicated_by_fault: u64,
    /// Packets it held back (reordered).
    pub reordered_by_fault: u64,
    /// Packets it corrupted.
    pub corrupted_by_fault: u64,
    /// Failed cross-process memory accesses.
    pub memory_faults: u64,
    /// Reads of client memory across processes (process_vm_readv).
    pub memory_reads: u64,
    /// Writes of client memory across processes (process_vm_writev).
    pub memory_writes: u64,
    /// Of those reads and writes, the ones a client's memory helper served.
    pub memory_helper_ops: u64,
    /// Attached clients (other than the one asking).
    pub clients: u64,
    /// Of those, the providers (clients running their own QPs on the steered port). The other
    /// counters include what the providers reported (the live ones' last reports, at most
    /// [`PUBLISH_INTERVAL_MS`] old, and the departed ones' last).
    pub providers: u64,
    /// Datagrams the daemon's own socket of the port received (`udp_rcvd` less the providers'):
    /// with steering, none of the providers' packets.
    pub daemon_udp_rcvd: u64,
    /// Datagrams a member's socket received for another member's QP (a GRO run the kernel gave
    /// to the owner of its first segment), passed on to their owner through the relay.
    pub relayed: u64,
    /// Datagrams for another member that could not be passed on (a full relay link, no owner).
    pub relay_lost: u64,
    /// Frames written to the device's capture file (the daemon's alone: it writes the file).
    pub capture_frames: u64,
    /// Frames the capture lost: its rings were full (the writer fell behind) or the file could
    /// not be written. They are lost from the file only, never from the wire (libpcap's
    /// `ps_drop`).
    pub capture_dropped: u64,
}

/// Sums of several device layers (the daemon's and its providers'); `clients`, `providers`,
/// `daemon_udp_rcvd` and the capture's counts are the daemon's alone and stay as they are.
impl std::ops::AddAssign for IoStats {
    fn add_assign(&mut self, o: IoStats) {
        let IoStats {
            udp_sent,
            udp_rcvd,
            loopback,
            send_errors,
            dropped_by_fault,
            duplicated_by_fault,
            reordered_by_fault,
            corrupted_by_fault,
            memory_faults,
            memory_reads,
            memory_writes,
            memory_helper_ops,
            clients: _,
            providers: _,
            daemon_udp_rcvd: _,
            relayed,
            relay_lost,
            capture_frames: _,
            capture_dropped: _,
        } = o;
        self.udp_sent += udp_sent;
        self.udp_rcvd += udp_rcvd;
        self.loopback += loopback;
        self.send_errors += send_errors;
        self.dropped_by_fault += dropped_by_fault;
        self.duplicated_by_fault += duplicated_by_fault;
        self.reordered_by_fault += reordered_by_fault;
        self.corrupted_by_fault += corrupted_by_fault;
        self.memory_faults += memory_faults;
        self.memory_reads += memory_reads;
        self.memory_writes += memory_writes;
        self.memory_helper_ops += memory_helper_ops;
        self.relayed += relayed;
        self.relay_lost += relay_lost;
    }
}

/// How often at most a provider reports its counters while they change.
pub const PUBLISH_INTERVAL_MS: u64 = 50;

/// One rdma_cm event as it travels through a channel's pipe: a frame of [`CM_RECORD_LEN`] bytes,
/// a 2-byte little-endian length, then the postcard body, zero-padded. Frames are smaller than
/// PIPE_BUF, so writes from the device and from the client's own library never interleave.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CmRecord {
    /// The device the ID lives on (empty: an event the client library made itself).
    pub device: String,
    /// The device's ID.
    pub id: u32,
    /// The client's handle for the ID (0: a new connection ID, see `listen_user`).
    pub user: u64,
    /// For CONNECT_REQUEST: the client's handle of the listener; for MULTICAST_JOIN: the
    /// client's handle of the join.
    pub listen_user: u64,
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// Status (0, a REJ reason, or a negative errno).
    pub status: i32,
    /// What the peer sent.
    pub param: ConnParam,
    /// For CONNECT_REQUEST: the new ID's addresses.
    pub local: Option<SocketAddr>,
    /// See `local`.
    pub remote: Option<SocketAddr>,
    /// For CONNECT_REQUEST: the path the REQ carried (the new ID's `route.path_rec`).
    pub route: Option<softrdma_engine::cm::Route>,
}

/// The size of a [`CmRecord`] frame in a channel's pipe.
pub const CM_RECORD_LEN: usize = 512;

impl CmRecord {
    /// The frame.
    pub fn to_frame(&self) -> Option<[u8; CM_RECORD_LEN]> {
        let mut f = [0u8; CM_RECORD_LEN];
        let n = postcard::to_slice(self, &mut f[2..]).ok()?.len();
        f[..2].copy_from_slice(&(n as u16).to_le_bytes());
        Some(f)
    }

    /// From a frame (untrusted: a bad one is an error).
    pub fn from_frame(f: &[u8]) -> Option<CmRecord> {
        let n = usize::from(u16::from_le_bytes([*f.first()?, *f.get(1)?]));
        postcard::from_bytes(f.get(2..2 + n)?).ok()
    }
}

/// A malformed or oversized frame, or an I/O error.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// I/O.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The frame is larger than [`MAX_FRAME`].
    #[error("frame of {0} bytes is larger than the limit")]
    TooLarge(usize),
    /// The body does not decode.
    #[error("malformed message: {0}")]
    Decode(#[from] postcard::Error),
    /// The peer closed the connection.
    #[error("connection closed")]
    Closed,
}

/// Sends one message with optional fds.
pub fn send<T: Serialize>(sock: &UnixStream, msg: &T, fds: &[RawFd]) -> Result<(), ProtoError> {
    let body = postcard::to_stdvec(msg)?;
    if body.len() > MAX_FRAME {
        return Err(ProtoError::TooLarge(body.len()));
    }
    let len = (body.len() as u32).to_le_bytes();
    let iov = [IoSlice::new(&len), IoSlice::new(&body)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    let total = len.len() + body.len();
    let n = loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r.map_err(io::Error::from)?,
        }
    };
    if n < total {
        // The rest without fds (a stream socket may take a large frame in parts).
        let mut rest = Vec::with_capacity(total - n);
        rest.extend_from_slice(&len);
        rest.extend_from_slice(&body);
        use std::io::Write;
        (&*sock).write_all(&rest[n..])?;
    }
    Ok(())
}

/// Receives one message and the fds that came with it.
pub fn recv<T: for<'de> Deserialize<'de>>(sock: &UnixStream) -> Result<(T, Vec<OwnedFd>), ProtoError> {
    let mut len = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut fds = Vec::new();
    let got = loop {
        let mut iov = [IoSliceMut::new(&mut len)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
            Ok(m) => {
                for c in m.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(r) = c {
                        // SAFETY: the kernel just installed these descriptors in this process for
                        // us; nothing else owns them.
                        fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                }
                break m.bytes;
            }
        }
    };
    if got == 0 {
        return Err(ProtoError::Closed);
    }
    if got < 4 {
        (&*sock).read_exact(&mut len[got..])?;
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(ProtoError::TooLarge(n));
    }
    let mut body = vec![0u8; n];
    (&*sock).read_exact(&mut body)?;
    Ok((postcard::from_bytes(&body)?, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn round_trip_with_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        send(&a, &Request::OpenXrcd { create: true, exclusive: false }, &[f.as_raw_fd()]).unwrap();
        send(&a, &Request::QueryQp(Qpn::new(3)), &[]).unwrap();
        let (m, fds): (Request, _) = recv(&b).unwrap();
        assert!(matches!(m, Request::OpenXrcd { create: true, exclusive: false }));
        assert_eq!(fds.len(), 1);
        let (m, fds): (Request, _) = recv(&b).unwrap();
        assert!(matches!(m, Request::QueryQp(q) if q == Qpn::new(3)));
        assert!(fds.is_empty());
    }

    #[test]
    fn malformed_and_oversized_frames_are_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&3u32.to_le_bytes()).unwrap();
        a.write_all(&[0xff, 0xff, 0xff]).unwrap();
        assert!(matches!(recv::<Request>(&b), Err(ProtoError::Decode(_))));
        a.write_all(&(MAX_FRAME as u32 + 1).to_le_bytes()).unwrap();
        assert!(matches!(recv::<Request>(&b), Err(ProtoError::TooLarge(_))));
        drop(a);
        assert!(matches!(recv::<Request>(&b), Err(ProtoError::Closed)));
    }
}
