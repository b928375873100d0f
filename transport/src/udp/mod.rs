//! RoCEv2 over real UDP sockets (docs/architecture.md D5): moves the UDP payloads the engine builds
//! (BTH, extension headers, payload, pad, ICRC) between hosts, batched with UDP GSO and GRO.
//!
//! # Sockets
//!
//! A [`RoceUdp`] owns one *receive socket* bound to `addr:port` (4791 normally) and a *pool* of
//! send sockets bound to `addr:sport_base + i`. The pool exists because the ICRC covers the UDP
//! source port: the engine picks a source port per QP for flow entropy (rxe: `0xC000 | hash(QPN)`),
//! and the packet must leave from exactly that port, which a UDP socket can only do if it is bound
//! to it. One socket per port, bound once, costs a file descriptor each and nothing per packet;
//! the alternatives (a raw socket, or rebinding) need privileges or a syscall per flow change.
//! With `sport_count == 0` there is no pool and everything leaves from the receive socket.
//!
//! Every socket is nonblocking, never connected, and has UDP checksums on (the Linux default;
//! nothing here sets `SO_NO_CHECK`, which GSO would refuse anyway).
//!
//! - IPv4 sockets use `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: DF is set and the kernel never
//!   fragments. That keeps every RoCE packet in one IP datagram, and it fixes the IPv4 ID the
//!   ICRC covers: an *unconnected* socket with DF sends ID 0, and the segments of one GSO send
//!   get IDs 0, 1, 2, ... (measured; `shared/reference/wire/README.md`). A connected socket would
//!   use a running per-socket counter, which a receiver cannot guess; that is why nothing here
//!   connects. IPv6 sockets get `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO` and `IPV6_DONTFRAG` for the
//!   same "one packet, never fragmented" property (IPv6 has no ID in its fixed header).
//! - IPv6 sockets set `IPV6_V6ONLY`, so a device on `::` does not also take the IPv4 port.
//! - The receive socket asks for `IP_PKTINFO`/`IPV6_RECVPKTINFO` (the datagram's destination
//!   address: a multicast group, or which local address was hit), `IP_RECVTTL`/
//!   `IPV6_RECVHOPLIMIT` and `IP_RECVTOS`/`IPV6_RECVTCLASS` (reported with each datagram; the
//!   capture does not use them yet: its rebuilt IP header has TTL 64, docs/architecture.md D8),
//!   and tries 4 MiB receive and send buffers (the kernel caps them at `net.core.rmem_max`/
//!   `wmem_max`; failure is ignored).
//! - `SO_REUSEADDR` is never set, and `SO_REUSEPORT` only for a steered device
//!   ([`UdpConfig::steered`], [`crate::steer`]), after checking with a plain bind that the port is
//!   free: a second device on the same address and port must fail to bind, not silently share
//!   (and steal) the traffic.
//!
//! # Batching
//!
//! [`RoceUdp::send_segments`] sends several equal-size RoCE packets in one `sendmsg` with a
//! `UDP_SEGMENT` control message (UDP GSO): the kernel (or the NIC) cuts the buffer into
//! datagrams, each still one RoCE packet on the wire. Limits: at most [`MAX_GSO_SEGMENTS`] (64)
//! segments, the value of `UDP_MAX_SEGMENTS` on 6.1 kernels (newer ones allow 128), and at most
//! [`MAX_GSO_BYTES`] (65535 - 8 - 20) bytes, because the whole super-packet must fit one IPv4
//! datagram before segmentation. Only the last segment may be shorter. If the kernel rejects GSO at
//! first use (`EIO` from a device that cannot do it, `EINVAL` from a kernel without it), the call
//! is completed one datagram at a time and GSO stays off for this socket set.
//!
//! On receive, `UDP_GRO` lets the kernel hand over a run of same-size datagrams of one flow as
//! one buffer plus the segment size; [`RoceUdp::recv`] cuts it back into datagrams. Independently
//! of GRO, `recvmmsg` reads up to 32 buffers per syscall.
//!
//! Sending never blocks: `ENOBUFS` and `EAGAIN` count the datagrams as dropped
//! ([`RoceUdp::send_drops`]) and report success, because RoCE retransmits and the engine must not
//! wait on the wire.
//!
//! # MTU
//!
//! [`interface_mtu`] finds the MTU of the interface that holds an address, and [`active_mtu`]
//! turns it into the port's active MTU as Linux rxe does.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use nix::sys::socket::{self as nsock, sockopt};
use socket2::{SockAddr, Socket};

mod group;
mod iface;
mod ring;
mod sockets;

pub use self::group::GroupSocket;
pub use self::iface::{active_mtu, interface_mtu, interface_of};
use self::ring::RecvRing;
pub(crate) use self::sockets::{bind_error, configure_receive, new_socket, setup_error};
use self::sockets::{bind_pool, send_gso, send_one};

/// The IANA port of RoCEv2.
pub const ROCE_V2_PORT: u16 = 4791;

/// The first UDP source port rxe uses for flow entropy (`RXE_ROCE_V2_SPORT`); source-port pools
/// stay within `0xC000..=0xFFFF` when they have to move.
pub const SPORT_RANGE_START: u16 = 0xC000;

/// Most segments one [`RoceUdp::send_segments`] call takes: `UDP_MAX_SEGMENTS` of 6.1 kernels
/// (more gets `EINVAL` there). Newer kernels, and stable updates of some older ones, raised it
/// to 128; 64 works everywhere.
pub const MAX_GSO_SEGMENTS: usize = 64;

/// Most bytes one [`RoceUdp::send_segments`] call takes: the largest UDP payload of one IPv4
/// datagram (65535 minus the 20-byte IPv4 and 8-byte UDP headers). GSO builds the super-packet as
/// one datagram before cutting it, so this bounds the sum of the segments, for IPv6 too.
pub const MAX_GSO_BYTES: usize = 65535 - 8 - 20;

/// Most datagrams one [`RoceUdp::recv`] call reads without GRO (see there for GRO).
pub const RECV_BUDGET: usize = 256;

/// Bytes rxe subtracts from the interface MTU before rounding to an IB MTU: `RXE_MAX_HDR_LENGTH`
/// (80) in `drivers/infiniband/sw/rxe/rxe_hdr.h`, room for the IP, UDP and largest IB headers.
pub const ROCE_HEADER_OVERHEAD: u32 = 80;

/// Socket buffer size asked for (the kernel caps it at `net.core.rmem_max`/`wmem_max`).
pub(crate) const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Buffers per `recvmmsg`.
const RECV_BATCH: usize = 32;

/// Bytes per receive buffer: any UDP datagram (at most 65527 bytes of payload) and any GRO run
/// (the kernel keeps a coalesced UDP packet under 64 KiB) fit, so nothing is ever truncated.
const RECV_SLOT: usize = 1 << 16;

/// Control-message bytes per receive buffer: pktinfo (at most 40 with its header), TTL or hop
/// limit, TOS or traffic class and the GRO segment size (24 each), with room to spare.
const CMSG_SLOT: usize = 256;

/// How to set up a [`RoceUdp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpConfig {
    /// The local address (the device's GID address; IPv4 or IPv6). Unspecified (`0.0.0.0`, `::`)
    /// receives on every address, and the kernel then picks each packet's source address.
    pub addr: IpAddr,
    /// The UDP port to receive on, and the port every peer listens on: [`ROCE_V2_PORT`] normally.
    /// 0 lets the kernel pick one ([`RoceUdp::port`] tells which), which only makes sense for a
    /// device that talks to itself.
    pub port: u16,
    /// First UDP source port of the send-socket pool. If a port of the block is taken, further
    /// blocks are tried ([`RoceUdp::sport_base`] tells the one used).
    pub sport_base: u16,
    /// Sockets in the pool; 0 sends everything from the receive socket (source port = `port`).
    pub sport_count: u16,
    /// Use UDP GSO in [`RoceUdp::send_segments`] when the kernel supports it.
    pub gso: bool,
    /// Let the kernel coalesce received datagrams (UDP GRO) when it supports it.
    pub gro: bool,
    /// Make the receive socket member 0 of a steered `SO_REUSEPORT` group ([`crate::steer`]):
    /// client processes get further members, and a program steers each datagram by its
    /// destination QPN. The port is first bound without `SO_REUSEPORT` once, so a port somebody
    /// already has still fails as "address in use" rather than joining their group.
    pub steered: bool,
}

impl UdpConfig {
    /// A device at `addr` on [`ROCE_V2_PORT`], 16 source ports from [`SPORT_RANGE_START`], GSO
    /// and GRO on.
    pub fn new(addr: IpAddr) -> UdpConfig {
        UdpConfig {
            addr,
            port: ROCE_V2_PORT,
            sport_base: SPORT_RANGE_START,
            sport_count: 16,
            gso: true,
            gro: true,
            steered: false,
        }
    }
}

/// Why a bind failed, for callers that act on it (the message already says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindProblem {
    /// `EADDRINUSE`: another socket (another device, maybe another user's) owns the address and
    /// port.
    InUse,
    /// `EADDRNOTAVAIL`: the address is not one of this host's.
    NotLocal,
    /// `EACCES`: a port below 1024 without `CAP_NET_BIND_SERVICE`.
    Permission,
    /// Anything else; the message carries the system's error.
    Other,
}

impl BindProblem {
    fn of(error: &io::Error) -> BindProblem {
        match error.raw_os_error() {
            Some(libc::EADDRINUSE) => BindProblem::InUse,
            Some(libc::EADDRNOTAVAIL) => BindProblem::NotLocal,
            Some(libc::EACCES) => BindProblem::Permission,
            _ => BindProblem::Other,
        }
    }
}

/// What can go wrong setting up a [`RoceUdp`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdpError {
    /// Binding a socket failed. The message names the address and the likely cause, e.g.
    /// "cannot bind UDP 127.0.0.1:4791 (--addr 127.0.0.1): address already in use (another
    /// device, maybe another user's, owns it)", or, when processes of this user hold the port,
    /// "... address already in use, held by pid 1234 (ib_send_bw) of this user: ..."; it includes
    /// `error`, which is therefore not reported again as the source.
    #[error("cannot bind UDP {local} (--addr {addr}): {}", bind_reason(.problem, .error, .holders))]
    Bind {
        /// The address and port that could not be bound.
        local: SocketAddr,
        /// The configured address (what `--addr` said).
        addr: IpAddr,
        /// The cause, classified.
        problem: BindProblem,
        /// The system's error.
        error: io::Error,
        /// With [`BindProblem::InUse`]: the processes of this user that hold a socket on that
        /// address and port (pid, command name), as far as /proc shows them; another user's
        /// processes cannot be looked into.
        holders: Vec<(u32, String)>,
    },
    /// Every block of `count` source ports tried had a port in use.
    #[error(
        "cannot bind UDP source ports on {addr}: every block of {count} consecutive ports tried (from {first} up to \
         65535, then from {SPORT_RANGE_START}) has a port in use; free some ports or use a smaller pool"
    )]
    NoSourcePorts {
        /// The configured address.
        addr: IpAddr,
        /// Ports per block (`sport_count`).
        count: u16,
        /// The first base tried (`sport_base`).
        first: u16,
    },
    /// The configuration cannot work.
    #[error("invalid UDP configuration: {0}")]
    Config(String),
    /// Creating or configuring a socket failed.
    #[error("cannot set up UDP socket on {local}: {what}: {error}")]
    Setup {
        /// The address the socket was for.
        local: SocketAddr,
        /// What was being done.
        what: &'static str,
        /// The system's error (included in the message).
        error: io::Error,
    },
}

fn bind_reason(problem: &BindProblem, error: &io::Error, holders: &[(u32, String)]) -> String {
    match problem {
        BindProblem::InUse if !holders.is_empty() => {
            let who: Vec<String> = holders.iter().map(|(pid, comm)| format!("pid {pid} ({comm})")).collect();
            format!(
                "address already in use, held by {} of this user: a device's daemon, or a program still running \
                 from a device that stopped (it keeps its member of the device's port); end it, or use another --addr",
                who.join(", ")
            )
        }
        BindProblem::InUse => "address already in use (another device, maybe another user's, owns it)".to_string(),
        BindProblem::NotLocal => "address not available (it is not an address of this host)".to_string(),
        BindProblem::Permission => "permission denied (ports below 1024 need CAP_NET_BIND_SERVICE or root)".to_string(),
        BindProblem::Other => error.to_string(),
    }
}

/// One received RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The sender's address and UDP source port (the port the ICRC covers).
    pub src: SocketAddr,
    /// The IP destination address of the datagram (`IP_PKTINFO`/`IPV6_PKTINFO`): a multicast
    /// group, or the local address it was sent to. `None` if the kernel did not say.
    pub dst: Option<IpAddr>,
    /// IPv4 TTL or IPv6 hop limit as received.
    pub ttl: Option<u8>,
    /// IPv4 TOS byte or IPv6 traffic class (DSCP and ECN) as received.
    pub tos: Option<u8>,
    /// The datagram's place in a GRO buffer (0 when it came alone). When the sender used GSO
    /// (as on loopback, where the kernel hands the GSO packet over whole), the kernel numbered
    /// the segments' IPv4 IDs from 0 in this order: a hint for the ICRC check, never trusted
    /// alone.
    pub segment: u16,
    /// The UDP payload: BTH through ICRC.
    pub payload: &'a [u8],
}

/// Counters of a [`RoceUdp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdpStats {
    /// Datagrams handed to the kernel (each GSO segment counts).
    pub sent: u64,
    /// Send syscalls that succeeded.
    pub send_calls: u64,
    /// Of those, sends with UDP GSO.
    pub gso_sends: u64,
    /// Datagrams dropped on send because the socket or device queue was full (`ENOBUFS`,
    /// `EAGAIN`).
    pub send_drops: u64,
    /// Datagrams delivered by [`RoceUdp::recv`].
    pub received: u64,
    /// Receive buffers that held more than one datagram (GRO coalesced them).
    pub gro_buffers: u64,
    /// Datagrams dropped on receive because they did not fit the buffer (should never happen).
    pub recv_truncated: u64,
}

/// A RoCEv2 UDP endpoint: the receive socket on `addr:port` and the source-port pool. See the
/// [module documentation](self) for the socket options and why.
pub struct RoceUdp {
    recv: Socket,
    local: SocketAddr,
    pool: Vec<Socket>,
    sport_base: u16,
    gso: bool,
    gro: bool,
    ring: RecvRing,
    stats: UdpStats,
    steering: Option<crate::steer::Steering>,
}

impl fmt::Debug for RoceUdp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoceUdp")
            .field("local", &self.local)
            .field("sport_base", &self.sport_base)
            .field("sport_count", &self.pool.len())
            .field("gso", &self.gso)
            .field("gro", &self.gro)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The result of one send syscall that did not fail.
enum Sent {
    Ok,
    Dropped,
}

impl RoceUdp {
    /// Binds the receive socket to `addr:port` and the source-port pool (see [`UdpConfig`]).
    ///
    /// Errors: [`UdpError::Bind`] if the receive socket cannot be bound (address taken, not local,
    /// privileged port), or a pool socket fails for a reason other than its port being taken;
    /// [`UdpError::NoSourcePorts`] if no block of free source ports was found;
    /// [`UdpError::Config`] for a pool that does not fit below 65536; [`UdpError::Setup`] if a
    /// socket cannot be created or configured (e.g. too many open files for a large pool).
    pub fn bind(config: &UdpConfig) -> Result<RoceUdp, UdpError> {
        let addr = config.addr;
        let count = u32::from(config.sport_count);
        if count > 0 && (config.sport_base == 0 || u32::from(config.sport_base) + count > 0x1_0000) {
            return Err(UdpError::Config(format!(
                "source ports {}..{} do not fit in 1..=65535",
                config.sport_base,
                u32::from(config.sport_base) + count
            )));
        }

        let mut wanted = SocketAddr::new(addr, config.port);
        if config.steered {
            // A plain bind first: a port another socket has fails here as in use, instead of
            // joining that socket's group (same uid) or racing it. The probe's port is kept
            // (port 0 picks one), and it is closed before the group's first member binds.
            let probe = new_socket(wanted)?;
            probe.bind(&SockAddr::from(wanted)).map_err(|error| bind_error(wanted, addr, error))?;
            if let Some(a) = probe.local_addr().ok().and_then(|a| a.as_socket()) {
                wanted.set_port(a.port());
            }
        }
        let recv = new_socket(wanted)?;
        if config.steered {
            nsock::setsockopt(&recv, sockopt::ReusePort, &true)
                .map_err(|e| setup_error(wanted, "setting SO_REUSEPORT", e.into()))?;
        }
        recv.bind(&SockAddr::from(wanted)).map_err(|error| bind_error(wanted, addr, error))?;
        let local = recv
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| setup_error(wanted, "reading the bound address", io::ErrorKind::Other.into()))?;
        // Bigger buffers absorb bursts between two polls; the kernel caps them, and a small buffer
        // only costs drops that RoCE retransmits, so failure is ignored.
        let _ = recv.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
        configure_receive(&recv, local)?;
        let gro = config.gro && nsock::setsockopt(&recv, sockopt::UdpGroSegment, &true).is_ok();
        // A kernel with UDP GSO answers the UDP_SEGMENT getsockopt; one without says ENOPROTOOPT.
        let gso = config.gso && nsock::getsockopt(&recv, sockopt::UdpGsoSegment).is_ok();

        let (sport_base, pool) = if config.sport_count == 0 {
            (local.port(), Vec::new())
        } else {
            bind_pool(addr, config.sport_base, config.sport_count)?
        };

        let steering = if config.steered { Some(crate::steer::Steering::new(local, &recv)?) } else { None };
        Ok(RoceUdp {
            recv,
            local,
            pool,
            sport_base,
            gso,
            gro,
            ring: RecvRing::new(),
            stats: UdpStats::default(),
            steering,
        })
    }

    /// A client's endpoint on a steered device's port: `fd` is the member socket the device
    /// made for it ([`crate::steer::Steering::add_member`]). It receives what the steering program
    /// gives its member and sends from the device's port until [`RoceUdp::bind_source_ports`]
    /// gives it a pool of its own. GSO and GRO as the kernel allows (see [`crate::steer`] on
    /// GRO).
    pub fn from_member(fd: std::os::fd::OwnedFd) -> Result<RoceUdp, UdpError> {
        let recv = Socket::from(fd);
        let unknown = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
        let local = recv.local_addr().ok().and_then(|a| a.as_socket()).ok_or_else(|| {
            setup_error(unknown, "reading a member socket's address", io::ErrorKind::InvalidInput.into())
        })?;
        recv.set_nonblocking(true).map_err(|e| setup_error(local, "setting O_NONBLOCK", e))?;
        // SAFETY: fcntl(2) F_SETFD on a descriptor this function owns (`recv`), no pointers.
        if unsafe { libc::fcntl(recv.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(setup_error(local, "setting FD_CLOEXEC", io::Error::last_os_error()));
        }
        let gso = nsock::getsockopt(&recv, sockopt::UdpGsoSegment).is_ok();
        let gro = nsock::setsockopt(&recv, sockopt::UdpGroSegment, &true).is_ok();
        Ok(RoceUdp {
            recv,
            local,
            pool: Vec::new(),
            sport_base: local.port(),
            gso,
            gro,
            ring: RecvRing::new(),
            stats: UdpStats::default(),
            steering: None,
        })
    }

    /// The steering of a device bound with [`UdpConfig::steered`].
    pub fn steering(&self) -> Option<&crate::steer::Steering> {
        self.steering.as_ref()
    }

    /// The steering of a device bound with [`UdpConfig::steered`], to add members and move blocks.
    pub fn steering_mut(&mut self) -> Option<&mut crate::steer::Steering> {
        self.steering.as_mut()
    }

    /// The receive socket's address and port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The UDP port this device receives on and sends to (peers listen on the same port).
    pub fn port(&self) -> u16 {
        self.local.port()
    }

    /// The first source port of the pool actually bound (may differ from the configured one if
    /// that block was taken); the receive port when there is no pool.
    pub fn sport_base(&self) -> u16 {
        self.sport_base
    }

    /// Sockets in the source-port pool (the configured `sport_count`).
    pub fn sport_count(&self) -> u16 {
        self.pool.len() as u16
    }

    /// Whether [`RoceUdp::send_segments`] uses UDP GSO (configured, supported, and not disabled
    /// after the kernel refused it).
    pub fn gso_enabled(&self) -> bool {
        self.gso
    }

    /// Whether the receive socket has UDP GRO on.
    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// Most segments one [`RoceUdp::send_segments`] call takes ([`MAX_GSO_SEGMENTS`]), with or
    /// without GSO.
    pub fn max_segments(&self) -> usize {
        MAX_GSO_SEGMENTS
    }

    /// Datagrams dropped on send because a queue was full.
    pub fn send_drops(&self) -> u64 {
        self.stats.send_drops
    }

    /// All counters.
    pub fn stats(&self) -> UdpStats {
        self.stats
    }

    /// Reads every datagram queued on the receive socket, up to a budget, and calls `f` once per
    /// RoCE datagram (a GRO buffer is cut into its segments, in order). Returns how many were
    /// delivered; 0 when nothing was queued. Never blocks: poll [`RoceUdp::as_fd`] for
    /// readability first.
    ///
    /// The budget keeps one busy peer from starving the caller's other work: without GRO at most
    /// [`RECV_BUDGET`] datagrams; with GRO at most [`RECV_BUDGET`] buffers, each of which may hold
    /// a run of datagrams (up to 64 coalesced by GRO, or one whole GSO send of a sender on the
    /// same host, which loopback delivers uncut). A buffer is never split across calls: the
    /// caller only comes back when poll says the socket is readable, so nothing may stay behind
    /// in user space.
    ///
    /// An error is returned only if nothing was delivered; after a partial read the next call
    /// meets it again.
    pub fn recv(&mut self, f: &mut dyn FnMut(Datagram<'_>)) -> io::Result<usize> {
        self.recv_from_first(RECV_BATCH, f)
    }

    /// [`RoceUdp::recv`] for a thread that spins on the socket and found it empty last time:
    /// the first `recvmmsg` asks for one buffer only, and when it gets one the call returns
    /// there, without the kernel's look for a second (on a nonblocking socket `recvmmsg` tries
    /// the queue once more after each buffer it fills, and on loopback that empty try costs
    /// ~0.1 us: BENCHMARKS.md, "The two datagrams of a one-way"). A lone arrival (a ping-pong's
    /// message: the peer's GSO send arrives as one buffer) is the common case there; a caller
    /// that gets one buffer and wants the rest of a burst calls [`RoceUdp::recv`] next. What
    /// stays queued stays in the kernel, so a level-triggered poll still sees the socket
    /// readable.
    pub fn recv_lone(&mut self, f: &mut dyn FnMut(Datagram<'_>)) -> io::Result<usize> {
        self.recv_from_first(1, f)
    }

    fn recv_from_first(&mut self, first: usize, f: &mut dyn FnMut(Datagram<'_>)) -> io::Result<usize> {
        let fd = self.recv.as_raw_fd();
        let mut delivered = 0usize;
        let mut buffers = 0usize;
        while buffers < RECV_BUDGET {
            let cap = if buffers == 0 { first } else { RECV_BATCH };
            let want = (RECV_BUDGET - buffers).min(cap);
            let n = match self.ring.fill(fd, want) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) if delivered > 0 => break,
                Err(e) => return Err(e),
            };
            buffers += n;
            for i in 0..n {
                let meta = self.ring.meta[i];
                if meta.truncated {
                    self.stats.recv_truncated += 1;
                    continue;
                }
                let data = &self.ring.data[i * RECV_SLOT..i * RECV_SLOT + meta.len];
                // A stride of 0 cannot come from the kernel; treat it as one datagram.
                let stride = if meta.stride == 0 { meta.len.max(1) } else { meta.stride };
                let mut segments = 0usize;
                for (k, payload) in data.chunks(stride).enumerate() {
                    let segment = k as u16;
                    f(Datagram { src: meta.src, dst: meta.dst, ttl: meta.ttl, tos: meta.tos, segment, payload });
                    segments += 1;
                }
                if data.is_empty() {
                    // An empty datagram is still a datagram (the engine counts it as malformed).
                    f(Datagram {
                        src: meta.src,
                        dst: meta.dst,
                        ttl: meta.ttl,
                        tos: meta.tos,
                        segment: 0,
                        payload: data,
                    });
                    segments = 1;
                }
                if segments > 1 {
                    self.stats.gro_buffers += 1;
                }
                delivered += segments;
            }
            if n < want || (buffers == n && first < RECV_BATCH) {
                // recvmmsg on a nonblocking socket returns what is queued: the queue is empty now.
                // Or a short first read (`recv_lone`) got what it asked for.
                break;
            }
        }
        self.stats.received += delivered as u64;
        Ok(delivered)
    }

    /// Gives an endpoint without a source-port pool (a client's member socket,
    /// [`RoceUdp::from_member`]) one: `count` send sockets on its address at consecutive ports,
    /// the first block of them free from `base` on (as [`RoceUdp::bind`] finds the device's).
    /// Errors as `bind`'s pool: [`UdpError::NoSourcePorts`] when no block is free.
    pub fn bind_source_ports(&mut self, base: u16, count: u16) -> Result<(), UdpError> {
        if count == 0 || !self.pool.is_empty() {
            return Err(UdpError::Config(format!(
                "a source-port pool of {count} on an endpoint with {} already",
                self.pool.len()
            )));
        }
        let (sport_base, pool) = bind_pool(self.local.ip(), base, count)?;
        (self.sport_base, self.pool) = (sport_base, pool);
        Ok(())
    }

    /// Sends one datagram to `dst` on this device's port (peers listen on the same port), from
    /// the socket bound to `src_port`: a pool port, or the receive port.
    ///
    /// A full queue (`ENOBUFS`, `EAGAIN`) drops the datagram, counts it in
    /// [`RoceUdp::send_drops`] and returns `Ok`. Errors: `InvalidInput` if `src_port` is not one
    /// of this device's ports or `dst` is of the other IP family; others as the kernel reports
    /// them (`EMSGSIZE`: larger than the path MTU, since DF is set).
    pub fn send(&mut self, dst: IpAddr, src_port: u16, payload: &[u8]) -> io::Result<()> {
        let to = self.destination(dst)?;
        let outcome = send_one(self.socket_for(src_port)?, &to, payload)?;
        self.account(outcome, 1, false);
        Ok(())
    }

    /// Sends `buf` as datagrams of `segment_size` bytes (the last one may be shorter) to `dst`
    /// from `src_port`, in one syscall with UDP GSO when it is on, else one send per segment.
    ///
    /// Limits: at most [`RoceUdp::max_segments`] segments and [`MAX_GSO_BYTES`] bytes per call
    /// (`InvalidInput` otherwise, and for `segment_size == 0`). If the kernel refuses GSO
    /// (`EIO`, `EINVAL`) the call is completed one datagram at a time, and if that works GSO is
    /// turned off for good ([`RoceUdp::gso_enabled`]); if it fails too, its error is returned and
    /// GSO stays on (the segments themselves were at fault, e.g. larger than the MTU). Drops as
    /// in [`RoceUdp::send`]: a full queue drops every segment of the call. Without GSO, an error
    /// on one segment returns it at once; the segments before it were sent.
    pub fn send_segments(&mut self, dst: IpAddr, src_port: u16, buf: &[u8], segment_size: usize) -> io::Result<()> {
        if segment_size == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "UDP segment size 0"));
        }
        if buf.len() > MAX_GSO_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} bytes in one segmented send; at most {MAX_GSO_BYTES}", buf.len()),
            ));
        }
        let segments = buf.len().div_ceil(segment_size);
        if segments > MAX_GSO_SEGMENTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{segments} segments in one send; at most {MAX_GSO_SEGMENTS}"),
            ));
        }
        if segments <= 1 {
            return self.send(dst, src_port, buf);
        }
        let to = self.destination(dst)?;
        let mut gso_refused = false;
        if self.gso {
            let socket = self.socket_for(src_port)?;
            match send_gso(socket, to, buf, segment_size) {
                Ok(outcome) => {
                    self.account(outcome, segments as u64, true);
                    return Ok(());
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => gso_refused = true,
                Err(e) => return Err(e),
            }
        }
        for segment in buf.chunks(segment_size) {
            let outcome = send_one(self.socket_for(src_port)?, &to, segment)?;
            self.account(outcome, 1, false);
        }
        if gso_refused {
            self.gso = false;
        }
        Ok(())
    }

    /// Sends several messages from `src_port`, in order, each as [`RoceUdp::send_segments`]
    /// would (`(dst, bytes, segment size)`), in as few `sendmmsg` calls as the kernel takes
    /// them (16 a call) when GSO is on: one system call for the two GSO sends of a 64 KiB
    /// WRITE, or for the SENDs a poll found posted. A message the kernel refuses in a
    /// `sendmmsg` is sent again alone by `send_segments`, which drops it on a full queue, turns
    /// GSO off if the kernel refuses it, or fails; every message is tried. Errors: the index
    /// and error of each message that failed.
    pub fn send_many(&mut self, src_port: u16, msgs: &[(IpAddr, &[u8], usize)]) -> Result<(), Vec<(usize, io::Error)>> {
        let mut failed = Vec::new();
        let slow = |udp: &mut Self, from: usize, failed: &mut Vec<(usize, io::Error)>| {
            for (i, &(dst, buf, seg)) in msgs.iter().enumerate().skip(from) {
                if let Err(e) = udp.send_segments(dst, src_port, buf, seg) {
                    failed.push((i, e));
                }
            }
        };
        let valid = |&(dst, buf, seg): &(IpAddr, &[u8], usize)| {
            seg > 0
                && buf.len() <= MAX_GSO_BYTES
                && buf.len().div_ceil(seg) <= MAX_GSO_SEGMENTS
                && dst.is_ipv4() == self.local.is_ipv4()
        };
        let socket_ok = self.socket_for(src_port).is_ok();
        if !self.gso || msgs.len() < 2 || !socket_ok || !msgs.iter().all(valid) {
            // One at a time: `send_segments` says what is wrong with any of them.
            slow(self, 0, &mut failed);
            return if failed.is_empty() { Ok(()) } else { Err(failed) };
        }
        let port = self.local.port();
        let out: Vec<sockets::Outgoing<'_>> = msgs
            .iter()
            .map(|&(dst, buf, seg)| {
                let segments = buf.len().div_ceil(seg);
                sockets::Outgoing {
                    to: SockAddr::from(SocketAddr::new(dst, port)),
                    buf,
                    segment_size: (segments > 1).then_some(seg as u16),
                }
            })
            .collect();
        let mut i = 0;
        while i < out.len() {
            let sent = match self.socket_for(src_port) {
                Ok(socket) => sockets::send_gso_many(socket, &out[i..]),
                Err(e) => Err(e),
            };
            match sent {
                Ok(k) if k > 0 => {
                    // One system call, however many messages it took.
                    for &(_, buf, seg) in &msgs[i..i + k] {
                        let segments = buf.len().div_ceil(seg).max(1) as u64;
                        self.stats.sent += segments;
                        self.stats.gso_sends += u64::from(segments > 1);
                    }
                    self.stats.send_calls += 1;
                    i += k;
                }
                // The kernel took none: this one alone, as `send_segments` handles its error.
                _ => {
                    let (dst, buf, seg) = msgs[i];
                    if let Err(e) = self.send_segments(dst, src_port, buf, seg) {
                        failed.push((i, e));
                    }
                    i += 1;
                    if !self.gso {
                        slow(self, i, &mut failed);
                        break;
                    }
                }
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }

    /// The socket that sends from `src_port`.
    fn socket_for(&self, src_port: u16) -> io::Result<&Socket> {
        if src_port == self.local.port() {
            return Ok(&self.recv);
        }
        let offset = usize::from(src_port.wrapping_sub(self.sport_base));
        if src_port >= self.sport_base && offset < self.pool.len() {
            return Ok(&self.pool[offset]);
        }
        let pool = if self.pool.is_empty() {
            "no source-port pool".to_string()
        } else {
            format!("pool {}..={}", self.sport_base, u32::from(self.sport_base) + self.pool.len() as u32 - 1)
        };
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "UDP source port {src_port} is not one of this device's ({pool}, receive port {})",
                self.local.port()
            ),
        ))
    }

    /// `dst` on this device's port, if it is of the socket's family.
    fn destination(&self, dst: IpAddr) -> io::Result<SocketAddr> {
        if dst.is_ipv4() != self.local.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot send to {dst} from {}: other IP family", self.local.ip()),
            ));
        }
        Ok(SocketAddr::new(dst, self.local.port()))
    }

    fn account(&mut self, outcome: Sent, datagrams: u64, gso: bool) {
        match outcome {
            Sent::Ok => {
                self.stats.sent += datagrams;
                self.stats.send_calls += 1;
                if gso {
                    self.stats.gso_sends += 1;
                }
            }
            Sent::Dropped => self.stats.send_drops += datagrams,
        }
    }
}

impl AsFd for RoceUdp {
    /// The receive socket, to poll for readability.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.recv.as_fd()
    }
}

impl AsRawFd for RoceUdp {
    /// The receive socket, to poll for readability.
    fn as_raw_fd(&self) -> RawFd {
        self.recv.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_is_send() {
        fn send<T: Send>() {}
        send::<RoceUdp>();
    }
}
