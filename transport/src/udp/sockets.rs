//! Socket set-up (options every socket of a device has, the source-port pool) and the send
//! system calls, with how their errors count.

use std::io::{self, IoSlice};
use std::mem;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{self as nsock, sockopt, ControlMessage, MsgFlags, SockaddrStorage};
use socket2::{SockAddr, Socket};

use super::{BindProblem, Sent, UdpError, SOCKET_BUFFER_BYTES, SPORT_RANGE_START};

/// One send syscall without control messages.
pub(super) fn send_one(socket: &Socket, to: &SocketAddr, payload: &[u8]) -> io::Result<Sent> {
    let to = SockAddr::from(*to);
    loop {
        match socket.send_to(payload, &to) {
            Ok(_) => return Ok(Sent::Ok),
            Err(e) => match classify_send_error(e)? {
                Some(outcome) => return Ok(outcome),
                None => continue,
            },
        }
    }
}

/// One `sendmsg` with a `UDP_SEGMENT` control message.
pub(super) fn send_gso(socket: &Socket, to: SocketAddr, buf: &[u8], segment_size: usize) -> io::Result<Sent> {
    let to = SockaddrStorage::from(to);
    // The callers checked segment_size <= MAX_GSO_BYTES < 65536.
    let size = segment_size as u16;
    let iov = [IoSlice::new(buf)];
    let cmsgs = [ControlMessage::UdpGsoSegments(&size)];
    loop {
        match nsock::sendmsg(socket.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, Some(&to)) {
            Ok(_) => return Ok(Sent::Ok),
            Err(errno) => match classify_send_error(io::Error::from(errno))? {
                Some(outcome) => return Ok(outcome),
                None => continue,
            },
        }
    }
}

/// One datagram or GSO send of [`send_gso_many`]: its destination, its bytes, and the
/// segment size when it is more than one segment.
pub(super) struct Outgoing<'a> {
    pub(super) to: SockAddr,
    pub(super) buf: &'a [u8],
    pub(super) segment_size: Option<u16>,
}

/// The most messages one [`send_gso_many`] call takes.
pub(super) const SEND_MANY_MAX: usize = 16;

/// One `sendmmsg` of up to [`SEND_MANY_MAX`] messages, each with its own `UDP_SEGMENT` control
/// message when it has a segment size: how many the kernel took, in order (the ones after stay
/// unsent). An error is the first message's (the kernel reports a later message's error by
/// taking the ones before it; the caller's next call then starts at that message).
pub(super) fn send_gso_many(socket: &Socket, msgs: &[Outgoing<'_>]) -> io::Result<usize> {
    let msgs = &msgs[..msgs.len().min(SEND_MANY_MAX)];
    let space = unsafe { libc::CMSG_SPACE(mem::size_of::<u16>() as u32) } as usize;
    // u64s: the control buffers must be aligned for `cmsghdr`.
    let mut control = [0u64; SEND_MANY_MAX * 4];
    debug_assert!(space <= 4 * mem::size_of::<u64>());
    let mut iovs: [libc::iovec; SEND_MANY_MAX] =
        [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; SEND_MANY_MAX];
    // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value for every field.
    let mut hdrs: [libc::mmsghdr; SEND_MANY_MAX] = unsafe { mem::zeroed() };
    for (i, m) in msgs.iter().enumerate() {
        iovs[i] = libc::iovec { iov_base: m.buf.as_ptr() as *mut libc::c_void, iov_len: m.buf.len() };
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = m.to.as_ptr() as *mut libc::c_void;
        h.msg_namelen = m.to.len();
        h.msg_iov = &mut iovs[i];
        h.msg_iovlen = 1;
        if let Some(size) = m.segment_size {
            let ctl = control[i * 4..].as_mut_ptr() as *mut libc::c_void;
            h.msg_control = ctl;
            h.msg_controllen = space as _;
            // SAFETY: `ctl` points at `space` bytes of this message's part of `control`
            // (4 u64s each, at least CMSG_SPACE(2)), aligned for cmsghdr; CMSG_FIRSTHDR of a
            // header whose control length covers one cmsghdr is that buffer.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(mem::size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, size);
            }
        }
    }
    loop {
        // SAFETY: `hdrs[..msgs.len()]` are valid msghdrs whose names, iovecs, payloads and
        // control buffers (`msgs`, `iovs`, `control`) outlive the call.
        let n = unsafe { libc::sendmmsg(socket.as_raw_fd(), hdrs.as_mut_ptr(), msgs.len() as u32, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// `Ok(Some(Dropped))` for a full queue, `Ok(None)` to retry (`EINTR`), `Err` for the rest.
fn classify_send_error(error: io::Error) -> io::Result<Option<Sent>> {
    match error.raw_os_error() {
        Some(libc::ENOBUFS | libc::EAGAIN) => Ok(Some(Sent::Dropped)),
        Some(libc::EINTR) => Ok(None),
        _ => Err(error),
    }
}

pub(crate) fn bind_error(local: SocketAddr, addr: IpAddr, error: io::Error) -> UdpError {
    let problem = BindProblem::of(&error);
    let holders = if problem == BindProblem::InUse { holders(local) } else { Vec::new() };
    UdpError::Bind { local, addr, problem, error, holders }
}

/// The processes of this user holding a UDP socket bound to `local`'s port on its address or on
/// the wildcard address (pid and command name, by pid): /proc/net/udp and udp6 give the sockets'
/// inodes, /proc/PID/fd which processes have them open (another user's cannot be read, and are
/// left out). For the message of a bind that found the address taken: a program left running
/// from a device that stopped keeps its member of the device's port (docs/architecture.md D2), and
/// "address in use" alone did not say who.
pub(crate) fn holders(local: SocketAddr) -> Vec<(u32, String)> {
    let mut inodes = std::collections::HashSet::new();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(at), Some(inode)) = (f.get(1).and_then(|a| proc_addr(a)), f.get(9)) else { continue };
            let same = at.ip() == local.ip() || at.ip().is_unspecified() || mapped(at.ip()) == Some(local.ip());
            if at.port() == local.port() && same && *inode != "0" {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    let mut found = Vec::new();
    if inodes.is_empty() {
        return found;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else { return found };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        let holds = fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_str().is_some_and(|l| inodes.contains(l))));
        if holds {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_string()));
        }
    }
    found.sort();
    found
}

/// An address of /proc/net/udp{,6} ("0100007F:12B7": the address as the kernel's 32-bit words in
/// this host's byte order, then the port), or `None`.
fn proc_addr(field: &str) -> Option<SocketAddr> {
    let (a, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| a.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok()).map(u32::to_ne_bytes);
    let ip: IpAddr = match a.len() {
        8 => std::net::Ipv4Addr::from(word(0)?).into(),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            std::net::Ipv6Addr::from(b).into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The IPv4 address an IPv4-mapped IPv6 address stands for.
fn mapped(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
        IpAddr::V4(_) => None,
    }
}

pub(crate) fn setup_error(local: SocketAddr, what: &'static str, error: io::Error) -> UdpError {
    UdpError::Setup { local, what, error }
}

/// A nonblocking, close-on-exec UDP socket for `local`'s family with the options every socket
/// here has (V6ONLY, no fragmentation, a large send buffer). Not bound yet.
pub(crate) fn new_socket(local: SocketAddr) -> Result<Socket, UdpError> {
    let socket = crate::ksock::udp_socket(&local).map_err(|e| {
        let what = if e.raw_os_error() == Some(libc::EMFILE) {
            "creating a socket (too many open files: each source port of the pool is one socket)"
        } else {
            "creating a socket"
        };
        setup_error(local, what, e)
    })?;
    socket.set_nonblocking(true).map_err(|e| setup_error(local, "setting O_NONBLOCK", e))?;
    if local.is_ipv6() {
        socket.set_only_v6(true).map_err(|e| setup_error(local, "setting IPV6_V6ONLY", e))?;
        set_int_option(&socket, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)
            .map_err(|e| setup_error(local, "setting IPV6_MTU_DISCOVER", e))?;
        nsock::setsockopt(&socket, sockopt::Ipv6DontFrag, &true)
            .map_err(|e| setup_error(local, "setting IPV6_DONTFRAG", e.into()))?;
    } else {
        set_int_option(&socket, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
            .map_err(|e| setup_error(local, "setting IP_MTU_DISCOVER", e))?;
        if let IpAddr::V4(a) = local.ip() {
            if !a.is_unspecified() {
                // Multicast UD SENDs leave through the device's own interface with TTL 64, as
                // rxe's do (rxe_net.c); the host's other devices hear them through the kernel's
                // multicast loopback.
                let _ = socket.set_multicast_if_v4(&a);
                let _ = socket.set_multicast_ttl_v4(64);
            }
        }
    }
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    Ok(socket)
}

/// The receive socket's ancillary data: destination address, TTL, TOS.
pub(crate) fn configure_receive(socket: &Socket, local: SocketAddr) -> Result<(), UdpError> {
    let fail = |what: &'static str| move |e: nix::errno::Errno| setup_error(local, what, e.into());
    if local.is_ipv6() {
        nsock::setsockopt(socket, sockopt::Ipv6RecvPacketInfo, &true).map_err(fail("setting IPV6_RECVPKTINFO"))?;
        nsock::setsockopt(socket, sockopt::Ipv6RecvHopLimit, &true).map_err(fail("setting IPV6_RECVHOPLIMIT"))?;
        nsock::setsockopt(socket, sockopt::Ipv6RecvTClass, &true).map_err(fail("setting IPV6_RECVTCLASS"))?;
    } else {
        nsock::setsockopt(socket, sockopt::Ipv4PacketInfo, &true).map_err(fail("setting IP_PKTINFO"))?;
        nsock::setsockopt(socket, sockopt::Ipv4RecvTtl, &true).map_err(fail("setting IP_RECVTTL"))?;
        nsock::setsockopt(socket, sockopt::IpRecvTos, &true).map_err(fail("setting IP_RECVTOS"))?;
    }
    Ok(())
}

/// `setsockopt` of an int option that neither socket2 nor nix offers (`IP_MTU_DISCOVER`).
pub(super) fn set_int_option(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live c_int, for the whole call; the fd
    // is owned by `socket`.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The bases tried for a pool of `count` ports: `base` itself, then the following blocks up to
/// 65535 (only those inside `0xC000..`), then the blocks from 0xC000 that end before `base`.
fn pool_bases(base: u16, count: u16) -> impl Iterator<Item = u16> {
    let (base, count) = (u32::from(base), u32::from(count));
    let start = u32::from(SPORT_RANGE_START);
    let fits = move |b: &u32| b + count <= 0x1_0000;
    let forward = (1..).map(move |k| base + k * count).take_while(fits).filter(move |b| *b >= start);
    let wrapped = (0..).map(move |k| start + k * count).take_while(move |b| b + count <= base);
    std::iter::once(base).chain(forward).chain(wrapped).map(|b| b as u16)
}

/// Binds `count` send sockets to consecutive ports, trying the bases of [`pool_bases`] until one
/// block is entirely free.
pub(super) fn bind_pool(addr: IpAddr, base: u16, count: u16) -> Result<(u16, Vec<Socket>), UdpError> {
    'blocks: for block in pool_bases(base, count) {
        let mut pool = Vec::with_capacity(usize::from(count));
        for i in 0..count {
            let local = SocketAddr::new(addr, block + i);
            let socket = new_socket(local)?;
            match socket.bind(&SockAddr::from(local)) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => continue 'blocks,
                Err(e) => return Err(bind_error(local, addr, e)),
            }
            // Pool sockets only send; a small receive buffer bounds what strays sent to them can
            // hold (the kernel rounds 0 up to its minimum).
            let _ = socket.set_recv_buffer_size(0);
            pool.push(socket);
        }
        return Ok((block, pool));
    }
    Err(UdpError::NoSourcePorts { addr, count, first: base })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_bases_stay_in_range() {
        let bases: Vec<u16> = pool_bases(0xC000, 0x1000).collect();
        assert_eq!(bases, [0xC000, 0xD000, 0xE000, 0xF000]);
        // From the middle: forward while blocks fit, then wrap to 0xC000 without reaching the start.
        let bases: Vec<u16> = pool_bases(0xE010, 0x1000).collect();
        // (0xF010 + 0x1000 would pass 65535.)
        assert_eq!(bases, [0xE010, 0xC000, 0xD000]);
        // A base below the range is tried first, and only blocks inside the range follow.
        let bases: Vec<u16> = pool_bases(0xBFF0, 0x2000).collect();
        assert_eq!(bases, [0xBFF0, 0xDFF0]);
        // Single ports: every port of the range, each once.
        let bases: Vec<u16> = pool_bases(0xFFFF, 1).collect();
        assert_eq!((bases.len(), bases[0], bases[1], bases[0x3FFF]), (0x4000, 0xFFFF, 0xC000, 0xFFFE));
        assert_eq!(pool_bases(0xC000, 1).count(), 0x4000);
    }

    #[test]
    fn send_errors() {
        let err = |n| classify_send_error(io::Error::from_raw_os_error(n));
        assert!(matches!(err(libc::ENOBUFS), Ok(Some(Sent::Dropped))));
        assert!(matches!(err(libc::EAGAIN), Ok(Some(Sent::Dropped))));
        assert!(matches!(err(libc::EINTR), Ok(None)));
        assert_eq!(err(libc::EMSGSIZE).err().and_then(|e| e.raw_os_error()), Some(libc::EMSGSIZE));
    }

    #[test]
    fn bind_messages() {
        // Port 9 (discard): no process here holds it, so the message names none.
        let local: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let e = bind_error(local, local.ip(), io::Error::from_raw_os_error(libc::EADDRINUSE));
        assert_eq!(
            e.to_string(),
            "cannot bind UDP 127.0.0.1:9 (--addr 127.0.0.1): address already in use (another device, maybe \
             another user's, owns it)"
        );
        let local: SocketAddr = "[2001:db8::1]:4791".parse().unwrap();
        let e = bind_error(local, local.ip(), io::Error::from_raw_os_error(libc::EADDRNOTAVAIL));
        assert_eq!(
            e.to_string(),
            "cannot bind UDP [2001:db8::1]:4791 (--addr 2001:db8::1): address not available (it is not an address \
             of this host)"
        );
    }

    #[test]
    fn a_taken_address_names_the_processes_of_this_user_that_hold_it() {
        let me = std::process::id();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let local = s.local_addr().unwrap();
        let e = bind_error(local, local.ip(), io::Error::from_raw_os_error(libc::EADDRINUSE));
        let t = e.to_string();
        assert!(t.contains(&format!("held by pid {me} (")) && t.contains("end it, or use another --addr"), "{t}");
        // A socket on the wildcard address holds the port on every address.
        let any = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let on = SocketAddr::new("127.0.0.9".parse().unwrap(), any.local_addr().unwrap().port());
        assert!(holders(on).iter().any(|h| h.0 == me), "{:?}", holders(on));
        // Gone with the socket.
        drop((s, any));
        assert!(!holders(local).iter().any(|h| h.0 == me), "{:?}", holders(local));
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn proc_net_udp_addresses_parse() {
        assert_eq!(proc_addr("0100007F:12B7"), Some("127.0.0.1:4791".parse().unwrap()));
        assert_eq!(proc_addr("00000000:0009"), Some("0.0.0.0:9".parse().unwrap()));
        assert_eq!(
            proc_addr("0000000000000000FFFF00001F00007F:12B7"),
            Some("[::ffff:127.0.0.31]:4791".parse().unwrap())
        );
        assert_eq!(proc_addr("00000000000000000000000001000000:12B7"), Some("[::1]:4791".parse().unwrap()));
        assert_eq!(proc_addr("zz"), None);
        assert_eq!(proc_addr("0100007F:"), None);
        assert_eq!(proc_addr("0100007:12B7"), None);
    }
}
