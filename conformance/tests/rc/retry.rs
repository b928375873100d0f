//! Loss and its repair: sequence NAKs and go-back-N, duplicates (re-ACKed, replayed, re-executed),
//! implicit NAKs of READ responses, retry and RNR retry counts, RNR NAKs and the NAKs behind them
//! (IBTA Vol 1 9.7.5).

use super::*;

#[test]
fn one_psn_sequence_nak_per_gap_then_go_back_n() {
    let (mut p, a, b) = setup(RcOptions::default());
    let msg = pattern(4096, 5);
    p.fill(A, BASE, &msg);
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 8192);
    // Lose the first transmission of PSN 101 (the second of four packets).
    p.set_filter(lose_first(1, |s| s.from == 0 && s.psn == Psn::new(101)));
    send(&mut p, &a, 1, SendOp::Send, BASE, 4096);
    p.drive(STEPS);
    let naks: Vec<_> = p.log.iter().filter(|s| s.from == B && s.syndrome == Some(0x60)).collect();
    assert_eq!(naks.len(), 1, "exactly one PSN sequence NAK for the gap");
    assert_eq!(naks[0].psn, Psn::new(101), "the NAK carries the expected PSN");
    assert_eq!(p.read(B, BASE + 0x10000, 4096), msg);
    assert_eq!(p.poll(B, b.cq).len(), 1);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
    assert!(p.b.counters().out_of_seq_request >= 2);
    assert_eq!(p.a.counters().rcvd_seq_err, 1);
}

#[test]
fn c9_105_duplicate_send_is_reacked_not_redelivered() {
    let (mut p, a, b) = setup(RcOptions { timeout: 10, ..RcOptions::default() });
    p.fill(A, BASE, b"hello");
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    post_recv(&mut p, B, &b, 8, BASE + 0x2000, 64);
    // Lose B's first ACK: A times out and resends; B sees a duplicate.
    p.set_filter(lose_first(1, |s| s.from == 1));
    send(&mut p, &a, 1, SendOp::Send, BASE, 5);
    p.drive(STEPS);
    assert_eq!(p.sent(A), vec![Opcode::RC_SEND_ONLY, Opcode::RC_SEND_ONLY]);
    assert_eq!(p.sent(B), vec![Opcode::RC_ACKNOWLEDGE, Opcode::RC_ACKNOWLEDGE]);
    let wb = p.poll(B, b.cq);
    assert_eq!(wb.len(), 1, "delivered once");
    assert_eq!(p.b.counters().duplicate_request, 1);
    let wa = p.poll(A, a.cq);
    assert_eq!(wa.len(), 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    // The retransmission waited for the local ACK timeout: 4.096 us x 2^10.
    let resend = p.log.iter().filter(|s| s.from == A).nth(1).unwrap().at;
    assert!(resend.as_nanos() >= 4096 << 10, "resent at {resend}");
}

#[test]
fn retry_exhausted_is_retry_exc_err_and_the_rest_flush() {
    let (mut p, a, _b) = setup(RcOptions { timeout: 8, retry_cnt: 2, ..RcOptions::default() });
    p.set_filter(|s| if s.from == 0 { Fate::Drop } else { Fate::Deliver });
    p.fill(A, BASE, b"x");
    let mut w = SendWr::new(1, SendOp::Write { remote_addr: BASE, rkey: 0 }, sge(&a, BASE, 1));
    w.signaled = false;
    p.dev(A).post_send(a.qpn, w.clone()).unwrap();
    w.wr_id = 2;
    p.dev(A).post_send(a.qpn, w).unwrap();
    p.drive(STEPS);
    // One transmission plus retry_cnt retries of the first packet.
    let tries = p.log.iter().filter(|s| s.from == A && s.psn == Psn::new(100)).count();
    assert_eq!(tries, 3);
    // Error and flush completions appear although the WRs were unsignaled.
    assert_eq!(p.statuses(A, a.cq), vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.a.query_qp(a.qpn).unwrap().0, QpState::Err);
    assert_eq!(p.a.counters().retry_exceeded_err, 1);
}

#[test]
fn rnr_nak_then_success_when_a_receive_is_posted() {
    let (mut p, a, b) = setup(RcOptions { min_rnr_timer: 14, ..RcOptions::default() });
    p.fill(A, BASE, b"wait");
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    // Let the first attempt arrive with no receive WQE posted.
    for _ in 0..3 {
        p.step();
    }
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    p.drive(STEPS);
    let rnr: Vec<_> = p.log.iter().filter(|s| s.from == B && s.syndrome == Some(0x20 | 14)).collect();
    assert_eq!(rnr.len(), 1, "one RNR NAK with the responder's min_rnr_timer");
    assert_eq!(p.poll(B, b.cq).len(), 1);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
    // The retry waited the RNR timer of code 14: 1.28 ms.
    let retry = p.log.iter().filter(|s| s.from == A).nth(1).unwrap().at;
    assert!(retry.as_nanos() >= 1_280_000, "retried at {retry}");
}

#[test]
fn rnr_retry_zero_exhausts_at_once() {
    let (mut p, a, _b) = setup(RcOptions { rnr_retry: 0, ..RcOptions::default() });
    p.fill(A, BASE, b"wait");
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    send(&mut p, &a, 2, SendOp::Send, BASE, 4);
    p.drive(STEPS);
    assert_eq!(p.statuses(A, a.cq), vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]);
}

#[test]
fn duplicate_atomic_is_replayed_not_reexecuted() {
    let (mut p, a, b) = setup(RcOptions { timeout: 10, ..RcOptions::default() });
    let target = BASE + 0x8000;
    // Lose the first atomic ACK: A resends the FETCH_ADD, B answers from its cache.
    p.set_filter(lose_first(1, |s| s.from == 1 && s.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE));
    send(&mut p, &a, 1, SendOp::FetchAdd { remote_addr: target, rkey: b.mr.rkey, add: 1 }, BASE, 8);
    p.drive(STEPS);
    assert_eq!(p.sent(A), vec![Opcode::RC_FETCH_ADD, Opcode::RC_FETCH_ADD]);
    assert_eq!(u64::from_ne_bytes(p.read(B, target, 8).try_into().unwrap()), 1, "added once");
    assert_eq!(u64::from_ne_bytes(p.read(A, BASE, 8).try_into().unwrap()), 0, "the original value");
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn a_read_response_after_a_lost_atomic_ack_is_an_implicit_nak() {
    // IBTA 9.7.5.1.5: responses come in PSN order, so a response for a later request means an
    // earlier one was lost: the requester resends at once, without the ACK timeout (rxe's
    // check_psn retries a pending READ/atomic on any later PSN). Here the FETCH_ADD's ACK is lost
    // and only a READ follows it (found under issue 21: a window shrunk by loss leaves nothing
    // else behind a lost atomic ACK).
    let (mut p, a, b) = setup(RcOptions { timeout: 20, ..RcOptions::default() });
    let target = BASE + 0x8000;
    let data = pattern(1024, 7);
    p.fill(B, BASE + 0x40000, &data);
    p.set_filter(lose_first(1, |s| s.from == B && s.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE));
    send(&mut p, &a, 1, SendOp::FetchAdd { remote_addr: target, rkey: b.mr.rkey, add: 1 }, BASE, 8);
    send(&mut p, &a, 2, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 1024);
    p.drive(STEPS);
    assert_eq!(p.statuses(A, a.cq), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(u64::from_ne_bytes(p.read(B, target, 8).try_into().unwrap()), 1, "added once");
    assert_eq!(p.read(A, BASE + 0x50000, 1024), data);
    // Timeout 20 is 4.3 s: the resend came from the READ response, long before.
    let last = p.log.last().unwrap().at;
    assert!(last.as_nanos() < 1_000_000_000, "done at {last}");
}

#[test]
fn read_response_gap_is_an_implicit_nak_and_the_read_resumes() {
    let (mut p, a, b) = setup(RcOptions::default());
    let data = pattern(4096, 6);
    p.fill(B, BASE + 0x40000, &data);
    // Lose the second READ response packet once.
    p.set_filter(lose_first(1, |s| s.from == 1 && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE));
    send(&mut p, &a, 1, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 4096);
    p.drive(STEPS);
    assert_eq!(p.read(A, BASE + 0x50000, 4096), data);
    // The READ was reissued from the missing PSN (101) for the remaining 3 KiB.
    let reqs: Vec<_> = p.log.iter().filter(|s| s.from == A && s.opcode == Opcode::RC_RDMA_READ_REQUEST).collect();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].psn, Psn::new(101));
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

/// A 64-byte READ of `pattern(64, seed)` from B (ACK timeout 10) whose first `lost` packets from B
/// are lost, run to quiescence; A read the pattern.
fn read_losing_responses(seed: u8, lost: usize) -> (Pair, Side) {
    let (mut p, a, b) = setup(RcOptions { timeout: 10, ..RcOptions::default() });
    p.fill(B, BASE + 0x40000, &pattern(64, seed));
    p.set_filter(lose_first(lost, |s| s.from == 1));
    send(&mut p, &a, 1, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 64);
    p.drive(STEPS);
    assert_eq!(p.read(A, BASE + 0x50000, 64), pattern(64, seed));
    (p, a)
}

#[test]
fn duplicate_read_is_reexecuted() {
    let (p, _) = read_losing_responses(10, 1);
    assert_eq!(p.sent(B), vec![Opcode::RC_RDMA_READ_RESPONSE_ONLY, Opcode::RC_RDMA_READ_RESPONSE_ONLY]);
    assert_eq!(p.b.counters().duplicate_request, 1);
}

#[test]
fn read_response_lost_twice_still_completes() {
    let (mut p, a) = read_losing_responses(11, 2);
    assert_eq!(p.sent(A).len(), 3);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn rnr_retry_seven_retries_forever() {
    let (mut p, a, b) = setup(RcOptions { rnr_retry: 7, min_rnr_timer: 1, ..RcOptions::default() });
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    for _ in 0..400 {
        p.step();
    }
    let rnrs = p.log.iter().filter(|s| s.from == B && s.syndrome.is_some_and(|x| x & 0x60 == 0x20)).count();
    assert!(rnrs > 50, "{rnrs} RNR NAKs, still retrying");
    assert!(p.poll(A, a.cq).is_empty());
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn nak_past_a_read_whose_responses_were_lost_resends_the_read() {
    // Found by the property test: a PSN sequence NAK for a request after an incomplete READ means
    // the READ executed and its responses were lost; the READ is reissued (implicit NAK, IBTA
    // 9.7.5.1.5), not skipped.
    let (mut p, a, b) = setup(RcOptions { timeout: 16, ..RcOptions::default() });
    p.fill(B, BASE + 0x40000, &pattern(64, 12));
    p.fill(A, BASE, &pattern(2048, 13));
    post_recv(&mut p, B, &b, 7, BASE + 0x10000, 4096);
    let (mut lost_resp, mut lost_send) = (false, false);
    p.set_filter(move |s| {
        if s.from == 1 && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY && !lost_resp {
            lost_resp = true;
            Fate::Drop
        } else if s.from == 0 && s.opcode == Opcode::RC_SEND_FIRST && !lost_send {
            lost_send = true;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    send(&mut p, &a, 1, SendOp::Read { remote_addr: BASE + 0x40000, rkey: b.mr.rkey }, BASE + 0x50000, 64);
    send(&mut p, &a, 2, SendOp::Send, BASE, 2048);
    p.drive(STEPS);
    assert_eq!(p.read(A, BASE + 0x50000, 64), pattern(64, 12));
    assert_eq!(p.read(B, BASE + 0x10000, 2048), pattern(2048, 13));
    assert_eq!(p.statuses(A, a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    // Resolved without waiting for the ACK timeout (4.096 us x 2^16 = 268 ms).
    assert!(p.now.as_nanos() < 268_000_000, "took {}", p.now);
}

/// Runs the pair to quiescence like `Pair::drive`, except that a device takes every datagram that
/// has arrived by the time it runs before it transmits anything, as the real device does (it
/// reads a batch of datagrams from its UDP socket, then transmits). `lose` selects the datagrams
/// the wire loses. Returns the batches B received, each as the (opcode, PSN) of its datagrams.
fn drive_batched(
    p: &mut Pair,
    mut lose: impl FnMut(&softrdma_conformance::pair::Seen) -> bool,
) -> Vec<Vec<(Opcode, Psn)>> {
    use softrdma_conformance::pair::{Seen, ADDR_A, ADDR_B};
    use softrdma_engine::device::RecvMeta;
    use softrdma_engine::time::Instant;
    use softrdma_engine::wire::IbPacket;
    let mut in_flight: Vec<(Instant, usize, RecvMeta, Vec<u8>)> = Vec::new();
    let mut batches_at_b = Vec::new();
    let mut buf = vec![0u8; 4096 + 256];
    for _ in 0..STEPS {
        for from in [A, B] {
            let now = p.now;
            while let Some(t) = p.dev(from).poll_transmit(now, &mut buf) {
                let bytes = buf[..t.len].to_vec();
                let seen = Seen::new(from, now, bytes.clone());
                let lost = lose(&seen);
                p.log.push(seen);
                if !lost {
                    let src = if from == A { ADDR_A } else { ADDR_B };
                    let meta = RecvMeta { src, src_port: t.src_port, ip_id: None, dst: Some(t.dst) };
                    in_flight.push((now + p.latency, 1 - from, meta, bytes));
                }
            }
        }
        let next_pkt = in_flight.iter().map(|x| x.0).min();
        let next_timer = [p.a.poll_timeout(), p.b.poll_timeout()].into_iter().flatten().min();
        let pkt_first = match (next_pkt, next_timer) {
            (None, None) => return batches_at_b,
            (Some(t), Some(x)) => t <= x,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if let (true, Some(t)) = (pkt_first, next_pkt) {
            p.now = p.now.max(t);
            let now = p.now;
            // Everything that has arrived, in the order it was sent; each device transmits only
            // at the top of the next round, after its whole batch.
            let (arrived, rest): (Vec<_>, Vec<_>) = in_flight.into_iter().partition(|x| x.0 <= now);
            in_flight = rest;
            let mut batch = Vec::new();
            for (_, to, meta, bytes) in arrived {
                if to == B {
                    let pkt = IbPacket::new_checked(&bytes[..]).expect("well-formed");
                    batch.push((pkt.opcode(), pkt.bth().psn()));
                }
                p.dev(to).handle_packet(now, meta, &bytes);
            }
            if !batch.is_empty() {
                batches_at_b.push(batch);
            }
        } else if let Some(t) = next_timer {
            p.now = p.now.max(t);
            let now = p.now;
            p.a.handle_timeout(now);
            p.b.handle_timeout(now);
        }
    }
    panic!("livelock: {STEPS} rounds without quiescence");
}

/// IBTA 9.7.5.1.4 (duplicate READ requests are re-executed) with go-back-N (9.7.5.2): a requester
/// that goes back resends several READ requests at once, and a responder that receives them all
/// before it transmits (a batch read from its socket) answers each of them. Regression: the
/// responder dropped every queued READ response when a duplicate READ arrived, so only the last
/// resent READ was answered, the first never was, and the requester ended in RETRY_EXC_ERR.
#[test]
fn duplicate_reads_received_together_are_each_answered() {
    let (mut p, a, b) = setup(RcOptions { mtu: Mtu::Mtu256, timeout: 10, ..RcOptions::default() });
    // Three READs of 1 KiB (4 response packets each at MTU 256): PSNs 100-103, 104-107, 108-111.
    let reads: Vec<(u64, u64, Vec<u8>)> = (0..3u64)
        .map(|i| (BASE + 0x40000 + i * 0x1000, BASE + 0x50000 + i * 0x1000, pattern(1024, 20 + i as u8)))
        .collect();
    for (i, (remote, local, data)) in reads.iter().enumerate() {
        p.fill(B, *remote, data);
        send(&mut p, &a, i as u64 + 1, SendOp::Read { remote_addr: *remote, rkey: b.mr.rkey }, *local, 1024);
    }
    // Lose the second response packet of the first READ (PSN 101), once: A sees the gap and goes
    // back, resending the READ from PSN 101 and then the two later READs.
    let mut lost = false;
    let batches = drive_batched(&mut p, move |s| {
        if s.from == B && s.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE && s.psn == Psn::new(101) && !lost {
            lost = true;
            true
        } else {
            false
        }
    });
    // B received the three resent READ requests together (all duplicates).
    let resent = [
        (Opcode::RC_RDMA_READ_REQUEST, Psn::new(101)),
        (Opcode::RC_RDMA_READ_REQUEST, Psn::new(104)),
        (Opcode::RC_RDMA_READ_REQUEST, Psn::new(108)),
    ];
    assert!(batches.iter().any(|x| x[..] == resent[..]), "B's batches: {batches:?}");
    // Each READ is answered: all three complete, with B's data.
    let wa = p.poll(A, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status, w.opcode, w.byte_len)).collect::<Vec<_>>(),
        (1..=3).map(|i| (i, WcStatus::Success, WcOpcode::RdmaRead, 1024)).collect::<Vec<_>>()
    );
    for (_, local, data) in &reads {
        assert_eq!(&p.read(A, *local, 1024), data);
    }
    // Answered the first time: one go-back, three duplicates.
    assert_eq!(p.b.counters().duplicate_request, 3);
    assert_eq!(p.a.poll_timeout(), None, "nothing left outstanding");
}

#[test]
fn a_responder_answering_rnr_for_longer_than_the_ack_timeouts_allow_is_not_a_transport_error() {
    // IBTA 9.7.5.2.8: an RNR NAK is a response; the requester waits the RNR timer and then
    // retries under rnr_retry (7: forever). The local ACK timeout and retry_cnt (C9-140) count a
    // silent responder, not the RNR waits it asked for: an RNR timer longer than the ACK timeout
    // (min_rnr_timer 10 is 0.32 ms, timeout 4 is 65 us, retry_cnt 1) must not end in
    // RETRY_EXC_ERR while the responder keeps answering.
    let (mut p, a, b) =
        setup(RcOptions { timeout: 4, retry_cnt: 1, rnr_retry: 7, min_rnr_timer: 10, ..RcOptions::default() });
    send(&mut p, &a, 1, SendOp::Send, BASE, 4);
    let end = p.now + softrdma_engine::time::Duration::from_millis(10);
    while p.now < end && p.step() {}
    let wa = p.poll(A, a.cq);
    assert!(wa.is_empty(), "the requester gave up while the responder answered: {wa:?}");
    let rnrs = p.log.iter().filter(|s| s.from == B && s.syndrome.is_some_and(|x| x & 0x60 == 0x20)).count();
    assert!(rnrs > 20, "{rnrs} RNR NAKs in 10 ms");
    post_recv(&mut p, B, &b, 7, BASE + 0x1000, 64);
    p.drive(STEPS);
    assert_eq!(p.poll(A, a.cq)[0].status, WcStatus::Success);
}

/// Eight SENDs to a responder with no receive, retry_cnt 1 and rnr_retry 7, for 3000 events
/// (sequence NAKs from B held back `nak_delay` past the RNR timer, when given): the requester must
/// still be retrying (RNR waits and the sequence NAKs behind them spend no retry_cnt), and every
/// SEND completes once receives are posted.
fn rnr_stream_outlives_retry_cnt(nak_delay: Option<softrdma_engine::time::Duration>) {
    let (mut p, a, b) = setup(RcOptions { retry_cnt: 1, rnr_retry: 7, min_rnr_timer: 1, ..RcOptions::default() });
    if let Some(d) = nak_delay {
        p.set_filter(move |s| if s.from == B && s.syndrome == Some(0x60) { Fate::Delay(d) } else { Fate::Deliver });
    }
    for i in 0..8 {
        send(&mut p, &a, i, SendOp::Send, BASE, 4);
    }
    for _ in 0..3000 {
        p.step();
    }
    let from_b =
        |p: &Pair, f: fn(u8) -> bool| p.log.iter().filter(|s| s.from == B && s.syndrome.is_some_and(f)).count();
    let rnrs = from_b(&p, |x| x & 0x60 == 0x20);
    let seq_naks = from_b(&p, |x| x == 0x60);
    let wa = p.poll(A, a.cq);
    assert!(
        wa.is_empty(),
        "the requester gave up while the responder answered ({rnrs} RNR NAKs, {seq_naks} sequence NAKs): {wa:?}"
    );
    assert!(rnrs > 5 && seq_naks > 5, "{rnrs} RNR NAKs, {seq_naks} sequence NAKs: the case did not happen");
    for i in 0..8 {
        post_recv(&mut p, B, &b, 100 + i, BASE + 0x1000 + 64 * i, 64);
    }
    p.drive(STEPS);
    p.poll_successes(A, a.cq, 8);
}

#[test]
fn a_sequence_nak_behind_an_rnr_nak_spends_no_transport_retry() {
    // IBTA 9.7.5.2.8 and C9-140: an RNR NAK sends the requester back to the NAKed PSN after the
    // RNR timer, under rnr_retry (7: forever). The responder, which accepted nothing past that
    // PSN, answers the requests pipelined behind it with a sequence NAK (9.7.5.2.3) for the
    // same PSN, sent before the requester's resend can have left: it is stale, not a new loss,
    // and must neither rewind again nor spend retry_cnt. Spending it ended a slow receiver's
    // stream in RETRY_EXC_ERR (two ib_send_bw pairs between `softrdma cluster` hosts: a quarter
    // of the runs) although the responder answered every time.
    rnr_stream_outlives_retry_cnt(None);
}

/// The responder resources of IBTA 9.7.5.1.4 (max_dest_rd_atomic) are held by new READ/atomic
/// requests, not by the answers to duplicates: a duplicate reuses what its first execution saved.
/// A responder that falls behind (starved of CPU, found by rxe interop under faults) can hold the
/// answers to a whole resent window and to the new requests after it, more than
/// max_dest_rd_atomic answers in all, while the requester keeps within its max_rd_atomic.
/// Regression: the responder counted every queued READ/atomic answer, NAKed the next new atomic
/// as an invalid request and went to the error state; rxe (retry_cnt 7: for ever) then resent
/// into the silence without end.
#[test]
fn answers_to_duplicates_hold_no_responder_resource() {
    use softrdma_conformance::pair::{ADDR_A, ADDR_B};
    use softrdma_engine::device::RecvMeta;
    use softrdma_engine::wire::IbPacket;
    type Out = Vec<(Psn, Opcode, RecvMeta, Vec<u8>)>;
    fn transmit(p: &mut Pair, from: usize) -> Out {
        let mut buf = vec![0u8; 4096 + 256];
        let mut out = Vec::new();
        let now = p.now;
        while let Some(t) = p.dev(from).poll_transmit(now, &mut buf) {
            let bytes = buf[..t.len].to_vec();
            let pkt = IbPacket::new_checked(&bytes[..]).expect("the engine emits well-formed packets");
            let src = if from == A { ADDR_A } else { ADDR_B };
            let meta = RecvMeta { src, src_port: t.src_port, ip_id: None, dst: Some(t.dst) };
            out.push((pkt.bth().psn(), pkt.opcode(), meta, bytes));
        }
        out
    }
    fn deliver(p: &mut Pair, to: usize, pkts: &Out) {
        let now = p.now;
        for (_, _, meta, bytes) in pkts {
            p.dev(to).handle_packet(now, *meta, bytes);
        }
    }
    let (mut p, a, b) =
        setup(RcOptions { timeout: 10, max_rd_atomic: 4, max_dest_rd_atomic: 4, ..RcOptions::default() });
    let target = BASE + 0x8000;
    for i in 0..8u64 {
        send(&mut p, &a, i + 1, SendOp::FetchAdd { remote_addr: target, rkey: b.mr.rkey, add: 1 }, BASE + 8 * i, 8);
    }
    // A sends four (its max_rd_atomic); B executes them and answers.
    let first = transmit(&mut p, A);
    assert_eq!(first.len(), 4);
    let p0 = first[0].0;
    deliver(&mut p, B, &first);
    let answers = transmit(&mut p, B);
    assert_eq!(answers.iter().map(|x| x.1).collect::<Vec<_>>(), vec![Opcode::RC_ATOMIC_ACKNOWLEDGE; 4]);
    // The first two answers arrive; A sends the next two.
    deliver(&mut p, A, &answers[..2].to_vec());
    let new = transmit(&mut p, A);
    assert_eq!(new.iter().map(|x| x.0).collect::<Vec<_>>(), vec![p0 + 4, p0 + 5]);
    // The last two answers are late: A times out and goes back to its oldest unanswered
    // request, resending p0+2 ..= p0+5.
    let t = p.a.poll_timeout().expect("A's transport timer runs");
    p.now = t;
    let now = p.now;
    p.a.handle_timeout(now);
    let resent = transmit(&mut p, A);
    assert_eq!(resent.iter().map(|x| x.0).collect::<Vec<_>>(), vec![p0 + 2, p0 + 3, p0 + 4, p0 + 5]);
    // B, behind, receives the two new ones and the resent window before it transmits anything.
    deliver(&mut p, B, &new);
    deliver(&mut p, B, &resent);
    // The late answers arrive at A: two more requests go out, within A's four outstanding.
    deliver(&mut p, A, &answers[2..].to_vec());
    let more = transmit(&mut p, A);
    assert_eq!(more.iter().map(|x| x.0).collect::<Vec<_>>(), vec![p0 + 6, p0 + 7]);
    // B receives them while the answers to the duplicates are still queued.
    deliver(&mut p, B, &more);
    let out = transmit(&mut p, B);
    assert!(
        out.iter().all(|x| x.1 == Opcode::RC_ATOMIC_ACKNOWLEDGE),
        "B answers every request, refusing none: {:?}",
        out.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>()
    );
    assert!(out.iter().any(|x| x.0 == p0 + 7), "the last new request is answered");
    assert_eq!(p.b.counters().duplicate_request, 4);
    // Then all of it completes, each atomic executed once.
    deliver(&mut p, A, &out);
    p.drive(STEPS);
    assert_eq!(p.statuses(A, a.cq), (1..=8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    assert_eq!(u64::from_ne_bytes(p.read(B, target, 8).try_into().unwrap()), 8, "each added once");
    let mut origs: Vec<u64> =
        (0..8).map(|i| u64::from_ne_bytes(p.read(A, BASE + 8 * i, 8).try_into().unwrap())).collect();
    origs.sort_unstable();
    assert_eq!(origs, (0..8).collect::<Vec<_>>(), "each saw a distinct original value");
}

#[test]
fn a_sequence_nak_behind_an_rnr_nak_that_arrives_after_the_rnr_wait_spends_no_transport_retry() {
    // The same rule as above (IBTA 9.7.5.2.8, C9-140) when the responder's sequence NAK for the
    // RNR-NAKed PSN reaches the requester only after the RNR timer ran out and the resend from
    // that PSN has left: it still asks for the resend already made, not for a new one. A busy
    // device (the daemon reaching a client's memory through its helper) processes the RNR NAK,
    // fires the short RNR timer (perftest's min_rnr_timer) and only then reads the sequence NAK
    // queued behind it; spending retry_cnt on each ended `ib_send_bw --use-srq -q 4` (four QPs
    // on one SRQ, so one QP can find it empty many times in a row) in RETRY_EXC_ERR, 2 runs in
    // 100 on the device path with the memory helper.
    // Every sequence NAK from B is held back well past the RNR timer of code 1 (10 us).
    rnr_stream_outlives_retry_cnt(Some(softrdma_engine::time::Duration::from_micros(200)));
}
