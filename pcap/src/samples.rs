//! Synthetic traces built with the engine's encoder: one frame per opcode (for cross-checks
//! against independent decoders such as tshark) and a short conversation for `softrdma demo`.
//!
//! These are made-up packets, not traffic a device produced; their field values come from a
//! seeded generator so that other seeds exercise other values.

use std::net::{Ipv4Addr, Ipv6Addr};

use softrdma_engine::wire::roce::{self, EmitOptions, FrameRepr, L3Repr};
use softrdma_engine::wire::{
    aeth::{Msn, CREDITS_INVALID},
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EthernetAddress, Gid, GrhRepr, Headers, IbRepr,
    IethRepr, ImmDtRepr, IpProtocol, NakCode, Opcode, Psn, Qpn, RdethRepr, RethRepr, Syndrome, XrcEthRepr,
};

/// One synthetic frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// What it is, e.g. `RC_SEND_ONLY`.
    pub name: String,
    /// The Ethernet frame.
    pub frame: Vec<u8>,
}

pub use softrdma_engine::rng::Rng;

const MAC_A: EthernetAddress = EthernetAddress([0x02, 0x53, 0x52, 0x44, 0x4d, 0x01]);
const MAC_B: EthernetAddress = EthernetAddress([0x02, 0x53, 0x52, 0x44, 0x4d, 0x02]);

/// Which network layer a sample uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// RoCEv2 over IPv4.
    Ipv4,
    /// RoCEv2 over IPv6.
    Ipv6,
    /// RoCEv1.
    Grh,
}

fn l3(net: Net, forward: bool, rng: &mut Rng) -> L3Repr {
    let (a4, b4) = (Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2));
    let (a6, b6): (Ipv6Addr, Ipv6Addr) = ("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap());
    let (s4, d4, s6, d6) = if forward { (a4, b4, a6, b6) } else { (b4, a4, b6, a6) };
    match net {
        Net::Ipv4 => {
            let mut r = roce::ipv4_default(s4, d4, (rng.below(64) as u8) << 2);
            if let L3Repr::Ipv4(ref mut v4) = r {
                v4.ident = rng.below(3) as u16 * 0x1111; // 0 as Linux sockets send, or changing IDs
            }
            r
        }
        Net::Ipv6 => roce::ipv6_default(s6, d6, (rng.below(64) as u8) << 2, rng.below(1 << 20) as u32),
        Net::Grh => L3Repr::Grh(GrhRepr {
            traffic_class: (rng.below(64) as u8) << 2,
            flow_label: rng.below(1 << 20) as u32,
            payload_len: 0,
            next_header: IpProtocol::IbaTransport,
            hop_limit: 64,
            sgid: Gid::from(if forward { a6 } else { b6 }),
            dgid: Gid::from(if forward { b6 } else { a6 }),
        }),
    }
}

/// Fills every extension header the opcode carries with generated values.
fn fill_headers(ib: &mut IbRepr, rng: &mut Rng) {
    let headers = ib.bth.opcode.info().map_or(Headers::NONE, |i| i.headers);
    if headers.contains(Headers::RDETH) {
        ib.rdeth = Some(RdethRepr { ee_context: rng.next_u64() as u32 & 0xff_ffff });
    }
    if headers.contains(Headers::DETH) {
        ib.deth = Some(DethRepr { qkey: rng.next_u64() as u32 & 0x7fff_ffff, src_qp: Qpn::new(rng.next_u64() as u32) });
    }
    if headers.contains(Headers::XRCETH) {
        ib.xrceth = Some(XrcEthRepr { xrc_srqn: rng.next_u64() as u32 & 0xff_ffff });
    }
    if headers.contains(Headers::RETH) {
        ib.reth = Some(RethRepr {
            va: rng.next_u64() & 0x0000_7fff_ffff_f000,
            rkey: rng.next_u64() as u32,
            dma_len: rng.below(1 << 20) as u32,
        });
    }
    if headers.contains(Headers::ATOMICETH) {
        ib.atomiceth = Some(AtomicEthRepr {
            va: rng.next_u64() & 0x0000_7fff_ffff_fff8,
            rkey: rng.next_u64() as u32,
            swap_add: rng.next_u64(),
            compare: rng.next_u64(),
        });
    }
    if headers.contains(Headers::AETH) {
        let syndrome = match rng.below(4) {
            0 => Syndrome::Ack { credits: CREDITS_INVALID },
            1 => Syndrome::Ack { credits: rng.below(31) as u8 },
            2 => Syndrome::RnrNak { timer: rng.below(32) as u8 },
            _ => Syndrome::Nak(NakCode::from(rng.below(5) as u8)),
        };
        // Only ACKNOWLEDGE may carry a NAK; responses with data carry an ACK syndrome.
        let syndrome =
            if ib.bth.opcode.0 & 0x1f == 0x11 { syndrome } else { Syndrome::Ack { credits: CREDITS_INVALID } };
        ib.aeth = Some(AethRepr { syndrome, msn: Msn::new(rng.next_u64() as u32) });
    }
    if headers.contains(Headers::ATOMICACKETH) {
        ib.atomicacketh = Some(AtomicAckEthRepr { orig_rem_data: rng.next_u64() });
    }
    if headers.contains(Headers::IMMDT) {
        ib.immdt = Some(ImmDtRepr { imm: rng.next_u64() as u32 });
    }
    if headers.contains(Headers::IETH) {
        ib.ieth = Some(IethRepr { rkey: rng.next_u64() as u32 });
    }
}

fn bth(opcode: Opcode, dest_qp: u32, psn: u32, rng: &mut Rng) -> BthRepr {
    BthRepr {
        opcode,
        solicited: rng.below(2) == 1,
        mig_req: rng.below(4) == 0,
        pad_count: 0,
        tver: 0,
        pkey: if rng.below(2) == 0 { 0xffff } else { 0x8000 | rng.below(0x8000) as u16 },
        fecn: rng.below(8) == 0,
        becn: rng.below(8) == 0,
        dest_qp: Qpn::new(dest_qp),
        ack_req: rng.below(2) == 1,
        psn: Psn::new(psn),
    }
}

/// Builds one frame. `payload` must be empty for opcodes that carry none.
pub fn build(net: Net, forward: bool, src_port: u16, ib: IbRepr, payload: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut ib = ib;
    ib.payload_len = payload.len();
    ib.bth.pad_count = IbRepr::pad_for(payload.len());
    let (src, dst) = if forward { (MAC_A, MAC_B) } else { (MAC_B, MAC_A) };
    let repr = FrameRepr {
        eth: roce::default_eth(src, dst),
        vlan_tci: None,
        l3: l3(net, forward, rng),
        udp_src_port: src_port,
        ib,
    };
    let mut frame = vec![0u8; repr.buffer_len()];
    // Over IPv6 the UDP checksum is mandatory (RFC 8200 8.1).
    let opts = EmitOptions { udp_checksum: net == Net::Ipv6 };
    let n = repr.emit(&mut frame, payload, opts).expect("sample reprs are consistent");
    frame.truncate(n);
    frame
}

/// One frame for every opcode in the table (RC, UC, RD, UD, CNP, XRC) and one reserved opcode,
/// with generated header values; mostly IPv4, some IPv6 and some RoCEv1.
pub fn every_opcode(seed: u64) -> Vec<Sample> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let ops = (0..=255u8).filter(|&o| Opcode(o).info().is_some()).chain([0x1f]);
    for (i, op) in ops.enumerate() {
        let opcode = Opcode(op);
        let mut ib = IbRepr::new(bth(opcode, rng.next_u64() as u32, rng.next_u64() as u32, &mut rng));
        fill_headers(&mut ib, &mut rng);
        let carries_payload = opcode.info().is_none_or(|i| i.payload);
        let payload: Vec<u8> =
            if carries_payload { (0..rng.below(70)).map(|_| rng.next_u64() as u8).collect() } else { Vec::new() };
        let net = match i % 6 {
            4 => Net::Ipv6,
            5 => Net::Grh,
            _ => Net::Ipv4,
        };
        let sport = 0xc000 | (rng.below(0x4000) as u16);
        out.push(Sample { name: opcode.to_string(), frame: build(net, true, sport, ib, &payload, &mut rng) });
    }
    out
}

/// A short, coherent exchange between two RC QPs (and a UD and an XRC QP) at path MTU 256, as a
/// device would put it on the wire: a segmented SEND and its coalesced ACK, an RDMA WRITE with
/// immediate, an RDMA READ answered in two packets, a FETCH_ADD and its atomic ACK, an RNR NAK
/// and the retried SEND, a PSN sequence NAK, a UD datagram, an XRC SEND and a CNP.
pub fn demo_conversation() -> Vec<Sample> {
    let mut rng = Rng::new(0x5eed);
    let (qa, qb) = (0x11u32, 0x12u32);
    let mut out = Vec::new();
    let mut psn = 100u32;
    let mut msn = 0u32;
    let mut push = |name: &str, forward: bool, ib: IbRepr, payload: &[u8], rng: &mut Rng| {
        let sport = 0xc000 | ((if forward { qa } else { qb }) as u16);
        out.push(Sample { name: name.to_string(), frame: build(Net::Ipv4, forward, sport, ib, payload, rng) });
    };
    let plain = |opcode: Opcode, dest: u32, psn: u32, ack_req: bool| {
        IbRepr::new(BthRepr { ack_req, ..BthRepr::new(opcode, Qpn::new(dest), Psn::new(psn)) })
    };
    let ack = |psn: u32, msn: u32, syndrome: Syndrome| {
        let mut ib = plain(Opcode::RC_ACKNOWLEDGE, qa, psn, false);
        ib.aeth = Some(AethRepr { syndrome, msn: Msn::new(msn) });
        ib
    };
    let ok = Syndrome::Ack { credits: CREDITS_INVALID };
    // A 600-byte SEND in three packets, ACK requested on the last; one ACK for all three.
    let msg: Vec<u8> = (0..600u32).map(|i| (i % 251) as u8).collect();
    push("SEND first", true, plain(Opcode::RC_SEND_FIRST, qb, psn, false), &msg[..256], &mut rng);
    push("SEND middle", true, plain(Opcode::RC_SEND_MIDDLE, qb, psn + 1, false), &msg[256..512], &mut rng);
    push("SEND last", true, plain(Opcode::RC_SEND_LAST, qb, psn + 2, true), &msg[512..], &mut rng);
    msn += 1;
    push("ACK", false, ack(psn + 2, msn, ok), &[], &mut rng);
    psn += 3;
    // RDMA WRITE with immediate, one packet.
    let mut w = plain(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, qb, psn, true);
    w.reth = Some(RethRepr { va: 0x7f3a_1200_0000, rkey: 0x3c01_0a07, dma_len: 64 });
    w.immdt = Some(ImmDtRepr { imm: 0x0000_002a });
    push("WRITE with immediate", true, w, &[0x5a; 64], &mut rng);
    msn += 1;
    push("ACK", false, ack(psn, msn, ok), &[], &mut rng);
    psn += 1;
    // RDMA READ of 300 bytes: the response takes two PSNs.
    let mut r = plain(Opcode::RC_RDMA_READ_REQUEST, qb, psn, true);
    r.reth = Some(RethRepr { va: 0x7f3a_1200_1000, rkey: 0x3c01_0a07, dma_len: 300 });
    push("READ request", true, r, &[], &mut rng);
    msn += 1;
    let mut f = plain(Opcode::RC_RDMA_READ_RESPONSE_FIRST, qa, psn, false);
    f.aeth = Some(AethRepr { syndrome: ok, msn: Msn::new(msn) });
    push("READ response first", false, f, &msg[..256], &mut rng);
    let mut l = plain(Opcode::RC_RDMA_READ_RESPONSE_LAST, qa, psn + 1, false);
    l.aeth = Some(AethRepr { syndrome: ok, msn: Msn::new(msn) });
    push("READ response last", false, l, &msg[256..300], &mut rng);
    psn += 2;
    // FETCH_ADD and its atomic ACK.
    let mut fa = plain(Opcode::RC_FETCH_ADD, qb, psn, true);
    fa.atomiceth = Some(AtomicEthRepr { va: 0x7f3a_1200_2000, rkey: 0x3c01_0a07, swap_add: 1, compare: 0 });
    push("FETCH_ADD", true, fa, &[], &mut rng);
    msn += 1;
    let mut aa = plain(Opcode::RC_ATOMIC_ACKNOWLEDGE, qa, psn, false);
    aa.aeth = Some(AethRepr { syndrome: ok, msn: Msn::new(msn) });
    aa.atomicacketh = Some(AtomicAckEthRepr { orig_rem_data: 41 });
    push("atomic ACK", false, aa, &[], &mut rng);
    psn += 1;
    // A SEND that finds no receive WQE: RNR NAK (timer 14 = 1.28 ms), then the retry.
    push("SEND", true, plain(Opcode::RC_SEND_ONLY, qb, psn, true), b"ping", &mut rng);
    push("RNR NAK", false, ack(psn, msn, Syndrome::RnrNak { timer: 14 }), &[], &mut rng);
    push("SEND (retry)", true, plain(Opcode::RC_SEND_ONLY, qb, psn, true), b"ping", &mut rng);
    msn += 1;
    push("ACK", false, ack(psn, msn, ok), &[], &mut rng);
    psn += 1;
    // A lost packet: the responder NAKs the gap once.
    push("SEND (psn+1, one lost)", true, plain(Opcode::RC_SEND_ONLY, qb, psn + 1, true), b"pong", &mut rng);
    push("NAK PSN sequence error", false, ack(psn, msn, Syndrome::Nak(NakCode::PsnSequenceError)), &[], &mut rng);
    // A UD datagram.
    let mut ud = plain(Opcode::UD_SEND_ONLY, 0x20, 7, false);
    ud.deth = Some(DethRepr { qkey: 0x1111_1111, src_qp: Qpn::new(0x21) });
    push("UD SEND", true, ud, b"datagram", &mut rng);
    // An XRC SEND to SRQ 0x99 through TGT QP 0x30.
    let mut x = plain(Opcode::XRC_SEND_ONLY, 0x30, 1, true);
    x.xrceth = Some(XrcEthRepr { xrc_srqn: 0x99 });
    push("XRC SEND", true, x, b"to the SRQ", &mut rng);
    // A congestion notification back to the sender.
    let mut cnp = plain(Opcode::CNP, qa, 0, false);
    cnp.bth.becn = true;
    push("CNP", false, cnp, &[], &mut rng);
    out
}

#[cfg(test)]
mod test {
    use super::*;
    use softrdma_engine::wire::roce::FrameRepr;

    #[test]
    fn every_sample_parses_with_a_good_icrc() {
        for seed in [1, 2, 3] {
            let s = every_opcode(seed);
            assert_eq!(s.len(), 86);
            for x in &s {
                let p = FrameRepr::parse(&x.frame).unwrap_or_else(|e| panic!("{}: {e}", x.name));
                assert!(p.icrc_ok, "{}", x.name);
                assert_eq!(p.repr.ib.bth.opcode.to_string(), x.name);
            }
        }
    }

    #[test]
    fn seeds_differ() {
        assert_ne!(every_opcode(1), every_opcode(2));
        assert_eq!(every_opcode(9), every_opcode(9));
    }

    #[test]
    fn demo_conversation_is_valid() {
        let s = demo_conversation();
        assert!(s.len() > 15);
        for x in &s {
            assert!(FrameRepr::parse(&x.frame).unwrap().icrc_ok, "{}", x.name);
        }
    }
}
