//! What a device's daemon and its clients share (issue 21's crate line): the client protocol's
//! frames and messages ([`proto`]), the shared-memory arena both sides map with its ring layout
//! ([`arena`]), and where devices live on a node and who may use them ([`runtime`]). The device
//! crate (`softrdma-device`: the daemon, the provider and the verbs API) re-exports all three.

#![warn(missing_docs, unreachable_pub)]

pub mod arena;
pub mod proto;
pub mod runtime;
