//! Which interface holds an address, its MTU, and the port's active MTU from it.

use std::net::IpAddr;

use nix::sys::socket::SockaddrStorage;
use softrdma_engine::verbs::Mtu;

use super::ROCE_HEADER_OVERHEAD;

/// The MTU of the interface that holds `addr` ([`interface_of`]), from
/// `/sys/class/net/<name>/mtu`; `None` if no interface holds it, or for the unspecified address.
/// So 127.0.0.2 gives lo's MTU (65536).
pub fn interface_mtu(addr: IpAddr) -> Option<u32> {
    let name = interface_of(addr)?;
    // An alias label ("eth0:1") names the address, not a device; the MTU is the device's.
    let device = name.split(':').next()?;
    if device.is_empty() || device.contains('/') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{device}/mtu")).ok()?.trim().parse().ok()
}

/// The name of the network interface that holds `addr`, the one rule for every place that names
/// a device's interface (its MTU here, `ndev_ifindex` in the verbs shim, the interface the
/// command presents in sysfs); `None` for the unspecified address or when no interface holds it.
///
/// An interface holds `addr` when it lists it exactly (the first such interface, as
/// `getifaddrs(3)` lists them), else when it is a loopback interface (`IFF_LOOPBACK`) and one of
/// its addresses' prefixes contains `addr`: Linux delivers all of 127.0.0.0/8 locally through
/// `lo` although only 127.0.0.1/8 is listed, so a device at 127.0.0.5 is on `lo`. Other subnets
/// do not count: a device can bind only an address of this host, and the loopback prefix is the
/// only one whose unlisted addresses are.
///
/// The name may be an IPv4 alias label (`eth0:1`), which names the address rather than a device.
pub fn interface_of(addr: IpAddr) -> Option<String> {
    if addr.is_unspecified() {
        return None;
    }
    let interfaces: Vec<_> = nix::ifaddrs::getifaddrs().ok()?.collect();
    let ip_of = |s: &Option<SockaddrStorage>| -> Option<IpAddr> {
        let s = s.as_ref()?;
        if let Some(v4) = s.as_sockaddr_in() {
            return Some(IpAddr::V4(v4.ip()));
        }
        s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
    };
    if let Some(exact) = interfaces.iter().find(|i| ip_of(&i.address) == Some(addr)) {
        return Some(exact.interface_name.clone());
    }
    interfaces
        .iter()
        .filter(|i| i.flags.contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK))
        .find(|i| match (ip_of(&i.address), ip_of(&i.netmask)) {
            (Some(a), Some(m)) => same_prefix(a, addr, m),
            _ => false,
        })
        .map(|i| i.interface_name.clone())
}

/// Whether `a` and `b` agree under `mask` (all three of one family).
fn same_prefix(a: IpAddr, b: IpAddr, mask: IpAddr) -> bool {
    match (a, b, mask) {
        (IpAddr::V4(a), IpAddr::V4(b), IpAddr::V4(m)) => {
            let m = u32::from(m);
            u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b), IpAddr::V6(m)) => {
            let m = u128::from(m);
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

/// The port's active MTU for an interface MTU, as Linux rxe derives it: `rxe_set_mtu()`
/// (`drivers/infiniband/sw/rxe/rxe.c`) calls `eth_mtu_int_to_enum()` (`rxe_param.h`), which
/// subtracts `RXE_MAX_HDR_LENGTH` (80, `rxe_hdr.h`: [`ROCE_HEADER_OVERHEAD`]) and rounds down to
/// 256, 512, 1024, 2048 or 4096; a result under 256 becomes 256.
///
/// So lo (65536) and 9000-byte jumbo frames give 4096, a 1500-byte Ethernet 1024 (1420 left), and
/// 1280 also 1024. The thresholds are 4176, 2128, 1104 and 592.
pub fn active_mtu(iface_mtu: u32) -> Mtu {
    Mtu::at_most(iface_mtu.saturating_sub(ROCE_HEADER_OVERHEAD) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(same_prefix(ip("127.0.0.1"), ip("127.0.0.5"), ip("255.0.0.0")));
        assert!(!same_prefix(ip("10.0.0.1"), ip("10.0.1.1"), ip("255.255.255.0")));
        assert!(!same_prefix(ip("10.0.0.1"), ip("::1"), ip("255.0.0.0")));
        assert!(same_prefix(ip("fd00::1"), ip("fd00::2"), ip("ffff:ffff:ffff:ffff::")));
    }

    #[test]
    fn loopback_addresses_are_on_lo() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // Where the test runs, lo may be down (a new network namespace): then no interface holds
        // 127.0.0.1 either, and there is nothing to check.
        if let Some(lo) = interface_of(ip("127.0.0.1")) {
            assert_eq!(interface_of(ip("127.0.0.5")), Some(lo));
        }
        assert_eq!(interface_of(ip("0.0.0.0")), None);
    }
}
