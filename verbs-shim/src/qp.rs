//! Queue pairs (including `ibv_qp_ex` and its `ibv_wr_*` builder), shared receive queues, XRC
//! target QPs (`ibv_open_qp`), posting, modify and query, multicast.

use std::ffi::{c_int, c_void};

use softrdma_device::verbs::{
    Access, AttrMask, Mtu, QpAttr, QpCaps, QpState, QpType, QueuePair, RecvWr, SendOp, SendWr, Sge, SharedReceiveQueue,
    SrqAttr, UdDest,
};

use crate::callback::Ours;
use crate::context::{ctx_of, lock, Ctx};
use crate::cq::cq_of;
use crate::ffi;
use crate::mem::{av_dest, destroy_obj, gid_ip, pd_of, xrcd_of, Ah};
use crate::{errno_call, into_c, nonnull, ptr_call, Errno, EINVAL};

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
    fn inner(&self) -> &SharedReceiveQueue {
        self.inner.as_ref().expect("checked by srq_of")
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

/// The gather/scatter list of a work request.
///
/// # Safety
/// `list` is NULL or points to `n` readable ibv_sge (a work request's sg_list and num_sge).
unsafe fn sges(list: *mut ffi::ibv_sge, n: c_int) -> Result<Vec<Sge>, Errno> {
    if n < 0 || (n > 0 && list.is_null()) {
        return Err(EINVAL);
    }
    Ok((0..n as usize)
        .map(|i| {
            // SAFETY: `list` is non-NULL here (n > 0) and i < n, per the contract.
            let s = unsafe { &*list.add(i) };
            Sge { addr: s.addr, length: s.length, lkey: s.lkey }
        })
        .collect())
}

/// A softrdma send work request from an `ibv_send_wr` posted to a QP of type `ty`. `wr.ud` shares
/// its union with `wr.rdma` and `wr.atomic`, and `qp_type.xrc` means something only on an XRC
/// initiator, so each is read only for the QP type that defines it.
///
/// # Safety
/// `w` is a work request as ibv_post_send(3) takes it: its sg_list holds num_sge entries, and a
/// UD request's `ah`, a bind's `mw` and `mr` are NULL or the program's live objects.
unsafe fn send_wr(w: &ffi::ibv_send_wr, ty: ffi::ibv_qp_type) -> Result<SendWr, Errno> {
    // SAFETY: these unions hold plain integers (u32 imm/invalidate_rkey; rdma and atomic are
    // plain-integer structs that fit in the union), so any bytes read are valid values; each is
    // used only for the opcodes that define it.
    let (imm, inv_rkey, rdma, at) = unsafe {
        (u32::from_be(w.__bindgen_anon_1.imm_data), w.__bindgen_anon_1.invalidate_rkey, w.wr.rdma, w.wr.atomic)
    };
    let op = match w.opcode {
        ffi::IBV_WR_SEND => SendOp::Send,
        ffi::IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        ffi::IBV_WR_SEND_WITH_INV => SendOp::SendWithInv { rkey: inv_rkey },
        ffi::IBV_WR_RDMA_WRITE => SendOp::Write { remote_addr: rdma.remote_addr, rkey: rdma.rkey },
        ffi::IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm { remote_addr: rdma.remote_addr, rkey: rdma.rkey, imm },
        ffi::IBV_WR_RDMA_READ => SendOp::Read { remote_addr: rdma.remote_addr, rkey: rdma.rkey },
        ffi::IBV_WR_ATOMIC_CMP_AND_SWP => {
            SendOp::CompareSwap { remote_addr: at.remote_addr, rkey: at.rkey, compare: at.compare_add, swap: at.swap }
        }
        ffi::IBV_WR_ATOMIC_FETCH_AND_ADD => {
            SendOp::FetchAdd { remote_addr: at.remote_addr, rkey: at.rkey, add: at.compare_add }
        }
        // The 8 bytes to write are the WR's gather list (rxe takes them from sg_list).
        ffi::IBV_WR_ATOMIC_WRITE => SendOp::AtomicWrite { remote_addr: rdma.remote_addr, rkey: rdma.rkey },
        ffi::IBV_WR_LOCAL_INV => SendOp::LocalInv { rkey: inv_rkey },
        ffi::IBV_WR_BIND_MW => {
            // SAFETY: with IBV_WR_BIND_MW the program filled bind_mw; its window and region are
            // NULL or live (this function's contract).
            unsafe {
                let b = w.__bindgen_anon_2.bind_mw;
                crate::mem::bind_op(b.mw, b.rkey, &b.bind_info)?
            }
        }
        _ => return Err(EINVAL),
    };
    // SAFETY: the request's sg_list holds num_sge entries (this function's contract).
    let mut wr = SendWr::new(w.wr_id, op, unsafe { sges(w.sg_list, w.num_sge) }?);
    let f = w.send_flags;
    wr.signaled = f & ffi::IBV_SEND_SIGNALED != 0;
    wr.fence = f & ffi::IBV_SEND_FENCE != 0;
    wr.solicited = f & ffi::IBV_SEND_SOLICITED != 0;
    wr.inline = f & ffi::IBV_SEND_INLINE != 0;
    if ty == ffi::IBV_QPT_XRC_SEND {
        // SAFETY: on an XRC initiator the program sets qp_type.xrc (a u32 union member).
        wr.remote_srqn = unsafe { w.qp_type.xrc.remote_srqn };
    }
    if ty == ffi::IBV_QPT_UD {
        // SAFETY: on a UD QP the program fills wr.ud, whose `ah` is NULL or an address handle of
        // this library (an Ah) not yet destroyed.
        let (ud, ah) = unsafe {
            let ud = w.wr.ud;
            (ud, (ud.ah as *const Ah).as_ref().ok_or(EINVAL)?)
        };
        wr.ud = Some(UdDest { dest: ah.dest, remote_qpn: ud.remote_qpn, remote_qkey: ud.remote_qkey });
    }
    Ok(wr)
}

/// Posts a list: the valid prefix goes to the queue; the first request that is not posted is
/// `bad`, and its error is the post's.
fn post<W, T>(
    items: Vec<(W, *mut T)>,
    conv_err: Option<(c_int, *mut T)>,
    bad: *mut *mut T,
    run: impl FnOnce(Vec<W>) -> Result<(), softrdma_device::verbs::Error>,
) -> c_int {
    let ptrs: Vec<*mut T> = items.iter().map(|(_, p)| *p).collect();
    let wrs = items.into_iter().map(|(w, _)| w).collect();
    let (err, at) = match run(wrs) {
        Ok(()) => match conv_err {
            None => return 0,
            Some((e, p)) => (e, p),
        },
        Err(softrdma_device::verbs::Error::Post { err, index }) => (err.errno(), ptrs[index]),
        Err(e) => (crate::errno_of(&e), ptrs.first().copied().unwrap_or(std::ptr::null_mut())),
    };
    // SAFETY: `bad` is the caller's out-pointer (or NULL).
    if let Some(b) = unsafe { bad.as_mut() } {
        *b = at;
    }
    err
}

ffi_callback! {
    #[on_panic = crate::callback::post_failed(bad, wr)]
    fn post_send(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        let r = crate::guarded(|| {
            let q = qp_of(qp)?;
            let mut items = Vec::new();
            let mut conv_err = None;
            let mut p = wr;
            // SAFETY: qp_of accepted `qp` as a live QP of this library.
            let ty = crate::ofed_xrc::upstream_type(unsafe { (*qp).qp_type });
            // SAFETY: ibv_post_send(3): `wr` is a NULL-terminated list of readable work requests,
            // each as send_wr requires, which the program leaves alone during the call.
            while let Some(w) = unsafe { p.as_ref() } {
                // SAFETY: as above.
                match unsafe { send_wr(w, ty) } {
                    Ok(s) => items.push((s, p)),
                    Err(Errno(e)) => {
                        conv_err = Some((e, p));
                        break;
                    }
                }
                p = w.next;
            }
            Ok(post(items, conv_err, bad, |wrs| q.inner().post_send(wrs)))
        });
        r.unwrap_or_else(|Errno(e)| {
            // SAFETY: ibv_post_send(3): `bad` is NULL or a writable slot for the failed request.
            if let Some(b) = unsafe { bad.as_mut() } {
                *b = wr;
            }
            e
        })
    }
}

/// Receive requests with the C request each came from, and the first one that could not be read
/// (its errno).
type RecvList = (Vec<(RecvWr, *mut ffi::ibv_recv_wr)>, Option<(c_int, *mut ffi::ibv_recv_wr)>);

/// The requests of a receive list.
///
/// # Safety
/// ibv_post_recv(3)'s contract: `wr` is a NULL-terminated list of readable requests, each with
/// num_sge entries in its sg_list.
unsafe fn recv_list(wr: *mut ffi::ibv_recv_wr) -> RecvList {
    let mut items = Vec::new();
    let mut p = wr;
    // SAFETY: per the contract, every `next` is NULL or a readable request.
    while let Some(w) = unsafe { p.as_ref() } {
        // SAFETY: per the contract, sg_list holds num_sge entries.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(sg_list) => items.push((RecvWr { wr_id: w.wr_id, sg_list }, p)),
            Err(Errno(e)) => return (items, Some((e, p))),
        }
        p = w.next;
    }
    (items, None)
}

ffi_callback! {
    #[on_panic = crate::callback::eio()]
    fn post_recv(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_recv_wr,
        bad: *mut *mut ffi::ibv_recv_wr,
    ) -> c_int {
        let r = crate::guarded(|| {
            let q = qp_of(qp)?;
            // SAFETY: qp_of accepted `qp` as a live QP of this library.
            if !unsafe { (*qp).srq }.is_null() {
                // A QP attached to an SRQ has no receive queue of its own.
                // SAFETY: ibv_post_recv(3): `bad` is NULL or a writable slot.
                if let Some(b) = unsafe { bad.as_mut() } {
                    *b = wr;
                }
                return Ok(libc::EINVAL);
            }
            // SAFETY: ibv_post_recv(3): `wr` is the program's NULL-terminated list of requests.
            let (items, conv_err) = unsafe { recv_list(wr) };
            Ok(post(items, conv_err, bad, |wrs| q.inner().post_recv(wrs)))
        });
        r.unwrap_or_else(|Errno(e)| e)
    }
}

ffi_callback! {
    #[on_panic = crate::callback::eio()]
    fn post_srq_recv(
        srq: *mut ffi::ibv_srq,
        wr: *mut ffi::ibv_recv_wr,
        bad: *mut *mut ffi::ibv_recv_wr,
    ) -> c_int {
        let r = crate::guarded(|| {
            let s = srq_of(srq)?;
            // SAFETY: ibv_post_srq_recv(3): `wr` is the program's NULL-terminated list of requests.
            let (items, conv_err) = unsafe { recv_list(wr) };
            Ok(post(items, conv_err, bad, |wrs| s.inner().post_recv(wrs)))
        });
        r.unwrap_or_else(|Errno(e)| e)
    }
}

/// Posts one send work request (ibv_bind_mw).
pub(crate) fn post_one(qp: *mut ffi::ibv_qp, wr: SendWr) -> Result<(), Errno> {
    qp_of(qp)?.inner().post_send(vec![wr])?;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ffi::ibv_qp, gid: *const ffi::ibv_gid, _lid: u16) -> c_int {
    errno_call(|| {
        let q = qp_of(qp)?;
        // SAFETY: ibv_attach_mcast(3)/ibv_detach_mcast(3): `gid` is NULL or a readable ibv_gid.
        let g = unsafe { gid.as_ref() }.ok_or(EINVAL)?;
        // SAFETY: ibv_gid's members are all plain bytes (raw, or two u64), so raw is always valid.
        q.inner().attach_mcast(gid_ip(unsafe { g.raw }))?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ffi::ibv_qp, gid: *const ffi::ibv_gid, _lid: u16) -> c_int {
    errno_call(|| {
        let q = qp_of(qp)?;
        // SAFETY: ibv_attach_mcast(3)/ibv_detach_mcast(3): `gid` is NULL or a readable ibv_gid.
        let g = unsafe { gid.as_ref() }.ok_or(EINVAL)?;
        // SAFETY: ibv_gid's members are all plain bytes (raw, or two u64), so raw is always valid.
        q.inner().detach_mcast(gid_ip(unsafe { g.raw }))?;
        Ok(())
    })
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

pub(crate) fn fill_ops(v: &mut ffi::verbs_context) {
    v.context.ops.post_send = Some(post_send);
    v.context.ops.post_recv = Some(post_recv);
    v.context.ops.post_srq_recv = Some(post_srq_recv);
    v.create_qp_ex = Some(create_qp_ex);
    v.open_qp = Some(open_qp);
    v.create_srq_ex = Some(create_srq_ex);
    v.get_srq_num = Some(get_srq_num);
}

// The extended QP's work-request builder (ibv_wr_start ... ibv_wr_complete).

impl Ours<ffi::ibv_qp_ex> {
    /// The Qp behind an extended QP.
    fn qp(&self) -> &Qp {
        // SAFETY: an Ours is a live object of this library (Ours::new), and every ibv_qp_ex this
        // library hands out is the first field of a Qp (`create`, `open_qp`).
        unsafe { &*(self.as_ptr() as *const Qp) }
    }
}

/// Runs `f` on the QP's batch under its lock (threads may call these at once; each call is then
/// whole, though interleaving two threads' batches on one QP is the program's error).
fn with<R>(qp: Ours<ffi::ibv_qp_ex>, f: impl FnOnce(&mut Build) -> R) -> R {
    f(&mut lock(&qp.qp().build))
}

/// Applies `f` to the batch's last work request; with none, the batch fails with EINVAL.
fn on_last(qp: Ours<ffi::ibv_qp_ex>, f: impl FnOnce(&mut SendWr)) {
    with(qp, |b| match b.wrs.last_mut() {
        Some(w) => f(w),
        None => fail(b),
    })
}

fn fail(b: &mut Build) {
    b.err.get_or_insert(libc::EINVAL);
}

/// The failure of an `ibv_wr_*` builder that panicked (see `ffi_callback!`): EIO for the batch,
/// unless it has failed already, so that its `ibv_wr_complete` posts nothing and returns the
/// error. The lock tolerates the poison of a panic that held it.
fn wr_failed(qp: Ours<ffi::ibv_qp_ex>) {
    with(qp, |b| {
        b.err.get_or_insert(libc::EIO);
    });
}

/// Adds a work request of `op` to the batch, with the wr_id and flags the program set in `qp`.
fn push(qp: Ours<ffi::ibv_qp_ex>, op: SendOp) {
    // The program sets wr_id and wr_flags before each ibv_wr_* call.
    let (f, wr_id) = (qp.qp().ex.wr_flags, qp.qp().ex.wr_id);
    let mut wr = SendWr::new(wr_id, op, Vec::new());
    wr.signaled = f & ffi::IBV_SEND_SIGNALED != 0;
    wr.fence = f & ffi::IBV_SEND_FENCE != 0;
    wr.solicited = f & ffi::IBV_SEND_SOLICITED != 0;
    with(qp, |b| b.wrs.push(wr));
}

ffi_callback! {
    /// `ibv_wr_start`: a new batch.
    #[on_panic = wr_failed(qp)]
    fn wr_start(qp: Ours<ffi::ibv_qp_ex>) {
        with(qp, |b| *b = Build::default())
    }
}

ffi_callback! {
    /// `ibv_wr_abort`: the batch is dropped.
    #[on_panic = wr_failed(qp)]
    fn wr_abort(qp: Ours<ffi::ibv_qp_ex>) {
        with(qp, |b| *b = Build::default())
    }
}

ffi_callback! {
    /// `ibv_wr_complete`: the batch is posted, or its first error returned.
    #[on_panic = crate::callback::eio()]
    fn wr_complete(qp: Ours<ffi::ibv_qp_ex>) -> c_int {
        let b = with(qp, std::mem::take);
        if let Some(e) = b.err {
            return e;
        }
        let r = crate::guarded(|| {
            let q = qp_of(qp.as_ptr() as *mut ffi::ibv_qp)?;
            q.inner().post_send(b.wrs)?;
            Ok(())
        });
        // The inline data was copied at post; its buffers may go now.
        drop(b.inline);
        match r {
            Ok(()) => 0,
            Err(Errno(e)) => e,
        }
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_send(qp: Ours<ffi::ibv_qp_ex>) {
        push(qp, SendOp::Send)
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_send_imm(qp: Ours<ffi::ibv_qp_ex>, imm: u32) {
        push(qp, SendOp::SendWithImm { imm: u32::from_be(imm) })
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_send_inv(qp: Ours<ffi::ibv_qp_ex>, rkey: u32) {
        push(qp, SendOp::SendWithInv { rkey })
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_rdma_write(qp: Ours<ffi::ibv_qp_ex>, rkey: u32, remote_addr: u64) {
        push(qp, SendOp::Write { remote_addr, rkey })
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_rdma_write_imm(qp: Ours<ffi::ibv_qp_ex>, rkey: u32, remote_addr: u64, imm: u32) {
        push(qp, SendOp::WriteWithImm { remote_addr, rkey, imm: u32::from_be(imm) })
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_rdma_read(qp: Ours<ffi::ibv_qp_ex>, rkey: u32, remote_addr: u64) {
        push(qp, SendOp::Read { remote_addr, rkey })
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_atomic_cmp_swp(qp: Ours<ffi::ibv_qp_ex>, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
        push(qp, SendOp::CompareSwap { remote_addr, rkey, compare, swap })
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_atomic_fetch_add(qp: Ours<ffi::ibv_qp_ex>, rkey: u32, remote_addr: u64, add: u64) {
        push(qp, SendOp::FetchAdd { remote_addr, rkey, add })
    }
}

ffi_callback! {
    /// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` are copied now, as the WR's inline data.
    #[on_panic = wr_failed(qp)]
    fn wr_atomic_write(qp: Ours<ffi::ibv_qp_ex>, rkey: u32, remote_addr: u64, atomic_wr: *const c_void) {
        push(qp, SendOp::AtomicWrite { remote_addr, rkey });
        // SAFETY: ibv_wr_atomic_write(3): `atomic_wr` points to 8 readable bytes.
        unsafe { set_inline(qp, &[(atomic_wr as *const u8, 8)]) }
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_local_inv(qp: Ours<ffi::ibv_qp_ex>, rkey: u32) {
        push(qp, SendOp::LocalInv { rkey })
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_bind_mw(
        qp: Ours<ffi::ibv_qp_ex>,
        mw: *mut ffi::ibv_mw,
        rkey: u32,
        info: *const ffi::ibv_mw_bind_info,
    ) {
        // SAFETY: ibv_wr_bind_mw(3): `info` is NULL or a readable ibv_mw_bind_info whose region is
        // NULL or live, and `mw` is the program's window.
        let op = unsafe { info.as_ref().map(|i| crate::mem::bind_op(mw, rkey, i)) };
        match op {
            Some(Ok(op)) => push(qp, op),
            _ => with(qp, fail),
        }
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_set_sge(qp: Ours<ffi::ibv_qp_ex>, lkey: u32, addr: u64, length: u32) {
        on_last(qp, |w| w.sg_list = vec![Sge { addr, length, lkey }])
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_set_sge_list(qp: Ours<ffi::ibv_qp_ex>, n: usize, list: *const ffi::ibv_sge) {
        // SAFETY: ibv_wr_set_sge_list(3): `list` holds `n` readable ibv_sge.
        match unsafe { sges(list as *mut ffi::ibv_sge, n as c_int) } {
            Ok(s) => on_last(qp, |w| w.sg_list = s),
            Err(_) => with(qp, fail),
        }
    }
}

/// Inline data is copied now: the program may reuse its buffers as soon as the call returns.
///
/// # Safety
/// Each `(p, n)` of `bufs` with n > 0 is NULL or `n` readable bytes.
unsafe fn set_inline(qp: Ours<ffi::ibv_qp_ex>, bufs: &[(*const u8, usize)]) {
    let mut data = Vec::new();
    for &(p, n) in bufs {
        if n > 0 {
            if p.is_null() {
                return with(qp, fail);
            }
            // SAFETY: per the contract, a non-NULL `p` has `n` readable bytes.
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
        }
    }
    let data = data.into_boxed_slice();
    let sge = Sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 };
    with(qp, |b| match b.wrs.last_mut() {
        Some(w) => {
            w.inline = true;
            w.sg_list = vec![sge];
            b.inline.push(data);
        }
        None => fail(b),
    })
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_set_inline_data(qp: Ours<ffi::ibv_qp_ex>, addr: *mut c_void, length: usize) {
        // SAFETY: ibv_wr_set_inline_data(3): `addr` has `length` readable bytes.
        unsafe { set_inline(qp, &[(addr as *const u8, length)]) }
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_set_inline_data_list(qp: Ours<ffi::ibv_qp_ex>, n: usize, list: *const ffi::ibv_data_buf) {
        if n > 0 && list.is_null() {
            return with(qp, fail);
        }
        // SAFETY: ibv_wr_set_inline_data_list(3): `list` (non-NULL when n > 0) holds `n` readable
        // ibv_data_buf, and i < n.
        let bufs: Vec<(*const u8, usize)> = (0..n)
            .map(|i| unsafe {
                let b = &*list.add(i);
                (b.addr as *const u8, b.length)
            })
            .collect();
        // SAFETY: the same contract: each buffer has its `length` readable bytes.
        unsafe { set_inline(qp, &bufs) }
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_set_ud_addr(qp: Ours<ffi::ibv_qp_ex>, ah: *mut ffi::ibv_ah, remote_qpn: u32, remote_qkey: u32) {
        // SAFETY: ibv_wr_set_ud_addr(3): `ah` is NULL or an address handle of this library (an Ah)
        // the program has not destroyed.
        match unsafe { (ah as *const Ah).as_ref() }.map(|a| a.dest) {
            Some(dest) => on_last(qp, |w| w.ud = Some(UdDest { dest, remote_qpn, remote_qkey })),
            None => with(qp, fail),
        }
    }
}

ffi_callback! {
    #[on_panic = wr_failed(qp)]
    fn wr_set_xrc_srqn(qp: Ours<ffi::ibv_qp_ex>, srqn: u32) {
        on_last(qp, |w| w.remote_srqn = srqn)
    }
}

fn fill_ex(ex: &mut ffi::ibv_qp_ex) {
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_atomic_write = Some(wr_atomic_write);
    ex.wr_local_inv = Some(wr_local_inv);
    ex.wr_bind_mw = Some(wr_bind_mw);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
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
mod builder_test {
    use super::*;

    /// The builder's batch, as `ibv_wr_*` calls leave it (on a QP with no device QP, whose
    /// ibv_wr_complete fails with EINVAL once the batch is good).
    #[test]
    fn the_builder_collects_a_batch() {
        let mut q = unbacked();
        let ex = q.ex;
        let qp = &mut *q as *mut Qp as *mut ffi::ibv_qp_ex;
        let data = [1u8, 2, 3];
        // SAFETY: `qp` is a Qp of this test's, and `data` has the 3 bytes given.
        unsafe {
            ex.wr_start.unwrap()(qp);
            (*qp).wr_id = 7;
            (*qp).wr_flags = ffi::IBV_SEND_SIGNALED;
            ex.wr_rdma_write.unwrap()(qp, 5, 0x1000);
            ex.wr_set_sge.unwrap()(qp, 9, 0x2000, 64);
            (*qp).wr_id = 8;
            (*qp).wr_flags = 0;
            ex.wr_send_imm.unwrap()(qp, 0x0102_0304u32.to_be());
            ex.wr_set_inline_data.unwrap()(qp, data.as_ptr() as *mut c_void, data.len());
        }
        {
            let b = lock(&q.build);
            assert_eq!(b.err, None);
            let w = &b.wrs;
            assert_eq!((w.len(), w[0].wr_id, w[0].signaled), (2, 7, true));
            assert_eq!(w[0].op, SendOp::Write { remote_addr: 0x1000, rkey: 5 });
            assert_eq!(w[0].sg_list, vec![Sge { addr: 0x2000, length: 64, lkey: 9 }]);
            assert_eq!((w[1].wr_id, w[1].signaled, w[1].inline), (8, false, true));
            assert_eq!(w[1].op, SendOp::SendWithImm { imm: 0x0102_0304 });
            assert_eq!(&*b.inline[0], &data);
            assert_eq!(w[1].sg_list[0].addr, b.inline[0].as_ptr() as u64);
        }
        // SAFETY: as above.
        unsafe {
            assert_eq!(ex.wr_complete.unwrap()(qp), libc::EINVAL, "no device QP");
            assert!(lock(&q.build).wrs.is_empty(), "the batch is gone");
            ex.wr_start.unwrap()(qp);
            ex.wr_set_sge.unwrap()(qp, 1, 2, 3);
            assert!(lock(&q.build).err.is_some());
            assert_eq!(ex.wr_complete.unwrap()(qp), libc::EINVAL, "an SGE without a request");
            ex.wr_start.unwrap()(qp);
            ex.wr_send.unwrap()(qp);
            ex.wr_abort.unwrap()(qp);
            assert!(lock(&q.build).wrs.is_empty(), "aborted");
        }
    }
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
