//! Trace analysis: what each captured frame holds, read as far as its bytes allow, and a summary
//! of a whole capture (`softrdma pcap decode` and `softrdma pcap check` print these).
//!
//! A frame is IB when it is RoCEv2 (UDP destination port 4791 over IPv4 or IPv6) or RoCEv1
//! (ethertype 0x8915). Frames cut short by the capture's snap length are *truncated*: their
//! headers are decoded as far as the captured bytes go and their ICRC cannot be checked, which is
//! not an error of the packet. A packet whose own lengths are inconsistent (a header cut off
//! before the ICRC, a pad count beyond the payload, ...) is *malformed*.
//!
//! A UD SEND_ONLY to QP1 carries a management datagram; when it is a CM MAD (IBTA Vol 1 ch. 12),
//! [`IbFrame::cm`] holds it decoded, or why it is not a valid CM MAD. A bad MAD is not an error
//! of the IB packet.

use std::collections::BTreeMap;
use std::net::IpAddr;

use softrdma_engine::wire::roce::{self, Dissection, L3Repr};

use crate::LinkType;
use softrdma_engine::wire::{
    aeth, atomicacketh, atomiceth, bth, deth, icrc, ieth, immdt, rdeth, reth, xrceth, AethRepr, AtomicAckEthRepr,
    AtomicEthRepr, BthRepr, DethRepr, Error as WireError, EtherType, Headers, IbPacket, IethRepr, ImmDtRepr, RdethRepr,
    RethRepr, XrcEthRepr,
};
use softrdma_engine::wire::{CmMadRepr, Opcode, MAD_LEN};

/// The network layer of an IB frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3Kind {
    /// RoCEv2 over IPv4.
    Ipv4,
    /// RoCEv2 over IPv6.
    Ipv6,
    /// RoCEv1 (GRH).
    Grh,
}

impl L3Kind {
    /// "ipv4", "ipv6" or "grh".
    pub fn name(self) -> &'static str {
        match self {
            L3Kind::Ipv4 => "ipv4",
            L3Kind::Ipv6 => "ipv6",
            L3Kind::Grh => "grh",
        }
    }
}

/// The IB transport headers of a frame, each present when the opcode carries it and the
/// captured bytes hold it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IbHeaders {
    /// BTH.
    pub bth: Option<BthRepr>,
    /// RDETH.
    pub rdeth: Option<RdethRepr>,
    /// DETH.
    pub deth: Option<DethRepr>,
    /// XRCETH.
    pub xrceth: Option<XrcEthRepr>,
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomiceth: Option<AtomicEthRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomicacketh: Option<AtomicAckEthRepr>,
    /// ImmDt.
    pub immdt: Option<ImmDtRepr>,
    /// IETH.
    pub ieth: Option<IethRepr>,
}

/// What an IB frame holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbFrame {
    /// Network layer kind.
    pub l3: L3Kind,
    /// Source IP address (SGID for RoCEv1).
    pub src: IpAddr,
    /// Destination IP address (DGID for RoCEv1).
    pub dst: IpAddr,
    /// UDP source port (RoCEv2 only).
    pub sport: Option<u16>,
    /// UDP destination port (RoCEv2 only).
    pub dport: Option<u16>,
    /// The transport headers read.
    pub headers: IbHeaders,
    /// Payload length without pad, from the packet's declared length (known even when the
    /// capture cut the frame), if the headers could be read.
    pub payload_len: Option<usize>,
    /// The ICRC's four bytes as on the wire, when the whole packet was captured.
    pub icrc: Option<[u8; 4]>,
    /// Whether the ICRC is right (false when it could not be checked).
    pub icrc_ok: bool,
    /// What is wrong with the packet itself (not the capture), if anything.
    pub error: Option<String>,
    /// For a UD SEND_ONLY to QP1 (the GSI QP, where CM MADs travel): the payload read as a CM
    /// MAD, or why it is not one. `None` for every other packet.
    pub cm: Option<Result<CmMadRepr, WireError>>,
}

impl IbFrame {
    /// Whether the packet is malformed (an error other than the capture cutting it).
    pub fn is_malformed(&self) -> bool {
        self.error.is_some()
    }

    /// Whether the ICRC was checked and is wrong.
    pub fn has_bad_icrc(&self) -> bool {
        self.icrc.is_some() && !self.icrc_ok
    }
}

/// One captured frame, analysed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameSummary {
    /// Frame number, from 1.
    pub frame: u64,
    /// Whether the capture holds fewer bytes than were on the wire.
    pub truncated: bool,
    /// The IB content, if the frame is IB.
    pub ib: Option<IbFrame>,
}

/// The engine's dissection of a frame for the link types this crate reads (one dispatch for
/// `summarize` and the behaviour analysis).
pub(crate) fn dissect_linktype(linktype: LinkType, data: &[u8]) -> Option<Dissection<'_>> {
    let ip_version = |d: &[u8]| match d.first().map(|b| b >> 4) {
        Some(4) => EtherType::Ipv4,
        Some(6) => EtherType::Ipv6,
        _ => EtherType::Unknown(0),
    };
    match linktype {
        LinkType::ETHERNET => Some(roce::dissect(data)),
        LinkType::RAW | LinkType::IPV4 | LinkType::IPV6 => Some(roce::dissect_network_layer(ip_version(data), data)),
        LinkType::LINUX_SLL if data.len() >= 16 => {
            let et = EtherType::from(u16::from_be_bytes([data[14], data[15]]));
            Some(roce::dissect_network_layer(et, &data[16..]))
        }
        LinkType::LINUX_SLL2 if data.len() >= 20 => {
            let et = EtherType::from(u16::from_be_bytes([data[0], data[1]]));
            Some(roce::dissect_network_layer(et, &data[20..]))
        }
        _ => None,
    }
}

/// Reads the transport headers present in `bytes` (`body_end`: where the headers must stop).
fn read_headers(bytes: &[u8], body_end: usize) -> (IbHeaders, Option<WireError>) {
    let mut h = IbHeaders::default();
    let Ok(b) = bth::Packet::new_checked(bytes) else {
        return (h, Some(WireError::Truncated("BTH")));
    };
    let Ok(bth_repr) = BthRepr::parse(&b) else {
        return (h, Some(WireError::Truncated("BTH")));
    };
    h.bth = Some(bth_repr);
    let Some(info) = bth_repr.opcode.info() else {
        return (h, None);
    };
    let mut off = bth::HEADER_LEN;
    for (kind, len) in Headers::ORDER {
        if !info.headers.contains(kind) {
            continue;
        }
        if off + len > body_end.min(bytes.len()) {
            return (h, Some(WireError::Truncated(kind.name())));
        }
        let x = &bytes[off..off + len];
        match kind {
            Headers::RDETH => h.rdeth = RdethRepr::parse(&rdeth::Packet::new_unchecked(x)).ok(),
            Headers::DETH => h.deth = DethRepr::parse(&deth::Packet::new_unchecked(x)).ok(),
            Headers::XRCETH => h.xrceth = XrcEthRepr::parse(&xrceth::Packet::new_unchecked(x)).ok(),
            Headers::RETH => h.reth = RethRepr::parse(&reth::Packet::new_unchecked(x)).ok(),
            Headers::ATOMICETH => h.atomiceth = AtomicEthRepr::parse(&atomiceth::Packet::new_unchecked(x)).ok(),
            Headers::AETH => h.aeth = AethRepr::parse(&aeth::Packet::new_unchecked(x)).ok(),
            Headers::ATOMICACKETH => {
                h.atomicacketh = AtomicAckEthRepr::parse(&atomicacketh::Packet::new_unchecked(x)).ok()
            }
            Headers::IMMDT => h.immdt = ImmDtRepr::parse(&immdt::Packet::new_unchecked(x)).ok(),
            Headers::IETH => h.ieth = IethRepr::parse(&ieth::Packet::new_unchecked(x)).ok(),
            _ => {}
        }
        off += len;
    }
    (h, None)
}

/// Analyses one captured frame. `record_truncated`: the capture record says it holds fewer bytes
/// than the wire did (captured length below original length). Never panics, whatever the bytes.
///
/// A frame also counts as truncated when it holds fewer bytes than its IP (or GRH) header
/// declares: some capture tools cut frames and rewrite the record lengths to match (the
/// `rdma-nccl2` trace does), and a sender never puts such a frame on the wire. A packet whose
/// network-layer lengths are consistent but whose transport headers do not fit is malformed.
pub fn summarize(frame: u64, linktype: LinkType, data: &[u8], record_truncated: bool) -> FrameSummary {
    let mut s = FrameSummary { frame, truncated: record_truncated, ib: None };
    let Some(d) = dissect_linktype(linktype, data) else {
        return s;
    };
    if !d.roce {
        return s;
    }
    let Some(l3) = d.l3 else {
        return s;
    };
    let l3_kind = match l3 {
        L3Repr::Ipv4(_) => L3Kind::Ipv4,
        L3Repr::Ipv6(_) => L3Kind::Ipv6,
        L3Repr::Grh(_) => L3Kind::Grh,
    };
    let mut ib = IbFrame {
        l3: l3_kind,
        src: l3.src_addr(),
        dst: l3.dst_addr(),
        sport: d.udp.map(|u| u.src_port),
        dport: d.udp.map(|u| u.dst_port),
        headers: IbHeaders::default(),
        payload_len: None,
        icrc: None,
        icrc_ok: false,
        error: None,
        cm: None,
    };
    // A packet the capture cut short: not the packet's fault, as long as what is there is sane.
    // (The frame ends before the end its IP/GRH header declares; inconsistent lengths within the
    // packet are a Malformed error of the dissection instead.)
    let cut_by_capture = d.ib_bytes.len() < d.ib_declared_len && !matches!(d.error, Some(WireError::Malformed(_)));
    if cut_by_capture {
        s.truncated = true;
    }
    let below_transport_error = d.error.filter(|e| !(cut_by_capture && matches!(e, WireError::Truncated(_))));
    let body_end = d.ib_declared_len.saturating_sub(icrc::LEN);
    let (headers, header_error) = read_headers(d.ib_bytes, body_end);
    ib.headers = headers;
    let header_len = ib.headers.bth.map(|b| bth::HEADER_LEN + b.opcode.info().map_or(0, |i| i.headers.len()));
    if let (Some(hl), Some(b)) = (header_len, ib.headers.bth) {
        ib.payload_len = body_end.checked_sub(hl + usize::from(b.pad_count));
    }
    if let (Some(hl), Some(b)) = (header_len, ib.headers.bth) {
        ib.cm = cm_mad(b, d.ib_bytes, hl, body_end.saturating_sub(usize::from(b.pad_count)));
    }
    if let Some(e) = below_transport_error {
        ib.error = Some(e.to_string());
    } else if d.is_complete() {
        match IbPacket::new_checked(d.ib_bytes) {
            Ok(p) => ib.payload_len = Some(p.payload().len()),
            Err(e) => ib.error = Some(e.to_string()),
        }
        if let Some(stored) = d.stored_icrc() {
            if d.ib_bytes.len() >= bth::HEADER_LEN + icrc::LEN {
                ib.icrc = Some(stored.to_le_bytes());
                ib.icrc_ok = d.icrc_ok().unwrap_or(false);
            }
        }
    } else if !cut_by_capture {
        // Complete per the capture, yet shorter than declared: the packet itself is broken.
        ib.error = Some(header_error.unwrap_or(WireError::Truncated("transport packet")).to_string());
    } else if let Some(WireError::Malformed(m)) = header_error {
        ib.error = Some(WireError::Malformed(m).to_string());
    }
    s.ib = Some(ib);
    s
}

/// The CM MAD of a GSI packet: a UD SEND_ONLY to QP1 (IBTA Vol 1 13.5.1: MADs for the GSI travel
/// on QP1; 12.6: CM is a GSI class). Reads the payload as far as the captured bytes go (a frame the
/// capture cut shows as a truncated MAD); anything but a valid CM MAD is the error.
fn cm_mad(
    bth: BthRepr,
    ib_bytes: &[u8],
    header_len: usize,
    payload_end: usize,
) -> Option<Result<CmMadRepr, WireError>> {
    if bth.opcode != Opcode::UD_SEND_ONLY || bth.dest_qp.value() != 1 {
        return None;
    }
    let end = payload_end.min(ib_bytes.len()).min(header_len + MAD_LEN);
    let payload = ib_bytes.get(header_len..end).unwrap_or(&[]);
    Some(CmMadRepr::parse(payload))
}

/// Counts over a whole capture, for `softrdma pcap check`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Frames read.
    pub frames: u64,
    /// IB frames among them.
    pub ib_packets: u64,
    /// IB frames per opcode.
    pub opcodes: BTreeMap<u8, u64>,
    /// IB frames whose ICRC was checked and is right.
    pub good_icrc: u64,
    /// IB frames whose ICRC was checked and is wrong.
    pub bad_icrc: u64,
    /// IB frames that are malformed.
    pub malformed: u64,
    /// Frames the capture cut short.
    pub truncated: u64,
    /// IB frames whose ICRC could not be checked (cut by the capture).
    pub icrc_unchecked: u64,
    /// Frame numbers of the first few problems (malformed or bad ICRC), with the reason.
    pub first_problems: Vec<(u64, String)>,
}

impl CheckReport {
    /// Adds one frame.
    pub fn add(&mut self, s: &FrameSummary) {
        self.frames += 1;
        if s.truncated {
            self.truncated += 1;
        }
        let Some(ib) = &s.ib else { return };
        self.ib_packets += 1;
        if let Some(b) = ib.headers.bth {
            *self.opcodes.entry(b.opcode.0).or_default() += 1;
        }
        let mut problem = None;
        if let Some(e) = &ib.error {
            self.malformed += 1;
            problem = Some(format!("malformed: {e}"));
        }
        if ib.icrc.is_some() && ib.icrc_ok {
            self.good_icrc += 1;
        }
        if ib.has_bad_icrc() {
            self.bad_icrc += 1;
            problem.get_or_insert_with(|| "bad ICRC".to_string());
        }
        if ib.icrc.is_none() && ib.error.is_none() {
            self.icrc_unchecked += 1;
        }
        if let Some(p) = problem {
            if self.first_problems.len() < 10 {
                self.first_problems.push((s.frame, p));
            }
        }
    }

    /// Whether no IB frame is malformed or has a bad ICRC.
    pub fn is_clean(&self) -> bool {
        self.bad_icrc == 0 && self.malformed == 0
    }
}
