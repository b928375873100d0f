//! Packets from the wire are untrusted: a peer can send any header with a valid ICRC (the ICRC is
//! not a security measure). Random requests and responses, correctly checksummed and addressed to
//! live QPs, must never panic the engine, and the devices must stay drivable to quiescence.

use proptest::prelude::*;
use softrdma_conformance::pair::{Pair, RcOptions, ADDR_A, ADDR_B, BASE};
use softrdma_engine::device::{ip_udp_header, RecvMeta};
use softrdma_engine::wire::{
    aeth::Msn, icrc, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, Headers, IbPacket, IbRepr, IethRepr,
    ImmDtRepr, Opcode, Psn, Qpn, RethRepr, Syndrome,
};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

fn packet(op: u8, dest: Qpn, psn: u32, vals: (u64, u32, u32, u8, u64), payload: &[u8]) -> Vec<u8> {
    let opcode = Opcode(op);
    let headers = opcode.info().map_or(Headers::NONE, |i| i.headers);
    let carries = opcode.info().is_none_or(|i| i.payload);
    let payload = if carries { payload } else { &[][..] };
    let mut ib = IbRepr::new(BthRepr {
        pad_count: IbRepr::pad_for(payload.len()),
        ack_req: vals.3 & 1 == 1,
        ..BthRepr::new(opcode, dest, Psn::new(psn))
    });
    let (va, rkey, len, syn, data) = vals;
    if headers.contains(Headers::DETH) {
        ib.deth = Some(softrdma_engine::wire::DethRepr { qkey: rkey, src_qp: Qpn::new(len) });
    }
    if headers.contains(Headers::XRCETH) {
        ib.xrceth = Some(softrdma_engine::wire::XrcEthRepr { xrc_srqn: rkey & 0xff_ffff });
    }
    if headers.contains(Headers::RETH) {
        ib.reth = Some(RethRepr { va, rkey, dma_len: len });
    }
    if headers.contains(Headers::ATOMICETH) {
        ib.atomiceth = Some(AtomicEthRepr { va, rkey, swap_add: data, compare: data ^ 1 });
    }
    if headers.contains(Headers::AETH) {
        ib.aeth = Some(AethRepr { syndrome: Syndrome::from_byte(syn), msn: Msn::new(len) });
    }
    if headers.contains(Headers::ATOMICACKETH) {
        ib.atomicacketh = Some(AtomicAckEthRepr { orig_rem_data: data });
    }
    if headers.contains(Headers::IMMDT) {
        ib.immdt = Some(ImmDtRepr { imm: rkey });
    }
    if headers.contains(Headers::IETH) {
        ib.ieth = Some(IethRepr { rkey });
    }
    ib.payload_len = payload.len();
    let mut buf = vec![0u8; ib.buffer_len()];
    ib.emit(&mut buf).unwrap();
    IbPacket::new_unchecked(&mut buf[..]).payload_mut().copy_from_slice(payload);
    buf
}

fn deliver(p: &mut Pair, to: usize, bytes: &mut [u8]) {
    let (src, dst) = if to == 1 { (ADDR_A, ADDR_B) } else { (ADDR_B, ADDR_A) };
    let (hdr, n) = ip_udp_header(src, dst, 0xc123, bytes.len(), 0);
    let body = bytes.len() - icrc::LEN;
    let crc = icrc::roce_v2_parts(&hdr[..n], &bytes[..body]).unwrap();
    IbPacket::new_unchecked(&mut bytes[..]).set_icrc(crc);
    let now = p.now;
    p.dev(to).handle_packet(now, RecvMeta { src, src_port: 0xc123, ip_id: None, dst: None }, bytes);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn forged_packets_never_panic(
        pkts in prop::collection::vec(
            (0u8..0x18, prop::bool::ANY, -4i32..8, (any::<u64>(), any::<u32>(), 0u32..20000, any::<u8>(), any::<u64>()), 0usize..5000, prop::bool::ANY),
            1..40,
        )
    ) {
        let mut p = Pair::new(9);
        let (a, b) = p.connect_rc(RcOptions { timeout: 8, retry_cnt: 2, rnr_retry: 1, ..RcOptions::default() });
        // Some legitimate work in flight on both sides.
        p.b.post_recv(b.qpn, RecvWr { wr_id: 1, sg_list: vec![Sge { addr: BASE, length: 4096, lkey: b.mr.lkey }] }).unwrap();
        p.a.post_send(a.qpn, SendWr::new(1, SendOp::Read { remote_addr: BASE, rkey: b.mr.rkey }, vec![Sge { addr: BASE, length: 3000, lkey: a.mr.lkey }])).unwrap();
        p.a.post_send(a.qpn, SendWr::new(2, SendOp::Send, vec![Sge { addr: BASE, length: 100, lkey: a.mr.lkey }])).unwrap();
        p.step();
        for (low, rd, dpsn, mut vals, plen, real_key) in pkts {
            // Half the time aim at the real region, so that checks pass and execution runs.
            if real_key {
                vals.1 = b.mr.rkey;
                vals.0 = BASE + (vals.0 % (1 << 20));
            }
            let payload = vec![0x5a; plen];
            if rd {
                // A "response" to A's requester, near its PSNs.
                let op = [0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12][low as usize % 6];
                let psn = (100 + dpsn) as u32;
                let mut bytes = packet(op, a.qpn, psn, vals, &payload);
                deliver(&mut p, 0, &mut bytes);
            } else {
                // A request to B's responder, near its expected PSN (A's READ took 100..102, its SEND 103).
                let psn = (102 + dpsn) as u32;
                let mut bytes = packet(low, b.qpn, psn, vals, &payload);
                deliver(&mut p, 1, &mut bytes);
            }
        }
        // The devices still run to quiescence.
        p.drive(1_000_000);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
    ))]

    /// The same for UC, UD and XRC target QPs (with an SRQ and an MW bound), and multicast.
    #[test]
    fn forged_packets_to_uc_ud_and_xrc_never_panic(
        pkts in prop::collection::vec(
            (0u8..4, 0u8..0x18, -4i32..8, (any::<u64>(), any::<u32>(), 0u32..20000, any::<u8>(), any::<u64>()), 0usize..5000, prop::bool::ANY, any::<u32>()),
            1..40,
        )
    ) {
        use softrdma_engine::device::{QpCaps, QpInit, SrqAttr};
        use softrdma_engine::verbs::QpType;
        let mut p = Pair::new(10);
        let (_a, b) = p.connect_rc(RcOptions::default());
        let o = RcOptions::default();
        let caps = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 0 };
        let mk = |p: &mut Pair, t| p.b.create_qp(QpInit { qp_type: t, pd: b.pd, send_cq: b.cq, recv_cq: b.cq, caps, sq_sig_all: false, srq: None }).unwrap();
        let uc = mk(&mut p, QpType::Uc);
        let ud = mk(&mut p, QpType::Ud);
        Pair::bring_up(&mut p.b, uc, QpType::Uc, &o, ADDR_A, Qpn::new(0x99), 0, 100, 0);
        Pair::bring_up(&mut p.b, ud, QpType::Ud, &o, ADDR_A, Qpn::new(0x99), 0, 0, 7);
        p.b.attach_mcast(ud, "239.0.0.1".parse().unwrap()).unwrap();
        let x = p.b.open_xrcd(1, Some(1), true, false).unwrap();
        let srq = p.b.create_xrc_srq(x, b.pd, b.cq, SrqAttr { max_wr: 8, max_sge: 2, srq_limit: 2 }).unwrap();
        let (tgt, _) = p.b.create_xrc_tgt_qp(1, x).unwrap();
        Pair::bring_up(&mut p.b, tgt, QpType::XrcTgt, &o, ADDR_A, Qpn::new(0x99), 0, 100, 0);
        let mw = p.b.alloc_mw(b.pd, 2).unwrap();
        for i in 0..3u64 {
            let wr = RecvWr { wr_id: i, sg_list: vec![Sge { addr: BASE + i * 0x1000, length: 0x800, lkey: b.mr.lkey }] };
            p.b.post_recv(uc, wr.clone()).unwrap();
            p.b.post_recv(ud, wr.clone()).unwrap();
            p.b.post_srq_recv(srq, wr).unwrap();
        }
        for (which, low, dpsn, mut vals, plen, real_key, srqn) in pkts {
            if real_key {
                vals.1 = if plen % 2 == 0 { b.mr.rkey } else { mw };
                vals.0 = BASE + (vals.0 % (1 << 20));
            }
            let payload = vec![0x3c; plen];
            let (op, dest) = match which {
                0 => (0x20 | (low % 12), uc),
                1 => (0x64 | (low & 1), ud),
                2 => (0x64 | (low & 1), Qpn::MULTICAST),
                _ => (0xa0 | low, tgt),
            };
            let mut bytes = packet(op, dest, (100 + dpsn) as u32, vals, &payload);
            if op >= 0xa0 {
                // Point the XRCETH (right after the BTH) at the real SRQ or a random one.
                if let Some(x) = bytes.get_mut(12..16) {
                    let n = if real_key { srq } else { srqn & 0xff_ffff };
                    x.copy_from_slice(&n.to_be_bytes());
                }
            }
            if (0x64..=0x65).contains(&op) && real_key {
                // The right Q_Key in the DETH.
                bytes[12..16].copy_from_slice(&7u32.to_be_bytes());
            }
            if dest == Qpn::MULTICAST {
                let (hdr, n) = ip_udp_header(ADDR_A, "239.0.0.1".parse().unwrap(), 0xc123, bytes.len(), 0);
                let body = bytes.len() - icrc::LEN;
                let crc = icrc::roce_v2_parts(&hdr[..n], &bytes[..body]).unwrap();
                IbPacket::new_unchecked(&mut bytes[..]).set_icrc(crc);
                let now = p.now;
                p.b.handle_packet(now, RecvMeta { src: ADDR_A, src_port: 0xc123, ip_id: None, dst: Some("239.0.0.1".parse().unwrap()) }, &bytes);
            } else {
                deliver(&mut p, 1, &mut bytes);
            }
        }
        p.drive(1_000_000);
    }
}

/// IBTA 9.7.5.1.1: a response for a PSN the requester has not sent answers nothing. An ACK ten
/// PSNs past A's one SEND must not complete it (rxe's completer would: it compares with the
/// oldest WQE's last PSN only); the real ACK then does. `softrdma conform`'s case
/// rc_req/ack_for_an_unsent_psn_is_ignored checks the same on a live device.
#[test]
fn an_ack_for_a_psn_not_yet_sent_completes_nothing() {
    use softrdma_engine::fault::Fate;
    let mut p = Pair::new(3);
    let (a, _b) = p.connect_rc(RcOptions::default());
    // B never hears A: only forged responses reach A.
    p.set_filter(|s| if s.from == 0 { Fate::Drop } else { Fate::Deliver });
    p.a.post_send(a.qpn, SendWr::new(7, SendOp::Send, vec![Sge { addr: BASE, length: 16, lkey: a.mr.lkey }])).unwrap();
    p.step();
    let sent = *p.sent(0).first().expect("A sent its SEND");
    assert_eq!(sent, Opcode::RC_SEND_ONLY);
    let first = 100;
    let mut ahead = packet(0x11, a.qpn, first + 10, (0, 0, 1, 0, 0), &[]);
    deliver(&mut p, 0, &mut ahead);
    assert!(p.poll(0, a.cq).is_empty(), "an ACK for an unsent PSN completed the SEND");
    assert_eq!(p.a.counters().unsent_psn_responses, 1);
    let mut ack = packet(0x11, a.qpn, first, (0, 0, 1, 0, 0), &[]);
    deliver(&mut p, 0, &mut ack);
    assert_eq!(p.statuses(0, a.cq), vec![(7, softrdma_engine::verbs::WcStatus::Success)]);
}

/// IBTA 9.6: a packet whose BTH TVer is not 0 is dropped silently (rxe's hdr_check), not
/// executed; the same SEND with TVer 0 is. `softrdma conform`'s case
/// invalid/wrong_transport_version_is_dropped checks the same on a live device.
#[test]
fn a_packet_of_another_transport_version_is_dropped() {
    let mut p = Pair::new(4);
    let (_a, b) = p.connect_rc(RcOptions::default());
    p.b.post_recv(b.qpn, RecvWr { wr_id: 9, sg_list: vec![Sge { addr: BASE, length: 64, lkey: b.mr.lkey }] }).unwrap();
    // A's responder expects PSN 100 from B's requester and B's expects 100 from A's.
    let mut v1 = packet(0x04, b.qpn, 100, (0, 0, 0, 1, 0), &[7; 8]);
    v1[1] |= 0x01;
    deliver(&mut p, 1, &mut v1);
    p.drive(10_000);
    assert_eq!(p.b.counters().malformed, 1);
    assert!(p.poll(1, b.cq).is_empty(), "a TVer 1 SEND was delivered");
    let mut v0 = packet(0x04, b.qpn, 100, (0, 0, 0, 1, 0), &[7; 8]);
    deliver(&mut p, 1, &mut v0);
    p.drive(10_000);
    assert_eq!(p.statuses(1, b.cq), vec![(9, softrdma_engine::verbs::WcStatus::Success)]);
}
