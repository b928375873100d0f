//! Answers held back by an application-driven device (`Progress::Application`, a provider's
//! device): a poll returns its completions before the ACKs leave, which go with the next post or
//! soon after; the progress thread holds an acknowledgement for the post that follows; process
//! exit sends what is held.
//!
//! Each test uses its own UDP port so tests can run in parallel.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_device::hca::{Hca, HcaConfig};
use softrdma_device::verbs::*;

mod common;
use common::*;

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
    let resent = da.counters().0.retransmitted_pkts;
    send(&a, 8);
    let w = one(&a.cq);
    assert_eq!((w.wr_id, w.status), (8, WcStatus::Success));
    // Acknowledged by b's first ACK, not after a's transport timer sent the SEND again.
    assert_eq!(da.counters().0.retransmitted_pkts, resent, "the ACK waited for a retransmission");
    drop(poller.join().unwrap());
    // 3. The ACK alone, with a handoff that only ends with a completion (so that its own idle
    // check does not send the ACK): d's progress thread sends it (how soon is its sleep's
    // choice, tested in `hca::progress`: 200 us while answers are owed), before c's transport
    // timer would send the SEND again.
    let dev0 = |name: &str, addr: IpAddr| app_device(name, addr, 47946, |c| c.handoff_idle = Duration::from_secs(60));
    let (dc, dd) = (dev0("defer2", A), dev0("defer3", B));
    let (c, mut d) = (side(&dc, QpType::Rc), side(&dd, QpType::Rc));
    c.qp.connect(100, &d.qp.endpoint(900), &o).unwrap();
    d.qp.connect(900, &c.qp.endpoint(100), &o).unwrap();
    let resent = dc.counters().0.retransmitted_pkts;
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
        send(&c, 10 + i);
        loop {
            let w = one(&c.cq);
            assert_eq!(w.status, WcStatus::Success);
            if w.wr_id == 10 + i {
                break;
            }
        }
        d = poller.join().unwrap();
    }
    assert_eq!(dc.counters().0.retransmitted_pkts, resent, "an ACK waited for a retransmission");
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
    wait_successes_until(&a.cq, &mut got, "the child's answer", |g| g.contains(&1));
    send(12);
    let t0 = Instant::now();
    wait_successes_until(&a.cq, &mut got, "the last SEND's ACK never came", |g| g.contains(&12));
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
/// within the hold's bound (HELD_ANSWER_WAIT), not after the requester's transport timer (4 s here).
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
    let resent = da.counters().0.retransmitted_pkts;
    write(&mut a, rb, value(i), 5000 + i);
    assert_eq!(da.counters().0.retransmitted_pkts, resent, "the held ACK waited for a retransmission");
    let b = pong.join().unwrap();
    // Once per post: b has not posted since, so nothing is held now.
    write(&mut a, rb, 99, 4999);
    assert_eq!(b.mr.as_slice()[FLAG], 99);
}
