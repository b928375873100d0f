//! A fixed workload for profilers: parses and ICRC-verifies one RoCEv2 frame many times.
//! `valgrind --tool=callgrind target/release/examples/parse_profile 4096 100000` counts the
//! instructions per packet, repeatably on a noisy machine. MODE=parse (default) decodes into
//! header values with `FrameRepr::parse`; MODE=view uses the zero-copy `RoceView`; MODE=bare runs
//! crc32fast alone over the same bytes.

use std::hint::black_box;

use softrdma_engine::wire::roce::{self, FrameRepr};

#[path = "../benches/support/frame.rs"]
mod support;

fn main() {
    let mut args = std::env::args().skip(1);
    let payload: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let iterations: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let frame = support::rc_send_only(&vec![0x5au8; payload]);
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
