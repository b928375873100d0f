//! # softrdma-bindgen
//!
//! How the verbs shim's committed C bindings (verbs-shim/bindings/verbs.rs and rdma_cma.rs) are
//! made from rdma-core's installed headers. Not part of the shim's build: the shim compiles the
//! committed files, so building it (and the `softrdma` binary that embeds it) needs no rdma-core
//! headers and no libclang. This crate's test (tests/current.rs) regenerates them from the
//! installed headers and fails on any difference; `scripts/regen-bindings.sh` rewrites them
//! (`cargo run -p softrdma-bindgen -- write`).

use std::path::{Path, PathBuf};

use bindgen::callbacks::{DeriveTrait, ImplementsTrait, ParseCallbacks};

/// The headers the bindings are generated from (packages libibverbs-dev and librdmacm-dev).
pub const VERBS_H: &str = "/usr/include/infiniband/verbs.h";
pub const RDMA_CMA_H: &str = "/usr/include/rdma/rdma_cma.h";

/// What bindgen may assume of the verbs.h types `rdma_cma.rs` borrows from `verbs.rs` when it
/// derives traits for the structures that embed them (`ibv_gid` in `rdma_ib_addr`, `ibv_ah_attr`
/// in `rdma_ud_param`): `verbs.rs` makes them `Copy`, and `Default` by a manual (zeroing) impl.
#[derive(Debug)]
struct VerbsTypesFromFfi;

impl ParseCallbacks for VerbsTypesFromFfi {
    fn blocklisted_type_implements_trait(&self, name: &str, derive: DeriveTrait) -> Option<ImplementsTrait> {
        if !name.starts_with("ibv_") && !name.starts_with("union ibv_") && !name.starts_with("struct ibv_") {
            return None;
        }
        Some(match derive {
            DeriveTrait::Copy => ImplementsTrait::Yes,
            DeriveTrait::Default => ImplementsTrait::Manually,
            _ => ImplementsTrait::No,
        })
    }
}

/// The bindgen this crate builds with (Cargo.lock pins it): its output is part of the files.
const BINDGEN: &str = "0.72";

/// The first lines of each generated file: what it is and how it was made.
fn preamble(header: &str, rdma_core: &str) -> String {
    format!(
        "// Generated from rdma-core {rdma_core}'s {header} by bindgen {BINDGEN} (verbs-shim/bindgen).\n\
         // Do not edit: regenerate with scripts/regen-bindings.sh (needs libibverbs-dev, librdmacm-dev\n\
         // and libclang-dev); `cargo test -p softrdma-bindgen` checks that it is current.\n"
    )
}

/// Bindings of `infiniband/verbs.h`: every `ibv_*`/`verbs_*` type and `IBV_*` constant.
pub fn verbs(rdma_core: &str, wrapper_dir: &Path) -> Result<String, String> {
    let body = bindgen::Builder::default()
        .header(wrapper_dir.join("wrapper.h").to_string_lossy())
        .allowlist_type("ibv_.*|verbs_.*|_compat_ibv_port_attr|ib_uverbs_access_flags")
        .allowlist_var("IBV_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .map_err(|e| format!("bindgen on {VERBS_H}: {e}"))?
        .to_string();
    Ok(preamble(VERBS_H, rdma_core) + &body)
}

/// Bindings of `rdma/rdma_cma.h`: the rdma_cm structures, event types, port spaces, options and
/// `RAI_*` flags, with the verbs types taken from `crate::ffi` (the `use` below).
pub fn rdma_cma(rdma_core: &str, wrapper_dir: &Path) -> Result<String, String> {
    let body = bindgen::Builder::default()
        .header(wrapper_dir.join("rdmacm_wrapper.h").to_string_lossy())
        .allowlist_type("rdma_.*|RDMA_.*|rai_.*|RAI_.*|ibv_sa_path_rec")
        .allowlist_var("rdma_.*|RDMA_.*|rai_.*|RAI_.*")
        // Everything verbs.h defines is `crate::ffi`'s (the raw_line below brings it in scope).
        .blocklist_file(".*/infiniband/verbs\\.h")
        // bindgen still walks the blocklisted types, and would emit the libc types they hold.
        .blocklist_type("pthread_.*|__pthread_.*|__atomic_wide_counter.*")
        .raw_line("#[allow(unused_imports)]")
        .raw_line("use crate::ffi::*;")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(VerbsTypesFromFfi))
        .generate()
        .map_err(|e| format!("bindgen on {RDMA_CMA_H}: {e}"))?
        .to_string();
    Ok(preamble(RDMA_CMA_H, rdma_core) + &body)
}

/// The installed rdma-core's version, as its `libibverbs-dev` package states it (Debian), or
/// as pkg-config does elsewhere.
pub fn rdma_core_version() -> Option<String> {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    run("dpkg-query", &["-W", "-f=${Version}", "libibverbs-dev"])
        .or_else(|| run("pkg-config", &["--modversion", "libibverbs"]))
}

/// The verbs-shim directory (this crate lives in verbs-shim/bindgen).
pub fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("verbs-shim/bindgen is inside verbs-shim").to_path_buf()
}

/// What regeneration cannot run without, by name; empty when it can run.
pub fn missing_inputs() -> Vec<String> {
    let mut missing: Vec<String> =
        [VERBS_H, RDMA_CMA_H].into_iter().filter(|h| !Path::new(h).exists()).map(str::to_owned).collect();
    // bindgen loads libclang when first asked (clang-sys looks in LIBCLANG_PATH, llvm-config's
    // directory and the usual library directories); a failed load is a panic there.
    let loaded = std::panic::catch_unwind(bindgen::clang_version).is_ok_and(|v| v.parsed.is_some());
    if !loaded {
        missing.push("libclang (apt-get install libclang-dev)".to_owned());
    }
    missing
}

/// The two files as the installed headers give them: (file name under verbs-shim/bindings, text).
pub fn generate_all() -> Result<Vec<(&'static str, String)>, String> {
    let version = rdma_core_version().unwrap_or_else(|| "(unknown version)".to_owned());
    let c = shim_dir().join("c");
    Ok(vec![("verbs.rs", verbs(&version, &c)?), ("rdma_cma.rs", rdma_cma(&version, &c)?)])
}

/// The committed files that differ from what the installed headers give, each with its first
/// differing line.
pub fn stale() -> Result<Vec<String>, String> {
    let mut stale = Vec::new();
    for (name, generated) in generate_all()? {
        let path = shim_dir().join("bindings").join(name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed == generated {
            continue;
        }
        let at = committed.lines().zip(generated.lines()).position(|(a, b)| a != b).map_or_else(
            || {
                format!(
                    "lengths differ: {} lines committed, {} generated",
                    committed.lines().count(),
                    generated.lines().count()
                )
            },
            |i| {
                format!(
                    "first difference at line {}:\n  committed: {}\n  generated: {}",
                    i + 1,
                    committed.lines().nth(i).unwrap_or(""),
                    generated.lines().nth(i).unwrap_or("")
                )
            },
        );
        stale.push(format!("{}: {at}", path.display()));
    }
    Ok(stale)
}

/// Rewrites the committed files from the installed headers; returns the paths written.
pub fn write_all() -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for (name, text) in generate_all()? {
        let path = shim_dir().join("bindings").join(name);
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
