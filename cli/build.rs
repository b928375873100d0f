//! Builds the verbs shim (libibverbs.so.1, librdmacm.so.1, libmlx5.so.1, libefa.so.1) and
//! embeds it in the `softrdma` binary, so that an installed `softrdma` (`cargo install --path
//! cli`) can run `softrdma exec` on a machine with no clone and no build tree: the libraries are
//! unpacked on first use into a per-user cache directory (src/shim.rs).
//!
//! The shim is the `softrdma-verbs-shim` static library relinked with rdma-core's symbol
//! versions (verbs-shim/maps/*.map: a Rust cdylib cannot carry versioned symbols). It is built
//! here by a nested `cargo build --release -p softrdma-verbs-shim` into a target directory of its
//! own beside this build's (a build script cannot wait on the outer build's own artifacts), then
//! linked with the system `cc`. Missing tools or headers fail the build with the package to
//! install. Also sets `SOFTRDMA_COMMIT` (the git commit, for `--version`) when built from a
//! clone.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries and the version map each is linked with.
const LIBS: [(&str, &str); 4] = [
    ("libibverbs.so.1", "ibverbs.map"),
    ("librdmacm.so.1", "rdmacm.map"),
    ("libmlx5.so.1", "mlx5.map"),
    ("libefa.so.1", "efa.map"),
];

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("cli/ is inside the workspace").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    commit(&root);
    // The shim's sources: its own and those of the workspace crates it links.
    for krate in ["engine", "transport", "pcap", "protocol", "device", "verbs-shim"] {
        for part in ["src", "Cargo.toml", "build.rs", "c", "maps"] {
            let p = root.join(krate).join(part);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    for f in ["Cargo.lock", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    if !root.join("verbs-shim/Cargo.toml").is_file() {
        fail(
            "the verbs-shim sources are not beside cli/ (build softrdma from the repository: cargo install --path cli)",
        );
    }
    let archive = build_archive(&root, &out);
    let shim = out.join("shim");
    std::fs::create_dir_all(&shim).expect("creating OUT_DIR/shim");
    // The cache key of the unpacked copy: FNV-1a over the libraries and the header.
    let mut id: u64 = 0xcbf29ce484222325;
    for (name, map) in LIBS {
        link(&root, &archive, &shim, name, map);
        let bytes = std::fs::read(shim.join(name)).unwrap_or_else(|e| fail(&format!("reading {name}: {e}")));
        for b in bytes.iter().chain(name.as_bytes()) {
            id = (id ^ u64::from(*b)).wrapping_mul(0x100000001b3);
        }
    }
    let header = root.join("verbs-shim/include/softrdma/ofed_xrc.h");
    println!("cargo:rerun-if-changed={}", header.display());
    for b in std::fs::read(&header).unwrap_or_else(|e| fail(&format!("{}: {e}", header.display()))) {
        id = (id ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    println!("cargo:rustc-env=SOFTRDMA_SHIM_ID={id:016x}");
}

/// `SOFTRDMA_COMMIT`: `git describe --always --dirty` of the clone, when there is one.
fn commit(root: &Path) {
    let git = root.join(".git");
    if git.exists() {
        println!("cargo:rerun-if-changed={}", git.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", git.join("index").display());
    }
    let described = Command::new("git")
        .args(["describe", "--always", "--dirty", "--exclude", "*"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty());
    println!("cargo:rustc-env=SOFTRDMA_COMMIT={}", described.as_deref().unwrap_or("unknown"));
}

/// The static library, from a nested cargo build (always release: the shim is the data path).
fn build_archive(root: &Path, out: &Path) -> PathBuf {
    // OUT_DIR is TARGET/PROFILE/build/softrdma-HASH/out: the nested build goes to TARGET/embedded-shim.
    let target = out.ancestors().nth(4).map(Path::to_path_buf).unwrap_or_else(|| out.join("t"));
    let nested = target.join("embedded-shim");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--release", "-p", "softrdma-verbs-shim", "--lib", "--target-dir"])
        .arg(&nested);
    if root.join("Cargo.lock").is_file() {
        cmd.arg("--locked");
    }
    // The outer build's settings for this package and its profile are not the nested build's.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                k.as_str(),
                "OUT_DIR"
                    | "TARGET"
                    | "HOST"
                    | "PROFILE"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "NUM_JOBS"
                    | "RUSTC_WRAPPER"
                    | "CARGO_TARGET_DIR"
                    | "CARGO_BUILD_TARGET_DIR"
            )
        {
            cmd.env_remove(&k);
        }
    }
    let status = cmd.status().unwrap_or_else(|e| fail(&format!("running cargo for the verbs shim: {e}")));
    if !status.success() {
        fail("building the verbs shim (cargo build -p softrdma-verbs-shim) failed: see its errors above");
    }
    let a = nested.join("release/libsoftrdma_verbs_shim.a");
    if !a.is_file() {
        fail(&format!("the verbs shim's static library is not where cargo puts it: {}", a.display()));
    }
    a
}

/// One library: exactly the symbols of its version map (and what they need) from the archive.
fn link(root: &Path, archive: &Path, dir: &Path, name: &str, map: &str) {
    let map = root.join("verbs-shim/maps").join(map);
    let text = std::fs::read_to_string(&map).unwrap_or_else(|e| fail(&format!("{}: {e}", map.display())));
    let mut cmd = Command::new(std::env::var_os("SOFTRDMA_CC").unwrap_or_else(|| "cc".into()));
    cmd.arg("-shared").arg("-o").arg(dir.join(name));
    cmd.arg(format!("-Wl,-soname,{name}")).arg(format!("-Wl,--version-script={}", map.display()));
    // Without debug information (the archive's is ~20 MB per library): the symbols stay.
    cmd.args(["-Wl,--gc-sections", "-Wl,-z,now", "-Wl,-z,relro", "-Wl,--strip-debug"]);
    // A map line "    symbol;" names an exported symbol: pull each in by name.
    for line in text.lines() {
        let Some(sym) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(';')) else { continue };
        if !sym.is_empty() && sym.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            cmd.arg(format!("-Wl,-u,{sym}"));
        }
    }
    if name == "libibverbs.so.1" {
        // ibv_query_gid_type's aliases (verbs-shim/c/symver.c) are referenced by no one.
        cmd.args(["-Wl,-u,softrdma_query_gid_type_34", "-Wl,-u,softrdma_query_gid_type_25"]);
    }
    cmd.arg(archive).args(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"]);
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(_) => fail(&format!("linking {name} failed (see the linker's errors above)")),
        Err(e) => fail(&format!("running cc to link {name}: {e}; install a C toolchain (apt-get install gcc)")),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("softrdma build: {msg}");
    panic!("softrdma build: {msg}");
}
