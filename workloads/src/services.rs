//! Workloads for the other transports on the simulated wire: XRC fan-in (N initiator QPs on one
//! node send to M XRC SRQs of one domain on the other, each initiator through its own target QP),
//! UD and UC. A SEND carries its message's number in its immediate data (SEND with immediate), so
//! the runner can tell which message landed in which receive buffer whatever its length (zero
//! included); an RDMA operation's message is the place it targets.
//!
//! Operations: SEND on every service; RDMA WRITE, READ and FETCH_ADD through XRC (initiator to
//! target QP, the target's PD being the one of the SRQ the request names); RDMA WRITE on UC.
//!
//! What is checked:
//! - XRC (reliable): every message exactly once, in order per initiator, in an SRQ it was sent
//!   to, with its data intact; a WRITE's data in place and a READ's in the initiator's buffer
//!   once they completed; each initiator's FETCH_ADD counter holds the sum of its adds (each
//!   executed once); errors only as the RC rules order them.
//! - UD: no PSN check, so a duplicated datagram arrives twice and a lost one never; the runner
//!   checks that the datagrams delivered are exactly the ones the wire delivered intact (corrupted
//!   copies fail the ICRC), and that none is corrupted.
//! - UC: a message with a lost, corrupted or out-of-order packet is dropped; a duplicated
//!   single-packet message may be delivered twice (a FIRST/ONLY is accepted whatever its PSN). A
//!   dropped WRITE may have placed its first packets (IBTA 9.8.3.2.1 lets the data already
//!   placed stay). Checked: nothing delivered that was not sent, nothing corrupted (a WRITE's
//!   target holds only its own bytes or untouched ones), and without faults every message exactly
//!   once and every WRITE whole.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use softrdma_engine::connect::{connect_pair, ConnectParams, End};
use softrdma_engine::device::{CqId, Device, DeviceConfig, QpCaps, QpInit, SrqAttr, GRH_SLOT};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::rng::Rng;
use softrdma_engine::verbs::{Access, Mtu, QpType, WcOpcode, WcStatus};
use softrdma_engine::wire::Qpn;
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge, UdDest};

use crate::node::{simulate, DeviceNode};
use crate::workload::{count_naks_sent, Op, Report, Workload, WorkloadError};

const OWNER: u32 = 1;
const BASE: u64 = 0x10_0000;

/// The service a workload runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// XRC: `initiators` INI QPs to `srqs` XRC SRQs of one domain.
    Xrc {
        /// INI QPs on the sending node (one TGT QP each on the receiving node).
        initiators: u32,
        /// XRC SRQs on the receiving node.
        srqs: u32,
    },
    /// Unreliable datagram.
    Ud,
    /// Unreliable connected.
    Uc,
}

fn message(i: u32, len: u32) -> Vec<u8> {
    let mut r = Rng::new(u64::from(i) * 0x9e37_79b9 + 99);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

/// The operations a service's workload mixes.
fn allowed(service: Service) -> &'static [Op] {
    match service {
        Service::Xrc { .. } => &[Op::Send, Op::Write, Op::Read, Op::Atomic],
        Service::Uc => &[Op::Send, Op::Write],
        Service::Ud => &[Op::Send],
    }
}

/// Runs a workload on another service: the operations of [`allowed`] for it, sizes from 0 to
/// 1 MiB (at most the MTU for UD).
pub fn run_service(w: &Workload, service: Service) -> Result<Report, WorkloadError> {
    if w.ops.is_empty() || w.size.0 > w.size.1 || w.size.1 > 1 << 20 {
        return Err(WorkloadError::Invalid("ops must be non-empty and sizes MIN..MAX within 0..=1 MiB".into()));
    }
    let allowed = allowed(service);
    if let Some(op) = w.ops.iter().find(|o| !allowed.contains(o)) {
        return Err(WorkloadError::Invalid(format!(
            "{op:?} is not part of the {service:?} workload (use {allowed:?})"
        )));
    }
    if service == Service::Ud && w.size.1 as usize > w.mtu.bytes() {
        return Err(WorkloadError::Invalid("UD messages must fit the MTU".into()));
    }
    let (nq, nsrq) = match service {
        Service::Xrc { initiators, srqs } => (initiators.max(1), srqs.max(1)),
        _ => (w.qps.max(1), 0),
    };
    let slot = u64::from(w.size.1.max(8)).next_multiple_of(64) + GRH_SLOT as u64;
    // Receive buffers: two per message (duplicates), plus the send buffers (the RDMA targets on
    // the other side), plus a FETCH_ADD counter per initiator.
    let mem_len = slot * u64::from(w.messages.max(1)) * 3 + 64 * u64::from(nq) + 4096;
    if mem_len > 1 << 30 {
        return Err(WorkloadError::Invalid("messages x size above 1 GiB".into()));
    }
    let addrs = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))];
    let mut nodes: Vec<DeviceNode> = (0..2)
        .map(|i| {
            let mut m = VecMemory::new();
            m.add(OWNER, BASE, mem_len as usize);
            let mut cfg = DeviceConfig::new(addrs[i], w.seed ^ (0xa + i as u64));
            cfg.mtu = Mtu::Mtu4096;
            DeviceNode::new(Device::new(cfg, m))
        })
        .collect();
    let err = |e: softrdma_engine::verbs::VerbsError| WorkloadError::Invalid(e.to_string());
    let per_q = w.messages.div_ceil(nq).max(1);
    let depth = (per_q * 2 + 2).min(16384);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut pds = Vec::new();
    let mut keys = Vec::new();
    for n in nodes.iter_mut() {
        let pd = n.dev.alloc_pd(OWNER);
        keys.push(n.dev.reg_mr(pd, BASE, mem_len, all).map_err(err)?);
        pds.push(pd);
    }
    // Receiving side objects.
    let recv_cq: CqId = nodes[1].dev.create_cq(32767).map_err(err)?;
    let send_cq: CqId = nodes[0].dev.create_cq(32767).map_err(err)?;
    let (qtype_a, qtype_b) = match service {
        Service::Xrc { .. } => (QpType::XrcIni, QpType::XrcTgt),
        Service::Ud => (QpType::Ud, QpType::Ud),
        Service::Uc => (QpType::Uc, QpType::Uc),
    };
    let mut srqs = Vec::new();
    let mut xrcd = None;
    if let Service::Xrc { .. } = service {
        let x = nodes[1].dev.open_xrcd(OWNER, Some(1), true, false).map_err(err)?;
        for _ in 0..nsrq {
            let attr = SrqAttr { max_wr: (w.messages * 2 + 2).min(16384), max_sge: 1, srq_limit: 0 };
            srqs.push(nodes[1].dev.create_xrc_srq(x, pds[1], recv_cq, attr).map_err(err)?);
        }
        xrcd = Some(x);
    }
    let params = ConnectParams {
        mtu: w.mtu,
        access: all,
        qkey: 0x1111,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        timeout: w.timeout,
        retry_cnt: w.retry_cnt,
        ..ConnectParams::default()
    };
    let caps = QpCaps { max_send_wr: depth, max_recv_wr: depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let mut qps: Vec<(Qpn, Qpn)> = Vec::new();
    for q in 0..nq {
        let qa = nodes[0]
            .dev
            .create_qp(QpInit {
                qp_type: qtype_a,
                pd: pds[0],
                send_cq,
                recv_cq: send_cq,
                caps,
                sq_sig_all: false,
                srq: None,
            })
            .map_err(err)?;
        let qb = match xrcd {
            Some(x) => nodes[1].dev.create_xrc_tgt_qp(OWNER, x).map_err(err)?.0,
            None => nodes[1]
                .dev
                .create_qp(QpInit {
                    qp_type: qtype_b,
                    pd: pds[1],
                    send_cq: recv_cq,
                    recv_cq,
                    caps,
                    sq_sig_all: false,
                    srq: None,
                })
                .map_err(err)?,
        };
        let psn = 0x100 * (q + 1);
        let [a, b] = &mut nodes[..] else { unreachable!("two nodes") };
        connect_pair(
            End { dev: &mut a.dev, qpn: qa, qp_type: qtype_a, psn },
            End { dev: &mut b.dev, qpn: qb, qp_type: qtype_b, psn: 0 },
            &params,
        )
        .map_err(|e| WorkloadError::Invalid(e.to_string()))?;
        qps.push((qa, qb));
    }
    // Post: message i on QP i % nq (to SRQ by the RNG for XRC).
    let mut rng = Rng::new(w.seed);
    let mut sent: Vec<(u32, usize, Op, u32, Option<usize>)> = Vec::new(); // (msg, qp, op, len, srq)
    let recv_base = BASE + slot * u64::from(w.messages);
    let recv_slots = u64::from(w.messages) * 2;
    let counter = |q: usize| recv_base + recv_slots * slot + 64 * q as u64;
    let mut recv_slot = 0u64;
    let mut srq_of_buffer: BTreeMap<u64, usize> = BTreeMap::new();
    for i in 0..w.messages {
        let q = (i % nq) as usize;
        let op = w.ops[rng.next_u64() as usize % w.ops.len()];
        let len = w.size.0 + (rng.next_u64() % u64::from(w.size.1 - w.size.0 + 1)) as u32;
        let len = if op == Op::Atomic { 8 } else { len };
        let srq = (!srqs.is_empty()).then(|| (rng.next_u64() % srqs.len() as u64) as usize);
        let off = BASE + slot * u64::from(i);
        match op {
            Op::Send | Op::Write => nodes[0].dev.memory().set(OWNER, off, &message(i, len)),
            Op::Read => nodes[1].dev.memory().set(OWNER, off, &message(i, len)),
            Op::Atomic => {}
        }
        // Receive buffers: one per SEND on XRC, two on UD and UC (a duplicate may arrive). The
        // receive's wr_id is its buffer's index.
        let copies = match (op, service) {
            (Op::Send, Service::Xrc { .. }) => 1,
            (Op::Send, _) => 2,
            _ => 0,
        };
        for _ in 0..copies {
            if let Some(s) = srq {
                srq_of_buffer.insert(recv_slot, s);
            }
            let addr = recv_base + recv_slot * slot;
            let wr = RecvWr { wr_id: recv_slot, sg_list: vec![Sge { addr, length: slot as u32, lkey: keys[1].lkey }] };
            recv_slot += 1;
            match srq {
                Some(s) => nodes[1].dev.post_srq_recv(srqs[s], wr).map_err(err)?,
                None => nodes[1].dev.post_recv(qps[q].1, wr).map_err(err)?,
            }
        }
        let rkey = keys[1].rkey;
        let sop = match op {
            Op::Send => SendOp::SendWithImm { imm: i + 1 },
            Op::Write => SendOp::Write { remote_addr: off, rkey },
            Op::Read => SendOp::Read { remote_addr: off, rkey },
            Op::Atomic => SendOp::FetchAdd { remote_addr: counter(q), rkey, add: u64::from(i) + 1 },
        };
        let mut wr = SendWr::new(u64::from(i) + 1, sop, vec![Sge { addr: off, length: len, lkey: keys[0].lkey }]);
        if let Some(s) = srq {
            // Every XRC request names an SRQ: the target QP's PD for RDMA is that SRQ's.
            wr.remote_srqn = srqs[s];
        }
        if service == Service::Ud {
            wr.ud = Some(UdDest { dest: addrs[1], remote_qpn: qps[q].1.value(), remote_qkey: 0x1111 });
        }
        nodes[0].dev.post_send(qps[q].0, wr).map_err(err)?;
        sent.push((i, q, op, len, srq));
    }
    let mut report = Report { posted: sent.len() as u64, ..Report::default() };
    let mut nodes = simulate(nodes, w, &mut report);
    // Send side: completions in order per QP; errors only as the reliable rules order them.
    let swc = nodes[0].dev.poll_cq(send_cq, usize::MAX);
    for wc in &swc {
        if wc.status == WcStatus::Success {
            report.completed_ok += 1;
        } else {
            *report.completed_err.entry(format!("{:?}", wc.status)).or_default() += 1;
        }
    }
    // All requests are signaled here; per QP they complete in posting order.
    let mut last: BTreeMap<Qpn, u64> = BTreeMap::new();
    for wc in &swc {
        if let Some(l) = last.insert(wc.qp_num, wc.wr_id) {
            if l >= wc.wr_id {
                report.out_of_order += 1;
                report.violations.push(format!("send completion {} after {}", wc.wr_id, l));
            }
        }
    }
    // RDMA operations that completed: their data in place. On UC a WRITE that was dropped may
    // have placed its first packets: every byte is its own or untouched, and on a perfect wire
    // all of it is there.
    let perfect = w.faults.loss + w.faults.duplicate + w.faults.reorder + w.faults.corrupt == 0.0;
    let status: BTreeMap<u64, WcStatus> = swc.iter().map(|c| (c.wr_id, c.status)).collect();
    let mut failed_qps = std::collections::BTreeSet::new();
    for &(i, q, op, len, _) in &sent {
        let st = status.get(&(u64::from(i) + 1)).copied();
        if st.is_some_and(|s| s != WcStatus::Success) {
            failed_qps.insert(q);
        }
        if st != Some(WcStatus::Success) || !matches!(op, Op::Write | Op::Read) {
            continue;
        }
        let off = BASE + slot * u64::from(i);
        let want = message(i, len);
        let got = match op {
            Op::Write => nodes[1].dev.memory().get(OWNER, off, len as usize),
            _ => nodes[0].dev.memory().get(OWNER, off, len as usize),
        };
        if got == want {
            report.bytes_verified += u64::from(len);
        } else if service == Service::Uc && !perfect && got.iter().zip(&want).all(|(g, w)| *g == 0 || g == w) {
            // Dropped on the way: what landed is its own.
        } else {
            report.corrupted_delivered += 1;
            report.violations.push(format!("{op:?} {i}: the data differs from what was sent"));
        }
    }
    // FETCH_ADD counters: the sum of the initiator's adds, each executed exactly once (when none
    // of its requests failed: a failed one may or may not have executed).
    for q in 0..nq as usize {
        let adds: Vec<u64> =
            sent.iter().filter(|s| s.1 == q && s.2 == Op::Atomic).map(|s| u64::from(s.0) + 1).collect();
        if adds.is_empty() || failed_qps.contains(&q) {
            continue;
        }
        let want: u64 = adds.iter().sum();
        let got = u64::from_ne_bytes(nodes[1].dev.memory().get(OWNER, counter(q), 8).try_into().unwrap_or([0; 8]));
        if got != want {
            report.duplicated += u64::from(got > want);
            report.lost += u64::from(got < want);
            report.violations.push(format!("initiator {q}: FETCH_ADD counter {got}, expected {want}"));
        }
    }
    // Receive side: which message landed in each completed receive buffer.
    let rwc = nodes[1].dev.poll_cq(recv_cq, usize::MAX);
    let mut delivered: BTreeMap<u32, u64> = BTreeMap::new();
    let mut per_qp_last: BTreeMap<(usize, Qpn), u32> = BTreeMap::new();
    for wc in &rwc {
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                report.violations.push(format!("receive completed with {:?}", wc.status));
            }
            continue;
        }
        let buf = recv_base + (wc.wr_id) * slot;
        let data_off = if wc.grh { GRH_SLOT as u64 } else { 0 };
        let len = wc.byte_len.saturating_sub(if wc.grh { GRH_SLOT as u32 } else { 0 });
        let id = wc.imm.map_or(0, u64::from);
        let Some(&(i, q, _, slen, srq)) =
            id.checked_sub(1).and_then(|m| sent.get(m as usize)).filter(|s| s.2 == Op::Send)
        else {
            report.corrupted_delivered += 1;
            report.violations.push(format!("receive buffer {} holds no message that was sent", wc.wr_id));
            continue;
        };
        let got = nodes[1].dev.memory().get(OWNER, buf + data_off, len as usize);
        if len != slen || got != message(i, slen) || wc.opcode != WcOpcode::Recv {
            report.corrupted_delivered += 1;
            report.violations.push(format!("message {i} delivered corrupted"));
            continue;
        }
        report.bytes_verified += u64::from(len);
        if let Some(s) = srq {
            // The right SRQ: the buffer that took it was posted to the SRQ the message named.
            if srq_of_buffer.get(&wc.wr_id) != Some(&s) {
                report.violations.push(format!("message {i} landed in an SRQ it was not sent to"));
            }
        }
        *delivered.entry(i).or_default() += 1;
        if matches!(service, Service::Xrc { .. }) {
            let key = (q, wc.qp_num);
            if per_qp_last.get(&key).is_some_and(|&l| l >= i) {
                report.out_of_order += 1;
                report.violations.push(format!("message {i} out of order on initiator {q}"));
            }
            per_qp_last.insert(key, i);
        }
    }
    let sends = sent.iter().filter(|s| s.2 == Op::Send).count() as u64;
    let unique = delivered.len() as u64;
    let total: u64 = delivered.values().sum();
    report.lost = sends - unique.min(sends);
    report.duplicated = total - unique;
    let c1 = *nodes[1].dev.counters();
    report.icrc_dropped = c1.icrc_err + nodes[0].dev.counters().icrc_err;
    let c0 = *nodes[0].dev.counters();
    report.retransmitted_packets = c0.retransmitted_pkts;
    report.retries = c0.completer_retry_err;
    report.seq_naks_received = c0.rcvd_seq_err;
    report.ack_timeouts = c0.local_ack_timeout_err;
    count_naks_sent(&mut report, &c0, &c1);
    match service {
        Service::Xrc { .. } => {
            let errs: u64 = report.completed_err.values().sum();
            if errs == 0 {
                if report.lost > 0 || report.duplicated > 0 {
                    report.violations.push(format!("XRC lost {} and duplicated {}", report.lost, report.duplicated));
                }
                if report.completed_ok != report.posted {
                    report.violations.push(format!("{} of {} requests completed", report.completed_ok, report.posted));
                }
            }
        }
        Service::Ud => {
            // Every intact datagram the wire delivered arrived; nothing else did.
            let intact = report.wire.delivered.saturating_sub(c1.icrc_err);
            if total != intact {
                report.violations.push(format!("UD delivered {total} datagrams, the wire delivered {intact} intact"));
            }
        }
        Service::Uc => {
            if perfect && (report.lost > 0 || report.duplicated > 0) {
                report.violations.push("UC lost or duplicated a message on a perfect wire".into());
            }
        }
    }
    Ok(report)
}
