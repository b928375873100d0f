//! The client side of the device protocol: a connection to a running device (daemon).

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;

use softrdma_engine::verbs::VerbsError;

use crate::proto::{self, DeviceInfo, ProtoError, Request, Response, VERSION};
use crate::runtime;

/// Why a connection or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No device answers on that socket.
    #[error(
        "no softrdma device {name:?} answers in {dir} ({source}); start one with `softrdma up {name} --addr ADDR`"
    )]
    NoDevice {
        /// Device name.
        name: String,
        /// Runtime directory.
        dir: String,
        /// The connect error.
        source: io::Error,
    },
    /// The runtime directory is unusable.
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// The device refused the client (another uid, another protocol version).
    #[error("the device refused this client: {0} ({why})", why = refusal_reason(.0))]
    Refused(VerbsError),
    /// The connection broke (the device went away: IBV_EVENT_DEVICE_FATAL).
    #[error("device connection lost: {0}")]
    Lost(#[from] ProtoError),
    /// The device answered something that does not fit the call.
    #[error("unexpected answer from the device")]
    Unexpected,
}

fn refusal_reason(e: &VerbsError) -> &'static str {
    match e {
        VerbsError::NotSupp => {
            "it speaks another protocol version: the device and this program come from different builds"
        }
        VerbsError::Access => "it belongs to another user",
        _ => "see the device's log",
    }
}

/// How long a call waits for the device's answer before the connection counts as lost.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A connection to a device.
pub struct Connection {
    sock: Mutex<UnixStream>,
    /// The same socket, to watch for the device going away while waiting for events.
    watch: OwnedFd,
    /// The owner id the device gave this client.
    pub owner: u32,
    /// The device.
    pub info: DeviceInfo,
    /// Readable while async events wait.
    pub event_fd: OwnedFd,
    /// The client's ring arena (sealed memfd) from the device.
    pub arena_fd: OwnedFd,
    /// The device's doorbell.
    pub doorbell: OwnedFd,
    /// The ring on which this client gives staging space back.
    pub release: crate::arena::RingDesc,
    /// What this process's memory helper has done, when the device uses one.
    pub helper: Option<std::sync::Arc<crate::memory::HelperProgress>>,
    /// The runtime directory the device was found in (a provider opens a second connection
    /// there for its XRC objects).
    pub dir: std::path::PathBuf,
}

impl Connection {
    /// Connects to device `name` in the runtime directory.
    pub fn connect(name: &str) -> Result<Connection, ClientError> {
        runtime::check_name(name)?;
        let dir = runtime::runtime_dir()?;
        Connection::connect_in(&dir, name)
    }

    /// Connects to device `name` in directory `dir`.
    pub fn connect_in(dir: &Path, name: &str) -> Result<Connection, ClientError> {
        let path = runtime::socket_path(dir, name);
        let sock = UnixStream::connect(&path).map_err(|source| ClientError::NoDevice {
            name: name.to_owned(),
            dir: dir.display().to_string(),
            source,
        })?;
        // A device that stops answering (stopped, wedged) fails the call instead of hanging the
        // program: no request takes the device anywhere near this long.
        let _ = sock.set_read_timeout(Some(CALL_TIMEOUT));
        let _ = sock.set_write_timeout(Some(CALL_TIMEOUT));
        // Yama ptrace_scope 1 lets only a declared tracer use process_vm_readv/writev on us
        // (docs/architecture.md D3): declare the device, whose pid is the socket peer's. Without
        // Yama this fails harmlessly.
        if let Ok(cred) = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials) {
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_PTRACER, cred.pid() as libc::c_ulong, 0, 0, 0) };
        }
        static PROBE_WORD: u64 = proto::PROBE;
        // SOFTRDMA_MEMORY_HELPER=1 pretends the kernel refuses cross-process access (an
        // unreadable probe), to exercise the fallback where it does not.
        let forced = std::env::var_os("SOFTRDMA_MEMORY_HELPER").is_some_and(|v| v == "1");
        let probe = if forced { 0 } else { std::ptr::addr_of!(PROBE_WORD) as u64 };
        let hello = Request::Hello { version: VERSION, pid: std::process::id() as i32, probe };
        proto::send(&sock, &hello, &[])?;
        let (resp, mut fds) = proto::recv::<Response>(&sock)?;
        match resp {
            Response::Hello { owner, info, release, memory_helper } if fds.len() == 3 + usize::from(memory_helper) => {
                let helper = if memory_helper {
                    let sock = UnixStream::from(fds.remove(3));
                    let progress = std::sync::Arc::new(crate::memory::HelperProgress::default());
                    let p = progress.clone();
                    std::thread::Builder::new()
                        .name("softrdma-memory".into())
                        .spawn(move || {
                            // The program's signals go to the program's threads (crate::signals).
                            crate::signals::keep_off_this_thread();
                            crate::memory::serve_helper(sock, p)
                        })
                        .map_err(|e| ClientError::Lost(ProtoError::Io(e)))?;
                    Some(progress)
                } else {
                    None
                };
                let (event_fd, arena_fd) = (fds.remove(0), fds.remove(0));
                let doorbell = fds.remove(0);
                let watch = OwnedFd::from(sock.try_clone().map_err(|e| ClientError::Lost(ProtoError::Io(e)))?);
                Ok(Connection {
                    sock: Mutex::new(sock),
                    watch,
                    owner,
                    info,
                    event_fd,
                    arena_fd,
                    doorbell,
                    release,
                    helper,
                    dir: dir.to_path_buf(),
                })
            }
            Response::Err(e) => Err(ClientError::Refused(e)),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// The connection's socket, to poll for POLLHUP (the device went away).
    pub fn hangup_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.watch.as_fd()
    }

    /// One call: the request (and fds), the answer (and fds).
    pub fn call(&self, req: &Request, fds: &[RawFd]) -> Result<(Response, Vec<OwnedFd>), ClientError> {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let r = proto::send(&sock, req, fds).and_then(|()| proto::recv::<Response>(&sock));
        if r.is_err() {
            // A call that failed half-way (timeout, closed) leaves the stream out of step: no
            // later call may read its late answer. The connection is over.
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
        Ok(r?)
    }
}
