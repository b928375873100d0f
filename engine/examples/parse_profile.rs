//! A fixed workload for profilers: parses and ICRC-verifies one RoCEv2 frame many times.
//! `valgrind --tool=callgrind target/release/examples/parse_profile 4096 100000` counts the
//! instructions per packet, repeatably on a noisy machine. MODE=parse (default) decodes into
//! header values with `FrameRepr::parse`; MODE=view uses the zero-copy `RoceView`; MODE=bare runs
//! crc32fast alone over the same bytes.

use std::hint::black_box;
use std::net::Ipv4Addr;

use softrdma_engine::wire::roce::{self, EmitOptions, FrameRepr};
use softrdma_engine::wire::{BthRepr, EthernetAddress, IbRepr, Opcode, Psn, Qpn};

fn main() {
    let mut args = std::env::args().skip(1);
    let payload: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let iterations: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let mut ib = IbRepr::new(BthRepr {
        opcode: Opcode::RC_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pad_count: IbRepr::pad_for(payload),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: Qpn::new(0x11),
        ack_req: true,
        psn: Psn::new(7),
    });
    ib.payload_len = payload;
    let repr = FrameRepr {
        eth: roce::default_eth(EthernetAddress([2, 0, 0, 0, 0, 1]), EthernetAddress([2, 0, 0, 0, 0, 2])),
        vlan_tci: None,
        l3: roce::ipv4_default(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 0),
        udp_src_port: 0xc011,
        ib,
    };
    let data = vec![0x5au8; payload];
    let mut frame = vec![0u8; repr.buffer_len()];
    repr.emit(&mut frame, &data, EmitOptions::default()).expect("emit");
    let mode = std::env::var("MODE").unwrap_or_else(|_| "parse".into());
    let mut ok = 0u64;
    for _ in 0..iterations {
        match mode.as_str() {
            "view" => {
                let v = roce::RoceView::new_checked(black_box(&frame)).expect("view");
                ok += u64::from(v.icrc_ok());
            }
            "bare" => {
                // The same bytes through crc32fast alone: the floor.
                let l3 = &black_box(&frame)[14..frame.len() - 4];
                let mut h = crc32fast::Hasher::new();
                h.update(&[0xff; 8]);
                h.update(l3);
                ok += u64::from(black_box(h.finalize()) != 1);
            }
            _ => {
                let p = FrameRepr::parse(black_box(&frame)).expect("parse");
                ok += u64::from(p.icrc_ok);
            }
        }
    }
    assert_eq!(ok, iterations);
    println!("{iterations} frames of {} bytes parsed and verified", frame.len());
}
