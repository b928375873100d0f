//! Replay of captures and built conversations against the engine under each profile.

use std::path::PathBuf;

use crate::{PcapWriter, Reader, Record, Resolution};
use softrdma_engine::rng::Rng;

use super::*;

fn capture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures").join(name)
}

fn opts(profile: &str) -> Options {
    Options { side: Side::Both, behaviour: WireProfile::by_name(profile).unwrap(), recv_depth: None }
}

fn run(name: &str, profile: &str) -> ReplayReport {
    replay_file(&capture(name), &opts(profile)).expect("capture readable")
}

fn records(name: &str) -> Vec<Record> {
    Reader::open(capture(name)).unwrap().map(|r| r.unwrap()).collect()
}

fn write(records: &[Record]) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    let mut w = PcapWriter::with_linktype(
        std::fs::File::create(f.path()).unwrap(),
        Resolution::Nano,
        records[0].linktype,
        65535,
    )
    .unwrap();
    for r in records {
        w.write_packet(r.timestamp_ns, &r.data, r.orig_len).unwrap();
    }
    w.finish().unwrap();
    f
}

/// Every shared capture with whole RC conversations, at its floor (the figures of INTEROP.md,
/// "Replaying the shared captures"): the hardware (ConnectX) captures match under `cx`, the
/// rxe ones under `rxe`, and each matches worse under the other profile.
#[test]
fn every_shared_capture_replays_at_its_floor() {
    // (file, the profile it was recorded under, answers compared at least, matched at least)
    let floors = [
        ("write.pcap", "cx", 17, 16),
        ("read2.pcap", "cx", 13, 12),
        ("send.pcap", "cx", 9, 8),
        ("nvme-discover2.pcap", "cx", 31, 31),
        ("nvme-rdma-idle.pcap", "cx", 4, 4),
        ("rocev2_test.pcap", "cx", 133, 133),
        ("rocev2-2_test.pcap", "cx", 116, 116),
        ("rxe-2guests-all.pcap", "rxe", 800, 800),
        ("rxe-rc-ud-pingpong-n20.pcap", "rxe", 244, 244),
        ("rxe-guest-vs-hostpy-badicrc-n5.pcap", "rxe", 50, 50),
    ];
    for (file, own, expected, matched) in floors {
        let r = run(file, own);
        assert!(r.answers_expected >= expected, "{file}: {} answers compared, floor {expected}", r.answers_expected);
        assert!(
            r.answers_matched >= matched,
            "{file} under {own}: {} of {} match, floor {matched}\n{}",
            r.answers_matched,
            r.answers_expected,
            text(&r)
        );
        let other = run(file, if own == "cx" { "rxe" } else { "cx" });
        assert_eq!(other.answers_expected, r.answers_expected, "{file}: the profile changes what is compared");
        assert!(other.answers_matched < r.answers_matched, "{file}: the other profile matches as well");
        // Under the other profile the difference is the profiles' MigReq choice, named.
        assert!(other.mismatch_fields.contains_key("MigReq"), "{file}: {:?}", other.mismatch_fields);
    }
}

#[test]
fn captures_that_cannot_be_replayed_say_why() {
    for (file, why) in [
        ("rocev1_test.pcap", "RoCEv1"),
        ("rc-small.pcap", "bad ICRC"),
        ("uc-sg.pcap", "bad ICRC"),
        ("dc-small.pcap", ""),
        ("rdma-nccl2.pcap", ""),
    ] {
        let r = run(file, "cx");
        assert!(!r.conversations.is_empty(), "{file}");
        assert_eq!(r.answers_expected, 0, "{file}");
        for c in &r.conversations {
            let reason = c.not_replayable.as_deref().unwrap_or_else(|| panic!("{file}: {c:?}"));
            assert!(reason.contains(why), "{file}: {reason}");
        }
    }
    // The truncated NCCL capture: UC conversations with cut frames, UD ones not modelled.
    let r = run("rdma-nccl2.pcap", "cx");
    assert!(r.conversations.iter().any(|c| c.not_replayable.as_deref().unwrap().contains("snap length")));
}

/// The comparison can fail: an ACK whose MSN was changed in the capture is a mismatch naming
/// the frame and the field, and a request softrdma would NAK shows softrdma's answer.
#[test]
fn a_changed_answer_is_a_mismatch() {
    let mut cap = behaviour::load(&capture("write.pcap")).unwrap();
    // Frame 5: the ACK of the first SEND (msn 1).
    let ack = cap.packets.iter_mut().find(|p| p.frame == 5).unwrap();
    assert_eq!(ack.ib.headers.aeth.unwrap().msn.value(), 1);
    ack.ib_bytes[bth::HEADER_LEN + 3] = 7;
    let before = run("write.pcap", "cx");
    let r = replay("write.pcap", &cap, &opts("cx"));
    let m: Vec<&Mismatch> =
        r.conversations.iter().filter(|c| c.transport == "RC").flat_map(|c| &c.mismatches).collect();
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(
        (m[0].frame, m[0].field.as_str(), m[0].recorded.as_str(), m[0].softrdma.as_str()),
        (Some(5), "MSN", "7", "1")
    );
    assert_eq!(r.answers_matched + 1, before.answers_matched);
    assert_eq!(r.answers_expected, before.answers_expected);
}

/// The CM messages: under cx the REP and REQ agree with the ConnectX host's except the REQ's
/// flow label (that host's rdma_cm sent 0; Linux's computes it from the ports, as softrdma
/// does and as the NVMe host of nvme-discover2 did); under rxe the CM response timeouts (20
/// against 22) and the REP's target ACK delay (15 against 16) differ.
#[test]
fn cm_messages_are_compared() {
    let cm = |r: &ReplayReport| -> Vec<ConversationReport> {
        r.conversations.iter().filter(|c| c.transport == "CM").cloned().collect()
    };
    let cx = run("write.pcap", "cx");
    let convs = cm(&cx);
    assert_eq!(convs.len(), 2, "{}", text(&cx));
    // As responder: REP, then the DREP answering the active side's DREQ (or the DREQ).
    let passive = convs.iter().find(|c| c.role == "responder").unwrap();
    assert!(passive.answers_expected >= 2 && passive.answers_matched == passive.answers_expected, "{passive:?}");
    let active = convs.iter().find(|c| c.role == "requester").unwrap();
    let m: Vec<(&str, &str, &str)> =
        active.mismatches.iter().map(|m| (m.field.as_str(), m.recorded.as_str(), m.softrdma.as_str())).collect();
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!((m[0].0, m[0].1), ("REQ primary path flow label", "0x0"));
    assert_eq!(run("nvme-discover2.pcap", "cx").mismatch_fields.len(), 0);
    let rxe = run("write.pcap", "rxe");
    let f = |field: &str| -> Vec<(String, String)> {
        cm(&rxe)
            .iter()
            .flat_map(|c| c.mismatches.clone())
            .filter(|m| m.field == field)
            .map(|m| (m.recorded, m.softrdma))
            .collect()
    };
    assert_eq!(f("REP target ACK delay"), [("16".to_string(), "15".to_string())]);
    assert_eq!(f("REQ remote CM response timeout"), [("22".to_string(), "20".to_string())]);
}

/// A trace that starts mid-message, with capture times out of order, duplicated frames and
/// a frame with a bad ICRC: reported, replayed from the first message that starts, no crash.
#[test]
fn odd_traces_are_reported_per_conversation() {
    let mut recs = records("rxe-rc-ud-pingpong-n20.pcap");
    let full = run("rxe-rc-ud-pingpong-n20.pcap", "rxe");
    // Start in the middle (drop the first 40 frames), swap two capture times, duplicate one
    // frame, corrupt one byte of another's payload (its ICRC no longer holds).
    recs.drain(..40);
    let (a, b) = (recs[10].timestamp_ns, recs[11].timestamp_ns);
    recs[10].timestamp_ns = b;
    recs[11].timestamp_ns = a;
    let dup = recs[20].clone();
    recs.insert(21, dup);
    let last = recs[30].data.len() - 8;
    recs[30].data[last] ^= 0xff;
    let f = write(&recs);
    let r = replay_file(f.path(), &opts("rxe")).unwrap();
    assert!(r.answers_expected > 0 && r.answers_expected < full.answers_expected, "{}", text(&r));
    assert!(r.answers_matched > 0);
    let setup: Vec<&String> = r.conversations.iter().flat_map(|c| &c.setup).collect();
    assert!(setup.iter().any(|s| s.contains("mid-message") || s.contains("first packet that starts")), "{setup:?}");
}

/// A pcapng file with the frames spread over two interfaces replays as the classic file.
#[test]
fn pcapng_with_two_interfaces() {
    fn block(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
        let len = 12 + body.len().div_ceil(4) * 4;
        out.extend(kind.to_le_bytes());
        out.extend((len as u32).to_le_bytes());
        out.extend(body);
        out.resize(out.len() + (body.len().div_ceil(4) * 4 - body.len()), 0);
        out.extend((len as u32).to_le_bytes());
    }
    let recs = records("write.pcap");
    let mut ng = Vec::new();
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend([1u8, 0, 0, 0]);
    shb.extend((-1i64).to_le_bytes());
    block(&mut ng, 0x0a0d_0d0a, &shb);
    for _ in 0..2 {
        let mut idb = 1u16.to_le_bytes().to_vec(); // Ethernet
        idb.extend([0, 0]);
        idb.extend(65535u32.to_le_bytes());
        block(&mut ng, 1, &idb);
    }
    for (i, r) in recs.iter().enumerate() {
        let us = r.timestamp_ns / 1000;
        let mut epb = (i as u32 % 2).to_le_bytes().to_vec();
        epb.extend(((us >> 32) as u32).to_le_bytes());
        epb.extend((us as u32).to_le_bytes());
        epb.extend((r.data.len() as u32).to_le_bytes());
        epb.extend(r.orig_len.to_le_bytes());
        epb.extend(&r.data);
        epb.resize(20 + r.data.len().div_ceil(4) * 4, 0);
        block(&mut ng, 6, &epb);
    }
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &ng).unwrap();
    let r = replay_file(f.path(), &opts("cx")).unwrap();
    let classic = run("write.pcap", "cx");
    assert_eq!((r.answers_expected, r.answers_matched), (classic.answers_expected, classic.answers_matched));
}

/// Damaged input never panics: frames cut, bytes flipped, frames dropped, repeated and
/// reordered, seeded; each run either reports or gives reasons.
#[test]
fn damaged_captures_never_panic() {
    let mut rng = Rng::new(20);
    for name in ["write.pcap", "nvme-discover2.pcap", "rxe-rc-ud-pingpong-n20.pcap", "read2.pcap"] {
        let base = records(name);
        for _ in 0..60 {
            let mut recs = base.clone();
            for _ in 0..(1 + rng.next_u32() % 6) {
                let i = rng.next_u32() as usize % recs.len();
                match rng.next_u32() % 5 {
                    0 => {
                        let n = rng.next_u32() as usize % (recs[i].data.len() + 1);
                        recs[i].data.truncate(n);
                    }
                    1 if !recs[i].data.is_empty() => {
                        let j = rng.next_u32() as usize % recs[i].data.len();
                        recs[i].data[j] ^= 1 << (rng.next_u32() % 8);
                    }
                    2 if recs.len() > 1 => {
                        recs.remove(i);
                    }
                    3 => {
                        let r = recs[i].clone();
                        recs.insert(i, r);
                    }
                    _ => {
                        let j = rng.next_u32() as usize % recs.len();
                        recs.swap(i, j);
                    }
                }
            }
            let f = write(&recs);
            for profile in ["rxe", "cx"] {
                let r = replay_file(f.path(), &opts(profile)).unwrap();
                assert!(r.answers_matched <= r.answers_expected);
                let _ = text(&r);
            }
        }
    }
}

/// The inputs fuzzing found kept as regression cases (fuzz/regressions/read_capture/) replay
/// to the end under both profiles. One sent a responder QP to the error state; the replay
/// then posted receives until its queue was full, which a QP in error never is.
#[test]
fn the_fuzzers_regression_captures_replay_to_the_end() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/read_capture");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        for profile in ["rxe", "cx"] {
            if let Ok(r) = replay_file(&path, &opts(profile)) {
                assert!(r.answers_matched <= r.answers_expected);
            }
        }
        n += 1;
    }
    assert!(n >= 1);
}

/// Garbage bytes as a capture: an error naming the file, not a panic.
#[test]
fn garbage_is_an_error() {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), b"this is not a capture file at all").unwrap();
    assert!(replay_file(f.path(), &opts("rxe")).is_err());
}

/// Sets the credit codes of the ACKs of the conversation whose responder is `responder`, in
/// order (the parsed AETH and the bytes both).
fn set_ack_credits(cap: &mut Capture, responder: &str, codes: &[u8]) {
    let who: IpAddr = responder.parse().unwrap();
    let mut acks = cap.packets.iter_mut().filter(|p| {
        p.ib.src.to_canonical() == who
            && p.ib.headers.bth.is_some_and(|b| b.opcode == Opcode::RC_ACKNOWLEDGE)
            && p.ib.headers.aeth.is_some()
    });
    for &code in codes {
        let p = acks.next().expect("an ACK to edit");
        let mut a = p.ib.headers.aeth.unwrap();
        a.syndrome = Syndrome::Ack { credits: code };
        p.ib.headers.aeth = Some(a);
        p.ib_bytes[bth::HEADER_LEN] = code;
    }
}

fn credit_mismatches(r: &ReplayReport) -> Vec<&Mismatch> {
    r.conversations
        .iter()
        .filter(|c| c.transport == "RC")
        .flat_map(|c| &c.mismatches)
        .filter(|m| m.field == "credits" || m.recorded.contains("credits") || m.softrdma.contains("credits"))
        .collect()
}

/// Issue 55, part 3: a responder whose application posted its receives late advertises credit
/// counts that fall (4, 3, 2 WQEs left after three SENDs) and then rise (4 after the fourth,
/// three posted at once). A replay that keeps the queue at one depth reports "recorded 0x03,
/// softrdma 0x04"; the replay posts by the schedule the counts imply and matches every answer.
#[test]
fn credits_that_a_late_posting_schedule_explains_match() {
    let before = run("nvme-discover2.pcap", "cx");
    let mut cap = behaviour::load(&capture("nvme-discover2.pcap")).unwrap();
    set_ack_credits(&mut cap, "172.16.0.103", &[4, 3, 2, 4]);
    let r = replay("nvme-discover2.pcap", &cap, &opts("cx"));
    assert!(credit_mismatches(&r).is_empty(), "{}", text(&r));
    assert_eq!((r.answers_matched, r.answers_expected), (before.answers_matched, before.answers_expected));
    let setup: Vec<&String> = r.conversations.iter().flat_map(|c| &c.setup).collect();
    assert!(
        setup.iter().any(|s| s.contains("the schedule the recorded credit counts imply") && s.contains("5 by PSN")),
        "{setup:?}"
    );
}

/// A sequence no posting schedule explains (two receives gone for one SEND: 4 left, then 2) is
/// a real mismatch, and says why.
#[test]
fn credits_that_no_schedule_explains_are_a_mismatch() {
    let mut cap = behaviour::load(&capture("nvme-discover2.pcap")).unwrap();
    set_ack_credits(&mut cap, "172.16.0.103", &[4, 2]);
    let r = replay("nvme-discover2.pcap", &cap, &opts("cx"));
    let m = credit_mismatches(&r);
    assert!(
        m.iter()
            .any(|m| m.field == "credits"
                && m.softrdma.contains("no receive-posting schedule explains credit code 0x02")),
        "{m:?}"
    );
}
