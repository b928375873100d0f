//! Memory windows, types 1 and 2 (IBTA 10.6.7): bind through a work request, access through the
//! window's R_Key checked against its range and rights, invalidation (local, and remote by SEND
//! with invalidate).

use softrdma_conformance::pair::{Pair, RcOptions, Side, BASE};
use softrdma_engine::verbs::{Access, WcOpcode, WcStatus};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const STEPS: usize = 100_000;
const WIN: u64 = BASE + 0x10000;

/// Connected pair; B has a region allowing binds and a window of `mw_type`, bound over
/// [WIN, WIN + 4096) with `rights`. Returns the window's R_Key after the bind.
fn setup(mw_type: u8, rights: Access) -> (Pair, Side, Side, u32) {
    let mut p = Pair::new(1);
    let (a, b) = p.connect_rc(RcOptions::default());
    let mr = p.b.reg_mr(b.pd, BASE, 1 << 20, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.alloc_mw(b.pd, mw_type).unwrap();
    let new_rkey = p.b.next_mw_rkey(mw);
    let bind = SendOp::BindMw { mw_rkey: mw, new_rkey, mr_lkey: mr.lkey, addr: WIN, length: 4096, access: rights };
    p.b.post_send(b.qpn, SendWr::new(77, bind, vec![])).unwrap();
    p.drive(STEPS);
    let wb = p.b.poll_cq(b.cq, 16);
    assert_eq!((wb[0].wr_id, wb[0].opcode, wb[0].status), (77, WcOpcode::BindMw, WcStatus::Success));
    assert!(p.log.is_empty(), "a bind sends nothing");
    (p, a, b, new_rkey)
}

fn write(p: &mut Pair, a: &Side, rkey: u32, addr: u64, len: u32) -> WcStatus {
    p.a.post_send(
        a.qpn,
        SendWr::new(
            1,
            SendOp::Write { remote_addr: addr, rkey },
            vec![Sge { addr: BASE, length: len, lkey: a.mr.lkey }],
        ),
    )
    .unwrap();
    p.drive(STEPS);
    p.a.poll_cq(a.cq, 16).pop().map(|w| w.status).unwrap()
}

#[test]
fn type1_window_grants_access_to_its_range_only() {
    for mw_type in [1, 2] {
        let (mut p, a, _b, rkey) = setup(mw_type, Access::REMOTE_WRITE | Access::REMOTE_READ);
        p.fill(0, BASE, b"through the window");
        assert_eq!(write(&mut p, &a, rkey, WIN + 100, 18), WcStatus::Success, "type {mw_type}");
        assert_eq!(p.read(1, WIN + 100, 18), b"through the window".to_vec());
        // Past the end of the window (still inside the region): remote access error.
        assert_eq!(write(&mut p, &a, rkey, WIN + 4090, 18), WcStatus::RemAccessErr, "type {mw_type}");
    }
}

#[test]
fn window_rights_are_checked() {
    let (mut p, a, _b, rkey) = setup(1, Access::REMOTE_READ);
    assert_eq!(write(&mut p, &a, rkey, WIN, 8), WcStatus::RemAccessErr);
}

#[test]
fn the_key_before_the_bind_grants_nothing() {
    let mut p = Pair::new(2);
    let (a, b) = p.connect_rc(RcOptions::default());
    let mw = p.b.alloc_mw(b.pd, 1).unwrap();
    assert_eq!(write(&mut p, &a, mw, WIN, 8), WcStatus::RemAccessErr);
}

#[test]
fn bind_needs_a_region_that_allows_it() {
    let mut p = Pair::new(3);
    let (_a, b) = p.connect_rc(RcOptions::default());
    // The pair's region has no MW_BIND.
    let mw = p.b.alloc_mw(b.pd, 2).unwrap();
    let bind = SendOp::BindMw {
        mw_rkey: mw,
        new_rkey: mw ^ 1,
        mr_lkey: b.mr.lkey,
        addr: WIN,
        length: 64,
        access: Access::REMOTE_READ,
    };
    p.b.post_send(b.qpn, SendWr::new(5, bind, vec![])).unwrap();
    p.drive(STEPS);
    assert_eq!(p.b.poll_cq(b.cq, 16)[0].status, WcStatus::MwBindErr);
}

#[test]
fn local_invalidate_revokes_a_type2_window() {
    let (mut p, a, b, rkey) = setup(2, Access::REMOTE_WRITE);
    p.b.post_send(b.qpn, SendWr::new(9, SendOp::LocalInv { rkey }, vec![])).unwrap();
    p.drive(STEPS);
    let wb = p.b.poll_cq(b.cq, 16);
    assert_eq!((wb[0].opcode, wb[0].status), (WcOpcode::LocalInv, WcStatus::Success));
    assert_eq!(write(&mut p, &a, rkey, WIN, 8), WcStatus::RemAccessErr);
}

#[test]
fn send_with_invalidate_revokes_a_type2_window_remotely() {
    let (mut p, a, b, rkey) = setup(2, Access::REMOTE_WRITE);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 3, sg_list: vec![Sge { addr: BASE + 0x8000, length: 64, lkey: b.mr.lkey }] })
        .unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(2, SendOp::SendWithInv { rkey }, vec![Sge { addr: BASE, length: 4, lkey: a.mr.lkey }]),
    )
    .unwrap();
    p.drive(STEPS);
    let wb = p.b.poll_cq(b.cq, 16);
    assert_eq!((wb[0].wr_id, wb[0].status, wb[0].invalidated_rkey), (3, WcStatus::Success, Some(rkey)));
    p.a.poll_cq(a.cq, 16);
    assert_eq!(write(&mut p, &a, rkey, WIN, 8), WcStatus::RemAccessErr);
}

#[test]
fn send_with_invalidate_of_an_unknown_key_is_an_invalid_request() {
    let (mut p, a, b, rkey) = setup(2, Access::REMOTE_WRITE);
    p.b.post_recv(b.qpn, RecvWr { wr_id: 3, sg_list: vec![Sge { addr: BASE + 0x8000, length: 64, lkey: b.mr.lkey }] })
        .unwrap();
    p.a.post_send(a.qpn, SendWr::new(2, SendOp::SendWithInv { rkey: rkey ^ 0x100 }, vec![])).unwrap();
    p.drive(STEPS);
    assert_eq!(p.a.poll_cq(a.cq, 16)[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn a_valid_type2_window_cannot_be_bound_again() {
    let (mut p, _a, b, rkey) = setup(2, Access::REMOTE_WRITE);
    let mr = p.b.reg_mr(b.pd, BASE, 1 << 20, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let bind = SendOp::BindMw {
        mw_rkey: rkey,
        new_rkey: rkey ^ 1,
        mr_lkey: mr.lkey,
        addr: WIN,
        length: 64,
        access: Access::REMOTE_READ,
    };
    p.b.post_send(b.qpn, SendWr::new(8, bind, vec![])).unwrap();
    p.drive(STEPS);
    assert_eq!(p.b.poll_cq(b.cq, 16)[0].status, WcStatus::MwBindErr);
}

#[test]
fn bind_completes_after_earlier_work() {
    // A bind posted behind a WRITE completes after it (completions in send-queue order).
    let mut p = Pair::new(4);
    let (a, b) = p.connect_rc(RcOptions::default());
    let mr = p.a.reg_mr(a.pd, BASE, 1 << 20, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.a.alloc_mw(a.pd, 1).unwrap();
    p.a.post_send(
        a.qpn,
        SendWr::new(
            1,
            SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey },
            vec![Sge { addr: BASE, length: 8, lkey: a.mr.lkey }],
        ),
    )
    .unwrap();
    let bind = SendOp::BindMw {
        mw_rkey: mw,
        new_rkey: mw ^ 3,
        mr_lkey: mr.lkey,
        addr: WIN,
        length: 64,
        access: Access::REMOTE_READ,
    };
    p.a.post_send(a.qpn, SendWr::new(2, bind, vec![])).unwrap();
    p.drive(STEPS);
    let wa = p.a.poll_cq(a.cq, 16);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(),
        vec![(1, WcOpcode::RdmaWrite), (2, WcOpcode::BindMw)]
    );
}
