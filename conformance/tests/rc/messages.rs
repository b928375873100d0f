//! RC messages as they should go: each operation's packets, segmentation by the path MTU, PSN
//! wrap, zero-length and 2 GiB - 1 messages, inline data, fences, max_rd_atomic, unsignaled
//! work, many QPs at once (IBTA Vol 1 chapter 9, the reliable service of 9.7).

use super::*;

#[test]
fn send_only_delivers_data_and_both_completions() {
    let (mut p, a, b) = setup(RcOptions::default());
    let msg = pattern(100, 1);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 4096);
    send(&mut p, &a, 1, SendOp::Send, BASE, 100);
    p.drive(STEPS);
    assert_eq!(p.read(B, BASE + 0x1000, 100), msg);
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.len(), 1);
    assert_eq!((wa[0].wr_id, wa[0].status, wa[0].opcode, wa[0].byte_len), (1, WcStatus::Success, WcOpcode::Send, 100));
    let wb = p.poll(B, b.cq);
    assert_eq!(wb.len(), 1);
    assert_eq!((wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len), (7, WcStatus::Success, WcOpcode::Recv, 100));
    assert_eq!(p.sent(A), vec![Opcode::RC_SEND_ONLY]);
    assert_eq!(p.sent(B), vec![Opcode::RC_ACKNOWLEDGE]);
    // IBTA 11.6.2: COMM_EST at B's first packet in RTR? B was already RTS, so no event.
    assert_eq!(p.b.poll_event(), None);
}

#[test]
fn segmentation_by_path_mtu_first_middle_last() {
    let (mut p, a, b) = setup(RcOptions { mtu: Mtu::Mtu1024, ..RcOptions::default() });
    let msg = pattern(5000, 2);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 8192);
    send(&mut p, &a, 1, SendOp::Send, BASE, 5000);
    p.drive(STEPS);
    assert_eq!(
        p.sent(A),
        vec![
            Opcode::RC_SEND_FIRST,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_LAST
        ]
    );
    let psns: Vec<u32> = p.log.iter().filter(|s| s.from == A).map(|s| s.psn.value()).collect();
    assert_eq!(psns, vec![100, 101, 102, 103, 104]);
    // AckReq only on the last packet of the message (rxe's placement).
    let acks: Vec<bool> = p.log.iter().filter(|s| s.from == A).map(|s| s.ack_req).collect();
    assert_eq!(acks, vec![false, false, false, false, true]);
    assert_eq!(p.read(B, BASE + 0x10000, 5000), msg);
    assert_eq!(p.poll(B, b.cq)[0].byte_len, 5000);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn write_and_write_with_immediate() {
    let (mut p, a, b) = setup(RcOptions::default());
    let msg = pattern(3000, 3);
    p.fill(A, BASE, &msg);
    send(&mut p, &a, 1, SendOp::Write { remote_addr: BASE + 0x20000, rkey: b.mr.rkey }, BASE, 3000);
    p.drive(STEPS);
    assert_eq!(p.read(B, BASE + 0x20000, 3000), msg);
    assert!(p.poll(B, b.cq).is_empty(), "a WRITE consumes no receive WQE");
    post_recv(&mut p, B, &b, 9, BASE + 0x30000, 16);
    send(&mut p, &a, 2, SendOp::WriteWithImm { remote_addr: BASE + 0x21000, rkey: b.mr.rkey, imm: 0xabcd }, BASE, 10);
    p.drive(STEPS);
    let wb = p.poll(B, b.cq);
    assert_eq!(wb.len(), 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].opcode, wb[0].imm, wb[0].byte_len),
        (9, WcOpcode::RecvRdmaWithImm, Some(0xabcd), 10)
    );
    assert_eq!(p.read(B, BASE + 0x21000, 10), msg[..10].to_vec());
    assert_eq!(p.statuses(A, a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn read_multi_packet() {
    let (mut p, a, b) = setup(RcOptions::default());
    let data = pattern(4500, 4);
    p.fill(B, BASE + 0x40000, &data);
    send(&mut p, &a, 1, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 4500);
    p.drive(STEPS);
    assert_eq!(p.read(A, BASE + 0x50000, 4500), data);
    assert_eq!(
        p.sent(B),
        vec![
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_LAST
        ]
    );
    let wa = p.poll(A, a.cq);
    assert_eq!((wa[0].status, wa[0].opcode, wa[0].byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 4500));
    // The READ consumed 5 PSNs: the next request uses PSN 105.
    send(&mut p, &a, 2, SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.log.iter().rfind(|s| s.from == A).unwrap().psn, Psn::new(105));
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    let (mut p, a, b) = setup(RcOptions::default());
    let target = BASE + 0x8000;
    p.fill(B, target, &5u64.to_ne_bytes());
    let op = SendOp::FetchAdd { remote_addr: target, rkey: b.mr.rkey, add: 10 };
    send(&mut p, &a, 1, op, BASE + 0x100, 8);
    let op = SendOp::CompareSwap { remote_addr: target, rkey: b.mr.rkey, compare: 15, swap: 99 };
    send(&mut p, &a, 2, op, BASE + 0x108, 8);
    let op = SendOp::CompareSwap { remote_addr: target, rkey: b.mr.rkey, compare: 15, swap: 1 };
    send(&mut p, &a, 3, op, BASE + 0x110, 8);
    p.drive(STEPS);
    let get = |p: &mut Pair, side, addr| u64::from_ne_bytes(p.read(side, addr, 8).try_into().unwrap());
    assert_eq!(get(&mut p, A, BASE + 0x100), 5);
    assert_eq!(get(&mut p, A, BASE + 0x108), 15);
    assert_eq!(get(&mut p, A, BASE + 0x110), 99, "compare failed: original returned, no swap");
    assert_eq!(get(&mut p, B, target), 99);
    let wa = p.poll(A, a.cq);
    assert_eq!(
        wa.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        vec![WcOpcode::FetchAdd, WcOpcode::CompSwap, WcOpcode::CompSwap]
    );
}

#[test]
fn psn_wraps_around_mid_message() {
    let (mut p, a, b) = setup(RcOptions { psn_a: 0xff_fffe, ..RcOptions::default() });
    let msg = pattern(4000, 7);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 8192);
    send(&mut p, &a, 1, SendOp::Send, BASE, 4000);
    p.drive(STEPS);
    let psns: Vec<u32> = p.log.iter().filter(|s| s.from == A).map(|s| s.psn.value()).collect();
    assert_eq!(psns, vec![0xff_fffe, 0xff_ffff, 0, 1]);
    assert_eq!(p.read(B, BASE + 0x10000, 4000), msg);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn zero_length_send_and_write() {
    let (mut p, a, b) = setup(RcOptions::default());
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    p.dev(A).post_send(a.qpn, SendWr::new(1, SendOp::Send, vec![])).unwrap();
    p.dev(A).post_send(a.qpn, SendWr::new(2, SendOp::Write { remote_addr: 0, rkey: 0 }, vec![])).unwrap();
    p.drive(STEPS);
    let wb = p.poll(B, b.cq);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 0));
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::Success, WcStatus::Success]);
}

#[test]
fn max_rd_atomic_one_keeps_one_read_outstanding() {
    let (mut p, a, b) = setup(RcOptions { max_rd_atomic: 1, ..RcOptions::default() });
    p.fill(B, BASE + 0x40000, &pattern(64, 8));
    for i in 0..5u64 {
        let op = SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey };
        send(&mut p, &a, i, op, BASE + 0x50000 + i * 64, 64);
    }
    p.drive(STEPS);
    // Requests and responses alternate: never two READs in flight.
    let order: Vec<usize> = p.log.iter().map(|s| s.from).collect();
    assert_eq!(order, vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
    assert_eq!(p.poll(A, a.cq).len(), 5);
}

#[test]
fn comm_est_when_the_first_packet_arrives_in_rtr() {
    use softrdma_engine::device::QpAttr;
    use softrdma_engine::verbs::AttrMask;
    let (mut p, a, b) = setup(RcOptions::default());
    // Put B back through RESET to RTR only.
    p.b.modify_qp(b.qpn, &QpAttr { qp_state: QpState::Reset, ..Default::default() }, AttrMask::STATE).unwrap();
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: RcOptions::default().access,
        ..Default::default()
    };
    p.b.modify_qp(b.qpn, &attr, AttrMask::STATE | AttrMask::PORT | AttrMask::PKEY_INDEX | AttrMask::ACCESS_FLAGS)
        .unwrap();
    attr.qp_state = QpState::Rtr;
    attr.dest = softrdma_conformance::pair::ADDR_A;
    attr.dest_qp_num = a.qpn.value();
    attr.rq_psn = 100;
    attr.path_mtu = Mtu::Mtu1024;
    attr.max_dest_rd_atomic = 1;
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    p.b.modify_qp(b.qpn, &attr, m).unwrap();
    post_recv(&mut p, B, &b, 1, BASE, 64);
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    p.drive(STEPS);
    assert_eq!(p.b.poll_event(), Some(AsyncEvent::CommEst(b.qpn)));
    assert_eq!(p.poll(B, b.cq).len(), 1, "an RTR QP receives");
}

#[test]
fn fence_waits_for_earlier_reads() {
    let (mut p, a, b) = setup(RcOptions::default());
    p.fill(B, BASE + 0x40000, &pattern(64, 9));
    send(&mut p, &a, 1, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 64);
    let mut w =
        SendWr::new(2, SendOp::Write { remote_addr: BASE + 0x60000, rkey: b.mr.rkey }, sge(&a, BASE + 0x50000, 64));
    w.fence = true;
    p.dev(A).post_send(a.qpn, w).unwrap();
    p.drive(STEPS);
    // The fenced WRITE left only after the READ response arrived, so it carries the read data.
    assert_eq!(
        p.log.iter().map(|s| (s.from, s.opcode)).collect::<Vec<_>>()[..3],
        [(0, Opcode::RC_RDMA_READ_REQUEST), (1, Opcode::RC_RDMA_READ_RESPONSE_ONLY), (0, Opcode::RC_RDMA_WRITE_ONLY)]
    );
    assert_eq!(p.read(B, BASE + 0x60000, 64), pattern(64, 9));
}

#[test]
fn unsignaled_success_makes_no_completion() {
    let (mut p, a, _b) = setup(RcOptions::default());
    let mut w = SendWr::new(1, SendOp::Write { remote_addr: 0, rkey: 0 }, vec![]);
    w.signaled = false;
    p.dev(A).post_send(a.qpn, w).unwrap();
    p.dev(A).post_send(a.qpn, SendWr::new(2, SendOp::Write { remote_addr: 0, rkey: 0 }, vec![])).unwrap();
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![2]);
}

#[test]
fn inline_data_is_copied_at_post_time() {
    let (mut p, a, b) = setup(RcOptions::default());
    p.fill(A, BASE, b"inline!!");
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    let mut w = SendWr::new(1, SendOp::Send, sge(&a, BASE, 8));
    w.inline = true;
    // No key is needed for inline data (IBV_SEND_INLINE).
    w.sg_list[0].lkey = 0;
    p.dev(A).post_send(a.qpn, w).unwrap();
    // Changing the buffer after the post does not change what is sent.
    p.fill(A, BASE, b"changed!");
    p.drive(STEPS);
    assert_eq!(p.read(B, BASE + 0x1000, 8), b"inline!!".to_vec());
    // More than max_inline_data is EINVAL.
    let mut w = SendWr::new(2, SendOp::Send, sge(&a, BASE, 4096));
    w.inline = true;
    assert_eq!(p.dev(A).post_send(a.qpn, w), Err(softrdma_engine::verbs::VerbsError::Inval));
}

#[test]
fn two_gib_minus_one_write_announces_its_length_and_is_accepted() {
    use softrdma_engine::connect::{connect_pair, ConnectParams, End};
    use softrdma_engine::device::{Device, DeviceConfig, QpCaps, QpInit, RecvMeta};
    use softrdma_engine::memory::VecMemory;
    use softrdma_engine::verbs::{Access, QpType};
    use softrdma_engine::wire::IbPacket;
    let len: u32 = (1 << 31) - 1;
    let big = 1u64 << 31;
    let addrs = [softrdma_conformance::pair::ADDR_A, softrdma_conformance::pair::ADDR_B];
    // Two devices with 2 GiB of (lazily zeroed) memory each.
    let mut devs: Vec<(Device<VecMemory>, _, _)> = addrs
        .iter()
        .map(|&ip| {
            let mut m = VecMemory::new();
            m.add(1, BASE, big as usize);
            let mut d = Device::new(DeviceConfig::new(ip, 3), m);
            let pd = d.alloc_pd(1);
            let cq = d.create_cq(16).unwrap();
            let mr = d.reg_mr(pd, BASE, big, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
            let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
            let qpn = d
                .create_qp(QpInit {
                    qp_type: QpType::Rc,
                    pd,
                    send_cq: cq,
                    recv_cq: cq,
                    caps,
                    sq_sig_all: false,
                    srq: None,
                })
                .unwrap();
            (d, qpn, mr)
        })
        .collect();
    let (qa, qb) = (devs[0].1, devs[1].1);
    let params = ConnectParams {
        mtu: Mtu::Mtu4096,
        access: Access::REMOTE_WRITE,
        qkey: 0,
        timeout: 0,
        retry_cnt: 0,
        rnr_retry: 0,
        min_rnr_timer: 0,
        max_rd_atomic: 0,
        max_dest_rd_atomic: 0,
    };
    let [(da, ..), (db, ..)] = &mut devs[..] else { unreachable!("two devices") };
    connect_pair(
        End { dev: da, qpn: qa, qp_type: QpType::Rc, psn: 0 },
        End { dev: db, qpn: qb, qp_type: QpType::Rc, psn: 0 },
        &params,
    )
    .unwrap();
    let rkey = devs[1].2.rkey;
    let lkey = devs[0].2.lkey;
    let wr = SendWr::new(1, SendOp::Write { remote_addr: BASE, rkey }, vec![Sge { addr: BASE, length: len, lkey }]);
    devs[0].0.post_send(qa, wr).unwrap();
    // Move the first three packets only (the whole message is 524,288 packets).
    let mut buf = vec![0u8; 8192];
    let now = softrdma_engine::time::Instant::ZERO;
    for i in 0..3 {
        let t = devs[0].0.poll_transmit(now, &mut buf).unwrap();
        let p = IbPacket::new_checked(&buf[..t.len]).unwrap();
        if i == 0 {
            assert_eq!(p.opcode(), Opcode::RC_RDMA_WRITE_FIRST);
            assert_eq!(p.reth().unwrap().dma_len(), len, "the RETH announces 2^31 - 1 bytes");
        } else {
            assert_eq!(p.opcode(), Opcode::RC_RDMA_WRITE_MIDDLE);
        }
        assert_eq!(p.payload().len(), 4096);
        devs[1].0.handle_packet(
            now,
            RecvMeta { src: addrs[0], src_port: t.src_port, ip_id: None, dst: None },
            &buf[..t.len],
        );
    }
    // The responder accepted them (2 GiB bounds check passed): no NAK, three packets counted.
    assert_eq!(devs[1].0.counters().rcvd_pkts, 3);
    assert!(devs[1].0.poll_transmit(now, &mut buf).is_none(), "no NAK");
    assert_eq!(devs[1].0.query_qp(qb).unwrap().0, QpState::Rts);
}

#[test]
fn a_thousand_qp_pairs_each_complete_their_work() {
    // Per-QP state is independent: one message on each of 1000 connected pairs, all posted at
    // once, all complete (the device's ready queue and timer index serve every QP).
    let mut p = Pair::new(77);
    let pairs: Vec<(Side, Side)> =
        (0..1000).map(|i| p.connect_rc(RcOptions { depth: 2, cqe: 4, psn_a: i, ..RcOptions::default() })).collect();
    for (i, (a, b)) in pairs.iter().enumerate() {
        post_recv(&mut p, B, b, i as u64, BASE + 0x1000, 64);
        p.dev(A).post_send(a.qpn, SendWr::new(i as u64, SendOp::Send, sge(a, BASE, 16))).unwrap();
    }
    p.drive(1_000_000);
    for (i, (a, b)) in pairs.iter().enumerate() {
        assert_eq!(p.statuses(A, a.cq), vec![(i as u64, WcStatus::Success)]);
        assert_eq!(p.poll(B, b.cq).len(), 1);
    }
    assert_eq!(p.a.poll_timeout(), None, "no timer left armed once everything is acknowledged");
}
