//! Scale measurements for `softrdma bench`: many idle RC QPs on one device ([`rc_scale`]), and
//! the XRC fan-in that needs N send QPs where RC needs N x M ([`xrc_fanin`]).
//!
//! Memory is read from `/proc/PID/smaps_rollup` (exact: the kernel walks the page tables) of the
//! device daemon and of this process. A client's ring arena is one memfd that the daemon creates
//! and both map, so its pages would count in the RSS of both; `Pss_Shmem` splits each shared page
//! among the processes that map it, so the daemon's and the client's `Pss_Shmem` add up to the
//! arena pages counted once. Private memory is `Anonymous` (heap, stacks). If `smaps_rollup`
//! cannot be read, `/proc/PID/status` is used instead (`RssAnon`, and half of `RssShmem` as the
//! shared share; those counters are approximate).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use serde::Serialize;
use softrdma_device::arena::WQE_SLOT;
use softrdma_device::verbs::{
    Access, CompletionQueue, ConnectOptions, Context, Mtu, QpCaps, QpType, QueuePair, RecvWr, SendOp, SendWr, SrqAttr,
    WcOpcode, WcStatus, WorkCompletion,
};

/// How long any wait for completions may take.
const T: Duration = Duration::from_secs(30);
/// Bytes of each test message.
const MSG: usize = 64;
/// Send and receive queue depth of the idle QPs (a server's idle connection).
const IDLE_WR: u32 = 16;
/// Pairs [`rc_scale`] sends a test message on (both ways), spread over all pairs.
const SAMPLES: usize = 16;

/// What [`rc_scale`] measured. Durations in seconds, memory in bytes.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    /// QPs asked for.
    pub requested: usize,
    /// QPs the device created (less than `requested` when it refused one: see `error`).
    pub created: usize,
    /// QPs brought to RTS, connected in pairs (an even number, at most `created`).
    pub connected: usize,
    /// Why it stopped short of `requested`, as the device said (None: all created and connected).
    pub error: Option<String>,
    /// The device's advertised max_qp (for the whole device, all clients together).
    pub max_qp: u64,
    /// Ring space one idle QP takes in its client's arena (virtual: send and receive ring of
    /// `IDLE_WR` slots of `WQE_SLOT` bytes each, plus their two 128-byte headers, the only part
    /// an idle QP touches).
    pub ring_bytes_per_qp: u64,
    /// Wall time to create the QPs (one `ibv_create_qp` each).
    pub create_secs: f64,
    /// Wall time to connect them all (every QP RESET -> INIT -> RTR -> RTS).
    pub connect_secs: f64,
    /// Wall time to destroy them all.
    pub destroy_secs: f64,
    /// Growth of the daemon's private memory (Anonymous) plus the arena pages (the arena is the
    /// daemon's memfd; counted once, see `arena_delta_bytes`).
    pub daemon_delta_bytes: u64,
    /// Growth of this process's private memory (Anonymous; its mapping of the arena is in
    /// `daemon_delta_bytes`).
    pub client_delta_bytes: u64,
    /// Growth of the shared ring arena's resident pages, counted once (Pss_Shmem of both).
    pub arena_delta_bytes: u64,
    /// (daemon_delta_bytes + client_delta_bytes) / connected QPs (created ones if none connected).
    pub bytes_per_qp: u64,
    /// daemon_delta_bytes per QP.
    pub daemon_bytes_per_qp: u64,
    /// client_delta_bytes per QP.
    pub client_bytes_per_qp: u64,
    /// Raw growth of the daemon's RSS (counts the arena pages it maps in full).
    pub daemon_rss_delta_bytes: u64,
    /// Raw growth of this process's RSS (counts the arena pages it maps in full).
    pub client_rss_delta_bytes: u64,
    /// The daemon's RSS before, after connecting, and after destroying everything.
    pub daemon_rss_before: u64,
    /// See `daemon_rss_before`.
    pub daemon_rss_after: u64,
    /// See `daemon_rss_before`.
    pub daemon_rss_after_destroy: u64,
    /// Pairs that carried a test SEND each way, every byte checked.
    pub pairs_checked: usize,
}

/// What [`xrc_fanin`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct XrcReport {
    /// Initiators (sending processes' connections).
    pub n: usize,
    /// SRQs on the target node.
    pub m: usize,
    /// XRC initiator QPs used (N).
    pub initiator_qps: usize,
    /// XRC target QPs (N).
    pub target_qps: usize,
    /// XRC SRQs (M).
    pub srqs: usize,
    /// Messages delivered, each checked (N x M).
    pub messages: usize,
    /// QPs RC needs on each side for the same reachability (N x M).
    pub rc_qps_per_side: usize,
    /// Wall time to set everything up (domain, SRQs, QPs, connections).
    pub setup_secs: f64,
    /// Wall time from the first post to the last receive checked.
    pub transfer_secs: f64,
}

/// Memory of one process, bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: u64,
    anon: u64,
    shmem_pss: u64,
}

fn kb_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map(|k| k << 10)
}

fn mem(pid: u32) -> Result<Mem> {
    let rollup = format!("/proc/{pid}/smaps_rollup");
    if let Ok(t) = std::fs::read_to_string(&rollup) {
        if let (Some(rss), Some(anon), Some(shmem_pss)) =
            (kb_field(&t, "Rss:"), kb_field(&t, "Anonymous:"), kb_field(&t, "Pss_Shmem:"))
        {
            return Ok(Mem { rss, anon, shmem_pss });
        }
    }
    let status = format!("/proc/{pid}/status");
    let t = std::fs::read_to_string(&status).with_context(|| format!("read {status}"))?;
    let f = |name: &str| kb_field(&t, name).with_context(|| format!("{status}: no {name}"));
    Ok(Mem { rss: f("VmRSS:")?, anon: f("RssAnon:")?, shmem_pss: f("RssShmem:")? / 2 })
}

fn grow(before: u64, after: u64) -> u64 {
    after.saturating_sub(before)
}

/// The bytes message `i` of a test carries (`tag` names the sender and receiver).
fn payload(tag: u64) -> [u8; MSG] {
    let mut b = [0u8; MSG];
    let mut x = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for (k, c) in b.chunks_mut(8).enumerate() {
        let v = if k == 0 { tag } else { x };
        c.copy_from_slice(&v.to_le_bytes());
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    b
}

fn all_ok(w: &[WorkCompletion], n: usize, what: &str) -> Result<()> {
    ensure!(w.len() == n, "{what}: {} of {n} completions within {T:?}", w.len());
    if let Some(bad) = w.iter().find(|c| c.status != WcStatus::Success) {
        bail!("{what}: completion {bad:?}");
    }
    Ok(())
}

/// Creates `qps` idle RC QPs (send and receive queues of 16, 1 SGE, no inline) on one PD and one
/// CQ of a client of the running daemon `dev`, and connects them in pairs on that device (QP 2i
/// to QP 2i+1, 4096 MTU).
///
/// Measures the wall time of the creates, of the connects (every QP to RTS: three
/// `ibv_modify_qp` each) and of the destroys, and the memory the idle connected QPs take: the
/// growth of the daemon's and of this process's memory from before the first create to after
/// the last connect (see the module doc for what is counted; the shared arena counts once).
/// Then it proves the QPs work: on up to 16 pairs spread over all of them it sends one 64-byte
/// message each way and checks the completions and every byte (an error if any is wrong).
///
/// A device that refuses a create or a connect is not an error: the report gives the count
/// reached and the device's answer (`created`, `connected`, `error`), measured up to there.
/// (Each client has one ring arena with 32 GiB of sparse ring space; an idle QP's two rings
/// take `ring_bytes_per_qp` of it, about 33 KB, so one context holds about a million of them,
/// more than the device's max_qp.)
pub fn rc_scale(dev: &str, qps: usize) -> Result<ScaleReport> {
    let ctx = Context::open(dev).with_context(|| format!("open device {dev}"))?;
    let daemon_pid = u32::try_from(ctx.info().pid).context("daemon pid")?;
    ensure!(daemon_pid != std::process::id(), "{dev} runs in this process: rc_scale measures a daemon");
    let me = std::process::id();
    let pd = ctx.alloc_pd().context("alloc_pd")?;
    // Room for the test's completions only: idle QPs complete nothing.
    let cq = ctx.create_cq(4 * SAMPLES as u32 + 16, None).context("create_cq")?;
    let mut mr = pd.alloc_mr(4 * SAMPLES * MSG, Access::LOCAL_WRITE).context("reg_mr")?;
    let caps =
        QpCaps { max_send_wr: IDLE_WR, max_recv_wr: IDLE_WR, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let ring = |n: u32| 128 + u64::from(n.next_power_of_two()) * u64::from(WQE_SLOT);
    let mut list: Vec<QueuePair> = Vec::with_capacity(qps);
    let mut error = None;

    let (d0, c0) = (mem(daemon_pid)?, mem(me)?);
    let t0 = Instant::now();
    for i in 0..qps {
        match pd.qp_builder(QpType::Rc, &cq).caps(caps).build() {
            Ok(qp) => list.push(qp),
            Err(e) => {
                error = Some(format!("create_qp refused after {i} QPs: {e}"));
                break;
            }
        }
    }
    let create_secs = t0.elapsed().as_secs_f64();
    let created = list.len();
    list.truncate(created & !1);

    let o = ConnectOptions { mtu: Mtu::Mtu4096, ..ConnectOptions::default() };
    let psn = |i: usize| (i as u32).wrapping_mul(0x9e37) & 0xff_ffff;
    let t1 = Instant::now();
    let mut connected = 0usize;
    for (p, pair) in list.chunks_exact(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let r = a
            .connect(psn(2 * p), &b.endpoint(psn(2 * p + 1)), &o)
            .and_then(|()| b.connect(psn(2 * p + 1), &a.endpoint(psn(2 * p)), &o));
        if let Err(e) = r {
            error.get_or_insert(format!("connect refused after {connected} QPs in RTS (pair {p}): {e}"));
            break;
        }
        connected += 2;
    }
    let connect_secs = t1.elapsed().as_secs_f64();
    let (d1, c1) = (mem(daemon_pid)?, mem(me)?);

    // The test traffic: pair p sends A->B and B->A; buffers: 4 slots per sample
    // (A's send, B's send, A's receive, B's receive).
    let pairs = connected / 2;
    let stride = pairs.div_ceil(SAMPLES).max(1);
    let sample: Vec<usize> = (0..pairs).step_by(stride).collect();
    for (s, &p) in sample.iter().enumerate() {
        for side in 0..2 {
            let tag = ((p as u64) << 1 | side as u64) + 1;
            let at = (4 * s + side) * MSG;
            mr.as_mut_slice()[at..at + MSG].copy_from_slice(&payload(tag));
        }
    }
    for (s, &p) in sample.iter().enumerate() {
        for side in 0..2 {
            let at = (4 * s + 2 + side) * MSG;
            let wr = RecvWr { wr_id: (4 * s + 2 + side) as u64, sg_list: vec![mr.sge(at..at + MSG)] };
            list[2 * p + side].post_recv(vec![wr]).with_context(|| format!("post_recv on pair {p}"))?;
        }
    }
    for (s, &p) in sample.iter().enumerate() {
        for side in 0..2 {
            let at = (4 * s + side) * MSG;
            let wr = SendWr::new((4 * s + side) as u64, SendOp::Send, vec![mr.sge(at..at + MSG)]);
            list[2 * p + side].post_send(vec![wr]).with_context(|| format!("post_send on pair {p}"))?;
        }
    }
    let want = 4 * sample.len();
    let got = cq.wait(want, T)?;
    all_ok(&got, want, "test SENDs on the scaled QPs")?;
    for w in &got {
        let slot = w.wr_id as usize;
        let (s, kind) = (slot / 4, slot % 4);
        let p = *sample.get(s).with_context(|| format!("completion with unknown wr_id {}", w.wr_id))?;
        if kind < 2 {
            ensure!(w.opcode == WcOpcode::Send, "pair {p}: send completion {w:?}");
            continue;
        }
        // Slot 2 is A's receive: B (side 1) sent it; slot 3 is B's, from A.
        let (receiver, sender) = (kind - 2, 3 - kind);
        ensure!(
            w.opcode == WcOpcode::Recv
                && w.byte_len as usize == MSG
                && w.qp_num.value() == list[2 * p + receiver].qpn(),
            "pair {p}: receive completion {w:?}"
        );
        let tag = ((p as u64) << 1 | sender as u64) + 1;
        ensure!(mr.as_slice()[slot * MSG..(slot + 1) * MSG] == payload(tag), "pair {p}: received data differs");
    }

    let t2 = Instant::now();
    for qp in list {
        let n = qp.qpn();
        qp.destroy().map_err(|(_, e)| e).with_context(|| format!("destroy QP {n:#x}"))?;
    }
    let destroy_secs = t2.elapsed().as_secs_f64();
    drop((mr, cq, pd));
    let d2 = mem(daemon_pid)?;

    let arena = grow(d0.shmem_pss + c0.shmem_pss, d1.shmem_pss + c1.shmem_pss);
    let daemon_delta = grow(d0.anon, d1.anon) + arena;
    let client_delta = grow(c0.anon, c1.anon);
    let per = |b: u64| b / (if connected > 0 { connected } else { created.max(1) }) as u64;
    Ok(ScaleReport {
        requested: qps,
        created,
        connected,
        error,
        max_qp: u64::from(ctx.info().limits.max_qp),
        ring_bytes_per_qp: ring(IDLE_WR) * 2,
        create_secs,
        connect_secs,
        destroy_secs,
        daemon_delta_bytes: daemon_delta,
        client_delta_bytes: client_delta,
        arena_delta_bytes: arena,
        bytes_per_qp: per(daemon_delta + client_delta),
        daemon_bytes_per_qp: per(daemon_delta),
        client_bytes_per_qp: per(client_delta),
        daemon_rss_delta_bytes: grow(d0.rss, d1.rss),
        client_rss_delta_bytes: grow(c0.rss, c1.rss),
        daemon_rss_before: d0.rss,
        daemon_rss_after: d1.rss,
        daemon_rss_after_destroy: d2.rss,
        pairs_checked: sample.len(),
    })
}

/// XRC fan-in across two devices, in this process: on `dev_tgt` an XRC domain with `m` XRC SRQs
/// (each with its own CQ) and `n` XRC target QPs; on `dev_ini` `n` XRC initiator QPs, initiator
/// i connected to target QP i. Every initiator sends one 64-byte message to every SRQ (the SRQ
/// named per work request, `remote_srqn`), so N send QPs reach M receive queues where RC would
/// need a QP per (initiator, queue) pair: N x M on each side.
///
/// Checks every message: each SRQ receives exactly one from each initiator, through that
/// initiator's target QP, with the bytes that name sender and SRQ; any missing, duplicate or
/// wrong message is an error. Measures the setup and transfer wall time.
pub fn xrc_fanin(dev_ini: &str, dev_tgt: &str, n: usize, m: usize) -> Result<XrcReport> {
    ensure!(n > 0 && m > 0, "xrc_fanin needs n > 0 and m > 0 (got {n}, {m})");
    let t0 = Instant::now();
    let ctx_t = Context::open(dev_tgt).with_context(|| format!("open device {dev_tgt}"))?;
    let ctx_i = Context::open(dev_ini).with_context(|| format!("open device {dev_ini}"))?;

    // Target node: domain, SRQs (one CQ each, so arrivals are counted per SRQ), target QPs.
    let xrcd = ctx_t.open_xrcd(None, true, false).context("open_xrcd")?;
    let pd_t = ctx_t.alloc_pd().context("alloc_pd (target)")?;
    let mr_t = pd_t.alloc_mr(n * m * MSG, Access::LOCAL_WRITE).context("reg_mr (target)")?;
    let cqs: Vec<CompletionQueue> =
        (0..m).map(|_| ctx_t.create_cq(n as u32 + 1, None)).collect::<Result<_, _>>().context("create_cq (SRQ)")?;
    let mut srqs = Vec::with_capacity(m);
    for (j, cq) in cqs.iter().enumerate() {
        let srq = xrcd
            .create_srq(&pd_t, cq, SrqAttr { max_wr: n as u32, max_sge: 1, srq_limit: 0 })
            .with_context(|| format!("create XRC SRQ {j}"))?;
        let wrs = (0..n)
            .map(|k| {
                let slot = j * n + k;
                RecvWr { wr_id: slot as u64, sg_list: vec![mr_t.sge(slot * MSG..(slot + 1) * MSG)] }
            })
            .collect();
        srq.post_recv(wrs).with_context(|| format!("post_srq_recv on SRQ {j}"))?;
        srqs.push(srq);
    }
    let tgts: Vec<QueuePair> =
        (0..n).map(|_| xrcd.create_tgt_qp()).collect::<Result<_, _>>().context("create XRC target QP")?;

    // Initiator node: N send-only QPs, one per target QP.
    let pd_i = ctx_i.alloc_pd().context("alloc_pd (initiator)")?;
    let cq_i = ctx_i.create_cq((n * m) as u32 + 1, None).context("create_cq (initiator)")?;
    let mut mr_i = pd_i.alloc_mr(n * m * MSG, Access::LOCAL_WRITE).context("reg_mr (initiator)")?;
    let caps = QpCaps { max_send_wr: m as u32, max_recv_wr: 0, max_send_sge: 1, max_recv_sge: 0, max_inline_data: 0 };
    let inis: Vec<QueuePair> = (0..n)
        .map(|_| pd_i.qp_builder(QpType::XrcIni, &cq_i).caps(caps).build())
        .collect::<Result<_, _>>()
        .context("create XRC initiator QP")?;
    let o = ConnectOptions { mtu: Mtu::Mtu4096, ..ConnectOptions::default() };
    for (i, (ini, tgt)) in inis.iter().zip(&tgts).enumerate() {
        let (ps, pt) = (100 + i as u32, 5000 + i as u32);
        ini.connect(ps, &tgt.endpoint(pt), &o).with_context(|| format!("connect initiator {i}"))?;
        tgt.connect(pt, &ini.endpoint(ps), &o).with_context(|| format!("connect target QP {i}"))?;
    }
    // Message (i, j): initiator i to SRQ j; its first 8 bytes are the tag.
    let tag = |i: usize, j: usize| ((i as u64) << 32 | j as u64) + 1;
    for i in 0..n {
        for j in 0..m {
            let at = (i * m + j) * MSG;
            mr_i.as_mut_slice()[at..at + MSG].copy_from_slice(&payload(tag(i, j)));
        }
    }
    let setup_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    for (i, ini) in inis.iter().enumerate() {
        let wrs = srqs
            .iter()
            .enumerate()
            .map(|(j, srq)| {
                let at = (i * m + j) * MSG;
                let mut w = SendWr::new((i * m + j) as u64, SendOp::Send, vec![mr_i.sge(at..at + MSG)]);
                w.remote_srqn = srq.srq_num();
                w
            })
            .collect();
        ini.post_send(wrs).with_context(|| format!("post_send on initiator {i}"))?;
    }
    let sent = cq_i.wait(n * m, T)?;
    all_ok(&sent, n * m, "XRC SENDs")?;
    let mut delivered = 0;
    for (j, cq) in cqs.iter().enumerate() {
        let got = cq.wait(n, T)?;
        all_ok(&got, n, &format!("SRQ {j} receives"))?;
        let mut from = vec![false; n];
        for w in &got {
            let slot = w.wr_id as usize;
            ensure!(
                w.opcode == WcOpcode::Recv && w.byte_len as usize == MSG && slot / n == j,
                "SRQ {j}: completion {w:?}"
            );
            let data = &mr_t.as_slice()[slot * MSG..(slot + 1) * MSG];
            let t = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")).wrapping_sub(1);
            let (i, jj) = ((t >> 32) as usize, (t & 0xffff_ffff) as usize);
            ensure!(i < n && jj == j, "SRQ {j}: message for SRQ {jj} from initiator {i}");
            ensure!(data == payload(tag(i, j)), "SRQ {j}: message from initiator {i} is corrupt");
            ensure!(!from[i], "SRQ {j}: two messages from initiator {i}");
            ensure!(
                w.qp_num.value() == tgts[i].qpn(),
                "SRQ {j}: initiator {i}'s message came through QP {:#x}, not its target QP",
                w.qp_num.value()
            );
            from[i] = true;
            delivered += 1;
        }
    }
    let transfer_secs = t1.elapsed().as_secs_f64();
    ensure!(delivered == n * m, "{delivered} of {} XRC messages delivered", n * m);
    // Objects go in dependency order: QPs and SRQs before their domain, CQs and PDs.
    drop(inis);
    drop(tgts);
    drop(srqs);
    drop((xrcd, cqs, cq_i, mr_i, mr_t, pd_i, pd_t));

    Ok(XrcReport {
        n,
        m,
        initiator_qps: n,
        target_qps: n,
        srqs: m,
        messages: delivered,
        rc_qps_per_side: n * m,
        setup_secs,
        transfer_secs,
    })
}
