//! The opcode table: for every RC, UC, UD, XRC opcode and the RoCEv2 CNP, which extension
//! headers follow the BTH (in which order), whether a payload follows, and what the packet is.
//! It drives both parsing ([`super::ib`]) and emitting, as rxe's `rxe_opcode[]` does.
//!
//! Opcode byte (IBTA Vol 1 9.2.1, table 38): bits 7-5 the transport service (000 RC, 001 UC,
//! 010 RD, 011 UD, 100 CNP (RoCEv2 Annex A17.9.3), 101 XRC (Annex A14), 110/111
//! manufacturer-specific), bits 4-0 the operation. RD is in the table so that traces of it decode
//! (softrdma does not implement the RD service). Opcodes without an entry (reserved values,
//! manufacturer-specific) still parse: their BTH is read and everything up to the ICRC is
//! payload, so they round-trip byte for byte.

use core::fmt;

use super::{aeth, atomicacketh, atomiceth, deth, ieth, immdt, rdeth, reth, xrceth};

/// An 8-bit BTH opcode. Any value is representable; [`Opcode::info`] says whether the table
/// knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// The transport service an opcode belongs to (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (000).
    Rc,
    /// Unreliable Connected (001).
    Uc,
    /// Reliable Datagram (010): decoded, not implemented.
    Rd,
    /// Unreliable Datagram (011).
    Ud,
    /// Congestion Notification Packet (100, RoCEv2).
    Cnp,
    /// Extended Reliable Connected (101).
    Xrc,
    /// Manufacturer-specific (110 and 111).
    Manufacturer,
}

impl Transport {
    /// The short name used in opcode names ("RC", "UC", ...).
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
            Transport::Manufacturer => "MANUFACTURER",
        }
    }
}

/// Which extension headers a packet carries. They always appear in this order after the BTH:
/// RDETH, DETH, XRCETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, then the CNP's reserved block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Headers(u16);

impl Headers {
    /// No extension header.
    pub const NONE: Headers = Headers(0);
    /// Datagram ETH (UD).
    pub const DETH: Headers = Headers(1 << 0);
    /// XRC ETH (XRC requests).
    pub const XRCETH: Headers = Headers(1 << 1);
    /// RDMA ETH.
    pub const RETH: Headers = Headers(1 << 2);
    /// Atomic ETH.
    pub const ATOMICETH: Headers = Headers(1 << 3);
    /// ACK ETH.
    pub const AETH: Headers = Headers(1 << 4);
    /// Atomic ACK ETH.
    pub const ATOMICACKETH: Headers = Headers(1 << 5);
    /// Immediate data.
    pub const IMMDT: Headers = Headers(1 << 6);
    /// Invalidate ETH.
    pub const IETH: Headers = Headers(1 << 7);
    /// The 16 reserved bytes of a CNP (RoCEv2 Annex A17.9.3).
    pub const CNP_RESERVED: Headers = Headers(1 << 8);
    /// Reliable Datagram ETH (RD).
    pub const RDETH: Headers = Headers(1 << 9);

    /// Every header in wire order, with its length.
    pub const ORDER: [(Headers, usize); 10] = [
        (Headers::RDETH, rdeth::HEADER_LEN),
        (Headers::DETH, deth::HEADER_LEN),
        (Headers::XRCETH, xrceth::HEADER_LEN),
        (Headers::RETH, reth::HEADER_LEN),
        (Headers::ATOMICETH, atomiceth::HEADER_LEN),
        (Headers::AETH, aeth::HEADER_LEN),
        (Headers::ATOMICACKETH, atomicacketh::HEADER_LEN),
        (Headers::IMMDT, immdt::HEADER_LEN),
        (Headers::IETH, ieth::HEADER_LEN),
        (Headers::CNP_RESERVED, CNP_RESERVED_LEN),
    ];

    /// Length of a single header (0 for an empty or multi-header set).
    pub const fn header_len(self) -> usize {
        let mut i = 0;
        while i < Self::ORDER.len() {
            if Self::ORDER[i].0 .0 == self.0 {
                return Self::ORDER[i].1;
            }
            i += 1;
        }
        0
    }

    /// Both sets.
    pub const fn union(self, other: Headers) -> Headers {
        Headers(self.0 | other.0)
    }

    /// Whether every header of `other` is in `self`.
    pub const fn contains(self, other: Headers) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total length of these extension headers in bytes.
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                total += Self::ORDER[i].1;
            }
            i += 1;
        }
        total
    }

    /// The name of a single header ("RETH", "AtomicETH", ...); "headers" for a set.
    pub const fn name(self) -> &'static str {
        match self.0 {
            x if x == Self::RDETH.0 => "RDETH",
            x if x == Self::DETH.0 => "DETH",
            x if x == Self::XRCETH.0 => "XRCETH",
            x if x == Self::RETH.0 => "RETH",
            x if x == Self::ATOMICETH.0 => "AtomicETH",
            x if x == Self::AETH.0 => "AETH",
            x if x == Self::ATOMICACKETH.0 => "AtomicAckETH",
            x if x == Self::IMMDT.0 => "ImmDt",
            x if x == Self::IETH.0 => "IETH",
            x if x == Self::CNP_RESERVED.0 => "CNP reserved block",
            _ => "headers",
        }
    }

    /// Whether there are none.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Offset of `header` from the end of the BTH, if this set has it.
    pub const fn offset_of(self, header: Headers) -> Option<usize> {
        if !self.contains(header) {
            return None;
        }
        let mut off = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if Self::ORDER[i].0 .0 == header.0 {
                return Some(off);
            }
            if self.contains(Self::ORDER[i].0) {
                off += Self::ORDER[i].1;
            }
            i += 1;
        }
        None
    }
}

/// Length of the reserved block that follows the BTH of a CNP.
pub const CNP_RESERVED_LEN: usize = 16;

/// What a packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (any variant).
    Send,
    /// RDMA WRITE (any variant).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACK or NAK.
    Acknowledge,
    /// Atomic acknowledge.
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// ATOMIC WRITE (IBTA 1.5, 9.4.6): 8 bytes written at an aligned address as one store,
    /// acknowledged by a plain ACK.
    AtomicWrite,
    /// Congestion notification.
    Cnp,
    /// RD RESYNC.
    Resync,
}

impl OpKind {
    /// Whether a requester sends it (as opposed to a responder).
    pub const fn is_request(self) -> bool {
        matches!(
            self,
            OpKind::Send
                | OpKind::Write
                | OpKind::ReadRequest
                | OpKind::CompareSwap
                | OpKind::FetchAdd
                | OpKind::AtomicWrite
                | OpKind::Resync
        )
    }
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// Whether the packet starts a message (FIRST or ONLY).
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// Whether the packet ends a message (LAST or ONLY).
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// Name as in rxe/rdma-core, e.g. `RC_SEND_ONLY`.
    pub name: &'static str,
    /// What the packet does.
    pub kind: OpKind,
    /// Where it sits in its message.
    pub position: Position,
    /// Extension headers after the BTH.
    pub headers: Headers,
    /// Whether a payload may follow the headers.
    pub payload: bool,
    /// Offset of each extension header from the end of the BTH, indexed by the header's bit
    /// (0xff: absent); precomputed so that the parser never walks [`Headers::ORDER`].
    offsets: [u8; 16],
    /// Total length of the extension headers.
    ext_len: u8,
}

impl OpcodeInfo {
    const fn new(name: &'static str, kind: OpKind, position: Position, headers: Headers, payload: bool) -> OpcodeInfo {
        let mut offsets = [0xffu8; 16];
        let mut off = 0usize;
        let mut i = 0;
        while i < Headers::ORDER.len() {
            let (h, len) = Headers::ORDER[i];
            if headers.contains(h) {
                offsets[h.0.trailing_zeros() as usize] = off as u8;
                off += len;
            }
            i += 1;
        }
        OpcodeInfo { name, kind, position, headers, payload, offsets, ext_len: off as u8 }
    }

    /// Length of BTH plus extension headers.
    pub const fn header_len(&self) -> usize {
        super::bth::HEADER_LEN + self.ext_len as usize
    }

    /// Length of the extension headers alone.
    pub const fn ext_len(&self) -> usize {
        self.ext_len as usize
    }

    /// Offset of a single extension header from the end of the BTH, if this opcode carries it.
    pub const fn offset_of(&self, header: Headers) -> Option<usize> {
        if header.0 == 0 || header.0 & (header.0 - 1) != 0 {
            return None;
        }
        match self.offsets[header.0.trailing_zeros() as usize] {
            0xff => None,
            o => Some(o as usize),
        }
    }
}

impl Opcode {
    /// `RC_SEND_FIRST` (0x00).
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// `RC_SEND_MIDDLE` (0x01).
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// `RC_SEND_LAST` (0x02).
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// `RC_SEND_LAST_WITH_IMMEDIATE` (0x03).
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    /// `RC_SEND_ONLY` (0x04).
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// `RC_SEND_ONLY_WITH_IMMEDIATE` (0x05).
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    /// `RC_RDMA_WRITE_FIRST` (0x06).
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    /// `RC_RDMA_WRITE_MIDDLE` (0x07).
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// `RC_RDMA_WRITE_LAST` (0x08).
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    /// `RC_RDMA_WRITE_LAST_WITH_IMMEDIATE` (0x09).
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    /// `RC_RDMA_WRITE_ONLY` (0x0a).
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    /// `RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE` (0x0b).
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    /// `RC_RDMA_READ_REQUEST` (0x0c).
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    /// `RC_RDMA_READ_RESPONSE_FIRST` (0x0d).
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    /// `RC_RDMA_READ_RESPONSE_MIDDLE` (0x0e).
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    /// `RC_RDMA_READ_RESPONSE_LAST` (0x0f).
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    /// `RC_RDMA_READ_RESPONSE_ONLY` (0x10).
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// `RC_ACKNOWLEDGE` (0x11).
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// `RC_ATOMIC_ACKNOWLEDGE` (0x12).
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    /// `RC_COMPARE_SWAP` (0x13).
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// `RC_FETCH_ADD` (0x14).
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// `RC_ATOMIC_WRITE` (0x1d, IBTA 1.5).
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1d);
    /// `RC_SEND_LAST_WITH_INVALIDATE` (0x16).
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    /// `RC_SEND_ONLY_WITH_INVALIDATE` (0x17).
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    /// `UC_SEND_FIRST` (0x20).
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    /// `UC_SEND_MIDDLE` (0x21).
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    /// `UC_SEND_LAST` (0x22).
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    /// `UC_SEND_LAST_WITH_IMMEDIATE` (0x23).
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    /// `UC_SEND_ONLY` (0x24).
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    /// `UC_SEND_ONLY_WITH_IMMEDIATE` (0x25).
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    /// `UC_RDMA_WRITE_FIRST` (0x26).
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    /// `UC_RDMA_WRITE_MIDDLE` (0x27).
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    /// `UC_RDMA_WRITE_LAST` (0x28).
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    /// `UC_RDMA_WRITE_LAST_WITH_IMMEDIATE` (0x29).
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    /// `UC_RDMA_WRITE_ONLY` (0x2a).
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2a);
    /// `UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE` (0x2b).
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2b);
    /// `RD_SEND_FIRST` (0x40).
    pub const RD_SEND_FIRST: Opcode = Opcode(0x40);
    /// `RD_SEND_MIDDLE` (0x41).
    pub const RD_SEND_MIDDLE: Opcode = Opcode(0x41);
    /// `RD_SEND_LAST` (0x42).
    pub const RD_SEND_LAST: Opcode = Opcode(0x42);
    /// `RD_SEND_LAST_WITH_IMMEDIATE` (0x43).
    pub const RD_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x43);
    /// `RD_SEND_ONLY` (0x44).
    pub const RD_SEND_ONLY: Opcode = Opcode(0x44);
    /// `RD_SEND_ONLY_WITH_IMMEDIATE` (0x45).
    pub const RD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x45);
    /// `RD_RDMA_WRITE_FIRST` (0x46).
    pub const RD_RDMA_WRITE_FIRST: Opcode = Opcode(0x46);
    /// `RD_RDMA_WRITE_MIDDLE` (0x47).
    pub const RD_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x47);
    /// `RD_RDMA_WRITE_LAST` (0x48).
    pub const RD_RDMA_WRITE_LAST: Opcode = Opcode(0x48);
    /// `RD_RDMA_WRITE_LAST_WITH_IMMEDIATE` (0x49).
    pub const RD_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x49);
    /// `RD_RDMA_WRITE_ONLY` (0x4a).
    pub const RD_RDMA_WRITE_ONLY: Opcode = Opcode(0x4a);
    /// `RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE` (0x4b).
    pub const RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x4b);
    /// `RD_RDMA_READ_REQUEST` (0x4c).
    pub const RD_RDMA_READ_REQUEST: Opcode = Opcode(0x4c);
    /// `RD_RDMA_READ_RESPONSE_FIRST` (0x4d).
    pub const RD_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x4d);
    /// `RD_RDMA_READ_RESPONSE_MIDDLE` (0x4e).
    pub const RD_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x4e);
    /// `RD_RDMA_READ_RESPONSE_LAST` (0x4f).
    pub const RD_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x4f);
    /// `RD_RDMA_READ_RESPONSE_ONLY` (0x50).
    pub const RD_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x50);
    /// `RD_ACKNOWLEDGE` (0x51).
    pub const RD_ACKNOWLEDGE: Opcode = Opcode(0x51);
    /// `RD_ATOMIC_ACKNOWLEDGE` (0x52).
    pub const RD_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x52);
    /// `RD_COMPARE_SWAP` (0x53).
    pub const RD_COMPARE_SWAP: Opcode = Opcode(0x53);
    /// `RD_FETCH_ADD` (0x54).
    pub const RD_FETCH_ADD: Opcode = Opcode(0x54);
    /// `RD_RESYNC` (0x55).
    pub const RD_RESYNC: Opcode = Opcode(0x55);
    /// `UD_SEND_ONLY` (0x64).
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// `UD_SEND_ONLY_WITH_IMMEDIATE` (0x65).
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    /// `CNP` (0x81).
    pub const CNP: Opcode = Opcode(0x81);
    /// `XRC_SEND_FIRST` (0xa0).
    pub const XRC_SEND_FIRST: Opcode = Opcode(0xa0);
    /// `XRC_SEND_MIDDLE` (0xa1).
    pub const XRC_SEND_MIDDLE: Opcode = Opcode(0xa1);
    /// `XRC_SEND_LAST` (0xa2).
    pub const XRC_SEND_LAST: Opcode = Opcode(0xa2);
    /// `XRC_SEND_LAST_WITH_IMMEDIATE` (0xa3).
    pub const XRC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0xa3);
    /// `XRC_SEND_ONLY` (0xa4).
    pub const XRC_SEND_ONLY: Opcode = Opcode(0xa4);
    /// `XRC_SEND_ONLY_WITH_IMMEDIATE` (0xa5).
    pub const XRC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0xa5);
    /// `XRC_RDMA_WRITE_FIRST` (0xa6).
    pub const XRC_RDMA_WRITE_FIRST: Opcode = Opcode(0xa6);
    /// `XRC_RDMA_WRITE_MIDDLE` (0xa7).
    pub const XRC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0xa7);
    /// `XRC_RDMA_WRITE_LAST` (0xa8).
    pub const XRC_RDMA_WRITE_LAST: Opcode = Opcode(0xa8);
    /// `XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE` (0xa9).
    pub const XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0xa9);
    /// `XRC_RDMA_WRITE_ONLY` (0xaa).
    pub const XRC_RDMA_WRITE_ONLY: Opcode = Opcode(0xaa);
    /// `XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE` (0xab).
    pub const XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0xab);
    /// `XRC_RDMA_READ_REQUEST` (0xac).
    pub const XRC_RDMA_READ_REQUEST: Opcode = Opcode(0xac);
    /// `XRC_RDMA_READ_RESPONSE_FIRST` (0xad).
    pub const XRC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0xad);
    /// `XRC_RDMA_READ_RESPONSE_MIDDLE` (0xae).
    pub const XRC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0xae);
    /// `XRC_RDMA_READ_RESPONSE_LAST` (0xaf).
    pub const XRC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0xaf);
    /// `XRC_RDMA_READ_RESPONSE_ONLY` (0xb0).
    pub const XRC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0xb0);
    /// `XRC_ACKNOWLEDGE` (0xb1).
    pub const XRC_ACKNOWLEDGE: Opcode = Opcode(0xb1);
    /// `XRC_ATOMIC_ACKNOWLEDGE` (0xb2).
    pub const XRC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0xb2);
    /// `XRC_COMPARE_SWAP` (0xb3).
    pub const XRC_COMPARE_SWAP: Opcode = Opcode(0xb3);
    /// `XRC_FETCH_ADD` (0xb4).
    pub const XRC_FETCH_ADD: Opcode = Opcode(0xb4);
    /// `XRC_ATOMIC_WRITE` (0xbd, IBTA 1.5).
    pub const XRC_ATOMIC_WRITE: Opcode = Opcode(0xbd);
    /// `XRC_SEND_LAST_WITH_INVALIDATE` (0xb6).
    pub const XRC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0xb6);
    /// `XRC_SEND_ONLY_WITH_INVALIDATE` (0xb7).
    pub const XRC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0xb7);

    /// The transport service (top three bits).
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Manufacturer,
        }
    }

    /// The table row, or `None` for reserved, RD and manufacturer-specific opcodes.
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[usize::from(self.0)].as_ref()
    }

    /// The name (`RC_SEND_ONLY`), or `None` when the table has no entry.
    pub fn name(self) -> Option<&'static str> {
        self.info().map(|i| i.name)
    }
}

impl fmt::Display for Opcode {
    /// The table name, or `RESERVED_0xNN` (`MANUFACTURER_0xNN`) for an opcode without an entry.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None if self.transport() == Transport::Manufacturer => write!(f, "MANUFACTURER_{:#04x}", self.0),
            None => write!(f, "RESERVED_{:#04x}", self.0),
        }
    }
}

/// Operations shared by RC, UC and XRC: low five opcode bits, name suffix, kind, position,
/// headers (XRCETH is added for XRC requests), payload.
const OPS: [(u8, &str, OpKind, Position, Headers, bool); 24] = {
    use OpKind::*;
    use Position::*;
    const N: Headers = Headers::NONE;
    const R: Headers = Headers::RETH;
    const A: Headers = Headers::AETH;
    const I: Headers = Headers::IMMDT;
    [
        (0x00, "SEND_FIRST", Send, First, N, true),
        (0x01, "SEND_MIDDLE", Send, Middle, N, true),
        (0x02, "SEND_LAST", Send, Last, N, true),
        (0x03, "SEND_LAST_WITH_IMMEDIATE", Send, Last, I, true),
        (0x04, "SEND_ONLY", Send, Only, N, true),
        (0x05, "SEND_ONLY_WITH_IMMEDIATE", Send, Only, I, true),
        (0x06, "RDMA_WRITE_FIRST", Write, First, R, true),
        (0x07, "RDMA_WRITE_MIDDLE", Write, Middle, N, true),
        (0x08, "RDMA_WRITE_LAST", Write, Last, N, true),
        (0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", Write, Last, I, true),
        (0x0a, "RDMA_WRITE_ONLY", Write, Only, R, true),
        (0x0b, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write, Only, R.union(I), true),
        (0x0c, "RDMA_READ_REQUEST", ReadRequest, Only, R, false),
        (0x0d, "RDMA_READ_RESPONSE_FIRST", ReadResponse, First, A, true),
        (0x0e, "RDMA_READ_RESPONSE_MIDDLE", ReadResponse, Middle, N, true),
        (0x0f, "RDMA_READ_RESPONSE_LAST", ReadResponse, Last, A, true),
        (0x10, "RDMA_READ_RESPONSE_ONLY", ReadResponse, Only, A, true),
        (0x11, "ACKNOWLEDGE", Acknowledge, Only, A, false),
        (0x12, "ATOMIC_ACKNOWLEDGE", AtomicAcknowledge, Only, A.union(Headers::ATOMICACKETH), false),
        (0x13, "COMPARE_SWAP", CompareSwap, Only, Headers::ATOMICETH, false),
        (0x14, "FETCH_ADD", FetchAdd, Only, Headers::ATOMICETH, false),
        (0x16, "SEND_LAST_WITH_INVALIDATE", Send, Last, Headers::IETH, true),
        (0x17, "SEND_ONLY_WITH_INVALIDATE", Send, Only, Headers::IETH, true),
        // IBTA 1.5 (and Linux rxe since 6.2): RETH and exactly 8 bytes of payload.
        (0x1d, "ATOMIC_WRITE", AtomicWrite, Only, R, true),
    ]
};

/// The name of every tabled opcode (listed whole: const string concatenation is not available).
const NAMES: [(u8, &str); 85] = [
    (0x00, "RC_SEND_FIRST"),
    (0x01, "RC_SEND_MIDDLE"),
    (0x02, "RC_SEND_LAST"),
    (0x03, "RC_SEND_LAST_WITH_IMMEDIATE"),
    (0x04, "RC_SEND_ONLY"),
    (0x05, "RC_SEND_ONLY_WITH_IMMEDIATE"),
    (0x06, "RC_RDMA_WRITE_FIRST"),
    (0x07, "RC_RDMA_WRITE_MIDDLE"),
    (0x08, "RC_RDMA_WRITE_LAST"),
    (0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE"),
    (0x0a, "RC_RDMA_WRITE_ONLY"),
    (0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
    (0x0c, "RC_RDMA_READ_REQUEST"),
    (0x0d, "RC_RDMA_READ_RESPONSE_FIRST"),
    (0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE"),
    (0x0f, "RC_RDMA_READ_RESPONSE_LAST"),
    (0x10, "RC_RDMA_READ_RESPONSE_ONLY"),
    (0x11, "RC_ACKNOWLEDGE"),
    (0x12, "RC_ATOMIC_ACKNOWLEDGE"),
    (0x13, "RC_COMPARE_SWAP"),
    (0x14, "RC_FETCH_ADD"),
    (0x16, "RC_SEND_LAST_WITH_INVALIDATE"),
    (0x17, "RC_SEND_ONLY_WITH_INVALIDATE"),
    (0x1d, "RC_ATOMIC_WRITE"),
    (0x20, "UC_SEND_FIRST"),
    (0x21, "UC_SEND_MIDDLE"),
    (0x22, "UC_SEND_LAST"),
    (0x23, "UC_SEND_LAST_WITH_IMMEDIATE"),
    (0x24, "UC_SEND_ONLY"),
    (0x25, "UC_SEND_ONLY_WITH_IMMEDIATE"),
    (0x26, "UC_RDMA_WRITE_FIRST"),
    (0x27, "UC_RDMA_WRITE_MIDDLE"),
    (0x28, "UC_RDMA_WRITE_LAST"),
    (0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE"),
    (0x2a, "UC_RDMA_WRITE_ONLY"),
    (0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
    (0x40, "RD_SEND_FIRST"),
    (0x41, "RD_SEND_MIDDLE"),
    (0x42, "RD_SEND_LAST"),
    (0x43, "RD_SEND_LAST_WITH_IMMEDIATE"),
    (0x44, "RD_SEND_ONLY"),
    (0x45, "RD_SEND_ONLY_WITH_IMMEDIATE"),
    (0x46, "RD_RDMA_WRITE_FIRST"),
    (0x47, "RD_RDMA_WRITE_MIDDLE"),
    (0x48, "RD_RDMA_WRITE_LAST"),
    (0x49, "RD_RDMA_WRITE_LAST_WITH_IMMEDIATE"),
    (0x4a, "RD_RDMA_WRITE_ONLY"),
    (0x4b, "RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
    (0x4c, "RD_RDMA_READ_REQUEST"),
    (0x4d, "RD_RDMA_READ_RESPONSE_FIRST"),
    (0x4e, "RD_RDMA_READ_RESPONSE_MIDDLE"),
    (0x4f, "RD_RDMA_READ_RESPONSE_LAST"),
    (0x50, "RD_RDMA_READ_RESPONSE_ONLY"),
    (0x51, "RD_ACKNOWLEDGE"),
    (0x52, "RD_ATOMIC_ACKNOWLEDGE"),
    (0x53, "RD_COMPARE_SWAP"),
    (0x54, "RD_FETCH_ADD"),
    (0x55, "RD_RESYNC"),
    (0x64, "UD_SEND_ONLY"),
    (0x65, "UD_SEND_ONLY_WITH_IMMEDIATE"),
    (0x81, "CNP"),
    (0xa0, "XRC_SEND_FIRST"),
    (0xa1, "XRC_SEND_MIDDLE"),
    (0xa2, "XRC_SEND_LAST"),
    (0xa3, "XRC_SEND_LAST_WITH_IMMEDIATE"),
    (0xa4, "XRC_SEND_ONLY"),
    (0xa5, "XRC_SEND_ONLY_WITH_IMMEDIATE"),
    (0xa6, "XRC_RDMA_WRITE_FIRST"),
    (0xa7, "XRC_RDMA_WRITE_MIDDLE"),
    (0xa8, "XRC_RDMA_WRITE_LAST"),
    (0xa9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE"),
    (0xaa, "XRC_RDMA_WRITE_ONLY"),
    (0xab, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
    (0xac, "XRC_RDMA_READ_REQUEST"),
    (0xad, "XRC_RDMA_READ_RESPONSE_FIRST"),
    (0xae, "XRC_RDMA_READ_RESPONSE_MIDDLE"),
    (0xaf, "XRC_RDMA_READ_RESPONSE_LAST"),
    (0xb0, "XRC_RDMA_READ_RESPONSE_ONLY"),
    (0xb1, "XRC_ACKNOWLEDGE"),
    (0xb2, "XRC_ATOMIC_ACKNOWLEDGE"),
    (0xb3, "XRC_COMPARE_SWAP"),
    (0xb4, "XRC_FETCH_ADD"),
    (0xbd, "XRC_ATOMIC_WRITE"),
    (0xb6, "XRC_SEND_LAST_WITH_INVALIDATE"),
    (0xb7, "XRC_SEND_ONLY_WITH_INVALIDATE"),
];

const fn name_of(op: u8) -> &'static str {
    let mut i = 0;
    while i < NAMES.len() {
        if NAMES[i].0 == op {
            return NAMES[i].1;
        }
        i += 1;
    }
    panic!("opcode table: missing name")
}

/// The table: one optional row per opcode value, built at compile time.
static TABLE: [Option<OpcodeInfo>; 256] = build_table();

const fn build_table() -> [Option<OpcodeInfo>; 256] {
    let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
    let mut i = 0;
    while i < OPS.len() {
        let (low, _, kind, position, headers, payload) = OPS[i];
        // RC: every operation.
        t[low as usize] = Some(OpcodeInfo::new(name_of(low), kind, position, headers, payload));
        // UC: SEND and RDMA WRITE only (IBTA Vol 1 table 38).
        if low <= 0x0b {
            let op = 0x20 | low;
            t[op as usize] = Some(OpcodeInfo::new(name_of(op), kind, position, headers, payload));
        }
        // RD: every operation; an RDETH on every packet, a DETH on requests (IBTA 9.3.1, 9.3.2).
        // RD has no SEND with invalidate.
        if low <= 0x14 {
            let op = 0x40 | low;
            let rd = if kind.is_request() { Headers::RDETH.union(Headers::DETH) } else { Headers::RDETH };
            t[op as usize] = Some(OpcodeInfo::new(name_of(op), kind, position, headers.union(rd), payload));
        }
        // XRC: every RC operation; requests carry an XRCETH right after the BTH (Annex A14).
        let op = 0xa0 | low;
        let headers = if kind.is_request() { headers.union(Headers::XRCETH) } else { headers };
        t[op as usize] = Some(OpcodeInfo::new(name_of(op), kind, position, headers, payload));
        i += 1;
    }
    // RD RESYNC: RDETH and DETH, no payload.
    t[0x55] = Some(OpcodeInfo::new(
        name_of(0x55),
        OpKind::Resync,
        Position::Only,
        Headers::RDETH.union(Headers::DETH),
        false,
    ));
    // UD: SEND_ONLY with DETH, and with DETH + ImmDt.
    t[0x64] = Some(OpcodeInfo::new(name_of(0x64), OpKind::Send, Position::Only, Headers::DETH, true));
    t[0x65] =
        Some(OpcodeInfo::new(name_of(0x65), OpKind::Send, Position::Only, Headers::DETH.union(Headers::IMMDT), true));
    // CNP: BTH, 16 reserved bytes, ICRC (RoCEv2 Annex A17.9.3).
    t[0x81] = Some(OpcodeInfo::new(name_of(0x81), OpKind::Cnp, Position::Only, Headers::CNP_RESERVED, false));
    t
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn table_has_every_service() {
        let known: Vec<u8> = (0..=255u8).filter(|&o| Opcode(o).info().is_some()).collect();
        // 24 RC, 12 UC, 22 RD, 2 UD, 1 CNP, 24 XRC.
        assert_eq!(known.len(), 85);
        for &(op, name) in NAMES.iter() {
            assert_eq!(Opcode(op).name(), Some(name));
        }
    }

    #[test]
    fn header_layouts() {
        let i = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(i.header_len(), 12 + 16 + 4);
        assert_eq!(i.headers.offset_of(Headers::IMMDT), Some(16));
        let i = Opcode::XRC_RDMA_WRITE_FIRST.info().unwrap();
        assert_eq!(i.headers.offset_of(Headers::XRCETH), Some(0));
        assert_eq!(i.headers.offset_of(Headers::RETH), Some(4));
        let i = Opcode::XRC_ACKNOWLEDGE.info().unwrap();
        assert!(!i.headers.contains(Headers::XRCETH), "responses carry no XRCETH");
        let i = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap();
        assert_eq!(i.headers.offset_of(Headers::ATOMICACKETH), Some(4));
        assert_eq!(i.header_len(), 24);
        let i = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(i.headers.offset_of(Headers::IMMDT), Some(8));
        assert_eq!(Opcode::CNP.info().unwrap().header_len(), 28);
        assert_eq!(Opcode::RC_COMPARE_SWAP.info().unwrap().header_len(), 40);
        let i = Opcode::RD_RDMA_WRITE_ONLY.info().unwrap();
        assert_eq!(i.headers.offset_of(Headers::DETH), Some(4));
        assert_eq!(i.headers.offset_of(Headers::RETH), Some(12));
        let i = Opcode::RD_ACKNOWLEDGE.info().unwrap();
        assert_eq!(i.headers.offset_of(Headers::AETH), Some(4));
        assert!(!i.headers.contains(Headers::DETH));
        assert_eq!(Opcode::XRC_FETCH_ADD.info().unwrap().header_len(), 44);
    }

    #[test]
    fn reserved_opcodes_have_names_for_display() {
        assert_eq!(Opcode(0x1f).info(), None);
        assert_eq!(Opcode(0x1f).to_string(), "RESERVED_0x1f");
        assert_eq!(Opcode(0x4a).transport(), Transport::Rd);
        assert_eq!(Opcode(0x4a).to_string(), "RD_RDMA_WRITE_ONLY");
        assert_eq!(Opcode(0x5f).to_string(), "RESERVED_0x5f");
        assert_eq!(Opcode(0xc3).to_string(), "MANUFACTURER_0xc3");
        assert_eq!(Opcode(0x2c).info(), None, "UC has no READ");
        assert_eq!(Opcode::RC_SEND_ONLY.to_string(), "RC_SEND_ONLY");
    }
}
