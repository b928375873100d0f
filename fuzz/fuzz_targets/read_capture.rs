//! Fuzzes the capture reader, the analysis of every record it yields, and the replay of the
//! capture's conversations under both behaviour profiles (`softrdma pcap replay`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_engine::device::WireProfile;
use softrdma_pcap::analyze::summarize;
use softrdma_pcap::behaviour::Capture;
use softrdma_pcap::replay::{replay, Options, Side};
use softrdma_pcap::Reader;

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = Reader::from_slice(data) else { return };
    let mut cap = Capture::default();
    for rec in reader.take(10_000) {
        match rec {
            Ok(r) => {
                let s = summarize(r.index, r.linktype, &r.data, r.is_truncated());
                cap.add(&r, &s);
            }
            Err(_) => break,
        }
    }
    for behaviour in [WireProfile::RXE, WireProfile::CX] {
        let r = replay("fuzz", &cap, &Options { side: Side::Both, behaviour, recv_depth: None });
        assert!(r.answers_matched <= r.answers_expected);
        let _ = softrdma_pcap::replay::text(&r);
    }
});
