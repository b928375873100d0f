//! # softrdma-transport
//!
//! Moves packets for a softrdma device: RoCEv2 over UDP port 4791 (batched with GSO/GRO) and an
//! in-memory simulated wire with seeded faults and virtual time.
//!
//! Status: not built yet. The UDP transport and the simulated wire arrive with the engine and
//! device issues; this crate exists so the workspace has its final shape. It holds no code that
//! pretends to work.
#![warn(missing_docs, unreachable_pub)]
