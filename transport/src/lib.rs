//! # softrdma-transport
//!
//! Moves packets for a softrdma device. Today it holds:
//!
//! - [`faults`], the one fault model both wires use: the rates ([`faults::Faults`]: loss,
//!   ACK loss, duplication, reordering, corruption, delay), their `--faults` spec string, the
//!   seeded sampler that decides each datagram's faults, and a scripted wire's per-datagram
//!   [`faults::Fate`].
//! - [`sim`], the simulated wire: a deterministic discrete-event network of endpoints that
//!   exchange UDP datagrams (RoCEv2 payloads) under virtual time, with latency, jitter,
//!   per-sender bandwidth and seeded faults (loss, duplication, reordering, single-bit corruption,
//!   partitions), and a driver that runs them to quiescence and catches livelock. Conformance and
//!   property tests run the real engine over it (docs/architecture.md D7).
//! - [`udp`], the real wire: RoCEv2 datagrams over UDP sockets (port 4791, a pool of source
//!   ports for flow entropy, batched with GSO/GRO), and the interface MTU to active MTU rule.
//! - [`steer`], steering on a device's port: a `SO_REUSEPORT` group whose classic BPF program
//!   hands each datagram to the socket of the process that owns its destination QP.
//!
//! The test workloads that run engine devices over [`sim`] (`softrdma sim`) live in their own
//! crate, `softrdma-workloads`: nothing here exists only for tests.
//!
//! Not built yet: the optional raw-Ethernet transport. No code here pretends to be it.
//!
//! Guarantees of [`sim`]:
//! - Deterministic: the same endpoints, configuration and seed give the same run, event for
//!   event; every fault is drawn from one seeded RNG in a documented order, and events at the same
//!   instant run in the order they were scheduled.
//! - Virtual time only ([`softrdma_engine::time`]): no real clock is read, and nothing sleeps.
//! - No threads, no sockets, no I/O.
#![warn(missing_docs, unreachable_pub)]

pub mod faults;
pub mod ksock;
pub mod relay;
pub mod sim;
pub mod steer;
pub mod udp;

pub use udp::{active_mtu, interface_mtu, interface_of, GroupSocket, RoceUdp, UdpConfig, UdpError, UdpStats};
