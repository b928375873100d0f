//! Reading classic pcap and pcapng files into [`Record`]s.
//!
//! `pcap-parser` does the parsing: it frames records and blocks and decodes their fields. This
//! module feeds it bytes, keeps the per-section state it asks its callers to keep (the interface
//! table of each pcapng section), converts timestamps to nanoseconds and counts frames.

use std::fs::File;
use std::io::{self, Cursor, Read};
use std::path::Path;

use pcap_parser::pcapng::{Block, InterfaceDescriptionBlock, OptionCode};
use pcap_parser::traits::{PcapNGPacketBlock, PcapReaderIterator};
use pcap_parser::{LegacyPcapReader, PcapBlockOwned, PcapError, PcapNGReader};

use crate::{ByteOrder, Error, Format, LinkType, Record};

/// The longest record or block the reader accepts, in bytes (Wireshark's own limit is 16 MiB).
///
/// The read buffer starts at 16 KiB and doubles only when it is full of real input that still
/// does not hold the record, so a bogus length field costs at most twice the input actually
/// present, and never more than this.
pub const MAX_BLOCK_LEN: usize = 32 << 20;

/// Initial read buffer: a 9000-byte jumbo frame fits; bigger records grow it.
const INITIAL_BUFFER: usize = 16 << 10;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The first four bytes of a file, read little-endian.
mod magic {
    pub(super) const PCAP_MICRO: u32 = 0xa1b2_c3d4;
    pub(super) const PCAP_NANO: u32 = 0xa1b2_3c4d;
    /// Alexey Kuznetzov's "modified" pcap: microsecond records with 8 more header bytes.
    pub(super) const PCAP_MODIFIED: u32 = 0xa1b2_cd34;
    pub(super) const PCAPNG_SHB: u32 = 0x0a0d_0d0a;
    /// pcapng byte-order magic, bytes 8..12 of a section header block.
    pub(super) const PCAPNG_BOM: u32 = 0x1a2b_3c4d;
}

/// Block type of the obsolete pcapng Packet Block, which `pcap-parser` reports as unknown.
const OBSOLETE_PACKET_BLOCK: u32 = 2;

/// An iterator of [`Record`]s over a classic pcap or pcapng capture.
///
/// Each item is `Ok(record)` or, once, `Err(error)` for the damage that stopped reading; after an
/// error or the end of input the iterator only returns `None`.
///
/// ```no_run
/// # fn main() -> Result<(), softrdma_pcap::Error> {
/// for record in softrdma_pcap::Reader::open("trace.pcap")? {
///     let record = record?;
///     println!("{} {} {}", record.index, record.timestamp_ns, record.data.len());
/// }
/// # Ok(())
/// # }
/// ```
pub struct Reader<R: Read> {
    parser: Parser<R>,
    section: Section,
    /// Capacity of the parser's buffer, which `PcapReaderIterator` does not report.
    capacity: usize,
    next_index: u64,
    done: bool,
}

/// What the parser reads: the bytes already taken to detect the format, then the rest.
type Source<R> = Filled<io::Chain<Cursor<Vec<u8>>, R>>;

enum Parser<R: Read> {
    Pcap(LegacyPcapReader<Source<R>>),
    Pcapng(PcapNGReader<Source<R>>),
}

impl<R: Read> Parser<R> {
    fn get(&mut self) -> &mut dyn PcapReaderIterator {
        match self {
            Parser::Pcap(parser) => parser,
            Parser::Pcapng(parser) => parser,
        }
    }
}

impl Reader<File> {
    /// Opens a capture file and reads its file header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Reader::new(File::open(path)?)
    }
}

impl<'a> Reader<&'a [u8]> {
    /// Reads a capture held in memory.
    pub fn from_slice(bytes: &'a [u8]) -> Result<Self, Error> {
        Reader::new(bytes)
    }
}

impl<R: Read> Reader<R> {
    /// Reads a capture from any byte stream; the file header is read (and checked) now.
    pub fn new(mut input: R) -> Result<Self, Error> {
        // Enough to tell the formats apart, including the byte order of a pcapng section.
        let mut head = Vec::new();
        (&mut input).take(12).read_to_end(&mut head)?;
        let (format, byte_order) = detect(&head)?;
        let mut capacity = INITIAL_BUFFER;
        if format == Format::Pcapng {
            // pcap-parser wants the first section header whole in its first buffer: read it all
            // now (as far as the input goes) and size the buffer after it.
            let shb_len = read_u32(&head, 4, byte_order).map_or(0, |len| len as usize);
            if shb_len > MAX_BLOCK_LEN {
                return Err(Error::TooLarge { offset: 0 });
            }
            let rest = shb_len.saturating_sub(head.len()) as u64;
            (&mut input).take(rest).read_to_end(&mut head)?;
            capacity = capacity.max(head.len().next_power_of_two());
        }

        let source = Filled(Cursor::new(head).chain(input));
        let parser = match format {
            Format::Pcapng => PcapNGReader::new(capacity, source).map(Parser::Pcapng),
            Format::PcapMicro | Format::PcapNano => LegacyPcapReader::new(capacity, source).map(Parser::Pcap),
        }
        .map_err(|e| header_error(&e))?;

        Ok(Reader {
            parser,
            section: Section { format, byte_order, pcap_linktype: LinkType::ETHERNET, interfaces: Vec::new() },
            capacity,
            next_index: 1,
            done: false,
        })
    }

    /// The container format.
    pub fn format(&self) -> Format {
        self.section.format
    }

    /// The byte order of the file, or of the pcapng section being read.
    pub fn byte_order(&self) -> ByteOrder {
        self.section.byte_order
    }

    /// Reads blocks until one holds a packet (`Some`) or the input ends cleanly (`None`).
    fn advance(&mut self) -> Result<Option<Record>, Error> {
        let Reader { parser, section, capacity, next_index, .. } = self;
        let parser = parser.get();
        loop {
            let offset = parser.consumed() as u64;
            match parser.next() {
                Ok((len, block)) => {
                    let record = section.decode(block, offset);
                    parser.consume(len);
                    if let Some(mut record) = record? {
                        record.index = *next_index;
                        *next_index += 1;
                        return Ok(Some(record));
                    }
                }
                Err(PcapError::Eof) => return Ok(None),
                Err(PcapError::Incomplete(_) | PcapError::BufferTooSmall) => {
                    // Refill while there is room: that adds bytes or proves the end of input, after
                    // which the parser answers UnexpectedEof. Grow only a buffer full of real input.
                    if parser.data().len() < *capacity {
                        parser.refill().map_err(|_| read_error())?;
                    } else if *capacity < MAX_BLOCK_LEN {
                        *capacity = (*capacity * 2).min(MAX_BLOCK_LEN);
                        parser.grow(*capacity);
                    } else {
                        return Err(Error::TooLarge { offset });
                    }
                }
                Err(PcapError::UnexpectedEof) => return Err(Error::Truncated { offset }),
                Err(PcapError::ReadError) => return Err(read_error()),
                Err(PcapError::HeaderNotRecognized) => {
                    return Err(malformed(offset, "section header with an unknown byte-order magic"))
                }
                Err(_) => return Err(malformed(offset, "block lengths or options are inconsistent")),
            }
        }
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.advance() {
            Ok(Some(record)) => Some(Ok(record)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(error) => {
                self.done = true;
                Some(Err(error))
            }
        }
    }
}

impl<R: Read> std::iter::FusedIterator for Reader<R> {}

/// What the reader must remember between blocks.
struct Section {
    format: Format,
    byte_order: ByteOrder,
    /// The link type of a classic pcap file, from its header.
    pcap_linktype: LinkType,
    /// The interfaces of the current pcapng section, indexed by interface id.
    interfaces: Vec<Interface>,
}

/// A pcapng interface, as its Interface Description Block describes it.
struct Interface {
    linktype: LinkType,
    snaplen: u32,
    /// `if_tsresol` as a divisor: timestamp units per second.
    units_per_sec: u64,
    /// `if_tsoffset`: seconds to add to every timestamp.
    offset_secs: i64,
}

impl Section {
    /// Updates the section state from `block`, or turns it into a record (index left at 0).
    fn decode(&mut self, block: PcapBlockOwned<'_>, offset: u64) -> Result<Option<Record>, Error> {
        match block {
            PcapBlockOwned::LegacyHeader(header) => {
                // The upper 16 bits of the classic link type field carry FCS flags; drop them.
                self.pcap_linktype = LinkType((header.network.0 & 0xffff) as u16);
                Ok(None)
            }
            PcapBlockOwned::Legacy(frame) => {
                let fraction = u64::from(frame.ts_usec);
                let fraction_ns = match self.format {
                    Format::PcapNano => fraction,
                    _ => fraction * 1_000,
                };
                // At most (2^32 - 1) * (10^9 + 1000), well inside u64.
                let timestamp_ns = u64::from(frame.ts_sec) * NANOS_PER_SEC + fraction_ns;
                Ok(Some(record(timestamp_ns, self.pcap_linktype, frame.origlen, frame.data)))
            }
            PcapBlockOwned::NG(block) => self.decode_ng(block, offset),
        }
    }

    fn decode_ng(&mut self, block: Block<'_>, offset: u64) -> Result<Option<Record>, Error> {
        match block {
            Block::SectionHeader(shb) => {
                // pcap-parser checks the trailing length of most blocks, but not of this one.
                check_trailer(shb.block_len1, shb.block_len2, offset)?;
                if shb.major_version != 1 {
                    return Err(malformed(offset, "unsupported pcapng major version"));
                }
                self.byte_order = if shb.big_endian() { ByteOrder::Big } else { ByteOrder::Little };
                self.interfaces.clear();
                Ok(None)
            }
            Block::InterfaceDescription(idb) => {
                let interface = Interface::describe(&idb, self.byte_order)
                    .ok_or_else(|| malformed(offset, "if_tsresol beyond 10^19 or 2^63"))?;
                self.interfaces.push(interface);
                Ok(None)
            }
            Block::EnhancedPacket(epb) => {
                let interface = self.interface(epb.if_id, offset)?;
                let units = u64::from(epb.ts_high) << 32 | u64::from(epb.ts_low);
                let timestamp_ns = interface.timestamp_ns(units).ok_or(Error::TimestampOutOfRange { offset })?;
                let linktype = interface.linktype;
                Ok(Some(record(timestamp_ns, linktype, epb.origlen, epb.packet_data())))
            }
            Block::SimplePacket(spb) => {
                check_trailer(spb.block_len1, spb.block_len2, offset)?;
                let interface = self.interface(0, offset)?;
                // The captured length is implied: the original length, cut by the snaplen of
                // interface 0 (0 = no limit) and by the block itself; the rest is padding.
                let mut len = spb.data.len().min(spb.origlen as usize);
                if interface.snaplen != 0 {
                    len = len.min(interface.snaplen as usize);
                }
                let linktype = interface.linktype;
                Ok(Some(record(0, linktype, spb.origlen, &spb.data[..len])))
            }
            Block::Unknown(block) => {
                check_trailer(block.block_len1, block.block_len2, offset)?;
                // pcap-parser reads the type of an unknown block little-endian.
                let block_type = match self.byte_order {
                    ByteOrder::Little => block.block_type,
                    ByteOrder::Big => block.block_type.swap_bytes(),
                };
                if block_type == OBSOLETE_PACKET_BLOCK {
                    self.obsolete_packet(block.data, offset)
                } else {
                    Ok(None)
                }
            }
            // Statistics, name resolution, secrets, custom blocks: nothing a record carries.
            _ => Ok(None),
        }
    }

    /// Decodes the body of an obsolete Packet Block (pcapng draft, section 4.3 of the old text):
    /// interface id (u16), drops count (u16), timestamp high and low (u32), captured length and
    /// original length (u32), data padded to 32 bits, options.
    fn obsolete_packet(&self, body: &[u8], offset: u64) -> Result<Option<Record>, Error> {
        let short = || malformed(offset, "packet block shorter than its fields");
        let order = self.byte_order;
        let interface_id = read_u16(body, 0, order).ok_or_else(short)?;
        let ts_high = read_u32(body, 4, order).ok_or_else(short)?;
        let ts_low = read_u32(body, 8, order).ok_or_else(short)?;
        let caplen = read_u32(body, 12, order).ok_or_else(short)?;
        let origlen = read_u32(body, 16, order).ok_or_else(short)?;
        let data = body
            .get(20..)
            .and_then(|rest| rest.get(..caplen as usize))
            .ok_or_else(|| malformed(offset, "captured length exceeds the block"))?;

        let interface = self.interface(u32::from(interface_id), offset)?;
        let units = u64::from(ts_high) << 32 | u64::from(ts_low);
        let timestamp_ns = interface.timestamp_ns(units).ok_or(Error::TimestampOutOfRange { offset })?;
        Ok(Some(record(timestamp_ns, interface.linktype, origlen, data)))
    }

    fn interface(&self, id: u32, offset: u64) -> Result<&Interface, Error> {
        self.interfaces.get(id as usize).ok_or(Error::UnknownInterface {
            offset,
            interface: id,
            described: self.interfaces.len(),
        })
    }
}

impl Interface {
    /// Reads the link type, snaplen, `if_tsresol` and `if_tsoffset` of an interface; `None` if the
    /// resolution does not fit a `u64` divisor.
    ///
    /// The options are read here rather than from pcap-parser's precomputed fields: 0.17 reads
    /// `if_tsoffset` little-endian in big-endian sections, and rejects every power-of-two
    /// `if_tsresol`.
    fn describe(idb: &InterfaceDescriptionBlock<'_>, order: ByteOrder) -> Option<Interface> {
        let option = |code: OptionCode| {
            idb.options.iter().find(|option| option.code == code).and_then(|option| option.as_bytes().ok())
        };
        // Default: microseconds. A malformed (wrong-length) option counts as absent.
        let tsresol = match option(OptionCode::IfTsresol) {
            Some(&[value]) => value,
            _ => 6,
        };
        let offset_secs =
            option(OptionCode::IfTsoffset).and_then(|value| <[u8; 8]>::try_from(value).ok()).map_or(0, |bytes| {
                match order {
                    ByteOrder::Little => i64::from_le_bytes(bytes),
                    ByteOrder::Big => i64::from_be_bytes(bytes),
                }
            });
        // pcapng: the high bit selects a power of two, else a power of ten, of the low 7 bits.
        let exponent = u32::from(tsresol & 0x7f);
        let units_per_sec =
            if tsresol & 0x80 == 0 { 10u64.checked_pow(exponent)? } else { 2u64.checked_pow(exponent)? };
        Some(Interface { linktype: LinkType(idb.linktype.0 as u16), snaplen: idb.snaplen, units_per_sec, offset_secs })
    }

    /// Converts a timestamp in this interface's units to nanoseconds since the epoch.
    fn timestamp_ns(&self, units: u64) -> Option<u64> {
        let per_sec = u128::from(self.units_per_sec);
        let units = u128::from(units);
        let fraction_ns = (units % per_sec) * u128::from(NANOS_PER_SEC) / per_sec;
        let secs = i128::try_from(units / per_sec).ok()? + i128::from(self.offset_secs);
        let nanos = secs * i128::from(NANOS_PER_SEC) + i128::try_from(fraction_ns).ok()?;
        u64::try_from(nanos).ok()
    }
}

fn record(timestamp_ns: u64, linktype: LinkType, orig_len: u32, data: &[u8]) -> Record {
    Record { index: 0, timestamp_ns, linktype, orig_len, data: data.to_vec() }
}

/// Tells the format and byte order from the first bytes (up to 12) of the input.
fn detect(head: &[u8]) -> Result<(Format, ByteOrder), Error> {
    let Some(first) = read_u32(head, 0, ByteOrder::Little) else {
        return Err(Error::Truncated { offset: 0 });
    };
    let found = match first {
        magic::PCAP_MICRO | magic::PCAP_MODIFIED => (Format::PcapMicro, ByteOrder::Little),
        magic::PCAP_NANO => (Format::PcapNano, ByteOrder::Little),
        m if m == magic::PCAP_MICRO.swap_bytes() => (Format::PcapMicro, ByteOrder::Big),
        m if m == magic::PCAP_NANO.swap_bytes() => (Format::PcapNano, ByteOrder::Big),
        magic::PCAPNG_SHB => match read_u32(head, 8, ByteOrder::Little) {
            None => return Err(Error::Truncated { offset: 0 }),
            Some(magic::PCAPNG_BOM) => (Format::Pcapng, ByteOrder::Little),
            Some(bom) if bom == magic::PCAPNG_BOM.swap_bytes() => (Format::Pcapng, ByteOrder::Big),
            Some(_) => return Err(Error::BadMagic(head.to_vec())),
        },
        _ => return Err(Error::BadMagic(head[..4].to_vec())),
    };
    Ok(found)
}

/// Maps a failure to read the file header (or first section header) to an [`Error`].
fn header_error(error: &PcapError<&'static [u8]>) -> Error {
    match error {
        PcapError::Eof | PcapError::UnexpectedEof | PcapError::Incomplete(_) => Error::Truncated { offset: 0 },
        PcapError::ReadError => read_error(),
        _ => malformed(0, "file header is malformed"),
    }
}

/// pcap-parser reports a failed `read` without the `io::Error`; its cause is lost here.
fn read_error() -> Error {
    Error::Io(io::Error::other("reading the capture failed"))
}

fn malformed(offset: u64, reason: &'static str) -> Error {
    Error::Malformed { offset, reason }
}

fn check_trailer(block_len1: u32, block_len2: u32, offset: u64) -> Result<(), Error> {
    if block_len1 == block_len2 {
        Ok(())
    } else {
        Err(malformed(offset, "trailing block length differs from the leading one"))
    }
}

fn read_u16(bytes: &[u8], at: usize, order: ByteOrder) -> Option<u16> {
    let field: [u8; 2] = bytes.get(at..at + 2)?.try_into().ok()?;
    Some(match order {
        ByteOrder::Little => u16::from_le_bytes(field),
        ByteOrder::Big => u16::from_be_bytes(field),
    })
}

fn read_u32(bytes: &[u8], at: usize, order: ByteOrder) -> Option<u32> {
    let field: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    Some(match order {
        ByteOrder::Little => u32::from_le_bytes(field),
        ByteOrder::Big => u32::from_be_bytes(field),
    })
}

/// A reader whose every `read` fills the buffer unless the input ends, so that each refill of
/// the parser's buffer either adds bytes or proves the end of input (a bare `read` may return
/// less, and the parser reads once per refill).
struct Filled<R>(R);

impl<R: Read> Read for Filled<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.0.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n.min(buf.len() - filled),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if filled == 0 => return Err(e),
                // Hand over what arrived; the error comes back on the next call.
                Err(_) => break,
            }
        }
        Ok(filled)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn interface(tsresol: u8, offset_secs: i64) -> Interface {
        let exponent = u32::from(tsresol & 0x7f);
        Interface {
            linktype: LinkType::ETHERNET,
            snaplen: 0,
            units_per_sec: if tsresol & 0x80 == 0 { 10u64.pow(exponent) } else { 1 << exponent },
            offset_secs,
        }
    }

    #[test]
    fn timestamp_units() {
        assert_eq!(interface(6, 0).timestamp_ns(1_500_000), Some(1_500_000_000));
        assert_eq!(interface(9, 0).timestamp_ns(1_234_567_891), Some(1_234_567_891));
        // 2^-10 s units: 1024 units are one second, 512 half of one.
        assert_eq!(interface(0x8a, 0).timestamp_ns(1024 + 512), Some(1_500_000_000));
        assert_eq!(interface(0, 0).timestamp_ns(7), Some(7_000_000_000));
        assert_eq!(interface(6, 10).timestamp_ns(1), Some(10_000_001_000));
        assert_eq!(interface(6, -10).timestamp_ns(1), None);
        assert_eq!(interface(0, 0).timestamp_ns(u64::MAX), None);
        assert_eq!(interface(19, 0).timestamp_ns(u64::MAX), Some(u64::MAX / 10_000_000_000));
    }

    #[test]
    fn detect_magic() {
        let cases: [(&[u8], Format, ByteOrder); 5] = [
            (&[0xd4, 0xc3, 0xb2, 0xa1], Format::PcapMicro, ByteOrder::Little),
            (&[0xa1, 0xb2, 0xc3, 0xd4], Format::PcapMicro, ByteOrder::Big),
            (&[0x4d, 0x3c, 0xb2, 0xa1], Format::PcapNano, ByteOrder::Little),
            (&[0xa1, 0xb2, 0x3c, 0x4d], Format::PcapNano, ByteOrder::Big),
            (&[0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0x1c, 0x1a, 0x2b, 0x3c, 0x4d], Format::Pcapng, ByteOrder::Big),
        ];
        for (head, format, order) in cases {
            assert_eq!(detect(head).unwrap(), (format, order), "{head:02x?}");
        }
        assert!(matches!(detect(&[1, 2, 3, 4, 5]), Err(Error::BadMagic(m)) if m == [1, 2, 3, 4]));
        assert!(matches!(detect(&[0xd4, 0xc3]), Err(Error::Truncated { offset: 0 })));
        assert!(matches!(detect(&[0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0x1c, 0, 0, 0, 0]), Err(Error::BadMagic(_))));
    }

    /// A source that hands out one byte per `read`.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((&byte, rest)), Some(slot)) => {
                    *slot = byte;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn filled_reads_through_short_reads() {
        let mut buf = [0; 5];
        let mut source = Filled(Trickle(b"abcdefg"));
        assert_eq!(source.read(&mut buf).unwrap(), 5);
        assert_eq!(&buf, b"abcde");
        assert_eq!(source.read(&mut buf).unwrap(), 2);
        assert_eq!(source.read(&mut buf).unwrap(), 0);
    }
}
