//! Two engines of one device (two processes sharing a device's address and steered port, each
//! running its own QPNs): what travels between them is the device's internal loopback, which
//! an HCA never puts on a wire. Whether those packets carry an ICRC follows the transmit's
//! `loopback_icrc` (the device captures or injects faults: yes; otherwise no), whichever engine
//! runs the destination QP; a receiver told the same takes them without the check
//! (`handle_internal_packet`), and one that checks drops a packet without it.

use std::net::{IpAddr, Ipv4Addr};

use softrdma_engine::connect::{connect_pair, ConnectParams, End};
use softrdma_engine::device::{ip_udp_header, Transmit};
use softrdma_engine::device::{qpn_block, CqId, Device, DeviceConfig, QpCaps, QpInit, RecvMeta, TransmitOptions};
use softrdma_engine::memory::{Owner, VecMemory};
use softrdma_engine::time::Instant;
use softrdma_engine::verbs::{Access, Mtu, QpType, WcStatus};
use softrdma_engine::wire::{icrc, IbPacket, Qpn};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));
const OWNER: Owner = 1;
const BASE: u64 = 0x10_0000;
const MEM: usize = 1 << 16;

struct Side {
    dev: Device<VecMemory>,
    qpn: Qpn,
    cq: CqId,
    lkey: u32,
}

/// An engine of the device on ADDR that runs the QPNs of `block` only.
fn side(block: u32, seed: u64) -> Side {
    let mut mem = VecMemory::new();
    mem.add(OWNER, BASE, MEM);
    let mut dev = Device::new(DeviceConfig::new(ADDR, seed), mem);
    dev.restrict_qpns_to(vec![block], block << softrdma_engine::device::QPN_BLOCK_SHIFT);
    let pd = dev.alloc_pd(OWNER);
    let cq = dev.create_cq(16).unwrap();
    let mr = dev.reg_mr(pd, BASE, MEM as u64, Access::LOCAL_WRITE).unwrap();
    let caps = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init = QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None };
    let qpn = dev.create_qp(init).unwrap();
    assert_eq!(qpn_block(qpn.value()), block);
    Side { dev, qpn, cq, lkey: mr.lkey }
}

/// Two engines of the device, an RC QP on each, connected; `b` has a receive posted and `a` a
/// 100-byte SEND. Returns the SEND's packet as `a` transmits it with `loopback_icrc`.
fn send_between_engines(loopback_icrc: bool) -> (Side, Side, Vec<u8>, Transmit) {
    let (mut a, mut b) = (side(1, 1), side(2, 2));
    let p = ConnectParams { mtu: Mtu::Mtu1024, ..ConnectParams::default() };
    connect_pair(
        End { dev: &mut a.dev, qpn: a.qpn, qp_type: QpType::Rc, psn: 10 },
        End { dev: &mut b.dev, qpn: b.qpn, qp_type: QpType::Rc, psn: 20 },
        &p,
    )
    .unwrap();
    a.dev.memory().set(OWNER, BASE, &[7u8; 100]);
    let rsge = vec![Sge { addr: BASE + 4096, length: 1024, lkey: b.lkey }];
    b.dev.post_recv(b.qpn, RecvWr { wr_id: 1, sg_list: rsge }).unwrap();
    let ssge = vec![Sge { addr: BASE, length: 100, lkey: a.lkey }];
    a.dev.post_send(a.qpn, SendWr::new(2, SendOp::Send, ssge)).unwrap();
    let mut buf = vec![0u8; 2048];
    let opts = TransmitOptions { loopback_icrc, ..TransmitOptions::default() };
    let t = a.dev.poll_transmit_with(Instant::ZERO, &mut buf, opts).expect("the SEND leaves");
    assert_eq!(t.dst, ADDR, "the destination QP is on the device's own address");
    buf.truncate(t.len);
    (a, b, buf, t)
}

/// Whether `pkt`, sent from ADDR's `sport` to ADDR, carries its right ICRC.
fn icrc_right(pkt: &[u8], sport: u16) -> bool {
    let (hdr, n) = ip_udp_header(ADDR, ADDR, sport, pkt.len(), 0);
    let p = IbPacket::new_checked(pkt).unwrap();
    icrc::roce_v2_parts(&hdr[..n], p.body()).is_ok_and(|c| c == p.icrc())
}

fn meta(t: &Transmit) -> RecvMeta {
    RecvMeta { src: ADDR, src_port: t.src_port, ip_id: None, dst: None }
}

#[test]
fn a_packet_for_another_engines_qp_on_the_address_carries_an_icrc_only_when_asked() {
    // Asked (the device captures or injects faults): the right ICRC, which the receiver checks.
    let (_a, mut b, pkt, t) = send_between_engines(true);
    assert!(icrc_right(&pkt, t.src_port), "the ICRC asked for is wrong");
    b.dev.handle_packet(Instant::ZERO, meta(&t), &pkt);
    assert_eq!(b.dev.counters().icrc_err, 0);
    let c = b.dev.poll_cq(b.cq, 4);
    assert_eq!((c.len(), c[0].status, c[0].byte_len), (1, WcStatus::Success, 100));

    // Not asked: no ICRC, although another engine runs the destination QP.
    let (_a, mut b, pkt, t) = send_between_engines(false);
    assert!(!icrc_right(&pkt, t.src_port), "an ICRC was computed that nobody asked for");
    // A receiver that checks drops it (and so must be told as the sender was) ...
    b.dev.handle_packet(Instant::ZERO, meta(&t), &pkt);
    assert_eq!(b.dev.counters().icrc_err, 1);
    assert!(b.dev.poll_cq(b.cq, 4).is_empty());
    // ... one told takes it as internal loopback, every other check made.
    b.dev.handle_internal_packet(Instant::ZERO, meta(&t), &pkt);
    let c = b.dev.poll_cq(b.cq, 4);
    assert_eq!((c.len(), c[0].status, c[0].byte_len), (1, WcStatus::Success, 100));
    assert_eq!(b.dev.memory().get(OWNER, BASE + 4096, 100), vec![7u8; 100]);
}
