//! Protection domains, memory regions and windows.

use super::*;

/// A protection domain.
pub struct ProtectionDomain {
    pub(super) ctx: Context,
    pub(super) id: PdId,
}

impl ProtectionDomain {
    /// `ibv_dealloc_pd`, reporting EBUSY while objects use it.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        // On a provider: EBUSY while an XRC SRQ uses its twin.
        if let Err(e) = self.ctx.inner.xrc_destroy_pd(self.id) {
            return Err((self, e));
        }
        let (ctx, req) = (self.ctx.clone(), Request::DeallocPd(self.id));
        // SAFETY: `me` is never used again; its context is dropped exactly once.
        destroy_now(self, &ctx, req, |me| unsafe { std::ptr::drop_in_place(&mut me.ctx) })
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// `ibv_reg_mr` of a new zeroed buffer of `len` bytes.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        let buf = vec![0u8; len.max(1)].into_boxed_slice();
        let keys = match self.ctx.inner.call(Request::RegMr {
            pd: self.id,
            addr: buf.as_ptr() as u64,
            len: len as u64,
            access,
        })? {
            Response::Mr(k) => k,
            _ => return unexpected(),
        };
        self.ctx.inner.mrs_lock().insert(keys.lkey, (self.id, buf.as_ptr() as u64, len as u64, access));
        self.ctx.inner.xrc_registered(keys.lkey);
        Ok(MemoryRegion { ctx: self.ctx.clone(), buf, keys })
    }

    /// `ibv_reg_mr` of memory this process owns and keeps alive and in place until the
    /// returned handle is dropped (the device checks the range is mapped: EFAULT otherwise).
    ///
    /// # Safety
    /// `[addr, addr+len)` must stay allocated while the registration lives.
    pub unsafe fn reg_mr_raw(&self, addr: u64, len: u64, access: Access) -> Result<RawMr> {
        match self.ctx.inner.call(Request::RegMr { pd: self.id, addr, len, access })? {
            Response::Mr(keys) => {
                self.ctx.inner.mrs_lock().insert(keys.lkey, (self.id, addr, len, access));
                self.ctx.inner.xrc_registered(keys.lkey);
                Ok(RawMr { ctx: self.ctx.clone(), keys })
            }
            _ => unexpected(),
        }
    }

    /// `ibv_alloc_mw` of type 1 or 2 (bind it with a `SendOp::BindMw` work request).
    pub fn alloc_mw(&self, mw_type: u8) -> Result<MemoryWindow> {
        match self.ctx.inner.call(Request::AllocMw { pd: self.id, mw_type })? {
            Response::Mw(rkey) => Ok(MemoryWindow { ctx: self.ctx.clone(), rkey }),
            _ => unexpected(),
        }
    }

    /// A QP builder on this PD.
    pub fn qp_builder<'a>(&'a self, qp_type: QpType, send_cq: &'a CompletionQueue) -> QueuePairBuilder<'a> {
        QueuePairBuilder {
            pd: self,
            init: QpInit {
                qp_type,
                pd: self.id,
                send_cq: send_cq.id,
                recv_cq: send_cq.id,
                caps: QpCaps {
                    max_send_wr: 128,
                    max_recv_wr: 128,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
                srq: None,
            },
        }
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<SharedReceiveQueue> {
        match self.ctx.inner.call(Request::CreateSrq { pd: self.id, attr })? {
            Response::Srq { srqn, ring } => Ok(SharedReceiveQueue {
                ctx: self.ctx.clone(),
                srqn,
                ring,
                max_sge: attr.max_sge,
                pd: self.id,
                host: None,
            }),
            _ => unexpected(),
        }
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        let _ = self.ctx.inner.xrc_destroy_pd(self.id);
        self.ctx.inner.release(Request::DeallocPd(self.id));
    }
}

/// A registered buffer this handle owns.
pub struct MemoryRegion {
    pub(super) ctx: Context,
    pub(super) buf: Box<[u8]>,
    pub(super) keys: MrKeys,
}

impl MemoryRegion {
    /// Local and remote keys.
    pub fn keys(&self) -> MrKeys {
        self.keys
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }
    /// Start address (what a remote peer names in RDMA WRITE/READ/atomics).
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// The buffer (read it after the completion that says the data is there).
    pub fn as_slice(&self) -> &[u8] {
        // The device writes through process_vm_writev: read fresh bytes, not a cached view.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        &self.buf
    }
    /// The buffer, to fill before posting.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }
    /// An SGE for `range` of the buffer.
    pub fn sge(&self, range: std::ops::Range<usize>) -> Sge {
        assert!(range.start <= range.end && range.end <= self.buf.len(), "SGE outside the region");
        Sge { addr: self.addr() + range.start as u64, length: (range.end - range.start) as u32, lkey: self.keys.lkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Out of the registry first (under its lock), so no post is gathering from the buffer
        // when it is freed.
        self.ctx.inner.mrs_lock().remove(&self.keys.lkey);
        self.ctx.inner.xrc_forget_mr(self.keys.lkey);
        self.ctx.inner.release(Request::DeregMr(self.keys.lkey));
    }
}

/// A memory window.
pub struct MemoryWindow {
    pub(super) ctx: Context,
    pub(super) rkey: u32,
}

impl MemoryWindow {
    /// `ibv_dealloc_mw`, reporting the device's answer.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        let (ctx, req) = (self.ctx.clone(), Request::DeallocMw(self.rkey));
        // SAFETY: `me` is never used again; its context is dropped exactly once.
        destroy_now(self, &ctx, req, |me| unsafe { std::ptr::drop_in_place(&mut me.ctx) })
    }

    /// The R_Key it was allocated with.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// `ibv_inc_rkey`: the same window index with the next key byte (a bind's new R_Key).
    pub fn inc_rkey(rkey: u32) -> u32 {
        (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        self.ctx.inner.release(Request::DeallocMw(self.rkey));
    }
}

/// A registration of memory the caller owns.
pub struct RawMr {
    pub(super) ctx: Context,
    pub(super) keys: MrKeys,
}

impl RawMr {
    /// `ibv_rereg_mr`: a new PD, range or access, keeping the keys. The new range must stay
    /// allocated while the registration lives (as for `reg_mr_raw`).
    ///
    /// # Safety
    /// With a new range, `[addr, addr+len)` must stay allocated while the registration lives.
    pub unsafe fn rereg(
        &mut self,
        pd: Option<&ProtectionDomain>,
        range: Option<(u64, u64)>,
        access: Option<Access>,
    ) -> Result<()> {
        let lkey = self.keys.lkey;
        let req = Request::ReregMr { lkey, pd: pd.map(|p| p.id), range, access };
        // Out of the registry while it changes: no post gathers from it meanwhile.
        let old = self.ctx.inner.mrs_lock().remove(&lkey);
        self.ctx.inner.xrc_forget_mr(lkey);
        let r = self.ctx.inner.call(req);
        if let Some((p, a, l, acc)) = old {
            let entry = match r {
                Ok(_) => {
                    let (a, l) = range.unwrap_or((a, l));
                    (pd.map(|p| p.id).unwrap_or(p), a, l, access.unwrap_or(acc))
                }
                Err(_) => (p, a, l, acc),
            };
            self.ctx.inner.mrs_lock().insert(lkey, entry);
            self.ctx.inner.xrc_registered(lkey);
        }
        r.map(|_| ())
    }

    /// `ibv_dereg_mr`, reporting the device's answer.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        let (ctx, req) = (self.ctx.clone(), Request::DeregMr(self.keys.lkey));
        // Out of the registry first, so no post gathers from memory about to be given back.
        let entry = ctx.inner.mrs_lock().remove(&self.keys.lkey);
        ctx.inner.xrc_forget_mr(self.keys.lkey);
        // SAFETY: `me` is in a ManuallyDrop that is never used again (destroy_now): its context
        // reference is dropped once, here, and nothing else of it needed dropping.
        match destroy_now(self, &ctx, req, |me| unsafe { std::ptr::drop_in_place(&mut me.ctx) }) {
            Ok(()) => Ok(()),
            Err((me, e)) => {
                if let Some(entry) = entry {
                    ctx.inner.mrs_lock().insert(me.keys.lkey, entry);
                    ctx.inner.xrc_registered(me.keys.lkey);
                }
                Err((me, e))
            }
        }
    }

    /// Keys.
    pub fn keys(&self) -> MrKeys {
        self.keys
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        self.ctx.inner.mrs_lock().remove(&self.keys.lkey);
        self.ctx.inner.xrc_forget_mr(self.keys.lkey);
        self.ctx.inner.release(Request::DeregMr(self.keys.lkey));
    }
}
