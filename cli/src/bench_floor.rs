//! The floor of an RC one-way on this machine's loopback, for `softrdma bench`'s latency rows.
//!
//! udpbench's busy-poll ping-pong moves one datagram per one-way. An RC SEND ping-pong moves
//! two: the SEND, and the ACK of the peer's SEND (IBTA 9.7.5.1: an RC request completes at its
//! requester only once acknowledged, and acknowledgements are packets of their own, never carried
//! in a request). softrdma sends the two together, in one GSO send (a `UDP_SEGMENT` control
//! message), into a socket with `UDP_GRO` that reads them as one buffer. On loopback that costs
//! the kernel about 0.5 us more per one-way than one plain datagram (BENCHMARKS.md, "The two
//! datagrams of a one-way"), and no user-space code of ours is in that difference. This
//! measures both in one run, two threads spinning on nonblocking sockets on two cores (as
//! udpbench does): a single 20-byte datagram, and two 20-byte segments in one GSO send (the
//! sizes of a 2-byte SEND_ONLY and of an ACK, without the IP and UDP headers).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use nix::sys::socket::{self as nsock, sockopt, ControlMessage, MsgFlags, SockaddrIn};

/// The size of each datagram: a SEND_ONLY of 2 bytes (BTH 12, payload 2 and 2 bytes of pad,
/// ICRC 4) and an ACK (BTH 12, AETH 4, ICRC 4) are both 20 bytes of UDP payload.
const SEGMENT: usize = 20;

/// One-way p50s of the same run, in microseconds.
pub(crate) struct Floor {
    /// One 20-byte datagram per one-way.
    pub(crate) single_us: f64,
    /// Two 20-byte segments in one GSO send per one-way.
    pub(crate) pair_us: f64,
}

/// Measures both ping-pongs, `iters` round trips each (after as many to warm up).
pub(crate) fn measure(iters: usize) -> Result<Floor> {
    Ok(Floor { single_us: ping_pong(1, iters)?, pair_us: ping_pong(2, iters)? })
}

/// A socket on 127.0.0.1 with `UDP_GRO` (as a device's), nonblocking.
fn socket() -> Result<UdpSocket> {
    socket_in(None, Ipv4Addr::LOCALHOST)
}

/// A socket bound to `ip` with `UDP_GRO`, nonblocking, in network namespace `netns` (a name
/// under /run/netns, as `ip netns` and `softrdma cluster` make them) or in this process's. A
/// socket stays in the namespace it was made in: a thread enters the namespace, makes it and
/// ends, and this process's own threads never move.
pub(crate) fn socket_in(netns: Option<&str>, ip: Ipv4Addr) -> Result<UdpSocket> {
    let make = move || -> Result<UdpSocket> {
        let s = UdpSocket::bind((ip, 0)).with_context(|| format!("binding a UDP socket on {ip}"))?;
        s.set_nonblocking(true)?;
        nsock::setsockopt(&s, sockopt::UdpGroSegment, &true).context("setting UDP_GRO")?;
        Ok(s)
    };
    let Some(ns) = netns else { return make() };
    let path = std::path::Path::new("/run/netns").join(ns);
    std::thread::scope(|scope| {
        scope
            .spawn(move || -> Result<UdpSocket> {
                let f = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .with_context(|| format!("entering network namespace {ns}"))?;
                make()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread making a socket in {ns} panicked"))?
    })
}

/// Sends `segments` datagrams of SEGMENT bytes to `to`: one plain send, or one GSO send.
fn send(s: &UdpSocket, to: &SockaddrIn, buf: &[u8], segments: usize) -> Result<()> {
    let fd = s.as_raw_fd();
    let iov = [std::io::IoSlice::new(&buf[..SEGMENT * segments])];
    let size = SEGMENT as u16;
    let gso = [ControlMessage::UdpGsoSegments(&size)];
    let cmsgs: &[ControlMessage] = if segments > 1 { &gso } else { &[] };
    nsock::sendmsg(fd, &iov, cmsgs, MsgFlags::empty(), Some(to)).context("sendmsg")?;
    Ok(())
}

/// How long a side waits for the other before it gives up (loopback answers in microseconds).
const STALL: std::time::Duration = std::time::Duration::from_secs(5);

/// Spins until `want` bytes arrived (one GRO buffer, or its datagrams one by one). A 1-byte
/// datagram is the end: returns false. Nothing for [`STALL`]: an error.
fn receive(s: &UdpSocket, buf: &mut [u8], want: usize) -> Result<bool> {
    let mut got = 0;
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    while got < want {
        match s.recv(buf) {
            Ok(1) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                spins = spins.wrapping_add(1);
                if spins % 4096 == 0 && since.get_or_insert_with(Instant::now).elapsed() > STALL {
                    bail!("nothing from the ping-pong's other end for {STALL:?}");
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("recv"),
        }
    }
    Ok(true)
}

/// Pins the calling thread to `cpu` when the machine has it (as udpbench pins its two threads).
fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// The calling thread's CPUs, to restore after [`pin`].
fn cpus() -> Option<nix::sched::CpuSet> {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()
}

fn addr_of(s: &UdpSocket) -> Result<SockaddrIn> {
    match s.local_addr()? {
        SocketAddr::V4(a) => Ok(SockaddrIn::from(a)),
        SocketAddr::V6(a) => bail!("an IPv6 address {a} for a socket bound on 127.0.0.1"),
    }
}

/// The one-way p50 (half the round trip's median) of a busy-poll ping-pong of `segments`
/// datagrams per one-way.
fn ping_pong(segments: usize, iters: usize) -> Result<f64> {
    ping_pong_between(socket()?, socket()?, segments, iters)
}

/// [`ping_pong`] between two given sockets (bound, nonblocking, with `UDP_GRO`).
pub(crate) fn ping_pong_between(a: UdpSocket, b: UdpSocket, segments: usize, iters: usize) -> Result<f64> {
    let (to_a, to_b) = (addr_of(&a)?, addr_of(&b)?);
    let want = SEGMENT * segments;
    let before = cpus();
    let pong = std::thread::spawn(move || -> Result<()> {
        pin(1);
        let mut buf = vec![0u8; 65536];
        while receive(&b, &mut buf, want)? {
            send(&b, &to_a, &buf, segments)?;
        }
        Ok(())
    });
    pin(0);
    let msg = vec![0x5au8; SEGMENT * 2];
    let mut buf = vec![0u8; 65536];
    let mut rtt = Vec::with_capacity(iters);
    let mut run = || -> Result<()> {
        for i in 0..2 * iters {
            let t0 = Instant::now();
            send(&a, &to_b, &msg, segments)?;
            if !receive(&a, &mut buf, want)? {
                bail!("the ping-pong's far end stopped");
            }
            if i >= iters {
                rtt.push(t0.elapsed().as_nanos() as f64);
            }
        }
        Ok(())
    };
    let r = run();
    // The end, also after a failure: one byte.
    let _ = a.send_to(&[0], SocketAddr::V4(to_b.into()));
    let joined = pong.join();
    if let Some(set) = before {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
    joined.map_err(|_| anyhow::anyhow!("the ping-pong thread panicked"))??;
    r?;
    rtt.sort_by(f64::total_cmp);
    Ok(rtt[rtt.len() / 2] / 2.0 / 1000.0)
}

/// A 64 KiB RDMA WRITE at path MTU 4096 is 16 packets: the first with its RETH (BTH 12, RETH 16,
/// payload 4096, ICRC 4: 4128 bytes of UDP payload), then 15 of BTH, payload and ICRC (4112
/// bytes). One GSO send holds at most 65,507 bytes, 15 such packets, and its segments are all one
/// size but the last: the longer first packet goes alone. So the message takes two sends however
/// they are batched (BENCHMARKS.md, "Within one device on this machine").
const FIRST: usize = 4128;
const MIDDLE: usize = 4112;
const PER_MESSAGE: usize = FIRST + 15 * MIDDLE;

/// What one thread gets through this machine's loopback to another (receiving with `UDP_GRO`)
/// in one run, in GB/s of RDMA payload (4096 bytes a packet), for the floor of `ib_write_bw`'s
/// 64 KiB rows.
pub(crate) struct BulkFloor {
    /// 15 packets of 4112 bytes per GSO send, nothing else: the most the socket takes (what
    /// udpbench's GSO+GRO row measures, at this size).
    pub(crate) gso_gbs: f64,
    /// A 64 KiB WRITE's 16 packets as they must be sent: the first alone, the 15 others in one
    /// GSO send.
    pub(crate) message_gbs: f64,
    /// The same, with each packet's ICRC computed as the engine computes it (IBTA A17.4.3.1:
    /// every RoCEv2 packet on the wire carries one).
    pub(crate) message_icrc_gbs: f64,
}

/// Measures the three senders, `secs` seconds each.
pub(crate) fn bulk(secs: f64) -> Result<BulkFloor> {
    Ok(BulkFloor {
        gso_gbs: stream(Sender::Gso, secs)?,
        message_gbs: stream(Sender::Message, secs)?,
        message_icrc_gbs: stream(Sender::MessageIcrc, secs)?,
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Sender {
    Gso,
    Message,
    MessageIcrc,
}

/// One sending thread (CPU 0) to one blocking receiver (CPU 1) for `secs`; the RDMA payload the
/// receiver got, in GB/s (datagrams the receiving socket had no room for are not counted).
fn stream(how: Sender, secs: f64) -> Result<f64> {
    let (tx, rx) = (socket()?, socket()?);
    // The buffers a device's sockets ask for (and udpbench's): with the default ones the queue
    // holds three GSO sends and the floor measured drops.
    nsock::setsockopt(&rx, sockopt::RcvBuf, &(4 << 20)).context("setting SO_RCVBUF")?;
    nsock::setsockopt(&tx, sockopt::SndBuf, &(4 << 20)).context("setting SO_SNDBUF")?;
    rx.set_nonblocking(false)?;
    rx.set_read_timeout(Some(std::time::Duration::from_millis(20)))?;
    let to = addr_of(&rx)?;
    let before = cpus();
    // Set once the sender stopped: the receiver then ends at its first empty wait (the end
    // datagram below may find the socket full; a starved receiver must still end).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender_done = done.clone();
    let receiver = std::thread::spawn(move || -> Result<u64> {
        pin(1);
        let mut buf = vec![0u8; 65536];
        let mut got = 0u64;
        let mut idle_since: Option<Instant> = None;
        loop {
            match rx.recv(&mut buf) {
                Ok(1) => return Ok(got),
                Ok(n) => {
                    got += n as u64;
                    idle_since = None;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if done.load(std::sync::atomic::Ordering::SeqCst) {
                        return Ok(got);
                    }
                    if idle_since.get_or_insert_with(Instant::now).elapsed() > STALL {
                        bail!("no datagram from the bulk floor's sender for {STALL:?}");
                    }
                }
                Err(e) => return Err(e).context("receiving the bulk floor's datagrams"),
            }
        }
    });
    pin(0);
    let mut msg = vec![0x5au8; PER_MESSAGE];
    let ip_udp = ip_udp_header();
    let fd = tx.as_raw_fd();
    let size = MIDDLE as u16;
    let gso = [ControlMessage::UdpGsoSegments(&size)];
    let mut sent = || -> Result<()> {
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < secs {
            for _ in 0..16 {
                if how == Sender::Gso {
                    let iov = [std::io::IoSlice::new(&msg[FIRST..])];
                    let _ = nsock::sendmsg(fd, &iov, &gso, MsgFlags::empty(), Some(&to));
                    continue;
                }
                if how == Sender::MessageIcrc {
                    for (at, len) in std::iter::once((0, FIRST)).chain((0..15).map(|i| (FIRST + i * MIDDLE, MIDDLE))) {
                        let p = &mut msg[at..at + len];
                        let crc = softrdma_engine::wire::icrc::roce_v2_parts(&ip_udp, &p[..len - 4])?;
                        p[len - 4..].copy_from_slice(&crc.to_le_bytes());
                    }
                }
                let first = [std::io::IoSlice::new(&msg[..FIRST])];
                let _ = nsock::sendmsg(fd, &first, &[], MsgFlags::empty(), Some(&to));
                let rest = [std::io::IoSlice::new(&msg[FIRST..])];
                let _ = nsock::sendmsg(fd, &rest, &gso, MsgFlags::empty(), Some(&to));
            }
        }
        Ok(())
    };
    let t0 = Instant::now();
    let r = sent();
    let elapsed = t0.elapsed().as_secs_f64();
    // The end: the flag, and one byte for a receiver blocked in its wait.
    sender_done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = tx.send_to(&[0], SocketAddr::V4(to.into()));
    let joined = receiver.join();
    if let Some(set) = before {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
    let got = joined.map_err(|_| anyhow::anyhow!("the bulk floor's receiver panicked"))??;
    r?;
    // UDP payload bytes to RDMA payload: 4096 of every 4112 (the GSO sender) or 65,536 of every
    // 65,808 (a message).
    let payload = match how {
        Sender::Gso => got as f64 * 4096.0 / MIDDLE as f64,
        _ => got as f64 * 65536.0 / PER_MESSAGE as f64,
    };
    Ok(payload / elapsed / 1e9)
}

/// UCX's eager protocol over RC for a 64 KiB tag message, as ucx_perftest's tag_bw sends it
/// between two hosts (UCX 1.13 keeps a non-blocking tag send below 256 KiB eager): 8 active
/// messages of 8,256 bytes (UCX's rc_verbs segment size), each one SEND cut into packets of the
/// path MTU (at 4096: 4096, 4096 and 64 bytes of payload; at 1024, what a 1500-byte link
/// carries: 8 x 1024 and 64), each with BTH 12 and ICRC 4, in one GSO send, and each answered by
/// the responder with a 20-byte ACK (the SEND's last packet asks for one, IBTA 9.7.2.1.1;
/// coalescing ACKs of messages that arrive one send apart would hold them).
const EAGER_PAYLOAD: usize = 8256;
/// BTH and ICRC of each packet.
const EAGER_OVERHEAD: usize = 12 + 4;

/// The packet sizes of one eager SEND at path MTU `mtu` bytes.
pub(crate) fn eager_segments(mtu: usize) -> Vec<usize> {
    let mtu = mtu.max(256);
    let full = EAGER_PAYLOAD / mtu;
    let mut v = vec![mtu + EAGER_OVERHEAD; full];
    if EAGER_PAYLOAD % mtu != 0 {
        v.push(EAGER_PAYLOAD % mtu + EAGER_OVERHEAD);
    }
    v
}
/// Messages the sender keeps unacknowledged (UCX keeps up to its flow-control window of 512;
/// this keeps the receiving socket's buffer from overflowing, which no RC peer would do).
const EAGER_WINDOW: usize = 32;

/// The floor of that stream from socket `tx` to socket `rx` (in whatever namespaces they were
/// made, [`socket_in`]): one thread sends the messages with each packet's ICRC computed (IBTA
/// A17.4.3.1) and reads the ACKs, another receives, checks every packet's ICRC and answers each
/// message with an ACK, both spinning (as ucx_perftest does), for `secs`, at path MTU `mtu`
/// bytes ([`eager_segments`]). GB/s of UCX payload; an error if the kernel refuses a send for
/// anything but a full queue, or if nothing arrived.
pub(crate) fn eager_stream(
    tx: UdpSocket,
    rx: UdpSocket,
    mtu: usize,
    secs: f64,
    ack_every: usize,
    batch: usize,
) -> Result<f64> {
    let segments = eager_segments(mtu);
    let eager_bytes: usize = segments.iter().sum();
    for s in [&tx, &rx] {
        nsock::setsockopt(s, sockopt::RcvBuf, &(4 << 20)).context("setting SO_RCVBUF")?;
        nsock::setsockopt(s, sockopt::SndBuf, &(4 << 20)).context("setting SO_SNDBUF")?;
    }
    let (to_rx, to_tx) = (addr_of(&rx)?, addr_of(&tx)?);
    let ip_udp = ip_udp_header();
    let before = cpus();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender_done = done.clone();
    let rx_segments = segments.clone();
    let receiver = std::thread::spawn(move || -> Result<u64> {
        pin(1);
        let segments = rx_segments;
        let mut buf = vec![0u8; 65536];
        let (mut got, mut at, mut seg, mut unacked) = (0u64, 0usize, 0usize, 0usize);
        let ack = [0u8; SEGMENT];
        let mut idle_since: Option<Instant> = None;
        loop {
            match rx.recv(&mut buf) {
                Ok(1) => return Ok(got),
                Ok(n) => {
                    idle_since = None;
                    // The packets in order (a whole GSO send, or its segments one by one).
                    let mut off = 0;
                    while off < n {
                        let len = segments[seg].min(n - off);
                        let p = &buf[off..off + len];
                        if len < 4
                            || softrdma_engine::wire::icrc::roce_v2_parts(&ip_udp, &p[..len - 4])?.to_le_bytes()
                                != p[len - 4..]
                        {
                            bail!("the eager floor's packet {seg} at byte {at} came with a wrong ICRC");
                        }
                        off += len;
                        at += len;
                        seg += 1;
                        if seg == segments.len() {
                            seg = 0;
                            got += EAGER_PAYLOAD as u64;
                            unacked += 1;
                            if unacked == ack_every {
                                unacked = 0;
                                let _ = rx.send_to(&ack, SocketAddr::V4(to_tx.into()));
                            }
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if done.load(std::sync::atomic::Ordering::SeqCst) {
                        return Ok(got);
                    }
                    if idle_since.get_or_insert_with(Instant::now).elapsed() > STALL {
                        bail!("no datagram from the eager floor's sender for {STALL:?}");
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(e).context("receiving the eager floor's packets"),
            }
        }
    });
    pin(0);
    let mut msg = vec![0x5au8; eager_bytes];
    let fd = tx.as_raw_fd();
    let size = segments[0] as u16;
    let gso = [ControlMessage::UdpGsoSegments(&size)];
    let mut acks = vec![0u8; 65536];
    let mut sent = || -> Result<()> {
        let t0 = Instant::now();
        let mut outstanding = 0usize;
        while t0.elapsed().as_secs_f64() < secs {
            while let Ok(n) = tx.recv(&mut acks) {
                outstanding = outstanding.saturating_sub((n / SEGMENT).max(1) * ack_every);
            }
            if outstanding + batch > EAGER_WINDOW {
                std::hint::spin_loop();
                continue;
            }
            let mut at = 0;
            for &len in &segments {
                let p = &mut msg[at..at + len];
                let crc = softrdma_engine::wire::icrc::roce_v2_parts(&ip_udp, &p[..len - 4])?;
                p[len - 4..].copy_from_slice(&crc.to_le_bytes());
                at += len;
            }
            if batch > 1 {
                let iov = [std::io::IoSlice::new(&msg)];
                let slices = vec![iov; batch];
                let addrs = vec![Some(to_rx); batch];
                let mut hdrs = nsock::MultiHeaders::<SockaddrIn>::preallocate(batch, Some(nix::cmsg_space!(u16)));
                match nsock::sendmmsg(fd, &mut hdrs, &slices, &addrs, gso, MsgFlags::empty()) {
                    Ok(r) => outstanding += r.count(),
                    Err(e) if full_queue(e) => {}
                    Err(e) => bail!("sendmmsg of the eager floor's SENDs ({} bytes a GSO send): {e}", eager_bytes),
                }
                continue;
            }
            let iov = [std::io::IoSlice::new(&msg)];
            match nsock::sendmsg(fd, &iov, &gso, MsgFlags::empty(), Some(&to_rx)) {
                Ok(_) => outstanding += 1,
                Err(e) if full_queue(e) => {}
                Err(e) => bail!("sendmsg of an eager floor's SEND ({} bytes a GSO send): {e}", eager_bytes),
            }
        }
        Ok(())
    };
    let t0 = Instant::now();
    let r = sent();
    let elapsed = t0.elapsed().as_secs_f64();
    sender_done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = tx.send_to(&[0], SocketAddr::V4(to_rx.into()));
    let joined = receiver.join();
    if let Some(set) = before {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
    r?;
    let got = joined.map_err(|_| anyhow::anyhow!("the eager floor's receiver panicked"))??;
    if got == 0 {
        bail!("no message of the eager floor arrived");
    }
    Ok(got as f64 / elapsed / 1e9)
}

/// A send refused because the socket's queue is full (the sender tries again).
fn full_queue(e: nix::errno::Errno) -> bool {
    matches!(e, nix::errno::Errno::EAGAIN | nix::errno::Errno::ENOBUFS | nix::errno::Errno::EINTR)
}

/// IPv4 and UDP headers as a device's would be (the ICRC covers them, masked).
fn ip_udp_header() -> [u8; 28] {
    let mut ip_udp = [0u8; 28];
    ip_udp[0] = 0x45;
    ip_udp[9] = 17;
    ip_udp[22] = (4791u16 >> 8) as u8;
    ip_udp[23] = (4791u16 & 0xff) as u8;
    ip_udp
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn both_ping_pongs_run_and_give_a_latency() {
        let f = measure(2000).expect("measure");
        eprintln!("one-way p50: one datagram {:.2} us, a message and its ACK {:.2} us", f.single_us, f.pair_us);
        // Loopback round trips take microseconds, never nothing and never seconds.
        for v in [f.single_us, f.pair_us] {
            assert!(v > 0.05 && v < 50_000.0, "{v} us");
        }
    }

    #[test]
    fn the_eager_floor_moves_checked_messages() {
        for (mtu, ack_every, batch) in [(4096, 1, 1), (1024, 8, 8)] {
            let gbs = eager_stream(socket().expect("socket"), socket().expect("socket"), mtu, 0.2, ack_every, batch)
                .expect("eager");
            eprintln!("UCX's eager pattern at MTU {mtu}, ACK per {ack_every}, {batch} a call: {gbs:.2} GB/s");
            assert!(gbs > 0.001 && gbs < 1000.0, "{gbs} GB/s");
        }
    }

    #[test]
    fn eager_sends_are_cut_at_the_path_mtu() {
        assert_eq!(eager_segments(4096), [4112, 4112, 80]);
        assert_eq!(eager_segments(1024), [1040, 1040, 1040, 1040, 1040, 1040, 1040, 1040, 80]);
        assert_eq!(eager_segments(8256), [8272]);
    }

    #[test]
    fn the_bulk_senders_get_datagrams_through() {
        let f = bulk(std::env::var("BULK_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(0.2)).expect("bulk");
        eprintln!(
            "GB/s: GSO {:.2}, a WRITE's packets {:.2}, with their ICRCs {:.2}",
            f.gso_gbs, f.message_gbs, f.message_icrc_gbs
        );
        // Each sender got something through, and no more than memory could move.
        for v in [f.gso_gbs, f.message_gbs, f.message_icrc_gbs] {
            assert!(v > 0.01 && v < 1000.0, "{v} GB/s");
        }
    }
}
