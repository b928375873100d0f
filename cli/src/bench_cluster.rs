//! The middleware rows of `softrdma bench`: between two `softrdma cluster` hosts (network
//! namespaces on one bridge, one softrdma device each), in one run:
//!
//! - UCX (ucx_perftest: tag_lat 8 B, tag_bw and ucp_put_bw 64 KiB) over softrdma's rc_verbs and
//!   ud_verbs against UCX over tcp, the same two hosts and the same bridge;
//! - an MPI ping-pong (8 B, checked data; the program of the cluster tests, carried in this
//!   binary) over Open MPI's pml ucx on softrdma against its ob1 pml with the tcp btl;
//! - the ratios softrdma/tcp of each.
//!
//! Needs root (the cluster does) and no cluster of the user's already up (the hosts' names are
//! fixed); otherwise the rows say why they were skipped. The cluster it makes is taken down on
//! return, on error too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::bench::{run, server_client, tail, Outcome, Table};
use crate::bench_parse::parse_ucx;

/// The MPI program of scripts/test-cluster.sh (ping-pong with checked data, Allreduce, Alltoall).
const MPI_CHECK_C: &str = include_str!("../../scripts/cluster/mpi_check.c");

/// The cluster this run made: `cluster down` when dropped.
struct Cluster<'a> {
    exe: &'a Path,
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        let _ = run(Command::new(self.exe).args(["cluster", "down"]), Duration::from_secs(60));
    }
}

/// The running cluster's hosts (address and network namespace of each) and its links' MTU.
fn hosts_up(exe: &Path) -> Result<(Vec<(String, String)>, u32)> {
    let (st, out) = run(Command::new(exe).args(["cluster", "status", "--json"]), Duration::from_secs(30))?;
    if st != Some(0) {
        bail!("softrdma cluster status: {}", tail(&out));
    }
    // stdout then stderr: the JSON is the first line.
    let json = out.lines().next().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(json).with_context(|| format!("cluster status --json: {json}"))?;
    let hosts = v["hosts"]
        .as_array()
        .map(|h| {
            h.iter().filter_map(|h| Some((h["addr"].as_str()?.to_owned(), h["netns"].as_str()?.to_owned()))).collect()
        })
        .unwrap_or_default();
    Ok((hosts, v["mtu"].as_u64().unwrap_or(1500) as u32))
}

/// Adds the cluster rows (or one row saying why there are none) to `t`.
pub(crate) fn rows(t: &mut Table, exe: &Path, quick: bool, port: &mut u16) {
    const GROUP: &str = "cluster (2 hosts)";
    if !crate::bench::nix_is_root() {
        t.row(GROUP, "UCX and MPI between cluster hosts", "skipped: needs root (network namespaces)");
        return;
    }
    match hosts_up(exe) {
        Ok((h, _)) if !h.is_empty() => {
            t.row(
                GROUP,
                "UCX and MPI between cluster hosts",
                "skipped: a cluster is already up (`softrdma cluster down`)",
            );
            return;
        }
        Err(e) => {
            t.row(GROUP, "UCX and MPI between cluster hosts", format!("failed: {e:#}"));
            return;
        }
        Ok(_) => {}
    }
    eprintln!("softrdma bench: UCX and MPI between two softrdma cluster hosts");
    if let Err(e) = measure(t, exe, quick, port) {
        t.row(GROUP, "UCX and MPI between cluster hosts", format!("failed: {e:#}"));
    }
}

fn measure(t: &mut Table, exe: &Path, quick: bool, port: &mut u16) -> Result<()> {
    const GROUP: &str = "cluster (2 hosts)";
    let (st, out) = run(Command::new(exe).args(["cluster", "up", "--hosts", "2"]), Duration::from_secs(120))?;
    let _cluster = Cluster { exe };
    if st != Some(0) {
        bail!("softrdma cluster up: {}", tail(&out));
    }
    let (hosts, mtu) = hosts_up(exe)?;
    let [(a1, ns1), (a2, ns2)] = hosts.as_slice() else { bail!("cluster up made {} hosts, not 2", hosts.len()) };
    let iters = |full: u32| if quick { (full / 10).max(100) } else { full };
    floor_rows(t, [(a1, ns1), (a2, ns2)], mtu, quick);

    // ucx_perftest, server in host 1, client in host 2.
    let mut ucx = |tls: &str, test: &str, size: u32, n: u32| -> Result<Vec<f64>> {
        *port += 1;
        let p = port.to_string();
        let (size_s, n_s) = (size.to_string(), n.to_string());
        let in_host = |h: &str| {
            let mut c = Command::new(exe);
            c.args(["cluster", "exec", h, "--", "env", &format!("UCX_TLS={tls}"), "ucx_perftest"]);
            c
        };
        let (client, _) = server_client(
            in_host("1").args(["-p", &p]),
            || {
                let mut c = in_host("2");
                c.args([a1.as_str(), "-p", &p, "-t", test, "-s", &size_s, "-n", &n_s, "-f"]);
                c
            },
            Duration::from_secs(120),
            Duration::from_secs(10),
            |c: &Outcome, took| c.0 != Some(0) && took < Duration::from_secs(3),
        )?;
        match (client.0, parse_ucx(&client.1)) {
            (Some(0), Some(v)) => Ok(v),
            _ => bail!("ucx_perftest UCX_TLS={tls} -t {test} -s {size}: status {:?}: {}", client.0, tail(&client.1)),
        }
    };
    let gbit = |mib_s: f64| mib_s * 1048576.0 * 8.0 / 1e9;
    for (tls, name) in [("rc_v,self", "softrdma rc_verbs"), ("ud_v,self", "softrdma ud_verbs"), ("tcp", "tcp")] {
        let what = |test: &str| format!("UCX {name} (UCX_TLS={tls}): {test}");
        match ucx(tls, "tag_lat", 8, iters(20_000)) {
            Ok(u) => {
                t.v.insert(format!("cluster_ucx_{tls}_lat_us"), u[1]);
                t.row(GROUP, what("tag_lat 8 B"), format!("one-way p50 {:.2} us", u[1]));
            }
            Err(e) => t.row(GROUP, what("tag_lat 8 B"), format!("failed: {e:#}")),
        }
        for test in ["tag_bw", "ucp_put_bw"] {
            match ucx(tls, test, 65536, iters(5000)) {
                Ok(u) => {
                    t.v.insert(format!("cluster_ucx_{tls}_{test}_gbps"), gbit(u[4]));
                    t.row(GROUP, what(&format!("{test} 64 KiB")), format!("{:.2} Gbit/s", gbit(u[4])));
                }
                Err(e) => t.row(GROUP, what(&format!("{test} 64 KiB")), format!("failed: {e:#}")),
            }
        }
    }
    ratio(t, "UCX tag_lat 8 B: softrdma rc_verbs / tcp", "cluster_ucx_rc_v,self_lat_us", "cluster_ucx_tcp_lat_us");
    ratio(
        t,
        "UCX tag_bw 64 KiB: softrdma rc_verbs / tcp",
        "cluster_ucx_rc_v,self_tag_bw_gbps",
        "cluster_ucx_tcp_tag_bw_gbps",
    );

    ratio(
        t,
        "UCX tag_lat 8 B: tcp / the UDP one-way between the hosts",
        "cluster_ucx_tcp_lat_us",
        "cluster_udp_single_us",
    );
    ratio(
        t,
        "UCX tag_lat 8 B: softrdma rc_verbs / the UDP one-way of a message and its ACK",
        "cluster_ucx_rc_v,self_lat_us",
        "cluster_udp_pair_us",
    );
    ratio(
        t,
        "UCX tag_bw 64 KiB: tcp / the best floor of its eager stream over RC",
        "cluster_ucx_tcp_tag_bw_gbps",
        "cluster_udp_eager_best_gbps",
    );
    ratio(
        t,
        "UCX tag_bw 64 KiB: softrdma rc_verbs / the floor of its eager stream over RC",
        "cluster_ucx_rc_v,self_tag_bw_gbps",
        "cluster_udp_eager_gbps",
    );

    // MPI ping-pong between the two hosts.
    let mpi_what = |pml: &str| format!("MPI ping-pong 8 B, Open MPI {pml}");
    if !crate::bench::which("mpicc") || !crate::bench::which("mpirun") {
        t.row(GROUP, mpi_what("(both)"), "skipped: Open MPI is not installed (openmpi-bin, libopenmpi-dev)");
        return Ok(());
    }
    let dir = tempfile::tempdir().context("a directory for the MPI program")?;
    let prog = build_mpi(dir.path())?;
    let hostfile = dir.path().join("hosts");
    std::fs::write(&hostfile, hosts.iter().map(|(h, _)| format!("{h} slots=1\n")).collect::<String>())?;
    let rsh = format!("{} cluster rsh", exe.display());
    // (round trip in us) of `bytes`-byte ping-pongs; `stamped` for bandwidth (mpi_check.c).
    let mpi = |args: &[&str], bytes: usize, n: u32, stamped: bool| -> Result<f64> {
        let mut c = Command::new(exe);
        c.args(["cluster", "exec", "1", "--", "mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent", &rsh])
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["-np", "2"])
            .args(args)
            .arg(&prog)
            .args([bytes.to_string(), n.to_string()]);
        if stamped {
            c.arg("stamped");
        }
        let (st, out) = run(&mut c, Duration::from_secs(300))?;
        let rtt = out
            .lines()
            .find_map(|l| l.strip_prefix("pingpong rank 1: ").and_then(|r| r.rsplit_once("rtt ")))
            .and_then(|(_, us)| us.trim_end_matches(" us").trim().parse::<f64>().ok());
        match (st, rtt) {
            (Some(0), Some(v)) if out.contains("mpi_check: OK") => Ok(v),
            _ => bail!("mpirun {}: status {st:?}: {}", args.join(" "), tail(&out)),
        }
    };
    const MIB: usize = 1 << 20;
    for (key, pml, args) in [
        (
            "cluster_mpi_ucx",
            "pml ucx over softrdma rc_verbs",
            &["--mca", "pml", "ucx", "-x", "UCX_TLS=rc_v,self", "-x", "OMPI_MCA_pml_ucx_devices=any"][..],
        ),
        (
            "cluster_mpi_tcp",
            "pml ob1, btl tcp",
            &["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0"][..],
        ),
    ] {
        match mpi(args, 8, iters(5000), false) {
            Ok(v) => {
                t.v.insert(format!("{key}_rtt_us"), v);
                t.row(GROUP, mpi_what(pml), format!("round trip {v:.2} us"));
            }
            Err(e) => t.row(GROUP, mpi_what(pml), format!("failed: {e:#}")),
        }
        // Bandwidth: a 1 MiB message each way per round trip.
        let what = format!("MPI ping-pong 1 MiB (stamped: every message's iteration checked), Open MPI {pml}");
        match mpi(args, MIB, iters(500), true) {
            Ok(v) => {
                let gbps = 2.0 * MIB as f64 * 8.0 / (v * 1e3);
                t.v.insert(format!("{key}_bw_gbps"), gbps);
                t.row(GROUP, what, format!("{gbps:.2} Gbit/s (round trip {v:.0} us)"));
            }
            Err(e) => t.row(GROUP, what, format!("failed: {e:#}")),
        }
    }
    ratio(t, "MPI ping-pong 8 B: pml ucx on softrdma / ob1 tcp", "cluster_mpi_ucx_rtt_us", "cluster_mpi_tcp_rtt_us");
    ratio(
        t,
        "MPI ping-pong 8 B: pml ucx on softrdma round trip / UCX rc_verbs tag_lat one-way",
        "cluster_mpi_ucx_rtt_us",
        "cluster_ucx_rc_v,self_lat_us",
    );
    ratio(
        t,
        "MPI ping-pong 1 MiB bandwidth: pml ucx on softrdma / ob1 tcp",
        "cluster_mpi_ucx_bw_gbps",
        "cluster_mpi_tcp_bw_gbps",
    );
    Ok(())
}

/// The physical limits between the two hosts, through the same veths and bridge the middleware
/// uses (sockets made in the hosts' namespaces, measured from this process): UDP's busy-poll
/// ping-pong of one 20-byte datagram a one-way (what a TCP one-way moves) and of a message and
/// its ACK in one GSO send (what an RC one-way moves), and the floor of the stream UCX's
/// tag_bw 64 KiB sends over rc_verbs (8 SENDs of 8,256 bytes a message, every packet with its
/// ICRC, every SEND acknowledged: [`crate::bench_floor::eager_stream`]).
fn floor_rows(t: &mut Table, hosts: [(&String, &String); 2], link_mtu: u32, quick: bool) {
    const GROUP: &str = "cluster (2 hosts)";
    let sockets = || -> Result<_> {
        let [(a1, n1), (a2, n2)] = hosts;
        let ip = |a: &str| a.parse::<std::net::Ipv4Addr>().with_context(|| format!("host address {a}"));
        Ok((crate::bench_floor::socket_in(Some(n1), ip(a1)?)?, crate::bench_floor::socket_in(Some(n2), ip(a2)?)?))
    };
    let iters = if quick { 5000 } else { 50_000 };
    let pp = |segments| -> Result<f64> {
        let (a, b) = sockets()?;
        crate::bench_floor::ping_pong_between(a, b, segments, iters)
    };
    match (pp(1), pp(2)) {
        (Ok(single), Ok(pair)) => {
            t.v.insert("cluster_udp_single_us".into(), single);
            t.v.insert("cluster_udp_pair_us".into(), pair);
            t.row(
                GROUP,
                "limit: UDP busy-poll ping-pong between the hosts, 20 B (a message and its ACK: 2 x 20 B in one GSO send)",
                format!("one-way p50 {single:.2} us ({pair:.2} us)"),
            );
        }
        (a, b) => {
            let e = a.err().or(b.err()).map(|e| format!("{e:#}")).unwrap_or_default();
            t.row(GROUP, "limit: UDP busy-poll ping-pong between the hosts", format!("failed: {e}"));
        }
    }
    // The stream as UCX's rc_verbs sends it (one ACK a SEND, one send call a SEND), and the best a
    // sender of the same packets could do (an ACK per 8 SENDs, 8 SENDs a sendmmsg): the second is
    // the floor any transport moving these packets meets, so tcp is compared with it.
    let secs = if quick { 0.5 } else { 2.0 };
    // The path MTU a device on these links runs at (what UCX's SENDs are cut into).
    let mtu = softrdma_transport::udp::active_mtu(link_mtu).bytes();
    for (key, ack_every, batch, what) in [
        (
            "cluster_udp_eager_gbps",
            1,
            1,
            "limit: UDP between the hosts, UCX's eager 64 KiB over RC (8 SENDs of 8256 B, each cut at the path MTU into one GSO send, ICRCs computed and checked, each SEND acknowledged)",
        ),
        (
            "cluster_udp_eager_best_gbps",
            8,
            8,
            "limit: the same packets sent best (an ACK per 8 SENDs, 8 SENDs a sendmmsg)",
        ),
    ] {
        match sockets().and_then(|(tx, rx)| crate::bench_floor::eager_stream(tx, rx, mtu, secs, ack_every, batch)) {
            Ok(gbs) => {
                t.v.insert(key.into(), gbs * 8.0);
                t.row(GROUP, what, format!("{:.2} Gbit/s (path MTU {mtu})", gbs * 8.0));
            }
            Err(e) => t.row(GROUP, what, format!("failed: {e:#}")),
        }
    }
}

/// `mpicc` of the MPI program into `dir`.
fn build_mpi(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("mpi_check.c");
    let prog = dir.join("mpi_check");
    std::fs::write(&src, MPI_CHECK_C)?;
    let (st, out) = run(Command::new("mpicc").args(["-O1", "-o"]).arg(&prog).arg(&src), Duration::from_secs(120))?;
    if st != Some(0) {
        bail!("mpicc: {}", tail(&out));
    }
    Ok(prog)
}

/// A ratio row of two measured values (no target: these are comparisons, not goals).
fn ratio(t: &mut Table, what: &str, num: &str, den: &str) {
    const GROUP: &str = "cluster (2 hosts)";
    match (t.get(num), t.get(den)) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() && d.is_finite() => {
            t.row(GROUP, format!("ratio {what}"), format!("{:.2}", n / d));
        }
        _ => t.row(GROUP, format!("ratio {what}"), "not measured (a run above failed)"),
    }
}
