//! Two devices in this process, talking real RoCEv2 over UDP on loopback (127.0.0.1 and
//! 127.0.0.2), and one device talking to itself through internal loopback: RC SEND, WRITE, READ
//! and atomics, UD, XRC and SRQ, with and without injected faults; the capture holds every packet
//! with a valid ICRC.
//!
//! Each test uses its own UDP port so tests can run in parallel (devices on the same address and
//! port would collide, as two HCAs cannot own one address).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use softrdma_device::hca::{Hca, HcaConfig};

mod common;
use common::*;
use softrdma_device::verbs::*;

/// SEND (several packets), WRITE with immediate, READ, both atomics, between `a` and `b`.
fn rc_ops(a: &mut Side, b: &mut Side, bad_rkey: bool) {
    // SEND of 10 KB (several MTU packets).
    let data = pattern(10_000, 7);
    a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
    b.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.mr.sge(0..16384)] }]).unwrap();
    a.qp.post_send(vec![SendWr::new(2, SendOp::Send, vec![a.mr.sge(0..data.len())])]).unwrap();
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status, r.opcode, r.byte_len), (1, WcStatus::Success, WcOpcode::Recv, 10_000));
    assert_eq!(&b.mr.as_slice()[..data.len()], &data[..]);
    let s = one(&a.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (2, WcStatus::Success, WcOpcode::Send));

    // WRITE with immediate into b at offset 100 000.
    let data = pattern(70_000, 3);
    a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
    b.qp.post_recv(vec![RecvWr { wr_id: 3, sg_list: vec![] }]).unwrap();
    let op = SendOp::WriteWithImm { remote_addr: b.mr.addr() + 100_000, rkey: b.mr.rkey(), imm: 0xfeed };
    a.qp.post_send(vec![SendWr::new(4, op, vec![a.mr.sge(0..data.len())])]).unwrap();
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status, r.opcode, r.imm), (3, WcStatus::Success, WcOpcode::RecvRdmaWithImm, Some(0xfeed)));
    assert_eq!(&b.mr.as_slice()[100_000..170_000], &data[..]);
    assert_eq!(one(&a.cq).status, WcStatus::Success);

    // READ it back from b into a at 500 000.
    let op = SendOp::Read { remote_addr: b.mr.addr() + 100_000, rkey: b.mr.rkey() };
    a.qp.post_send(vec![SendWr::new(5, op, vec![a.mr.sge(500_000..570_000)])]).unwrap();
    let c = one(&a.cq);
    assert_eq!((c.wr_id, c.status, c.opcode), (5, WcStatus::Success, WcOpcode::RdmaRead));
    assert_eq!(&a.mr.as_slice()[500_000..570_000], &data[..]);

    // Atomics on b's word at 8192.
    b.mr.as_mut_slice()[8192..8200].copy_from_slice(&40u64.to_ne_bytes());
    let fa = SendOp::FetchAdd { remote_addr: b.mr.addr() + 8192, rkey: b.mr.rkey(), add: 2 };
    a.qp.post_send(vec![SendWr::new(6, fa, vec![a.mr.sge(0..8)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(u64::from_ne_bytes(a.mr.as_slice()[..8].try_into().unwrap()), 40);
    let cs = SendOp::CompareSwap { remote_addr: b.mr.addr() + 8192, rkey: b.mr.rkey(), compare: 42, swap: 7 };
    a.qp.post_send(vec![SendWr::new(7, cs, vec![a.mr.sge(8..16)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(u64::from_ne_bytes(a.mr.as_slice()[8..16].try_into().unwrap()), 42);
    assert_eq!(u64::from_ne_bytes(b.mr.as_slice()[8192..8200].try_into().unwrap()), 7);

    if !bad_rkey {
        return;
    }
    // A bad rkey is a remote access error, never an access outside the MR; the responder's QP
    // goes to ERR (IBTA 9.9.3.1.3, class C error), so this ends the connection.
    let op = SendOp::Write { remote_addr: b.mr.addr(), rkey: b.mr.rkey() ^ 0x55 };
    a.qp.post_send(vec![SendWr::new(8, op, vec![a.mr.sge(0..64)])]).unwrap();
    let status = one(&a.cq).status;
    // Over a lossy wire the NAK itself may be lost; the responder's QP is in ERR and answers
    // nothing more, so the requester's retries run out instead (IBTA 9.7.6.1.3).
    let lost_nak = LOSSY.with(|l| l.get()) && status == WcStatus::RetryExcErr;
    assert!(status == WcStatus::RemAccessErr || lost_nak, "{status:?}");
}

thread_local! {
    /// The current test's wire drops packets.
    static LOSSY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[test]
fn rc_across_two_devices_over_udp() {
    let (da, db) = (device("ta", A, 47911, ""), device("tb", B, 47911, ""));
    let (mut a, mut b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu4096);
    rc_ops(&mut a, &mut b, true);
    let (_, io_a, _) = da.counters();
    let (_, io_b, _) = db.counters();
    assert!(io_a.udp_sent > 10 && io_b.udp_rcvd > 10, "{io_a:?} {io_b:?}");
    assert_eq!(io_a.loopback, 0, "two devices talk over UDP, not loopback");
}

#[test]
fn rc_within_one_device_through_loopback_with_faults() {
    let d = device("tl", A, 47912, "loss=0.03,dup=0.03,reorder=0.03,corrupt=0.01,seed=5");
    LOSSY.with(|l| l.set(true));
    let (mut a, mut b) = (side(&d, QpType::Rc), side(&d, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    for round in 0..3 {
        rc_ops(&mut a, &mut b, round == 2);
    }
    let (c, io, f) = d.counters();
    assert!(io.loopback > 100 && io.udp_sent == 0, "{io:?}");
    assert!(f.dropped > 0 && f.duplicated > 0 && f.corrupted > 0, "{f:?}");
    assert!(c.retransmitted_pkts > 0, "{c:?}");
    assert!(c.icrc_err > 0, "corrupted packets are caught by the ICRC: {c:?}");
}

#[test]
fn ud_across_devices_and_grh() {
    let (da, db) = (device("ua", A, 47913, ""), device("ub", B, 47913, ""));
    let (mut a, b) = (side(&da, QpType::Ud), side(&db, QpType::Ud));
    let o = ConnectOptions::default();
    a.qp.connect(0, &b.qp.endpoint(0), &o).unwrap();
    b.qp.connect(0, &a.qp.endpoint(0), &o).unwrap();
    let msg = pattern(1000, 9);
    a.mr.as_mut_slice()[..1000].copy_from_slice(&msg);
    b.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.mr.sge(0..2048)] }]).unwrap();
    let ah = AddressHandle { dest: B };
    let mut wr = SendWr::new(2, SendOp::Send, vec![a.mr.sge(0..1000)]);
    wr.ud = Some(ah.ud(b.qp.qpn(), o.qkey));
    a.qp.post_send(vec![wr]).unwrap();
    let r = one(&b.cq);
    assert_eq!(
        (r.status, r.byte_len, r.grh, r.src_qp.value(), r.src),
        (WcStatus::Success, 1040, true, a.qp.qpn(), Some(A))
    );
    assert_eq!(&b.mr.as_slice()[40..1040], &msg[..]);
    // The GRH slot holds the IPv4 header in bytes 20..40 (source address at 32).
    assert_eq!(&b.mr.as_slice()[32..36], &[127, 0, 0, 1]);
}

#[test]
fn xrc_fan_in_two_owners_share_a_domain_file() {
    let (ds, dr) = (device("xs", A, 47914, ""), device("xr", B, 47914, ""));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xrcd");
    let file = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).unwrap();
    // Two receiving "processes" (owners) on device xr open the same domain file.
    let r1 = Context::embedded(&dr).unwrap();
    let r2 = Context::embedded(&dr).unwrap();
    let x1 = r1.open_xrcd(Some(&file), true, false).unwrap();
    let f2 = std::fs::File::open(&path).unwrap();
    assert!(
        matches!(r2.open_xrcd(Some(&f2), true, true), Err(Error::Verbs(VerbsError::Inval))),
        "O_EXCL on an existing domain"
    );
    let x2 = r2.open_xrcd(Some(&f2), false, false).unwrap();
    let other = tempfile::NamedTempFile::new().unwrap();
    assert!(matches!(r2.open_xrcd(Some(other.as_file()), false, false), Err(Error::Verbs(VerbsError::Again))));
    let (pd1, pd2) = (r1.alloc_pd().unwrap(), r2.alloc_pd().unwrap());
    let (cq1, cq2) = (r1.create_cq(64, None).unwrap(), r2.create_cq(64, None).unwrap());
    let attr = SrqAttr { max_wr: 32, max_sge: 1, srq_limit: 0 };
    let (s1, s2) = (x1.create_srq(&pd1, &cq1, attr).unwrap(), x2.create_srq(&pd2, &cq2, attr).unwrap());
    let m1 = pd1.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let m2 = pd2.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    s1.post_recv(vec![RecvWr { wr_id: 11, sg_list: vec![m1.sge(0..4096)] }]).unwrap();
    s2.post_recv(vec![RecvWr { wr_id: 22, sg_list: vec![m2.sge(0..4096)] }]).unwrap();
    // One target QP made by owner 1; owner 2 opens it.
    let tgt = x1.create_tgt_qp().unwrap();
    let opened = x2.open_qp(tgt.qpn()).unwrap();
    assert_eq!(opened.qpn(), tgt.qpn());
    // One initiator on the sending device reaches both SRQs through the one target QP.
    let mut s = side(&ds, QpType::XrcIni);
    let o = ConnectOptions::default();
    s.qp.connect(5, &tgt.endpoint(77), &o).unwrap();
    tgt.connect(77, &s.qp.endpoint(5), &o).unwrap();
    s.mr.as_mut_slice()[..4].copy_from_slice(b"to-1");
    s.mr.as_mut_slice()[4..8].copy_from_slice(b"to-2");
    let mut w1 = SendWr::new(1, SendOp::Send, vec![s.mr.sge(0..4)]);
    w1.remote_srqn = s1.srq_num();
    let mut w2 = SendWr::new(2, SendOp::Send, vec![s.mr.sge(4..8)]);
    w2.remote_srqn = s2.srq_num();
    w2.signaled = true;
    s.qp.post_send(vec![w1, w2]).unwrap();
    let sent = s.cq.wait(2, T).unwrap();
    assert!(sent.iter().all(|w| w.status == WcStatus::Success), "{sent:?}");
    let c1 = one(&cq1);
    let c2 = one(&cq2);
    assert_eq!((c1.wr_id, c1.status, c1.byte_len), (11, WcStatus::Success, 4));
    assert_eq!((c2.wr_id, c2.status, c2.byte_len), (22, WcStatus::Success, 4));
    assert_eq!(&m1.as_slice()[..4], b"to-1");
    assert_eq!(&m2.as_slice()[..4], b"to-2");
    // An SRQ number that is not in the domain is refused (NAK), never delivered.
    let mut bad = SendWr::new(3, SendOp::Send, vec![s.mr.sge(0..4)]);
    bad.remote_srqn = 0x00ff_fff0;
    s.qp.post_send(vec![bad]).unwrap();
    assert_eq!(one(&s.cq).status, WcStatus::RemInvReqErr);
    assert!(cq1.poll(4).unwrap().is_empty() && cq2.poll(4).unwrap().is_empty());
    drop((opened, tgt));
}

#[test]
fn capture_holds_every_packet_with_a_valid_icrc() {
    let dir = tempfile::tempdir().unwrap();
    let pa = dir.path().join("a.pcap");
    let mut ca = HcaConfig::new("pa", A);
    ca.port = 47915;
    ca.pcap = Some(pa.clone());
    let da = Arc::new(Hca::start(ca).unwrap());
    let db = device("pb", B, 47915, "");
    let (mut a, mut b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu2048);
    rc_ops(&mut a, &mut b, true);
    let (c, _, _) = da.counters();
    drop((a, b));
    da.stop();
    let (report, n) = capture_report(&pa);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(n, c.sent_pkts + c.rcvd_pkts, "every sent and received packet is in the capture");
}

#[test]
fn registering_memory_the_process_does_not_have_is_efault() {
    let d = device("mf", A, 47916, "");
    let ctx = Context::embedded(&d).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    // SAFETY: the registration is refused; nothing is ever accessed.
    let r = unsafe { pd.reg_mr_raw(0x1000, 4096, Access::LOCAL_WRITE) };
    assert!(matches!(r, Err(Error::Verbs(VerbsError::Fault))), "{:?}", r.err());
    // Another owner's objects are not reachable.
    let other = Context::embedded(&d).unwrap();
    let cq = other.create_cq(4, None).unwrap();
    let pd2 = other.alloc_pd().unwrap();
    assert!(pd.qp_builder(QpType::Rc, &cq).build().is_err(), "a CQ of another client");
    drop(pd2);
}

#[test]
fn pipelined_writes_across_devices() {
    let (da, db) = (device("wa", A, 47917, ""), device("wb", B, 47917, ""));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu4096);
    let data = pattern(65536, 1);
    a.mr.as_mut_slice()[..65536].copy_from_slice(&data);
    let wrs: Vec<SendWr> = (0..16u64)
        .map(|i| {
            let op = SendOp::Write { remote_addr: b.mr.addr() + (i % 8) * 65536, rkey: b.mr.rkey() };
            SendWr::new(i, op, vec![a.mr.sge(0..65536)])
        })
        .collect();
    a.qp.post_send(wrs).unwrap();
    let done = a.cq.wait(16, T).unwrap();
    assert!(
        done.len() == 16 && done.iter().all(|w| w.status == WcStatus::Success),
        "{done:?} {:?} {:?}",
        da.stats(),
        db.stats()
    );
    assert_eq!(&b.mr.as_slice()[7 * 65536..8 * 65536], &data[..]);
}

#[test]
fn gso_batches_carry_an_icrc_for_each_segments_ipv4_id() {
    let dir = tempfile::tempdir().unwrap();
    let pa = dir.path().join("gso.pcap");
    let mut ca = HcaConfig::new("ga", A);
    ca.port = 47918;
    ca.gso = true;
    ca.pcap = Some(pa.clone());
    // The receiver checks ICRCs exactly: only the GRO position hint tells it segment k had ID k.
    ca.icrc = softrdma_engine::device::IcrcPolicy::Exact;
    let da = Arc::new(Hca::start(ca).unwrap());
    let mut cb = HcaConfig::new("gb", B);
    cb.port = 47918;
    cb.gso = true;
    cb.icrc = softrdma_engine::device::IcrcPolicy::Exact;
    let db = Arc::new(Hca::start(cb).unwrap());
    let (mut a, mut b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    rc_ops(&mut a, &mut b, false);
    let (ca, ia, _) = da.counters();
    let (cb, ib, _) = db.counters();
    assert!(ia.gso_sends > 0 && ib.gso_sends > 0, "{ia:?} {ib:?}");
    assert!(ia.gro_buffers > 0 || ib.gro_buffers > 0, "{ia:?} {ib:?}");
    assert_eq!((ca.icrc_err, cb.icrc_err, ca.icrc_id_solved, cb.icrc_id_solved), (0, 0, 0, 0));
    drop((a, b));
    da.stop();
    // The capture shows each segment with the ID it carried, and every ICRC holds for it.
    let mut report = softrdma_pcap::analyze::CheckReport::default();
    let mut ids = std::collections::BTreeSet::new();
    for r in softrdma_pcap::Reader::open(&pa).unwrap() {
        let r = r.unwrap();
        report.add(&softrdma_pcap::analyze::summarize(r.index, r.linktype, &r.data, r.is_truncated()));
        if r.data[14 + 12..14 + 16] == [127, 0, 0, 1] {
            ids.insert(u16::from_be_bytes([r.data[18], r.data[19]]));
        }
    }
    assert!(report.is_clean(), "{report:?}");
    assert!(ids.len() > 2, "segments numbered 0, 1, 2, ...: {ids:?}");
}

#[test]
fn posting_checks_give_the_errno_libibverbs_gives() {
    let d = device("pe", A, 47919, "");
    let ctx = Context::embedded(&d).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
    let qp = pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let post_err = |r: Result<()>| match r {
        Err(Error::Post { err, index }) => (err, index),
        other => panic!("{other:?}"),
    };
    // post_recv in RESET is EINVAL; post_send before RTS is EINVAL.
    assert_eq!(post_err(qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![mr.sge(0..8)] }])), (VerbsError::Inval, 0));
    assert_eq!(post_err(qp.post_send(vec![SendWr::new(1, SendOp::Send, vec![mr.sge(0..8)])])), (VerbsError::Inval, 0));
    let peer = pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
    let o = ConnectOptions::default();
    qp.connect(1, &peer.endpoint(2), &o).unwrap();
    peer.connect(2, &qp.endpoint(1), &o).unwrap();
    // Too many SGEs: EINVAL at the index of the bad request; the ones before it were posted.
    let ok = RecvWr { wr_id: 2, sg_list: vec![mr.sge(0..8)] };
    let bad = RecvWr { wr_id: 3, sg_list: vec![mr.sge(0..8), mr.sge(8..16)] };
    assert_eq!(post_err(qp.post_recv(vec![ok, bad])), (VerbsError::Inval, 1));
    // A full queue is ENOMEM (the ring holds max_recv_wr; the device may already have taken
    // some into the engine, whose queue holds as many again).
    let many: Vec<RecvWr> = (0..64).map(|i| RecvWr { wr_id: 10 + i, sg_list: vec![mr.sge(0..8)] }).collect();
    let (err, index) = post_err(qp.post_recv(many));
    assert_eq!(err, VerbsError::NoMem);
    assert!((3..=8).contains(&index), "{index}");
    // UC-only and UD-only rules: an atomic needs 8 bytes.
    let fa = SendOp::FetchAdd { remote_addr: 0, rkey: 0, add: 1 };
    assert_eq!(post_err(qp.post_send(vec![SendWr::new(4, fa, vec![mr.sge(0..4)])])), (VerbsError::Inval, 0));
    // Inline data is copied at post: the buffer may change right after, the peer sees the old.
    peer.post_recv(vec![RecvWr { wr_id: 99, sg_list: vec![mr.sge(0..64)] }]).unwrap();
    let mut data = b"inline!!".to_vec();
    let mut wr = SendWr::new(5, SendOp::Send, vec![Sge { addr: data.as_ptr() as u64, length: 8, lkey: 0 }]);
    wr.inline = true;
    qp.post_send(vec![wr]).unwrap();
    data.copy_from_slice(b"changed!");
    let got = cq.wait(2, T).unwrap();
    assert!(got.iter().any(|w| w.wr_id == 99 && w.opcode == WcOpcode::Recv && w.byte_len == 8), "{got:?}");
    assert_eq!(&mr.as_slice()[..8], b"inline!!");
    // Too much inline data is EINVAL.
    let big = [0u8; 65];
    let mut wr = SendWr::new(6, SendOp::Send, vec![Sge { addr: big.as_ptr() as u64, length: 65, lkey: 0 }]);
    wr.inline = true;
    assert_eq!(post_err(qp.post_send(vec![wr])), (VerbsError::Inval, 0));
    std::hint::black_box(&data);
}

/// `ibv_post_send` is ENOMEM once max_send_wr requests are outstanding, counting those still in
/// the send queue's ring and those the device already took into its engine together (before,
/// the ring and the engine's queue each held max_send_wr: twice as many were accepted). The peer
/// never answers (it stays in RESET, whose packets a responder drops); the flushed requests free
/// their slots once their completions are written.
#[test]
fn the_send_queue_holds_max_send_wr_across_ring_and_device() {
    let (da, db) = (device("sqa", A, 47935, ""), device("sqb", B, 47935, ""));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qa = a._pd.qp_builder(QpType::Rc, &a.cq).caps(caps).build().unwrap();
    let qb = b._pd.qp_builder(QpType::Rc, &b.cq).caps(caps).build().unwrap();
    let o = ConnectOptions { timeout: 20, retry_cnt: 1, ..ConnectOptions::default() };
    qa.connect(1, &qb.endpoint(2), &o).unwrap();
    let send = |id: u64| SendWr::new(id, SendOp::Send, vec![a.mr.sge(0..64)]);
    qa.post_send(vec![send(1), send(2)]).unwrap();
    // Let the device take them into its engine (its queue is where they wait for the ACK).
    std::thread::sleep(Duration::from_millis(100));
    match qa.post_send(vec![send(3), send(4), send(5), send(6)]) {
        Err(Error::Post { err: VerbsError::NoMem, index: 2 }) => {}
        r => panic!("two requests past max_send_wr 4: {r:?}"),
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(matches!(qa.post_send(vec![send(7)]), Err(Error::Post { err: VerbsError::NoMem, index: 0 })));
    // ERR flushes the four; once their completions are in, four slots are free again.
    qa.modify(&QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    let got: Vec<(u64, WcStatus)> = a.cq.wait(4, T).unwrap().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got.iter().map(|w| w.0).collect::<Vec<_>>(), vec![1, 2, 3, 4], "{got:?}");
    assert!(got.iter().all(|w| w.1 == WcStatus::WrFlushErr), "{got:?}");
    // In ERR a post completes flushed (as in rxe); four fit, the fifth does not until polled.
    match qa.post_send(vec![send(8), send(9), send(10), send(11), send(12)]) {
        Ok(()) | Err(Error::Post { err: VerbsError::NoMem, index: 4 }) => {}
        r => panic!("{r:?}"),
    }
    let more = a.cq.wait(4, T).unwrap();
    assert_eq!(more.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![8, 9, 10, 11], "{more:?}");
}

#[test]
fn completion_channel_events_and_solicited_only() {
    let d = device("ce", A, 47920, "");
    let ctx = Context::embedded(&d).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let rcq = ctx.create_cq(64, Some(&ch)).unwrap();
    let scq = ctx.create_cq(64, None).unwrap();
    assert!(scq.req_notify(false).is_err(), "a CQ without a channel cannot be armed");
    let a = pd.qp_builder(QpType::Rc, &scq).build().unwrap();
    let b = pd.qp_builder(QpType::Rc, &scq).recv_cq(&rcq).build().unwrap();
    let o = ConnectOptions::default();
    a.connect(1, &b.endpoint(2), &o).unwrap();
    b.connect(2, &a.endpoint(1), &o).unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let recv = |id| RecvWr { wr_id: id, sg_list: vec![mr.sge(0..64)] };
    b.post_recv(vec![recv(1), recv(2), recv(3)]).unwrap();
    let short = Duration::from_millis(300);
    // Solicited-only: an ordinary SEND completes without an event...
    rcq.req_notify(true).unwrap();
    a.post_send(vec![SendWr::new(10, SendOp::Send, vec![mr.sge(100..108)])]).unwrap();
    assert_eq!(rcq.wait(1, T).unwrap().len(), 1);
    assert_eq!(ch.get_cq_event(Some(short)).unwrap(), None);
    // ...a solicited one fires it.
    let mut w = SendWr::new(11, SendOp::Send, vec![mr.sge(100..108)]);
    w.solicited = true;
    a.post_send(vec![w]).unwrap();
    assert_eq!(ch.get_cq_event(Some(T)).unwrap(), Some(rcq.id()));
    assert_eq!(rcq.wait(1, T).unwrap().len(), 1);
    // Armed for any completion: the next one fires, once.
    rcq.req_notify(false).unwrap();
    a.post_send(vec![SendWr::new(12, SendOp::Send, vec![mr.sge(100..108)])]).unwrap();
    assert_eq!(ch.get_cq_event(Some(T)).unwrap(), Some(rcq.id()));
    assert_eq!(rcq.wait(1, T).unwrap().len(), 1);
    assert_eq!(ch.get_cq_event(Some(short)).unwrap(), None, "one event per arming");
    assert_eq!(scq.wait(3, T).unwrap().len(), 3);
}

/// UCX's ud_verbs arms its receive CQ solicited-only and sleeps on the channel; a UD datagram
/// sent with IBV_SEND_SOLICITED must wake it (IBTA 11.4.2.2 applies to every service type).
#[test]
fn a_solicited_datagram_fires_a_solicited_only_ud_cq() {
    let d = device("cu", A, 47922, "");
    let ctx = Context::embedded(&d).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let rcq = ctx.create_cq(64, Some(&ch)).unwrap();
    let scq = ctx.create_cq(64, None).unwrap();
    let a = pd.qp_builder(QpType::Ud, &scq).build().unwrap();
    let b = pd.qp_builder(QpType::Ud, &scq).recv_cq(&rcq).build().unwrap();
    let o = ConnectOptions::default();
    a.connect(0, &b.endpoint(0), &o).unwrap();
    b.connect(0, &a.endpoint(0), &o).unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let recv = |id| RecvWr { wr_id: id, sg_list: vec![mr.sge(0..1024)] };
    b.post_recv(vec![recv(1), recv(2)]).unwrap();
    let send = |id, solicited| {
        let mut w = SendWr::new(id, SendOp::Send, vec![mr.sge(2000..2008)]);
        w.ud = Some(AddressHandle { dest: A }.ud(b.qpn(), o.qkey));
        w.solicited = solicited;
        w
    };
    rcq.req_notify(true).unwrap();
    a.post_send(vec![send(10, false)]).unwrap();
    assert_eq!(rcq.wait(1, T).unwrap().len(), 1);
    assert_eq!(ch.get_cq_event(Some(Duration::from_millis(300))).unwrap(), None, "not solicited");
    a.post_send(vec![send(11, true)]).unwrap();
    assert_eq!(ch.get_cq_event(Some(T)).unwrap(), Some(rcq.id()), "a solicited datagram wakes the channel");
    let w = rcq.wait(1, T).unwrap();
    assert_eq!((w.len(), w[0].wr_id, w[0].grh), (1, 2, true));
    // With no event left, the channel's fd is not readable once a non-blocking get has found
    // the queue empty (programs that poll the fd would otherwise spin on it).
    assert_eq!(ch.get_cq_event(Some(Duration::ZERO)).unwrap(), None);
    assert!(!fd_readable(&ch), "an empty channel's fd stays quiet");
    // An event makes it readable again, and it stays so until the event is taken.
    b.post_recv(vec![recv(3)]).unwrap();
    rcq.req_notify(false).unwrap();
    a.post_send(vec![send(12, false)]).unwrap();
    assert_eq!(rcq.wait(1, T).unwrap().len(), 1);
    let until = std::time::Instant::now() + T;
    while !fd_readable(&ch) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(fd_readable(&ch), "a waiting event makes the fd readable");
    assert_eq!(ch.get_cq_event(Some(Duration::ZERO)).unwrap(), Some(rcq.id()));
    assert_eq!(ch.get_cq_event(Some(Duration::ZERO)).unwrap(), None);
    assert!(!fd_readable(&ch));
}

fn fd_readable(fd: &impl std::os::fd::AsFd) -> bool {
    let mut p = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
    nix::poll::poll(&mut p, nix::poll::PollTimeout::ZERO).unwrap() > 0
}

#[test]
fn ipv6_device_runs_rc_and_ud() {
    let six: IpAddr = "::1".parse().unwrap();
    let d = device("v6", six, 47921, "");
    assert_eq!(d.info().addr, six);
    let (mut a, mut b) = (side(&d, QpType::Rc), side(&d, QpType::Rc));
    connect(&a, &b, Mtu::Mtu4096);
    rc_ops(&mut a, &mut b, true);
    let (c, _, _) = d.counters();
    assert_eq!((c.icrc_err, c.icrc_id_solved), (0, 0), "IPv6 ICRCs are exact");
    // UD over IPv6: the GRH slot holds the IPv6 header (source address in bytes 8..24).
    let (mut u, v) = (side(&d, QpType::Ud), side(&d, QpType::Ud));
    let o = ConnectOptions::default();
    u.qp.connect(0, &v.qp.endpoint(0), &o).unwrap();
    v.qp.connect(0, &u.qp.endpoint(0), &o).unwrap();
    u.mr.as_mut_slice()[..4].copy_from_slice(b"six!");
    v.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![v.mr.sge(0..1024)] }]).unwrap();
    let mut wr = SendWr::new(2, SendOp::Send, vec![u.mr.sge(0..4)]);
    wr.ud = Some(AddressHandle { dest: six }.ud(v.qp.qpn(), o.qkey));
    u.qp.post_send(vec![wr]).unwrap();
    let r = one(&v.cq);
    assert_eq!((r.status, r.byte_len, r.grh, r.src), (WcStatus::Success, 44, true, Some(six)));
    assert_eq!(&v.mr.as_slice()[40..44], b"six!");
    assert_eq!(v.mr.as_slice()[0] >> 4, 6, "an IPv6 header in the GRH slot");
    assert_eq!(&v.mr.as_slice()[8..24], &"::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
}

#[test]
fn sends_are_gathered_at_post_and_scattered_at_poll_without_reaching_into_the_client() {
    let (da, db) = (device("ga2", A, 47922, ""), device("gb2", B, 47922, ""));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    let n = 50;
    for i in 0..n {
        a.mr.as_mut_slice()[i * 512..(i + 1) * 512].copy_from_slice(&pattern(512, i as u8));
    }
    b.qp.post_recv(
        (0..n).map(|i| RecvWr { wr_id: i as u64, sg_list: vec![b.mr.sge(i * 512..(i + 1) * 512)] }).collect(),
    )
    .unwrap();
    let wrs = (0..n).map(|i| SendWr::new(i as u64, SendOp::Send, vec![a.mr.sge(i * 512..(i + 1) * 512)])).collect();
    a.qp.post_send(wrs).unwrap();
    assert_eq!(b.cq.wait(n, T).unwrap().len(), n);
    assert_eq!(a.cq.wait(n, T).unwrap().len(), n);
    for i in 0..n {
        assert_eq!(&b.mr.as_slice()[i * 512..(i + 1) * 512], &pattern(512, i as u8)[..]);
    }
    let (_, io, _) = da.counters();
    assert_eq!(io.memory_reads, 0, "the sender's device never read the client: {io:?}");
    // ...and the receiver's device never wrote it: the data waited in the staging area and the
    // client scattered it into its buffers when it polled (docs/architecture.md D3).
    let (_, io, _) = db.counters();
    assert_eq!(io.memory_writes, 0, "the receiver's device never wrote the client: {io:?}");
    // A larger message, or one whose lkey this process does not know, is read by the device.
    a.qp.post_send(vec![SendWr::new(99, SendOp::Send, vec![a.mr.sge(0..4096)])]).unwrap();
    b.qp.post_recv(vec![RecvWr { wr_id: 99, sg_list: vec![b.mr.sge(0..4096)] }]).unwrap();
    assert_eq!(b.cq.wait(1, T).unwrap()[0].byte_len, 4096);
    let io = da.counters().1;
    assert!(io.memory_reads + io.memory_guarded > 0, "{io:?}");
}

#[test]
fn receives_posted_before_the_peer_sends_are_there_for_its_datagrams() {
    // UD has no RNR retry: a datagram that finds no receive WQE is gone. Receives posted on the
    // ring before the peer posted its sends must be in the engine before the datagrams are.
    let (da, db) = (device("ua2", A, 47923, ""), device("ub2", B, 47923, ""));
    for round in 0..3 {
        let (a, b) = (side(&da, QpType::Ud), side(&db, QpType::Ud));
        let o = ConnectOptions::default();
        a.qp.connect(0, &b.qp.endpoint(0), &o).unwrap();
        b.qp.connect(0, &a.qp.endpoint(0), &o).unwrap();
        let n = 60;
        b.qp.post_recv(
            (0..n).map(|i| RecvWr { wr_id: i as u64, sg_list: vec![b.mr.sge(i * 128..(i + 1) * 128)] }).collect(),
        )
        .unwrap();
        let dest = AddressHandle { dest: B }.ud(b.qp.qpn(), o.qkey);
        for i in 0..n {
            let mut w = SendWr::new(i as u64, SendOp::Send, vec![a.mr.sge(0..64)]);
            w.ud = Some(dest);
            a.qp.post_send(vec![w]).unwrap();
        }
        assert_eq!(a.cq.wait(n, T).unwrap().len(), n);
        let got = b.cq.wait(n, Duration::from_secs(5)).unwrap();
        assert_eq!(got.len(), n, "round {round}: {} of {n} datagrams found a receive", got.len());
    }
}

#[test]
fn memory_window_type_2_bound_and_used_remotely() {
    let d = device("mw", A, 47924, "");
    let (a, b) = (side(&d, QpType::Rc), side(&d, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    // b's window over 64 bytes of its region, bound through b's QP, used by a.
    // A window needs a region registered with IBV_ACCESS_MW_BIND (IBTA 10.6.7.2.1).
    let region = b._pd.alloc_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND).unwrap();
    let mw = b._pd.alloc_mw(2).unwrap();
    let new_rkey = MemoryWindow::inc_rkey(mw.rkey());
    let bind = SendOp::BindMw {
        mw_rkey: mw.rkey(),
        new_rkey,
        mr_lkey: region.lkey(),
        addr: region.addr() + 4096,
        length: 64,
        access: Access::REMOTE_WRITE,
    };
    b.qp.post_send(vec![SendWr::new(1, bind, vec![])]).unwrap();
    assert_eq!(one(&b.cq).status, WcStatus::Success);
    let mut a = a;
    a.mr.as_mut_slice()[..8].copy_from_slice(b"windowed");
    let w = SendOp::Write { remote_addr: region.addr() + 4096, rkey: new_rkey };
    a.qp.post_send(vec![SendWr::new(2, w, vec![a.mr.sge(0..8)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(&region.as_slice()[4096..4104], b"windowed");
    // Outside the window: remote access error.
    let w = SendOp::Write { remote_addr: region.addr() + 4096 + 60, rkey: new_rkey };
    a.qp.post_send(vec![SendWr::new(3, w, vec![a.mr.sge(0..8)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr);
}

#[test]
fn staged_receives_keep_the_error_semantics() {
    let d = device("se", A, 47925, "");
    let (a, b) = (side(&d, QpType::Rc), side(&d, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    // Too small a buffer: the staged receive is as long as the posted SGEs, so the message
    // does not fit and completes with IBV_WC_LOC_LEN_ERR.
    b.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.mr.sge(0..8)] }]).unwrap();
    a.qp.post_send(vec![SendWr::new(2, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status), (1, WcStatus::LocLenErr));
    // A receive SGE with an lkey this process never registered is not staged: the engine sees it
    // and reports a local protection error, as an HCA would.
    let (a, b) = (side(&d, QpType::Rc), side(&d, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    let bad = Sge { addr: b.mr.addr(), length: 64, lkey: b.mr.lkey() ^ 0x100 };
    b.qp.post_recv(vec![RecvWr { wr_id: 3, sg_list: vec![bad] }]).unwrap();
    a.qp.post_send(vec![SendWr::new(4, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status), (3, WcStatus::LocProtErr));
}

#[test]
fn a_client_the_kernel_guards_is_served_through_its_memory_helper() {
    // Where the kernel refuses process_vm_readv/writev on a client, the device reaches the
    // client's memory through a helper thread of the client (docs/architecture.md D3's fallback).
    let (da, db) = (device("ha", A, 47926, ""), device("hb", B, 47926, ""));
    let side_h = |hca: &Arc<Hca>, t: QpType| {
        let ctx = Context::embedded_with_memory_helper(hca).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qp = pd.qp_builder(t, &cq).build().unwrap();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let mr = pd.alloc_mr(1 << 17, access).unwrap();
        Side { _ctx: ctx, _pd: pd, cq, qp, mr }
    };
    let (mut a, mut b) = (side_h(&da, QpType::Rc), side_h(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu4096);
    // WRITE and READ of 8 KiB (larger than what is gathered or staged: the helper moves them),
    // an atomic, and a SEND of 100 KiB (not staged: over 64 KiB).
    let data = pattern(8192, 5);
    a.mr.as_mut_slice()[..8192].copy_from_slice(&data);
    let w = SendOp::Write { remote_addr: b.mr.addr() + 16384, rkey: b.mr.rkey() };
    a.qp.post_send(vec![SendWr::new(1, w, vec![a.mr.sge(0..8192)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(&b.mr.as_slice()[16384..24576], &data[..]);
    let r = SendOp::Read { remote_addr: b.mr.addr() + 16384, rkey: b.mr.rkey() };
    a.qp.post_send(vec![SendWr::new(2, r, vec![a.mr.sge(32768..40960)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(&a.mr.as_slice()[32768..40960], &data[..]);
    let fa = SendOp::FetchAdd { remote_addr: b.mr.addr(), rkey: b.mr.rkey(), add: 3 };
    a.qp.post_send(vec![SendWr::new(3, fa, vec![a.mr.sge(0..8)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(u64::from_ne_bytes(b.mr.as_slice()[..8].try_into().unwrap()), 3);
    let big = pattern(100_000, 9);
    a.mr.as_mut_slice()[..100_000].copy_from_slice(&big);
    b.qp.post_recv(vec![RecvWr { wr_id: 4, sg_list: vec![b.mr.sge(0..100_000)] }]).unwrap();
    a.qp.post_send(vec![SendWr::new(5, SendOp::Send, vec![a.mr.sge(0..100_000)])]).unwrap();
    assert_eq!(one(&b.cq).byte_len, 100_000);
    assert_eq!(&b.mr.as_slice()[..100_000], &big[..]);
    assert_eq!(one(&a.cq).wr_id, 5);
    b.mr.as_mut_slice()[..8].copy_from_slice(&3u64.to_ne_bytes());
    // 20 FETCH_ADDs in one post (the helper answers later: the ATOMIC ACKs wait for it, in
    // order), each executed exactly once; then a CMP_SWAP that matches and one that does not.
    let adds: Vec<SendWr> = (0..20u64)
        .map(|i| {
            let fa = SendOp::FetchAdd { remote_addr: b.mr.addr(), rkey: b.mr.rkey(), add: 1 };
            SendWr::new(10 + i, fa, vec![a.mr.sge(65536 + 8 * i as usize..65544 + 8 * i as usize)])
        })
        .collect();
    a.qp.post_send(adds).unwrap();
    for i in 0..20u64 {
        let c = one(&a.cq);
        assert_eq!((c.wr_id, c.status), (10 + i, WcStatus::Success));
        let at = 65536 + 8 * i as usize;
        assert_eq!(u64::from_ne_bytes(a.mr.as_slice()[at..at + 8].try_into().unwrap()), 3 + i, "FETCH_ADD {i}");
    }
    assert_eq!(u64::from_ne_bytes(b.mr.as_slice()[..8].try_into().unwrap()), 23);
    for (id, compare, want_after) in [(40, 23, 99), (41, 23, 99)] {
        let cs = SendOp::CompareSwap { remote_addr: b.mr.addr(), rkey: b.mr.rkey(), compare, swap: 99 };
        a.qp.post_send(vec![SendWr::new(id, cs, vec![a.mr.sge(0..8)])]).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
        assert_eq!(u64::from_ne_bytes(b.mr.as_slice()[..8].try_into().unwrap()), want_after);
    }
    assert_eq!(u64::from_ne_bytes(a.mr.as_slice()[..8].try_into().unwrap()), 99, "the second CMP_SWAP saw 99");
    // A READ of 120 KiB: answered from the helper's memory in read-ahead pieces.
    let big = pattern(120 << 10, 3);
    b.mr.as_mut_slice()[..big.len()].copy_from_slice(&big);
    let r = SendOp::Read { remote_addr: b.mr.addr(), rkey: b.mr.rkey() };
    a.qp.post_send(vec![SendWr::new(50, r, vec![a.mr.sge(0..big.len())])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(&a.mr.as_slice()[..big.len()], &big[..]);
    let (sa, sb) = (da.stats().1, db.stats().1);
    assert!(sa.memory_reads > 0 && sb.memory_writes > 0, "{sa:?} {sb:?}");
    assert_eq!(
        (sa.memory_helper_ops, sb.memory_helper_ops),
        (sa.memory_reads + sa.memory_writes, sb.memory_reads + sb.memory_writes),
        "every access went through the helpers"
    );
    assert_eq!((sa.memory_faults, sb.memory_faults), (0, 0));
}

#[test]
fn a_silent_memory_helper_stalls_only_its_own_client() {
    // A client whose memory helper stops answering (stopped, wedged) must not stall the device
    // for anyone else: the device thread never waits for a helper (its requests go through a
    // thread of their own; the QP that needs the data waits). Once the helper is overdue, the
    // client's work fails with an error instead.
    let (da, db) = (device("sa", A, 47931, ""), device("sb", B, 47931, ""));
    let overdue = Duration::from_secs(4);
    let (ctx, _silent) = Context::embedded_with_helper_socket(&da, overdue).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq).build().unwrap();
    let mr = pd.alloc_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
    let s = Side { _ctx: ctx, _pd: pd, cq, qp, mr };
    let peer = side(&db, QpType::Rc);
    connect(&s, &peer, Mtu::Mtu1024);
    peer.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![peer.mr.sge(0..8192)] }]).unwrap();
    // 8 KiB: more than what is gathered at post, so the device reads it through the helper.
    s.qp.post_send(vec![SendWr::new(2, SendOp::Send, vec![s.mr.sge(0..8192)])]).unwrap();
    let asked = std::time::Instant::now();
    while da.stats().1.memory_helper_ops == 0 {
        assert!(asked.elapsed() < T, "the device never asked the helper");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Meanwhile two other clients of the same devices: 200 round trips and a 1 MiB WRITE.
    let (mut x, y) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&x, &y, Mtu::Mtu1024);
    let start = std::time::Instant::now();
    for i in 0..200u64 {
        y.qp.post_recv(vec![RecvWr { wr_id: i, sg_list: vec![y.mr.sge(0..64)] }]).unwrap();
        x.qp.post_send(vec![SendWr::new(i, SendOp::Send, vec![x.mr.sge(0..64)])]).unwrap();
        assert_eq!(one(&y.cq).status, WcStatus::Success);
        assert_eq!(one(&x.cq).status, WcStatus::Success);
    }
    let data = pattern(1 << 20, 11);
    x.mr.as_mut_slice().copy_from_slice(&data);
    let w = SendOp::Write { remote_addr: y.mr.addr(), rkey: y.mr.rkey() };
    x.qp.post_send(vec![SendWr::new(999, w, vec![x.mr.sge(0..1 << 20)])]).unwrap();
    assert_eq!(one(&x.cq).status, WcStatus::Success);
    assert_eq!(y.mr.as_slice(), &data[..]);
    let others = start.elapsed();
    // All of that happened while the silent client's send still waited for its data: a device
    // thread that waited for the helper would have served nobody until the helper was overdue,
    // and by then the send would have failed.
    assert!(s.cq.poll(4).unwrap().is_empty(), "the silent client's send ended before the others' traffic");
    assert!(asked.elapsed() < overdue, "the others took {others:?}: longer than the helper's time limit");
    eprintln!("others' traffic while a helper was silent: {others:?}");
    // Once overdue, the helper is gone and the send fails (its data cannot be read).
    let c = s.cq.wait(1, overdue + T).unwrap();
    assert_eq!(c.len(), 1, "the silent client's send never ended");
    assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::LocProtErr));
    assert_eq!(peer.cq.poll(4).unwrap().len(), 0, "nothing arrived from the silent client");
}

#[test]
fn threads_post_to_one_qp_and_poll_one_cq_together() {
    // libibverbs' calls are thread-safe: two threads posting to the same send queue must not
    // corrupt it (the rings are single-producer; the client takes turns), and two threads may
    // poll one CQ.
    let (da, db) = (device("ta", A, 47927, ""), device("tb", B, 47927, ""));
    let per = 2000usize;
    // Larger than what is gathered at post: the posts then meet at the ring, nowhere earlier.
    const M: usize = 1024;
    let endpoint = |hca: &Arc<Hca>| {
        let ctx = Context::embedded(hca).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4 * per as u32, None).unwrap();
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 2 * per as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
        let mr = pd.alloc_mr(2 * per * M, Access::LOCAL_WRITE).unwrap();
        (ctx, pd, cq, qp, mr)
    };
    let (_ca, _pa, acq, aqp, amr) = endpoint(&da);
    let (_cb, _pb, bcq, bqp, bmr) = endpoint(&db);
    let o = ConnectOptions { mtu: Mtu::Mtu1024, ..ConnectOptions::default() };
    aqp.connect(100, &bqp.endpoint(900), &o).unwrap();
    bqp.connect(900, &aqp.endpoint(100), &o).unwrap();
    bqp.post_recv(
        (0..2 * per).map(|i| RecvWr { wr_id: i as u64, sg_list: vec![bmr.sge(i * M..(i + 1) * M)] }).collect(),
    )
    .unwrap();
    let got = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (qp, mr) = (&aqp, &amr);
            s.spawn(move || {
                for i in 0..per {
                    // Each message carries its own number, in its own M bytes of the region.
                    let tag = (t * per + i) as u64;
                    let at = tag as usize * M;
                    // SAFETY: these bytes belong to this message alone, written before it is
                    // posted and never touched again.
                    unsafe {
                        std::ptr::copy_nonoverlapping(tag.to_le_bytes().as_ptr(), (mr.addr() as *mut u8).add(at), 8)
                    };
                    let wr = SendWr::new(tag, SendOp::Send, vec![mr.sge(at..at + M)]);
                    loop {
                        match qp.post_send(vec![wr.clone()]) {
                            Ok(()) => break,
                            Err(softrdma_device::verbs::Error::Post { err: VerbsError::NoMem, .. }) => {
                                std::thread::yield_now()
                            }
                            Err(e) => panic!("post_send: {e}"),
                        }
                    }
                }
            });
        }
        for _ in 0..2 {
            s.spawn(|| {
                let t0 = std::time::Instant::now();
                while got.load(std::sync::atomic::Ordering::SeqCst) < 2 * per {
                    let w = acq.poll(4).unwrap();
                    for c in &w {
                        assert_eq!(c.status, WcStatus::Success, "{c:?}");
                    }
                    got.fetch_add(w.len(), std::sync::atomic::Ordering::SeqCst);
                    assert!(t0.elapsed() < T, "send completions missing");
                    std::thread::yield_now();
                }
            });
        }
    });
    let w = bcq.wait(2 * per, T).unwrap();
    assert_eq!(w.len(), 2 * per, "every message of both threads arrives");
    let mut seen = std::collections::HashSet::new();
    for c in &w {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        let at = c.wr_id as usize * M;
        let tag = u64::from_le_bytes(bmr.as_slice()[at..at + 8].try_into().unwrap());
        assert!(seen.insert(tag), "message {tag} arrived twice");
    }
    assert_eq!(seen.len(), 2 * per);
}

#[test]
fn gso_sends_keep_injected_corruption_detectable() {
    // The fault injector flips a bit after the ICRC is made right for the IPv4 ID each GSO
    // segment carries: a corrupted segment must fail the receiver's ICRC check (and be resent),
    // never arrive with an ICRC recomputed over the corrupted bytes.
    let config = |name: &str, addr, seed| {
        let mut c = HcaConfig::new(name, addr);
        c.port = 47928;
        c.gso = true;
        c.icrc = softrdma_engine::device::IcrcPolicy::Exact;
        c.faults = format!("corrupt=0.05,seed={seed}").parse().unwrap();
        c.seed = Some(seed);
        Arc::new(Hca::start(c).unwrap())
    };
    let (da, db) = (config("gca", A, 11), config("gcb", B, 12));
    LOSSY.with(|l| l.set(true));
    let (mut a, mut b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    for _ in 0..3 {
        rc_ops(&mut a, &mut b, false);
    }
    let (ca, ia, fa) = da.counters();
    let (cb, ib, fb) = db.counters();
    assert!(ia.gso_sends > 0, "{ia:?}");
    assert!(fa.corrupted + fb.corrupted > 0, "{fa:?} {fb:?}");
    assert!(ca.icrc_err + cb.icrc_err > 0, "corrupted segments fail the ICRC: {ca:?} {cb:?} {ib:?}");
    assert!(ca.retransmitted_pkts + cb.retransmitted_pkts > 0, "{ca:?} {cb:?}");
}

#[test]
fn captured_internal_loopback_packets_carry_a_valid_icrc() {
    // Loopback packets skip the ICRC only when nobody can see them: with a capture they have it.
    let dir = tempfile::tempdir().unwrap();
    let pa = dir.path().join("lo.pcap");
    let mut c = HcaConfig::new("lo", A);
    c.port = 47929;
    c.pcap = Some(pa.clone());
    c.icrc = softrdma_engine::device::IcrcPolicy::Exact;
    let d = Arc::new(Hca::start(c).unwrap());
    let (mut a, mut b) = (side(&d, QpType::Rc), side(&d, QpType::Rc));
    connect(&a, &b, Mtu::Mtu4096);
    rc_ops(&mut a, &mut b, false);
    let (counters, io, _) = d.counters();
    assert!(io.loopback > 10 && counters.icrc_err == 0, "{io:?} {counters:?}");
    drop((a, b));
    d.stop();
    let (report, _) = capture_report(&pa);
    assert!(report.is_clean() && io.loopback > 0, "{report:?}");
}

/// `ack_loss` tells acknowledgements from everything else on the transmit path: a responder
/// whose every packet but its ACKs is lost still completes SENDs (only ACKs answer them), while
/// its READ responses never arrive and the requester's retries run out (IBTA 9.7.6.1.3).
#[test]
fn ack_loss_spares_acks_and_only_acks() {
    let (da, db) = (device("aa", A, 47930, ""), device("ab", B, 47930, "loss=1,ack_loss=0"));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    // 16.8 ms per try: long enough for an ACK on a loaded machine, short for a test.
    let o = ConnectOptions { timeout: 12, retry_cnt: 2, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();

    let data = pattern(3000, 9);
    a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
    b.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.mr.sge(0..4096)] }]).unwrap();
    a.qp.post_send(vec![SendWr::new(2, SendOp::Send, vec![a.mr.sge(0..data.len())])]).unwrap();
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (1, WcStatus::Success, 3000));
    let s = one(&a.cq);
    assert_eq!((s.wr_id, s.status), (2, WcStatus::Success), "the responder's ACK was dropped");
    let (_, _, faults_b) = db.counters();
    assert_eq!(faults_b.dropped, 0, "an ACK counted as dropped: {faults_b:?}");

    let op = SendOp::Read { remote_addr: b.mr.addr(), rkey: b.mr.rkey() };
    a.qp.post_send(vec![SendWr::new(3, op, vec![a.mr.sge(8192..9192)])]).unwrap();
    let c = one(&a.cq);
    assert_eq!((c.wr_id, c.status), (3, WcStatus::RetryExcErr), "a READ response got through");
    let (_, _, faults_b) = db.counters();
    // A resent READ supersedes a response still queued, so there may be fewer than three.
    assert!(faults_b.dropped >= 1, "no READ response was dropped: {faults_b:?}");
}

/// ibv_resize_cq(3) fails with EINVAL when the CQ holds more completions than the new size; the
/// completions of sends posted just before the call count, as they would on hardware, however
/// recently the device looked at the send ring.
#[test]
fn resize_counts_the_completions_of_work_posted_before_it() {
    let (da, db) = (device("za", A, 47925, ""), device("zb", B, 47925, ""));
    let (a, b) = (side(&da, QpType::Ud), side(&db, QpType::Ud));
    let o = ConnectOptions::default();
    a.qp.connect(0, &b.qp.endpoint(0), &o).unwrap();
    b.qp.connect(0, &a.qp.endpoint(0), &o).unwrap();
    let ah = AddressHandle { dest: B };
    for round in 0..20u64 {
        let wrs = (0..6)
            .map(|i| {
                let mut wr = SendWr::new(round * 8 + i, SendOp::Send, vec![a.mr.sge(0..64)]);
                wr.ud = Some(ah.ud(b.qp.qpn(), o.qkey));
                wr
            })
            .collect();
        a.qp.post_send(wrs).unwrap();
        let r = a.cq.resize(1);
        assert!(
            matches!(r, Err(Error::Verbs(VerbsError::Inval))),
            "round {round}: resize to 1 with 6 sends posted gave {r:?}"
        );
        let done = a.cq.wait(6, T).unwrap();
        assert_eq!(done.len(), 6, "round {round}");
        assert!(done.iter().all(|w| w.status == WcStatus::Success));
        // Empty again: any size goes.
        a.cq.resize(if round % 2 == 0 { 7 } else { 256 }).unwrap();
    }
}

/// A device that stops sends what its fault injector still delays: those packets had left, as
/// far as the peer can tell, and a network delivers a packet whose sender is gone. Were they
/// dropped, a reordered last ACK would die with an exiting program and leave its peer resending
/// (rxe never stops at retry_cnt 7).
#[test]
fn a_stopping_device_sends_what_its_faults_delay() {
    let (da, db) = (device("la", A, 47964, "delay=50s"), device("lb", B, 47964, ""));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    b.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.mr.sge(0..64)] }]).unwrap();
    a.qp.post_send(vec![SendWr::new(2, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    // The SEND waits in a's delay queue.
    assert!(b.cq.wait(1, Duration::from_millis(300)).unwrap().is_empty(), "the delay did not hold the SEND");
    da.stop();
    // `one` waits 20 s, under half the delay: the SEND left at the stop.
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (1, WcStatus::Success, 64));
}
