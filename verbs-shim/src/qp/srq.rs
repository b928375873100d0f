//! Shared receive queues (`ibv_create_srq[_ex]`, modify, query, `ibv_get_srq_num`), XRC SRQs
//! among them.

use std::ffi::{c_int, c_void};

use softrdma_device::verbs::{SharedReceiveQueue, SrqAttr};

use crate::context::{ctx_of, lock, Ctx};
use crate::cq::cq_of;
use crate::ffi;
use crate::mem::{destroy_obj, pd_of, xrcd_of};
use crate::{errno_call, into_c, nonnull, ptr_call, Errno, EINVAL};

/// A shared receive queue.
#[repr(C)]
pub(crate) struct Srq {
    pub(crate) srq: ffi::ibv_srq,
    ctx: *const Ctx,
    pub(crate) inner: Option<SharedReceiveQueue>,
}

pub(crate) fn srq_of<'a>(p: *mut ffi::ibv_srq) -> Result<&'a Srq, Errno> {
    // SAFETY: every ibv_srq this library hands out is the first field of a Srq.
    let srq = unsafe { (p as *mut Srq).as_ref() }.ok_or(EINVAL)?;
    srq.inner.as_ref().ok_or(EINVAL)?;
    Ok(srq)
}

impl Srq {
    pub(super) fn inner(&self) -> &SharedReceiveQueue {
        self.inner.as_ref().expect("checked by srq_of")
    }
}

// Shared receive queues.

pub(crate) fn srq_attr(a: &ffi::ibv_srq_attr, ctx: &Ctx) -> Result<SrqAttr, Errno> {
    let l = ctx.info.limits;
    if a.max_wr == 0 || a.max_wr > l.max_qp_wr || a.max_sge > l.max_sge || a.srq_limit > a.max_wr {
        return Err(EINVAL);
    }
    Ok(SrqAttr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit })
}

/// A new Srq of `inner`, recorded in the context's table of SRQs.
///
/// # Safety
/// `context` is a context of this library (the caller has checked it with ctx_of), and `pd` the
/// PD the SRQ was made in.
pub(crate) unsafe fn new_srq(
    context: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    srq_context: *mut c_void,
    inner: SharedReceiveQueue,
) -> *mut Srq {
    let Ok(ctx) = ctx_of(context) else { unreachable!("checked by the caller") };
    let srq = ffi::ibv_srq { context, srq_context, pd, handle: inner.srq_num(), ..Default::default() };
    let n = inner.srq_num();
    let s = into_c(Srq { srq, ctx, inner: Some(inner) });
    lock(&ctx.srqs).insert(n, s as usize);
    s
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ffi::ibv_pd, attr: *mut ffi::ibv_srq_init_attr) -> *mut ffi::ibv_srq {
    ptr_call(|| {
        let p = pd_of(pd)?;
        let a = nonnull(attr)?;
        let ctx = ctx_of(p.pd.context)?;
        let inner = p.inner().create_srq(srq_attr(&a.attr, ctx)?)?;
        // SAFETY: the PD's context was accepted by ctx_of above, and `pd` by pd_of.
        Ok(unsafe { new_srq(p.pd.context, pd, a.srq_context, inner) } as *mut ffi::ibv_srq)
    })
}

ffi_callback! {
    #[on_panic = crate::callback::null_eio()]
    fn create_srq_ex(
        context: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_srq_init_attr_ex,
    ) -> *mut ffi::ibv_srq {
        ptr_call(|| {
            let ctx = ctx_of(context)?;
            let a = nonnull(attr)?;
            let m = a.comp_mask;
            if m & !(ffi::IBV_SRQ_INIT_ATTR_RESERVED - 1) != 0 {
                return Err(EINVAL);
            }
            let ty = if m & ffi::IBV_SRQ_INIT_ATTR_TYPE != 0 { a.srq_type } else { ffi::IBV_SRQT_BASIC };
            if m & ffi::IBV_SRQ_INIT_ATTR_PD == 0 {
                return Err(EINVAL);
            }
            let p = pd_of(a.pd)?;
            let sa = srq_attr(&a.attr, ctx)?;
            let inner = match ty {
                ffi::IBV_SRQT_BASIC => p.inner().create_srq(sa)?,
                ffi::IBV_SRQT_XRC => {
                    let need = ffi::IBV_SRQ_INIT_ATTR_XRCD | ffi::IBV_SRQ_INIT_ATTR_CQ;
                    if m & need != need {
                        return Err(EINVAL);
                    }
                    let x = xrcd_of(a.xrcd)?;
                    let cq = cq_of(a.cq)?;
                    x.inner.as_ref().ok_or(EINVAL)?.create_srq(p.inner(), cq.inner(), sa)?
                }
                // Tag matching is hardware offload this device does not have.
                ffi::IBV_SRQT_TM => return Err(Errno(libc::EOPNOTSUPP)),
                _ => return Err(EINVAL),
            };
            // SAFETY: `context` was accepted by ctx_of above, and `a.pd` by pd_of.
            Ok(unsafe { new_srq(context, a.pd, a.srq_context, inner) } as *mut ffi::ibv_srq)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ffi::ibv_srq) -> c_int {
    errno_call(|| {
        let s = srq_of(srq)?;
        // SAFETY: `s.ctx` is the SRQ's context, which the program may not close before the SRQ.
        let (ctx, n) = (unsafe { &*s.ctx }, s.inner().srq_num());
        // SAFETY: ibv_destroy_srq(3): `srq` (accepted by srq_of) is an Srq of this library,
        // destroyed once and not used after success.
        unsafe { destroy_obj(srq as *mut Srq, |s| &mut s.inner, |i| i.destroy()) }?;
        lock(&ctx.srqs).remove(&n);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ffi::ibv_srq, attr: *mut ffi::ibv_srq_attr, mask: c_int) -> c_int {
    errno_call(|| {
        let s = srq_of(srq)?;
        let a = nonnull(attr)?;
        let mask = mask as u32;
        if mask & !(ffi::IBV_SRQ_MAX_WR | ffi::IBV_SRQ_LIMIT) != 0 {
            return Err(EINVAL);
        }
        if mask & ffi::IBV_SRQ_MAX_WR != 0 {
            // The ring was sized at creation; resizing an SRQ is not built yet.
            return Err(Errno(libc::EOPNOTSUPP));
        }
        if mask & ffi::IBV_SRQ_LIMIT != 0 {
            let (cur, _) = s.inner().query()?;
            if a.srq_limit > cur.max_wr {
                return Err(EINVAL);
            }
            s.inner().set_limit(a.srq_limit)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ffi::ibv_srq, attr: *mut ffi::ibv_srq_attr) -> c_int {
    errno_call(|| {
        let s = srq_of(srq)?;
        let out = nonnull(attr)?;
        let (a, _) = s.inner().query()?;
        *out = ffi::ibv_srq_attr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit };
        Ok(())
    })
}

ffi_callback! {
    #[on_panic = crate::callback::eio()]
    fn get_srq_num(srq: *mut ffi::ibv_srq, num: *mut u32) -> c_int {
        errno_call(|| {
            let s = srq_of(srq)?;
            *nonnull(num)? = s.inner().srq_num();
            Ok(())
        })
    }
}

/// The context's SRQ ops.
pub(super) fn fill_ops(v: &mut ffi::verbs_context) {
    v.create_srq_ex = Some(create_srq_ex);
    v.get_srq_num = Some(get_srq_num);
}
