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
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: IbRepr::pad_for(payload.len()),
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: dest,
        ack_req: vals.3 & 1 == 1,
        psn: Psn::new(psn),
    });
    let (va, rkey, len, syn, data) = vals;
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
