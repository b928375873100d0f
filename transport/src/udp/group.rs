//! IPv4 multicast group sockets.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use socket2::{SockAddr, Socket};

use super::sockets::set_int_option;

/// A member socket of one IPv4 multicast group: bound to the group's address and the RoCE port
/// (a socket bound to the device's unicast address never receives group datagrams), joined on
/// the device's interface (IP_ADD_MEMBERSHIP: the kernel sends the IGMP report and programs the
/// 01:00:5e filter), hearing only its own group (IP_MULTICAST_ALL off). Dropping it leaves the
/// group.
#[derive(Debug)]
pub struct GroupSocket {
    sock: Socket,
    group: Ipv4Addr,
}

impl GroupSocket {
    /// Joins `group` on the interface of `iface` (the device's address), receiving on `port`.
    pub fn join(group: Ipv4Addr, iface: Ipv4Addr, port: u16) -> io::Result<GroupSocket> {
        if !group.is_multicast() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let sock = crate::ksock::udp_socket(&SocketAddr::new(IpAddr::V4(group), port))?;
        sock.set_reuse_address(true)?;
        sock.set_nonblocking(true)?;
        sock.bind(&SockAddr::from(SocketAddr::new(IpAddr::V4(group), port)))?;
        sock.join_multicast_v4(&group, &iface)?;
        set_int_option(&sock, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0)?;
        Ok(GroupSocket { sock, group })
    }

    /// The group.
    pub fn group(&self) -> Ipv4Addr {
        self.group
    }

    /// One datagram (non-blocking: `WouldBlock` when none waits): its length and sender.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        // SAFETY: an initialized byte buffer viewed as MaybeUninit for socket2's recv_from.
        let b = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
        let (n, from) = self.sock.recv_from(b)?;
        let from = from.as_socket().ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?;
        Ok((n, from))
    }
}

impl AsRawFd for GroupSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for GroupSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}
