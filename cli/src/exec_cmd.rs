//! `softrdma exec -- PROG ARGS...`: runs an unchanged verbs program on softrdma. The verbs shim
//! (libibverbs.so.1, librdmacm.so.1, stub libmlx5.so.1 and libefa.so.1) goes first on
//! LD_LIBRARY_PATH, the default device starts unless a device already runs, and the devices are
//! presented in /dev and /sys in a private mount namespace (`present`).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use softrdma_device::{daemon, runtime};

/// The default device, as the shim starts it when it finds none ($SOFTRDMA_DEFAULT_ADDR chooses
/// another address).
const DEFAULT_DEVICE: &str = "srdma0";
const DEFAULT_ADDR: &str = "127.0.0.1";

/// Runs `program` on softrdma (the shim directory: `crate::shim::dir`).
pub(crate) fn run(program: &[String], present: bool) -> Result<ExitCode> {
    if program.is_empty() {
        bail!("usage: softrdma exec -- PROGRAM [ARGS...]");
    }
    let exe = std::env::current_exe().context("finding the softrdma executable")?;
    crate::shim::dir()?;
    let dir = runtime::runtime_dir()?;
    if runtime::list_devices(&dir).is_empty() {
        let addr = std::env::var("SOFTRDMA_DEFAULT_ADDR").unwrap_or_else(|_| DEFAULT_ADDR.to_owned());
        let idle = daemon::AUTOSTART_IDLE_EXIT.as_secs().to_string();
        let args = vec!["--addr".to_owned(), addr, "--idle-exit".to_owned(), idle];
        daemon::up(&exe, DEFAULT_DEVICE, &args)?;
    }
    if present {
        // Middleware looks for the device in /dev and /sys before it calls verbs.
        if let Err(e) = crate::present::present(&dir, false) {
            eprintln!(
                "softrdma exec: the devices are not presented in /dev/infiniband and /sys/class/infiniband ({e:#}); \
                 programs that look there (UCX, Open MPI, pyverbs' rdma_cm tests) will not find them"
            );
        }
    }
    exec_with_shim(program, &[])
}

/// `cluster exec`: the process is already in the host's network namespace; its device runs in
/// `dir`. The presentation is not optional here (a cluster host is for middleware), and sysfs is
/// mounted afresh so that /sys/class/net is the host's.
pub(crate) fn exec_presented(program: &[String], dir: &Path) -> Result<ExitCode> {
    crate::present::present(dir, true).context("presenting the host's device")?;
    let mut env = vec![("SOFTRDMA_RUNTIME_DIR", dir.as_os_str()), ("SOFTRDMA_NO_AUTOSTART", "1".as_ref())];
    // The cluster's hosts share this machine's cores, but each host's launcher sees them all
    // as its own: Open MPI's default binding (a job of up to two ranks a host: each to a core,
    // from the first) put the rank of every host on core 0, where two ranks polling their
    // transports took turns by time slice: an 8 B ping-pong between two hosts cost 5.1 ms a
    // round trip over pml ucx and 8.1 ms over ob1 tcp, against 33 us and 13 us unbound
    // (BENCHMARKS.md, "Measured apart from `softrdma bench`"). Unbound unless the job says
    // otherwise (`--bind-to`, or this variable set by the caller).
    if std::env::var_os(OMPI_BINDING).is_none() {
        env.push((OMPI_BINDING, "none".as_ref()));
    }
    exec_with_shim(program, &env)
}

/// Open MPI's binding policy (`--bind-to`; mpirun passes it on to the daemons it starts).
const OMPI_BINDING: &str = "OMPI_MCA_hwloc_base_binding_policy";

/// Replaces this process with the program, the shim first on LD_LIBRARY_PATH.
fn exec_with_shim(program: &[String], env: &[(&str, &std::ffi::OsStr)]) -> Result<ExitCode> {
    let Some((prog, args)) = program.split_first() else { bail!("no program") };
    let exe = std::env::current_exe().context("finding the softrdma executable")?;
    let shim = crate::shim::dir()?;
    let mut path = shim.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut c = Command::new(prog);
    c.args(args).env("LD_LIBRARY_PATH", path).env("SOFTRDMA_BIN", &exe);
    for (k, v) in env {
        c.env(k, v);
    }
    let err = c.exec();
    bail!("cannot run {prog}: {err}")
}
