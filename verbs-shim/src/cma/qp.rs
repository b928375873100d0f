//! QPs, CQs and SRQs made through rdma_cm (`rdma_create_qp[_ex]`, `rdma_create_srq[_ex]`), their
//! moves through INIT/RTR/RTS as librdmacm's ucma_modify_qp_* make them, `rdma_init_qp_attr`.

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::{c_int, c_void};

use softrdma_device::proto::{Request, Response};
use softrdma_engine::cm::InitQpAttr;
use softrdma_engine::verbs::{QpState, QpType};

use super::id::{first, id_mut};
use super::{api, cm_call, cma, id_of, lock, CmDev, Id};
use crate::cma_ffi as c;
use crate::{ffi, minus1_call, Errno, EINVAL};

pub(super) fn default_pd(dev: &CmDev) -> Result<*mut ffi::ibv_pd, Errno> {
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
pub(super) fn qp_to_rts(i: &Id, qp: *mut ffi::ibv_qp, depths: Option<(u8, u8)>) -> Result<(), Errno> {
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

pub(super) fn qp_to_err(qp: *mut ffi::ibv_qp) {
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
