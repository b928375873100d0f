//! Fuzzes the packet parsers with untrusted bytes: frame dissection, strict frame parsing, the
//! transport packet view and its repr, and the capture analysis. None may panic; a frame that
//! parses must re-emit to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_engine::wire::roce::{self, EmitOptions, FrameRepr};
use softrdma_engine::wire::{EtherType, IbPacket, IbRepr};
use softrdma_pcap::analyze::summarize;
use softrdma_pcap::LinkType;

fuzz_target!(|data: &[u8]| {
    let d = roce::dissect(data);
    let _ = (d.icrc_ok(), d.stored_icrc());
    if let Ok(p) = FrameRepr::parse(data) {
        let _ = (p.ib.payload(), p.ib.pad(), p.ib.icrc());
        // What parsed re-emits into a frame that parses back to the same headers.
        let mut out = vec![0u8; p.repr.buffer_len()];
        if let Ok(n) = p.repr.emit(&mut out, p.ib.payload(), EmitOptions { udp_checksum: p.udp_checksum != 0 }) {
            let again = FrameRepr::parse(&out[..n]).expect("an emitted frame parses");
            assert_eq!(again.repr, p.repr);
            assert!(again.icrc_ok);
        }
    }
    if let Ok(p) = IbPacket::new_checked(data) {
        let _ = IbRepr::parse(&p);
        let _ = (p.reth(), p.aeth(), p.deth(), p.xrceth(), p.atomiceth(), p.payload());
    }
    for et in [EtherType::Ipv4, EtherType::Ipv6, EtherType::Roce] {
        let _ = roce::dissect_network_layer(et, data).icrc_ok();
    }
    for lt in [LinkType::ETHERNET, LinkType::RAW, LinkType::LINUX_SLL, LinkType::LINUX_SLL2] {
        let _ = summarize(1, lt, data, false);
        let _ = summarize(1, lt, data, true);
    }
});
