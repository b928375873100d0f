//! The completer (rxe_comp.c): matches ACKs, NAKs, READ responses and atomic ACKs to the oldest
//! outstanding WQEs, places READ data and atomic results, retires WQEs in order with their
//! completions, and decides retries (NAKs, implicit NAKs, the local ACK timeout).

use super::packet::walk_sges;
use super::qp::Qp;
use super::req::{rewind, Credits};
use super::Ctx;
use crate::memory::Memory;
use crate::verbs::{QpState, WcStatus};
use crate::wire::{aeth, IbPacket, NakCode, OpKind, Psn, Syndrome};
use crate::wr::SendOp;

/// Forward progress reloads the retry counters (rxe reloads comp.retry_cnt and rnr_retry on every
/// acknowledged packet) and
/// restarts the timer.
fn progress<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    qp.comp.started_retry = false;
    // The PSN a sequence NAK sent the requester back to stays remembered until it is itself
    // acknowledged: the NAK's own progress (it acknowledges the PSNs before it, IBTA 9.7.5.1.3)
    // does not end that resend, or a copy of the NAK would rewind again (issue 21;
    // handle_nak). Only that: `started_retry` ends here as before, so a later loss found by
    // an implicit NAK (a gap in READ responses, 9.7.5.1.5) in the meantime still resends at
    // once (with it kept, a READ response gap right behind a NAKed SEND waited for the ACK
    // timer).
    if qp.comp.retry_psn.is_some_and(|p| qp.comp.psn.distance(p) > 0) {
        qp.comp.retry_psn = None;
    }
    qp.comp.retry_left = qp.attr.retry_cnt;
    qp.comp.rnr_left = qp.attr.rnr_retry;
    qp.rearm(ctx);
}

/// Fails the oldest WQE with `status` and moves the QP to ERR (the rest flush).
fn fail_front<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, status: WcStatus) {
    if let Some(w) = qp.sq.front_mut() {
        w.done = Some(status);
    }
    qp.enter(ctx, QpState::Err);
}

/// Goes back to `psn` to resend, spending one transport retry; RETRY_EXC_ERR when none is left.
fn retry<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn) {
    ctx.counters.completer_retry_err += 1;
    if qp.comp.retry_left == 0 {
        ctx.counters.retry_exceeded_err += 1;
        fail_front(qp, ctx, WcStatus::RetryExcErr);
        return;
    }
    qp.comp.retry_left -= 1;
    rewind(qp, psn);
    qp.rearm(ctx);
}

/// Starts a resend from `psn` for a gap or an implicit NAK, unless one is already under way
/// (one resend per loss, as rxe's comp.started_retry).
fn retry_once<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn) {
    if !qp.comp.started_retry {
        qp.comp.started_retry = true;
        // A loss: the window shrinks (window::Window; IBTA leaves the requester's pace to it).
        let high = qp.req.sent_high;
        qp.comp.window.on_loss(psn, high);
        retry(qp, ctx, psn);
    }
}

/// The local ACK timeout fired: resend from the oldest unacknowledged PSN (IBTA 9.7.6.1.3: transport timer).
pub(crate) fn retransmit_timeout<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    qp.comp.retrans_at = None;
    qp.comp.started_retry = false;
    qp.comp.retry_psn = None;
    if !qp.sq.iter().any(|w| w.started && w.done.is_none()) {
        return;
    }
    ctx.counters.local_ack_timeout_err += 1;
    // Go-back-N resends everything from the oldest unacknowledged PSN (IBTA 9.7.6.1.3), but
    // only a small window of it before an ACK says what the responder has (window::Window): when
    // only an ACK was lost, the responder re-ACKs the first duplicate (9.7.5.1.4) and the rest
    // of the old window is not sent again.
    let high = qp.req.sent_high;
    qp.comp.window.on_timeout(high);
    let psn = qp.comp.psn;
    retry(qp, ctx, psn);
}

fn handle_nak<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn, syndrome: Syndrome) {
    match syndrome {
        Syndrome::Nak(NakCode::PsnSequenceError) => {
            // IBTA 9.7.5.2.8: resend from the PSN the responder expects. A second NAK for the
            // same PSN while that resend is under way (a duplicate, or one sent before the resend
            // arrived) starts nothing new.
            //
            // The responder sends one NAK per sequence error (9.7.5.1.2), so a second one for a
            // PSN already being resent is a copy (duplicated or reordered by the network) or a
            // stale one; rewinding again for it would resend the whole window a second time.
            // `progress` keeps `retry_psn` until that PSN is acknowledged (issue 21).
            ctx.counters.rcvd_seq_err += 1;
            if qp.comp.retry_psn == Some(psn) {
                return;
            }
            // While an RNR NAK's wait runs, the resend from the RNR-NAKed PSN is already set
            // (rewound, it leaves when the RNR timer fires; nothing is sent meanwhile): a
            // sequence NAK now was sent before that resend, for the requests pipelined behind
            // the NAKed one, which the responder could not accept (9.7.5.2.8). It is stale, not
            // a loss: no second rewind and no transport retry (C9-140 counts a silent
            // responder; this one answers). Spending retry_cnt on it ended a slow receiver's
            // stream in RETRY_EXC_ERR after retry_cnt RNR waits. A loss of the resend itself is
            // still found after the wait (the next NAK, or the ACK timer).
            if qp.comp.rnr_until.is_some() {
                return;
            }
            qp.comp.started_retry = true;
            qp.comp.retry_psn = Some(psn);
            // A loss: the window shrinks, once per window (window::Window).
            let high = qp.req.sent_high;
            qp.comp.window.on_loss(psn, high);
            retry(qp, ctx, psn);
        }
        Syndrome::RnrNak { timer } => {
            ctx.counters.rcvd_rnr_err += 1;
            if qp.comp.rnr_left == 0 {
                ctx.counters.retry_rnr_exceeded_err += 1;
                fail_front(qp, ctx, WcStatus::RnrRetryExcErr);
                return;
            }
            // rnr_retry 7 means "retry forever" (IBTA 11.2.4.2).
            if qp.comp.rnr_left != 7 {
                qp.comp.rnr_left -= 1;
            }
            qp.comp.rnr_until = Some(ctx.now + crate::time::Duration::from_nanos(aeth::rnr_timer_ns(timer)));
            rewind(qp, psn);
            // The resend after the wait starts from a small window (window::Window::on_rnr).
            qp.comp.window.on_rnr();
            // The resend from `psn` after the wait is the one a sequence NAK for `psn` asks for
            // (IBTA 9.7.5.2.8): the responder answered RNR for `psn` and then NAKs the requests
            // pipelined behind it for the same PSN (9.7.5.2.3). That NAK may reach the requester
            // after the wait ran out and the resend left (a device busy elsewhere reads it only
            // then): as for a copy of a sequence NAK, it starts no second rewind and spends no
            // retry_cnt (C9-140 counts a silent responder). `progress` forgets the PSN once it
            // is acknowledged. A loss of the resend itself is found by the next RNR NAK, a
            // sequence NAK for a later PSN or the ACK timer. Forgetting it here instead spent
            // retry_cnt on every such late NAK: `ib_send_bw --use-srq -q 4` ended in
            // RETRY_EXC_ERR (2 runs in 100 on the device path through the memory helper).
            qp.comp.retry_psn = Some(psn);
            // The responder answered: the transport timer (which counts silence against
            // retry_cnt, C9-140) stops for the wait it asked for and starts again with the resend
            // (Qp::handle_timeout). Left running, an RNR timer longer than the ACK timeout spent
            // retry_cnt on a live responder.
            qp.comp.retrans_at = None;
        }
        Syndrome::Nak(code) => {
            let status = match code {
                NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                _ => WcStatus::RemOpErr,
            };
            fail_front(qp, ctx, status);
        }
        Syndrome::Ack { .. } | Syndrome::Reserved(_) => {}
    }
}

/// The end-to-end credit limit an acknowledgement sets (IBTA 9.7.7.2; see [`Credits`]): an ACK
/// with a credit count sets MSN + count, one with the invalid count lifts the limit, an RNR NAK
/// of a responder that counts says it has no WQE (the limit is its MSN). Only ACKs (opcode
/// ACKNOWLEDGE): the AETH of a READ response or an atomic ACK carries the MSN, but a ConnectX
/// puts 0 in its credit field whatever its receive queue holds (nvme-discover2.pcap). An ACK
/// older (by MSN) than the one that set the limit changes nothing.
fn update_credits(qp: &mut Qp, pkt: &IbPacket<&[u8]>) {
    let Some(aeth) = pkt.aeth() else { return };
    let msn = Psn::new(aeth.msn().value());
    if qp.comp.credits.is_some_and(|c| msn.distance(c.msn) < 0) {
        return;
    }
    qp.comp.credits = match aeth.syndrome() {
        Syndrome::Ack { credits } => aeth::credit_count(credits).map(|n| Credits { msn, limit: msn + n }),
        Syndrome::RnrNak { .. } if qp.comp.credits.is_some() => Some(Credits { msn, limit: msn }),
        _ => qp.comp.credits,
    };
}

/// One response packet, as the completer's states read it.
#[derive(Debug, Clone, Copy)]
struct Response {
    kind: OpKind,
    psn: Psn,
    /// The AETH's syndrome (ACKs, NAKs, a READ response's first and last, atomic ACKs).
    syndrome: Option<Syndrome>,
}

/// The oldest outstanding WQE, as the states after [`check_psn`] see it (copied out: they change
/// the QP).
#[derive(Debug, Clone, Copy)]
struct Wqe {
    op: SendOp,
    first_psn: Psn,
    last_psn: Psn,
    len: u32,
    /// The response's PSN lies beyond the WQE's last.
    after: bool,
}

/// Where the completer goes after a state handled the oldest WQE (rxe_comp.c's next state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The WQE retired, acknowledged by a response for a later PSN (rxe's complete_ack): the
    /// completer moved on, and the response may acknowledge the next WQE too (get_wqe again).
    NextWqe,
    /// The completer's PSN moved (progress), and the response is spent.
    Progressed,
    /// The response is spent and acknowledged nothing new (a duplicate, a NAK of the oldest
    /// unacknowledged PSN, an implicit NAK, an error).
    Done,
}

/// Processes one response packet, in the completer's states (rxe_comp.c): the credits an ACK
/// sets ([`update_credits`]), then for the oldest outstanding WQE, and the next ones while the
/// response acknowledges them whole: [`get_wqe`] (local operations done at the front retire),
/// [`check_psn`] (a duplicate is dropped), and the WQE's own check of the response
/// ([`check_write_send`], [`check_read`] with [`do_read`], [`check_atomic`] with
/// [`do_atomic`]); last, local operations behind what retired complete, and progress updates the
/// completer ([`update_comp`]).
pub(crate) fn handle_response<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>) {
    let Some(info) = pkt.info() else { return };
    let r = Response { kind: info.kind, psn: pkt.bth().psn(), syndrome: pkt.aeth().map(|a| a.syndrome()) };
    if newest_sent_psn(qp).is_none_or(|n| r.psn.distance(n) > 0) {
        // IBTA 9.7.5.1.1: the valid responses are those for the outstanding PSNs; one for a PSN
        // not sent yet answers nothing (a responder's bug or a forged packet) and must not
        // complete the WQEs before it. (rxe completes them: its check_psn tests only against
        // the oldest WQE's last PSN.)
        ctx.counters.unsent_psn_responses += 1;
        return;
    }
    if r.kind == OpKind::Acknowledge {
        update_credits(qp, pkt);
    }
    let mut advanced = false;
    let before = qp.comp.psn;
    while get_wqe(qp, ctx) {
        let Some(w) = check_psn(qp, r.psn) else { break };
        let step = match w.op {
            SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::Write { .. }
            | SendOp::WriteWithImm { .. }
            | SendOp::AtomicWrite { .. } => check_write_send(qp, ctx, &r, &w),
            SendOp::Read { .. } => check_read(qp, ctx, pkt, &r, &w),
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => Step::Done,
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => check_atomic(qp, ctx, pkt, &r, &w),
        };
        advanced |= step != Step::Done;
        if step != Step::NextWqe {
            break;
        }
    }
    // Local operations queued right behind what just retired complete now.
    qp.retire_local_front(ctx);
    if advanced && qp.state != QpState::Err {
        update_comp(qp, ctx, before);
    }
}

/// The newest PSN sent: the highest first transmission, or the last PSN of a READ on the wire
/// (its responses take every PSN up to it, IBTA 9.7.1). `None` before the first packet.
fn newest_sent_psn(qp: &Qp) -> Option<Psn> {
    let sent = qp.req.sent_high - 1;
    let newest = qp.sq.iter().take_while(|w| w.started).last();
    let read_last = newest.filter(|w| matches!(w.wr.op, SendOp::Read { .. })).map(|w| w.last_psn());
    match read_last {
        Some(l) if l.distance(sent) > 0 => Some(l),
        _ => qp.sq.iter().any(|w| w.started).then_some(sent),
    }
}

/// The oldest WQE (rxe's get_wqe): local operations at the front that are done retire (in
/// order, as their completions must be); whether an outstanding request is at the front now (a
/// local operation not yet run, or an empty queue, ends the response's walk).
fn get_wqe<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) -> bool {
    while let Some(w) = qp.sq.front() {
        if !w.wr.op.is_local() {
            return true;
        }
        match w.done {
            Some(status) => qp.retire(ctx, status),
            None => return false,
        }
    }
    false
}

/// The response's PSN against the oldest WQE (rxe's check_psn): a response older than anything
/// outstanding is a duplicate, dropped (`None`).
fn check_psn(qp: &Qp, psn: Psn) -> Option<Wqe> {
    let w = qp.sq.front()?;
    if !w.started || psn.distance(w.first_psn) < 0 {
        // A response older than anything outstanding: a duplicate. Drop it.
        return None;
    }
    let last = w.last_psn();
    let after = psn.distance(last) > 0;
    Some(Wqe { op: w.wr.op, first_psn: w.first_psn, last_psn: last, len: w.len, after })
}

/// A SEND, WRITE or ATOMIC WRITE (rxe's check_ack, write_send): a response for a later PSN
/// retires it whole (complete_ack); an ACK of its last packet retires it, of an earlier one
/// moves the completer's PSN (update_comp); a NAK goes to [`handle_nak`]. ATOMIC WRITE is
/// acknowledged by a plain ACK, as a WRITE (IBTA 1.5 9.4.6).
fn check_write_send<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, r: &Response, w: &Wqe) -> Step {
    let psn = r.psn;
    if w.after {
        // A response for a later PSN acknowledges this WQE (IBTA 9.7.5.1.3: responses
        // are in order, an ACK acknowledges every earlier request).
        qp.retire(ctx, WcStatus::Success);
        return Step::NextWqe;
    }
    if r.kind != OpKind::Acknowledge {
        return Step::Done;
    }
    match r.syndrome {
        Some(Syndrome::Ack { .. }) => {
            if psn == w.last_psn {
                qp.retire(ctx, WcStatus::Success);
            } else {
                qp.comp.psn = psn + 1;
            }
            Step::Progressed
        }
        Some(s) => {
            // A NAK acknowledges every packet before its PSN (IBTA 9.7.5.1.3):
            // progress, which reloads the retry counter.
            let mut step = Step::Done;
            if psn.distance(qp.comp.psn) > 0 {
                qp.comp.psn = psn;
                step = Step::Progressed;
            }
            handle_nak(qp, ctx, psn, s);
            step
        }
        None => Step::Done,
    }
}

/// The first PSN of the READ `w` not yet answered: the completer's PSN once it lies inside the
/// READ, else the READ's first.
fn read_resume_psn(qp: &Qp, w: &Wqe) -> Psn {
    if qp.comp.psn.distance(w.first_psn) > 0 {
        qp.comp.psn
    } else {
        w.first_psn
    }
}

/// A READ (rxe's check_ack): its responses go to [`do_read`]; an ACK, or a NAK past it, says the
/// responder executed it and its responses were lost, and a response of a later request says
/// the same: an implicit NAK (IBTA 9.7.5.1.5), a resend from the first missing PSN
/// ([`retry_once`]); a NAK of it goes to [`handle_nak`].
fn check_read<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>, r: &Response, w: &Wqe) -> Step {
    match r.kind {
        OpKind::ReadResponse => do_read(qp, ctx, pkt, r, w),
        OpKind::Acknowledge => {
            match r.syndrome {
                // The responder acknowledged (or NAKed) past the READ: it executed the
                // READ and its responses were lost (an implicit NAK, IBTA 9.7.5.1.5).
                Some(_) if w.after || matches!(r.syndrome, Some(Syndrome::Ack { .. })) => {
                    let expect = read_resume_psn(qp, w);
                    retry_once(qp, ctx, expect);
                }
                Some(s) => handle_nak(qp, ctx, r.psn, s),
                None => {}
            }
            Step::Done
        }
        // A READ response or atomic ACK of a later request (responses come in PSN
        // order, IBTA 9.7.5.1.5): this READ's responses were lost, an implicit NAK
        // (rxe's check_psn retries a pending READ/atomic on any later PSN).
        _ if w.after => {
            let expect = read_resume_psn(qp, w);
            retry_once(qp, ctx, expect);
            Step::Done
        }
        _ => Step::Done,
    }
}

/// A READ response (rxe's do_read): the next expected one places its data in the WQE's buffers
/// (its length must be the MTU, or what is left on the last: BAD_RESP_ERR; a buffer that cannot
/// be written: LOC_PROT_ERR) and moves the completer's PSN, the last retires the WQE; a gap is
/// an implicit NAK (IBTA 9.7.5.1.5), an older or a later PSN is ignored.
fn do_read<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>, r: &Response, w: &Wqe) -> Step {
    let psn = r.psn;
    let expect = read_resume_psn(qp, w);
    let d = psn.distance(expect);
    if d > 0 {
        // A gap in the READ responses: an implicit NAK (IBTA 9.7.5.1.5):
        // reissue the READ from the first missing PSN, once per loss.
        qp.comp.psn = expect;
        retry_once(qp, ctx, expect);
        return Step::Done;
    }
    if d < 0 || w.after {
        return Step::Done;
    }
    let mtu = qp.mtu();
    let offset = (psn - w.first_psn) as u32 * mtu;
    let data = pkt.payload();
    let is_last = psn == w.last_psn;
    let want = if is_last { w.len - offset.min(w.len) } else { mtu };
    if data.len() as u32 != want {
        fail_front(qp, ctx, WcStatus::BadRespErr);
        return Step::Done;
    }
    let sges = qp.sq[0].wr.sg_list.clone();
    let ok = walk_sges(&sges, offset, data.len(), |sge, sge_off, at, n| {
        let Some(mr) = ctx.mr_by_lkey(sge.lkey) else { return false };
        let owner = mr.owner;
        ctx.mem.write_local(owner, sge.addr.wrapping_add(u64::from(sge_off)), &data[at..at + n]).is_ok()
    });
    if !ok {
        fail_front(qp, ctx, WcStatus::LocProtErr);
        return Step::Done;
    }
    qp.comp.psn = psn + 1;
    if is_last {
        qp.retire(ctx, WcStatus::Success);
    }
    Step::Progressed
}

/// A CmpSwap or FetchAdd (rxe's check_ack): its atomic ACK goes to [`do_atomic`]; an ACK, or a
/// NAK past it, and a response of a later request are an implicit NAK (IBTA 9.7.5.1.5), a resend
/// of the atomic ([`retry_once`]); a NAK of it goes to [`handle_nak`].
fn check_atomic<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>, r: &Response, w: &Wqe) -> Step {
    match r.kind {
        OpKind::AtomicAcknowledge if r.psn == w.first_psn => do_atomic(qp, ctx, pkt),
        OpKind::Acknowledge => {
            match r.syndrome {
                Some(_) if w.after || matches!(r.syndrome, Some(Syndrome::Ack { .. })) => {
                    let first = w.first_psn;
                    retry_once(qp, ctx, first);
                }
                Some(s) => handle_nak(qp, ctx, r.psn, s),
                None => {}
            }
            Step::Done
        }
        // A READ response or atomic ACK of a later request: this atomic's ACK was
        // lost (or is late), an implicit NAK (IBTA 9.7.5.1.5; rxe's check_psn). The
        // resent atomic is answered from the responder's cache, not executed again
        // (9.7.5.1.4). Found under issue 21: with a window shrunk by loss, nothing
        // but such responses may follow a lost atomic ACK, and the QP waited for the
        // ACK timeout.
        OpKind::ReadResponse | OpKind::AtomicAcknowledge if w.after => {
            let first = w.first_psn;
            retry_once(qp, ctx, first);
            Step::Done
        }
        _ => Step::Done,
    }
}

/// The atomic ACK of the oldest WQE (rxe's do_atomic): the original value goes to the WQE's
/// buffer (one that cannot be written: LOC_PROT_ERR) and the WQE retires.
fn do_atomic<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &IbPacket<&[u8]>) -> Step {
    let orig = pkt.atomicacketh().map(|a| a.orig_rem_data()).unwrap_or(0);
    let sges = qp.sq[0].wr.sg_list.clone();
    let bytes = orig.to_ne_bytes();
    let ok = walk_sges(&sges, 0, 8, |sge, sge_off, at, n| {
        let Some(mr) = ctx.mr_by_lkey(sge.lkey) else { return false };
        let owner = mr.owner;
        ctx.mem.write_local(owner, sge.addr.wrapping_add(u64::from(sge_off)), &bytes[at..at + n]).is_ok()
    });
    if !ok {
        fail_front(qp, ctx, WcStatus::LocProtErr);
        return Step::Done;
    }
    qp.retire(ctx, WcStatus::Success);
    Step::Progressed
}

/// The response moved the completer (rxe's update_comp): the window grows by the PSNs it
/// acknowledged ([`Window::on_ack`](super::window::Window::on_ack)), and [`progress`] reloads
/// the retry counters and restarts the timer.
fn update_comp<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, before: Psn) {
    let acked = qp.comp.psn.distance(before);
    if acked > 0 {
        let now_psn = qp.comp.psn;
        qp.comp.window.on_ack(acked as u32, now_psn, ctx.now);
    }
    progress(qp, ctx);
}
