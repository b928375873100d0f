//! The connection state machines: the consumer's calls (connect, accept, reject, establish,
//! disconnect, destroy, notify), the MADs that arrive, and the response timers (IBTA Vol 1 12.6,
//! 12.9; the kernel's cm.c and cma.c for the values).

use std::net::{IpAddr, SocketAddr};

use super::sidr::sidr_status;
use super::{
    backlog_of, mad_buf, reject, roce_path, service_id, Cm, CmError, CmEventKind, ConnParam, Ece, Id, IdHandle,
    IdState, OutMad, Peer,
};
use super::{ParkedReq, MAX_PARKED_REQS};
use crate::time::{Duration, Instant};
use crate::verbs::{Mtu, QpType};
use crate::wire::{
    CmDrepRepr, CmDreqRepr, CmMadRepr, CmMessage, CmMraRepr, CmRejRepr, CmRepRepr, CmReqRepr, CmRtuRepr, CmaHdrPacket,
    CmaHdrRepr, REJ_PRIVATE_DATA_LEN, REP_PRIVATE_DATA_LEN, REQ_PRIVATE_DATA_LEN,
};

/// REQ private data left for the consumer after the 36-byte IP header (IBTA 12.6.5: 92 bytes).
pub const REQ_USER_DATA_LEN: usize = REQ_PRIVATE_DATA_LEN - CmaHdrRepr::LEN;

/// The MRA service timeout rdma_cm asks for while its consumer decides (`CMA_CM_MRA_SETTING`).
const MRA_SERVICE_TIMEOUT: u8 = 24;

/// REJ "message rejected" values (IBTA 12.6.7).
const REJ_MSG_REQ: u8 = 0;
const REJ_MSG_REP: u8 = 1;
const REJ_MSG_OTHER: u8 = 2;

/// -ETIMEDOUT, the status of UNREACHABLE and of a DREQ nobody answered.
const ETIMEDOUT: i32 = -110;

/// The transport field of a REQ for a QP type (IBTA 12.6.5; XRC: 3 with the extended field 1).
fn transport_of(t: QpType) -> Option<(u8, u8)> {
    match t {
        QpType::Rc => Some((0, 0)),
        QpType::Uc => Some((1, 0)),
        QpType::XrcIni => Some((3, 1)),
        _ => None,
    }
}

impl Cm {
    pub(super) fn tid(&mut self, comm_id: u32) -> u64 {
        // cm_form_tid: the MAD agent's high half, and the comm ID as the kernel holds it (its
        // big-endian bytes read in CPU order).
        (u64::from(self.cfg.seed as u32 & 0xff | 1) << 32) | u64::from(comm_id.swap_bytes())
    }

    pub(super) fn send(&mut self, dst: IpAddr, tid: u64, msg: CmMessage) -> Option<OutMad> {
        self.send_with(dst, tid, 0, msg)
    }

    /// Sends a MAD with an attribute modifier (ECE's options in a REQ or REP).
    fn send_with(&mut self, dst: IpAddr, tid: u64, attr_mod: u32, msg: CmMessage) -> Option<OutMad> {
        let mut buf = mad_buf();
        let repr = CmMadRepr { tid, attr_mod, msg };
        if repr.emit(&mut buf).is_err() {
            return None;
        }
        let m = OutMad { dst, mad: buf };
        self.out.push_back(m.clone());
        self.counters.mads_sent += 1;
        Some(m)
    }

    /// The REQ's response timeout (cm_send_req: 2 x packet lifetime + remote response timeout).
    fn req_timeout(&self) -> Duration {
        let l = self.cfg.timer(self.cfg.packet_lifetime).as_nanos();
        Duration::from_nanos(2 * l + self.cfg.timer(self.cfg.cm_response_timeout).as_nanos())
    }

    /// How long an ID waits before resending its REP or DREQ (ib_cm's per-ID timeout_ms): the
    /// passive side's is set from the REQ's local CM response timeout (cm_req_handler), the
    /// active side's is its REQ's response timeout (ib_send_cm_req); cm_send_dreq_locked resends
    /// a DREQ after it.
    fn resend_interval(&self, h: IdHandle) -> Duration {
        match self.ids.get(&h) {
            Some(id) if id.qp_type == QpType::Ud => self.sidr_timeout(),
            Some(id) if id.passive => self.cfg.timer(id.peer_response_timeout),
            _ => self.req_timeout(),
        }
    }

    /// Sends a REQ for an ID with resolved addresses (`rdma_connect`).
    pub fn connect(&mut self, now: Instant, h: IdHandle, p: ConnParam) -> Result<(), CmError> {
        if self.id(h)?.qp_type == QpType::Ud {
            return self.sidr_connect(now, h, p);
        }
        let ack = self.cfg.packet_lifetime + 1;
        let comm = self.alloc_comm_id();
        let (cfg_timeout, retries, guid) = (self.cfg.cm_response_timeout, self.cfg.max_cm_retries, self.cfg.ca_guid);
        let rate = self.cfg.path_rate;
        let mtu = self.cfg.mtu;
        let id = self.id(h)?;
        if id.state != IdState::Idle {
            return Err(CmError::Inval);
        }
        let (Some(local), Some(remote)) = (id.local, id.remote) else { return Err(CmError::Inval) };
        let Some((transport, ext)) = transport_of(id.qp_type) else { return Err(CmError::NotSupp) };
        let psn = id.local_psn;
        if p.private_data.len() > REQ_USER_DATA_LEN {
            return Err(CmError::Inval);
        }
        // The route's path (rdma_resolve_route / RDMA_OPTION_IB_PATH); an ID connected without
        // one (engine users that skip the route step) gets the RoCE path of its addresses.
        let (path, mtu) = match &id.route {
            Some(r) => {
                let ack = id.ack_timeout.unwrap_or(r.packet_life_time.saturating_add(1));
                let m = Mtu::from_ibv(u32::from(r.mtu)).map_or(mtu, |m| m.min(mtu));
                (r.path(ack), m)
            }
            None => {
                let mut p = roce_path(local, remote, id.tos, id.ack_timeout.unwrap_or(ack));
                p.packet_rate = rate;
                (p, mtu)
            }
        };
        let mut private_data = vec![0u8; CmaHdrRepr::LEN];
        CmaHdrRepr { port: local.port(), src: local.ip(), dst: remote.ip() }
            .emit(&mut CmaHdrPacket::new_unchecked(&mut private_data[..]))
            .map_err(|_| CmError::Inval)?;
        private_data.extend_from_slice(&p.private_data);
        let xrc = id.qp_type == QpType::XrcIni;
        // cma_connect_ib / cm_format_req; an XRC initiator leaves the responder side unset.
        // ECE: the vendor in the Vendor ID, the options in the attribute modifier.
        let ece = p.ece;
        let req = CmReqRepr {
            local_comm_id: comm,
            vendor_id: ece.vendor_id & 0xff_ffff,
            service_id: service_id(id.ps, remote.port()),
            local_ca_guid: guid,
            local_qkey: 0,
            local_qpn: p.qp_num,
            responder_resources: if xrc { 0 } else { p.responder_resources },
            local_eecn: 0,
            remote_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: cfg_timeout,
            transport,
            e2e_flow_control: p.flow_control,
            starting_psn: psn,
            local_cm_response_timeout: cfg_timeout,
            retry_count: if xrc { 0 } else { p.retry_count.min(7) },
            pkey: 0xffff,
            path_mtu: mtu as u8,
            rdc_exists: false,
            rnr_retry_count: if xrc { 0 } else { p.rnr_retry_count.min(7) },
            max_cm_retries: retries,
            srq: !xrc && p.srq,
            extended_transport: ext,
            primary_path: path.clone(),
            alternate_path: Default::default(),
            private_data,
        };
        id.local_comm_id = comm;
        id.local_qpn = p.qp_num;
        id.local_psn = psn;
        id.mine = p;
        id.path = path;
        id.path_mtu = mtu;
        id.state = IdState::ReqSent;
        id.retries_left = retries;
        let tid = self.tid(comm);
        self.ids.get_mut(&h).expect("exists").tid = tid;
        self.by_comm.insert(comm, h);
        // cm_send_req: the REQ goes where its primary path leads (cm_init_av_by_path).
        let dst = self.ids.get(&h).and_then(|i| i.mad_dst()).unwrap_or(remote.ip());
        let last = self.send_with(dst, tid, ece.attr_mod, CmMessage::Req(req));
        let timeout = self.req_timeout();
        let id = self.ids.get_mut(&h).expect("exists");
        id.last = last;
        self.set_timer(h, Some(now + timeout));
        Ok(())
    }

    /// Accepts a connection request (`rdma_accept` on the passive side): sends REP.
    pub fn accept(&mut self, now: Instant, h: IdHandle, p: ConnParam) -> Result<(), CmError> {
        if self.id(h)?.qp_type == QpType::Ud {
            return self.sidr_reply(h, sidr_status::OK, p);
        }
        let (guid, delay, retries) = (self.cfg.ca_guid, self.cfg.target_ack_delay, self.cfg.max_cm_retries);
        let id = self.id(h)?;
        if id.state != IdState::ReqRcvd {
            return Err(CmError::Inval);
        }
        if p.private_data.len() > REP_PRIVATE_DATA_LEN {
            return Err(CmError::Inval);
        }
        let tgt = id.qp_type == QpType::XrcTgt;
        // The PSN was chosen with the ID: the consumer's QP reached RTR with it (its receive
        // PSN) before this call.
        let psn = id.local_psn;
        // cma_accept_ib / cm_format_rep: an XRC target's QPN goes in the Local EECN field.
        let rep = CmRepRepr {
            local_comm_id: id.local_comm_id,
            remote_comm_id: id.remote_comm_id,
            local_qkey: 0,
            local_qpn: if tgt { 0 } else { p.qp_num },
            local_eecn: if tgt { p.qp_num } else { 0 },
            starting_psn: psn,
            vendor_id: p.ece.vendor_id & 0xff_ffff,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: delay,
            failover_accepted: 0,
            e2e_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: tgt || p.srq,
            local_ca_guid: guid,
            private_data: p.private_data.clone(),
        };
        id.local_qpn = p.qp_num;
        id.local_psn = psn;
        let p_ece_attr_mod = p.ece.attr_mod;
        // cm_init_qp_rts_attr: the passive QP's retry count is the REQ's; ib_cm's REP parameters
        // carry none, so the accept's retry_count does not change it.
        let retry_count = id.mine.retry_count;
        id.mine = ConnParam { retry_count, ..p };
        id.state = IdState::RepSent;
        id.retries_left = retries;
        let (dst, tid, resp) = (id.mad_dst(), id.tid, id.peer_response_timeout);
        self.leave_pending(h);
        let Some(dst) = dst else { return Err(CmError::Inval) };
        let last = self.send_with(dst, tid, p_ece_attr_mod, CmMessage::Rep(rep));
        self.ids.get_mut(&h).expect("exists").last = last;
        // REP resend: the REQ's local CM response timeout (cm.c).
        let t = self.cfg.timer(resp);
        self.set_timer(h, Some(now + t));
        Ok(())
    }

    /// Sends RTU for an active connection whose REP arrived (librdmacm's accept on the active
    /// side after its QP reached RTS, or `rdma_establish`).
    pub fn establish(&mut self, _now: Instant, h: IdHandle) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.state != IdState::RepRcvd {
            return Err(CmError::Inval);
        }
        id.state = IdState::Established;
        let rtu =
            CmRtuRepr { local_comm_id: id.local_comm_id, remote_comm_id: id.remote_comm_id, private_data: vec![] };
        let (dst, tid) = (id.mad_dst(), id.tid);
        self.counters.established += 1;
        if let Some(dst) = dst {
            let last = self.send(dst, tid, CmMessage::Rtu(rtu));
            // A duplicate REP is answered with this RTU again (cm_dup_rep_handler).
            self.ids.get_mut(&h).expect("exists").last = last;
        }
        Ok(())
    }

    /// `rdma_reject`: REJ for a received REQ (or REP), reason 28 (or another, e.g. 35 for ECE).
    pub fn reject(&mut self, _now: Instant, h: IdHandle, private_data: &[u8], reason: u16) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.qp_type == QpType::Ud {
            // cma_reject of a UD ID: SIDR_REP "reject" with the private data.
            let p = ConnParam { private_data: private_data.to_vec(), ..Default::default() };
            return self.sidr_reply(h, sidr_status::REJECT, p);
        }
        let msg = match id.state {
            IdState::ReqRcvd => REJ_MSG_REQ,
            IdState::RepRcvd => REJ_MSG_REP,
            _ => return Err(CmError::Inval),
        };
        if private_data.len() > REJ_PRIVATE_DATA_LEN {
            return Err(CmError::Inval);
        }
        let rej = CmRejRepr {
            local_comm_id: id.local_comm_id,
            remote_comm_id: id.remote_comm_id,
            msg_rejected: msg,
            reject_info_len: 0,
            reason,
            ari: vec![],
            private_data: private_data.to_vec(),
        };
        let was_pending = id.state == IdState::ReqRcvd;
        id.state = IdState::Closed;
        let (dst, tid) = (id.mad_dst(), id.tid);
        if was_pending {
            self.leave_pending(h);
        }
        self.forget_peer(h);
        if let Some(dst) = dst {
            self.send(dst, tid, CmMessage::Rej(rej));
            self.counters.rejs_sent += 1;
        }
        Ok(())
    }

    /// `rdma_notify(IBV_EVENT_COMM_EST)`: data arrived before the RTU; the connection is up.
    pub fn notify(&mut self, h: IdHandle) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.state == IdState::RepSent {
            self.rtu_received(h, Vec::new());
        }
        Ok(())
    }

    /// The QP `qpn` of this device reported COMM_EST (IBTA 11.6.3: the first packet arrived in
    /// RTR): a passive connection still waiting for its RTU is established.
    pub fn notify_qp(&mut self, qpn: u32) {
        let h = self.ids.iter().find(|(_, i)| i.state == IdState::RepSent && i.local_qpn == qpn).map(|(h, _)| *h);
        if let Some(h) = h {
            self.rtu_received(h, Vec::new());
        }
    }

    fn rtu_received(&mut self, h: IdHandle, private_data: Vec<u8>) {
        let Some(id) = self.ids.get_mut(&h) else { return };
        id.state = IdState::Established;
        id.last = None;
        self.set_timer(h, None);
        self.counters.established += 1;
        self.event(h, CmEventKind::Established, 0, None, ConnParam { private_data, ..Default::default() });
    }

    /// `rdma_disconnect`: DREQ on an established connection, DREP to a received DREQ.
    pub fn disconnect(&mut self, now: Instant, h: IdHandle) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.qp_type == QpType::Ud {
            // A UD "connection" is no connection: nothing to tear down on the wire.
            return Ok(());
        }
        let state = id.state;
        match state {
            IdState::Established | IdState::RepSent | IdState::RepRcvd => {
                self.send_dreq(now, h);
                Ok(())
            }
            IdState::DreqRcvd => {
                self.send_drep_and_wait(now, h);
                Ok(())
            }
            IdState::DreqSent | IdState::Timewait | IdState::Closed => Ok(()),
            _ => Err(CmError::Inval),
        }
    }

    fn send_dreq(&mut self, now: Instant, h: IdHandle) {
        let Some(comm) = self.ids.get(&h).map(|i| i.local_comm_id) else { return };
        // cm_format_dreq: the DREQ's TID is cm_form_tid, this side's MAD agent half and its own
        // comm ID (cm.c:1288-1303, :2645-2646): on the active side the REQ's TID again, on the
        // passive side its own rather than the REQ's. ConnectX (write.pcap, nvme-discover2.pcap)
        // and rxe's kernel CM send exactly this.
        let tid = self.tid(comm);
        let Some(id) = self.ids.get_mut(&h) else { return };
        let dreq = CmDreqRepr {
            local_comm_id: id.local_comm_id,
            remote_comm_id: id.remote_comm_id,
            remote_qpn: id.peer.qpn,
            private_data: vec![],
        };
        id.state = IdState::DreqSent;
        id.retries_left = self.cfg.max_cm_retries;
        id.tid = tid;
        let Some(dst) = id.mad_dst() else { return };
        let last = self.send(dst, tid, CmMessage::Dreq(dreq));
        self.ids.get_mut(&h).expect("exists").last = last;
        let t = self.resend_interval(h);
        self.set_timer(h, Some(now + t));
    }

    fn send_drep_and_wait(&mut self, now: Instant, h: IdHandle) {
        let Some(id) = self.ids.get_mut(&h) else { return };
        let drep =
            CmDrepRepr { local_comm_id: id.local_comm_id, remote_comm_id: id.remote_comm_id, private_data: vec![] };
        let (dst, tid) = (id.mad_dst(), id.tid);
        if let Some(dst) = dst {
            let last = self.send(dst, tid, CmMessage::Drep(drep));
            // A duplicate DREQ in timewait is answered with this DREP again.
            self.ids.get_mut(&h).expect("exists").last = last;
        }
        self.enter_timewait(now, h);
    }

    fn enter_timewait(&mut self, now: Instant, h: IdHandle) {
        let Some(id) = self.ids.get_mut(&h) else { return };
        id.state = IdState::Timewait;
        // cm_enter_timewait: the AV's local ACK timeout.
        let t = self.cfg.timer(id.path.local_ack_timeout.max(1));
        self.set_timer(h, Some(now + t));
    }

    /// `rdma_destroy_id`: what the kernel's cm_destroy_id sends for the ID's state; a connection
    /// that must still finish (DREQ retries, timewait) lives on without its consumer.
    pub fn destroy(&mut self, now: Instant, h: IdHandle) -> Result<(), CmError> {
        let id = self.id(h)?;
        let state = id.state;
        if id.qp_type == QpType::Ud {
            // cm_destroy_id: a SIDR_REQ the consumer holds is rejected; anything else just goes.
            if state == IdState::ReqRcvd {
                let _ = self.sidr_reply(h, sidr_status::REJECT, ConnParam::default());
            }
            self.remove(h);
            return Ok(());
        }
        match state {
            IdState::ReqSent => {
                // REJ "timeout" with our CA GUID as the additional information.
                let guid = self.cfg.ca_guid;
                let id = self.ids.get_mut(&h).expect("exists");
                let rej = CmRejRepr {
                    local_comm_id: id.local_comm_id,
                    remote_comm_id: 0,
                    msg_rejected: REJ_MSG_OTHER,
                    reject_info_len: 8,
                    reason: reject::TIMEOUT,
                    ari: guid.to_be_bytes().to_vec(),
                    private_data: vec![],
                };
                let (dst, tid) = (id.mad_dst(), id.tid);
                if let Some(dst) = dst {
                    self.send(dst, tid, CmMessage::Rej(rej));
                    self.counters.rejs_sent += 1;
                }
                self.remove(h);
            }
            IdState::ReqRcvd | IdState::RepRcvd => {
                // cm_destroy_id: a consumer-defined REJ of the REQ (or REP) the consumer holds.
                let _ = self.reject(now, h, &[], reject::CONSUMER_DEFINED);
                self.remove(h);
            }
            IdState::RepSent => {
                // cm_destroy_id: a consumer-defined REJ while waiting for the RTU.
                let id = self.ids.get(&h).expect("exists");
                let (dst, tid, l, r) = (id.mad_dst(), id.tid, id.local_comm_id, id.remote_comm_id);
                if let Some(dst) = dst {
                    self.rej_to(dst, tid, r, l, REJ_MSG_OTHER, reject::CONSUMER_DEFINED);
                }
                self.remove(h);
            }
            IdState::Established => {
                self.send_dreq(now, h);
                self.orphan(h);
            }
            IdState::DreqRcvd => {
                self.send_drep_and_wait(now, h);
                self.orphan(h);
            }
            IdState::DreqSent | IdState::Timewait => self.orphan(h),
            IdState::Idle | IdState::Listen | IdState::Closed => self.remove(h),
        }
        Ok(())
    }

    fn orphan(&mut self, h: IdHandle) {
        if let Some(id) = self.ids.get_mut(&h) {
            id.orphan = true;
        }
    }

    /// The connection no longer blocks a new one from the same peer QP.
    fn forget_peer(&mut self, h: IdHandle) {
        let Some(id) = self.ids.get(&h) else { return };
        let key = (id.peer.ca_guid, id.peer.qpn);
        if self.by_peer_qp.get(&key) == Some(&h) {
            self.by_peer_qp.remove(&key);
        }
    }

    fn close(&mut self, h: IdHandle) {
        self.set_timer(h, None);
        self.forget_peer(h);
        let orphan = match self.ids.get_mut(&h) {
            Some(id) => {
                id.state = IdState::Closed;
                id.last = None;
                id.orphan
            }
            None => return,
        };
        if orphan {
            self.remove(h);
        }
    }

    /// Runs every CM timer that is due: resends, UNREACHABLE, timewait exits.
    pub fn handle_timeout(&mut self, now: Instant) {
        // REQs that waited for a listener: taken by one that came meanwhile, or rejected.
        if self.parked.iter().any(|p| p.until <= now) {
            let (due, wait): (Vec<_>, Vec<_>) =
                std::mem::take(&mut self.parked).into_iter().partition(|p| p.until <= now);
            self.parked = wait;
            for p in due {
                if self.listeners.contains_key(&p.req.service_id) {
                    self.handle_req(now, p.src, p.tid, p.attr_mod, p.req);
                } else {
                    self.rej_to(p.src, p.tid, p.req.local_comm_id, 0, REJ_MSG_REQ, reject::INVALID_SERVICE_ID);
                }
            }
        }
        let due: Vec<IdHandle> = self.timers.iter().take_while(|(t, _)| *t <= now).map(|(_, h)| *h).collect();
        for h in due {
            self.set_timer(h, None);
            let Some(id) = self.ids.get_mut(&h) else { continue };
            match id.state {
                IdState::ReqSent | IdState::RepSent | IdState::DreqSent => {
                    if id.retries_left > 0 {
                        id.retries_left -= 1;
                        let Some(m) = id.last.clone() else { continue };
                        self.out.push_back(m);
                        self.counters.mads_sent += 1;
                        self.counters.mads_resent += 1;
                        let t = self.resend_interval(h);
                        self.set_timer(h, Some(now + t));
                    } else if id.state == IdState::DreqSent {
                        // DREQ_ERROR: DISCONNECTED with -ETIMEDOUT, then timewait.
                        self.event(h, CmEventKind::Disconnected, ETIMEDOUT, None, ConnParam::default());
                        self.enter_timewait(now, h);
                    } else {
                        // REQ_ERROR / REP_ERROR: UNREACHABLE, -ETIMEDOUT.
                        self.event(h, CmEventKind::Unreachable, ETIMEDOUT, None, ConnParam::default());
                        self.close(h);
                    }
                }
                IdState::Timewait => {
                    self.event(h, CmEventKind::TimewaitExit, 0, None, ConnParam::default());
                    self.close(h);
                }
                _ => {}
            }
        }
    }

    /// Takes one MAD QP1 received from `src` (untrusted: counted and dropped when malformed).
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, mad: &[u8]) {
        let Ok(repr) = CmMadRepr::parse(mad) else {
            self.counters.mads_malformed += 1;
            return;
        };
        self.counters.mads_rcvd += 1;
        let tid = repr.tid;
        let handled = match repr.msg {
            CmMessage::Req(req) => {
                self.handle_req(now, src, tid, repr.attr_mod, req);
                true
            }
            CmMessage::Rep(rep) => self.handle_rep(now, src, repr.attr_mod, rep),
            CmMessage::Rtu(rtu) => self.handle_rtu(rtu),
            CmMessage::Rej(rej) => self.handle_rej(src, rej),
            CmMessage::Mra(mra) => self.handle_mra(now, mra),
            CmMessage::Dreq(dreq) => self.handle_dreq(now, src, tid, dreq),
            CmMessage::Drep(drep) => self.handle_drep(now, drep),
            CmMessage::SidrReq(sreq) => {
                self.handle_sidr_req(now, src, tid, sreq);
                true
            }
            CmMessage::SidrRep(srep) => self.handle_sidr_rep(srep),
            _ => false,
        };
        if !handled {
            self.counters.mads_unmatched += 1;
        }
    }

    fn rej_to(&mut self, dst: IpAddr, tid: u64, remote_comm_id: u32, local_comm_id: u32, msg: u8, reason: u16) {
        let rej = CmRejRepr {
            local_comm_id,
            remote_comm_id,
            msg_rejected: msg,
            reject_info_len: 0,
            reason,
            ari: vec![],
            private_data: vec![],
        };
        self.send(dst, tid, CmMessage::Rej(rej));
        self.counters.rejs_sent += 1;
    }

    fn handle_req(&mut self, now: Instant, src: IpAddr, tid: u64, attr_mod: u32, req: CmReqRepr) {
        // A duplicate (the peer resent its REQ): MRA while the consumer decides, the stale REJ
        // in timewait, nothing otherwise (cm_dup_req_handler).
        if let Some(&h) = self.by_remote.get(&(src, req.local_comm_id)) {
            let Some(id) = self.ids.get(&h) else { return };
            match id.state {
                IdState::ReqRcvd => {
                    let mra = CmMraRepr {
                        local_comm_id: id.local_comm_id,
                        remote_comm_id: id.remote_comm_id,
                        msg_mraed: 0,
                        service_timeout: MRA_SERVICE_TIMEOUT,
                        private_data: vec![],
                    };
                    let tid = id.tid;
                    self.send(src, tid, CmMessage::Mra(mra));
                    self.counters.mras_sent += 1;
                }
                IdState::Timewait => {
                    let (l, r) = (id.local_comm_id, id.remote_comm_id);
                    self.rej_to(src, tid, r, l, REJ_MSG_REQ, reject::STALE_CONN);
                }
                _ => {}
            }
            return;
        }
        // IBTA 12.9.8.3.1 / cm_match_req: a (CA GUID, QPN) already connected or in timewait.
        if self.by_peer_qp.contains_key(&(req.local_ca_guid, req.local_qpn)) {
            self.rej_to(src, tid, req.local_comm_id, 0, REJ_MSG_REQ, reject::STALE_CONN);
            return;
        }
        let sid = req.service_id;
        let Some(list) = self.listeners.get(&sid) else {
            // A resent REQ that already waits for a listener.
            if self.parked.iter().any(|p| p.src == src && p.req.local_comm_id == req.local_comm_id) {
                return;
            }
            // No listener for the service ID: REJ 8 (cm_issue_rej), at once or after the grace
            // a late listener gets (CmConfig::late_listener_grace).
            let grace = self.cfg.late_listener_grace;
            if grace == Duration::ZERO || self.parked.len() >= MAX_PARKED_REQS {
                self.rej_to(src, tid, req.local_comm_id, 0, REJ_MSG_REQ, reject::INVALID_SERVICE_ID);
            } else {
                self.parked.push(ParkedReq { until: now + grace, src, tid, attr_mod, req });
            }
            return;
        };
        let hdr = CmaHdrPacket::new_checked(&req.private_data[..]).and_then(|p| CmaHdrRepr::parse(&p)).ok();
        // rdma_cm's own checks on what the IB CM matched (cma_ib_req_handler): its IP header,
        // the destination address against the listener's, the QP type.
        let listener =
            hdr.as_ref().and_then(|hd| list.iter().find(|(a, _)| a.is_none() || *a == Some(hd.dst)).map(|(_, h)| *h));
        let Some(lh) = listener else {
            self.rej_to(src, tid, req.local_comm_id, 0, REJ_MSG_REQ, reject::CONSUMER_DEFINED);
            return;
        };
        let hdr = hdr.expect("listener found through it");
        let Some(l) = self.ids.get(&lh) else { return };
        let qp_type = match (req.transport, req.extended_transport, l.qp_type) {
            (0, _, QpType::Rc) => QpType::Rc,
            (1, _, QpType::Uc) => QpType::Uc,
            (3, 1, QpType::XrcTgt) => QpType::XrcTgt,
            _ => {
                self.rej_to(src, tid, req.local_comm_id, 0, REJ_MSG_REQ, reject::CONSUMER_DEFINED);
                return;
            }
        };
        if l.pending >= backlog_of(l.backlog) || self.pending >= self.cfg.max_pending {
            // The kernel drops a REQ beyond the listen backlog (the peer resends it).
            self.counters.reqs_dropped += 1;
            return;
        }
        let ps = l.ps;
        let local_port = (sid & 0xffff) as u16;
        let comm = self.alloc_comm_id();
        let h = self.alloc_handle();
        let mut id = Id::new(ps, qp_type, self.cfg.mtu);
        id.local_psn = self.rng.next_u32() & 0xff_ffff;
        id.state = IdState::ReqRcvd;
        id.local = Some(SocketAddr::new(hdr.dst, local_port));
        id.remote = Some(SocketAddr::new(hdr.src, hdr.port));
        id.parent = Some(lh);
        id.local_comm_id = comm;
        id.remote_comm_id = req.local_comm_id;
        id.tid = tid;
        id.peer = Peer {
            qpn: req.local_qpn,
            psn: req.starting_psn,
            ca_guid: req.local_ca_guid,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
        };
        // The passive side's path is the REQ's, seen from this end (cm_format_paths_from_req).
        let mut path = req.primary_path.clone();
        std::mem::swap(&mut path.local_gid, &mut path.remote_gid);
        std::mem::swap(&mut path.local_lid, &mut path.remote_lid);
        id.path = path;
        id.path_mtu = Mtu::from_ibv(u32::from(req.path_mtu)).map_or(self.cfg.mtu, |m| m.min(self.cfg.mtu));
        id.peer_response_timeout = req.local_cm_response_timeout;
        id.passive = true;
        // The consumer's own retry count is what the REQ asked for (cm_init_qp_rts_attr), and
        // its depths mirror the REQ's (cm_req_handler: our responder resources are the peer's
        // initiator depth and the other way round).
        id.mine.retry_count = req.retry_count;
        id.mine.responder_resources = req.initiator_depth;
        id.mine.initiator_depth = req.responder_resources;
        self.ids.insert(h, id);
        self.by_comm.insert(comm, h);
        self.by_remote.insert((src, req.local_comm_id), h);
        self.by_peer_qp.insert((req.local_ca_guid, req.local_qpn), h);
        self.pending += 1;
        if let Some(l) = self.ids.get_mut(&lh) {
            l.pending += 1;
        }
        let user = req.private_data.get(CmaHdrRepr::LEN..).unwrap_or_default().to_vec();
        let param = ConnParam {
            private_data: user,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            flow_control: req.e2e_flow_control,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            qp_num: req.local_qpn,
            // cm_format_req_event: the REQ's ECE.
            ece: Ece { vendor_id: req.vendor_id, attr_mod },
            qkey: 0,
        };
        let _ = now;
        self.event(h, CmEventKind::ConnectRequest, 0, Some(lh), param);
    }

    fn handle_rep(&mut self, _now: Instant, src: IpAddr, attr_mod: u32, rep: CmRepRepr) -> bool {
        let Some(&h) = self.by_comm.get(&rep.remote_comm_id) else { return false };
        let Some(id) = self.ids.get_mut(&h) else { return false };
        match id.state {
            IdState::ReqSent => {}
            IdState::Established if id.remote_comm_id == rep.local_comm_id => {
                // A duplicate REP: our RTU was lost; send it again (cm_dup_rep_handler).
                if let Some(m) = id.last.clone() {
                    self.out.push_back(m);
                    self.counters.mads_sent += 1;
                }
                return true;
            }
            IdState::RepRcvd if id.remote_comm_id == rep.local_comm_id => {
                // The consumer has not established yet and the peer resent its REP. rdma_cm arms
                // a delayed MRA when it hands a REP to its consumer (cma_ib_handler, cma.c:2163-
                // 2169: ib_send_cm_mra with IB_CM_MRA_FLAG_DELAY moves ib_cm to MRA_REP_SENT),
                // and cm_dup_rep_handler sends it for a duplicate REP (cm.c), so the passive side
                // waits the service timeout instead of resending until it gives up (IBTA 12.6.6:
                // MRA for a REP). The MRA's message-MRAed field takes REJ's encoding.
                let mra = CmMraRepr {
                    local_comm_id: id.local_comm_id,
                    remote_comm_id: id.remote_comm_id,
                    msg_mraed: REJ_MSG_REP,
                    service_timeout: MRA_SERVICE_TIMEOUT,
                    private_data: vec![],
                };
                let tid = id.tid;
                self.send(src, tid, CmMessage::Mra(mra));
                self.counters.mras_sent += 1;
                return true;
            }
            IdState::RepRcvd => return true,
            _ => return false,
        }
        let xrc = id.qp_type == QpType::XrcIni;
        id.remote_comm_id = rep.local_comm_id;
        id.peer = Peer {
            // An XRC target's QPN travels in the Local EECN field (cm_msgs.h).
            qpn: if xrc { rep.local_eecn } else { rep.local_qpn },
            psn: rep.starting_psn,
            ca_guid: rep.local_ca_guid,
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
        };
        id.state = IdState::RepRcvd;
        id.last = None;
        // cm_rep_handler: the depths the REP grants.
        id.mine.initiator_depth = rep.responder_resources;
        id.mine.responder_resources = rep.initiator_depth;
        let key = (rep.local_ca_guid, id.peer.qpn);
        let param = ConnParam {
            private_data: rep.private_data,
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            flow_control: rep.e2e_flow_control,
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
            qp_num: id.peer.qpn,
            // cm_format_rep_event: the REP's ECE.
            ece: Ece { vendor_id: rep.vendor_id, attr_mod },
            qkey: 0,
        };
        self.by_remote.insert((src, rep.local_comm_id), h);
        self.by_peer_qp.insert(key, h);
        self.set_timer(h, None);
        self.event(h, CmEventKind::ConnectResponse, 0, None, param);
        true
    }

    fn handle_rtu(&mut self, rtu: CmRtuRepr) -> bool {
        let Some(&h) = self.by_comm.get(&rtu.remote_comm_id) else { return false };
        let Some(id) = self.ids.get(&h) else { return false };
        if id.remote_comm_id != rtu.local_comm_id {
            return false;
        }
        match id.state {
            IdState::RepSent => {
                self.rtu_received(h, rtu.private_data);
                true
            }
            IdState::Established => true,
            _ => false,
        }
    }

    fn handle_rej(&mut self, src: IpAddr, rej: CmRejRepr) -> bool {
        let Some(h) = self.rej_target(src, &rej) else { return false };
        let Some(id) = self.ids.get(&h) else { return false };
        // A REJ to our REQ may carry a zero Local Comm ID (no listener); otherwise it must be
        // the peer we know.
        if id.state != IdState::ReqSent && id.remote_comm_id != rej.local_comm_id {
            return false;
        }
        match id.state {
            IdState::ReqSent | IdState::RepSent | IdState::RepRcvd | IdState::ReqRcvd => {
                let was_pending = id.state == IdState::ReqRcvd;
                if was_pending {
                    self.leave_pending(h);
                }
                let param = ConnParam { private_data: rej.private_data, ..Default::default() };
                self.event(h, CmEventKind::Rejected, i32::from(rej.reason), None, param);
                self.close(h);
                true
            }
            IdState::Established if rej.reason == reject::STALE_CONN => {
                // The peer thinks this connection is stale: it is over.
                self.event(h, CmEventKind::Disconnected, 0, None, ConnParam::default());
                self.close(h);
                true
            }
            _ => false,
        }
    }

    /// cm_acquire_rejected_id: a REJ "timeout" (reason 4) is sent by an active side that gave up
    /// before knowing our comm ID, so its Remote Comm ID is 0; it names the connection by the
    /// sender's Local Comm ID and, in the ARI, the sender's CA GUID. Every other REJ names our
    /// comm ID.
    fn rej_target(&self, src: IpAddr, rej: &CmRejRepr) -> Option<IdHandle> {
        if rej.reason == reject::TIMEOUT && rej.remote_comm_id == 0 {
            let h = *self.by_remote.get(&(src, rej.local_comm_id))?;
            let id = self.ids.get(&h)?;
            let ari_guid = rej.ari.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
            return (ari_guid == Some(id.peer.ca_guid)).then_some(h);
        }
        self.by_comm.get(&rej.remote_comm_id).copied()
    }

    fn handle_mra(&mut self, now: Instant, mra: CmMraRepr) -> bool {
        let Some(&h) = self.by_comm.get(&mra.remote_comm_id) else { return false };
        let Some(id) = self.ids.get(&h) else { return false };
        if !matches!(id.state, IdState::ReqSent | IdState::RepSent) {
            return false;
        }
        // cm_mra_handler: the peer needs service_timeout more; the resend waits that long.
        let t =
            self.cfg.timer(mra.service_timeout).as_nanos() + self.cfg.timer(self.cfg.packet_lifetime + 1).as_nanos();
        self.set_timer(h, Some(now + Duration::from_nanos(t)));
        true
    }

    fn handle_dreq(&mut self, now: Instant, src: IpAddr, tid: u64, dreq: CmDreqRepr) -> bool {
        let found = self.by_comm.get(&dreq.remote_comm_id).copied();
        let Some(h) = found.filter(|h| self.ids.get(h).is_some_and(|i| i.remote_comm_id == dreq.local_comm_id)) else {
            // An unknown comm ID still gets a DREP (cm_issue_drep), so the peer stops.
            let drep = CmDrepRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: vec![],
            };
            self.send(src, tid, CmMessage::Drep(drep));
            self.counters.mads_unmatched += 1;
            return true;
        };
        let id = self.ids.get_mut(&h).expect("found");
        // IBTA 12.9.8.6 / cm_dreq_handler: a DREQ naming another QP is dropped.
        if dreq.remote_qpn != id.local_qpn {
            return false;
        }
        match id.state {
            IdState::Established | IdState::RepSent | IdState::RepRcvd => {
                id.state = IdState::DreqRcvd;
                id.tid = tid;
                id.last = None;
                self.set_timer(h, None);
                self.event(h, CmEventKind::Disconnected, 0, None, ConnParam::default());
            }
            IdState::DreqSent => {
                // Both sides disconnected at once: answer, and wait.
                id.tid = tid;
                self.event(h, CmEventKind::Disconnected, 0, None, ConnParam::default());
                self.send_drep_and_wait(now, h);
            }
            IdState::Timewait => {
                // cm_dreq_handler: a DREQ in timewait (our DREP was lost, or we disconnected
                // first and its DREQ crossed ours) gets a fresh DREP, whatever we sent last.
                let drep = CmDrepRepr {
                    local_comm_id: id.local_comm_id,
                    remote_comm_id: id.remote_comm_id,
                    private_data: vec![],
                };
                self.send(src, tid, CmMessage::Drep(drep));
            }
            _ => {}
        }
        true
    }

    fn handle_drep(&mut self, now: Instant, drep: CmDrepRepr) -> bool {
        let Some(&h) = self.by_comm.get(&drep.remote_comm_id) else { return false };
        let Some(id) = self.ids.get(&h) else { return false };
        if id.state != IdState::DreqSent || id.remote_comm_id != drep.local_comm_id {
            return false;
        }
        self.event(h, CmEventKind::Disconnected, 0, None, ConnParam::default());
        self.enter_timewait(now, h);
        true
    }
}
