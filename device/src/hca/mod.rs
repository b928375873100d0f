//! The emulated HCA as a running thing: one engine [`Device`] driven over the RoCEv2 UDP transport
//! by a device thread, with internal loopback, fault injection and the capture tap, and the
//! verbs calls of its clients (each an owner of objects, checked on every call).
//!
//! Threads: the device thread waits (ppoll) on the UDP socket, a wake-up eventfd and the next
//! timer; a client's call runs on the caller's thread (the daemon's connection thread, or the
//! application's own thread for an embedded device) under the device lock, then moves whatever the
//! call made sendable, so a post leaves without a thread switch.
//!
//! Parts: `config` holds the configuration ([`HcaConfig`] and the environment's tuning knobs),
//! this module the state and the device's start and clients;
//! `datapath` moves packets and ring entries, `dispatch` serves the clients' requests, and
//! `progress` decides who moves the work (the device thread, or the application's calls with a
//! progress thread).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// The device's tables are keyed by its own small numbers (clients, CQs, QPNs, keys), never by
/// what a peer chooses: a fast hash instead of SipHash, which an empty poll paid for in every
/// lookup (BENCHMARKS.md, "The empty poll").
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, rustc_hash::FxBuildHasher>;
/// A set as [`HashMap`].
pub(crate) type HashSet<K> = std::collections::HashSet<K, rustc_hash::FxBuildHasher>;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use nix::poll::{PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use softrdma_engine::device::{
    ip_udp_header, AsyncEvent, Counters, CqId, Device, DeviceConfig, FlowPorts, PdId, RecvMeta, Transmit,
    TransmitOptions,
};
use softrdma_engine::time::Instant;
use softrdma_engine::verbs::{Access, QpType, VerbsError, WcOpcode};
use softrdma_engine::wire::{icrc, IbPacket, Qpn};
use softrdma_engine::wr::RecvWr;
use softrdma_transport::udp::{self, RoceUdp, UdpConfig};

use crate::arena::{Allocator, Arena, RingAllocator, RingDesc, CQE_SLOT, STAGING_LEN, STAGING_OFF, WQE_SLOT};
use crate::capture::{monotonic_ns, Capture};
use crate::faults::{Copy, FaultCounts, FaultInjector};
use crate::memory::{range_mapped, ProcessMemory, STAGE_VA};
use crate::proto::{
    ClientEvent, CqEntry, DeviceInfo, IoStats, ProviderSettings, Published, RecvEntry, Request, Response, SendEntry,
    PUBLISH_INTERVAL_MS,
};

mod config;
mod datapath;
mod dispatch;
mod fork;
mod progress;
mod relay;

pub(crate) use self::config::tuning;
pub use self::config::{HcaConfig, Publisher};
use self::datapath::{Gso, PACKET_ROOM};
pub(crate) use self::fork::{in_forked_child, watch_fork};
use self::fork::{register_member_fds, unregister_member_fds};
use self::progress::*;
pub use self::progress::{
    Progress, END_AFTER_POST_WAIT, HANDOFF_IDLE, HANDOFF_LOOK_MAX, HELD_ANSWER_WAIT, IDLE_LOOK_AFTER, PROGRESS_SPIN,
};

/// A descriptor an answer hands to its client (an event fd, a member socket of the steered port).
pub type OutFd = Arc<dyn AsFd + Send + Sync>;

/// The RoCEv2 UDP port (IANA).
pub const ROCE_PORT: u16 = 4791;

/// rxe's vendor id (0xFFFFFF: no OUI); not Mellanox's 0x02c9, so programs that special-case
/// Mellanox hardware do not.
pub const VENDOR_ID: u32 = 0xff_ffff;

/// How long a REQ for a port nobody listens on waits for a listener ([`HcaConfig`]'s CM).
pub const LATE_LISTENER_GRACE_MS: u64 = 200;

/// The largest `max_cqe` a device takes: ConnectX's (2^22 - 1); one such CQ's ring is 512 MiB
/// of the arena's (sparse) ring space.
pub const MAX_CQE_LIMIT: u32 = (1 << 22) - 1;

/// Why a device could not start.
#[derive(Debug, thiserror::Error)]
pub enum HcaError {
    /// The UDP transport could not bind.
    #[error(transparent)]
    Udp(#[from] udp::UdpError),
    /// Another I/O error (eventfd, capture file).
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The error.
        source: io::Error,
    },
}

/// The objects a client made, so every call can be checked against them and they can be
/// destroyed when the client goes.
#[derive(Debug, Default)]
struct Objects {
    pds: HashSet<PdId>,
    mrs: HashSet<u32>,
    /// Memory windows by their index (the R_Key without its key byte, which binds change).
    mws: HashSet<u32>,
    cqs: HashSet<CqId>,
    qps: HashSet<Qpn>,
    srqs: HashSet<u32>,
    xrcds: Vec<softrdma_engine::device::XrcdId>,
    handles: HashSet<(Qpn, u32)>,
    mcast: HashSet<(Qpn, IpAddr)>,
    channels: HashSet<u32>,
}

struct Client {
    objects: Objects,
    events: VecDeque<ClientEvent>,
    event_fd: Arc<EventFd>,
    /// The client's ring arena and where its rings are.
    arena: Arc<Arena>,
    alloc: RingAllocator,
    /// Its staging area, the ring on which it gives staging back, what is staged by token, and
    /// the device's staging memory region in each of its PDs.
    staging: Allocator,
    release: RingDesc,
    staged: HashMap<u64, Staged>,
    stage_mrs: HashMap<PdId, u32>,
    /// The PD of each QP and SRQ (to check SGEs before staging).
    qp_pd: HashMap<Qpn, PdId>,
    srq_pd: HashMap<u32, PdId>,
    sq: HashMap<Qpn, RingDesc>,
    rq: HashMap<Qpn, RingDesc>,
    srq_rings: HashMap<u32, RingDesc>,
    cq_rings: HashMap<CqId, RingDesc>,
    /// On a device its application drives ([`Progress::Application`]: a provider): its CQs,
    /// which it polls straight from the engine ([`Hca::poll_cq`]); their completions stay in the
    /// engine's CQ, not copied into the rings (unless the client has a memory helper, whose
    /// writes its polls must wait for). With the completions the engine had added to each when
    /// the pump last looked.
    direct_cqs: HashMap<CqId, u64>,
    /// The arena's `posted` counter when the rings were last serviced.
    seen_posted: u32,
    /// Work left in a ring because the engine's queue was full: look again next time.
    backlog: bool,
    /// Its member of the steered port, when it runs its own QPs.
    steer: Option<u32>,
    /// Its key blocks, when it runs its own QPs (reserved in the device's engine).
    key_blocks: Vec<u32>,
    /// A provider's last report of its own QPs' counters, and of the QPN its allocator takes next.
    published: Option<(Counters, IoStats)>,
    next_qpn: Option<u32>,
}

impl Client {
    /// The ring of a destroyed queue: its space goes back to the allocator, its touched pages
    /// back to the system (an idle ring's slots were never touched: nothing to give).
    fn give_back(&mut self, r: &RingDesc) {
        self.alloc.release(r);
        self.arena.discard(r);
    }
}

/// What a new client gets.
pub struct Attached {
    /// Its owner id.
    pub owner: u32,
    /// Readable while async events wait for it.
    pub event_fd: Arc<EventFd>,
    /// Its ring arena (a sealed memfd) to map.
    pub arena: OwnedFd,
    /// The doorbell to write after posting to a ring (unless the device is polling).
    pub doorbell: OwnedFd,
    /// The ring on which the client gives staging space back.
    pub release: RingDesc,
}

impl Hca {
    /// Reaches a client's memory through its helper (the kernel refused process_vm_readv).
    pub fn use_memory_helper(&self, owner: u32, sock: std::os::unix::net::UnixStream) {
        self.use_memory_helper_timeout(owner, sock, crate::memory::HELPER_TIMEOUT);
    }

    /// [`Hca::use_memory_helper`], waiting at most `timeout` for each of the helper's answers.
    pub fn use_memory_helper_timeout(
        &self,
        owner: u32,
        sock: std::os::unix::net::UnixStream,
        timeout: std::time::Duration,
    ) {
        let Ok(wake) = self.shared.wake.as_fd().try_clone_to_owned() else {
            // No descriptor left for the link: the helper cannot be reached (its accesses fail).
            drop(sock);
            return;
        };
        self.shared.lock().dev.memory().attach_helper_timeout(owner, sock, wake, timeout);
    }
}

struct Channel {
    fd: Arc<EventFd>,
    events: VecDeque<CqId>,
}

struct CqWatch {
    channel: Option<u32>,
    /// Armed by req_notify_cq: fire on the first completion (solicited-only: the first
    /// solicited or unsuccessful one) added after `seen`.
    armed: bool,
    solicited_only: bool,
    seen: u64,
}

/// A packet waiting for its time (delay or reordering injected).
struct Delayed {
    at: Instant,
    seq: u64,
    dst: IpAddr,
    sport: u16,
    data: Vec<u8>,
    /// The IPv4 ID its ICRC was computed for.
    icrc_id: u16,
    /// The bit the fault injector flips, once the ICRC is right for the ID it will carry.
    flip: Option<usize>,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Counters of the device layer (the engine keeps the transport's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Datagrams sent on the UDP socket.
    pub udp_sent: u64,
    /// Datagrams received from the UDP socket.
    pub udp_rcvd: u64,
    /// Packets moved through internal loopback.
    pub loopback: u64,
    /// UDP send errors (the packet is lost; the transport retransmits).
    pub send_errors: u64,
    /// GSO sends (several packets in one system call).
    pub gso_sends: u64,
    /// Received buffers that held several coalesced packets (GRO).
    pub gro_buffers: u64,
    /// Work requests taken from the clients' rings.
    pub ring_wqes: u64,
    /// Ring entries that did not decode (a misbehaving client; skipped).
    pub ring_malformed: u64,
    /// Ring entries the engine refused (the client's checks at post time should prevent it).
    pub ring_rejected: u64,
    /// Reads of client memory across processes (process_vm_readv).
    pub memory_reads: u64,
    /// Writes of client memory across processes (process_vm_writev).
    pub memory_writes: u64,
    /// Reads and writes of this process's own memory by guarded copy (a provider's, an embedded
    /// device's: `crate::guard`).
    pub memory_guarded: u64,
    /// Datagrams the kernel handed to this layer's socket for another member of the steered
    /// port, passed on to their owner (`relay`).
    pub relayed: u64,
    /// Datagrams for another member that could not be passed on (a full link, no owner, a bad
    /// frame on a link).
    pub relay_lost: u64,
    /// Times a progress thread ([`Progress::Application`]) went on looking at the socket after
    /// work ([`PROGRESS_SPIN`]) instead of sleeping in poll: while a CQ was armed for a
    /// channel, or while the application made no call.
    pub progress_looks: u64,
    /// Datagrams a progress thread ([`Progress::Application`]) read from the device's socket
    /// itself (the rest were read by the application's calls).
    pub progress_rcvd: u64,
    /// Times the socket left the progress thread's wait set for the application's threads (the
    /// handoff; each costs an `epoll_ctl`, and so does its end).
    pub handoffs: u64,
}

struct State {
    dev: Device<ProcessMemory>,
    udp: RoceUdp,
    faults: FaultInjector,
    copies: Vec<Copy>,
    delayed: BinaryHeap<Reverse<Delayed>>,
    seq: u64,
    loopback: VecDeque<(u16, Vec<u8>, Option<IpAddr>)>,
    tap: Option<Capture>,
    epoch: std::time::Instant,
    /// The time of the pump or application call in progress, read once at its start
    /// ([`State::now`]): a clock read costs ~40 ns here and a pump made five.
    clock: Option<Instant>,
    /// A provider's reports to its daemon, when it last made one, and what it said.
    publisher: Option<Publisher>,
    /// When the last report went (engine time).
    last_publish: Instant,
    published: Option<(Counters, IoStats, u32)>,
    /// A report made while the state was locked, which the device thread sends once it has let
    /// the lock go (see [`State::publish`]).
    unsent: Option<Published>,
    /// The last reports of providers that have gone (a NIC's counters do not go down when a
    /// process exits).
    departed: (Counters, IoStats),
    /// Where the next holder of each QPN block given to providers starts allocating (an offset
    /// in the block): after its last holder's QPNs.
    qpn_cursor: HashMap<u32, u32>,
    clients: HashMap<u32, Client>,
    /// rdma_cm: IDs' owners and the clients' event channels.
    cm: crate::cm::CmDesk,
    /// The device's name (in CM event records).
    name: String,
    next_owner: u32,
    channels: HashMap<u32, Channel>,
    next_channel: u32,
    cqs: HashMap<CqId, CqWatch>,
    /// How many of `cqs` are armed: a thread of a client waits for a completion event (a
    /// [`Progress::Application`] device's progress thread then keeps looking for a while after
    /// work, since no application thread drives it: see `progress_spin_time`).
    armed_cqs: usize,
    /// Shared XRC domain files by (st_dev, st_ino), kept open while their domain lives.
    xrcd_files: HashMap<(u64, u64), File>,
    /// rdma_cm multicast joins and the IP group memberships behind them.
    groups: crate::mcast::Groups,
    buf: Vec<u8>,
    io: IoCounters,
    gso: Gso,
    /// Completions written into the clients' CQ rings so far (a poll's drive compares).
    cqes_written: u64,
    /// The application's polls take completions straight from the engine's CQs
    /// ([`Progress::Application`]: `Client::direct_cqs`).
    direct_cqs: bool,
    /// An application thread's poll held back the answers (ACKs) to what it received, to
    /// return the completions first ([`Hca::drive`]): the next pump sends them, requester
    /// packets first. Mirrored in `Shared::tx_owed` for the progress thread's lock-free waits.
    tx_owed: bool,
    /// An application thread posted a send since a poll last found completions: answers may
    /// be held back only then (a ping-pong's next post sends them; a program that only polls,
    /// a stream's receiver, would hold each batch's ACK until its next poll: measured slower).
    posted_send: bool,
    /// A spinning application poll's last read found the socket empty (`State::receive_spin`).
    spin_found_empty: bool,
    /// When an application thread last posted a send (`Hca::drive_post`).
    last_post: Option<Instant>,
    /// Calls of the application's threads that reach the state (polls, posts): the progress
    /// thread tells from its changes whether the application makes calls at all.
    app_calls: u64,
    /// Datagrams for other members of the steered port, and the links they go on.
    relay: relay::Relay,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    wake: EventFd,
    stop: AtomicBool,
    info: DeviceInfo,
    progress: Progress,
    /// When the device thread wakes next for timers (the engine's clock, ns; `u64::MAX`: not
    /// for timers), so that an application thread that arms an earlier timer wakes it.
    sleep_until: std::sync::atomic::AtomicU64,
    /// What the device thread waits on besides the doorbell and the multicast groups: `udp_poll`,
    /// which leaves the set while an application thread reads the socket itself
    /// ([`Progress::Application`], see `Hca::drive`): the device thread is then not woken by each
    /// datagram that thread is about to read.
    poll_set: nix::sys::epoll::Epoll,
    /// The device thread's descriptor of the receive socket (the same socket, so the same
    /// readiness: it waits with the state's lock released).
    udp_poll: OwnedFd,
    /// An application thread polls the socket: `udp_poll` is out of `poll_set`. Changed only with
    /// the state's lock held, so the flag and the set agree.
    handed_off: AtomicBool,
    /// Application threads asleep on a completion channel with the socket in their wait set
    /// (`Hca::sleep_on_channel`): while there are any, the socket stays handed off. Changed only
    /// with the state's lock held, as `handed_off` is.
    channel_sleepers: std::sync::atomic::AtomicU32,
    /// `HcaConfig::handoff_idle`.
    handoff_idle: std::time::Duration,
    /// `HcaConfig::idle_look_after`.
    idle_look_after: std::time::Duration,
    /// When an application thread last read the socket (ns since `epoch`).
    last_drive_ns: std::sync::atomic::AtomicU64,
    /// Times the socket went to the application's threads (IoCounters::handoffs).
    handoffs: std::sync::atomic::AtomicU64,
    /// When a poll last returned a message with no send posted since the poll before (ns since
    /// `epoch`; see `Hca::end_handoff_after_poll`).
    last_message_ns: std::sync::atomic::AtomicU64,
    /// A poll returned a message (or found more completions waiting) while the socket was handed
    /// off: the handoff ends after that thread's next send has left (see
    /// `Hca::end_handoff_after_poll`), not before it.
    end_after_post: AtomicBool,
    /// An application thread posted a send since the last poll that returned completions.
    posted_since_poll: AtomicBool,
    /// `State::tx_owed`, readable without the lock.
    tx_owed: AtomicBool,
    epoch: std::time::Instant,
}

/// A running device.
pub struct Hca {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// A member of a steered port: its descriptors, which a forked child must not keep.
    member_fds: Vec<RawFd>,
}

fn eventfd() -> io::Result<EventFd> {
    EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).map_err(io::Error::from)
}

fn node_guid(addr: IpAddr) -> u64 {
    // EUI-64 from the made-up MAC (capture::mac_of), universal/local bit flipped as IPv6 does.
    let m = crate::capture::mac_of(addr);
    u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

impl Hca {
    /// Starts a device: binds UDP, opens the capture, starts the device thread.
    pub fn start(cfg: HcaConfig) -> Result<Hca, HcaError> {
        let ucfg = UdpConfig {
            addr: cfg.addr,
            port: cfg.port,
            sport_base: 0xc000,
            sport_count: cfg.flow_ports,
            gso: cfg.gso,
            gro: true,
            steered: cfg.steered,
        };
        let udp = match RoceUdp::bind(&ucfg) {
            // A kernel without SO_ATTACH_REUSEPORT_CBPF (or another setup failure of the steered
            // group): the device runs unsteered; clients that ask to run their own QPs are told.
            Err(udp::UdpError::Setup { what, error, .. }) if cfg.steered => {
                tracing::warn!("port steering unavailable ({what}: {error}); running unsteered");
                RoceUdp::bind(&UdpConfig { steered: false, ..ucfg })?
            }
            r => r?,
        };
        Hca::start_on(cfg, udp, None, relay::Relay::new())
    }

    /// Starts the part of a steered device that runs in a client process (a user-space
    /// provider): `member` is the socket of the device's port the daemon made for this process
    /// (`Request::JoinSteering`) and `blocks` the QPN blocks steered to it. The engine allocates
    /// QPNs from those blocks only; packets for any other QPN of the device's address (the
    /// daemon's, other processes') go out through the port, which steers them.
    ///
    /// `link` is this process's end of its relay link to the daemon (`Request::JoinSteering`):
    /// datagrams the kernel hands to this socket for QPs that are not this process's go on to the
    /// daemon, which passes them to their owner, and what other members received for this
    /// process's QPs comes back on it ([`softrdma_transport::relay`]).
    pub fn start_member(
        mut cfg: HcaConfig,
        member: OwnedFd,
        link: Option<OwnedFd>,
        blocks: Vec<u32>,
        first_qpn: u32,
    ) -> Result<Hca, HcaError> {
        let relay = match link {
            Some(fd) => relay::Relay::provider(
                &blocks,
                softrdma_transport::relay::Link::from_fd(fd)
                    .map_err(|source| HcaError::Io { what: "relay link".into(), source })?,
            ),
            None => relay::Relay::new(),
        };
        let mut udp = RoceUdp::from_member(member)?;
        cfg.port = udp.local_addr().port();
        // The QPs of this process send from source ports of their own, one per QP from a pool
        // of this process's (as the daemon's QPs and rxe's do: RoCEv2, IBTA Annex A17, makes the
        // UDP source port a QP's flow entropy), not all from the device's port: between two hosts
        // they are then separate flows, which ECMP can spread and a NIC's GRO never merges
        // into one run for the QPs of several processes (transport/src/steer.rs).
        if cfg.flow_ports > 0 {
            if let Err(e) = udp.bind_source_ports(0xc000, cfg.flow_ports) {
                tracing::warn!(
                    "provider for {}: no source ports of its own ({e}); sending from the device's port",
                    cfg.name
                );
                cfg.flow_ports = 0;
            }
        }
        cfg.steered = false;
        Hca::start_on(cfg, udp, Some((blocks, first_qpn)), relay)
    }

    fn start_on(
        cfg: HcaConfig,
        udp: RoceUdp,
        blocks: Option<(Vec<u32>, u32)>,
        relay: relay::Relay,
    ) -> Result<Hca, HcaError> {
        let io_err = |what: &str| {
            let what = what.to_owned();
            move |source| HcaError::Io { what, source }
        };
        // The device thread polls its own descriptor of the receive socket (see `Shared::udp_poll`).
        let udp_poll = udp.as_fd().try_clone_to_owned().map_err(io_err("UDP socket descriptor"))?;
        let mut member_fds =
            if blocks.is_some() { vec![udp.as_fd().as_raw_fd(), udp_poll.as_raw_fd()] } else { Vec::new() };
        // A forked child drops its copy of the relay link too: it would take its parent's packets.
        member_fds.extend(relay.links().iter().map(|l| l.as_fd().as_raw_fd()));
        register_member_fds(&member_fds);
        let poll_set = nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| io_err("epoll")(e.into()))?;
        poll_set
            .add(&udp_poll, nix::sys::epoll::EpollEvent::new(nix::sys::epoll::EpollFlags::EPOLLIN, 0))
            .map_err(|e| io_err("epoll")(e.into()))?;
        let flow_ports = if cfg.flow_ports == 0 {
            FlowPorts { base: cfg.port, count: 0 }
        } else {
            FlowPorts { base: udp.sport_base(), count: cfg.flow_ports }
        };
        let iface_mtu = udp::interface_mtu(cfg.addr).unwrap_or(1500);
        let active_mtu = cfg.mtu.unwrap_or_else(|| udp::active_mtu(iface_mtu));
        let seed = cfg.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            t.as_nanos() as u64 ^ u64::from(std::process::id()) << 32
        });
        let mut dc = DeviceConfig::new(cfg.addr, seed);
        dc.mtu = active_mtu;
        dc.icrc = cfg.icrc;
        dc.flow_ports = flow_ports;
        dc.behaviour = cfg.behaviour;
        if let Some(m) = cfg.max_cqe {
            dc.limits.max_cqe = m.clamp(1, MAX_CQE_LIMIT);
        }
        let mut memory = ProcessMemory::default();
        memory.set_guarded(tuning().guarded_copy);
        let mut dev = Device::new(dc, memory);
        if let Some((b, first)) = blocks {
            dev.restrict_qpns_to(b, first);
        }
        if !cfg.key_blocks.is_empty() {
            dev.restrict_keys_to(cfg.key_blocks.clone());
        }
        dev.set_xrc_policy(cfg.xrc_policy);
        {
            let cm = dev.cm().config_mut();
            cm.ca_guid = node_guid(cfg.addr);
            cm.cm_response_timeout = cfg.cm_response_timeout;
            // The REP's target ACK delay: rxe's 15, mlx5's 16 under the cx profile
            // (../shared/reference/cm).
            if cfg.behaviour.name == softrdma_engine::device::ProfileName::Cx {
                cm.target_ack_delay = 16;
            }
            cm.timer_scale_permille = cfg.cm_timer_permille.max(1);
            // A REQ that finds no listener waits this long for one before its REJ 8: a listen
            // here is a few calls to the daemon (the kernel's is one system call), and qperf
            // 0.4.11 sends its port to the client before it listens (engine/src/cm).
            cm.late_listener_grace = softrdma_engine::time::Duration::from_millis(LATE_LISTENER_GRACE_MS);
        }
        let epoch = std::time::Instant::now();
        // `epoch` on CLOCK_MONOTONIC: the capture's times (its rings' clock) count from it.
        let epoch_mono_ns = monotonic_ns();
        let tap = match (&cfg.capture_ring, &cfg.pcap) {
            (Some(r), _) => Some(Capture::to_ring(r.clone())),
            (None, Some(p)) => {
                Some(Capture::to_file(p, epoch_mono_ns).map_err(io_err(&format!("capture file {}", p.display())))?)
            }
            (None, None) => None,
        };
        let info = DeviceInfo {
            name: cfg.name.clone(),
            addr: cfg.addr,
            active_mtu,
            iface_mtu,
            limits: dev.config().limits,
            node_guid: node_guid(cfg.addr),
            vendor_id: VENDOR_ID,
            pid: std::process::id() as i32,
            gid: crate::proto::gid_of(cfg.addr),
        };
        let state = State {
            dev,
            udp,
            faults: FaultInjector::new(cfg.faults),
            copies: Vec::new(),
            delayed: BinaryHeap::new(),
            seq: 0,
            loopback: VecDeque::new(),
            tap,
            epoch,
            clock: None,
            publisher: cfg.publish.clone(),
            last_publish: Instant(0),
            published: None,
            unsent: None,
            departed: Default::default(),
            qpn_cursor: HashMap::default(),
            clients: HashMap::default(),
            cm: crate::cm::CmDesk::with_paths(crate::paths::PathCache::new(cfg.path_cache_ttl)),
            name: cfg.name.clone(),
            next_owner: 1,
            channels: HashMap::default(),
            next_channel: 1,
            cqs: HashMap::default(),
            armed_cqs: 0,
            xrcd_files: HashMap::default(),
            groups: Default::default(),
            buf: vec![0u8; PACKET_ROOM],
            io: IoCounters::default(),
            gso: Gso::new(cfg.gso, cfg.addr),
            cqes_written: 0,
            direct_cqs: cfg.progress == Progress::Application,
            tx_owed: false,
            posted_send: false,
            spin_found_empty: false,
            last_post: None,
            app_calls: 0,
            relay,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: eventfd().map_err(io_err("eventfd"))?,
            stop: AtomicBool::new(false),
            info,
            progress: cfg.progress,
            handoff_idle: cfg.handoff_idle,
            idle_look_after: cfg.idle_look_after,
            sleep_until: std::sync::atomic::AtomicU64::new(u64::MAX),
            poll_set,
            udp_poll,
            handed_off: AtomicBool::new(false),
            channel_sleepers: std::sync::atomic::AtomicU32::new(0),
            last_drive_ns: std::sync::atomic::AtomicU64::new(0),
            last_message_ns: std::sync::atomic::AtomicU64::new(u64::MAX),
            handoffs: std::sync::atomic::AtomicU64::new(0),
            end_after_post: AtomicBool::new(false),
            posted_since_poll: AtomicBool::new(false),
            tx_owed: AtomicBool::new(false),
            // The state's epoch: `last_drive_ns` compares with the state's clock.
            epoch,
        });
        if cfg.progress == Progress::Application {
            progress::send_owed_at_exit(&shared);
        }
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-engine", cfg.name))
            .spawn(move || {
                // In a program's process (embedded, provider), its signals go to its threads.
                crate::signals::keep_off_this_thread();
                run(&s2)
            })
            .map_err(io_err("device thread"))?;
        Ok(Hca { shared, thread: Mutex::new(Some(thread)), member_fds })
    }

    /// What the device says about itself.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// A new client (owner) whose memory is process `pid`'s; returns its owner id and the fd that
    /// is readable while async events wait for it.
    pub fn attach(&self, pid: i32) -> io::Result<Attached> {
        let fd = Arc::new(eventfd()?);
        let arena = Arc::new(Arena::create()?);
        let arena_fd = arena.fd().as_fd().try_clone_to_owned()?;
        let mut alloc = RingAllocator::default();
        let release = alloc.ring(4096, 64).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        arena.reset(&release);
        // One doorbell per device: any client's doorbell makes the device look at the rings of
        // the clients whose `posted` counter moved.
        let doorbell = self.shared.wake.as_fd().try_clone_to_owned()?;
        let mut st = self.shared.lock();
        let owner = st.next_owner;
        st.next_owner += 1;
        st.dev.memory().attach(owner, pid);
        st.dev.memory().attach_arena(owner, arena.clone());
        let c = Client {
            objects: Objects::default(),
            events: VecDeque::new(),
            event_fd: fd.clone(),
            arena,
            alloc,
            staging: Allocator::span(STAGING_OFF, STAGING_LEN),
            release,
            staged: HashMap::default(),
            stage_mrs: HashMap::default(),
            qp_pd: HashMap::default(),
            srq_pd: HashMap::default(),
            sq: HashMap::default(),
            rq: HashMap::default(),
            srq_rings: HashMap::default(),
            cq_rings: HashMap::default(),
            direct_cqs: HashMap::default(),
            seen_posted: 0,
            backlog: false,
            steer: None,
            key_blocks: Vec::new(),
            published: None,
            next_qpn: None,
        };
        st.clients.insert(owner, c);
        Ok(Attached { owner, event_fd: fd, arena: arena_fd, doorbell, release })
    }

    /// A client went away: its objects are destroyed as the kernel's uverbs cleanup destroys a
    /// closed context's, except that XRC target QP handles left open do not destroy their QP
    /// (docs/architecture.md, XRC target QP lifetime; `XrcPolicy::DestroyOnLastClose` gives
    /// upstream's behaviour).
    pub fn detach(&self, owner: u32) {
        let mut st = self.shared.lock();
        st.send_owed();
        st.detach(owner);
        drop(st);
        // The device thread lets go of the sockets of groups the client's leaving ended (their
        // IP membership goes with them), and looks at the timers the cleanup armed (DREQs).
        let _ = self.shared.wake.write(1);
    }

    /// Runs one verbs call of a client. `fds`: descriptors that came with the call (an XRC
    /// domain file); the answer may carry descriptors too (a completion channel's).
    pub fn call(&self, owner: u32, req: Request, fds: Vec<OwnedFd>) -> (Response, Vec<OutFd>) {
        // Taking an event and arming a CQ change nothing the device thread looks at (no packet,
        // no timer): they do not wake it (an event-driven program makes both calls for every
        // message, and on a device the application drives each wake-up of the progress thread
        // took a core from the program: `ibv_rc_pingpong -e`), and they leave answers a poll or
        // a channel's sleeper held back for the thread's next post, which follows them.
        let quiet = matches!(req, Request::GetAsyncEvent | Request::GetCqEvent(_) | Request::ReqNotifyCq { .. });
        let mut st = self.shared.lock();
        // Answers a poll held back leave before the call changes anything (a QP destroyed
        // with its ACK unsent would leave the peer retrying, where a NIC had answered at once).
        if !quiet {
            st.send_owed();
        }
        let out = match st.clients.contains_key(&owner) {
            true => st.call(owner, req, fds),
            false => (Response::Err(VerbsError::Inval), Vec::new()),
        };
        let transmit = !quiet || !st.tx_owed;
        st.pump_with(transmit);
        drop(st);
        if !quiet {
            // New timers or packets for the device thread to look at.
            let _ = self.shared.wake.write(1);
        }
        out
    }

    /// Whether a client is still attached (the device cuts off a misbehaving one).
    pub fn is_attached(&self, owner: u32) -> bool {
        self.shared.lock().clients.contains_key(&owner)
    }

    /// How many clients are attached (`softrdma stat`'s own connection included while it asks).
    pub fn client_count(&self) -> usize {
        self.shared.lock().clients.len()
    }

    /// How many CQs are armed for a completion event (`ibv_req_notify_cq` since their last
    /// event): while any is, a [`Progress::Application`] device's progress thread keeps looking
    /// for [`PROGRESS_SPIN`] after work instead of blocking at once.
    pub fn armed_cqs(&self) -> usize {
        self.shared.lock().armed_cqs
    }

    /// Engine counters, device-layer counters and injected faults.
    pub fn counters(&self) -> (softrdma_engine::device::Counters, IoCounters, FaultCounts) {
        let st = self.shared.lock();
        let mut io = st.io;
        let u = st.udp.stats();
        (io.gso_sends, io.gro_buffers) = (u.gso_sends, u.gro_buffers);
        let mem = st.dev.memory_ref();
        (io.memory_reads, io.memory_writes, io.memory_guarded) = (mem.reads, mem.writes, mem.guarded_copies);
        io.handoffs = self.shared.handoffs.load(Ordering::Relaxed);
        (*st.dev.counters(), io, st.faults.counts)
    }

    /// The counters as `softrdma stat` shows them.
    pub fn stats(&self) -> (softrdma_engine::device::Counters, IoStats) {
        let mut st = self.shared.lock();
        let mut io = st.io_stats();
        io.clients = st.clients.len() as u64;
        (*st.dev.counters(), io)
    }

    /// Who makes this device progress.
    pub fn progress(&self) -> Progress {
        self.shared.progress
    }

    /// One more key block for a provider whose blocks are full (from its daemon,
    /// `Request::KeyBlock`).
    pub fn add_key_block(&self, block: u32) {
        self.shared.lock().dev.add_key_block(block);
    }

    /// Stops the device thread and flushes the capture.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.shared.wake.write(1);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
        let mut st = self.shared.lock();
        st.send_owed();
        st.send_delayed_now();
        if let Some(tap) = st.tap.as_mut() {
            tap.finish();
        }
        // A provider's last word: what its QPs did since its last report.
        st.publish(true);
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        self.stop();
        // The sockets close with the state, after this; a later socket may reuse the numbers.
        unregister_member_fds(&self.member_fds);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in the device; the state is still the
        // engine's, so go on rather than poison every client.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A receive whose data the device places in the client's staging area: where, and the SGEs
/// the client posted (checked when it was staged).
struct Staged {
    off: usize,
    len: u32,
    sges: Vec<softrdma_engine::wr::Sge>,
}

#[cfg(test)]
mod tests;
