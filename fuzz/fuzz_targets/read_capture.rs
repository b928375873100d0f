//! Fuzzes the capture reader and the analysis of every record it yields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_pcap::analyze::summarize;
use softrdma_pcap::Reader;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = Reader::from_slice(data) {
        for rec in reader.take(10_000) {
            match rec {
                Ok(r) => {
                    let _ = summarize(r.index, r.linktype, &r.data, r.is_truncated());
                }
                Err(_) => break,
            }
        }
    }
});
