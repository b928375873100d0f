//! The golden packets of ../shared/reference/wire/golden (built with scapy, ICRC cross-checked by
//! two independent implementations, decoded by tshark): softrdma parses them to the documented
//! fields, re-emits them byte for byte, verifies their ICRC, and detects the broken ones.

use softrdma_conformance::{hex, shared_dir};
use softrdma_engine::wire::roce::{EmitOptions, FrameRepr, L3Repr, ParsedFrame};
use softrdma_engine::wire::{aeth::CREDITS_INVALID, Error, IbPacket, NakCode, Opcode, Psn, Qpn, Syndrome};
use softrdma_pcap::analyze::summarize;
use softrdma_pcap::Reader;

fn golden_dir() -> std::path::PathBuf {
    shared_dir().join("reference/wire/golden")
}

fn golden_hex(name: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(golden_dir().join(format!("{name}.hex"))).expect("golden hex file");
    hex(&text)
}

/// Parses, checks the ICRC, re-emits and compares byte for byte.
fn parse_and_reemit(frame: &[u8]) -> ParsedFrame<'_> {
    let p = FrameRepr::parse(frame).expect("golden frame parses");
    assert!(p.icrc_ok, "ICRC verifies");
    let mut out = vec![0u8; p.repr.buffer_len()];
    // The golden frames carry UDP checksum 0 (as rxe sends), so emit without one.
    assert_eq!(p.udp_checksum, 0);
    let n = p.repr.emit(&mut out, p.ib.payload(), EmitOptions { udp_checksum: false }).expect("emit");
    assert_eq!(&out[..n], frame, "re-emitted frame is byte-identical");
    p
}

#[test]
fn g1_rc_send_only_v4() {
    let f = golden_hex("g1_rc_send_only_v4");
    let p = parse_and_reemit(&f);
    let b = p.repr.ib.bth;
    assert_eq!(b.opcode, Opcode::RC_SEND_ONLY);
    assert_eq!((b.dest_qp, b.psn, b.ack_req, b.pkey), (Qpn::new(0x12), Psn::new(1), true, 0xffff));
    assert_eq!(p.ib.payload(), b"Hello, RoCEv2!!!");
    assert_eq!(p.ib.icrc_bytes(), [0xaa, 0xe4, 0xf0, 0xd2]);
    assert_eq!(p.repr.udp_src_port, 49152);
    assert!(matches!(p.repr.l3, L3Repr::Ipv4(ip) if ip.dscp_ecn == 0 && ip.ttl == 64 && ip.dont_frag));
}

#[test]
fn g2_rc_write_first_v4() {
    let f = golden_hex("g2_rc_write_first_v4");
    let p = parse_and_reemit(&f);
    assert_eq!(p.repr.ib.bth.opcode, Opcode::RC_RDMA_WRITE_FIRST);
    let r = p.repr.ib.reth.expect("RETH");
    assert_eq!((r.va, r.rkey, r.dma_len), (0x7f00_1234_5000, 0xabcd, 8192));
    assert_eq!(p.ib.payload().len(), 64);
    assert!(!p.repr.ib.bth.ack_req);
    assert!(matches!(p.repr.l3, L3Repr::Ipv4(ip) if ip.dscp_ecn == 0x6a));
}

#[test]
fn g3_rc_nak_seq_err_v4() {
    let f = golden_hex("g3_rc_nak_seq_err_v4");
    let p = parse_and_reemit(&f);
    assert_eq!(p.repr.ib.bth.opcode, Opcode::RC_ACKNOWLEDGE);
    assert_eq!(p.repr.ib.bth.psn, Psn::new(5));
    let a = p.repr.ib.aeth.expect("AETH");
    assert_eq!(a.syndrome, Syndrome::Nak(NakCode::PsnSequenceError));
    assert_eq!(a.syndrome.to_byte(), 0x60);
    assert_eq!(a.msn.value(), 3);
    assert_eq!(p.ib.payload().len(), 0);
}

#[test]
fn g4_ud_send_only_v4() {
    let f = golden_hex("g4_ud_send_only_v4");
    let p = parse_and_reemit(&f);
    let b = p.repr.ib.bth;
    assert_eq!(b.opcode, Opcode::UD_SEND_ONLY);
    assert!(b.solicited);
    assert_eq!(b.pad_count, 2);
    let d = p.repr.ib.deth.expect("DETH");
    assert_eq!((d.qkey, d.src_qp), (0x1111_1111, Qpn::new(0x46)));
    assert_eq!(p.ib.payload(), b"UDping");
    assert_eq!(p.ib.pad(), &[0, 0]);
}

#[test]
fn g5_rc_write_only_imm_v6() {
    let f = golden_hex("g5_rc_write_only_imm_v6");
    let p = parse_and_reemit(&f);
    let b = p.repr.ib.bth;
    assert_eq!(b.opcode, Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE);
    assert_eq!(b.psn, Psn::new(0xff_ffff));
    assert!(b.solicited && b.ack_req);
    let r = p.repr.ib.reth.expect("RETH");
    assert_eq!((r.va, r.rkey, r.dma_len), (0x1000, 0x1234_5678, 8));
    assert_eq!(p.repr.ib.immdt.expect("ImmDt").imm, 0xdead_beef);
    match p.repr.l3 {
        L3Repr::Ipv6(ip) => {
            assert_eq!((ip.traffic_class, ip.flow_label, ip.hop_limit), (0x6a, 0x12345, 64));
            assert_eq!(ip.src_addr.to_string(), "2001:db8::1");
        }
        other => panic!("expected IPv6, got {other:?}"),
    }
}

#[test]
fn golden_pcap_matches_hex_files() {
    let names = [
        "g1_rc_send_only_v4",
        "g2_rc_write_first_v4",
        "g3_rc_nak_seq_err_v4",
        "g4_ud_send_only_v4",
        "g5_rc_write_only_imm_v6",
    ];
    let recs: Vec<_> = Reader::open(golden_dir().join("golden.pcap")).unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), names.len());
    for (r, n) in recs.iter().zip(names) {
        assert_eq!(r.data, golden_hex(n), "{n}");
        let s = summarize(r.index, softrdma_pcap::LinkType::ETHERNET, &r.data, false);
        assert!(s.ib.unwrap().icrc_ok);
    }
}

#[test]
fn cx4lx_cnp_from_hardware() {
    let recs: Vec<_> = Reader::open(golden_dir().join("cx4lx_cnp.pcap")).unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 1);
    // A hardware frame: non-zero IPv4 ID 0x718c and DSCP/ECN 0xc2, both kept on re-emit.
    let p = parse_and_reemit(&recs[0].data);
    assert!(matches!(p.repr.l3, L3Repr::Ipv4(ip) if ip.ident == 0x718c && ip.dscp_ecn == 0xc2));
    assert_eq!(p.repr.ib.bth.opcode, Opcode::CNP);
    assert!(p.repr.ib.bth.becn);
    assert_eq!(p.ib.payload().len(), 0);
}

fn coverage() -> Vec<(String, Vec<u8>)> {
    let names = std::fs::read_to_string(golden_dir().join("coverage_names.txt")).unwrap();
    let names: Vec<String> = names.lines().map(|l| l.split_whitespace().nth(1).unwrap().to_string()).collect();
    let recs: Vec<_> = Reader::open(golden_dir().join("coverage.pcap")).unwrap().map(|r| r.unwrap().data).collect();
    assert_eq!(names.len(), recs.len());
    names.into_iter().zip(recs).collect()
}

#[test]
fn coverage_frames_parse_reemit_and_verify() {
    let bad = ["bad_icrc", "truncated_bth", "reth_truncated"];
    let mut checked = 0;
    for (name, frame) in coverage() {
        if bad.contains(&name.as_str()) {
            continue;
        }
        let p = parse_and_reemit(&frame);
        let ib = &p.repr.ib;
        let op = ib.bth.opcode;
        match name.as_str() {
            "rc_ack" => assert_eq!(ib.aeth.unwrap().syndrome, Syndrome::Ack { credits: CREDITS_INVALID }),
            "rc_rnr_nak" => assert_eq!(ib.aeth.unwrap().syndrome, Syndrome::RnrNak { timer: 14 }),
            "rc_nak_rem_access" => assert_eq!(ib.aeth.unwrap().syndrome, Syndrome::Nak(NakCode::RemoteAccessError)),
            "rc_read_req" => {
                assert_eq!(op, Opcode::RC_RDMA_READ_REQUEST);
                assert_eq!(ib.reth.unwrap().dma_len, 4096);
            }
            "rc_read_resp_first" => {
                assert_eq!((op, ib.aeth.unwrap().msn.value()), (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 7))
            }
            "rc_read_resp_middle" => {
                assert_eq!(op, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE);
                assert!(ib.aeth.is_none());
                assert_eq!(p.ib.payload(), &[0x4d; 32]);
            }
            "rc_cmp_swap" => {
                let a = ib.atomiceth.unwrap();
                assert_eq!(
                    (op, a.va, a.rkey, a.swap_add, a.compare),
                    (Opcode::RC_COMPARE_SWAP, 0x3000, 0x66, 0x1111, 0x2222)
                );
            }
            "rc_fetch_add" => {
                let a = ib.atomiceth.unwrap();
                assert_eq!((op, a.va, a.swap_add), (Opcode::RC_FETCH_ADD, 0x3008, 1));
            }
            "rc_atomic_ack" => assert_eq!(ib.atomicacketh.unwrap().orig_rem_data, 0x2222),
            "rc_send_only_imm" => assert_eq!(ib.immdt.unwrap().imm, 0xcafe_babe),
            "rc_send_only_inv" => assert_eq!(ib.ieth.unwrap().rkey, 0x1234),
            "uc_send_only" => assert_eq!(op, Opcode::UC_SEND_ONLY),
            "xrc_send_only" => {
                assert_eq!(op, Opcode::XRC_SEND_ONLY);
                assert_eq!(ib.xrceth.unwrap().xrc_srqn, 0x99);
            }
            "xrc_write_first" => {
                assert_eq!(op, Opcode::XRC_RDMA_WRITE_FIRST);
                assert_eq!(ib.xrceth.unwrap().xrc_srqn, 0x99);
                let r = ib.reth.unwrap();
                assert_eq!((r.va, r.rkey, r.dma_len), (0x4000, 0x77, 64));
            }
            "cnp" => assert!(op == Opcode::CNP && ib.bth.becn && !ib.bth.fecn),
            "rc_send_fecn" => assert!(ib.bth.fecn && !ib.bth.becn),
            "reserved_opcode_0x1f" => {
                assert_eq!(op, Opcode(0x1f));
                assert_eq!(op.info(), None);
                assert_eq!(p.ib.payload(), &[0x3f; 4], "unknown opcode: the rest is payload");
            }
            "rocev1_send_only" => {
                assert!(matches!(p.repr.l3, L3Repr::Grh(_)));
                assert_eq!(p.ib.payload(), b"RoCEv1 payload!!");
            }
            other => panic!("coverage frame {other} has no expectation"),
        }
        checked += 1;
    }
    assert_eq!(checked, 18);
}

#[test]
fn coverage_broken_frames_are_detected() {
    for (name, frame) in coverage() {
        match name.as_str() {
            "bad_icrc" => {
                let p = FrameRepr::parse(&frame).expect("layout is fine");
                assert!(!p.icrc_ok, "bad ICRC detected");
                let s = summarize(17, softrdma_pcap::LinkType::ETHERNET, &frame, false);
                assert!(s.ib.unwrap().has_bad_icrc());
            }
            "truncated_bth" => {
                assert_eq!(FrameRepr::parse(&frame).unwrap_err(), Error::Truncated("BTH"));
                let s = summarize(18, softrdma_pcap::LinkType::ETHERNET, &frame, false).ib.unwrap();
                assert_eq!(s.error.as_deref(), Some("BTH truncated"));
            }
            "reth_truncated" => {
                assert_eq!(FrameRepr::parse(&frame).unwrap_err(), Error::Truncated("RETH"));
                let s = summarize(19, softrdma_pcap::LinkType::ETHERNET, &frame, false).ib.unwrap();
                assert_eq!(s.error.as_deref(), Some("RETH truncated"));
                assert_eq!(s.headers.bth.unwrap().opcode, Opcode::RC_RDMA_WRITE_FIRST);
            }
            _ => {}
        }
    }
}

#[test]
fn every_coverage_prefix_is_handled_without_panic() {
    for (_, frame) in coverage() {
        for n in 0..=frame.len() {
            let cut = &frame[..n];
            let _ = FrameRepr::parse(cut);
            let _ = summarize(1, softrdma_pcap::LinkType::ETHERNET, cut, n < frame.len());
            if n >= 42 {
                let _ = IbPacket::new_checked(&cut[42..]);
            }
        }
    }
}
