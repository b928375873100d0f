//! # softrdma
//!
//! The command-line front end of softrdma, a user-space RoCEv2 RDMA device.
//!
//! Today it offers the capture tools, built on the engine's wire module:
//! - `softrdma demo`: builds a short RoCE conversation with the project's own encoder, writes it
//!   as a pcap file, decodes it back and checks every ICRC;
//! - `softrdma pcap decode FILE [--json]`: one line (or one JSON object) per frame;
//! - `softrdma pcap check FILE`: a summary; non-zero exit when an IB packet is malformed or has a
//!   bad ICRC.
//!
//! - `softrdma sim ...`: an RC workload between two engine devices on the simulated lossy wire,
//!   checked against what was posted.
//!
//! The device commands of design.md (`daemon`, `up`, `down`, `exec`, `stat`, `capture`, `bench`)
//! are not built yet; clap rejects them as unknown subcommands.

mod demo;
mod pcap_cmd;
mod sim;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "softrdma", version, about = "A user-space RoCEv2 RDMA device: capture and wire tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a RoCE conversation with softrdma's encoder, write it as pcap, decode and check it.
    Demo {
        /// Where to write the capture (default: a file in the system temp dir).
        #[arg(long, short = 'w')]
        out: Option<PathBuf>,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
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
enum PcapCommand {
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { out, json } => demo::run(out, json),
        Command::Sim(args) => sim::run(&args),
        Command::Pcap { command } => match command {
            PcapCommand::Decode { file, json } => pcap_cmd::decode(&file, json),
            PcapCommand::Check { file } => pcap_cmd::check(&file),
            PcapCommand::Generate { file, seed, pcapng } => pcap_cmd::generate(&file, seed, pcapng),
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
