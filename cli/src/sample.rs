//! `softrdma pcap sample`: builds a RoCE conversation with the
//! project's own encoder, writes it as a pcap file, reads the file back, decodes every frame and
//! checks every ICRC, the same way `softrdma pcap decode` and `check` do for any capture.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use softrdma_pcap::analyze::CheckReport;
use softrdma_pcap::samples;

use crate::pcap_cmd::{for_each_frame, frame_json, frame_text, print_report, write_capture};

pub(crate) fn run(out: Option<PathBuf>, json: bool) -> Result<ExitCode> {
    let path = out.unwrap_or_else(|| std::env::temp_dir().join(format!("softrdma-demo-{}.pcap", std::process::id())));
    let frames = samples::demo_conversation();
    write_capture(&path, &frames, false)?;
    let stdout = io::stdout();
    let mut o = stdout.lock();
    if !json {
        writeln!(
            o,
            "softrdma pcap sample: {} RoCEv2 frames built with softrdma's own encoder (offline, no device),",
            frames.len()
        )?;
        writeln!(o, "written to {} and decoded back:", path.display())?;
    }
    let mut report = CheckReport::default();
    let mut i = 0;
    let err = for_each_frame(&path, |s| {
        report.add(s);
        if json {
            writeln!(o, "{}", frame_json(s))?;
        } else {
            let name = frames.get(i).map_or("", |f| f.name.as_str());
            writeln!(o, "{}   # {name}", frame_text(s))?;
        }
        i += 1;
        Ok(())
    })?;
    if !json {
        print_report(&mut o, "check:", &report, err.as_deref())?;
        writeln!(o, "open it in Wireshark, or run: softrdma pcap decode {} --json", path.display())?;
    }
    let good = report.is_clean() && err.is_none() && report.frames == frames.len() as u64;
    Ok(if good { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
