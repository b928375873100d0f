//! The guarded copy (`softrdma_device::guard`, how a provider reaches its own process's memory)
//! next to `memcpy` (`softrdma_engine::copy::copy_bytes`) in the same run: 4 KiB pieces (a
//! packet's payload at MTU 4096) into a hot 64 KiB buffer and into a cold 256 MiB one, with the
//! destination 0 or 12 bytes above the source modulo 4 KiB (12: where `rep movsb` runs slowly
//! on AMD Zen, and where a payload read out of a region into a packet lands).
//!
//! `cargo bench -p softrdma-device --bench guarded_copy`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softrdma_device::guard;
use softrdma_engine::copy::copy_bytes;

fn copies(c: &mut Criterion) {
    assert!(guard::available());
    let src = vec![2u8; 3 * 4096];
    for (name, total) in [("hot 64 KiB", 64usize << 10), ("cold 256 MiB", 256 << 20)] {
        let mut dst = vec![1u8; total];
        let mut g = c.benchmark_group(format!("4 KiB pieces into {name}"));
        g.throughput(Throughput::Bytes(total as u64));
        if total > 1 << 20 {
            g.sample_size(10);
        }
        for distance in [0usize, 12] {
            // The source's offset that puts each piece's destination `distance` bytes above it
            // modulo 4 KiB (the pieces start 4 KiB apart in `dst`).
            let want = (dst.as_ptr() as usize).wrapping_sub(distance) & 4095;
            let off = (want + 4096 - (src.as_ptr() as usize & 4095)) & 4095;
            let s = &src[off..off + 4096];
            g.bench_function(format!("guarded, distance {distance}"), |b| {
                b.iter(|| {
                    for c in dst.chunks_mut(4096) {
                        assert!(guard::write(c.as_mut_ptr() as u64, &s[..c.len()]));
                    }
                    black_box(&mut dst);
                })
            });
            g.bench_function(format!("memcpy, distance {distance}"), |b| {
                b.iter(|| {
                    for c in dst.chunks_mut(4096) {
                        copy_bytes(c, &s[..c.len()]);
                    }
                    black_box(&mut dst);
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, copies);
criterion_main!(benches);
