//! Bringing queue pairs up: RESET -> INIT -> RTR -> RTS, each `modify_qp` carrying exactly the
//! attributes the kernel's `qp_state_table` requires for the QP type ([`crate::modify::required`],
//! IBTA Vol 1 11.2.4.2 and its Table 95), and two QPs on two devices connected to each other.
//!
//! This is the one place a test, a workload or a benchmark brings engine QPs up; a program using
//! the device goes through its verbs (`modify_qp`) instead.
//!
//! Creating the QPs stays with the caller: an RC QP with an SRQ, an XRC initiator and an XRC target
//! (created through its domain) are made differently, and their bring-up is not.

use std::net::IpAddr;

use crate::device::{Device, QpAttr};
use crate::memory::Memory;
use crate::modify::required;
use crate::verbs::{Access, AttrMask, Mtu, QpState, QpType, VerbsError};
use crate::wire::Qpn;

/// The transitions from RESET to RTS, in order.
pub const TO_RTS: [(QpState, QpState); 3] =
    [(QpState::Reset, QpState::Init), (QpState::Init, QpState::Rtr), (QpState::Rtr, QpState::Rts)];

/// What both ends of a connection set alike: the path, the access they grant, and the retry and
/// depth policy. Each field goes only into the transitions whose required mask names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// Path MTU (RTR).
    pub mtu: Mtu,
    /// What the peer may do through this QP (INIT).
    pub access: Access,
    /// Q_Key (UD, INIT).
    pub qkey: u32,
    /// Local ACK timeout code, 4.096 us x 2^timeout (RTS).
    pub timeout: u8,
    /// Transport retries (RTS).
    pub retry_cnt: u8,
    /// RNR retries, 7: infinite (RTS).
    pub rnr_retry: u8,
    /// RNR NAK timer code this QP's responder sends (RTR).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests as requester (RTS).
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests as responder (RTR).
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnectParams {
    /// MTU 1024, every access, timeout 14 (about 67 ms), 7 retries of each kind, RNR timer 1,
    /// 16 outstanding READs/atomics each way.
    fn default() -> ConnectParams {
        ConnectParams {
            mtu: Mtu::Mtu1024,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            qkey: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

/// The other end of a connection, as this QP's RTR sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// The peer's address (the address vector's GID).
    pub addr: IpAddr,
    /// The peer's QP number.
    pub qpn: Qpn,
    /// The first PSN the peer sends: this QP's expected PSN (rq_psn).
    pub psn: u32,
}

/// One end of a pair for [`connect_pair`]: a device, a QP of it still in RESET, and the first PSN
/// that QP sends.
pub struct End<'a, M: Memory> {
    /// The device holding the QP; its address is the peer's destination.
    pub dev: &'a mut Device<M>,
    /// The QP.
    pub qpn: Qpn,
    /// Its type.
    pub qp_type: QpType,
    /// Its first send PSN (sq_psn), the peer's rq_psn.
    pub psn: u32,
}

/// A transition that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{qp_type:?} {from:?}->{to:?}: {error}")]
pub struct BringUpError {
    /// The QP's type.
    pub qp_type: QpType,
    /// The state it was in.
    pub from: QpState,
    /// The state it was to reach.
    pub to: QpState,
    /// What `modify_qp` said (EINVAL for a transition the table lacks).
    pub error: VerbsError,
}

/// The attributes of every transition to RTS, for a QP sending from `psn` to `remote`; each
/// transition's mask picks its own out of them.
pub fn attributes(p: &ConnectParams, psn: u32, remote: &Remote) -> QpAttr {
    QpAttr {
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: p.access,
        qkey: p.qkey,
        path_mtu: p.mtu,
        dest: remote.addr,
        dest_qp_num: remote.qpn.value(),
        rq_psn: remote.psn,
        max_dest_rd_atomic: p.max_dest_rd_atomic,
        min_rnr_timer: p.min_rnr_timer,
        sq_psn: psn,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        max_rd_atomic: p.max_rd_atomic,
        ..QpAttr::default()
    }
}

/// The mask of one transition: STATE and what the table requires for `qp_type`; `None` when the
/// transition does not exist.
pub fn mask(qp_type: QpType, from: QpState, to: QpState) -> Option<AttrMask> {
    required(qp_type, from, to).map(|m| m | AttrMask::STATE)
}

/// Moves QP `qpn` of `dev`, in RESET, through INIT and RTR to RTS, sending from `psn` to `remote`.
pub fn bring_up<M: Memory>(
    dev: &mut Device<M>,
    qpn: Qpn,
    qp_type: QpType,
    p: &ConnectParams,
    psn: u32,
    remote: &Remote,
) -> Result<(), BringUpError> {
    let mut attr = attributes(p, psn, remote);
    for (from, to) in TO_RTS {
        let fail = |error| BringUpError { qp_type, from, to, error };
        attr.qp_state = to;
        let mask = mask(qp_type, from, to).ok_or(fail(VerbsError::Inval))?;
        dev.modify_qp(qpn, &attr, mask).map_err(fail)?;
    }
    Ok(())
}

/// Connects two QPs, each in RESET, to each other: each to RTS with the other's address, QPN and
/// first PSN; `a` first, then `b`.
pub fn connect_pair<M: Memory, N: Memory>(a: End<'_, M>, b: End<'_, N>, p: &ConnectParams) -> Result<(), BringUpError> {
    let to_b = Remote { addr: b.dev.config().addr, qpn: b.qpn, psn: b.psn };
    let to_a = Remote { addr: a.dev.config().addr, qpn: a.qpn, psn: a.psn };
    bring_up(a.dev, a.qpn, a.qp_type, p, a.psn, &to_b)?;
    bring_up(b.dev, b.qpn, b.qp_type, p, b.psn, &to_a)
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::device::{DeviceConfig, QpCaps, QpInit};
    use crate::memory::VecMemory;
    use std::net::Ipv4Addr;

    fn dev(host: u8) -> Device<VecMemory> {
        Device::new(DeviceConfig::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, host)), 1), VecMemory::new())
    }

    fn qp(d: &mut Device<VecMemory>, qp_type: QpType) -> Qpn {
        let pd = d.alloc_pd(1);
        let cq = d.create_cq(16).unwrap();
        let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        d.create_qp(QpInit { qp_type, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None }).unwrap()
    }

    #[test]
    fn rc_pair_reaches_rts_facing_each_other() {
        let (mut a, mut b) = (dev(1), dev(2));
        let (qa, qb) = (qp(&mut a, QpType::Rc), qp(&mut b, QpType::Rc));
        let p = ConnectParams::default();
        let ends = (
            End { dev: &mut a, qpn: qa, qp_type: QpType::Rc, psn: 100 },
            End { dev: &mut b, qpn: qb, qp_type: QpType::Rc, psn: 5000 },
        );
        connect_pair(ends.0, ends.1, &p).unwrap();
        let ((sa, qa_attr), (sb, qb_attr)) = (a.query_qp(qa).unwrap(), b.query_qp(qb).unwrap());
        assert_eq!((sa, qa_attr.dest_qp_num, qa_attr.sq_psn, qa_attr.rq_psn), (QpState::Rts, qb.value(), 100, 5000));
        assert_eq!((sb, qb_attr.dest_qp_num, qb_attr.sq_psn, qb_attr.rq_psn), (QpState::Rts, qa.value(), 5000, 100));
        assert_eq!((qa_attr.dest, qb_attr.dest), (b.config().addr, a.config().addr));
    }

    #[test]
    fn a_second_bring_up_fails_naming_the_transition() {
        let mut a = dev(1);
        let qa = qp(&mut a, QpType::Ud);
        let p = ConnectParams { qkey: 0x1111, ..ConnectParams::default() };
        let r = Remote { addr: a.config().addr, qpn: qa, psn: 0 };
        bring_up(&mut a, qa, QpType::Ud, &p, 0, &r).unwrap();
        let e = bring_up(&mut a, qa, QpType::Ud, &p, 0, &r).unwrap_err();
        assert_eq!((e.from, e.to), (QpState::Reset, QpState::Init));
    }
}
