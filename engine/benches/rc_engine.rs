//! Engine-only cost of the RC transport: two devices wired back to back in one thread (no I/O,
//! no simulator), requester + responder + completer on both sides. Reports packets/s for 4 KiB
//! RDMA WRITEs and 64 B SENDs, ACKs included.
//!
//! `cargo bench -p softrdma-engine --bench rc_engine`

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant as WallClock;

use criterion::{criterion_group, Criterion, Throughput};
use softrdma_engine::connect::{connect_pair, ConnectParams, End};
use softrdma_engine::device::{CqId, Device, DeviceConfig, MrKeys, QpCaps, QpInit, RecvMeta};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::time::Instant;
use softrdma_engine::verbs::{Access, Mtu, QpType};
use softrdma_engine::wire::Qpn;
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const BASE: u64 = 0x10_0000;
const MEM: usize = 8 << 20;
const BATCH: u64 = 512;

struct Side {
    dev: Device<VecMemory>,
    qpn: Qpn,
    cq: CqId,
    mr: MrKeys,
}

fn side(addr: IpAddr) -> Side {
    let mut m = VecMemory::new();
    m.add(1, BASE, MEM);
    let mut dev = Device::new(DeviceConfig::new(addr, 7), m);
    let pd = dev.alloc_pd(1);
    let cq = dev.create_cq(4 * BATCH as u32).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dev.reg_mr(pd, BASE, MEM as u64, all).unwrap();
    let caps = QpCaps {
        max_send_wr: 2 * BATCH as u32,
        max_recv_wr: 2 * BATCH as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qpn = dev
        .create_qp(QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None })
        .unwrap();
    Side { dev, qpn, cq, mr }
}

/// Two sides, their RC QPs connected to each other.
fn pair(ia: IpAddr, ib: IpAddr) -> (Side, Side) {
    let (mut a, mut b) = (side(ia), side(ib));
    let params = ConnectParams {
        mtu: Mtu::Mtu4096,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        min_rnr_timer: 0,
        ..ConnectParams::default()
    };
    connect_pair(
        End { dev: &mut a.dev, qpn: a.qpn, qp_type: QpType::Rc, psn: 0 },
        End { dev: &mut b.dev, qpn: b.qpn, qp_type: QpType::Rc, psn: 0 },
        &params,
    )
    .unwrap();
    (a, b)
}

/// Runs `BATCH` operations to completion; returns the packets exchanged.
fn batch(a: &mut Side, b: &mut Side, write: bool, len: u32, buf: &mut [u8]) -> u64 {
    let addr_a = a.dev.config().addr;
    let addr_b = b.dev.config().addr;
    for i in 0..BATCH {
        if !write {
            b.dev
                .post_recv(b.qpn, RecvWr { wr_id: i, sg_list: vec![Sge { addr: BASE, length: len, lkey: b.mr.lkey }] })
                .unwrap();
        }
        let op = if write { SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey } } else { SendOp::Send };
        let mut wr = SendWr::new(i, op, vec![Sge { addr: BASE, length: len, lkey: a.mr.lkey }]);
        wr.signaled = i == BATCH - 1;
        a.dev.post_send(a.qpn, wr).unwrap();
    }
    let now = Instant::ZERO;
    let mut pkts = 0;
    loop {
        let mut moved = false;
        while let Some(t) = a.dev.poll_transmit(now, buf) {
            b.dev.handle_packet(
                now,
                RecvMeta { src: addr_a, src_port: t.src_port, ip_id: None, dst: None },
                &buf[..t.len],
            );
            pkts += 1;
            moved = true;
        }
        while let Some(t) = b.dev.poll_transmit(now, buf) {
            a.dev.handle_packet(
                now,
                RecvMeta { src: addr_b, src_port: t.src_port, ip_id: None, dst: None },
                &buf[..t.len],
            );
            pkts += 1;
            moved = true;
        }
        if !moved {
            break;
        }
    }
    let done = a.dev.poll_cq(a.cq, usize::MAX);
    assert_eq!(done.len(), 1, "the last, signaled WR completes");
    b.dev.poll_cq(b.cq, usize::MAX);
    pkts
}

fn bench(c: &mut Criterion) {
    let ia: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let ib: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let mut buf = vec![0u8; 8192];
    for (name, write, len) in [("write_4KiB", true, 4096u32), ("send_64B", false, 64)] {
        let (mut a, mut b) = pair(ia, ib);
        // Packets per batch (data packets and ACKs), measured once.
        let per_batch = batch(&mut a, &mut b, write, len, &mut buf);
        let mut g = c.benchmark_group("rc_engine");
        g.throughput(Throughput::Elements(per_batch));
        g.bench_function(format!("{name}_{per_batch}_packets_per_batch"), |bch| {
            bch.iter_custom(|iters| {
                let t = WallClock::now();
                for _ in 0..iters {
                    batch(&mut a, &mut b, write, len, &mut buf);
                }
                t.elapsed()
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);

fn main() {
    // RC_PROFILE=write|send runs 200 batches without criterion, for callgrind/perf.
    if let Ok(mode) = std::env::var("RC_PROFILE") {
        let ia: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let ib: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let (write, len) = if mode == "write" { (true, 4096) } else { (false, 64) };
        let (mut a, mut b) = pair(ia, ib);
        let mut buf = vec![0u8; 8192];
        let mut pkts = 0;
        for _ in 0..200 {
            pkts += batch(&mut a, &mut b, write, len, &mut buf);
        }
        println!("{pkts} packets");
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
