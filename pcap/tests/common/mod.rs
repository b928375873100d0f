//! Helpers shared by the integration tests: where the reference captures live, reading a whole
//! capture, and a byte-by-byte pcapng builder for files no writer here produces.
#![allow(dead_code)]

use std::path::PathBuf;

use softrdma_pcap::{Error, Reader, Record};

/// The shared reference data, beside the repository.
pub fn shared() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"))
}

/// Every `*.pcap` file of the shared captures and golden packets, sorted.
pub fn shared_captures() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["captures", "reference/wire/golden"] {
        let dir = shared().join(dir);
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "pcap" || ext == "pcapng") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Reads everything: the records, then the error that stopped reading, if any.
///
/// Also checks the iterator's contract: it ends within a bound set by the input size, and stays
/// ended after an error.
pub fn read_all<R: std::io::Read>(mut reader: Reader<R>, input_len: usize) -> (Vec<Record>, Option<Error>) {
    // Every record or block takes at least 12 bytes of input.
    let bound = input_len / 12 + 2;
    let mut records = Vec::new();
    let mut error = None;
    for item in reader.by_ref().take(bound) {
        match item {
            Ok(record) => {
                assert!(error.is_none(), "a record after an error");
                records.push(record);
            }
            Err(e) => {
                assert!(error.is_none(), "two errors");
                error = Some(e);
            }
        }
    }
    assert!(reader.next().is_none(), "the reader did not end within {bound} items");
    assert!(reader.next().is_none(), "the reader is not fused");
    (records, error)
}

/// Reads an in-memory capture; `Err` if even the file header is unreadable.
pub fn read_bytes(bytes: &[u8]) -> Result<(Vec<Record>, Option<Error>), Error> {
    Ok(read_all(Reader::from_slice(bytes)?, bytes.len()))
}

/// Builds pcapng files field by field, in either byte order.
pub struct Ng {
    pub out: Vec<u8>,
    big: bool,
}

impl Ng {
    pub fn new() -> Ng {
        Ng { out: Vec::new(), big: false }
    }

    fn u16(&self, v: u16) -> [u8; 2] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn u32(&self, v: u32) -> [u8; 4] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    /// Options in this section's byte order, closed by opt_endofopt.
    pub fn options(&self, options: &[(u16, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (code, value) in options {
            out.extend(self.u16(*code));
            out.extend(self.u16(value.len() as u16));
            out.extend(*value);
            out.resize(out.len().div_ceil(4) * 4, 0);
        }
        if !options.is_empty() {
            out.extend([0; 4]);
        }
        out
    }

    /// A block with `body` (padded to 32 bits); `trailer` overrides the trailing length.
    pub fn block_with_trailer(&mut self, block_type: u32, body: &[u8], trailer: Option<u32>) -> &mut Ng {
        let mut body = body.to_vec();
        body.resize(body.len().div_ceil(4) * 4, 0);
        let len = 12 + body.len() as u32;
        let head = [self.u32(block_type), self.u32(len)].concat();
        self.out.extend(head);
        self.out.extend(body);
        self.out.extend(self.u32(trailer.unwrap_or(len)));
        self
    }

    pub fn block(&mut self, block_type: u32, body: &[u8]) -> &mut Ng {
        self.block_with_trailer(block_type, body, None)
    }

    /// Starts a section in the given byte order.
    pub fn shb(&mut self, big: bool, major: u16) -> &mut Ng {
        self.big = big;
        let body = [&self.u32(0x1a2b_3c4d)[..], &self.u16(major), &self.u16(0), &[0xff; 8]].concat();
        self.block(0x0a0d_0d0a, &body)
    }

    pub fn idb(&mut self, linktype: u16, snaplen: u32, options: &[(u16, &[u8])]) -> &mut Ng {
        let body = [&self.u16(linktype)[..], &self.u16(0), &self.u32(snaplen), &self.options(options)].concat();
        self.block(1, &body)
    }

    pub fn epb(&mut self, if_id: u32, ts: u64, data: &[u8], orig_len: u32) -> &mut Ng {
        let mut body = [&self.u32(if_id)[..], &self.packet(ts, data, orig_len)].concat();
        body.resize(body.len().div_ceil(4) * 4, 0);
        self.block(6, &body)
    }

    pub fn spb(&mut self, data: &[u8], orig_len: u32) -> &mut Ng {
        let body = [&self.u32(orig_len)[..], data].concat();
        self.block(3, &body)
    }

    /// The obsolete Packet Block (type 2).
    pub fn pb(&mut self, if_id: u16, ts: u64, data: &[u8], orig_len: u32) -> &mut Ng {
        let body = [&self.u16(if_id)[..], &self.u16(0), &self.packet(ts, data, orig_len)].concat();
        self.block(2, &body)
    }

    /// What an EPB and a PB hold after the interface: the timestamp (high and low words), the
    /// captured and the original length, and the data.
    fn packet(&self, ts: u64, data: &[u8], orig_len: u32) -> Vec<u8> {
        [
            &self.u32((ts >> 32) as u32)[..],
            &self.u32(ts as u32),
            &self.u32(data.len() as u32),
            &self.u32(orig_len),
            data,
        ]
        .concat()
    }
}

/// Frames of assorted sizes: empty, unaligned, minimal Ethernet, full MTU, jumbo.
pub fn sample_frames() -> Vec<Vec<u8>> {
    [0usize, 1, 3, 4, 5, 60, 61, 1514, 9018]
        .iter()
        .map(|&len| (0..len).map(|i| (i * 7 + len) as u8).collect())
        .collect()
}
