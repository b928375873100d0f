//! XRC (IBTA Annex A14; the libibverbs XRC API): domains shared through an identity, XRC SRQs,
//! initiator and target QPs, demultiplexing by XRCETH, isolation between domains and PDs, and the
//! target QP's lifetime bound to its domain.

use softrdma_conformance::pair::{Fate, Pair, RcOptions, ADDR_A, ADDR_B, BASE, MEM, OWNER};
use softrdma_engine::device::{CqId, Device, PdId, QpCaps, QpInit, SrqAttr, XrcPolicy, XrcdId};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::verbs::{Access, QpType, VerbsError, WcOpcode, WcStatus};
use softrdma_engine::wire::Qpn;
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const STEPS: usize = 100_000;

/// The receiving node: one domain, `nsrq` XRC SRQs each with its own CQ, one target QP.
struct Target {
    xrcd: XrcdId,
    pd: PdId,
    srqs: Vec<(u32, CqId)>,
    tgt: Qpn,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// The sending node: one initiator QP.
struct Initiator {
    qpn: Qpn,
    cq: CqId,
    lkey: u32,
}

fn target(d: &mut Device<VecMemory>, identity: u64, nsrq: usize) -> Target {
    let xrcd = d.open_xrcd(OWNER, Some(identity), true, false).unwrap();
    let pd = d.alloc_pd(OWNER);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = d.reg_mr(pd, BASE, MEM as u64, all).unwrap();
    let srqs = (0..nsrq)
        .map(|_| {
            let cq = d.create_cq(256).unwrap();
            let n = d.create_xrc_srq(xrcd, pd, cq, SrqAttr { max_wr: 64, max_sge: 2, srq_limit: 0 }).unwrap();
            (n, cq)
        })
        .collect();
    let (tgt, handle) = d.create_xrc_tgt_qp(OWNER, xrcd).unwrap();
    Target { xrcd, pd, srqs, tgt, handle, lkey: mr.lkey, rkey: mr.rkey }
}

fn initiator(d: &mut Device<VecMemory>) -> Initiator {
    let pd = d.alloc_pd(OWNER);
    let cq = d.create_cq(256).unwrap();
    let mr = d.reg_mr(pd, BASE, MEM as u64, Access::LOCAL_WRITE).unwrap();
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 0, max_send_sge: 2, max_recv_sge: 0, max_inline_data: 0 };
    let qpn = d
        .create_qp(QpInit { qp_type: QpType::XrcIni, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None })
        .unwrap();
    Initiator { qpn, cq, lkey: mr.lkey }
}

fn connect(p: &mut Pair, ini: &Initiator, t: &Target, psn: u32) {
    let o = RcOptions::default();
    Pair::bring_up(&mut p.a, ini.qpn, QpType::XrcIni, &o, ADDR_B, t.tgt, psn, 0, 0);
    Pair::bring_up(&mut p.b, t.tgt, QpType::XrcTgt, &o, ADDR_A, ini.qpn, 0, psn, 0);
}

fn xsend(p: &mut Pair, ini: &Initiator, wr_id: u64, srqn: u32, op: SendOp, addr: u64, len: u32) {
    let mut w = SendWr::new(wr_id, op, vec![Sge { addr, length: len, lkey: ini.lkey }]);
    w.remote_srqn = srqn;
    p.a.post_send(ini.qpn, w).unwrap();
}

fn post(p: &mut Pair, t: &Target, srq: usize, wr_id: u64, addr: u64) {
    p.b.post_srq_recv(t.srqs[srq].0, RecvWr { wr_id, sg_list: vec![Sge { addr, length: 256, lkey: t.lkey }] }).unwrap();
}

#[test]
fn xrc_send_reaches_the_named_srq_and_completes_on_its_cq() {
    let mut p = Pair::new(1);
    let t = target(&mut p.b, 42, 2);
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    post(&mut p, &t, 0, 100, BASE + 0x1000);
    post(&mut p, &t, 1, 200, BASE + 0x2000);
    p.fill(0, BASE, b"to srq one");
    xsend(&mut p, &ini, 1, t.srqs[1].0, SendOp::Send, BASE, 10);
    p.drive(STEPS);
    assert_eq!(p.read(1, BASE + 0x2000, 10), b"to srq one".to_vec());
    let c1 = p.b.poll_cq(t.srqs[1].1, 16);
    assert_eq!(c1.len(), 1);
    assert_eq!((c1[0].wr_id, c1[0].status, c1[0].byte_len, c1[0].qp_num), (200, WcStatus::Success, 10, t.tgt));
    assert!(p.b.poll_cq(t.srqs[0].1, 16).is_empty(), "the other SRQ saw nothing");
    assert_eq!(p.b.query_srq(t.srqs[0].0).unwrap().1, 1, "its WQE is still there");
    assert_eq!(p.a.poll_cq(ini.cq, 16)[0].status, WcStatus::Success);
    // The wire carried XRC opcodes, the request with an XRCETH.
    assert_eq!(p.log[0].opcode, softrdma_engine::wire::Opcode::XRC_SEND_ONLY);
    assert_eq!(p.log[1].opcode, softrdma_engine::wire::Opcode::XRC_ACKNOWLEDGE);
}

#[test]
fn xrc_rdma_write_read_and_atomic_through_a_target_qp() {
    let mut p = Pair::new(2);
    let t = target(&mut p.b, 42, 1);
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    p.fill(0, BASE, &[7u8; 3000]);
    let n = t.srqs[0].0;
    xsend(&mut p, &ini, 1, n, SendOp::Write { remote_addr: BASE + 0x10000, rkey: t.rkey }, BASE, 3000);
    xsend(&mut p, &ini, 2, n, SendOp::Read { remote_addr: BASE + 0x10000, rkey: t.rkey }, BASE + 0x20000, 3000);
    xsend(
        &mut p,
        &ini,
        3,
        n,
        SendOp::FetchAdd { remote_addr: BASE + 0x30000, rkey: t.rkey, add: 5 },
        BASE + 0x40000,
        8,
    );
    p.drive(STEPS);
    assert_eq!(p.read(1, BASE + 0x10000, 3000), vec![7u8; 3000]);
    assert_eq!(p.read(0, BASE + 0x20000, 3000), vec![7u8; 3000]);
    assert_eq!(u64::from_ne_bytes(p.read(1, BASE + 0x30000, 8).try_into().unwrap()), 5);
    let wa = p.a.poll_cq(ini.cq, 16);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::RdmaRead),
            (3, WcStatus::Success, WcOpcode::FetchAdd)
        ]
    );
}

#[test]
fn xrc_isolation_an_srq_of_another_domain_is_never_delivered_to() {
    let mut p = Pair::new(3);
    let t = target(&mut p.b, 42, 1);
    // A second domain on the same node, with its own SRQ.
    let other = target(&mut p.b, 43, 1);
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    post(&mut p, &other, 0, 900, BASE + 0x5000);
    p.fill(0, BASE, b"intruder");
    xsend(&mut p, &ini, 1, other.srqs[0].0, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    assert_ne!(p.read(1, BASE + 0x5000, 8), b"intruder".to_vec());
    assert_eq!(p.b.query_srq(other.srqs[0].0).unwrap().1, 1, "the foreign SRQ's WQE is untouched");
    assert!(p.b.poll_cq(other.srqs[0].1, 16).is_empty());
    // NAK invalid request; the initiator completes with REM_INV_REQ_ERR.
    assert!(p.log.iter().any(|s| s.from == 1 && s.syndrome == Some(0x61)));
    assert_eq!(p.a.poll_cq(ini.cq, 16)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(p.b.counters().xrc_srq_err, 1);
}

#[test]
fn xrc_unknown_srq_number_is_an_invalid_request() {
    let mut p = Pair::new(4);
    let t = target(&mut p.b, 42, 1);
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    xsend(&mut p, &ini, 1, 0x00ab_cdef, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.a.poll_cq(ini.cq, 16)[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn xrc_rdma_checks_the_pd_of_the_srq_named() {
    let mut p = Pair::new(5);
    let t = target(&mut p.b, 42, 1);
    // A region in another PD of the same node: not reachable through an SRQ of t.pd.
    let pd2 = p.b.alloc_pd(OWNER);
    assert_ne!(pd2, t.pd);
    let mr2 = p.b.reg_mr(pd2, BASE, MEM as u64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    xsend(&mut p, &ini, 1, t.srqs[0].0, SendOp::Write { remote_addr: BASE, rkey: mr2.rkey }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.a.poll_cq(ini.cq, 16)[0].status, WcStatus::RemAccessErr);
    assert!(p.log.iter().any(|s| s.from == 1 && s.syndrome == Some(0x62)));
}

#[test]
fn open_xrcd_semantics() {
    let mut p = Pair::new(6);
    // No domain and no O_CREAT: EAGAIN; O_CREAT|O_EXCL on an existing one: EINVAL (uverbs).
    assert_eq!(p.b.open_xrcd(1, Some(77), false, false), Err(VerbsError::Again));
    let x = p.b.open_xrcd(1, Some(77), true, true).unwrap();
    assert_eq!(p.b.open_xrcd(2, Some(77), true, true), Err(VerbsError::Inval));
    // Another process opening the same file shares the domain.
    assert_eq!(p.b.open_xrcd(2, Some(77), false, false), Ok(x));
    // A private domain (fd -1) is never shared.
    let a = p.b.open_xrcd(1, None, true, false).unwrap();
    let b = p.b.open_xrcd(1, None, true, false).unwrap();
    assert_ne!(a, b);
}

#[test]
fn a_domain_with_an_open_target_qp_cannot_close() {
    let mut p = Pair::new(7);
    let x = p.b.open_xrcd(OWNER, Some(5), true, false).unwrap();
    let (q, h) = p.b.create_xrc_tgt_qp(OWNER, x).unwrap();
    assert_eq!(p.b.close_xrcd(OWNER, x), Err(VerbsError::Busy));
    p.b.destroy_qp_handle(q, h).unwrap();
    assert_eq!(p.b.close_xrcd(OWNER, x), Ok(()));
}

/// Sends one SEND to SRQ 0 and says whether it was delivered (and acknowledged).
fn one_send(p: &mut Pair, t: &Target, ini: &Initiator, wr_id: u64) -> bool {
    post(p, t, 0, wr_id, BASE + 0x1000);
    p.fill(0, BASE, &wr_id.to_le_bytes());
    xsend(p, ini, wr_id, t.srqs[0].0, SendOp::Send, BASE, 8);
    p.drive(STEPS);
    let got = p.b.poll_cq(t.srqs[0].1, 16);
    p.a.poll_cq(ini.cq, 16);
    got.iter().any(|w| w.wr_id == wr_id && w.status == WcStatus::Success)
}

#[test]
fn tgt_qp_lifetime_follows_the_domain() {
    let mut p = Pair::new(8);
    // Process 1 (OWNER) creates the domain, SRQ and target QP; process 2 opens both.
    let t = target(&mut p.b, 42, 1);
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    let x2 = p.b.open_xrcd(2, Some(42), false, false).unwrap();
    assert_eq!(x2, t.xrcd);
    let _h2 = p.b.open_qp(2, x2, t.tgt).unwrap();
    assert!(one_send(&mut p, &t, &ini, 1));
    // The creator's handle closed: traffic continues through the other handle.
    p.b.destroy_qp_handle(t.tgt, t.handle).unwrap();
    assert!(one_send(&mut p, &t, &ini, 2));
    // Process 2 exits without destroying its handle: the QP lives on with its domain, which
    // process 1 still holds.
    p.b.release_owner(2);
    assert!(p.b.qp_handles(t.tgt).is_empty());
    assert!(one_send(&mut p, &t, &ini, 3), "traffic continues while the domain lives");
    // The domain goes (its last reference): the target QP goes with it; packets to it are
    // dropped and counted.
    p.b.release_owner(OWNER);
    assert!(p.b.query_qp(t.tgt).is_err());
    let (before, malformed) = (p.b.counters().unknown_qp, p.b.counters().malformed);
    p.fill(0, BASE, b"late");
    xsend(&mut p, &ini, 4, t.srqs[0].0, SendOp::Send, BASE, 4);
    p.drive(STEPS);
    // IBTA 9.6: a well-formed packet for a QP that is gone is dropped and counted as such.
    assert!(p.b.counters().unknown_qp > before);
    assert_eq!(p.b.counters().malformed, malformed);
    assert_eq!(p.a.poll_cq(ini.cq, 16)[0].status, WcStatus::RetryExcErr);
}

#[test]
fn tgt_qp_explicitly_destroyed_through_its_last_handle_is_gone() {
    let mut p = Pair::new(9);
    let t = target(&mut p.b, 42, 1);
    let h2 = p.b.open_qp(OWNER, t.xrcd, t.tgt).unwrap();
    p.b.destroy_qp_handle(t.tgt, t.handle).unwrap();
    assert!(p.b.query_qp(t.tgt).is_ok());
    p.b.destroy_qp_handle(t.tgt, h2).unwrap();
    assert!(p.b.query_qp(t.tgt).is_err());
}

#[test]
fn upstream_policy_destroys_the_tgt_qp_when_its_last_handle_closes_on_exit() {
    let mut p = Pair::new(10);
    p.b.set_xrc_policy(XrcPolicy::DestroyOnLastClose);
    let t = target(&mut p.b, 42, 1);
    let _x2 = p.b.open_xrcd(2, Some(42), false, false).unwrap();
    // Process 2 keeps the domain open; the creator exits without destroying the QP.
    p.b.release_owner(OWNER);
    assert!(p.b.query_qp(t.tgt).is_err(), "upstream: gone with its last handle");
}

/// OFED 1.4/1.5 `ibv_create_xrc_rcv_qp` / `ibv_reg_xrc_rcv_qp` / `ibv_unreg_xrc_rcv_qp`: the
/// receive QP lives while any registered process does ("persists until the last process
/// registered for the QP calls ibv_unreg_xrc_rcv_qp"), whatever the device's policy.
#[test]
fn registered_rcv_qp_goes_with_its_last_registration() {
    let mut p = Pair::new(12);
    let t = target(&mut p.b, 42, 1);
    let (q, h1) = p.b.create_xrc_tgt_qp_with(OWNER, t.xrcd, Some(XrcPolicy::DestroyOnLastClose)).unwrap();
    let x2 = p.b.open_xrcd(2, Some(42), false, false).unwrap();
    let h2 = p.b.open_qp(2, x2, q).unwrap();
    let x3 = p.b.open_xrcd(3, Some(42), false, false).unwrap();
    let h3 = p.b.open_qp(3, x3, q).unwrap();
    // The creator unregisters, process 2 exits: process 3 still holds it.
    p.b.release_qp_handle(q, h1).unwrap();
    p.b.release_owner(2);
    assert!(p.b.query_qp(q).is_ok(), "registered by process 3");
    assert_eq!(p.b.release_qp_handle(q, h2), Err(VerbsError::Inval), "process 2's registration went with it");
    p.b.release_qp_handle(q, h3).unwrap();
    assert!(p.b.query_qp(q).is_err(), "the last registration went: so did the QP");
    // The domain itself is still open (processes 1 and 3).
    assert!(p.b.open_qp(3, x3, t.tgt).is_ok());
}

/// The seed's `ibv_alloc_xrc_rcv_qp`: the device owns the receive QP (no handle, no user
/// object); it persists until the XRC domain's reference count reaches zero, even on a device
/// whose policy for ordinary target QPs is upstream's last-close.
#[test]
fn allocated_rcv_qp_lives_until_the_domain_goes() {
    let mut p = Pair::new(13);
    p.b.set_xrc_policy(XrcPolicy::DestroyOnLastClose);
    let t = target(&mut p.b, 42, 1);
    let ini = initiator(&mut p.a);
    let (q, h) = p.b.create_xrc_tgt_qp_with(OWNER, t.xrcd, Some(XrcPolicy::LiveWithDomain)).unwrap();
    let t = Target { tgt: q, handle: h, ..t };
    connect(&mut p, &ini, &t, 20);
    p.b.release_qp_handle(q, h).unwrap();
    assert!(p.b.is_unowned_tgt_qp(q));
    assert!(one_send(&mut p, &t, &ini, 1), "alive with no handle");
    // Another process opens the domain; the allocator exits; traffic still flows.
    let _x2 = p.b.open_xrcd(2, Some(42), false, false).unwrap();
    p.b.release_owner(OWNER);
    assert!(p.b.query_qp(q).is_ok(), "the domain is still referenced by process 2");
    assert!(one_send(&mut p, &t, &ini, 2), "alive after its allocator went");
    p.b.release_owner(2);
    assert!(p.b.query_qp(q).is_err(), "the domain's last reference went: so did the QP");
}

#[test]
fn open_qp_in_another_domain_is_refused() {
    let mut p = Pair::new(11);
    let t = target(&mut p.b, 42, 1);
    let other = p.b.open_xrcd(OWNER, Some(43), true, false).unwrap();
    assert_eq!(p.b.open_qp(OWNER, other, t.tgt), Err(VerbsError::Inval));
    assert_eq!(p.b.open_qp(OWNER, t.xrcd, Qpn::new(0x123456)), Err(VerbsError::NoEnt));
}

#[test]
fn xrc_fan_in_under_loss_is_exactly_once_in_order_to_the_right_srq() {
    // N initiators on A, each with its own target QP on B, sending to M SRQs of one domain;
    // 5% of packets lost both ways.
    for seed in [1u64, 2, 3] {
        let mut p = Pair::new(seed);
        let (n, m, per) = (3usize, 4usize, 12u64);
        let mut t = target(&mut p.b, 42, m);
        let mut pairs = Vec::new();
        for i in 0..n {
            let ini = initiator(&mut p.a);
            let (tgt, _h) = if i == 0 { (t.tgt, t.handle) } else { p.b.create_xrc_tgt_qp(OWNER, t.xrcd).unwrap() };
            t.tgt = tgt;
            connect(&mut p, &ini, &t, 10 + i as u32 * 1000);
            pairs.push((ini, tgt));
        }
        let mut rng = softrdma_engine::rng::Rng::new(seed);
        p.set_filter(move |_| if rng.next_u64() % 100 < 5 { Fate::Drop } else { Fate::Deliver });
        let mut sent: Vec<Vec<(u64, usize)>> = vec![Vec::new(); n];
        let mut pick = softrdma_engine::rng::Rng::new(seed ^ 0xff);
        for k in 0..per {
            for (i, (ini, _)) in pairs.iter().enumerate() {
                let srq = (pick.next_u64() % m as u64) as usize;
                let wr_id = ((i as u64) << 32) | k;
                let addr = BASE + 0x1_0000 + (wr_id & 0xffff) * 64 + i as u64 * 0x1000;
                p.b.post_srq_recv(
                    t.srqs[srq].0,
                    RecvWr {
                        wr_id,
                        sg_list: vec![Sge {
                            addr: BASE + 0x10_0000 + (i as u64 * per + k) * 64,
                            length: 64,
                            lkey: t.lkey,
                        }],
                    },
                )
                .unwrap();
                p.fill(0, addr, &wr_id.to_le_bytes());
                let mut w = SendWr::new(wr_id, SendOp::Send, vec![Sge { addr, length: 8, lkey: ini.lkey }]);
                w.remote_srqn = t.srqs[srq].0;
                p.a.post_send(ini.qpn, w).unwrap();
                sent[i].push((wr_id, srq));
            }
        }
        p.drive(1_000_000);
        // Every SRQ's CQ got exactly the messages sent to it; per initiator, in order.
        let mut got: Vec<Vec<(u64, usize)>> = vec![Vec::new(); n];
        for (s, (_, cq)) in t.srqs.iter().enumerate() {
            let mut last_per_ini = vec![None; n];
            for wc in p.b.poll_cq(*cq, 4096) {
                assert_eq!(wc.status, WcStatus::Success);
                // The buffer of the WQE that completed holds the message: which initiator sent it.
                let buf = BASE + 0x10_0000 + ((wc.wr_id >> 32) * per + (wc.wr_id & 0xffff)) * 64;
                let msg = u64::from_le_bytes(p.read(1, buf, 8).try_into().unwrap());
                let from = (msg >> 32) as usize;
                assert!(from < n, "seed {seed}: garbage in a receive buffer");
                // Per initiator, messages reach an SRQ in the order they were sent.
                assert!(last_per_ini[from].is_none_or(|l| l < msg), "seed {seed}: out of order");
                last_per_ini[from] = Some(msg);
                got[from].push((msg, s));
            }
        }
        for i in 0..n {
            let mut g = got[i].clone();
            let mut expect = sent[i].clone();
            g.sort();
            expect.sort();
            assert_eq!(g, expect, "seed {seed}: initiator {i} exactly once, to the right SRQ");
            let wa = p.a.poll_cq(pairs[i].0.cq, 4096);
            assert_eq!(wa.len(), per as usize);
            assert!(wa.iter().all(|w| w.status == WcStatus::Success));
            assert!(wa.windows(2).all(|w| w[0].wr_id < w[1].wr_id), "in order");
        }
    }
}

#[test]
fn async_events_of_a_target_qp_go_to_every_handle() {
    let mut p = Pair::new(12);
    let t = target(&mut p.b, 42, 1);
    let _x2 = p.b.open_xrcd(2, Some(42), false, false).unwrap();
    let h2 = p.b.open_qp(2, t.xrcd, t.tgt).unwrap();
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    // A bad rkey through the target QP: access error, the target QP goes to ERR.
    xsend(&mut p, &ini, 1, t.srqs[0].0, SendOp::Write { remote_addr: BASE, rkey: t.rkey ^ 0x40 }, BASE, 8);
    p.drive(STEPS);
    let evs: Vec<_> = std::iter::from_fn(|| p.b.poll_handle_event()).collect();
    let got: Vec<(u32, u32)> = evs
        .iter()
        .filter(|e| e.event == softrdma_engine::device::AsyncEvent::QpAccessErr(t.tgt))
        .map(|e| (e.handle, e.owner))
        .collect();
    assert_eq!(got, vec![(t.handle, OWNER), (h2, 2)], "each opener gets the event");
}

/// A region may answer to a second remote key, one another engine of the device gave out for the
/// same memory (a provider process's key, its region's twin here): RDMA through a target QP with
/// that key lands, the region's own key still works, a key that names a region here cannot be
/// taken as an alias, and the alias goes with the region (then it is a remote access error, NAK).
#[test]
fn an_rkey_alias_reaches_its_region_and_goes_with_it() {
    let mut p = Pair::new(8);
    let t = target(&mut p.b, 42, 1);
    let ini = initiator(&mut p.a);
    connect(&mut p, &ini, &t, 10);
    let n = t.srqs[0].0;
    let twin = p.b.reg_mr(t.pd, BASE + 0x40000, 0x1000, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let foreign = 0x00ab_cd5a;
    assert_eq!(p.b.alias_rkey(twin.lkey, t.rkey), Err(VerbsError::Inval), "a key of this engine");
    assert_eq!(p.b.alias_rkey(0x00ff_ff00, foreign), Err(VerbsError::Inval), "no such region");
    p.b.alias_rkey(twin.lkey, foreign).unwrap();
    assert_eq!(p.b.alias_rkey(twin.lkey, foreign), Err(VerbsError::Inval), "taken");
    p.fill(0, BASE, &[9u8; 100]);
    xsend(&mut p, &ini, 1, n, SendOp::Write { remote_addr: BASE + 0x40010, rkey: foreign }, BASE, 100);
    xsend(&mut p, &ini, 2, n, SendOp::Write { remote_addr: BASE + 0x40200, rkey: twin.rkey }, BASE, 100);
    p.drive(STEPS);
    assert_eq!(p.read(1, BASE + 0x40010, 100), vec![9u8; 100]);
    assert_eq!(p.read(1, BASE + 0x40200, 100), vec![9u8; 100]);
    let done = p.a.poll_cq(ini.cq, 16);
    assert!(done.iter().all(|w| w.status == WcStatus::Success), "{done:?}");
    // Deregistered, the region takes its alias with it.
    p.b.dereg_mr(twin.lkey).unwrap();
    xsend(&mut p, &ini, 3, n, SendOp::Write { remote_addr: BASE + 0x40010, rkey: foreign }, BASE, 100);
    p.drive(STEPS);
    let c = p.a.poll_cq(ini.cq, 16);
    assert_eq!(c.last().map(|w| w.status), Some(WcStatus::RemAccessErr), "{c:?}");
}

/// A PD that an XRC SRQ is in, and a CQ that one completes into, cannot go (EBUSY, as uverbs
/// counts their users); once the SRQ is gone, they can.
#[test]
fn an_xrc_srqs_pd_and_cq_are_busy_while_it_lives() {
    let mut p = Pair::new(9);
    let x = p.b.open_xrcd(OWNER, None, true, false).unwrap();
    let pd = p.b.alloc_pd(OWNER);
    let cq = p.b.create_cq(16).unwrap();
    let srq = p.b.create_xrc_srq(x, pd, cq, SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    assert_eq!(p.b.dealloc_pd(pd), Err(VerbsError::Busy));
    assert_eq!(p.b.destroy_cq(cq), Err(VerbsError::Busy));
    p.b.destroy_srq(srq).unwrap();
    assert_eq!(p.b.destroy_cq(cq), Ok(()));
    assert_eq!(p.b.dealloc_pd(pd), Ok(()));
}
