//! Helpers of the device's integration tests (embedded.rs, application.rs): two devices in this
//! process on 127.0.0.1 and 127.0.0.2, a side (context, PD, CQ, QP, MR) on each.
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
