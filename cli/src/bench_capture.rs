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
    /// Bytes of the larger of the two files.
    bytes: u64,
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
            let mut bytes = 0;
            for f in files.iter().flatten() {
                bytes = bytes.max(std::fs::metadata(f).map(|m| m.len()).unwrap_or(0));
                let (status, _) = run(Command::new(exe).args(["pcap", "check"]).arg(f), Duration::from_secs(300))?;
                checked &= status == Some(0);
                let _ = std::fs::remove_file(f);
            }
            let (frames, lost) = counts.unwrap_or((0, u64::MAX));
            Some(Captured { frames, lost, checked, bytes })
        }
    };
    Ok((gbit(p.mib_s), captured))
}

/// The physical limit of a capture of both devices: what the capture's directory takes from two
/// threads writing at once, each `bytes` as fast as the file system allows (whole 4 MiB blocks
/// with O_DIRECT on a disk, plain writes into memory on tmpfs: what the capture's writer does,
/// device/src/capture/sink.rs), on an otherwise quiet machine. Bytes per second, both together.
fn write_limit(dir: &Path, bytes: u64) -> Result<f64> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    const BLOCK: usize = 4 << 20;
    let in_memory = nix::sys::statfs::statfs(dir)
        .map(|s| {
            let t = s.filesystem_type();
            t == nix::sys::statfs::TMPFS_MAGIC || t == nix::sys::statfs::FsType(0x8584_58f6)
        })
        .unwrap_or(false);
    let start = std::time::Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let path = dir.join(format!("bench-capture-limit{i}"));
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut o = std::fs::OpenOptions::new();
                o.write(true).create(true).truncate(true);
                if !in_memory {
                    o.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
                }
                let mut f = o.open(&path)?;
                let v = vec![0x5au8; BLOCK + 4096];
                let at = v.as_ptr().align_offset(4096);
                let block = &v[at..at + BLOCK];
                let mut left = bytes;
                while left > 0 {
                    f.write_all(block)?;
                    left = left.saturating_sub(BLOCK as u64);
                }
                drop(f);
                std::fs::remove_file(&path)
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(2.0 * bytes.div_ceil(BLOCK as u64) as f64 * BLOCK as f64 / secs)
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
    let (mut frames, mut lost, mut checked, mut bytes) = (0u64, 0u64, true, 0u64);
    for round in 0..rounds {
        eprintln!("softrdma bench: capture off/on, round {} of {rounds}", round + 1);
        off.push(one(r, exe, addrs, None, iters)?.0);
        let (g, c) = one(r, exe, addrs, Some(&dir), iters)?;
        on.push(g);
        if let Some(c) = c {
            frames += c.frames;
            lost = lost.saturating_add(c.lost);
            checked &= c.checked;
            bytes = bytes.max(c.bytes);
        }
    }
    // The limit, measured in the same run into the same directory, files as large as the
    // captures were.
    eprintln!("softrdma bench: the capture directory's write limit");
    // The best of two runs of at least 1 GiB a writer: a disk's speed wanders (a virtual disk's
    // host caches bursts), and a limit is what the directory can do, not what it did once.
    let per_file = bytes.max(1 << 30);
    let limit = write_limit(&dir, per_file).and_then(|a| Ok(a.max(write_limit(&dir, per_file)?)));
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
    // A capture of both devices writes every byte of the stream twice (the sender's file and
    // the receiver's): the stream can go at most half the directory's write limit with it on.
    let ceiling = match &limit {
        Ok(bps) => {
            let c = (bps / 2.0 * 8.0 / 1e9 / m_off).min(1.0);
            let invalid =
                if c < m_on / m_off { " (below what the capture did: not this machine's limit; re-run)" } else { "" };
            t.v.insert("capture_write_limit_gbps".into(), bps * 8.0 / 1e9);
            t.row(
                group,
                "the capture directory's write limit (2 writers at once, as the capture writes)",
                format!(
                    "{:.2} GB/s: a stream captured on both devices goes at most {:.2} Gbit/s, {c:.3} of capture off{invalid}",
                    bps / 1e9,
                    bps / 2.0 * 8.0 / 1e9
                ),
            );
            Some(c)
        }
        Err(e) => {
            t.row(group, "the capture directory's write limit", format!("not measured: {e:#}"));
            None
        }
    };
    let ratio = m_on / m_off;
    // A limit below what the capture did is no limit (the disk was slower when measured).
    let ceiling = ceiling.filter(|&c| c >= ratio);
    let verdict = if !checked || lost > 0 {
        "invalid: the capture lost or damaged frames".to_owned()
    } else if ratio >= 0.75 {
        "met".to_owned()
    } else {
        match ceiling {
            Some(c) if c < 0.75 => {
                format!("missed; above this machine's limit: the directory's write speed allows {c:.3}")
            }
            Some(c) => format!("missed; {:.2} of the write limit's {c:.3}", ratio / c),
            None => "missed".to_owned(),
        }
    };
    t.row("ratio", "ib_write_bw 64 KiB across, capture on / off", format!("{ratio:.3} (target >= 0.75: {verdict})"));
    Ok(())
}
