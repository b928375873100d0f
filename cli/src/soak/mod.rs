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

#[macro_use]
mod workload;
mod worker;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use softrdma_device::daemon;
use softrdma_device::verbs::*;

pub(crate) use worker::{worker, WorkerArgs};
use worker::{Control, Done, RequesterHello, ResponderHello};
use workload::{mix, Tally};

/// Outstanding operations per QP at the requester (each op holds its own buffer slot until done).
pub(super) const WINDOW: usize = 8;
/// Receives posted per responder QP (and on the XRC SRQ).
pub(super) const RECV_DEPTH: usize = 8;
/// UD datagrams in flight and receives posted.
pub(super) const UD_DEPTH: usize = 32;
/// How long a draining side waits for what it is owed.
pub(super) const DRAIN: Duration = Duration::from_secs(20);

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
    #[arg(long, default_value = "loss=0.002,duplicate=0.002,reorder=0.002,corrupt=0.0005")]
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
    /// Capture both devices into DIR/<device>.pcap, and check the captures at the end: none
    /// lost a frame, every frame in time order, and no bad ICRC or malformed frame but those of
    /// the packets the fault injector corrupted (each captured by its sender and its receiver).
    #[arg(long, value_name = "DIR")]
    pcap: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
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
    /// With `--pcap`: each capture's path, frames and bad ICRCs (the corrupted packets').
    captures: Vec<(String, u64, u64)>,
    capture_frames_lost: u64,
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
        if let Some(d) = &a.pcap {
            std::fs::create_dir_all(d)?;
            args.push("--pcap".into());
            args.push(d.join(format!("{name}.pcap")).display().to_string());
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
                io.capture_dropped += st.capture_dropped;
            }
        }
    }
    let capture_frames_lost = io.capture_dropped;
    // The captures, once the daemons have written them out.
    let names = s.devices.names.clone();
    if a.pcap.is_some() {
        for n in &names {
            let _ = daemon::down(n);
        }
    }
    let mut captures = Vec::new();
    if let Some(d) = &a.pcap {
        for n in &names {
            let path = d.join(format!("{n}.pcap"));
            match crate::demo::read_capture(&path) {
                Ok((r, misordered)) => {
                    // A corrupted packet (a bit flipped after its ICRC was made) shows as a bad
                    // ICRC, or as malformed when the bit was in a header field that sizes it.
                    let ok = r.truncated == 0
                        && misordered == 0
                        && r.bad_icrc + r.malformed <= 2 * io.corrupted_by_fault
                        && r.frames > 0;
                    if !ok {
                        s.failures.push(format!(
                            "capture {}: {} frames, {} bad ICRCs ({} packets corrupted on purpose), {} malformed, \
                             {} cut short, {} out of time order; first problems {:?}",
                            path.display(),
                            r.frames,
                            r.bad_icrc,
                            io.corrupted_by_fault,
                            r.malformed,
                            r.truncated,
                            misordered,
                            r.first_problems
                        ));
                    }
                    captures.push((path.display().to_string(), r.frames, r.bad_icrc));
                }
                Err(e) => s.failures.push(format!("capture {}: {e}", path.display())),
            }
        }
        if capture_frames_lost > 0 {
            s.failures.push(format!("the captures lost {capture_frames_lost} frames"));
        }
    }
    let t = &s.tally;
    // With the capture on, each daemon also maps capture rings (its own, and one per client
    // process of the device running its own QPs), whose pages count as they are first written.
    let rings = if a.pcap.is_some() {
        (1 + 2 * u64::from(a.pairs)) * ((softrdma_device::capture::ring_bytes() >> 10) as u64)
    } else {
        0
    };
    let bound = a.rss_bound_mib * 1024 + rings;
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
        captures,
        capture_frames_lost,
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
        "  injected                  loss {}, duplicate {}, reorder {}, corrupt {}; retransmitted {}",
        r.dropped_by_fault, r.duplicated_by_fault, r.reordered_by_fault, r.corrupted_by_fault, r.retransmitted_pkts
    );
    for (p, n, bad) in &r.captures {
        println!("  capture                   {n:>12}   frames in {p} ({bad} bad ICRCs: corrupted on purpose)");
    }
    if !r.captures.is_empty() {
        println!("  capture frames lost       {:>12}", r.capture_frames_lost);
    }
    for f in &r.failures {
        println!("  FAILURE: {f}");
    }
    println!("soak: {}", if r.ok { "ok" } else { "VIOLATIONS (exit 1)" });
}
