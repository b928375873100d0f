//! The receive ring: buffers, source addresses and control space for one `recvmmsg`, and the
//! decoding of what the kernel wrote (source, destination, TTL, TOS, GRO segment size).

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

use super::{CMSG_SLOT, RECV_BATCH, RECV_SLOT};

/// What the kernel said about one received buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlotMeta {
    pub(super) len: usize,
    /// GRO segment size; `len` when the buffer holds one datagram.
    pub(super) stride: usize,
    pub(super) truncated: bool,
    pub(super) src: SocketAddr,
    pub(super) dst: Option<IpAddr>,
    pub(super) ttl: Option<u8>,
    pub(super) tos: Option<u8>,
}

impl Default for SlotMeta {
    fn default() -> SlotMeta {
        SlotMeta {
            len: 0,
            stride: 0,
            truncated: false,
            src: SocketAddr::from(([0, 0, 0, 0], 0)),
            dst: None,
            ttl: None,
            tos: None,
        }
    }
}

/// Control-message space for one buffer, aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgSpace([u8; CMSG_SLOT]);

/// Receive buffers, addresses, control space and the `mmsghdr`s describing them for one
/// `recvmmsg`, allocated and built once: a call resets only the lengths and flags the kernel
/// wrote back in the last one. (Rebuilding all 32 headers per call, zeroed first, was 15% of an
/// empty poll: BENCHMARKS.md, "The empty poll".)
pub(super) struct RecvRing {
    pub(super) data: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    control: Vec<CmsgSpace>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// How many headers from the first the last call may have written back into.
    dirty: usize,
    pub(super) meta: [SlotMeta; RECV_BATCH],
}

// SAFETY: the raw pointers in `iov` and `hdrs` point only into this ring's own heap buffers
// (`data`, `names`, `control`, `iov`), allocated once in `new` and never resized, so they stay
// valid wherever the ring moves; they are used only through `&mut self` (`fill`).
unsafe impl Send for RecvRing {}

impl RecvRing {
    pub(super) fn new() -> RecvRing {
        let mut r = RecvRing {
            data: vec![0; RECV_BATCH * RECV_SLOT],
            // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid (AF_UNSPEC) value.
            names: vec![unsafe { mem::zeroed::<libc::sockaddr_storage>() }; RECV_BATCH],
            control: vec![CmsgSpace([0; CMSG_SLOT]); RECV_BATCH],
            iov: Vec::with_capacity(RECV_BATCH),
            hdrs: Vec::with_capacity(RECV_BATCH),
            dirty: RECV_BATCH,
            meta: [SlotMeta::default(); RECV_BATCH],
        };
        let data = r.data.as_mut_ptr();
        for i in 0..RECV_BATCH {
            // SAFETY: i < RECV_BATCH, and `data` holds RECV_BATCH slots of RECV_SLOT bytes.
            r.iov.push(libc::iovec { iov_base: unsafe { data.add(i * RECV_SLOT) }.cast(), iov_len: RECV_SLOT });
        }
        let (names, control, iov) = (r.names.as_mut_ptr(), r.control.as_mut_ptr(), r.iov.as_mut_ptr());
        for i in 0..RECV_BATCH {
            // SAFETY (zeroed): mmsghdr is a plain C struct; null pointers and zero lengths are
            // valid values, and every field the kernel reads is set here or in `fill`.
            let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
            // SAFETY: i < RECV_BATCH = the length of `names`, `control` and `iov`.
            unsafe {
                h.msg_hdr.msg_name = names.add(i).cast();
                h.msg_hdr.msg_iov = iov.add(i);
                h.msg_hdr.msg_control = control.add(i).cast();
            }
            h.msg_hdr.msg_iovlen = 1;
            r.hdrs.push(h);
        }
        r
    }

    /// One `recvmmsg` of up to `want` (<= RECV_BATCH) buffers; fills `meta[..n]`.
    pub(super) fn fill(&mut self, fd: RawFd, want: usize) -> io::Result<usize> {
        let want = want.min(RECV_BATCH);
        for h in &mut self.hdrs[..self.dirty.clamp(1, RECV_BATCH)] {
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = CMSG_SLOT as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        let hdrs = self.hdrs.as_mut_ptr();
        // SAFETY: the first `want` headers point at buffers, names and control space owned by
        // `self` (borrowed mutably for this call) with the lengths given; the kernel writes only
        // within them. A null timeout is allowed.
        // The system call itself, not libc's wrapper: that one makes every call a cancellation
        // point (two calls into the thread library around it, ~6% of an empty poll), which
        // neither ibv_poll_cq nor the progress thread is (BENCHMARKS.md, "The empty poll").
        let n = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                fd,
                hdrs,
                want as libc::c_uint,
                0 as libc::c_int,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        // The kernel wrote back into the headers of what it received (and perhaps the next).
        self.dirty = n + 1;
        for (i, h) in self.hdrs.iter().enumerate().take(n) {
            let len = h.msg_len as usize;
            // SAFETY: the kernel filled `names[i]` (msg_namelen bytes) and the control messages
            // within `msg_controllen` bytes of `control[i]`, which `h.msg_hdr` still describes.
            self.meta[i] = unsafe { parse_message(&h.msg_hdr, &self.names[i], len) };
        }
        Ok(n)
    }
}

/// Decodes one received message's source address and control messages.
///
/// # Safety
/// `hdr` must describe a message `recvmsg`/`recvmmsg` just filled: `msg_control` pointing at
/// `msg_controllen` valid bytes of control messages, and `name` the source address it wrote.
unsafe fn parse_message(hdr: &libc::msghdr, name: &libc::sockaddr_storage, len: usize) -> SlotMeta {
    let mut meta =
        SlotMeta { len, stride: len, truncated: hdr.msg_flags & libc::MSG_TRUNC != 0, ..SlotMeta::default() };
    meta.src = socket_addr(name, hdr.msg_namelen).unwrap_or(meta.src);
    // SAFETY (whole loop): the caller guarantees the control buffer; CMSG_FIRSTHDR/CMSG_NXTHDR
    // only return headers that lie within msg_controllen, and each read below checks the
    // message's length first and reads unaligned.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !c.is_null() {
        let (level, kind, cmsg_len) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize) };
        let data = unsafe { libc::CMSG_DATA(c) };
        // SAFETY: CMSG_LEN only computes a length.
        let data_len = cmsg_len.saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize);
        // SAFETY: read only when the message holds 4 data bytes, unaligned.
        let int = || (data_len >= 4).then(|| unsafe { data.cast::<libc::c_int>().read_unaligned() });
        match (level, kind) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if data_len >= mem::size_of::<libc::in_pktinfo>() => {
                // SAFETY: the message holds an in_pktinfo (length checked above), read unaligned.
                let info = unsafe { data.cast::<libc::in_pktinfo>().read_unaligned() };
                // ipi_addr is the header's destination address (ipi_spec_dst the local one).
                meta.dst = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr))));
            }
            (libc::IPPROTO_IP, libc::IP_TTL) => meta.ttl = int().map(|v| v as u8),
            // IP_TOS comes as one byte.
            // SAFETY: the message holds at least the one byte read.
            (libc::IPPROTO_IP, libc::IP_TOS) if data_len >= 1 => meta.tos = Some(unsafe { data.read() }),
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if data_len >= mem::size_of::<libc::in6_pktinfo>() => {
                // SAFETY: the message holds an in6_pktinfo (length checked above), read unaligned.
                let info = unsafe { data.cast::<libc::in6_pktinfo>().read_unaligned() };
                meta.dst = Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
            }
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => meta.ttl = int().map(|v| v as u8),
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => meta.tos = int().map(|v| v as u8),
            (libc::SOL_UDP, libc::UDP_GRO) => {
                if let Some(size) = int().filter(|&s| s > 0) {
                    meta.stride = size as usize;
                }
            }
            _ => {}
        }
        // SAFETY: `c` is a header of this control buffer; CMSG_NXTHDR stays within it (or gives null).
        c = unsafe { libc::CMSG_NXTHDR(hdr, c) };
    }
    meta
}

/// A kernel-written socket address as a std one.
fn socket_addr(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(name.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, which fits in it.
            let a = unsafe { (name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>().read_unaligned() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6, which fits in it.
            let a = unsafe { (name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}
