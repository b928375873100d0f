//! `softrdma doctor`: passes on a machine that has what softrdma needs (this one), and names each
//! problem made on purpose: a taken UDP port, a runtime dir others can enter, an address that is
//! not this machine's.

use std::net::UdpSocket;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn doctor(rt: &std::path::Path, args: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .env("SOFTRDMA_RUNTIME_DIR", rt)
        .arg("doctor")
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), v)
}

fn check<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} in {v}"))
}

/// A loopback address of its own for this test (127.0.0.0/8 is all loopback).
const ADDR: &str = "127.0.0.61";

#[test]
fn passes_here_with_every_check_named() {
    let t = tempfile::tempdir().unwrap();
    let rt = t.path().join("rt");
    let (code, v) = doctor(&rt, &["--addr", ADDR, "--port", "47961"]);
    for name in ["runtime dir", "udp port", "multicast", "namespaces", "ptrace scope", "memlock", "udp gso/gro"] {
        let c = check(&v, name);
        assert_ne!(c["status"], "fail", "{c}");
    }
    assert_eq!(v["failed"], 0, "{v}");
    assert_eq!(code, 0);
    // It made the runtime dir, private.
    assert_eq!(std::fs::metadata(&rt).unwrap().permissions().mode() & 0o777, 0o700);
}

#[test]
fn a_taken_port_fails_and_says_how_to_find_the_holder() {
    let t = tempfile::tempdir().unwrap();
    let _holder = UdpSocket::bind((ADDR, 47962)).unwrap();
    let (code, v) = doctor(&t.path().join("rt"), &["--addr", ADDR, "--port", "47962"]);
    let c = check(&v, "udp port");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(c["detail"].as_str().unwrap().contains("47962"), "{c}");
    assert!(c["fix"].as_str().unwrap().contains("ss -ulpn"), "{c}");
    assert_eq!(v["failed"], 1, "{v}");
    assert_eq!(code, 1);
}

#[test]
fn a_runtime_dir_others_can_enter_fails_naming_its_mode() {
    let t = tempfile::tempdir().unwrap();
    let rt = t.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, v) = doctor(&rt, &["--addr", ADDR, "--port", "47963"]);
    let c = check(&v, "runtime dir");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(c["detail"].as_str().unwrap().contains("755"), "{c}");
    assert!(c["fix"].as_str().unwrap().contains("chmod 700"), "{c}");
    assert_eq!(code, 1);
}

#[test]
fn an_address_not_of_this_machine_fails() {
    let t = tempfile::tempdir().unwrap();
    let (code, v) = doctor(&t.path().join("rt"), &["--addr", "192.0.2.77"]);
    let c = check(&v, "udp port");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(c["detail"].as_str().unwrap().contains("not an address of this machine"), "{c}");
    assert_eq!(code, 1);
}
