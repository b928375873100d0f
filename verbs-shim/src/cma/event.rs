//! Event channels and the events on them: `rdma_create_event_channel`, `rdma_get_cm_event` (a
//! device's CM record turned into librdmacm's event) and `rdma_ack_cm_event`.

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::{c_int, c_void};

use softrdma_device::proto::{CmRecord, Request};
use softrdma_engine::verbs::QpType;

use super::addr::{path_record, path_record_of, ud_ah_attr};
use super::id::rdma_migrate_id;
use super::id::{first, id_mut, new_id, set_route_addrs};
use super::qp::{default_pd, qp_to_err, qp_to_rts};
use super::{api, channel_of, cm_call, cma, id_of, lock, Channel, Event, Id, Placement};
use crate::cma_ffi as c;
use crate::{ffi, minus1_call, ptr_call, set_errno, Errno, EINVAL};

// enum rdma_cm_event_type
pub(super) const ADDR_RESOLVED: u32 = 0;
pub(super) const ADDR_ERROR: u32 = 1;
pub(super) const ROUTE_RESOLVED: u32 = 2;
pub(super) const ROUTE_ERROR: u32 = 3;
pub(super) const CONNECT_REQUEST: u32 = 4;
const CONNECT_RESPONSE: u32 = 5;
const CONNECT_ERROR: u32 = 6;
const UNREACHABLE: u32 = 7;
pub(super) const REJECTED: u32 = 8;
const ESTABLISHED: u32 = 9;
pub(super) const DEVICE_REMOVAL: u32 = 11;
const MULTICAST_JOIN: u32 = 12;
const MULTICAST_ERROR: u32 = 13;

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
