//! `softrdma demo`: the main job. It starts two devices as daemons (srdma0 on 127.0.0.1 and
//! srdma1 on 127.0.0.2, a private runtime dir, light loss injected on both, every packet
//! captured), then runs real verbs traffic between them over RoCEv2/UDP and checks every byte:
//! - RC: SEND, RDMA WRITE (with immediate), RDMA READ, FETCH_ADD and CMP_SWAP;
//! - UD datagrams;
//! - an XRC fan-in: two separate client processes on srdma1 share one XRC domain through a
//!   file; the first creates the target QP, the second opens it (`ibv_open_qp`); each has its
//!   own XRC SRQ; one initiator QP on srdma0 reaches both SRQs through that one target QP.
//!
//! It prints a table (operations, bytes, time, throughput, retransmissions, NAKs) and the paths of
//! the captures, which it checks (every packet has a valid ICRC) after stopping the devices.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use serde::{Deserialize, Serialize};
use softrdma_device::daemon;
use softrdma_device::verbs::*;

const T: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Directory for the captures and the devices' runtime files (default: a new one under the
    /// system temp dir).
    #[arg(long, short = 'w')]
    dir: Option<PathBuf>,
    /// Loss injected on both devices' transmit paths.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Operations per workload.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    ops: u32,
    /// Seed of the fault injection.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// UDP port of the two devices (RoCEv2's 4791; another one lets the demo run beside devices
    /// that already own 4791 on those addresses).
    #[arg(long, default_value_t = 4791)]
    port: u16,
    /// One UDP send per packet instead of the devices' default UDP GSO batching.
    #[arg(long)]
    no_gso: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Where the QPs run: `provider` (each process runs the engine for its own QPs on the
    /// device's steered port; XRC domains, SRQs and target QPs are the daemon's) or `device` (the
    /// daemons run every QP).
    #[arg(long, default_value = "provider", value_parser = ["provider", "device"])]
    datapath: String,
}

/// Opens device `name` on the data path `datapath` ("provider" or "device").
fn open(name: &str, datapath: &str) -> Result<Context> {
    Ok(if datapath == "provider" { Context::provider(name)? } else { Context::open(name)? })
}

#[derive(Debug, Serialize)]
struct Row {
    workload: String,
    ops: usize,
    bytes: u64,
    ms: f64,
    ok: bool,
    note: String,
}

/// Stops the devices it started, whatever happens.
struct Devices {
    names: Vec<String>,
}

impl Drop for Devices {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = daemon::down(n);
        }
    }
}

fn pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn expect(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern(&mut v, seed);
    v
}

struct Rc {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
}

fn rc_side(ctx: &Context, t: QpType) -> Result<Rc> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024, None)?;
    let caps = QpCaps { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp = pd.qp_builder(t, &cq).caps(caps).build()?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(4 << 20, access)?;
    Ok(Rc { qp, cq, mr, _pd: pd })
}

fn ok_all(w: &[WorkCompletion], n: usize, what: &str) -> Result<()> {
    ensure!(w.len() == n, "{what}: {} of {n} completions within {T:?}", w.len());
    if let Some(bad) = w.iter().find(|c| c.status != WcStatus::Success) {
        bail!("{what}: completion {bad:?}");
    }
    Ok(())
}

/// Posts `n` requests made by `mk`, at most `window` outstanding; returns the send completions.
fn pipeline(a: &Rc, n: usize, window: usize, mut mk: impl FnMut(usize) -> SendWr) -> Result<Vec<WorkCompletion>> {
    let mut done = Vec::with_capacity(n);
    let mut posted = 0;
    while done.len() < n {
        while posted < n && posted - done.len() < window {
            a.qp.post_send(vec![mk(posted)])?;
            posted += 1;
        }
        let got = a.cq.wait(1, T)?;
        ensure!(!got.is_empty(), "no completion within {T:?} ({} of {n} done)", done.len());
        done.extend(got);
    }
    Ok(done)
}

const MSG: usize = 4096;
/// Message slots in the XRC initiator's 4 MiB region (message i is sent from slot i % this).
const SENDER_SLOTS: usize = (4 << 20) / MSG;
const BIG: usize = 64 << 10;

fn rc_workloads(c0: &Context, c1: &Context, ops: usize, rows: &mut Vec<Row>) -> Result<()> {
    let (mut a, mut b) = (rc_side(c0, QpType::Rc)?, rc_side(c1, QpType::Rc)?);
    let mtu = c0.info().active_mtu.min(c1.info().active_mtu);
    // Timeout 14 (67 ms), as ibv_rc_pingpong uses: shorter ones make a slow receiver (a debug
    // build on a loaded 2-core machine) face a go-back-N storm it cannot drain.
    let o = ConnectOptions { mtu, ..ConnectOptions::default() };
    a.qp.connect(1000, &b.qp.endpoint(5000), &o)?;
    b.qp.connect(5000, &a.qp.endpoint(1000), &o)?;

    // SEND: `ops` messages of 4 KiB, each checked at the receiver.
    let slots = (4 << 20) / MSG;
    let t0 = Instant::now();
    let mut recvs = Vec::new();
    let mut posted_recv = 0;
    let mut check_ok = true;
    let mut sends = Vec::new();
    let mut sent = 0;
    while recvs.len() < ops {
        while posted_recv < ops && posted_recv - recvs.len() < 128 {
            let s = posted_recv % slots;
            b.qp.post_recv(vec![RecvWr {
                wr_id: posted_recv as u64,
                sg_list: vec![b.mr.sge(s * MSG..(s + 1) * MSG)],
            }])?;
            posted_recv += 1;
        }
        while sent < ops && sent < posted_recv && sent - sends.len() < 64 {
            // Message i's content goes into its slot just before it is posted; the slot's previous
            // message (i - slots) completed long ago (at most 64 are outstanding).
            let s = sent % slots;
            pattern(&mut a.mr.as_mut_slice()[s * MSG..(s + 1) * MSG], sent as u64);
            a.qp.post_send(vec![SendWr::new(sent as u64, SendOp::Send, vec![a.mr.sge(s * MSG..(s + 1) * MSG)])])?;
            sent += 1;
        }
        // Poll both sides without blocking on either: the sender may be waiting for its own
        // completions before it can send what the receiver waits for.
        let sent_done = a.cq.poll(64)?;
        let got = b.cq.poll(64)?;
        if sent_done.is_empty() && got.is_empty() {
            ensure!(t0.elapsed() < T, "SEND: no completion within {T:?}");
            std::thread::sleep(Duration::from_micros(20));
        }
        sends.extend(sent_done);
        for w in &got {
            let s = w.wr_id as usize % slots;
            check_ok &= w.status == WcStatus::Success
                && w.byte_len as usize == MSG
                && b.mr.as_slice()[s * MSG..(s + 1) * MSG] == expect(w.wr_id, MSG)[..];
        }
        recvs.extend(got);
    }
    while sends.len() < ops {
        let got = a.cq.wait(ops - sends.len(), T)?;
        ensure!(!got.is_empty(), "SEND: send completions missing");
        sends.extend(got);
    }
    ok_all(&sends, ops, "SEND")?;
    rows.push(Row {
        workload: "RC SEND 4 KiB".into(),
        ops,
        bytes: (ops * MSG) as u64,
        ms: t0.elapsed().as_secs_f64() * 1e3,
        ok: check_ok,
        note: "each message checked at the receiver".into(),
    });

    // RDMA WRITE: `ops` writes of 64 KiB into b, the last one with immediate data.
    pattern(&mut a.mr.as_mut_slice()[..BIG], 77);
    b.qp.post_recv(vec![RecvWr { wr_id: 9, sg_list: vec![] }])?;
    let slots = (4 << 20) / BIG;
    let t0 = Instant::now();
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let done = pipeline(&a, ops, 16, |i| {
        let remote_addr = raddr + ((i % slots) * BIG) as u64;
        let op = if i + 1 == ops {
            SendOp::WriteWithImm { remote_addr, rkey, imm: 0xd00d }
        } else {
            SendOp::Write { remote_addr, rkey }
        };
        SendWr::new(i as u64, op, vec![a.mr.sge(0..BIG)])
    })?;
    ok_all(&done, ops, "WRITE")?;
    let imm = b.cq.wait(1, T)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let written = (0..ops.min(slots)).all(|s| b.mr.as_slice()[s * BIG..(s + 1) * BIG] == expect(77, BIG)[..]);
    let imm_ok = imm.len() == 1 && imm[0].imm == Some(0xd00d) && imm[0].opcode == WcOpcode::RecvRdmaWithImm;
    rows.push(Row {
        workload: "RC RDMA WRITE 64 KiB".into(),
        ops,
        bytes: (ops * BIG) as u64,
        ms,
        ok: written && imm_ok,
        note: "target memory checked; last one with immediate".into(),
    });

    // RDMA READ: `ops` reads of 64 KiB from b.
    pattern(&mut b.mr.as_mut_slice()[..BIG], 99);
    let t0 = Instant::now();
    let raddr = b.mr.addr();
    let laddr_slots = (4 << 20) / BIG;
    let done = pipeline(&a, ops, 8, |i| {
        let s = i % laddr_slots;
        SendWr::new(i as u64, SendOp::Read { remote_addr: raddr, rkey }, vec![a.mr.sge(s * BIG..(s + 1) * BIG)])
    })?;
    ok_all(&done, ops, "READ")?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let read_ok = (0..ops.min(laddr_slots)).all(|s| a.mr.as_slice()[s * BIG..(s + 1) * BIG] == expect(99, BIG)[..]);
    rows.push(Row {
        workload: "RC RDMA READ 64 KiB".into(),
        ops,
        bytes: (ops * BIG) as u64,
        ms,
        ok: read_ok,
        note: "local memory checked".into(),
    });

    // Atomics: `ops` FETCH_ADDs of 1 on one word, then a CMP_SWAP that must see their sum.
    b.mr.as_mut_slice()[..8].copy_from_slice(&0u64.to_ne_bytes());
    let t0 = Instant::now();
    let done = pipeline(&a, ops, 16, |i| {
        let op = SendOp::FetchAdd { remote_addr: raddr, rkey, add: 1 };
        SendWr::new(i as u64, op, vec![a.mr.sge(8 * (i % 4096)..8 * (i % 4096) + 8)])
    })?;
    ok_all(&done, ops, "FETCH_ADD")?;
    let cs = SendOp::CompareSwap { remote_addr: raddr, rkey, compare: ops as u64, swap: 0xabcd };
    a.qp.post_send(vec![SendWr::new(1 << 40, cs, vec![a.mr.sge(BIG..BIG + 8)])])?;
    ok_all(&a.cq.wait(1, T)?, 1, "CMP_SWAP")?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let word = |m: &MemoryRegion, at: usize| u64::from_ne_bytes(m.as_slice()[at..at + 8].try_into().expect("8 bytes"));
    let mut seen: Vec<u64> = (0..ops).map(|i| word(&a.mr, 8 * (i % 4096))).collect();
    seen.sort_unstable();
    let atomics_ok =
        seen == (0..ops as u64).collect::<Vec<_>>() && word(&a.mr, BIG) == ops as u64 && word(&b.mr, 0) == 0xabcd;
    rows.push(Row {
        workload: "RC atomics".into(),
        ops: ops + 1,
        bytes: 8 * (ops as u64 + 1),
        ms,
        ok: atomics_ok,
        note: "each FETCH_ADD saw a distinct value; CMP_SWAP saw the sum".into(),
    });
    drop((a, b));
    Ok(())
}

fn ud_workload(c0: &Context, c1: &Context, ops: usize, rows: &mut Vec<Row>) -> Result<()> {
    let (mut a, b) = (rc_side(c0, QpType::Ud)?, rc_side(c1, QpType::Ud)?);
    let o = ConnectOptions::default();
    a.qp.connect(0, &b.qp.endpoint(0), &o)?;
    b.qp.connect(0, &a.qp.endpoint(0), &o)?;
    const D: usize = 1024;
    const SLOT: usize = D + 40;
    // At most the receive queue's depth of datagrams in flight (more would be ENOMEM at post).
    let n = ops.min(250);
    for i in 0..n {
        b.qp.post_recv(vec![RecvWr { wr_id: i as u64, sg_list: vec![b.mr.sge(i * SLOT..(i + 1) * SLOT)] }])?;
        // Each datagram says which one it is (a lost one shifts the rest into earlier buffers).
        let m = &mut a.mr.as_mut_slice()[i * D..(i + 1) * D];
        m[..8].copy_from_slice(&(i as u64).to_le_bytes());
        pattern(&mut m[8..], 1000 + i as u64);
    }
    let ah = AddressHandle { dest: c1.gid_addr() };
    let t0 = Instant::now();
    let dest = ah.ud(b.qp.qpn(), o.qkey);
    let done = pipeline(&a, n, 32, |i| {
        let mut w = SendWr::new(i as u64, SendOp::Send, vec![a.mr.sge(i * D..(i + 1) * D)]);
        w.ud = Some(dest);
        w
    })?;
    ok_all(&done, n, "UD SEND")?;
    // UD is unreliable: what the injected loss dropped never arrives. Wait until quiet.
    let mut got = Vec::new();
    let mut last = Instant::now();
    while got.len() < n && last.elapsed() < Duration::from_millis(300) {
        let w = b.cq.poll(64)?;
        if !w.is_empty() {
            last = Instant::now();
        }
        got.extend(w);
        std::thread::sleep(Duration::from_micros(200));
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut seen = std::collections::HashSet::new();
    let intact = got.iter().all(|w| {
        let slot = &b.mr.as_slice()[w.wr_id as usize * SLOT + 40..(w.wr_id as usize + 1) * SLOT];
        let i = u64::from_le_bytes(slot[..8].try_into().expect("8 bytes"));
        w.status == WcStatus::Success
            && w.byte_len as usize == SLOT
            && seen.insert(i)
            && slot[8..] == expect(1000 + i, D - 8)[..]
    });
    rows.push(Row {
        workload: "UD SEND 1 KiB".into(),
        ops: n,
        bytes: (got.len() * D) as u64,
        ms,
        ok: intact && !got.is_empty(),
        note: format!("{} of {n} delivered (UD does not retransmit); each delivered one intact, none twice", got.len()),
    });
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct WorkerHello {
    srqn: u32,
    tgt_qpn: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct WorkerDone {
    received: usize,
    bytes: u64,
    intact: bool,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(args: &[String]) -> Result<Worker> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("demo-worker")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting an XRC worker process")?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Worker { child, stdin, stdout })
    }
    fn read<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        serde_json::from_str(&line).with_context(|| format!("XRC worker said {line:?}"))
    }
    fn write<T: Serialize>(&mut self, v: &T) -> Result<()> {
        writeln!(self.stdin, "{}", serde_json::to_string(v)?)?;
        Ok(self.stdin.flush()?)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn xrc_workload(c0: &Context, dir: &Path, ops: usize, datapath: &str, rows: &mut Vec<Row>) -> Result<()> {
    let file = dir.join("xrc-domain");
    let per = ops.div_ceil(2);
    let common = |role: &str| -> Vec<String> {
        vec![
            "--device".into(),
            "srdma1".into(),
            "--xrcd-file".into(),
            file.display().to_string(),
            "--role".into(),
            role.into(),
            "--messages".into(),
            per.to_string(),
            "--datapath".into(),
            datapath.into(),
        ]
    };
    let mut w1 = Worker::spawn(&common("create"))?;
    let h1: WorkerHello = w1.read()?;
    let mut w2 = Worker::spawn(&common("join"))?;
    w2.write(&h1.tgt_qpn)?;
    let h2: WorkerHello = w2.read()?;
    ensure!(h2.tgt_qpn == h1.tgt_qpn, "the second process opened another QP");
    let ini = rc_side(c0, QpType::XrcIni)?;
    let tgt = Endpoint { addr: "127.0.0.2".parse()?, qpn: h1.tgt_qpn, psn: 0 };
    let o = ConnectOptions::default();
    ini.qp.connect(300, &tgt, &o)?;
    w1.write(&ini.qp.endpoint(300))?;
    let _ready: bool = w1.read()?;
    let mut m = ini.mr;
    let slots = m.len() / MSG;
    for i in 0..(2 * per).min(slots) {
        pattern(&mut m.as_mut_slice()[i * MSG..(i + 1) * MSG], 5000 + i as u64);
    }
    let t0 = Instant::now();
    let rc = Rc { qp: ini.qp, cq: ini.cq, mr: m, _pd: ini._pd };
    let srqs = [h1.srqn, h2.srqn];
    let done = pipeline(&rc, 2 * per, 32, |i| {
        let s = i % slots;
        let mut w = SendWr::new(i as u64, SendOp::Send, vec![rc.mr.sge(s * MSG..(s + 1) * MSG)]);
        w.remote_srqn = srqs[i % 2];
        w
    })?;
    ok_all(&done, 2 * per, "XRC SEND")?;
    let d1: WorkerDone = w1.read()?;
    let d2: WorkerDone = w2.read()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    w1.write(&"exit")?;
    w2.write(&"exit")?;
    rows.push(Row {
        workload: "XRC SEND fan-in 4 KiB".into(),
        ops: 2 * per,
        bytes: d1.bytes + d2.bytes,
        ms,
        ok: d1.intact && d2.intact && d1.received == per && d2.received == per,
        note: format!(
            "1 initiator -> 1 target QP -> 2 SRQs in 2 processes sharing one XRC domain file ({} + {} received)",
            d1.received, d2.received
        ),
    });
    Ok(())
}

/// `softrdma demo-worker`: one receiving process of the XRC fan-in.
#[derive(clap::Args, Debug)]
pub(crate) struct WorkerArgs {
    #[arg(long)]
    device: String,
    #[arg(long)]
    xrcd_file: PathBuf,
    /// `create`: creates the domain and the target QP; `join`: opens both.
    #[arg(long)]
    role: String,
    #[arg(long)]
    messages: usize,
    #[arg(long, default_value = "device")]
    datapath: String,
}

pub(crate) fn worker(a: &WorkerArgs) -> Result<ExitCode> {
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    let mut read_line = |line: &mut String| -> Result<String> {
        line.clear();
        stdin.read_line(line)?;
        Ok(line.trim().to_owned())
    };
    let ctx = open(&a.device, &a.datapath)?;
    let create = a.role == "create";
    let file = std::fs::OpenOptions::new().create(create).truncate(false).read(true).write(true).open(&a.xrcd_file)?;
    let xrcd = ctx.open_xrcd(Some(&file), create, false)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024, None)?;
    let n = a.messages;
    let srq = xrcd.create_srq(&pd, &cq, SrqAttr { max_wr: n as u32 + 1, max_sge: 1, srq_limit: 0 })?;
    let mr = pd.alloc_mr(n * MSG, Access::LOCAL_WRITE)?;
    for i in 0..n {
        srq.post_recv(vec![RecvWr { wr_id: i as u64, sg_list: vec![mr.sge(i * MSG..(i + 1) * MSG)] }])?;
    }
    let tgt = if create {
        xrcd.create_tgt_qp()?
    } else {
        let qpn: u32 = serde_json::from_str(&read_line(&mut line)?)?;
        xrcd.open_qp(qpn)?
    };
    println!("{}", serde_json::to_string(&WorkerHello { srqn: srq.srq_num(), tgt_qpn: tgt.qpn() })?);
    if create {
        let ini: Endpoint = serde_json::from_str(&read_line(&mut line)?)?;
        tgt.connect(0, &ini, &ConnectOptions::default())?;
        println!("true");
    }
    let got = cq.wait(n, T)?;
    // Messages alternate between the two SRQs: this process got every other one, in order.
    let base = if create { 0 } else { 1 };
    let intact = got.iter().enumerate().all(|(k, w)| {
        let i = w.wr_id as usize;
        w.status == WcStatus::Success
            && i == k
            && mr.as_slice()[i * MSG..(i + 1) * MSG] == expect(5000 + ((2 * k + base) % SENDER_SLOTS) as u64, MSG)[..]
    });
    let bytes = got.iter().map(|w| u64::from(w.byte_len)).sum();
    println!("{}", serde_json::to_string(&WorkerDone { received: got.len(), bytes, intact })?);
    let _ = read_line(&mut line);
    drop((tgt, srq));
    Ok(ExitCode::SUCCESS)
}

fn check_capture(path: &Path) -> Result<(u64, bool)> {
    let (report, misordered) = read_capture(path)?;
    Ok((report.frames, report.is_clean() && misordered == 0))
}

/// Reads a device's capture: what `softrdma pcap check` says of its frames, and how many frames
/// are stamped before the frame ahead of them (a device's capture is in time order).
pub(crate) fn read_capture(path: &Path) -> Result<(softrdma_pcap::analyze::CheckReport, u64)> {
    let mut report = softrdma_pcap::analyze::CheckReport::default();
    let (mut last, mut misordered) = (0, 0);
    for r in softrdma_pcap::Reader::open(path)? {
        let r = r?;
        report.add(&softrdma_pcap::analyze::summarize(r.index, r.linktype, &r.data, r.is_truncated()));
        if r.timestamp_ns < last {
            misordered += 1;
        }
        last = r.timestamp_ns;
    }
    Ok((report, misordered))
}

/// A work directory (`dir`, or a new one under the system temp dir named for `what`) and in it a
/// private runtime dir, `run/` (mode 0700), which this process and the ones it starts use: the
/// devices it starts are its own.
pub(crate) fn private_workdir(dir: Option<&Path>, what: &str) -> Result<(PathBuf, PathBuf)> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::temp_dir().join(format!("softrdma-{what}-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let dir = std::path::absolute(&dir)?;
    let rt = dir.join("run");
    std::fs::create_dir_all(&rt)?;
    std::fs::set_permissions(&rt, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    std::env::set_var("SOFTRDMA_RUNTIME_DIR", &rt);
    Ok((dir, rt))
}

pub(crate) fn run(a: &DemoArgs) -> Result<ExitCode> {
    // The XRC workers inherit the runtime dir.
    let (dir, _rt) = private_workdir(a.dir.as_deref(), "demo")?;
    let exe = std::env::current_exe()?;
    let mut devices = Devices { names: Vec::new() };
    let mut pcaps = Vec::new();
    for (i, (name, addr)) in [("srdma0", "127.0.0.1"), ("srdma1", "127.0.0.2")].into_iter().enumerate() {
        let pcap = dir.join(format!("{name}.pcap"));
        let faults = format!("loss={},seed={}", a.loss, a.seed + i as u64);
        let port = a.port.to_string();
        let mut args: Vec<String> =
            ["--addr", addr, "--faults", &faults, "--pcap", &pcap.display().to_string(), "--port", &port]
                .iter()
                .map(|s| s.to_string())
                .collect();
        if a.no_gso {
            args.push("--no-gso".into());
        }
        daemon::up(&exe, name, &args)?;
        devices.names.push(name.to_owned());
        pcaps.push(pcap);
    }
    let c0 = open("srdma0", &a.datapath)?;
    let c1 = open("srdma1", &a.datapath)?;
    let mut rows = Vec::new();
    let t0 = Instant::now();
    let ops = a.ops as usize;
    let r = rc_workloads(&c0, &c1, ops, &mut rows)
        .and_then(|()| ud_workload(&c0, &c1, ops, &mut rows))
        .and_then(|()| xrc_workload(&c0, &dir, ops, &a.datapath, &mut rows));
    if let Err(e) = r {
        // Say what the devices saw before they stop.
        for (n, c) in [("srdma0", &c0), ("srdma1", &c1)] {
            if let Ok((c, io)) = c.counters() {
                eprintln!("{n}: {c:?}\n{n}: {io:?}");
            }
        }
        return Err(e);
    }
    let total = t0.elapsed();
    // The devices' counters, which count every QP's packets: a provider's own context counts
    // only its own, and reports them to the device as it closes.
    drop((c0, c1));
    let stats = [Context::open("srdma0")?.counters()?, Context::open("srdma1")?.counters()?];
    drop(devices); // stops the daemons, which flush their captures
    let mut caps = Vec::new();
    for p in &pcaps {
        caps.push(check_capture(p)?);
    }
    // The capture keeps up with the demo: it loses no frame (`capture_dropped`).
    let lost: Vec<u64> = stats.iter().map(|(_, io)| io.capture_dropped).collect();
    let all_ok = rows.iter().all(|r| r.ok) && caps.iter().all(|c| c.1) && lost.iter().all(|&l| l == 0);
    if a.json {
        let v = serde_json::json!({
            "ok": all_ok,
            "datapath": a.datapath,
            "rows": rows,
            "devices": stats.iter().zip(["srdma0", "srdma1"]).map(|((c, io), n)| serde_json::json!({
                "name": n, "sent_pkts": c.sent_pkts, "rcvd_pkts": c.rcvd_pkts,
                "retransmitted_pkts": c.retransmitted_pkts, "naks_sent": c.naks_sent.total(),
                "dropped_by_fault": io.dropped_by_fault, "icrc_err": c.icrc_err, "udp_sent": io.udp_sent,
                "icrc_id_solved": c.icrc_id_solved,
            })).collect::<Vec<_>>(),
            "captures": pcaps.iter().zip(&caps).zip(&lost).map(|((p, (n, ok)), l)| serde_json::json!({
                "path": p.display().to_string(), "frames": n, "all_icrc_valid": ok, "frames_lost": l,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!(
            "softrdma demo: two devices, srdma0 on 127.0.0.1 and srdma1 on 127.0.0.2, RoCEv2 over UDP {},",
            a.port
        );
        println!("{:.1}% loss injected on each device's transmit path; every byte checked.", a.loss * 100.0);
        let path = if a.datapath == "provider" {
            "provider: each process runs the engine for its own QPs (`--datapath device`: the daemons do)"
        } else {
            "device: the daemons run every QP (`--datapath provider`: each process runs its own)"
        };
        println!("data path {path}.\n");
        println!(
            "{:<24} {:>6} {:>12} {:>9} {:>10} {:>10}  {:<6} note",
            "workload", "ops", "bytes", "ms", "MB/s", "ops/s", "check"
        );
        for r in &rows {
            let s = r.ms / 1e3;
            println!(
                "{:<24} {:>6} {:>12} {:>9.1} {:>10.1} {:>10.0}  {:<6} {}",
                r.workload,
                r.ops,
                r.bytes,
                r.ms,
                r.bytes as f64 / s / 1e6,
                r.ops as f64 / s,
                if r.ok { "ok" } else { "FAILED" },
                r.note
            );
        }
        println!(
            "\n{:<8} {:>10} {:>10} {:>14} {:>10} {:>17} {:>9}",
            "device", "sent_pkts", "rcvd_pkts", "retransmitted", "NAKs sent", "dropped_by_fault", "icrc_err"
        );
        for ((c, io), n) in stats.iter().zip(["srdma0", "srdma1"]) {
            println!(
                "{:<8} {:>10} {:>10} {:>14} {:>10} {:>17} {:>9}",
                n,
                c.sent_pkts,
                c.rcvd_pkts,
                c.retransmitted_pkts,
                c.naks_sent.total(),
                io.dropped_by_fault,
                c.icrc_err
            );
        }
        println!("\ntotal {:.2} s", total.as_secs_f64());
        for ((p, (n, ok)), l) in pcaps.iter().zip(&caps).zip(&lost) {
            println!(
                "capture: {} ({n} frames, {}, {l} lost)",
                p.display(),
                if *ok { "every ICRC valid" } else { "BAD FRAMES: run softrdma pcap check" }
            );
        }
        println!("open them in Wireshark, or run: softrdma pcap decode {}", pcaps[0].display());
        println!("verdict: {}", if all_ok { "OK" } else { "FAILED" });
    }
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
