//! Connections: `rdma_connect`, `rdma_listen`, `rdma_accept`, `rdma_reject`, ECE, `rdma_notify`,
//! `rdma_disconnect`, `rdma_establish`, and a synchronous listener's `rdma_get_request`.

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use softrdma_device::proto::Request;
use softrdma_engine::cm::{ConnParam, Ece};
use softrdma_engine::verbs::QpType;

use super::addr::{bind_inner, unattached};
use super::event::CONNECT_REQUEST;
use super::event::{rdma_ack_cm_event, rdma_get_cm_event};
use super::hotplug::listen_on;
use super::id::rdma_destroy_id;
use super::id::{complete, first, id_mut};
use super::qp::rdma_create_qp;
use super::qp::{qp_to_err, qp_to_rts};
use super::{cm_call, cma, id_of, lock, CmDev, Id};
use crate::cma_ffi as c;
use crate::{ffi, minus1_call, Errno, EINVAL};

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
