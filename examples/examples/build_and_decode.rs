//! Builds a RoCEv2 RDMA WRITE with immediate using the engine's wire module, then parses it back
//! and checks its ICRC: `cargo run -p softrdma-examples --example build_and_decode`.

use std::net::Ipv4Addr;

use softrdma_engine::wire::roce::{self, EmitOptions, FrameRepr};
use softrdma_engine::wire::{BthRepr, EthernetAddress, IbRepr, ImmDtRepr, Opcode, Psn, Qpn, RethRepr};

fn main() {
    let payload = b"written by RDMA";
    let mut ib = IbRepr::new(BthRepr {
        pad_count: IbRepr::pad_for(payload.len()),
        ack_req: true,
        ..BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, Qpn::new(0x12), Psn::new(0xff_fffe))
    });
    ib.reth = Some(RethRepr { va: 0x7f00_0000_1000, rkey: 0x1234, dma_len: payload.len() as u32 });
    ib.immdt = Some(ImmDtRepr { imm: 42 });
    ib.payload_len = payload.len();
    let frame = FrameRepr {
        eth: roce::default_eth(EthernetAddress([2, 0, 0, 0, 0, 1]), EthernetAddress([2, 0, 0, 0, 0, 2])),
        vlan_tci: None,
        l3: roce::ipv4_default(Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2), 0),
        udp_src_port: 0xc012,
        ib,
    };
    let mut buf = vec![0u8; frame.buffer_len()];
    let n = frame.emit(&mut buf, payload, EmitOptions::default()).expect("consistent headers");
    let parsed = FrameRepr::parse(&buf[..n]).expect("our own frame parses");
    println!(
        "{} bytes: {} psn={} icrc={:08x} ok={} payload={:?}",
        n,
        parsed.repr.ib.bth.opcode,
        parsed.repr.ib.bth.psn,
        parsed.ib.icrc(),
        parsed.icrc_ok,
        String::from_utf8_lossy(parsed.ib.payload())
    );
    assert!(parsed.icrc_ok);
}
