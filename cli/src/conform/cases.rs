//! The built-in cases: every conformance/cases/CHAPTER/NAME.toml, listed by build.rs.

include!(concat!(env!("OUT_DIR"), "/conform_cases.rs"));
