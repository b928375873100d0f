//! The RoCEv2 UDP transport on loopback: 127.0.0.1 and 127.0.0.2 (all of 127/8 is local) and ::1.
//!
//! Each test uses its own range of receive ports and source-port pools, and binding skips ports
//! someone else holds, so tests run in parallel (and beside other programs) without colliding.
//! Every receive loop has a deadline of a few seconds.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::thread::sleep;
use std::time::{Duration, Instant};

use softrdma_engine::verbs::Mtu;
use softrdma_transport::udp::{
    active_mtu, interface_mtu, BindProblem, Datagram, RoceUdp, UdpConfig, UdpError, MAX_GSO_BYTES, RECV_BUDGET,
};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// How long a test waits for datagrams that should arrive at once.
const DEADLINE: Duration = Duration::from_secs(5);

fn config(addr: IpAddr, port: u16, sport_base: u16, sport_count: u16) -> UdpConfig {
    UdpConfig { addr, port, sport_base, sport_count, gso: true, gro: true, steered: false }
}

/// Devices on `addrs` sharing one receive port (peers send to their own port number), searching
/// ports from `first_port` and skipping ports someone else holds. Pools start at `sport_base`.
fn bind_group(
    addrs: &[IpAddr],
    first_port: u16,
    sport_base: u16,
    sport_count: u16,
    gso: bool,
    gro: bool,
) -> Vec<RoceUdp> {
    'ports: for port in first_port..first_port + 100 {
        let mut devices = Vec::new();
        for &addr in addrs {
            let cfg = UdpConfig { addr, port, sport_base, sport_count, gso, gro, steered: false };
            match RoceUdp::bind(&cfg) {
                Ok(d) => devices.push(d),
                Err(UdpError::Bind { problem: BindProblem::InUse, local, .. }) if local.port() == port => {
                    continue 'ports
                }
                Err(e) => panic!("bind {addr}:{port}: {e}"),
            }
        }
        return devices;
    }
    panic!("no free port in {first_port}..{}", first_port + 100);
}

/// A received datagram, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Got {
    src: SocketAddr,
    dst: Option<IpAddr>,
    ttl: Option<u8>,
    tos: Option<u8>,
    payload: Vec<u8>,
}

impl From<Datagram<'_>> for Got {
    fn from(d: Datagram<'_>) -> Got {
        Got { src: d.src, dst: d.dst, ttl: d.ttl, tos: d.tos, payload: d.payload.to_vec() }
    }
}

/// Receives until `want` datagrams arrived or the deadline passed, then checks for a short while
/// that nothing more comes.
fn collect(dev: &mut RoceUdp, want: usize) -> Vec<Got> {
    let mut got = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while got.len() < want && Instant::now() < deadline {
        let n = dev.recv(&mut |d| got.push(Got::from(d))).expect("recv");
        if n == 0 {
            sleep(Duration::from_millis(1));
        }
    }
    let quiet = Instant::now() + Duration::from_millis(30);
    while Instant::now() < quiet {
        dev.recv(&mut |d| got.push(Got::from(d))).expect("recv");
        sleep(Duration::from_millis(1));
    }
    got
}

fn read_number(path: &str) -> u32 {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().unwrap()
}

fn payload(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag ^ (i as u8).wrapping_mul(7)).collect()
}

#[test]
fn ipv4_between_two_addresses_from_pool_ports() {
    let mut devs = bind_group(&[A, B], 21_000, 0xC100, 4, true, true);
    let mut b = devs.pop().unwrap();
    let mut a = devs.pop().unwrap();
    assert_eq!(a.port(), b.port());
    assert_eq!(a.local_addr(), SocketAddr::new(A, a.port()));
    assert_eq!(a.sport_count(), 4);

    // One datagram from each pool port, and one from the receive socket itself.
    let base = a.sport_base();
    assert!((0xC100..=0xFFFC).contains(&base), "pool base {base:#x}");
    let mut ports: Vec<u16> = (0..4).map(|i| base + i).collect();
    ports.push(a.port());
    for (i, &port) in ports.iter().enumerate() {
        a.send(B, port, &payload(i as u8, 64 + i)).unwrap();
    }
    let got = collect(&mut b, ports.len());
    assert_eq!(got.len(), ports.len(), "{got:?}");

    let ttl = read_number("/proc/sys/net/ipv4/ip_default_ttl") as u8;
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.src, SocketAddr::new(A, ports[i]), "datagram {i}");
        assert_eq!(g.dst, Some(B));
        assert_eq!(g.ttl, Some(ttl));
        assert_eq!(g.tos, Some(0));
        assert_eq!(g.payload, payload(i as u8, 64 + i));
    }
    assert_eq!(a.stats().sent, 5);
    assert_eq!(b.stats().received, 5);

    // And back, from B's pool.
    b.send(A, b.sport_base() + 3, b"pong").unwrap();
    let got = collect(&mut a, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].src, SocketAddr::new(B, b.sport_base() + 3));
    assert_eq!(got[0].dst, Some(A));
    assert_eq!(got[0].payload, b"pong");

    // Ports that are not ours, and the other family, are refused.
    for port in [base.wrapping_sub(1), base + 4, 4791] {
        let e = a.send(B, port, b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "port {port}: {e}");
    }
    assert_eq!(a.send(V6, base, b"x").unwrap_err().kind(), io::ErrorKind::InvalidInput);

    // Nothing queued: recv returns 0 and does not block.
    let t = Instant::now();
    assert_eq!(a.recv(&mut |_| panic!("nothing was sent")).unwrap(), 0);
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn ipv6_on_loopback() {
    // ::1 is a single address, so the device talks to itself: pool port -> its own receive port.
    let mut devs = bind_group(&[V6], 21_200, 0xC200, 2, true, true);
    let mut d = devs.pop().unwrap();
    assert_eq!(d.local_addr(), SocketAddr::new(V6, d.port()));
    for i in 0..2 {
        d.send(V6, d.sport_base() + i, &payload(i as u8, 100)).unwrap();
    }
    let got = collect(&mut d, 2);
    assert_eq!(got.len(), 2, "{got:?}");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.src.ip(), V6);
        assert_eq!(g.src.port(), d.sport_base() + i as u16);
        assert_eq!(g.dst, Some(V6));
        assert!(g.ttl.is_some_and(|t| t > 0), "hop limit {:?}", g.ttl);
        assert_eq!(g.tos, Some(0));
        assert_eq!(g.payload, payload(i as u8, 100));
    }
    assert_eq!(d.send(A, d.sport_base(), b"x").unwrap_err().kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn ipv6_wildcard_is_v6_only() {
    // With IPV6_V6ONLY, a device on [::]:p leaves 0.0.0.0:p to IPv4.
    let mut devs = bind_group(&[IpAddr::V6(Ipv6Addr::UNSPECIFIED)], 21_300, 0xC300, 1, true, true);
    let d = devs.pop().unwrap();
    let v4 = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, d.port()));
    assert!(v4.is_ok(), "IPv4 wildcard on port {} is taken: {v4:?}", d.port());
}

/// 10 segments of 1000 bytes and a last one of 300, each numbered.
fn segmented() -> (Vec<u8>, Vec<Vec<u8>>) {
    let segments: Vec<Vec<u8>> = (0..11).map(|i| payload(0x40 + i as u8, if i == 10 { 300 } else { 1000 })).collect();
    (segments.concat(), segments)
}

fn gso_case(first_port: u16, sport_base: u16, gso: bool, gro: bool) {
    let mut devs = bind_group(&[A, B], first_port, sport_base, 2, gso, gro);
    let mut b = devs.pop().unwrap();
    let mut a = devs.pop().unwrap();
    assert_eq!(b.gro_enabled(), gro, "GRO not available on this kernel");
    let (buf, segments) = segmented();
    let port = a.sport_base() + 1;
    a.send_segments(B, port, &buf, 1000).unwrap();

    let got = collect(&mut b, 11);
    let lens: Vec<usize> = got.iter().map(|g| g.payload.len()).collect();
    assert_eq!(lens, [1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 300], "gso {gso} gro {gro}");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.payload, segments[i], "segment {i} (gso {gso} gro {gro})");
        assert_eq!(g.src, SocketAddr::new(A, port));
        assert_eq!(g.dst, Some(B));
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.sent, 11);
    assert_eq!(sb.received, 11);
    if a.gso_enabled() {
        assert_eq!((sa.send_calls, sa.gso_sends), (1, 1), "gro {gro}");
    } else {
        assert!(!gso || sa.gso_sends == 0);
        assert_eq!(sa.send_calls, 11);
    }
    if !gro {
        assert_eq!(sb.gro_buffers, 0);
    }
    eprintln!(
        "gso {gso} (active {}) gro {gro}: {} send calls, {} receive buffers held more than one datagram",
        a.gso_enabled(),
        sa.send_calls,
        sb.gro_buffers
    );
}

#[test]
fn gso_segments_arrive_as_datagrams_gro_on() {
    gso_case(21_400, 0xC400, true, true);
}

#[test]
fn gso_segments_arrive_as_datagrams_gro_off() {
    gso_case(21_500, 0xC500, true, false);
}

#[test]
fn segments_without_gso_arrive_as_datagrams() {
    gso_case(21_600, 0xC600, false, true);
    gso_case(21_700, 0xC700, false, false);
}

#[test]
fn segment_limits() {
    let mut devs = bind_group(&[A], 21_800, 0xC800, 1, true, true);
    let mut a = devs.pop().unwrap();
    let port = a.sport_base();
    assert_eq!(a.max_segments(), 64);
    let invalid = |r: io::Result<()>| r.unwrap_err().kind() == io::ErrorKind::InvalidInput;
    assert!(invalid(a.send_segments(A, port, &[0; 65 * 100], 100)), "65 segments");
    assert!(invalid(a.send_segments(A, port, &vec![0; MAX_GSO_BYTES + 1], 2000)), "too many bytes");
    assert!(invalid(a.send_segments(A, port, &[0; 100], 0)), "segment size 0");
    assert!(invalid(a.send_segments(A, 1, &[0; 200], 100)), "not our port");
    assert_eq!(a.stats().sent, 0);

    // The largest call allowed: 64 segments within MAX_GSO_BYTES, to itself.
    let seg = MAX_GSO_BYTES / 64;
    let buf: Vec<u8> = (0..64 * seg).map(|i| (i / seg) as u8).collect();
    a.send_segments(A, port, &buf, seg).unwrap();
    let got = collect(&mut a, 64);
    assert_eq!(got.len(), 64);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.payload.len(), seg);
        assert!(g.payload.iter().all(|&x| x == i as u8), "segment {i}");
    }
    // One segment (buffer no longer than the segment size) is a plain send.
    a.send_segments(A, port, b"short", 1000).unwrap();
    let got = collect(&mut a, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, b"short");
}

#[test]
fn recv_budget_bounds_one_call() {
    let mut devs = bind_group(&[A, B], 21_900, 0xC900, 1, false, false);
    let mut b = devs.pop().unwrap();
    let mut a = devs.pop().unwrap();
    let total = RECV_BUDGET + 44;
    for i in 0..total {
        a.send(B, a.sport_base(), &(i as u32).to_be_bytes()).unwrap();
    }
    // Loopback delivers at once; wait until everything is queued.
    sleep(Duration::from_millis(100));
    let mut seen = Vec::new();
    let first = b.recv(&mut |d| seen.push(u32::from_be_bytes(d.payload.try_into().unwrap()))).unwrap();
    assert_eq!(first, RECV_BUDGET);
    let rest = collect(&mut b, total - first);
    seen.extend(rest.iter().map(|g| u32::from_be_bytes(g.payload[..].try_into().unwrap())));
    assert_eq!(seen, (0..total as u32).collect::<Vec<_>>());
    assert_eq!(a.send_drops(), 0);
}

#[test]
fn a_lone_read_takes_one_buffer_and_leaves_the_rest_queued() {
    let mut devs = bind_group(&[A, B], 22_300, 0xCE00, 1, false, false);
    let mut b = devs.pop().unwrap();
    let mut a = devs.pop().unwrap();
    let mut seen = Vec::new();
    // An empty socket: nothing, and no error.
    assert_eq!(b.recv_lone(&mut |d| seen.push(d.payload.to_vec())).unwrap(), 0);
    for i in 0..5u32 {
        a.send(B, a.sport_base(), &i.to_be_bytes()).unwrap();
    }
    sleep(Duration::from_millis(100));
    // One datagram (one buffer) only; the other four stay in the kernel's queue, in order.
    assert_eq!(b.recv_lone(&mut |d| seen.push(d.payload.to_vec())).unwrap(), 1);
    assert_eq!(seen, vec![0u32.to_be_bytes().to_vec()]);
    assert_eq!(b.recv(&mut |d| seen.push(d.payload.to_vec())).unwrap(), 4);
    assert_eq!(seen, (0..5u32).map(|i| i.to_be_bytes().to_vec()).collect::<Vec<_>>());
}

#[test]
fn bind_conflict_names_the_address() {
    let mut devs = bind_group(&[A], 22_000, 0xCA00, 1, true, true);
    let a = devs.pop().unwrap();
    let e = RoceUdp::bind(&config(A, a.port(), 0xCB00, 1)).unwrap_err();
    assert!(matches!(e, UdpError::Bind { problem: BindProblem::InUse, .. }), "{e:?}");
    // The holder is this test's own socket: the message names this process.
    assert_eq!(
        e.to_string(),
        format!(
            "cannot bind UDP 127.0.0.1:{} (--addr 127.0.0.1): address already in use, held by pid {} ({}) of this \
             user: a device's daemon, or a program still running from a device that stopped (it keeps its member of \
             the device's port); end it, or use another --addr",
            a.port(),
            std::process::id(),
            std::fs::read_to_string("/proc/self/comm").unwrap().trim()
        )
    );

    // An address that is not this host's (TEST-NET-1): no packet is sent, the bind fails.
    let e = RoceUdp::bind(&config("192.0.2.1".parse().unwrap(), 4791, 0xC000, 1)).unwrap_err();
    assert!(matches!(e, UdpError::Bind { problem: BindProblem::NotLocal, .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.starts_with("cannot bind UDP 192.0.2.1:4791 (--addr 192.0.2.1): "), "{text}");
    assert!(text.contains("not an address of this host"), "{text}");

    // A pool that does not fit below 65536.
    let e = RoceUdp::bind(&config(A, 22_050, 0xFFF0, 32)).unwrap_err();
    assert!(matches!(e, UdpError::Config(_)), "{e:?}");
}

#[test]
fn pool_moves_past_taken_ports() {
    // Hold one port of the wanted block: the pool takes the next block of 4.
    let wanted = (0xCC00..0xCD00)
        .step_by(4)
        .find_map(|base: u16| UdpSocket::bind((Ipv4Addr::LOCALHOST, base + 2)).ok().map(|s| (base, s)))
        .expect("a free port");
    let (base, _holder) = wanted;
    let mut devs = bind_group(&[A], 22_100, base, 4, true, true);
    let mut a = devs.pop().unwrap();
    let used = a.sport_base();
    assert_ne!(used, base);
    assert_eq!((used - base) % 4, 0, "base {used:#x} not on the {base:#x} grid");
    assert!(used >= 0xC000 && u32::from(used) + 4 <= 0x1_0000);
    for i in 0..4 {
        a.send(A, used + i, &[i as u8]).unwrap();
    }
    let got = collect(&mut a, 4);
    let srcs: Vec<u16> = got.iter().map(|g| g.src.port()).collect();
    assert_eq!(srcs, (used..used + 4).collect::<Vec<_>>());

    // No pool: everything leaves from the receive port.
    let mut devs = bind_group(&[A], 22_200, 0, 0, true, true);
    let mut d = devs.pop().unwrap();
    assert_eq!((d.sport_count(), d.sport_base()), (0, d.port()));
    d.send(A, d.port(), b"self").unwrap();
    assert!(d.send(A, 0xC000, b"x").is_err());
    let got = collect(&mut d, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].src, SocketAddr::new(A, d.port()));
}

#[test]
fn interface_mtu_of_loopback() {
    let lo = read_number("/sys/class/net/lo/mtu");
    assert_eq!(interface_mtu(A), Some(lo));
    // Not listed (lo has 127.0.0.1/8), but inside lo's prefix.
    assert_eq!(interface_mtu(B), Some(lo));
    assert_eq!(interface_mtu("127.255.0.9".parse().unwrap()), Some(lo));
    assert_eq!(interface_mtu(V6), Some(lo));
    assert_eq!(interface_mtu("192.0.2.1".parse().unwrap()), None);
    assert_eq!(interface_mtu(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), None);
    assert_eq!(active_mtu(lo), if lo >= 4176 { Mtu::Mtu4096 } else { Mtu::at_most(lo as usize - 80) });
}

#[test]
fn active_mtu_as_rxe() {
    let table = [
        (65536, Mtu::Mtu4096),
        (9000, Mtu::Mtu4096),
        (4176, Mtu::Mtu4096),
        (4175, Mtu::Mtu2048),
        (2128, Mtu::Mtu2048),
        (2127, Mtu::Mtu1024),
        (1500, Mtu::Mtu1024),
        (1280, Mtu::Mtu1024),
        (1104, Mtu::Mtu1024),
        (1103, Mtu::Mtu512),
        (592, Mtu::Mtu512),
        (591, Mtu::Mtu256),
        (336, Mtu::Mtu256),
        (100, Mtu::Mtu256),
        (0, Mtu::Mtu256),
    ];
    for (iface, want) in table {
        assert_eq!(active_mtu(iface), want, "interface MTU {iface}");
    }
}

#[test]
fn send_many_delivers_every_message_in_order_in_few_calls() {
    let mut devs = bind_group(&[A, B], 22_400, 0xCF00, 1, true, true);
    let mut b = devs.pop().unwrap();
    let mut a = devs.pop().unwrap();
    let port = a.sport_base();
    // 20 messages (more than one sendmmsg takes): GSO sends of 3 segments and single datagrams
    // in turn, every segment numbered so order and content can be checked.
    let messages: Vec<(Vec<u8>, usize)> = (0..20u8)
        .map(|m| {
            let n = if m % 2 == 0 { 3 } else { 1 };
            let bytes: Vec<u8> = (0..n).flat_map(|s| payload(m * 4 + s, if s == n - 1 { 500 } else { 1200 })).collect();
            (bytes, 1200)
        })
        .collect();
    let list: Vec<(IpAddr, &[u8], usize)> = messages.iter().map(|(m, seg)| (B, m.as_slice(), *seg)).collect();
    a.send_many(port, &list).unwrap();
    let want: Vec<Vec<u8>> = (0..20u8)
        .flat_map(|m| {
            let n = if m % 2 == 0 { 3 } else { 1 };
            (0..n).map(move |s| payload(m * 4 + s, if s == n - 1 { 500 } else { 1200 }))
        })
        .collect();
    let got = collect(&mut b, want.len());
    let got: Vec<Vec<u8>> = got.into_iter().map(|g| g.payload).collect();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "datagrams out of order or changed");
    let s = a.stats();
    assert_eq!(s.sent, want.len() as u64);
    if a.gso_enabled() {
        // 16 messages a call: two calls, 10 of the messages GSO sends.
        assert_eq!((s.send_calls, s.gso_sends), (2, 10));
    }

    // A message no send could carry (segment size 0) fails with its index; the others go.
    let before = b.stats().received;
    let bad: Vec<(IpAddr, &[u8], usize)> = vec![(B, b"one", 100), (B, b"two", 0), (B, b"three", 100)];
    let errs = a.send_many(port, &bad).unwrap_err();
    assert_eq!(errs.iter().map(|(i, e)| (*i, e.kind())).collect::<Vec<_>>(), [(1, io::ErrorKind::InvalidInput)]);
    let got: Vec<Vec<u8>> = collect(&mut b, 2).into_iter().map(|g| g.payload).collect();
    assert_eq!(got, [b"one".to_vec(), b"three".to_vec()]);
    assert_eq!(b.stats().received, before + 2);
}
