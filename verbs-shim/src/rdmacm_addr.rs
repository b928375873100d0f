//! `rdma_getaddrinfo`, `rdma_freeaddrinfo` and `rdma_event_str`: the parts of librdmacm that
//! need no connection manager, done for real.
//!
//! `rdma_getaddrinfo` behaves as librdmacm 44 does on RoCE (`librdmacm/addrinfo.c`):
//! - the lookup is libc's `getaddrinfo`, with the hints translated (RAI_PASSIVE -> AI_PASSIVE,
//!   RAI_NUMERICHOST -> AI_NUMERICHOST, the QP type to a socket type, the port space to a
//!   protocol) or no hints at all when the caller gave none;
//! - only the first answer is kept: the result is one `rdma_addrinfo`, never a chain;
//! - the QP type and port space are the hints' when set, else the answer's (SOCK_STREAM -> RC,
//!   SOCK_DGRAM -> UD; TCP -> RDMA_PS_TCP, UDP -> RDMA_PS_UDP);
//! - a passive lookup fills `ai_src_addr` (the wildcard when `node` is NULL) and sets
//!   RAI_PASSIVE; an active one fills `ai_dst_addr`, and takes `ai_src_addr` from the hints;
//! - with neither node nor service, the result is the hints' fields and addresses;
//! - a failed lookup returns getaddrinfo's own (negative) EAI_* code, which is what librdmacm
//!   returns and what its examples hand to `gai_strerror`; other failures return -1. Both set
//!   errno (librdmacm leaves it as getaddrinfo did; here it is always meaningful).
//!
//! What it does not do: AF_IB (`RAI_FAMILY` with `AF_IB` and `RAI_NUMERICHOST`, which librdmacm
//! turns into a `sockaddr_ib`) fails with EAFNOSUPPORT, as AF_IB has no meaning on RoCE; the ibacm
//! route query of active lookups is not made, so `ai_route` and `ai_connect` stay NULL (as they
//! do under librdmacm when no ibacm daemon runs); no RDMA device is required.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use crate::cma_ffi::{
    rdma_addrinfo, rdma_cm_event_type, RAI_FAMILY, RAI_NUMERICHOST, RAI_PASSIVE, RDMA_CM_EVENT_ADDR_CHANGE,
    RDMA_CM_EVENT_ADDR_ERROR, RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_CONNECT_ERROR, RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_CONNECT_RESPONSE, RDMA_CM_EVENT_DEVICE_REMOVAL, RDMA_CM_EVENT_DISCONNECTED,
    RDMA_CM_EVENT_ESTABLISHED, RDMA_CM_EVENT_MULTICAST_ERROR, RDMA_CM_EVENT_MULTICAST_JOIN, RDMA_CM_EVENT_REJECTED,
    RDMA_CM_EVENT_ROUTE_ERROR, RDMA_CM_EVENT_ROUTE_RESOLVED, RDMA_CM_EVENT_TIMEWAIT_EXIT, RDMA_CM_EVENT_UNREACHABLE,
    RDMA_PS_IB, RDMA_PS_IPOIB, RDMA_PS_TCP, RDMA_PS_UDP,
};
use crate::ffi::{IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND};
use crate::{guarded, set_errno, Errno, EINVAL};

/// The `RAI_*` flags as `ai_flags` holds them.
const PASSIVE: c_int = RAI_PASSIVE as c_int;
const NUMERICHOST: c_int = RAI_NUMERICHOST as c_int;
const FAMILY: c_int = RAI_FAMILY as c_int;

/// The QP types and port spaces as `rdma_addrinfo`'s int fields hold them.
const QPT_RC: c_int = IBV_QPT_RC as c_int;
const QPT_UC: c_int = IBV_QPT_UC as c_int;
const QPT_UD: c_int = IBV_QPT_UD as c_int;
const QPT_XRC_SEND: c_int = IBV_QPT_XRC_SEND as c_int;
const QPT_XRC_RECV: c_int = IBV_QPT_XRC_RECV as c_int;
const PS_TCP: c_int = RDMA_PS_TCP as c_int;
const PS_UDP: c_int = RDMA_PS_UDP as c_int;
const PS_IPOIB: c_int = RDMA_PS_IPOIB as c_int;
const PS_IB: c_int = RDMA_PS_IB as c_int;

/// The largest socket address a caller's hints may carry.
const MAX_ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;

/// One `rdma_addrinfo` chain allocated with the C allocator, freed on drop unless handed to C.
struct Owned(*mut rdma_addrinfo);

impl Owned {
    /// A zeroed `rdma_addrinfo` (calloc: `rdma_freeaddrinfo` frees it with free).
    fn new() -> Result<Owned, Errno> {
        // SAFETY: calloc of one structure; NULL is checked.
        let p = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
        if p.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        Ok(Owned(p))
    }

    fn get(&mut self) -> &mut rdma_addrinfo {
        // SAFETY: self.0 is a live, exclusively owned allocation (made by `new`).
        unsafe { &mut *self.0 }
    }

    /// Gives the chain to C.
    fn into_raw(self) -> *mut rdma_addrinfo {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the chain was built by this module from C allocations and is owned by self.
        unsafe { free_chain(self.0) };
    }
}

/// libc's answer list, freed on drop.
struct Answers(*mut libc::addrinfo);

impl Drop for Answers {
    fn drop(&mut self) {
        // SAFETY: a list returned by a successful getaddrinfo, freed once.
        unsafe { libc::freeaddrinfo(self.0) };
    }
}

/// Frees every `rdma_addrinfo` of a chain and every member allocated with it.
///
/// # Safety
/// `res` is NULL or a chain whose nodes and members were allocated with the C allocator.
unsafe fn free_chain(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: (caller) a live node; read before it is freed.
        let rai = unsafe { &*res };
        let next = rai.ai_next;
        for member in [
            rai.ai_connect,
            rai.ai_route,
            rai.ai_src_canonname as *mut c_void,
            rai.ai_dst_canonname as *mut c_void,
            rai.ai_src_addr as *mut c_void,
            rai.ai_dst_addr as *mut c_void,
        ] {
            // SAFETY: (caller) NULL or allocated with the C allocator, owned by this node.
            unsafe { libc::free(member) };
        }
        // SAFETY: (caller) the node itself came from the C allocator.
        unsafe { libc::free(res as *mut c_void) };
        res = next;
    }
}

/// A malloc'd copy of the socket address `src` of `len` bytes, with its length.
fn copy_addr(
    src: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<(*mut libc::sockaddr, libc::socklen_t), Errno> {
    if src.is_null() || len == 0 || len > MAX_ADDR_LEN {
        return Err(EINVAL);
    }
    // SAFETY: malloc of len bytes; NULL is checked.
    let dst = unsafe { libc::malloc(len as usize) } as *mut libc::sockaddr;
    if dst.is_null() {
        return Err(Errno(libc::ENOMEM));
    }
    // SAFETY: src holds len readable bytes (the caller's or libc's claim), dst len writable ones.
    unsafe { ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) };
    Ok((dst, len))
}

/// A malloc'd copy of a C string (NULL stays NULL).
fn copy_name(name: *const c_char) -> Result<*mut c_char, Errno> {
    if name.is_null() {
        return Ok(ptr::null_mut());
    }
    // SAFETY: a NUL-terminated string from getaddrinfo's answer.
    let p = unsafe { libc::strdup(name) };
    if p.is_null() {
        return Err(Errno(libc::ENOMEM));
    }
    Ok(p)
}

/// The getaddrinfo hints that stand for `hints`: flags, family (not AF_IB), the socket type of
/// the QP type and the protocol of the port space.
fn socket_hints(hints: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: addrinfo is plain data; all-zero is "no constraint" in every field.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if hints.ai_flags & PASSIVE != 0 {
        ai.ai_flags |= libc::AI_PASSIVE;
    }
    if hints.ai_flags & NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if hints.ai_family != libc::AF_IB {
        ai.ai_family = hints.ai_family;
    }
    ai.ai_socktype = match hints.ai_qp_type {
        QPT_RC | QPT_UC | QPT_XRC_SEND | QPT_XRC_RECV => libc::SOCK_STREAM,
        QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match hints.ai_port_space {
        PS_TCP => libc::IPPROTO_TCP,
        PS_UDP | PS_IPOIB => libc::IPPROTO_UDP,
        PS_IB if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
    ai
}

/// The errno that goes with a getaddrinfo failure.
fn errno_of_gai(code: c_int) -> c_int {
    match code {
        libc::EAI_SYSTEM => crate::last_errno(),
        libc::EAI_MEMORY => libc::ENOMEM,
        libc::EAI_AGAIN => libc::EAGAIN,
        libc::EAI_FAMILY => libc::EAFNOSUPPORT,
        libc::EAI_SERVICE | libc::EAI_SOCKTYPE | libc::EAI_BADFLAGS => libc::EINVAL,
        _ => libc::EADDRNOTAVAIL,
    }
}

/// A lookup's outcome short of a crash: the result, or getaddrinfo's EAI_* code.
type Lookup = Result<Owned, c_int>;

/// Fills `rai` from libc's first answer to (`node`, `service`, `hints`).
fn resolve(
    node: *const c_char,
    service: *const c_char,
    hints: Option<&rdma_addrinfo>,
    rai: &mut Owned,
) -> Result<Result<(), c_int>, Errno> {
    let ai_hints = hints.map(socket_hints);
    let mut list: *mut libc::addrinfo = ptr::null_mut();
    let hints_ptr = ai_hints.as_ref().map_or(ptr::null(), |h| h as *const libc::addrinfo);
    // SAFETY: node and service are NULL or C strings (the caller's), hints_ptr NULL or a local.
    let code = unsafe { libc::getaddrinfo(node, service, hints_ptr, &mut list) };
    if code != 0 {
        return Ok(Err(code));
    }
    let answers = Answers(list);
    // SAFETY: a successful getaddrinfo returns at least one answer.
    let ai = unsafe { &*answers.0 };
    let out = rai.get();
    let qp_type = hints.map_or(0, |h| h.ai_qp_type);
    out.ai_qp_type = if qp_type != 0 {
        qp_type
    } else {
        match ai.ai_socktype {
            libc::SOCK_STREAM => QPT_RC,
            libc::SOCK_DGRAM => QPT_UD,
            _ => 0,
        }
    };
    let port_space = hints.map_or(0, |h| h.ai_port_space);
    out.ai_port_space = if port_space != 0 {
        port_space
    } else {
        match ai.ai_protocol {
            libc::IPPROTO_TCP => PS_TCP,
            libc::IPPROTO_UDP => PS_UDP,
            _ => 0,
        }
    };
    out.ai_family = ai.ai_family;
    let (addr, len) = copy_addr(ai.ai_addr, ai.ai_addrlen)?;
    if ai.ai_flags & libc::AI_PASSIVE != 0 {
        out.ai_flags = PASSIVE;
        out.ai_src_addr = addr as *mut _;
        out.ai_src_len = len;
        out.ai_src_canonname = copy_name(ai.ai_canonname)?;
    } else {
        out.ai_dst_addr = addr as *mut _;
        out.ai_dst_len = len;
        out.ai_dst_canonname = copy_name(ai.ai_canonname)?;
    }
    Ok(Ok(()))
}

/// `rdma_getaddrinfo` without the C boundary.
fn getaddrinfo(node: *const c_char, service: *const c_char, hints: Option<&rdma_addrinfo>) -> Result<Lookup, Errno> {
    if node.is_null() && service.is_null() && hints.is_none() {
        return Err(EINVAL);
    }
    if let Some(h) = hints {
        if h.ai_flags & FAMILY != 0 && h.ai_flags & NUMERICHOST != 0 && h.ai_family == libc::AF_IB {
            return Err(Errno(libc::EAFNOSUPPORT));
        }
    }
    let mut rai = Owned::new()?;
    if !node.is_null() || !service.is_null() {
        if let Err(code) = resolve(node, service, hints, &mut rai)? {
            return Ok(Err(code));
        }
    } else if let Some(h) = hints {
        let out = rai.get();
        out.ai_flags = h.ai_flags;
        out.ai_family = h.ai_family;
        out.ai_qp_type = h.ai_qp_type;
        out.ai_port_space = h.ai_port_space;
        if h.ai_dst_len != 0 {
            let (addr, len) = copy_addr(h.ai_dst_addr as *const _, h.ai_dst_len)?;
            out.ai_dst_addr = addr as *mut _;
            out.ai_dst_len = len;
        }
    }
    if let Some(h) = hints {
        let out = rai.get();
        if out.ai_src_len == 0 && h.ai_src_len != 0 {
            let (addr, len) = copy_addr(h.ai_src_addr as *const _, h.ai_src_len)?;
            out.ai_src_addr = addr as *mut _;
            out.ai_src_len = len;
        }
    }
    Ok(Ok(rai))
}

/// `rdma_getaddrinfo`: resolves `node`/`service` into one `rdma_addrinfo` (see the module page).
/// 0 and `*res` set; a negative EAI_* code when getaddrinfo fails; -1 otherwise. errno is set
/// on every failure, and `*res` is written only on success.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    let outcome = guarded(|| {
        let res = crate::nonnull(res)?;
        // SAFETY: hints is NULL or the caller's valid rdma_addrinfo, read only during the call.
        let hints = unsafe { hints.as_ref() };
        Ok(getaddrinfo(node, service, hints)?.map(|rai| *res = rai.into_raw()))
    });
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(code)) => {
            set_errno(errno_of_gai(code));
            code
        }
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}

/// `rdma_freeaddrinfo`: frees a chain `rdma_getaddrinfo` returned (NULL is nothing to free).
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let _ = guarded(|| {
        // SAFETY: res is NULL or a chain from rdma_getaddrinfo, whose every allocation is C's.
        unsafe { free_chain(res) };
        Ok(())
    });
}

/// The name librdmacm gives an event type.
fn event_name(event: rdma_cm_event_type) -> &'static std::ffi::CStr {
    match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    }
}

/// `rdma_event_str`: the event's name, a static string ("UNKNOWN EVENT" for other values).
#[no_mangle]
pub unsafe extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    crate::ptr_call(|| Ok(event_name(event).as_ptr() as *mut c_char))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use crate::cma_ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT;

    /// rdma_getaddrinfo's return value, errno, and the result (freed by the caller).
    fn lookup(
        node: Option<&CStr>,
        service: Option<&CStr>,
        hints: Option<&rdma_addrinfo>,
    ) -> (c_int, c_int, *mut rdma_addrinfo) {
        let sentinel = 0x5a5a as *mut rdma_addrinfo;
        let mut res = sentinel;
        set_errno(0);
        // SAFETY: C strings, a valid hints structure or NULL, a valid output pointer.
        let ret = unsafe {
            rdma_getaddrinfo(
                node.map_or(ptr::null(), CStr::as_ptr),
                service.map_or(ptr::null(), CStr::as_ptr),
                hints.map_or(ptr::null(), |h| h as *const _),
                &mut res,
            )
        };
        let errno = crate::last_errno();
        if ret != 0 {
            assert_eq!(res, sentinel, "*res written on failure");
            return (ret, errno, ptr::null_mut());
        }
        assert!(!res.is_null());
        (ret, errno, res)
    }

    fn hints(flags: c_int, family: c_int, port_space: c_int) -> rdma_addrinfo {
        rdma_addrinfo { ai_flags: flags, ai_family: family, ai_port_space: port_space, ..Default::default() }
    }

    /// The IPv4 address and port (host order) of a socket address.
    fn v4(addr: *const libc::sockaddr, len: libc::socklen_t) -> (Ipv4Addr, u16) {
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: an AF_INET address of that length.
        let sin = unsafe { &*(addr as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_family as c_int, libc::AF_INET);
        (Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)), u16::from_be(sin.sin_port))
    }

    fn v6(addr: *const libc::sockaddr, len: libc::socklen_t) -> (Ipv6Addr, u16) {
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in6>());
        // SAFETY: an AF_INET6 address of that length.
        let sin6 = unsafe { &*(addr as *const libc::sockaddr_in6) };
        assert_eq!(sin6.sin6_family as c_int, libc::AF_INET6);
        (Ipv6Addr::from(sin6.sin6_addr.s6_addr), u16::from_be(sin6.sin6_port))
    }

    fn free(res: *mut rdma_addrinfo) {
        // SAFETY: a result of rdma_getaddrinfo.
        unsafe { rdma_freeaddrinfo(res) };
    }

    #[test]
    fn numeric_ipv4_active() {
        let h = hints(NUMERICHOST, libc::AF_INET, PS_TCP);
        let (ret, _, res) = lookup(Some(c"192.0.2.7"), Some(c"7471"), Some(&h));
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_eq!((r.ai_flags, r.ai_family, r.ai_qp_type, r.ai_port_space), (0, libc::AF_INET, QPT_RC, PS_TCP));
        assert_eq!(v4(r.ai_dst_addr as *const _, r.ai_dst_len), (Ipv4Addr::new(192, 0, 2, 7), 7471));
        assert!(r.ai_src_addr.is_null() && r.ai_src_len == 0);
        assert!(r.ai_route.is_null() && r.ai_connect.is_null() && r.ai_next.is_null());
        assert!(r.ai_src_canonname.is_null() && r.ai_dst_canonname.is_null());
        free(res);
    }

    #[test]
    fn numeric_ipv6_active() {
        let h = hints(NUMERICHOST, 0, 0);
        let (ret, _, res) = lookup(Some(c"2001:db8::5"), Some(c"18515"), Some(&h));
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_eq!(r.ai_family, libc::AF_INET6);
        assert_eq!(v6(r.ai_dst_addr as *const _, r.ai_dst_len), ("2001:db8::5".parse().unwrap(), 18515));
        // No QP type nor port space asked: the first answer's (glibc lists SOCK_STREAM/TCP first).
        assert_eq!((r.ai_qp_type, r.ai_port_space), (QPT_RC, PS_TCP));
        free(res);
    }

    #[test]
    fn no_hints_numeric_ipv4() {
        let (ret, _, res) = lookup(Some(c"127.0.0.1"), Some(c"7174"), None);
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_eq!(v4(r.ai_dst_addr as *const _, r.ai_dst_len), (Ipv4Addr::LOCALHOST, 7174));
        assert_eq!((r.ai_qp_type, r.ai_port_space), (QPT_RC, PS_TCP));
        free(res);
    }

    #[test]
    fn udp_port_space_gives_ud() {
        let h = hints(NUMERICHOST, libc::AF_INET, PS_UDP);
        let (ret, _, res) = lookup(Some(c"10.1.2.3"), Some(c"7174"), Some(&h));
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_eq!((r.ai_qp_type, r.ai_port_space), (QPT_UD, PS_UDP));
        free(res);
    }

    #[test]
    fn named_host_localhost() {
        let h = hints(0, 0, PS_TCP);
        let (ret, errno, res) = lookup(Some(c"localhost"), Some(c"7471"), Some(&h));
        assert_eq!(ret, 0, "errno {errno}");
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        match r.ai_family {
            libc::AF_INET => assert_eq!(v4(r.ai_dst_addr as *const _, r.ai_dst_len), (Ipv4Addr::LOCALHOST, 7471)),
            libc::AF_INET6 => assert_eq!(v6(r.ai_dst_addr as *const _, r.ai_dst_len), (Ipv6Addr::LOCALHOST, 7471)),
            f => panic!("localhost resolved to family {f}"),
        }
        free(res);
        let h4 = hints(0, libc::AF_INET, PS_TCP);
        let (ret, _, res) = lookup(Some(c"localhost"), None, Some(&h4));
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_eq!(v4(r.ai_dst_addr as *const _, r.ai_dst_len), (Ipv4Addr::LOCALHOST, 0));
        free(res);
    }

    #[test]
    fn passive_without_node_is_the_wildcard() {
        for (family, wildcard) in [(libc::AF_INET, "0.0.0.0"), (libc::AF_INET6, "::")] {
            let h = hints(PASSIVE, family, PS_TCP);
            let (ret, _, res) = lookup(None, Some(c"7471"), Some(&h));
            assert_eq!(ret, 0);
            // SAFETY: a successful result.
            let r = unsafe { &*res };
            assert_eq!((r.ai_flags, r.ai_family, r.ai_qp_type), (PASSIVE, family, QPT_RC));
            let addr = r.ai_src_addr as *const _;
            let got = if family == libc::AF_INET {
                let (a, p) = v4(addr, r.ai_src_len);
                (a.to_string(), p)
            } else {
                let (a, p) = v6(addr, r.ai_src_len);
                (a.to_string(), p)
            };
            assert_eq!(got, (wildcard.to_string(), 7471));
            assert!(r.ai_dst_addr.is_null() && r.ai_dst_len == 0);
            free(res);
        }
        // Passive with a node: that address, as the source.
        let h = hints(PASSIVE | NUMERICHOST, 0, 0);
        let (ret, _, res) = lookup(Some(c"192.0.2.1"), Some(c"7471"), Some(&h));
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_eq!(v4(r.ai_src_addr as *const _, r.ai_src_len), (Ipv4Addr::new(192, 0, 2, 1), 7471));
        free(res);
    }

    #[test]
    fn active_lookup_keeps_the_hints_source() {
        let src = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from(Ipv4Addr::new(192, 0, 2, 99)).to_be() },
            sin_zero: [0; 8],
        };
        let mut h = hints(NUMERICHOST, libc::AF_INET, PS_TCP);
        h.ai_src_addr = &src as *const _ as *mut _;
        h.ai_src_len = std::mem::size_of_val(&src) as libc::socklen_t;
        let (ret, _, res) = lookup(Some(c"192.0.2.7"), Some(c"7471"), Some(&h));
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_ne!(r.ai_src_addr as *const libc::sockaddr_in, &src as *const _, "a copy, not the caller's");
        assert_eq!(v4(r.ai_src_addr as *const _, r.ai_src_len), (Ipv4Addr::new(192, 0, 2, 99), 0));
        assert_eq!(v4(r.ai_dst_addr as *const _, r.ai_dst_len), (Ipv4Addr::new(192, 0, 2, 7), 7471));
        free(res);
    }

    #[test]
    fn no_node_no_service_copies_the_hints() {
        let dst = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 7471u16.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(Ipv4Addr::new(198, 51, 100, 4)).to_be() },
            sin_zero: [0; 8],
        };
        let mut h = hints(0, libc::AF_INET, PS_UDP);
        h.ai_qp_type = QPT_UD;
        h.ai_dst_addr = &dst as *const _ as *mut _;
        h.ai_dst_len = std::mem::size_of_val(&dst) as libc::socklen_t;
        let (ret, _, res) = lookup(None, None, Some(&h));
        assert_eq!(ret, 0);
        // SAFETY: a successful result.
        let r = unsafe { &*res };
        assert_eq!((r.ai_family, r.ai_qp_type, r.ai_port_space), (libc::AF_INET, QPT_UD, PS_UDP));
        assert_eq!(v4(r.ai_dst_addr as *const _, r.ai_dst_len), (Ipv4Addr::new(198, 51, 100, 4), 7471));
        assert!(r.ai_src_addr.is_null());
        free(res);
    }

    #[test]
    fn bad_host_returns_the_gai_code_and_sets_errno() {
        let h = hints(NUMERICHOST, 0, PS_TCP);
        let (ret, errno, _) = lookup(Some(c"not-an-address"), Some(c"7471"), Some(&h));
        assert_eq!(ret, libc::EAI_NONAME);
        assert_eq!(errno, libc::EADDRNOTAVAIL);
        // SAFETY: gai_strerror of a getaddrinfo code: a static string.
        let text = unsafe { CStr::from_ptr(libc::gai_strerror(ret)) };
        assert!(!text.to_bytes().is_empty());
        let (ret, errno, _) = lookup(Some(c"192.0.2.1"), Some(c"no-such-service-here"), Some(&h));
        assert_eq!((ret, errno), (libc::EAI_SERVICE, libc::EINVAL));
    }

    #[test]
    fn refusals() {
        // Nothing to resolve.
        let (ret, errno, _) = lookup(None, None, None);
        assert_eq!((ret, errno), (-1, libc::EINVAL));
        // No place for the result.
        set_errno(0);
        // SAFETY: valid strings; res NULL is what is tested.
        let ret = unsafe { rdma_getaddrinfo(c"127.0.0.1".as_ptr(), ptr::null(), ptr::null(), ptr::null_mut()) };
        assert_eq!((ret, crate::last_errno()), (-1, libc::EINVAL));
        // AF_IB is not for RoCE.
        let h = hints(FAMILY | NUMERICHOST, libc::AF_IB, PS_TCP);
        let (ret, errno, _) = lookup(Some(c"fe80::1"), None, Some(&h));
        assert_eq!((ret, errno), (-1, libc::EAFNOSUPPORT));
        // A source length with no address.
        let mut h = hints(NUMERICHOST, 0, PS_TCP);
        h.ai_src_len = 16;
        let (ret, errno, _) = lookup(Some(c"192.0.2.1"), None, Some(&h));
        assert_eq!((ret, errno), (-1, libc::EINVAL));
    }

    #[test]
    fn freeing_a_chain_frees_every_node() {
        let h = hints(NUMERICHOST, 0, PS_TCP);
        let (_, _, first) = lookup(Some(c"192.0.2.1"), Some(c"1"), Some(&h));
        let (_, _, second) = lookup(Some(c"192.0.2.2"), Some(c"2"), Some(&h));
        let (_, _, third) = lookup(Some(c"2001:db8::3"), Some(c"3"), Some(&h));
        // SAFETY: three live results, linked into one chain, each member from the C allocator.
        unsafe {
            (*first).ai_next = second;
            (*second).ai_next = third;
            (*second).ai_dst_canonname = libc::strdup(c"two.example".as_ptr());
            (*third).ai_route = libc::malloc(64);
            (*third).ai_route_len = 64;
        }
        free(first);
        free(ptr::null_mut());
    }

    #[test]
    fn event_names_are_librdmacms() {
        let names = [
            "RDMA_CM_EVENT_ADDR_RESOLVED",
            "RDMA_CM_EVENT_ADDR_ERROR",
            "RDMA_CM_EVENT_ROUTE_RESOLVED",
            "RDMA_CM_EVENT_ROUTE_ERROR",
            "RDMA_CM_EVENT_CONNECT_REQUEST",
            "RDMA_CM_EVENT_CONNECT_RESPONSE",
            "RDMA_CM_EVENT_CONNECT_ERROR",
            "RDMA_CM_EVENT_UNREACHABLE",
            "RDMA_CM_EVENT_REJECTED",
            "RDMA_CM_EVENT_ESTABLISHED",
            "RDMA_CM_EVENT_DISCONNECTED",
            "RDMA_CM_EVENT_DEVICE_REMOVAL",
            "RDMA_CM_EVENT_MULTICAST_JOIN",
            "RDMA_CM_EVENT_MULTICAST_ERROR",
            "RDMA_CM_EVENT_ADDR_CHANGE",
            "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        ];
        assert_eq!(names.len() as u32, RDMA_CM_EVENT_TIMEWAIT_EXIT + 1);
        let name = |e: rdma_cm_event_type| {
            // SAFETY: rdma_event_str returns a static C string.
            unsafe { CStr::from_ptr(rdma_event_str(e)) }.to_str().unwrap().to_string()
        };
        for (e, n) in names.iter().enumerate() {
            assert_eq!(name(e as rdma_cm_event_type), *n);
        }
        for e in [RDMA_CM_EVENT_TIMEWAIT_EXIT + 1, 100, u32::MAX] {
            assert_eq!(name(e), "UNKNOWN EVENT");
        }
    }
}
