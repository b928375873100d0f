//! The device commands: `daemon`, `up`, `down`, `list`, `stat`.

use std::io::{self, Write as _};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::{Args, ValueEnum};
use softrdma_device::client::Connection;
use softrdma_device::daemon;
use softrdma_device::hca::HcaConfig;
use softrdma_device::proto::{Request, Response};
use softrdma_device::runtime;
use softrdma_engine::device::{IcrcPolicy, WireProfile, XrcPolicy};
use softrdma_engine::verbs::Mtu;

/// How to run a device (the options of `daemon` and `up`).
#[derive(Args, Debug, Clone)]
pub(crate) struct DeviceArgs {
    /// The IP address (IPv4 or IPv6) whose UDP port 4791 the device owns; its GID.
    #[arg(long)]
    pub(crate) addr: IpAddr,
    /// Active MTU (256, 512, 1024, 2048 or 4096); default: from the interface MTU, as rxe.
    #[arg(long)]
    pub(crate) mtu: Option<u32>,
    /// Capture every packet the device sends or receives into this pcap file.
    #[arg(long)]
    pub(crate) pcap: Option<PathBuf>,
    /// Faults to inject on transmit, e.g. loss=0.01,duplicate=0.01,reorder=0.01,corrupt=0.001,delay=1ms,seed=7
    /// (ack_loss=P: the loss rate of ACK/NAK packets alone, default: loss; reorder_delay=D: how long a
    /// reordered packet is held back, default 1ms; dup= is an alias of duplicate=).
    #[arg(long, default_value = "")]
    pub(crate) faults: String,
    /// UDP port (4791 is RoCEv2's; another one only for tests).
    #[arg(long, default_value_t = 4791)]
    pub(crate) port: u16,
    /// Send sockets for flow entropy (source ports 0xC000 upward); 0 sends from the 4791 socket.
    #[arg(long, default_value_t = 8)]
    pub(crate) flow_ports: u16,
    /// ICRC check of IPv4 packets: `any-id` accepts an ICRC that holds for some IPv4 ID (a UDP
    /// socket cannot see the sender's ID); `exact` requires ID 0.
    #[arg(long, value_enum, default_value_t = IcrcArg::AnyId)]
    pub(crate) icrc: IcrcArg,
    /// XRC target QP lifetime when its last handle closes without a destroy: `domain` (lives
    /// with its XRC domain) or `last-close` (destroyed, as upstream Linux).
    #[arg(long, value_enum, default_value_t = XrcArg::Domain)]
    pub(crate) xrc_tgt_lifetime: XrcArg,
    /// Seed of the device's random choices.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Send one packet per UDP send instead of batching consecutive packets into UDP GSO sends
    /// (up to 64 segments; segment k's ICRC is computed for IPv4 ID k, as Linux numbers them).
    /// GSO is the default: 1.4x the WRITE bandwidth on loopback (BENCHMARKS.md).
    #[arg(long)]
    pub(crate) no_gso: bool,
    /// The CM response timeout the device's REQs ask for (4.096 us x 2^N): 20 as Linux's rdma_cm
    /// (a REQ to a silent peer is retried 15 times, ~98 s in all), 22 as Mellanox firmware sends;
    /// default: the profile's (20 for rxe, 22 for cx).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub(crate) cm_response_timeout: Option<u8>,
    /// The wire choices the IBTA leaves open: `rxe` (Linux soft-RoCE) or `cx` (ConnectX as the
    /// shared hardware captures show it: MigReq set, ACK credits counted, AckReq on a QP's first
    /// packet, CM response timeout 22). INTEROP.md has the table.
    #[arg(long, default_value = "rxe", value_parser = clap::builder::PossibleValuesParser::new(WireProfile::NAMES))]
    pub(crate) profile: String,
    /// Scale of every CM timer (response timeouts, timewait), e.g. 0.01 to make a REQ to a
    /// silent peer give up in about a second; for tests. 1 is the kernel's timing.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) cm_timer_scale: f64,
    /// Seconds a path rdma_resolve_route looked up (route and neighbour tables) stays in the
    /// device's path record cache; 0 turns the cache off. Route, address, link and neighbour
    /// changes drop entries earlier.
    #[arg(long, default_value_t = 30)]
    pub(crate) path_cache_ttl: u64,
    /// Most entries of one CQ (max_cqe); default rxe's 32767, at most ConnectX's 4194303.
    /// libfabric's ofi_rxm asks 1024 x universe size (262144 by default).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=softrdma_device::hca::MAX_CQE_LIMIT as i64))]
    pub(crate) max_cqe: Option<u32>,
    /// End the device after this many seconds with no client attached (autostarted devices get
    /// 300); 0 or absent: never. A device also ends when its socket file is removed.
    #[arg(long)]
    pub(crate) idle_exit: Option<u64>,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub(crate) enum IcrcArg {
    AnyId,
    Exact,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub(crate) enum XrcArg {
    Domain,
    LastClose,
}

impl DeviceArgs {
    pub(crate) fn config(&self, name: &str) -> Result<HcaConfig> {
        let mut c = HcaConfig::new(name, self.addr);
        c.mtu = match self.mtu {
            None => None,
            Some(256) => Some(Mtu::Mtu256),
            Some(512) => Some(Mtu::Mtu512),
            Some(1024) => Some(Mtu::Mtu1024),
            Some(2048) => Some(Mtu::Mtu2048),
            Some(4096) => Some(Mtu::Mtu4096),
            Some(m) => bail!("--mtu {m}: use 256, 512, 1024, 2048 or 4096"),
        };
        c.pcap = self.pcap.clone();
        c.faults = self.faults.parse()?;
        c.port = self.port;
        c.flow_ports = self.flow_ports;
        c.icrc = match self.icrc {
            IcrcArg::AnyId => IcrcPolicy::AnyIpv4Id,
            IcrcArg::Exact => IcrcPolicy::Exact,
        };
        c.xrc_policy = match self.xrc_tgt_lifetime {
            XrcArg::Domain => XrcPolicy::LiveWithDomain,
            XrcArg::LastClose => XrcPolicy::DestroyOnLastClose,
        };
        c.seed = self.seed;
        c.gso = !self.no_gso;
        // A daemon serves processes: its own thread moves the work (whatever
        // $SOFTRDMA_PROGRESS says for devices embedded in a program), and its port is steered
        // so that clients may run their own QPs (SOFTRDMA_DATAPATH=provider).
        c.progress = softrdma_device::Progress::DeviceThread;
        c.steered = true;
        c.behaviour =
            WireProfile::by_name(&self.profile).ok_or_else(|| anyhow::anyhow!("unknown profile {}", self.profile))?;
        c.cm_response_timeout = self.cm_response_timeout.unwrap_or(profile_cm_response_timeout(c.behaviour));
        if !(self.cm_timer_scale > 0.0 && self.cm_timer_scale <= 1000.0) {
            bail!("--cm-timer-scale {}: use a factor above 0 and at most 1000", self.cm_timer_scale);
        }
        c.cm_timer_permille = ((self.cm_timer_scale * 1000.0).round() as u32).max(1);
        c.path_cache_ttl = std::time::Duration::from_secs(self.path_cache_ttl);
        c.max_cqe = self.max_cqe;
        Ok(c)
    }

    /// The same options as command-line arguments (for `up` to pass to `daemon`).
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut a = vec!["--addr".into(), self.addr.to_string()];
        if let Some(m) = self.mtu {
            a.extend(["--mtu".into(), m.to_string()]);
        }
        if let Some(p) = &self.pcap {
            let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            a.extend(["--pcap".into(), p.display().to_string()]);
        }
        a.extend(["--faults".into(), self.faults.clone(), "--port".into(), self.port.to_string()]);
        a.extend(["--flow-ports".into(), self.flow_ports.to_string()]);
        a.extend(["--icrc".into(), self.icrc.to_possible_value().expect("named").get_name().to_owned()]);
        let x = self.xrc_tgt_lifetime.to_possible_value().expect("named");
        a.extend(["--xrc-tgt-lifetime".into(), x.get_name().to_owned()]);
        if let Some(s) = self.seed {
            a.extend(["--seed".into(), s.to_string()]);
        }
        if self.no_gso {
            a.push("--no-gso".into());
        }
        if let Some(t) = self.cm_response_timeout {
            a.extend(["--cm-response-timeout".into(), t.to_string()]);
        }
        a.extend(["--profile".into(), self.profile.clone()]);
        a.extend(["--cm-timer-scale".into(), self.cm_timer_scale.to_string()]);
        a.extend(["--path-cache-ttl".into(), self.path_cache_ttl.to_string()]);
        if let Some(m) = self.max_cqe {
            a.extend(["--max-cqe".into(), m.to_string()]);
        }
        if let Some(i) = self.idle_exit {
            a.extend(["--idle-exit".into(), i.to_string()]);
        }
        a
    }
}

/// The CM response timeout a profile's REQs carry: 20 as Linux's rdma_cm, 22 as ConnectX
/// firmware (the REQs of write.pcap, read2.pcap, send.pcap: ../shared/reference/cm).
pub(crate) fn profile_cm_response_timeout(b: WireProfile) -> u8 {
    if b.name == softrdma_engine::device::ProfileName::Cx {
        22
    } else {
        20
    }
}

pub(crate) fn daemon(name: &str, args: &DeviceArgs) -> Result<ExitCode> {
    let cfg = args.config(name)?;
    let idle = args.idle_exit.filter(|&s| s > 0).map(std::time::Duration::from_secs);
    let idle_secs = args.idle_exit.unwrap_or(0);
    let r = softrdma_daemon::run(
        cfg,
        idle,
        |info| {
            println!(
                "softrdma: device {} on {} (UDP {}), active MTU {}, pid {}",
                info.name,
                info.addr,
                args.port,
                info.active_mtu.bytes(),
                info.pid
            );
        },
        // One write each, before the daemon lets go of its lock.
        |ended| match ended {
            softrdma_daemon::server::Ended::SocketGone => {
                eprintln!("softrdma: device {name}: its socket file was removed or replaced; ending")
            }
            softrdma_daemon::server::Ended::Idle => {
                eprintln!("softrdma: device {name}: no client for {idle_secs} s; ending")
            }
            softrdma_daemon::server::Ended::Stopped => {}
        },
    );
    match r {
        // Another process runs or starts this device: a distinct status, which `up` reads as a
        // start race it lost (the shared log file may have been truncated by then).
        Err(e @ daemon::DaemonError::Running(_)) => {
            eprintln!("softrdma: {e}");
            Ok(ExitCode::from(daemon::EXIT_ALREADY_RUNNING))
        }
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn up(name: &str, args: &DeviceArgs) -> Result<ExitCode> {
    args.config(name)?; // reject bad options here, not in the background
    let exe = std::env::current_exe().context("finding the softrdma executable")?;
    let info = daemon::up(&exe, name, &args.to_args())?;
    println!("{} up on {} (pid {})", info.name, info.addr, info.pid);
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn down(name: &str) -> Result<ExitCode> {
    // What the capture lost (frames lost are counted as they are lost, so the count before the
    // daemon stops is its last).
    let capture = Connection::connect(name).ok().and_then(|c| match c.call(&Request::Stats, &[]) {
        Ok((Response::Stats(_, io), _)) if io.capture_frames + io.capture_dropped > 0 => Some(io.capture_dropped),
        _ => None,
    });
    if daemon::down(name)? {
        match capture {
            Some(lost) => println!("{name} down (capture: {lost} frames lost)"),
            None => println!("{name} down"),
        }
    } else {
        println!("{name} was not running");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn list(json: bool) -> Result<ExitCode> {
    let dir = runtime::runtime_dir()?;
    for name in runtime::list_devices(&dir) {
        let Ok(c) = Connection::connect_in(&dir, &name) else { continue };
        let i = &c.info;
        if json {
            let v = serde_json::json!({
                "name": i.name, "addr": i.addr.to_string(), "active_mtu": i.active_mtu.bytes(),
                "iface_mtu": i.iface_mtu, "pid": i.pid, "node_guid": format!("{:016x}", i.node_guid),
                "gid": std::net::Ipv6Addr::from(i.gid).to_string(), "link_layer": "Ethernet", "state": "ACTIVE",
                "vendor_id": format!("{:#x}", i.vendor_id),
                "socket": runtime::socket_path(&dir, &name).display().to_string(),
            });
            writeln!(io::stdout().lock(), "{v}")?;
        } else {
            writeln!(io::stdout().lock(), "{}\t{}\tmtu {}\tpid {}", i.name, i.addr, i.active_mtu.bytes(), i.pid)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn stat(name: &str, json: bool) -> Result<ExitCode> {
    let c = Connection::connect(name)?;
    let Response::Stats(s, io) = c.call(&Request::Stats, &[])?.0 else { bail!("unexpected answer from {name}") };
    let Response::CmStats(cm, desk) = c.call(&Request::CmStats, &[])?.0 else { bail!("unexpected answer from {name}") };
    let rows: Vec<(&str, u64)> = vec![
        ("sent_pkts", s.sent_pkts),
        ("rcvd_pkts", s.rcvd_pkts),
        ("duplicate_request", s.duplicate_request),
        ("out_of_seq_request", s.out_of_seq_request),
        ("rcvd_rnr_err", s.rcvd_rnr_err),
        ("send_rnr_err", s.send_rnr_err),
        ("rcvd_seq_err", s.rcvd_seq_err),
        ("retry_exceeded_err", s.retry_exceeded_err),
        ("retry_rnr_exceeded_err", s.retry_rnr_exceeded_err),
        ("completer_retry_err", s.completer_retry_err),
        ("local_ack_timeout_err", s.local_ack_timeout_err),
        ("unsent_psn_responses", s.unsent_psn_responses),
        ("retransmitted_pkts", s.retransmitted_pkts),
        ("send_err", s.send_err),
        ("rdma_sends", s.rdma_sends),
        ("rdma_recvs", s.rdma_recvs),
        ("naks_sent_seq", s.naks_sent.psn_sequence),
        ("naks_sent_inv_req", s.naks_sent.invalid_request),
        ("naks_sent_rem_access", s.naks_sent.remote_access),
        ("naks_sent_rem_op", s.naks_sent.remote_operational),
        ("icrc_err", s.icrc_err),
        ("icrc_id_solved", s.icrc_id_solved),
        ("malformed", s.malformed),
        ("unknown_qp", s.unknown_qp),
        ("qkey_violations", s.qkey_violations),
        ("xrc_srq_err", s.xrc_srq_err),
        ("udp_sent", io.udp_sent),
        ("udp_rcvd", io.udp_rcvd),
        ("loopback_pkts", io.loopback),
        ("udp_send_errors", io.send_errors),
        ("dropped_by_fault", io.dropped_by_fault),
        ("duplicated_by_fault", io.duplicated_by_fault),
        ("reordered_by_fault", io.reordered_by_fault),
        ("corrupted_by_fault", io.corrupted_by_fault),
        ("memory_faults", io.memory_faults),
        ("memory_reads", io.memory_reads),
        ("memory_writes", io.memory_writes),
        ("memory_helper_ops", io.memory_helper_ops),
        ("clients", io.clients),
        ("providers", io.providers),
        ("daemon_udp_rcvd", io.daemon_udp_rcvd),
        // Datagrams the kernel gave to another process's socket of the port, passed on.
        ("relayed", io.relayed),
        ("relay_lost", io.relay_lost),
        // The capture (`--pcap`): frames written to its file, and frames it lost because it could
        // not keep up (lost from the file only, never from the wire; libpcap's ps_drop).
        ("capture_frames", io.capture_frames),
        ("capture_dropped", io.capture_dropped),
        // The connection manager (rdma_cm): MADs on QP1, and its IDs in the device.
        ("cm_mads_sent", cm.mads_sent),
        ("cm_mads_rcvd", cm.mads_rcvd),
        ("cm_mads_resent", cm.mads_resent),
        ("cm_mads_malformed", cm.mads_malformed),
        ("cm_mads_unmatched", cm.mads_unmatched),
        ("cm_reqs_dropped", cm.reqs_dropped),
        ("cm_rejs_sent", cm.rejs_sent),
        ("cm_mras_sent", cm.mras_sent),
        ("cm_established", cm.established),
        ("cm_ids", desk.ids),
        ("cm_pending", desk.pending),
        ("cm_channels", desk.channels),
        ("cm_events_dropped", desk.events_dropped),
        ("cm_calls_refused", desk.calls_refused),
        // The path record cache: route steps answered from it, looked up, and what dropped entries.
        ("path_cache_entries", desk.paths.entries),
        ("path_cache_hits", desk.paths.hits),
        ("path_cache_misses", desk.paths.misses),
        ("path_cache_expired", desk.paths.expired),
        ("path_cache_invalidated", desk.paths.invalidated),
        ("path_cache_unresolved", desk.paths.unresolved),
        ("path_lookups_failed", desk.paths.failed),
        ("paths_set_explicitly", desk.paths.explicit),
    ];
    let Response::McastGroups(groups) = c.call(&Request::McastGroups, &[])?.0 else {
        bail!("unexpected answer from {name}")
    };
    if json {
        let mut m: serde_json::Map<String, serde_json::Value> =
            rows.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        m.insert("mcast_groups".into(), serde_json::to_value(&groups)?);
        writeln!(io::stdout().lock(), "{}", serde_json::Value::Object(m))?;
    } else {
        for (k, v) in rows {
            writeln!(io::stdout().lock(), "{k:<24}{v}")?;
        }
        // rdma_cm multicast: each group, its members on this device, whether the device is a
        // member of the IP group (the kernel's IGMP membership), and the provider processes with
        // QPs attached that the daemon passes its datagrams on to.
        for g in &groups {
            let ip = if g.ip_member { "yes" } else { "no" };
            writeln!(
                io::stdout().lock(),
                "mcast_group             {} full {} send_only {} ip_member {ip} providers {}",
                g.group,
                g.full,
                g.send_only,
                g.providers
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `RDMA_PS_*` by name, as `rdma resource show cm_id` prints them.
fn port_space(ps: u16) -> String {
    match ps {
        softrdma_engine::cm::PS_TCP => "TCP".into(),
        softrdma_engine::cm::PS_UDP => "UDP".into(),
        softrdma_engine::cm::PS_IB => "IB".into(),
        softrdma_engine::cm::PS_IPOIB => "IPOIB".into(),
        p => format!("{p:#x}"),
    }
}

pub(crate) fn cm_ids(name: &str, json: bool) -> Result<ExitCode> {
    let c = Connection::connect(name)?;
    let Response::CmIds(ids) = c.call(&Request::CmList, &[])?.0 else { bail!("unexpected answer from {name}") };
    let addr = |a: Option<std::net::SocketAddr>| a.map_or_else(|| "-".to_owned(), |a| a.to_string());
    for (i, pid) in ids {
        // The state as ib_cm names it (LISTEN, REQ_SENT, ...), and a destroyed ID's leftover.
        let state = format!("{:?}", i.state);
        let mut state_name = String::new();
        for (k, ch) in state.chars().enumerate() {
            if ch.is_uppercase() && k > 0 {
                state_name.push('_');
            }
            state_name.push(ch.to_ascii_uppercase());
        }
        if json {
            let v = serde_json::json!({
                "id": i.id,
                "state": state_name,
                "ps": port_space(i.ps),
                "qp_type": format!("{:?}", i.qp_type),
                "qpn": i.qpn,
                "src": addr(i.local),
                "dst": addr(i.remote),
                "backlog": i.backlog,
                "pending": i.pending,
                "destroyed": i.orphan,
                "pid": pid,
            });
            writeln!(io::stdout().lock(), "{v}")?;
        } else {
            let mut line =
                format!("{name} cm-idn {} state {state_name} ps {} qp-type {:?}", i.id, port_space(i.ps), i.qp_type);
            if i.qpn != 0 {
                line += &format!(" lqpn {}", i.qpn);
            }
            line += &format!(" src-addr {} dst-addr {}", addr(i.local), addr(i.remote));
            if i.state == softrdma_engine::cm::IdState::Listen {
                line += &format!(" backlog {} pending {}", i.backlog, i.pending);
            }
            if i.orphan {
                line += " destroyed";
            }
            if pid >= 0 {
                line += &format!(" pid {pid}");
            }
            writeln!(io::stdout().lock(), "{line}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
