//! The QP attributes an ID's QP needs for each state (`rdma_init_qp_attr`): what the kernel's
//! cm_init_qp_init_attr, _rtr_attr and _rts_attr give, from the path and the peer's REQ/REP.

use super::*;

impl Cm {
    /// The QP attributes for moving the ID's QP to `state` (`rdma_init_qp_attr`).
    pub fn init_qp_attr(&self, h: IdHandle, state: QpState) -> Result<InitQpAttr, CmError> {
        let id = self.ids.get(&h).filter(|i| !i.orphan).ok_or(CmError::NoEnt)?;
        if id.ps == PS_IPOIB {
            // cma_set_qkey: an RDMA_PS_IPOIB ID's Q_Key is the IPoIB broadcast group's, which
            // only the IB SA knows (ib_sa_get_mcmember_rec); a RoCE port has no SA client, so
            // the kernel fails with -ENODEV, and with it rdma_create_qp (cma.c:1233-1237).
            return Err(CmError::NoDev);
        }
        let mut a = QpAttr { qp_state: state, ..QpAttr::default() };
        let mut mask = AttrMask::STATE;
        let connected = id.local_comm_id != 0;
        let mut r = InitQpAttr { attr: QpAttr::default(), mask, hop_limit: 0, traffic_class: 0, flow_label: 0, sl: 0 };
        match state {
            QpState::Init => {
                a.pkey_index = 0;
                a.port_num = 1;
                mask = mask | AttrMask::PKEY_INDEX | AttrMask::PORT;
                if id.qp_type == QpType::Ud {
                    // cma_ib_init_qp_attr: UD QPs get the port space's Q_Key.
                    a.qkey = RDMA_UDP_QKEY;
                    mask = mask | AttrMask::QKEY;
                } else {
                    // Before a connection exists the kernel grants nothing; once the CM has one,
                    // cm_init_qp_init_attr: REMOTE_WRITE, plus READ and ATOMIC when this side
                    // offers responder resources.
                    a.qp_access_flags = if !connected {
                        Access::EMPTY
                    } else if id.mine.responder_resources > 0 {
                        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
                    } else {
                        Access::REMOTE_WRITE
                    };
                    mask = mask | AttrMask::ACCESS_FLAGS;
                }
            }
            QpState::Rtr => {
                if !connected
                    || !matches!(
                        id.state,
                        IdState::RepSent | IdState::RepRcvd | IdState::Established | IdState::ReqRcvd
                    )
                {
                    return Err(CmError::Inval);
                }
                // cm_init_qp_rtr_attr. The receive PSN is the Starting PSN this side announced
                // (its REQ or REP), not the peer's: a CM message's Starting PSN is where its
                // sender's receive queue begins, and the peer's send queue starts there
                // (rdma_init_qp_attr sets rq_psn = seq_num, cma.c:1261-1262; cm_send_req and
                // ib_send_cm_rep keep their own PSN as rq_psn, cm.c:1574, :2319). The ConnectX
                // capture write.pcap shows it: the passive QP's first packet carries the REQ's PSN.
                a.path_mtu = id.path_mtu;
                a.dest_qp_num = id.peer.qpn;
                a.rq_psn = id.local_psn;
                a.dest = gid_to_ip(&id.path.remote_gid);
                mask = mask | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
                if matches!(id.qp_type, QpType::Rc | QpType::XrcTgt) {
                    a.max_dest_rd_atomic = id.mine.responder_resources;
                    a.min_rnr_timer = 0;
                    mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
                }
                r.hop_limit = id.path.hop_limit;
                r.traffic_class = id.path.traffic_class;
                r.flow_label = id.path.flow_label;
                r.sl = id.path.sl;
            }
            QpState::Rts => {
                if !connected
                    || !matches!(
                        id.state,
                        IdState::RepSent | IdState::RepRcvd | IdState::Established | IdState::ReqRcvd
                    )
                {
                    return Err(CmError::Inval);
                }
                // cm_init_qp_rts_attr: the send PSN is the peer's Starting PSN (the passive side
                // takes the REQ's, cm_req_handler, cm.c:2111; the active side the REP's,
                // cm_rep_handler, cm.c:2564).
                a.sq_psn = id.peer.psn;
                mask = mask | AttrMask::SQ_PSN;
                if matches!(id.qp_type, QpType::Rc | QpType::XrcIni) {
                    a.timeout = id.path.local_ack_timeout;
                    a.retry_cnt = id.mine.retry_count.min(7);
                    a.rnr_retry = id.peer.rnr_retry_count.min(7);
                    a.max_rd_atomic = id.mine.initiator_depth;
                    mask = mask
                        | AttrMask::TIMEOUT
                        | AttrMask::RETRY_CNT
                        | AttrMask::RNR_RETRY
                        | AttrMask::MAX_QP_RD_ATOMIC;
                }
                if id.qp_type == QpType::XrcTgt {
                    // cm_init_qp_rts_attr: a target QP sends no requests, but the transition
                    // still takes the ACK timeout with the PSN (qp_state_table[RTR][RTS]).
                    a.timeout = id.path.local_ack_timeout;
                    mask = mask | AttrMask::TIMEOUT;
                }
            }
            _ => return Err(CmError::Inval),
        }
        r.attr = a;
        r.mask = mask;
        Ok(r)
    }
}
