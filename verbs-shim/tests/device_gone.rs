//! The device going away, seen from a C verbs program on the shim: `tests/abi/device_gone.c`
//! gets IBV_EVENT_DEVICE_FATAL and then every call fails cleanly (no crash, no hang).
//!
//! Needs the built shim (`scripts/build-shim.sh`, or $SOFTRDMA_SHIM_DIR). The test starts srdma0
//! on 127.0.0.1 with a free UDP port in a private runtime dir, runs the program until it is
//! ready, stops the device (`softrdma down`), then lets the program go on.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{compile_c, down, shim_dir, softrdma_bin, text, Down, DEVICE};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn device_gone_gives_device_fatal_and_clean_failures() {
    let shim = shim_dir();
    assert!(shim.join("libibverbs.so.1").is_file(), "the shim is not built: run scripts/build-shim.sh first");
    let exe = softrdma_bin(&shim);
    assert!(exe.is_file(), "{} is missing: scripts/build-shim.sh builds it", exe.display());

    let work = tempfile::Builder::new().prefix("softrdma-gone-").tempdir().expect("temp dir");
    let bin = compile_c(&shim, "device_gone", work.path());

    let runtime = work.path().join("rt");
    std::fs::create_dir(&runtime).expect("runtime dir");
    std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    let _down = Down { exe: &exe, runtime: &runtime };
    let port = std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("free UDP port").port();
    let o = Command::new(&exe)
        .args(["up", DEVICE, "--addr", "127.0.0.1", "--port", &port.to_string()])
        .env("SOFTRDMA_RUNTIME_DIR", &runtime)
        .output()
        .expect("run softrdma up");
    assert!(o.status.success(), "softrdma up {DEVICE} --port {port} failed:\n{}", text(&o));

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
    let mut err = child.stderr.take().expect("piped");
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });

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
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait device_gone") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (t_out.join().unwrap_or_default(), t_err.join().unwrap_or_default());
    let report = format!(
        "device_gone: {} ({downed})\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}",
        match status {
            Some(s) => format!("exited with {s}"),
            None => format!("killed after {TIMEOUT:?}"),
        }
    );
    assert!(ready, "the program never printed `ready`:\n{report}");
    assert!(status.is_some_and(|s| s.success()), "{report}");
    println!("{report}");
}
