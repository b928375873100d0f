//! # softrdma-verbs-shim
//!
//! The C ABI drop-ins: `libibverbs.so.1`, `librdmacm.so.1` and stub `libmlx5.so.1` /
//! `libefa.so.1`, exporting rdma-core's public ABI over the softrdma device client so that
//! unchanged verbs programs run on softrdma.
//!
//! Status: not built yet (the verbs shim issue). No symbol is exported today; nothing here
//! pretends to be libibverbs.
#![warn(missing_docs, unreachable_pub)]
