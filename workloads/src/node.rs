//! An engine device as a node of the simulated wire, and the run of a set of them to quiescence.

use std::net::{IpAddr, SocketAddr};

use softrdma_engine::device::{Device, RecvMeta};
use softrdma_engine::memory::VecMemory;
use softrdma_engine::time::{Duration, Instant};
use softrdma_engine::wire::ROCE_V2_PORT;
use softrdma_transport::sim::{Datagram, Endpoint, Limits, Sim, SimError};

use crate::workload::{Report, Workload};

/// An engine device as a node of the simulated wire.
pub struct DeviceNode {
    /// The device.
    pub dev: Device<VecMemory>,
    buf: Vec<u8>,
}

impl DeviceNode {
    /// Wraps a device.
    pub fn new(dev: Device<VecMemory>) -> DeviceNode {
        DeviceNode { dev, buf: vec![0; 8192] }
    }
}

impl Endpoint for DeviceNode {
    fn addr(&self) -> IpAddr {
        self.dev.config().addr
    }

    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        let meta = RecvMeta { src: d.src.ip(), src_port: d.src.port(), ip_id: None, dst: Some(d.dst.ip()) };
        self.dev.handle_packet(now, meta, &d.payload);
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        let t = self.dev.poll_transmit(now, &mut self.buf)?;
        Some(Datagram {
            src: SocketAddr::new(self.dev.config().addr, t.src_port),
            dst: SocketAddr::new(t.dst, ROCE_V2_PORT),
            payload: self.buf[..t.len].to_vec(),
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.dev.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.dev.handle_timeout(now);
    }
}

/// Runs the nodes on the simulated wire to quiescence (a livelock bound is a violation), files
/// the time and the wire's counters in the report, and gives the nodes back.
pub(crate) fn simulate(nodes: Vec<DeviceNode>, w: &Workload, report: &mut Report) -> Vec<DeviceNode> {
    let mut sim = Sim::new(nodes, w.link, w.faults, w.seed);
    match sim.run(Limits { max_steps: 20_000_000, max_time: Duration::from_millis(600_000) }) {
        Ok(_) => {}
        Err(SimError::StepLimit(_)) => report.violations.push("livelock: step limit reached".into()),
        Err(SimError::TimeLimit(_)) => report.violations.push("livelock: time limit reached".into()),
    }
    report.virtual_time_ns = sim.now().as_nanos();
    report.wire = *sim.stats();
    sim.into_endpoints()
}
