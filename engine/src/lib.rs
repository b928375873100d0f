//! # softrdma-engine
//!
//! The sans-IO heart of softrdma: everything that is the InfiniBand / RoCEv2 protocol and nothing
//! that moves bytes.
//!
//! - [`wire`]: the packet formats (Ethernet, IPv4, IPv6, UDP, GRH, BTH and every IB extension
//!   header), the one opcode table that says which headers each opcode carries, the 24-bit
//!   [`wire::Psn`] with modular ordering, and the ICRC.
//! - [`device`]: one emulated HCA's objects (PD, MR, CQ, QP) and its transport engine, driven by
//!   verbs calls, `handle_packet`, `handle_timeout` and polled with `poll_transmit`, `poll_cq`,
//!   `poll_event`, `poll_timeout` (quinn-proto style): RC, UC, UD (multicast too), XRC initiator
//!   and target QPs, SRQs and XRC SRQs, memory windows.
//! - [`cm`]: the connection manager behind QP1 (REQ/REP/RTU/REJ/MRA/DREQ/DREP, timers,
//!   listeners), as the kernel's ib_cm + rdma_cm run it over RoCEv2.
//! - [`modify`]: the modify_qp attribute-mask table (the Linux kernel's `qp_state_table`), and
//!   [`connect`]: bringing a QP (or a pair facing each other) up to RTS with exactly the masks the
//!   table requires, the one bring-up tests, workloads and benchmarks use.
//! - [`verbs`] (libibverbs' numeric values), [`wr`] (work requests and completions), [`memory`]
//!   (how the engine reaches client memory: the `Memory` trait, `VecMemory` for tests), [`time`]
//!   (virtual time), [`rng`] (the seeded generator).
//!
//! Guarantees:
//! - No I/O, no clock, no threads, no unseeded randomness: time and bytes are passed in, so every
//!   run is repeatable.
//! - Parsing untrusted bytes never panics: views are built with `new_checked`, after which no
//!   accessor can index out of bounds; a bad packet is counted and dropped.
//! - No `unsafe` code.
//!
//! What it never does: open sockets, read files, spawn threads. Those live in `softrdma-transport`,
//! `softrdma-pcap` and `softrdma-device`.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod cm;
pub mod connect;
pub mod copy;
pub mod device;
pub mod fault;
pub mod memory;
pub mod modify;
pub mod rng;
pub mod time;
pub mod verbs;
pub mod wire;
pub mod wr;
