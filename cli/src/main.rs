//! # softrdma
//!
//! The command-line front end of softrdma, a user-space RoCEv2 RDMA device.
//!
//! - `softrdma demo`: two devices (daemons) on 127.0.0.1 and 127.0.0.2, RC/UD/XRC traffic between
//!   them over RoCEv2/UDP with light loss, every byte checked, a table and the captures;
//! - `softrdma daemon --name NAME --addr A`, `up NAME --addr A`, `down NAME`, `list`, `stat NAME`,
//!   `cm-ids NAME`: devices as processes (docs/architecture.md D2);
//! - `softrdma pcap sample`: a RoCE conversation built with the project's own encoder, written,
//!   decoded back and checked, with no device;
//! - `softrdma pcap decode FILE [--json]`: one line (or one JSON object) per frame;
//! - `softrdma pcap check FILE`: a summary; non-zero exit when an IB packet is malformed or has a
//!   bad ICRC.
//!
//! - `softrdma sim ...`: an RC workload between two engine devices on the simulated lossy wire,
//!   checked against what was posted.
//!
//! - `softrdma exec -- PROG ARGS...`: an unchanged verbs program on softrdma, through the shim.
//!
//! - `softrdma bench [--quick]`: perftest through the shim against the physical limits
//!   (udpbench) and the peers (UCX tcp, libfabric tcp), one table, written to BENCHMARKS.md.
//!
//! Not built: a `capture` subcommand (a device captures with `softrdma up --pcap`); clap
//! rejects it as an unknown subcommand.

mod bench;
mod bench_capture;
mod bench_cluster;
mod bench_floor;
mod bench_parse;
mod bench_progress;
mod bench_ratio;
mod bench_runner;
mod bench_scale;
mod cluster;
mod conform;
mod demo;
mod device_cmd;
mod doctor;
mod exec_cmd;
mod help;
mod pcap_cm;
mod pcap_cmd;
mod present;
mod replay_live;
mod sample;
mod shim;
mod sim;
mod soak;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "softrdma",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SOFTRDMA_COMMIT"), ", shim ", env!("SOFTRDMA_SHIM_ID"), ")"),
    about = "A user-space RoCEv2 RDMA device"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start two devices on 127.0.0.1 and 127.0.0.2, run RC, UD and XRC traffic between them with
    /// light loss, check every byte, print a table and the captures' paths.
    Demo(demo::DemoArgs),
    /// One receiving process of the demo's XRC fan-in (used by `demo`).
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    /// Reliability under load: two devices with faults, pairs of client processes running every
    /// opcode on RC, XRC and UD, one killed (SIGKILL) every few seconds and replaced; checks
    /// exactly-once delivery, that every work request completes once with the right status, the
    /// daemons' descriptors and memory. Exit 1 on any violation.
    Soak(soak::SoakArgs),
    /// One client process of the soak (used by `soak`).
    #[command(hide = true)]
    SoakWorker(soak::WorkerArgs),
    /// Run a device in the foreground until SIGTERM/SIGINT.
    Daemon {
        /// Device name.
        #[arg(long, default_value = "srdma0")]
        name: String,
        #[command(flatten)]
        args: device_cmd::DeviceArgs,
    },
    /// Run an unchanged verbs program on softrdma: the verbs shim first on LD_LIBRARY_PATH, the
    /// default device (srdma0 on 127.0.0.1) started unless a device runs, and the devices
    /// presented as the kernel would (/dev/infiniband, /sys/class/infiniband) in a private mount
    /// namespace.
    Exec {
        /// Do not present the devices in /dev and /sys (no namespaces).
        #[arg(long)]
        no_present: bool,
        /// The program and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        program: Vec<String>,
    },
    /// Check what softrdma needs of this machine (runtime dir, UDP port, multicast, namespaces,
    /// ptrace scope, memlock, GSO/GRO) and say how to fix each problem; exit 1 on a failed check.
    Doctor(doctor::DoctorArgs),
    /// Print the directory of the verbs shim `exec` uses (libibverbs.so.1, librdmacm.so.1, ...),
    /// unpacking the copy this binary carries on first use; for LD_LIBRARY_PATH set by hand.
    ShimPath,
    /// A simulated cluster on this machine: N network-namespace hosts on one bridge, a
    /// softrdma device on each (needs root).
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Start a device in the background (unless it runs) and wait until it answers.
    Up {
        /// Device name.
        name: String,
        #[command(flatten)]
        args: device_cmd::DeviceArgs,
    },
    /// Stop a device.
    Down {
        /// Device name.
        name: String,
    },
    /// List the running devices.
    List {
        /// One JSON object per device.
        #[arg(long)]
        json: bool,
    },
    /// Print a device's counters (rxe's names plus the device layer's).
    Stat {
        /// Device name.
        #[arg(default_value = "srdma0")]
        name: String,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List a device's rdma_cm IDs: state, port space, QP type and number, addresses, owner (what
    /// iproute2's `rdma resource show cm_id` shows for a kernel device).
    CmIds {
        /// Device name.
        #[arg(default_value = "srdma0")]
        name: String,
        /// One JSON object per ID.
        #[arg(long)]
        json: bool,
    },
    /// Measure softrdma with unchanged perftest against the physical limits (udpbench) and the
    /// peers (UCX over tcp, libfabric tcp) in one run; print one table and write it to
    /// BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Black-box IBTA conformance cases against a RoCE device through softrdma-conform-agent
    Conform(conform::ConformArgs),
    /// Run a workload between two engine devices on the simulated lossy wire; print one JSON
    /// object; exit 1 when an invariant broke (something lost, duplicated, reordered, corrupted).
    Sim(sim::SimArgs),
    /// Read capture files (pcap or pcapng).
    Pcap {
        #[command(subcommand)]
        command: PcapCommand,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Create the hosts (network namespaces on one bridge) and start a device on each.
    Up(cluster::UpArgs),
    /// Remove the hosts, their devices and every process left in them (exit 0 when none is up).
    Down,
    /// List the hosts: index, namespace, address, device.
    Status {
        /// One JSON object: {"hosts": [{"index", "netns", "addr", "device", ...}]}.
        #[arg(long)]
        json: bool,
    },
    /// Run a program on a host (index, name or address) with its device presented.
    Exec {
        /// The host: 2, h2, srdc-h2 or its address.
        host: String,
        /// The program and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        program: Vec<String>,
    },
    /// An rsh/ssh stand-in for launchers: joins the words into one command line and runs it
    /// with `sh -c` on the host, as `cluster exec` runs programs.
    Rsh {
        /// The host: 2, h2, srdc-h2 or its address.
        host: String,
        /// The command line's words.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
enum PcapCommand {
    /// Build a RoCE conversation with softrdma's encoder (no device), write it as pcap, decode
    /// and check it.
    Sample {
        /// Where to write the capture (default: a file in the system temp dir).
        #[arg(long, short = 'w')]
        out: Option<PathBuf>,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print one line per frame: addresses, opcode, headers, ICRC.
    Decode {
        /// The capture file.
        file: PathBuf,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Summarise a capture; exit 1 when an IB packet is malformed or has a bad ICRC.
    Check {
        /// The capture file.
        file: PathBuf,
    },
    /// Characterise the transport behaviour of the RoCE traffic, per file and transport: opcodes
    /// and message shapes, AckReq placement, ACK coalescing, AETH, UDP ports, IP header fields,
    /// timers and retransmissions, ICRC.
    Behaviour {
        /// The capture files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// One JSON object per file instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Replay each RC, UC, UD and XRC conversation (and the CM messages) of a capture against a softrdma engine device in virtual
    /// time, and compare softrdma's answers (as responder) or packets (as requester) with the
    /// recorded ones. Prints a line per conversation, each mismatch, and `replay: M of N answers
    /// match (K conversations)`. Exit 0 when it ran (mismatches are findings), 1 with --strict
    /// and a mismatch, 2 when the file cannot be read.
    Replay {
        /// The capture file.
        file: PathBuf,
        /// The side softrdma plays.
        #[arg(long = "as", value_enum, default_value = "both")]
        side: pcap_cmd::ReplaySide,
        /// softrdma's behaviour profile (`rxe` or `cx`; see INTEROP.md).
        #[arg(long, default_value = "rxe", value_parser = clap::builder::PossibleValuesParser::new(softrdma_engine::device::WireProfile::NAMES))]
        profile: String,
        /// Receive WQEs the replayed responder keeps posted for SENDs (default: inferred from the
        /// recorded ACK credits, RNR NAKs, else 32).
        #[arg(long)]
        recv_depth: Option<usize>,
        /// The ACK credit policy, overriding the profile's: `count` (the receive WQEs left, IBTA
        /// Table 44) or `invalid` (0x1F).
        #[arg(long, value_parser = ["count", "invalid"])]
        credits: Option<String>,
        /// Exit 1 when any answer differs.
        #[arg(long)]
        strict: bool,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Live replay: a running device plays each responder over the real wire (requests sent
        /// from --from on the device's port, rewritten to the device's QPN, keys and addresses,
        /// ICRC recomputed); its answers are compared as in virtual time. Responder side only.
        #[arg(long, value_name = "DEVICE")]
        to: Option<String>,
        /// The address the live replayer sends from (the device answers there); not the device's.
        #[arg(long, default_value = "127.0.0.254")]
        from: std::net::IpAddr,
        /// The device's UDP port (the live replayer binds the same port on --from).
        #[arg(long, default_value_t = 4791)]
        port: u16,
    },
    /// Write a synthetic capture holding one packet of every opcode (seeded).
    Generate {
        /// The file to write.
        file: PathBuf,
        /// Seed of the generated field values.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write pcapng instead of classic pcap.
        #[arg(long)]
        pcapng: bool,
    },
}

fn main() -> ExitCode {
    // Diagnostics on stderr, filtered by SOFTRDMA_LOG (e.g. `warn`, `softrdma_device=trace`).
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOFTRDMA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
    let cli = match Cli::from_arg_matches(&help::grouped(Cli::command()).get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Demo(a) => demo::run(&a),
        Command::DemoWorker(a) => demo::worker(&a),
        Command::Soak(a) => soak::run(&a),
        Command::SoakWorker(a) => soak::worker(&a),
        Command::Daemon { name, args } => device_cmd::daemon(&name, &args),
        Command::Up { name, args } => device_cmd::up(&name, &args),
        Command::Exec { no_present, program } => exec_cmd::run(&program, !no_present),
        Command::Cluster { cmd } => match cmd {
            ClusterCmd::Up(a) => cluster::up(&a),
            ClusterCmd::Down => cluster::down(),
            ClusterCmd::Status { json } => cluster::status(json),
            ClusterCmd::Exec { host, program } => cluster::exec(&host, &program),
            ClusterCmd::Rsh { host, command } => cluster::rsh(&host, &command),
        },
        Command::Doctor(a) => doctor::run(&a),
        Command::ShimPath => shim::dir().map(|d| {
            println!("{}", d.display());
            ExitCode::SUCCESS
        }),
        Command::Down { name } => device_cmd::down(&name),
        Command::List { json } => device_cmd::list(json),
        Command::Stat { name, json } => device_cmd::stat(&name, json),
        Command::CmIds { name, json } => device_cmd::cm_ids(&name, json),
        Command::Sim(args) => sim::run(&args),
        Command::Bench(args) => bench::run_bench(&args),
        Command::Conform(args) => Ok(conform::run(&args)),
        Command::Pcap { command } => match command {
            PcapCommand::Sample { out, json } => sample::run(out, json),
            PcapCommand::Decode { file, json } => pcap_cmd::decode(&file, json),
            PcapCommand::Check { file } => pcap_cmd::check(&file),
            PcapCommand::Behaviour { files, json } => pcap_cmd::behaviour(&files, json),
            PcapCommand::Generate { file, seed, pcapng } => pcap_cmd::generate(&file, seed, pcapng),
            PcapCommand::Replay { file, side, profile, recv_depth, credits, strict, json, to, from, port } => {
                let live = to.map(|dev| (dev, replay_live::Local { addr: from, port }));
                pcap_cmd::replay(&file, side, &profile, credits.as_deref(), recv_depth, strict, json, live)
            }
        },
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // A closed pipe (`| head`) is not an error worth a message.
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("softrdma: {e:#}");
            ExitCode::from(2)
        }
    }
}
