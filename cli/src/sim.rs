//! `softrdma sim`: an RC workload on the simulated wire, as one JSON object.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use softrdma_engine::time::Duration;
use softrdma_engine::verbs::Mtu;
use softrdma_transport::faults::Faults;
use softrdma_transport::sim::LinkConfig;
use softrdma_workloads::services::{self, Service};
use softrdma_workloads::workload::{self, Op, Workload};

#[derive(Args)]
pub(crate) struct SimArgs {
    /// Transport service: rc, uc, ud or xrc.
    #[arg(long, default_value = "rc")]
    transport: String,
    /// Operations to mix: send, write, read, atomic (comma-separated; default: all four on rc and
    /// xrc, send and write on uc, send on ud).
    #[arg(long, value_delimiter = ',')]
    ops: Option<Vec<String>>,
    /// XRC: initiator QPs on the sending node (one target QP each on the receiving node).
    #[arg(long, default_value_t = 4)]
    initiators: u32,
    /// XRC: SRQs of the receiving node's domain that the initiators send to.
    #[arg(long, default_value_t = 4)]
    srqs: u32,
    /// Messages in all.
    #[arg(long, default_value_t = 1000)]
    messages: u32,
    /// Message size range MIN..MAX in bytes, or one size N (atomics are 8). Default 1..4096 on
    /// rc, 0..4096 on xrc and uc, 0..MTU on ud.
    #[arg(long)]
    size: Option<String>,
    /// Connected QP pairs.
    #[arg(long, default_value_t = 4)]
    qps: u32,
    /// Probability that the wire loses a packet.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability that the wire duplicates a packet.
    #[arg(long, visible_alias = "dup", default_value_t = 0.0)]
    duplicate: f64,
    /// Probability that the wire holds a packet back (reordering it).
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Probability that the wire flips one bit of a packet.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// Seed of the workload, the devices and the wire.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Transport retries (0-7).
    #[arg(long, default_value_t = 7)]
    retry_cnt: u8,
    /// Local ACK timeout code (4.096 us x 2^code).
    #[arg(long, default_value_t = 12)]
    timeout: u8,
}

fn probability(name: &str, p: f64) -> Result<f64> {
    if !(0.0..=1.0).contains(&p) {
        bail!("--{name} must be a probability between 0 and 1, not {p}");
    }
    Ok(p)
}

pub(crate) fn run(a: &SimArgs) -> Result<ExitCode> {
    let service = match a.transport.as_str() {
        "rc" => None,
        "uc" => Some(Service::Uc),
        "ud" => Some(Service::Ud),
        "xrc" => Some(Service::Xrc { initiators: a.initiators, srqs: a.srqs }),
        t => bail!("--transport {t}: use rc, uc, ud or xrc"),
    };
    let default_ops = match service {
        None | Some(Service::Xrc { .. }) => "send,write,read,atomic",
        Some(Service::Uc) => "send,write",
        Some(Service::Ud) => "send",
    };
    let ops_text: Vec<String> = a.ops.clone().unwrap_or_else(|| default_ops.split(',').map(String::from).collect());
    let ops = ops_text
        .iter()
        .map(|o| Op::parse(o.trim()).with_context(|| format!("unknown op {o:?}: use send, write, read, atomic")))
        .collect::<Result<Vec<_>>>()?;
    let default_size = match service {
        None => "1..4096".to_string(),
        Some(Service::Ud) => format!("0..{}", a.mtu),
        Some(_) => "0..4096".to_string(),
    };
    let size_text = a.size.clone().unwrap_or(default_size);
    let (min, max) = size_text.split_once("..").unwrap_or((&size_text, &size_text));
    let size = (min.parse::<u32>().context("--size MIN")?, max.parse::<u32>().context("--size MAX")?);
    let mtu = match a.mtu {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        m => bail!("--mtu {m}: use 256, 512, 1024, 2048 or 4096"),
    };
    if a.retry_cnt > 7 || a.timeout > 31 || a.timeout == 0 {
        bail!("--retry-cnt is 0..7 and --timeout 1..31");
    }
    let faults = Faults {
        loss: probability("loss", a.loss)?,
        duplicate: probability("duplicate", a.duplicate)?,
        reorder: probability("reorder", a.reorder)?,
        reorder_delay: Duration::from_micros(20),
        corrupt: probability("corrupt", a.corrupt)?,
        ..Faults::none()
    };
    let w = Workload {
        ops,
        messages: a.messages,
        size,
        qps: a.qps,
        mtu,
        seed: a.seed,
        faults,
        link: LinkConfig {
            latency: Duration::from_micros(5),
            jitter: Duration::ZERO,
            bandwidth_bits_per_sec: 25_000_000_000,
        },
        retry_cnt: a.retry_cnt,
        timeout: a.timeout,
    };
    let r = match service {
        None => workload::run(&w)?,
        Some(s) => services::run_service(&w, s)?,
    };
    let out = json!({
        "posted": r.posted,
        "completed_ok": r.completed_ok,
        "completed_err": r.completed_err,
        "bytes_verified": r.bytes_verified,
        "lost": r.lost,
        "duplicated": r.duplicated,
        "out_of_order": r.out_of_order,
        "corrupted_delivered": r.corrupted_delivered,
        "retransmitted_packets": r.retransmitted_packets,
        "naks_sent": r.naks_sent,
        "retries": r.retries,
        "seq_naks_received": r.seq_naks_received,
        "ack_timeouts": r.ack_timeouts,
        // Packets sent again per packet the wire lost (either direction; as the demo and the
        // soak count them: retransmitted / injected drops).
        "retransmitted_per_drop": if r.wire.lost == 0 { 0.0 } else { r.retransmitted_packets as f64 / r.wire.lost as f64 },
        // Payload bytes checked at their destination per virtual second.
        "goodput_gbit_s": if r.virtual_time_ns == 0 { 0.0 } else { r.bytes_verified as f64 * 8.0 / r.virtual_time_ns as f64 },
        "virtual_time_ns": r.virtual_time_ns,
        "wire": {
            "sent": r.wire.sent,
            "delivered": r.wire.delivered,
            "lost": r.wire.lost,
            "duplicated": r.wire.duplicated,
            "reordered": r.wire.reordered,
            "corrupted": r.wire.corrupted,
        },
        "icrc_dropped": r.icrc_dropped,
        "violations": r.violations,
    });
    println!("{out}");
    Ok(if r.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
