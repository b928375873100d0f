//! How a device is set up: [`HcaConfig`], what the code that starts a device chooses, and
//! [`Tuning`], the environment's tuning knobs, read once per process ([`tuning`]). Every knob
//! the device reads is documented once, on its field of [`Tuning`]:
//!
//! | variable | default | field |
//! |---|---|---|
//! | `SOFTRDMA_PROGRESS` | `device` | [`Tuning::progress`] |
//! | `SOFTRDMA_HANDOFF_US` | 200 | [`Tuning::handoff_idle`] |
//! | `SOFTRDMA_HANDOFF_LOOK_MAX_US` | 4000 | [`Tuning::handoff_look_max`] |
//! | `SOFTRDMA_SPIN_US` | 1000 | [`Tuning::spin`] |
//! | `SOFTRDMA_PROGRESS_SPIN_US` | 200 | [`Tuning::progress_spin`] |
//! | `SOFTRDMA_IDLE_LOOK` | 1 | [`Tuning::idle_look`] |
//! | `SOFTRDMA_END_AFTER_POST` | 1 | [`Tuning::end_after_post`] |
//! | `SOFTRDMA_RECV_KEEP` | 1 | [`Tuning::recv_keep`] |
//! | `SOFTRDMA_STREAM_TAKE` | 1 | [`Tuning::stream_take`] |
//! | `SOFTRDMA_SPIN_YIELD` | 1 | [`Tuning::spin_yield`] |
//! | `SOFTRDMA_EVENT_SOCKET` | 1 | [`Tuning::event_socket`] |
//! | `SOFTRDMA_GUARDED_COPY` | 1 | [`Tuning::guarded_copy`] |
//! | `SOFTRDMA_SEND_MANY` | 1 | [`Tuning::send_many`] |
//!
//! All but the first are for measuring one choice against another in one build (BENCHMARKS.md
//! names the runs that used them); a value that does not parse leaves the default. The capture's
//! knobs are read where they act (`SOFTRDMA_CAPTURE_RING_MB` in `capture`, `SOFTRDMA_CAPTURE_DIRECT`
//! in `capture::sink`), as is `SOFTRDMA_MEMORY_HELPER` (`client`).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use softrdma_engine::device::{IcrcPolicy, WireProfile, XrcPolicy};
use softrdma_engine::verbs::Mtu;

use super::progress::{Progress, HANDOFF_IDLE, HANDOFF_LOOK_MAX, IDLE_LOOK_AFTER, PROGRESS_SPIN};
use super::ROCE_PORT;
use crate::faults::Faults;
use crate::proto::Published;

/// How a provider reports to its daemon ([`HcaConfig::publish`]): a call to the daemon, which
/// waits for its answer. The device thread makes it with the device's state unlocked (when
/// the device stops and at exit, with it locked).
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
    /// A provider's link to its daemon: its counters are reported there (`Request::Publish`).
    pub publish: Option<Publisher>,
    /// A provider's capture ring, which its daemon drains into the device's file
    /// (`Request::CaptureRing`), instead of `pcap`.
    pub(crate) capture_ring: Option<Arc<crate::capture::Ring>>,
    /// A provider's key blocks (`Response::Steering`): its engine gives its memory regions and
    /// windows keys from these only (`softrdma_engine::device::KEY_BLOCK_SHIFT`); empty: from
    /// any block not reserved.
    pub key_blocks: Vec<u32>,
    /// Faults injected on transmit.
    pub faults: Faults,
    /// Send sockets for flow entropy (UDP source ports 0xC000.. upward); 0: send from the 4791
    /// socket.
    pub flow_ports: u16,
    /// ICRC check for IPv4 senders: a UDP socket cannot see the sender's IPv4 ID, so the default
    /// accepts a packet whose ICRC holds for some ID (docs/architecture.md D5).
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
    pub behaviour: WireProfile,
    /// Scale of the CM's timers in 1/1000 (1000: the kernel's; tests shorten them).
    pub cm_timer_permille: u32,
    /// How long a looked-up path stays in the path record cache (zero: not cached).
    pub path_cache_ttl: std::time::Duration,
    /// Most entries of one CQ (`max_cqe`); None: rxe's 32767. A CQ's completion ring in the
    /// client's arena takes 128 bytes per entry, so the limit is MAX_CQE_LIMIT.
    pub max_cqe: Option<u32>,
    /// Who moves the device's work: its own thread, or the threads that post and poll.
    pub progress: Progress,
    /// [`Progress::Application`]: how long the socket stays handed off to an application thread
    /// that polled it and then stopped without a completion ([`Tuning::handoff_idle`]; zero: no
    /// handoff, the progress thread always waits on the socket).
    pub handoff_idle: std::time::Duration,
    /// [`Progress::Application`]: after how long without a call of the application (a poll or
    /// a post) its progress thread takes it for one that makes none, and goes on looking after
    /// the work it finds ([`PROGRESS_SPIN`]; [`IDLE_LOOK_AFTER`] by default).
    pub idle_look_after: std::time::Duration,
    /// Make the port a steered `SO_REUSEPORT` group (`softrdma_transport::steer`), so that
    /// clients can run their own QPs on it (`Request::JoinSteering`). The daemon does this;
    /// where the kernel refuses, the device runs unsteered and says so to a client that asks.
    pub steered: bool,
}

impl HcaConfig {
    /// A device `name` on `addr` with the defaults: UDP 4791, MTU from the interface, no capture,
    /// no faults, 8 flow ports, the "some IPv4 ID" ICRC check, one send per packet (no GSO),
    /// progress and the socket's handoff as the environment says ([`Tuning`]).
    pub fn new(name: &str, addr: IpAddr) -> HcaConfig {
        HcaConfig {
            name: name.to_owned(),
            addr,
            port: ROCE_PORT,
            mtu: None,
            pcap: None,
            publish: None,
            capture_ring: None,
            key_blocks: Vec::new(),
            faults: Faults::default(),
            flow_ports: 8,
            icrc: IcrcPolicy::AnyIpv4Id,
            xrc_policy: XrcPolicy::default(),
            seed: None,
            gso: false,
            cm_response_timeout: 20,
            behaviour: WireProfile::RXE,
            cm_timer_permille: 1000,
            path_cache_ttl: crate::paths::DEFAULT_TTL,
            max_cqe: None,
            progress: tuning().progress,
            handoff_idle: tuning().handoff_idle,
            idle_look_after: IDLE_LOOK_AFTER,
            steered: false,
        }
    }
}

/// The environment's tuning knobs (the table above), read once per process by [`tuning`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    /// `SOFTRDMA_PROGRESS`: who moves the devices' work: `application` (the application's
    /// threads, [`Progress::Application`]) or `device` (the default, as is anything else: the
    /// device thread). [`HcaConfig::new`] takes it.
    pub progress: Progress,
    /// `SOFTRDMA_HANDOFF_US`: the default of [`HcaConfig::handoff_idle`] ([`HANDOFF_IDLE`]);
    /// 0 turns the handoff off.
    pub handoff_idle: Duration,
    /// `SOFTRDMA_HANDOFF_LOOK_MAX_US`: the longest a progress thread sleeps between two looks at
    /// a socket handed off to an application thread ([`HANDOFF_LOOK_MAX`]).
    pub handoff_look_max: Duration,
    /// `SOFTRDMA_SPIN_US`: how long the device thread keeps polling the rings and the socket
    /// after the last work it found (1 ms) before it sleeps in poll.
    pub spin: Duration,
    /// `SOFTRDMA_PROGRESS_SPIN_US`: how long a progress thread keeps looking after work it found
    /// while the application sleeps on a completion channel ([`PROGRESS_SPIN`]; 0: it blocks in
    /// poll at once).
    pub progress_spin: Duration,
    /// `SOFTRDMA_IDLE_LOOK=0`: a progress thread does not keep looking after work while the
    /// application makes no call (after [`IDLE_LOOK_AFTER`]).
    pub idle_look: bool,
    /// `SOFTRDMA_END_AFTER_POST=0`: a poll ends the socket's handoff at once instead of leaving
    /// the end for the next send.
    pub end_after_post: bool,
    /// `SOFTRDMA_RECV_KEEP=0`: a stream's receiver does not keep the socket across its polls.
    pub recv_keep: bool,
    /// `SOFTRDMA_STREAM_TAKE=0`: a post that is part of a stream does not take the socket for
    /// the posting thread.
    pub stream_take: bool,
    /// `SOFTRDMA_SPIN_YIELD=0`: the device does not yield the CPU between two looks while it
    /// spins.
    pub spin_yield: bool,
    /// `SOFTRDMA_EVENT_SOCKET=0`: a thread that sleeps on a completion channel of a device the
    /// application drives waits on the channel alone, and the progress thread receives for it
    /// (see `Hca::sleep_on_channel`).
    pub event_socket: bool,
    /// `SOFTRDMA_GUARDED_COPY=0`: a device copies a client's memory with system calls instead of
    /// the guarded copy (`ProcessMemory::set_guarded`), to compare the two.
    pub guarded_copy: bool,
    /// `SOFTRDMA_SEND_MANY=0`: each GSO send of a pump leaves in a `sendmsg` of its own instead
    /// of waiting for the pump's flush, which sends them in one `sendmmsg` per socket.
    pub send_many: bool,
}

impl Tuning {
    fn from_env() -> Tuning {
        fn us(name: &str, default: Duration) -> Duration {
            std::env::var(name).ok().and_then(|v| v.parse().ok()).map_or(default, Duration::from_micros)
        }
        fn on(name: &str) -> bool {
            std::env::var(name).map_or(true, |v| v != "0")
        }
        Tuning {
            progress: match std::env::var("SOFTRDMA_PROGRESS").as_deref() {
                Ok("application") => Progress::Application,
                _ => Progress::DeviceThread,
            },
            handoff_idle: us("SOFTRDMA_HANDOFF_US", HANDOFF_IDLE),
            handoff_look_max: us("SOFTRDMA_HANDOFF_LOOK_MAX_US", HANDOFF_LOOK_MAX),
            spin: us("SOFTRDMA_SPIN_US", Duration::from_millis(1)),
            progress_spin: us("SOFTRDMA_PROGRESS_SPIN_US", PROGRESS_SPIN),
            idle_look: on("SOFTRDMA_IDLE_LOOK"),
            end_after_post: on("SOFTRDMA_END_AFTER_POST"),
            recv_keep: on("SOFTRDMA_RECV_KEEP"),
            stream_take: on("SOFTRDMA_STREAM_TAKE"),
            spin_yield: on("SOFTRDMA_SPIN_YIELD"),
            event_socket: on("SOFTRDMA_EVENT_SOCKET"),
            guarded_copy: on("SOFTRDMA_GUARDED_COPY"),
            send_many: on("SOFTRDMA_SEND_MANY"),
        }
    }
}

/// The process's [`Tuning`], read from the environment the first time it is asked for.
pub(crate) fn tuning() -> &'static Tuning {
    static T: OnceLock<Tuning> = OnceLock::new();
    T.get_or_init(Tuning::from_env)
}
