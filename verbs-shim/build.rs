//! Generates the C ABI types from rdma-core's installed `infiniband/verbs.h` (package
//! libibverbs-dev), so every struct the shim hands to C has exactly the layout the program was
//! compiled against, and compiles the one piece that must be C: the `.symver` aliases that
//! export `ibv_query_gid_type` under several private version nodes.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=c/wrapper.h");
    println!("cargo:rerun-if-changed=c/symver.c");
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
    cc::Build::new().file("c/symver.c").warnings(true).compile("softrdma_symver");
}
