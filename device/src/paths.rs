//! The device's path record cache: rdma_cm's route step (`rdma_resolve_route`).
//!
//! RoCE has no subnet administrator: the kernel builds an ID's path record from the routing table
//! and the neighbour table (cma_resolve_iboe_route; the route and neighbour lookups of
//! rdma_resolve_ip). The device does the same lookups, over rtnetlink: RTM_GETROUTE for the
//! (source, destination, ToS) triple gives the output interface, the next hop and the hop limit
//! (the route's RTAX_HOPLIMIT metric, else the interface's default), RTM_GETNEIGH for the next hop
//! on that interface gives the neighbour's link-layer address. What it found is cached per device
//! under (source, destination, ToS), so that a job opening many connections to the same peers
//! (MPI start-up) looks each peer up once: the seed's "local SA path record caching", whose IB
//! form is ibacm's cache in front of SA PathRecord queries.
//!
//! An entry lives `ttl` (default 30 s: as long as the kernel keeps a neighbour REACHABLE,
//! base_reachable_time_ms), and goes earlier when the network changes under it: the device
//! listens to rtnetlink's route, address, link and neighbour notifications, and a route, address
//! or link change drops every entry (any of them may now route differently), a neighbour change
//! drops the entries through that neighbour whose link-layer address it changed or removed. A
//! next hop whose neighbour entry is not known (no ARP answer yet) is not cached: the kernel
//! resolves it with the first datagram the device sends, and the next lookup finds it.
//!
//! Paths an application sets itself (`RDMA_OPTION_IB_PATH`) bypass the cache (counted as
//! `explicit`).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteMetric};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use serde::{Deserialize, Serialize};

/// The default lifetime of an entry.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// At most this many entries (the oldest goes first beyond it).
const MAX_ENTRIES: usize = 4096;

// rtnetlink multicast groups (linux/rtnetlink.h `enum rtnetlink_groups`).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// What a route lookup found: everything of a path record that does not depend on the ID's
/// ports (the flow label does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathInfo {
    /// The output interface (index and name).
    pub ifindex: u32,
    /// The output interface's name.
    pub ifname: String,
    /// Where the packets go next: the gateway, or the destination itself.
    pub next_hop: IpAddr,
    /// The neighbour's answer: its link-layer address (for a loopback or NOARP interface, the
    /// interface's own, as rdma_copy_src_l2_addr takes it).
    pub lladdr: Vec<u8>,
    /// The hop limit the route gives.
    pub hop_limit: u8,
}

pub use softrdma_protocol::proto::PathStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    src: IpAddr,
    dst: IpAddr,
    tos: u8,
}

struct Entry {
    info: PathInfo,
    at: Instant,
}

/// Where lookups come from: rtnetlink, or a test's table.
pub trait Lookup {
    /// The path from `src` to `dst` for type of service `tos`, and whether its next hop's
    /// neighbour answered (false: the route exists, the link-layer address is not known yet).
    fn lookup(&mut self, src: IpAddr, dst: IpAddr, tos: u8) -> io::Result<(PathInfo, bool)>;
    /// Network changes seen since the last call.
    fn changes(&mut self) -> Vec<Change>;
}

/// A change in the network that can make cached paths wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A route, address or link changed (or notifications were lost): every entry goes.
    All,
    /// The neighbour `ip` on interface `ifindex` now answers `lladdr` (None: it is gone or failed).
    Neighbour {
        /// The interface.
        ifindex: u32,
        /// The neighbour's address.
        ip: IpAddr,
        /// Its link-layer address now.
        lladdr: Option<Vec<u8>>,
    },
}

/// The cache.
pub struct PathCache<L: Lookup = Netlink> {
    ttl: Duration,
    entries: HashMap<Key, Entry>,
    lookup: Option<L>,
    stats: PathStats,
}

impl<L: Lookup> PathCache<L> {
    /// A cache over `lookup` whose entries live `ttl` (zero: nothing is cached).
    pub fn with(lookup: L, ttl: Duration) -> Self {
        PathCache { ttl, entries: HashMap::new(), lookup: Some(lookup), stats: PathStats::default() }
    }

    /// The counters.
    pub fn stats(&mut self) -> PathStats {
        self.apply_changes();
        PathStats { entries: self.entries.len() as u64, ..self.stats }
    }

    /// Counts a path an application set itself.
    pub fn count_explicit(&mut self) {
        self.stats.explicit += 1;
    }

    fn apply_changes(&mut self) {
        let Some(l) = self.lookup.as_mut() else { return };
        for c in l.changes() {
            let before = self.entries.len();
            match c {
                Change::All => self.entries.clear(),
                Change::Neighbour { ifindex, ip, lladdr } => self.entries.retain(|_, e| {
                    e.info.ifindex != ifindex || e.info.next_hop != ip || lladdr.as_ref() == Some(&e.info.lladdr)
                }),
            }
            self.stats.invalidated += (before - self.entries.len()) as u64;
        }
    }

    /// The path from `src` to `dst` with type of service `tos`, and whether it came from the
    /// cache; the lookup's error when there is no route.
    pub fn resolve(&mut self, src: IpAddr, dst: IpAddr, tos: u8, now: Instant) -> io::Result<(PathInfo, bool)> {
        self.apply_changes();
        let key = Key { src, dst, tos };
        if let Some(e) = self.entries.get(&key) {
            if now.saturating_duration_since(e.at) < self.ttl {
                self.stats.hits += 1;
                return Ok((e.info.clone(), true));
            }
            self.entries.remove(&key);
            self.stats.expired += 1;
        }
        self.stats.misses += 1;
        let l = self.lookup.as_mut().ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
        let (info, resolved) = l.lookup(src, dst, tos).inspect_err(|_| self.stats.failed += 1)?;
        if !resolved {
            self.stats.unresolved += 1;
        } else if !self.ttl.is_zero() {
            if self.entries.len() >= MAX_ENTRIES {
                if let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.at).map(|(k, _)| *k) {
                    self.entries.remove(&oldest);
                }
            }
            self.entries.insert(key, Entry { info: info.clone(), at: now });
        }
        Ok((info, false))
    }
}

impl PathCache<Netlink> {
    /// A cache over rtnetlink (opened at the first lookup).
    pub fn new(ttl: Duration) -> Self {
        PathCache { ttl, entries: HashMap::new(), lookup: None, stats: PathStats::default() }
    }

    /// Opens rtnetlink if not yet open (a failure leaves the cache without lookups: the route
    /// step fails with the error).
    pub fn open(&mut self) -> io::Result<()> {
        if self.lookup.is_none() {
            self.lookup = Some(Netlink::open()?);
        }
        Ok(())
    }
}

impl Default for PathCache<Netlink> {
    fn default() -> Self {
        PathCache::new(DEFAULT_TTL)
    }
}

/// Lookups over rtnetlink.
pub struct Netlink {
    /// Requests and their answers.
    query: Socket,
    /// Notifications (non-blocking).
    watch: Socket,
    seq: u32,
}

impl Netlink {
    /// Opens the two sockets.
    pub fn open() -> io::Result<Netlink> {
        let mut query = Socket::new(NETLINK_ROUTE)?;
        query.bind_auto()?;
        query.connect(&SocketAddr::new(0, 0))?;
        let mut watch = Socket::new(NETLINK_ROUTE)?;
        watch.bind_auto()?;
        for g in [
            RTNLGRP_LINK,
            RTNLGRP_NEIGH,
            RTNLGRP_IPV4_IFADDR,
            RTNLGRP_IPV4_ROUTE,
            RTNLGRP_IPV6_IFADDR,
            RTNLGRP_IPV6_ROUTE,
        ] {
            watch.add_membership(g)?;
        }
        watch.set_non_blocking(true)?;
        Ok(Netlink { query, watch, seq: 0 })
    }

    /// Sends one request and returns the answer's messages (an error message as its errno).
    fn ask(&mut self, msg: RouteNetlinkMessage) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        header.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        self.query.send(&buf, 0)?;
        let mut out = Vec::new();
        loop {
            let mut rx = Vec::with_capacity(65536);
            let n = self.query.recv(&mut rx, 0)?;
            let mut off = 0;
            while off < n {
                let bytes = &rx[off..n];
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = m.header.length as usize;
                if len == 0 {
                    break;
                }
                off += len.next_multiple_of(4);
                if m.header.sequence_number != self.seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::InnerMessage(i) => {
                        out.push(i);
                        return Ok(out);
                    }
                    NetlinkPayload::Error(e) => {
                        return Err(match e.code {
                            Some(c) => io::Error::from_raw_os_error(-c.get()),
                            None => io::Error::other("netlink: empty answer"),
                        });
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    _ => {}
                }
            }
        }
    }

    fn route(&mut self, src: IpAddr, dst: IpAddr, tos: u8) -> io::Result<(u32, Option<IpAddr>, Option<u8>)> {
        let mut m = RouteMessage::default();
        m.header.address_family = family(dst);
        m.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
        m.header.tos = tos;
        m.attributes.push(RouteAttribute::Destination(RouteAddress::from(dst)));
        if !src.is_unspecified() {
            m.header.source_prefix_length = if src.is_ipv4() { 32 } else { 128 };
            m.attributes.push(RouteAttribute::Source(RouteAddress::from(src)));
        }
        let answer = self.ask(RouteNetlinkMessage::GetRoute(m))?;
        let Some(RouteNetlinkMessage::NewRoute(r)) = answer.into_iter().next() else {
            return Err(io::Error::from_raw_os_error(libc::ENETUNREACH));
        };
        let (mut oif, mut gw, mut hop) = (None, None, None);
        for a in r.attributes {
            match a {
                RouteAttribute::Oif(i) => oif = Some(i),
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => gw = Some(IpAddr::V4(g)),
                RouteAttribute::Gateway(RouteAddress::Inet6(g)) => gw = Some(IpAddr::V6(g)),
                RouteAttribute::Metrics(ms) => {
                    for m in ms {
                        if let RouteMetric::Hoplimit(h) = m {
                            hop = u8::try_from(h).ok();
                        }
                    }
                }
                _ => {}
            }
        }
        let oif = oif.ok_or_else(|| io::Error::from_raw_os_error(libc::ENETUNREACH))?;
        Ok((oif, gw, hop))
    }

    fn neighbour(&mut self, ifindex: u32, ip: IpAddr) -> io::Result<Option<Vec<u8>>> {
        let mut m = NeighbourMessage::default();
        m.header.family = family(ip);
        m.header.ifindex = ifindex;
        m.attributes.push(NeighbourAttribute::Destination(match ip {
            IpAddr::V4(a) => NeighbourAddress::Inet(a),
            IpAddr::V6(a) => NeighbourAddress::Inet6(a),
        }));
        let answer = match self.ask(RouteNetlinkMessage::GetNeighbour(m)) {
            Ok(a) => a,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(RouteNetlinkMessage::NewNeighbour(n)) = answer.into_iter().next() else { return Ok(None) };
        if !usable(n.header.state) {
            return Ok(None);
        }
        Ok(n.attributes.into_iter().find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(l) => Some(l),
            _ => None,
        }))
    }
}

/// Whether a neighbour entry in this state answers (NUD_VALID: reachable, stale, delay, probe,
/// permanent, noarp).
fn usable(s: NeighbourState) -> bool {
    matches!(
        s,
        NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
            | NeighbourState::Noarp
    )
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// An interface's sysfs attribute, trimmed.
fn sysfs(ifname: &str, attr: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/{attr}")).ok().map(|s| s.trim().to_owned())
}

/// The hop limit a route without its own RTAX_HOPLIMIT gives (ip4_dst_hoplimit /
/// ip6_dst_hoplimit: the sysctl default).
fn default_hop_limit(dst: IpAddr, ifname: &str) -> u8 {
    let path = match dst {
        IpAddr::V4(_) => "/proc/sys/net/ipv4/ip_default_ttl".to_owned(),
        IpAddr::V6(_) => format!("/proc/sys/net/ipv6/conf/{ifname}/hop_limit"),
    };
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(64)
}

impl Lookup for Netlink {
    fn lookup(&mut self, src: IpAddr, dst: IpAddr, tos: u8) -> io::Result<(PathInfo, bool)> {
        let (ifindex, gw, hop) = self.route(src, dst, tos)?;
        let ifname = nix::net::if_::if_indextoname(ifindex)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("if{ifindex}"));
        let next_hop = gw.unwrap_or(dst);
        let hop_limit = hop.unwrap_or_else(|| default_hop_limit(dst, &ifname));
        // IFF_LOOPBACK (0x8) and IFF_NOARP (0x80): no neighbour to ask; the interface's own
        // address is the destination MAC (rdma_copy_src_l2_addr).
        let flags = sysfs(&ifname, "flags").and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok());
        let own = || {
            sysfs(&ifname, "address")
                .map(|a| a.split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect())
                .unwrap_or_else(|| vec![0; 6])
        };
        let (lladdr, resolved) = if flags.is_some_and(|f| f & 0x88 != 0) {
            (own(), true)
        } else {
            match self.neighbour(ifindex, next_hop)? {
                Some(l) => (l, true),
                None => (Vec::new(), false),
            }
        };
        Ok((PathInfo { ifindex, ifname, next_hop, lladdr, hop_limit }, resolved))
    }

    fn changes(&mut self) -> Vec<Change> {
        let mut out = Vec::new();
        let mut buf = Vec::with_capacity(65536);
        loop {
            buf.clear();
            let n = match self.watch.recv(&mut buf, 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // ENOBUFS: notifications were lost.
                Err(_) => {
                    out.push(Change::All);
                    break;
                }
            };
            let mut off = 0;
            while off < n {
                let Ok(m) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[off..n]) else {
                    out.push(Change::All);
                    break;
                };
                let len = m.header.length as usize;
                if len == 0 {
                    break;
                }
                off += len.next_multiple_of(4);
                let NetlinkPayload::InnerMessage(i) = m.payload else { continue };
                match i {
                    RouteNetlinkMessage::NewNeighbour(n) | RouteNetlinkMessage::DelNeighbour(n) => {
                        let gone = !usable(n.header.state);
                        let mut ip = None;
                        let mut ll = None;
                        for a in n.attributes {
                            match a {
                                NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => ip = Some(IpAddr::V4(v)),
                                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => ip = Some(IpAddr::V6(v)),
                                NeighbourAttribute::LinkLayerAddress(l) => ll = Some(l),
                                _ => {}
                            }
                        }
                        if let Some(ip) = ip {
                            out.push(Change::Neighbour {
                                ifindex: n.header.ifindex,
                                ip,
                                lladdr: if gone { None } else { ll },
                            });
                        }
                    }
                    RouteNetlinkMessage::NewRoute(_)
                    | RouteNetlinkMessage::DelRoute(_)
                    | RouteNetlinkMessage::NewAddress(_)
                    | RouteNetlinkMessage::DelAddress(_)
                    | RouteNetlinkMessage::NewLink(_)
                    | RouteNetlinkMessage::DelLink(_) => out.push(Change::All),
                    _ => {}
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// A table of paths that counts its lookups and hands out the changes a test queues.
    #[derive(Default)]
    struct Table {
        lookups: u32,
        unresolved: bool,
        queued: Vec<Change>,
    }

    impl Lookup for Table {
        fn lookup(&mut self, _src: IpAddr, dst: IpAddr, tos: u8) -> io::Result<(PathInfo, bool)> {
            self.lookups += 1;
            if dst.is_unspecified() {
                return Err(io::Error::from_raw_os_error(libc::ENETUNREACH));
            }
            let info = PathInfo {
                ifindex: 2,
                ifname: "eth0".into(),
                next_hop: dst,
                lladdr: vec![2, 0, 0, 0, 0, tos],
                hop_limit: 64,
            };
            Ok((info, !self.unresolved))
        }
        fn changes(&mut self) -> Vec<Change> {
            std::mem::take(&mut self.queued)
        }
    }

    const S: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const D: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    const E: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));

    #[test]
    fn a_second_resolve_is_a_hit_until_the_entry_expires() {
        let t0 = Instant::now();
        let mut c = PathCache::with(Table::default(), Duration::from_secs(30));
        assert!(!c.resolve(S, D, 0, t0).unwrap().1);
        assert!(c.resolve(S, D, 0, t0 + Duration::from_secs(29)).unwrap().1);
        // Another ToS is another path.
        assert!(!c.resolve(S, D, 32, t0).unwrap().1);
        assert!(!c.resolve(S, D, 0, t0 + Duration::from_secs(30)).unwrap().1);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.expired, s.entries), (1, 3, 1, 2));
        assert_eq!(c.lookup.as_ref().unwrap().lookups, 3);
    }

    #[test]
    fn a_route_change_drops_everything_a_neighbour_change_its_own_paths() {
        let t0 = Instant::now();
        let mut c = PathCache::with(Table::default(), Duration::from_secs(30));
        c.resolve(S, D, 0, t0).unwrap();
        c.resolve(S, E, 0, t0).unwrap();
        // The same answer again changes nothing; another MAC for D drops D's path only.
        c.lookup.as_mut().unwrap().queued =
            vec![Change::Neighbour { ifindex: 2, ip: D, lladdr: Some(vec![2, 0, 0, 0, 0, 0]) }];
        assert_eq!(c.stats().entries, 2);
        c.lookup.as_mut().unwrap().queued = vec![Change::Neighbour { ifindex: 2, ip: D, lladdr: Some(vec![9; 6]) }];
        assert_eq!(c.stats().entries, 1);
        assert!(c.resolve(S, E, 0, t0).unwrap().1);
        assert!(!c.resolve(S, D, 0, t0).unwrap().1);
        c.lookup.as_mut().unwrap().queued = vec![Change::All];
        assert!(!c.resolve(S, E, 0, t0).unwrap().1);
        let s = c.stats();
        assert_eq!((s.invalidated, s.entries), (3, 1));
    }

    #[test]
    fn unresolved_neighbours_failed_lookups_and_a_zero_ttl_cache_nothing() {
        let t0 = Instant::now();
        let mut c = PathCache::with(Table { unresolved: true, ..Table::default() }, Duration::from_secs(30));
        assert!(!c.resolve(S, D, 0, t0).unwrap().1);
        assert!(!c.resolve(S, D, 0, t0).unwrap().1);
        let unspec = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        assert_eq!(c.resolve(S, unspec, 0, t0).unwrap_err().raw_os_error(), Some(libc::ENETUNREACH));
        let s = c.stats();
        assert_eq!((s.unresolved, s.failed, s.entries), (2, 1, 0));
        let mut z = PathCache::with(Table::default(), Duration::ZERO);
        z.resolve(S, D, 0, t0).unwrap();
        assert!(!z.resolve(S, D, 0, t0).unwrap().1);
        assert_eq!(z.stats().entries, 0);
    }

    #[test]
    fn the_cache_is_bounded() {
        let t0 = Instant::now();
        let mut c = PathCache::with(Table::default(), Duration::from_secs(30));
        for i in 0..(MAX_ENTRIES as u32 + 10) {
            let d = IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + i));
            c.resolve(S, d, 0, t0 + Duration::from_micros(u64::from(i))).unwrap();
        }
        assert_eq!(c.stats().entries, MAX_ENTRIES as u64);
        // The oldest went.
        assert!(!c.resolve(S, IpAddr::V4(Ipv4Addr::from(0x0a01_0000)), 0, t0 + Duration::from_secs(1)).unwrap().1);
    }

    /// The real tables: a loopback destination routes through `lo`, needs no neighbour, and has
    /// the sysctl's hop limit; a route change seen through rtnetlink would drop it (not made here:
    /// tests do not change the host's routes; test-verbs-programs does it in a namespace).
    #[test]
    fn rtnetlink_finds_the_loopback_path() {
        let mut n = Netlink::open().expect("rtnetlink");
        let lo = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
        let (info, resolved) = n.lookup(lo, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)), 0).unwrap();
        assert!(resolved);
        assert_eq!(info.ifname, "lo");
        assert_eq!(info.lladdr, vec![0; 6]);
        assert_eq!(u32::from(info.hop_limit), default_hop_limit(lo, "lo").into());
    }
}
