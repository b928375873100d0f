//! Builds the verbs shim (libibverbs.so.1, librdmacm.so.1, libmlx5.so.1, libefa.so.1) and
//! embeds it in the `softrdma` binary, so that an installed `softrdma` (`cargo install --path
//! cli`) can run `softrdma exec` on a machine with no clone and no build tree: the libraries are
//! unpacked on first use into a per-user cache directory (src/shim.rs).
//!
//! The shim is the `softrdma-verbs-shim` static library relinked with rdma-core's symbol
//! versions (verbs-shim/maps/*.map: a Rust cdylib cannot carry versioned symbols). It is this
//! package's build dependency, so the same cargo run compiles it, sharing the compiled engine,
//! transport and device crates with the binary (see the build dependencies in Cargo.toml), and
//! this script links it with the system `cc`. It needs no rdma-core headers and no libclang (the
//! C bindings are committed). A missing C compiler fails the build with the package to install.
//! Also sets `SOFTRDMA_COMMIT` (the git commit, for `--version`) when built from a clone.

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
    conform_cases(&root, &out);
    // A change to the shim's code rebuilds the build dependency, and so reruns this script; the
    // version maps are read here only.
    println!("cargo:rerun-if-changed={}", root.join("verbs-shim/maps").display());
    let archive = find_archive(&out);
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

/// The static library: this package's build dependency `softrdma-verbs-shim`, which cargo has
/// compiled (crate types staticlib and rlib) into the deps directory before running this script.
/// Several variants of it can sit there (the workspace's own test builds, other profiles); ours
/// is the one that carries our build dependency's `UNIT` bytes.
fn find_archive(out: &Path) -> PathBuf {
    // OUT_DIR is TARGET[/TRIPLE]/PROFILE/build/softrdma-HASH/out; a build dependency is compiled
    // for the host, into TARGET/PROFILE/deps (the same directory unless --target is given).
    let profile_dir = out.ancestors().nth(3).unwrap_or(out);
    let mut dirs = vec![profile_dir.join("deps")];
    if let (Some(name), Some(up)) = (profile_dir.file_name(), profile_dir.ancestors().nth(2)) {
        dirs.push(up.join(name).join("deps"));
    }
    let unit = softrdma_verbs_shim::UNIT.as_bytes();
    let mut seen = Vec::new();
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("libsoftrdma_verbs_shim-") && name.ends_with(".a")) {
                continue;
            }
            let path = e.path();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| fail(&format!("reading {}: {e}", path.display())));
            if bytes.windows(unit.len()).any(|w| w == unit) {
                println!("cargo:rerun-if-changed={}", path.display());
                return path;
            }
            seen.push(name);
        }
    }
    fail(&format!(
        "the verbs shim's static library of this build is not in {} (saw: {:?})",
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" or "),
        seen
    ))
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

/// The conformance cases (conformance/cases/CHAPTER/NAME.toml) built into the binary, so that an
/// installed `softrdma conform` has them: OUT_DIR/conform_cases.rs, one `("CHAPTER/NAME",
/// include_str!(...))` per file, sorted.
fn conform_cases(root: &Path, out: &Path) {
    let dir = root.join("conformance/cases");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files = Vec::new();
    for chapter in std::fs::read_dir(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display()))) {
        let chapter = chapter.unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display()))).path();
        if !chapter.is_dir() {
            continue;
        }
        println!("cargo:rerun-if-changed={}", chapter.display());
        for f in std::fs::read_dir(&chapter).unwrap_or_else(|e| fail(&format!("{}: {e}", chapter.display()))) {
            let f = f.unwrap_or_else(|e| fail(&format!("{}: {e}", chapter.display()))).path();
            if f.extension().is_some_and(|e| e == "toml") {
                let name = format!(
                    "{}/{}",
                    chapter.file_name().unwrap_or_default().to_string_lossy(),
                    f.file_stem().unwrap_or_default().to_string_lossy()
                );
                println!("cargo:rerun-if-changed={}", f.display());
                files.push((name, f));
            }
        }
    }
    files.sort();
    let mut src = String::from("pub(crate) const ALL: &[(&str, &str)] = &[\n");
    for (name, path) in &files {
        src.push_str(&format!("    ({name:?}, include_str!({:?})),\n", path.display().to_string()));
    }
    src.push_str("];\n");
    std::fs::write(out.join("conform_cases.rs"), src).unwrap_or_else(|e| fail(&format!("conform_cases.rs: {e}")));
}
