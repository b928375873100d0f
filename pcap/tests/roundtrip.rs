//! Writing then reading gives back the same records, for every writer; hand-built files cover
//! what the writers never produce (big-endian pcap, multi-section multi-interface pcapng, SPB,
//! the obsolete Packet Block) and the damage the reader must name.

mod common;

use common::{read_bytes, sample_frames, Ng};
use pcap_parser::pcapng::{Block, OptionCode};
use pcap_parser::traits::PcapNGPacketBlock;
use softrdma_pcap::{
    ByteOrder, Error, Format, LinkType, PcapWriter, PcapngOptions, PcapngWriter, Reader, Record, Resolution,
};

/// (timestamp, frame, orig_len): nanosecond-precise times, and every other frame cut short.
fn packets() -> Vec<(u64, Vec<u8>, u32)> {
    sample_frames()
        .into_iter()
        .enumerate()
        .map(|(i, frame)| {
            let timestamp = 1_700_000_000_000_000_000 + i as u64 * 1_000_001_001;
            let orig_len = frame.len() as u32 + if i % 2 == 1 { 100 } else { 0 };
            (timestamp, frame, orig_len)
        })
        .collect()
}

fn expected(resolution_ns: u64) -> Vec<Record> {
    packets()
        .into_iter()
        .enumerate()
        .map(|(i, (timestamp, data, orig_len))| Record {
            index: i as u64 + 1,
            timestamp_ns: timestamp / resolution_ns * resolution_ns,
            linktype: LinkType::ETHERNET,
            orig_len,
            data,
        })
        .collect()
}

fn read_clean(bytes: &[u8]) -> Vec<Record> {
    let (records, error) = read_bytes(bytes).unwrap();
    assert!(error.is_none(), "{error:?}");
    records
}

#[test]
fn pcap_micro_round_trip() {
    let mut writer = PcapWriter::new(Vec::new(), Resolution::Micro).unwrap();
    for (timestamp, data, orig_len) in packets() {
        writer.write_packet(timestamp, &data, orig_len).unwrap();
    }
    let file = writer.finish().unwrap();
    let reader = Reader::from_slice(&file).unwrap();
    assert_eq!((reader.format(), reader.byte_order()), (Format::PcapMicro, ByteOrder::Little));
    let records = read_clean(&file);
    assert_eq!(records, expected(1_000));
    let truncated: Vec<bool> = records.iter().map(Record::is_truncated).collect();
    assert_eq!(truncated, (0..records.len()).map(|i| i % 2 == 1).collect::<Vec<_>>());
}

#[test]
fn pcap_nano_round_trip() {
    let mut writer = PcapWriter::new(Vec::new(), Resolution::Nano).unwrap();
    for (timestamp, data, orig_len) in packets() {
        writer.write_packet(timestamp, &data, orig_len).unwrap();
    }
    let file = writer.finish().unwrap();
    assert_eq!(Reader::from_slice(&file).unwrap().format(), Format::PcapNano);
    assert_eq!(read_clean(&file), expected(1));
}

#[test]
fn pcapng_round_trip() {
    let mut writer = PcapngWriter::new(Vec::new()).unwrap();
    for (i, (timestamp, data, orig_len)) in packets().into_iter().enumerate() {
        if i % 3 == 0 {
            writer.write_packet_with_comment(timestamp, &data, orig_len, "rx").unwrap();
        } else {
            writer.write_packet(timestamp, &data, orig_len).unwrap();
        }
    }
    let file = writer.finish().unwrap();
    let reader = Reader::from_slice(&file).unwrap();
    assert_eq!((reader.format(), reader.byte_order()), (Format::Pcapng, ByteOrder::Little));
    assert_eq!(read_clean(&file), expected(1));
}

#[test]
fn writers_cut_at_the_snaplen() {
    let frame: Vec<u8> = (0..100).collect();
    let mut pcap = PcapWriter::with_linktype(Vec::new(), Resolution::Nano, LinkType::RAW, 64).unwrap();
    pcap.write_packet(5, &frame, 0).unwrap();
    let options = PcapngOptions { linktype: LinkType::RAW, snaplen: 64, ..PcapngOptions::default() };
    let mut pcapng = PcapngWriter::with_options(Vec::new(), &options).unwrap();
    pcapng.write_packet(5, &frame, 0).unwrap();
    for file in [pcap.finish().unwrap(), pcapng.finish().unwrap()] {
        let records = read_clean(&file);
        let want =
            Record { index: 1, timestamp_ns: 5, linktype: LinkType::RAW, orig_len: 100, data: frame[..64].to_vec() };
        assert_eq!(records, [want]);
        assert!(records[0].is_truncated());
    }
}

/// The comments and names a pcapng file of softrdma carries (docs/architecture.md D8), as
/// pcap-parser itself sees them.
#[test]
fn pcapng_comments_are_where_wireshark_looks() {
    let options = PcapngOptions {
        userappl: Some("softrdma 0.1.0".into()),
        comment: Some("received packets carry a rebuilt IPv4 header".into()),
        if_name: Some("srdma0".into()),
        ..PcapngOptions::default()
    };
    let mut writer = PcapngWriter::with_options(Vec::new(), &options).unwrap();
    writer.write_packet(1, &[1; 60], 60).unwrap();
    writer.write_packet_with_comment(2, &[2; 61], 61, "rx: IPv4 ID from the ICRC solve").unwrap();
    let file = writer.finish().unwrap();

    let (rest, capture) = pcap_parser::parse_pcapng(&file).unwrap();
    assert!(rest.is_empty());
    let blocks = &capture.sections[0].blocks;
    let Block::SectionHeader(shb) = &blocks[0] else { panic!("no SHB first") };
    assert_eq!(shb.shb_userappl().unwrap().unwrap(), "softrdma 0.1.0");
    let comment = shb.options.iter().find(|o| o.code == OptionCode::Comment).unwrap();
    assert_eq!(comment.as_str().unwrap(), "received packets carry a rebuilt IPv4 header");
    let Block::InterfaceDescription(idb) = &blocks[1] else { panic!("no IDB second") };
    assert_eq!(idb.if_name().unwrap().unwrap(), "srdma0");
    assert_eq!(idb.if_tsresol().unwrap().unwrap(), 9);
    assert_eq!((idb.linktype.0, idb.snaplen), (1, 262_144));
    let epb_comments: Vec<Option<&str>> = blocks[2..]
        .iter()
        .map(|block| {
            let Block::EnhancedPacket(epb) = block else { panic!("not an EPB") };
            assert_eq!(epb.packet_data().len(), epb.orig_len() as usize);
            epb.options.iter().find(|o| o.code == OptionCode::Comment).map(|o| o.as_str().unwrap())
        })
        .collect();
    assert_eq!(epb_comments, [None, Some("rx: IPv4 ID from the ICRC solve")]);
}

/// A classic pcap file written big-endian by hand, as a SPARC or PowerPC tcpdump would.
fn big_endian_pcap(magic: u32, fraction: u32) -> Vec<u8> {
    let mut file = Vec::new();
    file.extend(magic.to_be_bytes());
    file.extend(2u16.to_be_bytes());
    file.extend(4u16.to_be_bytes());
    file.extend(0i32.to_be_bytes()); // thiszone
    file.extend(0u32.to_be_bytes()); // sigfigs
    file.extend(65_535u32.to_be_bytes());
    file.extend(1u32.to_be_bytes()); // Ethernet
    for (secs, data, orig_len) in [(1_695_280_510u32, &[0xaa; 60][..], 60u32), (1_695_280_511, &[0xbb; 7], 1500)] {
        file.extend(secs.to_be_bytes());
        file.extend(fraction.to_be_bytes());
        file.extend((data.len() as u32).to_be_bytes());
        file.extend(orig_len.to_be_bytes());
        file.extend(data);
    }
    file
}

#[test]
fn big_endian_classic_pcap() {
    for (magic, format, fraction_ns) in
        [(0xa1b2_c3d4, Format::PcapMicro, 123_456_000), (0xa1b2_3c4d, Format::PcapNano, 123_456)]
    {
        let file = big_endian_pcap(magic, 123_456);
        let reader = Reader::from_slice(&file).unwrap();
        assert_eq!((reader.format(), reader.byte_order()), (format, ByteOrder::Big));
        let records = read_clean(&file);
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].timestamp_ns, 1_695_280_510 * 1_000_000_000 + fraction_ns);
        assert_eq!((records[0].data.as_slice(), records[0].orig_len), (&[0xaa; 60][..], 60));
        assert_eq!((records[1].index, records[1].data.len(), records[1].orig_len), (2, 7, 1500));
        assert!(records[1].is_truncated() && !records[0].is_truncated());
        assert_eq!(records[1].linktype, LinkType::ETHERNET);
    }
}

#[test]
fn classic_pcap_passes_other_linktypes_through() {
    let mut writer = PcapWriter::with_linktype(Vec::new(), Resolution::Micro, LinkType(147), 100).unwrap();
    writer.write_packet(0, &[1, 2, 3], 3).unwrap();
    let records = read_clean(&writer.finish().unwrap());
    assert_eq!(records[0].linktype, LinkType(147));
    assert_eq!(LinkType(147).to_string(), "LINKTYPE(147)");
    assert_eq!(LinkType::ETHERNET.to_string(), "ETHERNET");
}

const IF_TSRESOL: u16 = 9;
const IF_TSOFFSET: u16 = 14;

/// Two sections, little- then big-endian, four interfaces, every packet block kind.
#[test]
fn pcapng_sections_interfaces_and_block_kinds() {
    let mut ng = Ng::new();
    // Section 1, little-endian.
    ng.shb(false, 1)
        .idb(1, 0, &[]) // microseconds by default
        .idb(101, 0, &[(IF_TSRESOL, &[9])])
        .epb(0, 1_500_000, b"usec", 4)
        .epb(1, 1_500_000_007, b"nsec", 40)
        .block(0x0bad, b"unknown blocks are skipped")
        .spb(b"simple\0\0", 6) // implied captured length: 6, the rest is padding
        .pb(1, 2_000_000_000, b"obsolete", 8);
    // Section 2, big-endian, binary resolution and an offset; interface ids start again.
    let offset = 1_000_000i64.to_be_bytes();
    ng.shb(true, 1)
        .idb(113, 4, &[(IF_TSRESOL, &[0x80 | 10]), (IF_TSOFFSET, &offset)])
        .spb(b"cut by snaplen", 14)
        .epb(0, 1024 + 256, b"be", 2)
        .pb(0, 512, b"old", 3);

    let reader = Reader::from_slice(&ng.out).unwrap();
    assert_eq!((reader.format(), reader.byte_order()), (Format::Pcapng, ByteOrder::Little));
    let records = read_clean(&ng.out);
    let got: Vec<(u64, u64, u16, &[u8], u32)> =
        records.iter().map(|r| (r.index, r.timestamp_ns, r.linktype.0, r.data.as_slice(), r.orig_len)).collect();
    let offset_ns = 1_000_000 * 1_000_000_000;
    assert_eq!(
        got,
        [
            (1, 1_500_000_000, 1, &b"usec"[..], 4),
            (2, 1_500_000_007, 101, b"nsec", 40),
            (3, 0, 1, b"simple", 6),
            (4, 2_000_000_000, 101, b"obsolete", 8),
            (5, 0, 113, b"cut ", 14),
            (6, offset_ns + 1_250_000_000, 113, b"be", 2),
            (7, offset_ns + 500_000_000, 113, b"old", 3),
        ]
    );
    assert!(records[1].is_truncated() && records[4].is_truncated());

    let mut reader = Reader::from_slice(&ng.out).unwrap();
    reader.by_ref().take(5).for_each(drop);
    assert_eq!(reader.byte_order(), ByteOrder::Big, "the byte order follows the section");
}

fn read_error(file: &[u8]) -> (usize, Error) {
    let (records, error) = read_bytes(file).unwrap();
    (records.len(), error.expect("an error"))
}

#[test]
fn pcapng_damage_is_named() {
    // A packet on an interface the section never described.
    let mut ng = Ng::new();
    ng.shb(false, 1).idb(1, 0, &[]).epb(0, 0, b"ok", 2).epb(1, 0, b"x", 1);
    let (good, error) = read_error(&ng.out);
    assert_eq!(good, 1);
    assert!(matches!(error, Error::UnknownInterface { interface: 1, described: 1, .. }), "{error}");

    // A new section forgets the interfaces of the previous one.
    let mut ng = Ng::new();
    ng.shb(false, 1).idb(1, 0, &[]).shb(false, 1).spb(b"x", 1);
    assert!(matches!(read_error(&ng.out), (0, Error::UnknownInterface { interface: 0, described: 0, .. })));

    // Trailing length differs from the leading one: for the blocks pcap-parser checks (EPB) and
    // for those this crate checks (SHB, SPB, unknown).
    for (block_type, body) in [(6u32, &[0u8; 20][..]), (3, &[0; 4]), (0x0bad, &[])] {
        let mut ng = Ng::new();
        ng.shb(false, 1).idb(1, 0, &[]);
        let at = ng.out.len() as u64;
        ng.block_with_trailer(block_type, body, Some(999)).epb(0, 0, b"never read", 10);
        let (good, error) = read_error(&ng.out);
        assert_eq!(good, 0);
        assert!(matches!(error, Error::Malformed { offset, .. } if offset == at), "{block_type:#x}: {error}");
    }
    let mut ng = Ng::new();
    ng.shb(false, 1);
    let len = ng.out.len();
    ng.out[len - 4] ^= 0x10;
    assert!(matches!(read_error(&ng.out), (0, Error::Malformed { offset: 0, .. })));

    // Major version 2 is not pcapng as we know it.
    let mut ng = Ng::new();
    ng.shb(false, 2);
    assert!(matches!(read_error(&ng.out), (0, Error::Malformed { offset: 0, .. })));

    // An if_tsresol of 10^20 units per second does not fit.
    let mut ng = Ng::new();
    ng.shb(false, 1).idb(1, 0, &[(IF_TSRESOL, &[20])]);
    assert!(matches!(read_error(&ng.out), (0, Error::Malformed { offset: 28, .. })));

    // A timestamp before the epoch, through a negative if_tsoffset.
    let mut ng = Ng::new();
    ng.shb(false, 1).idb(1, 0, &[(IF_TSOFFSET, &(-5i64).to_le_bytes())]).epb(0, 1, b"", 0);
    assert!(matches!(read_error(&ng.out), (0, Error::TimestampOutOfRange { .. })));
}

#[test]
fn not_a_capture() {
    assert!(matches!(Reader::from_slice(b""), Err(Error::Truncated { offset: 0 })));
    assert!(matches!(Reader::from_slice(b"\xd4\xc3\xb2"), Err(Error::Truncated { offset: 0 })));
    assert!(matches!(Reader::from_slice(b"GIF89a.........."), Err(Error::BadMagic(_))));
    // A classic header cut short, and a pcapng section header cut short.
    assert!(matches!(Reader::from_slice(&big_endian_pcap(0xa1b2_c3d4, 0)[..20]), Err(Error::Truncated { offset: 0 })));
    let file = PcapngWriter::new(Vec::new()).unwrap().finish().unwrap();
    assert!(matches!(Reader::from_slice(&file[..20]), Err(Error::Truncated { offset: 0 })));
    let error = Reader::open("/nonexistent/trace.pcap").err().unwrap();
    assert!(matches!(&error, Error::Io(e) if e.kind() == std::io::ErrorKind::NotFound), "{error}");
    let error = Reader::open(env!("CARGO_MANIFEST_DIR")).err().unwrap();
    assert!(matches!(error, Error::Io(_)), "a directory: {error}");
}

#[test]
fn empty_captures_have_no_records() {
    let pcap = PcapWriter::new(Vec::new(), Resolution::Micro).unwrap().finish().unwrap();
    let pcapng = PcapngWriter::new(Vec::new()).unwrap().finish().unwrap();
    assert!(read_clean(&pcap).is_empty());
    assert!(read_clean(&pcapng).is_empty());
}

#[test]
fn a_section_header_bigger_than_the_read_buffer() {
    let options = PcapngOptions { comment: Some("long note. ".repeat(4_000)), ..PcapngOptions::default() };
    let mut writer = PcapngWriter::with_options(Vec::new(), &options).unwrap();
    writer.write_packet(1, &[7; 70_000], 70_000).unwrap();
    let file = writer.finish().unwrap();
    let records = read_clean(&file);
    assert_eq!((records.len(), records[0].data.len()), (1, 70_000));

    // A section header claiming more than MAX_BLOCK_LEN is refused before anything is read.
    let mut ng = Ng::new();
    ng.shb(false, 1);
    ng.out[4..8].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    assert!(matches!(Reader::from_slice(&ng.out), Err(Error::TooLarge { offset: 0 })));
    ng.out[4..8].copy_from_slice(&0x0100_0000u32.to_le_bytes());
    assert!(matches!(Reader::from_slice(&ng.out), Err(Error::Truncated { offset: 0 })));
}
