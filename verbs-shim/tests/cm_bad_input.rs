//! Bad input to librdmacm on a device, from a C program on the shim (`tests/abi/cm_bad_input.c`):
//! a port already taken (EADDRINUSE), private data beyond what REQ, REP and REJ carry (EINVAL), a
//! call on a destroyed ID (EINVAL), a destroy that waits for its unacked event, ECE with bad
//! values (EINVAL); then a whole connection still works, carrying ECE both ways, and the
//! device's counters (`softrdma stat`) show what happened. Last, a thread that reads a channel
//! just destroyed blocks (as a read of the kernel's closed ucma fd under way does) instead of
//! failing with EBADF.
//!
//! Needs the built shim (`scripts/build-shim.sh`, or $SOFTRDMA_SHIM_DIR). The test starts srdma0
//! on 127.0.0.1 with a free UDP port in a private runtime dir.

use std::process::Command;

mod common;
use common::{compile_c_with, runtime_dir, shim_dir, softrdma_bin, text, up_on_free_port, Down, DEVICE};

#[test]
fn librdmacm_bad_calls_fail_with_the_kernels_errno_and_harm_nothing() {
    let shim = shim_dir();
    assert!(shim.join("librdmacm.so.1").is_file(), "the shim is not built: run scripts/build-shim.sh first");
    let exe = softrdma_bin(&shim);
    let work = tempfile::Builder::new().prefix("softrdma-cm-bad-").tempdir().expect("temp dir");
    let bin = compile_c_with(&shim, "cm_bad_input", work.path(), &["-lrdmacm", "-lpthread"]);

    let runtime = runtime_dir(work.path());
    let _down = Down { exe: &exe, runtime: &runtime };
    up_on_free_port(&exe, &runtime);

    // An rdma_cm port: any number works (the reservations live in the private runtime dir).
    let port = 20000 + std::process::id() % 20000;
    let o = Command::new("timeout")
        .arg("90")
        .arg(&bin)
        .args(["127.0.0.1", &port.to_string()])
        .env("LD_LIBRARY_PATH", &shim)
        .env("SOFTRDMA_RUNTIME_DIR", &runtime)
        .env("SOFTRDMA_BIN", &exe)
        .env("SOFTRDMA_NO_AUTOSTART", "1")
        .output()
        .expect("run cm_bad_input");
    let report = text(&o);
    assert!(o.status.success(), "cm_bad_input: {}\n{report}", o.status);
    assert!(report.contains("# 48 checks, 0 failed"), "{report}");

    let s = Command::new(&exe)
        .args(["stat", DEVICE, "--json"])
        .env("SOFTRDMA_RUNTIME_DIR", &runtime)
        .output()
        .expect("softrdma stat");
    assert!(s.status.success(), "softrdma stat: {}", text(&s));
    let v: serde_json::Value = serde_json::from_slice(&s.stdout).expect("stat --json is JSON");
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    // The consumer's rejects (one for the IB_PATH connection) and the request destroyed before
    // its accept: three REJs; one
    // connection established on each side; nothing malformed or lost on the way.
    assert_eq!(n("cm_rejs_sent"), 3, "{v}");
    // Every route step goes to the same destination: one lookup, the rest from the path cache
    // (plus one more lookup per entry a change in the host's routes dropped meanwhile); the path
    // the program set itself went around it.
    let (misses, dropped) = (n("path_cache_misses"), n("path_cache_invalidated"));
    assert!(misses >= 1 && misses <= 1 + dropped, "{v}");
    assert_eq!((n("path_cache_entries"), n("paths_set_explicitly")), (1, 1), "{v}");
    assert!(n("path_cache_hits") >= 1, "{v}");
    assert_eq!(n("cm_established"), 2, "{v}");
    assert_eq!((n("cm_mads_malformed"), n("cm_reqs_dropped"), n("cm_events_dropped")), (0, 0, 0), "{v}");
    println!("{report}");
}
