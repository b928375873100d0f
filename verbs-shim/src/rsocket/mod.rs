//! librdmacm's rsockets (rsocket(7)): the socket API over RDMA, on the wire as rdma-core's
//! librdmacm speaks it, so that a softrdma host and a host running rdma-core's own rsockets (rxe
//! in the interop guest) talk to each other. docs/rsockets.md records the protocol.
//!
//! - Stream sockets (SOCK_STREAM) run over one RC QP each (`stream`, `data`): the data is RDMA
//!   WRITEs into the peer's receive buffer, every message is an RDMA WRITE with immediate whose
//!   32 bits carry an rsocket opcode, and credits flow back as WRITEs of the next free half of the
//!   receive buffer into the sender's target SGL.
//! - Datagram sockets (SOCK_DGRAM) run over UD QPs, the peer's QP number learnt through a UDP
//!   socket of the same address (`dgram`).
//! - `rpoll`/`rselect` wait on rsockets and ordinary descriptors together (`poll`), as
//!   rdma-core's librspreload needs for the programs it runs.
//!
//! Everything is built on this library's own rdma_cm and verbs calls, as rsocket.c is built on
//! librdmacm's and libibverbs' public APIs: every packet an rsocket makes is an ordinary verbs
//! operation of the device, captured, faulted and counted as any other.
//!
//! An rsocket's number is a descriptor of its own that the program did not open (a stream
//! socket's is its rdma_cm ID's event channel, a datagram socket's its UDP socket, as in
//! rdma-core), so rpoll can tell rsockets from the program's descriptors.

mod config;
mod ctx;
mod data;
mod dgram;
mod iomap;
mod keepalive;
mod opts;
mod poll;
mod stream;

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, RwLock};

use crate::{guarded, set_errno, Errno};

/// One rsocket (each lives in an Arc: the variants' sizes do not matter).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Sock {
    Stream(stream::Stream),
    Dgram(dgram::Dgram),
}

static TABLE: RwLock<BTreeMap<c_int, Arc<Sock>>> = RwLock::new(BTreeMap::new());

fn lookup(fd: c_int) -> Option<Arc<Sock>> {
    TABLE.read().unwrap_or_else(|e| e.into_inner()).get(&fd).cloned()
}

fn sock(fd: c_int) -> Result<Arc<Sock>, Errno> {
    lookup(fd).ok_or(Errno(libc::EBADF))
}

fn insert(fd: c_int, s: Arc<Sock>) {
    TABLE.write().unwrap_or_else(|e| e.into_inner()).insert(fd, s);
}

fn remove(fd: c_int) -> Option<Arc<Sock>> {
    TABLE.write().unwrap_or_else(|e| e.into_inner()).remove(&fd)
}

/// For the calls that return an int: the value, or -1 with errno.
fn int_call(f: impl FnOnce() -> Result<c_int, Errno>) -> c_int {
    crate::minus1_call(f)
}

/// For the calls that return ssize_t (or off_t, size_t): the value, or -1 with errno.
fn size_call(f: impl FnOnce() -> Result<isize, Errno>) -> isize {
    match guarded(f) {
        Ok(v) => v,
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}

fn stream_of(s: &Sock) -> Result<&stream::Stream, Errno> {
    match s {
        Sock::Stream(st) => Ok(st),
        Sock::Dgram(_) => Err(Errno(libc::EOPNOTSUPP)),
    }
}

/// An iovec list as slices the callee may read or fill.
pub(crate) struct Iov {
    pub(crate) parts: Vec<(*mut u8, usize)>,
}

impl Iov {
    fn one(p: *mut c_void, n: usize) -> Iov {
        Iov { parts: vec![(p as *mut u8, n)] }
    }

    fn of(iov: *const libc::iovec, cnt: c_int) -> Result<Iov, Errno> {
        if cnt < 0 || (cnt > 0 && iov.is_null()) || cnt > libc::UIO_MAXIOV {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: readv(2)/writev(2): `iov` points to `cnt` iovecs.
        let v = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
        Ok(Iov { parts: v.iter().map(|e| (e.iov_base as *mut u8, e.iov_len)).collect() })
    }

    pub(crate) fn len(&self) -> usize {
        self.parts.iter().map(|p| p.1).sum()
    }
}

/// A cursor over an [`Iov`]: copies out of it (sends) or into it (receives) in order.
pub(crate) struct Cursor<'a> {
    iov: &'a Iov,
    part: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(iov: &'a Iov) -> Self {
        Cursor { iov, part: 0, off: 0 }
    }

    /// Copies the next `n` bytes of the iovecs to `dst`.
    pub(crate) fn read_to(&mut self, mut dst: *mut u8, mut n: usize) {
        while n > 0 && self.part < self.iov.parts.len() {
            let (p, len) = self.iov.parts[self.part];
            let k = (len - self.off).min(n);
            // SAFETY: the caller's buffer (send(2): `len` readable bytes) and a staging area of
            // at least `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(p.add(self.off), dst, k) };
            dst = dst.wrapping_add(k);
            n -= k;
            self.off += k;
            if self.off == len {
                self.part += 1;
                self.off = 0;
            }
        }
    }

    /// Copies `n` bytes from `src` into the next bytes of the iovecs.
    pub(crate) fn write_from(&mut self, mut src: *const u8, mut n: usize) {
        while n > 0 && self.part < self.iov.parts.len() {
            let (p, len) = self.iov.parts[self.part];
            let k = (len - self.off).min(n);
            // SAFETY: the caller's buffer (recv(2): `len` writable bytes) and received data of at
            // least `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src, p.add(self.off), k) };
            src = src.wrapping_add(k);
            n -= k;
            self.off += k;
            if self.off == len {
                self.part += 1;
                self.off = 0;
            }
        }
    }
}

// ---- the exported calls (rdma/rsocket.h) ----

#[no_mangle]
pub unsafe extern "C" fn rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    int_call(|| {
        let base = kind & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            // rdma-core also takes AF_IB; softrdma's rdma_cm speaks IP addresses only.
            return Err(Errno(if domain == libc::AF_IB { libc::EAFNOSUPPORT } else { libc::ENOTSUP }));
        }
        let fs = if kind & libc::SOCK_NONBLOCK != 0 { libc::O_NONBLOCK } else { 0 };
        let fdf = if kind & libc::SOCK_CLOEXEC != 0 { libc::FD_CLOEXEC } else { 0 };
        let (fd, s) = match base {
            libc::SOCK_STREAM if protocol == 0 || protocol == libc::IPPROTO_TCP => {
                let s = stream::Stream::new(domain, fs, fdf)?;
                (s.fd, Sock::Stream(s))
            }
            libc::SOCK_DGRAM if protocol == 0 || protocol == libc::IPPROTO_UDP => {
                let s = dgram::Dgram::new(domain, fs, fdf)?;
                (s.fd(), Sock::Dgram(s))
            }
            _ => return Err(Errno(libc::ENOTSUP)),
        };
        insert(fd, Arc::new(s));
        Ok(fd)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        let a = opts::sockaddr_in(addr, len)?;
        match &*s {
            Sock::Stream(st) => st.bind(&a),
            Sock::Dgram(d) => d.bind(&a, len),
        }?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        stream_of(&s)?;
        stream::Stream::listen(&s, backlog)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn raccept(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        let n = stream_of(&s).map_err(|_| Errno(libc::EOPNOTSUPP))?.accept()?;
        let fd = match &*n {
            Sock::Stream(st) => st.num(),
            Sock::Dgram(_) => return Err(Errno(libc::EIO)),
        };
        insert(fd, n.clone());
        if !addr.is_null() && !len.is_null() {
            // SAFETY: accept(2): `addr` has room for `*len` bytes.
            unsafe { rgetpeername(fd, addr, len) };
        }
        Ok(fd)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rconnect(socket: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        let a = opts::sockaddr_in(addr, len)?;
        match &*s {
            Sock::Stream(_) => stream::Stream::connect(&s, &a)?,
            Sock::Dgram(d) => d.connect(&a, len)?,
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
            return Err(Errno(libc::EINVAL));
        }
        match &*s {
            Sock::Stream(st) => st.shutdown(how)?,
            Sock::Dgram(d) => d.shutdown(),
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rclose(socket: c_int) -> c_int {
    int_call(|| {
        let s = remove(socket).ok_or(Errno(libc::EBADF))?;
        match &*s {
            Sock::Stream(st) => st.close(),
            Sock::Dgram(d) => d.close(),
        }
        Ok(0)
    })
}

fn recv_iov(
    socket: c_int,
    iov: &Iov,
    flags: c_int,
    from: Option<(*mut libc::sockaddr, *mut libc::socklen_t)>,
) -> Result<isize, Errno> {
    let r = recv_iov_inner(socket, iov, flags, from);
    if poll::trace() {
        eprintln!("softrdma rrecv({socket}, {}, {flags:#x}) = {r:?}", iov.len());
    }
    r
}

fn recv_iov_inner(
    socket: c_int,
    iov: &Iov,
    flags: c_int,
    from: Option<(*mut libc::sockaddr, *mut libc::socklen_t)>,
) -> Result<isize, Errno> {
    let s = sock(socket)?;
    match &*s {
        Sock::Stream(st) => {
            let n = st.recv(iov, flags)?;
            if let Some((a, l)) = from {
                if n > 0 && !a.is_null() && !l.is_null() {
                    st.peer_name(a, l)?;
                }
            }
            Ok(n as isize)
        }
        Sock::Dgram(d) => Ok(d.recv(iov, flags, from)? as isize),
    }
}

fn send_iov(
    socket: c_int,
    iov: &Iov,
    flags: c_int,
    to: Option<(*const libc::sockaddr, libc::socklen_t)>,
) -> Result<isize, Errno> {
    let r = send_iov_inner(socket, iov, flags, to);
    if poll::trace() {
        eprintln!("softrdma rsend({socket}, {}, {flags:#x}) = {r:?}", iov.len());
    }
    r
}

fn send_iov_inner(
    socket: c_int,
    iov: &Iov,
    flags: c_int,
    to: Option<(*const libc::sockaddr, libc::socklen_t)>,
) -> Result<isize, Errno> {
    let s = sock(socket)?;
    match &*s {
        Sock::Stream(st) => {
            if let Some((a, l)) = to {
                if !a.is_null() || l != 0 {
                    return Err(Errno(libc::EISCONN));
                }
            }
            Ok(st.send(iov, flags)? as isize)
        }
        Sock::Dgram(d) => Ok(d.send(iov, flags, to)? as isize),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    size_call(|| recv_iov(socket, &Iov::one(buf, len), flags, None))
}

#[no_mangle]
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    srclen: *mut libc::socklen_t,
) -> isize {
    size_call(|| recv_iov(socket, &Iov::one(buf, len), flags, Some((src, srclen))))
}

#[no_mangle]
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    size_call(|| {
        let m = crate::nonnull(msg)?;
        if !m.msg_control.is_null() && m.msg_controllen != 0 {
            // As rdma-core: no ancillary data over rsockets.
            return Err(Errno(libc::ENOTSUP));
        }
        let iov = Iov::of(m.msg_iov, m.msg_iovlen as c_int)?;
        let name = if m.msg_name.is_null() {
            None
        } else {
            Some((m.msg_name as *mut libc::sockaddr, &mut m.msg_namelen as *mut _))
        };
        m.msg_flags = 0;
        recv_iov(socket, &iov, flags, name)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize {
    size_call(|| recv_iov(socket, &Iov::one(buf, count), 0, None))
}

#[no_mangle]
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    size_call(|| recv_iov(socket, &Iov::of(iov, cnt)?, 0, None))
}

#[no_mangle]
pub unsafe extern "C" fn rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    size_call(|| send_iov(socket, &Iov::one(buf as *mut c_void, len), flags, None))
}

#[no_mangle]
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const libc::sockaddr,
    dstlen: libc::socklen_t,
) -> isize {
    size_call(|| send_iov(socket, &Iov::one(buf as *mut c_void, len), flags, Some((dst, dstlen))))
}

#[no_mangle]
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    size_call(|| {
        // SAFETY: sendmsg(2): `msg` is NULL or a message header.
        let m = unsafe { msg.as_ref() }.ok_or(Errno(libc::EINVAL))?;
        if !m.msg_control.is_null() && m.msg_controllen != 0 {
            return Err(Errno(libc::ENOTSUP));
        }
        let iov = Iov::of(m.msg_iov, m.msg_iovlen as c_int)?;
        let to = if m.msg_name.is_null() { None } else { Some((m.msg_name as *const libc::sockaddr, m.msg_namelen)) };
        send_iov(socket, &iov, flags, to)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize {
    size_call(|| send_iov(socket, &Iov::one(buf as *mut c_void, count), 0, None))
}

#[no_mangle]
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    size_call(|| send_iov(socket, &Iov::of(iov, cnt)?, 0, None))
}

#[no_mangle]
pub unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    int_call(|| {
        if nfds > 0 && fds.is_null() {
            return Err(Errno(libc::EFAULT));
        }
        let v = if nfds == 0 {
            &mut [][..]
        } else {
            // SAFETY: poll(2): `fds` holds `nfds` entries.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        poll::rpoll(v, timeout)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: select(2)'s arguments, each NULL or valid.
    int_call(|| unsafe { poll::rselect(nfds, readfds, writefds, exceptfds, timeout) })
}

#[no_mangle]
pub unsafe extern "C" fn rgetpeername(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        match &*s {
            Sock::Stream(st) => st.peer_name(addr, len)?,
            Sock::Dgram(d) => d.peer_name(addr, len)?,
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rgetsockname(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        match &*s {
            Sock::Stream(st) => st.sock_name(addr, len)?,
            Sock::Dgram(d) => d.sock_name(addr, len)?,
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        opts::set(&s, level, name, val, len)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        opts::get(&s, level, name, val, len)?;
        Ok(0)
    })
}

/// `int rfcntl(int socket, int cmd, ... /* arg */)`. Stable Rust cannot define a variadic
/// function; on the ABIs softrdma builds for (x86-64 and AArch64 SysV), a variadic int argument
/// arrives where a third fixed integer argument would, so it is read as one.
#[no_mangle]
pub unsafe extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: std::ffi::c_long) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        opts::fcntl(&s, cmd, arg as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn riomap(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    size_call(|| {
        let s = sock(socket)?;
        Ok(stream_of(&s)?.iomap(buf, len, prot, flags, offset)? as isize)
    }) as libc::off_t
}

#[no_mangle]
pub unsafe extern "C" fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int {
    int_call(|| {
        let s = sock(socket)?;
        stream_of(&s)?.iounmap(buf, len)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn riowrite(
    socket: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> usize {
    size_call(|| {
        let s = sock(socket)?;
        Ok(stream_of(&s)?.iowrite(buf, count, offset, flags)? as isize)
    }) as usize
}
