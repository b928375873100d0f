//! The requester's window and ACKs: coalesced ACKs with their credit code, the PSNs kept
//! unacknowledged, one rewind per NAK, the window after a loss or an RNR NAK, probes of a window
//! whose ACKs or last packet were lost (IBTA Vol 1 9.7.5).

use super::*;

#[test]
fn acks_are_coalesced_with_the_invalid_credit_code() {
    use softrdma_engine::device::RecvMeta;
    let (mut p, a, b) = setup(RcOptions::default());
    for i in 0..8 {
        send(&mut p, &a, i, SendOp::Write { remote_addr: BASE, rkey: b.mr.rkey }, BASE, 16);
    }
    // B takes all eight requests before it gets to send: one ACK answers them all.
    let mut buf = vec![0u8; 8192];
    let now = p.now;
    let mut reqs = Vec::new();
    while let Some(t) = p.a.poll_transmit(now, &mut buf) {
        reqs.push((t.src_port, buf[..t.len].to_vec()));
    }
    assert_eq!(reqs.len(), 8);
    for (port, r) in &reqs {
        p.b.handle_packet(
            now,
            RecvMeta { src: softrdma_conformance::pair::ADDR_A, src_port: *port, ip_id: None, dst: None },
            r,
        );
    }
    let mut acks = Vec::new();
    while let Some(t) = p.b.poll_transmit(now, &mut buf) {
        acks.push((t.src_port, buf[..t.len].to_vec()));
    }
    assert_eq!(acks.len(), 1, "one coalesced ACK");
    let ack = softrdma_engine::wire::IbPacket::new_checked(&acks[0].1[..]).unwrap();
    assert_eq!(ack.bth().psn(), Psn::new(107), "it acknowledges the last PSN");
    // Credit code 0x1F, "no credit information", as rxe sends (documented choice).
    assert_eq!(ack.aeth().unwrap().syndrome_byte(), 0x1f);
    for (port, a_ack) in &acks {
        p.a.handle_packet(
            now,
            RecvMeta { src: softrdma_conformance::pair::ADDR_B, src_port: *port, ip_id: None, dst: None },
            a_ack,
        );
    }
    assert_eq!(p.poll(A, a.cq).len(), 8);
}

/// The WRITE of [`big_write`]: 1 MiB, PSNs 100..1123 at MTU 1024.
const BIG_WRITE_LEN: usize = 1 << 20;
/// Where the WRITE of [`big_write`] goes in B's memory.
const BIG_WRITE_TARGET: u64 = BASE + 0x20_0000;

/// A pair (ACK timeout 20: 4.3 s) whose A holds `pattern(BIG_WRITE_LEN, seed)` at `BASE`, for a
/// [`send_big_write`]; the pattern is returned for [`check_big_write`].
fn big_write(seed: u8) -> (Pair, Side, Side, Vec<u8>) {
    let (mut p, a, b) = setup(RcOptions { timeout: 20, ..RcOptions::default() });
    let msg = pattern(BIG_WRITE_LEN, seed);
    p.fill(A, BASE, &msg);
    (p, a, b, msg)
}

/// Posts the 1 MiB WRITE of A's pattern to `BIG_WRITE_TARGET` at B.
fn send_big_write(p: &mut Pair, a: &Side, b: &Side) {
    let op = SendOp::Write { remote_addr: BIG_WRITE_TARGET, rkey: b.mr.rkey };
    send(p, a, 1, op, BASE, BIG_WRITE_LEN as u32);
}

/// The 1 MiB WRITE completed successfully and B holds `msg`.
fn check_big_write(p: &mut Pair, a: &Side, msg: &[u8]) {
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
    assert_eq!(p.read(B, BIG_WRITE_TARGET, BIG_WRITE_LEN), msg);
}

/// After a repair of losses: A received `seq_naks` PSN sequence NAKs (`what` says which) and went
/// back `go_backs` times (counting the implicit NAKs), no ACK timeout expired, and the last
/// packet went out within 100 ms, long before the 4.3 s ACK timer.
fn check_repaired_without_ack_timeout(p: &Pair, seq_naks: u64, what: &str, go_backs: u64) {
    let c = p.a.counters();
    assert_eq!(c.rcvd_seq_err, seq_naks, "{what}");
    assert_eq!(c.local_ack_timeout_err, 0, "no ACK timeout: {c:?}");
    assert_eq!(c.completer_retry_err, go_backs);
    let last = p.log.last().unwrap().at;
    assert!(last.as_nanos() < 100_000_000, "done at {last}, not after the 4.3 s ACK timer");
}

#[test]
fn requester_keeps_at_most_its_window_of_psns_unacknowledged() {
    // IBTA leaves the bound to the implementation; the device keeps MAX_UNACKED_PSNS (256,
    // twice rxe's RXE_MAX_UNACKED_PSNS: BENCHMARKS.md, "The window"): a 1 MiB WRITE (1024
    // packets at MTU 1024) whose ACKs are lost goes out that many packets at a time, the last
    // of them asking for an ACK, and no further until an ACK arrives.
    let w = MAX_UNACKED_PSNS;
    let (mut p, a, b, msg) = big_write(9);
    let acks_lost = std::rc::Rc::new(std::cell::Cell::new(true));
    let lost = acks_lost.clone();
    p.set_filter(move |s| if s.from == B && lost.get() { Fate::Drop } else { Fate::Deliver });
    send_big_write(&mut p, &a, &b);
    // Until the first ACK timeout has resent (since issue 21 it resends from the oldest PSN in a
    // window of 8, so a fixed number of steps would now cover more timeouts than retry_cnt).
    for _ in 0..600 {
        if !p.step() || p.a.counters().retransmitted_pkts > 0 {
            break;
        }
    }
    p.step();
    let first = Psn::new(100);
    let sent_a: Vec<_> = p.log.iter().filter(|s| s.from == A).collect();
    let highest = sent_a.iter().map(|s| s.psn.distance(first)).max().unwrap();
    assert_eq!(highest, w - 1, "exactly the window went out, and nothing beyond it");
    assert!(
        sent_a.iter().any(|s| s.psn == first + (w - 1) as u32 && s.ack_req),
        "the window's last packet asks for an ACK"
    );
    let resent = p.a.counters().retransmitted_pkts;
    assert!(resent > 0, "the ACK timer resent from the oldest PSN");
    // Issue 21: after a timeout, go-back-N resends a small window (8 PSNs) until an ACK says
    // what the responder has, not the whole window again.
    assert_eq!(resent, 8, "the timeout's resend");
    assert!(sent_a.last().is_some_and(|s| s.psn == first + 7 && s.ack_req), "the small window asks for an ACK");
    acks_lost.set(false);
    p.drive(STEPS);
    check_big_write(&mut p, &a, &msg);
}

#[test]
fn a_second_psn_sequence_nak_for_the_same_psn_does_not_rewind_again() {
    // IBTA 9.7.5.1.2: the responder NAKs a sequence error once; 9.7.5.2: the requester goes back
    // to the NAKed PSN. A copy of that NAK (the network duplicated it) arriving after the first
    // was acted on must not send the window a second time (issue 21). A 16 KiB WRITE (PSNs
    // 100..115 at MTU 1024) loses PSN 101 once; B's NAK is duplicated.
    let (mut p, a, b) = setup(RcOptions { mtu: Mtu::Mtu1024, ..RcOptions::default() });
    let len = 16 * 1024;
    let msg = pattern(len, 11);
    p.fill(A, BASE, &msg);
    let (mut lost, mut duplicated) = (false, false);
    p.set_filter(move |s| {
        if s.from == A && s.psn == Psn::new(101) && !lost {
            lost = true;
            Fate::Drop
        } else if s.from == B && s.syndrome == Some(0x60) && !duplicated {
            duplicated = true;
            Fate::Duplicate
        } else {
            Fate::Deliver
        }
    });
    let target = BASE + 0x10_0000;
    send(&mut p, &a, 1, SendOp::Write { remote_addr: target, rkey: b.mr.rkey }, BASE, len as u32);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
    assert_eq!(p.read(B, target, len), msg);
    assert_eq!(p.a.counters().rcvd_seq_err, 2, "both copies of the NAK arrived");
    // One go-back from 101: PSNs 101..115 once more, nothing a third time.
    assert_eq!(p.a.counters().completer_retry_err, 1, "one rewind");
    assert_eq!(p.a.counters().retransmitted_pkts, 15);
    for psn in 101..116 {
        let n = p.log.iter().filter(|s| s.from == A && s.psn == Psn::new(psn)).count();
        assert_eq!(n, 2, "PSN {psn} sent {n} times");
    }
}

#[test]
fn the_window_in_flight_halves_with_each_loss_so_a_loss_resends_less() {
    // Go-back-N (IBTA 9.7.5.1.2, 9.7.5.2) resends every packet sent after a lost one; how many
    // that is depends on how many the requester keeps unacknowledged, which IBTA leaves to it
    // (9.7.7.2 bounds only SENDs by credits). The window starts at MAX_UNACKED_PSNS (256) and
    // halves with each loss (issue 21): a 1 MiB WRITE (1024 packets at MTU 1024) losing four
    // packets far apart (each sent first after the go-back before it) resends at most 256, 128, 64 and 32 packets for them (plus the window's
    // additive growth between losses, at most 200 / 8 = 25 PSNs each), where a fixed window
    // resends up to 255 for each.
    let (mut p, a, b, msg) = big_write(13);
    let first = Psn::new(100);
    let mut dropped = Vec::new();
    p.set_filter(move |s| {
        let d = s.psn.distance(first);
        if s.from == A && [200, 450, 650, 850].contains(&d) && !dropped.contains(&d) {
            dropped.push(d);
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    send_big_write(&mut p, &a, &b);
    p.drive(STEPS);
    check_big_write(&mut p, &a, &msg);
    assert_eq!(p.a.counters().rcvd_seq_err, 4, "each loss was NAKed");
    let resent = p.a.counters().retransmitted_pkts;
    let w = MAX_UNACKED_PSNS as u64;
    assert!(resent <= w + w / 2 + w / 4 + w / 8 + 4 * 25, "{resent} packets resent for 4 losses");
    assert!(w + w / 2 + w / 4 + w / 8 + 4 * 25 < 4 * (w - 1), "the bound tells halving from a fixed window");
    // No ACK timeout was needed: every loss was repaired by its NAK.
    assert_eq!(p.a.counters().completer_retry_err, 4);
}

/// A 1 MiB WRITE (PSNs 100..1123 at MTU 1024) that loses PSN 200 once, so the window halves to
/// MAX_UNACKED_PSNS / 2 (128) PSNs, resent as 200..327 with AckReq on 263 and 327; then
/// `after_nak` decides the fate of B's packets after its sequence NAK. Returns the pair when the
/// WRITE has completed, checked.
fn window_stall(after_nak: impl FnMut(&softrdma_conformance::pair::Seen) -> Fate + 'static) -> Pair {
    let (mut p, a, b, msg) = big_write(17);
    let first = Psn::new(100);
    let (mut lost, mut naked) = (false, false);
    let mut after_nak = after_nak;
    p.set_filter(move |s| {
        if s.from == A && s.psn == first + 100 && !lost {
            lost = true;
            return Fate::Drop;
        }
        if naked {
            return after_nak(s);
        }
        if s.from == B && s.syndrome == Some(0x60) {
            naked = true;
        }
        Fate::Deliver
    });
    send_big_write(&mut p, &a, &b);
    p.drive(STEPS);
    check_big_write(&mut p, &a, &msg);
    p
}

#[test]
fn a_read_response_gap_right_behind_a_naked_send_resends_at_once() {
    // A two-packet SEND (PSNs 100, 101) loses its second packet; B NAKs 101 when the READ behind
    // it (PSN 102, two responses at MTU 1024) arrives, and A goes back to 101 (IBTA 9.7.5.2.8;
    // the NAK acknowledges 100, 9.7.5.1.3). Of B's answers to the resend, the ACK for 101 and
    // the READ's first response are lost: the second response is a gap, an implicit NAK
    // (9.7.5.1.5) that reissues the READ for what is missing at once. The resend the NAK
    // started may not swallow it (issue 21 kept it "under way" until 101 was acknowledged, and
    // the READ waited for the ACK timer, here 4.3 s).
    let (mut p, a, b) = setup(RcOptions { mtu: Mtu::Mtu1024, timeout: 20, ..RcOptions::default() });
    let data = pattern(2048, 23);
    p.fill(B, BASE + 0x40000, &data);
    let msg = pattern(2048, 5);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 2048);
    let (mut send_lost, mut naked, mut ack_lost, mut resp_lost) = (false, false, false, false);
    p.set_filter(move |s| {
        if s.from == A && s.psn == Psn::new(101) && !send_lost {
            send_lost = true;
            return Fate::Drop;
        }
        if s.from == B && s.syndrome == Some(0x60) {
            naked = true;
            return Fate::Deliver;
        }
        if naked && s.from == B && s.opcode == Opcode::RC_ACKNOWLEDGE && !ack_lost {
            ack_lost = true;
            return Fate::Drop;
        }
        if naked && s.from == B && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_FIRST && !resp_lost {
            resp_lost = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    send(&mut p, &a, 1, SendOp::Send, BASE, 2048);
    send(&mut p, &a, 2, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 2048);
    p.drive(STEPS);
    assert_eq!(p.statuses(A, a.cq), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.read(B, BASE + 0x1000, 2048), msg);
    assert_eq!(p.read(A, BASE + 0x50000, 2048), data);
    // The READ was asked for twice: the resend the NAK started, and the implicit NAK's.
    let reads = p.log.iter().filter(|s| s.from == A && s.opcode == Opcode::RC_RDMA_READ_REQUEST).count();
    assert_eq!(reads, 3, "the first READ request, the NAK's resend, the implicit NAK's");
    // One sequence NAK; two go-backs: the NAK's and the implicit NAK's.
    check_repaired_without_ack_timeout(&p, 1, "the lost SEND packet was NAKed", 2);
}

#[test]
fn a_window_whose_acks_are_all_lost_is_probed_not_left_to_the_ack_timer() {
    // A requester stopped by its own window of unacknowledged PSNs (issue 21) has nothing in
    // flight that could draw a response once the ACKs answering that window are lost (a
    // responder may coalesce them into one, IBTA 9.7.5.1.2; the device's responder does, per
    // receive batch). Before, only the local ACK timer (IBTA 9.7.6.1.3; here 4.3 s) ended the
    // stall: under 0.5% loss fi_pingpong's 1 MiB messages hit it dozens of times. Now, after
    // about two round trips, the next packet in PSN order goes out beyond the window asking for
    // an ACK, and the responder's ACK for it covers the window. Here both ACKs answering the
    // resent window (PSNs 200..327, AckReq on 263 and 327: see window_stall) are lost.
    let p = window_stall(lose_first(2, |s| s.from == B && s.syndrome == Some(0x1f)));
    // completer_retry_err counts every go-back: the NAK's only.
    check_repaired_without_ack_timeout(&p, 1, "the loss was NAKed", 1);
    // The probe: the packet after the window's last one (it had gone out once before the NAK,
    // in the first window), asking for an ACK, sent once more.
    let probe = Psn::new(100 + 100 + MAX_UNACKED_PSNS as u32 / 2);
    let sent: Vec<_> = p.log.iter().filter(|s| s.from == A && s.psn == probe).collect();
    assert_eq!(sent.len(), 2);
    assert!(sent[1].ack_req, "the probe asks for an ACK");
}

#[test]
fn a_window_whose_last_packet_is_lost_is_probed_into_a_sequence_nak() {
    // The tail of a window lost: the responder saw nothing after the gap, so it sent no
    // sequence NAK (IBTA 9.7.5.1.2 NAKs the first packet out of sequence), and the ACK that
    // asked before the gap (PSN 263) is lost too. The window probe (the next PSN) is out of
    // sequence at the responder, which NAKs the missing PSN: a go-back-N resend from it
    // (9.7.5.2.8), not the ACK timer.
    // (The tail, PSN 327, also went out once before the go-back, in the first window: its
    // resend is lost.)
    let tail = Psn::new(100 + 100 + MAX_UNACKED_PSNS as u32 / 2 - 1);
    let (mut acks, mut going_back, mut tail_lost) = (0, false, false);
    let p = window_stall(move |s| {
        if s.from == B && s.syndrome == Some(0x1f) && acks < 1 {
            acks += 1;
            Fate::Drop
        } else if s.from == A && s.psn == Psn::new(200) {
            going_back = true;
            Fate::Deliver
        } else if s.from == A && s.psn == tail && going_back && !tail_lost {
            tail_lost = true;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    check_repaired_without_ack_timeout(&p, 2, "the first loss and the lost tail were NAKed", 2);
}

#[test]
fn after_an_rnr_nak_the_resend_starts_small_and_the_window_comes_back() {
    // IBTA 9.7.5.2.8: after an RNR NAK the requester resends from the NAKed PSN once the RNR
    // timer ran out; the responder, still without a receive WQE, NAKs again and drops what was
    // pipelined behind (9.7.5.1.2). How much the requester resends at once is its own choice
    // (window::Window::on_rnr): a few packets, not its whole window, so that a slow receiver is not
    // buried in resends it must drop (qperf rc_bw -m 4096 on the device path: 16k RNR NAKs and
    // 4.2M resent packets in three 1-s runs). Once receives are there, all complete and the
    // window grows back.
    let (mut p, a, b) = setup(RcOptions { rnr_retry: 7, min_rnr_timer: 1, ..RcOptions::default() });
    post_recv(&mut p, B, &b, 1, BASE + 0x1000, 64);
    for i in 0..128 {
        send(&mut p, &a, i, SendOp::Send, BASE, 4);
    }
    for _ in 0..4000 {
        p.step();
    }
    let rnrs = p.log.iter().filter(|s| s.from == B && s.syndrome.is_some_and(|x| x & 0x60 == 0x20)).count();
    let first_rnr = p.log.iter().position(|s| s.from == B && s.syndrome.is_some_and(|x| x & 0x60 == 0x20)).unwrap();
    let resent = p.log[first_rnr..].iter().filter(|s| s.from == A).count();
    assert!(rnrs > 10, "{rnrs} RNR NAKs: the case did not happen");
    // At most the smallest window (8) and a window probe per RNR wait.
    assert!(resent <= rnrs * 9, "{resent} packets resent for {rnrs} RNR NAKs");
    for i in 0..127 {
        post_recv(&mut p, B, &b, 100 + i, BASE + 0x2000 + 64 * i, 64);
    }
    p.drive(STEPS);
    p.poll_successes(A, a.cq, 128);
    assert_eq!(p.poll(B, b.cq).len(), 128);
}
