//! Engine-only cost of the RC transport: two devices wired back to back in one thread (no I/O,
//! no simulator), requester + responder + completer on both sides. Reports packets/s for 4 KiB
//! RDMA WRITEs and 64 B SENDs, ACKs included.
//!
//! `cargo bench -p softrdma-engine --bench rc_engine`

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant as WallClock;

use criterion::{criterion_group, Criterion, Throughput};
use softrdma_engine::device::{CqId, Device, DeviceConfig, MrKeys, QpAttr, QpCaps, QpInit, RecvMeta};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::time::Instant;
use softrdma_engine::verbs::{Access, AttrMask, Mtu, QpState, QpType};
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

fn connect(s: &mut Side, peer: Qpn, peer_addr: IpAddr) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    s.dev
        .modify_qp(s.qpn, &a, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::Mtu4096;
    a.dest = peer_addr;
    a.dest_qp_num = peer.value();
    a.max_dest_rd_atomic = 16;
    let m = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    s.dev.modify_qp(s.qpn, &a, m | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER).unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    let m = AttrMask::STATE | AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::SQ_PSN;
    s.dev.modify_qp(s.qpn, &a, m | AttrMask::MAX_QP_RD_ATOMIC).unwrap();
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
        let mut a = side(ia);
        let mut b = side(ib);
        let (qa, qb) = (a.qpn, b.qpn);
        connect(&mut a, qb, ib);
        connect(&mut b, qa, ia);
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
        let mut a = side(ia);
        let mut b = side(ib);
        let (qa, qb) = (a.qpn, b.qpn);
        connect(&mut a, qb, ib);
        connect(&mut b, qa, ia);
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
