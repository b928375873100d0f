//! Kernel sockets made with the socket system call itself, not the C library's `socket()`.
//!
//! The transport also runs inside application processes (the provider data path), where
//! `socket()` may be another library's: rdma-core's librspreload, preloaded in front of a socket
//! program, turns every `socket()` into an rsocket, and rsockets are built on this device. A
//! device's own UDP socket made through the preload would be an rsocket (a datagram rsocket on
//! the very device that is opening), and the device would hang on its first packet. Every other
//! call on such a socket reaches the kernel as it is: the preload passes through each descriptor
//! it did not make.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A new kernel socket (`socket(2)` with SOCK_CLOEXEC).
pub fn socket(domain: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: the socket system call with plain integers; the descriptor is ours.
    let fd = unsafe { libc::syscall(libc::SYS_socket, domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// A UDP socket of `addr`'s family (IPv4 or IPv6), not bound, as socket2's `Socket`.
pub fn udp_socket(addr: &std::net::SocketAddr) -> io::Result<socket2::Socket> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    Ok(socket2::Socket::from(socket(domain, libc::SOCK_DGRAM, libc::IPPROTO_UDP)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_udp_socket_is_a_close_on_exec_kernel_socket_of_the_family() {
        let s = udp_socket(&"127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(s.r#type().unwrap(), socket2::Type::DGRAM);
        // SAFETY: fcntl(F_GETFD) on our descriptor.
        let fl = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(fl & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        s.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        assert!(s.local_addr().unwrap().as_socket().unwrap().is_ipv4());
        // A machine without IPv6 refuses the family; one with it gives an IPv6 socket.
        if let Ok(s6) = udp_socket(&"[::1]:0".parse().unwrap()) {
            if s6.bind(&"[::1]:0".parse::<std::net::SocketAddr>().unwrap().into()).is_ok() {
                assert!(s6.local_addr().unwrap().as_socket().unwrap().is_ipv6());
            }
        }
        assert!(socket(-1, libc::SOCK_DGRAM, 0).is_err());
    }
}
