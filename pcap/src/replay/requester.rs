//! Replay as requester: softrdma sends the recorded messages, and its packets are compared.

use super::*;

/// The requester replay (see the module documentation).
pub(super) fn requester(
    r: &mut ConversationReport,
    recorded: Recorded<'_>,
    conn: Option<&CmConn>,
) -> Result<(), String> {
    let Recorded { c, opts, mtu, reqs, resps, request_qp, response_qp, last_psn } = recorded;
    let ud = c.transport == "UD";
    let uc = c.transport == "UC";
    let mut e = make_engine(c.requester, opts.behaviour, mtu);
    let pd = e.dev.alloc_pd(OWNER);
    let local = e
        .dev
        .reg_mr(pd, LOCAL_BASE, LOCAL_LEN, Access::LOCAL_WRITE)
        .map_err(|err| format!("reg_mr for the message buffers: {err}"))?;
    // The messages, from the first transmission of each PSN.
    struct Msg {
        op: SendOp,
        len: u32,
        data: Vec<u8>,
        at: Instant,
        solicited: bool,
        first_frame: u64,
        psn: Psn,
        qkey: Option<u32>,
        srqn: Option<u32>,
    }
    let t0 = reqs.iter().chain(resps).map(|x| x.p.ts_ns).min().unwrap_or(0);
    let mut msgs: Vec<Msg> = Vec::new();
    let mut firsts: BTreeMap<u32, &RecordedPacket<'_>> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut retransmitted = 0u64;
    let mut open: Option<Msg> = None;
    let mut unsupported = None;
    for x in reqs {
        if !seen.insert(x.psn.value()) {
            retransmitted += 1;
            continue;
        }
        firsts.insert(x.psn.value(), x);
        let h = &x.p.ib.headers;
        let pos = x.position.unwrap_or(Position::Only);
        if pos.starts() {
            if let Some(m) = open.take() {
                msgs.push(m);
            }
            let imm = h.immdt.map(|i| i.imm);
            let name = x.opcode.info().map_or("", |i| i.name);
            let op = match x.kind {
                Some(OpKind::Send) => match (imm, h.ieth) {
                    (Some(imm), _) => SendOp::SendWithImm { imm },
                    (None, Some(i)) => SendOp::SendWithInv { rkey: i.rkey },
                    _ => SendOp::Send,
                },
                Some(OpKind::Write) => {
                    let t = h.reth.ok_or("WRITE without RETH")?;
                    // WRITE_ONLY_WITH_IMMEDIATE carries its ImmDt; FIRST does not: read it at LAST.
                    if name.contains("IMMEDIATE") {
                        SendOp::WriteWithImm { remote_addr: t.va, rkey: t.rkey, imm: imm.unwrap_or(0) }
                    } else {
                        SendOp::Write { remote_addr: t.va, rkey: t.rkey }
                    }
                }
                Some(OpKind::ReadRequest) => {
                    let t = h.reth.ok_or("READ without RETH")?;
                    SendOp::Read { remote_addr: t.va, rkey: t.rkey }
                }
                Some(OpKind::CompareSwap) => {
                    let t = h.atomiceth.ok_or("atomic without AtomicETH")?;
                    SendOp::CompareSwap { remote_addr: t.va, rkey: t.rkey, compare: t.compare, swap: t.swap_add }
                }
                Some(OpKind::FetchAdd) => {
                    let t = h.atomiceth.ok_or("atomic without AtomicETH")?;
                    SendOp::FetchAdd { remote_addr: t.va, rkey: t.rkey, add: t.swap_add }
                }
                other => {
                    unsupported = Some(format!("{other:?} ({})", name));
                    break;
                }
            };
            let len = match (x.kind, h.reth) {
                (Some(OpKind::ReadRequest), Some(t)) => t.dma_len,
                (Some(OpKind::CompareSwap | OpKind::FetchAdd), _) => 8,
                _ => 0,
            };
            open = Some(Msg {
                op,
                len,
                data: Vec::new(),
                at: time_of(x, t0),
                solicited: false,
                first_frame: x.frame(),
                psn: x.psn,
                qkey: h.deth.map(|d| d.qkey),
                srqn: h.xrceth.map(|x| x.xrc_srqn),
            });
        }
        let Some(m) = open.as_mut() else { continue };
        if matches!(x.kind, Some(OpKind::Send | OpKind::Write)) {
            m.data.extend_from_slice(x.payload());
            m.len = m.data.len() as u32;
        }
        if pos.ends() {
            m.solicited = h.bth.is_some_and(|b| b.solicited);
            if let (SendOp::WriteWithImm { imm, .. }, Some(i)) = (&mut m.op, h.immdt) {
                *imm = i.imm;
            }
            if let (SendOp::Write { remote_addr, rkey }, Some(i)) = (m.op, h.immdt) {
                m.op = SendOp::WriteWithImm { remote_addr, rkey, imm: i.imm };
            }
            if let (SendOp::Send, Some(i)) = (m.op, h.immdt) {
                m.op = SendOp::SendWithImm { imm: i.imm };
            }
            msgs.push(open.take().expect("open message"));
        }
    }
    if let Some(u) = unsupported {
        return Err(format!("the requester's {u} messages are not replayed as work requests"));
    }
    if let Some(m) = open.take() {
        r.not_compared
            .push(format!("the last message (from frame {}) is unfinished in the capture: not posted", m.first_frame));
    }
    // Outstanding READs/atomics: the REQ's initiator depth; else the most the engine allows, so
    // that softrdma never holds back a READ the recorded requester sent.
    let rd_atomic = conn.map_or(128, |k| k.initiator_depth.max(1));
    let peer_qpn = request_qp;
    let first = reqs[0].psn;
    // RC and XRC: no transport timer of the replaying QP's own (see `timed` below).
    let timed = !ud && !uc;
    if timed {
        e.ack_timeout = 0;
    }
    bring_up(
        &mut e,
        pd,
        qp_type(c, QpType::XrcIni),
        None,
        c.responder,
        peer_qpn,
        mtu,
        Psn::new(0),
        first,
        1,
        rd_atomic,
        12,
        msgs.first().and_then(|m| m.qkey).unwrap_or(0),
    )?;
    // The recorded requester's local ACK timeout is not on the wire, and its resends followed
    // its own clock (a requester whose process was not scheduled for a while times out and
    // resends though nothing was lost). softrdma's QP runs no transport timer of its own here
    // (IBTA 9.7.6.1.3 allows timeout 0: none) and instead times out exactly where the recorded
    // one did: at each resend that no recorded NAK asked for. So its window shrinks where the
    // recorded one did, and its AckReq placement and pace stay comparable.
    let mut timeouts: Vec<Instant> = Vec::new();
    if timed {
        // When the recorded NAKs (and RNR NAKs) came, sorted: one search per resend.
        let mut naks: Vec<Instant> = resps
            .iter()
            .filter(|y| y.p.ib.headers.aeth.is_some_and(|a| !matches!(a.syndrome, Syndrome::Ack { .. })))
            .map(|y| time_of(y, t0))
            .collect();
        naks.sort_unstable();
        let mut seen = std::collections::HashSet::new();
        let mut prev: Option<(Instant, bool)> = None;
        for x in reqs {
            let at = time_of(x, t0);
            let resend = !seen.insert(x.psn.value());
            if resend && !prev.is_some_and(|(_, was)| was) {
                // A NAK recorded between the request before this resend and the resend.
                let since = prev.map_or(Instant::ZERO, |(t, _)| t);
                let i = naks.partition_point(|&t| t < since);
                let nak = naks.get(i).is_some_and(|&t| t <= at);
                if !nak {
                    timeouts.push(at);
                }
            }
            prev = Some((at, resend));
        }
        if !timeouts.is_empty() {
            r.setup.push(format!(
                "{} recorded resends that no NAK asked for (the recorded requester's timeouts) re-enacted at their times",
                timeouts.len()
            ));
        }
    }
    if ud {
        r.not_compared.push("DETH source QP: softrdma's QP has its own number".into());
    }
    r.setup.push(format!(
        "{} work requests inferred from the recorded messages (opcodes, lengths, operands, payloads), posted at their first packets' times; softrdma's QP {:#x} stands for the recorded QP {:#x}",
        msgs.len(),
        e.qpn.value(),
        response_qp.or_else(|| reqs.iter().find_map(|x| x.p.ib.headers.deth.map(|d| d.src_qp.value()))).unwrap_or(0)
    ));
    if retransmitted > 0 {
        r.not_compared
            .push(format!("{retransmitted} recorded retransmissions (softrdma's own resends depend on its timers)"));
    }
    // The PSNs each message takes.
    let span = |m: &Msg| match m.op {
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
        _ => softrdma_engine::device::packets_for(m.len, mtu.bytes() as u32),
    };
    // Events in time order: each message posted at its first packet's time; each response fed
    // at its time, but never before the message it answers was posted (a capture's clock can
    // put an ACK in the same microsecond as its request, or before it); at equal times, posts
    // first.
    let mut events: Vec<(Instant, u8, usize)> = msgs.iter().enumerate().map(|(k, m)| (m.at, 0, k)).collect();
    for (i, x) in resps.iter().enumerate() {
        let answered = msgs.iter().find(|m| !after(m.psn, x.psn) && after(m.psn + span(m), x.psn));
        events.push((time_of(x, t0).max(answered.map_or(Instant::ZERO, |m| m.at)), 1, i));
    }
    events.extend(timeouts.iter().enumerate().map(|(i, &t)| (t, 2, i)));
    events.sort_by_key(|&(t, kind, i)| (t, kind, i));
    let mut addr = LOCAL_BASE;
    let empty = HashMap::new();
    for (t, kind, i) in events {
        e.run_until(t.max(e.now));
        if kind == 2 {
            let now = e.now;
            e.dev.expire_transport_timer(e.qpn, now);
            e.drain();
            continue;
        }
        if kind == 1 {
            let x = &resps[i];
            e.feed(
                x.p.ib.src.to_canonical(),
                x.p.ib.sport.unwrap_or(0),
                &rewrite(&x.p.ib_bytes, e.qpn, &empty, &HashMap::new()),
            );
            r.packets_replayed += 1;
            continue;
        }
        let m = &msgs[i];
        let len = m.len.max(m.data.len() as u32);
        // Message buffers go round a 64 MiB ring (the engine reads a message's bytes when it
        // sends them, so only more than 64 MiB outstanding could overwrite one too early).
        let room = u64::from(len).div_ceil(64) * 64 + 64;
        if addr + room > LOCAL_BASE + RING {
            addr = LOCAL_BASE;
        }
        if !e.dev.memory().set(addr, &m.data) {
            return Err("the replay's memory limit (256 MiB of touched pages) was reached".into());
        }
        let sg_list = if len == 0 { Vec::new() } else { vec![Sge { addr, length: len, lkey: local.lkey }] };
        addr += room;
        let wr = SendWr {
            wr_id: i as u64,
            op: m.op,
            sg_list,
            signaled: true,
            fence: false,
            solicited: m.solicited,
            inline: false,
            remote_srqn: m.srqn.unwrap_or(0),
            ud: ud.then(|| softrdma_engine::wr::UdDest {
                dest: c.responder,
                remote_qpn: request_qp,
                remote_qkey: m.qkey.unwrap_or(0),
            }),
        };
        e.dev
            .post_send(e.qpn, wr)
            .map_err(|err| format!("post_send of the message at frame {}: {err}", m.first_frame))?;
        e.drain();
    }
    let end = e.now + Duration::from_millis(100);
    e.run_until(end);
    r.packets_sent = e.sent.len() as u64;
    // Compare the first transmission of each PSN.
    let mut ours: BTreeMap<u32, &Sent> = BTreeMap::new();
    let mut our_resends = 0u64;
    for s in &e.sent {
        let psn = s.packet().bth().psn().value();
        match ours.entry(psn) {
            std::collections::btree_map::Entry::Occupied(_) => our_resends += 1,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(s);
            }
        }
    }
    if our_resends > 0 {
        r.not_compared.push(format!("softrdma resent {our_resends} packets (its ACK timeout or a NAK)"));
    }
    let posted_psns: u32 = msgs.iter().map(span).sum();
    let limit = first + posted_psns;
    for (psn, x) in &firsts {
        let psn = Psn::new(*psn);
        if !after(limit, psn) || after(psn, last_psn) {
            continue;
        }
        let Some(rp) = recorded_packet(x) else { continue };
        r.answers_expected += 1;
        let ok = match ours.get(&psn.value()) {
            None => {
                r.mismatches.push(Mismatch {
                    frame: Some(x.frame()),
                    psn: psn.value(),
                    field: "request".into(),
                    recorded: name(x.opcode),
                    softrdma: "not sent".into(),
                });
                false
            }
            Some(s) => {
                let sp = s.packet();
                let mut rec = header_fields(&rp);
                let mut our = header_fields(&sp);
                if let (Some(a), Some(b)) = (rp.reth(), sp.reth()) {
                    rec.push(("RETH", format!("va {:#x} rkey {:#x} len {}", a.va(), a.rkey(), a.dma_len())));
                    our.push(("RETH", format!("va {:#x} rkey {:#x} len {}", b.va(), b.rkey(), b.dma_len())));
                }
                if let (Some(a), Some(b)) = (rp.atomiceth(), sp.atomiceth()) {
                    rec.push((
                        "AtomicETH",
                        format!("va {:#x} rkey {:#x} {:#x} {:#x}", a.va(), a.rkey(), a.swap_add(), a.compare()),
                    ));
                    our.push((
                        "AtomicETH",
                        format!("va {:#x} rkey {:#x} {:#x} {:#x}", b.va(), b.rkey(), b.swap_add(), b.compare()),
                    ));
                }
                if let (Some(a), Some(b)) = (rp.xrceth(), sp.xrceth()) {
                    rec.push(("XRCETH SRQ", format!("{:#x}", a.xrc_srqn())));
                    our.push(("XRCETH SRQ", format!("{:#x}", b.xrc_srqn())));
                }
                if let (Some(a), Some(b)) = (rp.deth(), sp.deth()) {
                    rec.push(("DETH Q_Key", format!("{:#x}", a.qkey())));
                    our.push(("DETH Q_Key", format!("{:#x}", b.qkey())));
                }
                if let (Some(a), Some(b)) = (rp.immdt(), sp.immdt()) {
                    rec.push(("ImmDt", format!("{:#x}", a.imm())));
                    our.push(("ImmDt", format!("{:#x}", b.imm())));
                }
                rec.push(("payload", digest(rp.payload())));
                our.push(("payload", digest(sp.payload())));
                compare_fields(r, Some(x.frame()), psn, &rec, &our)
            }
        };
        r.answers_matched += u64::from(ok);
    }
    Ok(())
}
