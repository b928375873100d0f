//! A device as a process (design D2): `softrdma daemon` runs one, `up` starts one in the
//! background and waits until it answers, `down` stops one.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{ClientError, Connection};
use crate::hca::{Hca, HcaConfig, HcaError};
use crate::proto::DeviceInfo;
use crate::runtime::{self, RuntimeError};
use crate::server;

/// Why a daemon could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Runtime directory or name.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The device could not start (bind failure names --addr).
    #[error(transparent)]
    Hca(#[from] HcaError),
    /// Another process runs (or is starting) this device.
    #[error("device {0} is already running or starting (its lock file is held)")]
    Running(String),
    /// The daemon did not come up.
    #[error("device {name} did not start: {why}")]
    StartFailed {
        /// Device.
        name: String,
        /// What happened (the daemon's log).
        why: String,
    },
    /// Connecting to it failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// I/O on the socket or log.
    #[error("{what}: {source}")]
    Io {
        /// What.
        what: String,
        /// Error.
        source: io::Error,
    },
}

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
    r.map_err(io_err("accept".into()))
}

/// How long an autostarted device (the shim's, `softrdma exec`'s) lives with no client.
pub const AUTOSTART_IDLE_EXIT: Duration = Duration::from_secs(300);

/// The log file of a background device.
pub fn log_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.log"))
}

/// The exit status of a `daemon` whose device another process already runs or starts (its
/// lock file is held): EX_TEMPFAIL.
pub const EXIT_ALREADY_RUNNING: u8 = 75;

/// Starts device `name` in the background (`exe daemon --name NAME ARGS...`, detached in its own
/// process group, output to NAME.log in the runtime dir) unless it already answers, and waits
/// until it does.
pub fn up(exe: &Path, name: &str, args: &[String]) -> Result<DeviceInfo, DaemonError> {
    runtime::check_name(name)?;
    let dir = runtime::runtime_dir()?;
    if runtime::is_live(&dir, name) {
        return Ok(Connection::connect_in(&dir, name)?.info);
    }
    let log = log_path(&dir, name);
    let io_err = |what: String| move |source| DaemonError::Io { what, source };
    let out = fs::File::create(&log).map_err(io_err(format!("create {}", log.display())))?;
    let err = out.try_clone().map_err(io_err("log".into()))?;
    let mut child = Command::new(exe)
        .arg("daemon")
        .arg("--name")
        .arg(name)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(io_err(format!("start {}", exe.display())))?;
    let deadline = Instant::now() + server::START_TIMEOUT;
    loop {
        if runtime::is_live(&dir, name) {
            return Ok(Connection::connect_in(&dir, name)?.info);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Lost a start race to another `up`? Then that one comes up. (Not told by the log
            // alone: every racing `up` recreates the same log file, truncating what a loser wrote.)
            let text = fs::read_to_string(&log).unwrap_or_default();
            let lost_race =
                status.code() == Some(i32::from(EXIT_ALREADY_RUNNING)) || text.contains("already running or starting");
            if !lost_race {
                return Err(DaemonError::StartFailed {
                    name: name.to_owned(),
                    why: format!("{status}: {}", text.trim()),
                });
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(DaemonError::StartFailed { name: name.to_owned(), why: "no answer within 10 s".into() });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops device `name` (SIGTERM) and waits until it is gone. `Ok(false)`: it was not running.
pub fn down(name: &str) -> Result<bool, DaemonError> {
    runtime::check_name(name)?;
    let dir = runtime::runtime_dir()?;
    let pid = match Connection::connect_in(&dir, name) {
        Ok(c) => c.info.pid,
        Err(ClientError::NoDevice { .. }) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while runtime::is_live(&dir, name) || runtime::socket_path(&dir, name).exists() {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            let _ = fs::remove_file(runtime::socket_path(&dir, name));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(true)
}
