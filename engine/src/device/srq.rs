//! Shared receive queues and XRC domains (IBTA 10.2.9 SRQs; Annex A14 XRC).
//!
//! An XRC domain is identified by an opaque `identity` the device layer derives from the file the
//! processes opened (its inode), so several processes share one domain; `None` is a private
//! domain. Target QPs live in a domain, not in a PD, and can outlive the process that made them:
//! handles left open when their owner goes away do not destroy the QP, which then lives as long as
//! its domain (the libibverbs XRC extension / OFED kernel-owned receive QP). The upstream kernel's
//! rule (destroy on last handle close, exit included) is a device option,
//! [`XrcPolicy::DestroyOnLastClose`].

use std::collections::VecDeque;

use super::{AsyncEvent, CqId, Ctx, Device, PdId};
use crate::memory::{Memory, Owner};
use crate::verbs::VerbsError;
use crate::wire::Qpn;
use crate::wr::RecvWr;

/// An XRC domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct XrcdId(pub u32);

/// What happens to an XRC target QP when its last open handle goes away without an explicit
/// destroy (its owner exited or closed the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum XrcPolicy {
    /// It lives on, bound to its domain, until the domain is destroyed (the libibverbs XRC
    /// extension / OFED 1.3 semantics this project follows).
    #[default]
    LiveWithDomain,
    /// It is destroyed (today's upstream Linux kernel).
    DestroyOnLastClose,
}

/// SRQ attributes (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SrqAttr {
    /// Most outstanding receive WQEs.
    pub max_wr: u32,
    /// Most SGEs per WQE.
    pub max_sge: u32,
    /// Limit: SRQ_LIMIT_REACHED fires (once per arming) when fewer WQEs than this remain; 0 disarms.
    pub srq_limit: u32,
}

pub(crate) struct Srq {
    pub(crate) pd: PdId,
    /// XRC SRQs: their domain and CQ.
    pub(crate) xrc: Option<(XrcdId, CqId)>,
    pub(crate) attr: SrqAttr,
    pub(crate) queue: VecDeque<RecvWr>,
}

pub(crate) struct Xrcd {
    pub(crate) identity: Option<u64>,
    /// Open references (processes that opened it).
    pub(crate) refs: Vec<Owner>,
}

impl<M: Memory> Ctx<'_, M> {
    /// Takes the next receive WQE from an SRQ, raising SRQ_LIMIT_REACHED when the queue drops below
    /// an armed limit (IBTA 10.2.9.4: one event per arming).
    pub(crate) fn srq_pop(&mut self, srqn: u32) -> Option<RecvWr> {
        let srq = self.srqs.get_mut(&srqn)?;
        let wr = srq.queue.pop_front()?;
        if srq.attr.srq_limit > 0 && (srq.queue.len() as u32) < srq.attr.srq_limit {
            srq.attr.srq_limit = 0;
            self.events.push_back(AsyncEvent::SrqLimitReached(srqn));
        }
        Some(wr)
    }
}

impl<M: Memory> Device<M> {
    fn srq_number(&mut self) -> u32 {
        loop {
            let n = (self.rng.next_u32() & 0x00ff_ffff).max(1);
            if !self.srqs.contains_key(&n) {
                return n;
            }
        }
    }

    fn check_srq_attr(&self, a: &SrqAttr) -> Result<(), VerbsError> {
        let l = self.config.limits;
        if a.max_wr == 0 || a.max_wr > l.max_qp_wr || a.max_sge == 0 || a.max_sge > l.max_sge || a.srq_limit > a.max_wr
        {
            return Err(VerbsError::Inval);
        }
        Ok(())
    }

    /// Creates an SRQ (`ibv_create_srq`); returns its number.
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<u32, VerbsError> {
        if !self.pds.contains_key(&pd) {
            return Err(VerbsError::Inval);
        }
        self.check_srq_attr(&attr)?;
        let n = self.srq_number();
        self.srqs.insert(n, Srq { pd, xrc: None, attr, queue: VecDeque::new() });
        Ok(n)
    }

    /// Creates an XRC SRQ bound to a domain, a PD and a CQ (`ibv_create_srq_ex` with
    /// IBV_SRQT_XRC); its number (`ibv_get_srq_num`) is what initiators name in XRCETH.
    pub fn create_xrc_srq(&mut self, xrcd: XrcdId, pd: PdId, cq: CqId, attr: SrqAttr) -> Result<u32, VerbsError> {
        if !self.pds.contains_key(&pd) || !self.xrcds.contains_key(&xrcd) || !self.cqs.contains_key(&cq) {
            return Err(VerbsError::Inval);
        }
        self.check_srq_attr(&attr)?;
        let n = self.srq_number();
        self.srqs.insert(n, Srq { pd, xrc: Some((xrcd, cq)), attr, queue: VecDeque::new() });
        Ok(n)
    }

    /// Changes an SRQ's limit (`ibv_modify_srq` with IBV_SRQ_LIMIT), which re-arms the event.
    /// Resizing (IBV_SRQ_MAX_WR) is not supported (EOPNOTSUPP), as in rxe without resize.
    pub fn modify_srq_limit(&mut self, srqn: u32, limit: u32) -> Result<(), VerbsError> {
        let srq = self.srqs.get_mut(&srqn).ok_or(VerbsError::Inval)?;
        if limit > srq.attr.max_wr {
            return Err(VerbsError::Inval);
        }
        srq.attr.srq_limit = limit;
        Ok(())
    }

    /// The SRQ's attributes and the WQEs it holds.
    pub fn query_srq(&self, srqn: u32) -> Result<(SrqAttr, usize), VerbsError> {
        let s = self.srqs.get(&srqn).ok_or(VerbsError::Inval)?;
        Ok((s.attr, s.queue.len()))
    }

    /// Posts a receive WQE to an SRQ (`ibv_post_srq_recv`).
    pub fn post_srq_recv(&mut self, srqn: u32, wr: RecvWr) -> Result<(), VerbsError> {
        let srq = self.srqs.get_mut(&srqn).ok_or(VerbsError::Inval)?;
        if wr.sg_list.len() > srq.attr.max_sge as usize {
            return Err(VerbsError::Inval);
        }
        if srq.queue.len() >= srq.attr.max_wr as usize {
            return Err(VerbsError::NoMem);
        }
        srq.queue.push_back(wr);
        Ok(())
    }

    /// Destroys an SRQ; EBUSY while a QP is attached to it.
    pub fn destroy_srq(&mut self, srqn: u32) -> Result<(), VerbsError> {
        if !self.srqs.contains_key(&srqn) {
            return Err(VerbsError::Inval);
        }
        if self.qps.values().any(|q| q.srq == Some(srqn)) {
            return Err(VerbsError::Busy);
        }
        self.srqs.remove(&srqn);
        Ok(())
    }

    /// Opens (or creates) an XRC domain (`ibv_open_xrcd`). `identity`: the shared file's identity,
    /// `None` for a private domain. Without `create` a missing domain is EAGAIN; with `create` and
    /// `exclusive` an existing one is EINVAL (as the kernel's uverbs).
    pub fn open_xrcd(
        &mut self,
        owner: Owner,
        identity: Option<u64>,
        create: bool,
        exclusive: bool,
    ) -> Result<XrcdId, VerbsError> {
        if let Some(id) = identity {
            if let Some((&x, d)) = self.xrcds.iter_mut().find(|(_, d)| d.identity == Some(id)) {
                if create && exclusive {
                    return Err(VerbsError::Inval);
                }
                d.refs.push(owner);
                return Ok(x);
            }
            if !create {
                return Err(VerbsError::Again);
            }
        }
        let x = XrcdId(self.next_id());
        self.xrcds.insert(x, Xrcd { identity, refs: vec![owner] });
        Ok(x)
    }

    /// Closes one reference to a domain (`ibv_close_xrcd`). The last reference cannot go while a
    /// target QP of the domain still has an open handle or an XRC SRQ uses it (EBUSY); target QPs
    /// left without handles go with the domain.
    pub fn close_xrcd(&mut self, owner: Owner, xrcd: XrcdId) -> Result<(), VerbsError> {
        let d = self.xrcds.get(&xrcd).ok_or(VerbsError::Inval)?;
        let i = d.refs.iter().position(|o| *o == owner).ok_or(VerbsError::Inval)?;
        if d.refs.len() == 1 {
            let open_tgt = self.qps.values().any(|q| q.xrcd == Some(xrcd) && !q.handles.is_empty());
            let srq = self.srqs.values().any(|s| s.xrc.is_some_and(|(x, _)| x == xrcd));
            if open_tgt || srq {
                return Err(VerbsError::Busy);
            }
        }
        self.xrcds.get_mut(&xrcd).expect("present").refs.remove(i);
        self.reap_xrcd(xrcd);
        Ok(())
    }

    /// Destroys a domain that no process references any more, and its target QPs.
    fn reap_xrcd(&mut self, xrcd: XrcdId) {
        if self.xrcds.get(&xrcd).is_some_and(|d| d.refs.is_empty()) {
            self.xrcds.remove(&xrcd);
            let tgts: Vec<Qpn> = self.qps.values().filter(|q| q.xrcd == Some(xrcd)).map(|q| q.qpn).collect();
            for q in tgts {
                self.qps.remove(&q);
            }
            self.srqs.retain(|_, s| s.xrc.is_none_or(|(x, _)| x != xrcd));
        }
    }

    /// Creates an XRC target QP in a domain (`ibv_create_qp_ex` with IBV_QPT_XRC_RECV); returns
    /// the QPN and the creator's handle.
    pub fn create_xrc_tgt_qp(&mut self, owner: Owner, xrcd: XrcdId) -> Result<(Qpn, u32), VerbsError> {
        self.create_xrc_tgt_qp_with(owner, xrcd, None)
    }

    /// Creates an XRC target QP with its own lifetime rule instead of the device's: OFED's
    /// `ibv_create_xrc_rcv_qp` (the QP goes when its last registered process unregisters or
    /// exits: [`XrcPolicy::DestroyOnLastClose`]) and the seed's `ibv_alloc_xrc_rcv_qp` (the QP
    /// belongs to the domain and goes only with it: [`XrcPolicy::LiveWithDomain`]).
    pub fn create_xrc_tgt_qp_with(
        &mut self,
        owner: Owner,
        xrcd: XrcdId,
        lifetime: Option<XrcPolicy>,
    ) -> Result<(Qpn, u32), VerbsError> {
        if !self.xrcds.get(&xrcd).is_some_and(|d| d.refs.contains(&owner)) {
            return Err(VerbsError::Inval);
        }
        let init = super::QpInit {
            qp_type: crate::verbs::QpType::XrcTgt,
            pd: PdId(0),
            send_cq: CqId(0),
            recv_cq: CqId(0),
            caps: super::QpCaps::default(),
            sq_sig_all: false,
            srq: None,
        };
        let qpn = self.alloc_qpn()?;
        let mut qp = super::qp::Qp::new(qpn, init, owner);
        qp.pd = None;
        qp.send_cq = None;
        qp.recv_cq = None;
        qp.xrcd = Some(xrcd);
        qp.tgt_lifetime = lifetime;
        let h = self.next_id();
        qp.handles.push((h, owner));
        self.qps.insert(qpn, qp);
        Ok((qpn, h))
    }

    /// Opens another handle on an existing target QP of the same domain (`ibv_open_qp`).
    pub fn open_qp(&mut self, owner: Owner, xrcd: XrcdId, qpn: Qpn) -> Result<u32, VerbsError> {
        if !self.xrcds.get(&xrcd).is_some_and(|d| d.refs.contains(&owner)) {
            return Err(VerbsError::Inval);
        }
        let h = self.next_id();
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NoEnt)?;
        if qp.xrcd != Some(xrcd) {
            return Err(VerbsError::Inval);
        }
        qp.handles.push((h, owner));
        Ok(h)
    }

    /// Destroys a target QP handle (`ibv_destroy_qp` on an opened or created XRC_RECV QP): the QP
    /// goes with its last handle.
    pub fn destroy_qp_handle(&mut self, qpn: Qpn, handle: u32) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let i = qp.handles.iter().position(|(h, _)| *h == handle).ok_or(VerbsError::Inval)?;
        qp.handles.remove(i);
        if qp.handles.is_empty() {
            self.qps.remove(&qpn);
        }
        Ok(())
    }

    /// Lets go of a target QP handle the way a process going away does (`ibv_unreg_xrc_rcv_qp`;
    /// the creating handle of `ibv_alloc_xrc_rcv_qp`): the QP stays unless its lifetime rule
    /// (its own, else the device's) destroys it with its last handle.
    pub fn release_qp_handle(&mut self, qpn: Qpn, handle: u32) -> Result<(), VerbsError> {
        let policy = self.xrc_policy;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let i = qp.handles.iter().position(|(h, _)| *h == handle).ok_or(VerbsError::Inval)?;
        qp.handles.remove(i);
        if qp.handles.is_empty() && qp.tgt_lifetime.unwrap_or(policy) == XrcPolicy::DestroyOnLastClose {
            self.qps.remove(&qpn);
        }
        Ok(())
    }

    /// Whether `qpn` is an XRC target QP that no process holds a handle on (one the
    /// device owns: its async events have nobody to go to).
    pub fn is_unowned_tgt_qp(&self, qpn: Qpn) -> bool {
        self.qps.get(&qpn).is_some_and(|q| q.xrcd.is_some() && q.handles.is_empty())
    }

    /// The open handles of a target QP and their owners.
    pub fn qp_handles(&self, qpn: Qpn) -> Vec<(u32, Owner)> {
        self.qps.get(&qpn).map(|q| q.handles.clone()).unwrap_or_default()
    }

    /// A client went away (process exit, device closed): its handles on target QPs close without
    /// destroying them (unless the policy says so), its domain references go, and domains nobody
    /// references any more are destroyed with their target QPs.
    pub fn release_owner(&mut self, owner: Owner) {
        let policy = self.xrc_policy;
        let mut gone = Vec::new();
        for qp in self.qps.values_mut() {
            let before = qp.handles.len();
            qp.handles.retain(|(_, o)| *o != owner);
            if before > 0 && qp.handles.is_empty() && qp.tgt_lifetime.unwrap_or(policy) == XrcPolicy::DestroyOnLastClose
            {
                gone.push(qp.qpn);
            }
        }
        for q in gone {
            self.qps.remove(&q);
        }
        let doms: Vec<XrcdId> = self.xrcds.keys().copied().collect();
        for x in doms {
            if let Some(d) = self.xrcds.get_mut(&x) {
                d.refs.retain(|o| *o != owner);
            }
            self.reap_xrcd(x);
        }
    }

    /// Whether a shared domain with this file identity still exists (the device keeps the file
    /// open while it does).
    pub fn xrcd_identity_live(&self, identity: u64) -> bool {
        self.xrcds.values().any(|d| d.identity == Some(identity))
    }

    /// Sets the XRC target QP lifetime policy.
    pub fn set_xrc_policy(&mut self, p: XrcPolicy) {
        self.xrc_policy = p;
    }
}
