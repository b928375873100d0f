//! The `softrdma` binary and the verbs shim it embeds share their compiled crates: the shim is a
//! build dependency of the binary (cli/build.rs), and cargo compiles a crate once for both only
//! where the two dependency graphs agree on its features and profile (cli/Cargo.toml's build
//! dependencies, Cargo.toml's [profile.release.build-override]). When they drift apart, the
//! engine, transport and device are compiled twice and the README's first command (a cold
//! `cargo build --release -p softrdma`) takes a third longer. Asked of cargo's unit graph (an
//! unstable flag, allowed on the stable toolchain by RUSTC_BOOTSTRAP).

use std::collections::BTreeMap;
use std::process::Command;

#[test]
fn release_build_compiles_each_crate_once() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args(["build", "--release", "--locked", "-p", "softrdma", "--unit-graph", "-Z", "unstable-options"])
        .env("RUSTC_BOOTSTRAP", "1")
        .output()
        .expect("running cargo");
    assert!(out.status.success(), "cargo --unit-graph failed: {}", String::from_utf8_lossy(&out.stderr));
    let graph: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the unit graph is JSON");
    let units = graph["units"].as_array().expect("units");
    // Library compilations by package: more than one means two variants of the crate.
    let mut libs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for u in units {
        let kinds = u["target"]["kind"].as_array().expect("kind");
        if u["mode"] != "build" || !kinds.iter().any(|k| k == "lib" || k == "staticlib" || k == "rlib") {
            continue;
        }
        let pkg = u["pkg_id"].as_str().expect("pkg_id");
        let name = pkg.rsplit('#').next().unwrap_or(pkg).to_owned();
        let variant = format!("features {} profile {}", u["features"], u["profile"]);
        libs.entry(name).or_default().push(variant);
    }
    assert!(libs.contains_key("softrdma-verbs-shim@0.1.0"), "the shim is not in the graph: {:?}", libs.keys());
    let twice: Vec<String> = libs
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(name, variants)| format!("{name}:\n    {}", variants.join("\n    ")))
        .collect();
    assert!(
        twice.is_empty(),
        "crates compiled twice by `cargo build --release -p softrdma` (the build graph of the embedded shim differs from \
         the binary's; align cli/Cargo.toml's build dependencies or the profiles):\n{}",
        twice.join("\n")
    );
}
