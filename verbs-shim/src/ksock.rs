//! The library's own kernel sockets, made with the socket system call itself rather than the C
//! library's `socket()`: a program run under rdma-core's librspreload has `socket()` replaced
//! by one that makes an rsocket, and an rsocket is built on this library. Its rdma_cm asks the
//! kernel which source address routes to a destination (a connected UDP socket); made through
//! the preload, that socket would be an rsocket whose connect resolves an address again, without
//! end (iperf3's client under librspreload overflowed its stack so). The other socket calls on
//! such a socket reach the kernel as they are: the preload passes through every descriptor it
//! did not make.

use std::net::{SocketAddr, UdpSocket};

/// A new kernel socket (`socket(2)`, close-on-exec): the transport's, which its own sockets use.
pub(crate) use softrdma_transport::ksock::socket;

/// `addr` as a C socket address and its length.
pub(crate) fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: zeroed storage, filled as the family's structure.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v) => {
            // SAFETY: the storage holds a sockaddr_in.
            let s = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v.port().to_be();
            s.sin_addr.s_addr = u32::from_ne_bytes(v.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v) => {
            // SAFETY: the storage holds a sockaddr_in6.
            let s = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v.port().to_be();
            s.sin6_flowinfo = v.flowinfo().to_be();
            s.sin6_addr.s6_addr = v.ip().octets();
            s.sin6_scope_id = v.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// A UDP socket bound to `addr` (std's UdpSocket::bind, without the C library's socket()).
pub(crate) fn udp_bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let fd = socket(domain, libc::SOCK_DGRAM, 0)?;
    let (ss, len) = sockaddr(&addr);
    // SAFETY: our socket and a socket address of `len` bytes.
    if unsafe { libc::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &ss as *const _ as *const libc::sockaddr, len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(UdpSocket::from(fd))
}
