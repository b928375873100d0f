//! # softrdma-daemon
//!
//! A device as a process (docs/architecture.md D2): [`run`] starts an [`Hca`] with its device
//! thread, takes the device's lock in the runtime directory, binds the unix socket there and serves
//! the clients that attach to it ([`server`]) until it is told to stop. What clients use to find,
//! start and stop such a process (`softrdma_device::daemon::up`/`down`, `softrdma_device::client`,
//! the runtime directory's rules in `softrdma-protocol`) stays on their side of the line, so the
//! verbs shim does not link this crate.
#![warn(missing_docs, unreachable_pub)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use softrdma_device::daemon::DaemonError;
use softrdma_device::hca::{Hca, HcaConfig};
use softrdma_device::proto::DeviceInfo;
use softrdma_device::runtime;

pub mod server;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Runs a device until SIGTERM or SIGINT, or until its socket file is removed or replaced (no
/// client could reach it any more: its runtime dir was deleted), or, with `idle_exit`, until it
/// has had no client that long (what autostarted devices get): takes its lock, binds UDP and the
/// socket, serves clients. `ready` runs once the socket accepts.
pub fn run(
    cfg: HcaConfig,
    idle_exit: Option<Duration>,
    ready: impl FnOnce(&DeviceInfo),
    ended: impl FnOnce(&server::Ended),
) -> Result<server::Ended, DaemonError> {
    runtime::check_name(&cfg.name)?;
    let dir = runtime::runtime_dir()?;
    let Some(_lock) = runtime::lock_device(&dir, &cfg.name, false)? else {
        return Err(DaemonError::Running(cfg.name.clone()));
    };
    let sock_path = runtime::socket_path(&dir, &cfg.name);
    // We hold the lock, so a socket file left here is stale (a daemon that was killed).
    let _ = fs::remove_file(&sock_path);
    let hca = Arc::new(Hca::start(cfg)?);
    let io_err = |what: String| move |source| DaemonError::Io { what, source };
    let listener = UnixListener::bind(&sock_path).map_err(io_err(format!("bind {}", sock_path.display())))?;
    let _ = fs::set_permissions(&sock_path, fs::Permissions::from_mode(0o600));
    let handler = nix::sys::signal::SigHandler::Handler(on_signal);
    let action = nix::sys::signal::SigAction::new(
        handler,
        nix::sys::signal::SaFlags::empty(),
        nix::sys::signal::SigSet::empty(),
    );
    for sig in [nix::sys::signal::SIGTERM, nix::sys::signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        let _ = unsafe { nix::sys::signal::sigaction(sig, &action) };
    }
    let watch = server::Watch { socket: server::file_id(&sock_path).ok().map(|id| (sock_path.clone(), id)), idle_exit };
    ready(hca.info());
    let r = server::serve(hca.clone(), listener, &STOP, &watch);
    // Only our own socket file is removed (a replaced one belongs to another device).
    if watch.socket.as_ref().is_some_and(|(p, id)| server::file_id(p).ok() == Some(*id)) {
        let _ = fs::remove_file(&sock_path);
    }
    hca.stop();
    let r = r.map_err(io_err("accept".into()))?;
    // Said while the lock is still held: whoever sees the device ended (its lock free) can read why.
    ended(&r);
    Ok(r)
}
