//! # softrdma-workloads
//!
//! Test workloads: engine devices as nodes of the simulated wire
//! ([`softrdma_transport::sim`]), running N messages of chosen operations and sizes under seeded
//! faults, and a runner that checks what arrived against what was posted: nothing lost,
//! duplicated, reordered or corrupted (exactly once, in order). `softrdma sim` prints their
//! [`Report`]; the property tests assert on it.
//!
//! - [`workload`]: RC, Q connected QP pairs, SEND, WRITE, READ and atomics.
//! - [`services`]: the other services: XRC fan-in (initiators to the SRQs of one domain), UD and
//!   UC.
//! - [`DeviceNode`]: an engine device as an endpoint of the simulated wire.
//!
//! Guarantees: deterministic (the same workload and seed give the same report, the devices, the
//! wire and the choice of operations all seeded from it); virtual time only; no threads, no
//! sockets, no I/O. QPs are brought up with [`softrdma_engine::connect`], as everywhere else.
//!
//! What it never is: production code. The device does not depend on it; the CLI's `sim`
//! command and the tests do.
#![warn(missing_docs, unreachable_pub)]

mod node;
pub mod services;
pub mod workload;

pub use node::DeviceNode;
pub use workload::{Op, Report, Workload, WorkloadError};
