//! Every reference capture in ../shared reads to its end, with the frame counts INDEX.md and
//! GOLDEN.md give, and survives being rewritten by both writers.

mod common;

use std::collections::BTreeMap;
use std::io::Read;

use common::{read_all, read_bytes, shared, shared_captures};
use softrdma_pcap::{ByteOrder, Format, LinkType, PcapWriter, PcapngWriter, Reader, Record, Resolution};

/// (file, frames, frames cut short), from captures/INDEX.md and the golden packet notes.
///
/// "Cut short" is what INDEX.md means by truncated: the IPv4 total length claims more bytes than
/// the frame holds. In rdma-nccl2.pcap the capture tool cut frames at 229 bytes of IP but wrote
/// the record headers with the original length equal to the captured one (243 = 14 + 229), so
/// [`Record::is_truncated`], which can only see the record header, is false for every frame.
const EXPECTED: &[(&str, usize, usize)] = &[
    ("rocev2_test.pcap", 708, 0),
    ("rocev2-2_test.pcap", 641, 0),
    ("rocev1_test.pcap", 624, 0),
    ("write.pcap", 17, 0),
    ("read2.pcap", 16, 0),
    ("send.pcap", 9, 0),
    ("nvme-discover2.pcap", 31, 0),
    ("nvme-rdma-idle.pcap", 4, 0),
    ("dc-small.pcap", 19, 0),
    ("rc-small.pcap", 21, 0),
    ("uc-sg.pcap", 17, 0),
    ("rdma-nccl2.pcap", 520, 489),
    ("coverage.pcap", 21, 0),
    ("golden.pcap", 5, 0),
    // Linux rxe traffic recorded by the maintainers (the second table of INDEX.md).
    ("rxe-2guests-all.pcap", 824, 0),
    ("rxe-rc-ud-pingpong-n20.pcap", 273, 0),
    ("rxe-guest-vs-hostpy-badicrc-n5.pcap", 71, 0),
];

fn read_file(path: &std::path::Path) -> (Format, ByteOrder, Vec<Record>) {
    let bytes = std::fs::read(path).unwrap();
    let reader = Reader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (format, order) = (reader.format(), reader.byte_order());
    let (records, error) = read_all(reader, bytes.len());
    if let Some(error) = error {
        panic!("{}: {error} after {} records", path.display(), records.len());
    }
    (format, order, records)
}

#[test]
fn every_shared_capture_reads_to_the_end() {
    let mut seen = BTreeMap::new();
    for path in shared_captures() {
        let (format, order, records) = read_file(&path);
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.index, i as u64 + 1, "{name}: frame numbers count from 1");
            assert_eq!(record.linktype, LinkType::ETHERNET, "{name} frame {}", record.index);
        }
        let truncated = records.iter().filter(|r| r.is_truncated()).count();
        let cut_short = records.iter().filter(|r| ipv4_cut_short(&r.data)).count();
        eprintln!(
            "{name}: {format:?} {order:?}, {} frames, {truncated} truncated records, {cut_short} cut short",
            records.len()
        );
        assert_eq!(truncated, 0, "{name}: no reference capture has orig_len > caplen");
        seen.insert(name, (format, order, records.len(), cut_short));
    }
    for &(name, frames, cut_short) in EXPECTED {
        let &(format, order, got_frames, got_cut_short) =
            seen.get(name).unwrap_or_else(|| panic!("{name} is missing from ../shared"));
        assert_eq!((got_frames, got_cut_short), (frames, cut_short), "{name}");
        // None of the reference captures is pcapng (see the round-trip tests for that path).
        assert_eq!((format, order), (Format::PcapMicro, ByteOrder::Little), "{name}");
    }
}

/// Whether an Ethernet II frame holds IPv4 whose total length exceeds the bytes captured.
fn ipv4_cut_short(frame: &[u8]) -> bool {
    if frame.len() < 18 || frame[12..14] != [0x08, 0x00] {
        return false;
    }
    let total_length = u16::from_be_bytes([frame[16], frame[17]]);
    usize::from(total_length) > frame.len() - 14
}

#[test]
fn rdma_nccl2_is_cut_at_229_bytes_of_ip() {
    let (_, _, records) = read_file(&shared().join("captures/rdma-nccl2.pcap"));
    for record in records.iter().filter(|r| ipv4_cut_short(&r.data)) {
        assert_eq!(record.data.len(), 14 + 229, "frame {}", record.index);
        assert_eq!(record.orig_len, 14 + 229, "the record header does not say so");
    }
}

#[test]
fn timestamps_are_nanoseconds_since_the_epoch() {
    let (_, _, records) = read_file(&shared().join("captures/write.pcap"));
    for record in &records {
        assert_eq!(record.timestamp_ns % 1_000, 0, "a microsecond file");
        // Between 2001 and 2100: the seconds field was not mistaken for the fraction.
        assert!((1_000_000_000_000_000_000..4_102_444_800_000_000_000).contains(&record.timestamp_ns));
    }
    assert!(records.windows(2).all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
}

/// A source that hands out at most 7 bytes per read, to exercise refills at odd places.
struct Dribble<'a>(&'a [u8]);

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len()).min(7);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn file_slice_and_stream_read_the_same() {
    for name in ["captures/rdma-nccl2.pcap", "captures/uc-sg.pcap", "reference/wire/golden/coverage.pcap"] {
        let path = shared().join(name);
        let bytes = std::fs::read(&path).unwrap();
        let (_, _, from_file) = read_file(&path);
        let (from_slice, error) = read_bytes(&bytes).unwrap();
        assert!(error.is_none());
        let (from_stream, error) = read_all(Reader::new(Dribble(&bytes)).unwrap(), bytes.len());
        assert!(error.is_none());
        assert_eq!(from_file, from_slice, "{name}");
        assert_eq!(from_file, from_stream, "{name}");
    }
}

/// Every capture, rewritten by each writer, reads back to the same records.
#[test]
fn shared_captures_survive_rewriting() {
    for path in shared_captures() {
        let (_, _, records) = read_file(&path);
        let name = path.display();

        for resolution in [Resolution::Micro, Resolution::Nano] {
            let mut writer = PcapWriter::new(Vec::new(), resolution).unwrap();
            for r in &records {
                writer.write_packet(r.timestamp_ns, &r.data, r.orig_len).unwrap();
            }
            let (again, error) = read_bytes(&writer.finish().unwrap()).unwrap();
            assert!(error.is_none(), "{name} {resolution:?}");
            assert_eq!(again, records, "{name} {resolution:?}");
        }

        let mut writer = PcapngWriter::new(Vec::new()).unwrap();
        for r in &records {
            writer.write_packet(r.timestamp_ns, &r.data, r.orig_len).unwrap();
        }
        let (again, error) = read_bytes(&writer.finish().unwrap()).unwrap();
        assert!(error.is_none(), "{name} pcapng");
        assert_eq!(again, records, "{name} pcapng");
    }
}
