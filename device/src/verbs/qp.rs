//! Queue pairs, shared receive queues and address handles.

use super::*;

/// Builds a QP (`struct ibv_qp_init_attr`).
pub struct QueuePairBuilder<'a> {
    pub(super) pd: &'a ProtectionDomain,
    pub(super) init: QpInit,
}

impl<'a> QueuePairBuilder<'a> {
    /// Receive completions go to this CQ (default: the send CQ).
    pub fn recv_cq(mut self, cq: &CompletionQueue) -> Self {
        self.init.recv_cq = cq.id;
        self
    }
    /// Queue capacities.
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.init.caps = caps;
        self
    }
    /// Complete every send WR.
    pub fn sig_all(mut self, on: bool) -> Self {
        self.init.sq_sig_all = on;
        self
    }
    /// Take receives from an SRQ.
    pub fn srq(mut self, srq: &SharedReceiveQueue) -> Self {
        self.init.srq = Some(srq.srqn);
        self
    }
    /// `ibv_create_qp`.
    pub fn build(self) -> Result<QueuePair> {
        match self.pd.ctx.inner.call(Request::CreateQp(self.init))? {
            Response::Qp { qpn, sq, rq } => Ok(QueuePair {
                ctx: self.pd.ctx.clone(),
                qpn,
                qp_type: self.init.qp_type,
                handle: None,
                sq,
                rq,
                caps: self.init.caps,
                pd: self.init.pd,
                cqs: [Some(self.init.send_cq), Some(self.init.recv_cq)],
                state: std::sync::Mutex::new(QpState::Reset),
            }),
            _ => unexpected(),
        }
    }
}

/// What a peer needs to connect to a QP, exchanged out of band (serde).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// The device address (its GID).
    pub addr: IpAddr,
    /// QP number.
    pub qpn: u32,
    /// First PSN it sends.
    pub psn: u32,
}

/// Connection parameters (`ibv_modify_qp` to RTR and RTS).
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    /// Path MTU.
    pub mtu: Mtu,
    /// Access remote peers get through the QP.
    pub access: Access,
    /// Local ACK timeout code (14: 67 ms).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomics both ways.
    pub rd_atomic: u8,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mtu: Mtu::Mtu1024,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 16,
            qkey: 0x1111_1111,
        }
    }
}

/// A queue pair (or a handle on an XRC target QP).
pub struct QueuePair {
    pub(super) ctx: Context,
    pub(super) qpn: Qpn,
    pub(super) qp_type: QpType,
    pub(super) handle: Option<u32>,
    pub(super) sq: Option<RingDesc>,
    pub(super) rq: Option<RingDesc>,
    pub(super) caps: QpCaps,
    pub(super) pd: PdId,
    /// Its send and receive CQs (purged of its completions when it is reset or destroyed).
    pub(super) cqs: [Option<CqId>; 2],
    /// The state as this process last set or saw it (posting checks it, as libibverbs
    /// providers check their own copy).
    pub(super) state: std::sync::Mutex<QpState>,
}

impl QueuePair {
    /// `ibv_destroy_qp` (for an XRC target QP handle: closes the handle, destroying the QP with
    /// its last one), reporting the device's answer.
    // The error gives the QP back (it still exists): large, and rare.
    #[allow(clippy::result_large_err)]
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        let req = match self.handle {
            Some(handle) => Request::DestroyQpHandle { qpn: self.qpn, handle },
            None => Request::DestroyQp(self.qpn),
        };
        let ctx = self.ctx.clone();
        // SAFETY: `me` is never used again; its fields are dropped exactly once.
        destroy_now(self, &ctx, req, |me| unsafe {
            me.purge_completions();
            std::ptr::drop_in_place(&mut me.ctx);
            std::ptr::drop_in_place(&mut me.state);
        })
    }

    /// Lets go of an XRC target QP handle the way an exiting process does
    /// (`ibv_unreg_xrc_rcv_qp`): the QP stays unless its lifetime rule ends it with its last
    /// handle. Not for other QPs (EINVAL).
    #[allow(clippy::result_large_err)]
    pub fn release(self) -> std::result::Result<(), (Self, Error)> {
        let Some(handle) = self.handle else {
            return Err((self, Error::Verbs(VerbsError::Inval)));
        };
        let req = Request::ReleaseQpHandle { qpn: self.qpn, handle };
        let ctx = self.ctx.clone();
        // SAFETY: `me` is never used again; its fields are dropped exactly once.
        destroy_now(self, &ctx, req, |me| unsafe {
            std::ptr::drop_in_place(&mut me.ctx);
            std::ptr::drop_in_place(&mut me.state);
        })
    }

    pub(super) fn purge_completions(&self) {
        let cqs: Vec<CqId> = self.cqs.iter().flatten().copied().collect();
        self.ctx.inner.purge(self.qpn.value(), &cqs);
        self.ctx.inner.rq_lock().remove(&self.qpn.value());
    }

    /// For an XRC target QP: this process's handle on it (what its async events name).
    pub fn handle(&self) -> Option<u32> {
        self.handle
    }

    /// The QP's transport service.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn.value()
    }

    /// This QP as a peer sees it, with the PSN it will send from.
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        Endpoint { addr: self.ctx.gid_addr(), qpn: self.qpn(), psn }
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.ctx.inner.call(Request::ModifyQp { qpn: self.qpn, attr: *attr, mask })?;
        if mask.contains(AttrMask::STATE) {
            *self.state.lock().unwrap_or_else(|e| e.into_inner()) = attr.qp_state;
            if attr.qp_state == QpState::Reset {
                self.purge_completions();
            }
        }
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<(QpState, QpAttr)> {
        match self.ctx.inner.call(Request::QueryQp(self.qpn))? {
            Response::QpAttr(s, a) => {
                *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s;
                Ok((s, a))
            }
            _ => unexpected(),
        }
    }

    pub(super) fn cached_state(&self) -> QpState {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The checks `ibv_post_send` makes before a request reaches the queue (the engine's, so
    /// that what the ring carries is accepted): EINVAL for a QP that cannot send, an operation
    /// the service lacks, too many SGEs, an oversize message, a short atomic, bad inline data.
    pub(super) fn check_send(&self, wr: &SendWr) -> std::result::Result<Option<Vec<u8>>, VerbsError> {
        if matches!(self.cached_state(), QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::Inval);
        }
        let op_ok = match self.qp_type {
            QpType::Rc | QpType::XrcIni => true,
            QpType::Uc => !wr.op.is_read_or_atomic(),
            QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) && wr.ud.is_some(),
            QpType::XrcTgt => false,
        };
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let limits = self.ctx.inner.info.limits;
        if !op_ok || wr.sg_list.len() > self.caps.max_send_sge as usize || len > u64::from(limits.max_msg_size) {
            return Err(VerbsError::Inval);
        }
        if wr.op.is_atomic() && (len < 8 || wr.sg_list.is_empty()) {
            return Err(VerbsError::Inval);
        }
        if !wr.inline {
            return Ok(self.ctx.inner.gather(self.pd, wr));
        }
        if len > u64::from(self.caps.max_inline_data) || wr.op.is_read_or_atomic() {
            return Err(VerbsError::Inval);
        }
        // IBV_SEND_INLINE: the data is copied now (no lkey check); the buffer is free again
        // when the post returns. Read through the kernel so a bad address is EINVAL, not a crash.
        let mut data = vec![0u8; len as usize];
        let mut at = 0;
        for s in &wr.sg_list {
            let n = s.length as usize;
            let local = [std::io::IoSliceMut::new(&mut data[at..at + n])];
            let remote = [nix::sys::uio::RemoteIoVec { base: s.addr as usize, len: n }];
            let mut local = local;
            match nix::sys::uio::process_vm_readv(nix::unistd::Pid::this(), &mut local, &remote) {
                Ok(got) if got == n => {}
                _ if n == 0 => {}
                _ => return Err(VerbsError::Inval),
            }
            at += n;
        }
        Ok(Some(data))
    }

    /// RESET -> INIT -> RTR -> RTS (INIT -> RTR only for an XRC target QP; UD needs no remote),
    /// with the attribute masks the kernel's qp_state_table requires for the QP type.
    pub fn connect(&self, local_psn: u32, remote: &Endpoint, o: &ConnectOptions) -> Result<()> {
        use softrdma_engine::modify::required;
        let t = self.qp_type;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: o.access,
            qkey: o.qkey,
            path_mtu: o.mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            dest: remote.addr,
            max_dest_rd_atomic: o.rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            sq_psn: local_psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.rd_atomic,
            ..QpAttr::default()
        };
        let steps: &[(QpState, QpState)] = if t == QpType::XrcTgt {
            &[(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr)]
        } else {
            &[(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr), (QpState::Rtr, QpState::Rts)]
        };
        for &(from, to) in steps {
            a.qp_state = to;
            let mask = required(t, from, to).ok_or(VerbsError::Inval)? | AttrMask::STATE;
            self.modify(&a, mask)?;
        }
        Ok(())
    }

    /// `ibv_post_send` of a list, onto the send queue's ring in shared memory (no system call
    /// but the doorbell); on a device the application drives (a provider's), straight into its
    /// engine, which sends at once unless the post is part of a stream (`Hca::post_send`). On an
    /// error the requests before `index` were posted.
    pub fn post_send(&self, wrs: Vec<SendWr>) -> Result<()> {
        #[cfg(feature = "embedded")]
        if let (Some(hca), Some(_)) = (self.ctx.inner.application_hca(), self.sq) {
            // A post right after a post (no poll between): a stream.
            let stream = self.ctx.inner.posting.swap(true, Ordering::Relaxed);
            let (checked, refused) = prepare_prefix(wrs, |wr| self.check_send(&wr).map(|data| (wr, data)));
            if !checked.is_empty() {
                hca.post_send(self.qpn, checked, stream).map_err(|(err, index)| Error::Post { err, index })?;
            }
            return refused.map_or(Ok(()), Err);
        }
        self.ctx.inner.post_list(
            Some((self.qpn, self.caps.max_send_wr)),
            self.sq,
            wrs,
            |wr| Ok(SendEntry { data: self.check_send(&wr)?, wr }),
            |_| {},
        )
    }

    /// `ibv_post_recv` of a list, onto the receive queue's ring: EINVAL in RESET, for a QP
    /// without a receive queue of its own (SRQ, XRC) or too many SGEs; ENOMEM when full.
    pub fn post_recv(&self, wrs: Vec<RecvWr>) -> Result<()> {
        let inner = &self.ctx.inner;
        let qpn = self.qpn.value();
        let prepare = |wr: RecvWr| {
            if self.cached_state() == QpState::Reset || wr.sg_list.len() > self.caps.max_recv_sge as usize {
                return Err(VerbsError::Inval);
            }
            let mut out = inner.rq_lock();
            let n = out.entry(qpn).or_insert(0);
            if *n >= self.caps.max_recv_wr {
                return Err(VerbsError::NoMem);
            }
            *n += 1;
            drop(out);
            Ok(inner.recv_entry(self.pd, wr))
        };
        let undo_token = |wr_id: u64, stage: bool| {
            inner.unstage_token(wr_id, stage);
            if let Some(n) = inner.rq_lock().get_mut(&qpn) {
                *n = n.saturating_sub(1);
            }
        };
        // A device the application drives (a provider's): straight into its engine.
        #[cfg(feature = "embedded")]
        if let (Some(hca), Some(_), Backend::Embedded { owner, .. }) =
            (inner.application_hca(), self.rq, &inner.backend)
        {
            let (entries, refused) = prepare_prefix(wrs, prepare);
            // The engine's refusal undoes that entry and the ones after it (never posted).
            let tokens: Vec<(u64, bool)> = entries.iter().map(|e| (e.wr.wr_id, e.stage)).collect();
            if let Err((err, index)) = hca.post_recv(*owner, self.qpn, entries) {
                for &(wr_id, stage) in &tokens[index..] {
                    undo_token(wr_id, stage);
                }
                return Err(Error::Post { err, index });
            }
            return refused.map_or(Ok(()), Err);
        }
        inner.post_list(None, self.rq, wrs, prepare, |e| undo_token(e.wr.wr_id, e.stage))
    }

    /// `ibv_attach_mcast` (UD).
    pub fn attach_mcast(&self, group: IpAddr) -> Result<()> {
        let again = self.ctx.inner.mcast.lock().unwrap_or_else(|e| e.into_inner()).contains(&(group, self.qpn));
        self.ctx.inner.call(Request::AttachMcast { qpn: self.qpn, group })?;
        // A provider's QP: the daemon receives the group's datagrams and passes them on.
        if let Err(e) = self.ctx.inner.mcast_attached(self.qpn, group, true) {
            if !again {
                let _ = self.ctx.inner.call(Request::DetachMcast { qpn: self.qpn, group });
            }
            return Err(e);
        }
        Ok(())
    }

    /// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (UD): this QP's own multicast sends are not delivered
    /// to it.
    pub fn block_self_mcast_lb(&self) -> Result<()> {
        self.ctx.inner.call(Request::BlockSelfMcastLb(self.qpn))?;
        Ok(())
    }

    /// `ibv_detach_mcast` (UD).
    pub fn detach_mcast(&self, group: IpAddr) -> Result<()> {
        self.ctx.inner.call(Request::DetachMcast { qpn: self.qpn, group })?;
        let _ = self.ctx.inner.mcast_attached(self.qpn, group, false);
        Ok(())
    }

    /// The capacities it was created with.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let req = match self.handle {
            Some(handle) => Request::DestroyQpHandle { qpn: self.qpn, handle },
            None => Request::DestroyQp(self.qpn),
        };
        self.ctx.inner.release(req);
        self.ctx.inner.mcast_forget(self.qpn);
        self.purge_completions();
    }
}

/// Prepares a post list's requests in order up to the first one refused: the prepared ones and
/// that refusal, with its index (a NIC's post fails at the request it refuses and keeps the
/// ones before it). For the posts that go straight into an engine the application drives.
#[cfg(feature = "embedded")]
pub(super) fn prepare_prefix<W, E>(
    wrs: Vec<W>,
    mut prepare: impl FnMut(W) -> std::result::Result<E, VerbsError>,
) -> (Vec<E>, Option<Error>) {
    let mut ready = Vec::with_capacity(wrs.len());
    for (index, wr) in wrs.into_iter().enumerate() {
        match prepare(wr) {
            Ok(e) => ready.push(e),
            Err(err) => return (ready, Some(Error::Post { err, index })),
        }
    }
    (ready, None)
}

/// A shared receive queue (plain or XRC).
pub struct SharedReceiveQueue {
    pub(super) ctx: Context,
    pub(super) srqn: u32,
    pub(super) ring: RingDesc,
    pub(super) max_sge: u32,
    pub(super) pd: PdId,
    /// A provider's XRC SRQ (made on its XRC side, `xrc`): the provider whose memory regions
    /// its receives name.
    pub(super) host: Option<xrc::XrcHost>,
}

impl SharedReceiveQueue {
    /// `ibv_destroy_srq`, reporting the device's answer.
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        let (ctx, req) = (self.ctx.clone(), Request::DestroySrq(self.srqn));
        // SAFETY: `me` is never used again; its context is dropped exactly once.
        destroy_now(self, &ctx, req, |me| unsafe { std::ptr::drop_in_place(&mut me.ctx) })
    }

    /// `ibv_get_srq_num`: the number XRC senders name.
    pub fn srq_num(&self) -> u32 {
        self.srqn
    }
    /// `ibv_post_srq_recv` of a list, onto the SRQ's ring: EINVAL for too many SGEs, ENOMEM
    /// when the queue is full.
    pub fn post_recv(&self, wrs: Vec<RecvWr>) -> Result<()> {
        let inner = &self.ctx.inner;
        let prepare = |wr: RecvWr| {
            if wr.sg_list.len() > self.max_sge as usize {
                return Err(VerbsError::Inval);
            }
            let wr = match &self.host {
                // The provider's keys become their twins' (`xrc`).
                Some(h) => h.translate(wr).map_err(|e| match e {
                    Error::Verbs(v) => v,
                    _ => VerbsError::NoMem,
                })?,
                None => wr,
            };
            Ok(inner.recv_entry(self.pd, wr))
        };
        inner.post_list(None, Some(self.ring), wrs, prepare, |e| inner.unstage(e))
    }

    /// `ibv_modify_srq` with IBV_SRQ_LIMIT.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        self.ctx.inner.call(Request::ModifySrq { srqn: self.srqn, limit })?;
        Ok(())
    }
    /// `ibv_query_srq`: attributes and outstanding WQEs.
    pub fn query(&self) -> Result<(SrqAttr, u32)> {
        match self.ctx.inner.call(Request::QuerySrq(self.srqn))? {
            Response::SrqAttr(a, n) => Ok((a, n)),
            _ => unexpected(),
        }
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        self.ctx.inner.release(Request::DestroySrq(self.srqn));
    }
}

/// An address handle (`ibv_create_ah`): where UD datagrams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    /// Destination GID as an IP address.
    pub dest: IpAddr,
}

impl AddressHandle {
    /// A UD destination through this address handle.
    pub fn ud(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest { dest: self.dest, remote_qpn, remote_qkey }
    }
}
