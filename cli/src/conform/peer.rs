//! The tester's end of the wire: a RoCEv2 endpoint on UDP 4791 at the tester's own address that
//! sends the packets a case forges and hands over, in order, what the device under test sends
//! back. Every packet both ways goes into the case's capture (raw IP frames, as they were on the
//! wire, ICRC included).

use std::collections::VecDeque;
use std::fs::File;
use std::io::BufWriter;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use softrdma_engine::device::ip_udp_header;
use softrdma_engine::wire::{icrc, ROCE_V2_PORT};
use softrdma_pcap::{LinkType, PcapWriter, Resolution};
use softrdma_transport::udp::{RoceUdp, UdpConfig};

/// A packet from the DUT.
#[derive(Debug, Clone)]
pub(crate) struct Rx {
    /// The UDP payload: BTH through ICRC.
    pub(crate) payload: Vec<u8>,
    /// Whether its ICRC checked against the IP and UDP headers it came with.
    pub(crate) icrc_ok: bool,
    /// The IPv4 ID its ICRC checked with (the capture rebuilds the header with it).
    ip_id: u16,
    /// The DUT's UDP source port.
    pub(crate) src_port: u16,
}

pub(crate) struct Peer {
    udp: RoceUdp,
    local: IpAddr,
    dut: IpAddr,
    queue: VecDeque<Rx>,
    pcap: Option<PcapWriter<BufWriter<File>>>,
    /// Datagrams from addresses other than the DUT's (ignored, counted).
    pub(crate) strangers: u64,
}

impl Peer {
    /// Binds `local`:4791 for a conversation with the DUT at `dut`.
    pub(crate) fn bind(local: IpAddr, dut: IpAddr) -> Result<Peer, String> {
        let mut cfg = UdpConfig::new(local);
        // One socket: every forged packet leaves from port 4791, which its ICRC covers.
        cfg.sport_count = 0;
        let udp = RoceUdp::bind(&cfg).map_err(|e| {
            format!("the tester cannot bind its RoCE port on {local}:{ROCE_V2_PORT} ({e}); pick a free address with --local")
        })?;
        Ok(Peer { udp, local, dut, queue: VecDeque::new(), pcap: None, strangers: 0 })
    }

    /// Starts a capture of the next case into `path` (None: no capture).
    pub(crate) fn capture_to(&mut self, path: Option<&Path>) -> Result<(), String> {
        self.pcap = None;
        if let Some(p) = path {
            let f = File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let w = PcapWriter::with_linktype(BufWriter::new(f), Resolution::Nano, LinkType::RAW, 65535)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            self.pcap = Some(w);
        }
        Ok(())
    }

    /// Ends the capture (flushes it).
    pub(crate) fn end_capture(&mut self) {
        if let Some(w) = self.pcap.take() {
            let _ = w.finish();
        }
    }

    fn record(&mut self, src: IpAddr, dst: IpAddr, sport: u16, ip_id: u16, payload: &[u8]) {
        let Some(w) = self.pcap.as_mut() else { return };
        let (hdr, n) = ip_udp_header(src, dst, sport, payload.len(), ip_id);
        let mut frame = Vec::with_capacity(n + payload.len());
        frame.extend_from_slice(&hdr[..n]);
        frame.extend_from_slice(payload);
        let ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let _ = w.write_packet(ns, &frame, frame.len() as u32);
    }

    /// Sends one UDP payload (BTH through ICRC) to the DUT.
    pub(crate) fn send(&mut self, payload: &[u8]) -> Result<(), String> {
        self.udp.send(self.dut, ROCE_V2_PORT, payload).map_err(|e| format!("send to {}: {e}", self.dut))?;
        let (l, d) = (self.local, self.dut);
        self.record(l, d, ROCE_V2_PORT, 0, payload);
        Ok(())
    }

    /// The ICRC a packet from this tester to the DUT must carry.
    pub(crate) fn icrc_for(&self, payload: &[u8]) -> Option<u32> {
        let (hdr, n) = ip_udp_header(self.local, self.dut, ROCE_V2_PORT, payload.len(), 0);
        icrc::roce_v2_parts(&hdr[..n], &payload[..payload.len().checked_sub(icrc::LEN)?]).ok()
    }

    fn pump(&mut self, wait: Duration) -> Result<(), String> {
        let ms = wait.as_millis().min(60_000) as u16;
        let mut fds = [PollFd::new(self.udp.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(()),
            Err(e) => return Err(format!("poll: {e}")),
        }
        let (dut, local) = (self.dut, self.local);
        let mut got: Vec<(Rx, IpAddr)> = Vec::new();
        let mut strangers = 0u64;
        self.udp
            .recv(&mut |d| {
                if d.src.ip() != dut {
                    strangers += 1;
                    return;
                }
                let payload = d.payload.to_vec();
                let id = check_icrc(d.src.ip(), d.dst.unwrap_or(local), d.src.port(), d.segment, &payload);
                let rx = Rx { icrc_ok: id.is_some(), ip_id: id.unwrap_or(0), payload, src_port: d.src.port() };
                got.push((rx, d.src.ip()));
            })
            .map_err(|e| format!("receive: {e}"))?;
        self.strangers += strangers;
        for (rx, src) in got {
            self.record(src, local, rx.src_port, rx.ip_id, &rx.payload);
            self.queue.push_back(rx);
        }
        Ok(())
    }

    /// The DUT's next packet, waiting at most `within`.
    pub(crate) fn next(&mut self, within: Duration) -> Result<Option<Rx>, String> {
        let until = Instant::now() + within;
        loop {
            if let Some(rx) = self.queue.pop_front() {
                return Ok(Some(rx));
            }
            let now = Instant::now();
            if now >= until {
                return Ok(None);
            }
            self.pump((until - now).max(Duration::from_millis(1)))?;
        }
    }

    /// Drops what the DUT sent and nobody read (between cases).
    pub(crate) fn drain(&mut self) -> Result<usize, String> {
        self.pump(Duration::from_millis(0))?;
        let n = self.queue.len();
        self.queue.clear();
        Ok(n)
    }
}

/// IBTA A17.4.3.1: the ICRC over the headers as the sender wrote them; the IPv4 ID it checked
/// with (the hint, a GSO segment's place, or solved: a sender's kernel picks it), `None` when it
/// is wrong.
fn check_icrc(src: IpAddr, dst: IpAddr, sport: u16, segment: u16, payload: &[u8]) -> Option<u16> {
    let body_len = payload.len().checked_sub(icrc::LEN)?;
    let stored = u32::from_le_bytes(payload[body_len..].try_into().unwrap_or([0; 4]));
    let (hdr, n) = ip_udp_header(src, dst, sport, payload.len(), segment);
    if icrc::roce_v2_parts(&hdr[..n], &payload[..body_len]).ok() == Some(stored) {
        return Some(segment);
    }
    if matches!(dst, IpAddr::V4(_)) {
        icrc::solve_ipv4_id(&hdr[..n], payload)
    } else {
        None
    }
}
