//! UD connections: service ID resolution (IBTA Vol 1 12.11, SIDR_REQ / SIDR_REP), as rdma_cm
//! runs it for RDMA_PS_UDP and RDMA_PS_IPOIB IDs (the kernel's cm.c `ib_send_cm_sidr_req`,
//! `cm_sidr_req_handler`, `ib_send_cm_sidr_rep`, `cm_sidr_rep_handler`; cma.c `cma_resolve_ib_udp`,
//! `cma_send_sidr_rep`, `cma_sidr_rep_handler`).
//!
//! The active side sends a SIDR_REQ (request ID = its local ID, P_Key 0xFFFF, the service ID, the
//! rdma_cm IP header and the consumer's data as private data) and resends it every
//! 2^(CM response timeout - 8) ms, 16 times in all, then reports UNREACHABLE with -ETIMEDOUT. The
//! passive side hands a SIDR_REQ that a listener matches to its consumer as CONNECT_REQUEST and
//! answers with the consumer's accept (status 0, its QPN and the Q_Key) or reject (status 2); a
//! SIDR_REQ for a service nobody listens on gets status 1 (unsupported) at once. The active side
//! then hears ESTABLISHED with the peer's QPN and Q_Key (or UNREACHABLE with the SIDR status).
//! There is no connection afterwards: no RTU, no DREQ, no timewait.

use std::net::{IpAddr, SocketAddr};

use super::RDMA_UDP_QKEY;
use super::{backlog_of, roce_path, service_id, Cm, CmError, CmEventKind, ConnParam, Id, IdHandle, IdState};
use crate::time::{Duration, Instant};
use crate::verbs::QpType;
use crate::wire::{
    CmMessage, CmSidrRepRepr, CmSidrReqRepr, CmaHdrPacket, CmaHdrRepr, SIDR_REP_PRIVATE_DATA_LEN,
    SIDR_REQ_PRIVATE_DATA_LEN,
};

/// SIDR_REQ private data left for the consumer after the rdma_cm IP header (180 bytes).
pub const SIDR_REQ_USER_DATA_LEN: usize = SIDR_REQ_PRIVATE_DATA_LEN - CmaHdrRepr::LEN;

/// SIDR_REP status values (IBTA 12.11.2; Linux `enum ib_cm_sidr_status`).
pub mod sidr_status {
    /// The QP was found: QPN and Q_Key are valid.
    pub const OK: u8 = 0;
    /// No service for the service ID (the kernel's answer when nobody listens).
    pub const UNSUPPORTED: u8 = 1;
    /// The consumer rejected the request.
    pub const REJECT: u8 = 2;
    /// No QP for the service.
    pub const NO_QP: u8 = 3;
    /// Redirected elsewhere (not sent by this CM).
    pub const REDIRECT: u8 = 4;
    /// Unsupported class version (not sent: the MAD parser drops other versions).
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// -EINVAL, the status of the ADDR_ERROR a SIDR_REP with a foreign Q_Key gives (cma_set_qkey).
const EINVAL_STATUS: i32 = -22;

impl Cm {
    /// How long an active UD ID waits for its SIDR_REP before resending the SIDR_REQ
    /// (cma_resolve_ib_udp: 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms).
    pub(super) fn sidr_timeout(&self) -> Duration {
        self.cfg.timer(self.cfg.cm_response_timeout)
    }

    /// `rdma_connect` on a UD ID: sends a SIDR_REQ.
    pub(super) fn sidr_connect(&mut self, now: Instant, h: IdHandle, p: ConnParam) -> Result<(), CmError> {
        let comm = self.alloc_comm_id();
        let retries = self.cfg.max_cm_retries;
        let ack = self.cfg.packet_lifetime + 1;
        let id = self.id(h)?;
        if id.state != IdState::Idle {
            return Err(CmError::Inval);
        }
        let (Some(local), Some(remote)) = (id.local, id.remote) else { return Err(CmError::Inval) };
        if p.private_data.len() > SIDR_REQ_USER_DATA_LEN {
            return Err(CmError::Inval);
        }
        let mut private_data = vec![0u8; CmaHdrRepr::LEN];
        CmaHdrRepr { port: local.port(), src: local.ip(), dst: remote.ip() }
            .emit(&mut CmaHdrPacket::new_unchecked(&mut private_data[..]))
            .map_err(|_| CmError::Inval)?;
        private_data.extend_from_slice(&p.private_data);
        // cm_format_sidr_req: the request ID is the local ID, the P_Key the default.
        let req = CmSidrReqRepr {
            request_id: comm,
            pkey: 0xffff,
            service_id: service_id(id.ps, remote.port()),
            private_data,
        };
        id.path = roce_path(local, remote, id.tos, id.ack_timeout.unwrap_or(ack));
        id.local_comm_id = comm;
        id.local_qpn = p.qp_num;
        id.mine = p;
        id.state = IdState::ReqSent;
        id.retries_left = retries;
        let tid = self.tid(comm);
        self.ids.get_mut(&h).expect("exists").tid = tid;
        self.by_comm.insert(comm, h);
        let last = self.send(remote.ip(), tid, CmMessage::SidrReq(req));
        self.ids.get_mut(&h).expect("exists").last = last;
        let t = self.sidr_timeout();
        self.set_timer(h, Some(now + t));
        Ok(())
    }

    /// A SIDR_REQ from `src`: CONNECT_REQUEST for the listener of its service ID, or status 1
    /// (nobody listens) or 2 (rdma_cm refuses what the IB CM matched) at once.
    pub(super) fn handle_sidr_req(&mut self, _now: Instant, src: IpAddr, tid: u64, req: CmSidrReqRepr) {
        // A duplicate while the consumer decides: dropped (cm_sidr_req_handler's
        // cm_insert_remote_sidr).
        if self.by_remote.contains_key(&(src, req.request_id)) {
            return;
        }
        let Some(list) = self.listeners.get(&req.service_id) else {
            self.sidr_rep_to(src, tid, &req, sidr_status::UNSUPPORTED);
            return;
        };
        let hdr = CmaHdrPacket::new_checked(&req.private_data[..]).and_then(|p| CmaHdrRepr::parse(&p)).ok();
        // cma_ib_req_handler's checks: the IP header, the listener's address, its QP type; a
        // refusal destroys the IB CM ID, which rejects the SIDR_REQ (cm_destroy_id).
        let listener =
            hdr.as_ref().and_then(|hd| list.iter().find(|(a, _)| a.is_none() || *a == Some(hd.dst)).map(|(_, h)| *h));
        let Some((lh, hdr)) = listener.zip(hdr) else {
            self.sidr_rep_to(src, tid, &req, sidr_status::REJECT);
            return;
        };
        let Some(l) = self.ids.get(&lh) else { return };
        if l.qp_type != QpType::Ud {
            self.sidr_rep_to(src, tid, &req, sidr_status::REJECT);
            return;
        }
        if l.pending >= backlog_of(l.backlog) || self.pending >= self.cfg.max_pending {
            // Beyond the backlog: dropped, the peer resends.
            self.counters.reqs_dropped += 1;
            return;
        }
        let ps = l.ps;
        let local = SocketAddr::new(hdr.dst, (req.service_id & 0xffff) as u16);
        let remote = SocketAddr::new(hdr.src, hdr.port);
        let h = self.alloc_handle();
        let mut id = Id::new(ps, QpType::Ud, self.cfg.mtu);
        id.state = IdState::ReqRcvd;
        id.local = Some(local);
        id.remote = Some(remote);
        id.parent = Some(lh);
        id.remote_comm_id = req.request_id;
        id.tid = tid;
        id.passive = true;
        // The reply goes back where the request came from.
        id.path = roce_path(local, SocketAddr::new(src, hdr.port), 0, self.cfg.packet_lifetime + 1);
        id.mine.private_data = req.private_data.clone();
        self.ids.insert(h, id);
        self.by_remote.insert((src, req.request_id), h);
        self.pending += 1;
        if let Some(l) = self.ids.get_mut(&lh) {
            l.pending += 1;
        }
        let user = req.private_data.get(CmaHdrRepr::LEN..).unwrap_or_default().to_vec();
        self.event(h, CmEventKind::ConnectRequest, 0, Some(lh), ConnParam { private_data: user, ..Default::default() });
    }

    /// Answers a SIDR_REQ no ID holds (no listener, or refused).
    fn sidr_rep_to(&mut self, dst: IpAddr, tid: u64, req: &CmSidrReqRepr, status: u8) {
        let rep =
            CmSidrRepRepr { request_id: req.request_id, status, service_id: req.service_id, ..Default::default() };
        self.send(dst, tid, CmMessage::SidrRep(rep));
        self.counters.rejs_sent += 1;
    }

    /// `rdma_accept` (status 0, with the consumer's QPN and the port space's Q_Key) or
    /// `rdma_reject` (status 2) of a received SIDR_REQ; the ID is done with the protocol.
    pub(super) fn sidr_reply(&mut self, h: IdHandle, status: u8, p: ConnParam) -> Result<(), CmError> {
        let id = self.id(h)?;
        if id.state != IdState::ReqRcvd {
            return Err(CmError::Inval);
        }
        if p.private_data.len() > SIDR_REP_PRIVATE_DATA_LEN {
            return Err(CmError::Inval);
        }
        let ok = status == sidr_status::OK;
        let service = id.local.map_or(0, |l| service_id(id.ps, l.port()));
        // cma_send_sidr_rep: the QPN and Q_Key only with status 0 (cma_set_qkey: the port
        // space's Q_Key).
        let rep = CmSidrRepRepr {
            request_id: id.remote_comm_id,
            status,
            qpn: if ok { p.qp_num & 0xff_ffff } else { 0 },
            service_id: service,
            qkey: if ok { RDMA_UDP_QKEY } else { 0 },
            private_data: p.private_data.clone(),
            ..Default::default()
        };
        let (dst, tid, remote) = (id.mad_dst(), id.tid, id.remote_comm_id);
        id.local_qpn = p.qp_num;
        id.mine = p;
        id.state = if ok { IdState::Established } else { IdState::Closed };
        self.leave_pending(h);
        // The kernel forgets the remote request once it has answered (cm_send_sidr_rep_locked):
        // a later SIDR_REQ with the same ID is a new request.
        if let Some(d) = dst {
            self.by_remote.retain(|k, v| !(*v == h && k.1 == remote));
            self.send(d, tid, CmMessage::SidrRep(rep));
        }
        if ok {
            self.counters.established += 1;
        } else {
            self.counters.rejs_sent += 1;
        }
        Ok(())
    }

    /// A SIDR_REP for an active UD ID: ESTABLISHED with the peer's QPN and Q_Key, or
    /// UNREACHABLE with the status (cma_sidr_rep_handler).
    pub(super) fn handle_sidr_rep(&mut self, rep: CmSidrRepRepr) -> bool {
        let Some(&h) = self.by_comm.get(&rep.request_id) else { return false };
        let Some(id) = self.ids.get_mut(&h) else { return false };
        if id.qp_type != QpType::Ud || id.state != IdState::ReqSent {
            return false;
        }
        id.last = None;
        self.set_timer(h, None);
        let id = self.ids.get_mut(&h).expect("exists");
        if rep.status != sidr_status::OK {
            id.state = IdState::Closed;
            self.event(h, CmEventKind::Unreachable, i32::from(rep.status), None, ConnParam::default());
            return true;
        }
        // cma_set_qkey: an ID of RDMA_PS_UDP holds RDMA_UDP_QKEY; another Q_Key is an error.
        if rep.qkey != 0 && rep.qkey != RDMA_UDP_QKEY {
            id.state = IdState::Closed;
            self.event(h, CmEventKind::AddrError, EINVAL_STATUS, None, ConnParam::default());
            return true;
        }
        id.peer.qpn = rep.qpn;
        id.state = IdState::Established;
        self.counters.established += 1;
        let param =
            ConnParam { private_data: rep.private_data, qp_num: rep.qpn, qkey: RDMA_UDP_QKEY, ..Default::default() };
        self.event(h, CmEventKind::Established, 0, None, param);
        true
    }
}
