//! # softrdma-examples
//!
//! Runnable examples of the softrdma Rust API (`cargo run -p softrdma-examples --example NAME`).
//! Today the API is the wire format, so the one example builds a RoCEv2 packet with the engine's
//! encoder and decodes it back. The verbs examples (rc pingpong, XRC fan-in, UD, SRQ, write
//! bandwidth, LNet-style bulk RDMA) arrive with the device.
#![warn(missing_docs, unreachable_pub)]
