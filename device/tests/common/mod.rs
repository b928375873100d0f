//! Helpers of the device's integration tests (embedded.rs, application.rs, handoff.rs,
//! held_back.rs): two devices in this process on 127.0.0.1 and 127.0.0.2, a side (context, PD, CQ,
//! QP, MR) on each, and the loops that collect completions.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use softrdma_device::hca::{Hca, HcaConfig};
use softrdma_device::verbs::*;

pub const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
pub const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
pub const T: Duration = Duration::from_secs(20);

pub fn device(name: &str, addr: IpAddr, port: u16, faults: &str) -> Arc<Hca> {
    let mut c = HcaConfig::new(name, addr);
    c.port = port;
    c.faults = faults.parse().unwrap();
    c.seed = Some(port as u64);
    Arc::new(Hca::start(c).unwrap())
}

/// A device that the application's calls drive (`Progress::Application`, as a provider's) on
/// `port`; `tweak` sets the rest of its configuration.
pub fn app_device(name: &str, addr: IpAddr, port: u16, tweak: impl FnOnce(&mut HcaConfig)) -> Arc<Hca> {
    let mut c = HcaConfig::new(name, addr);
    c.port = port;
    c.progress = softrdma_device::Progress::Application;
    tweak(&mut c);
    Arc::new(Hca::start(c).unwrap())
}

/// Two application-driven devices on `port`, the first on A and the second on B, each with the
/// seed `port` and `tweak` applied to its configuration.
pub fn app_pair(names: (&str, &str), port: u16, tweak: impl Fn(&mut HcaConfig)) -> (Arc<Hca>, Arc<Hca>) {
    let dev = |name: &str, addr: IpAddr| {
        app_device(name, addr, port, |c| {
            c.seed = Some(u64::from(port));
            tweak(c)
        })
    };
    (dev(names.0, A), dev(names.1, B))
}

pub struct Side {
    pub _ctx: Context,
    pub _pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
}

pub fn side(hca: &Arc<Hca>, t: QpType) -> Side {
    let ctx = Context::embedded(hca).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 0 };
    let qp = pd.qp_builder(t, &cq).caps(caps).build().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(1 << 20, access).unwrap();
    Side { _ctx: ctx, _pd: pd, cq, qp, mr }
}

pub fn connect(a: &Side, b: &Side, mtu: Mtu) {
    let o = ConnectOptions { mtu, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(900), &o).unwrap();
    b.qp.connect(900, &a.qp.endpoint(100), &o).unwrap();
}

/// The summary of every frame of a capture (malformed frames, bad ICRCs), and how many frames.
pub fn capture_report(path: &std::path::Path) -> (softrdma_pcap::analyze::CheckReport, u64) {
    let mut report = softrdma_pcap::analyze::CheckReport::default();
    let mut n = 0;
    for r in softrdma_pcap::Reader::open(path).unwrap() {
        let r = r.unwrap();
        report.add(&softrdma_pcap::analyze::summarize(r.index, r.linktype, &r.data, r.is_truncated()));
        n += 1;
    }
    (report, n)
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub fn one(cq: &CompletionQueue) -> WorkCompletion {
    let w = cq.wait(1, T).unwrap();
    assert_eq!(w.len(), 1, "no completion within {T:?}");
    w[0]
}

/// The wr_ids of completions on `cq`, each a success, polled `batch` at a time (the polling thread
/// drives an application-driven device, as a program's polls do) until `done` says they are
/// enough; fails after T, naming `what`.
pub fn poll_successes_until(cq: &CompletionQueue, batch: u32, what: &str, done: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let mut got = Vec::new();
    let t0 = std::time::Instant::now();
    while !done(&got) {
        for w in cq.poll(batch).unwrap() {
            assert_eq!(w.status, WcStatus::Success, "{what}: {w:?}");
            got.push(w.wr_id);
        }
        assert!(t0.elapsed() < T, "{what}: not done within {T:?}, got {got:?}");
    }
    got
}

/// The wr_ids of at least `n` completions on `cq`, each a success (see [`poll_successes_until`]).
pub fn successes(cq: &CompletionQueue, n: usize, batch: u32) -> Vec<u64> {
    poll_successes_until(cq, batch, "successes", |g| g.len() >= n)
}

/// Waits on `cq` for one completion at a time, each a success, adding its wr_id to `got`, until
/// `done(got)`; each wait fails after T.
pub fn wait_successes_until(cq: &CompletionQueue, got: &mut Vec<u64>, what: &str, done: impl Fn(&[u64]) -> bool) {
    while !done(got) {
        let w = one(cq);
        assert_eq!(w.status, WcStatus::Success, "{what}: {w:?}");
        got.push(w.wr_id);
    }
}

/// What [`channel_pair`] makes.
pub struct ChannelPair {
    pub ch: CompletionChannel,
    pub cq: CompletionQueue,
    pub qa: QueuePair,
    pub qb: QueuePair,
}

/// A new RC QP pair between `a` and `b` (4 WRs, 1 SGE each), connected with `o`: a's on a's CQ,
/// b's on a new CQ of 16 with a new completion channel.
pub fn channel_pair(a: &Side, b: &Side, o: &ConnectOptions) -> ChannelPair {
    let ch = b._ctx.create_comp_channel().unwrap();
    let cq = b._ctx.create_cq(16, Some(&ch)).unwrap();
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qb = b._pd.qp_builder(QpType::Rc, &cq).caps(caps).build().unwrap();
    let qa = a._pd.qp_builder(QpType::Rc, &a.cq).caps(caps).build().unwrap();
    qa.connect(1, &qb.endpoint(2), o).unwrap();
    qb.connect(2, &qa.endpoint(1), o).unwrap();
    ChannelPair { ch, cq, qa, qb }
}

/// A new QP pair between `a` and `b` ([`channel_pair`]): a thread asleep on
/// that channel (the CQ armed first; with `poll_first`, polled empty just before) wakes for a's
/// SEND and finds its receive completed.
pub fn channel_sleeper_wakes(a: &Side, b: &Side, o: &ConnectOptions, poll_first: bool) {
    let ChannelPair { ch, cq, qa, qb } = channel_pair(a, b, o);
    qb.post_recv(vec![RecvWr { wr_id: 7, sg_list: vec![b.mr.sge(300_000..300_064)] }]).unwrap();
    if poll_first {
        assert!(cq.poll(4).unwrap().is_empty());
    }
    cq.req_notify(false).unwrap();
    let sleeper = std::thread::spawn(move || {
        let got = ch.get_cq_event(Some(T)).unwrap();
        let w = cq.poll(4).unwrap();
        (got.is_some(), w.len(), w.first().map(|w| (w.wr_id, w.status)))
    });
    std::thread::sleep(Duration::from_millis(50));
    qa.post_send(vec![SendWr::new(8, SendOp::Send, vec![a.mr.sge(0..64)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(sleeper.join().unwrap(), (true, 1, Some((7, WcStatus::Success))));
}
