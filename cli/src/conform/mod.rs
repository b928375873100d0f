//! `softrdma conform`: black-box conformance cases against any RoCEv2 device (docs/conform.md).
//!
//! The device under test (DUT) runs `softrdma-conform-agent` on its host, against its own
//! libibverbs; the tester here drives it over TCP (make objects, bring a QP up, post, poll, read
//! memory) and plays the DUT's peer QP on the wire from its own address: it forges the packets a
//! case names (including wrong ones: bad PSNs, keys, ICRCs, opcodes) and checks what the DUT sends
//! back and what the agent reports. Cases are data (conformance/cases/CHAPTER/NAME.toml), each
//! naming its IBTA rule.

mod agent;
mod case;
mod cases;
mod packet;
mod peer;
mod run;
mod vars;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;

use self::case::Case;
use self::run::{gid_hex, run_case, Bench, Verdict};

#[derive(Args)]
pub(crate) struct ConformArgs {
    /// The agent's host and port (HOST[:PORT], port 7471 by default).
    #[arg(long, default_value = "127.0.0.1")]
    dut: String,
    /// The tester's own RoCE address (it binds UDP 4791 there). Default: the address the host
    /// routes to the DUT from, or 127.0.0.254 for a DUT on loopback.
    #[arg(long)]
    local: Option<IpAddr>,
    /// The DUT's RDMA device (the agent's first device by default).
    #[arg(long)]
    dev: Option<String>,
    /// The DUT's GID index (the first RoCEv2 IPv4-mapped GID by default).
    #[arg(long)]
    gid_index: Option<u32>,
    /// Only the cases whose name matches (`*` matches any run of characters); repeatable.
    #[arg(long = "case")]
    cases: Vec<String>,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// A capture of each case's packets, both ways, as DIR/CASE.pcap.
    #[arg(long)]
    pcap_dir: Option<PathBuf>,
    /// List the cases and their rules, run nothing.
    #[arg(long)]
    list: bool,
    /// Cases from this directory (CHAPTER/NAME.toml under it) instead of the built-in ones.
    #[arg(long)]
    cases_dir: Option<PathBuf>,
}

/// `*`-wildcard match of a whole name.
fn matches(pat: &str, name: &str) -> bool {
    let parts: Vec<&str> = pat.split('*').collect();
    if parts.len() == 1 {
        return pat == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

pub(crate) fn run(a: &ConformArgs) -> ExitCode {
    match conform(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("softrdma conform: {e}");
            ExitCode::from(2)
        }
    }
}

/// CHAPTER/NAME and text of each case file under `dir`, sorted.
fn read_cases(dir: &std::path::Path) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let rd = |d: &std::path::Path| std::fs::read_dir(d).map_err(|e| format!("{}: {e}", d.display()));
    for chapter in rd(dir)? {
        let chapter = chapter.map_err(|e| e.to_string())?.path();
        if !chapter.is_dir() {
            continue;
        }
        for f in rd(&chapter)? {
            let f = f.map_err(|e| e.to_string())?.path();
            if f.extension().is_some_and(|e| e == "toml") {
                let name = format!(
                    "{}/{}",
                    chapter.file_name().unwrap_or_default().to_string_lossy(),
                    f.file_stem().unwrap_or_default().to_string_lossy()
                );
                let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
                out.push((name, text));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn selected(a: &ConformArgs) -> Result<Vec<(String, Case)>, String> {
    let all: Vec<(String, String)> = match &a.cases_dir {
        Some(d) => read_cases(d)?,
        None => cases::ALL.iter().map(|(n, t)| ((*n).to_string(), (*t).to_string())).collect(),
    };
    let mut out = Vec::new();
    for (name, text) in all {
        if !a.cases.is_empty() && !a.cases.iter().any(|p| matches(p, &name)) {
            continue;
        }
        let c = Case::parse(&text).map_err(|e| format!("case {name}: {e}"))?;
        out.push((name, c));
    }
    if out.is_empty() {
        return Err(format!("no case matches {}", a.cases.join(" ")));
    }
    Ok(out)
}

fn tester_address(a: &ConformArgs, dut_ip: IpAddr) -> IpAddr {
    if let Some(l) = a.local {
        return l;
    }
    if dut_ip.is_loopback() {
        return match dut_ip {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(127, 0, 0, 254)),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
    }
    let any = if dut_ip.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
    UdpSocket::bind((any, 0))
        .and_then(|s| s.connect((dut_ip, 4791)).map(|_| s))
        .and_then(|s| s.local_addr())
        .map_or(any, |l| l.ip())
}

fn conform(a: &ConformArgs) -> Result<ExitCode, String> {
    let list = selected(a)?;
    if a.list {
        for (name, c) in &list {
            println!("{name}\t{}\t{}", c.rule, c.title);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut agent = agent::Agent::connect(&a.dut)?;
    let mut open = String::from("open");
    if let Some(d) = &a.dev {
        open.push_str(&format!(" dev={d}"));
    }
    if let Some(g) = a.gid_index {
        open.push_str(&format!(" gid_index={g}"));
    }
    let info = agent.ok(&open)?;
    let gid = info.get("gid").cloned().unwrap_or_default();
    let raw: Vec<u8> =
        (0..16).filter_map(|i| gid.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
    let octets: [u8; 16] = raw.try_into().map_err(|_| format!("the agent's GID {gid:?} is not 16 bytes"))?;
    let v6 = Ipv6Addr::from(octets);
    let dut_ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    let local = tester_address(a, dut_ip);
    let peer = peer::Peer::bind(local, dut_ip)?;
    let dev = info.get("dev").cloned().unwrap_or_default();
    if !a.json {
        println!(
            "conform: device {dev} (GID index {}, {dut_ip}) through the agent at {}; the tester is {} at {local}",
            info.get("gid_index").map_or("?", |s| s.as_str()),
            a.dut,
            gid_hex(local)
        );
    }
    if let Some(d) = &a.pcap_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let mut bench = Bench { agent, peer, tester_gid: gid_hex(local) };
    let (mut pass, mut fail, mut dev_n) = (0, 0, 0);
    let mut rows = Vec::new();
    let start = Instant::now();
    if !a.json {
        println!("{:<52} {:<10} rule / what differed", "case", "result");
    }
    for (name, c) in &list {
        let pcap = a.pcap_dir.as_ref().map(|d| d.join(format!("{}.pcap", name.replace('/', "_"))));
        bench.peer.capture_to(pcap.as_deref())?;
        let t = Instant::now();
        let verdict = run_case(&mut bench, c);
        bench.peer.end_capture();
        let ms = t.elapsed().as_millis();
        let (word, detail) = match &verdict {
            Verdict::Pass => {
                pass += 1;
                ("pass", String::new())
            }
            Verdict::Fail(w) => {
                fail += 1;
                ("fail", w.clone())
            }
            Verdict::Deviation(w) => {
                dev_n += 1;
                ("deviation", w.clone())
            }
        };
        if a.json {
            rows.push(format!(
                "{{\"case\":{},\"rule\":{},\"title\":{},\"result\":\"{word}\",\"detail\":{},\"ms\":{ms},\"pcap\":{}}}",
                json_str(name),
                json_str(&c.rule),
                json_str(&c.title),
                json_str(&detail),
                pcap.as_ref().map_or("null".into(), |p| json_str(&p.display().to_string()))
            ));
        } else {
            println!("{name:<52} {word:<10} {}", c.rule);
            if !detail.is_empty() {
                println!("{:<63} {detail}", "");
                if let Some(p) = &pcap {
                    println!("{:<63} capture: {}", "", p.display());
                }
            }
        }
    }
    let n = list.len();
    if a.json {
        println!(
            "{{\"device\":{},\"tester\":{},\"passed\":{pass},\"failed\":{fail},\"deviations\":{dev_n},\"cases\":{n},\"results\":[{}]}}",
            json_str(&dev),
            json_str(&local.to_string()),
            rows.join(",")
        );
    } else {
        println!(
            "conform: {pass} passed, {fail} failed, {dev_n} deviations of {n} ({:.1} s)",
            start.elapsed().as_secs_f64()
        );
    }
    let _ = bench.agent.call("quit");
    Ok(if fail > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_whole_names() {
        assert!(matches("rc/*", "rc/req_psn"));
        assert!(matches("*psn*", "rc/req_psn_gap"));
        assert!(matches("rc/req_psn", "rc/req_psn"));
        assert!(!matches("rc/req", "rc/req_psn"));
        assert!(!matches("ud/*", "rc/req_psn"));
        assert!(matches("*", "x"));
        assert!(!matches("a*b*c", "acb"));
    }

    #[test]
    fn every_case_file_is_built_in_and_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/cases");
        let on_disk: Vec<String> = read_cases(&dir).unwrap().into_iter().map(|(n, _)| n).collect();
        let built: Vec<String> = cases::ALL.iter().map(|(n, _)| (*n).to_string()).collect();
        assert_eq!(on_disk, built, "build.rs builds in every case file");
        for (name, text) in cases::ALL {
            if let Err(e) = Case::parse(text) {
                panic!("{name}: {e}");
            }
        }
    }

    #[test]
    fn a_case_with_two_actions_in_a_step_is_refused() {
        let bad = "title = \"t\"\nrule = \"r\"\ntransport = \"rc\"\n[[step]]\nsleep_ms = 1\nsilence_ms = 1\n";
        assert!(Case::parse(bad).unwrap_err().contains("2 actions"));
        let unknown = "title = \"t\"\nrule = \"r\"\ntransport = \"rc\"\n[[step]]\nslep_ms = 1\n";
        assert!(Case::parse(unknown).is_err());
        let xrc = "title = \"t\"\nrule = \"r\"\ntransport = \"xrc\"\n[[step]]\nsleep_ms = 1\n";
        assert!(Case::parse(xrc).is_err());
    }
}
