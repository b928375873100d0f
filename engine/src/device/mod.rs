//! The device model: one emulated HCA's objects (PDs, MRs, CQs, QPs) and its transport engine,
//! driven from outside with verbs calls and the quinn-proto style sans-IO loop:
//!
//! - inputs: verbs calls (`alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify_qp`,
//!   `post_send`, `post_recv`), [`Device::handle_packet`] for every datagram that arrives, and
//!   [`Device::handle_timeout`] when [`Device::poll_timeout`] has passed;
//! - outputs: [`Device::poll_transmit`] writes the next UDP payload (BTH to ICRC) into the caller's
//!   buffer, [`Device::poll_cq`] returns completions, [`Device::poll_event`] async events.
//!
//! The reliable-connected machinery follows Linux rxe's split: the requester (`req`) turns send
//! WQEs into request packets, the completer (`comp`) matches responses to WQEs and completes
//! them, the responder (`resp`) executes incoming requests and answers them; `unreliable` is the
//! responder of UC and UD. The modules form a tree: `dispatch` hands a QP's packets, timers and
//! transmit turns to the roles; the roles work on the QP's state (`qp`: the shared part, and one
//! state per role, as rxe's `qp->req`, `->comp`, `->resp`) and share `packet` (writing packets,
//! scatter/gather) and `window` (the requester's window of unacknowledged PSNs, which the
//! completer's acknowledgements, losses and RNR NAKs move); the only call between roles is the
//! completer rewinding the requester.
//! Around them: `types` holds the values the device's API takes and returns (configuration,
//! handles, events, counters), `entry` its entry points, the sans-IO loop (datagrams in, packets
//! out, timers), and this module the objects and the verbs.
//!
//! A packet's path. In: [`Device::handle_packet`] (`entry`) checks the headers and the ICRC and
//! finds the QP by destination QPN (QP1's MADs go to the CM, `handle_gsi`; a multicast datagram
//! to every attached UD QP); `Qp::handle_packet` (`dispatch`) checks the opcode's service, the
//! P_Key, a connected QP's peer and the QP's state, and hands an RC or XRC request to the
//! responder, `resp::handle_request` (`check_psn`, `landing`, `check_op_sequence`,
//! `check_length`, one of the `execute_*`, `acknowledge`: its answers queue on the QP), a UC or UD
//! one to `unreliable::handle_uc` / `handle_ud`, and a response to the completer,
//! `comp::handle_response` (`update_credits`; for each WQE it acknowledges `get_wqe`,
//! `check_psn` and `check_write_send`, `check_read` and `do_read`, or `check_atomic` and
//! `do_atomic`; then `update_comp`; a NAK or an implicit NAK, `handle_nak` or `retry_once`,
//! rewinds the requester, `req::rewind`); then `touched` queues the QP to transmit and refiles its
//! timer. Out: [`Device::poll_transmit`] (`entry`) sends the CM's MADs first (`poll_gsi`), then
//! asks the next ready QP, `Qp::poll_transmit` (`dispatch`): the responder's queued answers,
//! `resp::poll_transmit` (ACKs and NAKs, READ responses, atomic ACKs, once the writes they answer
//! for are in place), come before the requester's requests, `req::poll_transmit`
//! (`check_window`, `start_wqe`, `Packet::next`, `ack_req`, `init_req_packet`, `finish_packet`,
//! `update_state`; UD: `ud_poll_transmit`), or after them with
//! [`TransmitOptions::requester_first`]; `packet::emit` writes every packet (headers, payload,
//! ICRC). Timers: [`Device::handle_timeout`] (`entry`) runs `Qp::handle_timeout` (`dispatch`):
//! the end of an RNR wait, the transport timer (`comp::retransmit_timeout`, a go-back-N resend),
//! the window's probe.

mod comp;
mod dispatch;
mod keys;
mod mw;
mod packet;
pub mod profile;
mod qp;
mod qpns;
mod req;
mod resp;
mod srq;
mod types;
mod unreliable;
mod window;
pub use self::window::MAX_UNACKED_PSNS;

use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;

pub use self::keys::{key_block, KEY_BLOCK_SHIFT};
pub use self::packet::ip_udp_header;
pub use self::profile::{CreditPolicy, ProfileName, WireProfile};
pub use self::qp::{QpAttr, QpCaps, QpInit};
use self::qpns::QpnSpace;
pub use self::qpns::{qpn_block, QPN_BLOCK_SHIFT};
pub use self::srq::{SrqAttr, XrcPolicy, XrcdId};
pub use self::types::*;
pub use self::unreliable::{ah_from_grh, GRH_SLOT};

use crate::cm::{Cm, CmConfig};
use crate::memory::{Memory, Owner};
use crate::rng::Rng;
use crate::time::{Duration, Instant};
use crate::verbs::{Access, AttrMask, Mtu, QpState, QpType, VerbsError, WcOpcode, WcStatus};
use crate::wire::{Psn, Qpn};
use crate::wr::{RecvWr, SendWr, WorkCompletion};

use self::qp::Qp;

/// A fast hasher for the device's small integer keys (QPNs, key indexes, object ids). The keys
/// are the device's own, so SipHash's flooding resistance buys nothing here; packets choose which
/// QPN to look up, but the table grows only by verbs calls.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(v)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A map keyed by small integers, hashed with [`IdHasher`].
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IdHasher>>;

pub(crate) struct Pd {
    owner: Owner,
}

pub(crate) struct Mr {
    pub(crate) pd: PdId,
    pub(crate) owner: Owner,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

impl Mr {
    /// Whether `[addr, addr+len)` lies inside the region.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr.saturating_add(self.len))
    }
}

pub(crate) struct Cq {
    capacity: usize,
    entries: VecDeque<WorkCompletion>,
    overflowed: bool,
    /// Completions ever added (a completion channel compares it with what it last saw).
    added: u64,
    /// Of those, the ones a solicited-only notification fires for: receives of a message with
    /// the Solicited Event bit, and every unsuccessful completion (IBTA 11.4.2.2).
    solicited: u64,
}

/// The shared state QP code needs besides the QP itself (split from [`Device`] to satisfy the
/// borrow checker without reference counting).
pub(crate) struct Ctx<'a, M: Memory> {
    pub(crate) now: Instant,
    pub(crate) mrs: &'a mut HashMap<u32, Mr>,
    pub(crate) rkey_aliases: &'a HashMap<u32, Mr>,
    pub(crate) srqs: &'a mut HashMap<u32, srq::Srq>,
    pub(crate) mws: &'a mut HashMap<u32, mw::Mw>,
    pub(crate) cqs: &'a mut HashMap<CqId, Cq>,
    pub(crate) mem: &'a mut M,
    pub(crate) events: &'a mut VecDeque<AsyncEvent>,
    pub(crate) handle_events: &'a mut VecDeque<HandleEvent>,
    pub(crate) counters: &'a mut Counters,
    pub(crate) local: IpAddr,
    pub(crate) flow_ports: FlowPorts,
    /// The packet being completed carried the Solicited Event bit.
    pub(crate) se: bool,
    /// The port's active MTU (UD datagrams may not exceed it).
    pub(crate) port_mtu: Mtu,
    /// The destination address of the packet being handled (the device's, or a multicast group).
    pub(crate) dst: IpAddr,
    /// The IPv4 Identification a packet emitted now will carry (its ICRC covers it).
    pub(crate) ip_id: u16,
    /// Whether a packet to the device's own address gets an ICRC.
    pub(crate) loopback_icrc: bool,
    /// The device's wire choices.
    pub(crate) behaviour: WireProfile,
}

impl<M: Memory> Ctx<'_, M> {
    /// Looks up a memory region by local key.
    pub(crate) fn mr_by_lkey(&self, lkey: u32) -> Option<&Mr> {
        self.mrs.get(&(lkey >> 8)).filter(|m| m.lkey == lkey)
    }

    /// Looks up a memory region by remote key (its own, or an alias it was given).
    pub(crate) fn mr_by_rkey(&self, rkey: u32) -> Option<&Mr> {
        self.mrs.get(&(rkey >> 8)).filter(|m| m.rkey == rkey).or_else(|| self.rkey_aliases.get(&rkey))
    }

    /// Adds a completion to a CQ; an overflow raises CQ_ERR (IBTA 11.4.2.1: CQ overrun) and drops it.
    pub(crate) fn complete(&mut self, cq: CqId, wc: WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.counters.send_err += u64::from(!matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm));
        }
        let Some(c) = self.cqs.get_mut(&cq) else { return };
        if c.entries.len() >= c.capacity {
            if !c.overflowed {
                c.overflowed = true;
                self.events.push_back(AsyncEvent::CqErr(cq));
            }
            return;
        }
        c.entries.push_back(wc);
        c.added += 1;
        c.solicited += u64::from(self.se || wc.status != WcStatus::Success);
    }
}

/// One emulated HCA.
pub struct Device<M: Memory> {
    config: DeviceConfig,
    rng: Rng,
    mem: M,
    pds: HashMap<PdId, Pd>,
    mrs: HashMap<u32, Mr>,
    /// Remote keys another engine of this device gave out for memory that a region here also
    /// covers ([`Device::alias_rkey`]), by the full key.
    rkey_aliases: HashMap<u32, Mr>,
    cqs: HashMap<CqId, Cq>,
    qps: HashMap<Qpn, Qp>,
    srqs: HashMap<u32, srq::Srq>,
    mws: HashMap<u32, mw::Mw>,
    mcast: HashMap<IpAddr, Vec<Qpn>>,
    xrcds: HashMap<XrcdId, srq::Xrcd>,
    xrc_policy: XrcPolicy,
    next_id: u32,
    next_qpn: u32,
    /// Which QPN blocks are this engine's (a steered port shares the QPN space among processes).
    qpns: QpnSpace,
    /// Which key indexes this engine allocates from (`keys.rs`).
    keys: keys::KeySpace,
    /// QPs that may have a packet to send, in round-robin order (a QP appears at most once:
    /// `in_ready` says which are queued).
    ready: VecDeque<Qpn>,
    in_ready: std::collections::HashSet<Qpn, BuildHasherDefault<IdHasher>>,
    /// QPs that stopped sending because the memory is fetching their data
    /// ([`Memory::would_block_count`]): ready again at [`Device::memory_ready`].
    mem_waiters: Vec<Qpn>,
    /// Every QP's next timer deadline, ordered (poll_timeout is the first), and what is filed
    /// for each QP.
    timers: std::collections::BTreeSet<(Instant, Qpn)>,
    armed: HashMap<Qpn, Instant>,
    events: VecDeque<AsyncEvent>,
    handle_events: VecDeque<HandleEvent>,
    counters: Counters,
    /// The IPv4 ID for which the last packet handed to [`Device::handle_packet`] had a right
    /// ICRC (the ID its sender gave it), when the check found one ([`Device::last_rx_ipv4_id`]).
    last_rx_ipv4_id: Option<u16>,
    /// The connection manager behind QP1 (docs/architecture.md D10).
    cm: Cm,
    /// QP1's send PSN: one per MAD, carried across connections (kernel mad.c starts it at 0).
    gsi_psn: Psn,
}

/// QP1's Q_Key (IB_QP1_QKEY, IBTA 13.4.6.2).
pub const GSI_QKEY: u32 = 0x8001_0000;

macro_rules! ctx {
    ($d:expr, $now:expr) => {
        Ctx {
            now: $now,
            mrs: &mut $d.mrs,
            rkey_aliases: &$d.rkey_aliases,
            srqs: &mut $d.srqs,
            mws: &mut $d.mws,
            cqs: &mut $d.cqs,
            mem: &mut $d.mem,
            events: &mut $d.events,
            handle_events: &mut $d.handle_events,
            counters: &mut $d.counters,
            local: $d.config.addr,
            flow_ports: $d.config.flow_ports,
            se: false,
            port_mtu: $d.config.mtu,
            dst: $d.config.addr,
            ip_id: 0,
            loopback_icrc: true,
            behaviour: $d.config.behaviour,
        }
    };
}

// After `ctx!`, which it uses.
mod entry;

impl<M: Memory> Device<M> {
    /// A device with no objects.
    pub fn new(config: DeviceConfig, mem: M) -> Device<M> {
        let mut rng = Rng::new(config.seed);
        // QPNs start at a random point above the reserved QP0/QP1, as hardware does.
        let next_qpn = 0x11 + (rng.next_u32() & 0xfff);
        Device {
            rng,
            mem,
            pds: HashMap::default(),
            mrs: HashMap::default(),
            rkey_aliases: HashMap::default(),
            cqs: HashMap::default(),
            qps: HashMap::default(),
            srqs: HashMap::default(),
            mws: HashMap::default(),
            mcast: HashMap::default(),
            xrcds: HashMap::default(),
            xrc_policy: XrcPolicy::default(),
            next_id: 1,
            next_qpn,
            qpns: QpnSpace::default(),
            keys: Default::default(),
            ready: VecDeque::new(),
            in_ready: Default::default(),
            mem_waiters: Vec::new(),
            timers: Default::default(),
            armed: HashMap::default(),
            events: VecDeque::new(),
            handle_events: VecDeque::new(),
            counters: Counters::default(),
            last_rx_ipv4_id: None,
            cm: Cm::new(CmConfig::new(config.addr, 0, config.mtu, config.seed)),
            gsi_psn: Psn::new(0),
            config,
        }
    }

    /// The connection manager (QP1's consumer).
    pub fn cm(&mut self) -> &mut Cm {
        &mut self.cm
    }

    /// The connection manager, to read.
    pub fn cm_ref(&self) -> &Cm {
        &self.cm
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The memory the device reaches, to read (counters).
    pub fn memory_ref(&self) -> &M {
        &self.mem
    }

    /// The memory the device reaches (tests look at it).
    pub fn memory(&mut self) -> &mut M {
        &mut self.mem
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn next_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Allocates a protection domain for `owner`.
    pub fn alloc_pd(&mut self, owner: Owner) -> PdId {
        let id = PdId(self.next_id());
        self.pds.insert(id, Pd { owner });
        id
    }

    /// Destroys a protection domain; EBUSY while MRs, MWs, QPs or SRQs use it (as uverbs counts
    /// a PD's users).
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        if !self.pds.contains_key(&pd) {
            return Err(VerbsError::Inval);
        }
        if self.pd_busy(pd, None) {
            return Err(VerbsError::Busy);
        }
        self.pds.remove(&pd);
        Ok(())
    }

    /// Whether objects other than the region `but` use `pd`: regions, windows, QPs, SRQs.
    pub fn pd_busy(&self, pd: PdId, but: Option<u32>) -> bool {
        self.mrs.values().any(|m| m.pd == pd && Some(m.lkey) != but)
            || self.mws.values().any(|w| w.pd == pd)
            || self.qps.values().any(|q| q.pd == Some(pd))
            || self.srqs.values().any(|s| s.pd == pd)
    }

    /// Registers `len` bytes at `addr` of the PD owner's memory. Remote write or atomic access
    /// needs local write too (IBTA 10.6.3.1, `ibv_reg_mr` EINVAL).
    pub fn reg_mr(&mut self, pd: PdId, addr: u64, len: u64, access: Access) -> Result<MrKeys, VerbsError> {
        let owner = self.pds.get(&pd).ok_or(VerbsError::Inval)?.owner;
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::Inval);
        }
        if addr.checked_add(len).is_none() {
            return Err(VerbsError::Inval);
        }
        // An index of this engine's and a random low byte (`keys.rs`).
        let lkey = self.new_key()?;
        let rkey = lkey;
        self.mrs.insert(lkey >> 8, Mr { pd, owner, addr, len, access, lkey, rkey });
        Ok(MrKeys { lkey, rkey })
    }

    /// `ibv_rereg_mr`: changes a region's PD, range or access in place, keeping its keys (as
    /// rxe and hardware do for these changes); `None` keeps what it was.
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdId>,
        range: Option<(u64, u64)>,
        access: Option<Access>,
    ) -> Result<(), VerbsError> {
        if let Some(p) = pd {
            if !self.pds.contains_key(&p) {
                return Err(VerbsError::Inval);
            }
        }
        let m = match self.mrs.get_mut(&(lkey >> 8)) {
            Some(m) if m.lkey == lkey => m,
            _ => return Err(VerbsError::Inval),
        };
        let acc = access.unwrap_or(m.access);
        if acc.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !acc.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::Inval);
        }
        if let Some((addr, len)) = range {
            if addr.checked_add(len).is_none() {
                return Err(VerbsError::Inval);
            }
            m.addr = addr;
            m.len = len;
        }
        if let Some(p) = pd {
            m.pd = p;
        }
        m.access = acc;
        self.drop_rkey_aliases(lkey);
        Ok(())
    }

    /// The receive WQEs queued on a QP's own receive queue (the device rewrites staged ones).
    pub fn queued_recvs_mut(&mut self, qpn: Qpn) -> Option<&mut VecDeque<RecvWr>> {
        self.qps.get_mut(&qpn).map(|q| &mut q.rq)
    }

    /// The receive WQEs queued on an SRQ.
    pub fn queued_srq_recvs_mut(&mut self, srqn: u32) -> Option<&mut VecDeque<RecvWr>> {
        self.srqs.get_mut(&srqn).map(|s| &mut s.queue)
    }

    /// Deregisters a memory region (and the remote keys aliased to it).
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), VerbsError> {
        match self.mrs.get(&(lkey >> 8)) {
            Some(m) if m.lkey == lkey => {
                self.mrs.remove(&(lkey >> 8));
                self.drop_rkey_aliases(lkey);
                Ok(())
            }
            _ => Err(VerbsError::Inval),
        }
    }

    /// Lets a region also answer to `rkey`, a remote key another engine of this device gave out
    /// for the same memory (a provider process's region, whose twin here serves RDMA that
    /// arrives through an XRC target QP of this engine). The alias has the region's PD, range
    /// and access as they are now; it goes when the region is deregistered or changed. EINVAL
    /// for an unknown region, or a key that already names a region or alias here: a key of
    /// this engine always wins.
    pub fn alias_rkey(&mut self, lkey: u32, rkey: u32) -> Result<(), VerbsError> {
        let m = self.mrs.get(&(lkey >> 8)).filter(|m| m.lkey == lkey).ok_or(VerbsError::Inval)?;
        if self.mrs.get(&(rkey >> 8)).is_some_and(|o| o.rkey == rkey) || self.rkey_aliases.contains_key(&rkey) {
            return Err(VerbsError::Inval);
        }
        let alias = Mr { pd: m.pd, owner: m.owner, addr: m.addr, len: m.len, access: m.access, lkey, rkey };
        self.rkey_aliases.insert(rkey, alias);
        Ok(())
    }

    fn drop_rkey_aliases(&mut self, lkey: u32) {
        if !self.rkey_aliases.is_empty() {
            self.rkey_aliases.retain(|_, a| a.lkey != lkey);
        }
    }

    /// Creates a CQ of at least `cqe` entries; EINVAL beyond the device limit.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqId, VerbsError> {
        if cqe == 0 || cqe > self.config.limits.max_cqe {
            return Err(VerbsError::Inval);
        }
        let id = CqId(self.next_id());
        self.cqs.insert(
            id,
            Cq { capacity: cqe as usize, entries: VecDeque::new(), overflowed: false, added: 0, solicited: 0 },
        );
        Ok(id)
    }

    /// `ibv_resize_cq`: the CQ holds `cqe` entries from now on; EINVAL beyond the device limit or
    /// below what it holds now plus `elsewhere` (completions already handed on but not yet polled).
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32, elsewhere: usize) -> Result<(), VerbsError> {
        let max = self.config.limits.max_cqe;
        let c = self.cqs.get_mut(&cq).ok_or(VerbsError::Inval)?;
        if cqe == 0 || cqe > max || c.entries.len() + elsewhere > cqe as usize {
            return Err(VerbsError::Inval);
        }
        c.capacity = cqe as usize;
        Ok(())
    }

    /// Destroys a CQ; EBUSY while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        if !self.cqs.contains_key(&cq) {
            return Err(VerbsError::Inval);
        }
        // An XRC SRQ completes into its CQ: busy too.
        if self.qps.values().any(|q| q.send_cq == Some(cq) || q.recv_cq == Some(cq))
            || self.srqs.values().any(|s| s.xrc.is_some_and(|(_, c)| c == cq))
        {
            return Err(VerbsError::Busy);
        }
        self.cqs.remove(&cq);
        Ok(())
    }

    /// Takes up to `max` completions from a CQ, oldest first.
    pub fn poll_cq(&mut self, cq: CqId, max: usize) -> Vec<WorkCompletion> {
        let Some(c) = self.cqs.get_mut(&cq) else { return Vec::new() };
        let n = max.min(c.entries.len());
        c.entries.drain(..n).collect()
    }

    /// Whether a local SGE lies in a memory region of `pd` that grants `access`: the check the
    /// engine makes when it uses the SGE (a device that redirects a receive checks it first).
    pub fn sge_ok(&self, pd: PdId, sge: &crate::wr::Sge, access: Access) -> bool {
        self.mrs
            .get(&(sge.lkey >> 8))
            .filter(|m| m.lkey == sge.lkey)
            .is_some_and(|m| m.pd == pd && m.contains(sge.addr, u64::from(sge.length)) && m.access.contains(access))
    }

    /// What a completion channel needs to know about a CQ: completions added since it was
    /// created, how many of those a solicited-only request fires for, and how many it holds now.
    pub fn cq_counts(&self, cq: CqId) -> Option<CqCounts> {
        self.cqs.get(&cq).map(|c| CqCounts { added: c.added, solicited: c.solicited, held: c.entries.len() })
    }

    /// Creates a QP in RESET. Capacities beyond the device limits are EINVAL (as rxe_qp_chk_cap).
    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn, VerbsError> {
        let l = self.config.limits;
        if !self.pds.contains_key(&init.pd) {
            return Err(VerbsError::Inval);
        }
        if !self.cqs.contains_key(&init.send_cq) || !self.cqs.contains_key(&init.recv_cq) {
            return Err(VerbsError::Inval);
        }
        let c = init.caps;
        if c.max_send_wr > l.max_qp_wr
            || c.max_recv_wr > l.max_qp_wr
            || c.max_send_sge > l.max_sge
            || c.max_recv_sge > l.max_sge
            || c.max_inline_data > l.max_inline
        {
            return Err(VerbsError::Inval);
        }
        if init.qp_type == QpType::XrcTgt {
            // Target QPs are made with create_xrc_tgt_qp: they belong to a domain, not a PD.
            return Err(VerbsError::Inval);
        }
        if let Some(n) = init.srq {
            match self.srqs.get(&n) {
                Some(s) if s.xrc.is_none() => {}
                _ => return Err(VerbsError::Inval),
            }
        }
        let qpn = self.alloc_qpn()?;
        let owner = self.pds[&init.pd].owner;
        self.qps.insert(qpn, Qp::new(qpn, init, owner));
        Ok(qpn)
    }

    /// Destroys a QP and removes its completions from its CQs.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let qp = self.qps.remove(&qpn).ok_or(VerbsError::Inval)?;
        for cq in [qp.send_cq, qp.recv_cq].into_iter().flatten() {
            if let Some(c) = self.cqs.get_mut(&cq) {
                c.entries.retain(|w| w.qp_num != qpn);
            }
        }
        self.ready.retain(|q| *q != qpn);
        self.in_ready.remove(&qpn);
        if let Some(t) = self.armed.remove(&qpn) {
            self.timers.remove(&(t, qpn));
        }
        for m in self.mcast.values_mut() {
            m.retain(|q| *q != qpn);
        }
        Ok(())
    }

    /// Attaches a UD QP to a multicast group (`ibv_attach_mcast`; the group's GID as an IP
    /// address). EINVAL for other QP types or a non-multicast address.
    pub fn attach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::Inval)?;
        if qp.qp_type != QpType::Ud || !group.is_multicast() {
            return Err(VerbsError::Inval);
        }
        let m = self.mcast.entry(group).or_default();
        if !m.contains(&qpn) {
            m.push(qpn);
        }
        Ok(())
    }

    /// Sets IBV_QP_CREATE_BLOCK_SELF_MCAST_LB on a UD QP (EINVAL for other types).
    pub fn set_block_self_mcast_lb(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbsError::Inval);
        }
        qp.block_self_mcast_lb = true;
        Ok(())
    }

    /// Detaches a QP from a group (`ibv_detach_mcast`); EINVAL if it was not attached.
    pub fn detach_mcast(&mut self, qpn: Qpn, group: IpAddr) -> Result<(), VerbsError> {
        let m = self.mcast.get_mut(&group).ok_or(VerbsError::Inval)?;
        let i = m.iter().position(|q| *q == qpn).ok_or(VerbsError::Inval)?;
        m.remove(i);
        Ok(())
    }

    /// Send work requests posted and not yet retired (completed) on a QP.
    pub fn send_queue_len(&self, qpn: Qpn) -> Option<usize> {
        self.qps.get(&qpn).map(|q| q.sq.len())
    }

    /// Whether QP `qpn` waits for an answer to packets it sent (its transport timer or an RNR
    /// wait is armed): the answer, or the timer, will run the QP again.
    pub fn awaiting_response(&self, qpn: Qpn) -> bool {
        self.qps.get(&qpn).is_some_and(|q| q.comp.retrans_at.is_some() || q.comp.rnr_until.is_some())
    }

    /// The QP's current attributes and state.
    pub fn query_qp(&self, qpn: Qpn) -> Result<(QpState, QpAttr), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::Inval)?;
        Ok((qp.state, qp.attr))
    }

    /// Modifies a QP (`ibv_modify_qp`): the attribute mask must suit the transition and QP type
    /// (EINVAL otherwise, state unchanged).
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        let now = Instant::ZERO;
        let limits = self.config.limits;
        let port_mtu = self.config.mtu;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let mut ctx = ctx!(self, now);
        qp.modify(&mut ctx, attr, mask, &limits, port_mtu)?;
        self.touched(qpn);
        Ok(())
    }

    /// Posts a send work request (`ibv_post_send`). ENOMEM when the send queue is full, EINVAL for
    /// a bad request; in ERR the request completes flushed.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        self.post_send_inline(qpn, wr, None)
    }

    /// Posts a send work request whose data the caller already copied (`data`, as many bytes as
    /// the SGEs say): IBV_SEND_INLINE data, which the application may reuse as soon as the post
    /// returns, or the payload of a SEND/WRITE that a client gathered at post time after its own
    /// lkey checks (docs/architecture.md D3), so the device need not reach into the client to send
    /// it.
    pub fn post_send_inline(&mut self, qpn: Qpn, wr: SendWr, data: Option<Vec<u8>>) -> Result<(), VerbsError> {
        let limits = self.config.limits;
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let mut ctx = ctx!(self, Instant::ZERO);
        qp.post_send(&mut ctx, wr, data, &limits)?;
        self.touched(qpn);
        Ok(())
    }

    /// Posts a receive work request (`ibv_post_recv`).
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::Inval)?;
        let mut ctx = ctx!(self, Instant::ZERO);
        qp.post_recv(&mut ctx, wr)
    }

    /// The next async event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        let e = self.events.pop_front()?;
        if let AsyncEvent::CommEst(q) = e {
            // The CM hears of it as ib_cm does through rdma_notify: a passive connection whose
            // RTU was lost is established by the first packet on its QP.
            self.cm.notify_qp(q.value());
        }
        Some(e)
    }

    /// The next async event of an XRC target QP for one of its handles (every handle gets each).
    pub fn poll_handle_event(&mut self) -> Option<HandleEvent> {
        self.handle_events.pop_front()
    }
}

/// Packets a message of `len` bytes takes at path MTU `mtu` (a zero-length message takes one).
/// Lengths go up to 2^31 (IBTA's largest message), so this is done in u64.
pub fn packets_for(len: u32, mtu: u32) -> u32 {
    (u64::from(len).div_ceil(u64::from(mtu.max(1)))).max(1) as u32
}

/// The payload of packet `index` (from 0) of a `len`-byte message at path MTU `mtu`.
pub fn packet_payload(len: u32, mtu: u32, index: u32) -> u32 {
    let start = u64::from(index) * u64::from(mtu);
    (u64::from(len).saturating_sub(start)).min(u64::from(mtu)) as u32
}

/// The local ACK timeout for the 5-bit attribute: 4.096 us x 2^timeout; 0 means no timer
/// (IBTA 11.2.4.2, the Local ACK Timeout attribute).
pub fn ack_timeout(code: u8) -> Option<Duration> {
    if code == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << code.min(31)))
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn two_gib_minus_one_message_arithmetic() {
        let len = (1u32 << 31) - 1;
        assert_eq!(packets_for(len, 4096), 524_288);
        assert_eq!(packet_payload(len, 4096, 0), 4096);
        assert_eq!(packet_payload(len, 4096, 524_287), 4095);
        assert_eq!(packets_for(len, 256), 8_388_608);
        assert_eq!(packet_payload(len, 256, 8_388_607), 255);
        assert_eq!(packets_for(1 << 31, 256), 8_388_608);
        assert_eq!(packet_payload(1 << 31, 256, 8_388_607), 256);
        assert_eq!(packets_for(0, 1024), 1);
        assert_eq!(packet_payload(0, 1024, 0), 0);
        // The PSN of the last packet of such a message wraps correctly.
        let first = crate::wire::Psn::new(0xff_fff0);
        assert_eq!((first + (packets_for(len, 4096) - 1)).value(), (0xff_fff0 + 524_287) & 0xff_ffff);
    }

    #[test]
    fn ack_timeout_table() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
    }
}
