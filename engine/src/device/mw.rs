//! Memory windows, types 1 and 2 (IBTA 10.6.7): a window grants remote access to a range of a
//! memory region under its own R_Key. Binding is a work request on a QP (type 1 through
//! `ibv_bind_mw`, type 2 through an IBV_WR_BIND_MW work request) and executes in send-queue order;
//! a type 2 window is tied to the QP that bound it (type 2B) and is invalidated by a local
//! invalidate or by a SEND with invalidate naming its R_Key.

use super::{Ctx, Device, PdId};
use crate::memory::{Memory, Owner};
use crate::verbs::{Access, VerbsError};
use crate::wire::Qpn;

/// A window's binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Binding {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) owner: Owner,
    /// Type 2: the QP it is bound to.
    pub(crate) qpn: Option<Qpn>,
}

pub(crate) struct Mw {
    pub(crate) pd: PdId,
    pub(crate) mw_type: u8,
    pub(crate) rkey: u32,
    pub(crate) bound: Option<Binding>,
}

/// What a remote access through an R_Key may reach.
pub(crate) struct Region {
    pub(crate) pd: PdId,
    pub(crate) owner: Owner,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    /// Type 2 windows: only this QP may use the key.
    pub(crate) qpn: Option<Qpn>,
}

impl Region {
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr.saturating_add(self.len))
    }
}

impl<M: Memory> Ctx<'_, M> {
    /// What an R_Key names: a memory region, or a bound window (IBTA 10.6.3: both share the key
    /// space).
    pub(crate) fn region_by_rkey(&self, rkey: u32) -> Option<Region> {
        if let Some(mr) = self.mr_by_rkey(rkey) {
            return Some(Region {
                pd: mr.pd,
                owner: mr.owner,
                addr: mr.addr,
                len: mr.len,
                access: mr.access,
                qpn: None,
            });
        }
        let mw = self.mws.get(&(rkey >> 8)).filter(|w| w.rkey == rkey)?;
        let b = mw.bound?;
        Some(Region { pd: mw.pd, owner: b.owner, addr: b.addr, len: b.len, access: b.access, qpn: b.qpn })
    }

    /// Binds a window (the execution of a bind work request). Errors are IBV_WC_MW_BIND_ERR.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bind_mw(
        &mut self,
        qp_pd: Option<PdId>,
        qpn: Qpn,
        mw_rkey: u32,
        new_rkey: u32,
        mr_lkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> bool {
        let Some(mr) = self.mr_by_lkey(mr_lkey) else { return false };
        // The region allows binding and covers the window; remote write or atomic through the
        // window needs local write on the region (IBTA 10.6.7.2).
        let ok_mr = mr.access.contains(Access::MW_BIND)
            && mr.contains(addr, len)
            && (!access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
                || mr.access.contains(Access::LOCAL_WRITE));
        let (mr_pd, owner) = (mr.pd, mr.owner);
        let Some(mw) = self.mws.get_mut(&(mw_rkey >> 8)).filter(|w| w.rkey == mw_rkey) else { return false };
        if !ok_mr || Some(mw.pd) != qp_pd || Some(mr_pd) != qp_pd || new_rkey >> 8 != mw_rkey >> 8 {
            return false;
        }
        if mw.mw_type == 2 && mw.bound.is_some() {
            // A valid type 2 window must be invalidated before it is bound again.
            return false;
        }
        mw.rkey = new_rkey;
        let qpn = (mw.mw_type == 2).then_some(qpn);
        mw.bound = Some(Binding { addr, len, access, owner, qpn });
        true
    }

    /// Invalidates a type 2 window by R_Key, from `qpn` in `pd` (local invalidate, or a SEND with
    /// invalidate at the responder). False if no such valid window.
    pub(crate) fn invalidate(&mut self, pd: Option<PdId>, rkey: u32) -> bool {
        match self.mws.get_mut(&(rkey >> 8)) {
            Some(w) if w.rkey == rkey && w.mw_type == 2 && w.bound.is_some() && Some(w.pd) == pd => {
                w.bound = None;
                true
            }
            _ => false,
        }
    }
}

impl<M: Memory> Device<M> {
    /// Allocates a window of type 1 or 2 (`ibv_alloc_mw`); returns its R_Key. It grants nothing
    /// until bound.
    pub fn alloc_mw(&mut self, pd: PdId, mw_type: u8) -> Result<u32, VerbsError> {
        if !self.pds.contains_key(&pd) || !(mw_type == 1 || mw_type == 2) {
            return Err(VerbsError::Inval);
        }
        let rkey = self.new_key()?;
        self.mws.insert(rkey >> 8, Mw { pd, mw_type, rkey, bound: None });
        Ok(rkey)
    }

    /// Frees a window (`ibv_dealloc_mw`).
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<(), VerbsError> {
        match self.mws.get(&(rkey >> 8)) {
            Some(_) => {
                self.mws.remove(&(rkey >> 8));
                Ok(())
            }
            None => Err(VerbsError::Inval),
        }
    }

    /// The next R_Key of a type 1 window for `ibv_bind_mw`: same index, a new key byte.
    pub fn next_mw_rkey(&mut self, rkey: u32) -> u32 {
        (rkey & !0xff) | ((rkey.wrapping_add(1 + (self.rng.next_u32() & 0x7f))) & 0xff)
    }
}
