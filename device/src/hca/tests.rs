//! The device thread's own tests: a malformed ring entry, and the IP multicast groups.

use super::*;
use softrdma_engine::device::{QpCaps, QpInit};

fn call(h: &Hca, o: u32, r: Request) -> Response {
    h.call(o, r, Vec::new()).0
}

#[test]
fn a_malformed_ring_entry_cuts_off_that_client_only() {
    let mut c = HcaConfig::new("mal", "127.0.0.1".parse().unwrap());
    c.port = 47942;
    let h = Hca::start(c).unwrap();
    let me = std::process::id() as i32;
    let (bad, good) = (h.attach(me).unwrap(), h.attach(me).unwrap());
    for o in [bad.owner, good.owner] {
        let Response::Pd(pd) = call(&h, o, Request::AllocPd) else { panic!() };
        let Response::Cq { cq, .. } = call(&h, o, Request::CreateCq { cqe: 8, channel: None }) else { panic!() };
        let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let init = QpInit { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq: None };
        let Response::Qp { sq: Some(sq), .. } = call(&h, o, Request::CreateQp(init)) else { panic!() };
        if o == bad.owner {
            let arena = Arena::open(bad.arena.try_clone().unwrap()).unwrap();
            // Not a work request: one byte where a SendEntry should be.
            assert!(arena.produce(&sq, &7u8).unwrap());
            arena.posted().fetch_add(1, Ordering::Release);
            nix::unistd::write(&bad.doorbell, &1u64.to_ne_bytes()).unwrap();
        }
    }
    let t0 = std::time::Instant::now();
    while h.is_attached(bad.owner) {
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "the bad client was not cut off");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(h.is_attached(good.owner));
    assert!(matches!(call(&h, good.owner, Request::AllocPd), Response::Pd(_)));
    assert_eq!(h.counters().1.ring_malformed, 1);
    assert!(matches!(call(&h, bad.owner, Request::AllocPd), Response::Err(VerbsError::Inval)));
}

/// The host's multicast memberships (/proc/net/igmp: each group as hex of the address read
/// in host order) include `g`.
fn igmp_has(g: std::net::Ipv4Addr) -> bool {
    let want = format!("{:08X}", u32::from_ne_bytes(g.octets()));
    std::fs::read_to_string("/proc/net/igmp").is_ok_and(|t| t.contains(&want))
}

fn igmp_left(g: std::net::Ipv4Addr) -> bool {
    let t0 = std::time::Instant::now();
    while igmp_has(g) {
        if t0.elapsed() > std::time::Duration::from_secs(2) {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

/// A UD rdma_cm ID of client `o` bound to the device's address joins `g` as a full member.
/// Returns the ID and the read end of its event channel.
fn cm_join(h: &Hca, o: u32, g: std::net::Ipv4Addr) -> (u32, OwnedFd) {
    let (r, w) = nix::unistd::pipe().unwrap();
    let Response::CmChannel(channel) = h.call(o, Request::CmCreateChannel, vec![w]).0 else { panic!() };
    let ps = softrdma_engine::cm::PS_UDP;
    let Response::CmId(id) = call(h, o, Request::CmCreateId { channel, ps, qp_type: QpType::Ud, user: 0 }) else {
        panic!()
    };
    let local = Some("127.0.0.1:0".parse().unwrap());
    assert!(matches!(call(h, o, Request::CmSetAddrs { id, local, remote: None, tos: 0 }), Response::Ok));
    let r2 = call(h, o, Request::CmJoin { id, group: g.into(), send_only: false, user: 0 });
    assert!(matches!(r2, Response::Ok), "{r2:?}");
    (id, r)
}

#[test]
fn the_last_leave_and_a_departed_member_take_the_device_out_of_the_ip_group_at_once() {
    let mut c = HcaConfig::new("mcl", "127.0.0.1".parse().unwrap());
    c.port = 47944;
    let h = Hca::start(c).unwrap();
    let p = std::process::id();
    let g = std::net::Ipv4Addr::new(239, 201, (p >> 8) as u8, (p as u8).max(1));
    let me = p as i32;
    let a = h.attach(me).unwrap();
    let (id, _chan) = cm_join(&h, a.owner, g);
    assert!(igmp_has(g), "a full member's join makes the device join the IP group");
    // The device thread has looked at the state (and its group sockets) since the join.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(matches!(call(&h, a.owner, Request::CmLeave { id, group: g.into() }), Response::Ok));
    assert!(igmp_left(g), "the device stayed in the IP group after the last leave");
    let b = h.attach(me).unwrap();
    let (_id, _chan2) = cm_join(&h, b.owner, g);
    assert!(igmp_has(g));
    std::thread::sleep(std::time::Duration::from_millis(20));
    h.detach(b.owner);
    assert!(igmp_left(g), "the device stayed in the IP group after its member's client went");
    h.stop();
}

/// A provider's report to its daemon is a call that waits for the daemon's answer: it is made
/// with the device's state unlocked, so that the program's threads never wait on the lock for
/// the daemon to be scheduled (`State::publish`). The forced last report, when the device
/// stops, is the exception.
#[test]
fn a_providers_report_goes_with_the_state_unlocked() {
    use std::sync::{OnceLock, Weak};
    let shared: Arc<OnceLock<Weak<Shared>>> = Arc::default();
    let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (sh2, seen2) = (shared.clone(), seen.clone());
    let mut c = HcaConfig::new("pub", "127.0.0.1".parse().unwrap());
    c.port = 47970;
    c.progress = Progress::Application;
    c.publish = Some(Publisher(Arc::new(move |_report| {
        let unlocked = sh2.get().and_then(Weak::upgrade).is_some_and(|sh| sh.state.try_lock().is_ok());
        seen2.lock().unwrap().push(unlocked);
    })));
    let h = Hca::start(c).unwrap();
    shared.set(Arc::downgrade(&h.shared)).unwrap();
    // Something to report: datagrams that are no RoCE packets (the counters move).
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let t0 = std::time::Instant::now();
    while seen.lock().unwrap().len() < 2 && t0.elapsed() < std::time::Duration::from_secs(5) {
        s.send_to(&[1, 2, 3], "127.0.0.1:47970").unwrap();
        // An application call pumps too, and leaves its report to the device thread.
        h.drive(true);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 2, "no reports were made: {seen:?}");
    assert!(seen.iter().all(|&unlocked| unlocked), "a report was made with the state locked: {seen:?}");
    h.stop();
}
