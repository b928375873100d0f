//! Devices as processes (`softrdma up/down/list/stat/daemon`) and what they promise their
//! clients: a private runtime dir, a bind failure that names --addr, a client that dies is cleaned
//! up, a malformed client is cut off alone, and an XRC target QP outlives the process that made it.
//!
//! Every test has its own runtime dir and UDP port, so tests run in parallel without meeting.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{cmd, rtdir, run, stat, text, up, Up};

#[test]
fn up_list_stat_down() {
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let g = up(rt, "t1", "127.0.0.1", 47930, &[]);
    // Starting it again finds it running.
    let o = run(rt, &["up", "t1", "--addr", "127.0.0.1", "--port", "47930"]);
    assert!(o.status.success() && text(&o).contains("t1 up on 127.0.0.1"), "{}", text(&o));
    let o = run(rt, &["list", "--json"]);
    let devs: Vec<Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(devs.len(), 1, "{}", text(&o));
    assert_eq!(devs[0]["name"], "t1");
    assert_eq!(devs[0]["addr"], "127.0.0.1");
    // lo has a 64 KiB MTU: rxe's rule gives 4096.
    assert_eq!(devs[0]["active_mtu"], 4096);
    assert_eq!(devs[0]["gid"], "::ffff:127.0.0.1", "GID 0 is the IPv4-mapped RoCEv2 GID");
    assert_eq!(devs[0]["link_layer"], "Ethernet");
    assert_ne!(devs[0]["vendor_id"], "0x2c9", "not Mellanox's vendor id");
    wait_clients(rt, "t1", 0);
    assert_eq!(stat(rt, "t1")["sent_pkts"], 0);
    // The socket and the directory are private.
    let md = std::fs::metadata(rt.join("t1.sock")).unwrap();
    assert_eq!(md.permissions().mode() & 0o077, 0);
    drop(g);
    assert!(run(rt, &["list"]).stdout.is_empty());
    let o = run(rt, &["down", "t1"]);
    assert!(o.status.success() && text(&o).contains("was not running"));
}

#[test]
fn a_taken_address_is_a_clear_error_naming_addr() {
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "t2", "127.0.0.1", 47931, &[]);
    // Another device on the same address and port (as another user's device would be).
    let o = run(rt, &["up", "t3", "--addr", "127.0.0.1", "--port", "47931"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("--addr 127.0.0.1") && t.contains("in use"), "{t}");
    // It names who holds the address: t2's daemon, a process of this user.
    assert!(t.contains("held by pid ") && t.contains("of this user"), "{t}");
    // An address that is not this host's.
    let o = run(rt, &["daemon", "--name", "t4", "--addr", "192.0.2.77", "--port", "47931"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--addr 192.0.2.77"), "{}", text(&o));
    // Bad options are refused before anything starts.
    let o = run(rt, &["up", "t5", "--addr", "127.0.0.1", "--mtu", "1500"]);
    assert!(!o.status.success() && text(&o).contains("--mtu 1500"), "{}", text(&o));
    let o = run(rt, &["up", "t5", "--addr", "127.0.0.1", "--faults", "loss=7"]);
    assert!(!o.status.success() && text(&o).contains("probability"), "{}", text(&o));
    let o = run(rt, &["up", "../x", "--addr", "127.0.0.1"]);
    assert!(!o.status.success() && text(&o).contains("invalid device name"), "{}", text(&o));
}

#[test]
fn a_runtime_dir_others_can_enter_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let rt = base.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = run(&rt, &["list"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("0700"), "{}", text(&o));
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(rt: &Path, dev: &str, file: &Path, role: &str) -> Worker {
        let mut child = cmd(rt)
            .args(["demo-worker", "--device", dev, "--xrcd-file"])
            .arg(file)
            .args(["--role", role, "--messages", "4"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker { child, stdin, stdout }
    }
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l
    }
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_clients(rt: &Path, name: &str, n: u64) {
    let t0 = Instant::now();
    while stat(rt, name)["clients"] != n {
        assert!(t0.elapsed() < Duration::from_secs(10), "clients never went to {n}: {}", stat(rt, name));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn xrc_target_qp_outlives_its_creator_and_dead_clients_are_cleaned_up() {
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    const DEV: &str = "x1";
    let _g = up(rt, DEV, "127.0.0.1", 47932, &[]);
    let file = rt.join("domain");
    // Process 1 creates the domain and the target QP; process 2 joins both.
    let mut w1 = Worker::spawn(rt, DEV, &file, "create");
    let hello: Value = serde_json::from_str(&w1.line()).unwrap_or_else(|e| panic!("{e}: {}", w1.stderr()));
    let qpn = hello["tgt_qpn"].as_u64().unwrap();
    let mut w2 = Worker::spawn(rt, DEV, &file, "join");
    writeln!(w2.stdin, "{qpn}").unwrap();
    let h2: Value = serde_json::from_str(&w2.line()).unwrap();
    assert_eq!(h2["tgt_qpn"], qpn);
    wait_clients(rt, "x1", 2);
    // Process 1 dies without closing anything: its handle on the target QP goes, the QP stays,
    // bound to the domain that process 2 still holds.
    w1.kill();
    wait_clients(rt, "x1", 1);
    let mut w3 = Worker::spawn(rt, DEV, &file, "join");
    writeln!(w3.stdin, "{qpn}").unwrap();
    let h3: Value = serde_json::from_str(&w3.line()).unwrap_or_else(|e| panic!("{e}: {}", w3.stderr()));
    assert_eq!(h3["tgt_qpn"], qpn, "a third process opens the target QP after its creator died");
    // When nobody holds the domain any more it is gone with its target QP: joining without
    // O_CREAT is EAGAIN, as the kernel answers.
    w2.kill();
    w3.kill();
    wait_clients(rt, "x1", 0);
    let mut w4 = Worker::spawn(rt, DEV, &file, "join");
    writeln!(w4.stdin, "{qpn}").unwrap();
    let _ = w4.child.wait();
    let err = w4.stderr();
    assert!(err.contains("EAGAIN"), "{err}");
}

#[test]
fn a_malformed_client_is_cut_off_alone() {
    use std::os::unix::net::UnixStream;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    const DEV: &str = "m1";
    let _g = up(rt, DEV, "127.0.0.1", 47933, &[]);
    let file = rt.join("domain");
    let mut good = Worker::spawn(rt, DEV, &file, "create");
    let _: Value = serde_json::from_str(&good.line()).unwrap();
    // A client that sends garbage after a valid length, and one that claims a huge frame.
    for garbage in [&[5u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff][..], &[0xff, 0xff, 0xff, 0x7f][..]] {
        let mut s = UnixStream::connect(rt.join("m1.sock")).unwrap();
        s.write_all(garbage).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 16];
        use std::io::Read;
        assert_eq!(s.read(&mut b).unwrap_or(0), 0, "the device closes that connection");
    }
    let s = stat(rt, "m1");
    assert_eq!(s["clients"], 1, "only the good client is attached: {s}");
    writeln!(good.stdin, "not an endpoint").unwrap();
    // The good client is still served (it fails on its own bad input, not the device's).
    let _ = good.child.wait();
    wait_clients(rt, DEV, 0);
}

#[test]
fn demo_runs_rc_ud_and_xrc_between_two_daemons_and_checks_everything() {
    // On both data paths: the processes' own QPs (the default), and the daemons'.
    for (datapath, port) in [("provider", "47950"), ("device", "47955")] {
        let base = tempfile::tempdir().unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_softrdma"))
            .args(["demo", "--ops", "24", "--port", port, "--datapath", datapath, "--json", "-w"])
            .arg(base.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{datapath}: {}", text(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["ok"], true, "{v}");
        assert_eq!(v["datapath"], datapath);
        let rows = v["rows"].as_array().unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r["workload"].as_str().unwrap()).collect();
        for w in ["RC SEND", "RC RDMA WRITE", "RC RDMA READ", "RC atomics", "UD SEND", "XRC SEND fan-in"] {
            assert!(names.iter().any(|n| n.starts_with(w)), "{w} missing: {names:?}");
        }
        assert!(rows.iter().all(|r| r["ok"] == true), "{v}");
        // 1% loss on each device: with this many packets some were dropped, and RC recovered.
        let devs = v["devices"].as_array().unwrap();
        assert!(devs.iter().map(|d| d["dropped_by_fault"].as_u64().unwrap()).sum::<u64>() > 0, "{v}");
        assert!(devs.iter().all(|d| d["udp_sent"].as_u64().unwrap() > 0), "{v}");
        for c in v["captures"].as_array().unwrap() {
            assert_eq!(c["all_icrc_valid"], true, "{c}");
            assert!(c["frames"].as_u64().unwrap() > 100, "{c}");
            assert!(Path::new(c["path"].as_str().unwrap()).exists());
        }
    }
}

#[test]
fn concurrent_ups_of_one_device_start_one_daemon() {
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let kids: Vec<_> = (0..4)
        .map(|_| cmd(rt).args(["up", "r1", "--addr", "127.0.0.1", "--port", "47934"]).output())
        .map(|o| o.unwrap())
        .collect();
    // (Started one after another above would not race; start them together:)
    let racing: Vec<_> = (0..4)
        .map(|_| {
            cmd(rt)
                .args(["up", "r2", "--addr", "127.0.0.2", "--port", "47934"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = racing.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let _g1 = Up(rt, "r1");
    let _g2 = Up(rt, "r2");
    for o in kids.iter().chain(&outs) {
        assert!(o.status.success(), "{}", text(o));
    }
    // Every `up` reports the same daemon.
    let pids: std::collections::BTreeSet<String> = outs
        .iter()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split("pid ")
                .nth(1)
                .unwrap_or("")
                .trim()
                .trim_end_matches(')')
                .to_owned()
        })
        .collect();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let o = run(rt, &["list", "--json"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 2);
}

/// Whether device `name`'s daemon still holds its lock (a process that ended released it).
fn daemon_holds_lock(rt: &Path, name: &str) -> bool {
    softrdma_device::runtime::lock_device(rt, name, false).unwrap().is_none()
}

fn wait_ended(rt: &Path, name: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while daemon_holds_lock(rt, name) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[test]
fn a_device_whose_socket_file_is_removed_ends() {
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "gone1", "127.0.0.1", 47941, &[]);
    assert!(daemon_holds_lock(rt, "gone1"));
    // No client can reach it any more (as when its runtime dir is deleted): it ends by itself.
    std::fs::remove_file(rt.join("gone1.sock")).unwrap();
    assert!(wait_ended(rt, "gone1", Duration::from_secs(5)), "the daemon outlived its socket");
    let log = std::fs::read_to_string(rt.join("gone1.log")).unwrap();
    assert!(log.contains("socket file was removed"), "{log}");
}

#[test]
fn an_idle_device_ends_after_its_idle_time_but_not_while_a_client_is_attached() {
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let o = run(rt, &["up", "idle1", "--addr", "127.0.0.1", "--port", "47942", "--idle-exit", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let _g = Up(rt, "idle1");
    // A client attached: the device stays past its idle time.
    let client = softrdma_device::client::Connection::connect_in(rt, "idle1").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(daemon_holds_lock(rt, "idle1"), "ended with a client attached");
    drop(client);
    // The client gone: ended within its idle time (1 s) and the once-a-second check.
    assert!(wait_ended(rt, "idle1", Duration::from_secs(5)), "an idle device did not end");
    let log = std::fs::read_to_string(rt.join("idle1.log")).unwrap();
    assert!(log.contains("no client for 1 s"), "{log}");
    // A device started without --idle-exit does not end by itself.
    let _g2 = up(rt, "idle2", "127.0.0.1", 47943, &[]);
    std::thread::sleep(Duration::from_millis(2500));
    assert!(daemon_holds_lock(rt, "idle2"));
}
