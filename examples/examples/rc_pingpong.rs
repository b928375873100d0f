//! RC ping-pong on the Rust verbs API, the way `ibv_rc_pingpong` does it: two devices run inside
//! this process (127.0.0.1 and 127.0.0.2, real RoCEv2 over UDP between them), one QP on each,
//! connected with endpoints exchanged as JSON (as a program would send them out of band), then
//! `--iters` round trips of a `--size`-byte message, each checked, and the round-trip time.
//!
//!     cargo run --release -p softrdma-examples --example rc_pingpong -- [--size 4096] [--iters 1000] [--port 4791]
//!
//! Against daemons instead (`softrdma up srdma0 --addr 127.0.0.1; softrdma up srdma1 --addr
//! 127.0.0.2`), open the contexts with `Context::open("srdma0")` and `Context::open("srdma1")`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_device::verbs::*;
use softrdma_device::{Hca, HcaConfig};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
    _ctx: Context,
}

fn side(hca: &Arc<Hca>, size: usize) -> Result<Side> {
    let ctx = Context::embedded(hca)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.qp_builder(QpType::Rc, &cq).build()?;
    let mr = pd.alloc_mr(2 * size, Access::LOCAL_WRITE)?;
    Ok(Side { qp, cq, mr, _pd: pd, _ctx: ctx })
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let (size, iters, port) = (arg("--size", 4096), arg("--iters", 1000), arg("--port", 4791) as u16);
    let mut devs = Vec::new();
    for (name, addr) in [("srdma0", "127.0.0.1"), ("srdma1", "127.0.0.2")] {
        let mut c = HcaConfig::new(name, addr.parse()?);
        c.port = port;
        devs.push(Arc::new(Hca::start(c)?));
    }
    let (mut a, mut b) = (side(&devs[0], size)?, side(&devs[1], size)?);
    // Exchange endpoints out of band, as JSON.
    let ea: Endpoint = serde_json::from_str(&serde_json::to_string(&a.qp.endpoint(100))?)?;
    let eb: Endpoint = serde_json::from_str(&serde_json::to_string(&b.qp.endpoint(200))?)?;
    let o = ConnectOptions { mtu: Mtu::Mtu4096, ..ConnectOptions::default() };
    a.qp.connect(100, &eb, &o)?;
    b.qp.connect(200, &ea, &o)?;
    let t0 = Instant::now();
    for i in 0..iters {
        let byte = i as u8;
        a.mr.as_mut_slice()[..size].fill(byte);
        b.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.mr.sge(size..2 * size)] }])?;
        a.qp.post_recv(vec![RecvWr { wr_id: 2, sg_list: vec![a.mr.sge(size..2 * size)] }])?;
        a.qp.post_send(vec![SendWr::new(3, SendOp::Send, vec![a.mr.sge(0..size)])])?;
        let got = b.cq.wait(1, Duration::from_secs(10))?;
        assert!(got.len() == 1 && got[0].status == WcStatus::Success, "ping {i}: {got:?}");
        assert!(b.mr.as_slice()[size..2 * size].iter().all(|&x| x == byte), "ping {i}: wrong data");
        b.mr.as_mut_slice()[..size].fill(!byte);
        b.qp.post_send(vec![SendWr::new(4, SendOp::Send, vec![b.mr.sge(0..size)])])?;
        let mut need = 3; // a's send, a's receive, b's send
        let deadline = Instant::now() + Duration::from_secs(10);
        while need > 0 && Instant::now() < deadline {
            need -= a.cq.poll(4)?.len() + b.cq.poll(4)?.len();
        }
        assert!(need == 0, "pong {i} did not complete");
        assert!(a.mr.as_slice()[size..2 * size].iter().all(|&x| x == !byte), "pong {i}: wrong data");
    }
    let dt = t0.elapsed();
    println!(
        "{iters} round trips of {size} bytes in {:.3} s: {:.1} us per round trip, {:.1} MB/s each way",
        dt.as_secs_f64(),
        dt.as_secs_f64() * 1e6 / iters as f64,
        (iters * size) as f64 / dt.as_secs_f64() / 1e6
    );
    Ok(())
}
