//! The device's control path: a client's requests (`proto::Request`) on the device's objects,
//! its counters, and a client's departure.

use super::*;

/// The most key blocks a provider gets: 16 x 2^14 regions and windows, the max_mr the device
/// reports (2^18).
const MAX_KEY_BLOCKS_PER_PROVIDER: usize = 16;

/// Before a region changes or goes (dereg, rereg), the queued receives staged over SGEs that use
/// it get their own SGEs back, so that when data arrives the engine checks those as the verbs
/// say it must (LOC_PROT_ERR and a NAK if the region no longer fits), instead of the staging.
fn unstage_lkey(dev: &mut Device<ProcessMemory>, c: &mut Client, lkey: u32) {
    let Client { objects, staging, staged, .. } = c;
    let mut fix = |q: &mut std::collections::VecDeque<RecvWr>| {
        for wr in q.iter_mut() {
            if staged.get(&wr.wr_id).is_some_and(|st| st.sges.iter().any(|s| s.lkey == lkey)) {
                let st = staged.remove(&wr.wr_id).expect("present");
                staging.free(st.off, st.len as usize);
                wr.sg_list = st.sges;
            }
        }
    };
    for q in &objects.qps {
        if let Some(rq) = dev.queued_recvs_mut(*q) {
            fix(rq);
        }
    }
    for s in &objects.srqs {
        if let Some(rq) = dev.queued_srq_recvs_mut(*s) {
            fix(rq);
        }
    }
}

/// RDMA_CM_EVENT_MULTICAST_JOIN.
const MULTICAST_JOIN: u32 = 12;

impl State {
    /// The device's counters as `softrdma stat` shows them: its own engine's and device layer's
    /// plus what its providers reported (the live ones' last reports and the departed ones').
    pub(super) fn totals(&mut self) -> (Counters, IoStats) {
        let (mut c, mut io) = (*self.dev.counters(), self.io_stats());
        io.daemon_udp_rcvd = io.udp_rcvd;
        io.providers = self.clients.values().filter(|c| c.steer.is_some()).count() as u64;
        let (dc, dio) = self.departed;
        c += dc;
        io += dio;
        for (pc, pio) in self.clients.values().filter_map(|c| c.published) {
            c += pc;
            io += pio;
        }
        (c, io)
    }

    /// `rdma_join_multicast_ex` on a RoCEv2 port (cma_iboe_join_multicast): a UD ID bound or
    /// resolved, an IPv4 group; the device takes part in the group (IP membership for a full
    /// member) and the ID hears RDMA_CM_EVENT_MULTICAST_JOIN with the group's QPN 0xFFFFFF and
    /// the port space's Q_Key.
    pub(super) fn mcast_join(&mut self, owner: u32, id: u32, group: IpAddr, send_only: bool, user: u64) -> Response {
        if self.cm.owner_of(id) != Some(owner) {
            return Response::CmErr(libc::ENOENT);
        }
        let ok_state = self.dev.cm_ref().ids().into_iter().any(|i| {
            i.id == id && i.qp_type == QpType::Ud && i.state == softrdma_engine::cm::IdState::Idle && i.local.is_some()
        });
        if !ok_state {
            return Response::CmErr(libc::EINVAL);
        }
        let (iface, port) = (self.addr(), self.udp.port());
        if let Err(e) = self.groups.join(owner, id, group, send_only, iface, port) {
            return Response::CmErr(e);
        }
        let rec = crate::proto::CmRecord {
            device: String::new(),
            id: 0,
            user: 0,
            listen_user: 0,
            event: MULTICAST_JOIN,
            status: 0,
            param: softrdma_engine::cm::ConnParam {
                qp_num: Qpn::MULTICAST.value(),
                qkey: softrdma_engine::cm::RDMA_UDP_QKEY,
                ..Default::default()
            },
            local: None,
            remote: Some(std::net::SocketAddr::new(group, 0)),
            route: None,
        };
        let name = self.name.clone();
        self.cm.push(&self.dev, &name, id, rec, user);
        Response::Ok
    }

    pub(super) fn owner_of(&self, f: impl Fn(&Objects) -> bool) -> Option<u32> {
        self.clients.iter().find(|(_, c)| f(&c.objects)).map(|(o, _)| *o)
    }

    pub(super) fn objs(&mut self, owner: u32) -> &mut Objects {
        &mut self.clients.get_mut(&owner).expect("caller checked the client").objects
    }

    pub(super) fn call(&mut self, owner: u32, req: Request, fds: Vec<OwnedFd>) -> (Response, Vec<OutFd>) {
        match req {
            Request::CmJoin { id, group, send_only, user } => {
                return (self.mcast_join(owner, id, group, send_only, user), Vec::new());
            }
            Request::CmLeave { id, group } => {
                if self.cm.owner_of(id) != Some(owner) {
                    return (Response::CmErr(libc::ENOENT), Vec::new());
                }
                let r = match self.groups.leave(owner, id, group) {
                    Ok(()) => Response::Ok,
                    Err(e) => Response::CmErr(e),
                };
                return (r, Vec::new());
            }
            Request::CmDestroyId(id) => {
                // rdma_destroy_id leaves the ID's groups (cma_leave_mc_groups).
                self.groups.drop_where(|o, i| o == owner && i == id);
            }
            _ => {}
        }
        if crate::cm::CmDesk::handles(&req) {
            let now = self.now();
            return (self.cm.call(&mut self.dev, now, owner, req, fds), Vec::new());
        }
        self.dev.memory().forget_read_ahead();
        match self.call_inner(owner, req, fds) {
            Ok(r) => r,
            Err(e) => (Response::Err(e), Vec::new()),
        }
    }

    pub(super) fn call_inner(
        &mut self,
        owner: u32,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> Result<(Response, Vec<OutFd>), VerbsError> {
        use Response as R;
        let ok = |r: Response| Ok((r, Vec::new()));
        let o = owner;
        // Every object a call names must be the caller's (a client never reaches another's).
        macro_rules! mine {
            ($set:ident, $k:expr) => {
                if !self.objs(o).$set.contains(&$k) {
                    return Err(VerbsError::Inval);
                }
            };
        }
        match req {
            Request::Hello { .. } => Err(VerbsError::Inval),
            Request::AllocPd => {
                let pd = self.dev.alloc_pd(o);
                // The device's own region over the client's staging area, in this PD, so
                // staged receives pass the engine's lkey checks; local write only (no rkey use).
                let keys = self.dev.reg_mr(pd, STAGE_VA, STAGING_LEN as u64, Access::LOCAL_WRITE)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.stage_mrs.insert(pd, keys.lkey);
                c.objects.pds.insert(pd);
                ok(R::Pd(pd))
            }
            Request::DeallocPd(pd) => {
                mine!(pds, pd);
                let lkey = self.clients.get(&o).and_then(|c| c.stage_mrs.get(&pd).copied());
                // Busy (EBUSY) before the staging region goes: receives staged on an SRQ of
                // the PD name it.
                if self.dev.pd_busy(pd, lkey) {
                    return Err(VerbsError::Busy);
                }
                if let Some(l) = lkey {
                    self.dev.dereg_mr(l)?;
                }
                if let Err(e) = self.dev.dealloc_pd(pd) {
                    // Still in use: give it its staging region back.
                    if let Ok(k) = self.dev.reg_mr(pd, STAGE_VA, STAGING_LEN as u64, Access::LOCAL_WRITE) {
                        self.clients.get_mut(&o).expect("checked").stage_mrs.insert(pd, k.lkey);
                    }
                    return Err(e);
                }
                let c = self.clients.get_mut(&o).expect("checked");
                c.stage_mrs.remove(&pd);
                c.objects.pds.remove(&pd);
                ok(R::Ok)
            }
            Request::RegMr { pd, addr, len, access } => {
                mine!(pds, pd);
                if len == 0 {
                    return Err(VerbsError::Inval);
                }
                let pid = self.pid_of(o);
                // The kernel pins the pages (writable when the MR may be written): EFAULT if
                // the process does not have them.
                let write = access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
                if !range_mapped(pid, addr, len, write) {
                    return Err(VerbsError::Fault);
                }
                let keys = self.dev.reg_mr(pd, addr, len, access)?;
                self.objs(o).mrs.insert(keys.lkey);
                ok(R::Mr(keys))
            }
            Request::DeregMr(lkey) => {
                mine!(mrs, lkey);
                if let Some(c) = self.clients.get_mut(&o) {
                    unstage_lkey(&mut self.dev, c, lkey);
                }
                self.dev.dereg_mr(lkey)?;
                self.objs(o).mrs.remove(&lkey);
                ok(R::Ok)
            }
            Request::ReregMr { lkey, pd, range, access } => {
                mine!(mrs, lkey);
                if let Some(p) = pd {
                    mine!(pds, p);
                }
                if let Some((addr, len)) = range {
                    let acc = access.unwrap_or(Access::LOCAL_WRITE);
                    let write = acc.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
                    if len == 0 {
                        return Err(VerbsError::Inval);
                    }
                    if !range_mapped(self.pid_of(o), addr, len, write) {
                        return Err(VerbsError::Fault);
                    }
                }
                if let Some(c) = self.clients.get_mut(&o) {
                    unstage_lkey(&mut self.dev, c, lkey);
                }
                self.dev.rereg_mr(lkey, pd, range, access)?;
                ok(R::Ok)
            }
            Request::AllocMw { pd, mw_type } => {
                mine!(pds, pd);
                let rkey = self.dev.alloc_mw(pd, mw_type)?;
                self.objs(o).mws.insert(rkey >> 8);
                ok(R::Mw(rkey))
            }
            Request::DeallocMw(rkey) => {
                mine!(mws, rkey >> 8);
                self.dev.dealloc_mw(rkey)?;
                self.objs(o).mws.remove(&(rkey >> 8));
                ok(R::Ok)
            }
            Request::CreateCompChannel => {
                let fd = Arc::new(eventfd().map_err(|_| VerbsError::NoMem)?);
                let id = self.next_channel;
                self.next_channel += 1;
                self.channels.insert(id, Channel { fd: fd.clone(), events: VecDeque::new() });
                self.objs(o).channels.insert(id);
                Ok((R::Channel(id), vec![fd]))
            }
            Request::DestroyCompChannel(id) => {
                mine!(channels, id);
                if self.cqs.values().any(|w| w.channel == Some(id)) {
                    return Err(VerbsError::Busy);
                }
                self.channels.remove(&id);
                self.objs(o).channels.remove(&id);
                ok(R::Ok)
            }
            Request::CreateCq { cqe, channel } => {
                if let Some(ch) = channel {
                    mine!(channels, ch);
                }
                let cq = self.dev.create_cq(cqe)?;
                let c = self.clients.get_mut(&o).expect("checked");
                let Some(ring) = c.alloc.ring(cqe, CQE_SLOT) else {
                    let _ = self.dev.destroy_cq(cq);
                    return Err(VerbsError::NoMem);
                };
                c.arena.reset(&ring);
                c.cq_rings.insert(cq, ring);
                if self.direct_cqs {
                    c.direct_cqs.insert(cq, 0);
                }
                c.objects.cqs.insert(cq);
                self.cqs.insert(cq, CqWatch { channel, armed: false, solicited_only: false, seen: 0 });
                ok(R::Cq { cq, ring })
            }
            Request::ResizeCq { cq, cqe, unpolled } => {
                mine!(cqs, cq);
                // Work the client posted before this call is carried out first, so that its
                // completions count against the new size (ibv_resize_cq(3): EINVAL when the CQ
                // holds more than `cqe`), as on hardware, where the WQEs posted microseconds
                // before are long done; otherwise whether the resize fails would depend on when
                // this thread last looked at the rings.
                self.pump();
                let c = self.clients.get_mut(&o).expect("checked");
                let old = *c.cq_rings.get(&cq).ok_or(VerbsError::Inval)?;
                // What sits in the old ring moves to the new one (the client holds the CQ while
                // it waits for this answer, so nobody consumes the old ring meanwhile).
                let mut moved: Vec<CqEntry> = Vec::new();
                c.arena.consume::<CqEntry>(&old, usize::MAX, |e| {
                    moved.extend(e);
                    true
                });
                let undo = |c: &mut Client, moved: &[CqEntry]| {
                    for e in moved {
                        let _ = c.arena.produce(&old, e);
                    }
                };
                if let Err(e) = self.dev.resize_cq(cq, cqe, moved.len() + unpolled as usize) {
                    undo(c, &moved);
                    return Err(e);
                }
                let Some(ring) = c.alloc.ring(cqe, CQE_SLOT) else {
                    undo(c, &moved);
                    return Err(VerbsError::NoMem);
                };
                c.arena.reset(&ring);
                for e in &moved {
                    let _ = c.arena.produce(&ring, e);
                }
                c.alloc.release(&old);
                c.cq_rings.insert(cq, ring);
                ok(R::Cq { cq, ring })
            }
            Request::DestroyCq(cq) => {
                mine!(cqs, cq);
                self.dev.destroy_cq(cq)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.objects.cqs.remove(&cq);
                c.direct_cqs.remove(&cq);
                if let Some(r) = c.cq_rings.remove(&cq) {
                    c.give_back(&r);
                }
                if let Some(w) = self.cqs.remove(&cq) {
                    self.armed_cqs -= usize::from(w.armed);
                    // Events of the CQ still queued on its channel go with it.
                    if let Some(ch) = w.channel.and_then(|c| self.channels.get_mut(&c)) {
                        ch.events.retain(|c| *c != cq);
                    }
                }
                ok(R::Ok)
            }
            Request::ReqNotifyCq { cq, solicited_only } => {
                mine!(cqs, cq);
                let n = self.dev.cq_counts(cq).ok_or(VerbsError::Inval)?;
                let w = self.cqs.get_mut(&cq).ok_or(VerbsError::Inval)?;
                if w.channel.is_none() {
                    return Err(VerbsError::Inval);
                }
                // IBTA 11.4.2.2 / ibv_req_notify_cq(3): the next completion, or with
                // solicited_only the next solicited receive or unsuccessful completion.
                if !w.armed {
                    self.armed_cqs += 1;
                }
                w.armed = true;
                w.solicited_only = solicited_only;
                w.seen = if solicited_only { n.solicited } else { n.added };
                ok(R::Ok)
            }
            Request::GetCqEvent(ch) => {
                mine!(channels, ch);
                let c = self.channels.get_mut(&ch).ok_or(VerbsError::Inval)?;
                ok(R::CqEvent(c.events.pop_front()))
            }
            Request::CreateQp(init) => {
                mine!(pds, init.pd);
                mine!(cqs, init.send_cq);
                if init.qp_type != QpType::XrcIni {
                    mine!(cqs, init.recv_cq);
                }
                if let Some(s) = init.srq {
                    mine!(srqs, s);
                }
                if init.qp_type == QpType::XrcTgt {
                    // Target QPs are made in a domain (CreateXrcTgtQp), not in a PD.
                    return Err(VerbsError::Inval);
                }
                let qpn = self.dev.create_qp(init)?;
                let c = self.clients.get_mut(&o).expect("checked");
                let sq = c.alloc.ring(init.caps.max_send_wr, WQE_SLOT);
                let rq = if init.srq.is_none() && init.qp_type != QpType::XrcIni {
                    c.alloc.ring(init.caps.max_recv_wr, WQE_SLOT).map(Some)
                } else {
                    Some(None)
                };
                let (Some(sq), Some(rq)) = (sq, rq) else {
                    sq.inspect(|r| c.alloc.release(r));
                    rq.flatten().inspect(|r| c.alloc.release(r));
                    let _ = self.dev.destroy_qp(qpn);
                    return Err(VerbsError::NoMem);
                };
                c.arena.reset(&sq);
                c.sq.insert(qpn, sq);
                if let Some(r) = rq {
                    c.arena.reset(&r);
                    c.rq.insert(qpn, r);
                }
                c.objects.qps.insert(qpn);
                c.qp_pd.insert(qpn, init.pd);
                ok(R::Qp { qpn, sq: Some(sq), rq })
            }
            Request::DestroyQp(qpn) => {
                mine!(qps, qpn);
                self.dev.destroy_qp(qpn)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.objects.qps.remove(&qpn);
                c.objects.mcast.retain(|(q, _)| *q != qpn);
                for r in [c.sq.remove(&qpn), c.rq.remove(&qpn)].into_iter().flatten() {
                    c.give_back(&r);
                }
                ok(R::Ok)
            }
            Request::ModifyQp { qpn, attr, mask } => {
                self.check_qp(o, qpn)?;
                self.dev.modify_qp(qpn, &attr, mask)?;
                ok(R::Ok)
            }
            Request::QueryQp(qpn) => {
                self.check_qp(o, qpn)?;
                let (s, a) = self.dev.query_qp(qpn)?;
                ok(R::QpAttr(s, a))
            }
            Request::CreateSrq { pd, attr } => {
                mine!(pds, pd);
                let s = self.dev.create_srq(pd, attr)?;
                self.clients.get_mut(&o).expect("checked").srq_pd.insert(s, pd);
                self.srq_ring(o, s, attr.max_wr)
            }
            Request::CreateXrcSrq { xrcd, pd, cq, attr } => {
                mine!(pds, pd);
                mine!(cqs, cq);
                if !self.objs(o).xrcds.contains(&xrcd) {
                    return Err(VerbsError::Inval);
                }
                let s = self.dev.create_xrc_srq(xrcd, pd, cq, attr)?;
                self.clients.get_mut(&o).expect("checked").srq_pd.insert(s, pd);
                self.srq_ring(o, s, attr.max_wr)
            }
            Request::ModifySrq { srqn, limit } => {
                mine!(srqs, srqn);
                self.dev.modify_srq_limit(srqn, limit)?;
                ok(R::Ok)
            }
            Request::QuerySrq(srqn) => {
                mine!(srqs, srqn);
                let (a, n) = self.dev.query_srq(srqn)?;
                ok(R::SrqAttr(a, n as u32))
            }
            Request::DestroySrq(srqn) => {
                mine!(srqs, srqn);
                self.dev.destroy_srq(srqn)?;
                let c = self.clients.get_mut(&o).expect("checked");
                c.objects.srqs.remove(&srqn);
                if let Some(r) = c.srq_rings.remove(&srqn) {
                    c.give_back(&r);
                }
                ok(R::Ok)
            }
            Request::OpenXrcd { create, exclusive } => {
                let file = fds.into_iter().next().map(File::from);
                let key = match &file {
                    Some(f) => {
                        let md = f.metadata().map_err(|_| VerbsError::Inval)?;
                        Some((md.dev(), md.ino()))
                    }
                    None => None,
                };
                // The identity is the file's (st_dev, st_ino); the device keeps the file open
                // while the domain lives, so the inode number cannot be reused meanwhile.
                let identity = key.map(|(d, i)| d.rotate_left(32) ^ i);
                let x = self.dev.open_xrcd(o, identity, create, exclusive)?;
                if let (Some(k), Some(f)) = (key, file) {
                    self.xrcd_files.entry(k).or_insert(f);
                }
                self.objs(o).xrcds.push(x);
                ok(R::Xrcd(x))
            }
            Request::CloseXrcd(x) => {
                let i = self.objs(o).xrcds.iter().position(|y| *y == x).ok_or(VerbsError::Inval)?;
                self.dev.close_xrcd(o, x)?;
                self.objs(o).xrcds.remove(i);
                self.reap_xrcd_files();
                ok(R::Ok)
            }
            Request::CreateXrcTgtQp(x) => {
                if !self.objs(o).xrcds.contains(&x) {
                    return Err(VerbsError::Inval);
                }
                let (qpn, h) = self.dev.create_xrc_tgt_qp(o, x)?;
                self.objs(o).handles.insert((qpn, h));
                ok(R::QpHandle(qpn, h))
            }
            Request::CreateXrcRcvQp { xrcd, lifetime } => {
                if !self.objs(o).xrcds.contains(&xrcd) {
                    return Err(VerbsError::Inval);
                }
                let (qpn, h) = self.dev.create_xrc_tgt_qp_with(o, xrcd, Some(lifetime))?;
                self.objs(o).handles.insert((qpn, h));
                ok(R::QpHandle(qpn, h))
            }
            Request::ReleaseQpHandle { qpn, handle } => {
                if !self.objs(o).handles.contains(&(qpn, handle)) {
                    return Err(VerbsError::Inval);
                }
                self.dev.release_qp_handle(qpn, handle)?;
                self.objs(o).handles.remove(&(qpn, handle));
                ok(R::Ok)
            }
            Request::OpenQp { xrcd, qpn } => {
                if !self.objs(o).xrcds.contains(&xrcd) {
                    return Err(VerbsError::Inval);
                }
                let h = self.dev.open_qp(o, xrcd, qpn)?;
                self.objs(o).handles.insert((qpn, h));
                ok(R::QpHandle(qpn, h))
            }
            Request::DestroyQpHandle { qpn, handle } => {
                if !self.objs(o).handles.contains(&(qpn, handle)) {
                    return Err(VerbsError::Inval);
                }
                self.dev.destroy_qp_handle(qpn, handle)?;
                self.objs(o).handles.remove(&(qpn, handle));
                ok(R::Ok)
            }
            Request::AttachMcast { qpn, group } => {
                mine!(qps, qpn);
                self.dev.attach_mcast(qpn, group)?;
                self.objs(o).mcast.insert((qpn, group));
                ok(R::Ok)
            }
            Request::DetachMcast { qpn, group } => {
                mine!(qps, qpn);
                self.dev.detach_mcast(qpn, group)?;
                self.objs(o).mcast.remove(&(qpn, group));
                ok(R::Ok)
            }
            Request::GetAsyncEvent => {
                let c = self.clients.get_mut(&o).expect("checked");
                ok(R::Event(c.events.pop_front()))
            }
            Request::Stats => {
                let (c, io) = self.totals();
                ok(R::Stats(c, io))
            }
            Request::Publish(p) => {
                let c = self.clients.get_mut(&o).expect("checked");
                // Only a provider runs QPs of its own to report on.
                if c.steer.is_none() {
                    return Err(VerbsError::Inval);
                }
                c.published = Some((p.counters, p.io));
                c.next_qpn = Some(p.next_qpn);
                ok(R::Ok)
            }
            Request::CaptureRing => {
                let c = self.clients.get(&o).expect("checked");
                // Only a provider of a device that captures produces frames of its own.
                let writer = self.tap.as_ref().and_then(Capture::writer);
                let (Some(w), Some(_), Some(fd)) = (writer, c.steer, fds.into_iter().next()) else {
                    return Err(VerbsError::Inval);
                };
                let ring = crate::capture::Ring::open(fd).map_err(|e| {
                    tracing::warn!("client {o}: capture ring refused: {e}");
                    VerbsError::Inval
                })?;
                w.add(std::sync::Arc::new(ring), Some(o));
                ok(R::Ok)
            }
            Request::RaiseCqEvent(cq) => {
                mine!(cqs, cq);
                let w = self.cqs.get_mut(&cq).ok_or(VerbsError::Inval)?;
                // Fires as route_events fires for the CQ's own completions: once per arming.
                if w.armed {
                    w.armed = false;
                    self.armed_cqs -= 1;
                    if let Some(c) = w.channel.and_then(|ch| self.channels.get_mut(&ch)) {
                        c.events.push_back(cq);
                        let _ = c.fd.write(1);
                    }
                }
                ok(R::Ok)
            }
            Request::McastRelay { group, on } => {
                let index = self.clients.get(&o).and_then(|c| c.steer).ok_or(VerbsError::Inval)?;
                let IpAddr::V4(g) = group else { return Err(VerbsError::Inval) };
                if !g.is_multicast() {
                    return Err(VerbsError::Inval);
                }
                self.relay.attach_group(index, g, on);
                ok(R::Ok)
            }
            Request::AliasRkey { lkey, rkey } => {
                mine!(mrs, lkey);
                self.dev.alias_rkey(lkey, rkey)?;
                ok(R::Ok)
            }
            Request::QueueEvent(e) => {
                // Only into the client's own queue: nobody else sees what it queues.
                let c = self.clients.get_mut(&o).expect("checked");
                c.events.push_back(e);
                let _ = c.event_fd.write(1);
                ok(R::Ok)
            }
            Request::McastGroups => {
                // The rdma_cm joins, and the providers the daemon passes each group on to (a
                // provider's QP may be attached to a group no ID of this device joined).
                let mut info = self.groups.info();
                for (group, n) in self.relay.group_members() {
                    match info.iter_mut().find(|i| i.group == group) {
                        Some(i) => i.providers = n,
                        None => info.push(crate::proto::GroupInfo {
                            group,
                            full: 0,
                            send_only: 0,
                            ip_member: false,
                            providers: n,
                        }),
                    }
                }
                info.sort_by_key(|i| i.group);
                ok(R::McastGroups(info))
            }
            Request::BlockSelfMcastLb(qpn) => {
                mine!(qps, qpn);
                self.dev.set_block_self_mcast_lb(qpn)?;
                ok(R::Ok)
            }
            Request::JoinSteering => {
                let State { udp, dev, clients, relay, .. } = self;
                // An unsteered port (the kernel refused the group): the client stays on the
                // device path.
                let steering = udp.steering_mut().ok_or(VerbsError::NotSupp)?;
                let c = clients.get_mut(&o).expect("checked");
                if c.steer.is_some() {
                    return Err(VerbsError::Inval);
                }
                let m = steering.add_member().map_err(|_| VerbsError::NoMem)?;
                let block = match steering.assign_block(m.index, |b| dev.reserve_qpn_block(b)) {
                    Ok(Some(b)) => b,
                    _ => {
                        let _ = steering.release(m.index);
                        return Err(VerbsError::NoMem);
                    }
                };
                let Some(key_block) = dev.reserve_key_block() else {
                    dev.release_qpn_block(block);
                    let _ = steering.release(m.index);
                    return Err(VerbsError::NoMem);
                };
                // The relay link: what other members receive for this client's QPs comes to it
                // through the daemon, and what it receives for others goes back this way.
                let (link, theirs) = match softrdma_transport::relay::Link::pair() {
                    Ok(p) => p,
                    Err(_) => {
                        dev.release_qpn_block(block);
                        dev.release_key_block(key_block);
                        let _ = steering.release(m.index);
                        return Err(VerbsError::NoMem);
                    }
                };
                relay.add_link(m.index, link);
                relay.set_foreign(steering.assigned_blocks());
                c.steer = Some(m.index);
                c.key_blocks = vec![key_block];
                // Start where the block's last holder stopped; until this one reports (or if it
                // never does: killed at once), its successor starts a stride further on.
                const STRIDE: u32 = 256;
                let mask = (1u32 << softrdma_engine::device::QPN_BLOCK_SHIFT) - 1;
                let off = self.qpn_cursor.get(&block).copied().unwrap_or(0) & mask;
                self.qpn_cursor.insert(block, (off + STRIDE) & mask);
                let first_qpn = (block << softrdma_engine::device::QPN_BLOCK_SHIFT) | off;
                let fd: OutFd = Arc::new(m.fd);
                // The provider applies the device's settings to its QPs as this device does.
                let settings = Box::new(ProviderSettings {
                    faults: self.faults.faults().to_string(),
                    behaviour: dev.config().behaviour,
                    icrc: dev.config().icrc,
                    max_cqe: dev.config().limits.max_cqe,
                    capture: self.tap.is_some(),
                });
                Ok((
                    R::Steering {
                        index: m.index,
                        blocks: vec![block],
                        key_blocks: vec![key_block],
                        settings,
                        first_qpn,
                    },
                    vec![fd, Arc::new(theirs)],
                ))
            }
            Request::KeyBlock => {
                let c = self.clients.get_mut(&o).expect("checked");
                // Only for a provider, and a bounded share: a client that asks for ever gets
                // ENOMEM, as its registrations would, and leaves blocks for the others.
                if c.steer.is_none() {
                    return Err(VerbsError::Inval);
                }
                if c.key_blocks.len() >= MAX_KEY_BLOCKS_PER_PROVIDER {
                    return Err(VerbsError::NoMem);
                }
                let b = self.dev.reserve_key_block().ok_or(VerbsError::NoMem)?;
                c.key_blocks.push(b);
                ok(R::KeyBlock(b))
            }
            // Routed to the CM in `call` before this match.
            _ => Err(VerbsError::Inval),
        }
    }

    pub(super) fn io_stats(&mut self) -> IoStats {
        // The file's writer counts for every ring it drains (this process's and its providers').
        let (capture_frames, capture_dropped) = self.tap.as_ref().and_then(Capture::stats).unwrap_or_default();
        let f = self.faults.counts;
        IoStats {
            udp_sent: self.io.udp_sent,
            udp_rcvd: self.io.udp_rcvd,
            loopback: self.io.loopback,
            send_errors: self.io.send_errors,
            dropped_by_fault: f.dropped,
            duplicated_by_fault: f.duplicated,
            reordered_by_fault: f.reordered,
            corrupted_by_fault: f.corrupted,
            memory_faults: self.dev.memory().faults,
            memory_reads: self.dev.memory().reads,
            memory_writes: self.dev.memory().writes,
            memory_helper_ops: self.dev.memory().helper_ops,
            // The asking client does not count itself.
            clients: self.clients.len().saturating_sub(1) as u64,
            // Set by `totals` for `softrdma stat`.
            providers: 0,
            daemon_udp_rcvd: 0,
            relayed: self.io.relayed,
            relay_lost: self.io.relay_lost,
            capture_frames,
            capture_dropped,
        }
    }

    /// Gives a new SRQ its ring (or destroys it again when the arena is full).
    pub(super) fn srq_ring(&mut self, o: u32, srqn: u32, max_wr: u32) -> Result<(Response, Vec<OutFd>), VerbsError> {
        let c = self.clients.get_mut(&o).expect("checked");
        let Some(ring) = c.alloc.ring(max_wr, WQE_SLOT) else {
            let _ = self.dev.destroy_srq(srqn);
            return Err(VerbsError::NoMem);
        };
        c.arena.reset(&ring);
        c.srq_rings.insert(srqn, ring);
        c.objects.srqs.insert(srqn);
        Ok((Response::Srq { srqn, ring }, Vec::new()))
    }

    /// A QP the caller may modify or query: its own, or a target QP it holds a handle on.
    pub(super) fn check_qp(&mut self, o: u32, qpn: Qpn) -> Result<(), VerbsError> {
        let ob = self.objs(o);
        if ob.qps.contains(&qpn) || ob.handles.iter().any(|(q, _)| *q == qpn) {
            Ok(())
        } else {
            Err(VerbsError::Inval)
        }
    }

    pub(super) fn pid_of(&mut self, o: u32) -> i32 {
        self.dev.memory().pid_of(o).unwrap_or(-1)
    }

    pub(super) fn reap_xrcd_files(&mut self) {
        let dev = &self.dev;
        self.xrcd_files.retain(|(d, i), _| dev.xrcd_identity_live(d.rotate_left(32) ^ i));
    }

    pub(super) fn detach(&mut self, owner: u32) {
        let Some(c) = self.clients.remove(&owner) else { return };
        // Its capture ring is drained to the end and let go.
        if let Some(w) = self.tap.as_ref().and_then(Capture::writer) {
            w.close_owner(owner);
        }
        if let Some((pc, pio)) = c.published {
            self.departed.0 += pc;
            self.departed.1 += pio;
        }
        // Its successor on its blocks starts after its last QPN (plus a margin for QPs it made
        // after its last report).
        if let (Some(n), Some(i), Some(st)) = (c.next_qpn, c.steer, self.udp.steering()) {
            let mask = (1u32 << softrdma_engine::device::QPN_BLOCK_SHIFT) - 1;
            for b in st.blocks_of(i) {
                if b == softrdma_engine::device::qpn_block(n) {
                    self.qpn_cursor.insert(b, (n + 16) & mask);
                }
            }
        }
        // Its blocks of QPNs come back to the device, its member waits for the next client.
        if let (Some(i), Some(st)) = (c.steer, self.udp.steering_mut()) {
            for b in st.blocks_of(i) {
                self.dev.release_qpn_block(b);
            }
            for &b in &c.key_blocks {
                self.dev.release_key_block(b);
            }
            let _ = st.release(i);
            self.relay.remove_link(i);
            self.relay.set_foreign(st.assigned_blocks());
        }
        // rdma_cm IDs first, as ucma's close: established connections get their DREQ.
        let now = self.now();
        self.cm.detach(&mut self.dev, now, owner);
        self.groups.drop_where(|o, _| o == owner);
        let ob = c.objects;
        for (q, g) in &ob.mcast {
            let _ = self.dev.detach_mcast(*q, *g);
        }
        for q in &ob.qps {
            let _ = self.dev.destroy_qp(*q);
        }
        // Target QP handles and domain references go (the QPs stay with their domain unless
        // the policy says otherwise).
        self.dev.release_owner(owner);
        for s in &ob.srqs {
            let _ = self.dev.destroy_srq(*s);
        }
        for cq in &ob.cqs {
            let _ = self.dev.destroy_cq(*cq);
            if let Some(w) = self.cqs.remove(cq) {
                self.armed_cqs -= usize::from(w.armed);
            }
        }
        for mr in &ob.mrs {
            let _ = self.dev.dereg_mr(*mr);
        }
        for mw in &ob.mws {
            // Any key byte: the engine finds a window by its index.
            let _ = self.dev.dealloc_mw(*mw << 8);
        }
        for lkey in c.stage_mrs.values() {
            let _ = self.dev.dereg_mr(*lkey);
        }
        for pd in &ob.pds {
            let _ = self.dev.dealloc_pd(*pd);
        }
        for ch in &ob.channels {
            self.channels.remove(ch);
        }
        self.dev.memory().detach(owner);
        self.reap_xrcd_files();
    }
}
