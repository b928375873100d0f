//! `softrdma soak`: reliability under load, measured.
//!
//! Two devices (srdma-soak0 and srdma-soak1, a private runtime dir, faults injected on both) and
//! `--pairs` pairs of client processes: a requester on the first device and a responder on the
//! second. Each pair runs `--qps` RC QPs, one XRC initiator QP into an XRC target QP and SRQ, and
//! one UD QP pair. Every RC and XRC QP carries every opcode (SEND, SEND with immediate, RDMA WRITE
//! and WRITE with immediate each read back, RDMA READ, FETCH_ADD, CMP_SWAP, ATOMIC WRITE read
//! back) with sizes from 0 to `--max-size`; UD carries datagrams up to the path MTU.
//!
//! Every few seconds a random client process of a random pair is killed (SIGKILL); its partner
//! hears it and drains, and a new pair takes their place. What is checked:
//! - exactly-once, in-order delivery of every reliable message: each message's content follows
//!   from the seed, the pair, the QP and its index, so the responder knows what its n-th receive
//!   must hold and a gap (lost), a repeat (duplicated) or other bytes (corrupted) are each told
//!   apart; READs, read-backs and atomics are checked at the requester (a FETCH_ADD returns the
//!   sum of the adds before it, so one executed twice shows);
//! - every posted work request completes exactly once, in order, with success while the peer
//!   lives, or with the status IBTA gives when it died (transport retries exceeded, IBTA C9-140;
//!   flushed, IBTA 10.3.1 / 11.4.2.2) — anything else counts in `wrong_status`;
//! - the daemons' open file descriptors drop back by exactly what the pair added once a killed
//!   pair is cleaned up (`leaked_fds`), and are back at their baseline at the end;
//! - the daemons' resident memory (RSS) grows by at most `--rss-bound-mib` from the moment the
//!   first pairs are running to the end (`rss_growth`).
//!
//! UD is unreliable: datagrams lost to the injected loss and copies made by injected duplication
//! are counted, not violations; a datagram that arrives with other bytes is (the ICRC must catch
//! corruption).
//!
//! The exit status is 1 on any violation.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use serde::{Deserialize, Serialize};
use softrdma_device::daemon;
use softrdma_device::verbs::*;

/// Outstanding operations per QP at the requester (each op holds its own buffer slot until done).
const WINDOW: usize = 8;
/// Receives posted per responder QP (and on the XRC SRQ).
const RECV_DEPTH: usize = 8;
/// UD datagrams in flight and receives posted.
const UD_DEPTH: usize = 32;
/// How long a draining side waits for what it is owed.
const DRAIN: Duration = Duration::from_secs(20);

#[derive(clap::Args, Debug)]
pub(crate) struct SoakArgs {
    /// How long to run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// RC QPs per pair of client processes (each pair adds one XRC and one UD QP).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    qps: u32,
    /// Pairs of client processes running at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pairs: u32,
    /// Faults injected on both devices' transmit paths (`softrdma up --faults`); `none` for none.
    #[arg(long, default_value = "loss=0.002,dup=0.002,reorder=0.002,corrupt=0.0005")]
    faults: String,
    /// Seed of the workload and (with the device index added) of the fault injection.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Mean seconds between two kills (each waits a random 0.5x to 1.5x of it); 0 kills nobody.
    #[arg(long, default_value_t = 3.0)]
    kill_every: f64,
    /// The RC and XRC QPs' local ACK timeout code (4.096 us * 2^N; 16 is 268 ms): a killed
    /// responder is noticed after retry_cnt + 1 = 8 timeouts (2.1 s at 16). A software device is
    /// a process, and on a loaded machine (load average 17 on 2 cores: compilers, fuzzers, another
    /// soak) timeouts of 67 ms (14) ran out 8 times in a row against live peers whose devices went
    /// unscheduled for up to 1.2 s; the transport's right answer to silence, but nothing about the
    /// device. Raise it on a loaded machine; any error with a live peer is a violation.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u8).range(1..=31))]
    ack_timeout: u8,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(8..=(16 << 20)))]
    max_size: u32,
    /// The daemons' RSS may grow by this much (MiB) from the first pairs running to the end.
    #[arg(long, default_value_t = 64)]
    rss_bound_mib: u64,
    /// Addresses of the two devices.
    #[arg(long, default_value = "127.0.0.45")]
    addr0: String,
    #[arg(long, default_value = "127.0.0.46")]
    addr1: String,
    /// UDP port of the two devices.
    #[arg(long, default_value_t = 4791)]
    port: u16,
    /// Directory for the runtime files and logs (default: a new one under the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

// ---------------------------------------------------------------------------------------------
// The workload: what operation k of QP q is, derived from the seed alone (both sides agree).

/// splitmix64: the operation of any (stream, index) without stepping through the ones before.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
    AtomicWrite,
}

impl Kind {
    /// It takes a receive at the responder.
    fn consumes_recv(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::WriteImm)
    }
}

#[derive(Debug, Clone, Copy)]
struct Op {
    kind: Kind,
    len: usize,
    /// READ: where in the responder's read area.
    offset: usize,
    /// Atomics: the add, the swap value, the value written.
    value: u64,
}

/// The stream of one QP: `stream` names (seed, pair generation, QP index).
#[derive(Debug, Clone, Copy)]
struct Workload {
    stream: u64,
    max: usize,
}

impl Workload {
    fn new(seed: u64, generation: u64, qp: usize, max: usize) -> Workload {
        Workload { stream: mix(mix(seed ^ 0x50a4) ^ mix(generation << 8 | qp as u64)), max }
    }

    /// Sizes from 0 to max, most of them small, as real traffic is.
    fn size(&self, r: u64) -> usize {
        let m = self.max;
        let pick = |lo: usize, hi: usize| {
            let hi = hi.min(m);
            let lo = lo.min(hi);
            lo + ((r >> 8) as usize) % (hi - lo + 1)
        };
        match r % 100 {
            0..=4 => 0,
            5..=29 => pick(1, 64),
            30..=64 => pick(65, 4096),
            65..=89 => pick(4097, 65536),
            _ => pick(65537, m),
        }
    }

    fn op(&self, k: u64) -> Op {
        let r = mix(self.stream ^ k.wrapping_mul(0xd6e8_feb8_6659_fd93));
        let r2 = mix(r);
        let kind = match r % 16 {
            0..=3 => Kind::Send,
            4..=5 => Kind::SendImm,
            6..=7 => Kind::Write,
            8..=9 => Kind::WriteImm,
            10..=11 => Kind::Read,
            12 => Kind::FetchAdd,
            13 => Kind::CmpSwap,
            14 => Kind::AtomicWrite,
            _ => Kind::Send,
        };
        let len = match kind {
            Kind::FetchAdd | Kind::CmpSwap | Kind::AtomicWrite => 8,
            _ => self.size(r2),
        };
        let offset = if kind == Kind::Read { (mix(r2) as usize) % (self.max - len + 1) } else { 0 };
        Op { kind, len, offset, value: mix(r2 ^ 0xa7) }
    }

    /// The bytes of message k: its index (little-endian, as much of it as fits), then a pattern.
    fn content(&self, k: u64, buf: &mut [u8]) {
        let head = k.to_le_bytes();
        let n = buf.len().min(8);
        buf[..n].copy_from_slice(&head[..n]);
        fill(&mut buf[n..], self.stream ^ k);
    }

    /// The message index a received buffer names, if it is long enough to name one.
    fn named(buf: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(buf.get(..8)?.try_into().ok()?))
    }

    /// The responder's READ area of this QP.
    fn read_area(&self, buf: &mut [u8]) {
        fill(buf, !self.stream);
    }
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = mix(seed) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// A worker's findings on stderr: the first 20 of them (the counts say how many there were).
macro_rules! note {
    ($($arg:tt)*) => {{
        static SAID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        if SAID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 20 {
            eprintln!($($arg)*);
        }
    }};
}

fn imm_of(k: u64) -> u32 {
    k as u32 ^ 0x5eed_0000
}

// ---------------------------------------------------------------------------------------------
// What the workers report.

/// One worker's findings (the requester's and the responder's add up).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Tally {
    /// Reliable messages checked (received and matched, or completed and verified).
    messages: u64,
    bytes: u64,
    lost: u64,
    duplicated: u64,
    corrupted: u64,
    wrong_status: u64,
    /// Completions out of posting order, or for a request never posted.
    misordered: u64,
    /// Work requests still without a completion when the drain ended.
    unfinished: u64,
    /// Completions with an error status after the peer died (allowed ones).
    flushed: u64,
    ud_sent: u64,
    ud_received: u64,
    ud_duplicated: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        let Tally {
            messages,
            bytes,
            lost,
            duplicated,
            corrupted,
            wrong_status,
            misordered,
            unfinished,
            flushed,
            ud_sent,
            ud_received,
            ud_duplicated,
        } = o;
        self.messages += messages;
        self.bytes += bytes;
        self.lost += lost;
        self.duplicated += duplicated;
        self.corrupted += corrupted;
        self.wrong_status += wrong_status;
        self.misordered += misordered;
        self.unfinished += unfinished;
        self.flushed += flushed;
        self.ud_sent += ud_sent;
        self.ud_received += ud_received;
        self.ud_duplicated += ud_duplicated;
    }

    fn violations(&self) -> u64 {
        self.lost + self.duplicated + self.corrupted + self.wrong_status + self.misordered + self.unfinished
    }
}

// ---------------------------------------------------------------------------------------------
// Messages between the soak and its workers (a JSON object a line).

#[derive(Debug, Serialize, Deserialize)]
struct RemoteQp {
    ep: Endpoint,
    /// The responder's region of this QP: write slots, then the read area, then 3 atomic words.
    addr: u64,
    rkey: u32,
    /// XRC: the SRQ the requests are for.
    srqn: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct ResponderHello {
    qps: Vec<RemoteQp>,
    ud_qpn: u32,
    ud_qkey: u32,
    mtu: Mtu,
}

#[derive(Debug, Serialize, Deserialize)]
struct RequesterHello {
    /// One endpoint per RC QP, then the XRC initiator's.
    eps: Vec<Endpoint>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Control {
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
struct Done {
    tally: Tally,
    /// Requester: operations posted and completed per QP.
    completed: Vec<u64>,
}

/// Layout of a responder QP's region.
struct Layout {
    max: usize,
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

const FA_WORD: usize = 0;
const CS_WORD: usize = 1;
const AW_WORD: usize = 2;

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
fn control_channel() -> mpsc::Receiver<Control> {
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

fn say<T: Serialize>(v: &T) -> Result<()> {
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

fn options(mtu: Mtu, ack_timeout: u8) -> ConnectOptions {
    ConnectOptions { mtu, timeout: ack_timeout, ..ConnectOptions::default() }
}

/// The statuses a work request may end with once its peer is dying: the transport gave up (IBTA
/// C9-140: retry count exceeded), the request was flushed after the QP went to the error state
/// (IBTA 10.3.1: outstanding and later WRs complete in error, flushed), or the responder's device
/// could not finish it in the moment between the process's death and the cleanup of its QPs:
/// its memory was gone (NAK remote operational error, IBTA 9.7.5.2.5) or its region already
/// deregistered (NAK remote access error, IBTA 9.7.5.2.4). A live peer allows none of them.
fn allowed_after_peer_death(s: WcStatus) -> bool {
    matches!(s, WcStatus::RetryExcErr | WcStatus::WrFlushErr | WcStatus::RemOpErr | WcStatus::RemAccessErr)
}

struct ReqQp {
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

fn wr_id(q: usize, k: u64, readback: bool) -> u64 {
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

fn requester(ctx: &Context, a: &WorkerArgs, rx: &mpsc::Receiver<Control>) -> Result<()> {
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

struct RespQp {
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

fn responder(ctx: &Context, a: &WorkerArgs, rx: &mpsc::Receiver<Control>) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// The soak itself.

struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    fn spawn(args: &[String]) -> Result<Worker> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("soak-worker")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a soak worker")?;
        let stdin = child.stdin.take().expect("piped");
        let stdout: ChildStdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Worker { child, stdin, lines })
    }

    fn read<T: for<'de> Deserialize<'de>>(&mut self, timeout: Duration) -> Result<T> {
        let line = self.lines.recv_timeout(timeout).context("a soak worker said nothing")?;
        serde_json::from_str(&line).with_context(|| format!("a soak worker said {line:?}"))
    }

    fn write<T: Serialize>(&mut self, v: &T) -> Result<()> {
        writeln!(self.stdin, "{}", serde_json::to_string(v)?)?;
        Ok(self.stdin.flush()?)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            self.kill();
        }
    }
}

struct Pair {
    generation: u64,
    req: Worker,
    resp: Worker,
    /// Descriptors this pair holds open in each daemon.
    fds: [i64; 2],
}

struct Devices {
    names: [String; 2],
    pids: [i32; 2],
}

impl Drop for Devices {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = daemon::down(n);
        }
    }
}

fn fd_count(pid: i32) -> i64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as i64).unwrap_or(-1)
}

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn fds_of(d: &Devices) -> [i64; 2] {
    [fd_count(d.pids[0]), fd_count(d.pids[1])]
}

/// The daemons' descriptor counts once they hold still (the same for 200 ms; at most 3 s).
fn steady_fds(d: &Devices) -> [i64; 2] {
    let t0 = Instant::now();
    let mut last = fds_of(d);
    let mut same = 0;
    while same < 4 && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
        let now = fds_of(d);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// Waits (up to 5 s) until the daemons hold exactly `want` descriptors; returns the excess.
fn settle_fds(d: &Devices, want: [i64; 2]) -> i64 {
    let t0 = Instant::now();
    loop {
        let now = fds_of(d);
        if now == want {
            return 0;
        }
        if t0.elapsed() > Duration::from_secs(5) {
            eprintln!("soak: daemons hold {now:?} descriptors, expected {want:?}");
            return (now[0] - want[0]).max(0) + (now[1] - want[1]).max(0);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Soak<'a> {
    a: &'a SoakArgs,
    devices: Devices,
    next_generation: u64,
    tally: Tally,
    leaked_fds: i64,
    kills: u64,
    failures: Vec<String>,
}

impl Soak<'_> {
    fn worker_args(&self, role: &str, device: &str, generation: u64) -> Vec<String> {
        [
            "--device",
            device,
            "--role",
            role,
            "--qps",
            &self.a.qps.to_string(),
            "--seed",
            &self.a.seed.to_string(),
            "--generation",
            &generation.to_string(),
            "--max-size",
            &self.a.max_size.to_string(),
            "--ack-timeout",
            &self.a.ack_timeout.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Starts a pair and connects it; measures the descriptors it adds to each daemon.
    fn start_pair(&mut self) -> Result<Pair> {
        let before = steady_fds(&self.devices);
        let generation = self.next_generation;
        self.next_generation += 1;
        let t = Duration::from_secs(60);
        let mut resp = Worker::spawn(&self.worker_args("responder", &self.devices.names[1], generation))?;
        let hello: ResponderHello = resp.read(t)?;
        let mut req = Worker::spawn(&self.worker_args("requester", &self.devices.names[0], generation))?;
        req.write(&Control::Responder(hello))?;
        let rh: RequesterHello = req.read(t)?;
        resp.write(&Control::Go(Some(rh)))?;
        let _ready: bool = resp.read(t)?;
        req.write(&Control::Go(None))?;
        // Traffic running: what the daemons opened for the pair (some only at first use).
        let after = steady_fds(&self.devices);
        Ok(Pair { generation, req, resp, fds: [after[0] - before[0], after[1] - before[1]] })
    }

    fn collect(&mut self, w: &mut Worker, what: &str) -> Option<Done> {
        match w.read::<Done>(DRAIN + Duration::from_secs(10)) {
            Ok(d) => {
                self.tally.add(&d.tally);
                Some(d)
            }
            Err(e) => {
                self.failures.push(format!("{what}: {e:#}"));
                None
            }
        }
    }

    /// Ends a pair cleanly: the requester drains, then the responder receives what it is owed.
    fn stop_pair(&mut self, mut p: Pair) {
        let before = fds_of(&self.devices);
        let g = p.generation;
        if p.req.write(&Control::Stop(Vec::new())).is_err() {
            self.failures.push(format!("pair {g}: the requester is gone"));
        }
        let owed = self.collect(&mut p.req, &format!("pair {g} requester")).map(|d| d.completed).unwrap_or_default();
        let _ = p.req.write(&Control::Exit);
        if p.resp.write(&Control::Stop(owed)).is_err() {
            self.failures.push(format!("pair {g}: the responder is gone"));
        }
        self.collect(&mut p.resp, &format!("pair {g} responder"));
        let _ = p.resp.write(&Control::Exit);
        self.end(p, before);
    }

    /// Kills one process of a pair; the other drains and reports.
    fn kill_in(&mut self, mut p: Pair, requester: bool) {
        let before = fds_of(&self.devices);
        let g = p.generation;
        let (victim, survivor, name) =
            if requester { (&mut p.req, &mut p.resp, "responder") } else { (&mut p.resp, &mut p.req, "requester") };
        // What the victim found so far counts: it says it, then goes on until killed.
        let heard = victim.write(&Control::Report).is_ok() && {
            match victim.read::<Tally>(Duration::from_secs(30)) {
                Ok(t) => {
                    self.tally.add(&t);
                    true
                }
                Err(_) => false,
            }
        };
        if !heard {
            self.failures.push(format!("pair {g}: the process to be killed did not report"));
        }
        // The survivor hears first, so that it tells the errors the death causes (in the moment
        // before it hears of the death) from errors with a live peer.
        let warned =
            survivor.write(&Control::PeerDying).is_ok() && survivor.read::<bool>(Duration::from_secs(30)).is_ok();
        if !warned {
            self.failures.push(format!("pair {g}: the {name} did not answer"));
        }
        victim.kill();
        self.kills += 1;
        if survivor.write(&Control::PeerGone).is_err() {
            self.failures.push(format!("pair {g}: the {name} is gone"));
        }
        self.collect(survivor, &format!("pair {g} {name} (after its peer was killed)"));
        let _ = survivor.write(&Control::Exit);
        self.end(p, before);
    }

    /// Waits for a pair's processes to exit and the daemons to let go of them.
    fn end(&mut self, mut p: Pair, before: [i64; 2]) {
        for w in [&mut p.req, &mut p.resp] {
            let t0 = Instant::now();
            while !matches!(w.child.try_wait(), Ok(Some(_))) && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
            w.kill();
        }
        self.leaked_fds += settle_fds(&self.devices, [before[0] - p.fds[0], before[1] - p.fds[1]]);
    }
}

#[derive(Debug, Serialize)]
struct Report {
    seconds: f64,
    pairs: u32,
    qps_per_pair: u32,
    faults: String,
    seed: u64,
    ack_timeout: u8,
    kills: u64,
    pairs_run: u64,
    /// What the workers found (messages, bytes, lost, duplicated, corrupted, wrong_status, ...).
    #[serde(flatten)]
    tally: Tally,
    leaked_fds: i64,
    rss_kib_start: [u64; 2],
    rss_kib_end: [u64; 2],
    rss_kib_max: [u64; 2],
    rss_growth_kib: i64,
    rss_bound_kib: u64,
    retransmitted_pkts: u64,
    dropped_by_fault: u64,
    duplicated_by_fault: u64,
    reordered_by_fault: u64,
    corrupted_by_fault: u64,
    failures: Vec<String>,
    ok: bool,
}

pub(crate) fn run(a: &SoakArgs) -> Result<ExitCode> {
    crate::demo::private_workdir(a.dir.as_deref(), "soak")?;
    let exe = std::env::current_exe()?;
    let names = ["srdma-soak0".to_string(), "srdma-soak1".to_string()];
    let mut pids = [0; 2];
    let mut started = Vec::new();
    for (i, (name, addr)) in names.iter().zip([&a.addr0, &a.addr1]).enumerate() {
        let mut args: Vec<String> = vec!["--addr".into(), addr.clone(), "--port".into(), a.port.to_string()];
        if a.faults != "none" {
            args.push("--faults".into());
            args.push(format!("{},seed={}", a.faults, a.seed.wrapping_add(i as u64)));
        }
        match daemon::up(&exe, name, &args) {
            Ok(info) => {
                pids[i] = info.pid;
                started.push(name.clone());
            }
            Err(e) => {
                for n in &started {
                    let _ = daemon::down(n);
                }
                bail!("starting {name} on {addr}: {e}");
            }
        }
    }
    let devices = Devices { names, pids };
    let base_fds = steady_fds(&devices);
    let mut s =
        Soak { a, devices, next_generation: 0, tally: Tally::default(), leaked_fds: 0, kills: 0, failures: Vec::new() };
    let t0 = Instant::now();
    let mut pairs: Vec<Option<Pair>> = Vec::new();
    for _ in 0..a.pairs {
        pairs.push(Some(s.start_pair()?));
    }
    let rss_start = [rss_kib(pids[0]), rss_kib(pids[1])];
    let mut rss_max = rss_start;
    let mut rng = mix(a.seed ^ 0x4b11);
    let end = t0 + Duration::from_secs(a.seconds);
    let next_kill = |rng: &mut u64| {
        *rng = mix(*rng);
        let f = 0.5 + (*rng % 1000) as f64 / 1000.0;
        Instant::now() + Duration::from_secs_f64(a.kill_every * f)
    };
    let mut kill_at = next_kill(&mut rng);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100).min(end.saturating_duration_since(Instant::now())));
        for (i, pid) in pids.iter().enumerate() {
            rss_max[i] = rss_max[i].max(rss_kib(*pid));
        }
        // A worker that ended on its own failed: say so and replace the pair.
        for slot in pairs.iter_mut() {
            let p = slot.as_mut().expect("running");
            for (w, name) in [(&mut p.req, "requester"), (&mut p.resp, "responder")] {
                if let Ok(Some(st)) = w.child.try_wait() {
                    s.failures.push(format!("pair {} {name} exited on its own ({st})", p.generation));
                }
            }
        }
        if a.kill_every > 0.0 && Instant::now() >= kill_at && Instant::now() < end {
            rng = mix(rng);
            let i = (rng % pairs.len() as u64) as usize;
            let p = pairs[i].take().expect("running");
            s.kill_in(p, rng >> 32 & 1 == 0);
            pairs[i] = Some(s.start_pair()?);
            kill_at = next_kill(&mut rng);
        }
        if !s.failures.is_empty() {
            break;
        }
    }
    for slot in pairs.iter_mut() {
        let p = slot.take().expect("running");
        s.stop_pair(p);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    s.leaked_fds += settle_fds(&s.devices, base_fds);
    let rss_end = [rss_kib(pids[0]), rss_kib(pids[1])];
    let growth = (0..2).map(|i| rss_end[i] as i64 - rss_start[i] as i64).max().unwrap_or(0);
    // The devices' fault and retransmission counters.
    let mut io = softrdma_device::proto::IoStats::default();
    let mut retx = 0;
    for n in &s.devices.names {
        if let Ok(c) = Context::open(n) {
            if let Ok((cnt, st)) = c.counters() {
                retx += cnt.retransmitted_pkts;
                io.dropped_by_fault += st.dropped_by_fault;
                io.duplicated_by_fault += st.duplicated_by_fault;
                io.reordered_by_fault += st.reordered_by_fault;
                io.corrupted_by_fault += st.corrupted_by_fault;
            }
        }
    }
    let t = &s.tally;
    let bound = a.rss_bound_mib * 1024;
    let ok = t.violations() == 0 && s.leaked_fds == 0 && growth <= bound as i64 && s.failures.is_empty();
    let r = Report {
        seconds: elapsed,
        pairs: a.pairs,
        qps_per_pair: a.qps,
        faults: a.faults.clone(),
        seed: a.seed,
        ack_timeout: a.ack_timeout,
        kills: s.kills,
        pairs_run: s.next_generation,
        tally: t.clone(),
        leaked_fds: s.leaked_fds,
        rss_kib_start: rss_start,
        rss_kib_end: rss_end,
        rss_kib_max: rss_max,
        rss_growth_kib: growth,
        rss_bound_kib: bound,
        retransmitted_pkts: retx,
        dropped_by_fault: io.dropped_by_fault,
        duplicated_by_fault: io.duplicated_by_fault,
        reordered_by_fault: io.reordered_by_fault,
        corrupted_by_fault: io.corrupted_by_fault,
        failures: s.failures.clone(),
        ok,
    };
    drop(s);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_report(&r);
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn print_report(r: &Report) {
    println!(
        "soak: {:.0} s, {} pairs of {} RC + 1 XRC + 1 UD QPs, faults {}, seed {}, ACK timeout {}",
        r.seconds, r.pairs, r.qps_per_pair, r.faults, r.seed, r.ack_timeout
    );
    println!("  client processes killed   {:>12}   (pairs run: {})", r.kills, r.pairs_run);
    println!(
        "  messages                  {:>12}   ({:.1} MiB checked)",
        r.tally.messages,
        r.tally.bytes as f64 / (1 << 20) as f64
    );
    println!("  lost                      {:>12}", r.tally.lost);
    println!("  duplicated                {:>12}", r.tally.duplicated);
    println!("  corrupted                 {:>12}", r.tally.corrupted);
    println!("  wrong_status              {:>12}", r.tally.wrong_status);
    println!("  misordered                {:>12}", r.tally.misordered);
    println!("  unfinished                {:>12}", r.tally.unfinished);
    println!("  flushed (peer killed)     {:>12}", r.tally.flushed);
    println!("  leaked_fds                {:>12}", r.leaked_fds);
    println!(
        "  rss_growth                {:>9} KiB   (bound {} KiB; daemons {:?} -> {:?} KiB, max {:?})",
        r.rss_growth_kib, r.rss_bound_kib, r.rss_kib_start, r.rss_kib_end, r.rss_kib_max
    );
    println!(
        "  UD datagrams              {:>12}   sent, {} received, {} duplicates (UD does not deduplicate)",
        r.tally.ud_sent, r.tally.ud_received, r.tally.ud_duplicated
    );
    println!("                                           (sent: as counted by requesters that lived to report)");
    println!(
        "  injected                  loss {}, dup {}, reorder {}, corrupt {}; retransmitted {}",
        r.dropped_by_fault, r.duplicated_by_fault, r.reordered_by_fault, r.corrupted_by_fault, r.retransmitted_pkts
    );
    for f in &r.failures {
        println!("  FAILURE: {f}");
    }
    println!("soak: {}", if r.ok { "ok" } else { "VIOLATIONS (exit 1)" });
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
