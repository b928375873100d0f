//! `softrdma pcap decode|check|generate|behaviour`.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use softrdma_engine::wire::{Opcode, Syndrome};
use softrdma_pcap::analyze::{self, CheckReport, FrameSummary, IbFrame};
use softrdma_pcap::replay;
use softrdma_pcap::{samples, PcapWriter, PcapngOptions, PcapngWriter, Reader, Record, Resolution};

use crate::pcap_cm::{cm_json, cm_text};

/// Reads every record of a capture and analyses it; `f` sees each summary. Returns the read
/// error that ended the file early, if any.
pub(crate) fn for_each_frame(path: &Path, mut f: impl FnMut(&FrameSummary) -> Result<()>) -> Result<Option<String>> {
    for_each_record(path, |_, s| f(s))
}

/// [`for_each_frame`], with the record (timestamp, link type, bytes) beside each summary.
pub(crate) fn for_each_record(
    path: &Path,
    mut f: impl FnMut(&Record, &FrameSummary) -> Result<()>,
) -> Result<Option<String>> {
    let reader = Reader::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    for rec in reader {
        match rec {
            Ok(r) => {
                let s = analyze::summarize(r.index, r.linktype, &r.data, r.is_truncated());
                f(&r, &s)?;
            }
            Err(e) => return Ok(Some(e.to_string())),
        }
    }
    Ok(None)
}

fn hex4(b: [u8; 4]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The JSON object of one frame, in the field order of the specification.
pub(crate) fn frame_json(s: &FrameSummary) -> Value {
    let Some(ib) = &s.ib else {
        return json!({"frame": s.frame, "ib": false});
    };
    let mut m = Map::new();
    m.insert("frame".into(), json!(s.frame));
    m.insert("ib".into(), json!(true));
    m.insert("l3".into(), json!(ib.l3.name()));
    m.insert("src".into(), json!(ib.src.to_string()));
    m.insert("dst".into(), json!(ib.dst.to_string()));
    m.insert("sport".into(), json!(ib.sport));
    m.insert("dport".into(), json!(ib.dport));
    let h = &ib.headers;
    if let Some(b) = h.bth {
        m.insert("opcode".into(), json!(b.opcode.0));
        m.insert("opcode_name".into(), json!(b.opcode.to_string()));
        m.insert("se".into(), json!(b.solicited));
        m.insert("m".into(), json!(b.mig_req));
        m.insert("padcnt".into(), json!(b.pad_count));
        m.insert("tver".into(), json!(b.tver));
        m.insert("pkey".into(), json!(b.pkey));
        m.insert("fecn".into(), json!(b.fecn));
        m.insert("becn".into(), json!(b.becn));
        m.insert("destqp".into(), json!(b.dest_qp.value()));
        m.insert("ackreq".into(), json!(b.ack_req));
        m.insert("psn".into(), json!(b.psn.value()));
    } else {
        // No BTH in the bytes: the fields are there, without values.
        for k in
            ["opcode", "opcode_name", "se", "m", "padcnt", "tver", "pkey", "fecn", "becn", "destqp", "ackreq", "psn"]
        {
            m.insert(k.into(), Value::Null);
        }
    }
    if let Some(x) = h.rdeth {
        m.insert("rdeth".into(), json!({"eecnxt": x.ee_context}));
    }
    if let Some(x) = h.reth {
        m.insert("reth".into(), json!({"va": x.va, "rkey": x.rkey, "dmalen": x.dma_len}));
    }
    if let Some(x) = h.aeth {
        m.insert("aeth".into(), json!({"syndrome": x.syndrome.to_byte(), "msn": x.msn.value()}));
    }
    if let Some(x) = h.deth {
        m.insert("deth".into(), json!({"qkey": x.qkey, "srcqp": x.src_qp.value()}));
    }
    if let Some(x) = h.xrceth {
        m.insert("xrceth".into(), json!({"srqn": x.xrc_srqn}));
    }
    if let Some(x) = h.atomiceth {
        m.insert("atomiceth".into(), json!({"va": x.va, "rkey": x.rkey, "swap_add": x.swap_add, "compare": x.compare}));
    }
    if let Some(x) = h.atomicacketh {
        m.insert("atomicacketh".into(), json!({"orig": x.orig_rem_data}));
    }
    if let Some(x) = h.immdt {
        m.insert("immdt".into(), json!(x.imm));
    }
    if let Some(x) = h.ieth {
        m.insert("ieth".into(), json!(x.rkey));
    }
    if let Some(cm) = &ib.cm {
        m.insert("cm".into(), cm_json(cm));
    }
    m.insert("payload_len".into(), json!(ib.payload_len));
    m.insert("icrc".into(), json!(ib.icrc.map(hex4)));
    m.insert("icrc_ok".into(), json!(ib.icrc_ok));
    m.insert("truncated".into(), json!(s.truncated));
    m.insert("error".into(), json!(ib.error));
    Value::Object(m)
}

fn syndrome_text(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { credits: 31 } => "ACK".to_string(),
        Syndrome::Ack { credits } => format!("ACK credits={credits}"),
        Syndrome::RnrNak { timer } => format!("RNR-NAK timer={timer}"),
        Syndrome::Nak(code) => format!("NAK {code:?}"),
        Syndrome::Reserved(b) => format!("reserved({b:#04x})"),
    }
}

fn endpoint(ib: &IbFrame, src: bool) -> String {
    let (addr, port) = if src { (ib.src, ib.sport) } else { (ib.dst, ib.dport) };
    match (addr, port) {
        (std::net::IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
        (a, Some(p)) => format!("{a}:{p}"),
        (a, None) => a.to_string(),
    }
}

/// The text line of one frame.
pub(crate) fn frame_text(s: &FrameSummary) -> String {
    let Some(ib) = &s.ib else {
        return format!("{:>5} not IB{}", s.frame, if s.truncated { " (truncated)" } else { "" });
    };
    let mut l = format!("{:>5} {} {} > {}", s.frame, ib.l3.name(), endpoint(ib, true), endpoint(ib, false));
    let h = &ib.headers;
    if let Some(b) = h.bth {
        let _ = write!(l, " {} qp={:#08x} psn={}", b.opcode, b.dest_qp.value(), b.psn.value());
        for (on, flag) in [(b.ack_req, "A"), (b.solicited, "SE"), (b.mig_req, "M"), (b.fecn, "FECN"), (b.becn, "BECN")]
        {
            if on {
                let _ = write!(l, " {flag}");
            }
        }
        if b.pkey != 0xffff {
            let _ = write!(l, " pkey={:#06x}", b.pkey);
        }
    }
    if let Some(x) = h.rdeth {
        let _ = write!(l, " eecnxt={:#x}", x.ee_context);
    }
    if let Some(x) = h.deth {
        let _ = write!(l, " qkey={:#x} srcqp={:#08x}", x.qkey, x.src_qp.value());
    }
    if let Some(x) = h.xrceth {
        let _ = write!(l, " srqn={:#x}", x.xrc_srqn);
    }
    if let Some(x) = h.reth {
        let _ = write!(l, " va={:#x} rkey={:#x} dmalen={}", x.va, x.rkey, x.dma_len);
    }
    if let Some(x) = h.atomiceth {
        let _ = write!(l, " va={:#x} rkey={:#x} swap_add={:#x} compare={:#x}", x.va, x.rkey, x.swap_add, x.compare);
    }
    if let Some(x) = h.aeth {
        let _ = write!(l, " {} msn={}", syndrome_text(x.syndrome), x.msn.value());
    }
    if let Some(x) = h.atomicacketh {
        let _ = write!(l, " orig={:#x}", x.orig_rem_data);
    }
    if let Some(x) = h.immdt {
        let _ = write!(l, " imm={:#010x}", x.imm);
    }
    if let Some(x) = h.ieth {
        let _ = write!(l, " inv_rkey={:#x}", x.rkey);
    }
    if let Some(cm) = &ib.cm {
        l.push_str(&cm_text(cm));
    }
    if let Some(n) = ib.payload_len {
        let _ = write!(l, " len={n}");
    }
    match ib.icrc {
        Some(c) if ib.icrc_ok => {
            let _ = write!(l, " icrc={} ok", hex4(c));
        }
        Some(c) => {
            let _ = write!(l, " icrc={} BAD", hex4(c));
        }
        None => l.push_str(" icrc=unchecked"),
    }
    if s.truncated {
        l.push_str(" (truncated)");
    }
    if let Some(e) = &ib.error {
        let _ = write!(l, " error: {e}");
    }
    l
}

/// `softrdma pcap decode`.
pub(crate) fn decode(path: &Path, as_json: bool) -> Result<ExitCode> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let err = for_each_frame(path, |s| {
        if as_json {
            writeln!(out, "{}", frame_json(s))?;
        } else {
            writeln!(out, "{}", frame_text(s))?;
        }
        Ok(())
    })?;
    out.flush()?;
    if let Some(e) = err {
        eprintln!("softrdma: {}: the file ends in damage: {e}", path.display());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a check report.
pub(crate) fn print_report(
    out: &mut impl Write,
    name: &str,
    r: &CheckReport,
    read_error: Option<&str>,
) -> io::Result<()> {
    writeln!(out, "{name}")?;
    writeln!(out, "  frames          {}", r.frames)?;
    writeln!(out, "  IB packets      {}", r.ib_packets)?;
    writeln!(out, "  good ICRC       {}", r.good_icrc)?;
    writeln!(out, "  bad ICRC        {}", r.bad_icrc)?;
    writeln!(out, "  malformed       {}", r.malformed)?;
    writeln!(out, "  truncated       {}", r.truncated)?;
    writeln!(out, "  ICRC unchecked  {} (cut short by the capture)", r.icrc_unchecked)?;
    writeln!(out, "  opcodes:")?;
    for (op, n) in &r.opcodes {
        writeln!(out, "    {:#04x} {:<40} {n}", op, Opcode(*op).to_string())?;
    }
    for (frame, why) in &r.first_problems {
        writeln!(out, "  frame {frame}: {why}")?;
    }
    if let Some(e) = read_error {
        writeln!(out, "  file damaged after frame {}: {e}", r.frames)?;
    }
    let verdict = if r.is_clean() && read_error.is_none() { "OK" } else { "FAIL" };
    writeln!(out, "  verdict         {verdict}")
}

/// `softrdma pcap check`.
pub(crate) fn check(path: &Path) -> Result<ExitCode> {
    let mut report = CheckReport::default();
    let err = for_each_frame(path, |s| {
        report.add(s);
        Ok(())
    })?;
    print_report(&mut io::stdout().lock(), &path.display().to_string(), &report, err.as_deref())?;
    Ok(if report.is_clean() && err.is_none() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `softrdma pcap behaviour`: one section (or JSON object) per file. Exit 1 when a file ends in
/// damage (what came before is still reported).
pub(crate) fn behaviour(files: &[PathBuf], as_json: bool) -> Result<ExitCode> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut damaged = false;
    for (n, path) in files.iter().enumerate() {
        let cap = softrdma_pcap::behaviour::load(path)?;
        let report = softrdma_pcap::behaviour::analyse(&path.display().to_string(), &cap);
        damaged |= report.read_error.is_some();
        if as_json {
            writeln!(out, "{}", serde_json::to_string(&report)?)?;
        } else {
            if n > 0 {
                writeln!(out)?;
            }
            write!(out, "{}", softrdma_pcap::behaviour::text(&report))?;
        }
    }
    out.flush()?;
    Ok(if damaged { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The side softrdma plays in `pcap replay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReplaySide {
    /// softrdma answers the recorded requests.
    Responder,
    /// softrdma sends the recorded messages.
    Requester,
    /// Both, one after the other.
    Both,
}

/// `softrdma pcap replay`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn replay(
    file: &Path,
    side: ReplaySide,
    profile: &str,
    credits: Option<&str>,
    recv_depth: Option<usize>,
    strict: bool,
    as_json: bool,
    live: Option<(String, crate::replay_live::Local)>,
) -> Result<ExitCode> {
    let mut behaviour = softrdma_engine::device::WireProfile::by_name(profile)
        .ok_or_else(|| anyhow::anyhow!("unknown profile {profile}"))?;
    if let Some(c) = credits {
        behaviour.credits = match c {
            "count" => softrdma_engine::device::CreditPolicy::Count,
            _ => softrdma_engine::device::CreditPolicy::Invalid,
        };
    }
    let side = match side {
        ReplaySide::Responder => replay::Side::Responder,
        ReplaySide::Requester => replay::Side::Requester,
        ReplaySide::Both => replay::Side::Both,
    };
    let opts = replay::Options { side, behaviour, recv_depth };
    let rep = match live {
        None => replay::replay_file(file, &opts).with_context(|| format!("cannot read {}", file.display()))?,
        Some((dev, local)) => {
            if side == replay::Side::Requester {
                anyhow::bail!("live replay (--to) plays the responder only: use --as responder or leave --as out");
            }
            let opts = replay::Options { side: replay::Side::Responder, ..opts };
            let cap =
                softrdma_pcap::behaviour::load(file).with_context(|| format!("cannot read {}", file.display()))?;
            let mut targets = crate::replay_live::targets(dev, local);
            replay::replay_on(&file.display().to_string(), &cap, &opts, &mut targets, false)
        }
    };
    let mut out = io::stdout().lock();
    if as_json {
        writeln!(out, "{}", serde_json::to_string(&rep)?)?;
    } else {
        write!(out, "{}", replay::text(&rep))?;
    }
    out.flush()?;
    Ok(if strict && rep.mismatches() > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Writes samples to a capture file, one microsecond apart.
pub(crate) fn write_capture(path: &Path, frames: &[samples::Sample], pcapng: bool) -> Result<()> {
    let file = BufWriter::new(File::create(path).with_context(|| format!("cannot create {}", path.display()))?);
    let base_ns: u64 = 1_767_225_600_000_000_000; // 2026-01-01T00:00:00Z: fixed, so output is reproducible
    if pcapng {
        let opts = PcapngOptions {
            userappl: Some("softrdma".into()),
            comment: Some("synthetic frames built with the softrdma encoder, not captured traffic".into()),
            ..PcapngOptions::default()
        };
        let mut w = PcapngWriter::with_options(file, &opts)?;
        for (i, s) in frames.iter().enumerate() {
            w.write_packet_with_comment(base_ns + i as u64 * 1000, &s.frame, s.frame.len() as u32, &s.name)?;
        }
        w.finish()?;
    } else {
        let mut w = PcapWriter::new(file, Resolution::Micro)?;
        for (i, s) in frames.iter().enumerate() {
            w.write_packet(base_ns + i as u64 * 1000, &s.frame, s.frame.len() as u32)?;
        }
        w.finish()?;
    }
    Ok(())
}

/// `softrdma pcap generate`.
pub(crate) fn generate(path: &Path, seed: u64, pcapng: bool) -> Result<ExitCode> {
    let frames = samples::every_opcode(seed);
    write_capture(path, &frames, pcapng)?;
    println!("wrote {} frames (one per opcode, seed {seed}) to {}", frames.len(), path.display());
    Ok(ExitCode::SUCCESS)
}
