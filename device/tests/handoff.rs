//! The handoff of an application-driven device's socket (`Progress::Application`, a
//! provider's device): a thread whose poll found nothing reads the socket itself and the progress
//! thread keeps off it, until the handoff ends (a poll that returned completions, an armed CQ,
//! `handoff_idle`); the progress thread's own looking while its application makes no call;
//! streams of posts and of receives.
//!
//! Each test uses its own UDP port so tests can run in parallel.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_device::hca::{Hca, HANDOFF_IDLE};
use softrdma_device::verbs::*;

mod common;
use common::*;

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
    let (da, db) = app_pair(("later0", "later1"), 47957, |c| c.handoff_idle = Duration::from_secs(60));
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
            let got = poll_successes_until(&b.cq, 4, &format!("round {round}"), |g| g.contains(&(20 + round)));
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
        let what = format!("round {round}");
        wait_successes_until(&a.cq, &mut got, &what, |g| g.contains(&(50 + round)));
        assert_eq!(&b.mr.as_slice()[4096..4096 + data.len()], &data[..]);
        // The rest of the round: a's receive of b's SEND, a's SEND.
        wait_successes_until(&a.cq, &mut got, &what, |g| g.contains(&(10 + round)) && g.contains(&(40 + round)));
        assert_eq!(got_b, [20 + round], "round {round}");
    }
}

/// The count of armed CQs that lets a progress thread keep looking while the application sleeps
/// on a channel (`Hca::armed_cqs`): arming counts once however often it is repeated, the event
/// disarms, and a CQ destroyed armed, or one of a context that goes, no longer counts. A count
/// left too high would keep a progress thread spinning after every packet for good; one that
/// went below zero would panic the device.
#[test]
fn armed_cqs_are_counted_from_arming_to_event_or_destroy() {
    let (da, db) = app_pair(("arm0", "arm1"), 47959, |_| {});
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, ..ConnectOptions::default() };
    let ChannelPair { ch, cq, qa, qb } = channel_pair(&a, &b, &o);
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
    let (da, db) = app_pair(("armpoll0", "armpoll1"), 47960, |c| c.handoff_idle = Duration::from_secs(60));
    let (mut a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 14, retry_cnt: 1, ..ConnectOptions::default() };
    let ChannelPair { ch, cq, qa, qb } = channel_pair(&a, &b, &o);
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
    let (da, db) = app_pair(("idle0", "idle1"), 47966, |c| c.idle_look_after = Duration::from_millis(300));
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
    assert_eq!(successes(&a.cq, n as usize, 16), (100..100 + n).collect::<Vec<_>>());
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
    let got = successes(&d.cq, n as usize + 1, 16);
    assert!(got.contains(&300), "{got:?}");
    assert_eq!(&c.mr.as_slice()[65536..65536 + data.len()], &data[..]);
    // c's sends are acknowledged while c makes no call: its progress thread reads the ACKs.
    // Had nobody read them, c's retransmission timer (67 ms, retry_cnt 1) would have ended
    // them in RETRY_EXC_ERR within these 400 ms. d may hold the last ACK for a while after its
    // poll returned the messages (`the_progress_thread_holds_an_acknowledgement_for_the_post_
    // that_follows`), so the completions are collected until all are in, each a success.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(successes(&c.cq, n as usize, 32), (200..200 + n).collect::<Vec<_>>());
}

/// A stream's receiver (each poll returns a message, and it posts no send) keeps the socket
/// across its polls (`Hca::end_handoff_after_poll`): one handoff for the stream, where each
/// poll that returned a message used to end it (an `epoll_ctl`) and the next empty poll took it
/// again (another). The first message after a pause still ends it, as
/// `application_driven_polls_hand_the_socket_back` needs: the program may then spin on memory.
/// Here the handoff's idle end is 60 s and the SENDs come every millisecond.
#[test]
fn a_stream_receiver_keeps_the_socket_across_its_polls() {
    let (da, db) = app_pair(("keep0", "keep1"), 47975, |c| c.handoff_idle = Duration::from_secs(60));
    let (a, b) = (side(&da, QpType::Rc), side(&db, QpType::Rc));
    connect(&a, &b, Mtu::Mtu1024);
    let n = 16u64;
    b.qp.post_recv((0..n).map(|i| RecvWr { wr_id: i, sg_list: vec![b.mr.sge(0..64)] }).collect()).unwrap();
    let handoffs = || db.counters().1.handoffs;
    let before = handoffs();
    let receiver = std::thread::spawn(move || {
        let got = successes(&b.cq, n as usize, 4);
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
