//! Steering on a real `SO_REUSEPORT` group on loopback (127.0.0.0/8): the kernel runs the
//! program the device installs and hands each datagram to the member owning its destination QPN.
//! Ports are picked by the kernel (port 0), so tests run in parallel; every wait has a deadline.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use softrdma_transport::steer::{block_start, Member, BLOCK_QPNS, DAEMON_INDEX};
use softrdma_transport::udp::{BindProblem, RoceUdp, UdpConfig, UdpError};

const ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const DEADLINE: Duration = Duration::from_secs(3);

fn steered_device() -> RoceUdp {
    let cfg = UdpConfig { port: 0, sport_count: 0, steered: true, ..UdpConfig::new(ADDR) };
    RoceUdp::bind(&cfg).expect("a steered device on 127.0.0.1")
}

/// A datagram whose BTH names `qpn`, tagged with `tag` after the BTH.
fn bth(qpn: u32, tag: u32) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[0] = 0x04;
    p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    p[12..16].copy_from_slice(&tag.to_be_bytes());
    p
}

/// The tags each endpoint received until `want` tags arrived overall or the deadline passed.
fn collect(eps: &mut [&mut RoceUdp], want: usize) -> Vec<Vec<u32>> {
    let mut got = vec![Vec::new(); eps.len()];
    let start = Instant::now();
    while got.iter().map(Vec::len).sum::<usize>() < want && start.elapsed() < DEADLINE {
        for (i, ep) in eps.iter_mut().enumerate() {
            ep.recv(&mut |d| {
                let t = d.payload.get(12..16).map_or(u32::MAX, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                got[i].push(t);
            })
            .expect("recv");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Anything late would show up as an extra tag.
    std::thread::sleep(Duration::from_millis(20));
    for (i, ep) in eps.iter_mut().enumerate() {
        ep.recv(&mut |d| got[i].push(u32::from_be_bytes([d.payload[12], d.payload[13], d.payload[14], d.payload[15]])))
            .expect("recv");
    }
    for g in &mut got {
        g.sort_unstable();
    }
    got
}

fn member(dev: &mut RoceUdp) -> (u32, RoceUdp) {
    let Member { index, fd } = dev.steering_mut().unwrap().add_member().expect("a member");
    (index, RoceUdp::from_member(fd).expect("the member as an endpoint"))
}

#[test]
fn each_datagram_reaches_the_member_that_owns_its_qpn() {
    let mut dev = steered_device();
    let to = dev.local_addr();
    let (i1, mut c1) = member(&mut dev);
    let (i2, mut c2) = member(&mut dev);
    assert_eq!((i1, i2), (1, 2));
    let b1 = dev.steering_mut().unwrap().assign_block(i1, |_| true).unwrap().expect("a block for member 1");
    let b1b = dev.steering_mut().unwrap().assign_block(i1, |_| true).unwrap().expect("a second block for member 1");
    let b2 = dev.steering_mut().unwrap().assign_block(i2, |_| true).unwrap().expect("a block for member 2");
    assert_eq!(b1b, b1 + 1, "a member's blocks stay together");
    let s = dev.steering().unwrap();
    assert_eq!(s.owner(block_start(b1) + 5), i1);
    assert_eq!(s.owner(block_start(b2)), i2);
    assert_eq!(s.installs(), 4);

    let tx = UdpSocket::bind((ADDR, 0)).unwrap();
    let sends: [(u32, u32); 8] = [
        (block_start(b1), 10),
        (block_start(b1b) + BLOCK_QPNS - 1, 11),
        (block_start(b2) + 7, 20),
        (1, 30),                       // QP1: the CM is the daemon's
        (0xFF_FFFF, 31),               // multicast
        (block_start(b2 + 1) + 1, 32), // a block nobody has
        (block_start(b1) + 3, 12),
        (block_start(b2) + 9, 21),
    ];
    for (qpn, tag) in sends {
        tx.send_to(&bth(qpn, tag), to).unwrap();
    }
    // Shorter than a BTH: the program's load fails, which returns the daemon's index.
    tx.send_to(&[0x04, 0, 0xff], to).unwrap();
    let got = collect(&mut [&mut dev, &mut c1, &mut c2], 9);
    assert_eq!(got[0].len(), 4, "daemon: {:?}", got[0]);
    assert_eq!(&got[0][..3], &[30, 31, 32]);
    assert_eq!(got[1], vec![10, 11, 12]);
    assert_eq!(got[2], vec![20, 21]);
}

#[test]
fn a_client_closing_its_socket_moves_no_other_clients_traffic_and_a_released_member_is_reused() {
    let mut dev = steered_device();
    let to = dev.local_addr();
    let (i1, c1) = member(&mut dev);
    let (i2, mut c2) = member(&mut dev);
    let b1 = dev.steering_mut().unwrap().assign_block(i1, |_| true).unwrap().unwrap();
    let b2 = dev.steering_mut().unwrap().assign_block(i2, |_| true).unwrap().unwrap();
    // The client of member 1 goes away: its descriptor closes, the group's copy stays, and the
    // kernel does not move member 2 into slot 1.
    drop(c1);
    let tx = UdpSocket::bind((ADDR, 0)).unwrap();
    tx.send_to(&bth(block_start(b2), 1), to).unwrap();
    tx.send_to(&bth(block_start(b2) + 1, 2), to).unwrap();
    let got = collect(&mut [&mut dev, &mut c2], 2);
    assert_eq!(got, vec![vec![], vec![1, 2]]);

    // The device takes member 1's blocks back: its QPNs now reach the daemon.
    dev.steering_mut().unwrap().release(i1).unwrap();
    assert!(dev.steering().unwrap().blocks_of(i1).is_empty());
    tx.send_to(&bth(block_start(b1), 3), to).unwrap();
    let got = collect(&mut [&mut dev, &mut c2], 1);
    assert_eq!(got, vec![vec![3], vec![]]);
    // A released member cannot be given blocks until a client has it again.
    assert_eq!(dev.steering_mut().unwrap().assign_block(i1, |_| true).unwrap(), None);
    let (again, mut c3) = member(&mut dev);
    assert_eq!(again, i1, "the spare member is handed out again");
    let b3 = dev.steering_mut().unwrap().assign_block(again, |_| true).unwrap().unwrap();
    tx.send_to(&bth(block_start(b3), 4), to).unwrap();
    let got = collect(&mut [&mut dev, &mut c2, &mut c3], 1);
    assert_eq!(got, vec![vec![], vec![], vec![4]]);
    assert_eq!(dev.steering().unwrap().members(), 3);
}

#[test]
fn the_daemon_and_unknown_members_never_get_blocks() {
    let mut dev = steered_device();
    let s = dev.steering_mut().unwrap();
    assert_eq!(s.assign_block(DAEMON_INDEX, |_| true).unwrap(), None);
    assert_eq!(s.assign_block(7, |_| true).unwrap(), None);
    // A block the device refuses (it has a QP there) is passed over.
    let (i, _c) = member(&mut dev);
    let b = dev.steering_mut().unwrap().assign_block(i, |b| b > 5).unwrap();
    assert_eq!(b, Some(6));
}

#[test]
fn a_steered_port_is_not_shared_with_a_second_device() {
    let dev = steered_device();
    let port = dev.local_addr().port();
    // A second steered device on the same port: its plain probe bind finds the port in use
    // instead of joining the group (same uid would be allowed to join).
    let cfg = UdpConfig { port, sport_count: 0, steered: true, ..UdpConfig::new(ADDR) };
    match RoceUdp::bind(&cfg) {
        Err(UdpError::Bind { problem: BindProblem::InUse, .. }) => {}
        other => panic!("expected address in use, got {other:?}"),
    }
    let plain = UdpConfig { port, sport_count: 0, ..UdpConfig::new(ADDR) };
    assert!(matches!(RoceUdp::bind(&plain), Err(UdpError::Bind { problem: BindProblem::InUse, .. })));
    assert_eq!(dev.local_addr(), SocketAddr::new(ADDR, port));
}
