//! The behaviour analysis on the shared captures and on built conversations.

use std::path::PathBuf;

use super::accumulate::{short_name, ShapeBuilder};
use super::text::duration;
use super::*;

fn capture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures").join(name)
}

fn report(name: &str) -> FileReport {
    let cap = load(&capture(name)).expect("capture readable");
    analyse(name, &cap)
}

#[test]
fn shapes_are_built_from_positions() {
    let mut b = ShapeBuilder::default();
    let mut done = Vec::new();
    for (pos, name) in [
        (Position::First, "SEND_FIRST"),
        (Position::Middle, "SEND_MIDDLE"),
        (Position::Middle, "SEND_MIDDLE"),
        (Position::Last, "SEND_LAST_WITH_IMMEDIATE"),
        (Position::Only, "WRITE_ONLY"),
        (Position::First, "WRITE_FIRST"),
        (Position::Middle, "WRITE_MIDDLE"),
        (Position::First, "WRITE_FIRST"),
        (Position::Last, "WRITE_LAST"),
        (Position::Middle, "WRITE_MIDDLE"),
    ] {
        b.push(pos, name, &mut done);
    }
    b.finish(&mut done);
    assert_eq!(
        done,
        [
            "SEND_FIRST MIDDLE*2 LAST_WITH_IMMEDIATE",
            "WRITE_ONLY",
            "WRITE_FIRST MIDDLE (unfinished)",
            "WRITE_FIRST LAST",
            "? MIDDLE (unfinished)",
        ]
    );
    assert_eq!(short_name("RC_RDMA_READ_RESPONSE_MIDDLE"), "READ_RESPONSE_MIDDLE");
    assert_eq!(short_name("XRC_SEND_ONLY"), "SEND_ONLY");
    assert_eq!(short_name("CNP"), "CNP");
}

#[test]
fn samples_summarise() {
    let mut s = Samples::default();
    assert_eq!(s.summary(), None);
    for v in [5, 1, 9, 3] {
        s.push(v);
    }
    assert_eq!(s.summary(), Some(Summary { n: 4, min: 1, median: 3, max: 9 }));
    assert_eq!(duration(999), "999ns");
    assert_eq!(duration(1_500), "1.5us");
    assert_eq!(duration(2_500_000), "2.50ms");
}

/// rxe-2guests-all.pcap: perftest and the pingpong examples between two rxe guests.
#[test]
fn rxe_all_workloads() {
    let r = report("rxe-2guests-all.pcap");
    assert_eq!((r.frames, r.roce_packets, r.not_roce), (824, 800, 24));
    assert_eq!((r.skipped_malformed, r.skipped_no_bth, r.truncated), (0, 0, 0));
    assert_eq!((r.icrc.valid, r.icrc.invalid, r.icrc.unchecked), (800, 0, 0));
    assert_eq!(r.transports.keys().copied().collect::<Vec<_>>(), ["RC", "UD"]);
    let rc = &r.transports["RC"].stats;
    let ud = &r.transports["UD"].stats;
    assert_eq!(rc.packets + ud.packets, 800);
    assert_eq!(ud.packets, 60);

    // 1. Shapes (PMTU 1024): 4 KiB pingpong SENDs in both directions, 8 KiB WRITEs and
    //    READs, FETCH_ADD answered by ATOMIC_ACKNOWLEDGE, 2 KiB SENDs, 32-byte WRITE_ONLYs.
    assert_eq!(rc.opcodes.get("RC_FETCH_ADD"), 20);
    assert_eq!(rc.opcodes.get("RC_ATOMIC_ACKNOWLEDGE"), 20);
    assert_eq!(rc.shapes["FETCH_ADD -> ATOMIC_ACKNOWLEDGE"], 20);
    assert_eq!(rc.shapes["READ_REQUEST -> READ_RESPONSE_FIRST MIDDLE*6 LAST"], 20);
    assert_eq!(rc.shapes["SEND_FIRST MIDDLE*2 LAST"], 40);
    assert_eq!(rc.shapes["WRITE_FIRST MIDDLE*6 LAST"], 20);
    assert_eq!(rc.shapes["SEND_FIRST LAST"], 20);
    assert_eq!(rc.shapes["WRITE_ONLY"], 40);
    assert_eq!(rc.shapes.len(), 6, "{:?}", rc.shapes);
    assert_eq!(ud.shapes["SEND_ONLY"], 60);

    // 2. rxe asks for an ACK on every message-ending packet and on no other.
    assert_eq!(rc.ackreq.only_last_marked, rc.ackreq.only_last);
    assert_eq!(rc.ackreq.first_middle_marked, 0);
    assert!(rc.ackreq.first_middle > 0);

    // 3. One ACK per message, each answering an AckReq (nothing coalesced, no duplicates).
    assert_eq!(rc.acks.messages_per_ack.keys().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(rc.acks.without_ackreq, 0);
    assert_eq!(rc.acks.ack_packets, rc.acks.positive);

    // 4. ACK syndrome 0x1f ("no credit information") on every AETH; no NAK of any kind.
    assert_eq!(rc.aeth.credits.keys().collect::<Vec<_>>(), ["0x1f"]);
    assert_eq!((rc.aeth.nak, rc.aeth.rnr_nak, rc.aeth.reserved), (0, 0, 0));
    assert_eq!(rc.aeth.first_msn.keys().copied().collect::<Vec<_>>(), [1]);

    // 5. One stable source port per sending QP, all in 0xC000-0xFFFF; destination 4791.
    for s in [rc, ud] {
        assert!(s.udp.sports.values().all(|p| p.len() == 1), "{:?}", s.udp.sports);
        assert_eq!(s.udp.sport_below_c000, 0);
        assert_eq!(s.udp.dports.keys().copied().collect::<Vec<_>>(), [4791]);
    }

    // 6. IPv4 IDs step by one per host pair; TTL 64, DF, DSCP/ECN 0, UDP checksum 0.
    let all_ip = [&rc.ip, &ud.ip];
    let steps: u64 = all_ip.iter().map(|ip| ip.ipv4_id_step_host_pair.total()).sum();
    let plus_one: u64 = all_ip.iter().map(|ip| ip.ipv4_id_step_host_pair.plus_one).sum();
    assert_eq!(steps, 798);
    assert!(plus_one * 10 >= steps * 9, "{plus_one}/{steps}");
    for ip in all_ip {
        assert_eq!(ip.ttl.keys().copied().collect::<Vec<_>>(), [64]);
        assert_eq!(ip.dont_frag, ip.ipv4);
        assert_eq!(ip.udp_checksum_nonzero, 0);
        assert_eq!(ip.dscp.keys().copied().collect::<Vec<_>>(), [0]);
    }

    // 7. No retransmission; every AckReq and every READ answered.
    assert_eq!(rc.timers.retransmitted, 0);
    assert_eq!(rc.timers.read_time_ns.summary().map(|s| s.n), Some(20));
    // The bridge capture shows five responses before the request they answer (four ACKs of
    // ib_write_bw's WRITE_LASTs, one ATOMIC_ACKNOWLEDGE): those are not timed.
    assert_eq!(rc.timers.responses_before_request, 5);
    assert_eq!(
        rc.timers.ack_time_ns.summary().map(|s| s.n as u64 + 5),
        Some(rc.ackreq.only_last_marked - rc.opcodes.get("RC_RDMA_READ_REQUEST"))
    );
}

/// rxe-rc-ud-pingpong-n20.pcap: one RC message (4 packets) sent again under emulation
/// jitter, after its ACK; rxe re-ACKs each duplicate packet.
#[test]
fn rxe_pingpong_retransmission() {
    let r = report("rxe-rc-ud-pingpong-n20.pcap");
    assert_eq!((r.roce_packets, r.icrc.valid), (248, 248));
    let rc = &r.transports["RC"].stats;
    assert_eq!(rc.timers.retransmitted, 4);
    assert_eq!(rc.timers.resend_bursts, 1);
    assert_eq!((rc.timers.bursts_after_nak, rc.timers.bursts_after_rnr), (0, 0));
    // The resent message is counted as a message again.
    assert_eq!(rc.shapes["SEND_FIRST MIDDLE*2 LAST"], 41);
    // Four duplicate ACKs (PSN advance 0), three of them answering packets without AckReq.
    assert_eq!(rc.acks.messages_per_ack.get(&0), Some(&4));
    assert_eq!(rc.acks.without_ackreq, 3);
    assert_eq!(rc.aeth.msn_steps.get(&0), Some(&4));
    // The resends are all in one conversation (192.168.77.10 > 192.168.77.11, qp 0x11).
    let resent: Vec<_> = r.conversations.iter().filter(|c| c.stats.timers.retransmitted > 0).collect();
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].requester.to_string(), "192.168.77.10");
    assert_eq!(resent[0].request_qp, Some(0x11));
    assert!(resent[0].response_qps.contains(&0x11));
}

/// One packet of every opcode (the project's own encoder, random field values): every
/// transport is recognised and nothing breaks on packets that make no conversation sense.
#[test]
fn every_opcode_is_classified() {
    let dir = tempfile::tempdir().expect("temp dir");
    for seed in 1..=5 {
        let path = dir.path().join(format!("every-{seed}.pcap"));
        let mut w = crate::PcapWriter::new(std::fs::File::create(&path).expect("create"), crate::Resolution::Micro)
            .expect("writer");
        for (i, s) in crate::samples::every_opcode(seed).iter().enumerate() {
            w.write_packet(1_767_225_600_000_000_000 + i as u64 * 1000, &s.frame, s.frame.len() as u32).expect("write");
        }
        w.finish().expect("finish");
        let r = analyse("every", &load(&path).expect("capture readable"));
        assert_eq!(r.transports.keys().copied().collect::<Vec<_>>(), ["CNP", "RC", "RD", "UC", "UD", "XRC"]);
        assert_eq!(r.transports["CNP"].stats.other, 1);
        assert_eq!(r.transports["UD"].stats.shapes.values().sum::<u64>(), 2);
        let analysed: u64 = r.transports.values().map(|t| t.stats.packets).sum();
        assert_eq!(analysed, r.roce_packets);
        assert!(r.unknown_opcodes >= 1);
        text(&r);
    }
}

/// Every reference capture goes through without error, whatever it holds (truncated frames,
/// bad ICRCs, Mellanox-only opcodes, RoCEv1), and the counts add up.
#[test]
fn every_capture_is_analysed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("captures directory") {
        let path = entry.expect("directory entry").path();
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("pcap" | "pcapng")) {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let cap = load(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let r = analyse(&name, &cap);
        let analysed: u64 = r.transports.values().map(|t| t.stats.packets).sum();
        assert_eq!(analysed + r.skipped_malformed + r.skipped_no_bth, r.roce_packets, "{name}");
        assert_eq!(r.frames, r.roce_packets + r.not_roce, "{name}");
        let per_conv: u64 = r.conversations.iter().map(|c| c.stats.packets).sum();
        assert_eq!(per_conv, analysed, "{name}");
        assert!(text(&r).starts_with(&name));
        serde_json::to_string(&r).unwrap_or_else(|e| panic!("{name}: {e}"));
        seen += 1;
    }
    assert!(seen >= 15, "only {seen} captures in {}", dir.display());
    // The truncated one is still analysed from its headers.
    let nccl = report("rdma-nccl2.pcap");
    assert_eq!(nccl.truncated, 489);
    assert!(nccl.transports.contains_key("UC"));
}
