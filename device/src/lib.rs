//! # softrdma-device
//!
//! The emulated HCA as a running thing: it will drive one engine device over a transport, serve
//! client processes over IPC (unix socket, shared-memory rings, eventfds), reach their memory and
//! keep rxe-named counters; it can also run embedded in a process.
//!
//! Status: not built yet (the device issue). This crate exists so the workspace has its final
//! shape; it holds no code that pretends to work.
#![warn(missing_docs, unreachable_pub)]
