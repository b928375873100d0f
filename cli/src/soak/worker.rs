//! The soak's client processes (`softrdma soak-worker`): a requester on one device posting the
//! workload, a responder on the other checking what arrives; JSON lines with the soak on
//! stdin/stdout.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use serde::{Deserialize, Serialize};
use softrdma_device::verbs::*;

/// Outstanding operations per QP at the requester (each op holds its own buffer slot until done).
use super::workload::*;
use super::{DRAIN, RECV_DEPTH, UD_DEPTH, WINDOW};

// ---------------------------------------------------------------------------------------------
// Messages between the soak and its workers (a JSON object a line).

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RemoteQp {
    pub(super) ep: Endpoint,
    /// The responder's region of this QP: write slots, then the read area, then 3 atomic words.
    pub(super) addr: u64,
    pub(super) rkey: u32,
    /// XRC: the SRQ the requests are for.
    pub(super) srqn: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ResponderHello {
    pub(super) qps: Vec<RemoteQp>,
    pub(super) ud_qpn: u32,
    pub(super) ud_qkey: u32,
    pub(super) mtu: Mtu,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RequesterHello {
    /// One endpoint per RC QP, then the XRC initiator's.
    pub(super) eps: Vec<Endpoint>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Control {
    /// The responder's QPs (to the requester, first).
    Responder(ResponderHello),
    /// Start (requester) / the requester's endpoints (responder).
    Go(Option<RequesterHello>),
    /// Finish cleanly. To the responder: how many operations each QP's requester completed.
    Stop(Vec<u64>),
    /// The partner process is about to be killed: errors its death causes are allowed from now
    /// on (answered `true`; the traffic goes on).
    PeerDying,
    /// The partner process was killed: drain.
    PeerGone,
    /// Say your findings so far (you are about to be killed); go on as before.
    Report,
    /// The report was read: exit.
    Exit,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Done {
    pub(super) tally: Tally,
    /// Requester: operations posted and completed per QP.
    pub(super) completed: Vec<u64>,
}

/// Layout of a responder QP's region.
pub(super) struct Layout {
    pub(super) max: usize,
}

impl Layout {
    fn write_slot(&self, s: usize) -> usize {
        s * self.max
    }
    fn read_area(&self) -> usize {
        WINDOW * self.max
    }
    fn word(&self, i: usize) -> usize {
        (WINDOW + 1) * self.max + 8 * i
    }
    fn len(&self) -> usize {
        self.word(3)
    }
}

pub(super) const FA_WORD: usize = 0;
pub(super) const CS_WORD: usize = 1;
pub(super) const AW_WORD: usize = 2;

// ---------------------------------------------------------------------------------------------
// Workers.

#[derive(clap::Args, Debug)]
pub(crate) struct WorkerArgs {
    #[arg(long)]
    device: String,
    #[arg(long)]
    role: String,
    #[arg(long)]
    qps: usize,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    generation: u64,
    #[arg(long)]
    max_size: usize,
    #[arg(long)]
    ack_timeout: u8,
}

/// Reads control lines from stdin on a thread; the worker polls the channel between its polls.
pub(super) fn control_channel() -> mpsc::Receiver<Control> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<Control>(&line) {
                Ok(c) => {
                    if tx.send(c).is_err() {
                        break;
                    }
                }
                Err(e) => eprintln!("soak worker: bad control line {line:?}: {e}"),
            }
        }
    });
    rx
}

pub(super) fn say<T: Serialize>(v: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(v)?)?;
    Ok(out.flush()?)
}

pub(crate) fn worker(a: &WorkerArgs) -> Result<ExitCode> {
    let ctx = Context::open(&a.device).with_context(|| format!("opening {}", a.device))?;
    let rx = control_channel();
    match a.role.as_str() {
        "requester" => requester(&ctx, a, &rx)?,
        "responder" => responder(&ctx, a, &rx)?,
        r => bail!("unknown role {r}"),
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn options(mtu: Mtu, ack_timeout: u8) -> ConnectOptions {
    ConnectOptions { mtu, timeout: ack_timeout, ..ConnectOptions::default() }
}

/// The statuses a work request may end with once its peer is dying: the transport gave up (IBTA
/// C9-140: retry count exceeded), the request was flushed after the QP went to the error state
/// (IBTA 10.3.1: outstanding and later WRs complete in error, flushed), or the responder's device
/// could not finish it in the moment between the process's death and the cleanup of its QPs:
/// its memory was gone (NAK remote operational error, IBTA 9.7.5.2.5) or its region already
/// deregistered (NAK remote access error, IBTA 9.7.5.2.4). A live peer allows none of them.
pub(super) fn allowed_after_peer_death(s: WcStatus) -> bool {
    matches!(s, WcStatus::RetryExcErr | WcStatus::WrFlushErr | WcStatus::RemOpErr | WcStatus::RemAccessErr)
}

pub(super) struct ReqQp {
    /// When this QP last completed a work request (or started).
    last_completion: Instant,
    qp: QueuePair,
    w: Workload,
    /// Local slots: WINDOW buffers of max bytes (send source, read destination, atomic result).
    mr: MemoryRegion,
    remote_addr: u64,
    rkey: u32,
    srqn: u32,
    next: u64,
    /// Posted work requests not yet completed, in posting order: (wr_id, op index, is read-back).
    outstanding: VecDeque<(u64, u64, bool)>,
    /// Operations fully completed (every WR of it).
    completed: u64,
    /// Operations completed successfully before the first error (what the responder must have).
    completed_ok: u64,
    /// The QP went to the error state (its first error was counted; the rest flush).
    failed: bool,
    /// Atomics as the requester expects them to stand at the responder.
    fa_total: u64,
    cs_value: u64,
    /// What each outstanding atomic must return: (op index, expected original).
    atomic_expect: VecDeque<(u64, u64)>,
    read_area: Vec<u8>,
}

pub(super) fn wr_id(q: usize, k: u64, readback: bool) -> u64 {
    (q as u64) << 48 | k << 1 | u64::from(readback)
}

impl ReqQp {
    /// Ops in flight (an op with a read-back has two WRs).
    fn in_flight(&self) -> usize {
        (self.next - self.completed) as usize
    }

    fn post_next(&mut self, q: usize) -> Result<()> {
        let k = self.next;
        let op = self.w.op(k);
        let s = (k as usize) % WINDOW;
        let max = self.w.max;
        let lay = Layout { max };
        let local = s * max;
        let remote_slot = self.remote_addr + lay.write_slot(s) as u64;
        let word = |i: usize| self.remote_addr + lay.word(i) as u64;
        let (rkey, srqn) = (self.rkey, self.srqn);
        let mut wrs = Vec::with_capacity(2);
        let sge = |mr: &MemoryRegion, len: usize| if len == 0 { vec![] } else { vec![mr.sge(local..local + len)] };
        match op.kind {
            Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm => {
                self.w.content(k, &mut self.mr.as_mut_slice()[local..local + op.len]);
                let o = match op.kind {
                    Kind::Send => SendOp::Send,
                    Kind::SendImm => SendOp::SendWithImm { imm: imm_of(k) },
                    Kind::Write => SendOp::Write { remote_addr: remote_slot, rkey },
                    _ => SendOp::WriteWithImm { remote_addr: remote_slot, rkey, imm: imm_of(k) },
                };
                wrs.push((SendWr::new(wr_id(q, k, false), o, sge(&self.mr, op.len)), false));
                if matches!(op.kind, Kind::Write | Kind::WriteImm) {
                    // Read the slot back: RC executes the READ after the WRITE (IBTA 9.5: requests
                    // are executed in order), and no other op touches the slot meanwhile.
                    let rd = SendOp::Read { remote_addr: remote_slot, rkey };
                    wrs.push((SendWr::new(wr_id(q, k, true), rd, sge(&self.mr, op.len)), true));
                }
            }
            Kind::Read => {
                let rd = SendOp::Read { remote_addr: self.remote_addr + (lay.read_area() + op.offset) as u64, rkey };
                wrs.push((SendWr::new(wr_id(q, k, false), rd, sge(&self.mr, op.len)), false));
            }
            Kind::FetchAdd => {
                let add = op.value & 0xffff;
                self.atomic_expect.push_back((k, self.fa_total));
                self.fa_total = self.fa_total.wrapping_add(add);
                let o = SendOp::FetchAdd { remote_addr: word(FA_WORD), rkey, add };
                wrs.push((SendWr::new(wr_id(q, k, false), o, sge(&self.mr, 8)), false));
            }
            Kind::CmpSwap => {
                self.atomic_expect.push_back((k, self.cs_value));
                let o =
                    SendOp::CompareSwap { remote_addr: word(CS_WORD), rkey, compare: self.cs_value, swap: op.value };
                self.cs_value = op.value;
                wrs.push((SendWr::new(wr_id(q, k, false), o, sge(&self.mr, 8)), false));
            }
            Kind::AtomicWrite => {
                self.mr.as_mut_slice()[local..local + 8].copy_from_slice(&op.value.to_le_bytes());
                let o = SendOp::AtomicWrite { remote_addr: word(AW_WORD), rkey };
                // Every ATOMIC WRITE goes to one word that earlier ops' READs may still be
                // reading: a responder may execute a later request before an earlier RDMA
                // READ's data is read (IBTA 9.5, the ordering table), so the write waits for
                // them with the fence (IBV_SEND_FENCE).
                let mut wr = SendWr::new(wr_id(q, k, false), o, sge(&self.mr, 8));
                wr.fence = true;
                wrs.push((wr, false));
                let rd = SendOp::Read { remote_addr: word(AW_WORD), rkey };
                wrs.push((SendWr::new(wr_id(q, k, true), rd, sge(&self.mr, 8)), true));
            }
        }
        for (mut wr, readback) in wrs {
            wr.remote_srqn = srqn;
            self.outstanding.push_back((wr.wr_id, k, readback));
            self.qp.post_send(vec![wr])?;
        }
        self.next += 1;
        Ok(())
    }

    /// Checks a successful completion of op k (its last WR); true if the op is done.
    fn check(&mut self, k: u64, readback: bool, wc: &WorkCompletion, t: &mut Tally) {
        let op = self.w.op(k);
        let local = (k as usize % WINDOW) * self.w.max;
        let got = &self.mr.as_slice()[local..local + op.len];
        let ok = match (op.kind, readback) {
            (Kind::Write | Kind::WriteImm, true) => {
                let mut want = vec![0u8; op.len];
                self.w.content(k, &mut want);
                got == want.as_slice()
            }
            (Kind::Read, _) => got == &self.read_area[op.offset..op.offset + op.len],
            (Kind::AtomicWrite, true) => {
                if got != op.value.to_le_bytes() {
                    note!("soak: QP {} op {k} ATOMIC WRITE of {:#x} read back {got:02x?}", wc.qp_num, op.value);
                }
                got == op.value.to_le_bytes()
            }
            (Kind::FetchAdd | Kind::CmpSwap, _) => {
                let want = self.atomic_expect.pop_front();
                let v = u64::from_le_bytes(got.try_into().unwrap_or([0; 8]));
                match want {
                    Some((wk, w)) if wk == k && v == w => true,
                    Some((wk, w)) if wk == k => {
                        // A FETCH_ADD executed twice, or one lost, shows in what the next returns.
                        if op.kind == Kind::FetchAdd && v > w {
                            t.duplicated += 1;
                        } else {
                            t.corrupted += 1;
                        }
                        note!("soak: QP {} op {k} {:?} returned {v:#x}, expected {w:#x}", wc.qp_num, op.kind);
                        return;
                    }
                    _ => false,
                }
            }
            _ => true,
        };
        if !ok {
            note!("soak: QP {} op {k} {:?} len {}: data differs", wc.qp_num, op.kind, op.len);
            t.corrupted += 1;
        }
    }
}

pub(super) fn requester(ctx: &Context, a: &WorkerArgs, rx: &mpsc::Receiver<Control>) -> Result<()> {
    let max = a.max_size;
    let hello = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Control::Responder(h)) => h,
        Ok(c) => bail!("expected the responder's QPs, got {c:?}"),
        Err(e) => bail!("no responder: {e}"),
    };
    ensure!(hello.qps.len() == a.qps + 1, "the responder offered {} QPs", hello.qps.len());
    let pd = ctx.alloc_pd()?;
    let depth = (WINDOW * 2 + 4) as u32;
    let cq = ctx.create_cq(((a.qps + 1) * WINDOW * 2 + 64) as u32, None)?;
    let access = Access::LOCAL_WRITE;
    let mtu = ctx.info().active_mtu.min(hello.mtu);
    let mut qps = Vec::new();
    let mut eps = Vec::new();
    for (q, r) in hello.qps.iter().enumerate() {
        let t = if q < a.qps { QpType::Rc } else { QpType::XrcIni };
        let caps = QpCaps { max_send_wr: depth, max_recv_wr: 0, max_send_sge: 1, max_recv_sge: 0, max_inline_data: 0 };
        let caps = if t == QpType::Rc { QpCaps { max_recv_wr: 1, max_recv_sge: 1, ..caps } } else { caps };
        let qp = pd.qp_builder(t, &cq).caps(caps).build()?;
        let psn = (mix(a.seed ^ q as u64) & 0xff_ffff) as u32;
        qp.connect(psn, &r.ep, &options(mtu, a.ack_timeout))?;
        eps.push(qp.endpoint(psn));
        let w = Workload::new(a.seed, a.generation, q, max);
        let mut read_area = vec![0u8; max];
        w.read_area(&mut read_area);
        qps.push(ReqQp {
            last_completion: Instant::now(),
            qp,
            w,
            mr: pd.alloc_mr(WINDOW * max, access)?,
            remote_addr: r.addr,
            rkey: r.rkey,
            srqn: r.srqn,
            next: 0,
            outstanding: VecDeque::new(),
            completed: 0,
            completed_ok: 0,
            failed: false,
            fa_total: 0,
            cs_value: 0,
            atomic_expect: VecDeque::new(),
            read_area,
        });
    }
    // UD: datagrams to the responder's UD QP.
    let ud_cq = ctx.create_cq((UD_DEPTH * 2) as u32, None)?;
    let ud_caps =
        QpCaps { max_send_wr: UD_DEPTH as u32, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let ud = pd.qp_builder(QpType::Ud, &ud_cq).caps(ud_caps).build()?;
    let ud_opts = ConnectOptions { qkey: hello.ud_qkey, ..ConnectOptions::default() };
    ud.connect(0, &Endpoint { addr: hello.qps[0].ep.addr, qpn: hello.ud_qpn, psn: 0 }, &ud_opts)?;
    let ud_max = mtu.bytes();
    let mut ud_mr = pd.alloc_mr(UD_DEPTH * ud_max, access)?;
    let ud_dest = AddressHandle { dest: hello.qps[0].ep.addr }.ud(hello.ud_qpn, hello.ud_qkey);
    let ud_w = Workload::new(a.seed, a.generation, 1000, ud_max);
    let mut ud_next = 0u64;
    let mut ud_out = 0usize;
    say(&RequesterHello { eps })?;

    // Wait for go.
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Control::Go(_)) => {}
        Ok(c) => bail!("expected go, got {c:?}"),
        Err(e) => bail!("no go: {e}"),
    }
    let mut t = Tally::default();
    let mut peer_gone = false;
    let mut stopping = false;
    let mut deadline: Option<Instant> = None;
    loop {
        match rx.try_recv() {
            Ok(Control::Stop(_)) => stopping = true,
            Ok(Control::PeerDying) => {
                peer_gone = true;
                say(&true)?;
            }
            Ok(Control::Report) => say(&t)?,
            Ok(Control::PeerGone) => {
                stopping = true;
                peer_gone = true;
            }
            Ok(c) => bail!("unexpected {c:?}"),
            Err(mpsc::TryRecvError::Empty) => {}
            // The soak is gone: so is the point of going on.
            Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
        }
        if stopping && deadline.is_none() {
            deadline = Some(Instant::now() + DRAIN);
        }
        if !stopping {
            for (q, r) in qps.iter_mut().enumerate() {
                while !r.failed && r.in_flight() < WINDOW {
                    r.post_next(q)?;
                }
            }
            while ud_out < UD_DEPTH {
                let s = (ud_next as usize) % UD_DEPTH;
                let len = ud_w.size(mix(ud_w.stream ^ ud_next)).min(ud_max);
                ud_w.content(ud_next, &mut ud_mr.as_mut_slice()[s * ud_max..s * ud_max + len]);
                let sg = if len == 0 { vec![] } else { vec![ud_mr.sge(s * ud_max..s * ud_max + len)] };
                let mut wr = SendWr::new(ud_next, SendOp::Send, sg);
                wr.ud = Some(ud_dest);
                ud.post_send(vec![wr])?;
                ud_next += 1;
                ud_out += 1;
            }
        }
        let wcs = cq.poll(64)?;
        for wc in &wcs {
            let q = (wc.wr_id >> 48) as usize;
            let Some(r) = qps.get_mut(q) else {
                t.misordered += 1;
                continue;
            };
            match r.outstanding.front() {
                Some(&(id, k, readback)) if id == wc.wr_id => {
                    r.outstanding.pop_front();
                    let quiet = r.last_completion.elapsed();
                    r.last_completion = Instant::now();
                    if wc.status == WcStatus::Success {
                        let op = r.w.op(k);
                        let last = !matches!(op.kind, Kind::Write | Kind::WriteImm | Kind::AtomicWrite) || readback;
                        if last {
                            r.check(k, readback, wc, &mut t);
                            r.completed += 1;
                            if !r.failed {
                                r.completed_ok = r.completed;
                            }
                            t.messages += 1;
                            t.bytes += op.len as u64;
                        }
                    } else {
                        if (peer_gone && allowed_after_peer_death(wc.status))
                            || (r.failed && wc.status == WcStatus::WrFlushErr)
                        {
                            // The peer died, or the QP failed earlier and flushes the rest
                            // (counted once, as the first error).
                            t.flushed += 1;
                        } else {
                            note!(
                                "soak: QP {} op {k} {:?}: {:?} (peer alive; the QP's last completion {} ms before)",
                                wc.qp_num,
                                r.w.op(k).kind,
                                wc.status,
                                quiet.as_millis()
                            );
                            t.wrong_status += 1;
                        }
                        r.failed = true;
                        // An op ends with its first error (the QP is in error; the rest flush).
                        let op = r.w.op(k);
                        if !readback && matches!(op.kind, Kind::Write | Kind::WriteImm | Kind::AtomicWrite) {
                            // Its read-back flushes next; it completes the op then.
                        } else {
                            r.completed += 1;
                        }
                        if matches!(op.kind, Kind::FetchAdd | Kind::CmpSwap) {
                            r.atomic_expect.pop_front();
                        }
                    }
                }
                _ => {
                    note!("soak: QP {}: completion {:#x} out of order", wc.qp_num, wc.wr_id);
                    t.misordered += 1;
                }
            }
        }
        let uwcs = ud_cq.poll(64)?;
        for wc in &uwcs {
            ud_out = ud_out.saturating_sub(1);
            if wc.status == WcStatus::Success {
                t.ud_sent += 1;
            } else {
                t.wrong_status += 1;
            }
        }
        if stopping {
            let left: usize = qps.iter().map(|r| r.outstanding.len()).sum::<usize>() + ud_out;
            if left == 0 {
                break;
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                for r in &qps {
                    if let Some(&(id, k, rb)) = r.outstanding.front() {
                        eprintln!(
                            "soak: QP {} ({:?}): {} work requests never completed, the first op {k} {:?} (read-back {rb}, wr_id {id:#x}); {} ops completed",
                            r.qp.qpn(), r.qp.qp_type(), r.outstanding.len(), r.w.op(k).kind, r.completed
                        );
                    }
                }
                if ud_out > 0 {
                    note!("soak: {ud_out} UD sends never completed");
                }
                t.unfinished += left as u64;
                break;
            }
        }
        if wcs.is_empty() && uwcs.is_empty() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let completed = qps.iter().map(|r| r.completed_ok).collect();
    say(&Done { tally: t, completed })?;
    // Wait to be told to go (the soak reads the report first).
    let _ = rx.recv_timeout(Duration::from_secs(30));
    Ok(())
}

pub(super) struct RespQp {
    qp: Option<QueuePair>,
    w: Workload,
    /// The next op index whose kind the receive stream has not passed yet.
    cursor: u64,
}

impl RespQp {
    /// The next op that takes a receive, from the cursor on.
    fn next_recv_op(&self, from: u64) -> u64 {
        let mut k = from;
        while !self.w.op(k).kind.consumes_recv() {
            k += 1;
        }
        k
    }

    /// Checks receive completion `wc` with its buffer `buf` against what the stream says comes
    /// next.
    fn check(&mut self, wc: &WorkCompletion, buf: &[u8], t: &mut Tally) {
        let k = self.next_recv_op(self.cursor);
        let op = self.w.op(k);
        // Which message it is by its own account: immediate data, or its first 8 bytes.
        let named = match wc.imm {
            Some(imm) => Some(u64::from(imm ^ 0x5eed_0000)),
            None if wc.byte_len >= 8 => Workload::named(buf),
            None => None,
        };
        let lo = |x: u64| x & 0xffff_ffff;
        if let Some(n) = named {
            if lo(n) != lo(k) {
                // Resolve the 32-bit name to the nearest index around k.
                let n = (k & !0xffff_ffff) | lo(n);
                if n > k && n < k + (1 << 24) {
                    let mut skipped = 0;
                    let mut j = k;
                    while j < n {
                        skipped += 1;
                        j = self.next_recv_op(j + 1);
                    }
                    note!("soak: QP {}: message {n} arrived where {k} was due", wc.qp_num);
                    t.lost += skipped;
                    self.cursor = n + 1;
                } else {
                    note!("soak: QP {}: message {n} again (due: {k})", wc.qp_num);
                    t.duplicated += 1;
                }
                return;
            }
        }
        self.cursor = k + 1;
        let want_opcode = if op.kind == Kind::WriteImm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv };
        let imm_ok = match op.kind {
            Kind::SendImm | Kind::WriteImm => wc.imm == Some(imm_of(k)),
            _ => wc.imm.is_none(),
        };
        let len_ok = op.kind == Kind::WriteImm || wc.byte_len as usize == op.len;
        let data_ok = op.kind == Kind::WriteImm || {
            let mut want = vec![0u8; op.len];
            self.w.content(k, &mut want);
            buf.get(..op.len) == Some(&want[..])
        };
        if wc.opcode != want_opcode || !imm_ok || !len_ok {
            note!("soak: QP {} message {k} ({:?}, {} B): got {wc:?}", wc.qp_num, op.kind, op.len);
            t.lost += 1;
        } else if !data_ok {
            note!("soak: QP {} message {k} ({:?}, {} B): bytes differ", wc.qp_num, op.kind, op.len);
            t.corrupted += 1;
        } else {
            t.messages += 1;
            t.bytes += op.len as u64;
        }
    }
}

pub(super) fn responder(ctx: &Context, a: &WorkerArgs, rx: &mpsc::Receiver<Control>) -> Result<()> {
    let max = a.max_size;
    let lay = Layout { max };
    let pd = ctx.alloc_pd()?;
    let nq = a.qps + 1;
    let cq = ctx.create_cq((nq * RECV_DEPTH + 64) as u32, None)?;
    let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    // Receive buffers: RECV_DEPTH of max bytes for each QP (the last set is the XRC SRQ's).
    let rbufs = pd.alloc_mr(nq * RECV_DEPTH * max, Access::LOCAL_WRITE)?;
    let xrcd = ctx.open_xrcd(None, true, false)?;
    let srq = xrcd.create_srq(&pd, &cq, SrqAttr { max_wr: RECV_DEPTH as u32, max_sge: 1, srq_limit: 0 })?;
    let mut regions = Vec::new();
    let mut qps = Vec::new();
    let mut hello = ResponderHello { qps: Vec::new(), ud_qpn: 0, ud_qkey: 0x50a4_0001, mtu: ctx.info().active_mtu };
    let caps =
        QpCaps { max_send_wr: 4, max_recv_wr: RECV_DEPTH as u32, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    for q in 0..nq {
        let w = Workload::new(a.seed, a.generation, q, max);
        let mut mr = pd.alloc_mr(lay.len(), remote)?;
        w.read_area(&mut mr.as_mut_slice()[lay.read_area()..lay.read_area() + max]);
        let qp = if q < a.qps { pd.qp_builder(QpType::Rc, &cq).caps(caps).build()? } else { xrcd.create_tgt_qp()? };
        let srqn = if q < a.qps { 0 } else { srq.srq_num() };
        hello.qps.push(RemoteQp { ep: qp.endpoint(0), addr: mr.addr(), rkey: mr.rkey(), srqn });
        regions.push(mr);
        qps.push(RespQp { qp: Some(qp), w, cursor: 0 });
    }
    let post = |q: usize, i: usize, rbufs: &MemoryRegion, qps: &[RespQp]| -> Result<()> {
        let b = (q * RECV_DEPTH + i) * max;
        let wr = RecvWr { wr_id: (q * RECV_DEPTH + i) as u64, sg_list: vec![rbufs.sge(b..b + max)] };
        if q < a.qps {
            qps[q].qp.as_ref().expect("live").post_recv(vec![wr])?;
        } else {
            srq.post_recv(vec![wr])?;
        }
        Ok(())
    };
    // UD receives.
    let ud_cq = ctx.create_cq((UD_DEPTH * 2) as u32, None)?;
    let ud_caps =
        QpCaps { max_send_wr: 1, max_recv_wr: UD_DEPTH as u32, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let ud = pd.qp_builder(QpType::Ud, &ud_cq).caps(ud_caps).build()?;
    hello.ud_qpn = ud.qpn();
    let ud_slot = ctx.info().active_mtu.bytes() + 40;
    let ud_w = Workload::new(a.seed, a.generation, 1000, ud_slot - 40);
    let ud_mr = pd.alloc_mr(UD_DEPTH * ud_slot, Access::LOCAL_WRITE)?;
    let post_ud = |i: usize| {
        ud.post_recv(vec![RecvWr { wr_id: i as u64, sg_list: vec![ud_mr.sge(i * ud_slot..(i + 1) * ud_slot)] }])
    };
    say(&hello)?;
    let ini = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Control::Go(Some(h))) => h,
        Ok(c) => bail!("expected the requester's endpoints, got {c:?}"),
        Err(e) => bail!("no requester: {e}"),
    };
    ensure!(ini.eps.len() == nq, "the requester has {} QPs", ini.eps.len());
    for (q, r) in qps.iter().enumerate() {
        r.qp.as_ref().expect("live").connect(0, &ini.eps[q], &options(ctx.info().active_mtu, a.ack_timeout))?;
        for i in 0..RECV_DEPTH {
            post(q, i, &rbufs, &qps)?;
        }
    }
    ud.connect(
        0,
        &Endpoint { addr: ini.eps[0].addr, qpn: 0, psn: 0 },
        &ConnectOptions { qkey: hello.ud_qkey, ..ConnectOptions::default() },
    )?;
    for i in 0..UD_DEPTH {
        post_ud(i)?;
    }
    say(&true)?;

    let mut t = Tally::default();
    let mut ud_seen = std::collections::HashSet::new();
    // Receives posted and not completed, per QP (the SRQ's under the last index).
    let mut posted: Vec<usize> = vec![RECV_DEPTH; nq];
    let mut owed: Option<Vec<u64>> = None;
    let mut deadline: Option<Instant> = None;
    let mut peer_gone = false;
    loop {
        match rx.try_recv() {
            Ok(Control::Stop(c)) => {
                owed = Some(c);
                deadline = Some(Instant::now() + DRAIN);
            }
            // A responder's receives end only when it moves its QPs to the error state.
            Ok(Control::PeerDying) => say(&true)?,
            Ok(Control::Report) => say(&t)?,
            Ok(Control::PeerGone) => {
                // IBTA 10.3.1: a QP moved to the error state completes its posted receives with
                // a flush status. The SRQ's receives stay on the SRQ (IBTA 10.2.9.5): destroyed
                // with it, never completed.
                peer_gone = true;
                deadline = Some(Instant::now() + DRAIN);
                let err = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
                for r in qps.iter().take(a.qps) {
                    r.qp.as_ref().expect("live").modify(&err, AttrMask::STATE)?;
                }
                posted[a.qps] = 0;
            }
            Ok(c) => bail!("unexpected {c:?}"),
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
        }
        let wcs = cq.poll(64)?;
        for wc in &wcs {
            let slot = wc.wr_id as usize;
            let q = slot / RECV_DEPTH;
            if q >= nq {
                t.misordered += 1;
                continue;
            }
            posted[q] = posted[q].saturating_sub(1);
            if wc.status != WcStatus::Success {
                if peer_gone && wc.status == WcStatus::WrFlushErr {
                    t.flushed += 1;
                } else {
                    note!("soak: receive on QP {}: {:?}", wc.qp_num, wc.status);
                    t.wrong_status += 1;
                }
                continue;
            }
            let buf = &rbufs.as_slice()[slot * max..(slot + 1) * max];
            let buf = &buf[..(wc.byte_len as usize).min(max)];
            qps[q].check(wc, buf, &mut t);
            if !peer_gone {
                post(q, slot % RECV_DEPTH, &rbufs, &qps)?;
                posted[q] += 1;
            }
        }
        let uwcs = ud_cq.poll(64)?;
        for wc in &uwcs {
            if wc.status != WcStatus::Success {
                if !(peer_gone && wc.status == WcStatus::WrFlushErr) {
                    t.wrong_status += 1;
                }
                continue;
            }
            let i = wc.wr_id as usize;
            let buf = &ud_mr.as_slice()[i * ud_slot + 40..i * ud_slot + (wc.byte_len as usize).min(ud_slot)];
            t.ud_received += 1;
            if let Some(k) = Workload::named(buf) {
                let mut want = vec![0u8; buf.len()];
                ud_w.content(k, &mut want);
                if want != buf {
                    note!("soak: UD datagram {k}: bytes differ");
                    t.corrupted += 1;
                } else if !ud_seen.insert(k) {
                    t.ud_duplicated += 1;
                }
            }
            if !peer_gone {
                post_ud(i)?;
            }
        }
        // Done when every operation the requester completed has been received.
        if let Some(owed) = &owed {
            let all = qps.iter_mut().zip(owed).all(|(r, &n)| r.next_recv_op(r.cursor) >= n);
            if all {
                break;
            }
        }
        if peer_gone && posted.iter().all(|&p| p == 0) {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            if let Some(owed) = &owed {
                for (r, &n) in qps.iter().zip(owed) {
                    let mut k = r.next_recv_op(r.cursor);
                    while k < n {
                        t.lost += 1;
                        k = r.next_recv_op(k + 1);
                    }
                }
            }
            let left: usize = posted.iter().sum();
            if peer_gone && left > 0 {
                note!("soak: {left} receives never completed after the flush");
                t.unfinished += left as u64;
            }
            break;
        }
        if wcs.is_empty() && uwcs.is_empty() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    say(&Done { tally: t, completed: Vec::new() })?;
    let _ = rx.recv_timeout(Duration::from_secs(30));
    drop(regions);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_engine::wire::Qpn;

    /// The receive completion (and its buffer) of message k of `w` as the responder sees it.
    fn arrival(w: &Workload, k: u64) -> (WorkCompletion, Vec<u8>) {
        let op = w.op(k);
        let mut buf = vec![0u8; op.len];
        if op.kind != Kind::WriteImm {
            w.content(k, &mut buf);
        }
        let wc = WorkCompletion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: if op.kind == Kind::WriteImm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv },
            byte_len: op.len as u32,
            imm: matches!(op.kind, Kind::SendImm | Kind::WriteImm).then(|| imm_of(k)),
            invalidated_rkey: None,
            qp_num: Qpn::new(7),
            src_qp: Qpn::new(8),
            grh: false,
            src: None,
        };
        (wc, buf)
    }

    /// The first `n` operations of the stream that take a receive and name themselves (immediate
    /// data or at least 8 bytes).
    fn receive_ops(w: &Workload, n: usize) -> Vec<u64> {
        (0..).filter(|&k| w.op(k).kind.consumes_recv()).take(n).collect()
    }

    fn named(w: &Workload, k: u64) -> bool {
        let op = w.op(k);
        op.kind != Kind::Send || op.len >= 8
    }

    fn responder_qp(w: Workload) -> RespQp {
        RespQp { qp: None, w, cursor: 0 }
    }

    #[test]
    fn in_order_messages_all_count_and_nothing_else() {
        let w = Workload::new(1, 0, 0, 1 << 16);
        let mut r = responder_qp(w);
        let mut t = Tally::default();
        for k in receive_ops(&w, 200) {
            let (wc, buf) = arrival(&w, k);
            r.check(&wc, &buf, &mut t);
        }
        assert_eq!((t.messages, t.violations()), (200, 0));
    }

    #[test]
    fn a_gap_is_lost_a_repeat_is_duplicated_other_bytes_are_corrupted() {
        let w = Workload::new(3, 1, 2, 1 << 16);
        let ks: Vec<u64> = receive_ops(&w, 400).into_iter().filter(|&k| named(&w, k)).collect();
        let mut r = responder_qp(w);
        let mut t = Tally::default();
        // Deliver up to ks[9], skipping every op between: the unnamed ones in between count too.
        let (wc, buf) = arrival(&w, ks[0]);
        r.check(&wc, &buf, &mut t);
        let (wc, buf) = arrival(&w, ks[5]);
        r.check(&wc, &buf, &mut t);
        // Lost: every receive-taking op before ks[5] but ks[0] (those before ks[0] too).
        let skipped = (0..ks[5]).filter(|&k| k != ks[0] && w.op(k).kind.consumes_recv()).count() as u64;
        assert_eq!(t.lost, skipped);
        // ks[5] again.
        r.check(&wc, &buf, &mut t);
        assert_eq!(t.duplicated, 1);
        // The next one due, with one byte changed (a long enough one).
        let next =
            ks.iter().copied().find(|&k| k > ks[5] && w.op(k).kind != Kind::WriteImm && w.op(k).len > 8).unwrap();
        let mut before = ks[5] + 1;
        while before < next {
            if w.op(before).kind.consumes_recv() {
                let (wc, buf) = arrival(&w, before);
                r.check(&wc, &buf, &mut t);
            }
            before += 1;
        }
        let (wc, mut buf) = arrival(&w, next);
        let last = buf.len() - 1;
        buf[last] ^= 1;
        r.check(&wc, &buf, &mut t);
        assert_eq!(t.corrupted, 1);
        assert_eq!((t.lost, t.duplicated), (skipped, 1));
    }

    #[test]
    fn sizes_cover_zero_to_the_maximum_and_every_opcode_appears() {
        let w = Workload::new(9, 0, 0, 1 << 20);
        let ops: Vec<Op> = (0..20_000).map(|k| w.op(k)).collect();
        assert!(ops.iter().any(|o| o.len == 0));
        assert!(ops.iter().any(|o| o.len > 1 << 19));
        assert!(ops.iter().all(|o| o.len <= 1 << 20 && o.offset + o.len <= 1 << 20));
        for kind in [
            Kind::Send,
            Kind::SendImm,
            Kind::Write,
            Kind::WriteImm,
            Kind::Read,
            Kind::FetchAdd,
            Kind::CmpSwap,
            Kind::AtomicWrite,
        ] {
            assert!(ops.iter().any(|o| o.kind == kind), "{kind:?} never drawn");
        }
    }
}
