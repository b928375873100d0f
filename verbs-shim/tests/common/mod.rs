//! What the tests that run C programs on the built shim share: where the shim and `softrdma`
//! are, and stopping the device a test started.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The device the tests use.
pub const DEVICE: &str = "srdma0";

/// The cargo target dir, as scripts/build-shim.sh sees it ($CARGO_TARGET_DIR, else target/).
pub fn target_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("verbs-shim sits in the workspace");
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(d) => root.join(d),
        None => root.join("target"),
    }
}

/// The shim directory: $SOFTRDMA_SHIM_DIR, else <target>/release/shim.
pub fn shim_dir() -> PathBuf {
    match std::env::var_os("SOFTRDMA_SHIM_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => target_dir().join("release").join("shim"),
    }
}

/// The `softrdma` executable: $SOFTRDMA_BIN, else beside the shim directory (where the shim
/// itself looks), else <target>/release/softrdma.
pub fn softrdma_bin(shim: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("SOFTRDMA_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let beside = shim.join("..").join("softrdma");
    if beside.is_file() {
        return beside;
    }
    target_dir().join("release").join("softrdma")
}

/// The built shim directory and the `softrdma` executable; both must be there.
pub fn built_shim() -> (PathBuf, PathBuf) {
    let shim = shim_dir();
    assert!(shim.join("libibverbs.so.1").is_file(), "the shim is not built: run scripts/build-shim.sh first");
    let exe = softrdma_bin(&shim);
    assert!(exe.is_file(), "{} is missing: scripts/build-shim.sh builds it", exe.display());
    (shim, exe)
}

/// A private runtime dir (mode 0700), `rt` in `work`.
pub fn runtime_dir(work: &Path) -> PathBuf {
    let runtime = work.join("rt");
    std::fs::create_dir(&runtime).expect("runtime dir");
    std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    runtime
}

/// `softrdma up DEVICE` on 127.0.0.1 with a free UDP port, in runtime dir `runtime`; the port.
pub fn up_on_free_port(exe: &Path, runtime: &Path) -> u16 {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("free UDP port").port();
    let o = Command::new(exe)
        .args(["up", DEVICE, "--addr", "127.0.0.1", "--port", &port.to_string()])
        .env("SOFTRDMA_RUNTIME_DIR", runtime)
        .output()
        .expect("run softrdma up");
    assert!(o.status.success(), "softrdma up {DEVICE} --port {port} failed:\n{}", text(&o));
    port
}

/// Reads `r` to its end on a thread of its own (a pipe a child fills while the test waits).
pub fn read_all(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Waits for `child` until `deadline`, and kills it then: its exit status, and whether it was
/// killed.
pub fn wait_until(child: &mut Child, deadline: Instant) -> (ExitStatus, bool) {
    loop {
        if let Some(s) = child.try_wait().expect("wait for the program") {
            return (s, false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return (child.wait().expect("wait for the killed program"), true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` (stdin closed, stdout and stderr captured), killing it after `timeout`: its output,
/// and whether it timed out.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> (Output, bool) {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {}: {e}", cmd.get_program().to_string_lossy()));
    let t_out = read_all(child.stdout.take().expect("piped"));
    let t_err = read_all(child.stderr.take().expect("piped"));
    let (status, timed_out) = wait_until(&mut child, Instant::now() + timeout);
    let stdout = t_out.join().unwrap_or_default();
    let stderr = t_err.join().unwrap_or_default();
    (Output { status, stdout, stderr }, timed_out)
}

/// A process's stdout and stderr as text.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `softrdma down DEVICE` in runtime dir `runtime`.
pub fn down(exe: &Path, runtime: &Path) -> std::io::Result<Output> {
    Command::new(exe).args(["down", DEVICE]).env("SOFTRDMA_RUNTIME_DIR", runtime).output()
}

/// Stops the device when the test ends, pass or fail.
pub struct Down<'a> {
    pub exe: &'a Path,
    pub runtime: &'a Path,
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        match down(self.exe, self.runtime) {
            Ok(o) => eprintln!("softrdma down {DEVICE}: {}", text(&o).trim()),
            Err(e) => eprintln!("softrdma down {DEVICE}: cannot run {}: {e}", self.exe.display()),
        }
    }
}

/// Compiles the C test program `tests/abi/NAME.c` against rdma-core's installed headers, linked
/// with -libverbs (the shim answers at run time), into `dir`; returns the executable.
pub fn compile_c(shim: &Path, name: &str, dir: &Path) -> PathBuf {
    compile_c_with(shim, name, dir, &[])
}

/// [`compile_c`] with more libraries after -libverbs (e.g. `-lrdmacm`).
pub fn compile_c_with(shim: &Path, name: &str, dir: &Path, libs: &[&str]) -> PathBuf {
    let mut args = vec![format!("-L{}", shim.display()), "-libverbs".to_string()];
    args.extend(libs.iter().map(|l| l.to_string()));
    compile_c_args(name, dir, &args)
}

/// Compiles `tests/abi/NAME.c` with the shim's headers (`-I<shim>/include`) and linked with the
/// shim's own libibverbs.so.1, for programs that call what only it exports (OFED's XRC verbs).
pub fn compile_c_on_shim(shim: &Path, name: &str, dir: &Path) -> PathBuf {
    let args = [format!("-I{}", shim.join("include").display()), shim.join("libibverbs.so.1").display().to_string()];
    compile_c_args(name, dir, &args)
}

/// `cc -O1 -Wall -Werror tests/abi/NAME.c -o DIR/NAME ARGS...`.
fn compile_c_args(name: &str, dir: &Path, args: &[String]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi").join(format!("{name}.c"));
    let bin = dir.join(name);
    let cc = std::env::var_os("CC").filter(|c| !c.is_empty()).unwrap_or_else(|| "cc".into());
    let o = Command::new(&cc)
        .args(["-O1", "-Wall", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cc.to_string_lossy()));
    assert!(o.status.success(), "compiling {} failed:\n{}", src.display(), text(&o));
    bin
}
