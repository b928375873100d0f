//! Posting: `ibv_post_send`, `ibv_post_recv` and `ibv_post_srq_recv` (the context's ops), the
//! C work requests read into the engine's.

use std::ffi::c_int;

use softrdma_device::verbs::{RecvWr, SendOp, SendWr, Sge, UdDest};

use super::*;
use crate::ffi;
use crate::mem::Ah;
use crate::{Errno, EINVAL};

/// The gather/scatter list of a work request.
///
/// # Safety
/// `list` is NULL or points to `n` readable ibv_sge (a work request's sg_list and num_sge).
pub(super) unsafe fn sges(list: *mut ffi::ibv_sge, n: c_int) -> Result<Vec<Sge>, Errno> {
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

/// The context's posting ops.
pub(super) fn fill_ops(v: &mut ffi::verbs_context) {
    v.context.ops.post_send = Some(post_send);
    v.context.ops.post_recv = Some(post_recv);
    v.context.ops.post_srq_recv = Some(post_srq_recv);
}
