//! The emulated HCA as a running thing: one engine [`Device`] driven over the RoCEv2 UDP transport
//! by a device thread, with internal loopback, fault injection and the capture tap, and the
//! verbs calls of its clients (each an owner of objects, checked on every call).
//!
//! Threads: the device thread waits (ppoll) on the UDP socket, a wake-up eventfd and the next
//! timer; a client's call runs on the caller's thread (the daemon's connection thread, or the
//! application's own thread for an embedded device) under the device lock, then moves whatever the
//! call made sendable, so a post leaves without a thread switch.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use nix::poll::{PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use softrdma_engine::device::{
    ip_udp_header, AsyncEvent, Behaviour, Counters, CqId, Device, DeviceConfig, FlowPorts, IcrcPolicy, PdId, RecvMeta,
    Transmit, TransmitOptions, XrcPolicy,
};
use softrdma_engine::time::Instant;
use softrdma_engine::verbs::{Access, Mtu, QpType, VerbsError, WcOpcode};
use softrdma_engine::wire::{icrc, IbPacket, Qpn};
use softrdma_engine::wr::RecvWr;
use softrdma_transport::udp::{self, RoceUdp, UdpConfig};

use crate::arena::{Allocator, Arena, RingAllocator, RingDesc, CQE_SLOT, STAGING_LEN, STAGING_OFF, WQE_SLOT};
use crate::capture::{monotonic_ns, Capture, Tap};
use crate::faults::{Copy, FaultCounts, FaultInjector, Faults};
use crate::memory::{range_mapped, ProcessMemory, STAGE_VA};
use crate::proto::{
    ClientEvent, CqEntry, DeviceInfo, IoStats, ProviderSettings, Published, RecvEntry, Request, Response, SendEntry,
    PUBLISH_INTERVAL_MS,
};

/// A descriptor an answer hands to its client (an event fd, a member socket of the steered port).
pub type OutFd = Arc<dyn AsFd + Send + Sync>;

/// The RoCEv2 UDP port (IANA).
pub const ROCE_PORT: u16 = 4791;

/// rxe's vendor id (0xFFFFFF: no OUI); not Mellanox's 0x02c9, so programs that special-case
/// Mellanox hardware do not.
pub const VENDOR_ID: u32 = 0xff_ffff;

/// How a provider reports to its daemon ([`HcaConfig::publish`]): called with the device's
/// state locked, from whichever thread pumped it.
#[derive(Clone)]
pub struct Publisher(pub Arc<dyn Fn(Published) + Send + Sync>);

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Publisher")
    }
}

/// How a device is set up.
#[derive(Debug, Clone)]
pub struct HcaConfig {
    /// Device name (srdma0).
    pub name: String,
    /// The address it owns UDP 4791 on.
    pub addr: IpAddr,
    /// The UDP port (4791; tests may pick another).
    pub port: u16,
    /// Active MTU; `None`: derived from the interface MTU as rxe derives it.
    pub mtu: Option<Mtu>,
    /// Capture every packet into this pcap file.
    pub pcap: Option<PathBuf>,
    /// A provider's link to its daemon: its counters and (with `capture_remote`) its captured
    /// packets are reported there (`Request::Publish`).
    pub publish: Option<Publisher>,
    /// Capture every packet for the daemon (`publish`) instead of into `pcap`.
    pub capture_remote: bool,
    /// Faults injected on transmit.
    pub faults: Faults,
    /// Send sockets for flow entropy (UDP source ports 0xC000.. upward); 0: send from the 4791
    /// socket.
    pub flow_ports: u16,
    /// ICRC check for IPv4 senders: a UDP socket cannot see the sender's IPv4 ID, so the default
    /// accepts a packet whose ICRC holds for some ID (design D5).
    pub icrc: IcrcPolicy,
    /// XRC target QP lifetime.
    pub xrc_policy: XrcPolicy,
    /// Seed of the device's random choices (key bits, QPNs); `None`: from the clock.
    pub seed: Option<u64>,
    /// Batch packets into UDP GSO sends. Off by default for devices built here (embedded ones in
    /// tests and programs); the daemon turns it on unless told `--no-gso`: with the requester's
    /// window of 128 PSNs it measured 1.4x the bandwidth of one send per packet for 64 KiB RDMA
    /// WRITEs on loopback (BENCHMARKS.md). Received GSO batches are always taken coalesced (GRO).
    pub gso: bool,
    /// The CM response timeout put in REQs: 20 as Linux's rdma_cm, 22 as Mellanox OFED's.
    pub cm_response_timeout: u8,
    /// The engine's wire choices (`softrdma_engine::device::profile`).
    pub behaviour: Behaviour,
    /// Scale of the CM's timers in 1/1000 (1000: the kernel's; tests shorten them).
    pub cm_timer_permille: u32,
    /// How long a looked-up path stays in the path record cache (zero: not cached).
    pub path_cache_ttl: std::time::Duration,
    /// Most entries of one CQ (`max_cqe`); None: rxe's 32767. A CQ's completion ring in the
    /// client's arena takes 128 bytes per entry, so the limit is MAX_CQE_LIMIT.
    pub max_cqe: Option<u32>,
    /// Who moves the device's work: its own thread, or the threads that post and poll.
    pub progress: Progress,
    /// Make the port a steered `SO_REUSEPORT` group (`softrdma_transport::steer`), so that
    /// clients can run their own QPs on it (`Request::JoinSteering`). The daemon does this;
    /// where the kernel refuses, the device runs unsteered and says so to a client that asks.
    pub steered: bool,
}

/// Who makes a device progress (design D2 revised: the data path in the application).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// The device thread does everything: it spins for a while after activity (1 ms,
    /// `$SOFTRDMA_SPIN_US`) and sleeps in poll otherwise. A process of its own (the daemon) has to
    /// work this way; every message then passes through the device's thread besides the
    /// application's.
    #[default]
    DeviceThread,
    /// The application's threads drive the device in the calls they make anyway, as a user-space
    /// provider over a NIC does: posting runs the engine and sends ([`Hca::drive`]), polling an
    /// empty CQ receives, runs the timers and writes completions. The device thread becomes a
    /// *progress thread* that never spins: it serves what no call drives (one-sided targets,
    /// timers, completion-channel sleepers) from a blocking poll on the socket, the doorbell and
    /// the engine's next timer; it can be told to keep off the socket for a while after an
    /// application thread read it ([`PARK`], `$SOFTRDMA_PARK_US`; off by default, measured).
    Application,
}

impl Progress {
    /// `$SOFTRDMA_PROGRESS`: `application` or `device` (the default; anything else too).
    pub fn from_env() -> Progress {
        match std::env::var("SOFTRDMA_PROGRESS").as_deref() {
            Ok("application") => Progress::Application,
            _ => Progress::DeviceThread,
        }
    }
}

/// How long the progress thread of a [`Progress::Application`] device stays off the socket after
/// an application thread last read it (and how often it looks again meanwhile). 0 by default:
/// measured (BENCHMARKS.md, "The data path in the application"), parking for 500 us made
/// ib_write_lat wait for the park to end (perftest polls its CQ, then spins on memory that only
/// the progress thread can fill): 275 us typical against 22-25 us without; 20 and 50 us were no
/// better than 0 for ib_send_lat either.
pub const PARK: std::time::Duration = std::time::Duration::from_micros(0);

/// The longest a [`Progress::Application`] device's progress thread sleeps (50 ms).
const APPLICATION_TICK_NS: u64 = 50_000_000;

/// [`PARK`], or `$SOFTRDMA_PARK_US` (read once; a tuning knob, BENCHMARKS.md compares values).
fn park_time() -> std::time::Duration {
    static S: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::env::var("SOFTRDMA_PARK_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(PARK, std::time::Duration::from_micros)
    })
}

/// The largest `max_cqe` a device takes: ConnectX's (2^22 - 1); one such CQ's ring is 512 MiB
/// of the arena's (sparse) ring space.
pub const MAX_CQE_LIMIT: u32 = (1 << 22) - 1;

impl HcaConfig {
    /// A device `name` on `addr` with the defaults: UDP 4791, MTU from the interface, no capture,
    /// no faults, 8 flow ports, the "some IPv4 ID" ICRC check, one send per packet (no GSO),
    /// progress as `$SOFTRDMA_PROGRESS` says ([`Progress::from_env`]).
    pub fn new(name: &str, addr: IpAddr) -> HcaConfig {
        HcaConfig {
            name: name.to_owned(),
            addr,
            port: ROCE_PORT,
            mtu: None,
            pcap: None,
            publish: None,
            capture_remote: false,
            faults: Faults::default(),
            flow_ports: 8,
            icrc: IcrcPolicy::AnyIpv4Id,
            xrc_policy: XrcPolicy::default(),
            seed: None,
            gso: false,
            cm_response_timeout: 20,
            behaviour: Behaviour::RXE,
            cm_timer_permille: 1000,
            path_cache_ttl: crate::paths::DEFAULT_TTL,
            max_cqe: None,
            progress: Progress::from_env(),
            steered: false,
        }
    }
}

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
    /// The arena's `posted` counter when the rings were last serviced.
    seen_posted: u32,
    /// Work left in a ring because the engine's queue was full: look again next time.
    backlog: bool,
    /// Its member of the steered port, when it runs its own QPs.
    steer: Option<u32>,
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
    /// `epoch` on CLOCK_MONOTONIC (ns): providers' captured packets carry that clock.
    epoch_mono_ns: u64,
    /// A provider's reports to its daemon, when it last made one, and what it said.
    publisher: Option<Publisher>,
    last_publish: std::time::Instant,
    published: Option<(Counters, IoStats, u32)>,
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
    /// Shared XRC domain files by (st_dev, st_ino), kept open while their domain lives.
    xrcd_files: HashMap<(u64, u64), File>,
    /// rdma_cm multicast joins and the IP group memberships behind them.
    groups: crate::mcast::Groups,
    buf: Vec<u8>,
    io: IoCounters,
    gso: Gso,
}

/// The GSO send being built.
struct Gso {
    enabled: bool,
    dst: IpAddr,
    dqpn: u32,
    sport: u16,
    seg: usize,
    n: usize,
    closed: bool,
    buf: Vec<u8>,
}

impl Gso {
    /// The IPv4 ID the next packet gets if it joins the send being built (0 if a new one starts).
    fn next_id(&self) -> u16 {
        if self.enabled && self.n > 0 && !self.closed && self.n < MAX_GSO_SEGMENTS {
            self.n as u16
        } else {
            0
        }
    }
}

/// Most segments in one GSO send: 64 is what 6.1 kernels take (newer ones take 128).
const MAX_GSO_SEGMENTS: usize = 64;

pub(crate) struct Shared {
    state: Mutex<State>,
    wake: EventFd,
    stop: AtomicBool,
    info: DeviceInfo,
    progress: Progress,
    /// When the device thread wakes next for timers (the engine's clock, ns; `u64::MAX`: not
    /// for timers), so that an application thread that arms an earlier timer wakes it.
    sleep_until: std::sync::atomic::AtomicU64,
    /// [`Progress::Application`]: nanoseconds since `epoch` until which an application thread
    /// counts as driving the device (it drove it less than [`PARK`] ago).
    driven_until: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
}

/// A running device.
pub struct Hca {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// A member of a steered port: its descriptors, which a forked child must not keep.
    member_fds: Vec<RawFd>,
}

/// Descriptors of steered-port members in this process (-1: free slot). A forked child replaces
/// each with a fresh unbound socket ([`forget_members_in_child`]): the child never takes its
/// parent's datagrams, and its copy of the device fails quietly instead of stealing them.
static MEMBER_FDS: [std::sync::atomic::AtomicI32; 64] = [const { std::sync::atomic::AtomicI32::new(-1) }; 64];

/// `pthread_atfork` child handler: only async-signal-safe calls (socket, dup2, close).
extern "C" fn forget_members_in_child() {
    for slot in &MEMBER_FDS {
        let fd = slot.load(Ordering::Relaxed);
        if fd < 0 {
            continue;
        }
        // SAFETY: plain syscalls on descriptor numbers; `fd` is this process's (inherited) copy
        // of a member socket, replaced in place so no other code's descriptor number changes.
        unsafe {
            let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0);
            if s >= 0 {
                libc::dup2(s, fd);
                libc::close(s);
            }
        }
    }
}

/// Files the descriptors of a member socket for [`forget_members_in_child`] (registered once).
fn register_member_fds(fds: &[RawFd]) {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: pthread_atfork(3) with a handler that lives for the whole program.
        unsafe { libc::pthread_atfork(None, None, Some(forget_members_in_child)) };
    });
    for &fd in fds {
        if let Some(slot) =
            MEMBER_FDS.iter().find(|s| s.compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst).is_ok())
        {
            let _ = slot;
        } else {
            tracing::warn!("more than {} member sockets: a forked child keeps a copy of fd {fd}", MEMBER_FDS.len());
        }
    }
}

fn unregister_member_fds(fds: &[RawFd]) {
    for &fd in fds {
        if let Some(slot) = MEMBER_FDS.iter().find(|s| s.load(Ordering::SeqCst) == fd) {
            slot.store(-1, Ordering::SeqCst);
        }
    }
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
        Hca::start_on(cfg, udp, None)
    }

    /// Starts the part of a steered device that runs in a client process (a user-space
    /// provider): `member` is the socket of the device's port the daemon made for this process
    /// (`Request::JoinSteering`) and `blocks` the QPN blocks steered to it. The engine allocates
    /// QPNs from those blocks only; packets for any other QPN of the device's address (the
    /// daemon's, other processes') go out through the port, which steers them.
    pub fn start_member(
        mut cfg: HcaConfig,
        member: OwnedFd,
        blocks: Vec<u32>,
        first_qpn: u32,
    ) -> Result<Hca, HcaError> {
        let udp = RoceUdp::from_member(member)?;
        cfg.port = udp.local_addr().port();
        cfg.flow_ports = 0;
        cfg.steered = false;
        Hca::start_on(cfg, udp, Some((blocks, first_qpn)))
    }

    fn start_on(cfg: HcaConfig, udp: RoceUdp, blocks: Option<(Vec<u32>, u32)>) -> Result<Hca, HcaError> {
        let io_err = |what: &str| {
            let what = what.to_owned();
            move |source| HcaError::Io { what, source }
        };
        // The device thread polls its own descriptor of the receive socket (the same socket, so
        // the same readiness), so that it can wait with the state's lock released.
        let udp_poll = udp.as_fd().try_clone_to_owned().map_err(io_err("UDP socket descriptor"))?;
        let member_fds =
            if blocks.is_some() { vec![udp.as_fd().as_raw_fd(), udp_poll.as_raw_fd()] } else { Vec::new() };
        register_member_fds(&member_fds);
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
        let mut dev = Device::new(dc, ProcessMemory::default());
        if let Some((b, first)) = blocks {
            dev.restrict_qpns_to(b, first);
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
        }
        let epoch = std::time::Instant::now();
        let epoch_mono_ns = monotonic_ns();
        let tap = match &cfg.pcap {
            _ if cfg.capture_remote => Some(Capture::Remote { epoch_mono_ns, out: Vec::new() }),
            Some(p) => Some(Capture::File(Tap::create(p).map_err(io_err(&format!("capture file {}", p.display())))?)),
            None => None,
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
            epoch_mono_ns,
            publisher: cfg.publish.clone(),
            last_publish: epoch,
            published: None,
            departed: Default::default(),
            qpn_cursor: HashMap::new(),
            clients: HashMap::new(),
            cm: crate::cm::CmDesk::with_paths(crate::paths::PathCache::new(cfg.path_cache_ttl)),
            name: cfg.name.clone(),
            next_owner: 1,
            channels: HashMap::new(),
            next_channel: 1,
            cqs: HashMap::new(),
            xrcd_files: HashMap::new(),
            groups: Default::default(),
            buf: vec![0u8; 4096 + 256],
            io: IoCounters::default(),
            gso: Gso {
                enabled: cfg.gso,
                dst: cfg.addr,
                dqpn: 0,
                sport: 0,
                seg: 0,
                n: 0,
                closed: false,
                buf: Vec::with_capacity(udp::MAX_GSO_BYTES),
            },
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: eventfd().map_err(io_err("eventfd"))?,
            stop: AtomicBool::new(false),
            info,
            progress: cfg.progress,
            sleep_until: std::sync::atomic::AtomicU64::new(u64::MAX),
            driven_until: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-engine", cfg.name))
            .spawn(move || run(&s2, &udp_poll))
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
            staged: HashMap::new(),
            stage_mrs: HashMap::new(),
            qp_pd: HashMap::new(),
            srq_pd: HashMap::new(),
            sq: HashMap::new(),
            rq: HashMap::new(),
            srq_rings: HashMap::new(),
            cq_rings: HashMap::new(),
            seen_posted: 0,
            backlog: false,
            steer: None,
            published: None,
            next_qpn: None,
        };
        st.clients.insert(owner, c);
        Ok(Attached { owner, event_fd: fd, arena: arena_fd, doorbell, release })
    }

    /// A client went away: its objects are destroyed as the kernel's uverbs cleanup destroys a
    /// closed context's, except that XRC target QP handles left open do not destroy their QP
    /// (design.md, XRC; `XrcPolicy::DestroyOnLastClose` gives upstream's behaviour).
    pub fn detach(&self, owner: u32) {
        let mut st = self.shared.lock();
        st.detach(owner);
    }

    /// Runs one verbs call of a client. `fds`: descriptors that came with the call (an XRC
    /// domain file); the answer may carry descriptors too (a completion channel's).
    pub fn call(&self, owner: u32, req: Request, fds: Vec<OwnedFd>) -> (Response, Vec<OutFd>) {
        let quiet = matches!(req, Request::GetAsyncEvent | Request::GetCqEvent(_));
        let mut st = self.shared.lock();
        let out = match st.clients.contains_key(&owner) {
            true => st.call(owner, req, fds),
            false => (Response::Err(VerbsError::Inval), Vec::new()),
        };
        st.pump();
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

    /// Engine counters, device-layer counters and injected faults.
    pub fn counters(&self) -> (softrdma_engine::device::Counters, IoCounters, FaultCounts) {
        let st = self.shared.lock();
        let mut io = st.io;
        let u = st.udp.stats();
        (io.gso_sends, io.gro_buffers) = (u.gso_sends, u.gro_buffers);
        let mem = st.dev.memory_ref();
        (io.memory_reads, io.memory_writes) = (mem.reads, mem.writes);
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

    /// Drives the device from the calling thread (a [`Progress::Application`] device's clients
    /// call this after posting and when a poll finds nothing): moves posted work into the engine,
    /// runs due timers, sends, writes completions, and with `receive` also reads what the socket
    /// holds (batch by batch) and answers it. Returns the datagrams received. On a
    /// [`Progress::DeviceThread`] device it does the same work, which the device thread would
    /// have done a little later.
    pub fn drive(&self, receive: bool) -> usize {
        let sh = &self.shared;
        if receive {
            // Only a thread that reads the socket keeps the progress thread off it: one that
            // posts and then spins on memory (an RDMA WRITE's last byte) needs it there.
            let until = sh.epoch.elapsed() + park_time();
            sh.driven_until.store(until.as_nanos() as u64, Ordering::Relaxed);
        }
        let mut st = sh.lock();
        st.pump();
        let mut received = 0;
        if receive {
            for _ in 0..64 {
                let n = st.receive();
                if n == 0 {
                    break;
                }
                received += n;
                st.pump();
            }
        }
        Hca::wake_for_timers(sh, &st);
        received
    }

    /// Wakes the device thread if the engine (or the fault injector's delay queue) now has a
    /// timer earlier than the one it sleeps for: an application thread armed it (a send's
    /// transport timer, IBTA 9.7.6.1.3) while that thread slept. Once per earlier deadline, not
    /// per call: later posts arm later timers.
    fn wake_for_timers(sh: &Shared, st: &State) {
        let next = [st.dev.poll_timeout(), st.delayed.peek().map(|d| d.0.at)].into_iter().flatten().min();
        if let Some(t) = next {
            if t.0 < sh.sleep_until.load(Ordering::SeqCst) {
                sh.sleep_until.store(t.0, Ordering::SeqCst);
                let _ = sh.wake.write(1);
            }
        }
    }

    /// After a post to QP `qpn`'s send queue on a [`Progress::Application`] device: moves the
    /// work into the engine and sends it now, unless the post is part of a `stream` (the
    /// application's previous call was a post too) and the QP still waits for an answer to
    /// what it sent before (an ACK, READ response or RNR timer is due). Then the new packets stay
    /// for the next pump, which that answer brings (the progress thread reads it, or the
    /// application's next poll; the transport timer bounds it), and leave together in GSO
    /// sends: an application that posts a stream of small messages makes one send syscall per
    /// batch instead of one per post. A post after a poll (a ping-pong, a latency test) or to
    /// an idle QP leaves at once.
    pub fn drive_post(&self, qpn: Qpn, stream: bool) {
        let mut st = self.shared.lock();
        if stream && st.dev.awaiting_response(qpn) {
            let moved = st.service_rings();
            st.io.ring_wqes += moved as u64;
        } else {
            st.pump();
        }
        Hca::wake_for_timers(&self.shared, &st);
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
        if let Some(tap) = st.tap.as_mut() {
            let _ = tap.flush();
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

/// Flips one bit of a packet (fault injection), if asked.
fn flip_bit(d: &mut [u8], bit: Option<usize>) {
    if let Some(b) = bit.filter(|b| b / 8 < d.len()) {
        d[b / 8] ^= 1 << (b % 8);
    }
}

/// The device thread; `udp` is a descriptor of the state's receive socket (`RoceUdp`), polled
/// while the state's lock is released.
fn run(sh: &Shared, udp: &OwnedFd) {
    // Adaptive polling (design D4): after ring or wire activity the device keeps looking at the rings
    // for a short while with the clients' doorbells suppressed, then clears the flag, fences,
    // looks once more (a post that saw the flag set is found here) and sleeps.
    let mut spin_until: Option<std::time::Instant> = None;
    // Datagrams arrived in the last round: an answer (or the next request) tends to follow.
    let mut received = false;
    let application = sh.progress == Progress::Application;
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        // An application thread drives the device: stay off the socket until it stops (it looks
        // at the socket itself; two threads taking turns per packet would only add wake-ups).
        let driven_for = application
            .then(|| {
                let until = sh.driven_until.load(Ordering::Relaxed);
                let now = sh.epoch.elapsed().as_nanos() as u64;
                (until > now).then(|| std::time::Duration::from_nanos(until - now))
            })
            .flatten();
        let (timeout, spinning_now, groups) = {
            let mut st = sh.lock();
            let before = st.io.ring_wqes + st.io.udp_rcvd;
            st.pump();
            // Spin after activity: the device thread for spin_time(); a progress thread for
            // progress_spin_time() and only while no application thread reads the socket.
            let spin_for = if application { progress_spin_time() } else { spin_time() };
            if driven_for.is_some() {
                spin_until = None;
            } else if !spin_for.is_zero() && (st.io.ring_wqes + st.io.udp_rcvd != before || received) {
                if spin_until.is_none() {
                    st.set_polling(true);
                }
                spin_until = Some(std::time::Instant::now() + spin_for);
            }
            let spinning = spin_until.is_some_and(|t| std::time::Instant::now() < t);
            if !spinning && spin_until.take().is_some() {
                st.set_polling(false);
                std::sync::atomic::fence(Ordering::SeqCst);
                st.pump();
            }
            let now = st.now();
            // A CM channel whose pipe was full is looked at again every millisecond.
            let cm_retry = st.cm.has_backlog().then(|| now + softrdma_engine::time::Duration::from_millis(1));
            let next = [st.dev.poll_timeout(), st.delayed.peek().map(|d| d.0.at), cm_retry].into_iter().flatten().min();
            let mut t = if spinning { Some(0) } else { next.map(|t| t.saturating_since(now).as_nanos()) };
            if let Some(d) = driven_for {
                t = Some(t.map_or(d.as_nanos() as u64, |t| t.min(d.as_nanos() as u64)));
            }
            if application {
                // Wakes at least every 50 ms: an application thread arming a later timer (a
                // send's transport timer, 67 ms and more) need not wake it, one arming an earlier
                // timer does ([`Hca::wake_for_timers`]), and neither happens once per post.
                t = Some(t.map_or(APPLICATION_TICK_NS, |t| t.min(APPLICATION_TICK_NS)));
            }
            // The application's calls arm timers while this thread sleeps: they wake it when they
            // arm one earlier than this ([`Hca::wake_for_timers`]).
            sh.sleep_until.store(t.map_or(u64::MAX, |t| now.0.saturating_add(t)), Ordering::SeqCst);
            (t, spinning, st.groups.sockets())
        };
        let ts = timeout.map(|ns| nix::sys::time::TimeSpec::from_duration(std::time::Duration::from_nanos(ns)));
        // The group sockets are shared with the state: one that a leave drops meanwhile stays open
        // (and a member) until this poll returns and `groups` goes, as the kernel would keep it
        // for a poll in progress anyway.
        if driven_for.is_some() {
            // Parked: not on the socket's wait queue at all (a poll asking for no event still
            // sits there, and every datagram would wake this thread for nothing).
            let mut fds = [PollFd::new(sh.wake.as_fd(), PollFlags::POLLIN)];
            let _ = nix::poll::ppoll(&mut fds, ts, None);
            if fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)) {
                let _ = sh.wake.read();
            }
            received = false;
            continue;
        }
        let mut fds =
            vec![PollFd::new(udp.as_fd(), PollFlags::POLLIN), PollFd::new(sh.wake.as_fd(), PollFlags::POLLIN)];
        fds.extend(groups.iter().map(|g| PollFd::new(g.as_fd(), PollFlags::POLLIN)));
        let _ = nix::poll::ppoll(&mut fds, ts, None);
        let group_readable = fds[2..].iter().any(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)));
        if spinning_now && spin_yields() {
            // While spinning, let the other runnable threads (the clients' pollers, the peer
            // device) have the CPU between two looks: on a machine with fewer cores than busy
            // threads, a spin that does not yield delays the very work it waits for.
            std::thread::yield_now();
        }
        let wake = fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        let readable = fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        if wake {
            let _ = sh.wake.read();
        }
        received = false;
        if group_readable {
            let mut st = sh.lock();
            if st.receive_groups() > 0 {
                st.pump();
                received = true;
            }
        }
        if readable {
            // Batch by batch, releasing the lock in between so clients' calls get in.
            for _ in 0..64 {
                let mut st = sh.lock();
                let n = st.receive();
                st.pump();
                if n == 0 {
                    break;
                }
                received = true;
            }
        }
    }
}

/// A receive whose data the device places in the client's staging area: where, and the SGEs
/// the client posted (checked when it was staged).
struct Staged {
    off: usize,
    len: u32,
    sges: Vec<softrdma_engine::wr::Sge>,
}

/// A staged receive that the engine did not take (it stays in the ring, or is dropped): neither
/// is its staging.
fn unstage(staging: &mut Allocator, staged: &mut HashMap<u64, Staged>, token: u64) {
    if let Some(st) = staged.remove(&token) {
        staging.free(st.off, st.len as usize);
    }
}

/// Before a region changes or goes (dereg, rereg), the queued receives staged over SGEs that use
/// it get their own SGEs back, so that when data arrives the engine checks those as the verbs
/// say it must (LOC_PROT_ERR and a NAK if the region no longer fits), instead of the staging.
fn unstage_lkey(dev: &mut Device<ProcessMemory>, c: &mut Client, lkey: u32) {
    let Client { objects, staging, staged, .. } = c;
    let mut fix = |q: &mut std::collections::VecDeque<RecvWr>| {
        for wr in q.iter_mut() {
            if staged.get(&wr.wr_id).is_some_and(|st| st.sges.iter().any(|s| s.lkey == lkey)) {
                let st = staged.remove(&wr.wr_id).expect("present");
                staging.free(st.off, st.len as usize);
                wr.sg_list = st.sges;
            }
        }
    };
    for q in &objects.qps {
        if let Some(rq) = dev.queued_recvs_mut(*q) {
            fix(rq);
        }
    }
    for s in &objects.srqs {
        if let Some(rq) = dev.queued_srq_recvs_mut(*s) {
            fix(rq);
        }
    }
}

/// Moves one ring's entries into the engine through `post`: a full engine queue stops it with the
/// rest left in the ring (`backlog`), a refused entry is counted and dropped, an entry that does
/// not decode stops it and marks the client `bad`. Returns how many entries were taken.
fn drain<E: for<'de> serde::Deserialize<'de>>(
    arena: &Arena,
    ring: &RingDesc,
    io: &mut IoCounters,
    backlog: &mut bool,
    bad: &mut bool,
    mut post: impl FnMut(E) -> Result<(), VerbsError>,
) -> usize {
    arena.consume::<E>(ring, usize::MAX, |v| match v {
        Some(e) => match post(e) {
            Err(VerbsError::NoMem) => {
                *backlog = true;
                false
            }
            r => {
                io.ring_rejected += u64::from(r.is_err());
                true
            }
        },
        None => {
            io.ring_malformed += 1;
            *bad = true;
            false
        }
    })
}

/// A receive the client asked to stage gets one SGE over a fresh piece of the staging area
/// instead of its own, once its own SGEs pass the engine's checks (otherwise the engine sees them
/// as they are, and reports what is wrong as it would); the staging is remembered by token.
fn redirect(
    dev: &Device<ProcessMemory>,
    pd: Option<PdId>,
    e: RecvEntry,
    staging: &mut Allocator,
    staged: &mut HashMap<u64, Staged>,
    stage_mrs: &HashMap<PdId, u32>,
) -> RecvWr {
    let RecvEntry { mut wr, stage } = e;
    let (Some(pd), true) = (pd, stage) else { return wr };
    let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    let ok = len <= u64::from(u32::MAX) && wr.sg_list.iter().all(|s| dev.sge_ok(pd, s, Access::LOCAL_WRITE));
    let (Some(&lkey), true) = (stage_mrs.get(&pd), ok) else { return wr };
    let Some(off) = staging.alloc(len as usize) else { return wr };
    staged.insert(wr.wr_id, Staged { off, len: len as u32, sges: wr.sg_list.clone() });
    let addr = STAGE_VA + (off - STAGING_OFF) as u64;
    wr.sg_list = vec![softrdma_engine::wr::Sge { addr, length: len as u32, lkey }];
    wr
}

/// How long the device keeps polling the rings and the socket after the last work it found:
/// 1 ms, or $SOFTRDMA_SPIN_US (a tuning knob, read once; BENCHMARKS.md compares settings).
fn spin_time() -> std::time::Duration {
    static S: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::time::Duration::from_micros(
            std::env::var("SOFTRDMA_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        )
    })
}

/// How long a progress thread ([`Progress::Application`]) keeps looking at the socket after
/// work it found itself, while no application thread reads it: $SOFTRDMA_PROGRESS_SPIN_US
/// (read once), default 0 (it blocks in poll at once).
fn progress_spin_time() -> std::time::Duration {
    static S: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        std::time::Duration::from_micros(
            std::env::var("SOFTRDMA_PROGRESS_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
        )
    })
}

/// Whether the device yields the CPU between two looks while it spins: yes, unless
/// $SOFTRDMA_SPIN_YIELD=0 (a tuning knob, read once).
fn spin_yields() -> bool {
    static S: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *S.get_or_init(|| std::env::var("SOFTRDMA_SPIN_YIELD").map_or(true, |v| v != "0"))
}

/// One line per packet at TRACE level (`SOFTRDMA_LOG=trace`): direction, opcode, PSN, AckReq.
fn trace_packet(dir: &str, p: &[u8]) {
    if p.len() >= 12 && tracing::enabled!(tracing::Level::TRACE) {
        let psn = u32::from_be_bytes([0, p[9], p[10], p[11]]);
        let qpn = u32::from_be_bytes([0, p[5], p[6], p[7]]);
        tracing::trace!(dir, opcode = p[0], qpn, psn, ack_req = p[8] >> 7, len = p.len());
    }
}

impl State {
    fn now(&self) -> Instant {
        Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    fn addr(&self) -> IpAddr {
        self.dev.config().addr
    }

    /// Reads one batch of datagrams (at most the transport's receive budget) and hands them to
    /// the engine; returns how many. The caller pumps after every batch: answers (ACKs, READ
    /// responses) must not wait until the socket is empty, or a sender retransmitting faster than
    /// we drain would never hear from us.
    fn receive(&mut self) -> usize {
        // Work posted before these packets arrived must be in the engine when they are handled
        // (a receive posted before the peer's SEND was posted is there for it, as on an HCA).
        let moved = self.service_rings();
        self.io.ring_wqes += moved as u64;
        let now = self.now();
        let addr = self.addr();
        let State { udp, dev, tap, io, epoch, .. } = self;
        let r = udp.recv(&mut |d| {
            io.udp_rcvd += 1;
            let src = d.src.ip();
            let dst = d.dst.filter(|a| *a != addr);
            // A datagram from this device's own address came from a provider sharing the port
            // (or from the daemon, to a provider), which captured it as it sent it: once per
            // packet, as internal loopback.
            if let Some(t) = tap.as_mut().filter(|_| src != addr) {
                let _ =
                    t.write(epoch.elapsed().as_nanos() as u64, src, dst.unwrap_or(addr), d.src.port(), d.payload, None);
            }
            // The place in a GRO buffer is the IPv4 ID a GSO sender gave it (a hint).
            let ip_id = (d.segment > 0).then_some(d.segment);
            let meta = RecvMeta { src, src_port: d.src.port(), ip_id, dst };
            trace_packet("rx", d.payload);
            dev.handle_packet(now, meta, d.payload);
        });
        r.unwrap_or(0)
    }

    /// Moves everything that can move: due timers, delayed packets, the engine's transmissions
    /// and the internal loopback, until nothing is left (bounded), then routes events.
    fn pump(&mut self) {
        for round in 0..1024 {
            let ring_work = self.service_rings();
            self.io.ring_wqes += ring_work as u64;
            let now = self.now();
            if self.dev.poll_timeout().is_some_and(|t| t <= now) {
                self.dev.handle_timeout(now);
            }
            while self.delayed.peek().is_some_and(|d| d.0.at <= now) {
                let d = self.delayed.pop().expect("peeked").0;
                self.deliver(d.dst, d.sport, &d.data, d.icrc_id, d.flip);
            }
            // Data the packets handled so far wrote is in place before any answer to them leaves.
            self.dev.memory().flush();
            // What memory helpers answered: the QPs that waited for it go again.
            if self.dev.memory().helper_round() {
                self.dev.memory_ready();
            }
            // Completions are visible before the answers leave (a responder's receive completion
            // does not wait for the ACK it sends, IBTA 9.7.5.1 and 10.8.1 tie neither to the
            // other): the application polling this CQ need not wait for our send syscalls.
            // Once per pump: the scan visits every CQ of every client.
            if round == 0 {
                self.fill_cq_rings();
            }
            let loopback_icrc = self.loopback_icrc();
            let mut buf = std::mem::take(&mut self.buf);
            let mut sent = 0;
            loop {
                // The engine computes the ICRC for the IPv4 ID the packet gets if it joins the
                // GSO send being built (Linux numbers segments 0, 1, 2, ...); `wire` corrects it
                // when the packet does not.
                let id = self.gso.next_id();
                let opts = TransmitOptions { ip_id: id, loopback_icrc };
                let Some(t) = self.dev.poll_transmit_with(now, &mut buf, opts) else { break };
                trace_packet("tx", &buf[..t.len]);
                self.emit(now, t, &buf[..t.len], id);
                sent += 1;
                if sent == 256 {
                    break;
                }
            }
            self.flush();
            self.buf = buf;
            let mut moved = 0;
            let addr = self.addr();
            while let Some((sport, data, dst)) = self.loopback.pop_front() {
                self.io.loopback += 1;
                let meta = RecvMeta { src: addr, src_port: sport, ip_id: None, dst };
                if loopback_icrc {
                    self.dev.handle_packet(now, meta, &data);
                } else {
                    self.dev.handle_internal_packet(now, meta, &data);
                }
                moved += 1;
            }
            if sent == 0 && moved == 0 && ring_work == 0 {
                break;
            }
        }
        // ... and before their completions are seen.
        self.dev.memory().flush();
        self.fill_cq_rings();
        self.route_events();
        let now = self.now();
        self.cm.route(&mut self.dev, now, &self.name);
        if self.publisher.is_some() {
            self.publish(false);
        }
    }

    /// A provider's report to its daemon (`Request::Publish`): the packets captured since the
    /// last one, at once; its counters when they changed and [`PUBLISH_INTERVAL_MS`] passed
    /// (the progress thread pumps at least that often), or with `force`.
    fn publish(&mut self, force: bool) {
        let Some(p) = self.publisher.clone() else { return };
        let captured = match &mut self.tap {
            Some(Capture::Remote { out, .. }) => std::mem::take(out),
            _ => Vec::new(),
        };
        let due = self.last_publish.elapsed() >= std::time::Duration::from_millis(PUBLISH_INTERVAL_MS);
        if !force && captured.is_empty() && !due {
            return;
        }
        let totals = (*self.dev.counters(), self.io_stats(), self.dev.next_qpn());
        if captured.is_empty() && self.published == Some(totals) {
            return;
        }
        self.last_publish = std::time::Instant::now();
        self.published = Some(totals);
        (p.0)(Published { counters: totals.0, io: totals.1, captured, next_qpn: totals.2 });
    }

    /// The device's counters as `softrdma stat` shows them: its own engine's and device layer's
    /// plus what its providers reported (the live ones' last reports and the departed ones').
    fn totals(&mut self) -> (Counters, IoStats) {
        let (mut c, mut io) = (*self.dev.counters(), self.io_stats());
        io.daemon_udp_rcvd = io.udp_rcvd;
        io.providers = self.clients.values().filter(|c| c.steer.is_some()).count() as u64;
        let (dc, dio) = self.departed;
        c += dc;
        io += dio;
        for (pc, pio) in self.clients.values().filter_map(|c| c.published) {
            c += pc;
            io += pio;
        }
        (c, io)
    }

    /// A packet the engine wrote, its ICRC computed for IPv4 ID `icrc_id`: through the fault
    /// injector (dropped, duplicated, delayed, corrupted) to `deliver`.
    fn emit(&mut self, now: Instant, t: Transmit, data: &[u8], icrc_id: u16) {
        let mut copies = std::mem::take(&mut self.copies);
        // The engine wrote the BTH first (the sampler reads its opcode for `ack_loss`).
        self.faults.decide(now, data, &mut copies);
        for c in &copies {
            if c.at > now {
                self.seq += 1;
                let d = Delayed {
                    at: c.at,
                    seq: self.seq,
                    dst: t.dst,
                    sport: t.src_port,
                    data: data.to_vec(),
                    icrc_id,
                    flip: c.flip_bit,
                };
                self.delayed.push(Reverse(d));
            } else {
                self.deliver(t.dst, t.src_port, data, icrc_id, c.flip_bit);
            }
        }
        self.copies = copies;
    }

    /// Whether internal loopback packets need an ICRC: only where someone can see it (a capture)
    /// or break it (fault injection).
    fn loopback_icrc(&self) -> bool {
        self.tap.is_some() || self.faults.is_active()
    }

    /// Recomputes an IPv4 packet's ICRC for IPv4 ID `to` if it was computed for `from`.
    fn fix_icrc(&self, dst: IpAddr, sport: u16, seg: &mut [u8], from: u16, to: u16) {
        if from == to || !matches!((self.addr(), dst), (IpAddr::V4(_), IpAddr::V4(_))) || seg.len() < icrc::LEN {
            return;
        }
        let (hdr, n) = ip_udp_header(self.addr(), dst, sport, seg.len(), to);
        if let Ok(crc) = icrc::roce_v2_parts(&hdr[..n], &seg[..seg.len() - icrc::LEN]) {
            IbPacket::new_unchecked(seg).set_icrc(crc);
        }
    }

    /// One packet onto the wire, or through internal loopback when it is for this device
    /// (a NIC loops back traffic between its own QPs; so do we, still through engine and tap).
    /// Its ICRC is for IPv4 ID `icrc_id`; `flip` is a bit the fault injector corrupts after the
    /// ICRC is made right for the ID the packet carries, so that the corruption stays detectable.
    fn deliver(&mut self, dst: IpAddr, sport: u16, data: &[u8], icrc_id: u16, flip: Option<usize>) {
        let addr = self.addr();
        let mcast = dst.is_multicast();
        // On a steered port, a QP of this address may live in another process: through the
        // port (which steers it) unless this engine runs it.
        let local = dst == addr && softrdma_transport::steer::dest_qpn(data).is_none_or(|q| self.dev.owns_qpn(q));
        if !local {
            self.wire(dst, sport, data, icrc_id, flip);
        }
        if local || mcast {
            // Internal loopback carries IPv4 ID 0.
            let mut d = data.to_vec();
            if self.loopback_icrc() {
                self.fix_icrc(dst, sport, &mut d, icrc_id, 0);
            }
            flip_bit(&mut d, flip);
            if local {
                self.capture(dst, sport, &d, 0);
            }
            self.loopback.push_back((sport, d, mcast.then_some(dst)));
        }
    }

    /// Writes a packet to the capture as it went out, with the IPv4 ID it carried.
    fn capture(&mut self, dst: IpAddr, sport: u16, data: &[u8], ip_id: u16) {
        let addr = self.addr();
        if let Some(tap) = self.tap.as_mut() {
            let _ = tap.write(self.epoch.elapsed().as_nanos() as u64, addr, dst, sport, data, Some(ip_id));
        }
    }

    /// One packet for the UDP socket. With GSO, consecutive packets to the same destination and
    /// from the same source port, of one size (the last may be shorter), leave in one send of up
    /// to 64 segments (design D5). Linux numbers the segments' IPv4 IDs 0, 1, 2, ... and the
    /// ICRC covers the ID, so segment k's ICRC is recomputed for ID k.
    fn wire(&mut self, dst: IpAddr, sport: u16, data: &[u8], icrc_id: u16, flip: Option<usize>) {
        if !self.gso.enabled {
            let mut fixed;
            let mut data = data;
            if icrc_id != 0 || flip.is_some() {
                fixed = data.to_vec();
                self.fix_icrc(dst, sport, &mut fixed, icrc_id, 0);
                flip_bit(&mut fixed, flip);
                data = &fixed;
            }
            self.capture(dst, sport, data, 0);
            match self.udp.send(dst, sport, data) {
                Ok(()) => self.io.udp_sent += 1,
                Err(_) => self.io.send_errors += 1,
            }
            return;
        }
        let b = &self.gso;
        // One destination QP per GSO send: a receiver's steered port picks the socket for the
        // whole run by its first segment.
        let dqpn = softrdma_transport::steer::dest_qpn(data).unwrap_or(u32::MAX);
        let fits = b.n > 0
            && b.dst == dst
            && b.dqpn == dqpn
            && b.sport == sport
            && !b.closed
            && data.len() <= b.seg
            && b.n < MAX_GSO_SEGMENTS
            && b.buf.len() + data.len() <= udp::MAX_GSO_BYTES;
        if !fits {
            self.flush();
            let b = &mut self.gso;
            b.dst = dst;
            b.dqpn = dqpn;
            b.sport = sport;
            b.seg = data.len();
            b.closed = false;
        }
        let k = self.gso.n as u16;
        let start = self.gso.buf.len();
        let mut buf = std::mem::take(&mut self.gso.buf);
        buf.extend_from_slice(data);
        self.fix_icrc(dst, sport, &mut buf[start..], icrc_id, k);
        flip_bit(&mut buf[start..], flip);
        self.capture(dst, sport, &buf[start..], k);
        self.gso.buf = buf;
        self.gso.n += 1;
        // A shorter segment can only be the last of a GSO send.
        self.gso.closed = data.len() < self.gso.seg;
    }

    /// Sends the GSO batch being built, if any.
    fn flush(&mut self) {
        let b = &mut self.gso;
        if b.n == 0 {
            return;
        }
        let r = if b.n == 1 {
            self.udp.send(b.dst, b.sport, &b.buf)
        } else {
            self.udp.send_segments(b.dst, b.sport, &b.buf, b.seg)
        };
        match r {
            Ok(()) => self.io.udp_sent += b.n as u64,
            Err(_) => self.io.send_errors += b.n as u64,
        }
        b.n = 0;
        b.buf.clear();
    }

    /// Async events to their owners; completion channel events for armed CQs.
    fn route_events(&mut self) {
        while let Some(e) = self.dev.poll_event() {
            let owner = match e {
                AsyncEvent::CqErr(c) => self.owner_of(|o| o.cqs.contains(&c)),
                AsyncEvent::SrqLimitReached(s) => self.owner_of(|o| o.srqs.contains(&s)),
                _ => event_qp(e).and_then(|q| self.owner_of(|o| o.qps.contains(&q))),
            };
            if let Some(c) = owner.and_then(|o| self.clients.get_mut(&o)) {
                c.events.push_back(ClientEvent { event: e, handle: None });
                let _ = c.event_fd.write(1);
            } else if let Some(q) = event_qp(e).filter(|q| self.dev.is_unowned_tgt_qp(*q)) {
                // A receive QP the device owns (the seed's ibv_alloc_xrc_rcv_qp): nobody to
                // deliver to, so its events go to the device's log, as the kernel's went to
                // /var/log/messages.
                tracing::warn!(qpn = q.value(), event = ?e, "async event of a device-owned XRC receive QP");
            }
        }
        while let Some(h) = self.dev.poll_handle_event() {
            if let Some(c) = self.clients.get_mut(&h.owner) {
                c.events.push_back(ClientEvent { event: h.event, handle: Some(h.handle) });
                let _ = c.event_fd.write(1);
            }
        }
        let mut fired = Vec::new();
        for (cq, w) in self.cqs.iter_mut() {
            let Some(n) = self.dev.cq_counts(*cq) else { continue };
            let now = if w.solicited_only { n.solicited } else { n.added };
            if w.armed && now > w.seen {
                w.armed = false;
                if let Some(ch) = w.channel {
                    fired.push((ch, *cq));
                }
            }
        }
        for (ch, cq) in fired {
            if let Some(c) = self.channels.get_mut(&ch) {
                c.events.push_back(cq);
                let _ = c.fd.write(1);
            }
        }
    }

    /// `rdma_join_multicast_ex` on a RoCEv2 port (cma_iboe_join_multicast): a UD ID bound or
    /// resolved, an IPv4 group; the device takes part in the group (IP membership for a full
    /// member) and the ID hears RDMA_CM_EVENT_MULTICAST_JOIN with the group's QPN 0xFFFFFF and
    /// the port space's Q_Key.
    fn mcast_join(&mut self, owner: u32, id: u32, group: IpAddr, send_only: bool, user: u64) -> Response {
        if self.cm.owner_of(id) != Some(owner) {
            return Response::CmErr(libc::ENOENT);
        }
        let ok_state = self.dev.cm_ref().ids().into_iter().any(|i| {
            i.id == id && i.qp_type == QpType::Ud && i.state == softrdma_engine::cm::IdState::Idle && i.local.is_some()
        });
        if !ok_state {
            return Response::CmErr(libc::EINVAL);
        }
        let (iface, port) = (self.addr(), self.udp.port());
        if let Err(e) = self.groups.join(owner, id, group, send_only, iface, port) {
            return Response::CmErr(e);
        }
        let rec = crate::proto::CmRecord {
            device: String::new(),
            id: 0,
            user: 0,
            listen_user: 0,
            event: MULTICAST_JOIN,
            status: 0,
            param: softrdma_engine::cm::ConnParam {
                qp_num: Qpn::MULTICAST.value(),
                qkey: softrdma_engine::cm::RDMA_UDP_QKEY,
                ..Default::default()
            },
            local: None,
            remote: Some(std::net::SocketAddr::new(group, 0)),
            route: None,
        };
        let name = self.name.clone();
        self.cm.push(&self.dev, &name, id, rec, user);
        Response::Ok
    }

    /// Group datagrams the member sockets hold, into the engine as from the wire.
    fn receive_groups(&mut self) -> usize {
        let now = self.now();
        let addr = self.addr();
        let mut buf = std::mem::take(&mut self.buf);
        if buf.len() < 65536 {
            buf.resize(65536, 0);
        }
        let State { groups, dev, tap, io, epoch, .. } = self;
        let n = groups.receive(&mut buf, 64, &mut |from, g, data| {
            // Our own sends come back through the kernel's multicast loopback; the device
            // already delivered them internally.
            if from.ip() == addr {
                return;
            }
            io.udp_rcvd += 1;
            let dst = IpAddr::V4(g);
            if let Some(t) = tap.as_mut() {
                let _ = t.write(epoch.elapsed().as_nanos() as u64, from.ip(), dst, from.port(), data, None);
            }
            let meta = RecvMeta { src: from.ip(), src_port: from.port(), ip_id: None, dst: Some(dst) };
            trace_packet("rx", data);
            dev.handle_packet(now, meta, data);
        });
        self.buf = buf;
        n
    }

    fn owner_of(&self, f: impl Fn(&Objects) -> bool) -> Option<u32> {
        self.clients.iter().find(|(_, c)| f(&c.objects)).map(|(o, _)| *o)
    }

    fn objs(&mut self, owner: u32) -> &mut Objects {
        &mut self.clients.get_mut(&owner).expect("caller checked the client").objects
    }

    fn call(&mut self, owner: u32, req: Request, fds: Vec<OwnedFd>) -> (Response, Vec<OutFd>) {
        match req {
            Request::CmJoin { id, group, send_only, user } => {
                return (self.mcast_join(owner, id, group, send_only, user), Vec::new());
            }
            Request::CmLeave { id, group } => {
                if self.cm.owner_of(id) != Some(owner) {
                    return (Response::CmErr(libc::ENOENT), Vec::new());
                }
                let r = match self.groups.leave(owner, id, group) {
                    Ok(()) => Response::Ok,
                    Err(e) => Response::CmErr(e),
                };
                return (r, Vec::new());
            }
            Request::CmDestroyId(id) => {
                // rdma_destroy_id leaves the ID's groups (cma_leave_mc_groups).
                self.groups.drop_where(|o, i| o == owner && i == id);
            }
            _ => {}
        }
        if crate::cm::CmDesk::handles(&req) {
            let now = self.now();
            return (self.cm.call(&mut self.dev, now, owner, req, fds), Vec::new());
        }
        self.dev.memory().forget_read_ahead();
        match self.call_inner(owner, req, fds) {
            Ok(r) => r,
            Err(e) => (Response::Err(e), Vec::new()),
        }
    }

    fn call_inner(
        &mut self,
        owner: u32,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> Result<(Response, Vec<OutFd>), VerbsError> {
        use Response as R;
        let ok = |r: Response| Ok((r, Vec::new()));
        let o = owner;
        // Every object a call names must be the caller's (a client never reaches another's).
        macro_rules! mine {
            ($set:ident, $k:expr) => {
                if !self.objs(o).$set.contains(&$k) {
                    return Err(VerbsError::Inval);
                }
            };
        }
        match req {
            Request::Hello { .. } => Err(VerbsError::Inval),
            Request::AllocPd => {
                let pd = self.dev.alloc_pd(o);
                // The device's own region over the client's staging area, in this PD, so
                // staged receives pass the engine's lkey checks; local write only (no rkey use).
                let keys = self.dev.reg_mr(pd, STAGE_VA, STAGING_LEN as u64, Access::LOCAL_WRITE)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.stage_mrs.insert(pd, keys.lkey);
                c.objects.pds.insert(pd);
                ok(R::Pd(pd))
            }
            Request::DeallocPd(pd) => {
                mine!(pds, pd);
                let lkey = self.clients.get(&o).and_then(|c| c.stage_mrs.get(&pd).copied());
                if let Some(l) = lkey {
                    self.dev.dereg_mr(l)?;
                }
                if let Err(e) = self.dev.dealloc_pd(pd) {
                    // Still in use: give it its staging region back.
                    if let Ok(k) = self.dev.reg_mr(pd, STAGE_VA, STAGING_LEN as u64, Access::LOCAL_WRITE) {
                        self.clients.get_mut(&o).expect("checked").stage_mrs.insert(pd, k.lkey);
                    }
                    return Err(e);
                }
                let c = self.clients.get_mut(&o).expect("checked");
                c.stage_mrs.remove(&pd);
                c.objects.pds.remove(&pd);
                ok(R::Ok)
            }
            Request::RegMr { pd, addr, len, access } => {
                mine!(pds, pd);
                if len == 0 {
                    return Err(VerbsError::Inval);
                }
                let pid = self.pid_of(o);
                // The kernel pins the pages (writable when the MR may be written): EFAULT if
                // the process does not have them.
                let write = access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
                if !range_mapped(pid, addr, len, write) {
                    return Err(VerbsError::Fault);
                }
                let keys = self.dev.reg_mr(pd, addr, len, access)?;
                self.objs(o).mrs.insert(keys.lkey);
                ok(R::Mr(keys))
            }
            Request::DeregMr(lkey) => {
                mine!(mrs, lkey);
                if let Some(c) = self.clients.get_mut(&o) {
                    unstage_lkey(&mut self.dev, c, lkey);
                }
                self.dev.dereg_mr(lkey)?;
                self.objs(o).mrs.remove(&lkey);
                ok(R::Ok)
            }
            Request::ReregMr { lkey, pd, range, access } => {
                mine!(mrs, lkey);
                if let Some(p) = pd {
                    mine!(pds, p);
                }
                if let Some((addr, len)) = range {
                    let acc = access.unwrap_or(Access::LOCAL_WRITE);
                    let write = acc.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
                    if len == 0 {
                        return Err(VerbsError::Inval);
                    }
                    if !range_mapped(self.pid_of(o), addr, len, write) {
                        return Err(VerbsError::Fault);
                    }
                }
                if let Some(c) = self.clients.get_mut(&o) {
                    unstage_lkey(&mut self.dev, c, lkey);
                }
                self.dev.rereg_mr(lkey, pd, range, access)?;
                ok(R::Ok)
            }
            Request::AllocMw { pd, mw_type } => {
                mine!(pds, pd);
                let rkey = self.dev.alloc_mw(pd, mw_type)?;
                self.objs(o).mws.insert(rkey >> 8);
                ok(R::Mw(rkey))
            }
            Request::DeallocMw(rkey) => {
                mine!(mws, rkey >> 8);
                self.dev.dealloc_mw(rkey)?;
                self.objs(o).mws.remove(&(rkey >> 8));
                ok(R::Ok)
            }
            Request::CreateCompChannel => {
                let fd = Arc::new(eventfd().map_err(|_| VerbsError::NoMem)?);
                let id = self.next_channel;
                self.next_channel += 1;
                self.channels.insert(id, Channel { fd: fd.clone(), events: VecDeque::new() });
                self.objs(o).channels.insert(id);
                Ok((R::Channel(id), vec![fd]))
            }
            Request::DestroyCompChannel(id) => {
                mine!(channels, id);
                if self.cqs.values().any(|w| w.channel == Some(id)) {
                    return Err(VerbsError::Busy);
                }
                self.channels.remove(&id);
                self.objs(o).channels.remove(&id);
                ok(R::Ok)
            }
            Request::CreateCq { cqe, channel } => {
                if let Some(ch) = channel {
                    mine!(channels, ch);
                }
                let cq = self.dev.create_cq(cqe)?;
                let c = self.clients.get_mut(&o).expect("checked");
                let Some(ring) = c.alloc.ring(cqe, CQE_SLOT) else {
                    let _ = self.dev.destroy_cq(cq);
                    return Err(VerbsError::NoMem);
                };
                c.arena.reset(&ring);
                c.cq_rings.insert(cq, ring);
                c.objects.cqs.insert(cq);
                self.cqs.insert(cq, CqWatch { channel, armed: false, solicited_only: false, seen: 0 });
                ok(R::Cq { cq, ring })
            }
            Request::ResizeCq { cq, cqe, unpolled } => {
                mine!(cqs, cq);
                // Work the client posted before this call is carried out first, so that its
                // completions count against the new size (ibv_resize_cq(3): EINVAL when the CQ
                // holds more than `cqe`), as on hardware, where the WQEs posted microseconds
                // before are long done; otherwise whether the resize fails would depend on when
                // this thread last looked at the rings.
                self.pump();
                let c = self.clients.get_mut(&o).expect("checked");
                let old = *c.cq_rings.get(&cq).ok_or(VerbsError::Inval)?;
                // What sits in the old ring moves to the new one (the client holds the CQ while
                // it waits for this answer, so nobody consumes the old ring meanwhile).
                let mut moved: Vec<CqEntry> = Vec::new();
                c.arena.consume::<CqEntry>(&old, usize::MAX, |e| {
                    moved.extend(e);
                    true
                });
                let undo = |c: &mut Client, moved: &[CqEntry]| {
                    for e in moved {
                        let _ = c.arena.produce(&old, e);
                    }
                };
                if let Err(e) = self.dev.resize_cq(cq, cqe, moved.len() + unpolled as usize) {
                    undo(c, &moved);
                    return Err(e);
                }
                let Some(ring) = c.alloc.ring(cqe, CQE_SLOT) else {
                    undo(c, &moved);
                    return Err(VerbsError::NoMem);
                };
                c.arena.reset(&ring);
                for e in &moved {
                    let _ = c.arena.produce(&ring, e);
                }
                c.alloc.release(&old);
                c.cq_rings.insert(cq, ring);
                ok(R::Cq { cq, ring })
            }
            Request::DestroyCq(cq) => {
                mine!(cqs, cq);
                self.dev.destroy_cq(cq)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.objects.cqs.remove(&cq);
                if let Some(r) = c.cq_rings.remove(&cq) {
                    c.give_back(&r);
                }
                if let Some(w) = self.cqs.remove(&cq) {
                    // Events of the CQ still queued on its channel go with it.
                    if let Some(ch) = w.channel.and_then(|c| self.channels.get_mut(&c)) {
                        ch.events.retain(|c| *c != cq);
                    }
                }
                ok(R::Ok)
            }
            Request::ReqNotifyCq { cq, solicited_only } => {
                mine!(cqs, cq);
                let n = self.dev.cq_counts(cq).ok_or(VerbsError::Inval)?;
                let w = self.cqs.get_mut(&cq).ok_or(VerbsError::Inval)?;
                if w.channel.is_none() {
                    return Err(VerbsError::Inval);
                }
                // IBTA 11.4.2.2 / ibv_req_notify_cq(3): the next completion, or with
                // solicited_only the next solicited receive or unsuccessful completion.
                w.armed = true;
                w.solicited_only = solicited_only;
                w.seen = if solicited_only { n.solicited } else { n.added };
                ok(R::Ok)
            }
            Request::GetCqEvent(ch) => {
                mine!(channels, ch);
                let c = self.channels.get_mut(&ch).ok_or(VerbsError::Inval)?;
                ok(R::CqEvent(c.events.pop_front()))
            }
            Request::CreateQp(init) => {
                mine!(pds, init.pd);
                mine!(cqs, init.send_cq);
                if init.qp_type != QpType::XrcIni {
                    mine!(cqs, init.recv_cq);
                }
                if let Some(s) = init.srq {
                    mine!(srqs, s);
                }
                if init.qp_type == QpType::XrcTgt {
                    // Target QPs are made in a domain (CreateXrcTgtQp), not in a PD.
                    return Err(VerbsError::Inval);
                }
                let qpn = self.dev.create_qp(init)?;
                let c = self.clients.get_mut(&o).expect("checked");
                let sq = c.alloc.ring(init.caps.max_send_wr, WQE_SLOT);
                let rq = if init.srq.is_none() && init.qp_type != QpType::XrcIni {
                    c.alloc.ring(init.caps.max_recv_wr, WQE_SLOT).map(Some)
                } else {
                    Some(None)
                };
                let (Some(sq), Some(rq)) = (sq, rq) else {
                    sq.inspect(|r| c.alloc.release(r));
                    rq.flatten().inspect(|r| c.alloc.release(r));
                    let _ = self.dev.destroy_qp(qpn);
                    return Err(VerbsError::NoMem);
                };
                c.arena.reset(&sq);
                c.sq.insert(qpn, sq);
                if let Some(r) = rq {
                    c.arena.reset(&r);
                    c.rq.insert(qpn, r);
                }
                c.objects.qps.insert(qpn);
                c.qp_pd.insert(qpn, init.pd);
                ok(R::Qp { qpn, sq: Some(sq), rq })
            }
            Request::DestroyQp(qpn) => {
                mine!(qps, qpn);
                self.dev.destroy_qp(qpn)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.objects.qps.remove(&qpn);
                c.objects.mcast.retain(|(q, _)| *q != qpn);
                for r in [c.sq.remove(&qpn), c.rq.remove(&qpn)].into_iter().flatten() {
                    c.give_back(&r);
                }
                ok(R::Ok)
            }
            Request::ModifyQp { qpn, attr, mask } => {
                self.check_qp(o, qpn)?;
                self.dev.modify_qp(qpn, &attr, mask)?;
                ok(R::Ok)
            }
            Request::QueryQp(qpn) => {
                self.check_qp(o, qpn)?;
                let (s, a) = self.dev.query_qp(qpn)?;
                ok(R::QpAttr(s, a))
            }
            Request::CreateSrq { pd, attr } => {
                mine!(pds, pd);
                let s = self.dev.create_srq(pd, attr)?;
                self.clients.get_mut(&o).expect("checked").srq_pd.insert(s, pd);
                self.srq_ring(o, s, attr.max_wr)
            }
            Request::CreateXrcSrq { xrcd, pd, cq, attr } => {
                mine!(pds, pd);
                mine!(cqs, cq);
                if !self.objs(o).xrcds.contains(&xrcd) {
                    return Err(VerbsError::Inval);
                }
                let s = self.dev.create_xrc_srq(xrcd, pd, cq, attr)?;
                self.clients.get_mut(&o).expect("checked").srq_pd.insert(s, pd);
                self.srq_ring(o, s, attr.max_wr)
            }
            Request::ModifySrq { srqn, limit } => {
                mine!(srqs, srqn);
                self.dev.modify_srq_limit(srqn, limit)?;
                ok(R::Ok)
            }
            Request::QuerySrq(srqn) => {
                mine!(srqs, srqn);
                let (a, n) = self.dev.query_srq(srqn)?;
                ok(R::SrqAttr(a, n as u32))
            }
            Request::DestroySrq(srqn) => {
                mine!(srqs, srqn);
                self.dev.destroy_srq(srqn)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.objects.srqs.remove(&srqn);
                if let Some(r) = c.srq_rings.remove(&srqn) {
                    c.give_back(&r);
                }
                ok(R::Ok)
            }
            Request::OpenXrcd { create, exclusive } => {
                let file = fds.into_iter().next().map(File::from);
                let key = match &file {
                    Some(f) => {
                        let md = f.metadata().map_err(|_| VerbsError::Inval)?;
                        Some((md.dev(), md.ino()))
                    }
                    None => None,
                };
                // The identity is the file's (st_dev, st_ino); the device keeps the file open
                // while the domain lives, so the inode number cannot be reused meanwhile.
                let identity = key.map(|(d, i)| d.rotate_left(32) ^ i);
                let x = self.dev.open_xrcd(o, identity, create, exclusive)?;
                if let (Some(k), Some(f)) = (key, file) {
                    self.xrcd_files.entry(k).or_insert(f);
                }
                self.objs(o).xrcds.push(x);
                ok(R::Xrcd(x))
            }
            Request::CloseXrcd(x) => {
                let i = self.objs(o).xrcds.iter().position(|y| *y == x).ok_or(VerbsError::Inval)?;
                self.dev.close_xrcd(o, x)?;
                self.objs(o).xrcds.remove(i);
                self.reap_xrcd_files();
                ok(R::Ok)
            }
            Request::CreateXrcTgtQp(x) => {
                if !self.objs(o).xrcds.contains(&x) {
                    return Err(VerbsError::Inval);
                }
                let (qpn, h) = self.dev.create_xrc_tgt_qp(o, x)?;
                self.objs(o).handles.insert((qpn, h));
                ok(R::QpHandle(qpn, h))
            }
            Request::CreateXrcRcvQp { xrcd, lifetime } => {
                if !self.objs(o).xrcds.contains(&xrcd) {
                    return Err(VerbsError::Inval);
                }
                let (qpn, h) = self.dev.create_xrc_tgt_qp_with(o, xrcd, Some(lifetime))?;
                self.objs(o).handles.insert((qpn, h));
                ok(R::QpHandle(qpn, h))
            }
            Request::ReleaseQpHandle { qpn, handle } => {
                if !self.objs(o).handles.contains(&(qpn, handle)) {
                    return Err(VerbsError::Inval);
                }
                self.dev.release_qp_handle(qpn, handle)?;
                self.objs(o).handles.remove(&(qpn, handle));
                ok(R::Ok)
            }
            Request::OpenQp { xrcd, qpn } => {
                if !self.objs(o).xrcds.contains(&xrcd) {
                    return Err(VerbsError::Inval);
                }
                let h = self.dev.open_qp(o, xrcd, qpn)?;
                self.objs(o).handles.insert((qpn, h));
                ok(R::QpHandle(qpn, h))
            }
            Request::DestroyQpHandle { qpn, handle } => {
                if !self.objs(o).handles.contains(&(qpn, handle)) {
                    return Err(VerbsError::Inval);
                }
                self.dev.destroy_qp_handle(qpn, handle)?;
                self.objs(o).handles.remove(&(qpn, handle));
                ok(R::Ok)
            }
            Request::AttachMcast { qpn, group } => {
                mine!(qps, qpn);
                self.dev.attach_mcast(qpn, group)?;
                self.objs(o).mcast.insert((qpn, group));
                ok(R::Ok)
            }
            Request::DetachMcast { qpn, group } => {
                mine!(qps, qpn);
                self.dev.detach_mcast(qpn, group)?;
                self.objs(o).mcast.remove(&(qpn, group));
                ok(R::Ok)
            }
            Request::GetAsyncEvent => {
                let c = self.clients.get_mut(&o).expect("checked");
                ok(R::Event(c.events.pop_front()))
            }
            Request::Stats => {
                let (c, io) = self.totals();
                ok(R::Stats(c, io))
            }
            Request::Publish(p) => {
                let c = self.clients.get_mut(&o).expect("checked");
                // Only a provider runs QPs of its own to report on.
                if c.steer.is_none() {
                    return Err(VerbsError::Inval);
                }
                c.published = Some((p.counters, p.io));
                c.next_qpn = Some(p.next_qpn);
                // Its packets go into the device's capture in the order it saw them (a capture
                // that has stopped meanwhile takes none).
                let epoch_mono_ns = self.epoch_mono_ns;
                if let Some(Capture::File(tap)) = self.tap.as_mut() {
                    for k in &p.captured {
                        let t = k.mono_ns.saturating_sub(epoch_mono_ns);
                        let _ = tap.write(t, k.src, k.dst, k.sport, &k.payload, k.ip_id);
                    }
                }
                ok(R::Ok)
            }
            Request::McastGroups => ok(R::McastGroups(self.groups.info())),
            Request::BlockSelfMcastLb(qpn) => {
                mine!(qps, qpn);
                self.dev.set_block_self_mcast_lb(qpn)?;
                ok(R::Ok)
            }
            Request::JoinSteering => {
                let State { udp, dev, clients, .. } = self;
                // An unsteered port (the kernel refused the group): the client stays on the
                // device path.
                let steering = udp.steering_mut().ok_or(VerbsError::NotSupp)?;
                let c = clients.get_mut(&o).expect("checked");
                if c.steer.is_some() {
                    return Err(VerbsError::Inval);
                }
                let m = steering.add_member().map_err(|_| VerbsError::NoMem)?;
                let block = match steering.assign_block(m.index, |b| dev.reserve_qpn_block(b)) {
                    Ok(Some(b)) => b,
                    _ => {
                        let _ = steering.release(m.index);
                        return Err(VerbsError::NoMem);
                    }
                };
                c.steer = Some(m.index);
                // Start where the block's last holder stopped; until this one reports (or if it
                // never does: killed at once), its successor starts a stride further on.
                const STRIDE: u32 = 256;
                let mask = (1u32 << softrdma_engine::device::QPN_BLOCK_SHIFT) - 1;
                let off = self.qpn_cursor.get(&block).copied().unwrap_or(0) & mask;
                self.qpn_cursor.insert(block, (off + STRIDE) & mask);
                let first_qpn = (block << softrdma_engine::device::QPN_BLOCK_SHIFT) | off;
                let fd: OutFd = Arc::new(m.fd);
                // The provider applies the device's settings to its QPs as this device does.
                let settings = Box::new(ProviderSettings {
                    faults: self.faults.faults().to_string(),
                    behaviour: dev.config().behaviour,
                    icrc: dev.config().icrc,
                    max_cqe: dev.config().limits.max_cqe,
                    capture: self.tap.is_some(),
                });
                Ok((R::Steering { index: m.index, blocks: vec![block], settings, first_qpn }, vec![fd]))
            }
            // Routed to the CM in `call` before this match.
            _ => Err(VerbsError::Inval),
        }
    }

    fn io_stats(&mut self) -> IoStats {
        let f = self.faults.counts;
        IoStats {
            udp_sent: self.io.udp_sent,
            udp_rcvd: self.io.udp_rcvd,
            loopback: self.io.loopback,
            send_errors: self.io.send_errors,
            dropped_by_fault: f.dropped,
            duplicated_by_fault: f.duplicated,
            reordered_by_fault: f.reordered,
            corrupted_by_fault: f.corrupted,
            memory_faults: self.dev.memory().faults,
            memory_reads: self.dev.memory().reads,
            memory_writes: self.dev.memory().writes,
            memory_helper_ops: self.dev.memory().helper_ops,
            // The asking client does not count itself.
            clients: self.clients.len().saturating_sub(1) as u64,
            // Set by `totals` for `softrdma stat`.
            providers: 0,
            daemon_udp_rcvd: 0,
        }
    }

    /// Sets every client's doorbell suppression flag.
    fn set_polling(&self, on: bool) {
        for c in self.clients.values() {
            c.arena.polling().store(u32::from(on), Ordering::SeqCst);
        }
    }

    /// Gives a new SRQ its ring (or destroys it again when the arena is full).
    fn srq_ring(&mut self, o: u32, srqn: u32, max_wr: u32) -> Result<(Response, Vec<OutFd>), VerbsError> {
        let c = self.clients.get_mut(&o).expect("checked");
        let Some(ring) = c.alloc.ring(max_wr, WQE_SLOT) else {
            let _ = self.dev.destroy_srq(srqn);
            return Err(VerbsError::NoMem);
        };
        c.arena.reset(&ring);
        c.srq_rings.insert(srqn, ring);
        c.objects.srqs.insert(srqn);
        Ok((Response::Srq { srqn, ring }, Vec::new()))
    }

    /// Moves work the clients posted on their rings into the engine, receive queues first (so a
    /// SEND posted together with its peer's receive finds it). A WQE is copied out of shared
    /// memory before it is decoded and checked; a full engine queue leaves the rest in the ring
    /// for later (backpressure). Returns how many WQEs moved.
    fn service_rings(&mut self) -> usize {
        let State { clients, dev, io, .. } = self;
        let mut moved = 0;
        let mut misbehaving = Vec::new();
        for (&owner, c) in clients.iter_mut() {
            let mut bad = false;
            // Staging space the client has scattered from and given back.
            if c.arena.pending(&c.release) > 0 {
                let Client { arena, release, staging, .. } = &mut *c;
                arena.consume::<(u64, u32)>(release, usize::MAX, |v| match v {
                    Some((off, len))
                        if off as usize >= STAGING_OFF
                            && (off as usize).saturating_add(len as usize) <= STAGING_OFF + STAGING_LEN =>
                    {
                        staging.free(off as usize, len as usize);
                        true
                    }
                    _ => {
                        bad = true;
                        false
                    }
                });
            }
            let posted = c.arena.posted().load(Ordering::Acquire);
            if posted == c.seen_posted && !c.backlog && !bad {
                continue;
            }
            c.seen_posted = posted;
            c.backlog = false;
            let mut backlog = false;
            let Client { arena, rq, srq_rings, sq, staging, staged, stage_mrs, qp_pd, srq_pd, .. } = &mut *c;
            // A receive the client asked to stage gets one SGE over a fresh piece of the staging
            // area instead of its own, once its own SGEs pass the engine's checks (otherwise the
            // engine sees them as they are, and reports what is wrong as it would).
            for (q, r) in rq.iter() {
                moved += drain(arena, r, io, &mut backlog, &mut bad, |e: RecvEntry| {
                    let token = e.wr.wr_id;
                    let wr = redirect(dev, qp_pd.get(q).copied(), e, staging, staged, stage_mrs);
                    dev.post_recv(*q, wr).inspect_err(|_| unstage(staging, staged, token))
                });
            }
            for (s, r) in srq_rings.iter() {
                moved += drain(arena, r, io, &mut backlog, &mut bad, |e: RecvEntry| {
                    let token = e.wr.wr_id;
                    let wr = redirect(dev, srq_pd.get(s).copied(), e, staging, staged, stage_mrs);
                    dev.post_srq_recv(*s, wr).inspect_err(|_| unstage(staging, staged, token))
                });
            }
            for (q, r) in sq.iter() {
                moved +=
                    drain(arena, r, io, &mut backlog, &mut bad, |e: SendEntry| dev.post_send_inline(*q, e.wr, e.data));
            }
            c.backlog = backlog;
            if bad {
                misbehaving.push(owner);
            }
        }
        // A ring entry that does not decode is a malformed message: that client is cut off and
        // its objects destroyed; nobody else notices.
        for owner in misbehaving {
            tracing::warn!(owner, "disconnecting a client that wrote a malformed entry to its rings");
            self.detach(owner);
        }
        if moved > 0 {
            // New requests come after completions their owner saw: it may have refilled buffers.
            self.dev.memory().forget_read_ahead();
        }
        moved
    }

    /// Moves completions from the engine's CQs into the clients' completion rings, as far as
    /// the rings have room (what does not fit waits in the engine's CQ, which overflows at its
    /// own capacity).
    fn fill_cq_rings(&mut self) {
        let State { clients, dev, .. } = self;
        for (&owner, c) in clients.iter_mut() {
            let helper_writes = dev.memory_ref().helper_writes(owner);
            for (cq, r) in &c.cq_rings {
                if dev.cq_counts(*cq).is_none_or(|n| n.held == 0) {
                    continue;
                }
                let free = c.arena.free(r) as usize;
                for wc in dev.poll_cq(*cq, free) {
                    // A staged receive's completion says where its data is.
                    let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                    let stage = if recv { c.staged.remove(&wc.wr_id) } else { None };
                    let e = CqEntry { wc, stage: stage.map(|st| (st.off as u64, st.len)), helper_writes };
                    let _ = c.arena.produce(r, &e);
                }
            }
        }
    }

    /// A QP the caller may modify or query: its own, or a target QP it holds a handle on.
    fn check_qp(&mut self, o: u32, qpn: Qpn) -> Result<(), VerbsError> {
        let ob = self.objs(o);
        if ob.qps.contains(&qpn) || ob.handles.iter().any(|(q, _)| *q == qpn) {
            Ok(())
        } else {
            Err(VerbsError::Inval)
        }
    }

    fn pid_of(&mut self, o: u32) -> i32 {
        self.dev.memory().pid_of(o).unwrap_or(-1)
    }

    fn reap_xrcd_files(&mut self) {
        let dev = &self.dev;
        self.xrcd_files.retain(|(d, i), _| dev.xrcd_identity_live(d.rotate_left(32) ^ i));
    }

    fn detach(&mut self, owner: u32) {
        let Some(c) = self.clients.remove(&owner) else { return };
        if let Some((pc, pio)) = c.published {
            self.departed.0 += pc;
            self.departed.1 += pio;
        }
        // Its successor on its blocks starts after its last QPN (plus a margin for QPs it made
        // after its last report).
        if let (Some(n), Some(i), Some(st)) = (c.next_qpn, c.steer, self.udp.steering()) {
            let mask = (1u32 << softrdma_engine::device::QPN_BLOCK_SHIFT) - 1;
            for b in st.blocks_of(i) {
                if b == softrdma_engine::device::qpn_block(n) {
                    self.qpn_cursor.insert(b, (n + 16) & mask);
                }
            }
        }
        // Its blocks of QPNs come back to the device, its member waits for the next client.
        if let (Some(i), Some(st)) = (c.steer, self.udp.steering_mut()) {
            for b in st.blocks_of(i) {
                self.dev.release_qpn_block(b);
            }
            let _ = st.release(i);
        }
        // rdma_cm IDs first, as ucma's close: established connections get their DREQ.
        let now = self.now();
        self.cm.detach(&mut self.dev, now, owner);
        self.groups.drop_where(|o, _| o == owner);
        let ob = c.objects;
        for (q, g) in &ob.mcast {
            let _ = self.dev.detach_mcast(*q, *g);
        }
        for q in &ob.qps {
            let _ = self.dev.destroy_qp(*q);
        }
        // Target QP handles and domain references go (the QPs stay with their domain unless
        // the policy says otherwise).
        self.dev.release_owner(owner);
        for s in &ob.srqs {
            let _ = self.dev.destroy_srq(*s);
        }
        for cq in &ob.cqs {
            let _ = self.dev.destroy_cq(*cq);
            self.cqs.remove(cq);
        }
        for mr in &ob.mrs {
            let _ = self.dev.dereg_mr(*mr);
        }
        for mw in &ob.mws {
            // Any key byte: the engine finds a window by its index.
            let _ = self.dev.dealloc_mw(*mw << 8);
        }
        for lkey in c.stage_mrs.values() {
            let _ = self.dev.dereg_mr(*lkey);
        }
        for pd in &ob.pds {
            let _ = self.dev.dealloc_pd(*pd);
        }
        for ch in &ob.channels {
            self.channels.remove(ch);
        }
        self.dev.memory().detach(owner);
        self.reap_xrcd_files();
    }
}

/// RDMA_CM_EVENT_MULTICAST_JOIN.
const MULTICAST_JOIN: u32 = 12;

/// The QP an affiliated async event names.
fn event_qp(e: AsyncEvent) -> Option<softrdma_engine::wire::Qpn> {
    match e {
        AsyncEvent::CommEst(q)
        | AsyncEvent::SqDrained(q)
        | AsyncEvent::QpFatal(q)
        | AsyncEvent::QpReqErr(q)
        | AsyncEvent::QpAccessErr(q)
        | AsyncEvent::LastWqeReached(q) => Some(q),
        AsyncEvent::CqErr(_) | AsyncEvent::SrqLimitReached(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_engine::device::{QpCaps, QpInit};

    fn call(h: &Hca, o: u32, r: Request) -> Response {
        h.call(o, r, Vec::new()).0
    }

    #[test]
    fn a_malformed_ring_entry_cuts_off_that_client_only() {
        let mut c = HcaConfig::new("mal", "127.0.0.1".parse().unwrap());
        c.port = 47942;
        let h = Hca::start(c).unwrap();
        let me = std::process::id() as i32;
        let (bad, good) = (h.attach(me).unwrap(), h.attach(me).unwrap());
        for o in [bad.owner, good.owner] {
            let Response::Pd(pd) = call(&h, o, Request::AllocPd) else { panic!() };
            let Response::Cq { cq, .. } = call(&h, o, Request::CreateCq { cqe: 8, channel: None }) else { panic!() };
            let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
            let init = QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None };
            let Response::Qp { sq: Some(sq), .. } = call(&h, o, Request::CreateQp(init)) else { panic!() };
            if o == bad.owner {
                let arena = Arena::open(bad.arena.try_clone().unwrap()).unwrap();
                // Not a work request: one byte where a SendEntry should be.
                assert!(arena.produce(&sq, &7u8).unwrap());
                arena.posted().fetch_add(1, Ordering::Release);
                nix::unistd::write(&bad.doorbell, &1u64.to_ne_bytes()).unwrap();
            }
        }
        let t0 = std::time::Instant::now();
        while h.is_attached(bad.owner) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5), "the bad client was not cut off");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(h.is_attached(good.owner));
        assert!(matches!(call(&h, good.owner, Request::AllocPd), Response::Pd(_)));
        assert_eq!(h.counters().1.ring_malformed, 1);
        assert!(matches!(call(&h, bad.owner, Request::AllocPd), Response::Err(VerbsError::Inval)));
    }
}
