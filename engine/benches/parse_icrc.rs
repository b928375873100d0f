//! Parse + ICRC verify of RoCEv2 frames, next to a bare crc32fast pass over the same bytes, in
//! the same run: the parse should cost little beside the CRC. Two parses: the zero-copy view a
//! receiver uses (`RoceView`) and the full decode into header values (`FrameRepr::parse`, what
//! capture analysis uses).
//!
//! `cargo bench -p softrdma-engine --bench parse_icrc`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softrdma_engine::wire::icrc;
use softrdma_engine::wire::roce::{self, FrameRepr};

#[path = "support/frame.rs"]
mod support;

fn bench(c: &mut Criterion) {
    for payload in [64usize, 4096] {
        let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
        let f = support::rc_send_only(&data);
        let l3 = &f[14..];
        let mut g = c.benchmark_group(format!("rocev2_{payload}B_payload"));
        g.throughput(Throughput::Bytes(l3.len() as u64));
        g.bench_function("crc32fast_bare", |b| {
            // The bytes the ICRC covers: 8 x 0xFF, then the packet up to the ICRC.
            b.iter(|| {
                let mut h = crc32fast::Hasher::new();
                h.update(&[0xff; 8]);
                h.update(black_box(&l3[..l3.len() - 4]));
                black_box(h.finalize())
            })
        });
        g.bench_function("icrc_verify", |b| b.iter(|| black_box(icrc::verify_roce_v2(black_box(l3)).unwrap())));
        // What the device computes for each packet it sends or receives: the IP and UDP headers
        // as one part, the transport packet (the UDP payload) as the other.
        g.bench_function("icrc_of_parts", |b| {
            b.iter(|| black_box(icrc::roce_v2_parts(black_box(&l3[..28]), black_box(&l3[28..l3.len() - 4])).unwrap()))
        });
        g.bench_function("view_and_icrc_verify", |b| {
            b.iter(|| {
                let v = roce::RoceView::new_checked(black_box(&f)).unwrap();
                assert!(v.icrc_ok());
                black_box(v.ib.bth().psn())
            })
        });
        g.bench_function("parse_to_reprs_and_icrc_verify", |b| {
            b.iter(|| {
                let p = FrameRepr::parse(black_box(&f)).unwrap();
                assert!(p.icrc_ok);
                black_box(p.repr.ib.bth.psn)
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
