//! Replay as responder: softrdma answers the recorded requests, and its answers are compared.

use super::*;

/// The responder replay (see the module documentation).
pub(super) fn responder(
    r: &mut ConversationReport,
    recorded: Recorded<'_>,
    from_start: bool,
    targets: &mut TargetFactory<'_>,
) -> Result<(), String> {
    let Recorded { c, opts, mtu, reqs, resps, request_qp, response_qp, last_psn } = recorded;
    let ud = c.transport == "UD";
    let xrc = c.transport == "XRC";
    // UC and UD: nothing answers on the wire.
    let uc = c.transport == "UC" || ud;
    let mut target = targets(c.responder, opts.behaviour, mtu)?;
    let t: &mut dyn Target = &mut *target;
    // Memory regions for the recorded ranges; the recorded keys (and, on a live target, the
    // addresses) are rewritten to the target's.
    let mut keys = KeyMap::new();
    for (rkey, (lo, hi)) in regions(reqs) {
        let (base, ours) = t.reg_region(lo, hi - lo).map_err(|err| format!("memory for rkey {rkey:#x}: {err}"))?;
        keys.insert(rkey, (ours, lo, base));
        r.setup.push(format!("memory region {lo:#x}..{hi:#x} for rkey {rkey:#x}, from the RETH/AtomicETH operands"));
    }
    // Receive queue: RNR NAKs in the recording mean the application ran out of receives, so
    // receives are then posted one per SEND, just before it, except where the recorded
    // responder had none; otherwise the queue is kept at a depth the recorded credits give.
    // The ACKs' syndromes (READ responses and atomic ACKs carry credits by other rules).
    let answers: Vec<(Psn, Syndrome)> = resps
        .iter()
        .filter(|x| x.kind == Some(OpKind::Acknowledge))
        .filter_map(|x| x.p.ib.headers.aeth.map(|a| (x.psn, a.syndrome)))
        .collect();
    let rnr: Vec<Psn> = answers.iter().filter(|(_, s)| matches!(s, Syndrome::RnrNak { .. })).map(|(p, _)| *p).collect();
    let counted = answers.iter().find_map(|(p, s)| match s {
        Syndrome::Ack { credits } if *credits != aeth::CREDITS_INVALID => Some((*p, *credits)),
        _ => None,
    });
    let all_invalid =
        answers.iter().all(|(_, s)| !matches!(s, Syndrome::Ack { credits } if *credits != aeth::CREDITS_INVALID));
    // The recorded credit counts, read as a receive-posting schedule (replay/credits.rs): when
    // the responder counted credits and the profile does too, the replay posts receives by the
    // schedule that explains the recorded counts, instead of keeping the queue at one depth.
    let by_schedule = opts.recv_depth.is_none()
        && rnr.is_empty()
        && counted.is_some()
        && !uc
        && !xrc
        && opts.behaviour.credits == CreditPolicy::Count;
    let mut schedule: Vec<usize> = Vec::new();
    let mut unexplained: Option<(usize, credits::Unexplained)> = None;
    if by_schedule {
        let mut codes: HashMap<u32, std::collections::VecDeque<u8>> = HashMap::new();
        for (p, s) in &answers {
            if let Syndrome::Ack { credits } = s {
                if *credits != aeth::CREDITS_INVALID {
                    codes.entry(p.value()).or_default().push_back(*credits);
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        let list: Vec<credits::Request> = reqs
            .iter()
            .map(|x| {
                let consumes = match x.kind {
                    Some(OpKind::Send) => x.position.is_some_and(|p| p.starts()),
                    Some(OpKind::Write) => x.p.ib.headers.immdt.is_some(),
                    _ => false,
                } && seen.insert(x.psn.value());
                let ack_code = codes.get_mut(&x.psn.value()).and_then(|q| q.pop_front());
                credits::Request { consumes, ack_code }
            })
            .collect();
        let (s, err) = credits::infer(&list);
        r.setup.push(credits::describe(&s, |i| reqs[i].psn.value()));
        unexplained = err.map(|e| (e.at, e));
        schedule = s;
    }
    let depth = if by_schedule {
        // The deepest the queue gets under the schedule.
        let mut consumed = 0usize;
        let mut deepest = 1usize;
        for (x, &p) in reqs.iter().zip(&schedule) {
            deepest = deepest.max(p.saturating_sub(consumed));
            if matches!(x.kind, Some(OpKind::Send)) && x.position.is_some_and(|q| q.starts()) {
                consumed += 1;
            }
        }
        deepest
    } else if let Some(d) = opts.recv_depth {
        r.setup.push(format!("receive queue kept at {d} WQEs (--recv-depth)"));
        d
    } else if !rnr.is_empty() {
        r.setup.push(format!(
            "receives posted one per SEND just before it, none where the recorded responder sent an RNR NAK ({} of them)",
            rnr.len()
        ));
        1
    } else if let Some((psn, code)) = counted {
        let d = aeth::credit_count(code).unwrap_or(0) as usize + 1;
        r.setup.push(format!(
            "receive queue kept at {d} WQEs: the first ACK with a credit count (PSN {}, code {code:#04x}) leaves {} after a SEND takes one",
            psn.value(),
            d - 1
        ));
        d
    } else {
        r.setup.push(if uc {
            "receive queue kept at 32 WQEs".into()
        } else {
            "receive queue kept at 32 WQEs (the recorded ACKs carry no credit count)".into()
        });
        32
    };
    let use_srq = !uc && !xrc && all_invalid && opts.behaviour.credits == CreditPolicy::Count && !answers.is_empty();
    if use_srq {
        r.setup.push(
            "the QP takes its receives from an SRQ: the recorded ACKs carry no credits, as a QP on an SRQ sends them"
                .into(),
        );
    }
    let min_rnr_timer = answers
        .iter()
        .find_map(|(_, s)| match s {
            Syndrome::RnrNak { timer } => Some(*timer),
            _ => None,
        })
        .unwrap_or(12);
    if !rnr.is_empty() {
        r.setup.push(format!("minimum RNR timer {min_rnr_timer} from the first recorded RNR NAK"));
    }
    let peer_qp = response_qp.unwrap_or(0);
    if response_qp.is_none() && !uc {
        r.setup.push("the requester's QPN is unknown (no responses, no CM): answers go to QP 0".into());
    }
    // The longest message a receive must hold.
    let mut max_recv_len = 0u32;
    let mut cur = 0u32;
    for x in reqs.iter().filter(|x| x.kind == Some(OpKind::Send)) {
        if x.position.is_some_and(|p| p.starts()) {
            cur = 0;
        }
        cur = cur.saturating_add(x.payload().len() as u32);
        max_recv_len = max_recv_len.max(cur);
    }
    let depth32 = (depth as u32).max(1) * 2;
    // UD: the receiving QP's Q_Key is the one the datagrams carry (IBTA 10.2.5).
    let qkey = reqs.iter().find_map(|x| x.p.ib.headers.deth.map(|d| d.qkey)).unwrap_or(0);
    if ud {
        r.setup.push(format!("the receiving UD QP's Q_Key {qkey:#x}, from the first DETH"));
    }
    // XRC: an XRC SRQ of the target's domain for each SRQ number the requests name (XRCETH).
    let mut srqns: HashMap<u32, u32> = HashMap::new();
    if xrc {
        for x in reqs {
            if let Some(h) = x.p.ib.headers.xrceth {
                if let std::collections::hash_map::Entry::Vacant(v) = srqns.entry(h.xrc_srqn) {
                    v.insert(t.xrc_srq((depth as u32).max(1) * 2)?);
                }
            }
        }
        r.setup.push(format!(
            "an XRC domain with an XRC target QP and {} XRC SRQs, one per SRQ number the XRCETHs name (rewritten to softrdma's)",
            srqns.len()
        ));
    }
    let setup = QpSetup {
        qp_type: qp_type(c, QpType::XrcTgt),
        qkey,
        srq_depth: use_srq.then_some(depth32),
        peer: c.requester,
        peer_qpn: peer_qp,
        mtu,
        rq_psn: reqs[0].psn,
        depth: depth32,
        rd_atomic: 16,
        min_rnr_timer,
        max_recv_len,
    };
    let qpn = Qpn::new(t.create_qp(&setup)?);
    r.setup.push(format!(
        "softrdma's QP {:#x} stands for the recorded QP {request_qp:#x} (the requests' destination QP is rewritten, keys too)",
        qpn.value()
    ));
    let t0 = reqs.iter().chain(resps).map(|x| x.p.ts_ns).min().unwrap_or(0);
    let mut rnr_left: HashMap<u32, usize> = HashMap::new();
    for p in &rnr {
        *rnr_left.entry(p.value()).or_insert(0) += 1;
    }
    let mut backwards = 0;
    let mut last_ts = 0;
    // Read requests fed: PSN -> (va, length), for the payload check of READ responses.
    let mut reads: Vec<(Psn, u64, u32)> = Vec::new();
    let mut known_atomics: HashMap<u32, bool> = HashMap::new();
    let mut posted = 0usize;
    for (i, x) in reqs.iter().enumerate() {
        if x.p.ts_ns < last_ts {
            backwards += 1;
        }
        last_ts = last_ts.max(x.p.ts_ns);
        t.advance(time_of(x, t0));
        // A SEND takes a receive at its first packet, a WRITE with immediate at its last.
        let consumes = match x.kind {
            Some(OpKind::Send) if ud => true,
            Some(OpKind::Send) => x.position.is_some_and(|p| p.starts()),
            Some(OpKind::Write) => x.p.ib.headers.immdt.is_some(),
            _ => false,
        };
        let to_srq = x.p.ib.headers.xrceth.and_then(|h| srqns.get(&h.xrc_srqn).copied());
        if consumes && xrc {
            if let Some(n) = to_srq {
                // As many as are missing, once: a receive posted to a QP in the error state
                // completes at once and never queues (a loop until the queue is full would not
                // end; found by fuzzing).
                for _ in t.queued_srq_recvs(n)..depth {
                    t.post_srq_recv(n)?;
                }
            }
        } else if by_schedule {
            // The schedule's total before this request (it never decreases).
            while posted < schedule[i] {
                t.post_recv()?;
                posted += 1;
            }
        } else if consumes {
            if depth == 1 && !rnr.is_empty() {
                // An RNR NAK of this PSN in the recording: the application had no receive the
                // first time(s) the packet came.
                let left = rnr_left.entry(x.psn.value()).or_insert(0);
                if *left > 0 {
                    *left -= 1;
                } else if t.queued_recvs() == 0 {
                    t.post_recv()?;
                }
            } else {
                for _ in t.queued_recvs()..depth {
                    t.post_recv()?;
                }
            }
        }
        if x.kind == Some(OpKind::ReadRequest) {
            if let Some(h) = x.p.ib.headers.reth {
                reads.push((x.psn, h.va, h.dma_len));
            }
        }
        if let Some(a) = x.p.ib.headers.atomiceth {
            known_atomics.insert(x.psn.value(), t.known(a.va, 8));
        }
        let bytes = rewrite(&x.p.ib_bytes, qpn, &keys, &srqns);
        t.feed(x.p.ib.src.to_canonical(), x.p.ib.sport.unwrap_or(0), &bytes);
        r.packets_replayed += 1;
    }
    if backwards > 0 {
        r.setup
            .push(format!("{backwards} requests have capture times earlier than the one before: fed in capture order"));
    }
    // Let timers run out (an ACK still waiting, READ responses still going out).
    let tail =
        resps.iter().map(|x| time_of(x, t0)).max().unwrap_or(Instant::ZERO).max(t.now()) + Duration::from_millis(100);
    let sent = t.finish(tail);
    r.packets_sent = sent.len() as u64;
    if uc {
        r.not_compared.push(format!(
            "{} has no answers on the wire; {} packets delivered, {} receive completions",
            c.transport,
            r.packets_replayed,
            t.completions()
        ));
        return Ok(());
    }
    if let Some((at, e)) = &unexplained {
        let x = &reqs[*at];
        let frame = resps
            .iter()
            .find(|a| a.psn == x.psn && a.kind == Some(OpKind::Acknowledge) && a.p.ts_ns >= x.p.ts_ns)
            .map(|a| a.frame());
        r.mismatches.push(Mismatch {
            frame,
            psn: x.psn.value(),
            field: "credits".into(),
            recorded: format!("credit code {:#04x}", e.code),
            softrdma: e.describe(),
        });
    }
    let resps: Vec<&RecordedPacket<'_>> =
        resps.iter().filter(|x| !after(x.psn, last_psn) || x.psn == last_psn).collect();
    let known = |addr: u64, len: usize| t.known(addr, len);
    compare_answers(r, &sent, &known, &resps, from_start, &reads, &known_atomics, mtu);
    Ok(())
}

/// The responder comparison (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub(super) fn compare_answers(
    r: &mut ConversationReport,
    sent: &[Sent],
    known: &dyn Fn(u64, usize) -> bool,
    resps: &[&RecordedPacket<'_>],
    from_start: bool,
    reads: &[(Psn, u64, u32)],
    known_atomics: &HashMap<u32, bool>,
    mtu: Mtu,
) {
    let ours: Vec<&Sent> = sent.iter().collect();
    let is_ack = |op: Opcode| op.info().is_some_and(|i| i.kind == OpKind::Acknowledge);
    // softrdma's positive acknowledgements, in order: (PSN covered, the packet).
    let our_acks: Vec<(Psn, &Sent)> = ours
        .iter()
        .filter(|s| {
            let p = s.packet();
            p.aeth().is_some_and(|a| matches!(a.syndrome(), Syndrome::Ack { .. }))
        })
        .map(|s| (s.packet().bth().psn(), *s))
        .collect();
    let mut used_data: Vec<bool> = vec![false; ours.len()];
    let mut msn_offset: Option<i64> = if from_start { Some(0) } else { None };
    if !from_start {
        r.setup.push(
            "MSN offset taken from the first ACK both name (the capture may start after the first messages)".into(),
        );
    }
    let mut unknown_payload = 0;
    let mut memory_differences = 0u64;
    for x in resps {
        r.answers_expected += 1;
        let Some(rp) = recorded_packet(x) else {
            r.mismatches.push(Mismatch {
                frame: Some(x.frame()),
                psn: x.psn.value(),
                field: "answer".into(),
                recorded: "unreadable".into(),
                softrdma: "-".into(),
            });
            continue;
        };
        let raeth = rp.aeth().map(|a| (a.syndrome(), a.msn().value()));
        let ok = if is_ack(x.opcode) {
            match raeth {
                Some((Syndrome::Ack { credits }, msn)) => {
                    // Acknowledged by softrdma too: an ACK (or the last READ response / an atomic
                    // ACK) of this PSN or a later one.
                    let cover = our_acks.iter().find(|(p, _)| !after(x.psn, *p));
                    match cover {
                        None => {
                            r.mismatches.push(Mismatch {
                                frame: Some(x.frame()),
                                psn: x.psn.value(),
                                field: "answer".into(),
                                recorded: format!("ACK of PSN {} msn {msn}", x.psn.value()),
                                softrdma: "never acknowledged".into(),
                            });
                            false
                        }
                        Some((p, s)) if *p == x.psn && is_ack(s.packet().opcode()) => {
                            let sp = s.packet();
                            let (ss, smsn) = sp
                                .aeth()
                                .map(|a| (a.syndrome(), a.msn().value()))
                                .unwrap_or((Syndrome::Reserved(0), 0));
                            let off = *msn_offset.get_or_insert(i64::from(msn) - i64::from(smsn));
                            let mut rec = header_fields(&rp);
                            let mut our = header_fields(&sp);
                            rec.push(("MSN", msn.to_string()));
                            our.push(("MSN", ((i64::from(smsn) + off) & 0xff_ffff).to_string()));
                            rec.push(("syndrome", syndrome_text(Syndrome::Ack { credits })));
                            our.push(("syndrome", syndrome_text(ss)));
                            compare_fields(r, Some(x.frame()), x.psn, &rec, &our)
                        }
                        Some(_) => true, // coalesced into a later acknowledgement
                    }
                }
                Some((s, _)) => {
                    // A NAK: softrdma must NAK the same PSN the same way.
                    let same = ours.iter().any(|o| {
                        let op = o.packet();
                        op.bth().psn() == x.psn && op.aeth().is_some_and(|a| a.syndrome() == s)
                    });
                    if !same {
                        let theirs = ours
                            .iter()
                            .filter(|o| o.packet().bth().psn() == x.psn && o.packet().aeth().is_some())
                            .map(|o| {
                                syndrome_text(o.packet().aeth().map(|a| a.syndrome()).unwrap_or(Syndrome::Reserved(0)))
                            })
                            .collect::<Vec<_>>();
                        r.mismatches.push(Mismatch {
                            frame: Some(x.frame()),
                            psn: x.psn.value(),
                            field: "syndrome".into(),
                            recorded: syndrome_text(s),
                            softrdma: if theirs.is_empty() {
                                "no answer for this PSN".into()
                            } else {
                                theirs.join(", ")
                            },
                        });
                    }
                    same
                }
                None => false,
            }
        } else {
            // READ responses and atomic ACKs, packet by packet: the first unused one of the PSN.
            let found = ours
                .iter()
                .enumerate()
                .find(|(i, o)| !used_data[*i] && o.packet().bth().psn() == x.psn && !is_ack(o.packet().opcode()));
            match found {
                None => {
                    r.mismatches.push(Mismatch {
                        frame: Some(x.frame()),
                        psn: x.psn.value(),
                        field: "answer".into(),
                        recorded: name(x.opcode),
                        softrdma: "none".into(),
                    });
                    false
                }
                Some((i, o)) => {
                    used_data[i] = true;
                    let sp = o.packet();
                    let mut rec = header_fields(&rp);
                    let mut our = header_fields(&sp);
                    if let (Some((rs, rmsn)), Some(a)) = (raeth, sp.aeth()) {
                        let off = *msn_offset.get_or_insert(i64::from(rmsn) - i64::from(a.msn().value()));
                        rec.push(("MSN", rmsn.to_string()));
                        our.push(("MSN", ((i64::from(a.msn().value()) + off) & 0xff_ffff).to_string()));
                        rec.push(("syndrome", syndrome_text(rs)));
                        our.push(("syndrome", syndrome_text(a.syndrome())));
                    }
                    if x.kind == Some(OpKind::ReadResponse) {
                        // The payload, where the trace itself wrote those bytes before the READ.
                        let read = reads.iter().rev().find(|(p, _, len)| {
                            !after(*p, x.psn)
                                && x.psn.distance(*p) < (*len as usize).div_ceil(mtu.bytes()).max(1) as i32
                        });
                        match read {
                            Some((p, va, _)) => {
                                let off = x.psn.distance(*p) as u64 * mtu.bytes() as u64;
                                if known(va + off, rp.payload().len()) {
                                    memory_differences += u64::from(rp.payload() != sp.payload());
                                } else {
                                    unknown_payload += 1;
                                }
                            }
                            None => unknown_payload += 1,
                        }
                    }
                    if let (Some(ra), Some(sa)) = (rp.atomicacketh(), sp.atomicacketh()) {
                        if known_atomics.get(&x.psn.value()).copied().unwrap_or(false) {
                            memory_differences += u64::from(ra.orig_rem_data() != sa.orig_rem_data());
                        } else {
                            unknown_payload += 1;
                        }
                    }
                    compare_fields(r, Some(x.frame()), x.psn, &rec, &our)
                }
            }
        };
        r.answers_matched += u64::from(ok);
    }
    if memory_differences > 0 {
        r.not_compared.push(format!(
            "{memory_differences} READ response payloads or atomic original values differ from the bytes the trace wrote there before: the application may have changed its memory itself (not on the wire), so they are not counted as mismatches"
        ));
    }
    if unknown_payload > 0 {
        r.not_compared.push(format!(
            "{unknown_payload} READ response payloads or atomic original values: the memory they come from was not written in the trace"
        ));
    }
    // softrdma NAKs the recording does not have.
    for o in &ours {
        let p = o.packet();
        let Some(a) = p.aeth() else { continue };
        if matches!(a.syndrome(), Syndrome::Ack { .. }) {
            continue;
        }
        let psn = p.bth().psn();
        let recorded =
            resps.iter().any(|x| x.psn == psn && x.p.ib.headers.aeth.is_some_and(|ra| ra.syndrome == a.syndrome()));
        if !recorded {
            r.mismatches.push(Mismatch {
                frame: None,
                psn: psn.value(),
                field: "unexpected answer".into(),
                recorded: "none".into(),
                softrdma: format!("{} at {}", syndrome_text(a.syndrome()), o.at),
            });
        }
    }
}
