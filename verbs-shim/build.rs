//! Compiles the one piece of the shim that must be C: the `.symver` aliases that export
//! `ibv_query_gid_type` under several private version nodes.
//!
//! The C ABI types are not generated here: they are committed (bindings/verbs.rs and
//! bindings/rdma_cma.rs, made by bindgen from rdma-core's headers; bindings/generate.rs says
//! how), so the build needs neither rdma-core's headers nor libclang.
//!
//! Also names this compilation of the crate (`SOFTRDMA_SHIM_UNIT`: this build script's OUT_DIR,
//! which is one per compiled variant), so that the `softrdma` build script, which embeds the
//! static library, can tell its own variant's archive from others in the same deps directory
//! (lib.rs `UNIT`).

fn main() {
    println!("cargo:rerun-if-changed=c/symver.c");
    println!("cargo:rerun-if-changed=bindings/verbs.rs");
    println!("cargo:rerun-if-changed=bindings/rdma_cma.rs");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rustc-env=SOFTRDMA_SHIM_UNIT=softrdma-shim-unit:{out}");
    cc::Build::new().file("c/symver.c").warnings(true).compile("softrdma_symver");
}
