//! Datagram rsockets (SOCK_DGRAM over UD), as rdma-core's: a UDP socket of the same address
//! finds the peer's UD QP, then datagrams go between UD QPs.
//!
//! - The first datagram to an address goes over the UDP socket, after a 16-byte header (IPv4;
//!   28 for IPv6): tag 0x55555555, IP version, op (0 data, 7 control), header length, a reserved
//!   byte, the sender's UD QPN, the sender's IP address. The receiver's service thread answers
//!   a data datagram with a control one carrying its own QPN, makes an address handle for the
//!   sender's QPN, and hands the data to its own QP (a UD SEND to itself), so the program
//!   receives it as any other. Later datagrams go straight between the QPs.
//! - Every datagram on a UD QP starts with an 8-byte header (IPv4; 24 for IPv6): version,
//!   length, the source port, the source address; the receiver reports that as the datagram's
//!   source (recvfrom).
//! - Datagrams are at most 2048 bytes with their header (one receive buffer: rdma-core's
//!   RS_SNDLOWAT); a larger one fails with EMSGSIZE (rdma-core would overrun its buffer).

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::config::{defaults, SNDLOWAT};
use super::opts::Addr;
use super::stream::eventfd;
use super::{Cursor, Iov};
use crate::cma::for_rsockets::*;
use crate::cma::{api, lock};
use crate::cma_ffi as c;
use crate::ffi;
use crate::Errno;

mod qp;
mod wire;

use qp::{post_recv, DsQp, Mem};
use wire::*;

fn last() -> Errno {
    Errno(crate::last_errno())
}

struct Dest {
    qp: usize,
    ah: *mut ffi::ibv_ah,
    qpn: u32,
}

struct DState {
    ready: bool,
    open: bool,
    sq_size: u16,
    rq_size: u16,
    sq_inline: u16,
    sbuf_size: u32,
    rbuf_size: u32,
    sbuf: Option<Mem>,
    free: Vec<u32>,
    qps: Vec<DsQp>,
    dests: HashMap<SocketAddr, Dest>,
    conn: Option<SocketAddr>,
    /// Received datagrams not yet read: (QP, offset in its buffer, bytes after the GRH).
    rmsgs: VecDeque<(usize, u32, u32)>,
    rqe_avail: u32,
    sqe_avail: u32,
}

// SAFETY: the raw pointers are this socket's verbs objects, used under the lock.
unsafe impl Send for DState {}

impl DState {
    /// Asks every QP's CQ not yet armed for its next completion's event. True if one was armed
    /// now (its completions must be looked at again before sleeping).
    fn arm_all(&mut self) -> bool {
        let mut now = false;
        for q in self.qps.iter_mut().filter(|q| !q.cq_armed) {
            // SAFETY: our CQ.
            unsafe {
                if let Some(f) = (*(*q.cq).context).ops.req_notify_cq {
                    f(q.cq, 0);
                }
            }
            q.cq_armed = true;
            now = true;
        }
        now
    }
}

pub(crate) struct Dgram {
    udp: OwnedFd,
    st: Mutex<DState>,
    svc: Mutex<Option<(OwnedFd, JoinHandle<()>)>>,
    pub(super) fs_flags: AtomicI32,
    pub(super) fd_flags: AtomicI32,
}

impl Dgram {
    pub(super) fn new(domain: c_int, fs: c_int, fdf: c_int) -> Result<Dgram, Errno> {
        // The socket system call itself: under librspreload, socket() would make another rsocket.
        let fd = crate::ksock::socket(domain, libc::SOCK_DGRAM, 0)
            .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let d = defaults();
        Ok(Dgram {
            udp: fd,
            st: Mutex::new(DState {
                ready: false,
                open: true,
                sq_size: d.sqsize.max(1),
                rq_size: d.rqsize.max(1),
                sq_inline: d.inline,
                sbuf_size: d.wmem,
                rbuf_size: d.mem,
                sbuf: None,
                free: vec![],
                qps: vec![],
                dests: HashMap::new(),
                conn: None,
                rmsgs: VecDeque::new(),
                rqe_avail: 0,
                sqe_avail: 0,
            }),
            svc: Mutex::new(None),
            fs_flags: AtomicI32::new(fs),
            fd_flags: AtomicI32::new(fdf),
        })
    }

    pub(super) fn fd(&self) -> c_int {
        self.udp.as_raw_fd()
    }

    fn nonblocking(&self, flags: c_int) -> bool {
        self.fs_flags.load(Ordering::Relaxed) & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    /// rdma-core's ds_init_ep: sizes (a receive buffer of 2048 bytes per receive, a send slot of
    /// 2048 bytes per send), the send buffer, the service thread.
    fn init(self: &Dgram, owner: &Arc<super::Sock>) -> Result<(), Errno> {
        let mut st = lock(&self.st);
        if st.ready {
            return Ok(());
        }
        let max = 0xFFFEu16;
        st.sq_size = st.sq_size.min(max);
        st.rq_size = st.rq_size.min(max);
        if st.rq_size as u32 > st.rbuf_size / SNDLOWAT {
            st.rq_size = (st.rbuf_size / SNDLOWAT).max(1) as u16;
        }
        st.rbuf_size = st.rq_size as u32 * SNDLOWAT;
        if st.sq_size as u32 > st.sbuf_size / SNDLOWAT {
            st.sq_size = (st.sbuf_size / SNDLOWAT).max(1) as u16;
        }
        st.sbuf_size = st.sq_size as u32 * SNDLOWAT;
        st.sbuf = Some(Mem::new(st.sbuf_size as usize)?);
        st.free = (0..st.sq_size as u32).rev().map(|i| i * SNDLOWAT).collect();
        st.sqe_avail = st.sq_size as u32;
        st.rqe_avail = st.rq_size as u32;
        let stop = eventfd(0)?;
        let stop_fd = stop.as_raw_fd();
        let o = owner.clone();
        let h = std::thread::Builder::new()
            .name("rsocket-udp".into())
            .spawn(move || {
                softrdma_device::signals::keep_off_this_thread();
                if let super::Sock::Dgram(d) = &*o {
                    d.service(stop_fd);
                }
            })
            .map_err(|_| Errno(libc::EAGAIN))?;
        *lock(&self.svc) = Some((stop, h));
        st.ready = true;
        Ok(())
    }

    fn owner(&self) -> Result<Arc<super::Sock>, Errno> {
        super::lookup(self.fd()).ok_or(Errno(libc::EBADF))
    }

    pub(super) fn bind(&self, a: &Addr, len: libc::socklen_t) -> Result<(), Errno> {
        self.init(&self.owner()?)?;
        // SAFETY: our socket; the program's address.
        if unsafe { libc::bind(self.fd(), a.as_ptr(), len.min(a.len)) } != 0 {
            return Err(last());
        }
        Ok(())
    }

    pub(super) fn connect(&self, a: &Addr, len: libc::socklen_t) -> Result<(), Errno> {
        self.init(&self.owner()?)?;
        let to = to_std(a.as_ptr()).ok_or(Errno(libc::EAFNOSUPPORT))?;
        // Bound first (src_for), so that connect(2) does not bind the socket elsewhere.
        self.dest(to)?;
        // SAFETY: our socket; the program's address.
        if unsafe { libc::connect(self.fd(), a.as_ptr(), len.min(a.len)) } != 0 {
            return Err(last());
        }
        lock(&self.st).conn = Some(to);
        Ok(())
    }

    /// Our UDP socket's address.
    fn local_name(&self) -> Result<SocketAddr, Errno> {
        // SAFETY: zeroed storage for any address.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&ss) as libc::socklen_t;
        // SAFETY: our socket; room for any address.
        if unsafe { libc::getsockname(self.fd(), &mut ss as *mut _ as *mut _, &mut len) } != 0 {
            return Err(last());
        }
        to_std(&ss as *const _ as *const _).ok_or(Errno(libc::EAFNOSUPPORT))
    }

    /// The source address rdma_cm picks for `to` (the device that serves the route).
    fn resolve_src(to: SocketAddr) -> Result<IpAddr, Errno> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a temporary synchronous ID, destroyed below.
        if unsafe { rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), c::RDMA_PS_UDP) } != 0 {
            return Err(last());
        }
        let dst = to_c(&to);
        // SAFETY: the temporary ID and the destination; its source address once resolved.
        let r = unsafe {
            if rdma_resolve_addr(id, std::ptr::null_mut(), dst.as_ptr() as *mut _, 2000) != 0 {
                Err(last())
            } else {
                to_std(&(*id).route.addr.__bindgen_anon_1.src_storage as *const _ as *const libc::sockaddr)
                    .ok_or(Errno(libc::EAFNOSUPPORT))
            }
        };
        // SAFETY: the temporary ID.
        unsafe { rdma_destroy_id(id) };
        Ok(r?.ip())
    }

    /// The local address datagrams to `to` leave from (rdma-core's ds_get_src_addr): the bound
    /// address, or for a wildcard (or 127.0.0.1) the one rdma_cm routes `to` from, with our
    /// port. A socket not bound yet is bound to that address (an ephemeral port), so that its
    /// UDP datagrams carry the address its QP has: the peer keys its destinations by the UDP
    /// source address (rdma-core leaves the two to differ, "to do" in its service thread).
    fn src_for(&self, to: SocketAddr) -> Result<SocketAddr, Errno> {
        let me = self.local_name()?;
        if me.port() == 0 {
            let ip = Self::resolve_src(to)?;
            let a = to_c(&SocketAddr::new(ip, 0));
            // SAFETY: our socket.
            if unsafe { libc::bind(self.fd(), a.as_ptr(), a.len) } != 0 {
                return Err(last());
            }
            return self.local_name();
        }
        let any = match me.ip() {
            IpAddr::V4(v) => v.is_unspecified() || v == std::net::Ipv4Addr::LOCALHOST,
            IpAddr::V6(v) => v.is_unspecified() || v.is_loopback(),
        };
        if !any {
            return Ok(me);
        }
        Ok(SocketAddr::new(Self::resolve_src(to)?, me.port()))
    }

    /// The destination entry of `to`, made (with a QP for the local address) when new.
    fn dest(&self, to: SocketAddr) -> Result<(), Errno> {
        if lock(&self.st).dests.contains_key(&to) {
            return Ok(());
        }
        let src = self.src_for(to)?;
        let qi = {
            let st = lock(&self.st);
            st.qps.iter().position(|q| q.local == src)
        };
        let qi = match qi {
            Some(i) => i,
            None => self.create_qp(src)?,
        };
        lock(&self.st).dests.entry(to).or_insert(Dest { qp: qi, ah: std::ptr::null_mut(), qpn: 0 });
        Ok(())
    }

    /// The service thread: datagrams on the UDP socket (rdma-core's udp_svc_process_rs).
    fn service(&self, stop: c_int) {
        let mut buf = vec![0u8; SNDLOWAT as usize];
        loop {
            let mut fds = [
                libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two pollfds.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 && crate::last_errno() != libc::EINTR {
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents == 0 {
                continue;
            }
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut sl = std::mem::size_of_val(&ss) as libc::socklen_t;
            // SAFETY: our socket, our buffer.
            let n = unsafe {
                libc::recvfrom(
                    self.fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    &mut ss as *mut _ as *mut _,
                    &mut sl,
                )
            };
            if n < UDP_HDR_V4 as isize {
                continue;
            }
            let Some(from) = to_std(&ss as *const _ as *const _) else { continue };
            let _ = self.on_udp(&buf[..n as usize], from);
        }
    }

    /// One datagram on the UDP socket. Untrusted: anything without a valid header is dropped.
    fn on_udp(&self, b: &[u8], from: SocketAddr) -> Result<(), Errno> {
        let hlen = b[6] as usize;
        let valid = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) == UDP_TAG
            && ((b[4] == 4 && from.is_ipv4() && hlen == UDP_HDR_V4)
                || (b[4] == 6 && from.is_ipv6() && hlen == UDP_HDR_V6))
            && b.len() >= hlen;
        if !valid {
            return Ok(());
        }
        let op = b[5];
        let qpn = u32::from_be_bytes([b[8], b[9], b[10], b[11]]) & 0xFF_FFFF;
        self.dest(from)?;
        if op == OP_DATA {
            self.send_udp(from, OP_CTRL, &[])?;
        }
        let (need, qi) = {
            let st = lock(&self.st);
            let d = st.dests.get(&from).ok_or(Errno(libc::EINVAL))?;
            (d.ah.is_null() || d.qpn != qpn, d.qp)
        };
        if need {
            let ah = {
                let st = lock(&self.st);
                self.make_ah(&st.qps[qi], from)
            }?;
            let mut st = lock(&self.st);
            if let Some(d) = st.dests.get_mut(&from) {
                if !d.ah.is_null() {
                    // SAFETY: the entry's old handle, replaced.
                    unsafe { (api().destroy_ah)(d.ah) };
                }
                d.ah = ah;
                d.qpn = qpn;
            }
        }
        if op == OP_DATA {
            // To our own QP, as if it had come over UD from `from`.
            self.post_ud(
                qi,
                None,
                &ds_header(&from),
                &mut Cursor::new(&super::data::one(b[hlen..].as_ptr().cast(), b.len() - hlen)),
                b.len() - hlen,
                true,
            )?;
        }
        Ok(())
    }

    /// A datagram with rdma-core's UDP header (op data or control) to `to` over the socket.
    fn send_udp(&self, to: SocketAddr, op: u8, iov: &[libc::iovec]) -> Result<usize, Errno> {
        let (qpn, ip) = {
            let st = lock(&self.st);
            let d = st.dests.get(&to).ok_or(Errno(libc::EINVAL))?;
            let q = &st.qps[d.qp];
            // SAFETY: our QP.
            (unsafe { (*q.qp).qp_num } & 0xFF_FFFF, q.local.ip())
        };
        let mut h = vec![];
        h.extend(UDP_TAG.to_be_bytes());
        match ip {
            IpAddr::V4(v) => {
                h.extend([4, op, UDP_HDR_V4 as u8, 0]);
                h.extend(qpn.to_be_bytes());
                h.extend(v.octets());
            }
            IpAddr::V6(v) => {
                h.extend([6, op, UDP_HDR_V6 as u8, 0]);
                h.extend(qpn.to_be_bytes());
                h.extend(v.octets());
            }
        }
        let mut v = vec![libc::iovec { iov_base: h.as_mut_ptr().cast(), iov_len: h.len() }];
        v.extend_from_slice(iov);
        let dst = to_c(&to);
        // SAFETY: zeroed header, filled with our iovecs and the destination.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_name = dst.as_ptr() as *mut c_void;
        m.msg_namelen = dst.len;
        m.msg_iov = v.as_mut_ptr();
        m.msg_iovlen = v.len() as _;
        // SAFETY: our socket; the message's buffers live across the call.
        let n = unsafe { libc::sendmsg(self.fd(), &m, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(last());
        }
        Ok((n as usize).saturating_sub(h.len()))
    }

    /// A datagram (our UD header, then `len` bytes of `src`) on QP `qi`: to `to`'s QP, or with
    /// `to` None to the QP itself. Waits for a free send slot unless `nonblock`.
    fn post_ud(
        &self,
        qi: usize,
        to: Option<SocketAddr>,
        hdr: &[u8],
        src: &mut Cursor<'_>,
        len: usize,
        block: bool,
    ) -> Result<(), Errno> {
        if hdr.len() + len > SNDLOWAT as usize {
            return Err(Errno(libc::EMSGSIZE));
        }
        loop {
            {
                let mut st = lock(&self.st);
                self.poll_cqs(&mut st);
                if let Some(off) = st.free.pop() {
                    st.sqe_avail -= 1;
                    let q = &st.qps[qi];
                    let (ah, qpn) = match to {
                        Some(t) => {
                            let d = st.dests.get(&t).ok_or(Errno(libc::EINVAL))?;
                            (d.ah, d.qpn)
                        }
                        // SAFETY: our QP.
                        None => (q.self_ah, unsafe { (*q.qp).qp_num }),
                    };
                    let base = st.sbuf.as_ref().expect("initialised").ptr;
                    // SAFETY: a free slot of SNDLOWAT bytes in our send buffer.
                    unsafe {
                        let slot = base.add(off as usize);
                        std::ptr::copy_nonoverlapping(hdr.as_ptr(), slot, hdr.len());
                        src.read_to(slot.add(hdr.len()), len);
                    }
                    let total = (hdr.len() + len) as u32;
                    let mut sge =
                        ffi::ibv_sge { addr: base as u64 + off as u64, length: total, lkey: unsafe { (*q.smr).lkey } };
                    let mut wr = ffi::ibv_send_wr {
                        wr_id: off as u64,
                        sg_list: &mut sge,
                        num_sge: 1,
                        opcode: ffi::IBV_WR_SEND,
                        send_flags: if total <= st.sq_inline as u32 { ffi::IBV_SEND_INLINE } else { 0 },
                        ..Default::default()
                    };
                    wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                        ah,
                        remote_qpn: qpn,
                        remote_qkey: c::RDMA_UDP_QKEY,
                    };
                    let mut bad = std::ptr::null_mut();
                    // SAFETY: our QP; the request lives across the call.
                    let r = unsafe {
                        ((*(*q.qp).context).ops.post_send.ok_or(Errno(libc::ENOSYS))?)(q.qp, &mut wr, &mut bad)
                    };
                    if r != 0 {
                        st.free.push(off);
                        st.sqe_avail += 1;
                        return Err(Errno(r));
                    }
                    return Ok(());
                }
            }
            if !block {
                return Err(Errno(libc::EAGAIN));
            }
            self.wait(|st| !st.free.is_empty())?;
        }
    }

    /// Retires completions of every QP (rdma-core's ds_poll_cqs): valid datagrams are queued
    /// while there is room, others have their receive posted again.
    fn poll_cqs(&self, st: &mut DState) {
        let rbuf_size = st.rbuf_size;
        for qi in 0..st.qps.len() {
            loop {
                let mut wc = ffi::ibv_wc::default();
                let q = &st.qps[qi];
                // SAFETY: our CQ.
                let n = unsafe {
                    match (*(*q.cq).context).ops.poll_cq {
                        Some(f) => f(q.cq, 1, &mut wc),
                        None => -1,
                    }
                };
                if n <= 0 {
                    break;
                }
                if wc.wr_id & RECV_FLAG != 0 {
                    let off = wc.wr_id as u32;
                    let body = wc.byte_len.saturating_sub(GRH_LEN as u32);
                    let ok = wc.status == ffi::IBV_WC_SUCCESS
                        && wc.byte_len >= (GRH_LEN + HDR_V4) as u32
                        && off < rbuf_size
                        && {
                            let rb = q.rbuf.as_ref().expect("made with the QP").ptr();
                            // SAFETY: within our receive buffer (off < rbuf_size, body <= 2048).
                            let h = unsafe {
                                std::slice::from_raw_parts(rb.add(off as usize), body.min(SNDLOWAT) as usize)
                            };
                            parse_header(h).is_some_and(|(_, l)| l as u32 <= body)
                        };
                    if ok && st.rqe_avail > 0 {
                        st.rqe_avail -= 1;
                        st.rmsgs.push_back((qi, off, body));
                    } else {
                        let _ = post_recv(q, rbuf_size, off);
                    }
                } else {
                    st.free.push(wc.wr_id as u32);
                    st.sqe_avail += 1;
                }
            }
        }
    }

    /// Blocks until `test` holds, sleeping on the QPs' completion channels.
    fn wait(&self, test: impl Fn(&DState) -> bool) -> Result<(), Errno> {
        let start = Instant::now();
        let spin = Duration::from_micros(defaults().polling_time_us as u64);
        loop {
            let mut fds = vec![];
            {
                let mut st = lock(&self.st);
                self.poll_cqs(&mut st);
                if test(&st) {
                    return Ok(());
                }
                if start.elapsed() < spin {
                    continue;
                }
                let armed_now = st.arm_all();
                for q in &st.qps {
                    // SAFETY: our channel.
                    fds.push(libc::pollfd { fd: unsafe { (*q.channel).fd }, events: libc::POLLIN, revents: 0 });
                }
                if armed_now {
                    continue;
                }
            }
            super::poll::block_on(&mut fds, defaults().wake_up_interval_ms)?;
            if self.take_events() {
                super::poll::notify_others();
            }
        }
    }

    pub(super) fn take_events(&self) -> bool {
        let mut st = lock(&self.st);
        let mut any = false;
        for q in st.qps.iter_mut() {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: our non-blocking channel.
            if unsafe { (api().get_cq_event)(q.channel, &mut cq, &mut ctx) } == 0 {
                // SAFETY: the event of our CQ.
                unsafe { (api().ack_cq_events)(q.cq, 1) };
                q.cq_armed = false;
                any = true;
            }
        }
        any
    }

    pub(super) fn send(
        &self,
        iov: &Iov,
        flags: c_int,
        to: Option<(*const libc::sockaddr, libc::socklen_t)>,
    ) -> Result<usize, Errno> {
        self.init(&self.owner()?)?;
        if !lock(&self.st).open {
            return Err(Errno(libc::EPIPE));
        }
        let dst = match to {
            Some((a, l)) if !a.is_null() => {
                let t = to_std(super::opts::sockaddr_in(a, l)?.as_ptr()).ok_or(Errno(libc::EAFNOSUPPORT))?;
                self.dest(t)?;
                // As rdma-core: the destination of the last sendto is the socket's until the next.
                lock(&self.st).conn = Some(t);
                t
            }
            _ => lock(&self.st).conn.ok_or(Errno(libc::EDESTADDRREQ))?,
        };
        let len = iov.len();
        let (qi, resolved, hdr) = {
            let st = lock(&self.st);
            let d = st.dests.get(&dst).ok_or(Errno(libc::EINVAL))?;
            (d.qp, !d.ah.is_null(), st.qps[d.qp].hdr.clone())
        };
        if !resolved {
            let v: Vec<libc::iovec> =
                iov.parts.iter().map(|&(p, n)| libc::iovec { iov_base: p.cast(), iov_len: n }).collect();
            if UDP_HDR_V6 + len > SNDLOWAT as usize {
                return Err(Errno(libc::EMSGSIZE));
            }
            return self.send_udp(dst, OP_DATA, &v);
        }
        self.post_ud(qi, Some(dst), &hdr, &mut Cursor::new(iov), len, !self.nonblocking(flags))?;
        Ok(len)
    }

    pub(super) fn recv(
        &self,
        iov: &Iov,
        flags: c_int,
        from: Option<(*mut libc::sockaddr, *mut libc::socklen_t)>,
    ) -> Result<usize, Errno> {
        self.init(&self.owner()?)?;
        if !lock(&self.st).open {
            return Ok(0);
        }
        if lock(&self.st).rmsgs.is_empty() {
            if self.nonblocking(flags) {
                let mut st = lock(&self.st);
                self.poll_cqs(&mut st);
                if st.rmsgs.is_empty() {
                    return Err(Errno(libc::EAGAIN));
                }
            } else {
                self.wait(|st| !st.rmsgs.is_empty() || !st.open)?;
            }
        }
        let mut st = lock(&self.st);
        let Some(&(qi, off, body)) = st.rmsgs.front() else { return Ok(0) };
        let rbuf_size = st.rbuf_size;
        let q = &st.qps[qi];
        let rb = q.rbuf.as_ref().expect("made with the QP").ptr();
        // SAFETY: a datagram of `body` bytes (validated on arrival) at `off` of our buffer.
        let data = unsafe { std::slice::from_raw_parts(rb.add(off as usize), body as usize) };
        let (src, hl) = parse_header(data).ok_or(Errno(libc::EIO))?;
        let n = (body as usize - hl).min(iov.len());
        Cursor::new(iov).write_from(data[hl..].as_ptr(), n);
        if let Some((a, l)) = from {
            if !a.is_null() && !l.is_null() {
                super::opts::copy_addr(to_c(&src).as_ptr(), a, l)?;
            }
        }
        if flags & libc::MSG_PEEK == 0 {
            let _ = post_recv(q, rbuf_size, off);
            st.rmsgs.pop_front();
            st.rqe_avail += 1;
        }
        Ok(n)
    }

    pub(super) fn shutdown(&self) {
        let _ = self.wait(|st| st.sqe_avail == st.sq_size as u32 || st.qps.is_empty());
        lock(&self.st).open = false;
        super::poll::notify_others();
    }

    pub(super) fn close(&self) {
        if lock(&self.st).ready {
            self.shutdown();
        }
        if let Some((stop, h)) = lock(&self.svc).take() {
            let one = 1u64;
            // SAFETY: our eventfd.
            unsafe { libc::write(stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
            let _ = h.join();
        }
        let mut st = lock(&self.st);
        for (_, d) in st.dests.drain() {
            if !d.ah.is_null() {
                // SAFETY: our handle.
                unsafe { (api().destroy_ah)(d.ah) };
            }
        }
        st.qps.clear();
    }

    pub(super) fn peer_name(&self, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> Result<(), Errno> {
        // SAFETY: getpeername(2) on our socket with the program's buffer.
        if unsafe { libc::getpeername(self.fd(), a, l) } != 0 {
            return Err(last());
        }
        Ok(())
    }

    pub(super) fn sock_name(&self, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> Result<(), Errno> {
        // SAFETY: getsockname(2) on our socket with the program's buffer.
        if unsafe { libc::getsockname(self.fd(), a, l) } != 0 {
            return Err(last());
        }
        Ok(())
    }

    /// SOL_RDMA sizes before the first QP; the rest to the UDP socket (as rdma-core), with the
    /// buffer sizes also kept for the QPs.
    pub(super) fn setsockopt(
        &self,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: libc::socklen_t,
    ) -> Result<(), Errno> {
        let int = || -> Result<u32, Errno> {
            if val.is_null() || (len as usize) < 4 {
                return Err(Errno(libc::EINVAL));
            }
            // SAFETY: an int of the program.
            Ok(unsafe { std::ptr::read_unaligned(val as *const c_int) }.max(0) as u32)
        };
        if level == 0x10000 {
            let v = int()?;
            let mut st = lock(&self.st);
            if !st.qps.is_empty() {
                return Err(Errno(libc::EINVAL));
            }
            match name {
                0 => st.sq_size = v.min(0xFFFE) as u16,
                1 => st.rq_size = v.min(0xFFFE) as u16,
                2 => st.sq_inline = v.min(0xFFFE) as u16,
                _ => return Err(Errno(libc::ENOTSUP)),
            }
            return Ok(());
        }
        // SAFETY: setsockopt(2) on our socket with the program's option.
        if unsafe { libc::setsockopt(self.fd(), level, name, val, len) } != 0 {
            return Err(last());
        }
        if level == libc::SOL_SOCKET && (name == libc::SO_RCVBUF || name == libc::SO_SNDBUF) {
            let v = int()?.saturating_mul(2);
            let mut st = lock(&self.st);
            if st.qps.is_empty() && !st.ready {
                if name == libc::SO_RCVBUF {
                    st.rbuf_size = v.max(SNDLOWAT);
                } else {
                    st.sbuf_size = v.max(SNDLOWAT);
                }
            }
        }
        Ok(())
    }

    pub(super) fn getsockopt(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut libc::socklen_t,
    ) -> Result<(), Errno> {
        if level == 0x10000 {
            let st = lock(&self.st);
            let v = match name {
                0 => st.sq_size as c_int,
                1 => st.rq_size as c_int,
                2 => st.sq_inline as c_int,
                _ => return Err(Errno(libc::ENOTSUP)),
            };
            if val.is_null() || len.is_null() {
                return Err(Errno(libc::EFAULT));
            }
            // SAFETY: getsockopt(2)'s buffer.
            unsafe {
                if (*len as usize) < 4 {
                    return Err(Errno(libc::EINVAL));
                }
                std::ptr::write_unaligned(val as *mut c_int, v);
                *len = 4;
            }
            return Ok(());
        }
        // SAFETY: getsockopt(2) on our socket with the program's buffer.
        if unsafe { libc::getsockopt(self.fd(), level, name, val, len) } != 0 {
            return Err(last());
        }
        Ok(())
    }

    pub(super) fn revents(&self, events: i16, arm: bool) -> i16 {
        let mut st = lock(&self.st);
        self.poll_cqs(&mut st);
        if arm {
            st.arm_all();
            self.poll_cqs(&mut st);
        }
        let mut r = 0;
        if events & libc::POLLIN != 0 && (!st.rmsgs.is_empty() || !st.open) {
            r |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && st.ready && !st.free.is_empty() {
            r |= libc::POLLOUT;
        }
        r
    }

    pub(super) fn waits(&self, out: &mut Vec<libc::pollfd>) {
        let st = lock(&self.st);
        for q in &st.qps {
            // SAFETY: our channel.
            out.push(libc::pollfd { fd: unsafe { (*q.channel).fd }, events: libc::POLLIN, revents: 0 });
        }
    }
}
