//! Real captures (../shared/captures, recorded on ConnectX hardware and on Linux rxe): every one
//! decodes; the ICRC verifies on every IB frame of the valid ones and fails on every frame of the
//! three whose headers were rewritten after capture; rdma-nccl2's frames cut by its 229-byte snap
//! length are reported truncated, not malformed.

use std::path::Path;

use softrdma_conformance::shared_dir;
use softrdma_pcap::analyze::{summarize, CheckReport};
use softrdma_pcap::Reader;

fn report(name: &str) -> CheckReport {
    let path = shared_dir().join("captures").join(name);
    check(&path)
}

fn check(path: &Path) -> CheckReport {
    let mut r = CheckReport::default();
    for rec in Reader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        let rec = rec.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        r.add(&summarize(rec.index, rec.linktype, &rec.data, rec.is_truncated()));
    }
    r
}

/// (file, frames, IB frames) for the captures whose every IB frame must verify.
const VALID: &[(&str, u64, u64)] = &[
    ("rocev2_test.pcap", 708, 708),
    ("rocev2-2_test.pcap", 641, 641),
    ("rocev1_test.pcap", 624, 624),
    ("write.pcap", 17, 17),
    ("read2.pcap", 16, 13), // 3 SMB/TCP frames
    ("send.pcap", 9, 9),
    ("nvme-discover2.pcap", 31, 31),
    ("nvme-rdma-idle.pcap", 4, 4),
    ("rxe-2guests-all.pcap", 824, 800),
    ("rxe-rc-ud-pingpong-n20.pcap", 273, 248),
];

#[test]
fn valid_captures_verify_on_every_frame() {
    for &(name, frames, ib) in VALID {
        let r = report(name);
        assert_eq!((r.frames, r.ib_packets), (frames, ib), "{name}: frame counts");
        assert_eq!(r.bad_icrc, 0, "{name}: {:?}", r.first_problems);
        assert_eq!(r.malformed, 0, "{name}: {:?}", r.first_problems);
        assert_eq!(r.icrc_unchecked, 0, "{name}");
        assert!(r.is_clean());
    }
}

#[test]
fn rocev1_capture_holds_both_versions() {
    let path = shared_dir().join("captures/rocev1_test.pcap");
    let (mut v1, mut v2) = (0, 0);
    for rec in Reader::open(&path).unwrap() {
        let rec = rec.unwrap();
        let s = summarize(rec.index, rec.linktype, &rec.data, rec.is_truncated());
        let ib = s.ib.expect("every frame is IB");
        assert!(ib.icrc_ok);
        match ib.l3.name() {
            "grh" => v1 += 1,
            _ => v2 += 1,
        }
    }
    assert_eq!((v1, v2), (323, 301));
}

#[test]
fn rewritten_captures_fail_on_every_frame() {
    for (name, frames) in [("dc-small.pcap", 19), ("rc-small.pcap", 21), ("uc-sg.pcap", 17)] {
        let r = report(name);
        assert_eq!(r.frames, frames, "{name}");
        assert_eq!(r.ib_packets, frames, "{name}");
        assert_eq!(r.bad_icrc, frames, "{name}: every frame's ICRC must fail");
        assert!(!r.is_clean());
    }
}

#[test]
fn rxe_capture_with_corrupted_icrc() {
    let r = report("rxe-guest-vs-hostpy-badicrc-n5.pcap");
    assert_eq!((r.frames, r.ib_packets), (71, 54));
    assert_eq!(r.bad_icrc, 4, "the responder corrupted exactly 4 packets");
    assert_eq!(r.malformed, 0);
}

#[test]
fn nccl_capture_reports_truncated_frames() {
    // The frames are cut at 229 bytes of IP while the record lengths were rewritten to match, so
    // the truncation shows as an IP total length beyond the captured bytes.
    let r = report("rdma-nccl2.pcap");
    assert_eq!((r.frames, r.ib_packets), (520, 509));
    assert_eq!(r.truncated, 489);
    assert_eq!(r.icrc_unchecked, 489);
    assert_eq!(r.malformed, 0, "{:?}", r.first_problems);
    // The 20 complete IB frames carry ICRCs that do not verify (the independent Python check of
    // ../shared/reference/wire/analyze_capture.py agrees: 20 bad, 489 truncated).
    assert_eq!(r.bad_icrc, 20, "{:?}", r.first_problems);
    assert!(r.opcodes.contains_key(&0x29), "UC RDMA WRITE_LAST_WITH_IMMEDIATE seen");
    assert!(r.opcodes.contains_key(&0x65), "UD SEND_ONLY_WITH_IMMEDIATE seen");
}

#[test]
fn every_capture_decodes() {
    let mut n = 0;
    for e in std::fs::read_dir(shared_dir().join("captures")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "pcap") {
            let r = check(&p);
            assert!(r.frames > 0, "{}", p.display());
            n += 1;
        }
    }
    assert!(n >= 15);
}

/// The independent ICRC check of ../shared/reference/wire/analyze_capture.py (Python, zlib)
/// counts the same good, bad and unverifiable frames in every capture.
#[test]
fn icrc_counts_agree_with_the_python_oracle() {
    let script = shared_dir().join("reference/wire/analyze_capture.py");
    let mut files: Vec<_> = std::fs::read_dir(shared_dir().join("captures"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    for f in files {
        let out = std::process::Command::new("python3").arg(&script).arg(&f).output().expect("python3");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let icrc = &v["icrc"];
        let n = |k: &str| icrc.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        let good = n("v2_ok") + n("v2v6_ok") + n("v1_ok");
        let bad = n("v2_BAD") + n("v2v6_BAD") + n("v1_BAD");
        let cut = n("v2_truncated") + n("v1_truncated");
        let r = check(&f);
        assert_eq!((r.good_icrc, r.bad_icrc, r.icrc_unchecked), (good, bad, cut), "{}", f.display());
    }
}

/// A receiver behind a plain UDP socket cannot see the sender's IPv4 ID, which the ICRC covers;
/// the linear solve finds it. On every intact IPv4 frame of the real captures (hardware and rxe,
/// whose IDs change per packet) the ID found is the one on the wire; on the three captures whose
/// headers were rewritten after capture, no ID explains the ICRC.
#[test]
fn icrc_solve_recovers_the_ipv4_id_of_real_traffic() {
    use softrdma_engine::wire::icrc::solve_ipv4_id;
    use softrdma_engine::wire::roce::{dissect, L3Repr};
    let mut solved = 0;
    let mut nonzero = 0;
    for name in VALID.iter().map(|v| v.0).chain(["dc-small.pcap", "rc-small.pcap", "uc-sg.pcap"]) {
        let bad = ["dc-small.pcap", "rc-small.pcap", "uc-sg.pcap"].contains(&name);
        for rec in Reader::open(shared_dir().join("captures").join(name)).unwrap() {
            let rec = rec.unwrap();
            let d = dissect(&rec.data);
            let Some(L3Repr::Ipv4(ip)) = d.l3 else { continue };
            if !d.is_complete() {
                continue;
            }
            let hl = d.l3_bytes.len() - d.ib_bytes.len();
            let mut headers = d.l3_bytes[..hl].to_vec();
            headers[4] = 0;
            headers[5] = 0;
            let got = solve_ipv4_id(&headers, d.ib_bytes);
            if bad {
                assert_eq!(got, None, "{name} frame {}", rec.index);
            } else {
                assert_eq!(got, Some(ip.ident), "{name} frame {}", rec.index);
                solved += 1;
                nonzero += usize::from(ip.ident != 0);
            }
        }
    }
    assert!(solved > 2000 && nonzero > 1000, "{solved} solved, {nonzero} with a non-zero ID");
}
