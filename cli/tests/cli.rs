//! The `softrdma` command as a user runs it: demo, pcap decode (text and JSON), check, generate.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn softrdma(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma")).args(args).output().expect("run softrdma")
}

fn shared(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared").join(rel);
    p.to_string_lossy().into_owned()
}

fn tmp(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("softrdma-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name).to_string_lossy().into_owned()
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

#[test]
fn pcap_sample_builds_decodes_and_checks_its_own_capture() {
    let path = tmp("demo.pcap");
    let out = softrdma(&["pcap", "sample", "-w", &path]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("verdict         OK"), "{text}");
    assert!(text.contains("RC_RDMA_READ_RESPONSE_FIRST") && text.contains("XRC_SEND_ONLY") && text.contains("CNP"));
    // The file it wrote is a real capture that check accepts on its own.
    let out = softrdma(&["pcap", "check", &path]);
    assert!(out.status.success());
    let json = json_lines(&softrdma(&["pcap", "decode", &path, "--json"]));
    assert!(json.len() > 15);
    assert!(json.iter().all(|f| f["ib"] == true && f["icrc_ok"] == true && f["error"].is_null()));
}

#[test]
fn decode_json_of_the_coverage_set() {
    let out = softrdma(&["pcap", "decode", &shared("reference/wire/golden/coverage.pcap"), "--json"]);
    assert!(out.status.success());
    let f = json_lines(&out);
    assert_eq!(f.len(), 21);
    // Frame 1: an ACK with the "no credits" code.
    assert_eq!(f[0]["frame"], 1);
    assert_eq!(f[0]["l3"], "ipv4");
    assert_eq!(f[0]["src"], "192.0.2.2");
    assert_eq!(f[0]["dport"], 4791);
    assert_eq!(f[0]["opcode"], 17);
    assert_eq!(f[0]["opcode_name"], "RC_ACKNOWLEDGE");
    assert_eq!(f[0]["aeth"]["syndrome"], 0x1f);
    assert_eq!(f[0]["aeth"]["msn"], 1);
    assert_eq!(f[0]["icrc"], "e0169bc6");
    assert_eq!(f[0]["icrc_ok"], true);
    assert_eq!(f[0]["truncated"], false);
    assert!(f[0]["error"].is_null());
    assert!(f[0].get("reth").is_none());
    // Frame 7: CMP_SWAP with AtomicETH.
    assert_eq!(f[6]["atomiceth"]["va"], 0x3000);
    assert_eq!(f[6]["atomiceth"]["swap_add"], 0x1111);
    assert_eq!(f[6]["atomiceth"]["compare"], 0x2222);
    // Frame 9: atomic ACK.
    assert_eq!(f[8]["atomicacketh"]["orig"], 0x2222);
    // Frames 10, 11: ImmDt and IETH as integers.
    assert_eq!(f[9]["immdt"], 0xcafe_babe_u32);
    assert_eq!(f[10]["ieth"], 0x1234);
    // Frame 13: XRC with XRCETH; frame 15: CNP with BECN; frame 16: FECN.
    assert_eq!(f[12]["xrceth"]["srqn"], 0x99);
    assert_eq!(f[12]["opcode_name"], "XRC_SEND_ONLY");
    assert_eq!((f[14]["opcode_name"].as_str(), f[14]["becn"].as_bool()), (Some("CNP"), Some(true)));
    assert_eq!(f[15]["fecn"], true);
    // Frame 17: bad ICRC; 18, 19: malformed; 20: reserved opcode; 21: RoCEv1.
    assert_eq!((f[16]["icrc_ok"].as_bool(), f[16]["icrc"].as_str()), (Some(false), Some("aae4f02d")));
    assert_eq!(f[17]["error"], "BTH truncated");
    assert!(f[17]["opcode"].is_null() && f[17]["psn"].is_null() && f[17]["icrc"].is_null());
    assert_eq!(f[18]["error"], "RETH truncated");
    assert_eq!(f[18]["opcode_name"], "RC_RDMA_WRITE_FIRST");
    assert_eq!(f[19]["opcode"], 0x1f);
    assert_eq!(f[19]["opcode_name"], "RESERVED_0x1f");
    assert_eq!(f[19]["payload_len"], 4);
    assert_eq!(f[20]["l3"], "grh");
    assert_eq!(f[20]["src"], "fe80::1");
    assert!(f[20]["sport"].is_null());
    assert_eq!(f[20]["icrc_ok"], true);
}

#[test]
fn decode_json_golden_g4_and_g5() {
    let f = json_lines(&softrdma(&["pcap", "decode", &shared("reference/wire/golden/golden.pcap"), "--json"]));
    let g4 = &f[3];
    assert_eq!(g4["deth"]["qkey"], 0x1111_1111);
    assert_eq!(g4["deth"]["srcqp"], 0x46);
    assert_eq!(g4["padcnt"], 2);
    assert_eq!(g4["se"], true);
    assert_eq!(g4["payload_len"], 6);
    let g5 = &f[4];
    assert_eq!(g5["l3"], "ipv6");
    assert_eq!(g5["psn"], 0xff_ffff);
    assert_eq!(g5["reth"]["rkey"], 0x1234_5678);
    assert_eq!(g5["reth"]["dmalen"], 8);
    assert_eq!(g5["immdt"], 0xdead_beef_u32);
    assert_eq!(g5["icrc"], "03008677");
}

#[test]
fn decode_cm_mads_of_the_nvme_capture() {
    let f = json_lines(&softrdma(&["pcap", "decode", &shared("captures/nvme-discover2.pcap"), "--json"]));
    // Frame 1: the REQ (values from ../shared/reference/cm/README.md and nvme-discover2.cm.txt).
    let req = &f[0]["cm"];
    assert_eq!((req["attr"].as_str(), req["attr_name"].as_str()), (Some("0x0010"), Some("ConnectRequest")));
    assert_eq!(req["tid"], "0x00000002ccc2ad73");
    assert_eq!(req["local_comm_id"], 0x73ad_c2cc_u32);
    assert!(req.get("remote_comm_id").is_none());
    assert_eq!(req["service_id"], "0x0000000001061144");
    assert_eq!((req["local_qpn"].as_u64(), req["starting_psn"].as_u64()), (Some(0x106), Some(0x53_757f)));
    assert_eq!((req["remote_cm_response_timeout"].as_u64(), req["retry_count"].as_u64()), (Some(22), Some(7)));
    assert_eq!((req["path_mtu"].as_u64(), req["e2e_flow_control"].as_bool()), (Some(3), Some(true)));
    assert_eq!(req["primary_path"]["flow_label"], 0x2bba0);
    assert_eq!(req["primary_path"]["packet_rate"], 6);
    assert_eq!(req["primary_path"]["local_gid"], "::ffff:172.16.0.110");
    assert_eq!(req["cma_hdr"]["port"], 39460);
    assert_eq!(
        (req["cma_hdr"]["src"].as_str(), req["cma_hdr"]["dst"].as_str()),
        (Some("172.16.0.110"), Some("172.16.0.103"))
    );
    // Frame 2: the REP; frame 28: the target's DREQ naming the host's QP.
    let rep = &f[1]["cm"];
    assert_eq!((rep["attr_name"].as_str(), rep["remote_comm_id"].as_u64()), (Some("ConnectReply"), Some(0x73ad_c2cc)));
    assert_eq!((rep["local_qpn"].as_u64(), rep["target_ack_delay"].as_u64()), (Some(0x8ca), Some(16)));
    assert_eq!(rep["private_data"], "000021");
    assert_eq!((f[27]["cm"]["attr"].as_str(), f[27]["cm"]["remote_qpn"].as_u64()), (Some("0x0015"), Some(0x106)));
    // Only the five CM frames have a cm object.
    assert_eq!(f.iter().filter(|x| x.get("cm").is_some()).count(), 5);

    let text =
        String::from_utf8(softrdma(&["pcap", "decode", &shared("captures/nvme-discover2.pcap")]).stdout).unwrap();
    let first = text.lines().next().unwrap();
    assert!(
        first.contains(" CM ConnectRequest comm 0x73adc2cc sid 0x1061144 qpn 0x106 psn 0x53757f ip 172.16.0.110:39460 > 172.16.0.103"),
        "{first}"
    );
}

#[test]
fn non_ib_frames_are_just_numbered() {
    let f = json_lines(&softrdma(&["pcap", "decode", &shared("captures/read2.pcap"), "--json"]));
    let non_ib: Vec<_> = f.iter().filter(|x| x["ib"] == false).collect();
    assert_eq!(non_ib.len(), 3);
    for x in non_ib {
        assert_eq!(x.as_object().unwrap().len(), 2, "{x}");
        assert!(x["frame"].is_u64());
    }
}

#[test]
fn truncated_frames_are_reported() {
    let f = json_lines(&softrdma(&["pcap", "decode", &shared("captures/rdma-nccl2.pcap"), "--json"]));
    let cut: Vec<_> = f.iter().filter(|x| x["truncated"] == true).collect();
    assert_eq!(cut.len(), 489);
    assert!(cut.iter().all(|x| x["icrc"].is_null() && x["error"].is_null() && x["opcode"].is_u64()));
}

#[test]
fn check_exit_status() {
    assert!(softrdma(&["pcap", "check", &shared("reference/wire/golden/golden.pcap")]).status.success());
    assert!(softrdma(&["pcap", "check", &shared("captures/rocev1_test.pcap")]).status.success());
    for bad in ["captures/rc-small.pcap", "captures/uc-sg.pcap", "reference/wire/golden/coverage.pcap"] {
        let out = softrdma(&["pcap", "check", &shared(bad)]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("verdict         FAIL"));
    }
    let out = softrdma(&["pcap", "check", &shared("captures/rc-small.pcap")]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("bad ICRC        21"));
}

#[test]
fn generate_round_trips_in_both_formats() {
    for (name, ng) in [("ops.pcap", false), ("ops.pcapng", true)] {
        let path = tmp(name);
        let mut args = vec!["pcap", "generate", &path, "--seed", "7"];
        if ng {
            args.push("--pcapng");
        }
        assert!(softrdma(&args).status.success());
        let out = softrdma(&["pcap", "check", &path]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        let f = json_lines(&softrdma(&["pcap", "decode", &path, "--json"]));
        assert_eq!(f.len(), 86);
    }
}

#[test]
fn bad_files_fail_clearly() {
    let out = softrdma(&["pcap", "decode", "/nonexistent/x.pcap"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.pcap"));
    // A capture cut in the middle of a record: the frames before it, then an error.
    let data = std::fs::read(shared("captures/send.pcap")).unwrap();
    let cut = tmp("cut.pcap");
    std::fs::write(&cut, &data[..data.len() - 10]).unwrap();
    let out = softrdma(&["pcap", "decode", &cut, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_lines(&out).len(), 8);
    let out = softrdma(&["pcap", "check", &cut]);
    assert_eq!(out.status.code(), Some(1));
    // Not a capture at all.
    let junk = tmp("junk.pcap");
    std::fs::write(&junk, b"definitely not a capture file").unwrap();
    let out = softrdma(&["pcap", "check", &junk]);
    assert_eq!(out.status.code(), Some(2));
}

/// The pcap subcommands the README and docs/capture.md tell users to run are the ones the binary
/// has (a rename of the code's types once renamed `pcap behaviour` to `pcap wire-profile`).
#[test]
fn the_documented_pcap_commands_exist() {
    let out = softrdma(&["pcap", "behaviour", &shared("captures/read2.pcap")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("RC"), "{text}");
    let readme = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    for line in readme.lines().filter(|l| l.trim_start().starts_with("softrdma pcap ")) {
        let sub = line.split_whitespace().nth(2).unwrap();
        let out = softrdma(&["pcap", sub, "--help"]);
        assert!(out.status.success(), "README runs `softrdma pcap {sub}`, which the binary lacks: {line}");
    }
}
