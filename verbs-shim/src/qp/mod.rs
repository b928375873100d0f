//! Queue pairs and XRC target QPs (`ibv_open_qp`): create, destroy, modify, query,
//! multicast; shared receive queues in `srq`, posting in `post`, the `ibv_qp_ex` work-request
//! builder in `ex`.

use std::ffi::{c_int, c_void};

use softrdma_device::verbs::{Access, AttrMask, Mtu, QpAttr, QpCaps, QpState, QpType, QueuePair, SendWr};

use crate::context::{ctx_of, lock, Ctx};
use crate::cq::cq_of;
use crate::ffi;
use crate::mem::{av_dest, destroy_obj, gid_ip, pd_of, xrcd_of};
use crate::{errno_call, into_c, nonnull, ptr_call, Errno, EINVAL};

mod ex;
mod post;
mod srq;

use ex::fill_ex;
pub(crate) use post::post_one;
pub use srq::{ibv_create_srq, ibv_destroy_srq};
pub(crate) use srq::{new_srq, srq_attr, srq_of};

/// What `ibv_qp_init_attr` said, for `ibv_query_qp`.
#[derive(Clone, Copy)]
struct InitInfo {
    cap: ffi::ibv_qp_cap,
    sq_sig_all: c_int,
}

/// The `ibv_wr_*` work requests between `ibv_wr_start` and `ibv_wr_complete`, and inline data
/// copied when it was given (the program may reuse its buffer at once).
#[derive(Default)]
struct Build {
    wrs: Vec<SendWr>,
    inline: Vec<Box<[u8]>>,
    err: Option<c_int>,
}

/// A queue pair. Its C structure is always an `ibv_qp_ex` (whose start is `ibv_qp`).
#[repr(C)]
pub(crate) struct Qp {
    pub(crate) ex: ffi::ibv_qp_ex,
    ctx: *const Ctx,
    pub(crate) inner: Option<QueuePair>,
    init: InitInfo,
    /// Created with send_ops_flags: `ibv_qp_to_qp_ex` gives the extended QP.
    extended: bool,
    build: std::sync::Mutex<Build>,
    /// An OFED IBV_QPT_XRC QP: its `struct ibv_xrc_domain` (for `ibv_query_qp`'s legacy tail).
    ofed_xrcd: *mut c_void,
}

pub(crate) fn qp_of<'a>(p: *mut ffi::ibv_qp) -> Result<&'a Qp, Errno> {
    // SAFETY: every ibv_qp this library hands out is the first field of a Qp.
    let qp = unsafe { (p as *mut Qp).as_ref() }.ok_or(EINVAL)?;
    qp.inner.as_ref().ok_or(EINVAL)?;
    Ok(qp)
}

impl Qp {
    fn inner(&self) -> &QueuePair {
        self.inner.as_ref().expect("checked by qp_of")
    }

    /// Marks an OFED IBV_QPT_XRC QP: the type the program asked for, and its domain.
    pub(crate) fn set_ofed_xrc(&mut self, xrcd: *mut c_void) {
        self.ex.qp_base.qp_type = crate::ofed_xrc::IBV_QPT_XRC;
        self.ofed_xrcd = xrcd;
    }
}

/// `sizeof(struct ibv_sge)`: the bytes one scatter/gather entry takes in a send WQE.
const SGE_BYTES: u32 = 16;

fn caps_of(c: &ffi::ibv_qp_cap, ctx: &Ctx) -> Result<QpCaps, Errno> {
    let l = ctx.info.limits;
    // rxe_qp_chk_cap: each capacity within the device's.
    if c.max_send_wr > l.max_qp_wr
        || c.max_recv_wr > l.max_qp_wr
        || c.max_send_sge > l.max_sge
        || c.max_recv_sge > l.max_sge
        || c.max_inline_data > l.max_inline
    {
        return Err(EINVAL);
    }
    // rxe_qp_init_req: a send WQE holds max(max_send_sge SGEs, max_inline_data bytes), and the
    // inline capacity the QP gets (and reports back in the caller's cap) is that whole WQE, so
    // a 16-byte IBV_SEND_INLINE fits a QP asked for one SGE and no inline data (rdma_xclient).
    let sge_bytes = c.max_send_sge.saturating_mul(SGE_BYTES);
    let max_inline_data = c.max_inline_data.max(sge_bytes.min(l.max_inline));
    Ok(QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data,
    })
}

pub(crate) struct Create<'a> {
    pub(crate) context: *mut ffi::ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut ffi::ibv_pd,
    pub(crate) send_cq: *mut ffi::ibv_cq,
    pub(crate) recv_cq: *mut ffi::ibv_cq,
    pub(crate) srq: *mut ffi::ibv_srq,
    pub(crate) cap: &'a mut ffi::ibv_qp_cap,
    pub(crate) qp_type: ffi::ibv_qp_type,
    pub(crate) sq_sig_all: c_int,
    pub(crate) xrcd: *mut ffi::ibv_xrcd,
    pub(crate) extended: bool,
}

/// A QP of the objects `a` names.
///
/// # Safety
/// The pointers in `a` are NULL or objects of this library (context, PD, CQs, SRQ, XRC domain)
/// that the caller has not destroyed.
pub(crate) unsafe fn create(a: Create<'_>) -> Result<*mut Qp, Errno> {
    let ctx = ctx_of(a.context)?;
    let ty = QpType::from_ibv(a.qp_type).ok_or(Errno(libc::EOPNOTSUPP))?;
    let inner = if ty == QpType::XrcTgt {
        xrcd_of(a.xrcd)?.inner.as_ref().ok_or(EINVAL)?.create_tgt_qp()?
    } else {
        let pd = pd_of(a.pd)?;
        let send_cq = cq_of(a.send_cq)?;
        let caps = caps_of(a.cap, ctx)?;
        a.cap.max_inline_data = caps.max_inline_data;
        let mut b = pd.inner().qp_builder(ty, send_cq.inner()).caps(caps).sig_all(a.sq_sig_all != 0);
        if ty != QpType::XrcIni {
            // rxe_qp_chk_init: every QP but an XRC initiator needs a receive CQ.
            b = b.recv_cq(cq_of(a.recv_cq)?.inner());
        }
        if !a.srq.is_null() {
            if ty == QpType::XrcIni {
                return Err(EINVAL);
            }
            b = b.srq(srq_of(a.srq)?.inner());
        }
        b.build()?
    };
    let (pd, send_cq, recv_cq, srq) = if ty == QpType::XrcTgt {
        (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())
    } else if ty == QpType::XrcIni {
        (a.pd, a.send_cq, std::ptr::null_mut(), std::ptr::null_mut())
    } else {
        (a.pd, a.send_cq, a.recv_cq, a.srq)
    };
    let base = ffi::ibv_qp {
        context: a.context,
        qp_context: a.qp_context,
        pd,
        send_cq,
        recv_cq,
        srq,
        handle: inner.handle().unwrap_or(0),
        qp_num: inner.qpn(),
        state: ffi::IBV_QPS_RESET,
        qp_type: a.qp_type,
        ..Default::default()
    };
    let mut ex = ffi::ibv_qp_ex { qp_base: base, ..Default::default() };
    fill_ex(&mut ex);
    let (qpn, handle) = (inner.qpn(), inner.handle());
    let qp = into_c(Qp {
        ex,
        ctx,
        inner: Some(inner),
        init: InitInfo { cap: *a.cap, sq_sig_all: a.sq_sig_all },
        extended: a.extended,
        build: Default::default(),
        ofed_xrcd: std::ptr::null_mut(),
    });
    match handle {
        Some(h) => lock(&ctx.tgt_handles).insert(h, qp as usize),
        None => lock(&ctx.qps).insert(qpn, qp as usize),
    };
    Ok(qp)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ffi::ibv_pd, attr: *mut ffi::ibv_qp_init_attr) -> *mut ffi::ibv_qp {
    ptr_call(|| {
        let p = pd_of(pd)?;
        let a = nonnull(attr)?;
        if a.qp_type == ffi::IBV_QPT_XRC_RECV {
            // A target QP belongs to an XRC domain: ibv_create_qp_ex with IBV_QP_INIT_ATTR_XRCD.
            // (ibv_create_qp_ex with only IBV_QP_INIT_ATTR_PD comes here, so XRC_SEND does.)
            return Err(EINVAL);
        }
        if a.qp_type == crate::ofed_xrc::IBV_QPT_XRC {
            // SAFETY: an OFED program's ibv_create_qp with IBV_QPT_XRC passes OFED's larger
            // ibv_qp_init_attr (with the domain), and `pd` was accepted by pd_of.
            return unsafe { crate::ofed_xrc::create_xrc_qp(pd, attr) };
        }
        // SAFETY: ibv_create_qp(3): the CQs and SRQ in `attr` are NULL or the program's live
        // objects; `pd` was accepted by pd_of.
        let qp = unsafe {
            create(Create {
                context: p.pd.context,
                qp_context: a.qp_context,
                pd,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: a.srq,
                cap: &mut a.cap,
                qp_type: a.qp_type,
                sq_sig_all: a.sq_sig_all,
                xrcd: std::ptr::null_mut(),
                extended: false,
            })
        }?;
        Ok(qp as *mut ffi::ibv_qp)
    })
}

/// The `ibv_wr_*` operations this device can post.
const SEND_OPS_SUPPORTED: u64 = (ffi::IBV_QP_EX_WITH_RDMA_WRITE
    | ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | ffi::IBV_QP_EX_WITH_SEND
    | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM
    | ffi::IBV_QP_EX_WITH_RDMA_READ
    | ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | ffi::IBV_QP_EX_WITH_ATOMIC_WRITE
    | ffi::IBV_QP_EX_WITH_LOCAL_INV
    | ffi::IBV_QP_EX_WITH_BIND_MW
    | ffi::IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

ffi_callback! {
    #[on_panic = crate::callback::null_eio()]
    fn create_qp_ex(
        context: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_qp_init_attr_ex,
    ) -> *mut ffi::ibv_qp {
        ptr_call(|| {
            let a = nonnull(attr)?;
            let m = a.comp_mask;
            let known = ffi::IBV_QP_INIT_ATTR_PD
                | ffi::IBV_QP_INIT_ATTR_XRCD
                | ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS
                | ffi::IBV_QP_INIT_ATTR_MAX_TSO_HEADER
                | ffi::IBV_QP_INIT_ATTR_IND_TABLE
                | ffi::IBV_QP_INIT_ATTR_RX_HASH
                | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            if m & !known != 0 {
                return Err(EINVAL);
            }
            let unsupported =
                ffi::IBV_QP_INIT_ATTR_MAX_TSO_HEADER | ffi::IBV_QP_INIT_ATTR_IND_TABLE | ffi::IBV_QP_INIT_ATTR_RX_HASH;
            let create_flags = if m & ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 { a.create_flags } else { 0 };
            let block_self = ffi::IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
            // The one creation flag this device has: a UD QP that does not hear its own multicast
            // sends (what `mckey -l` asks for).
            if m & unsupported != 0
                || create_flags & !block_self != 0
                || (create_flags != 0 && a.qp_type != ffi::IBV_QPT_UD)
            {
                return Err(Errno(libc::EOPNOTSUPP));
            }
            let extended = m & ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
            if extended && a.send_ops_flags & !SEND_OPS_SUPPORTED != 0 {
                return Err(Errno(libc::EOPNOTSUPP));
            }
            let xrcd = if m & ffi::IBV_QP_INIT_ATTR_XRCD != 0 { a.xrcd } else { std::ptr::null_mut() };
            let pd = if m & ffi::IBV_QP_INIT_ATTR_PD != 0 { a.pd } else { std::ptr::null_mut() };
            if a.qp_type == ffi::IBV_QPT_XRC_RECV && xrcd.is_null() {
                return Err(EINVAL);
            }
            if a.qp_type != ffi::IBV_QPT_XRC_RECV && pd.is_null() {
                return Err(EINVAL);
            }
            // SAFETY: ibv_create_qp_ex(3): the PD, CQs, SRQ and XRC domain in `attr` are NULL or
            // the program's live objects.
            let qp = unsafe {
                create(Create {
                    context,
                    qp_context: a.qp_context,
                    pd,
                    send_cq: a.send_cq,
                    recv_cq: a.recv_cq,
                    srq: a.srq,
                    cap: &mut a.cap,
                    qp_type: a.qp_type,
                    sq_sig_all: a.sq_sig_all,
                    xrcd,
                    extended,
                })
            }?;
            // SAFETY: `create` has just made `qp`; nothing else references it yet.
            let q = unsafe { &*qp };
            if create_flags & block_self != 0 {
                if let Err(e) = q.inner().block_self_mcast_lb() {
                    // SAFETY: `qp` is the live QP made above, destroyed once here and not returned.
                    unsafe { ibv_destroy_qp(qp as *mut ffi::ibv_qp) };
                    return Err(e.into());
                }
            }
            Ok(qp as *mut ffi::ibv_qp)
        })
    }
}

ffi_callback! {
    #[on_panic = crate::callback::null_eio()]
    fn open_qp(context: *mut ffi::ibv_context, attr: *mut ffi::ibv_qp_open_attr) -> *mut ffi::ibv_qp {
        ptr_call(|| {
            let ctx = ctx_of(context)?;
            let a = nonnull(attr)?;
            let need = ffi::IBV_QP_OPEN_ATTR_NUM | ffi::IBV_QP_OPEN_ATTR_XRCD | ffi::IBV_QP_OPEN_ATTR_TYPE;
            if a.comp_mask & need != need || a.comp_mask & !(ffi::IBV_QP_OPEN_ATTR_RESERVED - 1) != 0 {
                return Err(EINVAL);
            }
            if a.qp_type != ffi::IBV_QPT_XRC_RECV {
                return Err(EINVAL);
            }
            let inner = xrcd_of(a.xrcd)?.inner.as_ref().ok_or(EINVAL)?.open_qp(a.qp_num)?;
            let qp_context =
                if a.comp_mask & ffi::IBV_QP_OPEN_ATTR_CONTEXT != 0 { a.qp_context } else { std::ptr::null_mut() };
            let (st, _) = inner.query().unwrap_or((QpState::Reset, QpAttr::default()));
            let base = ffi::ibv_qp {
                context,
                qp_context,
                handle: inner.handle().unwrap_or(0),
                qp_num: inner.qpn(),
                state: st.to_ibv(),
                qp_type: ffi::IBV_QPT_XRC_RECV,
                ..Default::default()
            };
            let mut ex = ffi::ibv_qp_ex { qp_base: base, ..Default::default() };
            fill_ex(&mut ex);
            let h = inner.handle().unwrap_or(0);
            let qp = into_c(Qp {
                ex,
                ctx,
                inner: Some(inner),
                init: InitInfo { cap: Default::default(), sq_sig_all: 0 },
                extended: false,
                build: Default::default(),
                ofed_xrcd: std::ptr::null_mut(),
            });
            lock(&ctx.tgt_handles).insert(h, qp as usize);
            Ok(qp as *mut ffi::ibv_qp)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ffi::ibv_qp) -> c_int {
    // The error of QueuePair::destroy gives the QP back: large, and rare.
    #[allow(clippy::result_large_err)]
    errno_call(|| {
        let q = qp_of(qp)?;
        // SAFETY: `q.ctx` is the QP's context, which the program may not close before the QP.
        let (ctx, qpn, handle) = (unsafe { &*q.ctx }, q.inner().qpn(), q.inner().handle());
        // SAFETY: ibv_destroy_qp(3): `qp` (accepted by qp_of) is a Qp of this library, destroyed
        // once and not used after success.
        unsafe { destroy_obj(qp as *mut Qp, |q| &mut q.inner, |i| i.destroy()) }?;
        match handle {
            Some(h) => lock(&ctx.tgt_handles).remove(&h),
            None => lock(&ctx.qps).remove(&qpn),
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ffi::ibv_qp) -> *mut ffi::ibv_qp_ex {
    match qp_of(qp) {
        Ok(q) if q.extended => qp as *mut ffi::ibv_qp_ex,
        _ => std::ptr::null_mut(),
    }
}

fn qp_attr_of(a: &ffi::ibv_qp_attr, mask: AttrMask) -> Result<QpAttr, Errno> {
    let state = |v: u32| QpState::from_ibv(v).ok_or(EINVAL);
    let mut out = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        out.qp_state = state(a.qp_state)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        out.cur_qp_state = state(a.cur_qp_state)?;
    }
    if mask.contains(AttrMask::PATH_MTU) {
        out.path_mtu = Mtu::from_ibv(a.path_mtu).ok_or(EINVAL)?;
    }
    if mask.contains(AttrMask::AV) {
        out.dest = av_dest(&a.ah_attr)?;
    }
    out.qkey = a.qkey;
    out.rq_psn = a.rq_psn;
    out.sq_psn = a.sq_psn;
    out.dest_qp_num = a.dest_qp_num;
    out.qp_access_flags = Access(a.qp_access_flags & 0xf);
    out.pkey_index = a.pkey_index;
    out.port_num = a.port_num;
    out.timeout = a.timeout;
    out.retry_cnt = a.retry_cnt;
    out.rnr_retry = a.rnr_retry;
    out.min_rnr_timer = a.min_rnr_timer;
    out.max_rd_atomic = a.max_rd_atomic;
    out.max_dest_rd_atomic = a.max_dest_rd_atomic;
    Ok(out)
}

/// The attribute mask as the kernel's uverbs layer passes it on (`modify_qp_mask` in
/// drivers/infiniband/core/uverbs_cmd.c): an XRC initiator has no responder, so its
/// MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER are dropped; an XRC target has no requester, so its
/// MAX_QP_RD_ATOMIC, RETRY_CNT and RNR_RETRY are. Programs rely on it: perftest `-c XRC` sets the
/// RC attributes on both.
fn uverbs_mask(qp_type: ffi::ibv_qp_type, mask: AttrMask) -> AttrMask {
    match qp_type {
        ffi::IBV_QPT_XRC_SEND => AttrMask(mask.0 & !(AttrMask::MAX_DEST_RD_ATOMIC.0 | AttrMask::MIN_RNR_TIMER.0)),
        ffi::IBV_QPT_XRC_RECV => {
            AttrMask(mask.0 & !(AttrMask::MAX_QP_RD_ATOMIC.0 | AttrMask::RETRY_CNT.0 | AttrMask::RNR_RETRY.0))
        }
        _ => mask,
    }
}

/// `ibv_modify_qp`'s checks and the call, for a QP of type `qp_type` (upstream's numbering).
pub(crate) fn modify(q: &QueuePair, qp_type: ffi::ibv_qp_type, a: &ffi::ibv_qp_attr, mask: c_int) -> Result<(), Errno> {
    // Every ibv_qp_attr_mask bit (IBV_QP_STATE ... IBV_QP_DEST_QPN, IBV_QP_RATE_LIMIT).
    let known = ((1u32 << 21) - 1) | AttrMask::RATE_LIMIT.0;
    if mask as u32 & !known != 0 {
        return Err(EINVAL);
    }
    let mask = uverbs_mask(qp_type, AttrMask(mask as u32));
    if mask.intersects(AttrMask::ALT_PATH | AttrMask::PATH_MIG_STATE) {
        // Automatic path migration needs a second path; there is one port and one path.
        return Err(Errno(libc::EOPNOTSUPP));
    }
    let qa = qp_attr_of(a, mask)?;
    q.modify(&qa, mask)?;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ffi::ibv_qp, attr: *mut ffi::ibv_qp_attr, mask: c_int) -> c_int {
    errno_call(|| {
        let q = qp_of(qp)?;
        let a = nonnull(attr)?;
        // SAFETY: qp_of accepted `qp` as a live QP of this library; libibverbs lets the
        // provider keep ibv_qp.state current.
        let c = unsafe { &mut *qp };
        modify(q.inner(), crate::ofed_xrc::upstream_type(c.qp_type), a, mask)?;
        if mask & ffi::IBV_QP_STATE as c_int != 0 {
            c.state = a.qp_state;
        }
        Ok(())
    })
}

/// The engine's QP attributes as `struct ibv_qp_attr` (the address vector global, on port 1).
pub(crate) fn qp_attr_to_c(a: &softrdma_engine::device::QpAttr) -> ffi::ibv_qp_attr {
    let mut out = ffi::ibv_qp_attr {
        qp_state: a.qp_state.to_ibv(),
        path_mtu: a.path_mtu as u32,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.0,
        pkey_index: a.pkey_index,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..Default::default()
    };
    out.ah_attr.is_global = 1;
    out.ah_attr.port_num = 1;
    out.ah_attr.grh.dgid.raw = softrdma_device::proto::gid_of(a.dest);
    out
}

/// What `ibv_query_qp` reports for a QP in state `st` with attributes `a`.
pub(crate) fn query_to_c(st: QpState, a: &QpAttr, cap: ffi::ibv_qp_cap) -> ffi::ibv_qp_attr {
    let mut out = qp_attr_to_c(a);
    out.qp_state = st.to_ibv();
    out.cur_qp_state = st.to_ibv();
    out.path_mig_state = ffi::IBV_MIG_MIGRATED;
    out.cap = cap;
    out.ah_attr.grh.hop_limit = 1;
    out.port_num = 1;
    out
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    _mask: c_int,
    init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    errno_call(|| {
        let q = qp_of(qp)?;
        let out = nonnull(attr)?;
        let (st, a) = q.inner().query()?;
        // SAFETY: qp_of accepted `qp` as a live QP of this library.
        unsafe { (*qp).state = st.to_ibv() };
        *out = query_to_c(st, &a, q.init.cap);
        if !q.ofed_xrcd.is_null() {
            // SAFETY: a QP made through OFED's XRC call belongs to an OFED program, whose
            // `init` is NULL or its larger, writable ibv_qp_init_attr.
            if let Some(i) = unsafe { (init as *mut crate::ofed_xrc::QpInitAttr).as_mut() } {
                // An OFED program's ibv_qp_init_attr, which has the XRC domain after sq_sig_all.
                i.xrc_domain = q.ofed_xrcd;
            }
        }
        // SAFETY: ibv_query_qp(3): `init` is NULL or a writable ibv_qp_init_attr; `qp` is live
        // (qp_of).
        if let Some((i, b)) = unsafe { init.as_mut().map(|i| (i, &*qp)) } {
            *i = ffi::ibv_qp_init_attr {
                qp_context: b.qp_context,
                send_cq: b.send_cq,
                recv_cq: b.recv_cq,
                srq: b.srq,
                cap: q.init.cap,
                qp_type: b.qp_type,
                sq_sig_all: q.init.sq_sig_all,
            };
        }
        Ok(())
    })
}

/// `ibv_query_qp_data_in_order`: data lands in order (the device copies each packet's payload
/// in PSN order), so every operation is in order.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(qp: *mut ffi::ibv_qp, _op: u32, flags: u32) -> c_int {
    if qp_of(qp).is_err() || flags != 0 {
        return 0;
    }
    1
}

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ffi::ibv_qp, gid: *const ffi::ibv_gid, _lid: u16) -> c_int {
    // SAFETY: the caller's arguments, as ibv_attach_mcast(3) has them.
    unsafe { mcast_call(qp, gid, QueuePair::attach_mcast) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ffi::ibv_qp, gid: *const ffi::ibv_gid, _lid: u16) -> c_int {
    // SAFETY: the caller's arguments, as ibv_detach_mcast(3) has them.
    unsafe { mcast_call(qp, gid, QueuePair::detach_mcast) }
}

/// `ibv_attach_mcast` / `ibv_detach_mcast`: `op` on the QP with the group `gid` names.
///
/// # Safety
/// `gid` is NULL or a readable ibv_gid (ibv_attach_mcast(3)/ibv_detach_mcast(3)).
unsafe fn mcast_call(
    qp: *mut ffi::ibv_qp,
    gid: *const ffi::ibv_gid,
    op: fn(&QueuePair, std::net::IpAddr) -> softrdma_device::verbs::Result<()>,
) -> c_int {
    errno_call(|| {
        let q = qp_of(qp)?;
        // SAFETY: ibv_attach_mcast(3)/ibv_detach_mcast(3): `gid` is NULL or a readable ibv_gid.
        let g = unsafe { gid.as_ref() }.ok_or(EINVAL)?;
        // SAFETY: ibv_gid's members are all plain bytes (raw, or two u64), so raw is always valid.
        op(q.inner(), gid_ip(unsafe { g.raw }))?;
        Ok(())
    })
}

pub(crate) fn fill_ops(v: &mut ffi::verbs_context) {
    post::fill_ops(v);
    v.create_qp_ex = Some(create_qp_ex);
    v.open_qp = Some(open_qp);
    srq::fill_ops(v);
}

/// A QP with its callbacks and no device QP behind it (as a destroyed one), for their tests.
#[cfg(test)]
pub(crate) fn unbacked() -> Box<Qp> {
    let mut ex = ffi::ibv_qp_ex::default();
    fill_ex(&mut ex);
    Box::new(Qp {
        ex,
        ctx: std::ptr::null(),
        inner: None,
        init: InitInfo { cap: Default::default(), sq_sig_all: 0 },
        extended: true,
        build: Default::default(),
        ofed_xrcd: std::ptr::null_mut(),
    })
}

#[cfg(test)]
mod uverbs_mask_test {
    use super::*;

    #[test]
    fn xrc_initiators_drop_responder_attributes_and_targets_requester_ones() {
        let rtr = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        let ini = uverbs_mask(ffi::IBV_QPT_XRC_SEND, rtr);
        assert_eq!(ini, AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN);
        let rts = AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
        let tgt = uverbs_mask(ffi::IBV_QPT_XRC_RECV, rts);
        assert_eq!(tgt, AttrMask::STATE | AttrMask::SQ_PSN | AttrMask::TIMEOUT);
        // Other types keep every bit: the engine's table judges them.
        assert_eq!(uverbs_mask(ffi::IBV_QPT_RC, rtr | rts), rtr | rts);
        assert_eq!(uverbs_mask(ffi::IBV_QPT_XRC_SEND, rts), rts);
    }
}
