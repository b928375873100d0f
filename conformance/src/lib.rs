//! # softrdma-conformance
//!
//! The conformance suite: tests named after the IBTA rule (or the reference artefact) they check.
//! Today it checks the wire format against independent oracles: the golden packets and real
//! hardware captures in `../shared`, and tshark's decoding of packets we emit.
//!
//! The library part holds what the tests share: [`pair`], two engine devices on a scripted wire in
//! virtual time; where the shared reference data is; hex decoding.
#![warn(missing_docs, unreachable_pub)]

pub mod pair;

use std::path::PathBuf;

/// The `../shared` directory beside the repository (reference data; never copied into the repo).
pub fn shared_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.join("..").join("..").join("shared")
}

/// Decodes a hex string (whitespace ignored). Panics on bad hex: only for test fixtures.
pub fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("bad hex")).collect()
}
