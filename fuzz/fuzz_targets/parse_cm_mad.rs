//! Fuzzes the CM MAD parsers (IBTA Vol 1 ch. 12) with untrusted bytes: `CmMadRepr::parse` and
//! `CmaHdrRepr::parse` must never panic, and whatever parses must emit without error and parse
//! back to an equal Repr.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_engine::wire::{CmMadRepr, CmaHdrPacket, CmaHdrRepr, MAD_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = CmMadRepr::parse(data) {
        let mut out = [0u8; MAD_LEN];
        repr.emit(&mut out).expect("a parsed CM MAD emits");
        assert_eq!(CmMadRepr::parse(&out).expect("an emitted CM MAD parses"), repr);
        if let Some(hdr) = repr.msg.cma_hdr() {
            let mut b = [0u8; CmaHdrRepr::LEN];
            hdr.emit(&mut CmaHdrPacket::new_unchecked(&mut b[..])).expect("a parsed cma_hdr emits");
        }
    }
    if let Ok(p) = CmaHdrPacket::new_checked(data) {
        let _ = (p.cma_version(), p.ip_version(), p.port(), p.src_addr(), p.dst_addr());
        if let Ok(hdr) = CmaHdrRepr::parse(&p) {
            let mut b = [0u8; CmaHdrRepr::LEN];
            hdr.emit(&mut CmaHdrPacket::new_unchecked(&mut b[..])).expect("a parsed cma_hdr emits");
            let again = CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&b[..]).unwrap()).expect("an emitted cma_hdr parses");
            assert_eq!(again, hdr);
        }
    }
});
