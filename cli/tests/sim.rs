//! `softrdma sim` as a user runs it.

use std::process::Command;

use serde_json::Value;

fn sim(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma")).arg("sim").args(args).output().expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `softrdma sim` with the arguments of `command_line` (separated by white space), which must
/// succeed (`what` leads the message if it does not), and reads the one JSON object it prints.
#[track_caller]
fn sim_json(command_line: &str, what: &str) -> Value {
    let args: Vec<&str> = command_line.split_whitespace().collect();
    let (code, out, err) = sim(&args);
    assert_eq!(code, Some(0), "{what}{out}\n{err}");
    serde_json::from_str(out.trim()).expect("one JSON object")
}

/// Every one of the `n` messages of a report completed, none lost, duplicated or delivered
/// corrupted.
#[track_caller]
fn assert_exactly_once(v: &Value, n: u64) {
    assert_eq!((v["posted"].as_u64(), v["completed_ok"].as_u64()), (Some(n), Some(n)));
    assert_eq!(
        (v["lost"].as_u64(), v["duplicated"].as_u64(), v["corrupted_delivered"].as_u64()),
        (Some(0), Some(0), Some(0))
    );
}

#[test]
fn lossy_run_prints_one_json_object_with_every_field() {
    let v = sim_json(
        "--transport rc --ops send,write,read,atomic --messages 300 --size 1..3000 --qps 3 \
         --loss 0.02 --duplicate 0.02 --reorder 0.02 --corrupt 0.01 --seed 11 --mtu 1024",
        "",
    );
    for k in [
        "posted",
        "completed_ok",
        "completed_err",
        "bytes_verified",
        "lost",
        "duplicated",
        "out_of_order",
        "corrupted_delivered",
        "retransmitted_packets",
        "naks_sent",
        "virtual_time_ns",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["posted"], 300);
    assert_eq!(v["completed_ok"], 300);
    assert_eq!(v["lost"], 0);
    assert_eq!(v["corrupted_delivered"], 0);
    assert!(v["retransmitted_packets"].as_u64().unwrap() > 0, "2% loss makes retransmissions");
    assert!(v["naks_sent"]["psn_sequence"].as_u64().unwrap() > 0);
    assert!(v["wire"]["corrupted"].as_u64().unwrap() > 0);
}

#[test]
fn same_seed_same_result() {
    let a = sim(&["--messages", "100", "--loss", "0.05", "--seed", "5"]).1;
    let b = sim(&["--messages", "100", "--loss", "0.05", "--seed", "5"]).1;
    assert_eq!(a, b);
    let c = sim(&["--messages", "100", "--loss", "0.05", "--seed", "6"]).1;
    assert_ne!(a, c);
}

#[test]
fn hopeless_loss_ends_in_retry_exhaustion_not_a_hang() {
    let (code, out, _) = sim(&["--messages", "20", "--loss", "0.9", "--retry-cnt", "1", "--qps", "1"]);
    assert_eq!(code, Some(0), "errors in IBTA order are not violations: {out}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["completed_err"]["RetryExcErr"], 1);
    assert_eq!(v["completed_err"]["WrFlushErr"].as_u64().unwrap() + v["completed_ok"].as_u64().unwrap() + 1, 20);
}

#[test]
fn bad_arguments_are_clear_errors() {
    // The arguments, and what the error says.
    let cases: [(&[&str], &str); 4] = [
        (&["--transport", "rd"], "use rc, uc, ud or xrc"),
        (&["--loss", "1.5"], "probability"),
        (&["--mtu", "1500"], "--mtu"),
        (&["--ops", "send,teleport"], "teleport"),
    ];
    for (args, says) in cases {
        let (code, _, err) = sim(args);
        assert_eq!(code, Some(2), "{args:?}");
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn xrc_fan_in_under_faults_is_exactly_once() {
    let v = sim_json(
        "--transport xrc --initiators 3 --srqs 4 --messages 200 \
         --loss 0.03 --dup 0.03 --reorder 0.03 --corrupt 0.02 --seed 21",
        "",
    );
    assert_exactly_once(&v, 200);
    assert!(v["retransmitted_packets"].as_u64().unwrap() > 0);
}

#[test]
fn ud_and_uc_report_what_the_wire_did() {
    for t in ["ud", "uc"] {
        let v = sim_json(
            &format!("--transport {t} --messages 300 --loss 0.05 --duplicate 0.05 --seed 3"),
            &format!("{t}: "),
        );
        assert!(v["lost"].as_u64().unwrap() > 0, "{t}: losses show");
        assert_eq!(v["corrupted_delivered"], 0);
        if t == "ud" {
            // A duplicated datagram is delivered twice: duplicates equal the wire's.
            assert_eq!(v["duplicated"], v["wire"]["duplicated"]);
        }
    }
    // On a perfect wire nothing is lost or duplicated.
    for t in ["ud", "uc"] {
        let v: Value =
            serde_json::from_str(sim(&["--transport", t, "--messages", "200", "--seed", "3"]).1.trim()).unwrap();
        assert_eq!((v["lost"].as_u64(), v["duplicated"].as_u64()), (Some(0), Some(0)), "{t}");
    }
}

#[test]
fn xrc_and_uc_carry_rdma_and_zero_length_messages() {
    // XRC: every operation through the target QPs, sizes from 0, under faults: exactly once.
    let v = sim_json(
        "--transport xrc --ops send,write,read,atomic --size 0..2000 --messages 300 \
         --loss 0.03 --duplicate 0.03 --reorder 0.03 --corrupt 0.02 --seed 8",
        "",
    );
    assert_exactly_once(&v, 300);
    assert!(v["bytes_verified"].as_u64().unwrap() > 0);
    // Zero-length messages only, on every transport.
    for t in ["rc", "xrc", "uc", "ud"] {
        let v = sim_json(&format!("--transport {t} --size 0..0 --messages 100 --seed 2"), &format!("{t}: "));
        assert_eq!((v["completed_ok"].as_u64(), v["lost"].as_u64()), (Some(100), Some(0)), "{t}");
    }
    // UC WRITE on a perfect wire: every byte in place.
    let v = sim_json("--transport uc --ops write --messages 100 --seed 2", "");
    assert!(v["bytes_verified"].as_u64().unwrap() > 0, "{v}");
    // What a service does not carry is refused by name.
    let (code, _, err) = sim(&["--transport", "ud", "--ops", "write"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("Write is not part of the Ud workload"), "{err}");
}

#[test]
fn dup_is_an_alias_of_duplicate() {
    let args = |flag| ["--messages", "200", "--loss", "0.02", flag, "0.05", "--reorder", "0.02", "--seed", "5"];
    let (code, canonical, err) = sim(&args("--duplicate"));
    assert_eq!(code, Some(0), "{canonical}\n{err}");
    let v: Value = serde_json::from_str(canonical.trim()).unwrap();
    assert!(v["wire"]["duplicated"].as_u64().unwrap() > 0, "{canonical}");
    assert_eq!(sim(&args("--dup")).1, canonical);
    let (code, _, err) = sim(&["--duplicate", "1.5"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--duplicate must be a probability"), "{err}");
}
