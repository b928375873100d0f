//! `softrdma bench --progress`: who should move a device's work, measured in one run.
//!
//! Two devices run in this process (the first and second bench addresses, a port of their own),
//! one RC QP on each, and two threads play ib_send_lat: the ping thread posts a 2-byte SEND and
//! spins on its CQ for the answer, the pong thread spins on its CQ and answers. The same exchange
//! runs with the devices' own threads doing the work ([`Progress::DeviceThread`], what the
//! daemon does today: four busy threads on the path) and with the application's threads driving
//! the devices from their post and poll calls ([`Progress::Application`], the provider model of
//! the data-path issue: two busy threads, the progress threads off the socket while an
//! application thread polls it), and once more without that handoff. Beside them, the
//! physical limit of the same sitting: two threads ping-ponging 2-byte UDP datagrams with
//! busy-polling nonblocking sockets on the same addresses.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use softrdma_device::hca::HANDOFF_IDLE;
use softrdma_device::verbs::{
    Access, CompletionQueue, ConnectOptions, Context, MemoryRegion, Mtu, ProtectionDomain, QpType, QueuePair, RecvWr,
    SendOp, SendWr, WcStatus,
};
use softrdma_device::{Hca, HcaConfig, Progress};

/// One-way latency of one way of moving messages: median and 99th percentile, microseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OneWay {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Figures {
    pub(crate) udp: OneWay,
    pub(crate) device_thread: OneWay,
    pub(crate) application: OneWay,
    /// The same without the handoff (the progress thread always waits on the socket).
    pub(crate) no_handoff: OneWay,
    pub(crate) iters: usize,
}

/// Half of each round trip, as perftest's latency tests report one-way figures.
fn one_way(mut rtts: Vec<Duration>) -> OneWay {
    rtts.sort_unstable();
    let at = |q: f64| rtts[((rtts.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6 / 2.0;
    OneWay { p50_us: at(0.50), p99_us: at(0.99) }
}

const SIZE: usize = 2;

struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
    _ctx: Context,
}

fn side(hca: &Arc<Hca>) -> Result<Side> {
    let ctx = Context::embedded(hca)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None)?;
    let qp = pd.qp_builder(QpType::Rc, &cq).build()?;
    let mr = pd.alloc_mr(2 * SIZE, Access::LOCAL_WRITE)?;
    Ok(Side { qp, cq, mr, _pd: pd, _ctx: ctx })
}

impl Side {
    fn post_recv(&self) -> Result<()> {
        self.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![self.mr.sge(SIZE..2 * SIZE)] }])?;
        Ok(())
    }

    fn send(&self) -> Result<()> {
        self.qp.post_send(vec![SendWr::new(2, SendOp::Send, vec![self.mr.sge(0..SIZE)])])?;
        Ok(())
    }

    /// Polls the CQ until the receive completes (send completions pass by); an error
    /// completion or 10 s without the receive fail.
    fn wait_recv(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let wcs = self.cq.poll(8)?;
            if wcs.is_empty() {
                // As the verbs shim's ibv_poll_cq does on an empty CQ: the CPU goes to whoever
                // else is runnable (the device threads, with fewer cores than busy threads).
                std::thread::yield_now();
            }
            for wc in wcs {
                if wc.status != WcStatus::Success {
                    bail!("completion {wc:?}");
                }
                if wc.wr_id == 1 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("no answer within 10 s");
            }
        }
    }
}

/// The ping-pong between two devices made with `progress`; round-trip times of the ping side.
fn rc_pingpong(
    progress: Progress,
    handoff_idle: Duration,
    addrs: [IpAddr; 2],
    port: u16,
    iters: usize,
) -> Result<Vec<Duration>> {
    let mut devs = Vec::new();
    for (name, addr) in ["bench0", "bench1"].into_iter().zip(addrs) {
        let mut c = HcaConfig::new(name, addr);
        c.port = port;
        c.progress = progress;
        c.handoff_idle = handoff_idle;
        devs.push(Arc::new(Hca::start(c).with_context(|| format!("a device on {addr}:{port}"))?));
    }
    let (a, b) = (side(&devs[0])?, side(&devs[1])?);
    let o = ConnectOptions { mtu: Mtu::Mtu1024, ..ConnectOptions::default() };
    a.qp.connect(100, &b.qp.endpoint(200), &o)?;
    b.qp.connect(200, &a.qp.endpoint(100), &o)?;
    a.post_recv()?;
    b.post_recv()?;
    let warmup = iters / 10 + 10;
    let pong = std::thread::spawn(move || -> Result<()> {
        for _ in 0..warmup + iters {
            b.wait_recv()?;
            b.post_recv()?;
            b.send()?;
        }
        // Let the last send's ACK come back before the QP goes away.
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    });
    let mut rtts = Vec::with_capacity(iters);
    let r = (|| -> Result<()> {
        for i in 0..warmup + iters {
            let t = Instant::now();
            a.send()?;
            a.wait_recv()?;
            if i >= warmup {
                rtts.push(t.elapsed());
            }
            a.post_recv()?;
        }
        Ok(())
    })();
    let p = pong.join().map_err(|_| anyhow::anyhow!("the pong thread panicked"))?;
    r?;
    p?;
    drop(a);
    for d in &devs {
        d.stop();
    }
    Ok(rtts)
}

/// Busy-poll UDP ping-pong between two threads: the floor of the same sitting.
fn udp_pingpong(addrs: [IpAddr; 2], iters: usize) -> Result<Vec<Duration>> {
    let a = UdpSocket::bind(SocketAddr::new(addrs[0], 0))?;
    let b = UdpSocket::bind(SocketAddr::new(addrs[1], 0))?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    let (a_at, b_at) = (a.local_addr()?, b.local_addr()?);
    let warmup = iters / 10 + 10;
    let spin_recv = |s: &UdpSocket, buf: &mut [u8]| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match s.recv(buf) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        bail!("UDP: no answer within 10 s");
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let pong = std::thread::spawn(move || -> Result<()> {
        let mut buf = [0u8; 64];
        for _ in 0..warmup + iters {
            spin_recv(&b, &mut buf)?;
            b.send_to(&buf[..SIZE], a_at)?;
        }
        Ok(())
    });
    let mut rtts = Vec::with_capacity(iters);
    let mut buf = [0u8; 64];
    for i in 0..warmup + iters {
        let t = Instant::now();
        a.send_to(&[1u8; SIZE], b_at)?;
        spin_recv(&a, &mut buf)?;
        if i >= warmup {
            rtts.push(t.elapsed());
        }
    }
    pong.join().map_err(|_| anyhow::anyhow!("the UDP pong thread panicked"))??;
    Ok(rtts)
}

/// Runs the three exchanges, `rounds` times interleaved, keeping each one's best round by median
/// (the machine's noise only ever makes a run slower).
pub(crate) fn run(addrs: [IpAddr; 2], iters: usize, rounds: usize) -> Result<Figures> {
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let best = |old: Option<OneWay>, new: OneWay| match old {
        Some(o) if o.p50_us <= new.p50_us => Some(o),
        _ => Some(new),
    };
    let (mut udp, mut dev, mut app, mut no_handoff) = (None, None, None, None);
    for round in 0..rounds.max(1) {
        udp = best(udp, one_way(udp_pingpong(addrs, iters)?));
        let p = port + 3 * round as u16;
        dev = best(dev, one_way(rc_pingpong(Progress::DeviceThread, HANDOFF_IDLE, addrs, p, iters)?));
        app = best(app, one_way(rc_pingpong(Progress::Application, HANDOFF_IDLE, addrs, p + 1, iters)?));
        no_handoff =
            best(no_handoff, one_way(rc_pingpong(Progress::Application, Duration::ZERO, addrs, p + 2, iters)?));
    }
    Ok(Figures {
        udp: udp.expect("one round"),
        device_thread: dev.expect("one round"),
        application: app.expect("one round"),
        no_handoff: no_handoff.expect("one round"),
        iters,
    })
}

/// The table of a run, Markdown.
pub(crate) fn table(f: &Figures, cmd: &str) -> String {
    let row = |what: &str, o: OneWay| {
        format!(
            "| {what} | {:.2} | {:.2} | {:.2} |\n",
            o.p50_us,
            o.p99_us,
            o.p50_us / f.udp.p50_us.max(f64::MIN_POSITIVE)
        )
    };
    let mut s = format!(
        "`{cmd}` ({} round trips of 2 bytes per way and round, best round by median; one-way = half the round trip)\n\n",
        f.iters
    );
    s += "| how | one-way p50 (us) | p99 (us) | p50 / UDP p50 |\n|---|---|---|---|\n";
    s += &row("busy-poll UDP, two threads (the floor)", f.udp);
    s += &row("RC SEND, device threads move the work (Progress::DeviceThread)", f.device_thread);
    s += &row("RC SEND, the application's post and poll drive the device (Progress::Application)", f.application);
    s += &row("the same, the progress thread always on the socket (no handoff: `handoff_idle` 0)", f.no_handoff);
    s
}
