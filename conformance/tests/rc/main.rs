//! RC transport rules, one test per rule, named after the IBTA compliance statement (or section)
//! it checks. Two engine devices on a scripted wire in virtual time (`softrdma_conformance::pair`).
//! By concern: [`messages`] (operations as they should go), [`errors`] (NAK codes, local and
//! verbs errors, QP states), [`retry`] (loss, duplicates, NAKs, RNR, retry counts) and [`window`]
//! (the requester's window and ACKs); the helpers they share are here.

use softrdma_conformance::pair::{lose_first, Fate, Pair, RcOptions, Side, BASE};
use softrdma_engine::device::{AsyncEvent, MAX_UNACKED_PSNS};
use softrdma_engine::verbs::{Mtu, QpState, WcOpcode, WcStatus};
use softrdma_engine::wire::{Opcode, Psn};
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge};

const A: usize = 0;
const B: usize = 1;
const STEPS: usize = 100_000;

mod errors;
mod messages;
mod retry;
mod window;

fn sge(s: &Side, addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge { addr, length: len, lkey: s.mr.lkey }]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn setup(o: RcOptions) -> (Pair, Side, Side) {
    let mut p = Pair::new(42);
    let (a, b) = p.connect_rc(o);
    (p, a, b)
}

fn post_recv(p: &mut Pair, side: usize, s: &Side, wr_id: u64, addr: u64, len: u32) {
    p.dev(side).post_recv(s.qpn, RecvWr { wr_id, sg_list: sge(s, addr, len) }).unwrap();
}

fn send(p: &mut Pair, s: &Side, wr_id: u64, op: SendOp, addr: u64, len: u32) {
    p.dev(A).post_send(s.qpn, SendWr::new(wr_id, op, sge(s, addr, len))).unwrap();
}
