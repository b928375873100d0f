//! What the command-line tests share: running `softrdma` with a private runtime dir, and a
//! device that is stopped when the test ends.

#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// A runtime dir that does not exist yet: softrdma creates it, mode 0700.
pub fn rtdir() -> (tempfile::TempDir, PathBuf) {
    let base = tempfile::tempdir().unwrap();
    let rt = base.path().join("rt");
    (base, rt)
}

/// `softrdma` with `rt` as its runtime dir.
pub fn cmd(rt: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softrdma"));
    c.env("SOFTRDMA_RUNTIME_DIR", rt);
    c
}

/// Runs `softrdma args` to the end.
pub fn run(rt: &Path, args: &[&str]) -> Output {
    cmd(rt).args(args).output().expect("run softrdma")
}

/// What it printed, both streams.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `softrdma stat NAME --json`.
pub fn stat(rt: &Path, name: &str) -> Value {
    let o = run(rt, &["stat", name, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Stops the device when the test ends, pass or fail.
pub struct Up<'a>(pub &'a Path, pub &'a str);

impl Drop for Up<'_> {
    fn drop(&mut self) {
        let _ = run(self.0, &["down", self.1]);
    }
}

/// `softrdma up NAME --addr ADDR --port PORT EXTRA...`, which must succeed.
pub fn up<'a>(rt: &'a Path, name: &'a str, addr: &str, port: u16, extra: &[&str]) -> Up<'a> {
    let port = port.to_string();
    let mut args = vec!["up", name, "--addr", addr, "--port", &port];
    args.extend_from_slice(extra);
    let o = run(rt, &args);
    assert!(o.status.success(), "{}", text(&o));
    Up(rt, name)
}
