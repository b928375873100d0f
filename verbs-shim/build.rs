//! Generates the C ABI types from rdma-core's installed `infiniband/verbs.h` (package
//! libibverbs-dev) into `ffi.rs` and `rdma/rdma_cma.h` (package librdmacm-dev) into
//! `cma_ffi.rs`, so every struct the shim hands to C has exactly the layout the program was
//! compiled against, and compiles the one piece that must be C: the `.symver` aliases that
//! export `ibv_query_gid_type` under several private version nodes.
//!
//! `cma_ffi.rs` defines no type of verbs.h: it takes them from `crate::ffi`, so the crate has
//! one `ibv_context`, one `ibv_qp`, one `ibv_ah_attr`.

use std::path::{Path, PathBuf};

use bindgen::callbacks::{DeriveTrait, ImplementsTrait, ParseCallbacks};

/// What bindgen may assume of the verbs.h types `cma_ffi.rs` borrows from `ffi.rs` when it
/// derives traits for the structures that embed them (`ibv_gid` in `rdma_ib_addr`, `ibv_ah_attr`
/// in `rdma_ud_param`): `ffi.rs` makes them `Copy`, and `Default` by a manual (zeroing) impl.
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

/// Bindings of rdma-core's `rdma/rdma_cma.h`: the rdma_cm structures, event types, port spaces,
/// options and `RAI_*` flags, with the verbs types taken from `crate::ffi`.
fn rdma_cma_bindings(out: &Path) {
    let header = "/usr/include/rdma/rdma_cma.h";
    if !Path::new(header).exists() {
        panic!("{header} is missing: install librdmacm's headers (apt-get install librdmacm-dev), or run scripts/install-deps.sh");
    }
    let bindings = bindgen::Builder::default()
        .header("c/rdmacm_wrapper.h")
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
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .parse_callbacks(Box::new(VerbsTypesFromFfi))
        .generate()
        .expect("bindgen on rdma/rdma_cma.h");
    bindings.write_to_file(out.join("cma_ffi.rs")).expect("write cma_ffi.rs");
}

fn main() {
    println!("cargo:rerun-if-changed=c/wrapper.h");
    println!("cargo:rerun-if-changed=c/symver.c");
    println!("cargo:rerun-if-changed=c/rdmacm_wrapper.h");
    let header = "/usr/include/infiniband/verbs.h";
    if !std::path::Path::new(header).exists() {
        panic!("{header} is missing: install rdma-core's headers (apt-get install libibverbs-dev), or run scripts/install-deps.sh");
    }
    let bindings = bindgen::Builder::default()
        .header("c/wrapper.h")
        .allowlist_type("ibv_.*|verbs_.*|_compat_ibv_port_attr|ib_uverbs_access_flags")
        .allowlist_var("IBV_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen on infiniband/verbs.h");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out.join("ffi.rs")).expect("write ffi.rs");
    rdma_cma_bindings(&out);
    cc::Build::new().file("c/symver.c").warnings(true).compile("softrdma_symver");
}
