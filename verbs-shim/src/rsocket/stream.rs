//! Stream rsockets: the connection (rdma_cm, with rdma-core's connection data as private data),
//! the QP and buffers behind it, listening and accepting, shutdown and close. The data protocol
//! is in `data`.
//!
//! A stream rsocket is one synchronous rdma_cm ID (created with no event channel, so the ID has
//! a channel of its own and each CM call waits for its event, as rsocket.c uses librdmacm). The
//! channel's descriptor is the rsocket's number. Once connected, the channel is made
//! non-blocking, and its later events (DISCONNECTED) are read wherever the rsocket waits.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::config::{self, defaults, SNDLOWAT};
use super::data::{RsSge, State};
use super::opts::Addr;
use super::Sock;
use crate::cma::for_rsockets::*;
use crate::cma::{api, lock};
use crate::cma_ffi as c;
use crate::ffi;
use crate::Errno;

// rdma-core's rsocket states (the values matter only here; the ordering of the first ones is
// used: passive < opening < connected).
pub(super) const S_INIT: u32 = 0;
pub(super) const S_BOUND: u32 = 0x0001;
pub(super) const S_LISTENING: u32 = 0x0002;
pub(super) const S_OPENING: u32 = 0x0004;
pub(super) const S_CONNECTED: u32 = 0x0100;
pub(super) const S_WRITABLE: u32 = 0x0200;
pub(super) const S_READABLE: u32 = 0x0400;
pub(super) const S_CONNECT_RDWR: u32 = S_CONNECTED | S_READABLE | S_WRITABLE;
pub(super) const S_CONNECT_ERROR: u32 = 0x0800;
pub(super) const S_DISCONNECTED: u32 = 0x1000;
pub(super) const S_ERROR: u32 = 0x2000;

/// The size of rdma-core's `struct rs_conn_data`, the private data of the REQ and the REP.
pub(super) const CONN_DATA_LEN: usize = 40;
const CONN_FLAG_NET: u8 = 1;
const CONN_FLAG_IOMAP: u8 = 2;
/// Entries of the target SGL (rdma-core's RS_SGL_SIZE).
pub(super) const SGL_SIZE: u32 = 2;
/// How many times address and route resolution are tried (rdma-core's RS_CONN_RETRIES).
const CONN_RETRIES: u32 = 6;
const QP_MIN_SIZE: u16 = 16;
const QP_MAX_SIZE: u16 = 0xFFFE;

/// The queue of connections a listener has accepted and the program has not yet taken, with an
/// eventfd (semaphore mode) that counts them: the listener's descriptor in rpoll.
pub(super) struct Listener {
    pub(super) queue: Arc<Mutex<VecDeque<Arc<Sock>>>>,
    pub(super) ready: Arc<OwnedFd>,
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

pub(crate) struct Stream {
    pub(super) id: *mut c::rdma_cm_id,
    pub(super) fd: c_int,
    pub(super) domain: c_int,
    pub(super) st: Mutex<State>,
    /// Serialises the threads that sleep on the completion channel (rdma-core's cq_wait_lock).
    pub(super) wait: Mutex<()>,
    pub(super) listener: Mutex<Option<Listener>>,
    pub(super) connector: Mutex<Option<JoinHandle<()>>>,
    /// Written once a background (non-blocking) connect has ended.
    pub(super) wake: OwnedFd,
    pub(super) fs_flags: AtomicI32,
    pub(super) fd_flags: AtomicI32,
    /// An accepted socket's number: a descriptor made when the program accepts it (a duplicate
    /// of the channel's), so that it is newer than any the program opened before accepting.
    /// librspreload maps select(2)'s results back by the lowest descriptor whose rsocket number
    /// matches, so a number older than the program's own descriptor would be reported instead
    /// of it.
    pub(super) number: std::sync::OnceLock<OwnedFd>,
}

// SAFETY: the raw pointers are the rsocket's own rdma_cm ID and verbs objects, used only under
// `st` or by the calls of librdmacm/libibverbs that are thread-safe.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

pub(super) fn eventfd(flags: c_int) -> Result<OwnedFd, Errno> {
    // SAFETY: a new descriptor.
    let fd = unsafe { libc::eventfd(0, flags | libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(Errno(crate::last_errno()));
    }
    // SAFETY: ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn set_nonblock(fd: c_int) {
    // SAFETY: fcntl on a descriptor of this library.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

fn last() -> Errno {
    Errno(crate::last_errno())
}

impl Stream {
    /// The rsocket's number.
    pub(super) fn num(&self) -> c_int {
        self.number.get().map_or(self.fd, |n| n.as_raw_fd())
    }

    pub(super) fn new(domain: c_int, fs_flags: c_int, fd_flags: c_int) -> Result<Stream, Errno> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a synchronous ID (no channel) of the TCP port space, as rsocket.c makes.
        if unsafe { rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), c::RDMA_PS_TCP) } != 0 {
            return Err(last());
        }
        Self::of_id(id, domain, State::new(defaults()), fs_flags, fd_flags)
    }

    fn of_id(id: *mut c::rdma_cm_id, domain: c_int, st: State, fs: c_int, fdf: c_int) -> Result<Stream, Errno> {
        // SAFETY: a live ID with its own channel.
        let fd = unsafe { (*(*id).channel).fd };
        let wake = match eventfd(0) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the ID just made, not handed out.
                unsafe { rdma_destroy_id(id) };
                return Err(e);
            }
        };
        Ok(Stream {
            id,
            fd,
            domain,
            st: Mutex::new(st),
            wait: Mutex::new(()),
            listener: Mutex::new(None),
            connector: Mutex::new(None),
            wake,
            fs_flags: AtomicI32::new(fs),
            fd_flags: AtomicI32::new(fdf),
            number: std::sync::OnceLock::new(),
        })
    }

    pub(super) fn nonblocking(&self, flags: c_int) -> bool {
        self.fs_flags.load(Ordering::Relaxed) & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    pub(super) fn bind(&self, a: &Addr) -> Result<(), Errno> {
        let mut st = lock(&self.st);
        if st.state != S_INIT {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: our ID and a socket address of the given length.
        if unsafe { rdma_bind_addr(self.id, a.as_ptr() as *mut _) } != 0 {
            return Err(last());
        }
        st.state = S_BOUND;
        Ok(())
    }

    pub(super) fn listen(s: &Arc<Sock>, backlog: c_int) -> Result<(), Errno> {
        let Sock::Stream(me) = &**s else { return Err(Errno(libc::EOPNOTSUPP)) };
        let mut st = lock(&me.st);
        if st.state == S_LISTENING {
            return Ok(());
        }
        if st.state & !S_BOUND != 0 {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: our ID.
        if unsafe { rdma_listen(me.id, backlog) } != 0 {
            return Err(last());
        }
        let ready = Arc::new(eventfd(libc::EFD_SEMAPHORE)?);
        let stop = Arc::new(eventfd(0)?);
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let (q, r, sp, owner) = (queue.clone(), ready.clone(), stop.clone(), s.clone());
        let thread = std::thread::Builder::new()
            .name("rsocket-listen".into())
            .spawn(move || {
                softrdma_device::signals::keep_off_this_thread();
                listen_loop(&owner, &q, &r, &sp)
            })
            .map_err(|_| Errno(libc::EAGAIN))?;
        st.state = S_LISTENING;
        *lock(&me.listener) = Some(Listener { queue, ready, stop, thread: Some(thread) });
        Ok(())
    }

    /// raccept: the oldest connection the listener accepted.
    pub(super) fn accept(&self) -> Result<Arc<Sock>, Errno> {
        let (queue, ready) = {
            let g = lock(&self.listener);
            let l = g.as_ref().ok_or(Errno(libc::EINVAL))?;
            (l.queue.clone(), l.ready.clone())
        };
        loop {
            let mut v = 0u64;
            // SAFETY: reading our eventfd (semaphore mode: takes one).
            let n = unsafe { libc::read(ready.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            if n == 8 {
                if let Some(s) = lock(&queue).pop_front() {
                    if let Sock::Stream(n) = &*s {
                        // SAFETY: duplicating our own descriptor.
                        let d = unsafe { libc::fcntl(n.fd, libc::F_DUPFD_CLOEXEC, 0) };
                        if d < 0 {
                            return Err(last());
                        }
                        // SAFETY: the new descriptor is ours.
                        let _ = n.number.set(unsafe { OwnedFd::from_raw_fd(d) });
                    }
                    return Ok(s);
                }
                continue;
            }
            if self.nonblocking(0) {
                return Err(Errno(libc::EAGAIN));
            }
            if lock(&self.listener).is_none() {
                return Err(Errno(libc::EINVAL));
            }
            super::poll::block_on(
                &mut [libc::pollfd { fd: ready.as_raw_fd(), events: libc::POLLIN, revents: 0 }],
                1000,
            )?;
        }
    }

    pub(super) fn connect(s: &Arc<Sock>, a: &Addr) -> Result<(), Errno> {
        let Sock::Stream(me) = &**s else { return Err(Errno(libc::EOPNOTSUPP)) };
        {
            let mut st = lock(&me.st);
            match st.state {
                S_INIT | S_BOUND => {}
                S_LISTENING => return Err(Errno(libc::EINVAL)),
                x if x & S_OPENING != 0 => return Err(Errno(libc::EALREADY)),
                x if x & S_CONNECTED != 0 => return Err(Errno(libc::EISCONN)),
                _ => return Err(Errno(libc::ECONNABORTED)),
            }
            st.dst = Some(a.clone());
            st.state = S_OPENING;
        }
        if !me.nonblocking(0) {
            return me.connect_now();
        }
        let owner = s.clone();
        let h = std::thread::Builder::new()
            .name("rsocket-connect".into())
            .spawn(move || {
                softrdma_device::signals::keep_off_this_thread();
                let Sock::Stream(me) = &*owner else { return };
                let _ = me.connect_now();
                let one = 1u64;
                // SAFETY: our eventfd.
                unsafe { libc::write(me.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
                super::poll::notify_others();
            })
            .map_err(|_| Errno(libc::EAGAIN))?;
        *lock(&me.connector) = Some(h);
        Err(Errno(libc::EINPROGRESS))
    }

    /// The active side's steps, each waiting for its event (rdma-core's rs_do_connect): the
    /// address, the route (or the path the program gave with RDMA_ROUTE), the QP, the REQ with
    /// our connection data, and the REP's. A failure leaves the socket in the connect error
    /// state, its errno for SO_ERROR.
    fn connect_now(&self) -> Result<(), Errno> {
        let r = self.connect_steps();
        let mut st = lock(&self.st);
        match &r {
            Ok(()) => st.state = S_CONNECT_RDWR,
            Err(Errno(e)) => {
                st.state = S_CONNECT_ERROR;
                st.err = *e;
            }
        }
        r
    }

    fn connect_steps(&self) -> Result<(), Errno> {
        let (dst, route) = {
            let mut st = lock(&self.st);
            (st.dst.clone().ok_or(Errno(libc::EINVAL))?, st.route.take())
        };
        let mut tries = 0;
        loop {
            let to = 1000 << tries.min(4);
            // SAFETY: our ID; the destination copied from the program.
            if unsafe { rdma_resolve_addr(self.id, std::ptr::null_mut(), dst.as_ptr() as *mut _, to) } == 0 {
                break;
            }
            let e = last();
            tries += 1;
            if e.0 != libc::ETIMEDOUT || tries > CONN_RETRIES {
                return Err(e);
            }
        }
        let routed = match route {
            // SAFETY: our ID and the path records the program set.
            Some(r) => unsafe {
                rdma_set_option(
                    self.id,
                    c::RDMA_OPTION_IB as _,
                    c::RDMA_OPTION_IB_PATH as _,
                    r.as_ptr() as *mut c_void,
                    r.len(),
                ) == 0
            },
            None => false,
        };
        if !routed {
            let mut tries = 0;
            loop {
                let to = 1000 << tries.min(4);
                // SAFETY: our ID, its address resolved.
                if unsafe { rdma_resolve_route(self.id, to) } == 0 {
                    break;
                }
                let e = last();
                tries += 1;
                if e.0 != libc::ETIMEDOUT || tries > CONN_RETRIES {
                    return Err(e);
                }
            }
        }
        let data = {
            let mut st = lock(&self.st);
            self.create_ep(&mut st)?;
            st.conn_data()
        };
        let mut param = c::rdma_conn_param {
            private_data: data.as_ptr().cast(),
            private_data_len: CONN_DATA_LEN as u8,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        };
        // SAFETY: our ID with its QP; the parameters live across the call.
        if unsafe { rdma_connect(self.id, &mut param) } != 0 {
            return Err(last());
        }
        let reply = self.event_private_data();
        let mut st = lock(&self.st);
        st.save_conn_data(&reply.ok_or(Errno(libc::ENOTSUP))?)?;
        set_nonblock(self.fd);
        st.cm_nonblock = true;
        Ok(())
    }

    /// The private data of the ID's last event (a synchronous ID keeps it), if it is rsocket
    /// connection data of version 1.
    fn event_private_data(&self) -> Option<[u8; CONN_DATA_LEN]> {
        // SAFETY: our ID; its event (if any) is valid until the next CM call on it.
        unsafe {
            let ev = (*self.id).event;
            if ev.is_null() {
                return None;
            }
            let conn = (*ev).param.conn;
            if conn.private_data.is_null() || (conn.private_data_len as usize) < CONN_DATA_LEN {
                return None;
            }
            let mut d = [0u8; CONN_DATA_LEN];
            std::ptr::copy_nonoverlapping(conn.private_data as *const u8, d.as_mut_ptr(), CONN_DATA_LEN);
            (d[0] == 1).then_some(d)
        }
    }

    /// The CQ (with its completion channel, non-blocking), the RC QP, the buffers and the
    /// posted receives (rdma-core's rs_create_ep), with rdma-core's sizes.
    pub(super) fn create_ep(&self, st: &mut State) -> Result<(), Errno> {
        let api = api();
        // SAFETY: our ID, bound to a device by now.
        let (verbs, pd) = super::ctx::data_context(unsafe { (*self.id).verbs })?;
        let mut dattr = ffi::ibv_device_attr::default();
        // SAFETY: a live context.
        let max = if unsafe { (api.query_device)(verbs, &mut dattr) } == 0 {
            (dattr.max_qp_wr.max(0) as u32).min(QP_MAX_SIZE as u32) as u16
        } else {
            QP_MAX_SIZE
        };
        st.sq_size = st.sq_size.clamp(QP_MIN_SIZE, max.max(QP_MIN_SIZE));
        st.rq_size = st.rq_size.clamp(QP_MIN_SIZE, max.max(QP_MIN_SIZE));
        // SAFETY: verbs calls on our context; each object is kept in `st` (and the ID) and
        // destroyed in Drop.
        unsafe {
            let ch = (api.create_comp_channel)(verbs);
            if ch.is_null() {
                return Err(last());
            }
            st.channel = ch;
            set_nonblock((*ch).fd);
            let cq = (api.create_cq)(verbs, st.sq_size as c_int + st.rq_size as c_int, self.id.cast(), ch, 0);
            if cq.is_null() {
                return Err(last());
            }
            st.cq = cq;
            let notify = (*(*cq).context).ops.req_notify_cq.ok_or(Errno(libc::ENOSYS))?;
            notify(cq, 0);
            (*self.id).recv_cq_channel = ch;
            (*self.id).send_cq_channel = ch;
            (*self.id).recv_cq = cq;
            (*self.id).send_cq = cq;
            let mut qa = ffi::ibv_qp_init_attr {
                qp_context: self.id.cast(),
                send_cq: cq,
                recv_cq: cq,
                qp_type: ffi::IBV_QPT_RC,
                sq_sig_all: 1,
                cap: ffi::ibv_qp_cap {
                    max_send_wr: st.sq_size as u32,
                    max_recv_wr: st.rq_size as u32,
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: st.sq_inline as u32,
                },
                ..Default::default()
            };
            if rdma_create_qp(self.id, pd, &mut qa) != 0 {
                return Err(last());
            }
            st.qp = (*self.id).qp;
            st.sq_inline = qa.cap.max_inline_data.min(u16::MAX as u32) as u16;
            st.pd = pd;
        }
        st.init_bufs()?;
        for _ in 0..st.rq_size {
            st.post_recv()?;
        }
        Ok(())
    }

    pub(super) fn shutdown(&self, how: c_int) -> Result<(), Errno> {
        super::keepalive::forget(self.fd);
        let mut r = Ok(());
        'out: {
            let ctrl;
            {
                let mut st = lock(&self.st);
                if st.state & S_CONNECTED == 0 {
                    break 'out;
                }
                match how {
                    libc::SHUT_RDWR => {
                        ctrl = super::data::CTRL_DISCONNECT;
                        st.state &= !(S_READABLE | S_WRITABLE);
                    }
                    libc::SHUT_WR => {
                        st.state &= !S_WRITABLE;
                        st.shut_wr = true;
                        ctrl = if st.state & S_READABLE != 0 {
                            super::data::CTRL_SHUTDOWN
                        } else {
                            super::data::CTRL_DISCONNECT
                        };
                    }
                    _ => {
                        st.state &= !S_READABLE;
                        if st.state & S_WRITABLE != 0 {
                            break 'out;
                        }
                        ctrl = super::data::CTRL_DISCONNECT;
                    }
                }
            }
            if let Err(e) = self.process(false, State::can_send_ctrl) {
                r = Err(e);
                break 'out;
            }
            {
                let mut st = lock(&self.st);
                if st.state & S_CONNECTED != 0 && st.ctrl_avail() {
                    st.ctrl_seqno = st.ctrl_seqno.wrapping_add(1);
                    r = st.post_msg(super::data::msg(super::data::OP_CTRL, ctrl));
                }
            }
            if lock(&self.st).state & S_CONNECTED != 0 {
                let _ = self.process(false, State::all_sends_done);
            }
        }
        let st = lock(&self.st);
        if st.state & S_DISCONNECTED != 0 && !st.qp.is_null() {
            // As librdmacm's ucma_shutdown on IB: the QP to the error state, which flushes the
            // receives (and so wakes a thread waiting on the CQ).
            let mut a = ffi::ibv_qp_attr { qp_state: ffi::IBV_QPS_ERR, ..Default::default() };
            // SAFETY: our QP.
            unsafe { (api().modify_qp)(st.qp, &mut a, ffi::IBV_QP_STATE as c_int) };
        }
        r
    }

    /// rclose: a graceful shutdown when connected, then everything released (the descriptors
    /// when the last thread using the socket lets go of it).
    pub(super) fn close(&self) {
        if lock(&self.st).state & S_CONNECTED != 0 {
            let _ = self.shutdown(libc::SHUT_RDWR);
        }
        super::keepalive::forget(self.fd);
        if let Some(mut l) = lock(&self.listener).take() {
            let one = 1u64;
            // SAFETY: our eventfd.
            unsafe { libc::write(l.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
            if let Some(t) = l.thread.take() {
                let _ = t.join();
            }
            for s in lock(&l.queue).drain(..) {
                if let Sock::Stream(n) = &*s {
                    n.close();
                }
            }
        }
        if let Some(t) = lock(&self.connector).take() {
            let _ = t.join();
        }
    }

    pub(super) fn peer_name(&self, a: *mut libc::sockaddr, len: *mut libc::socklen_t) -> Result<(), Errno> {
        // SAFETY: our ID's route (the destination address).
        let src = unsafe { &(*self.id).route.addr.__bindgen_anon_2.dst_storage as *const _ as *const libc::sockaddr };
        super::opts::copy_addr(src, a, len)
    }

    pub(super) fn sock_name(&self, a: *mut libc::sockaddr, len: *mut libc::socklen_t) -> Result<(), Errno> {
        // SAFETY: our ID's route (the source address).
        let src = unsafe { &(*self.id).route.addr.__bindgen_anon_1.src_storage as *const _ as *const libc::sockaddr };
        super::opts::copy_addr(src, a, len)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let st = self.st.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the ID and the verbs objects are ours; the QP goes first, so that nothing is
        // written into the buffers after they are released.
        unsafe {
            if !(*self.id).qp.is_null() {
                rdma_destroy_qp(self.id);
            }
            st.release_bufs();
            destroy_cq_and_id(self.id, st.cq, st.channel);
        }
    }
}

/// Destroys an rsocket's CQ and completion channel (which it made itself and set in its ID, as
/// rsocket.c does), then the ID.
///
/// # Safety
/// `id` is a live rdma_cm ID whose QP is gone; `cq` and `channel` are NULL or made for it.
pub(super) unsafe fn destroy_cq_and_id(
    id: *mut c::rdma_cm_id,
    cq: *mut ffi::ibv_cq,
    channel: *mut ffi::ibv_comp_channel,
) {
    let api = api();
    // SAFETY: as the caller promises.
    unsafe {
        if !cq.is_null() {
            (api.destroy_cq)(cq);
            (*id).recv_cq = std::ptr::null_mut();
            (*id).send_cq = std::ptr::null_mut();
        }
        if !channel.is_null() {
            (api.destroy_comp_channel)(channel);
            (*id).recv_cq_channel = std::ptr::null_mut();
            (*id).send_cq_channel = std::ptr::null_mut();
        }
        rdma_destroy_id(id);
    }
}

/// The listener's thread (rdma-core's listen service): each connection request is answered
/// with a QP and our connection data, and queued for raccept once established.
fn listen_loop(owner: &Arc<Sock>, queue: &Mutex<VecDeque<Arc<Sock>>>, ready: &OwnedFd, stop: &OwnedFd) {
    let Sock::Stream(me) = &**owner else { return };
    loop {
        let mut fds = [
            libc::pollfd { fd: me.fd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if crate::last_errno() == libc::EINTR {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & libc::POLLIN == 0 {
            if fds[0].revents != 0 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        let mut nid = std::ptr::null_mut();
        // SAFETY: our listening ID; its channel has an event.
        if unsafe { rdma_get_request(me.id, &mut nid) } != 0 {
            continue;
        }
        if let Ok(s) = accept_one(me, nid) {
            lock(queue).push_back(s);
            let one = 1u64;
            // SAFETY: our eventfd.
            unsafe { libc::write(ready.as_raw_fd(), (&one as *const u64).cast(), 8) };
            super::poll::notify_others();
        }
    }
}

/// One connection request: the new rsocket inherits the listener's sizes, checks the peer's
/// connection data, and accepts with its own (rdma-core's rs_accept). A request without
/// rsocket connection data is rejected.
fn accept_one(l: &Stream, nid: *mut c::rdma_cm_id) -> Result<Arc<Sock>, Errno> {
    let st = lock(&l.st).inherit();
    let fs = l.fs_flags.load(Ordering::Relaxed);
    let fdf = l.fd_flags.load(Ordering::Relaxed);
    let n = Stream::of_id(nid, l.domain, st, fs, fdf)?;
    let reject = |n: Stream, e: Errno| {
        // SAFETY: the new ID, not yet accepted.
        unsafe { rdma_reject(n.id, std::ptr::null(), 0) };
        drop(n);
        Err(e)
    };
    let Some(req) = n.event_private_data() else { return reject(n, Errno(libc::EPROTO)) };
    let data = {
        let mut st = lock(&n.st);
        let r = n.create_ep(&mut st).and_then(|_| st.save_conn_data(&req));
        match r {
            Ok(()) => st.conn_data(),
            Err(e) => {
                drop(st);
                return reject(n, e);
            }
        }
    };
    // SAFETY: the request's event, kept by the synchronous ID.
    let mut param = unsafe { (*(*n.id).event).param.conn };
    param.private_data = data.as_ptr().cast();
    param.private_data_len = CONN_DATA_LEN as u8;
    // SAFETY: the new ID with its QP; the parameters live across the call.
    if unsafe { rdma_accept(n.id, &mut param) } != 0 {
        let e = last();
        return reject(n, e);
    }
    {
        let mut st = lock(&n.st);
        st.state = S_CONNECT_RDWR;
        st.cm_nonblock = true;
    }
    set_nonblock(n.fd);
    Ok(Arc::new(Sock::Stream(n)))
}

impl State {
    /// A new socket's sizes: the program's (from setsockopt before connecting) or rdma-core's
    /// defaults.
    pub(super) fn new(d: &config::Defaults) -> State {
        State::with_sizes(d.sq_size_default(), d.rqsize.max(1), d.inline, d.wmem, d.mem, d.iomap_size)
    }

    fn inherit(&self) -> State {
        let mut s = State::with_sizes(
            self.sq_size,
            self.rq_size,
            self.sq_inline,
            self.sbuf_size,
            self.rbuf_size,
            self.target_iomap_size,
        );
        s.keepalive_time = self.keepalive_time;
        s
    }

    /// Our connection data (see [`ConnData`]).
    pub(super) fn conn_data(&self) -> [u8; CONN_DATA_LEN] {
        let t = self.target.as_ref().expect("create_ep made the target SGL");
        let r = self.rbuf.as_ref().expect("create_ep made the receive buffer");
        ConnData {
            net: cfg!(target_endian = "big"),
            iomap: true,
            credits: self.rq_size,
            iomap_size: config::value_to_scale(self.target_iomap_size as u32),
            target_sgl: RsSge { addr: t.addr(), key: t.rkey(), length: SGL_SIZE },
            data_buf: RsSge { addr: r.addr(), key: r.rkey(), length: self.rbuf_size >> 1 },
        }
        .encode()
    }

    /// The peer's connection data (rdma-core's rs_save_conn_data).
    pub(super) fn save_conn_data(&mut self, d: &[u8; CONN_DATA_LEN]) -> Result<(), Errno> {
        let c = ConnData::parse(d)?;
        self.remote_sgl = c.target_sgl;
        self.remote_sge = 1 % c.target_sgl.length;
        self.swap_sgl = c.net != cfg!(target_endian = "big");
        if c.iomap {
            self.remote_iomap = RsSge {
                addr: c.target_sgl.addr.wrapping_add(16 * c.target_sgl.length as u64),
                key: c.target_sgl.key,
                length: config::scale_to_value(c.iomap_size),
            };
        }
        self.set_target(0, c.data_buf);
        self.sseq_comp = c.credits;
        Ok(())
    }
}

/// rdma-core's `struct rs_conn_data`, the private data of the REQ and of the REP (40 bytes, the
/// numbers big-endian): version (1), flags (1: the host is big-endian, so the SGL entries it
/// writes are in that order; 2: it has a target iomap), the receive credits (its receive queue
/// size), three reserved bytes, the target iomap size (8-bit scale), the target SGL (address,
/// rkey, number of entries) and the first half of the receive buffer (address, rkey, length).
#[derive(Debug, PartialEq)]
pub(super) struct ConnData {
    pub(super) net: bool,
    pub(super) iomap: bool,
    pub(super) credits: u16,
    pub(super) iomap_size: u8,
    pub(super) target_sgl: RsSge,
    pub(super) data_buf: RsSge,
}

impl ConnData {
    pub(super) fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut d = [0u8; CONN_DATA_LEN];
        d[0] = 1;
        d[1] = if self.iomap { CONN_FLAG_IOMAP } else { 0 } | if self.net { CONN_FLAG_NET } else { 0 };
        d[2..4].copy_from_slice(&self.credits.to_be_bytes());
        d[7] = self.iomap_size;
        for (o, s) in [(8, &self.target_sgl), (24, &self.data_buf)] {
            d[o..o + 8].copy_from_slice(&s.addr.to_be_bytes());
            d[o + 8..o + 12].copy_from_slice(&s.key.to_be_bytes());
            d[o + 12..o + 16].copy_from_slice(&s.length.to_be_bytes());
        }
        d
    }

    /// The peer's, untrusted: another version is ENOTSUP (as rdma-core); a target SGL of no
    /// entries (nowhere to write credits) or of more than 2^16 is EPROTO.
    pub(super) fn parse(d: &[u8; CONN_DATA_LEN]) -> Result<ConnData, Errno> {
        let be64 = |o: usize| u64::from_be_bytes(d[o..o + 8].try_into().expect("8 bytes"));
        let be32 = |o: usize| u32::from_be_bytes(d[o..o + 4].try_into().expect("4 bytes"));
        if d[0] != 1 {
            return Err(Errno(libc::ENOTSUP));
        }
        let sge = |o: usize| RsSge { addr: be64(o), key: be32(o + 8), length: be32(o + 12) };
        let c = ConnData {
            net: d[1] & CONN_FLAG_NET != 0,
            iomap: d[1] & CONN_FLAG_IOMAP != 0,
            credits: u16::from_be_bytes([d[2], d[3]]),
            iomap_size: d[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        };
        if c.target_sgl.length == 0 || c.target_sgl.length > 1 << 16 {
            return Err(Errno(libc::EPROTO));
        }
        Ok(c)
    }
}

impl config::Defaults {
    fn sq_size_default(&self) -> u16 {
        self.sqsize.max(1)
    }
}

/// The smallest send buffer rsockets work with.
pub(super) fn min_sbuf(v: u32) -> u32 {
    if v < SNDLOWAT {
        SNDLOWAT << 1
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes rdma-core's rs_format_conn_data makes on a little-endian host with rq_size 384,
    /// no iomap, the target SGL at 0x5555_0000_1000 (rkey 0x1234, 2 entries) and the receive
    /// buffer at 0x5555_0002_0000 (rkey 0x5678, a half of 64 KiB).
    const RDMA_CORE: [u8; CONN_DATA_LEN] = [
        1, 2, 0x01, 0x80, 0, 0, 0, 0, //
        0, 0, 0x55, 0x55, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 2, //
        0, 0, 0x55, 0x55, 0, 2, 0, 0, 0, 0, 0x56, 0x78, 0, 1, 0, 0,
    ];

    #[test]
    fn connection_data_is_rdma_cores_layout() {
        let c = ConnData::parse(&RDMA_CORE).expect("valid");
        assert_eq!(c.credits, 384);
        assert!(c.iomap && !c.net);
        assert_eq!((c.target_sgl.addr, c.target_sgl.key, c.target_sgl.length), (0x5555_0000_1000, 0x1234, 2));
        assert_eq!((c.data_buf.addr, c.data_buf.key, c.data_buf.length), (0x5555_0002_0000, 0x5678, 0x10000));
        assert_eq!(c.encode(), RDMA_CORE);
    }

    #[test]
    fn bad_connection_data_is_refused() {
        let mut d = RDMA_CORE;
        d[0] = 2;
        assert_eq!(ConnData::parse(&d).map_err(|e| e.0).unwrap_err(), libc::ENOTSUP);
        let mut d = RDMA_CORE;
        d[23] = 0;
        assert_eq!(ConnData::parse(&d).map_err(|e| e.0).unwrap_err(), libc::EPROTO);
    }
}
