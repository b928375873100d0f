//! SRQ (IBTA 10.2.9), UD (IBTA 9.8, 10.2.5, 11.4.1.1) and UC (IBTA 9.7.7) rules.

use softrdma_conformance::pair::{Fate, Pair, RcOptions, Side, ADDR_A, ADDR_B, BASE, MEM, OWNER};
use softrdma_engine::device::{AsyncEvent, CqId, Device, QpAttr, QpCaps, QpInit, SrqAttr, GRH_SLOT};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::verbs::{Access, AttrMask, QpState, QpType, VerbsError, WcOpcode, WcStatus};
use softrdma_engine::wire::{Opcode, Qpn};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge, UdDest};

const STEPS: usize = 100_000;

fn sge(lkey: u32, addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge { addr, length: len, lkey }]
}

// ---------------------------------------------------------------- SRQ

#[test]
fn srq_is_shared_and_its_qp_has_no_receive_queue() {
    let mut p = Pair::new(1);
    let (a, b) = p.connect_rc(RcOptions { b_srq: Some(16), ..RcOptions::default() });
    let srq = b.srq.unwrap();
    assert_eq!(p.b.post_recv(b.qpn, RecvWr { wr_id: 1, sg_list: sge(b.mr.lkey, BASE, 64) }), Err(VerbsError::Inval));
    for i in 0..3 {
        p.b.post_srq_recv(srq, RecvWr { wr_id: 10 + i, sg_list: sge(b.mr.lkey, BASE + 0x1000 * (i + 1), 64) }).unwrap();
    }
    p.fill(0, BASE, b"via the srq");
    for i in 0..3 {
        p.a.post_send(a.qpn, SendWr::new(i, SendOp::Send, sge(a.mr.lkey, BASE, 11))).unwrap();
    }
    p.drive(STEPS);
    let wb = p.b.poll_cq(b.cq, 16);
    assert_eq!(wb.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![10, 11, 12]);
    assert_eq!(p.read(1, BASE + 0x3000, 11), b"via the srq".to_vec());
}

#[test]
fn srq_limit_event_fires_once_per_arming() {
    let mut p = Pair::new(2);
    let (a, b) = p.connect_rc(RcOptions { b_srq: Some(16), ..RcOptions::default() });
    let srq = b.srq.unwrap();
    for i in 0..6 {
        p.b.post_srq_recv(srq, RecvWr { wr_id: i, sg_list: sge(b.mr.lkey, BASE + 0x1000, 64) }).unwrap();
    }
    p.b.modify_srq_limit(srq, 4).unwrap();
    let send = |p: &mut Pair, n: u64| {
        for i in 0..n {
            p.a.post_send(a.qpn, SendWr::new(i, SendOp::Send, sge(a.mr.lkey, BASE, 8))).unwrap();
        }
        p.drive(STEPS);
        std::iter::from_fn(|| p.b.poll_event()).filter(|e| *e == AsyncEvent::SrqLimitReached(srq)).count()
    };
    // 6 -> 5 (not below 4), 5 -> 4, 4 -> 3: fires once, at 3.
    assert_eq!(send(&mut p, 3), 1);
    // Disarmed now: more consumption raises nothing.
    assert_eq!(send(&mut p, 1), 0);
    assert_eq!(p.b.query_srq(srq).unwrap().0.srq_limit, 0, "the limit disarms when it fires");
    // Re-armed by modify_srq.
    for i in 0..4 {
        p.b.post_srq_recv(srq, RecvWr { wr_id: 100 + i, sg_list: sge(b.mr.lkey, BASE + 0x1000, 64) }).unwrap();
    }
    // Re-armed with 6 WQEs queued: two more take it to 4 (not below), a third to 3.
    p.b.modify_srq_limit(srq, 4).unwrap();
    assert_eq!(send(&mut p, 2), 0);
    assert_eq!(send(&mut p, 1), 1);
}

#[test]
fn last_wqe_reached_when_a_qp_on_an_srq_goes_to_error() {
    let mut p = Pair::new(3);
    let (_a, b) = p.connect_rc(RcOptions { b_srq: Some(16), ..RcOptions::default() });
    p.b.modify_qp(b.qpn, &QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    assert_eq!(p.b.poll_event(), Some(AsyncEvent::LastWqeReached(b.qpn)));
    assert_eq!(p.b.destroy_srq(b.srq.unwrap()), Err(VerbsError::Busy), "a QP is attached");
}

#[test]
fn srq_limits_and_full_queue() {
    let mut p = Pair::new(4);
    let pd = p.b.alloc_pd(OWNER);
    assert_eq!(p.b.create_srq(pd, SrqAttr { max_wr: 0, max_sge: 1, srq_limit: 0 }), Err(VerbsError::Inval));
    assert_eq!(p.b.create_srq(pd, SrqAttr { max_wr: 1 << 20, max_sge: 1, srq_limit: 0 }), Err(VerbsError::Inval));
    let s = p.b.create_srq(pd, SrqAttr { max_wr: 2, max_sge: 1, srq_limit: 0 }).unwrap();
    let wr = || RecvWr { wr_id: 0, sg_list: vec![] };
    p.b.post_srq_recv(s, wr()).unwrap();
    p.b.post_srq_recv(s, wr()).unwrap();
    assert_eq!(p.b.post_srq_recv(s, wr()), Err(VerbsError::NoMem));
    assert_eq!(
        p.b.post_srq_recv(s, RecvWr { wr_id: 0, sg_list: vec![Sge { addr: 0, length: 1, lkey: 0 }; 2] }),
        Err(VerbsError::Inval)
    );
}

// ---------------------------------------------------------------- UD

struct Ud {
    qpn: Qpn,
    cq: CqId,
    lkey: u32,
}

fn ud_qp(d: &mut Device<VecMemory>, qkey: u32) -> Ud {
    let pd = d.alloc_pd(OWNER);
    let cq = d.create_cq(64).unwrap();
    let mr = d.reg_mr(pd, BASE, MEM as u64, Access::LOCAL_WRITE).unwrap();
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qpn = d
        .create_qp(QpInit { qp_type: QpType::Ud, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None })
        .unwrap();
    Pair::bring_up(d, qpn, QpType::Ud, &RcOptions::default(), ADDR_A, Qpn::new(0), 0, 0, qkey);
    Ud { qpn, cq, lkey: mr.lkey }
}

fn ud_send(p: &mut Pair, from: &Ud, to: &Ud, to_addr: std::net::IpAddr, qkey: u32, len: u32, wr_id: u64) {
    let mut w = SendWr::new(wr_id, SendOp::SendWithImm { imm: 0x77 }, sge(from.lkey, BASE, len));
    w.ud = Some(UdDest { dest: to_addr, remote_qpn: to.qpn.value(), remote_qkey: qkey });
    p.a.post_send(from.qpn, w).unwrap();
}

#[test]
fn ud_delivers_with_the_grh_slot_first() {
    let mut p = Pair::new(5);
    let a = ud_qp(&mut p.a, 0x1111);
    let b = ud_qp(&mut p.b, 0x2222);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 9, sg_list: sge(b.lkey, BASE + 0x1000, 256) }).unwrap();
    p.fill(0, BASE, b"datagram");
    ud_send(&mut p, &a, &b, ADDR_B, 0x2222, 8, 1);
    p.drive(STEPS);
    let wb = p.b.poll_cq(b.cq, 16);
    assert_eq!(wb.len(), 1);
    let w = wb[0];
    assert_eq!((w.wr_id, w.status, w.opcode, w.byte_len, w.grh), (9, WcStatus::Success, WcOpcode::Recv, 40 + 8, true));
    assert_eq!((w.src_qp, w.imm, w.src), (a.qpn, Some(0x77), Some(ADDR_A)));
    // The GRH slot: for RoCEv2 over IPv4, 20 bytes of nothing, then the IPv4 header.
    let slot = p.read(1, BASE + 0x1000, GRH_SLOT);
    assert_eq!(&slot[..20], &[0u8; 20]);
    assert_eq!(slot[20], 0x45);
    assert_eq!(slot[29], 17, "protocol UDP");
    assert_eq!(&slot[32..36], &[10, 0, 0, 1], "source address");
    assert_eq!(&slot[36..40], &[10, 0, 0, 2], "destination address");
    assert_eq!(p.read(1, BASE + 0x1000 + 40, 8), b"datagram".to_vec());
    // No ACK on UD; the send completes at once.
    assert_eq!(p.sent(1), Vec::<Opcode>::new());
    assert_eq!(p.sent(0), vec![Opcode::UD_SEND_ONLY_WITH_IMMEDIATE]);
    assert_eq!(p.a.poll_cq(a.cq, 16)[0].status, WcStatus::Success);
}

#[test]
fn ud_q_key_mismatch_is_dropped_and_counted() {
    let mut p = Pair::new(6);
    let a = ud_qp(&mut p.a, 0x1111);
    let b = ud_qp(&mut p.b, 0x2222);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 9, sg_list: sge(b.lkey, BASE + 0x1000, 256) }).unwrap();
    ud_send(&mut p, &a, &b, ADDR_B, 0x3333, 8, 1);
    p.drive(STEPS);
    assert!(p.b.poll_cq(b.cq, 16).is_empty());
    assert_eq!(p.b.counters().qkey_violations, 1);
}

#[test]
fn ud_q_key_with_the_high_bit_means_the_qps_own() {
    let mut p = Pair::new(7);
    let a = ud_qp(&mut p.a, 0x2222);
    let b = ud_qp(&mut p.b, 0x2222);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 9, sg_list: sge(b.lkey, BASE + 0x1000, 256) }).unwrap();
    ud_send(&mut p, &a, &b, ADDR_B, 0x8000_0000, 8, 1);
    p.drive(STEPS);
    assert_eq!(p.b.poll_cq(b.cq, 16).len(), 1);
    // And user space may not give a QP such a Q_Key: EPERM.
    let attr = QpAttr { qp_state: QpState::Rts, qkey: 0x8000_0001, ..QpAttr::default() };
    assert_eq!(p.a.modify_qp(a.qpn, &attr, AttrMask::STATE | AttrMask::QKEY), Err(VerbsError::Perm));
}

#[test]
fn ud_longer_than_the_port_mtu_sends_nothing_and_reports_no_error() {
    let mut p = Pair::new(8);
    let a = ud_qp(&mut p.a, 1);
    let b = ud_qp(&mut p.b, 1);
    ud_send(&mut p, &a, &b, ADDR_B, 1, 4097, 1);
    p.drive(STEPS);
    assert!(p.log.is_empty(), "no packet (IBTA C10-93.1.1, as rxe)");
    assert_eq!(p.a.poll_cq(a.cq, 16)[0].status, WcStatus::Success);
}

#[test]
fn ud_duplicated_datagram_is_delivered_twice() {
    let mut p = Pair::new(9);
    let a = ud_qp(&mut p.a, 1);
    let b = ud_qp(&mut p.b, 1);
    for i in 0..2 {
        p.b.post_recv(b.qpn, RecvWr { wr_id: i, sg_list: sge(b.lkey, BASE + 0x1000 * (i + 1), 256) }).unwrap();
    }
    p.set_filter(|_| Fate::Duplicate);
    ud_send(&mut p, &a, &b, ADDR_B, 1, 8, 1);
    p.drive(STEPS);
    assert_eq!(p.b.poll_cq(b.cq, 16).len(), 2, "no PSN check on UD");
}

#[test]
fn ud_without_a_receive_drops_silently() {
    let mut p = Pair::new(10);
    let a = ud_qp(&mut p.a, 1);
    let b = ud_qp(&mut p.b, 1);
    ud_send(&mut p, &a, &b, ADDR_B, 1, 8, 1);
    p.drive(STEPS);
    assert_eq!(p.b.counters().dropped_messages, 1);
    assert_eq!(p.sent(1).len(), 0, "no RNR NAK on UD");
}

// ---------------------------------------------------------------- UC

fn uc_pair(p: &mut Pair) -> (Side, Side) {
    let o = RcOptions::default();
    let mk = |d: &mut Device<VecMemory>| {
        let pd = d.alloc_pd(OWNER);
        let cq = d.create_cq(64).unwrap();
        let mr = d.reg_mr(pd, BASE, MEM as u64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let qpn = d
            .create_qp(QpInit { qp_type: QpType::Uc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None })
            .unwrap();
        Side { pd, cq, qpn, mr, srq: None }
    };
    let a = mk(&mut p.a);
    let b = mk(&mut p.b);
    Pair::bring_up(&mut p.a, a.qpn, QpType::Uc, &o, ADDR_B, b.qpn, 100, 200, 0);
    Pair::bring_up(&mut p.b, b.qpn, QpType::Uc, &o, ADDR_A, a.qpn, 200, 100, 0);
    (a, b)
}

#[test]
fn uc_send_and_write_without_acknowledgements() {
    let mut p = Pair::new(11);
    let (a, b) = uc_pair(&mut p);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 5, sg_list: sge(b.mr.lkey, BASE + 0x10000, 4096) }).unwrap();
    p.fill(0, BASE, &[3u8; 2500]);
    p.a.post_send(a.qpn, SendWr::new(1, SendOp::Send, sge(a.mr.lkey, BASE, 2500))).unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(2, SendOp::Write { remote_addr: BASE + 0x20000, rkey: b.mr.rkey }, sge(a.mr.lkey, BASE, 100)),
    )
    .unwrap();
    p.drive(STEPS);
    assert_eq!(p.sent(1), Vec::<Opcode>::new(), "UC never acknowledges");
    assert_eq!(
        p.sent(0),
        vec![Opcode::UC_SEND_FIRST, Opcode::UC_SEND_MIDDLE, Opcode::UC_SEND_LAST, Opcode::UC_RDMA_WRITE_ONLY]
    );
    assert_eq!(p.read(1, BASE + 0x10000, 2500), vec![3u8; 2500]);
    assert_eq!(p.read(1, BASE + 0x20000, 100), vec![3u8; 100]);
    assert_eq!(p.b.poll_cq(b.cq, 16)[0].byte_len, 2500);
    assert_eq!(p.a.poll_cq(a.cq, 16).len(), 2);
}

#[test]
fn uc_gap_drops_the_message_and_the_next_first_is_accepted() {
    let mut p = Pair::new(12);
    let (a, b) = uc_pair(&mut p);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 5, sg_list: sge(b.mr.lkey, BASE + 0x10000, 4096) }).unwrap();
    p.fill(0, BASE, &[4u8; 2500]);
    p.fill(0, BASE + 0x8000, b"second");
    // Lose the MIDDLE of the first message.
    p.set_filter(|s| if s.opcode == Opcode::UC_SEND_MIDDLE { Fate::Drop } else { Fate::Deliver });
    p.a.post_send(a.qpn, SendWr::new(1, SendOp::Send, sge(a.mr.lkey, BASE, 2500))).unwrap();
    p.a.post_send(a.qpn, SendWr::new(2, SendOp::Send, sge(a.mr.lkey, BASE + 0x8000, 6))).unwrap();
    p.drive(STEPS);
    // The first message is lost; the second (a new ONLY, with a later PSN) lands in the same
    // receive WQE, which was never completed.
    let wb = p.b.poll_cq(b.cq, 16);
    assert_eq!(wb.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(), vec![(5, 6)]);
    assert_eq!(p.read(1, BASE + 0x10000, 6), b"second".to_vec());
    assert_eq!(p.b.counters().dropped_messages, 1);
    // The sender completed both: UC does not know.
    assert_eq!(p.a.poll_cq(a.cq, 16).len(), 2);
}

#[test]
fn uc_has_no_read_or_atomic() {
    let mut p = Pair::new(13);
    let (a, b) = uc_pair(&mut p);
    let r = p
        .a
        .post_send(a.qpn, SendWr::new(1, SendOp::Read { remote_addr: BASE, rkey: b.mr.rkey }, sge(a.mr.lkey, BASE, 8)));
    assert_eq!(r, Err(VerbsError::Inval));
    // Nor ATOMIC WRITE (IBTA 1.5: RC and XRC only).
    let op = SendOp::AtomicWrite { remote_addr: BASE, rkey: b.mr.rkey };
    assert_eq!(p.a.post_send(a.qpn, SendWr::new(2, op, sge(a.mr.lkey, BASE, 8))), Err(VerbsError::Inval));
}

#[test]
fn ud_multicast_reaches_every_attached_qp_and_only_them() {
    let mut p = Pair::new(14);
    let a = ud_qp(&mut p.a, 5);
    let b1 = ud_qp(&mut p.b, 5);
    let b2 = ud_qp(&mut p.b, 5);
    let b3 = ud_qp(&mut p.b, 5);
    let group: std::net::IpAddr = "239.1.2.3".parse().unwrap();
    p.b.attach_mcast(b1.qpn, group).unwrap();
    p.b.attach_mcast(b2.qpn, group).unwrap();
    assert_eq!(
        p.b.attach_mcast(b3.qpn, "10.9.9.9".parse().unwrap()),
        Err(VerbsError::Inval),
        "not a multicast address"
    );
    for (i, q) in [&b1, &b2, &b3].iter().enumerate() {
        p.b.post_recv(q.qpn, RecvWr { wr_id: i as u64, sg_list: sge(q.lkey, BASE + 0x1000 * (i as u64 + 1), 256) })
            .unwrap();
    }
    p.fill(0, BASE, b"to all");
    let mut w = SendWr::new(1, SendOp::Send, sge(a.lkey, BASE, 6));
    w.ud = Some(UdDest { dest: group, remote_qpn: Qpn::MULTICAST.value(), remote_qkey: 5 });
    p.a.post_send(a.qpn, w).unwrap();
    p.drive(STEPS);
    let got: Vec<u64> = p.b.poll_cq(b1.cq, 16).iter().chain(p.b.poll_cq(b2.cq, 16).iter()).map(|w| w.wr_id).collect();
    assert_eq!(got, vec![0, 1]);
    assert!(p.b.poll_cq(b3.cq, 16).is_empty());
    assert_eq!(p.read(1, BASE + 0x2000 + GRH_SLOT as u64, 6), b"to all".to_vec());
    // Detached, b2 gets nothing more.
    p.b.detach_mcast(b2.qpn, group).unwrap();
    assert_eq!(p.b.detach_mcast(b2.qpn, group), Err(VerbsError::Inval));
    p.b.post_recv(b2.qpn, RecvWr { wr_id: 9, sg_list: sge(b2.lkey, BASE + 0x9000, 256) }).unwrap();
    let mut w = SendWr::new(2, SendOp::Send, sge(a.lkey, BASE, 6));
    w.ud = Some(UdDest { dest: group, remote_qpn: Qpn::MULTICAST.value(), remote_qkey: 5 });
    p.a.post_send(a.qpn, w).unwrap();
    p.drive(STEPS);
    assert!(p.b.poll_cq(b2.cq, 16).is_empty());
}

#[test]
fn ah_from_the_grh_slot_answers_the_sender() {
    let mut p = Pair::new(15);
    let a = ud_qp(&mut p.a, 5);
    let b = ud_qp(&mut p.b, 5);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 1, sg_list: sge(b.lkey, BASE + 0x1000, 256) }).unwrap();
    p.a.post_recv(a.qpn, RecvWr { wr_id: 2, sg_list: sge(a.lkey, BASE + 0x1000, 256) }).unwrap();
    ud_send(&mut p, &a, &b, ADDR_B, 5, 8, 1);
    p.drive(STEPS);
    let wc = p.b.poll_cq(b.cq, 16)[0];
    // What ibv_create_ah_from_wc does: the sender's address from the GRH slot, its QPN from the wc.
    let slot = p.read(1, BASE + 0x1000, GRH_SLOT);
    let back = softrdma_engine::device::ah_from_grh(&slot).unwrap();
    assert_eq!(back, ADDR_A);
    let mut w = SendWr::new(3, SendOp::Send, sge(b.lkey, BASE, 4));
    w.ud = Some(UdDest { dest: back, remote_qpn: wc.src_qp.value(), remote_qkey: 5 });
    p.b.post_send(b.qpn, w).unwrap();
    p.drive(STEPS);
    assert_eq!(p.a.poll_cq(a.cq, 16).iter().filter(|w| w.wr_id == 2).count(), 1, "the answer arrived");
}

#[test]
fn a_qp_that_blocks_self_multicast_loopback_does_not_hear_its_own_sends() {
    // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (what `mckey -l` sets): the device's own multicast SEND
    // coming back (its address, the QP as DETH's source QP) skips that QP but reaches the
    // device's other attached QPs.
    let mut p = Pair::new(16);
    let a = ud_qp(&mut p.a, 5);
    let a2 = ud_qp(&mut p.a, 5);
    let group: std::net::IpAddr = "239.1.2.4".parse().unwrap();
    p.a.attach_mcast(a.qpn, group).unwrap();
    p.a.attach_mcast(a2.qpn, group).unwrap();
    p.a.set_block_self_mcast_lb(a.qpn).unwrap();
    assert_eq!(p.a.set_block_self_mcast_lb(Qpn::new(0x77_7777)), Err(VerbsError::Inval));
    for (i, q) in [&a, &a2].iter().enumerate() {
        p.a.post_recv(
            q.qpn,
            RecvWr { wr_id: 10 + i as u64, sg_list: sge(q.lkey, BASE + 0x4000 * (i as u64 + 1), 256) },
        )
        .unwrap();
    }
    p.fill(0, BASE, b"loop?");
    let mut w = SendWr::new(1, SendOp::Send, sge(a.lkey, BASE, 5));
    w.ud = Some(UdDest { dest: group, remote_qpn: Qpn::MULTICAST.value(), remote_qkey: 5 });
    p.a.post_send(a.qpn, w).unwrap();
    let now = p.now;
    let mut buf = vec![0u8; 9000];
    let t = p.a.poll_transmit(now, &mut buf).expect("the multicast SEND");
    assert_eq!(t.dst, group);
    // The device's loopback hands its own packet back.
    let meta = softrdma_engine::device::RecvMeta { src: ADDR_A, src_port: t.src_port, ip_id: None, dst: Some(group) };
    p.a.handle_packet(now, meta, &buf[..t.len]);
    let got: Vec<u64> = p.a.poll_cq(a2.cq, 16).iter().filter(|w| w.wr_id >= 10).map(|w| w.wr_id).collect();
    assert_eq!(got, vec![11], "the other attached QP hears it");
    assert!(p.a.poll_cq(a.cq, 16).iter().all(|w| w.wr_id != 10), "the sender's own QP does not");
}

#[test]
fn a_multicast_datagram_reaches_only_the_attached_qps_whose_qkey_matches() {
    // IBTA 10.2.5 / rxe_rcv_mcast_pkt: a device hands a datagram for a group to each attached QP;
    // each checks the Q_Key as for unicast, a mismatch is dropped and counted (qkey_violations).
    let mut p = Pair::new(16);
    let good = ud_qp(&mut p.a, 5);
    let other = ud_qp(&mut p.a, 6);
    let sender = ud_qp(&mut p.b, 5);
    let group: std::net::IpAddr = "239.1.2.5".parse().unwrap();
    p.a.attach_mcast(good.qpn, group).unwrap();
    p.a.attach_mcast(other.qpn, group).unwrap();
    for (i, q) in [&good, &other].iter().enumerate() {
        p.a.post_recv(
            q.qpn,
            RecvWr { wr_id: 10 + i as u64, sg_list: sge(q.lkey, BASE + 0x4000 * (i as u64 + 1), 256) },
        )
        .unwrap();
    }
    p.fill(1, BASE, b"to the group");
    let mut w = SendWr::new(1, SendOp::Send, sge(sender.lkey, BASE, 12));
    w.ud = Some(UdDest { dest: group, remote_qpn: Qpn::MULTICAST.value(), remote_qkey: 5 });
    p.b.post_send(sender.qpn, w).unwrap();
    let now = p.now;
    let mut buf = vec![0u8; 9000];
    let t = p.b.poll_transmit(now, &mut buf).expect("the multicast SEND");
    assert_eq!(t.dst, group);
    let before = p.a.counters().qkey_violations;
    let meta = softrdma_engine::device::RecvMeta { src: ADDR_B, src_port: t.src_port, ip_id: None, dst: Some(group) };
    p.a.handle_packet(now, meta, &buf[..t.len]);
    let got: Vec<(u64, u32)> = p.a.poll_cq(good.cq, 16).iter().map(|w| (w.wr_id, w.byte_len)).collect();
    assert_eq!(got, vec![(10, 40 + 12)], "the QP with the group's Q_Key gets it (GRH slot + data)");
    assert!(p.a.poll_cq(other.cq, 16).iter().all(|w| w.wr_id != 11), "the other Q_Key's QP does not");
    assert_eq!(p.a.counters().qkey_violations, before + 1);
}
