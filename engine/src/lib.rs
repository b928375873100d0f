//! # softrdma-engine
//!
//! The sans-IO heart of softrdma: everything that is the InfiniBand / RoCEv2 protocol and nothing
//! that moves bytes. It holds [`verbs`], the verbs vocabulary with libibverbs' numeric values,
//! [`time`], the virtual clock every input carries, and [`wire`], the packet formats (Ethernet, IPv4, IPv6, UDP, GRH,
//! BTH and every IB extension header), the one opcode table that says which headers each opcode
//! carries, the 24-bit [`wire::Psn`] with modular ordering, and the ICRC.
//!
//! Guarantees:
//! - No I/O, no clock, no threads, no unseeded randomness: time and bytes are passed in.
//! - Parsing untrusted bytes never panics: views are built with `new_checked`, after which no
//!   accessor can index out of bounds.
//! - No `unsafe` code.
//!
//! What it never does: open sockets, read files, spawn threads. Those live in `softrdma-transport`,
//! `softrdma-pcap` and `softrdma-device`.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod device;
pub mod memory;
pub mod modify;
pub mod rng;
pub mod time;
pub mod verbs;
pub mod wire;
pub mod wr;
