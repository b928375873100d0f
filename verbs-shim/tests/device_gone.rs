//! The device going away, seen from a C verbs program on the shim: `tests/abi/device_gone.c`
//! gets IBV_EVENT_DEVICE_FATAL and then every call fails cleanly (no crash, no hang).
//!
//! Needs the built shim (`scripts/build-shim.sh`, or $SOFTRDMA_SHIM_DIR). The test starts srdma0
//! on 127.0.0.1 with a free UDP port in a private runtime dir, runs the program until it is
//! ready, stops the device (`softrdma down`), then lets the program go on.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{built_shim, compile_c, down, read_all, runtime_dir, text, up_on_free_port, wait_until, Down};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn device_gone_gives_device_fatal_and_clean_failures() {
    let (shim, exe) = built_shim();

    let work = tempfile::Builder::new().prefix("softrdma-gone-").tempdir().expect("temp dir");
    let bin = compile_c(&shim, "device_gone", work.path());

    let runtime = runtime_dir(work.path());
    let _down = Down { exe: &exe, runtime: &runtime };
    up_on_free_port(&exe, &runtime);

    let mut child = Command::new(&bin)
        .env("LD_LIBRARY_PATH", &shim)
        .env("SOFTRDMA_RUNTIME_DIR", &runtime)
        .env("SOFTRDMA_BIN", &exe)
        .env("SOFTRDMA_NO_AUTOSTART", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start device_gone");
    let (tx, rx) = mpsc::channel();
    let out = BufReader::new(child.stdout.take().expect("piped"));
    let t_out = std::thread::spawn(move || {
        let mut all = String::new();
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all += &line;
            all.push('\n');
        }
        all
    });
    let t_err = read_all(child.stderr.take().expect("piped"));

    let deadline = Instant::now() + TIMEOUT;
    let ready = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l == "ready" => break true,
            Ok(_) => {}
            Err(_) => break false,
        }
    };
    let mut downed = String::new();
    if ready {
        let o = down(&exe, &runtime).expect("run softrdma down");
        downed = format!("softrdma down: {} {}", o.status, text(&o).trim());
        let _ = child.stdin.take().expect("piped").write_all(b"\n");
    }
    let (status, killed) = wait_until(&mut child, deadline);
    let stdout = t_out.join().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    let report = format!(
        "device_gone: {} ({downed})\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}",
        if killed { format!("killed after {TIMEOUT:?}") } else { format!("exited with {status}") }
    );
    assert!(ready, "the program never printed `ready`:\n{report}");
    assert!(!killed && status.success(), "{report}");
    println!("{report}");
}
