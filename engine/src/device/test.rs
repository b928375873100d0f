//! Device tests live in conformance/; this module holds only internal checks.
