//! `softrdma bench [--quick]`: the whole comparison of the benchmark issue, in one run on one
//! machine, printed as one table and written to BENCHMARKS.md.
//!
//! - softrdma: unchanged perftest (ib_write_bw, ib_read_bw, ib_send_bw at 64 B and 64 KiB;
//!   ib_send_lat and ib_write_lat at 2 B) through the verbs shim, across two devices (daemons on
//!   two loopback addresses) and within one device, on both data paths (the daemons' threads
//!   move the work; each program runs its own QPs, `SOFTRDMA_DATAPATH=provider`); then
//!   100,000 connected RC QPs on one device (time and memory) and an XRC fan-in (N initiators to
//!   M SRQs on N QPs);
//! - the physical limits: ../shared/tools/udpbench (plain UDP, GSO+GRO, busy-poll ping-pong,
//!   memcpy, process_vm_readv/writev);
//! - the peers a user would pick instead: UCX over tcp (ucx_perftest tag_bw, ucp_put_bw,
//!   tag_lat) and libfabric's tcp provider (fi_pingpong);
//! - middleware between two `softrdma cluster` hosts (root only; `bench_cluster`): UCX over
//!   softrdma's rc_verbs and ud_verbs vs UCX tcp, and an Open MPI ping-pong over pml ucx on
//!   softrdma vs its tcp btl;
//! - the ratios of the targets.
//!
//! Everything runs one program at a time (the machine has two cores; a measurement must not
//! compete with another). Every process it starts is stopped before it returns, on error too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::bench_parse::parse_udpbench;
pub(crate) use crate::bench_runner::{run, server_client, tail, Devices, Outcome, Runner};
use crate::bench_scale;

#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Fewer iterations and 1,000 instead of 100,000 QPs: a minute or two instead of several.
    #[arg(long)]
    quick: bool,
    /// Address of the first device (srdma0; server side of every softrdma run).
    #[arg(long, default_value = "127.0.0.1")]
    addr0: IpAddr,
    /// Address of the second device (srdma1; client side of the runs across devices).
    #[arg(long, default_value = "127.0.0.2")]
    addr1: IpAddr,
    /// The udpbench binary. Default: built from `shared/tools/udpbench`, looked for above the
    /// current directory and above this executable.
    #[arg(long)]
    udpbench: Option<PathBuf>,
    /// The Markdown file the table goes into (between the "softrdma bench" markers, replacing the
    /// previous table; appended when the markers are absent).
    #[arg(long, default_value = "BENCHMARKS.md")]
    write: PathBuf,
    /// Print the table only.
    #[arg(long)]
    no_write: bool,
    /// Do not install missing Debian packages; say what is missing instead.
    #[arg(long)]
    no_install: bool,
    /// RC QPs of the scale run (default 100,000; 1,000 with --quick).
    #[arg(long)]
    qps: Option<usize>,
    /// Run the scale rows only (many idle RC QPs, XRC fan-in) on two fresh devices and print
    /// them; nothing is written and no peer is measured.
    #[arg(long)]
    only_scale: bool,
    /// Run the capture rows only (ib_write_bw 64 KiB across with the capture off and on, in
    /// alternating runs) and print them; nothing is written and no peer is measured.
    #[arg(long)]
    only_capture: bool,
    /// Run the rsockets rows only (rstream across the devices, over rsockets and over the
    /// kernel's TCP on loopback) and print them; nothing is written.
    #[arg(long)]
    only_rsockets: bool,
    /// Skip the middleware rows (UCX and MPI between two `softrdma cluster` hosts; they run only
    /// as root, with no cluster already up).
    #[arg(long)]
    no_cluster: bool,
    /// Run the middleware rows only (UCX and MPI between two `softrdma cluster` hosts, with the
    /// UDP floors between the hosts) and print them; nothing is written.
    #[arg(long, conflicts_with = "no_cluster")]
    only_cluster: bool,
    /// Only the progress comparison (`bench_progress`): RC ping-pong between two devices in this
    /// process, moved by the device threads and by the application's calls, beside busy-poll UDP.
    /// Prints its table; needs no packages, daemons or perftest.
    #[arg(long)]
    progress: bool,
}

/// The data paths perftest runs on (`SOFTRDMA_DATAPATH`), with the suffix of their figures' keys.
const PATHS: [(&str, &str); 2] = [("device", ""), ("provider", "_provider")];

/// The Debian packages the comparison needs, by the program that tells whether one is there.
const PACKAGES: [(&str, &str); 4] = [
    ("ib_write_bw", "perftest"),
    ("ucx_perftest", "ucx-utils"),
    ("fi_pingpong", "libfabric-bin"),
    ("cmtime", "rdmacm-utils"),
];

const BEGIN: &str = "<!-- softrdma bench: begin (this section is written by `softrdma bench`) -->";
const END: &str = "<!-- softrdma bench: end -->";

/// The devices' retransmitted packets, summed (`softrdma stat --json`), or None.
fn retransmitted(exe: &Path, devs: &[&str]) -> Option<u64> {
    let mut n = 0;
    for d in devs {
        let o = Command::new(exe).args(["stat", d, "--json"]).output().ok()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        n += v["retransmitted_pkts"].as_u64()?;
    }
    Some(n)
}

pub(crate) fn which(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// Installs the missing packages with apt-get when allowed and possible; else says exactly what
/// is missing.
fn ensure_packages(no_install: bool) -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().filter(|(p, _)| !which(p)).map(|(_, pkg)| *pkg).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let root = nix_is_root();
    if no_install || !root || !which("apt-get") {
        bail!(
            "missing Debian packages: {} (install them: apt-get install {}){}",
            missing.join(", "),
            missing.join(" "),
            if no_install { "" } else { "; not root or no apt-get, so softrdma bench cannot install them itself" }
        );
    }
    eprintln!("softrdma bench: installing {}", missing.join(" "));
    let install = |pkgs: &[&str]| {
        Command::new("apt-get")
            .args(["install", "-y", "-q"])
            .args(pkgs)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    if !install(&missing).is_ok_and(|s| s.success()) {
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        if !install(&missing).is_ok_and(|s| s.success()) {
            bail!("apt-get install {} failed", missing.join(" "));
        }
    }
    Ok(())
}

pub(crate) fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// The udpbench binary: given, or built from the first `shared/tools/udpbench` found above the
/// current directory or this executable.
fn udpbench(given: Option<&Path>, exe: &Path) -> Result<PathBuf> {
    if let Some(p) = given {
        if !p.is_file() {
            bail!("--udpbench {}: no such file", p.display());
        }
        return Ok(p.to_owned());
    }
    let cwd = std::env::current_dir()?;
    let src = cwd
        .ancestors()
        .chain(exe.ancestors())
        .map(|d| d.join("shared/tools/udpbench"))
        .find(|d| d.join("Cargo.toml").is_file())
        .ok_or_else(|| {
            anyhow!("udpbench not found: no shared/tools/udpbench above {} (give --udpbench PATH)", cwd.display())
        })?;
    let target =
        exe.parent().and_then(Path::parent).map(|t| t.join("udpbench")).unwrap_or_else(|| cwd.join("target/udpbench"));
    eprintln!("softrdma bench: building udpbench from {}", src.display());
    let st = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "-q", "--manifest-path"])
        .arg(src.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .context("running cargo to build udpbench")?;
    if !st.success() {
        bail!("building udpbench from {} failed", src.display());
    }
    Ok(target.join("release/udpbench"))
}

/// What the table is made of: (group, what, value as text), plus the numbers the ratios use.
#[derive(Default)]
pub(crate) struct Table {
    rows: Vec<(String, String, String)>,
    pub(crate) v: BTreeMap<String, f64>,
}

impl Table {
    pub(crate) fn row(&mut self, group: &str, what: impl Into<String>, value: impl Into<String>) {
        let (what, value) = (what.into(), value.into());
        eprintln!("  {group} | {what} | {value}");
        self.rows.push((group.to_owned(), what, value));
    }
    pub(crate) fn get(&self, k: &str) -> Option<f64> {
        self.v.get(k).copied()
    }
}

pub(crate) fn gbit(mib_s: f64) -> f64 {
    mib_s * 1048576.0 * 8.0 / 1e9
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<f64>().unwrap_or(0.0))
        })
        .unwrap_or(0.0);
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_owned())))
        .unwrap_or_default();
    format!("{cpus} CPUs ({cpu}), {:.0} GiB, {os}, kernel {}", mem / 1048576.0, kernel.trim())
}

fn now_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The target of the scale rows: bytes per idle RC QP (device and client together).
const IDLE_QP_TARGET: f64 = 8.0 * 1024.0;

/// The scale rows: `qps` idle RC QPs on srdma0, then the XRC fan-in from srdma0 to srdma1.
fn scale_rows(t: &mut Table, qps: usize) -> Result<bench_scale::ScaleReport> {
    eprintln!("softrdma bench: {qps} RC QPs on one device; XRC fan-in");
    let s = bench_scale::rc_scale("srdma0", qps)?;
    match &s.error {
        None => t.row(
            "softrdma scale",
            format!("{} RC QPs connected on one device", s.created),
            format!(
                "create {:.2} s, connect {:.2} s, destroy {:.2} s; {:.1} KiB per idle QP (device {:.1} + client {:.1})",
                s.create_secs,
                s.connect_secs,
                s.destroy_secs,
                s.bytes_per_qp as f64 / 1024.0,
                s.daemon_bytes_per_qp as f64 / 1024.0,
                s.client_bytes_per_qp as f64 / 1024.0
            ),
        ),
        Some(e) => t.row(
            "softrdma scale",
            format!("RC QPs on one device (asked {qps})"),
            format!("stopped at {}: {e}", s.created),
        ),
    }
    let x = bench_scale::xrc_fanin("srdma0", "srdma1", 8, 4)?;
    t.row(
        "softrdma scale",
        format!("XRC: {} initiators to {} SRQs", x.n, x.m),
        format!(
            "{} send QPs + {} target QPs, {} messages delivered; RC needs {} QPs on each side",
            x.initiator_qps, x.target_qps, x.messages, x.rc_qps_per_side
        ),
    );
    Ok(s)
}

/// The ratio row of the scale target (none when the scale run stopped short).
fn scale_ratio_row(t: &mut Table, s: &bench_scale::ScaleReport) {
    if s.error.is_none() {
        let v = s.bytes_per_qp as f64;
        t.row(
            "ratio",
            format!("bytes per idle RC QP at {} QPs / 8 KiB", s.connected),
            format!(
                "{:.3} (target <= 1 at 100,000 QPs: {})",
                v / IDLE_QP_TARGET,
                if v > IDLE_QP_TARGET {
                    "missed"
                } else if s.connected >= 100_000 {
                    "met"
                } else {
                    "met at this count; 100,000 not asked"
                }
            ),
        );
    }
}

pub(crate) fn run_bench(a: &BenchArgs) -> Result<ExitCode> {
    if a.progress {
        let (iters, rounds) = if a.quick { (2_000, 1) } else { (20_000, 3) };
        eprintln!("softrdma bench --progress: {rounds} round(s) of {iters} round trips per way");
        let f = crate::bench_progress::run([a.addr0, a.addr1], iters, rounds)?;
        let cmd = if a.quick { "softrdma bench --progress --quick" } else { "softrdma bench --progress" };
        print!("{}", crate::bench_progress::table(&f, cmd));
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().context("finding the softrdma executable")?;
    let qps = a.qps.unwrap_or(if a.quick { 1000 } else { 100_000 });
    if a.only_scale {
        let devs = Devices::start(&exe, [a.addr0, a.addr1])?;
        let mut t = Table::default();
        let s = scale_rows(&mut t, qps)?;
        drop(devs);
        // The whole measurement (where the bytes are: the arena, the daemon's heap, the client's).
        eprintln!("{}", serde_json::to_string_pretty(&s)?);
        scale_ratio_row(&mut t, &s);
        println!("| group | what | result |\n|---|---|---|");
        for (g, w, v) in &t.rows {
            println!("| {g} | {w} | {v} |");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let print_rows = |t: &Table| {
        println!("| group | what | result |\n|---|---|---|");
        for (g, w, v) in &t.rows {
            println!("| {g} | {w} | {v} |");
        }
    };
    if a.only_cluster {
        let mut t = Table::default();
        let mut port = 20000 + (std::process::id() % 20000) as u16;
        crate::bench_cluster::rows(&mut t, &exe, a.quick, &mut port);
        print_rows(&t);
        return Ok(ExitCode::SUCCESS);
    }
    let shim = crate::shim::dir()?;
    ensure_packages(a.no_install)?;
    let ub = udpbench(a.udpbench.as_deref(), &exe)?;
    let started = Instant::now();
    let mut t = Table::default();
    let mut r = Runner {
        shim: &shim,
        addr0: a.addr0,
        addr1: a.addr1,
        port: 20000 + (std::process::id() % 20000) as u16,
        quick: a.quick,
    };
    if a.only_rsockets {
        let devs = Devices::start(&exe, [a.addr0, a.addr1])?;
        rsocket_rows(&mut t, &mut r)?;
        drop(devs);
        print_rows(&t);
        return Ok(ExitCode::SUCCESS);
    }
    if a.only_capture {
        let (rounds, iters) = if a.quick { (1, r.iters(5000)) } else { (3, 5000) };
        crate::bench_capture::rows(&mut t, &mut r, &exe, [a.addr0, a.addr1], rounds, iters)?;
        print_rows(&t);
        return Ok(ExitCode::SUCCESS);
    }

    // The physical limits.
    eprintln!("softrdma bench: physical limits (udpbench)");
    let secs = if a.quick { "1" } else { "3" };
    let ubr = |args: &[&str]| -> Result<BTreeMap<String, f64>> {
        let (st, out) = run(Command::new(&ub).args(args), Duration::from_secs(120))?;
        match (st, parse_udpbench(&out)) {
            (Some(0), Some(m)) => Ok(m),
            _ => bail!("udpbench {}: status {st:?}: {}", args.join(" "), tail(&out)),
        }
    };
    let plain = ubr(&["tput", "plain", "4156", secs])?;
    let gso = ubr(&["tput", "gsogro", "4156", secs])?;
    let gso64 = ubr(&["tput", "gsogro", "64", secs])?;
    let lat = ubr(&["lat", "busy", if a.quick { "5000" } else { "50000" }])?;
    let lat_block = ubr(&["lat", "block", if a.quick { "5000" } else { "50000" }])?;
    let mem = ubr(&["memcpy", "65536", "512"])?;
    let xp = ubr(&["xproc", "64", "65536"])?;
    let floor = crate::bench_floor::measure(if a.quick { 5000 } else { 50000 })?;
    let bulk = crate::bench_floor::bulk(if a.quick { 0.5 } else { 2.0 })?;
    let g = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    t.v.insert("udp_pair_oneway_us".into(), floor.pair_us);
    t.v.insert("roce_write_floor_gbps".into(), bulk.message_icrc_gbs * 8.0);
    t.v.insert("roce_write_floor_no_icrc_gbps".into(), bulk.message_gbs * 8.0);
    t.v.insert("udp_gsogro_gbps".into(), g(&gso, "rx_gbps"));
    t.v.insert("udp_busy_oneway_us".into(), g(&lat, "oneway_p50_ns") / 1000.0);
    t.v.insert("udp_block_rtt_us".into(), g(&lat_block, "rtt_p50_ns") / 1000.0);
    t.v.insert("udp_block_oneway_us".into(), g(&lat_block, "rtt_p50_ns") / 2000.0);
    t.v.insert("memcpy_cold_gbs".into(), g(&mem, "cold_GBps_median"));
    t.row(
        "limit",
        "UDP plain, 4156 B datagrams",
        format!("{:.2} Gbit/s, {:.0} k/s", g(&plain, "rx_gbps"), g(&plain, "rx_pps") / 1e3),
    );
    t.row(
        "limit",
        "UDP GSO+GRO, 4156 B",
        format!("{:.2} Gbit/s, {:.0} k/s", g(&gso, "rx_gbps"), g(&gso, "rx_pps") / 1e3),
    );
    t.row("limit", "UDP GSO+GRO, 64 B", format!("{:.2} M datagrams/s", g(&gso64, "rx_pps") / 1e6));
    t.row(
        "limit",
        "UDP busy-poll ping-pong 64 B",
        format!(
            "one-way p50 {:.2} us (RTT p50 {:.2}, p99 {:.2})",
            g(&lat, "oneway_p50_ns") / 1e3,
            g(&lat, "rtt_p50_ns") / 1e3,
            g(&lat, "rtt_p99_ns") / 1e3
        ),
    );
    t.row(
        "limit",
        "UDP busy-poll ping-pong, a message and its ACK: 2 x 20 B in one GSO send",
        format!(
            "one-way p50 {:.2} us (the same code with one 20 B datagram: {:.2} us)",
            floor.pair_us, floor.single_us
        ),
    );
    t.row(
        "limit",
        "UDP, a 64 KiB WRITE's 16 packets at MTU 4096 (the first alone, 15 in one GSO send)",
        format!(
            "{:.2} Gbit/s of payload, {:.2} with each packet's ICRC computed (15 packets a GSO send: {:.2})",
            bulk.message_gbs * 8.0,
            bulk.message_icrc_gbs * 8.0,
            bulk.gso_gbs * 8.0
        ),
    );
    t.row(
        "limit",
        "UDP blocking ping-pong 64 B",
        format!("RTT p50 {:.2} us, p99 {:.2} us", g(&lat_block, "rtt_p50_ns") / 1e3, g(&lat_block, "rtt_p99_ns") / 1e3),
    );
    t.row(
        "limit",
        "memcpy 64 KiB chunks, one thread",
        format!("cold {:.2} GB/s, hot {:.2} GB/s", g(&mem, "cold_GBps_median"), g(&mem, "hot_GBps_median")),
    );
    t.row(
        "limit",
        "process_vm_readv / writev 64 KiB, cold",
        format!(
            "{:.2} / {:.2} GB/s; a 64 B read {:.2} us",
            g(&xp, "readv_cold_GBps"),
            g(&xp, "writev_cold_GBps"),
            g(&xp, "readv_64B_ns_per_call") / 1e3
        ),
    );

    // The peers.
    eprintln!("softrdma bench: UCX over tcp and libfabric tcp");
    let u = r.ucx("tag_bw", 64, r.iters(200_000))?;
    t.v.insert("ucx_tag_bw_64_mps".into(), u[6] / 1e6);
    t.row("UCX tcp", "ucx_perftest tag_bw 64 B", format!("{:.3} M msg/s", u[6] / 1e6));
    let u = r.ucx("tag_bw", 65536, r.iters(20_000))?;
    t.row("UCX tcp", "ucx_perftest tag_bw 64 KiB", format!("{:.2} Gbit/s", gbit(u[4])));
    let u = r.ucx("ucp_put_bw", 65536, r.iters(20_000))?;
    t.v.insert("ucx_put_bw_gbps".into(), gbit(u[4]));
    t.row("UCX tcp", "ucx_perftest ucp_put_bw 64 KiB", format!("{:.2} Gbit/s", gbit(u[4])));
    let u = r.ucx("tag_lat", 2, r.iters(50_000))?;
    t.v.insert("ucx_tag_lat_us".into(), u[1]);
    t.row("UCX tcp", "ucx_perftest tag_lat 2 B", format!("one-way p50 {:.2} us", u[1]));
    let (_, us) = r.fi(2, r.iters(20_000))?;
    t.v.insert("fi_lat_us".into(), us);
    t.row("libfabric tcp", "fi_pingpong -e rdm 2 B", format!("one-way {us:.2} us"));
    let (mbs, _) = r.fi(65536, r.iters(10_000))?;
    t.v.insert("fi_bw_gbps".into(), mbs * 8.0 / 1e3);
    t.row(
        "libfabric tcp",
        "fi_pingpong -e rdm 64 KiB",
        format!("{:.2} Gbit/s (ping-pong, one message in flight)", mbs * 8.0 / 1e3),
    );

    // softrdma, on both data paths: the daemons' threads move every QP's work (the default), and
    // each program runs the engine for its own QPs (SOFTRDMA_DATAPATH=provider, issue 21's path).
    let devs = Devices::start(&exe, [a.addr0, a.addr1])?;
    for (path, label) in PATHS {
        for (cdev, tag) in [("srdma1", "across"), ("srdma0", "within")] {
            eprintln!("softrdma bench: perftest {tag} devices, {path} path");
            let group = format!("softrdma {tag}, {path} path");
            for prog in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
                for (size, iters) in [(64u32, 20_000u32), (65536, 5000)] {
                    let p = r.perftest(path, prog, cdev, size, r.iters(iters))?;
                    t.v.insert(format!("{prog}_{size}_{tag}{label}_gbps"), gbit(p.mib_s));
                    t.v.insert(format!("{prog}_{size}_{tag}{label}_mpps"), p.mpps);
                    t.row(
                        &group,
                        format!("{prog} -s {size}"),
                        format!("{:.2} Gbit/s, {:.3} M msg/s", gbit(p.mib_s), p.mpps),
                    );
                }
            }
            for prog in ["ib_send_lat", "ib_write_lat"] {
                let p = r.perftest(path, prog, cdev, 2, r.iters(20_000))?;
                t.v.insert(format!("{prog}_2_{tag}{label}_us"), p.lat_p50);
                t.v.insert(format!("{prog}_2_{tag}{label}_p99_us"), p.lat_p99);
                t.row(
                    &group,
                    format!("{prog} -s 2"),
                    format!("one-way p50 {:.2} us, p99 {:.2} us", p.lat_p50, p.lat_p99),
                );
            }
        }
    }

    // Event-driven programs (issue 54, target 3): each side sleeps on its completion channel,
    // against the blocking UDP ping-pong of this run; the polled round trip beside it.
    for (path, label) in PATHS {
        let group = format!("softrdma across, {path} path");
        eprintln!("softrdma bench: ibv_rc_pingpong -e, {path} path");
        let iters = r.iters(20_000);
        let ev = r.rc_pingpong(path, "srdma1", 64, iters, true)?;
        let polled = r.rc_pingpong(path, "srdma1", 64, iters, false)?;
        t.v.insert(format!("rc_pingpong_e_64_across{label}_us"), ev);
        t.row(
            &group,
            "ibv_rc_pingpong -s 64, with -e (completion events) and polled",
            format!("round trip {ev:.2} us with -e, {polled:.2} us polled"),
        );
        let q = r.qperf_rc_lat(path, 64)?;
        t.v.insert(format!("qperf_rc_lat_64_within{label}_us"), q);
        t.row(
            &format!("softrdma within, {path} path"),
            "qperf -cm1 rc_lat -m 64 (completion events)",
            format!("one-way {q:.2} us"),
        );
    }

    rsocket_rows(&mut t, &mut r)?;
    let s = scale_rows(&mut t, qps)?;

    let conns = if a.quick { 200 } else { 1000 };
    eprintln!("softrdma bench: cmtime -c {conns} across devices (rdma_cm)");
    let c = r.cmtime(conns)?;
    let step = |k: &str| c.get(k).copied().unwrap_or(f64::NAN);
    t.v.insert("cmtime_connect_us".into(), step("connect"));
    t.v.insert("cmtime_conn_per_s".into(), c.get("conn_per_s").copied().unwrap_or(f64::NAN));
    t.row(
        "softrdma rdma_cm",
        format!("cmtime -c {conns} across devices"),
        format!(
            "{:.0} connections/s; us per connection: resolve addr {:.1}, resolve route {:.1}, create QP {:.1}, \
             connect {:.1}, disconnect {:.1}",
            step("conn_per_s"),
            step("resolve addr"),
            step("resolve route"),
            step("create qp"),
            step("connect"),
            step("disconnect")
        ),
    );
    // The seeds' LNet pattern (examples/c/lnet_bulk), next to ib_write_bw of this run.
    // Where scripts/build-examples.sh puts it: the target dir's examples/, beside release/ (the
    // executable's) or beside the shim's dir when that is target/release/shim.
    let lnet = [
        exe.parent().and_then(Path::parent).map(|t| t.join("examples/lnet_bulk")),
        Some(shim.join("../../examples/lnet_bulk")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_file())
    .unwrap_or_else(|| shim.join("../../examples/lnet_bulk"));
    let (peers, count) = if a.quick { (8u32, 4u32) } else { (8, 16) };
    if lnet.is_file() {
        eprintln!("softrdma bench: lnet_bulk {peers} peers across devices");
        let before = retransmitted(&exe, &["srdma0", "srdma1"]);
        let (mbs, tps) = r.lnet_bulk(&lnet, peers, count)?;
        let resent = retransmitted(&exe, &["srdma0", "srdma1"]).zip(before).map(|(a, b)| a.saturating_sub(b));
        t.v.insert("lnet_bulk_mbs".into(), mbs);
        t.row(
            "softrdma workload",
            format!("lnet_bulk {peers} peers x {count} x 1 MiB across devices (PUT/GET as 256 x 4 KiB WRITE/READ)"),
            format!(
                "{mbs:.1} MB/s ({:.2} Gbit/s), {tps:.1} transfers/s, {} packets retransmitted",
                mbs * 8.0 / 1e3,
                resent.map_or("?".to_string(), |n| n.to_string())
            ),
        );
    } else {
        t.row(
            "softrdma workload",
            "lnet_bulk",
            format!("not run: {} missing (scripts/build-examples.sh)", lnet.display()),
        );
    }
    drop(devs);

    // The capture's cost (issue 53): alternating runs with it off and on.
    let (rounds, iters) = if a.quick { (1, r.iters(5000)) } else { (3, 5000) };
    crate::bench_capture::rows(&mut t, &mut r, &exe, [a.addr0, a.addr1], rounds, iters)?;

    // Middleware between two cluster hosts (root only).
    if !a.no_cluster {
        crate::bench_cluster::rows(&mut t, &exe, a.quick, &mut r.port);
    }

    crate::bench_ratio::rows(&mut t, &PATHS);
    scale_ratio_row(&mut t, &s);

    let mut md = String::new();
    // The version, not the commit: the table is read by users (BENCHMARKS.md); the commit that
    // made it is in the file's git history.
    let _ = writeln!(
        md,
        "Run: `softrdma bench{}` (softrdma {}) on {}, {}.",
        if a.quick { " --quick" } else { "" },
        env!("CARGO_PKG_VERSION"),
        now_utc(),
        machine()
    );
    let _ = writeln!(
        md,
        "softrdma devices: srdma0 on {}, srdma1 on {}; \"across\" = server on srdma0, client on srdma1; \"within\" = both on srdma0. \
         perftest figures: average bandwidth (Gbit/s = 10^9 bit/s), message rate, and its one-way latency (typical = median, 99th percentile). \
         Whole run: {:.0} s.\n",
        a.addr0,
        a.addr1,
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(md, "| group | what | result |\n|---|---|---|");
    for (g, w, v) in &t.rows {
        let _ = writeln!(md, "| {g} | {w} | {v} |");
    }
    println!("{md}");
    if !a.no_write {
        write_section(&a.write, &md)?;
        eprintln!("softrdma bench: table written to {}", a.write.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Puts `md` between the markers of `file` (replacing what was there), or appends it with them.
/// rsockets (issue 56): rstream across the devices, against the kernel's TCP over loopback
/// between the same addresses in the same run (rstream -T s).
fn rsocket_rows(t: &mut Table, r: &mut Runner<'_>) -> Result<()> {
    let group = "rsockets across, provider path";
    eprintln!("softrdma bench: rstream over rsockets and over tcp");
    let lat_args = ["-S", "64", "-C", "1", "-I", if r.quick { "2000" } else { "20000" }];
    let bw_args = ["-S", "65536", "-C", if r.quick { "2000" } else { "20000" }];
    let (_, lat) = r.rstream("provider", false, &lat_args)?;
    let (_, tcp_lat) = r.rstream("provider", true, &lat_args)?;
    let (bw, _) = r.rstream("provider", false, &bw_args)?;
    let (tcp_bw, _) = r.rstream("provider", true, &bw_args)?;
    t.v.insert("rstream_lat_64_us".into(), lat);
    t.v.insert("rstream_tcp_lat_64_us".into(), tcp_lat);
    t.v.insert("rstream_bw_64k_gbit".into(), bw);
    t.v.insert("rstream_tcp_bw_64k_gbit".into(), tcp_bw);
    t.row(
        group,
        "rstream 64 B ping-pong (-S 64 -C 1): rsockets, then tcp on loopback (-T s)",
        format!("{lat:.2} us, {tcp_lat:.2} us a transfer"),
    );
    t.row(
        group,
        "rstream 64 KiB stream (-S 65536): rsockets, then tcp on loopback (-T s)",
        format!("{bw:.2} Gbit/s, {tcp_bw:.2} Gbit/s"),
    );
    t.row(
        group,
        "ratio rstream rsockets / tcp: latency, bandwidth",
        format!("{:.2}, {:.2}", lat / tcp_lat, bw / tcp_bw),
    );
    Ok(())
}

fn write_section(file: &Path, md: &str) -> Result<()> {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let block = format!("{BEGIN}\n{md}{END}\n");
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => format!("{}{block}{}", &old[..b], old[e + END.len()..].trim_start_matches('\n')),
        _ => {
            let gap = if old.is_empty() || old.ends_with("\n\n") {
                ""
            } else if old.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{old}{gap}## `softrdma bench`\n\n{block}")
        }
    };
    std::fs::write(file, new).with_context(|| format!("writing {}", file.display()))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn the_section_is_replaced_not_repeated() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("B.md");
        std::fs::write(&f, "# Benchmarks\n\nkept\n").unwrap();
        write_section(&f, "first\n").unwrap();
        write_section(&f, "second\n").unwrap();
        let s = std::fs::read_to_string(&f).unwrap();
        assert!(s.starts_with("# Benchmarks\n\nkept\n"));
        assert_eq!(s.matches(BEGIN).count(), 1);
        assert!(s.contains("second\n") && !s.contains("first\n"));
    }
}
