//! The device's side of rdma_cm (docs/architecture.md D10): the engine's connection manager behind
//! QP1 owns the protocol; this module keeps who owns each communication ID, the clients' event
//! channels (the write end of a pipe each: the device writes one [`CmRecord`] frame per event, so
//! the channel's fd is a real fd that polls readable while events wait, as the kernel's ucma fd
//! does), and destroys a departed client's IDs as the kernel's ucma close does (an established
//! connection gets its DREQ, a listener disappears).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};

use softrdma_engine::cm::{CmError, CmEvent, CmEventKind, IdHandle};
use softrdma_engine::device::Device;
use softrdma_engine::time::Instant;

use crate::memory::ProcessMemory;
use crate::paths::PathCache;
use crate::proto::{CmDeskStats, CmRecord, Request, Response, CM_RECORD_LEN};

/// Most frames a channel holds back while its pipe is full (the client does not read): beyond
/// this, events are dropped and counted.
const MAX_BACKLOG: usize = 65_536;

struct Channel {
    owner: u32,
    pipe: OwnedFd,
    /// Frames the pipe had no room for, in order.
    backlog: VecDeque<[u8; CM_RECORD_LEN]>,
}

struct IdEntry {
    owner: u32,
    channel: u32,
    user: u64,
}

/// The device's CM bookkeeping.
#[derive(Default)]
pub(crate) struct CmDesk {
    channels: HashMap<u32, Channel>,
    next_channel: u32,
    ids: HashMap<IdHandle, IdEntry>,
    /// Events lost because a channel's backlog was full.
    pub(crate) events_dropped: u64,
    /// Calls refused (bad ID, wrong owner, wrong state).
    pub(crate) calls_refused: u64,
    /// Route lookups and their cache.
    pub(crate) paths: PathCache,
}

fn err(e: CmError) -> Response {
    Response::CmErr(e.errno())
}

impl CmDesk {
    /// A desk whose route steps use `paths`.
    pub(crate) fn with_paths(paths: PathCache) -> CmDesk {
        CmDesk { paths, ..CmDesk::default() }
    }

    /// Whether the request is one of the CM's.
    pub(crate) fn handles(req: &Request) -> bool {
        matches!(
            req,
            Request::CmCreateChannel
                | Request::CmDestroyChannel(_)
                | Request::CmCreateId { .. }
                | Request::CmDestroyId(_)
                | Request::CmMigrate { .. }
                | Request::CmSetAddrs { .. }
                | Request::CmListen { .. }
                | Request::CmConnect { .. }
                | Request::CmAccept { .. }
                | Request::CmReject { .. }
                | Request::CmEstablish(_)
                | Request::CmDisconnect(_)
                | Request::CmNotify(_)
                | Request::CmSetAckTimeout { .. }
                | Request::CmInitQpAttr { .. }
                | Request::CmResolveRoute(_)
                | Request::CmSetRoute { .. }
                | Request::CmStats
                | Request::CmList
        )
    }

    fn owned(&mut self, owner: u32, id: u32) -> Result<(), CmError> {
        match self.ids.get(&id) {
            Some(e) if e.owner == owner => Ok(()),
            _ => Err(CmError::NoEnt),
        }
    }

    /// One CM call of client `owner`.
    pub(crate) fn call(
        &mut self,
        dev: &mut Device<ProcessMemory>,
        now: Instant,
        owner: u32,
        req: Request,
        mut fds: Vec<OwnedFd>,
    ) -> Response {
        let r = match req {
            Request::CmCreateChannel => {
                if fds.is_empty() {
                    return err(CmError::Inval);
                }
                let pipe = fds.remove(0);
                // The device never blocks on a client's pipe.
                // SAFETY: fcntl on a descriptor we own.
                unsafe {
                    let fl = libc::fcntl(pipe.as_raw_fd(), libc::F_GETFL);
                    libc::fcntl(pipe.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
                }
                self.next_channel += 1;
                let ch = self.next_channel;
                self.channels.insert(ch, Channel { owner, pipe, backlog: VecDeque::new() });
                return Response::CmChannel(ch);
            }
            Request::CmDestroyChannel(ch) => {
                match self.channels.get(&ch) {
                    Some(c) if c.owner == owner => {}
                    _ => return err(CmError::NoEnt),
                }
                if self.ids.values().any(|e| e.channel == ch) {
                    // librdmacm: a channel with IDs on it cannot go (EBUSY).
                    return Response::CmErr(libc::EBUSY);
                }
                self.channels.remove(&ch);
                Ok(())
            }
            Request::CmCreateId { channel, ps, qp_type, user } => {
                if self.channels.get(&channel).is_none_or(|c| c.owner != owner) {
                    return err(CmError::Inval);
                }
                let h = dev.cm().create_id(ps, qp_type);
                self.ids.insert(h, IdEntry { owner, channel, user });
                return Response::CmId(h);
            }
            Request::CmDestroyId(id) => self.owned(owner, id).and_then(|()| {
                self.ids.remove(&id);
                dev.cm().destroy(now, id)
            }),
            Request::CmMigrate { id, channel, user } => self.owned(owner, id).and_then(|()| {
                if self.channels.get(&channel).is_none_or(|c| c.owner != owner) {
                    return Err(CmError::Inval);
                }
                let e = self.ids.get_mut(&id).expect("owned");
                e.channel = channel;
                e.user = user;
                Ok(())
            }),
            Request::CmSetAddrs { id, local, remote, tos } => {
                self.owned(owner, id).and_then(|()| dev.cm().set_addrs(id, local, remote, tos))
            }
            Request::CmListen { id, backlog } => self.owned(owner, id).and_then(|()| dev.cm().listen(id, backlog)),
            // cma_connect_ib: an ID without a QP sends the conn_param's qp_num as given (a QP
            // the program made itself, `rping -q`); the kernel does not look it up, nor do we.
            Request::CmConnect { id, param } => self.owned(owner, id).and_then(|()| dev.cm().connect(now, id, param)),
            Request::CmAccept { id, param } => self.owned(owner, id).and_then(|()| dev.cm().accept(now, id, param)),
            Request::CmReject { id, private_data, reason } => {
                self.owned(owner, id).and_then(|()| dev.cm().reject(now, id, &private_data, reason))
            }
            Request::CmEstablish(id) => self.owned(owner, id).and_then(|()| dev.cm().establish(now, id)),
            Request::CmDisconnect(id) => self.owned(owner, id).and_then(|()| dev.cm().disconnect(now, id)),
            Request::CmNotify(id) => self.owned(owner, id).and_then(|()| dev.cm().notify(id)),
            Request::CmSetAckTimeout { id, timeout } => {
                self.owned(owner, id).and_then(|()| dev.cm().set_ack_timeout(id, timeout))
            }
            Request::CmInitQpAttr { id, state } => {
                return match self.owned(owner, id).and_then(|()| dev.cm().init_qp_attr(id, state)) {
                    Ok(a) => Response::CmQpAttr(a),
                    Err(e) => {
                        self.calls_refused += 1;
                        err(e)
                    }
                };
            }
            Request::CmList => {
                let ids = dev.cm().ids();
                let rows = ids
                    .into_iter()
                    .map(|i| {
                        let owner = self.ids.get(&i.id).map(|e| e.owner);
                        let pid = owner.and_then(|o| dev.memory_ref().pid_of(o)).unwrap_or(-1);
                        (i, pid)
                    })
                    .collect();
                return Response::CmIds(rows);
            }
            Request::CmResolveRoute(id) => {
                let r = self.owned(owner, id).and_then(|()| dev.cm().route_key(id));
                let (local, remote, tos) = match r {
                    Ok(k) => k,
                    Err(e) => {
                        self.calls_refused += 1;
                        return err(e);
                    }
                };
                let now = std::time::Instant::now();
                let found = self.paths.open().and_then(|()| self.paths.resolve(local.ip(), remote.ip(), tos, now));
                let (info, cached) = match found {
                    Ok(f) => f,
                    // No route (ENETUNREACH, EHOSTUNREACH...): the route step's error.
                    Err(e) => return Response::CmErr(e.raw_os_error().unwrap_or(libc::EHOSTUNREACH)),
                };
                // cma_resolve_iboe_route: GIDs from the addresses, the route's hop limit, the ToS
                // as traffic class (SL 0: no VLAN priority map), the port's MTU and rate, packet
                // lifetime 18 (CMA_IBOE_PACKET_LIFETIME), the flow label hashed from the ports.
                let cfg = dev.cm().config();
                let route = softrdma_engine::cm::Route {
                    sgid: softrdma_engine::cm::ip_to_gid(local.ip()),
                    dgid: softrdma_engine::cm::ip_to_gid(remote.ip()),
                    hop_limit: info.hop_limit,
                    traffic_class: tos,
                    sl: 0,
                    flow_label: softrdma_engine::cm::flow_label(local.port(), remote.port()),
                    mtu: cfg.mtu as u8,
                    rate: 0,
                    packet_life_time: cfg.packet_lifetime,
                };
                return match dev.cm().set_route(id, route.clone()) {
                    Ok(()) => Response::CmRoute { route, cached, lladdr: info.lladdr },
                    Err(e) => {
                        self.calls_refused += 1;
                        err(e)
                    }
                };
            }
            Request::CmSetRoute { id, route } => self.owned(owner, id).and_then(|()| {
                dev.cm().set_route(id, route)?;
                self.paths.count_explicit();
                Ok(())
            }),
            Request::CmStats => {
                let cm = dev.cm();
                let desk = CmDeskStats {
                    ids: cm.id_count() as u64,
                    pending: cm.pending_count() as u64,
                    channels: self.channels.len() as u64,
                    events_dropped: self.events_dropped,
                    calls_refused: self.calls_refused,
                    paths: self.paths.stats(),
                };
                return Response::CmStats(cm.counters().clone(), desk);
            }
            _ => Err(CmError::Inval),
        };
        match r {
            Ok(()) => Response::Ok,
            Err(e) => {
                self.calls_refused += 1;
                err(e)
            }
        }
    }

    /// Hands the CM's events to their channels.
    pub(crate) fn route(&mut self, dev: &mut Device<ProcessMemory>, now: Instant, device: &str) {
        while let Some(e) = dev.cm().poll_event() {
            self.deliver(dev, now, device, e);
        }
        self.flush();
    }

    fn deliver(&mut self, dev: &mut Device<ProcessMemory>, now: Instant, device: &str, e: CmEvent) {
        let (entry_channel, user, listen_user) = if e.kind == CmEventKind::ConnectRequest {
            // A new connection ID: it belongs to the listener's client and channel until the
            // client migrates it.
            let Some(l) = e.listen_id.and_then(|l| self.ids.get(&l)) else {
                // The listener went away: the request is rejected as the kernel rejects it.
                let _ = dev.cm().destroy(now, e.id);
                return;
            };
            let (owner, channel, lu) = (l.owner, l.channel, l.user);
            self.ids.insert(e.id, IdEntry { owner, channel, user: 0 });
            (channel, 0, lu)
        } else {
            let Some(entry) = self.ids.get(&e.id) else { return };
            (entry.channel, entry.user, 0)
        };
        let (local, remote) = dev.cm_ref().addrs(e.id).unwrap_or((None, None));
        let route = if e.kind == CmEventKind::ConnectRequest { dev.cm_ref().passive_route(e.id) } else { None };
        let rec = CmRecord {
            device: device.to_owned(),
            id: e.id,
            user,
            listen_user,
            event: e.kind.to_rdma(),
            status: e.status,
            param: e.param,
            local,
            remote,
            route,
        };
        let Some(frame) = rec.to_frame() else { return };
        let Some(ch) = self.channels.get_mut(&entry_channel) else { return };
        if ch.backlog.len() >= MAX_BACKLOG {
            self.events_dropped += 1;
            return;
        }
        ch.backlog.push_back(frame);
    }

    /// Writes what the channels' pipes take.
    pub(crate) fn flush(&mut self) {
        for ch in self.channels.values_mut() {
            while let Some(f) = ch.backlog.front() {
                // SAFETY: write of a frame we own to a descriptor we own.
                let n = unsafe { libc::write(ch.pipe.as_raw_fd(), f.as_ptr().cast(), f.len()) };
                if n == f.len() as isize {
                    ch.backlog.pop_front();
                } else {
                    // EAGAIN (full: the client has not read) or EPIPE (gone): keep it for later,
                    // or for nobody, the client's detach removes the channel.
                    break;
                }
            }
        }
    }

    /// Whether a channel still holds frames its pipe had no room for.
    pub(crate) fn has_backlog(&self) -> bool {
        self.channels.values().any(|c| !c.backlog.is_empty())
    }

    /// The owner of an ID, if it has one.
    pub(crate) fn owner_of(&self, id: IdHandle) -> Option<u32> {
        self.ids.get(&id).map(|e| e.owner)
    }

    /// An event the device makes for an ID itself (RDMA_CM_EVENT_MULTICAST_JOIN): to the ID's
    /// channel, with `listen_user` carrying `tag`.
    pub(crate) fn push(&mut self, dev: &Device<ProcessMemory>, device: &str, id: IdHandle, rec: CmRecord, tag: u64) {
        let Some(entry) = self.ids.get(&id) else { return };
        let (local, _) = dev.cm_ref().addrs(id).unwrap_or((None, None));
        let rec = CmRecord { device: device.to_owned(), id, user: entry.user, listen_user: tag, local, ..rec };
        let Some(frame) = rec.to_frame() else { return };
        let Some(ch) = self.channels.get_mut(&entry.channel) else { return };
        if ch.backlog.len() >= MAX_BACKLOG {
            self.events_dropped += 1;
            return;
        }
        ch.backlog.push_back(frame);
        self.flush();
    }

    /// A departed client: its IDs are destroyed as ucma's close destroys them, its channels go.
    pub(crate) fn detach(&mut self, dev: &mut Device<ProcessMemory>, now: Instant, owner: u32) {
        let mine: Vec<IdHandle> = self.ids.iter().filter(|(_, e)| e.owner == owner).map(|(h, _)| *h).collect();
        for h in mine {
            self.ids.remove(&h);
            let _ = dev.cm().destroy(now, h);
        }
        self.channels.retain(|_, c| c.owner != owner);
    }
}
