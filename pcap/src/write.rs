//! Writing classic pcap and pcapng files.
//!
//! Both writers emit little-endian files with a single link type, write straight into the sink
//! (wrap a file in a `BufWriter`) and keep no state of their own beyond the header settings, so
//! dropping one loses nothing the sink does not itself hold.

use std::io::{self, Write};

use crate::LinkType;

/// Snapshot length written by default: 256 KiB, as tcpdump and Wireshark use.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Timestamp resolution of a classic pcap file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Microseconds (magic `a1b2c3d4`); what every tool reads.
    Micro,
    /// Nanoseconds (magic `a1b23c4d`).
    Nano,
}

/// The accessors of the sink (the writer's `inner`) that both writers have: `get_ref`, `get_mut`,
/// `finish` (flushes it) and `into_inner` (does not).
macro_rules! sink_accessors {
    () => {
        /// The sink.
        pub fn get_ref(&self) -> &W {
            &self.inner
        }

        /// The sink; writing to it directly corrupts the file.
        pub fn get_mut(&mut self) -> &mut W {
            &mut self.inner
        }

        /// Flushes the sink and returns it.
        pub fn finish(mut self) -> io::Result<W> {
            self.inner.flush()?;
            Ok(self.inner)
        }

        /// Returns the sink without flushing it.
        pub fn into_inner(self) -> W {
            self.inner
        }
    };
}

/// Writes a classic pcap file.
///
/// ```
/// use softrdma_pcap::{PcapWriter, Resolution};
/// let mut writer = PcapWriter::new(Vec::new(), Resolution::Nano)?;
/// writer.write_packet(1_700_000_000_123_456_789, &[0u8; 60], 60)?;
/// let file: Vec<u8> = writer.finish()?;
/// assert_eq!(file.len(), 24 + 16 + 60);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    inner: W,
    resolution: Resolution,
    snaplen: u32,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header for Ethernet frames and a snaplen of [`DEFAULT_SNAPLEN`].
    pub fn new(inner: W, resolution: Resolution) -> io::Result<Self> {
        PcapWriter::with_linktype(inner, resolution, LinkType::ETHERNET, DEFAULT_SNAPLEN)
    }

    /// Writes the file header for another link type or snaplen (which must not be 0).
    pub fn with_linktype(mut inner: W, resolution: Resolution, linktype: LinkType, snaplen: u32) -> io::Result<Self> {
        if snaplen == 0 {
            return Err(invalid("a classic pcap snaplen must not be 0"));
        }
        let magic: u32 = match resolution {
            Resolution::Micro => 0xa1b2_c3d4,
            Resolution::Nano => 0xa1b2_3c4d,
        };
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&magic.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes()); // version 2.4
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // 8..16: thiszone and sigfigs, both 0.
        header[16..20].copy_from_slice(&snaplen.to_le_bytes());
        header[20..24].copy_from_slice(&u32::from(linktype.0).to_le_bytes());
        inner.write_all(&header)?;
        Ok(PcapWriter { inner, resolution, snaplen })
    }

    /// Writes one record.
    ///
    /// `data` beyond the snaplen is cut, as a capture would; `orig_len` is the length on the wire
    /// and is raised to `data.len()` if smaller. Timestamps after 2106 do not fit the format and
    /// are refused; a microsecond file drops the sub-microsecond digits.
    pub fn write_packet(&mut self, timestamp_ns: u64, data: &[u8], orig_len: u32) -> io::Result<()> {
        let (captured, orig_len) = cut(data, self.snaplen, orig_len);
        let header = record_header(self.resolution, timestamp_ns, captured.len() as u32, orig_len)?;
        self.inner.write_all(&header)?;
        self.inner.write_all(captured)
    }

    sink_accessors!();
}

/// What [`PcapngWriter`] puts in its section header and its one interface description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapngOptions {
    /// Link type of the interface; Ethernet by default.
    pub linktype: LinkType,
    /// Snapshot length of the interface, [`DEFAULT_SNAPLEN`] by default; 0 means no limit.
    pub snaplen: u32,
    /// `shb_userappl`: the program that wrote the file, e.g. `"softrdma 0.1.0"`.
    pub userappl: Option<String>,
    /// `opt_comment` of the section, e.g. how received packets' IP headers were rebuilt.
    pub comment: Option<String>,
    /// `if_name`: the interface captured, e.g. `"srdma0"`.
    pub if_name: Option<String>,
}

impl Default for PcapngOptions {
    fn default() -> Self {
        PcapngOptions {
            linktype: LinkType::ETHERNET,
            snaplen: DEFAULT_SNAPLEN,
            userappl: None,
            comment: None,
            if_name: None,
        }
    }
}

/// Writes a pcapng file: one section, one interface with nanosecond timestamps
/// (`if_tsresol` = 9), and an Enhanced Packet Block per packet, optionally commented.
///
/// ```
/// use softrdma_pcap::{PcapngOptions, PcapngWriter};
/// let options = PcapngOptions {
///     comment: Some("received packets carry a rebuilt IPv4 header".into()),
///     ..PcapngOptions::default()
/// };
/// let mut writer = PcapngWriter::with_options(Vec::new(), &options)?;
/// writer.write_packet(1_700_000_000_000_000_000, &[0u8; 60], 60)?;
/// writer.write_packet_with_comment(1_700_000_000_000_001_000, &[0u8; 60], 60, "rx: IP header rebuilt")?;
/// let file = writer.finish()?;
/// # assert_eq!(&file[..4], &[0x0a, 0x0d, 0x0d, 0x0a]);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PcapngWriter<W: Write> {
    inner: W,
    snaplen: u32,
}

/// pcapng block types and option codes (draft-ietf-opsawg-pcapng).
mod ng {
    pub(super) const SHB: u32 = 0x0a0d_0d0a;
    pub(super) const IDB: u32 = 0x0000_0001;
    pub(super) const EPB: u32 = 0x0000_0006;
    pub(super) const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
    pub(super) const OPT_COMMENT: u16 = 1;
    pub(super) const SHB_USERAPPL: u16 = 4;
    pub(super) const IF_NAME: u16 = 2;
    pub(super) const IF_TSRESOL: u16 = 9;
    /// `if_tsresol` value for 10^-9 s units.
    pub(super) const NANOSECONDS: u8 = 9;
}

impl<W: Write> PcapngWriter<W> {
    /// Writes the section header and an Ethernet interface with the default snaplen.
    pub fn new(inner: W) -> io::Result<Self> {
        PcapngWriter::with_options(inner, &PcapngOptions::default())
    }

    /// Writes the section header and interface description that `options` describe.
    pub fn with_options(mut inner: W, options: &PcapngOptions) -> io::Result<Self> {
        let mut shb = [0u8; 16];
        shb[0..4].copy_from_slice(&ng::BYTE_ORDER_MAGIC.to_le_bytes());
        shb[4..6].copy_from_slice(&1u16.to_le_bytes()); // version 1.0
        shb[8..16].copy_from_slice(&(-1i64).to_le_bytes()); // section length not given
        let mut shb_options = Vec::new();
        if let Some(comment) = &options.comment {
            shb_options.push((ng::OPT_COMMENT, comment.as_bytes()));
        }
        if let Some(userappl) = &options.userappl {
            shb_options.push((ng::SHB_USERAPPL, userappl.as_bytes()));
        }
        write_block(&mut inner, ng::SHB, &shb, &[], &shb_options)?;

        let mut idb = [0u8; 8];
        idb[0..2].copy_from_slice(&options.linktype.0.to_le_bytes());
        // 2..4 reserved.
        idb[4..8].copy_from_slice(&options.snaplen.to_le_bytes());
        let tsresol = [ng::NANOSECONDS];
        let mut idb_options = vec![(ng::IF_TSRESOL, &tsresol[..])];
        if let Some(name) = &options.if_name {
            idb_options.push((ng::IF_NAME, name.as_bytes()));
        }
        write_block(&mut inner, ng::IDB, &idb, &[], &idb_options)?;

        Ok(PcapngWriter { inner, snaplen: options.snaplen })
    }

    /// Writes one Enhanced Packet Block; `data` and `orig_len` as in [`PcapWriter::write_packet`].
    pub fn write_packet(&mut self, timestamp_ns: u64, data: &[u8], orig_len: u32) -> io::Result<()> {
        self.write_epb(timestamp_ns, data, orig_len, &[])
    }

    /// Writes one Enhanced Packet Block with an `opt_comment` (at most 65535 bytes).
    pub fn write_packet_with_comment(
        &mut self,
        timestamp_ns: u64,
        data: &[u8],
        orig_len: u32,
        comment: &str,
    ) -> io::Result<()> {
        self.write_epb(timestamp_ns, data, orig_len, &[(ng::OPT_COMMENT, comment.as_bytes())])
    }

    fn write_epb(&mut self, timestamp_ns: u64, data: &[u8], orig_len: u32, options: &[(u16, &[u8])]) -> io::Result<()> {
        let limit = if self.snaplen == 0 { u32::MAX } else { self.snaplen };
        let (captured, orig_len) = cut(data, limit, orig_len);
        let mut epb = [0u8; 20];
        put_u32s(
            &mut epb,
            [
                0, // interface id
                (timestamp_ns >> 32) as u32,
                timestamp_ns as u32,
                captured.len() as u32,
                orig_len,
            ],
        );
        write_block(&mut self.inner, ng::EPB, &epb, captured, options)
    }

    sink_accessors!();
}

/// Cuts `data` to `snaplen` and makes the original length at least the data's length.
fn cut(data: &[u8], snaplen: u32, orig_len: u32) -> (&[u8], u32) {
    let captured = &data[..data.len().min(snaplen as usize)];
    let on_wire = u32::try_from(data.len()).unwrap_or(u32::MAX);
    (captured, orig_len.max(on_wire))
}

/// Writes one pcapng block, little-endian: type, total length, the fixed fields, `data` padded to
/// 32 bits, the options (each padded) closed by `opt_endofopt`, and the total length again.
/// Nothing is written if a length does not fit.
fn write_block<W: Write>(
    w: &mut W,
    block_type: u32,
    fixed: &[u8],
    data: &[u8],
    options: &[(u16, &[u8])],
) -> io::Result<()> {
    const PADDING: [u8; 3] = [0; 3];
    let mut options_len = 0;
    for (_, value) in options {
        if value.len() > usize::from(u16::MAX) {
            return Err(invalid("a pcapng option value is longer than 65535 bytes"));
        }
        options_len += 4 + padded(value.len());
    }
    if !options.is_empty() {
        options_len += 4; // opt_endofopt
    }
    let total = u32::try_from(12 + fixed.len() + padded(data.len()) + options_len)
        .map_err(|_| invalid("a pcapng block is longer than 4 GiB"))?;

    w.write_all(&block_type.to_le_bytes())?;
    w.write_all(&total.to_le_bytes())?;
    w.write_all(fixed)?;
    w.write_all(data)?;
    w.write_all(&PADDING[..padded(data.len()) - data.len()])?;
    for &(code, value) in options {
        w.write_all(&code.to_le_bytes())?;
        w.write_all(&(value.len() as u16).to_le_bytes())?;
        w.write_all(value)?;
        w.write_all(&PADDING[..padded(value.len()) - value.len()])?;
    }
    if !options.is_empty() {
        w.write_all(&[0; 4])?;
    }
    w.write_all(&total.to_le_bytes())
}

/// `len` rounded up to a multiple of 4.
fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// The 16-byte header of one classic pcap record (little-endian, as [`PcapWriter`] writes them):
/// for writers that lay records out themselves (a capture ring) and append them to a file that
/// began with [`PcapWriter`]'s header. `caplen` bytes follow it; `orig_len` is raised to `caplen`
/// if smaller. Timestamps after 2106 are refused.
pub fn record_header(resolution: Resolution, timestamp_ns: u64, caplen: u32, orig_len: u32) -> io::Result<[u8; 16]> {
    let secs = u32::try_from(timestamp_ns / NANOS_PER_SEC)
        .map_err(|_| invalid("timestamp beyond 2106 does not fit classic pcap"))?;
    let fraction = match resolution {
        Resolution::Micro => (timestamp_ns % NANOS_PER_SEC) / 1_000,
        Resolution::Nano => timestamp_ns % NANOS_PER_SEC,
    } as u32;
    let mut header = [0u8; 16];
    put_u32s(&mut header, [secs, fraction, caplen, orig_len.max(caplen)]);
    Ok(header)
}

fn put_u32s<const N: usize>(out: &mut [u8], words: [u32; N]) {
    for (chunk, word) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
}

fn invalid(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn pcap_header_bytes() {
        let file = PcapWriter::new(Vec::new(), Resolution::Micro).unwrap().finish().unwrap();
        assert_eq!(
            file,
            [
                0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, // magic, 2.4, zone, sigfigs
                0x00, 0x00, 0x04, 0x00, 1, 0, 0, 0, // snaplen 262144, Ethernet
            ]
        );
        let file = PcapWriter::new(Vec::new(), Resolution::Nano).unwrap().into_inner();
        assert_eq!(&file[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
    }

    #[test]
    fn pcap_record_bytes() {
        let mut writer = PcapWriter::new(Vec::new(), Resolution::Micro).unwrap();
        writer.write_packet(3_000_004_999, &[0xaa, 0xbb], 70).unwrap();
        let file = writer.finish().unwrap();
        assert_eq!(&file[24..], &[3, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 70, 0, 0, 0, 0xaa, 0xbb]);
    }

    #[test]
    fn pcap_refuses_what_does_not_fit() {
        let mut writer = PcapWriter::new(Vec::new(), Resolution::Nano).unwrap();
        let after_2106 = (u64::from(u32::MAX) + 1) * NANOS_PER_SEC;
        assert_eq!(writer.write_packet(after_2106, &[], 0).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(writer.get_ref().len(), 24, "nothing written");
        assert!(PcapWriter::with_linktype(Vec::new(), Resolution::Micro, LinkType::RAW, 0).is_err());
    }

    #[test]
    fn snaplen_cuts_and_orig_len_covers_data() {
        let mut writer = PcapWriter::with_linktype(Vec::new(), Resolution::Micro, LinkType::ETHERNET, 4).unwrap();
        writer.write_packet(0, &[1, 2, 3, 4, 5, 6], 0).unwrap();
        let file = writer.finish().unwrap();
        assert_eq!(&file[24..], &[0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 6, 0, 0, 0, 1, 2, 3, 4]);
    }

    #[test]
    fn pcapng_blocks_bytes() {
        let mut writer = PcapngWriter::new(Vec::new()).unwrap();
        let start = writer.get_ref().len();
        writer.write_packet_with_comment(0x0000_0001_0000_0002, &[9, 9, 9], 3, "hi").unwrap();
        let file = writer.finish().unwrap();
        #[rustfmt::skip]
        let shb_idb: &[u8] = &[
            0x0a, 0x0d, 0x0d, 0x0a, 28, 0, 0, 0, 0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0,
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 28, 0, 0, 0,
            1, 0, 0, 0, 32, 0, 0, 0, 1, 0, 0, 0, 0x00, 0x00, 0x04, 0x00,
            9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0,
        ];
        assert_eq!(&file[..start], shb_idb);
        #[rustfmt::skip]
        let epb: &[u8] = &[
            6, 0, 0, 0, 48, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,
            3, 0, 0, 0, 3, 0, 0, 0, 9, 9, 9, 0,
            1, 0, 2, 0, b'h', b'i', 0, 0, 0, 0, 0, 0, 48, 0, 0, 0,
        ];
        assert_eq!(&file[start..], epb);
    }

    #[test]
    fn pcapng_refuses_an_oversized_comment() {
        let mut writer = PcapngWriter::new(Vec::new()).unwrap();
        let before = writer.get_ref().len();
        let comment = "x".repeat(70_000);
        assert!(writer.write_packet_with_comment(0, &[1], 1, &comment).is_err());
        assert_eq!(writer.get_ref().len(), before, "nothing written");
    }
}
