//! The Rust-native verbs API, in the style of rust-ibverbs and sideway: a [`Context`] on a
//! device, and the objects made from it, each destroyed when dropped.
//!
//! A context talks to a daemon ([`Context::open`]) or to a device running inside this process
//! ([`Context::embedded`]); both run the same device code.
//!
//! Memory regions own their buffer ([`MemoryRegion`]); the device writes into it (received data,
//! RDMA WRITE and READ results), so read it only after the completion that says it is there, as
//! with any RDMA buffer.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};
pub use softrdma_engine::device::{CqId, MrKeys, PdId, QpAttr, QpCaps, QpInit, SrqAttr, XrcPolicy, XrcdId};
pub use softrdma_engine::verbs::{Access, AttrMask, Mtu, QpState, QpType, VerbsError, WcOpcode, WcStatus};
pub use softrdma_engine::wire::Qpn;
pub use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge, UdDest, WorkCompletion};

use std::sync::atomic::{fence, Ordering};

use crate::arena::{Arena, RingDesc};
use crate::client::{ClientError, Connection};
#[cfg(feature = "embedded")]
use crate::hca::Hca;
use crate::proto::{ClientEvent, CqEntry, DeviceInfo, RecvEntry, Request, Response, SendEntry};

mod cq;
mod hangup;
mod mem;
mod qp;
mod xrc;

use hangup::HangupWatch;

pub use cq::{CompletionChannel, CompletionQueue};
pub use mem::{MemoryRegion, MemoryWindow, ProtectionDomain, RawMr};
pub use qp::{AddressHandle, ConnectOptions, Endpoint, QueuePair, QueuePairBuilder, SharedReceiveQueue};
pub use xrc::XrcDomain;

/// The client's own bookkeeping maps (keys it made itself: lkeys, tokens, QPNs, CQ ids), on a
/// fast non-cryptographic hash; looked up on every post and poll. The device keeps SipHash for
/// anything a client chooses.
type FastMap<K, V> = std::collections::HashMap<K, V, rustc_hash::FxBuildHasher>;

/// A verbs error: the errno of the call, or the device connection lost.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The call failed (errno as libibverbs gives it).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A post failed at this index of the list; the ones before it were posted.
    #[error("work request {index} not posted: {err}")]
    Post {
        /// The error.
        err: VerbsError,
        /// Index of the first request not posted.
        index: usize,
    },
    /// The device is gone or unreachable.
    #[error(transparent)]
    Device(#[from] ClientError),
}

/// The result of a verbs call.
pub type Result<T> = std::result::Result<T, Error>;

enum Backend {
    Daemon(Connection),
    /// A device in this process (feature `embedded`; the verbs shim leaves it out, so
    /// libibverbs.so does not carry the device, its transport and its capture).
    #[cfg(feature = "embedded")]
    Embedded {
        hca: Arc<Hca>,
        owner: u32,
        event_fd: OwnedFd,
        /// A provider's link to the daemon of the device whose port it shares
        /// ([`Context::provider`]): kept open for the context's life, so that the daemon takes
        /// its member and QPN blocks back when this process goes; the provider's reports
        /// (counters, captured packets) travel on it too.
        daemon: Option<Arc<Connection>>,
    },
}

struct Inner {
    backend: Backend,
    info: DeviceInfo,
    /// The client's rings, shared with the device.
    arena: Arena,
    doorbell: OwnedFd,
    /// This process's memory regions by lkey: PD, start, length, access (for gathering at post
    /// and scattering at poll).
    mrs: std::sync::Mutex<FastMap<u32, (PdId, u64, u64, Access)>>,
    /// Receives whose data the device stages, by token: the application's wr_id and SGEs.
    staged: std::sync::Mutex<FastMap<u64, (u64, Vec<Sge>)>>,
    next_token: std::sync::atomic::AtomicU64,
    /// The ring on which staging space goes back to the device.
    release: RingDesc,
    /// Receives posted to each QP's own receive queue and not yet completed: posting beyond
    /// max_recv_wr is ENOMEM, as on hardware (the ring and the device's queue together hold
    /// more, so the limit is kept here).
    rq_outstanding: std::sync::Mutex<FastMap<u32, u32>>,
    /// Completion rings by CQ, and completions taken off them early (when a QP was reset or
    /// destroyed, its completions are removed and the others wait here, in order).
    cq_rings: std::sync::Mutex<FastMap<CqId, Arc<std::sync::Mutex<RingDesc>>>>,
    pending: std::sync::Mutex<FastMap<CqId, std::collections::VecDeque<CqEntry>>>,
    /// Whether `pending` was ever given entries (set with a CQ's ring lock held, before the
    /// entries go in): a poll takes the `pending` lock only then.
    pending_used: std::sync::atomic::AtomicBool,
    /// The rings are single-producer: threads of this process that post to the same queue (or
    /// give staging back) take turns, as libibverbs' providers lock a QP's send queue. Striped
    /// by ring.
    producers: [std::sync::Mutex<()>; 64],
    /// Daemon devices: wakes the event fds when the device goes away.
    hangup: Option<HangupWatch>,
    /// This process's memory helper, when the device reaches its memory through one: a
    /// completion waits for the helper's writes before it ([`CqEntry::helper_writes`]).
    helper: std::sync::OnceLock<Arc<crate::memory::HelperProgress>>,
    /// The last verbs call that moved work was a send post (cleared by every CQ poll): on a
    /// device the application drives, the next send post is part of a stream.
    posting: std::sync::atomic::AtomicBool,
    /// Receives are staged (the device writes their data into the arena and the poll copies it
    /// out): unless the device runs in this process and its threads drive it (a provider), whose
    /// engine writes a receive's data straight into the posted buffers (`Memory::write_local`).
    stage_receives: bool,
    /// A provider's daemon (runtime directory, device name), where its XRC side opens.
    daemon_at: Option<(std::path::PathBuf, String)>,
    /// A provider's XRC side (`xrc`): opened at its first `ibv_open_xrcd`.
    xrc: std::sync::OnceLock<xrc::XrcSide>,
    xrc_opening: std::sync::Mutex<()>,
    /// A provider's QPs attached to multicast groups: the daemon passes a group's datagrams to
    /// this process while any QP of it is attached, told once at the first attach and once at
    /// the last detach or destroy (attaching twice is one attachment, as in the engine).
    mcast: std::sync::Mutex<std::collections::BTreeSet<(IpAddr, Qpn)>>,
}

/// Receives up to this size have their data staged by the device in the shared arena and
/// scattered into the posted buffers by this process when it polls the completion (design D3);
/// larger ones are written into the buffers by the device (one process_vm_writev per packet).
pub const STAGE_MAX: u64 = 64 << 10;

/// SEND and WRITE payloads up to this size are gathered into the work request at post time
/// (design D3: the data moves in the client; the device does not reach into it to send them).
/// Larger ones are read by the device when it sends them (one process_vm_readv per packet).
pub const GATHER_MAX: usize = 512;

impl Inner {
    fn new(
        backend: Backend,
        info: DeviceInfo,
        arena_fd: OwnedFd,
        doorbell: OwnedFd,
        release: RingDesc,
    ) -> Result<Inner> {
        let arena = Arena::open(arena_fd).map_err(|_| VerbsError::NoMem)?;
        let hangup = match &backend {
            Backend::Daemon(c) => {
                Some(HangupWatch::start(c.hangup_fd(), c.event_fd.as_fd()).map_err(|_| VerbsError::NoMem)?)
            }
            // A provider's device is its daemon too: when the daemon goes, the device is gone
            // for the program (IBV_EVENT_DEVICE_FATAL), though its own QPs run in-process.
            #[cfg(feature = "embedded")]
            Backend::Embedded { daemon: Some(c), event_fd, .. } => {
                Some(HangupWatch::start(c.hangup_fd(), event_fd.as_fd()).map_err(|_| VerbsError::NoMem)?)
            }
            #[cfg(feature = "embedded")]
            Backend::Embedded { .. } => None,
        };
        let stage_receives = match &backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, .. } => hca.progress() != crate::hca::Progress::Application,
            _ => true,
        };
        Ok(Inner {
            stage_receives,
            backend,
            info,
            arena,
            doorbell,
            mrs: Default::default(),
            staged: Default::default(),
            next_token: std::sync::atomic::AtomicU64::new(1),
            release,
            rq_outstanding: Default::default(),
            cq_rings: Default::default(),
            pending: Default::default(),
            pending_used: std::sync::atomic::AtomicBool::new(false),
            producers: std::array::from_fn(|_| std::sync::Mutex::new(())),
            hangup,
            helper: std::sync::OnceLock::new(),
            posting: std::sync::atomic::AtomicBool::new(false),
            daemon_at: None,
            xrc: std::sync::OnceLock::new(),
            xrc_opening: std::sync::Mutex::new(()),
            mcast: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        })
    }

    /// The ring entry for a receive: staged when every SGE lies in a region of this process, in
    /// `pd`, that may be written locally (the device checks again), and it is not too large.
    fn recv_entry(&self, pd: PdId, wr: RecvWr) -> RecvEntry {
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let ours = self.stage_receives && !wr.sg_list.is_empty() && len <= STAGE_MAX && {
            let mrs = self.mrs_lock();
            wr.sg_list.iter().all(|s| {
                mrs.get(&s.lkey).is_some_and(|&(p, a, l, acc)| {
                    p == pd
                        && acc.contains(Access::LOCAL_WRITE)
                        && s.addr >= a
                        && s.addr.checked_add(u64::from(s.length)).is_some_and(|e| e <= a + l)
                })
            })
        };
        if !ours {
            return RecvEntry { wr, stage: false };
        }
        let token = (1 << 63) | self.next_token.fetch_add(1, Ordering::Relaxed);
        let RecvWr { wr_id, sg_list } = wr;
        self.staged_lock().insert(token, (wr_id, sg_list.clone()));
        RecvEntry { wr: RecvWr { wr_id: token, sg_list }, stage: true }
    }

    /// A completion from the ring as the application sees it: a staged receive's data copied
    /// into its buffers (the last byte last), its staging given back, its own wr_id restored.
    /// What every completion taken from the device needs, whether through a ring or straight
    /// from the engine: a receive's leaves its queue's count. True for a receive's.
    fn complete_direct(&self, wc: &WorkCompletion) -> bool {
        if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            return false;
        }
        if let Some(n) = self.rq_lock().get_mut(&wc.qp_num.value()) {
            *n = n.saturating_sub(1);
        }
        true
    }

    fn complete(&self, e: CqEntry) -> WorkCompletion {
        if let Some(h) = self.helper.get() {
            h.wait_for_writes(e.helper_writes);
        }
        let mut wc = e.wc;
        if !self.complete_direct(&wc) || !self.stage_receives {
            return wc;
        }
        let Some((wr_id, sges)) = self.staged_lock().remove(&wc.wr_id) else { return wc };
        wc.wr_id = wr_id;
        if let Some((off, len)) = e.stage {
            // Only a SEND's data lands in the receive buffers: an RDMA WRITE with immediate
            // consumes the receive but its data went to the WRITE's target (which may be this
            // very buffer), so nothing is scattered.
            let n = if wc.opcode == WcOpcode::Recv { wc.byte_len.min(len) as usize } else { 0 };
            let mut data = vec![0u8; n];
            if n > 0 && self.arena.stage_read(off as usize, &mut data) {
                let mrs = self.mrs_lock();
                let mut at = 0;
                for s in &sges {
                    if at == n {
                        break;
                    }
                    let k = (s.length as usize).min(n - at);
                    let still = mrs.get(&s.lkey).is_some_and(|&(_, a, l, _)| s.addr >= a && s.addr + k as u64 <= a + l);
                    if still {
                        // SAFETY: the range lies in a memory region of this process registered
                        // now (checked under the registry lock, held); a region leaves the
                        // registry before its memory is freed.
                        unsafe { std::ptr::copy_nonoverlapping(data[at..].as_ptr(), s.addr as *mut u8, k) };
                    }
                    at += k;
                }
                fence(Ordering::Release);
            }
            self.give_back(off, len);
        }
        wc
    }

    /// Gives staging space back to the device; waits for room if the device is behind.
    fn give_back(&self, off: u64, len: u32) {
        let _turn = self.producer(&self.release);
        while !matches!(self.arena.produce(&self.release, &(off, len)), Ok(true)) {
            self.ring_doorbell(true, None);
            std::thread::yield_now();
        }
    }

    /// Removes QP `qpn`'s completions from CQs `cqs` (after the QP was reset or destroyed, as
    /// the verbs require: the next poll must not see them); the others keep their order.
    fn purge(&self, qpn: u32, cqs: &[CqId]) {
        let rings = self.cq_rings.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for cq in cqs {
            let Some(ring) = rings.get(cq) else { continue };
            // The ring first, then the pending list: the order poll and resize take them in.
            let ring = ring.lock().unwrap_or_else(|e| e.into_inner());
            self.pending_used.store(true, Ordering::Relaxed);
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let q = pending.entry(*cq).or_default();
            self.arena.consume::<CqEntry>(&ring, usize::MAX, |e| {
                q.extend(e);
                true
            });
            let mut keep = std::collections::VecDeque::with_capacity(q.len());
            for e in q.drain(..) {
                if e.wc.qp_num.value() != qpn {
                    keep.push_back(e);
                    continue;
                }
                // A dropped staged receive still gives its staging back.
                self.staged_lock().remove(&e.wc.wr_id);
                if let Some((off, len)) = e.stage {
                    self.give_back(off, len);
                }
            }
            *q = keep;
        }
    }

    /// Posts a list onto a ring: each request is checked and encoded by `prepare` (its error
    /// is the post's), a full ring is ENOMEM; on an error the requests before `index` were
    /// posted, and `undo` takes back what `prepare` did for the one that was not. One doorbell
    /// for the list (`send_qp`: the QP whose send queue this is, see `ring_doorbell`, and its
    /// max_send_wr: ENOMEM once that many are outstanding in the ring and the device's queue
    /// together, by the ring's retired count).
    fn post_list<W, E: serde::Serialize>(
        &self,
        send_qp: Option<(Qpn, u32)>,
        ring: Option<RingDesc>,
        wrs: Vec<W>,
        mut prepare: impl FnMut(W) -> std::result::Result<E, VerbsError>,
        mut undo: impl FnMut(&E),
    ) -> Result<()> {
        let mut r = Ok(());
        let mut n = 0;
        let turn = ring.map(|r| self.producer(&r));
        for (index, wr) in wrs.into_iter().enumerate() {
            let err = match (ring, prepare(wr)) {
                (None, _) => Some(VerbsError::Inval),
                (_, Err(e)) => Some(e),
                (Some(ring), Ok(e)) => {
                    let full = send_qp.is_some_and(|(_, max)| {
                        self.arena.produced(&ring).wrapping_sub(self.arena.retired(&ring)) >= max
                    });
                    let err = match if full { Ok(false) } else { self.arena.produce(&ring, &e) } {
                        Ok(true) => None,
                        Ok(false) => Some(VerbsError::NoMem),
                        Err(_) => Some(VerbsError::Inval),
                    };
                    if err.is_some() {
                        undo(&e);
                    }
                    err
                }
            };
            if let Some(err) = err {
                r = Err(Error::Post { err, index });
                break;
            }
            n += 1;
        }
        drop(turn);
        if n > 0 {
            self.ring_doorbell(send_qp.is_some(), send_qp.map(|(q, _)| q));
        }
        r
    }

    /// This process's turn to produce on `ring`.
    fn producer(&self, ring: &RingDesc) -> std::sync::MutexGuard<'_, ()> {
        // Ring headers are 128 bytes apart: neighbouring rings take neighbouring locks.
        let i = (ring.off / 128) as usize % self.producers.len();
        self.producers[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the staging of a receive that was not posted.
    fn unstage(&self, e: &RecvEntry) {
        self.unstage_token(e.wr.wr_id, e.stage);
    }

    /// [`Inner::unstage`] by the receive's token and whether it was staged.
    fn unstage_token(&self, wr_id: u64, stage: bool) {
        if stage {
            self.staged_lock().remove(&wr_id);
        }
    }

    fn rq_lock(&self) -> std::sync::MutexGuard<'_, FastMap<u32, u32>> {
        self.rq_outstanding.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn staged_lock(&self) -> std::sync::MutexGuard<'_, FastMap<u64, (u64, Vec<Sge>)>> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After publishing work on a ring: tell the device, unless it is polling the rings now
    /// (design D4: the fence orders our producer index before our look at its flag; the device
    /// fences between clearing the flag and its last scan).
    ///
    /// On a device the application drives, a send (`urgent`) runs the device now, from this
    /// thread, as a provider's post_send rings the NIC (for QP `send_qp`, see `Hca::drive_post`);
    /// receives are not urgent: the device takes them off the ring before it looks at the next
    /// packets anyway.
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    fn ring_doorbell(&self, urgent: bool, send_qp: Option<Qpn>) {
        self.arena.posted().fetch_add(1, Ordering::Release);
        if self.application_driven() {
            #[cfg(feature = "embedded")]
            if let Backend::Embedded { hca, .. } = &self.backend {
                match (urgent, send_qp) {
                    // A post right after a post (no poll between): a stream, which may wait
                    // for the next poll or answer to leave in one batch; a post after a poll
                    // (a ping-pong) leaves at once.
                    (true, Some(q)) => hca.drive_post(q, self.posting.swap(true, Ordering::Relaxed)),
                    (true, None) => {
                        hca.drive(false);
                    }
                    (false, _) => {}
                }
            }
            return;
        }
        fence(Ordering::SeqCst);
        if self.arena.polling().load(Ordering::SeqCst) == 0 {
            let _ = nix::unistd::write(&self.doorbell, &1u64.to_ne_bytes());
        }
    }

    /// The device in this process that the application's threads drive (a provider's), if
    /// this is one: its send posts go straight into its engine.
    #[cfg(feature = "embedded")]
    fn application_hca(&self) -> Option<&Arc<Hca>> {
        match &self.backend {
            Backend::Embedded { hca, .. } if hca.progress() == crate::hca::Progress::Application => Some(hca),
            _ => None,
        }
    }

    /// Whether the application's threads drive this device ([`crate::hca::Progress::Application`]).
    fn application_driven(&self) -> bool {
        match &self.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, .. } => hca.progress() == crate::hca::Progress::Application,
            _ => false,
        }
    }

    /// On a device that the application's threads drive, runs it from this thread now (with
    /// `receive`, reading the socket too) and says so; `false` for every other device.
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    fn drive(&self, receive: bool) -> bool {
        match &self.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, .. } if hca.progress() == crate::hca::Progress::Application => {
                hca.drive(receive);
                true
            }
            _ => false,
        }
    }

    /// On a device the application drives: up to `max` completions of CQ `cq` straight from
    /// its engine ([`Hca::poll_cq`]); None for every other device (its completions come
    /// through the CQ's ring). With them, whether another CQ of this context holds completions.
    /// With `drive`, a poll that finds nothing drives the device and looks again.
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    fn poll_direct(&self, cq: CqId, max: usize, drive: bool) -> Option<(Vec<WorkCompletion>, bool)> {
        match &self.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, owner, .. } if hca.progress() == crate::hca::Progress::Application => {
                hca.poll_cq(*owner, cq, max, drive)
            }
            _ => None,
        }
    }

    /// On a device the application drives: this thread stops polling for now (see
    /// `Hca::end_handoff`); nothing for every other device.
    fn end_handoff(&self) {
        #[cfg(feature = "embedded")]
        if let Backend::Embedded { hca, .. } = &self.backend {
            hca.end_handoff();
        }
    }

    /// After a poll that returned completions: as [`Inner::end_handoff`], or when an answer is
    /// `likely`, after this thread's next send has left (see `Hca::end_handoff_after_poll`).
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    fn end_handoff_after_poll(&self, likely: bool, received: bool) {
        #[cfg(feature = "embedded")]
        if let Backend::Embedded { hca, .. } = &self.backend {
            hca.end_handoff_after_poll(likely, received);
        }
    }

    fn call_fds(&self, req: Request, fd: Option<RawFd>) -> Result<(Response, Vec<OwnedFd>)> {
        let (resp, fds) = match &self.backend {
            Backend::Daemon(c) => c.call(&req, fd.as_slice())?,
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, owner, daemon, .. } => {
                // A provider whose daemon went: its device is gone for the program, which has
                // heard IBV_EVENT_DEVICE_FATAL; every call fails from then on, as uverbs' do
                // after a device removal (its QPs' own data path runs in this process and is
                // left as it is).
                if self.hangup.as_ref().is_some_and(|h| h.gone.load(Ordering::SeqCst)) {
                    return Err(Error::Device(ClientError::Lost(crate::proto::ProtoError::Closed)));
                }
                let fds = match fd {
                    // SAFETY: the caller lends a descriptor it keeps open for the call.
                    Some(f) => vec![unsafe { BorrowedFd::borrow_raw(f) }
                        .try_clone_to_owned()
                        .map_err(|_| VerbsError::NoMem)?],
                    None => Vec::new(),
                };
                let again = matches!(req, Request::RegMr { .. } | Request::AllocMw { .. }).then(|| req.clone());
                let (mut r, mut out) = hca.call(*owner, req, fds);
                // A provider's key blocks are full (engine/src/device/keys.rs): one more from its
                // daemon, then once again; the daemon's ENOMEM is the program's.
                if let (Some(again), Response::Err(VerbsError::NoMem), Some(d)) = (again, &r, daemon) {
                    if let Ok((Response::KeyBlock(b), _)) = d.call(&Request::KeyBlock, &[]) {
                        hca.add_key_block(b);
                        (r, out) = hca.call(*owner, again, Vec::new());
                    }
                }
                let out = out.iter().filter_map(|e| e.as_fd().try_clone_to_owned().ok()).collect();
                (r, out)
            }
        };
        match resp {
            Response::Err(e) => Err(Error::Verbs(e)),
            r => Ok((r, fds)),
        }
    }

    /// The device connection, to notice the device going away while waiting (daemons only).
    fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backend {
            Backend::Daemon(c) => Some(c.hangup_fd()),
            #[cfg(feature = "embedded")]
            Backend::Embedded { daemon: Some(c), .. } => Some(c.hangup_fd()),
            #[cfg(feature = "embedded")]
            Backend::Embedded { .. } => None,
        }
    }

    fn call(&self, req: Request) -> Result<Response> {
        Ok(self.call_fds(req, None)?.0)
    }

    /// A provider's QP attached to or detached from `group`: tells the daemon, which passes the
    /// group's datagrams on (nothing to tell for other contexts).
    /// QP `qpn` attached to `group` (`on`) or detached from it, in the engine: tells a
    /// provider's daemon when the process's first QP attaches to the group or its last leaves.
    fn mcast_attached(&self, qpn: Qpn, group: IpAddr, on: bool) -> Result<()> {
        let mut set = self.mcast.lock().unwrap_or_else(|e| e.into_inner());
        let others = |set: &std::collections::BTreeSet<(IpAddr, Qpn)>| set.iter().any(|&(g, q)| g == group && q != qpn);
        if on {
            if set.contains(&(group, qpn)) {
                return Ok(());
            }
            if !others(&set) {
                self.mcast_relay(group, true)?;
            }
            set.insert((group, qpn));
        } else if set.remove(&(group, qpn)) && !others(&set) {
            self.mcast_relay(group, false)?;
        }
        Ok(())
    }

    /// QP `qpn` is destroyed: it leaves every group it was attached to.
    fn mcast_forget(&self, qpn: Qpn) {
        let groups: Vec<IpAddr> = {
            let set = self.mcast.lock().unwrap_or_else(|e| e.into_inner());
            set.iter().filter(|&&(_, q)| q == qpn).map(|&(g, _)| g).collect()
        };
        for g in groups {
            let _ = self.mcast_attached(qpn, g, false);
        }
    }

    fn mcast_relay(&self, group: IpAddr, on: bool) -> Result<()> {
        #[cfg(feature = "embedded")]
        if let Backend::Embedded { daemon: Some(c), .. } = &self.backend {
            return match c.call(&Request::McastRelay { group, on }, &[])?.0 {
                Response::Err(e) => Err(Error::Verbs(e)),
                _ => Ok(()),
            };
        }
        let _ = (group, on);
        Ok(())
    }

    fn mrs_lock(&self) -> std::sync::MutexGuard<'_, FastMap<u32, (PdId, u64, u64, Access)>> {
        self.mrs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gathers a small SEND/WRITE payload at post time when every SGE lies in a memory region of
    /// this process in the QP's PD (the lkey check the device would make); `None`: leave it to
    /// the device (which then reports a bad lkey as the HCA would, in the completion).
    fn gather(&self, pd: PdId, wr: &SendWr) -> Option<Vec<u8>> {
        let sends_data = matches!(
            wr.op,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::SendWithInv { .. }
                | SendOp::Write { .. }
                | SendOp::WriteWithImm { .. }
                | SendOp::AtomicWrite { .. }
        );
        let len: usize = wr.sg_list.iter().map(|s| s.length as usize).sum();
        if !sends_data || len > GATHER_MAX || wr.sg_list.is_empty() {
            return None;
        }
        let mrs = self.mrs_lock();
        let ok = wr.sg_list.iter().all(|s| {
            mrs.get(&s.lkey).is_some_and(|&(p, a, l, _)| {
                p == pd && s.addr >= a && s.addr.checked_add(u64::from(s.length)).is_some_and(|e| e <= a + l)
            })
        });
        if !ok {
            return None;
        }
        let mut out = Vec::with_capacity(len);
        for s in &wr.sg_list {
            // SAFETY: the range lies inside a memory region of this process that is registered
            // now; a region leaves the registry (under this lock, held) before its memory is
            // freed, so the bytes are allocated for the whole copy.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) });
        }
        Some(out)
    }

    /// Best effort for destructors.
    fn release(&self, req: Request) {
        let _ = self.call(req);
    }
}

/// Runs an object's destroy request now and reports the device's answer (EBUSY for one still in
/// use, as uverbs does); on an error the object stays as it was. On success its `Drop` does not
/// run (it would ask again); `release` gives back what it holds in this process.
fn destroy_now<T>(
    obj: T,
    ctx: &Context,
    req: Request,
    release: impl FnOnce(&mut T),
) -> std::result::Result<(), (T, Error)> {
    match ctx.inner.call(req) {
        Ok(_) => {
            let mut me = std::mem::ManuallyDrop::new(obj);
            release(&mut me);
            Ok(())
        }
        Err(e) => Err((obj, e)),
    }
}

fn unexpected<T>() -> Result<T> {
    Err(Error::Device(ClientError::Unexpected))
}

/// Waits until `fd` is readable, or the device connection (`hangup`) closes, or `timeout`.
fn wait_readable(fd: BorrowedFd<'_>, hangup: Option<BorrowedFd<'_>>, timeout: Option<Duration>) -> bool {
    let mut fds = vec![PollFd::new(fd, PollFlags::POLLIN)];
    if let Some(h) = hangup {
        fds.push(PollFd::new(h, PollFlags::empty())); // POLLHUP is always reported
    }
    let t = match timeout {
        None => PollTimeout::NONE,
        Some(d) => PollTimeout::try_from(d.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX),
    };
    matches!(nix::poll::poll(&mut fds, t), Ok(n) if n > 0)
}

/// Whether the device connection `fd` has hung up (the daemon is gone). Only the hang-up counts:
/// the socket is readable whenever another thread's call has its answer waiting.
fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut p = [PollFd::new(fd, PollFlags::empty())];
    let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    matches!(nix::poll::poll(&mut p, PollTimeout::ZERO), Ok(n) if n > 0)
        && p[0].revents().is_some_and(|r| r.intersects(gone))
}

/// Whether `fd` is readable right now (an eventfd drained only then never blocks).
fn readable_now(fd: BorrowedFd<'_>) -> bool {
    wait_readable(fd, None, Some(Duration::ZERO))
}

fn drain_eventfd(fd: BorrowedFd<'_>) {
    let mut b = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut b);
}

/// The next event of a queue the device keeps (`next` asks for it), waiting up to `timeout`
/// (`None`: forever) on the queue's eventfd. The fd is kept readable exactly while events may
/// wait, as the kernel's completion channel and async event fds are: programs put it in epoll
/// (UCX's async thread does) and call the verbs only when it is readable, so an fd left readable
/// with an empty queue would make them spin, and one drained with events left would make them
/// sleep through those.
fn next_event<T>(
    fd: BorrowedFd<'_>,
    hangup: Option<BorrowedFd<'_>>,
    timeout: Option<Duration>,
    mut next: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    // The device went away (its daemon's connection hung up): the event to report is that one
    // (IBV_EVENT_DEVICE_FATAL), even where the queue runs in this process (a provider).
    let gone = || hangup.is_some_and(hung_up);
    let lost = || Err(Error::Device(ClientError::Lost(crate::proto::ProtoError::Closed)));
    loop {
        if gone() {
            return lost();
        }
        if let Some(e) = next()? {
            return Ok(Some(e));
        }
        // A non-blocking call (the fd is in the program's epoll set) that finds the queue empty:
        // the fd must not stay readable. An event queued between the question and the drain
        // lost its wake-up, so ask once more; if there was one, others may follow it, so the fd
        // is made readable again (at worst one spurious wake-up). Blocking calls drain below,
        // after their wait, as they always did (draining them here too made lnet_bulk's
        // event threads stall the rxe interop run).
        if timeout == Some(Duration::ZERO) && readable_now(fd) {
            drain_eventfd(fd);
            if let Some(e) = next()? {
                let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
                return Ok(Some(e));
            }
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return Ok(None);
        }
        if wait_readable(fd, hangup, left) && readable_now(fd) {
            drain_eventfd(fd);
        }
    }
}

/// An open device.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

impl Context {
    /// Opens device `name` (a running daemon, found in the runtime directory).
    pub fn open(name: &str) -> Result<Context> {
        Context::daemon(Connection::connect(name)?)
    }

    /// Opens device `name` in runtime directory `dir`.
    pub fn open_in(dir: &std::path::Path, name: &str) -> Result<Context> {
        Context::daemon(Connection::connect_in(dir, name)?)
    }

    fn daemon(mut c: Connection) -> Result<Context> {
        let dup = |f: &OwnedFd| f.try_clone().map_err(|_| Error::Verbs(VerbsError::NoMem));
        let (arena, doorbell) = (dup(&c.arena_fd)?, dup(&c.doorbell)?);
        let (info, release) = (c.info.clone(), c.release);
        c.arena_fd = dup(&c.event_fd)?; // the connection keeps no second arena reference
        let helper = c.helper.clone();
        let inner = Inner::new(Backend::Daemon(c), info, arena, doorbell, release)?;
        if let Some(h) = helper {
            let _ = inner.helper.set(h);
        }
        Ok(Context { inner: Arc::new(inner) })
    }

    /// A context on a device running in this process.
    #[cfg(feature = "embedded")]
    pub fn embedded(hca: &Arc<Hca>) -> Result<Context> {
        let a = hca.attach(std::process::id() as i32).map_err(|_| VerbsError::NoMem)?;
        let event_fd = a.event_fd.as_fd().try_clone_to_owned().map_err(|_| VerbsError::NoMem)?;
        let info = hca.info().clone();
        let backend = Backend::Embedded { hca: hca.clone(), owner: a.owner, event_fd, daemon: None };
        Ok(Context { inner: Arc::new(Inner::new(backend, info, a.arena, a.doorbell, a.release)?) })
    }

    /// Opens device `name` as a user-space provider (`SOFTRDMA_DATAPATH=provider`; the data-path
    /// issue's items 1-3): this process runs the engine for its own QPs on a socket of the
    /// device's steered port that the daemon gives it, with QPNs from a block the port steers
    /// to that socket, and its threads drive it from their post and poll calls
    /// ([`crate::hca::Progress::Application`]); a progress thread serves one-sided targets,
    /// timers and channel sleepers. Its QPs talk to every other QP of the device, the daemon's
    /// and other providers', through the port, and to other devices over the wire.
    ///
    /// The device's settings hold for these QPs: the daemon's fault injection, profile and ICRC
    /// check apply, their counters and (while the device captures) packets are reported to the
    /// daemon (`Request::Publish`). XRC domains, XRC SRQs and target QPs are the daemon's: the
    /// context makes them on its XRC side (`verbs/xrc.rs`), a second context of this process on the
    /// device's own data path. Errors: the daemon's port is not
    /// steered (`NotSupp`), no QPN block is free (`NoMem`).
    #[cfg(feature = "embedded")]
    pub fn provider(name: &str) -> Result<Context> {
        Context::provider_on(Connection::connect(name)?)
    }

    /// [`Context::provider`] for device `name` in runtime directory `dir`.
    #[cfg(feature = "embedded")]
    pub fn provider_in(dir: &std::path::Path, name: &str) -> Result<Context> {
        Context::provider_on(Connection::connect_in(dir, name)?)
    }

    #[cfg(feature = "embedded")]
    fn provider_on(c: Connection) -> Result<Context> {
        let name = c.info.name.clone();
        let (resp, fds) = c.call(&Request::JoinSteering, &[])?;
        let (index, blocks, key_blocks, settings, first_qpn) = match resp {
            Response::Steering { index, blocks, key_blocks, settings, first_qpn } => {
                (index, blocks, key_blocks, settings, first_qpn)
            }
            Response::Err(e) => return Err(Error::Verbs(e)),
            _ => return unexpected(),
        };
        // The member socket, then this process's end of its relay link to the daemon.
        let mut fds = fds.into_iter();
        let member = fds.next().ok_or(Error::Verbs(VerbsError::Inval))?;
        let relay_link = fds.next();
        let mut cfg = crate::hca::HcaConfig::new(&c.info.name, c.info.addr);
        cfg.mtu = Some(c.info.active_mtu);
        cfg.progress = crate::hca::Progress::Application;
        // The device's settings hold for this process's QPs as for the daemon's (the data-path
        // issue's item 5): the faults are injected by whoever sends (with draws of its own: the
        // member index goes into the seed), the profile and ICRC check are the device's, and
        // while the device captures, this process reports every packet to it.
        let mut faults: crate::faults::Faults = settings.faults.parse().map_err(|e| {
            tracing::warn!("provider for {name}: the device's faults: {e}");
            Error::Verbs(VerbsError::Inval)
        })?;
        faults.seed ^= u64::from(index + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        cfg.faults = faults;
        cfg.behaviour = settings.behaviour;
        cfg.icrc = settings.icrc;
        cfg.max_cqe = Some(settings.max_cqe);
        cfg.capture_remote = settings.capture;
        cfg.key_blocks = key_blocks;
        let c = Arc::new(c);
        let link = c.clone();
        let pid = std::process::id();
        cfg.publish = Some(crate::hca::Publisher(Arc::new(move |p| {
            // A forked child (which should not use its parent's verbs objects anyway) never
            // speaks on its parent's connection: the frames would interleave.
            if std::process::id() == pid {
                let _ = link.call(&Request::Publish(Box::new(p)), &[]);
            }
        })));
        // Batched sends as the daemon makes them (design D5; one destination QP per batch).
        cfg.gso = true;
        let hca = Arc::new(Hca::start_member(cfg, member, relay_link, blocks, first_qpn).map_err(|e| {
            tracing::warn!("provider for {name}: {e}");
            Error::Verbs(VerbsError::NoMem)
        })?);
        let a = hca.attach(std::process::id() as i32).map_err(|_| VerbsError::NoMem)?;
        let event_fd = a.event_fd.as_fd().try_clone_to_owned().map_err(|_| VerbsError::NoMem)?;
        let info = hca.info().clone();
        let dir = c.dir.clone();
        let backend = Backend::Embedded { hca, owner: a.owner, event_fd, daemon: Some(c) };
        let mut inner = Inner::new(backend, info, a.arena, a.doorbell, a.release)?;
        inner.daemon_at = Some((dir, name));
        Ok(Context { inner: Arc::new(inner) })
    }

    /// A context on a device in this process whose memory the device reaches only through a
    /// helper thread of this context (the fallback for processes the kernel guards against
    /// cross-process access; here to exercise it).
    #[cfg(feature = "embedded")]
    pub fn embedded_with_memory_helper(hca: &Arc<Hca>) -> Result<Context> {
        let (ctx, theirs) = Context::embedded_with_helper_socket(hca, crate::memory::HELPER_TIMEOUT)?;
        let progress = Arc::new(crate::memory::HelperProgress::default());
        let _ = ctx.inner.helper.set(progress.clone());
        std::thread::Builder::new()
            .name("softrdma-memory".into())
            .spawn(move || {
                crate::signals::keep_off_this_thread();
                crate::memory::serve_helper(theirs, progress)
            })
            .map_err(|_| VerbsError::NoMem)?;
        Ok(ctx)
    }

    /// A context on a device in this process that reaches its memory only through a helper
    /// on the socket returned, which the caller serves (or, to test a client whose helper
    /// stops answering, does not), each answer awaited at most `timeout`.
    #[cfg(feature = "embedded")]
    pub fn embedded_with_helper_socket(
        hca: &Arc<Hca>,
        timeout: std::time::Duration,
    ) -> Result<(Context, std::os::unix::net::UnixStream)> {
        let ctx = Context::embedded(hca)?;
        let Backend::Embedded { owner, .. } = &ctx.inner.backend else { return unexpected() };
        let (mine, theirs) = std::os::unix::net::UnixStream::pair().map_err(|_| VerbsError::NoMem)?;
        hca.use_memory_helper_timeout(*owner, mine, timeout);
        Ok((ctx, theirs))
    }

    /// Whether this process runs this context's QPs itself ([`Context::provider`]).
    pub fn is_provider(&self) -> bool {
        match &self.inner.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { daemon, .. } => daemon.is_some(),
            _ => false,
        }
    }

    /// The device.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// GID index 0 as an IP address (the RoCEv2 GID of the device's address).
    pub fn gid_addr(&self) -> IpAddr {
        self.inner.info.addr
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        match self.inner.call(Request::AllocPd)? {
            Response::Pd(id) => Ok(ProtectionDomain { ctx: self.clone(), id }),
            _ => unexpected(),
        }
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        match self.inner.call_fds(Request::CreateCompChannel, None)? {
            (Response::Channel(id), mut fds) if !fds.is_empty() => {
                let fd = fds.remove(0);
                if let Some(h) = &self.inner.hangup {
                    h.add(fd.as_fd());
                }
                Ok(CompletionChannel { ctx: self.clone(), id, fd })
            }
            _ => unexpected(),
        }
    }

    /// `ibv_create_cq` with at least `cqe` entries, optionally on a completion channel.
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompletionChannel>) -> Result<CompletionQueue> {
        match self.inner.call(Request::CreateCq { cqe, channel: channel.map(|c| c.id) })? {
            Response::Cq { cq, ring } => {
                let ring = Arc::new(std::sync::Mutex::new(ring));
                self.inner.cq_rings.lock().unwrap_or_else(|e| e.into_inner()).insert(cq, ring.clone());
                Ok(CompletionQueue {
                    ctx: self.clone(),
                    id: cq,
                    ring,
                    cqe: std::sync::atomic::AtomicU32::new(cqe),
                    channel: channel.map(|c| c.id),
                    xrc: std::sync::OnceLock::new(),
                    xrc_guard: std::sync::Mutex::new(false),
                })
            }
            _ => unexpected(),
        }
    }

    /// `ibv_open_xrcd`: the domain of `file` (shared with every process that opens the same
    /// file), or a private one. Without `create` a missing domain is EAGAIN; `create` and
    /// `exclusive` with an existing one is EINVAL.
    pub fn open_xrcd(&self, file: Option<&File>, create: bool, exclusive: bool) -> Result<XrcDomain> {
        if self.is_provider() {
            // An XRC domain and its target QPs are shared by processes and outlive them: the
            // daemon's (design D2 revised), made on this context's XRC side (verbs::xrc).
            let side = self.xrc_side()?;
            let mut d = side.ctx.open_xrcd(file, create, exclusive)?;
            d.host = Some(xrc::XrcHost { host: self.clone() });
            return Ok(d);
        }
        let fd = file.map(|f| f.as_raw_fd());
        match self.inner.call_fds(Request::OpenXrcd { create, exclusive }, fd)?.0 {
            Response::Xrcd(id) => Ok(XrcDomain { ctx: self.clone(), id, host: None }),
            _ => unexpected(),
        }
    }

    /// `ibv_get_async_event`: waits up to `timeout` (`None`: forever) for the next async event.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<ClientEvent>> {
        let next = || match self.inner.call(Request::GetAsyncEvent)? {
            Response::Event(e) => Ok(e),
            _ => unexpected(),
        };
        next_event(self.event_fd(), self.inner.hangup_fd(), timeout, next)
    }

    /// The fd that is readable while async events wait.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        match &self.inner.backend {
            Backend::Daemon(c) => c.event_fd.as_fd(),
            #[cfg(feature = "embedded")]
            Backend::Embedded { event_fd, .. } => event_fd.as_fd(),
        }
    }

    /// The device's counters: the transport's and the device layer's.
    pub fn counters(&self) -> Result<(softrdma_engine::device::Counters, crate::proto::IoStats)> {
        match self.inner.call(Request::Stats)? {
            Response::Stats(c, io) => Ok((c, io)),
            _ => unexpected(),
        }
    }
}

#[cfg(feature = "embedded")]
impl Drop for Inner {
    fn drop(&mut self) {
        if let Backend::Embedded { hca, owner, .. } = &self.backend {
            hca.detach(*owner);
        }
    }
}
