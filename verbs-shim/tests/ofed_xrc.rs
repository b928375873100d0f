//! OFED 1.3-1.5's XRC verbs from a C program: `tests/abi/ofed_xrc.c`, compiled against the
//! shim's `include/softrdma/ofed_xrc.h` and linked with its libibverbs.so.1 (as an OFED program
//! was against OFED's), checks domains, OFED's SRQ and init_attr layouts, the registered and the
//! device-owned receive QPs' lifetimes across processes, the required masks, another domain's
//! SRQ refused and the flagged async events (see the program's header).
//!
//! Needs the built shim (`scripts/build-shim.sh`, or $SOFTRDMA_SHIM_DIR). The test starts srdma0
//! on 127.0.0.1 with a free UDP port in a private runtime dir.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{compile_c_on_shim, shim_dir, softrdma_bin, text, Down, DEVICE};

const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn ofed_xrc_verbs_from_a_c_program() {
    let shim = shim_dir();
    assert!(shim.join("libibverbs.so.1").is_file(), "the shim is not built: run scripts/build-shim.sh first");
    assert!(
        shim.join("include/softrdma/ofed_xrc.h").is_file(),
        "{}/include/softrdma/ofed_xrc.h is missing: run scripts/build-shim.sh",
        shim.display()
    );
    let exe = softrdma_bin(&shim);
    assert!(exe.is_file(), "{} is missing: scripts/build-shim.sh builds it", exe.display());

    let work = tempfile::Builder::new().prefix("softrdma-ofed-xrc-").tempdir().expect("temp dir");
    let bin = compile_c_on_shim(&shim, "ofed_xrc", work.path());
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
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ofed_xrc");
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = t_out.join().unwrap_or_default();
    let stderr = t_err.join().unwrap_or_default();
    let log = std::fs::read_to_string(runtime.join(format!("{DEVICE}.log"))).unwrap_or_default();
    let report = format!("--- stdout ---\n{stdout}--- stderr ---\n{stderr}--- {DEVICE}.log ---\n{log}");
    let Some(status) = status else { panic!("ofed_xrc timed out after {TIMEOUT:?}\n{report}") };
    assert!(status.success(), "ofed_xrc exited with {status}\n{report}");
    assert!(stdout.lines().any(|l| l.starts_with("# ") && l.ends_with(" 0 failed")), "no summary line\n{report}");
    let oks = stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(oks >= 35, "only {oks} checks ran\n{report}");
    println!("{report}");
}
