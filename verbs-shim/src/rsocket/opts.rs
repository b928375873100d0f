//! Socket addresses, options (rsetsockopt/rgetsockopt) and rfcntl, as rdma-core's rsockets
//! take them: the sizes of the QP and buffers are set before connecting (SO_SNDBUF, SO_RCVBUF,
//! RDMA_SQSIZE, RDMA_RQSIZE, RDMA_INLINE, RDMA_IOMAPSIZE); TCP options a reliable connection has
//! no use for are accepted and remembered.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::config;
use super::stream::{min_sbuf, S_CONNECTED, S_OPENING};
use super::Sock;
use crate::cma::for_rsockets::rdma_set_option;
use crate::cma::lock;
use crate::cma_ffi as c;
use crate::Errno;

// rdma/rsocket.h
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;
const QP_MAX_SIZE: u32 = 0xFFFE;

/// A socket address the program gave (IPv4 or IPv6), kept at full size.
#[derive(Clone)]
pub(crate) struct Addr {
    pub(crate) ss: libc::sockaddr_storage,
    pub(crate) len: libc::socklen_t,
}

impl Addr {
    pub(crate) fn as_ptr(&self) -> *const libc::sockaddr {
        &self.ss as *const _ as *const libc::sockaddr
    }
}

/// Copies an IPv4/IPv6 address from the program (EINVAL when too short, EAFNOSUPPORT for
/// another family).
pub(crate) fn sockaddr_in(a: *const libc::sockaddr, len: libc::socklen_t) -> Result<Addr, Errno> {
    if a.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: at least the family is readable in any socket address of len >= 2.
    if (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: as above.
    let fam = unsafe { (*a).sa_family } as c_int;
    let need = match fam {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return Err(Errno(libc::EAFNOSUPPORT)),
    };
    if (len as usize) < need {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: a zeroed storage; `need` bytes of the program's address.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    unsafe { std::ptr::copy_nonoverlapping(a as *const u8, &mut ss as *mut _ as *mut u8, need) };
    Ok(Addr { ss, len: need as libc::socklen_t })
}

/// Copies `src` (a sockaddr_in or sockaddr_in6) out as getsockname(2) does: truncated to the
/// room given, the full length reported.
pub(crate) fn copy_addr(
    src: *const libc::sockaddr,
    dst: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> Result<(), Errno> {
    if dst.is_null() || len.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: `src` is a socket address of this library; `dst` has room for `*len` bytes.
    unsafe {
        let full = if (*src).sa_family as c_int == libc::AF_INET6 {
            std::mem::size_of::<libc::sockaddr_in6>()
        } else {
            std::mem::size_of::<libc::sockaddr_in>()
        };
        let n = (*len as usize).min(full);
        std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n);
        *len = full as libc::socklen_t;
    }
    Ok(())
}

fn int_arg(val: *const c_void, len: libc::socklen_t) -> Result<c_int, Errno> {
    if val.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    if (len as usize) < std::mem::size_of::<c_int>() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: an int the program passed (setsockopt(2)).
    Ok(unsafe { std::ptr::read_unaligned(val as *const c_int) })
}

fn put_int(val: *mut c_void, len: *mut libc::socklen_t, v: c_int) -> Result<(), Errno> {
    if val.is_null() || len.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: getsockopt(2): `val` has room for `*len` bytes.
    unsafe {
        if (*len as usize) < std::mem::size_of::<c_int>() {
            return Err(Errno(libc::EINVAL));
        }
        std::ptr::write_unaligned(val as *mut c_int, v);
        *len = std::mem::size_of::<c_int>() as libc::socklen_t;
    }
    Ok(())
}

fn flag(bits: &mut u64, name: c_int, on: bool) {
    if (0..64).contains(&name) {
        if on {
            *bits |= 1 << name;
        } else {
            *bits &= !(1 << name);
        }
    }
}

fn has(bits: u64, name: c_int) -> c_int {
    ((0..64).contains(&name) && bits & (1 << name) != 0) as c_int
}

pub(super) fn set(
    s: &Arc<Sock>,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> Result<(), Errno> {
    let st = match &**s {
        Sock::Stream(st) => st,
        Sock::Dgram(d) => return d.setsockopt(level, name, val, len),
    };
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
            let v = int_arg(val, len)?;
            // As rdma-core: the rdma_cm option where the device takes it.
            // SAFETY: our ID; the program's int.
            unsafe {
                rdma_set_option(
                    st.id,
                    c::RDMA_OPTION_ID as _,
                    c::RDMA_OPTION_ID_REUSEADDR as _,
                    val as *mut c_void,
                    len as usize,
                )
            };
            flag(&mut lock(&st.st).so_opts, name, v != 0);
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            let v = int_arg(val, len)?;
            let mut g = lock(&st.st);
            if g.rbuf.is_none() {
                g.rbuf_size = (v.max(0) as u32).saturating_mul(2);
            }
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            let v = int_arg(val, len)?;
            let mut g = lock(&st.st);
            if g.sbuf.is_none() {
                g.sbuf_size = min_sbuf((v.max(0) as u32).saturating_mul(2));
            }
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            if (len as usize) < std::mem::size_of::<libc::linger>() || val.is_null() {
                return Err(Errno(libc::EINVAL));
            }
            // SAFETY: a struct linger the program passed.
            let l = unsafe { std::ptr::read_unaligned(val as *const libc::linger) };
            // Kept inverted, as rdma-core keeps it (on unless set off).
            flag(&mut lock(&st.st).so_opts, name, l.l_onoff == 0);
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
            let on = int_arg(val, len)? != 0;
            let secs = {
                let mut g = lock(&st.st);
                g.keepalive = on;
                flag(&mut g.so_opts, name, on);
                if g.keepalive_time == 0 {
                    g.keepalive_time = super::keepalive::system_time();
                }
                g.keepalive_time
            };
            if on {
                super::keepalive::watch(st.fd, s, secs);
            } else {
                super::keepalive::forget(st.fd);
            }
        }
        (libc::SOL_SOCKET, libc::SO_OOBINLINE) => {
            let v = int_arg(val, len)?;
            flag(&mut lock(&st.st).so_opts, name, v != 0);
        }
        (libc::IPPROTO_IP, libc::IP_TOS) => {
            let v = int_arg(val, len)?;
            lock(&st.st).ip_tos = v;
            // SAFETY: our ID; the program's int.
            if unsafe {
                rdma_set_option(
                    st.id,
                    c::RDMA_OPTION_ID as _,
                    c::RDMA_OPTION_ID_TOS as _,
                    val as *mut c_void,
                    len as usize,
                )
            } != 0
            {
                return Err(Errno(crate::last_errno()));
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG | libc::TCP_CONGESTION) => {}
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            let v = int_arg(val, len)?;
            if v <= 0 {
                return Err(Errno(libc::EINVAL));
            }
            let on = {
                let mut g = lock(&st.st);
                g.keepalive_time = v as u32;
                g.keepalive
            };
            if on {
                super::keepalive::watch(st.fd, s, v as u32);
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
            let v = int_arg(val, len)?;
            flag(&mut lock(&st.st).tcp_opts, name, v != 0);
        }
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
            let v = int_arg(val, len)?;
            // SAFETY: our ID; the program's int.
            unsafe {
                rdma_set_option(
                    st.id,
                    c::RDMA_OPTION_ID as _,
                    c::RDMA_OPTION_ID_AFONLY as _,
                    val as *mut c_void,
                    len as usize,
                )
            };
            flag(&mut lock(&st.st).ipv6_opts, name, v != 0);
        }
        (SOL_RDMA, _) => {
            let mut g = lock(&st.st);
            if g.state >= S_OPENING {
                return Err(Errno(libc::EINVAL));
            }
            match name {
                RDMA_ROUTE => {
                    if val.is_null() || len == 0 {
                        return Err(Errno(libc::EINVAL));
                    }
                    // SAFETY: `len` bytes of path records the program passed.
                    let v = unsafe { std::slice::from_raw_parts(val as *const u8, len as usize) };
                    g.route = Some(v.to_vec());
                }
                _ => {
                    let v = int_arg(val, len)?.max(0) as u32;
                    match name {
                        RDMA_SQSIZE => g.sq_size = v.min(QP_MAX_SIZE) as u16,
                        RDMA_RQSIZE => g.rq_size = v.min(QP_MAX_SIZE) as u16,
                        RDMA_INLINE => g.sq_inline = v.min(QP_MAX_SIZE) as u16,
                        RDMA_IOMAPSIZE => g.target_iomap_size = config::round_iomap(v),
                        _ => return Err(Errno(libc::ENOTSUP)),
                    }
                }
            }
        }
        _ => return Err(Errno(libc::ENOTSUP)),
    }
    Ok(())
}

pub(super) fn get(
    s: &Arc<Sock>,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> Result<(), Errno> {
    let st = match &**s {
        Sock::Stream(st) => st,
        Sock::Dgram(d) => return d.getsockopt(level, name, val, len),
    };
    let mut g = lock(&st.st);
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            put_int(val, len, has(g.so_opts, name))
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => put_int(val, len, g.rbuf_size as c_int),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => put_int(val, len, g.sbuf_size as c_int),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            if val.is_null() || len.is_null() {
                return Err(Errno(libc::EFAULT));
            }
            // SAFETY: getsockopt(2): room for `*len` bytes.
            unsafe {
                if (*len as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(Errno(libc::EINVAL));
                }
                let l = libc::linger { l_onoff: (has(g.so_opts, name) == 0) as c_int, l_linger: 0 };
                std::ptr::write_unaligned(val as *mut libc::linger, l);
                *len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
            }
            Ok(())
        }
        (libc::SOL_SOCKET, libc::SO_ERROR) => {
            let e = std::mem::take(&mut g.err);
            put_int(val, len, e)
        }
        (libc::SOL_SOCKET, libc::SO_TYPE) => put_int(val, len, libc::SOCK_STREAM),
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => put_int(val, len, st.domain),
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => put_int(val, len, libc::IPPROTO_TCP),
        (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => put_int(val, len, (g.state == super::stream::S_LISTENING) as c_int),
        (libc::IPPROTO_IP, libc::IP_TOS) => put_int(val, len, g.ip_tos),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => put_int(val, len, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => put_int(val, len, g.keepalive_time as c_int),
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => put_int(val, len, has(g.tcp_opts, name)),
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {
            // SAFETY: our ID's route.
            let mtu = unsafe {
                let r = &(*st.id).route;
                if r.num_paths > 0 && !r.path_rec.is_null() {
                    1 << (7 + (*r.path_rec).mtu as u32)
                } else {
                    2048
                }
            };
            put_int(val, len, mtu)
        }
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            if val.is_null() || len.is_null() {
                return Err(Errno(libc::EFAULT));
            }
            // As rdma-core: the state and the send window; the rest zero.
            // SAFETY: zeroed tcp_info, copied to room for `*len` bytes.
            unsafe {
                let mut info: libc::tcp_info = std::mem::zeroed();
                // TCP_ESTABLISHED (1) or TCP_CLOSE (7), netinet/tcp.h.
                info.tcpi_state = if g.state & S_CONNECTED != 0 { 1 } else { 7 };
                info.tcpi_snd_cwnd = g.sq_size as u32;
                let n = (*len as usize).min(std::mem::size_of::<libc::tcp_info>());
                std::ptr::copy_nonoverlapping(&info as *const _ as *const u8, val as *mut u8, n);
                *len = n as libc::socklen_t;
            }
            Ok(())
        }
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => put_int(val, len, has(g.ipv6_opts, name)),
        (SOL_RDMA, RDMA_SQSIZE) => put_int(val, len, g.sq_size as c_int),
        (SOL_RDMA, RDMA_RQSIZE) => put_int(val, len, g.rq_size as c_int),
        (SOL_RDMA, RDMA_INLINE) => put_int(val, len, g.sq_inline as c_int),
        (SOL_RDMA, RDMA_IOMAPSIZE) => put_int(val, len, g.target_iomap_size as c_int),
        (SOL_RDMA, RDMA_ROUTE) => {
            let Some(r) = g.route.as_ref() else {
                // The route resolved through rdma_cm is not given back as ibv_path_data.
                return Err(Errno(libc::ENOTSUP));
            };
            if val.is_null() || len.is_null() {
                return Err(Errno(libc::EFAULT));
            }
            // SAFETY: getsockopt(2): room for `*len` bytes.
            unsafe {
                if (*len as usize) < r.len() {
                    return Err(Errno(libc::EINVAL));
                }
                std::ptr::copy_nonoverlapping(r.as_ptr(), val as *mut u8, r.len());
                *len = r.len() as libc::socklen_t;
            }
            Ok(())
        }
        _ => Err(Errno(libc::ENOTSUP)),
    }
}

pub(super) fn fcntl(s: &Arc<Sock>, cmd: c_int, arg: c_int) -> Result<c_int, Errno> {
    let (fs, fd) = match &**s {
        Sock::Stream(st) => (&st.fs_flags, &st.fd_flags),
        Sock::Dgram(d) => (&d.fs_flags, &d.fd_flags),
    };
    match cmd {
        libc::F_GETFL => Ok(fs.load(Ordering::Relaxed) | libc::O_RDWR),
        libc::F_SETFL => {
            fs.store(arg & !libc::O_ACCMODE, Ordering::Relaxed);
            Ok(0)
        }
        libc::F_GETFD => Ok(fd.load(Ordering::Relaxed)),
        libc::F_SETFD => {
            fd.store(arg, Ordering::Relaxed);
            Ok(0)
        }
        _ => Err(Errno(libc::ENOTSUP)),
    }
}
