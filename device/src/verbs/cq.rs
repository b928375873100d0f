//! Completion channels and queues.

use super::*;

/// A completion channel: an fd that is readable while CQ events wait.
pub struct CompletionChannel {
    pub(super) ctx: Context,
    pub(super) id: u32,
    pub(super) fd: OwnedFd,
}

impl CompletionChannel {
    /// `ibv_destroy_comp_channel`, reporting EBUSY while CQs use it.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        let (ctx, req) = (self.ctx.clone(), Request::DestroyCompChannel(self.id));
        // SAFETY: `me` is never used again; its fields are dropped exactly once.
        destroy_now(self, &ctx, req, |me| unsafe {
            std::ptr::drop_in_place(&mut me.ctx);
            std::ptr::drop_in_place(&mut me.fd);
        })
    }

    /// `ibv_get_cq_event`: waits up to `timeout` for the next CQ event; returns the CQ's id.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<CqId>> {
        let next = || match self.ctx.inner.call(Request::GetCqEvent(self.id))? {
            Response::CqEvent(cq) => Ok(cq),
            _ => unexpected(),
        };
        let inner = &self.ctx.inner;
        next_event(self.fd.as_fd(), inner.hangup_fd(), timeout, next, |fd, wait| inner.sleep_on_channel(fd, wait))
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        self.ctx.inner.release(Request::DestroyCompChannel(self.id));
    }
}

/// A completion queue.
pub struct CompletionQueue {
    pub(super) ctx: Context,
    pub(super) id: CqId,
    /// Its completion ring (a resize gives it a new one; polls hold this while they read).
    pub(super) ring: Arc<std::sync::Mutex<RingDesc>>,
    /// The size asked for (for a twin on the XRC side).
    pub(super) cqe: std::sync::atomic::AtomicU32,
    pub(super) channel: Option<u32>,
    /// On a provider, its twin on the XRC side (`xrc`), once an XRC SRQ completes into it.
    pub(super) xrc: std::sync::OnceLock<Box<CompletionQueue>>,
    pub(super) xrc_guard: std::sync::Mutex<bool>,
}

impl CompletionQueue {
    /// `ibv_destroy_cq`, reporting EBUSY while QPs or SRQs use it.
    pub fn destroy(mut self) -> std::result::Result<(), (Self, Error)> {
        if let Err(e) = self.xrc_destroy() {
            return Err((self, e));
        }
        let (ctx, req) = (self.ctx.clone(), Request::DestroyCq(self.id));
        // SAFETY: `me` is never used again; its context is dropped exactly once (its twin is
        // gone: xrc_destroy took it).
        destroy_now(self, &ctx, req, |me| unsafe {
            me.forget_ring();
            std::ptr::drop_in_place(&mut me.ctx)
        })
    }

    /// Its id (what CQ events name).
    pub fn id(&self) -> CqId {
        self.id
    }

    /// Whether the application's polls drive its device ([`crate::hca::Progress::Application`]:
    /// the provider path), so that a poll that found nothing has already done the device's work.
    /// Not for a CQ with an XRC twin: the daemon's thread writes that one's completions, and a
    /// program spinning on it must leave that thread the CPU (with two programs spinning on two
    /// cores, XRC round trips took ~1.4 ms: BENCHMARKS.md, stop 41).
    pub fn application_driven(&self) -> bool {
        self.ctx.inner.application_driven() && self.xrc.get().is_none()
    }

    /// `ibv_poll_cq`: up to `max` completions, read from the completion ring in shared memory
    /// (no system call), or on a provider straight from its engine.
    pub fn poll(&self, max: u32) -> Result<Vec<WorkCompletion>> {
        if max > 0 && !self.ctx.inner.pending_used.load(Ordering::Relaxed) {
            // A provider's CQ with nothing taken off early: straight from its engine, without
            // the ring's lock (its ring stays empty). Any other CQ goes the way below.
            self.ctx.inner.posting.store(false, Ordering::Relaxed);
            if let Some((direct, more)) = self.ctx.inner.poll_direct(self.id, max as usize, true) {
                for wc in &direct {
                    self.ctx.inner.complete_direct(wc);
                }
                return self.finish_poll(direct, max, more);
            }
        }
        let mut entries = Vec::new();
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        // (Set under a ring's lock, which this thread now holds: seen if it matters here.)
        if self.ctx.inner.pending_used.load(Ordering::Relaxed) {
            let mut pending = self.ctx.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(q) = pending.get_mut(&self.id) {
                while entries.len() < max as usize {
                    let Some(e) = q.pop_front() else { break };
                    entries.push(e);
                }
            }
        }
        self.ctx.inner.posting.store(false, Ordering::Relaxed);
        let left = max as usize - entries.len();
        // A provider's CQ: straight from its engine (nothing in its ring); when empty, this poll
        // makes the device progress and looks again (under one taking of the device's lock).
        let direct = if left > 0 { self.ctx.inner.poll_direct(self.id, left, entries.is_empty()) } else { None };
        if let Some((direct, more)) = direct {
            drop(ring);
            let mut out: Vec<WorkCompletion> = entries.into_iter().map(|e| self.ctx.inner.complete(e)).collect();
            for wc in direct {
                self.ctx.inner.complete_direct(&wc);
                out.push(wc);
            }
            return self.finish_poll(out, max, more);
        }
        if left > 0 {
            let took = self.ctx.inner.arena.consume::<CqEntry>(&ring, left, |e| {
                entries.extend(e);
                true
            });
            // Nothing there: on a device the application drives, this poll is what makes it
            // progress (receive, timers, completions), as a provider's poll_cq does.
            if took == 0 && entries.is_empty() && self.ctx.inner.drive(true) {
                self.ctx.inner.arena.consume::<CqEntry>(&ring, left, |e| {
                    entries.extend(e);
                    true
                });
            }
        }
        drop(ring);
        let out = entries.into_iter().map(|e| self.ctx.inner.complete(e)).collect();
        self.finish_poll(out, max, false)
    }

    /// The end of a poll that took `out`: the completions of the XRC SRQs it serves, if room is
    /// left (on a provider: verbs::xrc); then, when anything came, the handoff ends: at once, or
    /// after the application's next send when it got a message or `more` completions wait in
    /// another of its CQs (it is about to answer or to poll again, not to spin on memory).
    fn finish_poll(&self, mut out: Vec<WorkCompletion>, max: u32, more: bool) -> Result<Vec<WorkCompletion>> {
        if let Some(t) = self.xrc.get() {
            let left = max as usize - out.len();
            if left > 0 {
                out.extend(t.poll(left as u32)?);
            }
        }
        if !out.is_empty() {
            // What the application waited for came: it may now wait on memory that only the
            // device thread can fill, which therefore takes the socket back. After a message
            // received (or with completions waiting elsewhere), once the answer the
            // application most likely posts next has left; not at all for a stream's receiver
            // (`Hca::end_handoff_after_poll`).
            let received = out.iter().any(|wc| {
                wc.status == WcStatus::Success && matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
            });
            self.ctx.inner.end_handoff_after_poll(received || more, received);
        }
        Ok(out)
    }

    /// Polls until `n` completions arrived or `timeout` passed (spins briefly, then backs off).
    pub fn wait(&self, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        let mut idle = 0u32;
        while out.len() < n && Instant::now() < deadline {
            let got = self.poll((n - out.len()) as u32)?;
            if got.is_empty() {
                // Adaptive: spin (yielding the CPU) for a while, then sleep in short naps.
                idle += 1;
                if idle < 2000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            } else {
                idle = 0;
            }
            out.extend(got);
        }
        Ok(out)
    }

    /// `ibv_resize_cq`: room for `cqe` completions from now on; EINVAL for fewer than it holds.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        let inner = &self.ctx.inner;
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        // What is in the ring now moves with the CQ; the device moves what it adds meanwhile.
        let unpolled = {
            inner.pending_used.store(true, Ordering::Relaxed);
            let mut pending = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            let q = pending.entry(self.id).or_default();
            inner.arena.consume::<CqEntry>(&ring, usize::MAX, |e| {
                q.extend(e);
                true
            });
            q.len() as u32
        };
        match inner.call(Request::ResizeCq { cq: self.id, cqe, unpolled })? {
            Response::Cq { ring: new, .. } => {
                *ring = new;
                self.cqe.store(cqe, Ordering::Relaxed);
                if let Some(t) = self.xrc.get() {
                    t.resize(cqe)?;
                }
                Ok(())
            }
            _ => unexpected(),
        }
    }

    /// `ibv_req_notify_cq`.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // The application is about to sleep on the channel: the device thread reads the socket.
        self.ctx.inner.end_handoff();
        self.ctx.inner.call(Request::ReqNotifyCq { cq: self.id, solicited_only })?;
        if let Some(t) = self.xrc.get() {
            t.req_notify(solicited_only)?;
        }
        Ok(())
    }
}

impl CompletionQueue {
    pub(super) fn forget_ring(&self) {
        self.ctx.inner.cq_rings.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
        self.ctx.inner.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        let _ = self.xrc_destroy();
        self.forget_ring();
        self.ctx.inner.release(Request::DestroyCq(self.id));
    }
}
