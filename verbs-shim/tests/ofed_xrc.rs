//! OFED 1.3-1.5's XRC verbs from a C program: `tests/abi/ofed_xrc.c`, compiled against the
//! shim's `include/softrdma/ofed_xrc.h` and linked with its libibverbs.so.1 (as an OFED program
//! was against OFED's), checks domains, OFED's SRQ and init_attr layouts, the registered and the
//! device-owned receive QPs' lifetimes across processes, the required masks, another domain's
//! SRQ refused and the flagged async events (see the program's header).
//!
//! Needs the built shim (`scripts/build-shim.sh`, or $SOFTRDMA_SHIM_DIR). The test starts srdma0
//! on 127.0.0.1 with a free UDP port in a private runtime dir.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{built_shim, compile_c_on_shim, run_with_timeout, runtime_dir, up_on_free_port, Down, DEVICE};

const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn ofed_xrc_verbs_from_a_c_program() {
    let (shim, exe) = built_shim();
    assert!(
        shim.join("include/softrdma/ofed_xrc.h").is_file(),
        "{}/include/softrdma/ofed_xrc.h is missing: run scripts/build-shim.sh",
        shim.display()
    );

    let work = tempfile::Builder::new().prefix("softrdma-ofed-xrc-").tempdir().expect("temp dir");
    let bin = compile_c_on_shim(&shim, "ofed_xrc", work.path());
    let runtime = runtime_dir(work.path());
    let _down = Down { exe: &exe, runtime: &runtime };
    up_on_free_port(&exe, &runtime);

    let mut cmd = Command::new(&bin);
    cmd.env("LD_LIBRARY_PATH", &shim)
        .env("SOFTRDMA_RUNTIME_DIR", &runtime)
        .env("SOFTRDMA_BIN", &exe)
        .env("SOFTRDMA_NO_AUTOSTART", "1");
    let (out, timed_out) = run_with_timeout(cmd, TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(runtime.join(format!("{DEVICE}.log"))).unwrap_or_default();
    let report = format!("--- stdout ---\n{stdout}--- stderr ---\n{stderr}--- {DEVICE}.log ---\n{log}");
    assert!(!timed_out, "ofed_xrc timed out after {TIMEOUT:?}\n{report}");
    assert!(out.status.success(), "ofed_xrc exited with {}\n{report}", out.status);
    assert!(stdout.lines().any(|l| l.starts_with("# ") && l.ends_with(" 0 failed")), "no summary line\n{report}");
    let oks = stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(oks >= 35, "only {oks} checks ran\n{report}");
    println!("{report}");
}
