//! Property tests of the wire module: any well-formed frame emits and parses back to itself with
//! a valid ICRC; no byte string, however broken, makes a parser panic.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use softrdma_engine::wire::roce::{self, EmitOptions, FrameRepr, L3Repr};
use softrdma_engine::wire::{
    aeth::Msn, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EtherType, EthernetAddress, EthernetRepr,
    Gid, GrhRepr, Headers, IbPacket, IbRepr, IethRepr, ImmDtRepr, IpProtocol, Ipv4Repr, Ipv6Repr, Opcode, Psn, Qpn,
    RdethRepr, RethRepr, Syndrome, XrcEthRepr,
};

fn opcode() -> impl Strategy<Value = Opcode> {
    // Mostly tabled opcodes, sometimes any byte (reserved ones round-trip too).
    prop_oneof![
        4 => (0u8..=255).prop_filter_map("tabled", |o| Opcode(o).info().map(|_| Opcode(o))),
        1 => any::<u8>().prop_map(Opcode),
    ]
}

fn bth(op: Opcode) -> impl Strategy<Value = BthRepr> {
    (any::<[bool; 6]>(), 0u8..16, any::<u16>(), any::<u32>(), any::<u32>()).prop_map(move |(f, tver, pkey, qp, psn)| {
        BthRepr {
            opcode: op,
            solicited: f[0],
            mig_req: f[1],
            pad_count: 0,
            tver,
            pkey,
            fecn: f[2],
            becn: f[3],
            dest_qp: Qpn::new(qp),
            ack_req: f[4],
            psn: Psn::new(psn),
        }
    })
}

fn ib_repr() -> impl Strategy<Value = (IbRepr, Vec<u8>)> {
    opcode().prop_flat_map(|op| {
        let headers = op.info().map_or(Headers::NONE, |i| i.headers);
        let payload_ok = op.info().is_none_or(|i| i.payload);
        (
            bth(op),
            any::<(u32, u32, u32, u64, u32, u32, u64, u32, u64, u64)>(),
            any::<(u8, u32, u64, u32, u32)>(),
            if payload_ok { prop::collection::vec(any::<u8>(), 0..300).boxed() } else { Just(Vec::new()).boxed() },
        )
            .prop_map(
                move |(b, (qk, sq, srqn, va, rk, dl, sw, rk2, cmp, orig), (syn, msn, va2, imm, inv), payload)| {
                    let mut r = IbRepr::new(b);
                    let has = |h| headers.contains(h);
                    if has(Headers::RDETH) {
                        r.rdeth = Some(RdethRepr { ee_context: srqn >> 8 & 0xff_ffff });
                    }
                    if has(Headers::DETH) {
                        r.deth = Some(DethRepr { qkey: qk, src_qp: Qpn::new(sq) });
                    }
                    if has(Headers::XRCETH) {
                        r.xrceth = Some(XrcEthRepr { xrc_srqn: srqn & 0xff_ffff });
                    }
                    if has(Headers::RETH) {
                        r.reth = Some(RethRepr { va, rkey: rk, dma_len: dl });
                    }
                    if has(Headers::ATOMICETH) {
                        r.atomiceth = Some(AtomicEthRepr { va: va2, rkey: rk2, swap_add: sw, compare: cmp });
                    }
                    if has(Headers::AETH) {
                        r.aeth = Some(AethRepr { syndrome: Syndrome::from_byte(syn), msn: Msn::new(msn) });
                    }
                    if has(Headers::ATOMICACKETH) {
                        r.atomicacketh = Some(AtomicAckEthRepr { orig_rem_data: orig });
                    }
                    if has(Headers::IMMDT) {
                        r.immdt = Some(ImmDtRepr { imm });
                    }
                    if has(Headers::IETH) {
                        r.ieth = Some(IethRepr { rkey: inv });
                    }
                    r.payload_len = payload.len();
                    r.bth.pad_count = IbRepr::pad_for(payload.len());
                    (r, payload)
                },
            )
    })
}

fn l3() -> impl Strategy<Value = L3Repr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u8>(), any::<u16>(), any::<bool>(), any::<u8>()).prop_map(
            |(s, d, tos, id, df, ttl)| {
                L3Repr::Ipv4(Ipv4Repr {
                    src_addr: Ipv4Addr::from(s),
                    dst_addr: Ipv4Addr::from(d),
                    protocol: IpProtocol::Udp,
                    payload_len: 0,
                    dscp_ecn: tos,
                    ident: id,
                    dont_frag: df,
                    ttl,
                })
            }
        ),
        (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u8>(), 0u32..(1 << 20), any::<u8>()).prop_map(
            |(s, d, tc, fl, hl)| {
                L3Repr::Ipv6(Ipv6Repr {
                    src_addr: Ipv6Addr::from(s),
                    dst_addr: Ipv6Addr::from(d),
                    next_header: IpProtocol::Udp,
                    payload_len: 0,
                    hop_limit: hl,
                    traffic_class: tc,
                    flow_label: fl,
                })
            }
        ),
        (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u8>(), 0u32..(1 << 20), any::<u8>()).prop_map(
            |(s, d, tc, fl, hl)| {
                L3Repr::Grh(GrhRepr {
                    traffic_class: tc,
                    flow_label: fl,
                    payload_len: 0,
                    next_header: IpProtocol::IbaTransport,
                    hop_limit: hl,
                    sgid: Gid(s),
                    dgid: Gid(d),
                })
            }
        ),
    ]
}

fn frame() -> impl Strategy<Value = (FrameRepr, Vec<u8>, bool)> {
    (ib_repr(), l3(), any::<u16>(), any::<[u8; 6]>(), any::<[u8; 6]>(), prop::option::of(any::<u16>()), any::<bool>())
        .prop_map(|((ib, payload), l3, sport, s, d, vlan, csum)| {
            let eth =
                EthernetRepr { src_addr: EthernetAddress(s), dst_addr: EthernetAddress(d), ethertype: EtherType::Ipv4 };
            (FrameRepr { eth, vlan_tci: vlan, l3, udp_src_port: sport, ib }, payload, csum)
        })
}

/// What emit derives (lengths, ethertype, protocol) is filled in the expected value.
fn normalised(mut r: FrameRepr) -> FrameRepr {
    let ib_len = r.ib.buffer_len();
    match &mut r.l3 {
        L3Repr::Ipv4(ip) => {
            ip.payload_len = 8 + ib_len;
            r.eth.ethertype = EtherType::Ipv4;
        }
        L3Repr::Ipv6(ip) => {
            ip.payload_len = 8 + ib_len;
            r.eth.ethertype = EtherType::Ipv6;
        }
        L3Repr::Grh(g) => {
            g.payload_len = ib_len;
            r.eth.ethertype = EtherType::Roce;
            r.udp_src_port = 0;
        }
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn emit_then_parse_round_trips((repr, payload, csum) in frame()) {
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf, &payload, EmitOptions { udp_checksum: csum }).unwrap();
        prop_assert_eq!(n, buf.len());
        let p = FrameRepr::parse(&buf).unwrap();
        prop_assert!(p.icrc_ok);
        prop_assert_eq!(p.ib.payload(), &payload[..]);
        prop_assert_eq!(p.repr, normalised(repr));
        // Re-emitting what was parsed gives the same bytes.
        let mut again = vec![0u8; n];
        p.repr.emit(&mut again, p.ib.payload(), EmitOptions { udp_checksum: csum }).unwrap();
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn any_single_bit_flip_in_covered_bytes_breaks_the_icrc((repr, payload, _c) in frame(), bit in any::<usize>()) {
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, &payload, EmitOptions::default()).unwrap();
        let l3_start = 14 + if repr.vlan_tci.is_some() { 4 } else { 0 };
        let ib_start = buf.len() - repr.ib.buffer_len();
        // Flip a bit in the transport packet past the BTH's ICRC-masked byte 4 (payload, headers, PSN...).
        let span = buf.len() - ib_start;
        let pos = ib_start + 5 + (bit / 8) % (span - 5);
        buf[pos] ^= 1 << (bit % 8);
        let d = roce::dissect(&buf);
        // A flipped length or opcode may make the frame unreadable; if it reads, the ICRC must fail.
        if let Some(ok) = d.icrc_ok() { prop_assert!(!ok, "flip at {} (l3 at {})", pos, l3_start); }
    }

    #[test]
    fn view_accepts_exactly_what_parse_accepts((repr, payload, csum) in frame(), edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4), cut in any::<usize>()) {
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, &payload, EmitOptions { udp_checksum: csum }).unwrap();
        for (i, v) in edits { let n = buf.len(); buf[i % n] = v; }
        let n = buf.len() - cut % 8.min(buf.len() + 1);
        let f = &buf[..n];
        let parsed = FrameRepr::parse(f);
        let view = roce::RoceView::new_checked(f);
        prop_assert_eq!(parsed.is_ok(), view.is_ok(), "parse {:?} view {:?}", parsed.as_ref().err(), view.as_ref().err());
        if let (Ok(p), Ok(v)) = (parsed, view) {
            prop_assert_eq!(p.icrc_ok, v.icrc_ok());
            prop_assert_eq!(p.ib.payload(), v.ib.payload());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = FrameRepr::parse(&bytes);
        let _ = roce::RoceView::new_checked(&bytes).map(|v| v.icrc_ok());
        let d = roce::dissect(&bytes);
        let _ = d.icrc_ok();
        let _ = IbPacket::new_checked(&bytes[..]).map(|p| (p.payload().len(), p.pad().len(), p.icrc()));
        if let Ok(p) = IbPacket::new_checked(&bytes[..]) { let _ = IbRepr::parse(&p); }
        for et in [EtherType::Ipv4, EtherType::Ipv6, EtherType::Roce] {
            let _ = roce::dissect_network_layer(et, &bytes).icrc_ok();
        }
    }

    #[test]
    fn mutated_frames_never_panic((repr, payload, _c) in frame(), edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, &payload, EmitOptions::default()).unwrap();
        for (i, v) in edits { let n = buf.len(); buf[i % n] = v; }
        let n = cut % (buf.len() + 1);
        let cut = &buf[..n];
        if let Ok(p) = FrameRepr::parse(cut) {
            let _ = (p.ib.payload(), p.ib.pad(), p.ib.reth(), p.ib.aeth(), p.ib.atomiceth());
        }
        let _ = roce::dissect(cut).icrc_ok();
    }
}
