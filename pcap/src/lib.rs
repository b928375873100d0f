//! # softrdma-pcap
//!
//! Capture files for softrdma: reading the traces that real hardware and Linux rxe recorded, and
//! writing the ones the emulated device records (docs/architecture.md D8).
//!
//! It holds:
//! - [`Reader`], an iterator of [`Record`]s over a classic pcap file (either byte order, microsecond
//!   or nanosecond timestamps) or a pcapng file (any number of sections and interfaces, Enhanced,
//!   Simple and obsolete Packet Blocks). The container formats are parsed by the `pcap-parser` crate;
//!   this crate turns its blocks into records with one timestamp unit and one frame count.
//! - [`PcapWriter`] (classic pcap) and [`PcapngWriter`] (pcapng with section, interface and
//!   per-packet comments), small hand-written emitters.
//!
//! Guarantees:
//! - Reading untrusted input never panics and always ends: a damaged or cut-off file yields the
//!   records before the damage, then one [`Error`], then nothing.
//! - Memory follows the input, not its length fields: the read buffer grows only once it is full of
//!   real bytes, and never past [`MAX_BLOCK_LEN`].
//! - Records count frames as Wireshark numbers them (1-based, packet records only) and carry
//!   timestamps in nanoseconds since the Unix epoch, whatever the file's resolution.
//! - No `unsafe` code.
//!
//! What the reader and writers never do: look inside a frame (decoding is `softrdma-engine`'s
//! `wire` module), open network interfaces, or read the clock (timestamps are passed in).
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod analyze;
pub mod behaviour;
mod read;
pub mod replay;
mod replay_cm;
pub mod samples;
mod write;

pub use read::{Reader, MAX_BLOCK_LEN};
pub use write::{record_header, PcapWriter, PcapngOptions, PcapngWriter, Resolution, DEFAULT_SNAPLEN};

use std::fmt;
use std::io;

/// A link-layer header type from the tcpdump.org registry (`LINKTYPE_*`).
///
/// Values this crate has no name for pass through unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkType(pub u16);

impl LinkType {
    /// `LINKTYPE_NULL`: BSD loopback.
    pub const NULL: LinkType = LinkType(0);
    /// `LINKTYPE_ETHERNET`: Ethernet II / 802.3 frames without FCS; what softrdma writes.
    pub const ETHERNET: LinkType = LinkType(1);
    /// `LINKTYPE_RAW`: raw IPv4 or IPv6, no link-layer header.
    pub const RAW: LinkType = LinkType(101);
    /// `LINKTYPE_LINUX_SLL`: Linux "cooked" capture (`tcpdump -i any`).
    pub const LINUX_SLL: LinkType = LinkType(113);
    /// `LINKTYPE_IPV4`: raw IPv4.
    pub const IPV4: LinkType = LinkType(228);
    /// `LINKTYPE_IPV6`: raw IPv6.
    pub const IPV6: LinkType = LinkType(229);
    /// `LINKTYPE_LINUX_SLL2`: Linux "cooked" capture, version 2.
    pub const LINUX_SLL2: LinkType = LinkType(276);
}

impl fmt::Display for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LinkType::NULL => f.write_str("NULL"),
            LinkType::ETHERNET => f.write_str("ETHERNET"),
            LinkType::RAW => f.write_str("RAW"),
            LinkType::LINUX_SLL => f.write_str("LINUX_SLL"),
            LinkType::IPV4 => f.write_str("IPV4"),
            LinkType::IPV6 => f.write_str("IPV6"),
            LinkType::LINUX_SLL2 => f.write_str("LINUX_SLL2"),
            LinkType(other) => write!(f, "LINKTYPE({other})"),
        }
    }
}

/// The container format of a capture file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Classic pcap with microsecond timestamps (magic `a1b2c3d4`; also the "modified" `a1b2cd34`).
    PcapMicro,
    /// Classic pcap with nanosecond timestamps (magic `a1b23c4d`).
    PcapNano,
    /// pcapng; the timestamp unit is per interface (`if_tsresol`).
    Pcapng,
}

/// The byte order of a capture file (of its current section, for pcapng).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// Least significant byte first.
    Little,
    /// Most significant byte first.
    Big,
}

/// One captured frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// Frame number, counted from 1 as Wireshark does (only packet records count).
    pub index: u64,
    /// Nanoseconds since the Unix epoch; 0 for pcapng Simple Packet Blocks, which carry no time.
    pub timestamp_ns: u64,
    /// Link-layer header type of the interface the frame was captured on.
    pub linktype: LinkType,
    /// Length of the frame on the wire, which may exceed what was captured.
    pub orig_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

impl Record {
    /// Whether fewer bytes were captured than were on the wire (snaplen cut the frame).
    pub fn is_truncated(&self) -> bool {
        self.data.len() < self.orig_len as usize
    }
}

/// Why a capture file could not be read (further).
///
/// Byte offsets count from the start of the input and point at the header, record or block that
/// failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input could not be opened or read.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The input starts with neither a pcap magic number nor a pcapng section header.
    #[error("not a pcap or pcapng file (first bytes {0:02x?})")]
    BadMagic(Vec<u8>),
    /// The input ends inside a file header, record or block.
    #[error("input ends inside the record or block at byte {offset}")]
    Truncated {
        /// Where the incomplete record or block starts.
        offset: u64,
    },
    /// A record or block is longer than [`MAX_BLOCK_LEN`] and the input goes on past that.
    #[error("record or block at byte {offset} is longer than {MAX_BLOCK_LEN} bytes")]
    TooLarge {
        /// Where the oversized record or block starts.
        offset: u64,
    },
    /// A pcapng block is inconsistent with itself (lengths, trailer, options, version).
    #[error("malformed block at byte {offset}: {reason}")]
    Malformed {
        /// Where the malformed block starts.
        offset: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A pcapng packet block names an interface its section has not described.
    #[error("packet block at byte {offset} names interface {interface}, but its section describes {described}")]
    UnknownInterface {
        /// Where the packet block starts.
        offset: u64,
        /// The interface id in the block.
        interface: u32,
        /// How many interfaces the section had described so far.
        described: usize,
    },
    /// A timestamp does not fit in nanoseconds since the epoch as a `u64` (before 1970 or after 2554).
    #[error("timestamp of the packet block at byte {offset} is out of range")]
    TimestampOutOfRange {
        /// Where the packet block starts.
        offset: u64,
    },
}
