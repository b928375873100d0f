//! The exported librdmacm functions (RDMACM_1.0-1.3), each behaving as librdmacm 44 over the
//! kernel's ucma does; the rsocket family stays in `rdmacm.rs` (ENOSYS).

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Condvar, Mutex};

use softrdma_device::proto::{CmRecord, Request, Response};
use softrdma_engine::cm::{ConnParam, Ece, InitQpAttr, PS_IB, PS_IPOIB, PS_TCP, PS_UDP};
use softrdma_engine::verbs::{QpState, QpType};

use super::{
    api, channel_of, cm_call, cma, id_of, lock, ports, sockaddr_from, sockaddr_to, Channel, CmDev, Event, Id, IdState,
    Mc, Placement,
};
use crate::cma_ffi as c;
use crate::{ffi, minus1_call, ptr_call, set_errno, Errno, EINVAL};

// enum rdma_cm_event_type
const ADDR_RESOLVED: u32 = 0;
const ADDR_ERROR: u32 = 1;
const ROUTE_RESOLVED: u32 = 2;
const ROUTE_ERROR: u32 = 3;
const CONNECT_REQUEST: u32 = 4;
const CONNECT_RESPONSE: u32 = 5;
const CONNECT_ERROR: u32 = 6;
const UNREACHABLE: u32 = 7;
const REJECTED: u32 = 8;
const ESTABLISHED: u32 = 9;
const DEVICE_REMOVAL: u32 = 11;
const MULTICAST_JOIN: u32 = 12;
const MULTICAST_ERROR: u32 = 13;

/// Whether the program's ID wants the QP type's CM semantics.
fn qp_type_of(t: u32) -> Option<QpType> {
    QpType::from_ibv(t)
}

fn ps_default_qp(ps: u32) -> Option<QpType> {
    match ps as u16 {
        PS_TCP => Some(QpType::Rc),
        PS_UDP | PS_IPOIB => Some(QpType::Ud),
        PS_IB => Some(QpType::Rc),
        _ => None,
    }
}

fn new_id(
    channel: *mut c::rdma_event_channel,
    context: *mut c_void,
    ps: u32,
    qp_type: QpType,
) -> Result<*mut c::rdma_cm_id, Errno> {
    let cma = cma()?;
    let sync = channel.is_null();
    let own_channel = if sync { Some(Channel::new()?) } else { None };
    let chan_ptr = match &own_channel {
        Some(ch) => &ch.c as *const c::rdma_event_channel as *mut c::rdma_event_channel,
        None => channel,
    };
    let handle = cma.handle();
    // SAFETY: rdma_cm_id is a bindgen C struct of integers, raw pointers, Option'd function
    // pointers and unions of those, for all of which all-zero bytes are valid (NULL / None / 0).
    let mut cid: c::rdma_cm_id = unsafe { std::mem::zeroed() };
    cid.channel = chan_ptr;
    cid.context = context;
    cid.ps = ps as _;
    cid.port_num = 1;
    cid.qp_type = qp_type.to_ibv() as _;
    let id = Box::new(Id {
        c: cid,
        st: Mutex::new(IdState {
            handle,
            sync,
            own_channel,
            qp_type,
            ps: ps as u16,
            on: Vec::new(),
            bound: None,
            port_lock: None,
            remote: None,
            tos: 0,
            reuseaddr: false,
            afonly: false,
            ack_timeout: None,
            listening: false,
            backlog: 0,
            addr_resolved: false,
            route_resolved: false,
            responder_resources: 0,
            initiator_depth: 0,
            ep_qp_init: None,
            ep_pd: std::ptr::null_mut(),
            path: None,
            own_cqs: false,
            own_srq: false,
            own_xrcd: std::ptr::null_mut(),
            local_ece: (0, 0),
            remote_ece: (0, 0),
            mcs: Vec::new(),
        }),
        outstanding: Mutex::new(0),
        acked: Condvar::new(),
    });
    let p = Box::into_raw(id);
    lock(&cma.ids).insert(handle, p as usize);
    lock(&cma.live).insert(p as usize);
    Ok(p as *mut c::rdma_cm_id)
}

fn id_mut<'a>(p: *mut c::rdma_cm_id) -> Result<&'a mut c::rdma_cm_id, Errno> {
    if p.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: an rdma_cm_id this library made; the program owns its fields as in librdmacm.
    Ok(unsafe { &mut *p })
}

fn channel_for(id: &Id) -> Result<&Channel, Errno> {
    channel_of(id.c.channel)
}

/// The ID gets a device ID on `dev` (its channel registered there).
fn place(id: &Id, st: &mut IdState, dev: &Arc<CmDev>) -> Result<Placement, Errno> {
    if let Some(p) = st.on.iter().find(|p| Arc::ptr_eq(&p.dev, dev)) {
        return Ok(p.clone());
    }
    let ch = channel_for(id)?.on(dev)?;
    let req = Request::CmCreateId { channel: ch, ps: st.ps, qp_type: st.qp_type, user: st.handle };
    match cm_call(dev, &req, &[])? {
        Response::CmId(h) => {
            let p = Placement { dev: dev.clone(), id: h };
            st.on.push(p.clone());
            Ok(p)
        }
        _ => Err(Errno(libc::EIO)),
    }
}

fn first(st: &IdState) -> Result<Placement, Errno> {
    st.on.first().cloned().ok_or(EINVAL)
}

/// Writes the ID's addresses into `id->route.addr`.
fn set_route_addrs(cid: &mut c::rdma_cm_id, src: Option<SocketAddr>, dst: Option<SocketAddr>) {
    let base = std::ptr::addr_of_mut!(cid.route.addr) as *mut u8;
    let ss = std::mem::size_of::<libc::sockaddr_storage>();
    if let Some(s) = src {
        sockaddr_to(s, base);
    }
    if let Some(d) = dst {
        // SAFETY: the second union of rdma_addr starts one sockaddr_storage in.
        sockaddr_to(d, unsafe { base.add(ss) });
    }
    // The IB address part: the GIDs of the two addresses, P_Key 0xFFFF.
    let gid = |a: SocketAddr| softrdma_device::proto::gid_of(a.ip());
    // SAFETY: rdma_ib_addr follows the two sockaddr_storage unions: sgid, dgid, pkey.
    unsafe {
        let ib = base.add(2 * ss);
        if let Some(s) = src {
            std::ptr::copy_nonoverlapping(gid(s).as_ptr(), ib, 16);
        }
        if let Some(d) = dst {
            std::ptr::copy_nonoverlapping(gid(d).as_ptr(), ib.add(16), 16);
        }
        std::ptr::write_unaligned(ib.add(32) as *mut u16, 0xffffu16.to_be());
    }
}

fn post_local(id: &Id, st: &IdState, event: u32, status: i32) -> Result<(), Errno> {
    let ch = channel_for(id)?;
    ch.post(&CmRecord {
        device: String::new(),
        id: 0,
        user: st.handle,
        listen_user: 0,
        event,
        status,
        param: ConnParam::default(),
        local: None,
        remote: None,
        route: None,
    });
    Ok(())
}

/// librdmacm's `ucma_complete`: a synchronous ID waits for its event; a failed one fails the call.
fn complete(p: *mut c::rdma_cm_id) -> Result<(), Errno> {
    let id = id_of(p)?;
    if !lock(&id.st).sync {
        return Ok(());
    }
    let cid = id_mut(p)?;
    if !cid.event.is_null() {
        // SAFETY: the previous event of this synchronous ID.
        unsafe { rdma_ack_cm_event(cid.event) };
        cid.event = std::ptr::null_mut();
    }
    let mut ev = std::ptr::null_mut();
    // SAFETY: the ID's own channel.
    if unsafe { rdma_get_cm_event(cid.channel, &mut ev) } != 0 {
        return Err(Errno(crate::last_errno()));
    }
    cid.event = ev;
    // SAFETY: a valid event just returned.
    let (kind, status) = unsafe { ((*ev).event, (*ev).status) };
    if status != 0 {
        return Err(Errno(if kind == REJECTED as _ {
            libc::ECONNREFUSED
        } else if status < 0 {
            -status
        } else {
            status
        }));
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut c::rdma_event_channel {
    ptr_call(|| {
        cma()?;
        let ch = Channel::new()?;
        Ok(Box::into_raw(ch) as *mut c::rdma_event_channel)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut c::rdma_event_channel) {
    let _ = crate::guarded(|| {
        if channel.is_null() {
            return Ok(());
        }
        // SAFETY: a channel from rdma_create_event_channel, given back once.
        let ch = unsafe { Box::from_raw(channel as *mut Channel) };
        if let Ok(cma) = cma() {
            for d in &cma.devs() {
                if let Some(h) = lock(&d.channels).remove(&ch.handle) {
                    let _ = cm_call(d, &Request::CmDestroyChannel(h), &[]);
                }
            }
        }
        // Closed later, not now (see `bury`).
        super::bury(ch);
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut c::rdma_event_channel,
    id: *mut *mut c::rdma_cm_id,
    context: *mut c_void,
    ps: c::rdma_port_space,
) -> c_int {
    minus1_call(|| {
        if id.is_null() {
            return Err(EINVAL);
        }
        let qp_type = ps_default_qp(ps as u32).ok_or(EINVAL)?;
        let p = new_id(channel, context, ps as u32, qp_type)?;
        // SAFETY: checked non-null.
        unsafe { *id = p };
        Ok(0)
    })
}

/// `rdma_create_id2` is not exported by librdmacm 44; `rdma_create_ep` and XRC need a QP type.
fn create_id_typed(
    channel: *mut c::rdma_event_channel,
    context: *mut c_void,
    ps: u32,
    qp_type: u32,
) -> Result<*mut c::rdma_cm_id, Errno> {
    let t = qp_type_of(qp_type).or_else(|| ps_default_qp(ps)).ok_or(EINVAL)?;
    new_id(channel, context, ps, t)
}

/// RDMA_CM_EVENT_DEVICE_REMOVAL (cma_process_remove): device `dev` went away; every ID with a
/// place on it hears so on its channel, once. The IDs stay for the program to destroy.
pub(crate) fn device_removed(cma: &super::Cma, dev: &Arc<CmDev>) {
    // The live set stays locked: an ID being destroyed leaves it first, so none is freed here.
    let live = lock(&cma.live);
    for &p in live.iter() {
        // SAFETY: a live ID (see id_of).
        let id = unsafe { &*(p as *const Id) };
        let st = lock(&id.st);
        if st.on.iter().any(|pl| Arc::ptr_eq(&pl.dev, dev)) {
            let _ = post_local(id, &st, DEVICE_REMOVAL, 0);
        }
    }
}

/// The ID listens on `dev`: a device ID with the bound address, listening with `backlog`.
fn listen_on(id: &Id, st: &mut IdState, dev: &Arc<CmDev>, bound: SocketAddr, backlog: u32) -> Result<(), Errno> {
    let p = place(id, st, dev)?;
    cm_call(dev, &Request::CmSetAddrs { id: p.id, local: Some(bound), remote: None, tos: st.tos }, &[])
        .or_else(|e| if e.0 == libc::EINVAL { Ok(Response::Ok) } else { Err(e) })?;
    cm_call(dev, &Request::CmListen { id: p.id, backlog }, &[])?;
    Ok(())
}

/// A device started after the program's first rdma_cm call: every wildcard listener listens on it
/// too, as the kernel's cma_add_one has each listener bound to a wildcard address listen on a new
/// ib_device (cma_listen_on_dev).
pub(crate) fn device_added(cma: &super::Cma, dev: &Arc<CmDev>) {
    let live = lock(&cma.live);
    for &p in live.iter() {
        // SAFETY: a live ID (see id_of).
        let id = unsafe { &*(p as *const Id) };
        let mut st = lock(&id.st);
        let Some(bound) = st.bound.filter(|b| unattached(cma, b.ip())) else { continue };
        if !st.listening || st.on.iter().any(|pl| Arc::ptr_eq(&pl.dev, dev)) {
            continue;
        }
        let backlog = st.backlog;
        if let Err(e) = listen_on(id, &mut st, dev, bound, backlog) {
            // The kernel logs and goes on when a listen on a new device fails.
            eprintln!("softrdma: rdma_cm: listening on new device {} failed: errno {}", dev.name, e.0);
        }
    }
}

fn free_id(p: *mut c::rdma_cm_id) {
    let Ok(id) = id_of(p) else { return };
    let handle = lock(&id.st).handle;
    if let Ok(cma) = cma() {
        lock(&cma.ids).remove(&handle);
        lock(&cma.live).remove(&(p as usize));
    }
    // SAFETY: made by new_id with Box::into_raw; removed from the registry above.
    drop(unsafe { Box::from_raw(p as *mut Id) });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut c::rdma_cm_id) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        if !cid.event.is_null() {
            // SAFETY: a synchronous ID's last event.
            unsafe { rdma_ack_cm_event(cid.event) };
            cid.event = std::ptr::null_mut();
        }
        let on: Vec<Placement> = std::mem::take(&mut lock(&i.st).on);
        for p in &on {
            let _ = cm_call(&p.dev, &Request::CmDestroyId(p.id), &[]);
        }
        // librdmacm's rdma_destroy_id waits until every event it reported for the ID was acked.
        let mut n = lock(&i.outstanding);
        while *n > 0 {
            n = i.acked.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        drop(n);
        free_id(id);
        Ok(0)
    })
}

fn route_source(dst: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = UdpSocket::bind(any).ok()?;
    let mut d = dst;
    if d.port() == 0 {
        d.set_port(9);
    }
    s.connect(d).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// An ID bound to `ip` belongs to no device: the wildcard, or a loopback address no device holds.
fn unattached(cma: &super::Cma, ip: IpAddr) -> bool {
    ip.is_unspecified() || (ip.is_loopback() && cma.dev_by_addr(ip).is_none())
}

/// Why an address has no device, as the kernel's rdma_bind_addr says it: an address of no
/// interface fails in cma_translate_addr (EADDRNOTAVAIL); an address of an interface without an
/// RDMA device (eth0's address with no device on it) fails in cma_acquire_dev_by_src_ip (ENODEV).
fn no_device(ip: IpAddr) -> Errno {
    if UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok() {
        Errno(libc::ENODEV)
    } else {
        Errno(libc::EADDRNOTAVAIL)
    }
}

fn bind_inner(id: &Id, cid: &mut c::rdma_cm_id, addr: SocketAddr) -> Result<(), Errno> {
    let cma = cma()?;
    let mut st = lock(&id.st);
    if st.bound.is_some() {
        return Err(EINVAL);
    }
    // The kernel binds only to an address of an RDMA device, the wildcard, or a loopback
    // address: that one binds without a device, like the wildcard (measured against rxe:
    // examples/c/cm_bind_probe.c in conformance/interop/rxe.sh; libfabric's verbs provider binds
    // "localhost" and then takes its source addresses from the devices).
    let dev = if unattached(cma, addr.ip()) {
        None
    } else {
        Some(cma.dev_by_addr(addr.ip()).ok_or_else(|| no_device(addr.ip()))?)
    };
    if dev.is_some() && st.ps == PS_IPOIB {
        // cma_acquire_dev_by_src_ip: an RDMA_PS_IPOIB ID takes only an IPoIB (InfiniBand link
        // layer) address; a RoCE device's address is EINVAL.
        return Err(EINVAL);
    }
    let (res, port) = ports::reserve(st.ps, addr)?;
    let bound = SocketAddr::new(addr.ip(), port);
    st.bound = Some(bound);
    st.port_lock = Some(res);
    if let Some(d) = dev {
        let p = place(id, &mut st, &d)?;
        cm_call(&p.dev, &Request::CmSetAddrs { id: p.id, local: Some(bound), remote: None, tos: st.tos }, &[])?;
        cid.verbs = d.verbs;
        // librdmacm's ucma_get_device: an ID on a device gets the device's default PD.
        if cid.pd.is_null() {
            cid.pd = default_pd(&d)? as _;
        }
    }
    set_route_addrs(cid, Some(bound), None);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut c::rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let a = sockaddr_from(addr).ok_or(EINVAL)?;
        bind_inner(i, id_mut(id)?, a)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut c::rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        let dst = sockaddr_from(dst_addr).ok_or(EINVAL)?;
        let cma = cma()?;
        let src = sockaddr_from(src_addr);
        if lock(&i.st).ps == PS_IPOIB && src.is_none_or(|s| s.ip().is_unspecified()) {
            // The kernel binds the ID to the wildcard and, the address resolved, fails to take a
            // RoCE device for it (cma_acquire_dev_by_src_ip: EINVAL for RDMA_PS_IPOIB off an
            // IPoIB netdev): ADDR_ERROR with status -EINVAL. (With a source address given, the
            // bind itself fails: EINVAL from this call.)
            if lock(&i.st).bound.is_none() {
                bind_inner(i, cid, SocketAddr::new(softrdma_engine::cm::unspecified_like(dst.ip()), 0))?;
            }
            let st = lock(&i.st);
            post_local(i, &st, ADDR_ERROR, -libc::EINVAL)?;
            drop(st);
            complete(id)?;
            return Ok(0);
        }
        if lock(&i.st).bound.is_none() {
            // The source: the one given, else the address the host's routing picks for the
            // destination; when that address has no device but the destination is a device's
            // own address, that device (the kernel loops a local RDMA address back through it).
            let ip = match src {
                Some(s) if !s.ip().is_unspecified() => Some(s.ip()),
                _ => route_source(dst),
            };
            let dev_ip = match ip {
                Some(ip) if cma.dev_by_addr(ip).is_some() => Some(ip),
                _ if cma.dev_by_addr(dst.ip()).is_some() => Some(dst.ip()),
                _ => None,
            };
            let Some(dev_ip) = dev_ip else {
                eprintln!(
                    "softrdma: rdma_resolve_addr: no softrdma device on {} (the route to {} leaves from it); start one with `softrdma up NAME --addr ADDR`",
                    ip.map_or("any address".to_owned(), |i| i.to_string()),
                    dst.ip()
                );
                let st = lock(&i.st);
                post_local(i, &st, ADDR_ERROR, -libc::ENODEV)?;
                drop(st);
                complete(id)?;
                return Ok(0);
            };
            bind_inner(i, cid, SocketAddr::new(dev_ip, src.map_or(0, |s| s.port())))?;
        }
        let mut st = lock(&i.st);
        let bound = st.bound.ok_or(EINVAL)?;
        let dev = match cma.dev_by_addr(bound.ip()) {
            Some(d) => d,
            None => {
                // Bound to the wildcard: the routing picks the device now.
                let ip = route_source(dst).filter(|ip| cma.dev_by_addr(*ip).is_some()).unwrap_or(dst.ip());
                cma.dev_by_addr(ip).ok_or(Errno(libc::ENODEV))?
            }
        };
        let local = SocketAddr::new(dev.addr, bound.port());
        let p = place(i, &mut st, &dev)?;
        cm_call(&p.dev, &Request::CmSetAddrs { id: p.id, local: Some(local), remote: Some(dst), tos: st.tos }, &[])?;
        st.remote = Some(dst);
        st.addr_resolved = true;
        cid.verbs = dev.verbs;
        if cid.pd.is_null() {
            cid.pd = default_pd(&dev)? as _;
        }
        set_route_addrs(cid, Some(local), Some(dst));
        post_local(i, &st, ADDR_RESOLVED, 0)?;
        drop(st);
        complete(id)?;
        Ok(0)
    })
}

/// The address vector toward a UD peer as the kernel makes it from a RoCE path
/// (ib_init_ah_attr_from_path): global, the peer's GID, the path's hop limit, traffic class and
/// flow label, GID index 0 of port 1.
fn ud_ah_attr(local: SocketAddr, remote: SocketAddr, tos: u8) -> ffi::ibv_ah_attr {
    let r = path_record(local, remote, tos, 0);
    let mut a = ffi::ibv_ah_attr { is_global: 1, port_num: 1, sl: r.sl, ..Default::default() };
    a.grh.dgid.raw = softrdma_device::proto::gid_of(remote.ip());
    a.grh.hop_limit = r.hop_limit;
    a.grh.traffic_class = r.traffic_class;
    a.grh.flow_label = u32::from_be(r.flow_label);
    a.grh.sgid_index = 0;
    a
}

fn path_record(local: SocketAddr, remote: SocketAddr, tos: u8, mtu: u8) -> c::ibv_sa_path_rec {
    // SAFETY: ibv_sa_path_rec is plain integers and GIDs (byte arrays): all-zero is valid.
    let mut r: c::ibv_sa_path_rec = unsafe { std::mem::zeroed() };
    r.sgid.raw = softrdma_device::proto::gid_of(local.ip());
    r.dgid.raw = softrdma_device::proto::gid_of(remote.ip());
    r.pkey = 0xffffu16.to_be();
    r.hop_limit = 64;
    r.traffic_class = tos;
    r.flow_label = softrdma_engine::cm::flow_label(local.port(), remote.port()).to_be();
    r.mtu = mtu;
    r.mtu_selector = 2;
    r.rate_selector = 2;
    r.packet_life_time = 18;
    r.packet_life_time_selector = 2;
    r.reversible = 1;
    r.numb_path = 1;
    r.sl = 0;
    r
}

/// The `ibv_sa_path_rec` librdmacm shows for a route.
fn path_record_of(r: &softrdma_engine::cm::Route) -> c::ibv_sa_path_rec {
    // SAFETY: a plain C struct; zero is a valid value of every field.
    let mut p: c::ibv_sa_path_rec = unsafe { std::mem::zeroed() };
    p.sgid.raw = r.sgid;
    p.dgid.raw = r.dgid;
    p.pkey = 0xffffu16.to_be();
    p.hop_limit = r.hop_limit;
    p.traffic_class = r.traffic_class;
    p.flow_label = r.flow_label.to_be();
    p.sl = r.sl;
    p.mtu = r.mtu;
    p.mtu_selector = 2;
    p.rate = r.rate;
    p.rate_selector = 2;
    p.packet_life_time = r.packet_life_time;
    p.packet_life_time_selector = 2;
    p.reversible = 1;
    p.numb_path = 1;
    p
}

/// `struct ibv_path_data` (infiniband/sa.h): flags, reserved, then a 64-byte `struct
/// ibv_path_record` in SA wire format.
const PATH_DATA_LEN: usize = 72;
/// IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL: the one entry the
/// kernel takes (ucma_set_ib_path).
const PATH_FLAGS_PRIMARY_GMP: u32 = 1 | 2 | (8 | 32);

/// RDMA_OPTION_IB_PATH's records: the primary, bidirectional GMP one as a route, or EINVAL
/// (ucma_set_ib_path: a length that is not a whole number of records, or no such record).
fn route_from_path_data(data: &[u8]) -> Result<softrdma_engine::cm::Route, Errno> {
    if data.is_empty() || data.len() % PATH_DATA_LEN != 0 {
        return Err(EINVAL);
    }
    let rec = data
        .chunks_exact(PATH_DATA_LEN)
        .find(|d| u32::from_ne_bytes([d[0], d[1], d[2], d[3]]) == PATH_FLAGS_PRIMARY_GMP)
        .ok_or(EINVAL)?;
    let p = &rec[8..];
    let gid = |o: usize| -> [u8; 16] { p[o..o + 16].try_into().expect("16 bytes") };
    let fl_hop = u32::from_be_bytes([p[44], p[45], p[46], p[47]]);
    Ok(softrdma_engine::cm::Route {
        dgid: gid(8),
        sgid: gid(24),
        flow_label: (fl_hop >> 8) & 0xf_ffff,
        hop_limit: fl_hop as u8,
        traffic_class: p[48],
        sl: (u16::from_be_bytes([p[52], p[53]]) & 0xf) as u8,
        mtu: p[54] & 0x3f,
        rate: p[55] & 0x3f,
        packet_life_time: p[56] & 0x3f,
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut c::rdma_cm_id, _timeout_ms: c_int) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        let mut st = lock(&i.st);
        // rdma_resolve_route: ADDR_RESOLVED -> ROUTE_QUERY, else EINVAL (once routed, again).
        if !st.addr_resolved || st.route_resolved {
            return Err(EINVAL);
        }
        let p = first(&st)?;
        // RoCE has no SA: the device builds the path record from the routing and neighbour
        // tables as the kernel's cma_resolve_iboe_route does, or takes it from its path cache.
        let route = match cm_call(&p.dev, &Request::CmResolveRoute(p.id), &[]) {
            Ok(Response::CmRoute { route, .. }) => route,
            Ok(_) => return Err(Errno(libc::EPROTO)),
            Err(Errno(e)) if e == libc::EINVAL || e == libc::ENOENT => return Err(Errno(e)),
            Err(Errno(e)) => {
                // No route to the destination: the route step fails as the kernel's work
                // handler fails it (RDMA_CM_EVENT_ROUTE_ERROR with the error).
                post_local(i, &st, ROUTE_ERROR, -e)?;
                drop(st);
                complete(id)?;
                return Ok(0);
            }
        };
        let mut rec = Box::new(path_record_of(&route));
        if let Some(t) = st.ack_timeout {
            rec.packet_life_time = t.saturating_sub(1);
        }
        cid.route.path_rec = &mut *rec as *mut c::ibv_sa_path_rec;
        cid.route.num_paths = 1;
        st.path = Some(rec);
        st.route_resolved = true;
        post_local(i, &st, ROUTE_RESOLVED, 0)?;
        drop(st);
        complete(id)?;
        Ok(0)
    })
}

fn default_pd(dev: &CmDev) -> Result<*mut ffi::ibv_pd, Errno> {
    let mut pd = lock(&dev.pd);
    if pd.is_null() {
        // SAFETY: an open context.
        let p = unsafe { (api().alloc_pd)(dev.verbs) };
        if p.is_null() {
            return Err(Errno(crate::last_errno()));
        }
        *pd = p;
    }
    Ok(*pd)
}

fn qp_attr_from(a: &InitQpAttr) -> (ffi::ibv_qp_attr, c_int) {
    let mut q = crate::qp::qp_attr_to_c(&a.attr);
    q.ah_attr.sl = a.sl;
    q.ah_attr.grh.hop_limit = a.hop_limit;
    q.ah_attr.grh.traffic_class = a.traffic_class;
    q.ah_attr.grh.flow_label = a.flow_label;
    (q, a.mask.0 as c_int)
}

fn init_attr(i: &Id, state: QpState) -> Result<(ffi::ibv_qp_attr, c_int), Errno> {
    let p = first(&lock(&i.st))?;
    match cm_call(&p.dev, &Request::CmInitQpAttr { id: p.id, state }, &[])? {
        Response::CmQpAttr(a) => Ok(qp_attr_from(&a)),
        _ => Err(Errno(libc::EIO)),
    }
}

fn modify(qp: *mut ffi::ibv_qp, attr: &mut ffi::ibv_qp_attr, mask: c_int) -> Result<(), Errno> {
    // SAFETY: the ID's QP, from libibverbs.
    let r = unsafe { (api().modify_qp)(qp, attr, mask) };
    if r != 0 {
        return Err(Errno(r));
    }
    Ok(())
}

/// librdmacm's ucma_modify_qp_rtr and _rts: INIT again (the attributes the connection now
/// knows), RTR, then RTS.
/// `depths`: the responder resources and initiator depth rdma_accept was given, which override
/// the CM's (librdmacm does the same; the active side keeps the CM's).
fn qp_to_rts(i: &Id, qp: *mut ffi::ibv_qp, depths: Option<(u8, u8)>) -> Result<(), Errno> {
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let (mut a, m) = init_attr(i, s)?;
        if let Some((rr, id)) = depths {
            match s {
                QpState::Init if rr > 0 => {
                    a.qp_access_flags |= ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_ATOMIC;
                }
                QpState::Rtr => a.max_dest_rd_atomic = rr,
                QpState::Rts => a.max_rd_atomic = id,
                _ => {}
            }
        }
        modify(qp, &mut a, m)?;
    }
    Ok(())
}

fn qp_to_err(qp: *mut ffi::ibv_qp) {
    if qp.is_null() {
        return;
    }
    let mut a = ffi::ibv_qp_attr { qp_state: ffi::IBV_QPS_ERR, ..Default::default() };
    let _ = modify(qp, &mut a, ffi::IBV_QP_STATE as c_int);
}

fn create_cqs(cid: &mut c::rdma_cm_id, send: u32, recv: u32) -> Result<(), Errno> {
    let api = api();
    // SAFETY: libibverbs calls on the ID's context.
    unsafe {
        if recv > 0 && cid.recv_cq.is_null() {
            cid.recv_cq_channel = (api.create_comp_channel)(cid.verbs) as _;
            if cid.recv_cq_channel.is_null() {
                return Err(Errno(crate::last_errno()));
            }
            cid.recv_cq =
                (api.create_cq)(cid.verbs, recv as c_int, cid as *mut _ as *mut c_void, cid.recv_cq_channel as _, 0)
                    as _;
            if cid.recv_cq.is_null() {
                return Err(Errno(crate::last_errno()));
            }
        }
        if send > 0 && cid.send_cq.is_null() {
            cid.send_cq_channel = (api.create_comp_channel)(cid.verbs) as _;
            if cid.send_cq_channel.is_null() {
                return Err(Errno(crate::last_errno()));
            }
            cid.send_cq =
                (api.create_cq)(cid.verbs, send as c_int, cid as *mut _ as *mut c_void, cid.send_cq_channel as _, 0)
                    as _;
            if cid.send_cq.is_null() {
                return Err(Errno(crate::last_errno()));
            }
        }
    }
    Ok(())
}

fn destroy_cqs(cid: &mut c::rdma_cm_id) {
    let api = api();
    // SAFETY: CQs and channels librdmacm made for the ID.
    unsafe {
        if !cid.send_cq.is_null() {
            (api.destroy_cq)(cid.send_cq as _);
            cid.send_cq = std::ptr::null_mut();
        }
        if !cid.send_cq_channel.is_null() {
            (api.destroy_comp_channel)(cid.send_cq_channel as _);
            cid.send_cq_channel = std::ptr::null_mut();
        }
        if !cid.recv_cq.is_null() {
            (api.destroy_cq)(cid.recv_cq as _);
            cid.recv_cq = std::ptr::null_mut();
        }
        if !cid.recv_cq_channel.is_null() {
            (api.destroy_comp_channel)(cid.recv_cq_channel as _);
            cid.recv_cq_channel = std::ptr::null_mut();
        }
    }
}

fn vctx(ctx: *mut ffi::ibv_context) -> *mut ffi::verbs_context {
    let off = std::mem::offset_of!(ffi::verbs_context, context);
    // SAFETY: libibverbs' contexts are verbs_contexts (the shim's are).
    unsafe { (ctx as *mut u8).sub(off) as *mut ffi::verbs_context }
}

fn get_xrcd(i: &Id, cid: &mut c::rdma_cm_id) -> Result<*mut ffi::ibv_xrcd, Errno> {
    let mut st = lock(&i.st);
    if !st.own_xrcd.is_null() {
        return Ok(st.own_xrcd);
    }
    let mut a = ffi::ibv_xrcd_init_attr {
        comp_mask: ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT as _,
    };
    let v = vctx(cid.verbs);
    // SAFETY: the context's own open_xrcd op.
    let x = unsafe { (*v).open_xrcd.map(|f| f(cid.verbs, &mut a)) }.unwrap_or(std::ptr::null_mut());
    if x.is_null() {
        return Err(Errno(crate::last_errno()));
    }
    st.own_xrcd = x;
    Ok(x)
}

fn create_qp_inner(id: *mut c::rdma_cm_id, attr: &mut ffi::ibv_qp_init_attr_ex) -> Result<(), Errno> {
    let i = id_of(id)?;
    let cid = id_mut(id)?;
    if cid.verbs.is_null() {
        return Err(EINVAL);
    }
    let cma = cma()?;
    let dev = cma.dev_by_verbs(cid.verbs).ok_or(EINVAL)?;
    if attr.comp_mask & ffi::IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = if cid.pd.is_null() { default_pd(&dev)? } else { cid.pd as _ };
        attr.comp_mask |= ffi::IBV_QP_INIT_ATTR_PD;
    }
    let t = QpType::from_ibv(attr.qp_type as u32).ok_or(EINVAL)?;
    if t == QpType::XrcTgt {
        if attr.xrcd.is_null() {
            attr.xrcd = get_xrcd(i, cid)?;
        }
        attr.comp_mask |= ffi::IBV_QP_INIT_ATTR_XRCD;
        attr.comp_mask &= !ffi::IBV_QP_INIT_ATTR_PD;
    } else {
        if attr.srq.is_null() && !cid.srq.is_null() {
            attr.srq = cid.srq as _;
        }
        let recv = if attr.srq.is_null() && t != QpType::XrcIni { attr.cap.max_recv_wr } else { 0 };
        if attr.send_cq.is_null() || (recv > 0 && attr.recv_cq.is_null()) {
            create_cqs(
                cid,
                if attr.send_cq.is_null() { attr.cap.max_send_wr.max(1) } else { 0 },
                if attr.recv_cq.is_null() { recv } else { 0 },
            )?;
            lock(&i.st).own_cqs = true;
            if attr.send_cq.is_null() {
                attr.send_cq = cid.send_cq as _;
            }
            if attr.recv_cq.is_null() {
                attr.recv_cq = if cid.recv_cq.is_null() { cid.send_cq as _ } else { cid.recv_cq as _ };
            }
        }
    }
    // XRC QPs and QPs with creation flags (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, `mckey -l`) need
    // the extended call.
    let flags = attr.comp_mask & ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && attr.create_flags != 0;
    let qp = if t == QpType::XrcIni || t == QpType::XrcTgt || flags {
        let v = vctx(cid.verbs);
        // SAFETY: the context's create_qp_ex op with a filled attribute.
        unsafe { (*v).create_qp_ex.map(|f| f(cid.verbs, attr)) }.unwrap_or(std::ptr::null_mut())
    } else {
        let mut a = ffi::ibv_qp_init_attr {
            qp_context: attr.qp_context,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            srq: attr.srq,
            cap: attr.cap,
            qp_type: attr.qp_type,
            sq_sig_all: attr.sq_sig_all,
        };
        // SAFETY: libibverbs' create_qp on the PD of this context.
        let q = unsafe { (api().create_qp)(attr.pd, &mut a) };
        attr.cap = a.cap;
        q
    };
    if qp.is_null() {
        return Err(Errno(crate::last_errno()));
    }
    let init = (|| -> Result<(), Errno> {
        if t == QpType::Ud {
            // ucma_init_ud_qp: INIT with the CM's attributes, then RTR and RTS.
            let (mut a, m) = init_attr(i, QpState::Init)?;
            modify(qp, &mut a, m)?;
            let mut a = ffi::ibv_qp_attr { qp_state: ffi::IBV_QPS_RTR, ..Default::default() };
            modify(qp, &mut a, ffi::IBV_QP_STATE as c_int)?;
            let mut a = ffi::ibv_qp_attr { qp_state: ffi::IBV_QPS_RTS, sq_psn: 0, ..Default::default() };
            modify(qp, &mut a, (ffi::IBV_QP_STATE | ffi::IBV_QP_SQ_PSN) as c_int)
        } else {
            let (mut a, m) = init_attr(i, QpState::Init)?;
            modify(qp, &mut a, m)
        }
    })();
    if let Err(e) = init {
        // SAFETY: the QP just made.
        unsafe { (api().destroy_qp)(qp) };
        return Err(e);
    }
    cid.qp = qp as _;
    // librdmacm's init_ece: the local ECE becomes what ibv_query_ece gives for the new QP, and
    // that is EOPNOTSUPP here (as on rxe), so none: a REQ or REP of an ID with a QP carries no ECE.
    lock(&i.st).local_ece = (0, 0);
    if cid.pd.is_null() && !attr.pd.is_null() {
        // rdma_verbs.h's helpers (rdma_reg_msgs, ...) register on `id->pd`: the QP's.
        cid.pd = attr.pd as _;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut c::rdma_cm_id, attr: *mut ffi::ibv_qp_init_attr_ex) -> c_int {
    minus1_call(|| {
        let a = crate::nonnull(attr)?;
        create_qp_inner(id, a)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut c::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    qp_init_attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    minus1_call(|| {
        let q = crate::nonnull(qp_init_attr)?;
        let mut a = ffi::ibv_qp_init_attr_ex {
            qp_context: q.qp_context,
            send_cq: q.send_cq,
            recv_cq: q.recv_cq,
            srq: q.srq,
            cap: q.cap,
            qp_type: q.qp_type,
            sq_sig_all: q.sq_sig_all,
            comp_mask: if pd.is_null() { 0 } else { ffi::IBV_QP_INIT_ATTR_PD },
            pd,
            ..Default::default()
        };
        create_qp_inner(id, &mut a)?;
        q.cap = a.cap;
        q.send_cq = a.send_cq;
        q.recv_cq = a.recv_cq;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut c::rdma_cm_id) {
    let _ = crate::guarded(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        if !cid.qp.is_null() {
            // SAFETY: the ID's QP.
            unsafe { (api().destroy_qp)(cid.qp as _) };
            cid.qp = std::ptr::null_mut();
        }
        if lock(&i.st).own_cqs {
            destroy_cqs(cid);
            lock(&i.st).own_cqs = false;
        }
        Ok(())
    });
}

fn conn_param_in(i: &Id, cid: &c::rdma_cm_id, p: *mut c::rdma_conn_param, passive: bool) -> Result<ConnParam, Errno> {
    let cma = cma()?;
    let dev = cma.dev_by_verbs(cid.verbs).ok_or(EINVAL)?;
    let st = lock(&i.st);
    let (max_rr, max_id) = if passive {
        (st.responder_resources.min(dev.max_rd_atom), st.initiator_depth.min(dev.max_init_rd_atom))
    } else {
        (dev.max_rd_atom, dev.max_init_rd_atom)
    };
    // librdmacm's ucma_copy_ece_param_to_kern_req / _rep: a REQ carries this side's ECE; a REP
    // answers with the vendor the REQ named and this side's options.
    let ece = if passive {
        Ece { vendor_id: st.remote_ece.0, attr_mod: st.local_ece.1 }
    } else {
        Ece { vendor_id: st.local_ece.0, attr_mod: st.local_ece.1 }
    };
    let qp = cid.qp as *mut ffi::ibv_qp;
    // SAFETY: the ID's QP, when it has one.
    let (qpn, srq) = if qp.is_null() { (0, false) } else { unsafe { ((*qp).qp_num, !(*qp).srq.is_null()) } };
    if p.is_null() {
        // A NULL conn_param: retry and RNR retry 7, depths at the most the device allows.
        return Ok(ConnParam {
            private_data: vec![],
            responder_resources: max_rr,
            initiator_depth: max_id,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq,
            qp_num: qpn,
            ece,
            qkey: 0,
        });
    }
    // SAFETY: the caller's conn_param.
    let p = unsafe { &*p };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        vec![]
    } else {
        // SAFETY: the caller's private data of the length it gives.
        unsafe { std::slice::from_raw_parts(p.private_data as *const u8, usize::from(p.private_data_len)).to_vec() }
    };
    Ok(ConnParam {
        private_data,
        responder_resources: p.responder_resources.min(max_rr),
        initiator_depth: p.initiator_depth.min(max_id),
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry_count.min(7),
        srq: if qp.is_null() { p.srq != 0 } else { srq },
        qp_num: if qp.is_null() { p.qp_num } else { qpn },
        ece,
        qkey: 0,
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut c::rdma_cm_id, conn_param: *mut c::rdma_conn_param) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        if !lock(&i.st).route_resolved {
            return Err(EINVAL);
        }
        let param = conn_param_in(i, cid, conn_param, false)?;
        // A UD ID connects through SIDR (180 bytes of its private data are the consumer's), the
        // others through a REQ (56).
        let max = if lock(&i.st).qp_type == QpType::Ud {
            softrdma_engine::cm::SIDR_REQ_USER_DATA_LEN
        } else {
            softrdma_engine::cm::REQ_USER_DATA_LEN
        };
        if param.private_data.len() > max {
            return Err(EINVAL);
        }
        let p = first(&lock(&i.st))?;
        if let Some(t) = lock(&i.st).ack_timeout {
            cm_call(&p.dev, &Request::CmSetAckTimeout { id: p.id, timeout: t }, &[])?;
        }
        cm_call(&p.dev, &Request::CmConnect { id: p.id, param }, &[])?;
        complete(id)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut c::rdma_cm_id, backlog: c_int) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        let cma = cma()?;
        if lock(&i.st).bound.is_none() {
            // librdmacm/kernel: listening on an unbound ID binds it to the wildcard first.
            bind_inner(i, cid, SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))?;
        }
        let mut st = lock(&i.st);
        let bound = st.bound.ok_or(EINVAL)?;
        let devs: Vec<Arc<CmDev>> = if unattached(cma, bound.ip()) {
            // A wildcard listener hears REQs on every device (and on each started later:
            // device_added); so does one bound to a loopback address (cma_listen_on_all), which
            // matches only REQs for that address.
            cma.devs()
        } else {
            vec![cma.dev_by_addr(bound.ip()).ok_or(Errno(libc::EADDRNOTAVAIL))?]
        };
        let b = backlog.max(0) as u32;
        for d in &devs {
            listen_on(i, &mut st, d, bound, b)?;
        }
        st.listening = true;
        st.backlog = b;
        if devs.len() == 1 {
            cid.verbs = devs[0].verbs;
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut c::rdma_cm_id, conn_param: *mut c::rdma_conn_param) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        let param = conn_param_in(i, cid, conn_param, true)?;
        let ud = lock(&i.st).qp_type == QpType::Ud;
        let max = if ud {
            softrdma_engine::wire::SIDR_REP_PRIVATE_DATA_LEN
        } else {
            softrdma_engine::wire::REP_PRIVATE_DATA_LEN
        };
        if param.private_data.len() > max {
            return Err(EINVAL);
        }
        let p = first(&lock(&i.st))?;
        let qp = cid.qp as *mut ffi::ibv_qp;
        // A UD QP is in RTS from rdma_create_qp on (ucma_init_ud_qp); accepting answers the
        // SIDR_REQ with its number.
        if !qp.is_null() && !ud {
            if let Err(e) = qp_to_rts(i, qp, Some((param.responder_resources, param.initiator_depth))) {
                let _ = cm_call(&p.dev, &Request::CmReject { id: p.id, private_data: vec![], reason: 28 }, &[]);
                return Err(e);
            }
        }
        cm_call(&p.dev, &Request::CmAccept { id: p.id, param }, &[])?;
        complete(id)?;
        Ok(0)
    })
}

fn reject_with(id: *mut c::rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> Result<(), Errno> {
    let i = id_of(id)?;
    let p = first(&lock(&i.st))?;
    let private_data = if data.is_null() || len == 0 {
        vec![]
    } else {
        // SAFETY: the caller's private data of the length it gives.
        unsafe { std::slice::from_raw_parts(data as *const u8, usize::from(len)).to_vec() }
    };
    cm_call(&p.dev, &Request::CmReject { id: p.id, private_data, reason }, &[])?;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut c::rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    minus1_call(|| {
        reject_with(id, private_data, private_data_len, softrdma_engine::cm::reject::CONSUMER_DEFINED)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut c::rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    minus1_call(|| {
        reject_with(id, private_data, private_data_len, softrdma_engine::cm::reject::VENDOR_OPTION_NOT_SUPPORTED)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut c::rdma_cm_id, ece: *mut ffi::ibv_ece) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let e = crate::nonnull(ece)?;
        // librdmacm: EINVAL once the ID has a QP, for vendor 0 and for any comp_mask.
        if !id_mut(id)?.qp.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
            return Err(EINVAL);
        }
        lock(&i.st).local_ece = (e.vendor_id, e.options);
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut c::rdma_cm_id, ece: *mut ffi::ibv_ece) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let e = crate::nonnull(ece)?;
        if !id_mut(id)?.qp.is_null() {
            return Err(EINVAL);
        }
        let (v, o) = lock(&i.st).remote_ece;
        e.vendor_id = v;
        e.options = o;
        e.comp_mask = 0;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut c::rdma_cm_id, event: ffi::ibv_event_type) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        if event == ffi::IBV_EVENT_COMM_EST {
            let p = first(&lock(&i.st))?;
            cm_call(&p.dev, &Request::CmNotify(p.id), &[])?;
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut c::rdma_cm_id) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        qp_to_err(cid.qp as _);
        let p = first(&lock(&i.st))?;
        cm_call(&p.dev, &Request::CmDisconnect(p.id), &[])?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut c::rdma_cm_id) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        if !cid.qp.is_null() {
            return Err(EINVAL);
        }
        let p = first(&lock(&i.st))?;
        cm_call(&p.dev, &Request::CmEstablish(p.id), &[])?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut c::rdma_cm_id,
    qp_attr: *mut ffi::ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let a = crate::nonnull(qp_attr)?;
        let m = crate::nonnull(qp_attr_mask)?;
        let state = QpState::from_ibv(a.qp_state).ok_or(EINVAL)?;
        let (attr, mask) = init_attr(i, state)?;
        *a = attr;
        *m = mask;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut c::rdma_cm_id, channel: *mut c::rdma_event_channel) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        let mut st = lock(&i.st);
        let (sync, own) = if channel.is_null() { (true, Some(Channel::new()?)) } else { (false, None) };
        let new_ptr = match &own {
            Some(ch) => &ch.c as *const c::rdma_event_channel as *mut c::rdma_event_channel,
            None => channel,
        };
        let ch = channel_of(new_ptr)?;
        for p in &st.on {
            let h = ch.on(&p.dev)?;
            cm_call(&p.dev, &Request::CmMigrate { id: p.id, channel: h, user: st.handle }, &[])?;
        }
        cid.channel = new_ptr;
        st.sync = sync;
        st.own_channel = own;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut c::rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        if optval.is_null() {
            return Err(EINVAL);
        }
        let u8v = || -> Result<u8, Errno> {
            if optlen < 1 {
                return Err(EINVAL);
            }
            // SAFETY: at least one byte.
            Ok(unsafe { *(optval as *const u8) })
        };
        let intv = || -> Result<c_int, Errno> {
            if optlen < std::mem::size_of::<c_int>() {
                return Err(EINVAL);
            }
            // SAFETY: an int.
            Ok(unsafe { std::ptr::read_unaligned(optval as *const c_int) })
        };
        let mut st = lock(&i.st);
        match (level as u32, optname as u32) {
            (c::RDMA_OPTION_ID, c::RDMA_OPTION_ID_TOS) => st.tos = u8v()?,
            (c::RDMA_OPTION_ID, c::RDMA_OPTION_ID_REUSEADDR) => st.reuseaddr = intv()? != 0,
            (c::RDMA_OPTION_ID, c::RDMA_OPTION_ID_AFONLY) => st.afonly = intv()? != 0,
            (c::RDMA_OPTION_ID, c::RDMA_OPTION_ID_ACK_TIMEOUT) => {
                let t = u8v()?;
                if t > 31 {
                    return Err(EINVAL);
                }
                st.ack_timeout = Some(t);
            }
            // A path record given by the application: on RoCE the kernel takes it as the route
            // (rdma_set_ib_path, allowed once the address is resolved) and reports
            // ROUTE_RESOLVED (ucma_set_ib_path).
            (c::RDMA_OPTION_IB, c::RDMA_OPTION_IB_PATH) => {
                // SAFETY: the caller gives optlen readable bytes at optval.
                let data = unsafe { std::slice::from_raw_parts(optval as *const u8, optlen) };
                let route = route_from_path_data(data)?;
                if !st.addr_resolved || st.route_resolved {
                    return Err(EINVAL);
                }
                let p = first(&st)?;
                cm_call(&p.dev, &Request::CmSetRoute { id: p.id, route: route.clone() }, &[])?;
                let cid = id_mut(id)?;
                let mut rec = Box::new(path_record_of(&route));
                cid.route.path_rec = &mut *rec as *mut c::ibv_sa_path_rec;
                cid.route.num_paths = 1;
                st.path = Some(rec);
                st.route_resolved = true;
                post_local(i, &st, ROUTE_RESOLVED, 0)?;
                drop(st);
                complete(id)?;
                return Ok(0);
            }
            _ => return Err(Errno(libc::ENOSYS)),
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut c::rdma_cm_id) -> u16 {
    crate::guarded(|| {
        let i = id_of(id)?;
        Ok(lock(&i.st).bound.map_or(0, |a| a.port()).to_be())
    })
    .unwrap_or(0)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut c::rdma_cm_id) -> u16 {
    crate::guarded(|| {
        let i = id_of(id)?;
        Ok(lock(&i.st).remote.map_or(0, |a| a.port()).to_be())
    })
    .unwrap_or(0)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ffi::ibv_context {
    ptr_call(|| {
        let cma = match cma() {
            Ok(c) => c,
            Err(e) => {
                if !num_devices.is_null() {
                    // SAFETY: the caller's int.
                    unsafe { *num_devices = 0 };
                }
                return Err(e);
            }
        };
        let devs = cma.devs();
        let n = devs.len();
        // SAFETY: a NULL-terminated array the caller frees with rdma_free_devices.
        let list =
            unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ffi::ibv_context>()) } as *mut *mut ffi::ibv_context;
        if list.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        for (k, d) in devs.iter().enumerate() {
            // SAFETY: n + 1 entries.
            unsafe { *list.add(k) = d.verbs };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's int.
            unsafe { *num_devices = n as c_int };
        }
        Ok(list)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ffi::ibv_context) {
    // SAFETY: from rdma_get_devices (calloc).
    unsafe { libc::free(list as *mut c_void) };
}

fn deliver(rec: CmRecord) -> Result<Option<Box<Event>>, Errno> {
    let cma = cma()?;
    let ids = lock(&cma.ids);
    let mut listen: *mut Id = std::ptr::null_mut();
    let target: *mut Id = if rec.event == CONNECT_REQUEST {
        let Some(&l) = ids.get(&rec.listen_user) else { return Ok(None) };
        listen = l as *mut Id;
        std::ptr::null_mut()
    } else {
        match ids.get(&rec.user) {
            Some(&p) => p as *mut Id,
            None => return Ok(None),
        }
    };
    drop(ids);
    // SAFETY: rdma_cm_event is integers, raw pointers and a union of parameter structs of the
    // same: all-zero bytes are a valid value (NULL pointers, zero lengths).
    let mut ev: c::rdma_cm_event = unsafe { std::mem::zeroed() };
    ev.event = rec.event as _;
    ev.status = rec.status;
    let mut private = rec.param.private_data.clone();
    let idp: *mut c::rdma_cm_id = if rec.event == CONNECT_REQUEST {
        // SAFETY: a live listener from the registry.
        let l = unsafe { &*listen };
        let lst = lock(&l.st);
        let dev = cma.dev_by_name(&rec.device).ok_or(Errno(libc::ENODEV))?;
        let (ps, t, ctx) = (u32::from(lst.ps), lst.qp_type, l.c.context);
        let listener_sync = lst.sync;
        drop(lst);
        let t = match (t, ps as u16) {
            (QpType::XrcIni, _) | (QpType::XrcTgt, _) => QpType::XrcTgt,
            (t, _) => t,
        };
        let np = new_id(l.c.channel, ctx, ps, t)?;
        let ni = id_of(np)?;
        let ncid = id_mut(np)?;
        {
            let mut st = lock(&ni.st);
            st.on.push(Placement { dev: dev.clone(), id: rec.id });
            st.bound = rec.local;
            st.remote = rec.remote;
            st.addr_resolved = true;
            st.route_resolved = true;
            // librdmacm: what this side may offer is bounded by what the peer asked.
            st.responder_resources = rec.param.initiator_depth;
            st.initiator_depth = rec.param.responder_resources;
            // ucma_process_conn_req: the REQ's ECE.
            st.remote_ece = (rec.param.ece.vendor_id, rec.param.ece.attr_mod);
            let ch = channel_of(l.c.channel)?.on(&dev)?;
            cm_call(&dev, &Request::CmMigrate { id: rec.id, channel: ch, user: st.handle }, &[])?;
            // The new ID's route is the path its REQ carried (cma_ib_new_conn_id), else (a
            // device that did not send it) the RoCE path of the addresses.
            let path = match (&rec.route, rec.local, rec.remote) {
                (Some(r), _, _) => Some(path_record_of(r)),
                (None, Some(lo), Some(re)) => Some(path_record(lo, re, 0, dev.conn.info.active_mtu as u8)),
                _ => None,
            };
            if let Some(p) = path {
                let mut rec_path = Box::new(p);
                ncid.route.path_rec = &mut *rec_path as *mut _;
                ncid.route.num_paths = 1;
                st.path = Some(rec_path);
            }
        }
        ncid.verbs = dev.verbs;
        if ncid.pd.is_null() {
            ncid.pd = default_pd(&dev)? as _;
        }
        set_route_addrs(ncid, rec.local, rec.remote);
        if listener_sync {
            // A synchronous listener's requests get their own channel (rdma_get_request).
            // SAFETY: the new ID.
            unsafe { rdma_migrate_id(np, std::ptr::null_mut()) };
        }
        ev.listen_id = listen as *mut c::rdma_cm_id;
        np
    } else {
        target as *mut c::rdma_cm_id
    };
    let i = id_of(idp)?;
    let cid = id_mut(idp)?;
    match rec.event {
        CONNECT_RESPONSE => {
            let qp = cid.qp as *mut ffi::ibv_qp;
            let rep_ece = rec.param.ece;
            if qp.is_null() {
                lock(&i.st).remote_ece = (rep_ece.vendor_id, rep_ece.attr_mod);
            } else if rep_ece.vendor_id != 0 && rep_ece.vendor_id != lock(&i.st).local_ece.0 {
                // ucma_process_conn_resp_ece: a REP naming another vendor than the REQ did is a
                // broken ECE handshake: the QP to ERROR and CONNECT_ERROR (status -1, EINVAL); no
                // RTU goes out, and destroying the ID rejects the REP.
                qp_to_err(qp);
                ev.event = CONNECT_ERROR as _;
                ev.status = -1;
            } else {
                lock(&i.st).remote_ece.0 = rep_ece.vendor_id;
                // ucma_process_conn_resp: the QP to RTR and RTS, then RTU; the program sees
                // ESTABLISHED.
                let p = first(&lock(&i.st))?;
                match qp_to_rts(i, qp, None) {
                    Ok(()) => {
                        cm_call(&p.dev, &Request::CmEstablish(p.id), &[])?;
                        ev.event = ESTABLISHED as _;
                    }
                    Err(e) => {
                        let _ = cm_call(&p.dev, &Request::CmReject { id: p.id, private_data: vec![], reason: 28 }, &[]);
                        ev.event = CONNECT_ERROR as _;
                        ev.status = -e.0;
                    }
                }
            }
        }
        REJECTED | UNREACHABLE | CONNECT_ERROR if lock(&i.st).qp_type != QpType::Ud => qp_to_err(cid.qp as _),
        DEVICE_REMOVAL => {}
        _ => {}
    }
    let ud = lock(&i.st).qp_type == QpType::Ud;
    let mut mc_context = None;
    if rec.event == MULTICAST_JOIN {
        // ucma_copy_ud_event + ucma_process_join: the group's QPN and Q_Key, the address vector
        // toward the group (the MGID ::ffff:G, hop limit 64), the join's context as the private
        // data; a full member's QP is attached to the group here.
        let mut st = lock(&i.st);
        let Some(mc) = st.mcs.iter_mut().find(|m| m.handle == rec.listen_user) else { return Ok(None) };
        mc_context = Some(mc.context);
        let group = mc.group;
        let mgid = softrdma_device::proto::gid_of(group);
        let mut ah = ffi::ibv_ah_attr { is_global: 1, port_num: 1, ..Default::default() };
        ah.grh.dgid.raw = mgid;
        ah.grh.hop_limit = 64;
        ev.param.ud.ah_attr = ah;
        ev.param.ud.qp_num = rec.param.qp_num;
        ev.param.ud.qkey = rec.param.qkey;
        let qp = cid.qp as *mut ffi::ibv_qp;
        if !qp.is_null() && !mc.send_only {
            let gid = ffi::ibv_gid { raw: mgid };
            // SAFETY: libibverbs on the ID's QP.
            let r = unsafe { (api().attach_mcast)(qp, &gid, 0) };
            if r == 0 {
                mc.attached = true;
            } else {
                ev.event = MULTICAST_ERROR as _;
                ev.status = -1;
                set_errno(r);
            }
        }
    } else if ud {
        // ucma_copy_ud_event: the peer's QPN and Q_Key (ESTABLISHED after SIDR) and the address
        // vector toward it; a CONNECT_REQUEST carries the private data only (cma_ib_req_handler).
        ev.param.ud.qp_num = rec.param.qp_num;
        ev.param.ud.qkey = rec.param.qkey;
        if rec.event == ESTABLISHED {
            if let (Some(lo), Some(re)) = (rec.local, rec.remote) {
                ev.param.ud.ah_attr = ud_ah_attr(lo, re, lock(&i.st).tos);
            }
        }
    } else if matches!(rec.event, CONNECT_REQUEST | CONNECT_RESPONSE | ESTABLISHED | REJECTED) || !private.is_empty() {
        ev.param.conn.responder_resources = rec.param.responder_resources;
        ev.param.conn.initiator_depth = rec.param.initiator_depth;
        ev.param.conn.flow_control = u8::from(rec.param.flow_control);
        ev.param.conn.retry_count = rec.param.retry_count;
        ev.param.conn.rnr_retry_count = rec.param.rnr_retry_count;
        ev.param.conn.srq = u8::from(rec.param.srq);
        ev.param.conn.qp_num = rec.param.qp_num;
    }
    if private.is_empty() {
        private.push(0);
    }
    let mut e = Box::new(Event { c: ev, private });
    let len = if rec.param.private_data.is_empty() { 0 } else { e.private.len() };
    e.c.param.conn.private_data_len = len.min(255) as u8;
    e.c.param.conn.private_data = if len == 0 { std::ptr::null() } else { e.private.as_ptr() as *const c_void };
    if let Some(ctx) = mc_context {
        e.c.param.ud.private_data = ctx as *const c_void;
    }
    e.c.id = idp;
    *lock(&i.outstanding) += 1;
    Ok(Some(e))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut c::rdma_event_channel,
    event: *mut *mut c::rdma_cm_event,
) -> c_int {
    minus1_call(|| {
        let ch = channel_of(channel)?;
        if event.is_null() {
            return Err(EINVAL);
        }
        ch.inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        struct Leave<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let _leave = Leave(&ch.inside);
        loop {
            let rec = ch.read()?;
            if let Some(e) = deliver(rec)? {
                // SAFETY: checked non-null.
                unsafe { *event = Box::into_raw(e) as *mut c::rdma_cm_event };
                return Ok(0);
            }
            // An event for an ID already destroyed: nobody to give it to.
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut c::rdma_cm_event) -> c_int {
    minus1_call(|| {
        if event.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: an event from rdma_get_cm_event, given back once.
        let e = unsafe { Box::from_raw(event as *mut Event) };
        if let Ok(i) = id_of(e.c.id) {
            let mut n = lock(&i.outstanding);
            *n = n.saturating_sub(1);
            i.acked.notify_all();
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(listen: *mut c::rdma_cm_id, id: *mut *mut c::rdma_cm_id) -> c_int {
    minus1_call(|| {
        let l = id_of(listen)?;
        if id.is_null() || !lock(&l.st).sync {
            return Err(EINVAL);
        }
        let lc = id_mut(listen)?;
        let mut ev = std::ptr::null_mut();
        // SAFETY: the listener's own channel.
        if unsafe { rdma_get_cm_event(lc.channel, &mut ev) } != 0 {
            return Err(Errno(crate::last_errno()));
        }
        // SAFETY: a valid event.
        let e = unsafe { &mut *ev };
        if e.status != 0 {
            let s = e.status;
            // SAFETY: give it back.
            unsafe { rdma_ack_cm_event(ev) };
            return Err(Errno(if s < 0 { -s } else { s }));
        }
        if e.event != CONNECT_REQUEST as _ {
            // SAFETY: give it back.
            unsafe { rdma_ack_cm_event(ev) };
            return Err(EINVAL);
        }
        let nid = e.id;
        let (qp_init, pd) = {
            let st = lock(&l.st);
            (st.ep_qp_init, st.ep_pd)
        };
        if let Some(mut qa) = qp_init {
            let ncid = id_mut(nid)?;
            if !pd.is_null() {
                ncid.pd = pd as _;
            }
            // SAFETY: the new ID with the listener's QP attributes (rdma_create_ep's).
            if unsafe { rdma_create_qp(nid, pd, &mut qa) } != 0 {
                let err = crate::last_errno();
                // SAFETY: give it back, then destroy the ID.
                unsafe {
                    rdma_ack_cm_event(ev);
                    rdma_destroy_id(nid);
                }
                return Err(Errno(err));
            }
        }
        let ncid = id_mut(nid)?;
        ncid.event = ev;
        // SAFETY: checked non-null.
        unsafe { *id = nid };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut c::rdma_cm_id,
    res: *mut c::rdma_addrinfo,
    pd: *mut ffi::ibv_pd,
    qp_init_attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    minus1_call(|| {
        if id.is_null() || res.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: the caller's addrinfo.
        let r = unsafe { &*res };
        // librdmacm: the ID and its QP take the addrinfo's QP type.
        let qp_type = r.ai_qp_type as u32;
        if !qp_init_attr.is_null() {
            // SAFETY: the caller's attributes.
            unsafe { (*qp_init_attr).qp_type = r.ai_qp_type as _ };
        }
        let p = create_id_typed(std::ptr::null_mut(), std::ptr::null_mut(), r.ai_port_space as u32, qp_type)?;
        let i = id_of(p)?;
        let fail = |e: Errno| {
            // SAFETY: the ID just made.
            unsafe { rdma_destroy_id(p) };
            e
        };
        if r.ai_flags as u32 & c::RAI_PASSIVE != 0 {
            let src = sockaddr_from(r.ai_src_addr as *const libc::sockaddr).ok_or(EINVAL).map_err(fail)?;
            bind_inner(i, id_mut(p)?, src).map_err(fail)?;
            let mut st = lock(&i.st);
            if !qp_init_attr.is_null() {
                // SAFETY: the caller's attributes, kept for each request.
                st.ep_qp_init = Some(unsafe { *qp_init_attr });
            }
            st.ep_pd = pd;
        } else {
            // SAFETY: resolve with the addrinfo's addresses (2000 ms, as librdmacm).
            let rc = unsafe { rdma_resolve_addr(p, r.ai_src_addr as _, r.ai_dst_addr as _, 2000) };
            if rc != 0 {
                return Err(fail(Errno(crate::last_errno())));
            }
            // SAFETY: the resolved ID.
            if unsafe { rdma_resolve_route(p, 2000) } != 0 {
                return Err(fail(Errno(crate::last_errno())));
            }
            if !qp_init_attr.is_null() {
                if !pd.is_null() {
                    id_mut(p)?.pd = pd as _;
                }
                // SAFETY: the caller's attributes.
                if unsafe { rdma_create_qp(p, pd, qp_init_attr) } != 0 {
                    return Err(fail(Errno(crate::last_errno())));
                }
            }
        }
        // SAFETY: checked non-null.
        unsafe { *id = p };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut c::rdma_cm_id) {
    let _ = crate::guarded(|| {
        let i = id_of(id)?;
        // SAFETY: the endpoint's QP and SRQ, then the ID.
        unsafe {
            rdma_destroy_qp(id);
            if lock(&i.st).own_srq {
                rdma_destroy_srq(id);
            }
            rdma_destroy_id(id);
        }
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(id: *mut c::rdma_cm_id, attr: *mut ffi::ibv_srq_init_attr_ex) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        let a = crate::nonnull(attr)?;
        let cma = cma()?;
        let dev = cma.dev_by_verbs(cid.verbs).ok_or(EINVAL)?;
        if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.pd = if cid.pd.is_null() { default_pd(&dev)? } else { cid.pd as _ };
            a.comp_mask |= ffi::IBV_SRQ_INIT_ATTR_PD;
        }
        let srq = if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type == ffi::IBV_SRQT_XRC {
            if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
                a.xrcd = get_xrcd(i, cid)?;
                a.comp_mask |= ffi::IBV_SRQ_INIT_ATTR_XRCD;
            }
            if a.comp_mask & ffi::IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
                create_cqs(cid, 0, a.attr.max_wr.max(1))?;
                lock(&i.st).own_cqs = true;
                a.cq = cid.recv_cq as _;
                a.comp_mask |= ffi::IBV_SRQ_INIT_ATTR_CQ;
            }
            let v = vctx(cid.verbs);
            // SAFETY: the context's create_srq_ex op.
            unsafe { (*v).create_srq_ex.map(|f| f(cid.verbs, a)) }.unwrap_or(std::ptr::null_mut())
        } else {
            let mut b = ffi::ibv_srq_init_attr { srq_context: a.srq_context, attr: a.attr };
            // SAFETY: libibverbs' create_srq.
            let s = unsafe { (api().create_srq)(a.pd, &mut b) };
            a.attr = b.attr;
            s
        };
        if srq.is_null() {
            return Err(Errno(crate::last_errno()));
        }
        cid.srq = srq as _;
        lock(&i.st).own_srq = true;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut c::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_srq_init_attr,
) -> c_int {
    minus1_call(|| {
        let a = crate::nonnull(attr)?;
        let i = id_of(id)?;
        let xrc = lock(&i.st).qp_type == QpType::XrcTgt;
        let mut ex = ffi::ibv_srq_init_attr_ex {
            srq_context: a.srq_context,
            attr: a.attr,
            comp_mask: ffi::IBV_SRQ_INIT_ATTR_TYPE | if pd.is_null() { 0 } else { ffi::IBV_SRQ_INIT_ATTR_PD },
            srq_type: if xrc { ffi::IBV_SRQT_XRC } else { ffi::IBV_SRQT_BASIC },
            pd,
            ..Default::default()
        };
        // SAFETY: forwards to the _ex form.
        if unsafe { rdma_create_srq_ex(id, &mut ex) } != 0 {
            return Err(Errno(crate::last_errno()));
        }
        a.attr = ex.attr;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut c::rdma_cm_id) {
    let _ = crate::guarded(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        if !cid.srq.is_null() {
            // SAFETY: the ID's SRQ.
            unsafe { (api().destroy_srq)(cid.srq as _) };
            cid.srq = std::ptr::null_mut();
        }
        let mut st = lock(&i.st);
        st.own_srq = false;
        if st.own_cqs && cid.qp.is_null() {
            destroy_cqs(cid);
            st.own_cqs = false;
        }
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut c::rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    minus1_call(|| {
        join(id, addr, false, context)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut c::rdma_cm_id,
    attr: *mut c::rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    minus1_call(|| {
        let a = crate::nonnull(attr)?;
        // librdmacm's checks, in its order.
        if a.comp_mask >= c::RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(Errno(libc::ENOTSUP));
        }
        if a.comp_mask & c::RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || a.comp_mask & c::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || a.join_flags >= c::RDMA_MC_JOIN_FLAG_RESERVED
        {
            return Err(EINVAL);
        }
        join(id, a.addr as *mut libc::sockaddr, a.join_flags == c::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, context)?;
        Ok(0)
    })
}

/// rdma_join_multicast2: the ID's device joins the group; RDMA_CM_EVENT_MULTICAST_JOIN follows on
/// the ID's channel, where the QP is attached (ucma_process_join).
fn join(id: *mut c::rdma_cm_id, addr: *mut libc::sockaddr, send_only: bool, context: *mut c_void) -> Result<(), Errno> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let i = id_of(id)?;
    let group = sockaddr_from(addr).ok_or(EINVAL)?.ip();
    let mut st = lock(&i.st);
    // The kernel's rdma_join_multicast: a UD ID whose address is bound or resolved.
    if st.qp_type != QpType::Ud || st.bound.is_none() {
        return Err(EINVAL);
    }
    let p = first(&st)?;
    let handle = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    st.mcs.push(Mc { handle, group, context, send_only, attached: false });
    drop(st);
    if let Err(e) = cm_call(&p.dev, &Request::CmJoin { id: p.id, group, send_only, user: handle }, &[]) {
        lock(&i.st).mcs.retain(|m| m.handle != handle);
        return Err(e);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut c::rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let group = sockaddr_from(addr).ok_or(EINVAL)?.ip();
        let mut st = lock(&i.st);
        // librdmacm: a group this ID did not join is EADDRNOTAVAIL.
        let k = st.mcs.iter().position(|m| m.group == group).ok_or(Errno(libc::EADDRNOTAVAIL))?;
        let mc = st.mcs.remove(k);
        let p = first(&st)?;
        drop(st);
        let qp = id_mut(id)?.qp as *mut ffi::ibv_qp;
        if mc.attached && !qp.is_null() {
            let gid = ffi::ibv_gid { raw: softrdma_device::proto::gid_of(group) };
            // SAFETY: libibverbs on the ID's QP.
            unsafe { (api().detach_mcast)(qp, &gid, 0) };
        }
        cm_call(&p.dev, &Request::CmLeave { id: p.id, group }, &[])?;
        Ok(0)
    })
}
