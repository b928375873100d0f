//! The capture (docs/architecture.md D8): every packet a device sends or receives, internal
//! loopback included, written as an Ethernet frame (LINKTYPE_ETHERNET) with real IP/UDP headers so
//! Wireshark decodes it.
//!
//! Sent packets are written as the kernel sends them (IPv4 ID as sent, DF, TTL 64). A UDP socket
//! does not show a received packet's IP header, so received packets get a rebuilt one: the IPv4
//! ID that makes the ICRC hold (the sender's real ID, recovered by solving the CRC), TTL 64, and
//! the UDP checksum computed over IPv6 (IPv4: 0). Loopback packets are written once, as sent.
//! MAC addresses are made up from the IP address (02:00 + the IPv4 address; locally
//! administered).
//!
//! The capture stays off the protocol's path (docs/capture.md): each process that runs QPs of
//! the device copies its frames into a capture ring of its own ([`ring`], shared memory), and one
//! thread of the process that owns the file ([`writer`]: the daemon, or the process a device runs
//! in) merges the rings in time order, repairs the received packets' headers and appends them
//! to the file. A ring that is full drops the frame from the capture, never from the wire, and
//! counts it (`capture_dropped` in `softrdma stat`).

mod ring;
mod sink;
mod writer;

use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use softrdma_engine::device::ip_udp_header;
use softrdma_engine::wire::{ethernet, EtherType, EthernetAddress, EthernetFrame, EthernetRepr};

pub(crate) use self::ring::Ring;
pub(crate) use self::writer::Writer;

/// A capture ring's data bytes: 128 MiB, or $SOFTRDMA_CAPTURE_RING_MB (a tuning knob). Its pages
/// are allocated only as they are first written, so a process that captures little holds
/// little. The size is the writer's slack: a writer the kernel leaves without a core for a while
/// (two programs spinning on a 2-core machine) must find room when it comes back. With 16 MiB,
/// qperf's twelve RC tests at 1 MiB within one device (both directions into one writer, ~2 GB/s
/// of frames) lost frames in 5 runs of 15; with 64 MiB in none of 5, but the matrix's qperf at
/// 64 KiB on the provider path still lost 2,852 frames once (a writer held up ~100 ms while the
/// machine also compiled): 128 MiB covers twice that.
pub fn ring_bytes() -> usize {
    const DEFAULT_MB: usize = 128;
    std::env::var("SOFTRDMA_CAPTURE_RING_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&mb| mb > 0)
        .unwrap_or(DEFAULT_MB)
        .saturating_mul(1 << 20)
}

/// The made-up MAC address of an IP address.
pub fn mac_of(a: IpAddr) -> [u8; 6] {
    match a {
        IpAddr::V4(v) => {
            let o = v.octets();
            [0x02, 0x00, o[0], o[1], o[2], o[3]]
        }
        IpAddr::V6(v) => {
            let o = v.octets();
            [0x02, 0x00, o[12], o[13], o[14], o[15]]
        }
    }
}

/// One process's capture of a device: its ring, and (in the process that owns the file) the
/// file's writer.
pub(crate) struct Capture {
    ring: Arc<Ring>,
    /// The producer's position in the ring (it alone moves it).
    head: u64,
    writer: Option<Writer>,
}

impl Capture {
    /// The device's file at `path` (created or truncated), times from `epoch_mono_ns`; this
    /// process's own frames go through a ring of its own.
    pub(crate) fn to_file(path: &Path, epoch_mono_ns: u64) -> io::Result<Capture> {
        let ring = Arc::new(Ring::create(ring_bytes())?);
        let writer = Writer::create(path, epoch_mono_ns)?;
        writer.add(ring.clone(), None);
        crate::hca::watch_fork();
        Ok(Capture { ring, head: 0, writer: Some(writer) })
    }

    /// A provider's capture: frames go into `ring`, which the device's daemon drains.
    pub(crate) fn to_ring(ring: Arc<Ring>) -> Capture {
        crate::hca::watch_fork();
        let head = ring.head();
        Capture { ring, head, writer: None }
    }

    /// The file's writer, in the process that owns it.
    pub(crate) fn writer(&self) -> Option<&Writer> {
        self.writer.as_ref()
    }

    /// Captures one packet: `payload` is the UDP payload (BTH .. ICRC). `ip_id`: the IPv4 ID it
    /// left with, or `None` for a received packet (recovered from the ICRC by the writer).
    pub(crate) fn write(&mut self, src: IpAddr, dst: IpAddr, sport: u16, payload: &[u8], ip_id: Option<u16>) {
        // A forked child's copy of the device never writes into its parent's ring.
        if crate::hca::in_forked_child() {
            return;
        }
        let (hdr, n) = ip_udp_header(src, dst, sport, payload.len(), ip_id.unwrap_or(0));
        let v4 = matches!((src, dst), (IpAddr::V4(_), IpAddr::V4(_)));
        let flags = match (v4, ip_id) {
            (true, None) => ring::FIX_IPV4_ID,
            (true, Some(_)) => 0,
            (false, _) => ring::FIX_UDP6,
        };
        let eth = EthernetRepr {
            src_addr: EthernetAddress(mac_of(src)),
            dst_addr: EthernetAddress(mac_of(dst)),
            ethertype: if v4 { EtherType::Ipv4 } else { EtherType::Ipv6 },
        };
        let l = ethernet::HEADER_LEN;
        self.ring.produce(&mut self.head, l + n + payload.len(), flags, |f| {
            eth.emit(&mut EthernetFrame::new_unchecked(&mut f[..l]));
            f[l..l + n].copy_from_slice(&hdr[..n]);
            softrdma_engine::copy::copy_bytes(&mut f[l + n..], payload);
        });
    }

    /// Frames written and frames lost so far (the file's owner; a provider's are its daemon's).
    pub(crate) fn stats(&self) -> Option<(u64, u64)> {
        self.writer.as_ref().map(Writer::stats)
    }

    /// Writes out everything captured (the device stops).
    pub(crate) fn finish(&mut self) {
        if let Some(w) = &self.writer {
            w.finish();
        }
    }
}

/// CLOCK_MONOTONIC now, in ns (the clock `std::time::Instant` reads on Linux, and the same in
/// every process of the machine).
pub(crate) fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| (t.tv_sec() as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec() as u64))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
