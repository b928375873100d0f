//! Devices that the application's own calls drive (`Progress::Application`, a provider's
//! device): one-sided targets and channel sleepers served without calls, resends while the
//! application sleeps, the handoff of the socket, held-back answers and their bounds.
//!
//! Each test uses its own UDP port so tests can run in parallel.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_device::hca::{Hca, HcaConfig, HANDOFF_IDLE};
use softrdma_device::verbs::*;

mod common;
use common::*;

/// A new QP pair between `a` and `b`, b's on a CQ with a completion channel: a thread asleep on
/// that channel (the CQ armed first; with `poll_first`, polled empty just before) wakes for a's
/// SEND and finds its receive completed.
fn channel_sleeper_wakes(a: &Side, b: &Side, o: &ConnectOptions, poll_first: bool) {
    let ch = b._ctx.create_comp_channel().unwrap();
    let cq = b._ctx.create_cq(16, Some(&ch)).unwrap();
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qb = b._pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
    let qa = a._pd.qp_builder(QpType::Rc, &a.cq).caps(caps).build().unwrap();
    qa.connect(1, &qb.endpoint(2), o).unwrap();
    qb.connect(2, &qa.endpoint(1), o).unwrap();
    qb.post_recv(vec![RecvWr { wr_id: 7, sg_list: vec![b.mr.sge(300_000..300_064)] }]).unwrap();
    if poll_first {
        assert!(cq.poll(4).unwrap().is_empty());
    }
    cq.req_notify(false).unwrap();
    let sleeper = std::thread::spawn(move || {
        let got = ch.get_cq_event(Some(T)).unwrap();
        let w = cq.poll(4).unwrap();
        (got.is_some(), w.len(), w.first().map(|w| (w.wr_id, w.status)))
    });
    std::thread::sleep(Duration::from_millis(50));
    qa.post_send(vec![SendWr::new(8, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(sleeper.join().unwrap(), (true, 1, Some((7, WcStatus::Success))));
}

/// Devices that the application's calls drive (`Progress::Application`): the target of one-sided
/// work makes no call at all, yet its progress thread answers WRITEs, READs and atomics in time
/// (they would otherwise wait for the requester's retransmission timer and fail after retries);
/// a thread asleep on a completion channel wakes for a SEND; and the requester's own calls move
/// its work.
#[test]
fn application_driven_devices_serve_one_sided_targets_and_channel_sleepers_without_calls() {
    let dev = |name: &str, addr: IpAddr| app_device(name, addr, 47936, |c| c.seed = Some(47936));
    let (da, db) = (dev("app0", A), dev("app1", B));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    // Shorter transport timer and few retries: a target that did not answer shows as an error.
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
    let data = pattern(50_000, 3);
    a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
    let t0 = std::time::Instant::now();
    for round in 0..20u64 {
        a.qp.post_send(vec![SendWr::new(
            round,
            SendOp::Write { remote_addr: b.mr.addr() + 4096, rkey: b.mr.rkey() },
            vec![a.mr.sge(0..data.len())],
        )])
        .unwrap();
        let w = one(&a.cq);
        assert_eq!((w.wr_id, w.status), (round, WcStatus::Success));
    }
    // READ it back into another part of a's region, then an atomic on b's memory.
    a.qp.post_send(vec![SendWr::new(
        50,
        SendOp::Read { remote_addr: b.mr.addr() + 4096, rkey: b.mr.rkey() },
        vec![a.mr.sge(100_000..100_000 + data.len())],
    )])
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(&a.mr.as_slice()[100_000..100_000 + data.len()], &data[..]);
    a.qp.post_send(vec![SendWr::new(
        51,
        SendOp::FetchAdd { remote_addr: b.mr.addr(), rkey: b.mr.rkey(), add: 5 },
        vec![a.mr.sge(200_000..200_008)],
    )])
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    // 22 one-sided operations, each answered by a device whose application made no call: well
    // under one transport timeout each (code 14: 67 ms) when the progress thread answers.
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "one-sided work took {took:?}");
    assert_eq!(&b.mr.as_slice()[4096..4096 + data.len()], &data[..]);
    assert_eq!(u64::from_ne_bytes(b.mr.as_slice()[..8].try_into().unwrap()), 5);

    // A thread asleep on b's completion channel wakes for a SEND.
    channel_sleeper_wakes(&a, &b, &o, false);
}

/// On an application-driven device, a send whose packet is lost is resent by the progress
/// thread's transport timer even when the application, having posted, only sleeps on its
/// completion channel (the post armed the timer while the progress thread slept with an older
/// deadline).
#[test]
fn application_driven_sends_are_resent_while_the_application_sleeps() {
    let dev = |name: &str, addr: IpAddr, faults: &str| {
        app_device(name, addr, 47937, |c| {
            c.seed = Some(47937);
            c.faults = faults.parse().unwrap();
        })
    };
    let (da, db) = (dev("lossy0", A, "loss=0.3"), dev("lossy1", B, ""));
    let ctx = Context::embedded(&da).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&ch)).unwrap();
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qa = pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let b = side(&db, QpType::Rc);
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 12, retry_cnt: 7, ..ConnectOptions::default() };
    qa.connect(1, &b.qp.endpoint(2), &o).unwrap();
    b.qp.connect(2, &qa.endpoint(1), &o).unwrap();
    for i in 0..10u64 {
        b.qp.post_recv(vec![RecvWr { wr_id: i, sg_list: vec![b.mr.sge(0..64)] }]).unwrap();
        cq.req_notify(false).unwrap();
        qa.post_send(vec![SendWr::new(i, SendOp::Send, vec![mr.sge(0..64)])]).unwrap();
        // No poll until the channel says so: only the progress thread can resend.
        assert!(ch.get_cq_event(Some(Duration::from_secs(10))).unwrap().is_some(), "send {i} never completed");
        let w = cq.poll(4).unwrap();
        assert_eq!(w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(i, WcStatus::Success)]);
        assert_eq!(one(&b.cq).status, WcStatus::Success);
    }
    // The run is only a test if sends were lost and resent.
    let (_, _, faults) = da.counters();
    assert!(faults.dropped > 0, "no send was lost (seeded loss 0.3 over 10 sends)");
}

/// The data-path issue's item 4: a process that runs its own QPs (an application-driven device,
/// as a provider) serves one-sided requests from its own memory, and memory the application
/// made inaccessible after registering it never crashes it. Here the pages are made PROT_NONE
/// (`mprotect`; unmapping them would let another thread's allocation reuse the range in this
/// multi-threaded test process): an RDMA WRITE into them is lost as a DMA into memory its owner
/// gave up, and counted (`memory_faults`); an RDMA READ of them ends at the requester as a
/// remote access error (the responder NAKs it, IBTA 9.7.5.2.8 / C9-96 for an R_Key range it
/// cannot serve); the target goes on serving its other memory.
#[test]
fn application_driven_target_survives_memory_it_made_inaccessible() {
    let dev = |name: &str, addr: IpAddr| app_device(name, addr, 47938, |c| c.seed = Some(47938));
    let (da, db) = (dev("inacc0", A), dev("inacc1", B));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let len = 64 * 1024;
    let base = anonymous_mapping(len);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: the range is mapped and stays allocated (if inaccessible) until after `raw` goes.
    let raw = unsafe { b._pd.reg_mr_raw(base as u64, len as u64, access) }.unwrap();
    let rkey = raw.keys().rkey;
    // SAFETY: the mapping made above; nothing of this process touches it until the munmap.
    assert_eq!(unsafe { libc::mprotect(base, len, libc::PROT_NONE) }, 0);
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
    let data = pattern(8192, 5);
    a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
    let faults_before = db.stats().1.memory_faults;
    a.qp.post_send(vec![SendWr::new(
        1,
        SendOp::Write { remote_addr: base as u64 + 4096, rkey },
        vec![a.mr.sge(0..data.len())],
    )])
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success, "the WRITE is acknowledged (its data is lost)");
    assert!(db.stats().1.memory_faults > faults_before, "the lost WRITE is counted");
    a.qp.post_send(vec![SendWr::new(
        2,
        SendOp::Read { remote_addr: base as u64 + 4096, rkey },
        vec![a.mr.sge(20_000..20_000 + data.len())],
    )])
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr, "a READ of inaccessible memory");
    // The target is alive and serves its other memory to a new connection.
    let qa = a._pd.qp_builder(QpType::Rc, &a.cq).build().unwrap();
    let qb = b._pd.qp_builder(QpType::Rc, &b.cq).build().unwrap();
    qa.connect(1, &qb.endpoint(2), &o).unwrap();
    qb.connect(2, &qa.endpoint(1), &o).unwrap();
    qa.post_send(vec![SendWr::new(
        3,
        SendOp::Write { remote_addr: b.mr.addr() + 4096, rkey: b.mr.rkey() },
        vec![a.mr.sge(0..data.len())],
    )])
    .unwrap();
    // (The first QP's flushed work may complete first on the shared CQ.)
    let w = (0..8).map(|_| one(&a.cq)).find(|w| w.wr_id == 3).expect("the WRITE on the new QP");
    assert_eq!(w.status, WcStatus::Success);
    assert_eq!(&b.mr.as_slice()[4096..4096 + data.len()], &data[..]);
    a.mr.as_mut_slice()[0] ^= 0xff;
    drop(raw);
    // SAFETY: the registration is gone; the mapping is ours.
    unsafe { libc::munmap(base, len) };
}

/// A fresh anonymous read-write mapping of `len` bytes, the caller's until it unmaps it.
fn anonymous_mapping(len: usize) -> *mut libc::c_void {
    // SAFETY: mmap(2) of new anonymous memory; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    base
}

/// An application-driven device writes received SENDs straight into the posted buffers (a
/// guarded copy in its own process): a receive buffer its program made inaccessible after posting
/// it ends in a local protection error completion, the sender's request in a NAK (remote
/// operational error: IBTA 9.7.5.2.8, as rxe answers a receive whose buffer it cannot write),
/// and the process lives on; no system call reached its memory.
#[test]
fn application_driven_receive_into_memory_made_inaccessible_fails_without_a_crash() {
    let dev = |name: &str, addr: IpAddr| app_device(name, addr, 47967, |c| c.seed = Some(47967));
    let (da, db) = (dev("rinacc0", A), dev("rinacc1", B));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let len = 16 * 1024;
    let base = anonymous_mapping(len);
    // SAFETY: the range is mapped and stays allocated (if inaccessible) until after `raw` goes.
    let raw = unsafe { b._pd.reg_mr_raw(base as u64, len as u64, Access::LOCAL_WRITE) }.unwrap();
    let sge = softrdma_engine::wr::Sge { addr: base as u64 + 100, length: 8000, lkey: raw.keys().lkey };
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
    b.qp.post_recv(vec![RecvWr { wr_id: 7, sg_list: vec![sge] }]).unwrap();
    // SAFETY: the mapping made above; nothing of this process touches it until the munmap.
    assert_eq!(unsafe { libc::mprotect(base, len, libc::PROT_NONE) }, 0);
    let data = pattern(3000, 9);
    a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
    let faults_before = db.stats().1.memory_faults;
    a.qp.post_send(vec![SendWr::new(1, SendOp::Send, vec![a.mr.sge(0..data.len())])]).unwrap();
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status), (7, WcStatus::LocProtErr), "the receive into inaccessible memory");
    assert_eq!(one(&a.cq).status, WcStatus::RemOpErr, "the sender's request is refused");
    let io = db.counters().1;
    assert!(db.stats().1.memory_faults > faults_before && io.memory_guarded > 0, "{io:?}");
    assert_eq!(io.memory_writes, 0, "no process_vm_writev");
    drop(raw);
    // SAFETY: the registration is gone; the mapping is ours.
    unsafe { libc::munmap(base, len) };
}

/// On an application-driven device, a thread whose poll found its CQ empty reads the socket
/// itself and the progress thread keeps off it (the handoff): the progress thread takes it back
/// when a poll returns completions (the application may then spin on memory only the progress
/// thread can fill), when a CQ is armed for a channel, and when the polling thread stops without
/// a completion (after `handoff_idle`). Each way, b's application makes no further call and still
/// serves a's WRITE or wakes for a's SEND (retry_cnt 1 and a 67 ms timer: a socket left handed
/// off ends in RETRY_EXC_ERR). The first two run with a handoff that would otherwise last 60 s.
#[test]
fn application_driven_polls_hand_the_socket_back() {
    let dev = |name: &str, addr: IpAddr, port: u16, idle: Duration| {
        app_device(name, addr, port, |c| {
            c.seed = Some(port as u64);
            c.handoff_idle = idle;
        })
    };
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    let pair = |da: &Arc<Hca>, db: &Arc<Hca>| {
        let (a, b) = (side(da, QpType::Rc), side(db, QpType::Rc));
        a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
        b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
        (a, b)
    };
    let write = |a: &mut Side, b: &Side, id: u64, seed: u8| {
        let data = pattern(8192, seed);
        a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
        let wr = SendOp::Write { remote_addr: b.mr.addr() + 4096, rkey: b.mr.rkey() };
        a.qp.post_send(vec![SendWr::new(id, wr, vec![a.mr.sge(0..data.len())])]).unwrap();
        let w = one(&a.cq);
        assert_eq!((w.wr_id, w.status), (id, WcStatus::Success));
        assert_eq!(&b.mr.as_slice()[4096..4096 + data.len()], &data[..]);
    };
    let long = Duration::from_secs(60);
    let (da, db) = (dev("hand0", A, 47939, long), dev("hand1", B, 47939, long));
    let (mut a, b) = pair(&da, &db);
    // 1. b polls until a completion comes (a's SEND), then makes no call while a WRITEs.
    b.qp.post_recv(vec![RecvWr { wr_id: 2, sg_list: vec![b.mr.sge(0..64)] }]).unwrap();
    let poller = std::thread::spawn(move || {
        let w = one(&b.cq);
        assert_eq!((w.wr_id, w.status), (2, WcStatus::Success));
        b
    });
    std::thread::sleep(Duration::from_millis(20));
    a.qp.post_send(vec![SendWr::new(3, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let b = poller.join().unwrap();
    write(&mut a, &b, 4, 2);
    // 2. b polls its empty CQ, arms it and sleeps on the channel: a's SEND wakes it.
    channel_sleeper_wakes(&a, &b, &o, true);
    write(&mut a, &b, 9, 3);
    // 3. With the default handoff: b polls its empty CQ a few times, then stops without a
    // completion.
    let (dc, dd) = (dev("hand2", A, 47940, HANDOFF_IDLE), dev("hand3", B, 47940, HANDOFF_IDLE));
    let (mut c, d) = pair(&dc, &dd);
    for _ in 0..3 {
        assert!(d.cq.poll(4).unwrap().is_empty());
    }
    write(&mut c, &d, 1, 1);
}

/// A thread that answers what it receives (it posted a send since its last completions) and
/// whose poll returns a message keeps the socket until its next send has left
/// (`Hca::end_handoff_after_poll`: the `epoll_ctl` is then not between a message and its answer).
/// One that makes no call after all (it spins on memory) has the progress thread back on the
/// socket within `END_AFTER_POST_WAIT` at that thread's next look: b's application makes no call
/// while a WRITEs, with a handoff that would otherwise last 60 s and a's retry_cnt 1 with a
/// 67 ms timer (a socket left handed off ends in RETRY_EXC_ERR). Then the ping-pong goes on: b's
/// next poll and send work as before.
#[test]
fn a_deferred_handoff_end_comes_without_the_post() {
    let dev = |name: &str, addr: IpAddr| {
        app_device(name, addr, 47957, |c| {
            c.seed = Some(47957);
            c.handoff_idle = Duration::from_secs(60);
        })
    };
    let (da, db) = (dev("later0", A), dev("later1", B));
    let (mut a, mut b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
    for round in 0..3u64 {
        a.qp.post_recv(vec![RecvWr { wr_id: 10 + round, sg_list: vec![a.mr.sge(200_000..200_064)] }]).unwrap();
        b.qp.post_recv(vec![RecvWr { wr_id: 20 + round, sg_list: vec![b.mr.sge(0..64)] }]).unwrap();
        // b posts first (a ping-pong's answering side; unsignaled, so that the poll that ends
        // its wait returns the message alone), then polls until a's SEND arrives.
        let mut pong = SendWr::new(30 + round, SendOp::Send, vec![b.mr.sge(64..128)]);
        pong.signaled = false;
        b.qp.post_send(vec![pong]).unwrap();
        let poller = std::thread::spawn(move || {
            let mut got = Vec::new();
            let t0 = Instant::now();
            while !got.contains(&(20 + round)) {
                for w in b.cq.poll(4).unwrap() {
                    assert_eq!(w.status, WcStatus::Success, "{w:?}");
                    got.push(w.wr_id);
                }
                assert!(t0.elapsed() < T, "round {round}: {got:?}");
            }
            (b, got)
        });
        std::thread::sleep(Duration::from_millis(20));
        a.qp.post_send(vec![SendWr::new(40 + round, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
        let (back, got_b) = poller.join().unwrap();
        b = back;
        // b now makes no call: a's WRITE is served by b's progress thread, or fails.
        let data = pattern(8192, round as u8);
        a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
        let wr = SendOp::Write { remote_addr: b.mr.addr() + 4096, rkey: b.mr.rkey() };
        a.qp.post_send(vec![SendWr::new(50 + round, wr, vec![a.mr.sge(0..data.len())])]).unwrap();
        let mut got = Vec::new();
        while !got.contains(&(50 + round)) {
            let w = one(&a.cq);
            assert_eq!(w.status, WcStatus::Success, "round {round}: {w:?}");
            got.push(w.wr_id);
        }
        assert_eq!(&b.mr.as_slice()[4096..4096 + data.len()], &data[..]);
        // The rest of the round: a's receive of b's SEND, a's SEND.
        while !got.contains(&(10 + round)) || !got.contains(&(40 + round)) {
            let w = one(&a.cq);
            assert_eq!(w.status, WcStatus::Success, "round {round}: {w:?}");
            got.push(w.wr_id);
        }
        assert_eq!(got_b, [20 + round], "round {round}");
    }
}

/// An application's poll returns the completions of what it received before the answers leave
/// (`Hca::drive`): the next post sends them after its own request, in one GSO send, and an
/// application that makes no further call has them sent by its progress thread after
/// about a millisecond at most. a's transport timer is ~4 s here: an ACK left unsent until a retransmission
/// would take that long.
#[test]
fn a_poll_returns_completions_before_the_answers_which_leave_with_the_next_post_or_soon() {
    // As a provider's device (`Context::open_provider`): with GSO.
    let dev = |name: &str, addr: IpAddr| app_device(name, addr, 47945, |c| c.gso = true);
    let (da, db) = (dev("defer0", A), dev("defer1", B));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 20, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
    let recv =
        |s: &Side, id: u64| s.qp.post_recv(vec![RecvWr { wr_id: id, sg_list: vec![s.mr.sge(64..128)] }]).unwrap();
    let send = |s: &Side, id: u64| s.qp.post_send(vec![SendWr::new(id, SendOp::Send, vec![s.mr.sge(0..64)])]).unwrap();
    // 1. A ping-pong: b answers each SEND with one of its own right after the poll. (Its SEND,
    // larger than the ACK, must go first to share a GSO send: segments after the first may only
    // be as large or smaller.)
    let gso_before = db.counters().1.gso_sends;
    let rounds = 50;
    recv(&b, 1);
    let pong = std::thread::spawn(move || {
        for i in 0..rounds {
            loop {
                let w = b.cq.poll(4).unwrap();
                assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
                if w.iter().any(|w| w.wr_id == 1) {
                    break;
                }
            }
            if i + 1 < rounds {
                recv(&b, 1);
            }
            send(&b, 100 + i);
        }
        b
    });
    for i in 0..rounds {
        recv(&a, 1);
        send(&a, 200 + i);
        let t0 = Instant::now();
        let mut got = (false, false);
        while got != (true, true) {
            for w in a.cq.poll(4).unwrap() {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                if w.wr_id == 1 {
                    got.0 = true;
                } else if w.wr_id == 200 + i {
                    got.1 = true;
                }
            }
            assert!(t0.elapsed() < T, "round {i}: {got:?}");
        }
    }
    let b = pong.join().unwrap();
    // b's answers to a's SENDs left with its own SENDs (without the deferral each ACK leaves
    // alone, from the poll, and no two packets of b's share a send).
    let merged = db.counters().1.gso_sends - gso_before;
    assert!(merged > 0, "no ACK left with the next post in {rounds} rounds");
    // 2. b polls until a's SEND completes, then makes no call: its progress thread sends the ACK.
    recv(&b, 7);
    let poller = std::thread::spawn(move || {
        // (The completion of b's last SEND of part 1 may come first.)
        loop {
            let w = one(&b.cq);
            assert_eq!(w.status, WcStatus::Success);
            if w.wr_id == 7 {
                return b;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(20));
    let t0 = Instant::now();
    send(&a, 8);
    let w = one(&a.cq);
    assert_eq!((w.wr_id, w.status), (8, WcStatus::Success));
    assert!(t0.elapsed() < Duration::from_secs(1), "the ACK waited for a retransmission: {:?}", t0.elapsed());
    drop(poller.join().unwrap());
    // 3. The ACK's bound, alone, with a handoff that only ends with a completion (so that its
    // own idle check does not send the ACK): the progress thread sleeps at most 1 ms while the
    // application drives the device (200 us while it knows answers are owed); without that it
    // sends the ACK at its next 50 ms tick (five rounds: ~125 ms) or after a's retransmission.
    let dev0 = |name: &str, addr: IpAddr| app_device(name, addr, 47946, |c| c.handoff_idle = Duration::from_secs(60));
    let (dc, dd) = (dev0("defer2", A), dev0("defer3", B));
    let (c, mut d) = (side(&dc, QpType::Rc), side(&dd, QpType::Rc));
    c.qp.connect(100, &d.qp.endpoint(900), &o).unwrap();
    d.qp.connect(900, &c.qp.endpoint(100), &o).unwrap();
    let mut total = Duration::ZERO;
    for i in 0..5 {
        // d posts a SEND first (answers are held back only for a program that posts: a
        // ping-pong), then polls until c's SEND arrives and makes no further call.
        recv(&c, 50 + i);
        recv(&d, i);
        let poller = std::thread::spawn(move || {
            send(&d, 30 + i);
            loop {
                let w = one(&d.cq);
                assert_eq!(w.status, WcStatus::Success);
                if w.wr_id == i {
                    return d;
                }
            }
        });
        std::thread::sleep(Duration::from_millis(10));
        let t0 = Instant::now();
        send(&c, 10 + i);
        loop {
            let w = one(&c.cq);
            assert_eq!(w.status, WcStatus::Success);
            if w.wr_id == 10 + i {
                break;
            }
        }
        total += t0.elapsed();
        d = poller.join().unwrap();
    }
    assert!(total < Duration::from_millis(50), "the ACKs waited for the progress thread: {total:?} for 5");
}

/// The process exit sends what a poll held back: a ping-pong's answering side (an
/// application-driven device, as a provider's) returns the last SEND's completion with its ACK
/// held (it posted a send since its previous completions) and exits at once, without destroying
/// anything (ibv_rc_pingpong's server does when it fails). Its peer must get that ACK (a NIC
/// answered at once): with retry_cnt 1 and a 268 ms timer it ends in RETRY_EXC_ERR otherwise.
/// The answering side is this test binary run again as a child
/// ([`held_back_answers_leave_at_process_exit_child`]), lines on its stdin and stdout between them.
#[test]
fn held_back_answers_leave_at_process_exit() {
    use std::io::{BufRead, Write};
    let da = device("exit0", A, 47951, "");
    let a = side(&da, QpType::Rc);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "held_back_answers_leave_at_process_exit_child", "--nocapture"])
        .env("SOFTRDMA_TEST_EXIT_CHILD", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut expect = |what: &str| -> String {
        loop {
            let l = from_child.next().unwrap_or_else(|| panic!("the child ended before {what}")).unwrap();
            if let Some(rest) = l.strip_prefix(what) {
                return rest.to_string();
            }
        }
    };
    let qpn: u32 = expect("CHILD qpn=").parse().unwrap();
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 16, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &Endpoint { addr: B, qpn, psn: 900 }, &o).unwrap();
    writeln!(to_child, "PARENT qpn={}", a.qp.qpn()).unwrap();
    expect("CHILD ready");
    let send = |id: u64| a.qp.post_send(vec![SendWr::new(id, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    a.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![a.mr.sge(64..128)] }]).unwrap();
    send(10);
    // The child's answer, then the last SEND, whose ACK the child holds as it exits.
    let mut got = Vec::new();
    while !got.contains(&1) {
        let w = one(&a.cq);
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        got.push(w.wr_id);
    }
    send(12);
    let t0 = Instant::now();
    while !got.contains(&12) {
        let w = one(&a.cq);
        assert_eq!((w.wr_id, w.status), (w.wr_id, WcStatus::Success), "the last SEND's ACK never came: {w:?}");
        got.push(w.wr_id);
    }
    let took = t0.elapsed();
    assert!(child.wait().unwrap().success());
    assert_eq!(da.counters().0.retransmitted_pkts, 0, "the ACK came only after a retransmission ({took:?})");
}

/// The child of [`held_back_answers_leave_at_process_exit`] (ignored: that test runs it).
#[test]
#[ignore]
fn held_back_answers_leave_at_process_exit_child() {
    use std::io::{BufRead, Write};
    assert!(
        std::env::var_os("SOFTRDMA_TEST_EXIT_CHILD").is_some(),
        "run by held_back_answers_leave_at_process_exit, not alone"
    );
    let db = app_device("exit1", B, 47951, |c| c.gso = true);
    let b = side(&db, QpType::Rc);
    println!("CHILD qpn={}", b.qp.qpn());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let qpn: u32 = line.trim().strip_prefix("PARENT qpn=").unwrap().parse().unwrap();
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 16, retry_cnt: 1, ..ConnectOptions::default() };
    b.qp.connect(900, &Endpoint { addr: A, qpn, psn: 100 }, &o).unwrap();
    let recv = |id: u64| b.qp.post_recv(vec![RecvWr { wr_id: id, sg_list: vec![b.mr.sge(64..128)] }]).unwrap();
    recv(1);
    println!("CHILD ready");
    std::io::stdout().flush().unwrap();
    let until_recv = || loop {
        let w = b.cq.poll(4).unwrap();
        assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
        if w.iter().any(|w| w.wr_id == 1) {
            return;
        }
    };
    until_recv();
    recv(1);
    b.qp.post_send(vec![SendWr::new(20, SendOp::Send, vec![b.mr.sge(0..64)])]).unwrap();
    // This poll returns the last SEND's receive with its ACK held back: gone at once, as a
    // program that exits after its last completion.
    until_recv();
    std::process::exit(0);
}

/// The progress thread of an application-driven device holds the acknowledgement of what it
/// received back for the application's next post when that application posted a moment ago
/// (ib_write_lat's shape: post, poll the completion, spin on memory the peer writes, post
/// again): the acknowledgement then leaves behind that post in one GSO send, and the peer's
/// poll finds both together. Once per post; and a program that does not post again has it sent
/// within the hold's bound (TX_DEFER), not after the requester's transport timer (4 s here).
/// The peer is a device-thread device: it acknowledges at once, alone, so that b's poll returns
/// at a's acknowledgement and b's progress thread, not its poll, receives a's WRITE.
#[test]
fn the_progress_thread_holds_an_acknowledgement_for_the_post_that_follows() {
    let mut ca = HcaConfig::new("hold0", A);
    ca.port = 47953;
    let da = Arc::new(Hca::start(ca).unwrap());
    let db = app_device("hold1", B, 47953, |c| c.gso = true);
    let (mut a, mut b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 20, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
    const FLAG: usize = 8192;
    // Spins until byte FLAG of `mr` is `v` (memory a peer's WRITE fills, as perftest spins).
    fn spin(mr: &MemoryRegion, v: u8) {
        let t0 = Instant::now();
        // SAFETY: the region is mapped for the test's life; the device writes it concurrently,
        // hence the volatile read.
        while unsafe { std::ptr::read_volatile(mr.as_slice().as_ptr().add(FLAG)) } != v {
            assert!(t0.elapsed() < T, "byte {FLAG} never became {v}");
            // (Yielding: with a's device thread spinning too, three busy threads share the
            // test machine's two CPUs.)
            std::thread::yield_now();
        }
    }
    // Writes `v` into byte FLAG of the peer's region and polls until the WRITE completes.
    fn write(s: &mut Side, peer: (u64, u32), v: u8, id: u64) {
        let off = 64 + id as usize % 64;
        s.mr.as_mut_slice()[off] = v;
        let op = SendOp::Write { remote_addr: peer.0 + FLAG as u64, rkey: peer.1 };
        s.qp.post_send(vec![SendWr::new(id, op, vec![s.mr.sge(off..off + 1)])]).unwrap();
        let w = one(&s.cq);
        assert_eq!((w.wr_id, w.status), (id, WcStatus::Success));
    }
    let (ra, rb) = ((a.mr.addr(), a.mr.rkey()), (b.mr.addr(), b.mr.rkey()));
    // Rounds until five acknowledgements left with b's next post (a quiet machine: nearly every
    // round; a loaded one lets the hold run out now and then), at most 2,000 rounds or 10 s.
    // Without the hold none ever does.
    let want = 5;
    let gso_before = db.counters().1.gso_sends;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let value = |i: u64| (i % 250 + 1) as u8;
    let stop_b = stop.clone();
    let pong = std::thread::spawn(move || {
        let mut i = 0;
        while !stop_b.load(std::sync::atomic::Ordering::SeqCst) {
            write(&mut b, ra, value(i), i);
            spin(&b.mr, value(i));
            i += 1;
        }
        b
    });
    let t0 = Instant::now();
    let mut i = 0;
    let merged = loop {
        spin(&a.mr, value(i));
        let merged = db.counters().1.gso_sends - gso_before;
        if merged >= want || i == 2000 || t0.elapsed() > Duration::from_secs(10) {
            break merged;
        }
        // b's poll has its completion by now and b spins on its memory; well within
        // HOLD_AFTER_POST of b's post.
        std::thread::sleep(Duration::from_micros(200));
        write(&mut a, rb, value(i), 5000 + i);
        i += 1;
    };
    assert!(merged >= want, "{merged} acknowledgements of {i} left with the next post");
    // b's last WRITE is in a's memory; a makes the last WRITE of the rounds, b's progress thread
    // holds its ACK for b's next post, and b stops without one: the ACK leaves within the
    // hold's bound all the same.
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let t0 = Instant::now();
    write(&mut a, rb, value(i), 5000 + i);
    assert!(t0.elapsed() < Duration::from_millis(500), "the held ACK waited {:?}", t0.elapsed());
    let b = pong.join().unwrap();
    // Once per post: b has not posted since, so nothing is held now.
    write(&mut a, rb, 99, 4999);
    assert_eq!(b.mr.as_slice()[FLAG], 99);
}

/// On an application-driven device (a provider's) ibv_post_send and ibv_post_recv go straight
/// into the engine: a list fails at the request the engine or the checks before it refuse, the
/// ones before it stay posted (libibverbs' bad_wr), ENOMEM once max_send_wr (max_recv_wr)
/// requests are outstanding (the peer QP here never answers: it stays in RESET, whose packets a
/// responder drops), EINVAL for a request with more SGEs than the QP has.
#[test]
fn application_driven_posts_fail_at_the_request_refused_and_keep_the_ones_before() {
    let dev = |name: &str, addr: IpAddr| app_device(name, addr, 47954, |_| {});
    let (da, db) = (dev("post0", A), dev("post1", B));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qa = a._pd.qp_builder(QpType::Rc, &a.cq).caps(caps).build().unwrap();
    let qb = b._pd.qp_builder(QpType::Rc, &b.cq).caps(caps).build().unwrap();
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 20, retry_cnt: 1, ..ConnectOptions::default() };
    qa.connect(1, &qb.endpoint(2), &o).unwrap();
    let send = |id: u64| SendWr::new(id, SendOp::Send, vec![a.mr.sge(0..64)]);
    let two_sges = SendWr::new(9, SendOp::Send, vec![a.mr.sge(0..64), a.mr.sge(64..128)]);
    match qa.post_send(vec![send(1), send(2), two_sges]) {
        Err(Error::Post { err: VerbsError::Inval, index: 2 }) => {}
        r => panic!("a request with two SGEs on a one-SGE QP: {r:?}"),
    }
    match qa.post_send(vec![send(3), send(4), send(5), send(6)]) {
        Err(Error::Post { err: VerbsError::NoMem, index: 2 }) => {}
        r => panic!("two requests past max_send_wr 4: {r:?}"),
    }
    assert!(matches!(qa.post_send(vec![send(7)]), Err(Error::Post { err: VerbsError::NoMem, index: 0 })));
    // Receives the same way (ibv_post_recv; max_recv_wr 4).
    let recv = |id: u64| RecvWr { wr_id: id, sg_list: vec![a.mr.sge(1024..1088)] };
    let two = RecvWr { wr_id: 19, sg_list: vec![a.mr.sge(1024..1088), a.mr.sge(2048..2112)] };
    match qa.post_recv(vec![recv(11), two, recv(12)]) {
        Err(Error::Post { err: VerbsError::Inval, index: 1 }) => {}
        r => panic!("a receive with two SGEs on a one-SGE QP: {r:?}"),
    }
    match qa.post_recv(vec![recv(13), recv(14), recv(15), recv(16)]) {
        Err(Error::Post { err: VerbsError::NoMem, index: 3 }) => {}
        r => panic!("a receive past max_recv_wr 4: {r:?}"),
    }
    // The four posted sends and four receives are outstanding: they flush when the QP goes to
    // ERR, each queue in order, with the application's own wr_ids.
    qa.modify(&QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    let got: Vec<(u64, WcStatus)> = a.cq.wait(8, T).unwrap().iter().map(|w| (w.wr_id, w.status)).collect();
    let sends: Vec<u64> = got.iter().filter(|w| w.0 < 10).map(|w| w.0).collect();
    let recvs: Vec<u64> = got.iter().filter(|w| w.0 >= 10).map(|w| w.0).collect();
    assert_eq!((sends, recvs), (vec![1, 2, 3, 4], vec![11, 13, 14, 15]), "{got:?}");
    assert!(got.iter().all(|w| w.1 == WcStatus::WrFlushErr), "{got:?}");
    // The refused ones never complete.
    std::thread::sleep(Duration::from_millis(20));
    assert!(a.cq.poll(16).unwrap().is_empty());
}

/// The count of armed CQs that lets a progress thread keep looking while the application sleeps
/// on a channel (`Hca::armed_cqs`): arming counts once however often it is repeated, the event
/// disarms, and a CQ destroyed armed, or one of a context that goes, no longer counts. A count
/// left too high would keep a progress thread spinning after every packet for good; one that
/// went below zero would panic the device.
#[test]
fn armed_cqs_are_counted_from_arming_to_event_or_destroy() {
    let dev = |name: &str, addr: IpAddr| app_device(name, addr, 47959, |c| c.seed = Some(47959));
    let (da, db) = (dev("arm0", A), dev("arm1", B));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, ..ConnectOptions::default() };
    let ch = b._ctx.create_comp_channel().unwrap();
    let cq = b._ctx.create_cq(16, Some(&ch)).unwrap();
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qb = b._pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
    let qa = a._pd.qp_builder(QpType::Rc, &a.cq).caps(caps).build().unwrap();
    qa.connect(1, &qb.endpoint(2), &o).unwrap();
    qb.connect(2, &qa.endpoint(1), &o).unwrap();
    assert_eq!(db.armed_cqs(), 0);
    cq.req_notify(false).unwrap();
    cq.req_notify(true).unwrap();
    assert_eq!(db.armed_cqs(), 1, "arming twice counts once");
    // A second armed CQ on the same channel, and one on a CQ without a channel is refused.
    let cq2 = b._ctx.create_cq(16, Some(&ch)).unwrap();
    cq2.req_notify(false).unwrap();
    assert_eq!(db.armed_cqs(), 2);
    assert!(b.cq.req_notify(false).is_err());
    assert_eq!(db.armed_cqs(), 2);
    // The event for a SEND disarms cq (solicited-only arming: a's SEND is solicited).
    qb.post_recv(vec![RecvWr { wr_id: 7, sg_list: vec![b.mr.sge(0..64)] }]).unwrap();
    let mut wr = SendWr::new(8, SendOp::Send, vec![a.mr.sge(0..64)]);
    wr.solicited = true;
    qa.post_send(vec![wr]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(ch.get_cq_event(Some(T)).unwrap(), Some(cq.id()));
    assert_eq!(one(&cq).wr_id, 7);
    assert_eq!(db.armed_cqs(), 1, "cq's event disarmed it; cq2 stays armed");
    // cq2 destroyed while armed.
    drop(cq2);
    assert_eq!(db.armed_cqs(), 0);
    // Armed again, then the whole context goes (its process's cleanup).
    cq.req_notify(false).unwrap();
    assert_eq!(db.armed_cqs(), 1);
    drop((qb, cq, ch, b));
    let t0 = Instant::now();
    while db.armed_cqs() != 0 && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(db.armed_cqs(), 0, "a departed context's armed CQ still counted");
}

/// The poll that closes the race between arming a CQ and sleeping on its channel
/// (ibv_req_notify_cq(3): arm, poll once more, then wait) reads the socket but does not take it
/// from the progress thread: its thread sleeps next. With a handoff that would last 60 s, a
/// taken socket would leave a's WRITEs unanswered (retry_cnt 1, a 67 ms timer: RETRY_EXC_ERR)
/// and a's SEND would never wake the sleeper. Three rounds, the sleeper arming and polling
/// before each.
#[test]
fn the_poll_after_arming_leaves_the_socket_to_the_progress_thread() {
    let dev = |name: &str, addr: IpAddr| {
        app_device(name, addr, 47960, |c| {
            c.seed = Some(47960);
            c.handoff_idle = Duration::from_secs(60);
        })
    };
    let (da, db) = (dev("armpoll0", A), dev("armpoll1", B));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    let ch = b._ctx.create_comp_channel().unwrap();
    let cq = b._ctx.create_cq(16, Some(&ch)).unwrap();
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qb = b._pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
    let qa = a._pd.qp_builder(QpType::Rc, &a.cq).caps(caps).build().unwrap();
    qa.connect(1, &qb.endpoint(2), &o).unwrap();
    qb.connect(2, &qa.endpoint(1), &o).unwrap();
    let (cq, ch) = (Arc::new(cq), Arc::new(ch));
    for round in 0..3u64 {
        qb.post_recv(vec![RecvWr { wr_id: 10 + round, sg_list: vec![b.mr.sge(0..64)] }]).unwrap();
        cq.req_notify(false).unwrap();
        assert!(cq.poll(4).unwrap().is_empty());
        let (cq2, ch2) = (cq.clone(), ch.clone());
        let sleeper = std::thread::spawn(move || {
            let got = ch2.get_cq_event(Some(T)).unwrap();
            let w = cq2.poll(4).unwrap();
            (got.is_some(), w.first().map(|w| (w.wr_id, w.status)))
        });
        std::thread::sleep(Duration::from_millis(20));
        // b's application only sleeps: its progress thread answers the WRITE.
        let data = pattern(8192, round as u8);
        a.mr.as_mut_slice()[..data.len()].copy_from_slice(&data);
        let wr = SendOp::Write { remote_addr: b.mr.addr() + 4096, rkey: b.mr.rkey() };
        qa.post_send(vec![SendWr::new(20 + round, wr, vec![a.mr.sge(0..data.len())])]).unwrap();
        let w = one(&a.cq);
        assert_eq!((w.wr_id, w.status), (20 + round, WcStatus::Success), "round {round}");
        assert_eq!(&b.mr.as_slice()[4096..4096 + data.len()], &data[..]);
        // And wakes the sleeper for a SEND.
        qa.post_send(vec![SendWr::new(30 + round, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
        let w = one(&a.cq);
        assert_eq!((w.wr_id, w.status), (30 + round, WcStatus::Success), "round {round}");
        assert_eq!(sleeper.join().unwrap(), (true, Some((10 + round, WcStatus::Success))), "round {round}");
    }
}

/// A progress thread whose application makes no call (it sleeps elsewhere, as the target of
/// ib_write_bw does) goes on looking at the socket after the work it found, instead of sleeping
/// in poll until the peer's next burst wakes it; one whose application keeps calling (here it
/// posts receives) sleeps after its work: its calls come, and on two cores a third busy thread
/// would only preempt the application's. Counted in `progress_looks` (no CQ is armed here).
#[test]
fn a_progress_thread_keeps_looking_while_its_application_makes_no_call() {
    // A long window (the default is 10 ms), so that a busy machine's scheduler cannot make b's
    // calls look far apart.
    let dev = |name: &str, addr: IpAddr| {
        app_device(name, addr, 47966, |c| {
            c.seed = Some(47966);
            c.idle_look_after = Duration::from_millis(300);
        })
    };
    let (da, db) = (dev("idle0", A), dev("idle1", B));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    let looks = || db.counters().1.progress_looks;
    let write = |id: u64| {
        let wr = SendWr::new(
            id,
            SendOp::Write { remote_addr: b.mr.addr() + 4096, rkey: b.mr.rkey() },
            vec![a.mr.sge(0..256)],
        );
        a.qp.post_send(vec![wr]).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
    };
    // b's application calls every millisecond: its progress thread answers each WRITE and
    // sleeps.
    let before = looks();
    for i in 0..20 {
        b.qp.post_recv(vec![RecvWr { wr_id: i, sg_list: vec![b.mr.sge(0..64)] }]).unwrap();
        write(i);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(looks(), before, "the progress thread kept looking while its application called");
    // b's application makes no call: each WRITE (a burst 400 ms apart) has the progress thread
    // looking after it.
    for i in 0..3 {
        std::thread::sleep(Duration::from_millis(400));
        write(100 + i);
    }
    assert!(looks() >= before + 3, "looks after work for an application without calls: {}", looks() - before);
}

/// A thread that posts a stream (each post follows a post, and its QP still waits for the
/// answer to what it sent before) takes the socket with those posts, as its polls would: the
/// answers to the stream (its ACKs) wait in the socket for that thread's next poll instead of
/// waking the progress thread, which then took the state's lock from under the posts
/// (`Hca::drive_post`). b delays every packet it sends by 5 ms, so that a's posts all find the
/// first SEND unacknowledged and a's ACKs arrive while a's thread sleeps; the handoff lasts 60 s
/// here. Then a thread that stops after its stream still has its peer's WRITE served and its
/// sends completed with the default handoff (the progress thread takes the socket back: a's
/// retry_cnt 1 with a 67 ms timer would otherwise end in RETRY_EXC_ERR).
#[test]
fn a_stream_poster_reads_the_answers_to_its_stream_itself() {
    let dev = |name: &str, addr: IpAddr, port: u16, idle: Duration, faults: &str| {
        app_device(name, addr, port, |c| {
            c.seed = Some(port as u64);
            c.handoff_idle = idle;
            c.faults = faults.parse().unwrap();
        })
    };
    let long = Duration::from_secs(60);
    let (da, db) = (dev("stream0", A, 47973, long, ""), dev("stream1", B, 47973, long, "delay=5ms"));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
    let n = 16u64;
    b.qp.post_recv((0..n).map(|i| RecvWr { wr_id: i, sg_list: vec![b.mr.sge(0..64)] }).collect()).unwrap();
    let read_by_progress = || da.counters().1.progress_rcvd;
    let before = read_by_progress();
    for i in 0..n {
        a.qp.post_send(vec![SendWr::new(100 + i, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    }
    // The first SEND's ACK comes back after ~5 ms, the rest's after another ~5 ms.
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(read_by_progress(), before, "the progress thread read the answers to a's stream");
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < n as usize {
        for w in a.cq.poll(16).unwrap() {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            got.push(w.wr_id);
        }
        assert!(t0.elapsed() < T, "{got:?}");
    }
    assert_eq!(got, (100..100 + n).collect::<Vec<_>>());
    drop((a, b));

    // With the default handoff: c streams SENDs to d, then makes no call at all; d WRITEs into
    // c's memory and reads it back.
    let (dc, dd) = (dev("stream2", A, 47974, HANDOFF_IDLE, ""), dev("stream3", B, 47974, HANDOFF_IDLE, ""));
    let (c, mut d) = (side(&dc, QpType::Rc), side(&dd, QpType::Rc));
    c.qp.connect(100, &d.qp.endpoint(900), &o).unwrap();
    d.qp.connect(900, &c.qp.endpoint(100), &o).unwrap();
    d.qp.post_recv((0..n).map(|i| RecvWr { wr_id: i, sg_list: vec![d.mr.sge(0..64)] }).collect()).unwrap();
    for i in 0..n {
        c.qp.post_send(vec![SendWr::new(200 + i, SendOp::Send, vec![c.mr.sge(0..64)])]).unwrap();
    }
    let data = pattern(4096, 7);
    d.mr.as_mut_slice()[8192..8192 + data.len()].copy_from_slice(&data);
    let wr = SendOp::Write { remote_addr: c.mr.addr() + 65536, rkey: c.mr.rkey() };
    d.qp.post_send(vec![SendWr::new(300, wr, vec![d.mr.sge(8192..8192 + data.len())])]).unwrap();
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < n as usize + 1 {
        for w in d.cq.poll(16).unwrap() {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            got.push(w.wr_id);
        }
        assert!(t0.elapsed() < T, "{got:?}");
    }
    assert!(got.contains(&300), "{got:?}");
    assert_eq!(&c.mr.as_slice()[65536..65536 + data.len()], &data[..]);
    // c's sends are acknowledged while c makes no call: its progress thread reads the ACKs.
    // Had nobody read them, c's retransmission timer (67 ms, retry_cnt 1) would have ended
    // them in RETRY_EXC_ERR within these 400 ms. d may hold the last ACK for a while after its
    // poll returned the messages (`the_progress_thread_holds_an_acknowledgement_for_the_post_
    // that_follows`), so the completions are collected until all are in, each a success.
    std::thread::sleep(Duration::from_millis(400));
    let mut done = Vec::new();
    let t0 = Instant::now();
    while done.len() < n as usize {
        for w in c.cq.poll(32).unwrap() {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            done.push(w.wr_id);
        }
        assert!(t0.elapsed() < T, "{done:?}");
    }
    assert_eq!(done, (200..200 + n).collect::<Vec<_>>());
}

/// A stream's receiver (each poll returns a message, and it posts no send) keeps the socket
/// across its polls (`Hca::end_handoff_after_poll`): one handoff for the stream, where each
/// poll that returned a message used to end it (an `epoll_ctl`) and the next empty poll took it
/// again (another). The first message after a pause still ends it, as
/// `application_driven_polls_hand_the_socket_back` needs: the program may then spin on memory.
/// Here the handoff's idle end is 60 s and the SENDs come every millisecond.
#[test]
fn a_stream_receiver_keeps_the_socket_across_its_polls() {
    let dev = |name: &str, addr: IpAddr| {
        app_device(name, addr, 47975, |c| {
            c.seed = Some(47975);
            c.handoff_idle = Duration::from_secs(60);
        })
    };
    let (da, db) = (dev("keep0", A), dev("keep1", B));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    let n = 16u64;
    b.qp.post_recv((0..n).map(|i| RecvWr { wr_id: i, sg_list: vec![b.mr.sge(0..64)] }).collect()).unwrap();
    let handoffs = || db.counters().1.handoffs;
    let before = handoffs();
    let receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        let t0 = Instant::now();
        while got.len() < n as usize {
            for w in b.cq.poll(4).unwrap() {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                got.push(w.wr_id);
            }
            assert!(t0.elapsed() < T, "{got:?}");
        }
        (b, got)
    });
    for i in 0..n {
        std::thread::sleep(Duration::from_millis(1));
        a.qp.post_send(vec![SendWr::new(100 + i, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
    }
    let (_b, got) = receiver.join().unwrap();
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    // The first poll takes the socket, the first message ends the handoff, the next poll takes
    // it again for the rest of the stream.
    let took = handoffs() - before;
    assert!(took <= 3, "{took} handoffs for a stream of {n} messages");
}
