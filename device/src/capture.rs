//! The capture tap (design D8): every packet a device sends or receives, internal loopback
//! included, written as an Ethernet frame (LINKTYPE_ETHERNET) with real IP/UDP headers so
//! Wireshark decodes it.
//!
//! Sent packets are written as the kernel sends them (IPv4 ID 0 with DF, TTL 64). A UDP socket
//! does not show a received packet's IP header, so received packets get a rebuilt one: the IPv4 ID
//! that makes the ICRC hold (the sender's real ID, recovered by solving the CRC), TTL 64, and the
//! UDP checksum recomputed over IPv6 (IPv4: 0). Loopback packets are written once, as sent. MAC
//! addresses are made up from the IP address (02:00 + the IPv4 address; locally administered).

use std::fs::File;
use std::io::{self, BufWriter};
use std::net::IpAddr;
use std::path::Path;

use softrdma_engine::device::ip_udp_header;
use softrdma_engine::wire::{
    ethernet, icrc, udp, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv6Packet, UdpPacket,
};
use softrdma_pcap::PcapWriter;

/// A capture file being written.
pub struct Tap {
    out: PcapWriter<BufWriter<File>>,
    frame: Vec<u8>,
    /// Frames written.
    pub frames: u64,
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

impl Tap {
    /// Creates (truncates) a pcap file.
    pub fn create(path: &Path) -> io::Result<Tap> {
        let f = File::create(path)?;
        let out = PcapWriter::new(BufWriter::new(f), softrdma_pcap::Resolution::Nano)?;
        Ok(Tap { out, frame: Vec::with_capacity(4200), frames: 0 })
    }

    /// Writes one packet: `payload` is the UDP payload (BTH .. ICRC). `ip_id`: the IPv4 ID, or
    /// `None` to recover it from the ICRC (received packets).
    pub fn write(
        &mut self,
        time_ns: u64,
        src: IpAddr,
        dst: IpAddr,
        sport: u16,
        payload: &[u8],
        ip_id: Option<u16>,
    ) -> io::Result<()> {
        let (hdr, n) = ip_udp_header(src, dst, sport, payload.len(), ip_id.unwrap_or(0));
        let v4 = matches!((src, dst), (IpAddr::V4(_), IpAddr::V4(_)));
        let eth = EthernetRepr {
            src_addr: EthernetAddress(mac_of(src)),
            dst_addr: EthernetAddress(mac_of(dst)),
            ethertype: if v4 { EtherType::Ipv4 } else { EtherType::Ipv6 },
        };
        self.frame.clear();
        self.frame.resize(ethernet::HEADER_LEN, 0);
        eth.emit(&mut EthernetFrame::new_unchecked(&mut self.frame[..]));
        let l3 = self.frame.len();
        self.frame.extend_from_slice(&hdr[..n]);
        self.frame.extend_from_slice(payload);
        let udp = l3 + n - udp::HEADER_LEN;
        if v4 {
            if ip_id.is_none() {
                if let Some(id) = icrc::solve_ipv4_id(&hdr[..n], payload) {
                    let mut ip = Ipv4Packet::new_unchecked(&mut self.frame[l3..udp]);
                    ip.set_ident(id);
                    ip.fill_checksum();
                }
            }
        } else {
            // RFC 8200 8.1: the UDP checksum is mandatory over IPv6.
            let ip = Ipv6Packet::new_unchecked(&self.frame[l3..udp]);
            let (s6, d6) = (ip.src_addr(), ip.dst_addr());
            UdpPacket::new_unchecked(&mut self.frame[udp..]).fill_checksum_v6(s6, d6);
        }
        self.out.write_packet(time_ns, &self.frame, self.frame.len() as u32)?;
        self.frames += 1;
        Ok(())
    }

    /// Flushes buffered frames to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        use std::io::Write;
        self.out.get_mut().flush()
    }
}

/// Where a device's captured packets go: its own capture file (a daemon, a device in a
/// process), or, for a provider running its own QPs of a daemon's device, to that daemon, which
/// writes them into the device's file (`Request::Publish`; the data-path issue's item 5).
pub(crate) enum Capture {
    /// The device's own file.
    File(Tap),
    /// Packets kept for the next report to the daemon; times on CLOCK_MONOTONIC from
    /// `epoch_mono_ns` (the device's epoch on that clock).
    Remote { epoch_mono_ns: u64, out: Vec<crate::proto::Captured> },
}

impl Capture {
    /// [`Tap::write`], or kept for the daemon (`time_ns` since the device's epoch).
    pub(crate) fn write(
        &mut self,
        time_ns: u64,
        src: IpAddr,
        dst: IpAddr,
        sport: u16,
        payload: &[u8],
        ip_id: Option<u16>,
    ) -> io::Result<()> {
        match self {
            Capture::File(t) => t.write(time_ns, src, dst, sport, payload, ip_id),
            Capture::Remote { epoch_mono_ns, out } => {
                let mono_ns = epoch_mono_ns.saturating_add(time_ns);
                out.push(crate::proto::Captured { mono_ns, src, dst, sport, ip_id, payload: payload.to_vec() });
                Ok(())
            }
        }
    }

    /// Flushes a capture file (the daemon's reports flush themselves).
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        match self {
            Capture::File(t) => t.flush(),
            Capture::Remote { .. } => Ok(()),
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
