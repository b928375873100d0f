//! rdma_cm IDs: creating, destroying and migrating them, their options and ports, `rdma_create_ep`,
//! and the helpers every other call uses (an ID's placement on a device, its local events, the
//! wait of a synchronous ID). Each call behaves as librdmacm 44 over the kernel's ucma does.

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use softrdma_device::proto::{CmRecord, Request, Response};
use softrdma_engine::cm::{ConnParam, PS_IB, PS_IPOIB, PS_TCP, PS_UDP};
use softrdma_engine::verbs::QpType;

use super::addr::{bind_inner, path_record_of, route_from_path_data};
use super::addr::{rdma_resolve_addr, rdma_resolve_route};
use super::event::{rdma_ack_cm_event, rdma_get_cm_event};
use super::event::{REJECTED, ROUTE_RESOLVED};
use super::qp::{rdma_create_qp, rdma_destroy_qp, rdma_destroy_srq};
use super::{
    channel_of, cm_call, cma, id_of, lock, sockaddr_from, sockaddr_to, Channel, CmDev, Id, IdState, Placement,
};
use crate::cma_ffi as c;
use crate::{ffi, minus1_call, Errno, EINVAL};

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

pub(super) fn new_id(
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

pub(super) fn id_mut<'a>(p: *mut c::rdma_cm_id) -> Result<&'a mut c::rdma_cm_id, Errno> {
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
pub(super) fn place(id: &Id, st: &mut IdState, dev: &Arc<CmDev>) -> Result<Placement, Errno> {
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

pub(super) fn first(st: &IdState) -> Result<Placement, Errno> {
    st.on.first().cloned().ok_or(EINVAL)
}

/// Writes the ID's addresses into `id->route.addr`.
pub(super) fn set_route_addrs(cid: &mut c::rdma_cm_id, src: Option<SocketAddr>, dst: Option<SocketAddr>) {
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

pub(super) fn post_local(id: &Id, st: &IdState, event: u32, status: i32) -> Result<(), Errno> {
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

/// The route of the ID `p` is the path record `rec`: the ID's route points to it (the ID's
/// state `st` keeps it), ROUTE_RESOLVED is posted, and, the state unlocked, a synchronous ID
/// waits for the event ([`complete`]).
pub(super) fn route_resolved(
    p: *mut c::rdma_cm_id,
    id: &Id,
    mut st: MutexGuard<'_, IdState>,
    mut rec: Box<c::ibv_sa_path_rec>,
) -> Result<(), Errno> {
    let cid = id_mut(p)?;
    cid.route.path_rec = &mut *rec as *mut c::ibv_sa_path_rec;
    cid.route.num_paths = 1;
    st.path = Some(rec);
    st.route_resolved = true;
    post_local(id, &st, ROUTE_RESOLVED, 0)?;
    drop(st);
    complete(p)
}

/// librdmacm's `ucma_complete`: a synchronous ID waits for its event; a failed one fails the call.
pub(super) fn complete(p: *mut c::rdma_cm_id) -> Result<(), Errno> {
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
                route_resolved(id, i, st, Box::new(path_record_of(&route)))?;
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
