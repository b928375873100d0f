//! `softrdma cluster`: N simulated RoCE hosts on one machine, for middleware tests that want
//! several nodes on one CI runner.
//!
//! Each host is a network namespace (`srdc-hI`) with `lo` up and one interface, `eth0`, a veth
//! whose peer sits on a bridge. The bridge lives in a namespace of its own (`srdc-sw`), so the
//! cluster's /24 exists only inside these namespaces, nothing of it is visible in the machine's
//! own network namespace, and the machine's firewall (iptables/nftables rules and bridge
//! netfilter of the initial namespace) never sees the cluster's frames. The bridge does not snoop
//! IGMP (multicast_snooping 0): every host hears every group, as on a plain Ethernet switch.
//! One softrdma device, `srdma0`, runs in each host on that host's address, with its own runtime
//! directory (unix socket paths are not per network namespace); at MTU 1500 its path MTU is 1024,
//! as a RoCE NIC's on standard Ethernet.
//!
//! `cluster exec I -- PROG` runs a program in host I: its network namespace, a hostname of its
//! own (`srdc-hI`, in a UTS namespace: MPI launchers tell nodes apart by hostname), a fresh sysfs
//! (so /sys/class/net is the host's), and the device presented as `softrdma exec` presents it.
//! `cluster rsh HOST CMD...` is the rsh/ssh stand-in launchers use: like ssh it joins its
//! arguments into one command line for `sh -c` on that host.
//!
//! Needs root (network namespaces, veth, bridges, tc). The state is in /run/softrdma-cluster.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The namespace of the bridge.
const SWITCH_NS: &str = "srdc-sw";
/// Host namespaces are `srdc-h1`, `srdc-h2`, ...
const HOST_PREFIX: &str = "srdc-h";
/// The device each host runs.
const DEVICE: &str = "srdma0";

fn state_dir() -> PathBuf {
    match std::env::var_os("SOFTRDMA_CLUSTER_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from("/run/softrdma-cluster"),
    }
}

/// One host of the cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Host {
    pub(crate) index: u32,
    pub(crate) netns: String,
    pub(crate) addr: Ipv4Addr,
    pub(crate) device: String,
    /// The host's softrdma runtime directory.
    pub(crate) runtime_dir: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    hosts: Vec<Host>,
    subnet: String,
    mtu: u32,
    netem: Option<String>,
    #[serde(default)]
    faults: Option<String>,
}

/// `cluster up` options.
#[derive(Debug, clap::Args)]
pub(crate) struct UpArgs {
    /// How many hosts (1-250).
    #[arg(long, default_value_t = 2)]
    hosts: u32,
    /// The interfaces' MTU.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// A netem qdisc on every host's interface (egress), e.g. "delay 50us loss 0.1%".
    #[arg(long)]
    netem: Option<String>,
    /// Faults every host's device injects on transmit (the device's --faults, e.g.
    /// "loss=0.005"): RoCE packets only, and available where netem is not (kernels without
    /// sch_netem).
    #[arg(long)]
    faults: Option<String>,
    /// The devices' max_cqe: ConnectX's 4194303 by default (the NICs middleware meets; libfabric's
    /// ofi_rxm asks a 262144-entry CQ, beyond rxe's 32767, which a plain `softrdma up` keeps).
    #[arg(long, default_value_t = softrdma_device::hca::MAX_CQE_LIMIT)]
    max_cqe: u32,
    /// The hosts' /24 (the first three octets; host I gets .I).
    #[arg(long, default_value = "10.199.0.0")]
    subnet: Ipv4Addr,
}

fn need_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("softrdma cluster needs root: it creates network namespaces, veth pairs and a bridge (run it with sudo)");
    }
    Ok(())
}

/// Runs a command and fails with its stderr.
fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args))
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Namespaces of ours that exist, found by name (also without a state file, after a crash).
fn our_namespaces() -> Vec<String> {
    let Ok(rd) = fs::read_dir("/run/netns") else { return Vec::new() };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n == SWITCH_NS || n.strip_prefix(HOST_PREFIX).is_some_and(|i| i.parse::<u32>().is_ok()))
        .collect();
    v.sort();
    v
}

fn load() -> Result<Option<State>> {
    let p = state_dir().join("state.json");
    match fs::read_to_string(&p) {
        Ok(s) => Ok(Some(serde_json::from_str(&s).with_context(|| format!("reading {}", p.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

fn loaded() -> Result<State> {
    load()?.context("no cluster is up (softrdma cluster up --hosts N)")
}

pub(crate) fn up(a: &UpArgs) -> Result<ExitCode> {
    need_root()?;
    if !(1..=250).contains(&a.hosts) {
        bail!("--hosts takes 1 to 250");
    }
    if !(576..=65535).contains(&a.mtu) {
        bail!("--mtu takes 576 to 65535");
    }
    if !(1..=softrdma_device::hca::MAX_CQE_LIMIT).contains(&a.max_cqe) {
        bail!("--max-cqe takes 1 to {}", softrdma_device::hca::MAX_CQE_LIMIT);
    }
    if let Some(s) = load()? {
        if s.hosts.iter().all(|h| netns_exists(&h.netns)) && netns_exists(SWITCH_NS) {
            bail!(
                "a cluster of {} hosts is already up (softrdma cluster status); run softrdma cluster down first",
                s.hosts.len()
            );
        }
    }
    // Leftovers of a cluster that died half-way go first.
    down_all()?;
    let o = a.subnet.octets();
    let subnet = format!("{}.{}.{}.0/24", o[0], o[1], o[2]);
    let r = build(a, o);
    if r.is_err() {
        let _ = down_all();
    }
    let hosts = r?;
    let dir = state_dir();
    fs::create_dir_all(&dir)?;
    let state = State { hosts, subnet, mtu: a.mtu, netem: a.netem.clone(), faults: a.faults.clone() };
    fs::write(dir.join("state.json"), serde_json::to_string_pretty(&state)?)?;
    print_status(&state, false);
    Ok(ExitCode::SUCCESS)
}

fn build(a: &UpArgs, o: [u8; 4]) -> Result<Vec<Host>> {
    let mtu = a.mtu.to_string();
    ip(&["netns", "add", SWITCH_NS])?;
    ip(&["-n", SWITCH_NS, "link", "set", "lo", "up"])?;
    ip(&["-n", SWITCH_NS, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"])?;
    ip(&["-n", SWITCH_NS, "link", "set", "br0", "mtu", &mtu, "up"])?;
    // Bridge netfilter, where the module is loaded, is per namespace: off for our bridge (the
    // namespace has no rules anyway).
    let _ = run(Command::new("ip").args(["netns", "exec", SWITCH_NS, "sh", "-c"]).arg(
        "for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables; do [ -w $f ] && echo 0 > $f; done; true",
    ));
    let exe = std::env::current_exe()?;
    let mut hosts = Vec::new();
    for i in 1..=a.hosts {
        let ns = format!("{HOST_PREFIX}{i}");
        let (sw_end, host_end) = (format!("srdc-p{i}"), format!("srdc-e{i}"));
        ip(&["netns", "add", &ns])?;
        ip(&["link", "add", &sw_end, "type", "veth", "peer", "name", &host_end])?;
        ip(&["link", "set", &sw_end, "netns", SWITCH_NS])?;
        ip(&["link", "set", &host_end, "netns", &ns])?;
        ip(&["-n", SWITCH_NS, "link", "set", &sw_end, "mtu", &mtu, "master", "br0", "up"])?;
        ip(&["-n", &ns, "link", "set", &host_end, "name", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "mtu", &mtu, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let addr = Ipv4Addr::new(o[0], o[1], o[2], i as u8);
        ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
        if let Some(netem) = &a.netem {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem"]);
            c.args(netem.split_whitespace());
            run(&mut c).context(
                "adding the netem qdisc (this kernel may lack sch_netem: --faults injects loss in the devices instead)",
            )?;
        }
        let runtime_dir = state_dir().join(format!("h{i}"));
        fs::create_dir_all(&runtime_dir)?;
        fs::set_permissions(&runtime_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        hosts.push(Host { index: i, netns: ns, addr, device: DEVICE.into(), runtime_dir });
    }
    // The devices, once every link is up (duplicate address detection is moot on IPv4).
    for h in &hosts {
        run(Command::new("ip")
            .args(["netns", "exec", &h.netns])
            .arg(&exe)
            .args(["up", DEVICE, "--addr", &h.addr.to_string()])
            .args(a.faults.iter().flat_map(|f| ["--faults", f.as_str()]))
            .args(["--max-cqe", &a.max_cqe.to_string()])
            .env("SOFTRDMA_RUNTIME_DIR", &h.runtime_dir))
        .with_context(|| format!("starting {DEVICE} on host {}", h.index))?;
    }
    Ok(hosts)
}

pub(crate) fn down() -> Result<ExitCode> {
    need_root()?;
    down_all()?;
    Ok(ExitCode::SUCCESS)
}

/// Removes everything of ours: the processes in our namespaces (devices first, politely), the
/// namespaces (which takes their veths along), the runtime directories and the state.
fn down_all() -> Result<()> {
    let exe = std::env::current_exe()?;
    if let Ok(Some(s)) = load() {
        for h in &s.hosts {
            if netns_exists(&h.netns) {
                let _ = Command::new(&exe)
                    .args(["down", &h.device])
                    .env("SOFTRDMA_RUNTIME_DIR", &h.runtime_dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    for ns in our_namespaces() {
        kill_all_in(&ns);
        ip(&["netns", "del", &ns]).with_context(|| format!("removing namespace {ns}"))?;
    }
    let dir = state_dir();
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// Ends every process left in a namespace: TERM, then KILL after 2 s.
fn kill_all_in(ns: &str) {
    let pids = || -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default()
    };
    let signal = |sig| {
        for p in pids() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), sig);
        }
    };
    signal(nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(2);
    while !pids().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(nix::sys::signal::Signal::SIGKILL);
}

pub(crate) fn status(json: bool) -> Result<ExitCode> {
    match load()? {
        Some(s) => print_status(&s, json),
        None if json => println!("{}", serde_json::json!({ "hosts": [] })),
        None => println!("no cluster is up"),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(s: &State, json: bool) {
    if json {
        let hosts: Vec<_> = s
            .hosts
            .iter()
            .map(|h| {
                serde_json::json!({
                    "index": h.index, "netns": h.netns, "addr": h.addr.to_string(), "device": h.device,
                    "runtime_dir": h.runtime_dir.display().to_string(), "up": netns_exists(&h.netns),
                })
            })
            .collect();
        let v = serde_json::json!({ "hosts": hosts, "subnet": s.subnet, "mtu": s.mtu, "netem": s.netem, "faults": s.faults });
        println!("{v}");
        return;
    }
    println!(
        "# {} hosts on {} (mtu {}{})",
        s.hosts.len(),
        s.subnet,
        s.mtu,
        s.netem.as_ref().map(|n| format!(", netem {n}")).unwrap_or_default()
    );
    for h in &s.hosts {
        println!("{}\t{}\t{}\t{}", h.index, h.netns, h.addr, h.device);
    }
}

/// A host by index (`2`), namespace (`srdc-h2`), short name (`h2`) or address.
fn find<'a>(s: &'a State, which: &str) -> Result<&'a Host> {
    let hit = s.hosts.iter().find(|h| {
        which == h.index.to_string()
            || which == h.netns
            || which == format!("h{}", h.index)
            || which.parse::<Ipv4Addr>().is_ok_and(|a| a == h.addr)
    });
    hit.with_context(|| {
        let names: Vec<String> = s.hosts.iter().map(|h| format!("{} ({})", h.index, h.addr)).collect();
        format!("no host {which:?} in the cluster; its hosts: {}", names.join(", "))
    })
}

/// `cluster exec HOST -- PROG ARGS`.
pub(crate) fn exec(which: &str, program: &[String]) -> Result<ExitCode> {
    need_root()?;
    let s = loaded()?;
    let h = find(&s, which)?;
    if program.is_empty() {
        bail!("usage: softrdma cluster exec HOST -- PROGRAM [ARGS...]");
    }
    enter(h)?;
    crate::exec_cmd::exec_presented(program, &h.runtime_dir)
}

/// `cluster rsh HOST CMD ARGS...`: what ssh does with its arguments (one command line, run by
/// the remote shell).
pub(crate) fn rsh(which: &str, words: &[String]) -> Result<ExitCode> {
    if words.is_empty() {
        bail!("softrdma cluster rsh: no command (an interactive shell is not offered)");
    }
    exec(which, &["/bin/sh".into(), "-c".into(), words.join(" ")])
}

/// Moves this process into host `h`: its network namespace, and a UTS namespace with its name.
fn enter(h: &Host) -> Result<()> {
    let p = Path::new("/run/netns").join(&h.netns);
    let f = fs::File::open(&p)
        .with_context(|| format!("host {} is gone ({}): is the cluster up?", h.index, p.display()))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).with_context(|| format!("entering {}", h.netns))?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUTS).context("a UTS namespace for the host's name")?;
    nix::unistd::sethostname(&h.netns).context("setting the host's name")?;
    Ok(())
}
