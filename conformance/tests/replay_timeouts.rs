//! A trace whose requester timed out replays whole as requester: the replay re-enacts the
//! recorded timeouts (their timer value is not on the wire) instead of running a timer of its own.
//!
//! The trace is made here: two engine devices in virtual time, the responder's first ACKs held
//! back longer than the requester's local ACK timeout (as when the responder's process is not
//! scheduled), captured at the requester's side and written as a pcap.

use std::path::Path;

use softrdma_conformance::pair::{Pair, RcOptions, ADDR_A, ADDR_B, BASE};
use softrdma_engine::time::{Duration, Instant};
use softrdma_engine::wire::roce::{default_eth, ipv4_default, EmitOptions, FrameRepr};
use softrdma_engine::wire::EthernetAddress;
use softrdma_engine::wire::{ib, IbPacket};
use softrdma_engine::wr::{SendOp, SendWr, Sge};
use softrdma_pcap::replay::{replay_file, Options, Side};
use softrdma_pcap::{PcapWriter, Resolution};
use softrdma_transport::faults::Fate;

/// The responder's answers sent before this time are held back.
const HELD_FROM: Duration = Duration::from_millis(2);

/// Records `writes` RDMA WRITEs of 15 KiB (15 packets: so that where a window ends is not where
/// a message does) from A to B, the answers B sends in its first [`HELD_FROM`] held back by
/// `held`, with A's local ACK timeout code `timeout`; writes the trace (as A's side saw it) to
/// `path`. Returns how many packets A sent more than once.
fn record(path: &Path, timeout: u8, writes: u64, held_for: Duration) -> usize {
    let mut p = Pair::new(3);
    let o = RcOptions { timeout, ..RcOptions::default() };
    let (a, b) = p.connect_rc(o);
    // What B sends in its first 2 ms is held back (its process was not scheduled).
    let held = move |s: &softrdma_conformance::pair::Seen| s.from == 1 && s.at < Instant::ZERO + HELD_FROM;
    p.set_filter(move |s| if held(s) { Fate::Delay(held_for) } else { Fate::Deliver });
    let len = 15 << 10;
    for i in 0..writes {
        let wr = SendWr::new(
            i,
            SendOp::Write { remote_addr: BASE + (i % 64) * len, rkey: b.mr.rkey },
            vec![Sge { addr: BASE + (i % 64) * len, length: len as u32, lkey: a.mr.lkey }],
        );
        p.a.post_send(a.qpn, wr).unwrap();
    }
    p.drive(1_000_000);
    let done = p.poll(0, a.cq);
    assert_eq!(done.len() as u64, writes, "every WRITE completes");
    assert!(done.iter().all(|w| w.status == softrdma_engine::verbs::WcStatus::Success), "{done:?}");

    // The capture at A: A's packets when sent, B's when they reached A.
    let mut frames: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut first = std::collections::HashSet::new();
    let mut resent = 0;
    for s in &p.log {
        let pkt = IbPacket::new_checked(&s.bytes[..]).unwrap();
        let mut at = s.at + p.latency;
        if s.from == 0 {
            at = s.at;
            if !first.insert(s.psn.value()) {
                resent += 1;
            }
        } else if held(s) {
            at += held_for;
        }
        let repr = ib::Repr::parse(&pkt).unwrap();
        let (src, dst) = if s.from == 0 { (ADDR_A, ADDR_B) } else { (ADDR_B, ADDR_A) };
        let (std::net::IpAddr::V4(src), std::net::IpAddr::V4(dst)) = (src, dst) else { unreachable!() };
        let f = FrameRepr {
            eth: default_eth(EthernetAddress([2, 0, 0, 0, 0, 1]), EthernetAddress([2, 0, 0, 0, 0, 2])),
            vlan_tci: None,
            l3: ipv4_default(src, dst, 0),
            udp_src_port: 0xc000,
            ib: repr,
        };
        let mut buf = vec![0u8; f.buffer_len()];
        let n = f.emit(&mut buf, pkt.payload(), EmitOptions::default()).unwrap();
        buf.truncate(n);
        frames.push((at.as_nanos(), buf));
    }
    frames.sort_by_key(|f| f.0);
    let mut w = PcapWriter::new(std::fs::File::create(path).unwrap(), Resolution::Nano).unwrap();
    for (t, f) in &frames {
        w.write_packet(1_700_000_000_000_000_000 + t, f, f.len() as u32).unwrap();
    }
    w.finish().unwrap();
    resent
}

fn replay(path: &Path) -> softrdma_pcap::replay::ConversationReport {
    let opts = Options { side: Side::Requester, behaviour: Default::default(), recv_depth: None };
    let r = replay_file(path, &opts).unwrap();
    let c = r.conversations.into_iter().find(|c| c.role == "requester").expect("a requester replay");
    assert!(c.not_replayable.is_none(), "{c:?}");
    c
}

/// IBTA 9.7.6.1.3 (transport timer) and 9.7.5.1.4 (duplicates answered): a requester that timed
/// out while its ACKs were late resent and slowed down (its window shrank); softrdma, replaying
/// it, does the same at the same moments, so every recorded first transmission matches, AckReq
/// included. With a timer code shorter than the replay's usual 14 (67 ms) the recording timed
/// out where a 67 ms timer would not; with a longer one, the reverse: both replay whole.
#[test]
fn a_requester_that_timed_out_replays_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Timeout 12 (16.8 ms) fires under a 40 ms hold; 16 (268 ms) not under a 100 ms one.
    for (timeout, held) in [(12u8, 40u64), (16, 100)] {
        let path = dir.path().join(format!("t{timeout}.pcap"));
        let resent = record(&path, timeout, 40, Duration::from_millis(held));
        assert_eq!(resent > 0, timeout == 12, "timeout {timeout}: {resent} resends");
        let c = replay(&path);
        assert!(c.answers_expected > 500, "{c:?}");
        assert_eq!(c.answers_matched, c.answers_expected, "timeout {timeout}: {:?}", c.mismatches);
        let reenacted = c.setup.iter().any(|s| s.contains("re-enacted"));
        assert_eq!(reenacted, timeout == 12, "{:?}", c.setup);
    }
}
