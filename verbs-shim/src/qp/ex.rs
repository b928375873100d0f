//! The extended QP's work-request builder (`ibv_wr_start` ... `ibv_wr_complete`, the `ibv_qp_ex`
//! ops).

use std::ffi::{c_int, c_void};

use softrdma_device::verbs::{SendOp, SendWr, Sge, UdDest};

use super::post::sges;
use super::*;
use crate::callback::Ours;
use crate::context::lock;
use crate::ffi;
use crate::mem::Ah;
use crate::Errno;

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

pub(super) fn fill_ex(ex: &mut ffi::ibv_qp_ex) {
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
