//! The C ABI, end to end: compiles `tests/abi/abi_check.c` with `cc` against rdma-core's
//! installed headers and runs it on the shim (libibverbs.so.1 found through LD_LIBRARY_PATH), so
//! the structure layouts and the static inline paths of verbs.h (verbs_context ops, ctx->ops,
//! ibv_cq_ex and ibv_qp_ex function pointers) are exercised exactly as a C program uses them.
//!
//! Needs the built shim: `scripts/build-shim.sh` (or $SOFTRDMA_SHIM_DIR naming another build).
//! The device runs in a private runtime dir and is stopped at the end. When UDP 127.0.0.1:4791 is
//! free, the program's own `ibv_get_device_list` starts srdma0 (the shim's auto-start); when
//! something else holds that port (rxe, another softrdma device), the test starts srdma0 itself
//! on 127.0.0.1 with a free UDP port, as the auto-started one could not bind.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

mod common;
use common::{compile_c, run_with_timeout, runtime_dir, shim_dir, softrdma_bin, up_on_free_port, Down, DEVICE};

const RUN_TIMEOUT: Duration = Duration::from_secs(150);

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let m = e.metadata().ok()?;
        let t = if m.is_dir() { newest_mtime(&e.path()) } else { m.modified().ok() };
        newest = newest.max(t);
    }
    newest
}

#[test]
fn abi_check_c_program_on_the_shim() {
    let shim = shim_dir();
    let lib = shim.join("libibverbs.so.1");
    assert!(
        lib.is_file(),
        "the verbs shim is not built: {} is missing. Run scripts/build-shim.sh first \
         (or set SOFTRDMA_SHIM_DIR to the directory holding libibverbs.so.1)",
        lib.display()
    );
    let exe = softrdma_bin(&shim);
    assert!(
        exe.is_file(),
        "{} is missing: scripts/build-shim.sh builds it with the shim (or set SOFTRDMA_BIN)",
        exe.display()
    );
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    if let (Some(src), Ok(built)) = (newest_mtime(&src_dir), lib.metadata().and_then(|m| m.modified())) {
        if src > built {
            eprintln!(
                "warning: {} is older than verbs-shim/src; this tests the old build (run scripts/build-shim.sh)",
                lib.display()
            );
        }
    }

    let work = tempfile::Builder::new().prefix("softrdma-abi-").tempdir().expect("temp dir");
    let bin = compile_c(&shim, "abi_check", work.path());

    // A private runtime dir (mode 0700: tempdir makes it so), and a scratch dir for the XRC files.
    let runtime = runtime_dir(work.path());
    let scratch = work.path().join("tmp");
    std::fs::create_dir(&scratch).expect("scratch dir");
    let _down = Down { exe: &exe, runtime: &runtime };

    let default_port_free = std::net::UdpSocket::bind("127.0.0.1:4791").is_ok();
    let how = if default_port_free {
        format!("{DEVICE} auto-started by the shim on 127.0.0.1:4791")
    } else {
        let port = up_on_free_port(&exe, &runtime);
        format!("UDP 127.0.0.1:4791 is taken: {DEVICE} started by the test on 127.0.0.1:{port}")
    };

    let mut cmd = Command::new(&bin);
    cmd.env("LD_LIBRARY_PATH", &shim)
        .env("SOFTRDMA_RUNTIME_DIR", &runtime)
        .env("SOFTRDMA_BIN", &exe)
        .env("TMPDIR", &scratch)
        .env_remove("SOFTRDMA_NO_AUTOSTART");
    let (out, timed_out) = run_with_timeout(cmd, RUN_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = || {
        let log = std::fs::read_to_string(runtime.join(format!("{DEVICE}.log"))).unwrap_or_default();
        let fails: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
        format!(
            "abi_check ({how}) {}:\n--- failures ---\n{}\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}--- {DEVICE}.log ---\n{log}",
            if timed_out { format!("timed out after {RUN_TIMEOUT:?}") } else { format!("exited with {}", out.status) },
            fails.join("\n"),
        )
    };
    assert!(!timed_out && out.status.success(), "{}", report());
    println!("{}", report());
    assert!(
        stdout.lines().any(|l| l.starts_with("# ") && l.ends_with(" 0 failed")),
        "abi_check exited 0 without its summary line:\n{}",
        report()
    );
}
