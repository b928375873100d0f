//! The capture's rows of `softrdma bench` (issue 53): `ib_write_bw -s 65536` across two devices
//! with the capture on both (`softrdma up --pcap`) against the same without it, in alternating
//! runs of one bench run, on the default data path. The frames the captures lost and whether
//! every frame of every capture checks (`softrdma pcap check`: well formed, ICRC valid) are part
//! of the figure: a ratio bought by dropping frames is not the capture's speed.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use crate::bench::{gbit, run, Devices, Runner, Table};

/// What one run with the capture on left behind: frames written, frames lost, whether every
/// capture checked.
struct Captured {
    frames: u64,
    lost: u64,
    checked: bool,
}

/// The devices' capture counters (`softrdma stat --json`), summed: written, lost.
fn capture_counts(exe: &Path, devs: &[&str]) -> Option<(u64, u64)> {
    let (mut frames, mut lost) = (0, 0);
    for d in devs {
        let o = Command::new(exe).args(["stat", d, "--json"]).output().ok()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        frames += v["capture_frames"].as_u64()?;
        lost += v["capture_dropped"].as_u64()?;
    }
    Some((frames, lost))
}

/// One `ib_write_bw -s 65536` across (provider path, the default) on two fresh devices, the
/// capture on both when `dir` is given; its bandwidth (Gbit/s) and, with the capture, what it
/// captured.
fn one(
    r: &mut Runner,
    exe: &Path,
    addrs: [IpAddr; 2],
    dir: Option<&Path>,
    iters: u32,
) -> Result<(f64, Option<Captured>)> {
    let files: Vec<_> = (0..2).map(|i| dir.map(|d| d.join(format!("bench-capture-srdma{i}.pcap")))).collect();
    let extra: Vec<Vec<String>> =
        files.iter().map(|f| f.iter().flat_map(|f| ["--pcap".to_owned(), f.display().to_string()]).collect()).collect();
    let devs = Devices::start_with(exe, addrs, [extra[0].clone(), extra[1].clone()])?;
    let p = r.perftest("provider", "ib_write_bw", "srdma1", 65536, iters)?;
    let counts = capture_counts(exe, &["srdma0", "srdma1"]);
    drop(devs);
    let captured = match dir {
        None => None,
        Some(_) => {
            let mut checked = true;
            for f in files.iter().flatten() {
                let (status, _) = run(Command::new(exe).args(["pcap", "check"]).arg(f), Duration::from_secs(300))?;
                checked &= status == Some(0);
                let _ = std::fs::remove_file(f);
            }
            let (frames, lost) = counts.unwrap_or((0, u64::MAX));
            Some(Captured { frames, lost, checked })
        }
    };
    Ok((gbit(p.mib_s), captured))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Adds the rows: each configuration's median over `rounds` alternating runs, then the ratio
/// with its verdict (target >= 0.75, with no frame lost and every capture checked).
pub(crate) fn rows(
    t: &mut Table,
    r: &mut Runner,
    exe: &Path,
    addrs: [IpAddr; 2],
    rounds: u32,
    iters: u32,
) -> Result<()> {
    // The captures go to the temporary directory ($TMPDIR; a disk here, written with O_DIRECT:
    // device/src/capture/sink.rs; TMPDIR=/dev/shm measures a capture to memory).
    let dir = std::env::temp_dir().join(format!("softrdma-bench-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let (mut frames, mut lost, mut checked) = (0u64, 0u64, true);
    for round in 0..rounds {
        eprintln!("softrdma bench: capture off/on, round {} of {rounds}", round + 1);
        off.push(one(r, exe, addrs, None, iters)?.0);
        let (g, c) = one(r, exe, addrs, Some(&dir), iters)?;
        on.push(g);
        if let Some(c) = c {
            frames += c.frames;
            lost = lost.saturating_add(c.lost);
            checked &= c.checked;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (m_off, m_on) = (median(&mut off), median(&mut on));
    t.v.insert("capture_off_gbps".into(), m_off);
    t.v.insert("capture_on_gbps".into(), m_on);
    let group = "softrdma capture";
    t.row(group, "ib_write_bw -s 65536 across, capture off", format!("{m_off:.2} Gbit/s (median of {rounds})"));
    t.row(
        group,
        "ib_write_bw -s 65536 across, capture on both devices",
        format!(
            "{m_on:.2} Gbit/s (median of {rounds}); {frames} frames captured, {lost} lost, {}",
            if checked { "every frame checked" } else { "a capture FAILED its check" }
        ),
    );
    let ratio = m_on / m_off;
    let verdict = if !checked || lost > 0 {
        "invalid: the capture lost or damaged frames".to_owned()
    } else if ratio >= 0.75 {
        "met".to_owned()
    } else {
        "missed".to_owned()
    };
    t.row("ratio", "ib_write_bw 64 KiB across, capture on / off", format!("{ratio:.3} (target >= 0.75: {verdict})"));
    Ok(())
}
