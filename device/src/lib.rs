//! # softrdma-device
//!
//! The emulated HCA as a running thing (docs/architecture.md D2-D5, D8, D9):
//! - [`hca`]: one engine device driven over RoCEv2/UDP by a device thread, with internal
//!   loopback, fault injection and the capture tap, serving the verbs calls of its clients;
//! - [`proto`], [`client`]: client processes attach over a unix socket with a versioned protocol
//!   (SO_PEERCRED, pidfd watch, fds passed with SCM_RIGHTS); the serving side, and running a
//!   device as a process, are the `softrdma-daemon` crate's;
//! - [`daemon`], [`runtime`]: starting and stopping a device process, found in the runtime
//!   directory;
//! - [`proto`], [`arena`], [`runtime`] live in `softrdma-protocol` (what the daemon and its
//!   clients share) and are re-exported here;
//! - [`memory`]: the clients' memory, reached with process_vm_readv/writev;
//! - [`verbs`]: the Rust-native verbs API, on a daemon or on a device inside the process.
#![warn(missing_docs, unreachable_pub)]

pub mod capture;
pub mod client;
mod cm;
pub mod daemon;
pub mod faults;
pub mod guard;
pub mod hca;
pub mod mcast;
pub mod memory;
pub mod paths;
pub mod signals;
pub mod verbs;

pub use hca::{Hca, HcaConfig, Progress};
pub use softrdma_protocol::{arena, proto, runtime};
