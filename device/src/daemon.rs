//! A device as a process (docs/architecture.md D2), from its clients' side: `up` starts one in the
//! background (`softrdma daemon`, which the `softrdma-daemon` crate runs) and waits until it
//! answers, `down` stops one.

use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::{ClientError, Connection};
use crate::hca::HcaError;
use crate::proto::DeviceInfo;
use crate::runtime::{self, RuntimeError};

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

/// How long `up` waits for a device it started to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

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
    let mut cmd = Command::new(exe);
    cmd.arg("daemon").arg("--name").arg(name).args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    // A session of its own (setsid: its own process group too, no controlling terminal). Where
    // the kernel shares CPU time out by session (autogroup, on in most distributions' kernels),
    // the device then gets a share of its own beside the programs' session instead of one
    // thread's share among their spinning threads: its capture's writer got ~0.4 of a core under
    // qperf's 1 MiB tests within one device, fell behind, and the rings dropped frames.
    // SAFETY: setsid(2) is async-signal-safe and touches nothing of the parent's.
    unsafe { cmd.pre_exec(|| nix::unistd::setsid().map(drop).map_err(io::Error::from)) };
    let mut child = cmd.spawn().map_err(io_err(format!("start {}", exe.display())))?;
    let deadline = Instant::now() + START_TIMEOUT;
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

/// Stops device `name` (SIGTERM) and waits until it is gone (its capture written out, its lock
/// free). `Ok(false)`: it was not running.
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
    // Gone means its lock is free: the daemon removes its socket first, then stops the device
    // (the capture file is written out) and lets the lock go as it exits. A `down` that
    // returned at the socket raced the next `up` of the name, which found the lock still held.
    let lock_free = || runtime::lock_device(&dir, name, false).map(|l| l.is_some()).unwrap_or(true);
    while runtime::is_live(&dir, name) || runtime::socket_path(&dir, name).exists() || !lock_free() {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            let _ = fs::remove_file(runtime::socket_path(&dir, name));
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(true)
}
