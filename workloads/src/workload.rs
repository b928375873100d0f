//! Workloads on the simulated wire: two engine devices, Q connected RC QP pairs, N messages of
//! chosen operations and sizes, under seeded faults; then the runner checks, against what was
//! posted, that nothing was lost, duplicated, reordered or corrupted. `softrdma sim` prints its
//! [`Report`]; the property tests assert on it.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use softrdma_engine::connect::{connect_pair, ConnectParams, End};
use softrdma_engine::device::{Counters, CqId, Device, DeviceConfig, MrKeys, QpCaps, QpInit};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::rng::Rng;
use softrdma_engine::time::Duration;
use softrdma_engine::verbs::{Access, Mtu, QpType, WcOpcode, WcStatus};
use softrdma_engine::wire::Qpn;
use softrdma_engine::wr::{RecvWr, SendOp, SendWr, Sge, WorkCompletion};
use softrdma_transport::faults::Faults;
use softrdma_transport::sim::{LinkConfig, WireStats};

use crate::node::{simulate, DeviceNode};

/// An operation a workload mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// SEND into a posted receive.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// Atomic FETCH_ADD on a per-QP counter.
    Atomic,
}

impl Op {
    /// Parses "send", "write", "read" or "atomic".
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "send" => Op::Send,
            "write" => Op::Write,
            "read" => Op::Read,
            "atomic" => Op::Atomic,
            _ => return None,
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Operations to mix (chosen per message by the seeded RNG).
    pub ops: Vec<Op>,
    /// Messages in all (spread over the QPs round-robin).
    pub messages: u32,
    /// Message size range in bytes (inclusive); atomics are always 8.
    pub size: (u32, u32),
    /// Connected QP pairs.
    pub qps: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// Seed of the workload, the devices and the wire.
    pub seed: u64,
    /// The wire's faults.
    pub faults: Faults,
    /// The wire's link.
    pub link: LinkConfig,
    /// Transport retries.
    pub retry_cnt: u8,
    /// Local ACK timeout code.
    pub timeout: u8,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            ops: vec![Op::Send, Op::Write, Op::Read, Op::Atomic],
            messages: 100,
            size: (1, 4096),
            qps: 2,
            mtu: Mtu::Mtu1024,
            seed: 1,
            faults: Faults::default(),
            link: LinkConfig { latency: Duration::from_micros(5), jitter: Duration::ZERO, bandwidth_bits_per_sec: 0 },
            retry_cnt: 7,
            timeout: 12,
        }
    }
}

/// The NAKs the two devices sent, by kind (a PSN sequence error, RNR, invalid request, remote
/// access and remote operational error), into `report.naks_sent`.
pub(crate) fn count_naks_sent(report: &mut Report, c0: &Counters, c1: &Counters) {
    let (a, b) = (c0.naks_sent, c1.naks_sent);
    report.naks_sent.insert("psn_sequence".into(), a.psn_sequence + b.psn_sequence);
    report.naks_sent.insert("rnr".into(), c0.send_rnr_err + c1.send_rnr_err);
    report.naks_sent.insert("invalid_request".into(), a.invalid_request + b.invalid_request);
    report.naks_sent.insert("remote_access".into(), a.remote_access + b.remote_access);
    report.naks_sent.insert("remote_operational".into(), a.remote_operational + b.remote_operational);
}

/// What happened, checked against what was posted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Work requests posted (send side).
    pub posted: u64,
    /// Completed successfully.
    pub completed_ok: u64,
    /// Completed in error, by status name.
    pub completed_err: BTreeMap<String, u64>,
    /// Payload bytes compared and found right (SEND and WRITE targets, READ results).
    pub bytes_verified: u64,
    /// Posted work requests that never completed, and SENDs/WRITEs completed OK whose data never
    /// arrived.
    pub lost: u64,
    /// Work requests or receives completed more than once, and atomics executed more than once.
    pub duplicated: u64,
    /// Completions out of posting order on a queue.
    pub out_of_order: u64,
    /// Successful completions whose data differs from what was sent.
    pub corrupted_delivered: u64,
    /// Packets the requesters sent again.
    pub retransmitted_packets: u64,
    /// NAKs sent: PSN sequence, RNR, invalid request, remote access, remote operational.
    pub naks_sent: BTreeMap<String, u64>,
    /// Times a requester went back to resend (a PSN sequence NAK, an implicit NAK or the local
    /// ACK timeout), each spending one transport retry.
    pub retries: u64,
    /// PSN sequence NAKs the requesters received and acted on or ignored.
    pub seq_naks_received: u64,
    /// Times a requester's local ACK timer expired (each one of `retries`).
    pub ack_timeouts: u64,
    /// Virtual time the run took.
    pub virtual_time_ns: u64,
    /// The wire's counters.
    pub wire: WireStats,
    /// Packets the devices dropped for a bad ICRC.
    pub icrc_dropped: u64,
    /// Every broken invariant, in words.
    pub violations: Vec<String>,
}

impl Report {
    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Why a workload could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// A parameter is out of range; the text says which.
    #[error("invalid workload: {0}")]
    Invalid(String),
}

const OWNER: u32 = 1;
const BASE: u64 = 0x10_0000;

struct Posted {
    qp: usize,
    op: Op,
    wr_id: u64,
    len: u32,
    /// Offset of the message's slot (same on both sides).
    slot: u64,
    add: u64,
}

fn status_name(s: WcStatus) -> String {
    format!("{s:?}")
}

/// Runs a workload. Errors only for parameters out of range; broken invariants are in the
/// report's `violations`.
pub fn run(w: &Workload) -> Result<Report, WorkloadError> {
    if w.ops.is_empty() || w.qps == 0 || w.size.0 > w.size.1 {
        return Err(WorkloadError::Invalid("ops, qps and size MIN..MAX must be non-empty".into()));
    }
    if w.size.1 > 1 << 20 {
        return Err(WorkloadError::Invalid("message size above 1 MiB".into()));
    }
    let per_qp = w.messages.div_ceil(w.qps);
    if per_qp > 8192 {
        return Err(WorkloadError::Invalid("more than 8192 messages per QP".into()));
    }
    let slot = u64::from(w.size.1.max(8)).next_multiple_of(64);
    let mem_len = slot * u64::from(w.messages.max(1)) + 64 * u64::from(w.qps) + 4096;
    if mem_len > 1 << 30 {
        return Err(WorkloadError::Invalid("messages x size above 1 GiB".into()));
    }
    let mk = |addr: IpAddr, seed: u64| {
        let mut m = VecMemory::new();
        m.add(OWNER, BASE, mem_len as usize);
        let mut cfg = DeviceConfig::new(addr, seed);
        cfg.mtu = Mtu::Mtu4096;
        DeviceNode::new(Device::new(cfg, m))
    };
    let addrs = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))];
    let mut nodes = vec![mk(addrs[0], w.seed ^ 0xa), mk(addrs[1], w.seed ^ 0xb)];
    // Objects: one PD, MR over all memory, and per QP pair a CQ on each side.
    let depth = per_qp.max(1);
    let mut pairs: Vec<[(Qpn, CqId); 2]> = Vec::new();
    let mut mrs = [MrKeys { lkey: 0, rkey: 0 }; 2];
    let mut pds = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate() {
        let pd = n.dev.alloc_pd(OWNER);
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        mrs[i] = n.dev.reg_mr(pd, BASE, mem_len, all).map_err(|e| WorkloadError::Invalid(e.to_string()))?;
        pds.push(pd);
    }
    for _ in 0..w.qps {
        let mut pair = [(Qpn::new(0), CqId(0)); 2];
        for (i, n) in nodes.iter_mut().enumerate() {
            let cq = n.dev.create_cq((2 * depth + 2).min(32767)).map_err(|e| WorkloadError::Invalid(e.to_string()))?;
            let caps =
                QpCaps { max_send_wr: depth, max_recv_wr: depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
            let init = QpInit {
                qp_type: QpType::Rc,
                pd: pds[i],
                send_cq: cq,
                recv_cq: cq,
                caps,
                sq_sig_all: false,
                srq: None,
            };
            let qpn = n.dev.create_qp(init).map_err(|e| WorkloadError::Invalid(e.to_string()))?;
            pair[i] = (qpn, cq);
        }
        pairs.push(pair);
    }
    let mut rng = Rng::new(w.seed);
    let params = ConnectParams {
        mtu: w.mtu,
        timeout: w.timeout,
        retry_cnt: w.retry_cnt,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..ConnectParams::default()
    };
    for (q, pair) in pairs.iter().enumerate() {
        let [a, b] = &mut nodes[..] else { unreachable!("two nodes") };
        let psn = 0x1000 * (q as u32 + 1);
        connect_pair(
            End { dev: &mut a.dev, qpn: pair[0].0, qp_type: QpType::Rc, psn },
            End { dev: &mut b.dev, qpn: pair[1].0, qp_type: QpType::Rc, psn: psn + 1 },
            &params,
        )
        .map_err(|e| WorkloadError::Invalid(format!("QP {q}: {e}")))?;
    }
    // The per-QP atomic counters live after the message slots.
    let counter = |q: usize| BASE + slot * u64::from(w.messages) + 64 * q as u64;
    // Post: message i goes on QP i % qps, from A (side 0) to B.
    let mut posted = Vec::new();
    for i in 0..w.messages {
        let q = (i % w.qps) as usize;
        let op = w.ops[rng.next_u64() as usize % w.ops.len()];
        let len =
            if op == Op::Atomic { 8 } else { w.size.0 + (rng.next_u64() % u64::from(w.size.1 - w.size.0 + 1)) as u32 };
        let off = slot * u64::from(i);
        let wr_id = u64::from(i) + 1;
        let pat = pattern(i, len);
        let (qa, _) = pairs[q][0];
        let (qb, _) = pairs[q][1];
        let add = u64::from(i) + 1;
        match op {
            Op::Send | Op::Write => nodes[0].dev.memory().set(OWNER, BASE + off, &pat),
            Op::Read => nodes[1].dev.memory().set(OWNER, BASE + off, &pat),
            Op::Atomic => {}
        }
        if op == Op::Send {
            let r = RecvWr { wr_id, sg_list: vec![Sge { addr: BASE + off, length: len, lkey: mrs[1].lkey }] };
            nodes[1].dev.post_recv(qb, r).map_err(|e| WorkloadError::Invalid(e.to_string()))?;
        }
        let sop = match op {
            Op::Send => SendOp::Send,
            Op::Write => SendOp::Write { remote_addr: BASE + off, rkey: mrs[1].rkey },
            Op::Read => SendOp::Read { remote_addr: BASE + off, rkey: mrs[1].rkey },
            Op::Atomic => SendOp::FetchAdd { remote_addr: counter(q), rkey: mrs[1].rkey, add },
        };
        let mut wr = SendWr::new(wr_id, sop, vec![Sge { addr: BASE + off, length: len, lkey: mrs[0].lkey }]);
        // Every fourth request is unsignaled: errors must still complete it.
        wr.signaled = i % 4 != 3;
        nodes[0].dev.post_send(qa, wr).map_err(|e| WorkloadError::Invalid(e.to_string()))?;
        posted.push(Posted { qp: q, op, wr_id, len, slot: off, add });
    }
    let mut report = Report { posted: posted.len() as u64, ..Report::default() };
    let mut nodes = simulate(nodes, w, &mut report);
    // Collect completions per QP pair.
    for (q, pair) in pairs.iter().enumerate() {
        let mine: Vec<&Posted> = posted.iter().filter(|p| p.qp == q).collect();
        let send_wcs: Vec<WorkCompletion> = nodes[0].dev.poll_cq(pair[0].1, usize::MAX);
        let recv_wcs: Vec<WorkCompletion> = nodes[1].dev.poll_cq(pair[1].1, usize::MAX);
        check_qp(&mut report, &mut nodes, q, *pair, &mine, &send_wcs, &recv_wcs, counter(q));
    }
    let c0: Counters = *nodes[0].dev.counters();
    let c1: Counters = *nodes[1].dev.counters();
    report.retransmitted_packets = c0.retransmitted_pkts + c1.retransmitted_pkts;
    report.retries = c0.completer_retry_err + c1.completer_retry_err;
    report.seq_naks_received = c0.rcvd_seq_err + c1.rcvd_seq_err;
    report.ack_timeouts = c0.local_ack_timeout_err + c1.local_ack_timeout_err;
    report.icrc_dropped = c0.icrc_err + c1.icrc_err;
    count_naks_sent(&mut report, &c0, &c1);
    if report.corrupted_delivered > 0 {
        report.violations.push(format!("{} completions delivered corrupted data", report.corrupted_delivered));
    }
    Ok(report)
}

fn pattern(i: u32, len: u32) -> Vec<u8> {
    let mut r = Rng::new(u64::from(i) * 0x9e37_79b9 + 17);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

#[allow(clippy::too_many_arguments)]
fn check_qp(
    r: &mut Report,
    nodes: &mut [DeviceNode],
    q: usize,
    qp_of: [(Qpn, CqId); 2],
    mine: &[&Posted],
    send_wcs: &[WorkCompletion],
    recv_wcs: &[WorkCompletion],
    counter_addr: u64,
) {
    // Send completions: in posting order, at most once each; unsignaled successes are silent.
    let mut seen = std::collections::HashSet::new();
    let mut last_idx: Option<usize> = None;
    let mut status_of: BTreeMap<u64, WcStatus> = BTreeMap::new();
    let mut first_error: Option<WcStatus> = None;
    for wc in send_wcs {
        if !seen.insert(wc.wr_id) {
            r.duplicated += 1;
            r.violations.push(format!("QP {q}: wr {} completed twice", wc.wr_id));
            continue;
        }
        let idx = mine.iter().position(|p| p.wr_id == wc.wr_id);
        if let (Some(i), Some(l)) = (idx, last_idx) {
            if i < l {
                r.out_of_order += 1;
                r.violations.push(format!("QP {q}: wr {} completed out of order", wc.wr_id));
            }
        }
        last_idx = idx.or(last_idx);
        status_of.insert(wc.wr_id, wc.status);
        if wc.status == WcStatus::Success {
            r.completed_ok += 1;
        } else {
            *r.completed_err.entry(status_name(wc.status)).or_default() += 1;
            match first_error {
                None => {
                    first_error = Some(wc.status);
                    if !matches!(wc.status, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr) {
                        r.violations.push(format!("QP {q}: first error is {:?}, not a retry exhaustion", wc.status));
                    }
                }
                Some(_) if wc.status != WcStatus::WrFlushErr => {
                    r.violations
                        .push(format!("QP {q}: after the first error, {:?} instead of WR_FLUSH_ERR", wc.status));
                }
                _ => {}
            }
        }
    }
    // Every posted WR was retired: with a completion, or silently if unsignaled and successful
    // (an unsignaled WR that failed would have completed: errors always do, IBTA 10.7.2.1).
    let (qpn, _) = qp_of[0];
    let left = nodes[0].dev.send_queue_len(qpn).unwrap_or(0);
    if left > 0 {
        r.lost += left as u64;
        r.violations.push(format!("QP {q}: {left} work requests never completed"));
    }
    for p in mine {
        let status = match status_of.get(&p.wr_id) {
            Some(s) => *s,
            None if (p.wr_id - 1) % 4 == 3 => {
                r.completed_ok += 1;
                WcStatus::Success
            }
            None => {
                if left == 0 {
                    r.lost += 1;
                    r.violations.push(format!("QP {q}: signaled wr {} retired without a completion", p.wr_id));
                }
                continue;
            }
        };
        if status != WcStatus::Success {
            continue;
        }
        let want = pattern(p.wr_id as u32 - 1, p.len);
        let got = match p.op {
            Op::Send | Op::Write => Some(nodes[1].dev.memory().get(OWNER, BASE + p.slot, p.len as usize)),
            Op::Read => Some(nodes[0].dev.memory().get(OWNER, BASE + p.slot, p.len as usize)),
            Op::Atomic => None,
        };
        if let Some(got) = got {
            if got == want {
                r.bytes_verified += u64::from(p.len);
            } else {
                r.corrupted_delivered += 1;
            }
        }
    }
    // Receives: one per SEND, in order, each with the right length.
    let sends: Vec<&&Posted> = mine.iter().filter(|p| p.op == Op::Send).collect();
    let mut rseen = std::collections::HashSet::new();
    let mut expect = sends.iter();
    for wc in recv_wcs {
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                r.violations.push(format!("QP {q}: receive completed with {:?}", wc.status));
            }
            continue;
        }
        if !rseen.insert(wc.wr_id) {
            r.duplicated += 1;
            r.violations.push(format!("QP {q}: receive {} completed twice", wc.wr_id));
            continue;
        }
        match expect.next() {
            Some(p) if p.wr_id == wc.wr_id => {
                if wc.opcode != WcOpcode::Recv || wc.byte_len != p.len {
                    r.violations.push(format!("QP {q}: receive {} has length {}", wc.wr_id, wc.byte_len));
                }
            }
            _ => {
                r.out_of_order += 1;
                r.violations.push(format!("QP {q}: receive {} out of order", wc.wr_id));
            }
        }
    }
    // Atomics: the counter holds the sum of the adds of the FETCH_ADDs that succeeded, each
    // executed exactly once.
    if first_error.is_none() {
        let sum: u64 = mine.iter().filter(|p| p.op == Op::Atomic).map(|p| p.add).sum();
        let got = u64::from_ne_bytes(nodes[1].dev.memory().get(OWNER, counter_addr, 8).try_into().unwrap_or([0; 8]));
        if got != sum {
            r.duplicated += u64::from(got > sum);
            r.lost += u64::from(got < sum);
            r.violations.push(format!("QP {q}: atomic counter {got}, expected {sum}"));
        }
    }
}
