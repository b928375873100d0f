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
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a UDP socket on 127.0.0.1")?;
    s.set_nonblocking(true)?;
    nsock::setsockopt(&s, sockopt::UdpGroSegment, &true).context("setting UDP_GRO")?;
    Ok(s)
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
    let (a, b) = (socket()?, socket()?);
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
}
