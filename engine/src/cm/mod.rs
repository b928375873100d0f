//! The connection manager (IBTA Vol 1 chapter 12) as the Linux kernel's ib_cm + rdma_cm run it
//! over RoCEv2 (docs/architecture.md D10): communication IDs, listeners by service ID, the active
//! and passive connection state machines (REQ -> REP -> RTU; REJ; MRA for duplicates; DREQ/DREP;
//! timewait), response timeouts and retries, and the QP attributes each side's QP needs
//! (`init_qp_attr`).
//!
//! Sans-IO like the rest of the engine: MADs come in through [`Cm::handle_mad`] (the device hands
//! it what QP1 received), go out through [`Cm::poll_mad`] (the device sends them from QP1 as UD
//! SEND_ONLY, Q_Key 0x80010000), time is an argument, and what the consumer must hear comes out
//! of [`Cm::poll_event`]. Addresses and routes are resolved by the caller (they need the host's
//! routing table); the CM is given the resolved source and destination.
//!
//! Values follow Linux 6.1 unless the configuration says otherwise (`reference/cm/README.md`):
//! CM response timeout 20, 15 CM retries, packet lifetime 18 (local ACK timeout 19), target ACK
//! delay 15 (rxe's), timewait 2^(lifetime + 1 - 8) ms.

mod conn;
mod qp_attr;
mod sidr;
mod types;
pub use conn::REQ_USER_DATA_LEN;
pub use sidr::{sidr_status, SIDR_REQ_USER_DATA_LEN};
pub use types::*;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::device::QpAttr;
use crate::rng::Rng;
use crate::time::{Duration, Instant};
use crate::verbs::{Access, AttrMask, Mtu, QpState, QpType};
use crate::wire::{CmPathRepr, MAD_LEN};

/// What a REQ or REP told us about the path and the peer (kept for `init_qp_attr`; the depths
/// and flags are what the peer offered, kept for inspection in tests and debugging).
#[derive(Debug, Clone, Default)]
#[allow(dead_code)]
struct Peer {
    qpn: u32,
    psn: u32,
    ca_guid: u64,
    /// Responder resources the peer offers / initiator depth it will use.
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
}

/// A communication ID.
#[derive(Debug)]
struct Id {
    ps: u16,
    qp_type: QpType,
    state: IdState,
    /// Destroyed by its consumer: it lives on only to finish the protocol (DREQ retries,
    /// timewait), and its events are dropped.
    orphan: bool,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    tos: u8,
    /// RDMA_OPTION_ID_ACK_TIMEOUT.
    ack_timeout: Option<u8>,
    /// The route (rdma_resolve_route, RDMA_OPTION_IB_PATH).
    route: Option<Route>,
    /// Listener: its backlog and how many of its connections wait in REQ_RCVD.
    backlog: u32,
    pending: u32,
    /// A connection made from a listener's REQ.
    parent: Option<IdHandle>,
    local_comm_id: u32,
    remote_comm_id: u32,
    tid: u64,
    local_qpn: u32,
    local_psn: u32,
    /// The parameters this side gave (connect/accept).
    mine: ConnParam,
    peer: Peer,
    path: CmPathRepr,
    path_mtu: Mtu,
    /// The peer's CM response timeout (REQ: remote/local CM response timeout fields).
    peer_response_timeout: u8,
    /// Made by a REQ (the passive side): its resend interval is 2^(the REQ's local CM response
    /// timeout - 8) ms, the active side's that of its REQ (ib_cm's timeout_ms).
    passive: bool,
    /// The last MAD this ID sent that may need resending, and where.
    last: Option<OutMad>,
    retries_left: u8,
    deadline: Option<Instant>,
}

impl Id {
    /// Where this ID's MADs go: the peer's GID of the connection's path (ib_cm sends the REP,
    /// DREQ and DREP through the address vector cm_init_av_by_path makes from the path, which
    /// on the passive side is the REQ's primary path, swapped), else the peer's IP address.
    fn mad_dst(&self) -> Option<IpAddr> {
        let gid = self.path.remote_gid;
        if gid != [0; 16] {
            let ip = gid_to_ip(&gid);
            if !ip.is_unspecified() && !ip.is_multicast() {
                return Some(ip);
            }
        }
        self.remote.map(|r| r.ip())
    }

    fn new(ps: u16, qp_type: QpType, mtu: Mtu) -> Id {
        Id {
            ps,
            qp_type,
            state: IdState::Idle,
            orphan: false,
            local: None,
            remote: None,
            tos: 0,
            ack_timeout: None,
            route: None,
            backlog: 0,
            pending: 0,
            parent: None,
            local_comm_id: 0,
            remote_comm_id: 0,
            tid: 0,
            local_qpn: 0,
            local_psn: 0,
            mine: ConnParam::default(),
            peer: Peer::default(),
            path: CmPathRepr::default(),
            path_mtu: mtu,
            peer_response_timeout: 20,
            passive: false,
            last: None,
            retries_left: 0,
            deadline: None,
        }
    }
}

/// CM counters (`softrdma stat`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CmCounters {
    /// MADs sent (resends included).
    pub mads_sent: u64,
    /// MADs received and handled.
    pub mads_rcvd: u64,
    /// MADs resent after a response timeout.
    pub mads_resent: u64,
    /// MADs that did not parse (truncated, wrong class/version/method, unknown attribute).
    pub mads_malformed: u64,
    /// MADs for no known connection, or that the connection's state does not take.
    pub mads_unmatched: u64,
    /// REQs dropped because a listener's backlog, or the device's pending limit, was full.
    pub reqs_dropped: u64,
    /// REJs sent, any reason.
    pub rejs_sent: u64,
    /// Duplicates answered with MRA.
    pub mras_sent: u64,
    /// Connections established.
    pub established: u64,
}

/// One device's connection manager.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    rng: Rng,
    ids: HashMap<IdHandle, Id>,
    next_id: IdHandle,
    /// Listeners by service ID: (address or wildcard, ID).
    listeners: HashMap<u64, Vec<(Option<IpAddr>, IdHandle)>>,
    /// IDs by local comm ID.
    by_comm: HashMap<u32, IdHandle>,
    /// Connections by the peer's (address, comm ID): duplicate REQs.
    by_remote: HashMap<(IpAddr, u32), IdHandle>,
    /// Live and timewait connections by the peer's (CA GUID, QPN): stale-connection REJ 10.
    by_peer_qp: HashMap<(u64, u32), IdHandle>,
    timers: BTreeSet<(Instant, IdHandle)>,
    out: VecDeque<OutMad>,
    events: VecDeque<CmEvent>,
    pending: usize,
    counters: CmCounters,
    /// REQs waiting for a listener ([`CmConfig::late_listener_grace`]): until when, from whom.
    parked: Vec<ParkedReq>,
}

/// A REQ that found no listener, waiting for one.
#[derive(Debug)]
pub(super) struct ParkedReq {
    pub(super) until: Instant,
    pub(super) src: IpAddr,
    pub(super) tid: u64,
    pub(super) attr_mod: u32,
    pub(super) req: crate::wire::CmReqRepr,
}

impl Cm {
    /// A CM with no IDs.
    pub fn new(cfg: CmConfig) -> Cm {
        let rng = Rng::new(cfg.seed ^ 0x636d_5f63_6f6d_6d69);
        Cm {
            cfg,
            rng,
            ids: HashMap::new(),
            next_id: 1,
            listeners: HashMap::new(),
            by_comm: HashMap::new(),
            by_remote: HashMap::new(),
            by_peer_qp: HashMap::new(),
            timers: BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            pending: 0,
            counters: CmCounters::default(),
            parked: Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// The configuration, to change (the device sets its CA GUID and timer values).
    pub fn config_mut(&mut self) -> &mut CmConfig {
        &mut self.cfg
    }

    /// Changes the timer scale (tests; `softrdma daemon --cm-timer-scale`).
    pub fn set_timer_scale(&mut self, permille: u32) {
        self.cfg.timer_scale_permille = permille.max(1);
    }

    /// The counters.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// Every ID, ordered by handle.
    pub fn ids(&self) -> Vec<IdInfo> {
        let mut v: Vec<IdInfo> = self
            .ids
            .iter()
            .map(|(&h, i)| IdInfo {
                id: h,
                ps: i.ps,
                qp_type: i.qp_type,
                state: i.state,
                orphan: i.orphan,
                local: i.local,
                remote: i.remote,
                qpn: i.local_qpn,
                backlog: i.backlog,
                pending: i.pending,
            })
            .collect();
        v.sort_by_key(|i| i.id);
        v
    }

    /// Connection requests waiting in REQ_RCVD (not yet accepted or rejected).
    pub fn pending_count(&self) -> usize {
        self.pending
    }

    /// How many IDs exist (orphans finishing their protocol included).
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    /// A new ID in a port space for a QP type.
    pub fn create_id(&mut self, ps: u16, qp_type: QpType) -> IdHandle {
        let h = self.alloc_handle();
        let mut id = Id::new(ps, qp_type, self.cfg.mtu);
        // rdma_cm picks an ID's starting PSN when the ID is made (`__rdma_create_id`): the
        // passive QP reaches RTR with it (its receive PSN) before the REP that carries it leaves.
        id.local_psn = self.rng.next_u32() & 0xff_ffff;
        self.ids.insert(h, id);
        h
    }

    fn alloc_handle(&mut self) -> IdHandle {
        loop {
            let h = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.ids.contains_key(&h) {
                return h;
            }
        }
    }

    fn alloc_comm_id(&mut self) -> u32 {
        loop {
            let c = self.rng.next_u32();
            if c != 0 && !self.by_comm.contains_key(&c) {
                return c;
            }
        }
    }

    fn id(&mut self, h: IdHandle) -> Result<&mut Id, CmError> {
        match self.ids.get_mut(&h) {
            Some(id) if !id.orphan => Ok(id),
            _ => Err(CmError::NoEnt),
        }
    }

    /// The ID's state.
    pub fn state(&self, h: IdHandle) -> Option<IdState> {
        self.ids.get(&h).filter(|i| !i.orphan).map(|i| i.state)
    }

    /// The ID's addresses (local, remote) as the CM knows them.
    pub fn addrs(&self, h: IdHandle) -> Option<(Option<SocketAddr>, Option<SocketAddr>)> {
        self.ids.get(&h).filter(|i| !i.orphan).map(|i| (i.local, i.remote))
    }

    /// Sets the addresses a resolved (or bound) ID uses, and its type of service.
    pub fn set_addrs(
        &mut self,
        h: IdHandle,
        local: Option<SocketAddr>,
        remote: Option<SocketAddr>,
        tos: u8,
    ) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.state != IdState::Idle {
            return Err(CmError::Inval);
        }
        id.local = local;
        id.remote = remote;
        id.tos = tos;
        Ok(())
    }

    /// The path a passive ID took from its REQ, as `id->route.path_rec` shows it (the kernel's
    /// cma_ib_new_conn_id copies cm_format_paths_from_req's primary path): the GIDs seen from this
    /// end, the REQ's hop limit, traffic class, SL, flow label, rate and MTU, and the packet
    /// lifetime one below its local ACK timeout. None for an ID that did not come from a REQ.
    pub fn passive_route(&self, h: IdHandle) -> Option<Route> {
        let id = self.ids.get(&h).filter(|i| !i.orphan && i.passive)?;
        let p = &id.path;
        Some(Route {
            sgid: p.local_gid,
            dgid: p.remote_gid,
            hop_limit: p.hop_limit,
            traffic_class: p.traffic_class,
            sl: p.sl,
            flow_label: p.flow_label,
            mtu: id.path_mtu as u8,
            rate: p.packet_rate,
            packet_life_time: p.local_ack_timeout.saturating_sub(1),
        })
    }

    /// What a route lookup for the ID needs: its local and remote addresses and its ToS (the
    /// addresses resolved, not yet connecting).
    pub fn route_key(&self, h: IdHandle) -> Result<(SocketAddr, SocketAddr, u8), CmError> {
        let id = self.ids.get(&h).filter(|i| !i.orphan).ok_or(CmError::NoEnt)?;
        match (id.state, id.local, id.remote) {
            (IdState::Idle, Some(l), Some(r)) => Ok((l, r, id.tos)),
            _ => Err(CmError::Inval),
        }
    }

    /// Gives an ID whose addresses are resolved its route (rdma_resolve_route, or the path an
    /// application set with RDMA_OPTION_IB_PATH: rdma_set_ib_path requires ADDR_RESOLVED, else
    /// EINVAL). An MTU outside 256-4096 is EINVAL.
    pub fn set_route(&mut self, h: IdHandle, route: Route) -> Result<(), CmError> {
        if Mtu::from_ibv(u32::from(route.mtu)).is_none() {
            return Err(CmError::Inval);
        }
        let id = self.id(h)?;
        if id.state != IdState::Idle || id.remote.is_none() || id.local.is_none() {
            return Err(CmError::Inval);
        }
        id.route = Some(route);
        Ok(())
    }

    /// RDMA_OPTION_ID_ACK_TIMEOUT: the local ACK timeout the QP gets (and the REQ's path carries).
    pub fn set_ack_timeout(&mut self, h: IdHandle, timeout: u8) -> Result<(), CmError> {
        if timeout > 31 {
            return Err(CmError::Inval);
        }
        self.id(h)?.ack_timeout = Some(timeout);
        Ok(())
    }

    /// Starts listening on the bound address (`None`: every address of the device) and port.
    /// A second listener on the same service ID and an overlapping address is EADDRINUSE.
    pub fn listen(&mut self, h: IdHandle, backlog: u32) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.state == IdState::Listen {
            // rdma_listen again changes the backlog (kernel cma: "already listening").
            id.backlog = backlog_of(backlog);
            return Ok(());
        }
        if id.state != IdState::Idle {
            return Err(CmError::Inval);
        }
        let Some(local) = id.local else { return Err(CmError::Inval) };
        let sid = service_id(id.ps, local.port());
        let addr = (!local.ip().is_unspecified()).then_some(local.ip());
        let list = self.listeners.entry(sid).or_default();
        if list.iter().any(|(a, _)| a.is_none() || addr.is_none() || *a == addr) {
            return Err(CmError::AddrInUse);
        }
        list.push((addr, h));
        let id = self.ids.get_mut(&h).expect("checked");
        id.state = IdState::Listen;
        id.backlog = backlog_of(backlog);
        // REQs that came for this service ID before the listen are taken now (at the next
        // timer run: `poll_timeout` says it is due).
        for p in self.parked.iter_mut().filter(|p| p.req.service_id == sid) {
            p.until = Instant(0);
        }
        Ok(())
    }

    /// The earliest CM timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let parked = self.parked.iter().map(|p| p.until).min();
        [self.timers.first().map(|(t, _)| *t), parked].into_iter().flatten().min()
    }

    /// The next MAD to send.
    pub fn poll_mad(&mut self) -> Option<OutMad> {
        self.out.pop_front()
    }

    /// The next event for a consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    fn event(&mut self, h: IdHandle, kind: CmEventKind, status: i32, listen_id: Option<IdHandle>, param: ConnParam) {
        if self.ids.get(&h).is_some_and(|i| i.orphan) {
            return;
        }
        self.events.push_back(CmEvent { id: h, kind, status, listen_id, param });
    }

    fn set_timer(&mut self, h: IdHandle, at: Option<Instant>) {
        let Some(id) = self.ids.get_mut(&h) else { return };
        if let Some(old) = id.deadline.take() {
            self.timers.remove(&(old, h));
        }
        id.deadline = at;
        if let Some(t) = at {
            self.timers.insert((t, h));
        }
    }

    /// Forgets an ID entirely (its lookups and timer).
    fn remove(&mut self, h: IdHandle) {
        self.set_timer(h, None);
        if self.ids.get(&h).is_some_and(|i| i.state == IdState::ReqRcvd) {
            self.leave_pending(h);
        }
        let Some(id) = self.ids.remove(&h) else { return };
        if id.local_comm_id != 0 && self.by_comm.get(&id.local_comm_id) == Some(&h) {
            self.by_comm.remove(&id.local_comm_id);
        }
        if let Some(r) = id.remote {
            if self.by_remote.get(&(r.ip(), id.remote_comm_id)) == Some(&h) {
                self.by_remote.remove(&(r.ip(), id.remote_comm_id));
            }
        }
        if self.by_peer_qp.get(&(id.peer.ca_guid, id.peer.qpn)) == Some(&h) {
            self.by_peer_qp.remove(&(id.peer.ca_guid, id.peer.qpn));
        }
        if id.state == IdState::Listen {
            if let Some(local) = id.local {
                let sid = service_id(id.ps, local.port());
                if let Some(l) = self.listeners.get_mut(&sid) {
                    l.retain(|(_, x)| *x != h);
                    if l.is_empty() {
                        self.listeners.remove(&sid);
                    }
                }
            }
        }
    }

    /// A connection leaves REQ_RCVD: its listener's backlog and the device's pending count drop
    /// (once: the connection forgets its listener).
    fn leave_pending(&mut self, h: IdHandle) {
        let parent = self.ids.get_mut(&h).and_then(|i| i.parent.take());
        self.pending = self.pending.saturating_sub(1);
        if let Some(p) = parent.and_then(|p| self.ids.get_mut(&p)) {
            p.pending = p.pending.saturating_sub(1);
        }
    }
}

/// The kernel's backlog: a non-positive value means the default (`cma_listen`: 1024 when 0).
fn backlog_of(b: u32) -> u32 {
    if b == 0 || b > 1 << 20 {
        1024
    } else {
        b
    }
}

/// A MAD buffer.
fn mad_buf() -> Vec<u8> {
    vec![0u8; MAD_LEN]
}
