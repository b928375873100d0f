//! The programs a `softrdma bench` run starts: its two devices, perftest and the other peers'
//! servers and clients ([`Runner`]), each run to its end or killed, and stopped on drop.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench_parse::{
    parse_cmtime, parse_fi, parse_lnet_bulk, parse_perftest, parse_pingpong, parse_qperf_latency, parse_ucx, Perf,
};

/// Children that must not outlive the run.
#[derive(Default)]
pub(crate) struct Procs {
    children: Vec<Child>,
}

impl Procs {
    pub(crate) fn spawn(&mut self, cmd: &mut Command) -> Result<usize> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        self.children.push(child);
        Ok(self.children.len() - 1)
    }

    /// Waits up to `limit` for child `i`, then kills it. Its status (None when killed) and output.
    pub(crate) fn finish(&mut self, i: usize, limit: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + limit;
        let child = &mut self.children[i];
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s.code(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let mut out = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut out);
        }
        (status, out)
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.children {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Runs a command to its end (killed after `limit`); its status and output (stdout then stderr).
pub(crate) fn run(cmd: &mut Command, limit: Duration) -> Result<(Option<i32>, String)> {
    let mut p = Procs::default();
    let i = p.spawn(cmd)?;
    Ok(p.finish(i, limit))
}

/// The two devices of the run, in a private runtime directory; stopped and removed on drop.
pub(crate) struct Devices {
    exe: PathBuf,
    dir: PathBuf,
    pids: Vec<i32>,
}

impl Devices {
    pub(crate) fn start(exe: &Path, addrs: [IpAddr; 2]) -> Result<Devices> {
        Devices::start_with(exe, addrs, [Vec::new(), Vec::new()])
    }

    /// As [`Devices::start`], each device with `extra` arguments of `softrdma up`.
    pub(crate) fn start_with(exe: &Path, addrs: [IpAddr; 2], extra: [Vec<String>; 2]) -> Result<Devices> {
        let dir = std::env::temp_dir().join(format!("softrdma-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        // Every program of the run (perftest through the shim, this process's own clients)
        // finds these devices and no other, and none starts a default device.
        std::env::set_var("SOFTRDMA_RUNTIME_DIR", &dir);
        std::env::set_var("SOFTRDMA_NO_AUTOSTART", "1");
        let mut d = Devices { exe: exe.to_owned(), dir, pids: Vec::new() };
        for (i, a) in addrs.iter().enumerate() {
            let mut args = vec!["--addr".to_owned(), a.to_string()];
            args.extend(extra[i].iter().cloned());
            let info = softrdma_device::daemon::up(exe, &format!("srdma{i}"), &args)
                .with_context(|| format!("starting srdma{i} on {a} (another address: --addr{i})"))?;
            d.pids.push(info.pid);
        }
        Ok(d)
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        for i in 0..self.pids.len() {
            let _ = run(Command::new(&self.exe).args(["down", &format!("srdma{i}")]), Duration::from_secs(15));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) struct Runner<'a> {
    pub(crate) shim: &'a Path,
    pub(crate) addr0: IpAddr,
    pub(crate) addr1: IpAddr,
    pub(crate) port: u16,
    pub(crate) quick: bool,
}

impl Runner<'_> {
    pub(crate) fn next_port(&mut self) -> u16 {
        self.port += 1;
        self.port
    }

    /// An unchanged perftest program as server (srdma0) and client (`cdev`), through the shim,
    /// both on the data path `path` (`SOFTRDMA_DATAPATH`: "device" or "provider").
    pub(crate) fn perftest(&mut self, path: &str, prog: &str, cdev: &str, size: u32, iters: u32) -> Result<Perf> {
        let port = self.next_port().to_string();
        let args = ["-s", &size.to_string(), "-n", &iters.to_string(), "-p", &port];
        let cmd = |dev: &str| {
            let mut c = Command::new(prog);
            c.args(["-d", dev]).args(args).env("LD_LIBRARY_PATH", self.shim).env("SOFTRDMA_DATAPATH", path);
            c
        };
        let addr = self.addr0.to_string();
        let (client, (sst, sout)) = server_client(
            &mut cmd("srdma0"),
            || {
                let mut c = cmd(cdev);
                c.arg(&addr);
                c
            },
            Duration::from_secs(300),
            Duration::from_secs(30),
            |c, _| c.1.contains("Couldn't connect"),
        )?;
        let lat = prog.ends_with("_lat");
        match (client.0, sst, parse_perftest(&client.1, lat)) {
            (Some(0), Some(0), Some(p)) => Ok(p),
            _ => bail!(
                "{prog} -s {size} ({path} path, client on {cdev}): client status {:?}, server status {sst:?}\nclient: {}\nserver: {}",
                client.0,
                tail(&client.1),
                tail(&sout)
            ),
        }
    }

    /// rdma-core's ibv_rc_pingpong, server on srdma0 and client on `cdev`, `size` B messages,
    /// `iters` round trips, with `-e` (each side arms its CQ and sleeps on the completion
    /// channel: the event-driven path) or polling: the client's round trip in us.
    pub(crate) fn rc_pingpong(&mut self, path: &str, cdev: &str, size: u32, iters: u32, events: bool) -> Result<f64> {
        let port = self.next_port().to_string();
        let args = ["-g", "0", "-s", &size.to_string(), "-n", &iters.to_string(), "-p", &port];
        let cmd = |dev: &str| {
            let mut c = Command::new("ibv_rc_pingpong");
            c.args(["-d", dev]).args(args).env("LD_LIBRARY_PATH", self.shim).env("SOFTRDMA_DATAPATH", path);
            if events {
                c.arg("-e");
            }
            c
        };
        let addr = self.addr0.to_string();
        let (client, (sst, sout)) = server_client(
            &mut cmd("srdma0"),
            || {
                let mut c = cmd(cdev);
                c.arg(&addr);
                c
            },
            Duration::from_secs(120),
            Duration::from_secs(30),
            |c, _| c.1.contains("Couldn't connect"),
        )?;
        match (client.0, sst, parse_pingpong(&client.1)) {
            (Some(0), Some(0), Some(us)) => Ok(us),
            _ => bail!(
                "ibv_rc_pingpong -s {size}{} ({path} path, client on {cdev}): client status {:?}, server status {sst:?}\nclient: {}\nserver: {}",
                if events { " -e" } else { "" },
                client.0,
                tail(&client.1),
                tail(&sout)
            ),
        }
    }

    /// qperf's rc_lat over rdma_cm (`-cm1`: it sleeps on completion channels), server and client
    /// both on srdma0 (qperf's client has no source address): the one-way latency in us.
    pub(crate) fn qperf_rc_lat(&mut self, path: &str, size: u32) -> Result<f64> {
        let port = self.next_port().to_string();
        let addr = self.addr0.to_string();
        let env = [("LD_LIBRARY_PATH", self.shim.as_os_str()), ("SOFTRDMA_DATAPATH", path.as_ref())];
        let (client, _) = server_client(
            Command::new("qperf").args(["-lp", &port]).envs(env),
            || {
                let mut c = Command::new("qperf");
                c.args([addr.as_str(), "-lp", &port, "-cm1", "-t", if self.quick { "1" } else { "3" }])
                    .args(["-m", &size.to_string(), "rc_lat"])
                    .envs(env);
                c
            },
            Duration::from_secs(60),
            Duration::from_secs(5),
            failed_at_once,
        )?;
        match (client.0, parse_qperf_latency(&client.1)) {
            (Some(0), Some(us)) => Ok(us),
            _ => bail!("qperf -cm1 rc_lat -m {size} ({path} path): status {:?}: {}", client.0, tail(&client.1)),
        }
    }

    /// rdmacm-utils' rstream between the two devices' addresses, over rsockets (softrdma's
    /// librdmacm, `path` data path) or with `tcp` over the kernel's TCP on loopback (`-T s`):
    /// the client's (Gbit/s, us a transfer).
    pub(crate) fn rstream(&mut self, path: &str, tcp: bool, args: &[&str]) -> Result<(f64, f64)> {
        let port = self.next_port().to_string();
        let (addr0, addr1) = (self.addr0.to_string(), self.addr1.to_string());
        let env = [("LD_LIBRARY_PATH", self.shim.as_os_str()), ("SOFTRDMA_DATAPATH", path.as_ref())];
        let t: &[&str] = if tcp { &["-T", "s"] } else { &[] };
        let (client, _) = server_client(
            Command::new("rstream").args(["-b", &addr0, "-p", &port]).args(args).args(t).envs(env),
            || {
                let mut c = Command::new("rstream");
                c.args(["-s", &addr0, "-b", &addr1, "-p", &port]).args(args).args(t).envs(env);
                c
            },
            Duration::from_secs(120),
            Duration::from_secs(10),
            failed_at_once,
        )?;
        // The result row: name bytes xfers iters total time Gb/sec usec/xfer.
        let row = client.1.lines().find(|l| l.starts_with("custom")).map(|l| l.split_whitespace().collect::<Vec<_>>());
        match (client.0, row) {
            (Some(0), Some(f)) if f.len() >= 8 => {
                let num = |s: &str| s.parse::<f64>().ok();
                match (num(f[6]), num(f[7])) {
                    (Some(g), Some(us)) => Ok((g, us)),
                    _ => bail!("rstream {args:?}: no figures in {f:?}"),
                }
            }
            _ => bail!(
                "rstream {args:?} ({}): status {:?}: {}",
                if tcp { "tcp" } else { path },
                client.0,
                tail(&client.1)
            ),
        }
    }

    /// ucx_perftest over tcp on loopback: server and client.
    pub(crate) fn ucx(&mut self, test: &str, size: u32, iters: u32) -> Result<Vec<f64>> {
        let port = self.next_port().to_string();
        let env = [("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")];
        let (size_s, iters_s) = (size.to_string(), iters.to_string());
        let (client, _) = server_client(
            Command::new("ucx_perftest").args(["-p", &port]).envs(env),
            || {
                let mut c = Command::new("ucx_perftest");
                c.args(["127.0.0.1", "-p", &port, "-t", test, "-s", &size_s, "-n", &iters_s, "-f"]).envs(env);
                c
            },
            Duration::from_secs(120),
            Duration::from_secs(10),
            failed_at_once,
        )?;
        match (client.0, parse_ucx(&client.1)) {
            (Some(0), Some(v)) => Ok(v),
            _ => bail!("ucx_perftest -t {test} -s {size}: status {:?}: {}", client.0, tail(&client.1)),
        }
    }

    /// fi_pingpong on libfabric's tcp provider (reliable datagram endpoints): MB/s and one-way us.
    pub(crate) fn fi(&mut self, size: u32, iters: u32) -> Result<(f64, f64)> {
        let port = self.next_port().to_string();
        let (size_s, iters_s) = (size.to_string(), iters.to_string());
        let common = ["-p", "tcp", "-e", "rdm", "-S", &size_s, "-I", &iters_s];
        let (client, _) = server_client(
            Command::new("fi_pingpong").args(common).args(["-B", &port]),
            || {
                let mut c = Command::new("fi_pingpong");
                c.args(common).args(["-P", &port, "127.0.0.1"]);
                c
            },
            Duration::from_secs(120),
            Duration::from_secs(10),
            failed_at_once,
        )?;
        match (client.0, parse_fi(&client.1)) {
            (Some(0), Some(v)) => Ok(v),
            _ => bail!("fi_pingpong -S {size}: status {:?}: {}", client.0, tail(&client.1)),
        }
    }

    /// rdmacm-utils' cmtime: its server (which never exits by itself) bound to srdma0, and a
    /// client on srdma1 making `conns` connections at once. Its step table, in us per
    /// connection ("us / conn"), plus `conn_per_s`: connections over the connect step's total.
    pub(crate) fn cmtime(&mut self, conns: u32) -> Result<BTreeMap<String, f64>> {
        let port = self.next_port().to_string();
        let (addr0, addr1) = (self.addr0.to_string(), self.addr1.to_string());
        let mut procs = Procs::default();
        let mut server = Command::new("cmtime");
        server.args(["-b", &addr0, "-p", &port]).env("LD_LIBRARY_PATH", self.shim);
        procs.spawn(&mut server)?;
        let mut out = (None, String::new());
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(100));
            let t0 = Instant::now();
            let mut c = Command::new("cmtime");
            c.args(["-s", &addr0, "-b", &addr1, "-p", &port, "-c", &conns.to_string()])
                .env("LD_LIBRARY_PATH", self.shim);
            out = run(&mut c, Duration::from_secs(120))?;
            if !failed_at_once(&out, t0.elapsed()) {
                break;
            }
        }
        drop(procs);
        match (out.0, parse_cmtime(&out.1)) {
            (Some(0), Some(mut m)) => {
                let total_ms = m.get("connect_total_ms").copied().unwrap_or(f64::NAN);
                m.insert("conn_per_s".into(), f64::from(conns) / (total_ms / 1000.0));
                Ok(m)
            }
            _ => bail!("cmtime -c {conns}: status {:?}: {}", out.0, tail(&out.1)),
        }
    }

    /// examples/c's lnet_bulk (the o2iblnd pattern): its server on srdma0, a client on srdma1
    /// with `peers` connections moving `count` 1 MiB transfers each (PUT and GET alternately),
    /// every byte checked. Returns (MB/s, transfers/s) from the client's final line.
    pub(crate) fn lnet_bulk(&mut self, prog: &Path, peers: u32, count: u32) -> Result<(f64, f64)> {
        let port = self.next_port().to_string();
        let (addr0, addr1) = (self.addr0.to_string(), self.addr1.to_string());
        let mut procs = Procs::default();
        let mut server = Command::new(prog);
        server
            .args(["--server", "--addr", &addr0, "--port", &port, "--peers", &peers.to_string()])
            .env("LD_LIBRARY_PATH", self.shim);
        procs.spawn(&mut server)?;
        let mut out = (None, String::new());
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(100));
            let t0 = Instant::now();
            let mut c = Command::new(prog);
            c.args(["--client", &addr0, "--src", &addr1, "--port", &port, "--peers", &peers.to_string()])
                .args(["--count", &count.to_string(), "--verify"])
                .env("LD_LIBRARY_PATH", self.shim);
            out = run(&mut c, Duration::from_secs(300))?;
            if !failed_at_once(&out, t0.elapsed()) {
                break;
            }
        }
        drop(procs);
        match (out.0, parse_lnet_bulk(&out.1)) {
            (Some(0), Some(v)) => Ok(v),
            _ => bail!("lnet_bulk --peers {peers} --count {count}: status {:?}: {}", out.0, tail(&out.1)),
        }
    }

    pub(crate) fn iters(&self, full: u32) -> u32 {
        if self.quick {
            (full / 10).max(100)
        } else {
            full
        }
    }
}

/// A status and the output of a finished program.
pub(crate) type Outcome = (Option<i32>, String);

/// Starts `server`, then runs the client `client()` (for at most `client_limit`) until
/// `retry(outcome, how long it took)` says the server was simply not listening yet, at most 50
/// times; then gives the server `server_limit` to finish. The client's and the server's outcome.
pub(crate) fn server_client(
    server: &mut Command,
    client: impl Fn() -> Command,
    client_limit: Duration,
    server_limit: Duration,
    retry: impl Fn(&Outcome, Duration) -> bool,
) -> Result<(Outcome, Outcome)> {
    let mut procs = Procs::default();
    let s = procs.spawn(server)?;
    let mut c = (None, String::new());
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        c = run(&mut client(), client_limit)?;
        if !retry(&c, t0.elapsed()) {
            break;
        }
    }
    Ok((c, procs.finish(s, server_limit)))
}

/// A peer's client that failed within 3 s: its server was not listening yet.
pub(crate) fn failed_at_once(c: &Outcome, took: Duration) -> bool {
    c.0 != Some(0) && took < Duration::from_secs(3)
}

pub(crate) fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(4)..].join(" / ")
}
