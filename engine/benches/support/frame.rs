//! The frame the `parse_icrc` bench and the `parse_profile` example parse: an RC SEND_ONLY over
//! RoCEv2/IPv4, emitted by the engine's own encoder. Both include this file (`#[path]`).

use std::net::Ipv4Addr;

use softrdma_engine::wire::roce::{self, EmitOptions, FrameRepr};
use softrdma_engine::wire::{BthRepr, EthernetAddress, IbRepr, Opcode, Psn, Qpn};

/// An RC SEND_ONLY frame over IPv4 (10.0.0.1 to 10.0.0.2, QP 0x11, PSN 7) carrying `payload`.
pub fn rc_send_only(payload: &[u8]) -> Vec<u8> {
    let mut ib = IbRepr::new(BthRepr {
        pad_count: IbRepr::pad_for(payload.len()),
        ack_req: true,
        ..BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11), Psn::new(7))
    });
    ib.payload_len = payload.len();
    let repr = FrameRepr {
        eth: roce::default_eth(EthernetAddress([2, 0, 0, 0, 0, 1]), EthernetAddress([2, 0, 0, 0, 0, 2])),
        vlan_tci: None,
        l3: roce::ipv4_default(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 0),
        udp_src_port: 0xc011,
        ib,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, payload, EmitOptions::default()).expect("emit");
    buf
}
