//! OFED 1.3-1.5's XRC verbs, which old MPI builds (Open MPI's openib XRC support, MVAPICH) were
//! written against, mapped onto the upstream objects: `struct ibv_xrc_domain` is an XRC domain
//! (the same file-shared domain `ibv_open_xrcd` gives), `ibv_create_xrc_srq` an XRC SRQ, an XRC
//! receive QP an XRC_RECV target QP, IBV_QPT_XRC (5) an XRC_SEND QP. They are exported from
//! libibverbs.so.1 under IBVERBS_1.1, where OFED's libibverbs had them; the declarations are in
//! `include/softrdma/ofed_xrc.h` (verbs-shim/include), installed next to the shim.
//!
//! Lifetimes, as OFED defined them:
//! - `ibv_create_xrc_rcv_qp` registers the caller; `ibv_reg_xrc_rcv_qp` registers another
//!   process (an `ibv_open_qp` handle here); the QP lives while any registered process does and
//!   goes when the last one unregisters or exits, whatever the device's `--xrc-tgt-lifetime`.
//! - `ibv_alloc_xrc_rcv_qp` (the kernel-owned receive QP of the seed, "make receiving XRC QP
//!   independent of any one user process"): created and moved RESET->INIT->RTR in the call, no
//!   user object (the QP number only), no destroy or query verb; it persists until the XRC
//!   domain's reference count reaches zero; its async events go to the device's log.
//!
//! Legacy structure layouts: OFED's `ibv_qp_init_attr` has `xrc_domain` after `sq_sig_all`; its
//! `ibv_srq` has `events_completed`, `xrc_srq_num`, `xrc_domain` and `xrc_cq` right after
//! `handle` (where upstream's mutex starts: the shim never uses that mutex); its
//! `ibv_send_wr.xrc_remote_srq_num` sits where upstream's `qp_type.xrc.remote_srqn` is; async
//! events of a registered receive QP carry IBV_XRC_QP_EVENT_FLAG and the QP number.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::Mutex;

use softrdma_device::verbs::{AttrMask, QueuePair, XrcDomain, XrcPolicy};
use softrdma_engine::device::AsyncEvent;

use crate::context::{ctx_of, lock, Ctx};
use crate::cq::cq_of;
use crate::ffi;
use crate::mem::{destroy_obj, open_domain, pd_of};
use crate::qp::{create, modify, new_srq, query_to_c, srq_attr, Create};
use crate::{errno_call, into_c, nonnull, ptr_call, Errno, EINVAL};

/// OFED's IBV_QPT_XRC: the sending XRC QP (upstream's XRC_SEND).
pub(crate) const IBV_QPT_XRC: ffi::ibv_qp_type = 5;

/// OFED's flag on the event type of an XRC receive QP's async event (the element is then the QP
/// number).
const IBV_XRC_QP_EVENT_FLAG: u32 = 0x8000_0000;

/// Upstream's number for a QP type: OFED's IBV_QPT_XRC is an XRC_SEND QP.
pub(crate) fn upstream_type(t: ffi::ibv_qp_type) -> ffi::ibv_qp_type {
    if t == IBV_QPT_XRC {
        ffi::IBV_QPT_XRC_SEND
    } else {
        t
    }
}

/// OFED's `struct ibv_xrc_domain`.
#[repr(C)]
pub(crate) struct XrcDomainC {
    context: *mut ffi::ibv_context,
    handle: u32,
}

/// OFED's `struct ibv_qp_init_attr`: upstream's with the XRC domain after `sq_sig_all`.
#[repr(C)]
pub(crate) struct QpInitAttr {
    base: ffi::ibv_qp_init_attr,
    pub(crate) xrc_domain: *mut c_void,
}

/// OFED 1.x's `struct ibv_srq` up to its XRC fields (its mutex and condition follow).
#[repr(C)]
struct SrqHead {
    context: *mut ffi::ibv_context,
    srq_context: *mut c_void,
    pd: *mut ffi::ibv_pd,
    handle: u32,
    events_completed: u32,
    xrc_srq_num: u32,
    xrc_domain: *mut XrcDomainC,
    xrc_cq: *mut ffi::ibv_cq,
}

// The legacy head is written over upstream's `ibv_srq` of an XRC SRQ: the common fields match
// and the XRC ones land in the mutex, which only libibverbs itself would use.
const _: () = {
    assert!(offset_of!(SrqHead, handle) == offset_of!(ffi::ibv_srq, handle));
    assert!(offset_of!(SrqHead, xrc_srq_num) == offset_of!(ffi::ibv_srq, mutex));
    assert!(size_of::<SrqHead>() <= offset_of!(ffi::ibv_srq, cond));
    assert!(offset_of!(QpInitAttr, xrc_domain) == 64);
};

const MAGIC: u64 = 0x5352_444d_4158_5243;

/// An OFED XRC domain: the C structure, the device's domain and this process's receive QP
/// registrations (QP number -> its handle).
#[repr(C)]
struct Domain {
    c: XrcDomainC,
    magic: u64,
    ctx: *const Ctx,
    inner: Option<XrcDomain>,
    regs: Mutex<HashMap<u32, QueuePair>>,
}

fn domain_of<'a>(p: *mut c_void) -> Result<&'a Domain, Errno> {
    // SAFETY: every ibv_xrc_domain this library hands out is the first field of a Domain; a
    // pointer from elsewhere is refused by the magic number (best effort, as C allows).
    let d = unsafe { (p as *mut Domain).as_ref() }.ok_or(EINVAL)?;
    if d.magic != MAGIC || d.inner.is_none() {
        return Err(EINVAL);
    }
    Ok(d)
}

impl Domain {
    fn inner(&self) -> &XrcDomain {
        self.inner.as_ref().expect("checked by domain_of")
    }

    fn ctx(&self) -> &Ctx {
        // SAFETY: the context outlives its objects (ibv_close_device with live objects is the
        // program's error, as in libibverbs).
        unsafe { &*self.ctx }
    }

    /// Records a registration: its events then reach this process with the XRC flag.
    fn register(&self, q: QueuePair) {
        if let Some(h) = q.handle() {
            lock(&self.ctx().xrc_rcv).insert(h, q.qpn());
        }
        lock(&self.regs).insert(q.qpn(), q);
    }

    /// Runs `f` on receive QP `qpn` of this domain: through this process's registration, else
    /// through a handle opened for the call (OFED checks the domain, not the registration).
    fn with_rcv_qp<R>(&self, qpn: u32, f: impl FnOnce(&QueuePair) -> Result<R, Errno>) -> Result<R, Errno> {
        if let Some(q) = lock(&self.regs).get(&qpn) {
            return f(q);
        }
        let q = self.inner().open_qp(qpn).map_err(not_found)?;
        let r = f(&q);
        if let Err((q, _)) = q.release() {
            // The device refused to let go of it: leave the handle to process exit rather than
            // destroy a QP that may live by its domain.
            std::mem::forget(q);
        }
        r
    }
}

/// OFED's verbs give EINVAL for a QP number that is not a receive QP of the domain.
fn not_found(e: softrdma_device::verbs::Error) -> Errno {
    match e {
        softrdma_device::verbs::Error::Device(_) => Errno(libc::EIO),
        _ => EINVAL,
    }
}

/// For OFED's verbs that return 0 or a negative error value.
fn neg_call(f: impl FnOnce() -> Result<(), Errno>) -> c_int {
    -errno_call(f)
}

/// The async event of a registered receive QP as OFED delivered it.
pub(crate) fn rcv_qp_event(
    e: AsyncEvent,
    qpn: u32,
) -> Option<(ffi::ibv_event_type, ffi::ibv_async_event__bindgen_ty_1)> {
    let ty = match e {
        AsyncEvent::CommEst(_) => ffi::IBV_EVENT_COMM_EST,
        AsyncEvent::SqDrained(_) => ffi::IBV_EVENT_SQ_DRAINED,
        AsyncEvent::QpFatal(_) => ffi::IBV_EVENT_QP_FATAL,
        AsyncEvent::QpReqErr(_) => ffi::IBV_EVENT_QP_REQ_ERR,
        AsyncEvent::QpAccessErr(_) => ffi::IBV_EVENT_QP_ACCESS_ERR,
        AsyncEvent::LastWqeReached(_) => ffi::IBV_EVENT_QP_LAST_WQE_REACHED,
        AsyncEvent::CqErr(_) | AsyncEvent::SrqLimitReached(_) => return None,
    };
    Some((ty | IBV_XRC_QP_EVENT_FLAG, ffi::ibv_async_event__bindgen_ty_1 { port_num: qpn as c_int }))
}

/// `ibv_create_qp` of OFED's IBV_QPT_XRC: an XRC_SEND QP (no receive queue; sends name the
/// remote SRQ in `xrc_remote_srq_num`); `attr` is OFED's `ibv_qp_init_attr`, with the domain.
///
/// # Safety
/// `attr` is NULL or points to OFED's larger `ibv_qp_init_attr` (with `xrc_domain`), readable and
/// writable; `pd` and the CQ in it are NULL or objects of this library not yet destroyed.
pub(crate) unsafe fn create_xrc_qp(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_qp_init_attr,
) -> Result<*mut ffi::ibv_qp, Errno> {
    let a = nonnull(attr as *mut QpInitAttr)?;
    let d = domain_of(a.xrc_domain)?;
    let p = pd_of(pd)?;
    if d.c.context != p.pd.context || !a.base.srq.is_null() {
        return Err(EINVAL);
    }
    a.base.cap.max_recv_wr = 0;
    a.base.cap.max_recv_sge = 0;
    // SAFETY: the pointers passed on are the caller's, checked above (`pd`) or as this function's
    // contract requires them (the send CQ); the receive side is NULL.
    let qp = unsafe {
        create(Create {
            context: p.pd.context,
            qp_context: a.base.qp_context,
            pd,
            send_cq: a.base.send_cq,
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            cap: &mut a.base.cap,
            qp_type: ffi::IBV_QPT_XRC_SEND,
            sq_sig_all: a.base.sq_sig_all,
            xrcd: std::ptr::null_mut(),
            extended: false,
        })
    }?;
    // SAFETY: `create` returned a live QP that nothing else references yet.
    unsafe { (*qp).set_ofed_xrc(a.xrc_domain) };
    Ok(qp as *mut ffi::ibv_qp)
}

/// `ibv_open_xrc_domain`: the XRC domain of the file `fd` names (shared by every process that
/// opens the same file), or with fd -1 and O_CREAT a private one.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_xrc_domain(context: *mut ffi::ibv_context, fd: c_int, oflag: c_int) -> *mut c_void {
    ptr_call(|| {
        let ctx = ctx_of(context)?;
        // SAFETY: OFED's ibv_open_xrc_domain: `fd` is -1 or a descriptor the program keeps open
        // across the call (open_domain only borrows it).
        let inner = unsafe { open_domain(ctx, fd, oflag) }?;
        let c = XrcDomainC { context, handle: inner.id().0 };
        let d = Domain { c, magic: MAGIC, ctx, inner: Some(inner), regs: Default::default() };
        Ok(into_c(d) as *mut c_void)
    })
}

/// `ibv_close_xrc_domain`: this process's registrations go first (as they would at exit), then
/// its reference to the domain; the last reference destroys the domain and its receive QPs.
/// EBUSY while this process's XRC SRQs still use the domain.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_xrc_domain(d: *mut c_void) -> c_int {
    errno_call(|| {
        let dom = domain_of(d)?;
        let regs: Vec<QueuePair> = lock(&dom.regs).drain().map(|(_, q)| q).collect();
        for q in regs {
            if let Some(h) = q.handle() {
                lock(&dom.ctx().xrc_rcv).remove(&h);
            }
            if let Err((q, _)) = q.release() {
                std::mem::forget(q);
            }
        }
        // SAFETY: domain_of accepted `d` as a Domain this library made with into_c; the program
        // closes it once and does not use it afterwards.
        unsafe { destroy_obj(d as *mut Domain, |x| &mut x.inner, |i| i.destroy()) }
    })
}

/// `ibv_create_xrc_srq`: an XRC SRQ of the domain whose completions go to `xrc_cq`; its number
/// is in OFED's `srq->xrc_srq_num`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_xrc_srq(
    pd: *mut ffi::ibv_pd,
    xrc_domain: *mut c_void,
    xrc_cq: *mut ffi::ibv_cq,
    attr: *mut ffi::ibv_srq_init_attr,
) -> *mut ffi::ibv_srq {
    ptr_call(|| {
        let p = pd_of(pd)?;
        let d = domain_of(xrc_domain)?;
        let cq = cq_of(xrc_cq)?;
        let a = nonnull(attr)?;
        let context = p.pd.context;
        // SAFETY: cq_of accepted `xrc_cq` as a live CQ of this library.
        if d.c.context != context || unsafe { (*xrc_cq).context } != context {
            return Err(EINVAL);
        }
        let ctx = ctx_of(context)?;
        let inner = d.inner().create_srq(p.inner(), cq.inner(), srq_attr(&a.attr, ctx)?)?;
        let n = inner.srq_num();
        // SAFETY: `context` is the PD's, which ctx_of has just accepted.
        let s = unsafe { new_srq(context, pd, a.srq_context, inner) } as *mut SrqHead;
        // SAFETY: new_srq returned a fresh Srq, whose first field is laid out as OFED's ibv_srq
        // head (SrqHead); nothing else references it yet.
        unsafe {
            (*s).xrc_srq_num = n;
            (*s).xrc_domain = xrc_domain as *mut XrcDomainC;
            (*s).xrc_cq = xrc_cq;
        }
        Ok(s as *mut ffi::ibv_srq)
    })
}

/// `ibv_create_xrc_rcv_qp`: a receive QP in `init_attr->xrc_domain` (the other fields are
/// ignored), registered to the caller. 0, or a negative error value.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_xrc_rcv_qp(init_attr: *mut c_void, xrc_rcv_qpn: *mut u32) -> c_int {
    neg_call(|| {
        let a = nonnull(init_attr as *mut QpInitAttr)?;
        let out = nonnull(xrc_rcv_qpn)?;
        let d = domain_of(a.xrc_domain)?;
        let q = d.inner().create_rcv_qp(XrcPolicy::DestroyOnLastClose)?;
        *out = q.qpn();
        d.register(q);
        Ok(())
    })
}

/// `ibv_modify_xrc_rcv_qp`: `ibv_modify_qp` on receive QP `xrc_qp_num` of the domain (the
/// transitions' required attributes are IBTA's, as for any XRC target QP). 0, or a positive
/// error value.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_xrc_rcv_qp(
    xrc_domain: *mut c_void,
    xrc_qp_num: u32,
    attr: *mut ffi::ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    errno_call(|| {
        let d = domain_of(xrc_domain)?;
        let a = nonnull(attr)?;
        d.with_rcv_qp(xrc_qp_num, |q| modify(q, ffi::IBV_QPT_XRC_RECV, a, attr_mask))
    })
}

/// `ibv_query_xrc_rcv_qp`. 0, or a positive error value.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_xrc_rcv_qp(
    xrc_domain: *mut c_void,
    xrc_qp_num: u32,
    attr: *mut ffi::ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut c_void,
) -> c_int {
    errno_call(|| {
        let d = domain_of(xrc_domain)?;
        let out = nonnull(attr)?;
        let (st, a) = d.with_rcv_qp(xrc_qp_num, |q| Ok(q.query()?))?;
        *out = query_to_c(st, &a, Default::default());
        // SAFETY: OFED's ibv_query_xrc_rcv_qp: `init_attr` is NULL or a writable OFED
        // ibv_qp_init_attr.
        if let Some(i) = unsafe { (init_attr as *mut QpInitAttr).as_mut() } {
            *i = QpInitAttr { base: ffi::ibv_qp_init_attr { qp_type: IBV_QPT_XRC, ..Default::default() }, xrc_domain };
        }
        Ok(())
    })
}

/// `ibv_reg_xrc_rcv_qp`: registers this process with receive QP `xrc_qp_num` of the domain
/// (again: nothing more). EINVAL when there is no such receive QP in the domain.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_xrc_rcv_qp(xrc_domain: *mut c_void, xrc_qp_num: u32) -> c_int {
    errno_call(|| {
        let d = domain_of(xrc_domain)?;
        if lock(&d.regs).contains_key(&xrc_qp_num) {
            return Ok(());
        }
        let q = d.inner().open_qp(xrc_qp_num).map_err(not_found)?;
        d.register(q);
        Ok(())
    })
}

/// `ibv_unreg_xrc_rcv_qp`: this process's registration goes; with the last one, so does a QP
/// made by `ibv_create_xrc_rcv_qp`. EINVAL when this process is not registered with it.
#[no_mangle]
pub unsafe extern "C" fn ibv_unreg_xrc_rcv_qp(xrc_domain: *mut c_void, xrc_qp_num: u32) -> c_int {
    errno_call(|| {
        let d = domain_of(xrc_domain)?;
        let q = lock(&d.regs).remove(&xrc_qp_num).ok_or(EINVAL)?;
        let h = q.handle();
        match q.release() {
            Ok(()) => {
                if let Some(h) = h {
                    lock(&d.ctx().xrc_rcv).remove(&h);
                }
                Ok(())
            }
            Err((q, e)) => {
                lock(&d.regs).insert(xrc_qp_num, q);
                Err(e.into())
            }
        }
    })
}

/// The attributes `ibv_alloc_xrc_rcv_qp` needs (the seed's table): RESET->INIT ...
const ALLOC_INIT: u32 = ffi::IBV_QP_ACCESS_FLAGS | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT;
/// ... and INIT->RTR; IBV_QP_MAX_DEST_RD_ATOMIC only for RDMA or atomics (else 0).
const ALLOC_RTR: u32 =
    ffi::IBV_QP_AV | ffi::IBV_QP_PATH_MTU | ffi::IBV_QP_DEST_QPN | ffi::IBV_QP_RQ_PSN | ffi::IBV_QP_MIN_RNR_TIMER;

/// `ibv_alloc_xrc_rcv_qp` (the seed's kernel-owned receive QP): creates a receive QP in the
/// domain, owned by the device, and moves it RESET->INIT->RTR with `attr`; `attr_mask` must have
/// the seed's bits (else -EINVAL). The program gets the QP number only. 0, or a negative error
/// value.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_xrc_rcv_qp(
    pd: *mut ffi::ibv_pd,
    xrc_domain: *mut c_void,
    attr: *mut ffi::ibv_qp_attr,
    attr_mask: c_int,
    xrc_rcv_qpn: *mut u32,
) -> c_int {
    neg_call(|| {
        let p = pd_of(pd)?;
        let d = domain_of(xrc_domain)?;
        let a = nonnull(attr)?;
        let out = nonnull(xrc_rcv_qpn)?;
        if p.pd.context != d.c.context {
            return Err(EINVAL);
        }
        let m = attr_mask as u32;
        if m & (ALLOC_INIT | ALLOC_RTR) != ALLOC_INIT | ALLOC_RTR {
            return Err(EINVAL);
        }
        if AttrMask(m).intersects(AttrMask::ALT_PATH | AttrMask::PATH_MIG_STATE) {
            // The seed allows an alternate path; there is one port and one path.
            return Err(Errno(libc::EOPNOTSUPP));
        }
        let q = d.inner().create_rcv_qp(XrcPolicy::LiveWithDomain)?;
        let mut at = *a;
        at.qp_state = ffi::IBV_QPS_INIT;
        let state = ffi::IBV_QP_STATE;
        let r = modify(&q, ffi::IBV_QPT_XRC_RECV, &at, (state | ALLOC_INIT) as c_int).and_then(|()| {
            at.qp_state = ffi::IBV_QPS_RTR;
            if m & ffi::IBV_QP_MAX_DEST_RD_ATOMIC == 0 {
                at.max_dest_rd_atomic = 0;
            }
            modify(&q, ffi::IBV_QPT_XRC_RECV, &at, (state | ALLOC_RTR | ffi::IBV_QP_MAX_DEST_RD_ATOMIC) as c_int)
        });
        if let Err(e) = r {
            drop(q); // its only handle: the QP goes
            return Err(e);
        }
        let n = q.qpn();
        // The device keeps it; the program has the number only.
        q.release().map_err(|(_, e)| Errno::from(e))?;
        *out = n;
        Ok(())
    })
}
