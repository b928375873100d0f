//! XRC on the provider data path (`SOFTRDMA_DATAPATH=provider`).
//!
//! An XRC domain, its SRQs and its target QPs are the daemon's (docs/architecture.md D2 revised;
//! the data-path issue's item 5): several processes share a domain through a file, and a target QP
//! outlives the process that made it and serves the SRQs of all of them. So a provider context
//! keeps a second context of this process on the device's own data path, its *XRC side*, opened at
//! its first `ibv_open_xrcd`, and makes the domain, its SRQs and its target QPs there. Initiator
//! QPs stay in the provider: they only send, to target QPs the port steers to the daemon.
//!
//! An XRC SRQ names a PD and a CQ of the program, and its receive buffers name the program's
//! memory regions; all of those live in the provider. The XRC side holds a twin of each it needs:
//! - a PD twin for each provider PD an XRC SRQ names;
//! - a CQ twin for each provider CQ an XRC SRQ completes into: polling the CQ polls its twin too,
//!   arming it arms the twin, and when the twin's channel fires a bridge thread fires the CQ's
//!   own channel (`Request::RaiseCqEvent`), so a program sleeping on its channel wakes;
//! - a registration twin for each provider region that an XRC receive names (lkeys are
//!   translated at post) or that grants remote access: such a twin is made when the XRC side
//!   opens or the region is registered, and answers to the provider's rkey too
//!   (`Request::AliasRkey`), so RDMA that arrives through a target QP finds the program's memory
//!   under the key the program gave out.
//!
//! The XRC side's async events (its target QP handles', its SRQs') move to the provider
//! context's queue through a bridge thread (`Request::QueueEvent`), where the program reads them
//! with the rest. A twin goes with its original; destroying a PD or CQ that an XRC SRQ still
//! uses is EBUSY, as it would be on the device path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::*;

/// How often bridge threads look whether their context is gone.
const BRIDGE_TICK: Duration = Duration::from_millis(100);

/// A provider context's objects on the device's own data path (see the module doc).
pub(super) struct XrcSide {
    /// This process's context on the device's data path.
    pub(super) ctx: Context,
    /// PD twins, by the provider PD.
    pds: Mutex<FastMap<PdId, Arc<ProtectionDomain>>>,
    /// Registration twins, by the provider lkey.
    mrs: Mutex<FastMap<u32, RawMr>>,
    /// Channel twins, by the provider channel's id.
    channels: Mutex<FastMap<u32, Arc<CompletionChannel>>>,
    /// Which provider CQ each CQ twin stands for (for the channel bridges).
    cq_of: Arc<Mutex<FastMap<CqId, CqId>>>,
    /// Set when the provider context goes: the bridge threads end.
    stop: Arc<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for XrcSide {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl XrcSide {
    /// Opens the XRC side of the provider context `host` on the daemon `dir`/`name`, with a
    /// twin of each of its regions that grants remote access, and starts its event bridge.
    fn open(host: &Context, dir: &std::path::Path, name: &str) -> Result<XrcSide> {
        let ctx = Context::open_in(dir, name)?;
        let side = XrcSide {
            ctx,
            pds: Default::default(),
            mrs: Default::default(),
            channels: Default::default(),
            cq_of: Default::default(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let remote: Vec<(u32, (PdId, u64, u64, Access))> =
            host.inner.mrs_lock().iter().filter(|(_, m)| remotely_reachable(m.3)).map(|(k, m)| (*k, *m)).collect();
        for (lkey, m) in remote {
            side.twin_mr(lkey, m)?;
        }
        side.start_event_bridge(Arc::downgrade(&host.inner))?;
        Ok(side)
    }

    /// The PD twin of provider PD `pd`.
    fn pd(&self, pd: PdId) -> Result<Arc<ProtectionDomain>> {
        let mut pds = lock(&self.pds);
        if let Some(p) = pds.get(&pd) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.ctx.alloc_pd()?);
        pds.insert(pd, p.clone());
        Ok(p)
    }

    /// Registers the twin of provider region `lkey` (`m`: its PD, range and access); for a
    /// region that grants remote access, with the provider's rkey as an alias.
    fn twin_mr(&self, lkey: u32, m: (PdId, u64, u64, Access)) -> Result<u32> {
        let (pd, addr, len, access) = m;
        let spd = self.pd(pd)?;
        // SAFETY: the range is the provider region's, which the program keeps mapped while it is
        // registered; the twin goes when the region does (`forget_mr`).
        let twin = unsafe { spd.reg_mr_raw(addr, len, access)? };
        let twin_lkey = twin.keys().lkey;
        if remotely_reachable(access) {
            // The engine gives a region one key for both uses (rkey = lkey).
            let rkey = lkey;
            if let Err(e) = self.ctx.inner.call(Request::AliasRkey { lkey: twin_lkey, rkey }) {
                // The provider's keys come from key blocks the daemon reserved for it
                // (engine/src/device/keys.rs), so no key of the daemon's or of another provider
                // equals this one; should the daemon refuse anyway, RDMA through a target QP
                // with it fails as a remote access error, and sends still work.
                tracing::warn!("XRC side: rkey {rkey:#x} of region {lkey:#x} not usable through target QPs: {e}");
            }
        }
        lock(&self.mrs).insert(lkey, twin);
        Ok(twin_lkey)
    }

    /// The twin's lkey of provider region `lkey` (made now if there is none yet), or `lkey`
    /// itself for a key the provider does not know (the device then fails the receive as a
    /// bad lkey, as it would on the device path).
    fn lkey(&self, host: &Context, lkey: u32) -> Result<u32> {
        if let Some(t) = lock(&self.mrs).get(&lkey) {
            return Ok(t.keys().lkey);
        }
        let m = host.inner.mrs_lock().get(&lkey).copied();
        match m {
            Some(m) => self.twin_mr(lkey, m),
            None => Ok(lkey),
        }
    }

    /// The CQ twin of provider CQ `cq` (made now, on a twin of its channel, if there is none).
    fn cq(&self, cq: &CompletionQueue) -> Result<CqId> {
        let mut made = lock(&cq.xrc_guard);
        if let Some(t) = cq.xrc.get() {
            return Ok(t.id);
        }
        let channel = match cq.channel {
            Some(ch) => Some(self.channel(ch, Arc::downgrade(&cq.ctx.inner))?),
            None => None,
        };
        let t = self.ctx.create_cq(cq.cqe.load(Ordering::Relaxed), channel.as_deref())?;
        lock(&self.cq_of).insert(t.id, cq.id);
        if channel.is_some() {
            // The program may have armed its CQ before an XRC SRQ named it (ibv_xsrq_pingpong
            // -e arms it right after ibv_create_cq): the twin starts armed, and its bridge's
            // `RaiseCqEvent` fires the CQ's channel only if the CQ itself is armed, so an
            // event reaches the program when it asked for one. (A CQ armed for solicited
            // completions only before then wakes at the twin's first completion, solicited or
            // not: an early wake, which a program that re-polls after each event tolerates.)
            t.req_notify(false)?;
        }
        let id = t.id;
        let _ = cq.xrc.set(Box::new(t));
        *made = true;
        Ok(id)
    }

    /// The channel twin of provider channel `ch`, with its bridge thread.
    fn channel(&self, ch: u32, host: Weak<Inner>) -> Result<Arc<CompletionChannel>> {
        let mut chans = lock(&self.channels);
        if let Some(c) = chans.get(&ch) {
            return Ok(c.clone());
        }
        let twin = Arc::new(self.ctx.create_comp_channel()?);
        let (t, stop, cq_of) = (twin.clone(), self.stop.clone(), self.cq_of.clone());
        std::thread::Builder::new()
            .name("softrdma-xrc-cq".into())
            .spawn(move || {
                crate::signals::keep_off_this_thread();
                while !stop.load(Ordering::SeqCst) {
                    match t.get_cq_event(Some(BRIDGE_TICK)) {
                        Ok(Some(twin_cq)) => {
                            let (Some(inner), Some(cq)) = (host.upgrade(), lock(&cq_of).get(&twin_cq).copied()) else {
                                continue;
                            };
                            let _ = inner.call(Request::RaiseCqEvent(cq));
                        }
                        Ok(None) => {}
                        Err(_) => return,
                    }
                }
            })
            .map_err(|_| Error::Verbs(VerbsError::NoMem))?;
        chans.insert(ch, twin.clone());
        Ok(twin)
    }

    /// Moves the XRC side's async events to the provider context's queue.
    fn start_event_bridge(&self, host: Weak<Inner>) -> Result<()> {
        let (side, stop) = (self.ctx.clone(), self.stop.clone());
        std::thread::Builder::new()
            .name("softrdma-xrc-events".into())
            .spawn(move || {
                crate::signals::keep_off_this_thread();
                while !stop.load(Ordering::SeqCst) {
                    match side.get_async_event(Some(BRIDGE_TICK)) {
                        Ok(Some(e)) => {
                            let Some(inner) = host.upgrade() else { return };
                            let _ = inner.call(Request::QueueEvent(e));
                        }
                        Ok(None) => {}
                        Err(_) => return,
                    }
                }
            })
            .map_err(|_| Error::Verbs(VerbsError::NoMem))?;
        Ok(())
    }
}

/// Whether a region with `access` can be the target of RDMA or atomics.
fn remotely_reachable(access: Access) -> bool {
    access.intersects(Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
}

impl Context {
    /// This provider context's XRC side, opened now if it is not yet.
    pub(super) fn xrc_side(&self) -> Result<&XrcSide> {
        if let Some(x) = self.inner.xrc.get() {
            return Ok(x);
        }
        let _once = lock(&self.inner.xrc_opening);
        if let Some(x) = self.inner.xrc.get() {
            return Ok(x);
        }
        let Some((dir, name)) = &self.inner.daemon_at else { return Err(Error::Verbs(VerbsError::NotSupp)) };
        let side = XrcSide::open(self, dir, name)?;
        let _ = self.inner.xrc.set(side);
        Ok(self.inner.xrc.get().expect("just set"))
    }
}

impl Inner {
    /// A provider region was registered: with an XRC side open, a region that grants remote
    /// access gets its twin now (RDMA through a target QP may come before any receive names it).
    pub(super) fn xrc_registered(self: &Arc<Inner>, lkey: u32) {
        let Some(x) = self.xrc.get() else { return };
        let m = self.mrs_lock().get(&lkey).copied();
        if let Some(m) = m.filter(|m| remotely_reachable(m.3)) {
            if let Err(e) = x.twin_mr(lkey, m) {
                tracing::warn!("XRC side: no twin for region {lkey:#x}: {e}");
            }
        }
    }

    /// A provider region goes (or changes): its twin goes too (a changed one is made again when
    /// it is next needed).
    pub(super) fn xrc_forget_mr(&self, lkey: u32) {
        if let Some(x) = self.xrc.get() {
            let twin = lock(&x.mrs).remove(&lkey);
            drop(twin);
        }
    }

    /// Destroys the twin of provider PD `pd`, if any: EBUSY while an XRC SRQ uses it.
    pub(super) fn xrc_destroy_pd(&self, pd: PdId) -> Result<()> {
        let Some(x) = self.xrc.get() else { return Ok(()) };
        let Some(twin) = lock(&x.pds).remove(&pd) else { return Ok(()) };
        match Arc::try_unwrap(twin) {
            Ok(t) => t.destroy().map_err(|(t, e)| {
                lock(&x.pds).insert(pd, Arc::new(t));
                e
            }),
            // An SRQ being made right now holds it.
            Err(t) => {
                lock(&x.pds).insert(pd, t);
                Err(Error::Verbs(VerbsError::Busy))
            }
        }
    }
}

impl CompletionQueue {
    /// Destroys this CQ's twin, if any: EBUSY while an XRC SRQ completes into it.
    pub(super) fn xrc_destroy(&mut self) -> Result<()> {
        let Some(t) = self.xrc.take() else { return Ok(()) };
        let id = t.id;
        match (*t).destroy() {
            Ok(()) => {
                if let Some(x) = self.ctx.inner.xrc.get() {
                    lock(&x.cq_of).remove(&id);
                }
                Ok(())
            }
            Err((t, e)) => {
                let _ = self.xrc.set(Box::new(t));
                Err(e)
            }
        }
    }
}

/// What a provider's XRC SRQ needs of its host: the twins of a PD and a CQ, and receives whose
/// buffers name the twins' keys.
#[derive(Clone)]
pub(super) struct XrcHost {
    pub(super) host: Context,
}

impl XrcHost {
    /// The twins (PD, CQ) on the XRC side for the provider's `pd` and `cq`; EINVAL for objects
    /// of another context.
    pub(super) fn twins(&self, pd: &ProtectionDomain, cq: &CompletionQueue) -> Result<(Arc<ProtectionDomain>, CqId)> {
        if !Arc::ptr_eq(&pd.ctx.inner, &self.host.inner) || !Arc::ptr_eq(&cq.ctx.inner, &self.host.inner) {
            return Err(Error::Verbs(VerbsError::Inval));
        }
        let x = self.host.xrc_side()?;
        Ok((x.pd(pd.id)?, x.cq(cq)?))
    }

    /// `wr` with its buffers' provider lkeys replaced by their twins'.
    pub(super) fn translate(&self, mut wr: RecvWr) -> Result<RecvWr> {
        let x = self.host.xrc_side()?;
        for s in wr.sg_list.iter_mut() {
            s.lkey = x.lkey(&self.host, s.lkey)?;
        }
        Ok(wr)
    }
}

/// An XRC domain.
pub struct XrcDomain {
    pub(super) ctx: Context,
    pub(super) id: XrcdId,
    /// A provider's domain (on its XRC side, `xrc`): the provider context.
    pub(super) host: Option<xrc::XrcHost>,
}

impl XrcDomain {
    /// `ibv_close_xrcd`, reporting EBUSY while objects of this process use it.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        let (ctx, req) = (self.ctx.clone(), Request::CloseXrcd(self.id));
        // SAFETY: `me` is never used again; its context is dropped exactly once.
        destroy_now(self, &ctx, req, |me| unsafe { std::ptr::drop_in_place(&mut me.ctx) })
    }

    /// The device's number for this domain (OFED's `ibv_xrc_domain.handle`).
    pub fn id(&self) -> XrcdId {
        self.id
    }

    /// `ibv_create_srq_ex` of type XRC in this domain.
    pub fn create_srq(&self, pd: &ProtectionDomain, cq: &CompletionQueue, attr: SrqAttr) -> Result<SharedReceiveQueue> {
        // On a provider the PD and CQ are the program's: the SRQ takes their twins (`xrc`).
        let twins = match &self.host {
            Some(h) => Some(h.twins(pd, cq)?),
            None => None,
        };
        let (pd_id, cq_id) = twins.as_ref().map_or((pd.id, cq.id), |(p, c)| (p.id, *c));
        match self.ctx.inner.call(Request::CreateXrcSrq { xrcd: self.id, pd: pd_id, cq: cq_id, attr })? {
            Response::Srq { srqn, ring } => Ok(SharedReceiveQueue {
                ctx: self.ctx.clone(),
                srqn,
                ring,
                max_sge: attr.max_sge,
                pd: pd_id,
                host: self.host.clone(),
            }),
            _ => unexpected(),
        }
    }

    /// `ibv_create_qp_ex` of type XRC_RECV: a target QP bound to this domain.
    pub fn create_tgt_qp(&self) -> Result<QueuePair> {
        self.tgt_handle(Request::CreateXrcTgtQp(self.id))
    }

    /// `ibv_open_qp`: a handle on an existing target QP of this domain.
    pub fn open_qp(&self, qpn: u32) -> Result<QueuePair> {
        self.tgt_handle(Request::OpenQp { xrcd: self.id, qpn: Qpn::new(qpn) })
    }

    /// OFED's XRC receive QP: a target QP whose lifetime is `lifetime` whatever the device's
    /// policy (`ibv_create_xrc_rcv_qp`: [`XrcPolicy::DestroyOnLastClose`], the QP goes with its
    /// last registration; `ibv_alloc_xrc_rcv_qp`: [`XrcPolicy::LiveWithDomain`]).
    pub fn create_rcv_qp(&self, lifetime: XrcPolicy) -> Result<QueuePair> {
        self.tgt_handle(Request::CreateXrcRcvQp { xrcd: self.id, lifetime })
    }

    pub(super) fn tgt_handle(&self, req: Request) -> Result<QueuePair> {
        match self.ctx.inner.call(req)? {
            Response::QpHandle(qpn, h) => Ok(QueuePair {
                ctx: self.ctx.clone(),
                qpn,
                qp_type: QpType::XrcTgt,
                handle: Some(h),
                sq: None,
                rq: None,
                caps: QpCaps::default(),
                pd: PdId(0),
                cqs: [None, None],
                state: std::sync::Mutex::new(QpState::Reset),
            }),
            _ => unexpected(),
        }
    }

    /// Leaves a target QP handle open: the QP then lives as long as the domain (not destroyed
    /// when this process exits), as the XRC extension defines.
    pub fn leak_handle(qp: QueuePair) {
        std::mem::forget(qp);
    }
}

impl Drop for XrcDomain {
    fn drop(&mut self) {
        self.ctx.inner.release(Request::CloseXrcd(self.id));
    }
}
