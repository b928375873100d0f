//! `librdmacm.so.1`: rdma_cm over softrdma (docs/architecture.md D10). The connection manager runs
//! in the device (its QP1 sends and receives the CM MADs); this library is the thin client
//! librdmacm is over the kernel's ucma:
//! - an event channel is a pipe: the device writes one frame per event into it (and this library
//!   writes the events it makes itself: address and route resolution), so `channel->fd` is a
//!   real fd that polls readable while events wait, and O_NONBLOCK is honoured by read(2);
//! - an ID gets a device when it is bound or resolved: the source address the host's routing
//!   picks for the destination names the device; a wildcard listener listens on every device;
//! - ports are reserved host-wide per port space with open-file-description locks in the runtime
//!   directory (as the kernel's port spaces are per host, not per device);
//! - QPs move through INIT/RTR/RTS as librdmacm moves them, with the attributes the device's CM
//!   gives (`rdma_init_qp_attr`).

mod addr;
mod conn;
mod event;
mod hotplug;
mod id;
mod mcast;
mod ports;
mod qp;
mod verbs_api;

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use softrdma_device::client::Connection;
use softrdma_device::proto::{CmRecord, Request, Response, CM_RECORD_LEN};
use softrdma_engine::verbs::QpType;

use crate::cma_ffi as c;
use crate::ffi;
use crate::Errno;

pub(crate) use verbs_api::api;

/// The librdmacm calls rsockets (src/rsocket) are built on, as rdma-core's rsocket.c is built on
/// its librdmacm's public API.
pub(crate) mod for_rsockets {
    pub(crate) use super::addr::{rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route};
    pub(crate) use super::conn::{rdma_accept, rdma_connect, rdma_get_request, rdma_listen, rdma_reject};
    pub(crate) use super::event::{rdma_ack_cm_event, rdma_get_cm_event};
    pub(crate) use super::id::{rdma_create_id, rdma_destroy_id, rdma_set_option};
    pub(crate) use super::qp::{rdma_create_qp, rdma_destroy_qp};
}

/// A device as librdmacm sees it: its CM connection and the program's context on it.
pub(crate) struct CmDev {
    pub(crate) name: String,
    pub(crate) addr: IpAddr,
    pub(crate) conn: Connection,
    /// The context from libibverbs (`id->verbs`), opened once, as librdmacm opens each device.
    pub(crate) verbs: *mut ffi::ibv_context,
    /// librdmacm's own PD per device (for `rdma_create_qp` with a NULL PD).
    pub(crate) pd: Mutex<*mut ffi::ibv_pd>,
    pub(crate) max_rd_atom: u8,
    pub(crate) max_init_rd_atom: u8,
    /// Channel registrations on this device: our channel handle -> the device's.
    pub(crate) channels: Mutex<HashMap<u64, u32>>,
}

// SAFETY: the raw pointers are libibverbs objects, used under their own locking.
unsafe impl Send for CmDev {}
unsafe impl Sync for CmDev {}

/// The process's view of rdma_cm.
pub(crate) struct Cma {
    /// The devices up now: a device started later joins (and every wildcard listener listens on
    /// it, as the kernel's cma_add_one makes each wildcard listener listen on a new ib_device);
    /// a device that goes down leaves.
    devs: Mutex<Vec<Arc<CmDev>>>,
    /// Every live ID by its handle (records name IDs by it; a stale handle finds nothing).
    pub(crate) ids: Mutex<HashMap<u64, usize>>,
    /// The addresses of the live IDs: a pointer not in it is never dereferenced.
    pub(crate) live: Mutex<HashSet<usize>>,
    pub(crate) next: Mutex<u64>,
}

static CMA: OnceLock<Result<Cma, c_int>> = OnceLock::new();

/// Whether rdma_cm's contexts stay on the device path (`SOFTRDMA_CM_DATAPATH=device`); by
/// default they follow `SOFTRDMA_DATAPATH`.
fn cm_device_path() -> bool {
    match std::env::var("SOFTRDMA_CM_DATAPATH").as_deref() {
        Ok("device") => true,
        Ok("") | Err(_) => false,
        Ok(other) => {
            eprintln!(
                "softrdma: SOFTRDMA_CM_DATAPATH={other:?} is not device; rdma_cm's contexts follow SOFTRDMA_DATAPATH"
            );
            false
        }
    }
}

/// Opens the named devices of libibverbs' list for rdma_cm: a CM connection and a context each.
/// A device that cannot be opened (it went down meanwhile, another user's) is left out.
fn open_devs(names: &[String]) -> Vec<Arc<CmDev>> {
    let api = api();
    let mut n: c_int = 0;
    // SAFETY: libibverbs' list, freed below; the contexts opened from it stay valid after.
    let list = unsafe { (api.get_device_list)(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for want in names {
        let Ok(conn) = Connection::connect(want) else { continue };
        let mut verbs = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` entries.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a valid ibv_device from libibverbs.
            let name = unsafe { std::ffi::CStr::from_ptr((*dev).name.as_ptr()) };
            if name.to_str().ok() == Some(want.as_str()) {
                // The context programs make their PDs, CQs and QPs on (id->verbs) follows
                // SOFTRDMA_DATAPATH as any other: the CM moves a QP through its states with
                // ibv_modify_qp as librdmacm does, whichever path runs it.
                // SOFTRDMA_CM_DATAPATH=device keeps rdma_cm's contexts on the device path.
                let device = cm_device_path();
                crate::context::DEVICE_PATH.set(device);
                // SAFETY: open a device of libibverbs' list.
                verbs = unsafe { (api.open_device)(dev) };
                crate::context::DEVICE_PATH.set(false);
            }
        }
        if verbs.is_null() {
            continue;
        }
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: verbs is an open context.
        unsafe { (api.query_device)(verbs, &mut attr) };
        out.push(Arc::new(CmDev {
            name: want.clone(),
            addr: conn.info.addr,
            conn,
            verbs,
            pd: Mutex::new(std::ptr::null_mut()),
            max_rd_atom: attr.max_qp_rd_atom.clamp(0, 255) as u8,
            max_init_rd_atom: attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
            channels: Mutex::new(HashMap::new()),
        }));
    }
    // SAFETY: the list from get_device_list above.
    unsafe { (api.free_device_list)(list) };
    out
}

/// The devices, found once (librdmacm's `ucma_init`): ENODEV when there is none. Devices started
/// later are added by the watcher thread.
pub(crate) fn cma() -> Result<&'static Cma, Errno> {
    let r = CMA.get_or_init(|| {
        let names: Vec<String> = crate::device::discover().map_err(|e| e.0)?.iter().map(|d| d.name.clone()).collect();
        let out = open_devs(&names);
        if out.is_empty() {
            return Err(libc::ENODEV);
        }
        Ok(Cma {
            devs: Mutex::new(out),
            ids: Mutex::new(HashMap::new()),
            live: Mutex::new(HashSet::new()),
            next: Mutex::new(1),
        })
    });
    match r {
        Ok(c) => {
            static WATCH: std::sync::Once = std::sync::Once::new();
            WATCH.call_once(|| {
                let _ = std::thread::Builder::new().name("softrdma-cm-watch".into()).spawn(move || {
                    // The program's signals go to the program's threads (softrdma_device::signals).
                    softrdma_device::signals::keep_off_this_thread();
                    watch(c)
                });
            });
            Ok(c)
        }
        Err(e) => Err(Errno(*e)),
    }
}

/// How long the watcher looks again for a device whose socket appeared but does not answer yet
/// (the daemon binds its socket, then listens).
const NEW_DEVICE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Watches the devices: one whose socket hangs up (the daemon stopped or died) leaves and the IDs
/// on it get RDMA_CM_EVENT_DEVICE_REMOVAL, as when the kernel unregisters an ib_device under its
/// IDs; one started later (its socket appears in the runtime directory) joins, and every wildcard
/// listener listens on it.
fn watch(cma: &'static Cma) {
    let dir = softrdma_device::runtime::runtime_dir_path();
    let notify = DirWatch::new(&dir);
    let mut look_until: Option<std::time::Instant> = None;
    loop {
        let alive = cma.devs();
        let mut fds: Vec<libc::pollfd> = alive
            .iter()
            .map(|d| libc::pollfd { fd: d.conn.hangup_fd().as_raw_fd(), events: libc::POLLRDHUP, revents: 0 })
            .collect();
        if let Some(w) = &notify {
            fds.push(libc::pollfd { fd: w.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        // Without inotify, look for new devices once a second.
        let timeout = match (look_until, &notify) {
            (Some(_), _) => 50,
            (None, Some(_)) => -1,
            (None, None) => 1000,
        };
        // SAFETY: `fds` holds fds.len() entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            if crate::last_errno() == libc::EINTR {
                continue;
            }
            return;
        }
        for (k, d) in alive.iter().enumerate() {
            if fds[k].revents != 0 {
                lock(&cma.devs).retain(|x| !Arc::ptr_eq(x, d));
                hotplug::device_removed(cma, d);
            }
        }
        let mut look = notify.is_none();
        if let Some(w) = &notify {
            if fds[alive.len()].revents != 0 && w.drain() {
                look_until = Some(std::time::Instant::now() + NEW_DEVICE_GRACE);
            }
        }
        if let Some(t) = look_until {
            look = true;
            if std::time::Instant::now() >= t {
                look_until = None;
            }
        }
        if look {
            cma.add_new(&dir);
        }
    }
}

/// An inotify watch on the runtime directory for device sockets appearing.
struct DirWatch {
    fd: OwnedFd,
}

impl DirWatch {
    fn new(dir: &std::path::Path) -> Option<DirWatch> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: a new inotify descriptor, owned below.
        let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if raw < 0 {
            return None;
        }
        // SAFETY: our own new descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a NUL-terminated path.
        let w = unsafe { libc::inotify_add_watch(raw, path.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) };
        (w >= 0).then_some(DirWatch { fd })
    }

    /// Reads every pending event; whether one names a device socket (`NAME.sock`): other files
    /// of the runtime dir (port locks, logs) are no reason to look.
    fn drain(&self) -> bool {
        let mut buf = [0u8; 4096];
        let mut sock = false;
        loop {
            // SAFETY: reads into our buffer from our non-blocking descriptor.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return sock;
            }
            sock |= names_a_socket(&buf[..n as usize]);
        }
    }
}

/// Whether a buffer of `struct inotify_event`s (wd, mask, cookie, len, then `len` bytes of
/// NUL-padded name) names a file ending in `.sock`.
fn names_a_socket(mut b: &[u8]) -> bool {
    const HEADER: usize = 16;
    while b.len() >= HEADER {
        let len = u32::from_ne_bytes([b[12], b[13], b[14], b[15]]) as usize;
        let Some(name) = b.get(HEADER..HEADER + len) else { return false };
        let name = name.split(|c| *c == 0).next().unwrap_or_default();
        if name.ends_with(b".sock") {
            return true;
        }
        b = &b[HEADER + len..];
    }
    false
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cma {
    pub(crate) fn handle(&self) -> u64 {
        let mut n = lock(&self.next);
        *n += 1;
        *n
    }

    /// The devices up now.
    pub(crate) fn devs(&self) -> Vec<Arc<CmDev>> {
        lock(&self.devs).clone()
    }

    pub(crate) fn dev_by_name(&self, name: &str) -> Option<Arc<CmDev>> {
        lock(&self.devs).iter().find(|d| d.name == name).cloned()
    }

    pub(crate) fn dev_by_addr(&self, ip: IpAddr) -> Option<Arc<CmDev>> {
        lock(&self.devs).iter().find(|d| d.addr == ip).cloned()
    }

    pub(crate) fn dev_by_verbs(&self, v: *mut ffi::ibv_context) -> Option<Arc<CmDev>> {
        lock(&self.devs).iter().find(|d| d.verbs == v).cloned()
    }

    /// Adds the devices running in `dir` that are not known yet, and has every wildcard
    /// listener listen on them.
    fn add_new(&self, dir: &std::path::Path) {
        let known: Vec<String> = self.devs().iter().map(|d| d.name.clone()).collect();
        let fresh: Vec<String> =
            softrdma_device::runtime::list_devices(dir).into_iter().filter(|n| !known.contains(n)).collect();
        if fresh.is_empty() {
            return;
        }
        for d in open_devs(&fresh) {
            lock(&self.devs).push(d.clone());
            hotplug::device_added(self, &d);
        }
    }
}

/// One CM call on a device: Ok, or the errno.
pub(crate) fn cm_call(dev: &CmDev, req: &Request, fds: &[c_int]) -> Result<Response, Errno> {
    match dev.conn.call(req, fds) {
        Ok((Response::CmErr(e), _)) => Err(Errno(e)),
        Ok((Response::Err(e), _)) => Err(Errno(e.errno())),
        Ok((r, _)) => Ok(r),
        Err(_) => Err(Errno(libc::ENODEV)),
    }
}

/// `struct rdma_event_channel` and the pipe behind it.
#[repr(C)]
pub(crate) struct Channel {
    pub(crate) c: c::rdma_event_channel,
    pub(crate) handle: u64,
    /// The read end is `c.fd`; the write end, which the devices get a copy of.
    pub(crate) write: OwnedFd,
    /// Threads inside `rdma_get_cm_event` on it now (see `rdma_destroy_event_channel`).
    pub(crate) inside: std::sync::atomic::AtomicUsize,
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: the read end is ours (the write end is an OwnedFd).
        unsafe { libc::close(self.c.fd) };
    }
}

/// Channels the program destroyed, with when: each is closed once [`GRACE`] has passed and no
/// thread is inside `rdma_get_cm_event` on it.
static GRAVEYARD: Mutex<Vec<(std::time::Instant, Box<Channel>)>> = Mutex::new(Vec::new());
/// How long a destroyed channel's descriptors stay open.
const GRACE: std::time::Duration = std::time::Duration::from_secs(1);
/// Beyond this many destroyed channels waiting, any older than [`GRACE_MIN`] is closed.
const GRAVEYARD_MAX: usize = 256;
const GRACE_MIN: std::time::Duration = std::time::Duration::from_millis(50);

/// `rdma_destroy_event_channel`: the channel's descriptors stay open a while, and as long as a
/// thread is blocked reading it. On the kernel, closing the ucma fd leaves a thread blocked in
/// read() on it blocked (the read holds the file), and rdma-core 44's rping destroys its channel
/// without joining its CM thread, which may be between two calls of rdma_get_cm_event: it has
/// just acknowledged the event that let the main thread go on. If the fd were closed at once,
/// that thread's next call would fail with EBADF (rping exits 255); kept open, it blocks as on
/// the kernel until the process exits. The wait is bounded (a program that makes and destroys
/// channels by the thousand keeps at most a second's worth open).
pub(crate) fn bury(ch: Box<Channel>) {
    let now = std::time::Instant::now();
    let mut g = lock(&GRAVEYARD);
    let inside = |c: &Channel| c.inside.load(std::sync::atomic::Ordering::SeqCst) > 0;
    let crowded = g.len() >= GRAVEYARD_MAX;
    g.retain(|(t, c)| {
        let age = now.duration_since(*t);
        inside(c) || age < if crowded { GRACE_MIN } else { GRACE }
    });
    g.push((now, ch));
}

impl Channel {
    pub(crate) fn new() -> Result<Box<Channel>, Errno> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: pipe2 fills two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(Errno(crate::last_errno()));
        }
        // Room for many events (cmtime's thousand connections on one channel): 1 MiB when the
        // system allows it.
        // SAFETY: fcntl on our own pipe.
        unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 1 << 20) };
        // SAFETY: our own new descriptor.
        let write = unsafe { OwnedFd::from_raw_fd(fds[1]) };
        let handle = cma().map(|c| c.handle()).unwrap_or(0);
        Ok(Box::new(Channel { c: c::rdma_event_channel { fd: fds[0] }, handle, write, inside: Default::default() }))
    }

    /// Writes a frame (events this library makes itself).
    pub(crate) fn post(&self, rec: &CmRecord) {
        if let Some(f) = rec.to_frame() {
            // SAFETY: a whole frame (< PIPE_BUF) to our own pipe.
            unsafe { libc::write(self.write.as_raw_fd(), f.as_ptr().cast(), f.len()) };
        }
    }

    /// The device's handle for this channel, registering it there first.
    pub(crate) fn on(&self, dev: &CmDev) -> Result<u32, Errno> {
        if let Some(h) = lock(&dev.channels).get(&self.handle) {
            return Ok(*h);
        }
        match cm_call(dev, &Request::CmCreateChannel, &[self.write.as_raw_fd()])? {
            Response::CmChannel(h) => {
                lock(&dev.channels).insert(self.handle, h);
                Ok(h)
            }
            _ => Err(Errno(libc::EIO)),
        }
    }

    /// Reads one frame: blocks unless the fd is non-blocking (then EAGAIN).
    pub(crate) fn read(&self) -> Result<CmRecord, Errno> {
        let mut f = [0u8; CM_RECORD_LEN];
        loop {
            // SAFETY: read into our buffer from the channel's fd.
            let n = unsafe { libc::read(self.c.fd, f.as_mut_ptr().cast(), f.len()) };
            if n == f.len() as isize {
                return CmRecord::from_frame(&f).ok_or(Errno(libc::EIO));
            }
            if n < 0 {
                let e = crate::last_errno();
                if e == libc::EINTR {
                    continue;
                }
                return Err(Errno(e));
            }
            if n == 0 {
                return Err(Errno(libc::ENODEV));
            }
            // A frame is written whole (< PIPE_BUF); a short read cannot happen.
            return Err(Errno(libc::EIO));
        }
    }
}

/// Where an ID lives on a device.
#[derive(Clone)]
pub(crate) struct Placement {
    pub(crate) dev: Arc<CmDev>,
    pub(crate) id: u32,
}

/// What librdmacm keeps of an ID beside the C structure.
/// One multicast join of an ID.
#[derive(Debug, Clone, Copy)]
pub(crate) struct McJoin {
    /// This process's number for it (it comes back in the join's event).
    pub(crate) handle: u64,
    pub(crate) group: std::net::IpAddr,
    /// The program's context (the join event's `param.ud.private_data`).
    pub(crate) context: *mut std::ffi::c_void,
    pub(crate) send_only: bool,
    /// The QP was attached to the group when the join completed.
    pub(crate) attached: bool,
}

pub(crate) struct IdState {
    pub(crate) handle: u64,
    pub(crate) sync: bool,
    /// The channel librdmacm made for a synchronous ID.
    pub(crate) own_channel: Option<Box<Channel>>,
    pub(crate) qp_type: QpType,
    pub(crate) ps: u16,
    /// The device IDs (several for a wildcard listener).
    pub(crate) on: Vec<Placement>,
    pub(crate) bound: Option<SocketAddr>,
    pub(crate) port_lock: Option<ports::Reservation>,
    pub(crate) remote: Option<SocketAddr>,
    pub(crate) tos: u8,
    pub(crate) reuseaddr: bool,
    pub(crate) afonly: bool,
    pub(crate) ack_timeout: Option<u8>,
    pub(crate) listening: bool,
    /// The backlog it listens with (for devices started later).
    pub(crate) backlog: u32,
    pub(crate) addr_resolved: bool,
    pub(crate) route_resolved: bool,
    /// From the CONNECT_REQUEST: what the peer offered (librdmacm's id_priv depths).
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    /// rdma_create_ep on a passive ID: the QP to make on each request.
    pub(crate) ep_qp_init: Option<ffi::ibv_qp_init_attr>,
    pub(crate) ep_pd: *mut ffi::ibv_pd,
    pub(crate) path: Option<Box<c::ibv_sa_path_rec>>,
    /// Resources librdmacm made for the ID (freed with it).
    pub(crate) own_cqs: bool,
    pub(crate) own_srq: bool,
    pub(crate) own_xrcd: *mut ffi::ibv_xrcd,
    pub(crate) local_ece: (u32, u32),
    pub(crate) remote_ece: (u32, u32),
    /// Multicast joins (rdma_join_multicast_ex): what librdmacm keeps per join.
    pub(crate) mcs: Vec<McJoin>,
}

/// `struct rdma_cm_id` and librdmacm's state.
#[repr(C)]
pub(crate) struct Id {
    pub(crate) c: c::rdma_cm_id,
    pub(crate) st: Mutex<IdState>,
    /// Events handed out and not yet acked; destroy waits for 0 (librdmacm does).
    pub(crate) outstanding: Mutex<u32>,
    pub(crate) acked: Condvar,
}

// SAFETY: the C structure's pointers are the program's; the state is locked.
unsafe impl Send for Id {}
unsafe impl Sync for Id {}

/// `struct rdma_cm_event` with the storage its pointers point into.
#[repr(C)]
pub(crate) struct Event {
    pub(crate) c: c::rdma_cm_event,
    pub(crate) private: Vec<u8>,
}

/// The ID behind an `rdma_cm_id` pointer.
pub(crate) fn id_of<'a>(p: *mut c::rdma_cm_id) -> Result<&'a Id, Errno> {
    // A pointer this library did not hand out, or an ID already destroyed (a program that
    // retries with the IDs it destroyed), is EINVAL, as ucma answers a stale handle; freed
    // memory is never read.
    let live = !p.is_null() && cma().is_ok_and(|c| lock(&c.live).contains(&(p as usize)));
    if !live {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: a live ID: the first field of an `Id` this library made and has not freed.
    Ok(unsafe { &*(p as *const Id) })
}

/// The channel behind an `rdma_event_channel` pointer.
pub(crate) fn channel_of<'a>(p: *mut c::rdma_event_channel) -> Result<&'a Channel, Errno> {
    if p.is_null() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: every rdma_event_channel this library hands out is the first field of a Channel.
    Ok(unsafe { &*(p as *const Channel) })
}

/// A socket address from C (AF_INET / AF_INET6).
pub(crate) fn sockaddr_from(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a sockaddr of the family it says.
    unsafe {
        match i32::from((*p).sa_family) {
            libc::AF_INET => {
                let s = &*(p as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
                Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(s.sin_port)))
            }
            libc::AF_INET6 => {
                let s = &*(p as *const libc::sockaddr_in6);
                let ip = std::net::Ipv6Addr::from(s.sin6_addr.s6_addr);
                Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(s.sin6_port)))
            }
            _ => None,
        }
    }
}

/// Writes a socket address as C's sockaddr_storage.
pub(crate) fn sockaddr_to(a: SocketAddr, out: *mut u8) {
    // SAFETY: `out` is a sockaddr_storage (128 bytes) of the caller's structure.
    unsafe {
        std::ptr::write_bytes(out, 0, std::mem::size_of::<libc::sockaddr_storage>());
        match a {
            SocketAddr::V4(v4) => {
                let s = out as *mut libc::sockaddr_in;
                (*s).sin_family = libc::AF_INET as u16;
                (*s).sin_port = v4.port().to_be();
                (*s).sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                let s = out as *mut libc::sockaddr_in6;
                (*s).sin6_family = libc::AF_INET6 as u16;
                (*s).sin6_port = v6.port().to_be();
                (*s).sin6_addr.s6_addr = v6.ip().octets();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::names_a_socket;

    fn event(name: &str, pad: usize) -> Vec<u8> {
        let len = (name.len() + pad) as u32;
        let mut e = vec![0u8; 12];
        e.extend_from_slice(&len.to_ne_bytes());
        e.extend_from_slice(name.as_bytes());
        e.extend(std::iter::repeat_n(0u8, pad));
        e
    }

    #[test]
    fn only_device_sockets_count() {
        assert!(names_a_socket(&event("srdma3.sock", 5)));
        assert!(!names_a_socket(&event("cm-ports", 8)));
        let mut two = event("srdma3.log", 6);
        two.extend(event("srdma3.sock", 5));
        assert!(names_a_socket(&two));
        // A truncated record is no socket (and no panic).
        assert!(!names_a_socket(&event("srdma3.sock", 5)[..20]));
        assert!(!names_a_socket(&[]));
    }
}
