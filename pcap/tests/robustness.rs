//! Damaged input: files cut at every byte, absurd lengths, failing sources, random bytes and
//! random mutations. The reader must never panic, must end, must not allocate what the input
//! does not hold, and must say where the damage is.

mod common;

use std::io::{self, Read};

use common::{read_all, read_bytes, shared, Ng};
use proptest::prelude::*;
use softrdma_pcap::{
    Error, LinkType, PcapWriter, PcapngOptions, PcapngWriter, Reader, Record, Resolution, MAX_BLOCK_LEN,
};

/// A source that hands out at most 7 bytes per read.
struct Dribble<'a>(&'a [u8]);

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.0.len()).min(7);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// Cuts `file` at every length and checks the outcome exactly: the records that fit whole, then
/// a clean end if the cut falls on a block boundary, else `Truncated` at the last boundary before
/// the cut.
///
/// `headers` are the ends of the header blocks (the pcap file header; pcapng's SHB and IDB): the
/// reader opens once the first one is whole. `ends` are the ends of the records.
fn check_every_cut(name: &str, file: &[u8], headers: &[usize], ends: &[usize], records: &[Record]) {
    assert_eq!(ends.len(), records.len());
    assert_eq!(ends.last().copied(), Some(file.len()), "{name}: the records end the file");
    let boundaries: Vec<usize> = headers.iter().chain(ends).copied().collect();
    for len in 0..=file.len() {
        let cut = &file[..len];
        // Alternate between a slice and a stream that reads 7 bytes at a time.
        let reader = if len % 2 == 0 {
            Reader::new(Box::new(cut) as Box<dyn Read>)
        } else {
            Reader::new(Box::new(Dribble(cut)) as Box<dyn Read>)
        };
        let Ok(reader) = reader else {
            assert!(len < headers[0], "{name}: header refused at {len}");
            assert!(matches!(reader, Err(Error::Truncated { offset: 0 })), "{name} cut at {len}");
            continue;
        };
        assert!(len >= headers[0], "{name}: header accepted at {len}");
        let (got, error) = read_all(reader, len);
        let whole = ends.iter().filter(|&&end| end <= len).count();
        assert_eq!(got, records[..whole], "{name} cut at {len}");
        let last_boundary = boundaries.iter().rev().find(|&&b| b <= len).copied();
        match error {
            None => assert_eq!(last_boundary, Some(len), "{name}: clean end mid-block at {len}"),
            Some(Error::Truncated { offset }) => {
                assert_ne!(last_boundary, Some(len), "{name}: error at boundary {len}");
                assert_eq!(Some(offset as usize), last_boundary, "{name} cut at {len}");
            }
            Some(other) => panic!("{name} cut at {len}: {other}"),
        }
    }
}

#[test]
fn real_captures_cut_at_every_byte() {
    for name in [
        "captures/write.pcap",
        "captures/dc-small.pcap",
        "captures/nvme-rdma-idle.pcap",
        "reference/wire/golden/golden.pcap",
        "reference/wire/golden/cx4lx_cnp.pcap",
    ] {
        let file = std::fs::read(shared().join(name)).unwrap();
        let (records, error) = read_bytes(&file).unwrap();
        assert!(error.is_none());
        let mut ends = Vec::new();
        let mut end = 24;
        for record in &records {
            end += 16 + record.data.len();
            ends.push(end);
        }
        check_every_cut(name, &file, &[24], &ends, &records);
    }
}

#[test]
fn pcapng_cut_at_every_byte() {
    let file = std::fs::read(shared().join("captures/write.pcap")).unwrap();
    let (records, _) = read_bytes(&file).unwrap();
    let options = PcapngOptions { comment: Some("rebuilt IP headers".into()), ..PcapngOptions::default() };
    let mut writer = PcapngWriter::with_options(Vec::new(), &options).unwrap();
    let header = writer.get_ref();
    // The section header's length is its second word; the interface block follows it.
    let shb_end = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let headers = [shb_end, header.len()];
    let mut ends = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if i % 2 == 0 {
            writer.write_packet_with_comment(r.timestamp_ns, &r.data, r.orig_len, "rx").unwrap();
        } else {
            writer.write_packet(r.timestamp_ns, &r.data, r.orig_len).unwrap();
        }
        ends.push(writer.get_ref().len());
    }
    let file = writer.finish().unwrap();
    check_every_cut("pcapng", &file, &headers, &ends, &records);
}

/// A classic pcap header (little-endian, microseconds, Ethernet).
fn pcap_header() -> Vec<u8> {
    PcapWriter::new(Vec::new(), Resolution::Micro).unwrap().finish().unwrap()
}

#[test]
fn absurd_record_length_in_a_short_file_is_truncation() {
    let mut file = pcap_header();
    file.extend([0; 8]);
    file.extend(0xffff_fff0u32.to_le_bytes()); // caplen
    file.extend(0xffff_fff0u32.to_le_bytes()); // orig_len
    file.extend([0; 100]);
    let (records, error) = read_bytes(&file).unwrap();
    assert!(records.is_empty());
    assert!(matches!(error, Some(Error::Truncated { offset: 24 })), "{error:?}");
}

#[test]
fn absurd_length_on_an_endless_stream_stops_at_the_limit() {
    let mut head = pcap_header();
    head.extend([0; 8]);
    head.extend(0xffff_fff0u32.to_le_bytes());
    head.extend(0xffff_fff0u32.to_le_bytes());
    let mut reader = Reader::new(io::Cursor::new(head).chain(io::repeat(0))).unwrap();
    assert!(matches!(reader.next(), Some(Err(Error::TooLarge { offset: 24 }))));
    assert!(reader.next().is_none());

    // The same for a pcapng block, and a record just under the limit still reads.
    let mut ng = Ng::new();
    ng.shb(false, 1).idb(1, 0, &[]);
    let at = ng.out.len() as u64;
    ng.out.extend(6u32.to_le_bytes());
    ng.out.extend(0xffff_fff0u32.to_le_bytes());
    let mut reader = Reader::new(io::Cursor::new(ng.out).chain(io::repeat(0))).unwrap();
    assert!(matches!(reader.next(), Some(Err(Error::TooLarge { offset })) if offset == at));

    // A record (16-byte header and data) of exactly MAX_BLOCK_LEN.
    let big = vec![0x5a; MAX_BLOCK_LEN - 16];
    let mut writer = PcapWriter::with_linktype(Vec::new(), Resolution::Micro, LinkType::ETHERNET, u32::MAX).unwrap();
    writer.write_packet(0, &big, 0).unwrap();
    let file = writer.finish().unwrap();
    let (records, error) = read_bytes(&file).unwrap();
    assert!(error.is_none(), "{error:?}");
    assert_eq!(records[0].data.len(), big.len());
}

#[test]
fn pcapng_block_shorter_than_its_header_is_malformed() {
    let mut ng = Ng::new();
    ng.shb(false, 1).idb(1, 0, &[]);
    let at = ng.out.len() as u64;
    ng.out.extend(6u32.to_le_bytes());
    ng.out.extend(8u32.to_le_bytes()); // an EPB needs 32
    ng.out.extend([0; 64]);
    let (_, error) = read_bytes(&ng.out).unwrap();
    assert!(matches!(error, Some(Error::Malformed { offset, .. }) if offset == at), "{error:?}");
}

/// Gives its bytes, then fails on every read.
struct Failing<'a>(&'a [u8]);

impl Read for Failing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Err(io::Error::other("disk on fire"));
        }
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn a_failing_source_ends_in_an_io_error() {
    let file = std::fs::read(shared().join("captures/send.pcap")).unwrap();
    let (all, _) = read_bytes(&file).unwrap();
    let cut = 24 + 2 * 16 + all[0].data.len() + all[1].data.len() + 5;
    let (records, error) = read_all(Reader::new(Failing(&file[..cut])).unwrap(), cut);
    assert_eq!(records, all[..2]);
    assert!(matches!(error, Some(Error::Io(_))), "{error:?}");
    assert!(matches!(Reader::new(Failing(&[])), Err(Error::Io(_))));
}

/// Valid files to mutate: a real capture, a commented pcapng, and a two-section pcapng.
fn seeds() -> Vec<Vec<u8>> {
    let golden = std::fs::read(shared().join("reference/wire/golden/golden.pcap")).unwrap();
    let (records, _) = read_bytes(&golden).unwrap();
    let mut writer =
        PcapngWriter::with_options(Vec::new(), &PcapngOptions { comment: Some("c".into()), ..Default::default() })
            .unwrap();
    for r in &records {
        writer.write_packet_with_comment(r.timestamp_ns, &r.data, r.orig_len, "rx").unwrap();
    }
    let mut ng = Ng::new();
    ng.shb(false, 1)
        .idb(1, 0, &[(9, &[9]), (14, &7i64.to_le_bytes())])
        .epb(0, 77, b"abcdefg", 9)
        .spb(b"hi", 2)
        .pb(0, 5, b"old", 3)
        .shb(true, 1)
        .idb(1, 3, &[(9, &[0x83])])
        .epb(0, 9, b"xyz", 3);
    vec![golden, writer.finish().unwrap(), ng.out]
}

fn read_anything(bytes: &[u8]) {
    if let Ok(reader) = Reader::from_slice(bytes) {
        let (records, _) = read_all(reader, bytes.len());
        for record in records {
            assert!(record.data.len() <= bytes.len());
        }
    }
}

/// Starts of files that get past the magic check, so the random tail reaches the parsers.
fn prefixes() -> Vec<Vec<u8>> {
    let mut be = pcap_header();
    be[..4].copy_from_slice(&[0xa1, 0xb2, 0x3c, 0x4d]);
    let mut ng_le = Ng::new();
    ng_le.shb(false, 1).idb(1, 0, &[]);
    let mut ng_be = Ng::new();
    ng_be.shb(true, 1);
    vec![Vec::new(), pcap_header(), be, ng_le.out, ng_be.out]
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        read_anything(&bytes);
    }

    #[test]
    fn arbitrary_tails_after_a_valid_start_never_panic(
        prefix in proptest::sample::select(prefixes()),
        tail in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        read_anything(&[prefix, tail].concat());
    }

    #[test]
    fn mutated_files_never_panic(
        seed in proptest::sample::select(seeds()),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut file = seed;
        for (at, byte) in edits {
            let at = at.index(file.len());
            file[at] = byte;
        }
        if do_cut {
            file.truncate(cut.index(file.len() + 1));
        }
        read_anything(&file);
    }
}
