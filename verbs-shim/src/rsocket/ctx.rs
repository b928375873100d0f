//! The verbs context an rsocket makes its CQ, PD and QP on.
//!
//! rsockets, like a program that opens the device itself and hands rdma_cm its own QP
//! (perftest's -R), open one context of their own per device and process, through
//! `ibv_open_device` as a program does (not librdmacm's `id->verbs`, which
//! `SOFTRDMA_CM_DATAPATH=device` can keep on the device path): so they follow `SOFTRDMA_DATAPATH` (the provider data
//! path by default: the process runs its rsockets' QPs, and a program spinning on a
//! non-blocking rrecv drives them itself instead of starving the daemon that would). The rdma_cm
//! ID still connects the QP: librdmacm moves any QP it is given (rdma_create_qp with our PD).

use std::sync::Mutex;

use crate::cma::api;
use crate::{ffi, Errno};

struct Opened {
    /// The process that opened it: a forked child opens its own (its copy of the parent's
    /// provider context takes no datagrams).
    pid: u32,
    device: usize,
    ctx: usize,
    pd: usize,
}

static OPENED: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// The context and PD for rsockets on the device of `verbs` (an rdma_cm ID's context). When
/// the device cannot be opened again, the ID's own context and a PD on it.
pub(super) fn data_context(verbs: *mut ffi::ibv_context) -> Result<(*mut ffi::ibv_context, *mut ffi::ibv_pd), Errno> {
    if verbs.is_null() {
        return Err(Errno(libc::ENODEV));
    }
    // SAFETY: a live context of libibverbs; its device outlives it.
    let device = unsafe { (*verbs).device };
    let pid = std::process::id();
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(o) = opened.iter().find(|o| o.pid == pid && o.device == device as usize) {
        return Ok((o.ctx as *mut ffi::ibv_context, o.pd as *mut ffi::ibv_pd));
    }
    let api = api();
    // SAFETY: the ID's device; the context opened is kept for the process's life (as rdma_cm's
    // are), so the pointers handed out stay valid.
    let mut ctx = unsafe { (api.open_device)(device) };
    if ctx.is_null() {
        ctx = verbs;
    }
    // SAFETY: an open context.
    let pd = unsafe { (api.alloc_pd)(ctx) };
    if pd.is_null() {
        return Err(Errno(crate::last_errno()));
    }
    opened.push(Opened { pid, device: device as usize, ctx: ctx as usize, pd: pd as usize });
    Ok((ctx, pd))
}
