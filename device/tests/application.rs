//! Devices that the application's own calls drive (`Progress::Application`, a provider's
//! device): one-sided targets and channel sleepers served without calls, resends while the
//! application sleeps, memory made inaccessible under a target, posts refused by the engine.
//! Who reads the socket when is in handoff.rs; answers held back by a poll in held_back.rs.
//!
//! Each test uses its own UDP port so tests can run in parallel.

use std::net::IpAddr;
use std::time::Duration;

use softrdma_device::verbs::*;

mod common;
use common::*;

/// Devices that the application's calls drive (`Progress::Application`): the target of one-sided
/// work makes no call at all, yet its progress thread answers WRITEs, READs and atomics in time
/// (they would otherwise wait for the requester's retransmission timer and fail after retries);
/// a thread asleep on a completion channel wakes for a SEND; and the requester's own calls move
/// its work.
#[test]
fn application_driven_devices_serve_one_sided_targets_and_channel_sleepers_without_calls() {
    let (da, db) = app_pair(("app0", "app1"), 47936, |_| {});
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

/// As above, but the thread that sleeps on the completion channel went to sleep before another
/// thread posted (rping's shape: its CQ thread sleeps, its main thread posts). The sleeper waits
/// on the device's socket itself (`Hca::sleep_on_channel`), so the socket stays handed off while
/// it sleeps; the transport timer that post armed must still run (the progress thread's, since
/// the sleeper's wait was set before the timer existed), or a lost send is never resent.
#[test]
fn sends_posted_while_another_thread_sleeps_on_the_channel_are_resent() {
    let dev = |name: &str, addr: IpAddr, faults: &str| {
        app_device(name, addr, 47941, |c| {
            c.seed = Some(47941);
            c.faults = faults.parse().unwrap();
        })
    };
    let (da, db) = (dev("sleep0", A, "loss=0.3"), dev("sleep1", B, ""));
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
        let event = std::thread::scope(|s| {
            let sleeper = s.spawn(|| ch.get_cq_event(Some(Duration::from_secs(10))));
            // Let the sleeper be asleep (its wait set without any timer) before the post.
            std::thread::sleep(Duration::from_millis(20));
            qa.post_send(vec![SendWr::new(i, SendOp::Send, vec![mr.sge(0..64)])]).unwrap();
            sleeper.join().unwrap().unwrap()
        });
        assert!(event.is_some(), "send {i} never completed");
        let w = cq.poll(4).unwrap();
        assert_eq!(w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(i, WcStatus::Success)]);
        assert_eq!(one(&b.cq).status, WcStatus::Success);
    }
    let (_, _, faults) = da.counters();
    assert!(faults.dropped > 0, "no send was lost (seeded loss 0.3 over 10 sends)");
}

/// A thread asleep in `ibv_get_cq_event` on an application-driven device (it waits on the
/// device's socket too, in poll(2), which the kernel never restarts) keeps waiting through a
/// signal whose handler has SA_RESTART and returns EINTR for one whose handler has not, as a
/// read(2) of the kernel's channel fd does (signal(7)): qperf ends each test from its SIGALRM
/// handler and expects the call to return.
#[test]
fn a_channel_sleep_restarts_or_ends_with_eintr_as_the_handler_asks() {
    extern "C" fn noop(_: libc::c_int) {}
    let install = |flags: libc::c_int| {
        // SAFETY: sigaction(2) with a handler that does nothing, for the whole test process.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = noop as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = flags;
        assert_eq!(unsafe { libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()) }, 0);
    };
    install(libc::SA_RESTART);
    let (da, _db) = app_pair(("intr0", "intr1"), 47943, |_| {});
    let ctx = Context::embedded(&da).unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&ch)).unwrap();
    cq.req_notify(false).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let sleeper = std::thread::spawn(move || {
        let r = ch.get_cq_event(None);
        let _ = tx.send(format!("{r:?}"));
        ch
    });
    use std::os::unix::thread::JoinHandleExt;
    let t = sleeper.as_pthread_t();
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: the thread is alive (it returns only after sending on `tx`, which is not yet).
    unsafe { libc::pthread_kill(t, libc::SIGUSR2) };
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "a restarting handler ended the wait");
    install(0);
    let mut got = None;
    for _ in 0..100 {
        // SAFETY: as above, until the thread has sent its result.
        unsafe { libc::pthread_kill(t, libc::SIGUSR2) };
        if let Ok(r) = rx.recv_timeout(Duration::from_millis(100)) {
            got = Some(r);
            break;
        }
    }
    let got = got.expect("the wait did not end for a handler without SA_RESTART");
    assert!(got.contains("Intr"), "{got}");
    drop(sleeper.join().unwrap());
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
    let (da, db) = app_pair(("inacc0", "inacc1"), 47938, |_| {});
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
    let (da, db) = app_pair(("rinacc0", "rinacc1"), 47967, |_| {});
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
