//! Fuzzes the device's packet handling with forged packets that carry a valid ICRC and target a
//! live, connected RC QP pair: the responder, requester and completer paths must never panic, and
//! the devices must keep answering.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use softrdma_engine::connect::{connect_pair, ConnectParams, End};
use softrdma_engine::device::{ip_udp_header, Device, DeviceConfig, QpCaps, QpInit, RecvMeta};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::time::Instant;
use softrdma_engine::verbs::{Access, Mtu, QpType};
use softrdma_engine::wire::{icrc, IbPacket, Psn};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const BASE: u64 = 0x1_0000;

fuzz_target!(|data: &[u8]| {
    let addrs = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))];
    let mut devs = Vec::new();
    for (i, ip) in addrs.iter().enumerate() {
        let mut m = VecMemory::new();
        m.add(1, BASE, 1 << 16);
        let mut d = Device::new(DeviceConfig::new(*ip, i as u64), m);
        let pd = d.alloc_pd(1);
        let cq = d.create_cq(64).unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let mr = d.reg_mr(pd, BASE, 1 << 16, all).unwrap();
        let caps = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 0 };
        let qpn = d
            .create_qp(QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None })
            .unwrap();
        devs.push((d, qpn, mr));
    }
    let qpns = [devs[0].1, devs[1].1];
    let params = ConnectParams {
        mtu: Mtu::Mtu256,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        timeout: 4,
        retry_cnt: 1,
        rnr_retry: 0,
        min_rnr_timer: 0,
        max_rd_atomic: 2,
        max_dest_rd_atomic: 2,
        ..ConnectParams::default()
    };
    let [(da, ..), (db, ..)] = &mut devs[..] else { unreachable!("two devices") };
    connect_pair(
        End { dev: da, qpn: qpns[0], qp_type: QpType::Rc, psn: 0 },
        End { dev: db, qpn: qpns[1], qp_type: QpType::Rc, psn: 0 },
        &params,
    )
    .unwrap();
    let (lkey_b, rkey_b, lkey_a) = (devs[1].2.lkey, devs[1].2.rkey, devs[0].2.lkey);
    devs[1]
        .0
        .post_recv(qpns[1], RecvWr { wr_id: 1, sg_list: vec![Sge { addr: BASE, length: 1024, lkey: lkey_b }] })
        .unwrap();
    let _ = devs[0].0.post_send(
        qpns[0],
        SendWr::new(
            1,
            SendOp::Read { remote_addr: BASE, rkey: rkey_b },
            vec![Sge { addr: BASE, length: 600, lkey: lkey_a }],
        ),
    );
    // Input: records of [target side (bit 0), length (2 bytes)] then that many packet bytes.
    let mut buf = vec![0u8; 8192];
    let mut rest = data;
    let mut now = Instant::ZERO;
    while rest.len() >= 3 {
        let to = usize::from(rest[0] & 1);
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let mut pkt = rest[3..3 + len].to_vec();
        rest = &rest[3 + len..];
        if pkt.len() >= 16 {
            // Aim at the live QP and near its PSNs, and fix the ICRC.
            pkt[5..8].copy_from_slice(&qpns[to].value().to_be_bytes()[1..]);
            let (hdr, n) = ip_udp_header(addrs[1 - to], addrs[to], 0xc001, pkt.len(), 0);
            let body = pkt.len() - icrc::LEN;
            if let Ok(c) = icrc::roce_v2_parts(&hdr[..n], &pkt[..body]) {
                let b = pkt.len();
                pkt[b - 4..].copy_from_slice(&c.to_le_bytes());
            }
        }
        devs[to].0.handle_packet(now, RecvMeta { src: addrs[1 - to], src_port: 0xc001, ip_id: None, dst: None }, &pkt);
        for d in devs.iter_mut() {
            while d.0.poll_transmit(now, &mut buf).is_some() {}
            if let Some(t) = d.0.poll_timeout() {
                now = now.max(t);
                d.0.handle_timeout(now);
            }
        }
        let _ = IbPacket::new_checked(&pkt[..]).map(|p| p.bth().psn() == Psn::new(0));
    }
});
