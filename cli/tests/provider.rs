//! Providers (the data path in the application process, `SOFTRDMA_DATAPATH=provider`) against
//! their device daemon: memory keys from blocks of their own, QPs on the steered port, the
//! internal loopback's ICRC, XRC SRQs, a device that goes away, GRO runs that mix processes,
//! packets reported to the capture, fault injection and counters, CQ overrun and multicast.
//!
//! Every test has its own runtime dir and UDP port, so tests run in parallel without meeting.

use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{cmd, rtdir, stat, text, up};

/// One QP of a test with what it needs: its CQ, a memory region, and the PD and context that
/// must outlive them.
struct Side {
    qp: softrdma_device::verbs::QueuePair,
    cq: softrdma_device::verbs::CompletionQueue,
    mr: softrdma_device::verbs::MemoryRegion,
    _pd: softrdma_device::verbs::ProtectionDomain,
    _ctx: softrdma_device::verbs::Context,
}

/// Each provider's memory keys come from key blocks the daemon reserved for it
/// (engine/src/device/keys.rs), never from another provider's or the device's own, so the
/// device can serve RDMA through XRC target QPs under any provider's key (before, about one
/// such alias in 256 collided). A provider that fills its block gets another from the daemon
/// (`Request::KeyBlock`); one that goes gives its blocks back.
#[test]
fn providers_memory_keys_come_from_blocks_of_their_own() {
    use softrdma_device::verbs::*;
    use softrdma_engine::device::key_block;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "tk", "127.0.0.1", 47965, &[]);
    let (p1, p2, d) = (
        Context::provider_in(rt, "tk").unwrap(),
        Context::provider_in(rt, "tk").unwrap(),
        Context::open_in(rt, "tk").unwrap(),
    );
    let buf = vec![0u8; 4096];
    let regs = |ctx: &Context, n: usize| {
        let pd = ctx.alloc_pd().unwrap();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: `buf` outlives every registration (they go at the end of the test).
        let mrs: Vec<RawMr> =
            (0..n).map(|_| unsafe { pd.reg_mr_raw(buf.as_ptr() as u64, 4096, access) }.unwrap()).collect();
        let w = pd.alloc_mw(2).unwrap();
        let mut keys: Vec<u32> = mrs.iter().map(|m| m.keys().rkey).collect();
        keys.push(w.rkey());
        (pd, mrs, w, keys)
    };
    let blocks = |keys: &[u32]| keys.iter().map(|k| key_block(k >> 8)).collect::<std::collections::BTreeSet<u32>>();
    let (_pd, _m, _w, kd) = regs(&d, 200);
    let in_block = 1usize << softrdma_engine::device::KEY_BLOCK_SHIFT;
    // More than one block's worth: the last ones come from a second block.
    let (_pd1, _m1, _w1, k1) = regs(&p1, in_block + 10);
    let (_pd2, _m2, _w2, k2) = regs(&p2, 200);
    let (b1, b2, bd) = (blocks(&k1), blocks(&k2), blocks(&kd));
    assert_eq!(b1.len(), 2, "{b1:?}");
    assert_eq!(b2.len(), 1, "{b2:?}");
    assert!(b1.is_disjoint(&b2) && b1.is_disjoint(&bd) && b2.is_disjoint(&bd), "{b1:?} {b2:?} {bd:?}");
    let distinct: std::collections::BTreeSet<u32> = k1.iter().map(|k| k >> 8).collect();
    assert_eq!(distinct.len(), k1.len(), "a key index handed out twice");
    // The first provider goes: the next one gets one of its blocks (the daemon hands out the
    // highest free block first, and the first provider had it).
    drop((_w1, _m1, _pd1, p1));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p3 = Context::provider_in(rt, "tk").unwrap();
        let (_pd3, _m3, _w3, k3) = regs(&p3, 1);
        let b3 = blocks(&k3);
        if b3.is_subset(&b1) {
            assert!(b3.is_disjoint(&b2) && b3.is_disjoint(&bd));
            break;
        }
        assert!(Instant::now() < deadline, "the first provider's key blocks never came back: {b3:?} {b1:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A side of an RC exchange: a PD, a 64-entry CQ, an RC QP and a 64 KiB MR on `ctx`.
fn side(ctx: softrdma_device::verbs::Context) -> Side {
    use softrdma_device::verbs::*;
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq).build().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.alloc_mr(1 << 16, access).unwrap();
    Side { qp, cq, mr, _pd: pd, _ctx: ctx }
}

/// Connects two sides' QPs (MTU 1024).
fn connect(a: &Side, b: &Side) {
    use softrdma_device::verbs::*;
    let o = ConnectOptions { mtu: Mtu::Mtu1024, ..ConnectOptions::default() };
    a.qp.connect(1, &b.qp.endpoint(2), &o).unwrap();
    b.qp.connect(2, &a.qp.endpoint(1), &o).unwrap();
}

/// One successful completion on `cq` within 10 s.
fn one(cq: &softrdma_device::verbs::CompletionQueue) {
    let w = cq.wait(1, Duration::from_secs(10)).unwrap();
    assert_eq!(w.len(), 1, "no completion");
    assert_eq!(w[0].status, softrdma_device::verbs::WcStatus::Success, "{w:?}");
}

/// SEND a -> b, then WRITE a -> b and READ it back into a, 6000 bytes each, checked.
fn exchange(a: &mut Side, b: &mut Side, seed: u8) {
    use softrdma_device::verbs::*;
    let data: Vec<u8> = (0..6000).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
    a.mr.as_mut_slice()[..6000].copy_from_slice(&data);
    b.qp.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.mr.sge(0..8192)] }]).unwrap();
    a.qp.post_send(vec![SendWr::new(2, SendOp::Send, vec![a.mr.sge(0..6000)])]).unwrap();
    one(&a.cq);
    one(&b.cq);
    assert_eq!(&b.mr.as_slice()[..6000], &data[..]);
    let (addr, rkey) = (b.mr.addr() + 10_000, b.mr.rkey());
    a.qp.post_send(vec![SendWr::new(3, SendOp::Write { remote_addr: addr, rkey }, vec![a.mr.sge(0..6000)])]).unwrap();
    one(&a.cq);
    a.qp.post_send(vec![SendWr::new(4, SendOp::Read { remote_addr: addr, rkey }, vec![a.mr.sge(20_000..26_000)])])
        .unwrap();
    one(&a.cq);
    assert_eq!(&a.mr.as_slice()[20_000..26_000], &data[..]);
    assert_eq!(&b.mr.as_slice()[10_000..16_000], &data[..]);
}

/// `SOFTRDMA_DATAPATH=provider`'s path on the Rust API: two processes' worth of providers and a
/// client on the device path share one daemon's steered port. Each provider allocates its QPNs
/// from its own block; their RC traffic between each other goes through the port, steered by the
/// kernel, without the daemon's engine seeing a packet; traffic with the device path's QP reaches
/// the daemon. A provider that goes away gives its block back.
#[test]
fn providers_run_their_own_qps_on_the_steered_port() {
    use softrdma_device::verbs::*;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "tp", "127.0.0.1", 47948, &[]);
    let mut p1 = side(Context::provider_in(rt, "tp").unwrap());
    let mut p2 = side(Context::provider_in(rt, "tp").unwrap());
    let mut d = side(Context::open_in(rt, "tp").unwrap());
    let block = |qpn: u32| qpn >> softrdma_engine::device::QPN_BLOCK_SHIFT;
    let (b1, b2, bd) = (block(p1.qp.qpn()), block(p2.qp.qpn()), block(d.qp.qpn()));
    assert!(b1 != b2 && b1 != bd && b2 != bd, "QPN blocks {b1} {b2} {bd}");

    // Provider to provider: the daemon's socket receives nothing, yet the device's counters
    // count the providers' packets (they report them within PUBLISH_INTERVAL_MS).
    connect(&p1, &p2);
    let s0 = stat(rt, "tp");
    let (before, own_before) = (s0["rcvd_pkts"].as_u64().unwrap(), s0["daemon_udp_rcvd"].as_u64().unwrap());
    assert_eq!(s0["providers"].as_u64(), Some(2), "{s0}");
    exchange(&mut p1, &mut p2, 1);
    exchange(&mut p2, &mut p1, 2);
    assert_eq!(stat(rt, "tp")["daemon_udp_rcvd"].as_u64().unwrap(), own_before, "steered traffic reached the daemon");
    // Each exchange's responder takes at least 13 requests (6 SEND and 6 WRITE packets of 1024
    // bytes, a READ request).
    let deadline = Instant::now() + Duration::from_secs(5);
    let counted = loop {
        let n = stat(rt, "tp")["rcvd_pkts"].as_u64().unwrap() - before;
        if n >= 26 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(counted >= 26, "the device counted {counted} of the providers' packets");

    // A provider that goes gives its block back: the next one gets it (the lowest free block),
    // and allocates after the QPN it used (a peer's CM holds that one in timewait).
    let old_qpn = p2.qp.qpn();
    drop(p2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut p3 = loop {
        let p = side(Context::provider_in(rt, "tp").unwrap());
        if block(p.qp.qpn()) == b2 || Instant::now() > deadline {
            break p;
        }
        drop(p);
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(block(p3.qp.qpn()), b2, "the block of a provider that went is not given again");
    assert!(p3.qp.qpn() > old_qpn, "QPN {:#x} of the block's last holder given again", old_qpn);

    // Provider to a QP on the device path, both ways: through the daemon's engine.
    connect(&p3, &d);
    exchange(&mut p3, &mut d, 3);
    exchange(&mut d, &mut p3, 4);
    assert!(stat(rt, "tp")["rcvd_pkts"].as_u64().unwrap() > before);

    // A forked child keeps no socket of the port (it would take its parent's datagrams).
    let bound_to_port = || {
        (0..4096).any(|fd| {
            // SAFETY: getsockname(2) on descriptor numbers, into a local sockaddr_in; only
            // async-signal-safe calls, as the child of a threaded process may make.
            unsafe {
                let mut a: libc::sockaddr_in = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                libc::getsockname(fd, (&raw mut a).cast(), &mut len) == 0
                    && a.sin_family == libc::AF_INET as libc::sa_family_t
                    && u16::from_be(a.sin_port) == 47948
            }
        })
    };
    assert!(bound_to_port(), "the parent holds its members");
    // SAFETY: fork(2); the child only runs async-signal-safe code and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = if bound_to_port() { 1 } else { 0 };
        // SAFETY: leaves the child at once, running nothing of the parent's.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child kept a member socket");
    drop((p1, p3, d));
}

/// What two providers of one device send each other is the device's internal loopback: it
/// carries no ICRC and is not checked, unless the device injects faults (or captures), when
/// every packet has its ICRC and a corrupted one is caught (engine `TransmitOptions::loopback_icrc`,
/// `tests/same_address.rs` for the packets themselves). Without the faults the exchanges pass with
/// no ICRC error (a receiver that checked what its sender left unprotected would drop every
/// packet); with them they pass too, the corrupted packets counted and resent.
#[test]
fn providers_of_one_device_protect_their_packets_only_where_they_can_break() {
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let icrc_errs = |name: &str, at_least: u64| {
        // The providers report their counters within PUBLISH_INTERVAL_MS.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = stat(rt, name)["icrc_err"].as_u64().unwrap();
            if n >= at_least || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for (name, port, faults) in [("tq", 47968, ""), ("tc", 47969, "corrupt=0.05,seed=5")] {
        let extra: &[&str] = if faults.is_empty() { &[] } else { &["--faults", faults] };
        let _g = up(rt, name, "127.0.0.1", port, extra);
        let mut p1 = side(softrdma_device::verbs::Context::provider_in(rt, name).unwrap());
        let mut p2 = side(softrdma_device::verbs::Context::provider_in(rt, name).unwrap());
        assert!(p1._ctx.is_provider() && p2._ctx.is_provider());
        connect(&p1, &p2);
        for seed in 0..8 {
            exchange(&mut p1, &mut p2, seed);
            exchange(&mut p2, &mut p1, seed + 100);
        }
        if faults.is_empty() {
            // Let a report come, then nothing may have been dropped for its ICRC.
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(icrc_errs(name, 0), 0, "packets between the device's providers failed their ICRC check");
        } else {
            assert!(icrc_errs(name, 1) > 0, "no corrupted packet was caught: {}", stat(rt, name));
        }
        drop((p1, p2));
    }
}

/// XRC on the provider path: the domain, its XRC SRQs and target QPs are the daemon's (made on
/// the provider's XRC side), while the SRQ's PD, CQ, channel and memory are the program's. A SEND
/// through the target QP lands in the program's buffer and completes into the program's CQ,
/// waking its channel; an RDMA WRITE through the target QP with the rkey the program's region
/// was given reaches it; the target QP's and SRQ's async events reach the program's queue; a PD or CQ an
/// XRC SRQ still uses cannot go (EBUSY); a deregistered region's rkey no longer works.
#[test]
fn a_providers_xrc_srq_serves_its_own_cq_memory_and_events() {
    use softrdma_device::verbs::*;
    use softrdma_engine::device::AsyncEvent;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "tx", "127.0.0.1", 47953, &[]);
    let t = Duration::from_secs(10);
    let r = Context::provider_in(rt, "tx").unwrap();
    let s = Context::provider_in(rt, "tx").unwrap();
    assert!(r.is_provider() && s.is_provider());
    let pd = r.alloc_pd().unwrap();
    let ch = r.create_comp_channel().unwrap();
    let cq = r.create_cq(64, Some(&ch)).unwrap();
    // Armed before any XRC SRQ names the CQ, as rdma-core's ibv_xsrq_pingpong -e arms it.
    cq.req_notify(false).unwrap();
    let mr = pd.alloc_mr(1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let x = r.open_xrcd(None, true, false).unwrap();
    let attr = SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 };
    let srq = x.create_srq(&pd, &cq, attr).unwrap();
    let tgt = x.create_tgt_qp().unwrap();
    // A PD and CQ of the program that only an XRC SRQ uses: busy while it does.
    let (pd2, cq2) = (r.alloc_pd().unwrap(), r.create_cq(8, None).unwrap());
    let srq2 = x.create_srq(&pd2, &cq2, attr).unwrap();
    let (pd2, e) = pd2.destroy().expect_err("a PD an XRC SRQ uses");
    assert!(matches!(e, Error::Verbs(VerbsError::Busy)), "{e:?}");
    let (cq2, e) = cq2.destroy().expect_err("a CQ an XRC SRQ uses");
    assert!(matches!(e, Error::Verbs(VerbsError::Busy)), "{e:?}");
    srq2.destroy().map_err(|(_, e)| e).unwrap();
    cq2.destroy().map_err(|(_, e)| e).unwrap();
    pd2.destroy().map_err(|(_, e)| e).unwrap();

    // The sender: an XRC send QP of another provider.
    let spd = s.alloc_pd().unwrap();
    let scq = s.create_cq(64, None).unwrap();
    let smr = spd.alloc_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
    let ini = spd.qp_builder(QpType::XrcIni, &scq).build().unwrap();
    let o = ConnectOptions::default();
    ini.connect(5, &tgt.endpoint(77), &o).unwrap();
    tgt.connect(77, &ini.endpoint(5), &o).unwrap();
    let send = |wr_id: u64, op: SendOp, range: std::ops::Range<usize>, srqn: u32| {
        let mut w = SendWr::new(wr_id, op, vec![smr.sge(range)]);
        w.remote_srqn = srqn;
        w.signaled = true;
        ini.post_send(vec![w]).unwrap();
        let c = scq.wait(1, t).unwrap();
        assert_eq!(c.len(), 1, "no send completion");
        c[0].status
    };
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: smr is this test's buffer, not posted anywhere yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), smr.addr() as *mut u8, data.len()) };

    // SEND: the program's buffer, the program's CQ, the program's channel (armed above).
    srq.post_recv(vec![RecvWr { wr_id: 11, sg_list: vec![mr.sge(0..4096)] }]).unwrap();
    assert_eq!(send(1, SendOp::Send, 0..3000, srq.srq_num()), WcStatus::Success);
    assert_eq!(ch.get_cq_event(Some(t)).unwrap(), Some(cq.id()), "the channel did not fire");
    let c = cq.wait(1, t).unwrap();
    assert_eq!(c.len(), 1, "no receive completion");
    assert_eq!((c[0].wr_id, c[0].status, c[0].byte_len), (11, WcStatus::Success, 3000));
    assert_eq!(c[0].qp_num.value(), tgt.qpn());
    assert_eq!(&mr.as_slice()[..3000], &data[..]);

    // RDMA WRITE through the target QP, with the key the program's region was given.
    let write = SendOp::Write { remote_addr: mr.addr() + 10_000, rkey: mr.rkey() };
    assert_eq!(send(2, write, 100..1100, srq.srq_num()), WcStatus::Success);
    assert_eq!(&mr.as_slice()[10_000..11_000], &data[100..1100]);
    // A region registered after the XRC side opened is reachable too.
    let mr2 = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let write2 = SendOp::Write { remote_addr: mr2.addr() + 8, rkey: mr2.rkey() };
    assert_eq!(send(3, write2, 0..64, srq.srq_num()), WcStatus::Success);
    assert_eq!(&mr2.as_slice()[8..72], &data[..64]);

    // The SRQ's limit event: armed at 2 with 3 receives posted, two SENDs leave one.
    let wrs = (0..3).map(|i| RecvWr { wr_id: 20 + i, sg_list: vec![mr.sge(20_000..24_000)] }).collect();
    srq.post_recv(wrs).unwrap();
    srq.set_limit(2).unwrap();
    assert_eq!(send(4, SendOp::Send, 0..10, srq.srq_num()), WcStatus::Success);
    assert_eq!(send(5, SendOp::Send, 0..10, srq.srq_num()), WcStatus::Success);
    // Before it, the target QP's COMM_EST (its first packet came in RTR), for this process's
    // handle on it.
    let mut events = Vec::new();
    while let Some(e) = r.get_async_event(Some(t)).unwrap() {
        events.push(e);
        if matches!(e.event, AsyncEvent::SrqLimitReached(_)) {
            break;
        }
    }
    let want = [
        (AsyncEvent::CommEst(softrdma_engine::wire::Qpn::new(tgt.qpn())), tgt.handle()),
        (AsyncEvent::SrqLimitReached(srq.srq_num()), None),
    ];
    assert_eq!(events.iter().map(|e| (e.event, e.handle)).collect::<Vec<_>>(), want);
    assert_eq!(cq.wait(2, t).unwrap().len(), 2);

    // A region that went: its key reaches nothing (remote access error).
    let gone = mr2.rkey();
    drop(mr2);
    let write3 = SendOp::Write { remote_addr: mr.addr(), rkey: gone };
    assert_eq!(send(6, write3, 0..64, srq.srq_num()), WcStatus::RemAccessErr);
    drop((ini, tgt, srq));
}

/// A provider's device is its daemon too: when the daemon goes, the program hears it as it would
/// from a device-path context (the async event fd and channel fds become readable; the next
/// event call fails as the device lost, which libibverbs reports as IBV_EVENT_DEVICE_FATAL),
/// though its own QPs run in its process.
#[test]
fn a_provider_hears_its_device_go_away() {
    use softrdma_device::verbs::*;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let g = up(rt, "tg", "127.0.0.1", 47954, &[]);
    let ctx = Context::provider_in(rt, "tg").unwrap();
    assert!(ctx.is_provider());
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(8, Some(&ch)).unwrap();
    cq.req_notify(false).unwrap();
    assert!(matches!(ctx.get_async_event(Some(Duration::from_millis(50))), Ok(None)), "no event while it runs");
    drop(g); // softrdma down
    let readable = |fd: std::os::fd::BorrowedFd<'_>| {
        let mut p = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        matches!(nix::poll::poll(&mut p, nix::poll::PollTimeout::from(5000u16)), Ok(1))
    };
    assert!(readable(ctx.event_fd()), "the async event fd did not wake");
    assert!(readable(std::os::fd::AsFd::as_fd(&ch)), "the channel fd did not wake");
    let e = ctx.get_async_event(Some(Duration::from_secs(5)));
    assert!(matches!(e, Err(Error::Device(_))), "{e:?}");
    assert!(matches!(ch.get_cq_event(Some(Duration::from_secs(5))), Err(Error::Device(_))));
}

/// A GRO run whose segments name the QPs of several processes (a NIC merges consecutive datagrams
/// of one flow; the kernel hands the run to the socket the steering program picks for its first
/// segment) still reaches every QP it names: the member that got it passes the others' segments on
/// through the relay (provider to daemon, daemon to provider), with the headers their ICRC covers.
/// On loopback one GSO send of a foreign sender makes such a run. Without the relay the first
/// segment's owner drops the rest as packets for QPs it does not have.
#[test]
fn a_gro_run_mixing_several_processes_qps_reaches_every_owner() {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};
    use softrdma_device::verbs::*;
    use softrdma_engine::device::ip_udp_header;
    use softrdma_engine::wire::{icrc, IbPacket};
    use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
    use std::os::fd::AsRawFd;
    const PORT: u16 = 47952;
    const LEN: usize = 200;
    const SRC_QPN: u32 = 0x42;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "gr", "127.0.0.1", PORT, &[]);
    let o = ConnectOptions::default();
    let side = |ctx: Context| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qp = pd.qp_builder(QpType::Ud, &cq).build().unwrap();
        qp.connect(0, &qp.endpoint(0), &o).unwrap();
        let mr = pd.alloc_mr(4 * 1024, Access::LOCAL_WRITE).unwrap();
        let wrs =
            (0..4u64).map(|k| RecvWr { wr_id: k, sg_list: vec![mr.sge(k as usize * 1024..(k as usize + 1) * 1024)] });
        qp.post_recv(wrs.collect()).unwrap();
        Side { qp, cq, mr, _pd: pd, _ctx: ctx }
    };
    let sides = [
        side(Context::provider_in(rt, "gr").unwrap()),
        side(Context::provider_in(rt, "gr").unwrap()),
        side(Context::open_in(rt, "gr").unwrap()),
    ];
    let block = |qpn: u32| qpn >> softrdma_engine::device::QPN_BLOCK_SHIFT;
    let blocks: Vec<u32> = sides.iter().map(|s| block(s.qp.qpn())).collect();
    assert!(blocks[0] != blocks[1] && blocks[0] != blocks[2] && blocks[1] != blocks[2], "QPN blocks {blocks:?}");
    let before = stat(rt, "gr");

    // A foreign sender: UD SEND_ONLY datagrams of equal size, valid ICRCs for the IPv4 IDs the
    // kernel gives GSO segments (0, 1, 2, ...).
    let (src, dst) = (Ipv4Addr::new(127, 0, 0, 9), Ipv4Addr::new(127, 0, 0, 1));
    let sock = std::net::UdpSocket::bind(SocketAddrV4::new(src, 0)).unwrap();
    let sport = sock.local_addr().unwrap().port();
    let fill = |run: u8, to: usize| (run << 4) | to as u8;
    let packet = |dqpn: u32, psn: u32, segment: u16, fill: u8| {
        let mut p = vec![0u8; 12 + 8 + LEN + icrc::LEN];
        p[0] = 0x64; // UD SEND_ONLY
        p[2..4].copy_from_slice(&0xffffu16.to_be_bytes()); // default P_Key
        p[4..8].copy_from_slice(&dqpn.to_be_bytes());
        p[8..12].copy_from_slice(&psn.to_be_bytes());
        p[12..16].copy_from_slice(&o.qkey.to_be_bytes());
        p[16..20].copy_from_slice(&SRC_QPN.to_be_bytes());
        p[20..20 + LEN].fill(fill);
        let (h, n) = ip_udp_header(IpAddr::V4(src), IpAddr::V4(dst), sport, p.len(), segment);
        let crc = icrc::roce_v2_parts(&h[..n], &p[..p.len() - icrc::LEN]).unwrap();
        IbPacket::new_unchecked(&mut p[..]).set_icrc(crc);
        p
    };
    // Run 0 starts with a provider's QP (its socket gets the run: provider -> daemon ->
    // provider), run 1 with the device path's QP (the daemon's socket: daemon -> providers).
    for (run, order) in [[0usize, 1, 2], [2, 0, 1]].iter().enumerate() {
        let mut buf = Vec::new();
        for (segment, &to) in order.iter().enumerate() {
            buf.extend(packet(sides[to].qp.qpn(), run as u32, segment as u16, fill(run as u8, to)));
        }
        let seg = (buf.len() / 3) as u16;
        let iov = [std::io::IoSlice::new(&buf)];
        let to = SockaddrIn::from(SocketAddrV4::new(dst, PORT));
        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
        let sent = sendmsg(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), Some(&to)).unwrap();
        assert_eq!(sent, buf.len());
    }

    // Every QP receives its two datagrams, data intact (after the 40-byte GRH slot). Not
    // necessarily in run order: a relayed segment takes one or two hops more than the other.
    for (to, s) in sides.iter().enumerate() {
        let w = s.cq.wait(2, Duration::from_secs(10)).unwrap();
        assert_eq!(w.len(), 2, "QP {to} ({:#x}) got {w:?}", s.qp.qpn());
        let mut got = Vec::new();
        for wc in &w {
            assert_eq!((wc.status, wc.byte_len, wc.src_qp.value()), (WcStatus::Success, 40 + LEN as u32, SRC_QPN));
            let at = wc.wr_id as usize * 1024;
            let data = &s.mr.as_slice()[at + 40..at + 40 + LEN];
            assert!(data.iter().all(|&b| b == data[0]), "QP {to}: {data:?}");
            got.push(data[0]);
        }
        got.sort();
        assert_eq!(got, [fill(0, to), fill(1, to)], "QP {to}");
    }
    // Three segments went on from the socket that got them: two by the provider (to the daemon),
    // one of them and two more by the daemon. The providers' counts come with their reports.
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let after = loop {
        let s = stat(rt, "gr");
        if n(&s, "relayed") - n(&before, "relayed") >= 5 || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(n(&after, "relayed") - n(&before, "relayed"), 5, "{after}");
    assert_eq!(n(&after, "relay_lost"), 0, "{after}");
}

/// The device's capture, fault injection and counters cover the providers' QPs (the data-path
/// issue's item 5): two providers exchange through a daemon that captures and drops packets;
/// the drops are theirs (the daemon's engine sends nothing), the device counts them and the
/// retransmissions, and the capture holds their packets, once each, every ICRC valid.
#[test]
fn providers_report_their_packets_to_the_device_capture_faults_and_counters() {
    use softrdma_device::verbs::*;
    let (base, rt) = rtdir();
    let rt = rt.as_path();
    let pcap = base.path().join("providers.pcap");
    let g = up(rt, "tq", "127.0.0.1", 47949, &["--pcap", pcap.to_str().unwrap(), "--faults", "loss=0.05,seed=11"]);
    let side = |ctx: Context| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qp = pd.qp_builder(QpType::Rc, &cq).build().unwrap();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = pd.alloc_mr(1 << 16, access).unwrap();
        (qp, cq, mr, pd, ctx)
    };
    let mut a = side(Context::provider_in(rt, "tq").unwrap());
    let b = side(Context::provider_in(rt, "tq").unwrap());
    // A short transport timer: a lost last packet is resent after ~4 ms.
    let o = ConnectOptions { mtu: Mtu::Mtu1024, timeout: 10, retry_cnt: 7, ..ConnectOptions::default() };
    a.0.connect(1, &b.0.endpoint(2), &o).unwrap();
    b.0.connect(2, &a.0.endpoint(1), &o).unwrap();
    let one = |cq: &CompletionQueue| {
        let w = cq.wait(1, Duration::from_secs(20)).unwrap();
        assert_eq!(w.len(), 1, "no completion");
        assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
    };
    let rounds = 10;
    for r in 0..rounds {
        let data: Vec<u8> = (0..6000).map(|i| (i as u8).wrapping_mul(13).wrapping_add(r)).collect();
        a.2.as_mut_slice()[..6000].copy_from_slice(&data);
        b.0.post_recv(vec![RecvWr { wr_id: 1, sg_list: vec![b.2.sge(0..8192)] }]).unwrap();
        a.0.post_send(vec![SendWr::new(2, SendOp::Send, vec![a.2.sge(0..6000)])]).unwrap();
        one(&a.1);
        one(&b.1);
        assert_eq!(&b.2.as_slice()[..6000], &data[..]);
        let (addr, rkey) = (b.2.addr() + 10_000, b.2.rkey());
        a.0.post_send(vec![SendWr::new(3, SendOp::Write { remote_addr: addr, rkey }, vec![a.2.sge(0..6000)])]).unwrap();
        one(&a.1);
        a.0.post_send(vec![SendWr::new(4, SendOp::Read { remote_addr: addr, rkey }, vec![a.2.sge(20_000..26_000)])])
            .unwrap();
        one(&a.1);
        assert_eq!(&a.2.as_slice()[20_000..26_000], &data[..]);
    }
    // The providers' last reports leave as they close.
    drop((a, b));
    let s = stat(rt, "tq");
    let n = |k: &str| s[k].as_u64().unwrap();
    assert_eq!(n("providers"), 0, "{s}");
    assert_eq!(n("daemon_udp_rcvd"), 0, "{s}");
    // 10 rounds of 13 request packets and 8 answers at least (an ACK for the SEND, one for the
    // WRITE, 6 READ responses).
    assert!(n("sent_pkts") >= 10 * (13 + 8), "{s}");
    assert!(n("dropped_by_fault") > 0 && n("retransmitted_pkts") > 0, "{s}");
    let (sent, dropped, dups) = (n("sent_pkts"), n("dropped_by_fault"), n("duplicated_by_fault"));
    drop(g);
    let o = cmd(rt).args(["pcap", "check", pcap.to_str().unwrap()]).output().unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let field = |k: &str| -> u64 {
        let line = out.lines().find(|l| l.trim_start().starts_with(k)).unwrap_or_else(|| panic!("{k}: {out}"));
        line.trim_start()[k.len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    let (frames, good) = (field("IB packets"), field("good ICRC"));
    assert_eq!(frames, good, "{out}");
    // Every packet a provider put on the wire is there once (the fault injector's drops never
    // left), none twice: a receiver does not capture what its sender on the device did.
    eprintln!("captured {frames}, sent {sent}, dropped {dropped}, duplicated {dups}");
    assert!(frames > 0 && frames == sent - dropped + dups, "{frames} captured, {sent} sent, {dropped} dropped: {out}");
    // Each provider's QP sends from a source port of its process's own pool (flow entropy, as
    // the daemon's QPs), never from the device's port: two QPs in two processes, two ports.
    let bytes = std::fs::read(&pcap).unwrap();
    let mut sports = std::collections::BTreeSet::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let f = &bytes[at + 16..(at + 16 + len).min(bytes.len())];
        if f.len() >= 14 + 28 && f[12..14] == [0x08, 0x00] {
            let udp = 14 + usize::from(f[14] & 0x0f) * 4;
            sports.insert(u16::from_be_bytes([f[udp], f[udp + 1]]));
        }
        at += 16 + len;
    }
    assert_eq!(sports.len(), 2, "source ports {sports:?}");
    assert!(sports.iter().all(|&p| p >= 0xc000 && p != 47949), "source ports {sports:?}");
}

/// A provider polls its CQs straight from its engine (no completion ring between them): a CQ
/// holds `cqe` completions, and the one after them overruns it (IBTA 11.4.2.1: IBV_EVENT_CQ_ERR,
/// the completion lost), as a NIC's CQ of that size does; what it held is still polled, in order.
/// (With a ring beside the engine's queue, the CQ held twice its size.)
#[test]
fn a_providers_cq_holds_cqe_completions_then_overruns() {
    use softrdma_device::verbs::*;
    use softrdma_engine::device::AsyncEvent;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "tq", "127.0.0.1", 47956, &[]);
    let ctx = Context::provider_in(rt, "tq").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let small = ctx.create_cq(4, None).unwrap();
    let big = ctx.create_cq(64, None).unwrap();
    let a = pd.qp_builder(QpType::Rc, &small).build().unwrap();
    let b = pd.qp_builder(QpType::Rc, &big).build().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mr = pd.alloc_mr(1 << 16, access).unwrap();
    let o = ConnectOptions { mtu: Mtu::Mtu1024, ..ConnectOptions::default() };
    a.connect(1, &b.endpoint(2), &o).unwrap();
    b.connect(2, &a.endpoint(1), &o).unwrap();
    let (addr, rkey) = (mr.addr() + 0x8000, mr.rkey());
    let write = |id: u64| {
        a.post_send(vec![SendWr::new(id, SendOp::Write { remote_addr: addr, rkey }, vec![mr.sge(0..64)])]).unwrap();
    };
    // Four WRITEs complete and fill the CQ; nobody polls it. The peer's polls make the device
    // progress (as the progress thread would).
    for id in 1..=4 {
        write(id);
    }
    // (Polls of the peer's CQ, empty, drive the device meanwhile: 300 ms is ample on loopback.)
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        assert!(big.poll(1).unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        matches!(ctx.get_async_event(Some(Duration::from_millis(100))), Ok(None)),
        "no event while the CQ has room"
    );
    // The fifth overruns it.
    write(5);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut event = None;
    while event.is_none() && Instant::now() < deadline {
        assert!(big.poll(1).unwrap().is_empty());
        event = ctx.get_async_event(Some(Duration::from_millis(10))).unwrap();
    }
    assert_eq!(event.map(|e| e.event), Some(AsyncEvent::CqErr(small.id())), "the overrun's event");
    let got = small.poll(16).unwrap();
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
}

/// A provider's QPs attached to a multicast group: the daemon passes the group's datagrams to
/// the process while any of its QPs is attached, and stops when the last one detaches or is
/// destroyed attached (ibv_destroy_qp detaches, as the kernel's uverbs does). Attaching a QP
/// twice is one attachment (as in the engine and in rxe): one detach ends it. `softrdma stat`
/// shows the count per group ("providers").
#[test]
fn a_providers_multicast_attachments_are_passed_on_while_a_qp_is_attached() {
    use softrdma_device::verbs::*;
    let (_base, rt) = rtdir();
    let rt = rt.as_path();
    let _g = up(rt, "mq", "127.0.0.1", 47958, &[]);
    let providers = |g: &str| -> u64 {
        let s = stat(rt, "mq");
        s["mcast_groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["group"] == g)
            .map_or(0, |e| e["providers"].as_u64().unwrap())
    };
    let ctx = Context::provider_in(rt, "mq").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qa = pd.qp_builder(QpType::Ud, &cq).build().unwrap();
    let qb = pd.qp_builder(QpType::Ud, &cq).build().unwrap();
    let (g, h): (std::net::IpAddr, std::net::IpAddr) = ("239.1.2.3".parse().unwrap(), "239.1.2.4".parse().unwrap());
    assert_eq!(providers("239.1.2.3"), 0);
    qa.attach_mcast(g).unwrap();
    qa.attach_mcast(g).unwrap();
    qb.attach_mcast(g).unwrap();
    qb.attach_mcast(h).unwrap();
    assert_eq!((providers("239.1.2.3"), providers("239.1.2.4")), (1, 1));
    // One detach ends qa's double attachment; qb still holds the process in the group.
    qa.detach_mcast(g).unwrap();
    assert!(matches!(qa.detach_mcast(g), Err(Error::Verbs(VerbsError::Inval))), "qa is no longer attached");
    assert_eq!(providers("239.1.2.3"), 1);
    // qb destroyed while attached to both.
    drop(qb);
    assert_eq!((providers("239.1.2.3"), providers("239.1.2.4")), (0, 0));
    qa.attach_mcast(h).unwrap();
    assert_eq!(providers("239.1.2.4"), 1);
    // The process's end (its context closed) ends its attachments too.
    drop(qa);
    drop(cq);
    drop(pd);
    drop(ctx);
    let t = Instant::now();
    while providers("239.1.2.4") != 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(providers("239.1.2.4"), 0);
}
