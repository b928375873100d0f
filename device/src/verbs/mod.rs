//! The Rust-native verbs API, in the style of rust-ibverbs and sideway: a [`Context`] on a
//! device, and the objects made from it, each destroyed when dropped.
//!
//! A context talks to a daemon ([`Context::open`]) or to a device running inside this process
//! ([`Context::embedded`]); both run the same device code. The backends, the constructors of a
//! context and the calls that depend on its backend are in `backend.rs`; waiting on the event
//! fds in `events.rs`; each kind of object in its own file.
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

mod backend;
mod cq;
mod events;
mod hangup;
mod mem;
mod qp;
mod xrc;

use backend::Backend;
use events::next_event;
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
/// scattered into the posted buffers by this process when it polls the completion
/// (docs/architecture.md D3); larger ones are written into the buffers by the device (one
/// process_vm_writev per packet).
pub const STAGE_MAX: u64 = 64 << 10;

/// SEND and WRITE payloads up to this size are gathered into the work request at post time
/// (docs/architecture.md D3: the data moves in the client; the device does not reach into it to
/// send them). Larger ones are read by the device when it sends them (one process_vm_readv per
/// packet).
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
    /// (docs/architecture.md D4: the fence orders our producer index before our look at its flag;
    /// the device fences between clearing the flag and its last scan).
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
/// use, as uverbs does; success for any object of a device that has gone); on an error the
/// object stays as it was. On success its `Drop` does not
/// run (it would ask again); `release` gives back what it holds in this process.
fn destroy_now<T>(
    obj: T,
    ctx: &Context,
    req: Request,
    release: impl FnOnce(&mut T),
) -> std::result::Result<(), (T, Error)> {
    match ctx.inner.call(req) {
        // The device is gone (its daemon exited, the connection to it broke): the object went
        // with it. Destroying it succeeds, as uverbs' destroy calls do for the objects of a
        // device that was disassociated (the kernel frees them; the program must be able to
        // clean up after a failure).
        Ok(_) | Err(Error::Device(_)) => {
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

/// An open device.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

impl Context {
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
            // daemon's (docs/architecture.md D2 revised), made on this context's XRC side
            // (verbs::xrc).
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
        next_event(self.event_fd(), self.inner.hangup_fd(), timeout, next, |_, _| None)
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
