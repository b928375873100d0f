//! The device's multicast groups (rdma_cm part 2): which rdma_cm IDs of which clients joined
//! which IPv4 group, counted per device as the kernel's cma counts joins per port
//! (cma_iboe_join_multicast / cma_leave_mc_groups), and the IP membership behind them: the first
//! full member makes the device join the IP group on its interface (the kernel sends the IGMP
//! report), the last one leaving makes it leave. Send-only full members join nothing on the IP
//! side. Received group datagrams come in through each group's own socket
//! ([`softrdma_transport::GroupSocket`]).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use softrdma_transport::GroupSocket;

/// Most groups one device takes part in (each with its own socket); a join beyond is ENOMEM.
/// `ibv_query_device` reports it as `max_mcast_grp`.
pub const MAX_GROUPS: usize = 256;

/// The kernel's ENOTSUPP (524), what rdma_join_multicast gives for an IPv6 group on RoCEv2
/// (cma_iboe_join_multicast).
pub const ENOTSUPP: i32 = 524;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Join {
    owner: u32,
    id: u32,
    send_only: bool,
}

#[derive(Debug)]
struct Group {
    joins: Vec<Join>,
    /// Shared with the device thread while it polls (see [`Groups::sockets`]).
    sock: Option<Arc<GroupSocket>>,
}

pub use softrdma_protocol::proto::GroupInfo;

/// Every group of one device.
#[derive(Debug, Default)]
pub struct Groups {
    groups: BTreeMap<Ipv4Addr, Group>,
}

impl Groups {
    /// Client `owner`'s ID `id` joins `group` from a device at `iface`, receiving on `port`.
    /// Errors are errnos: EINVAL (not a multicast address), ENOTSUPP (IPv6), ENOMEM (too many
    /// groups), or why the IP membership failed.
    pub(crate) fn join(
        &mut self,
        owner: u32,
        id: u32,
        group: IpAddr,
        send_only: bool,
        iface: IpAddr,
        port: u16,
    ) -> Result<(), i32> {
        let IpAddr::V4(g) = group else { return Err(ENOTSUPP) };
        if !g.is_multicast() {
            return Err(libc::EINVAL);
        }
        if !self.groups.contains_key(&g) && self.groups.len() >= MAX_GROUPS {
            return Err(libc::ENOMEM);
        }
        let entry = self.groups.entry(g).or_insert_with(|| Group { joins: Vec::new(), sock: None });
        if !send_only && entry.sock.is_none() {
            let IpAddr::V4(i) = iface else { return Err(ENOTSUPP) };
            match GroupSocket::join(g, i, port) {
                Ok(s) => entry.sock = Some(Arc::new(s)),
                Err(e) => {
                    if entry.joins.is_empty() {
                        self.groups.remove(&g);
                    }
                    return Err(e.raw_os_error().unwrap_or(libc::EIO));
                }
            }
        }
        entry.joins.push(Join { owner, id, send_only });
        Ok(())
    }

    /// One join of `id` leaves `group` (EADDRNOTAVAIL if it has none there).
    pub(crate) fn leave(&mut self, owner: u32, id: u32, group: IpAddr) -> Result<(), i32> {
        let IpAddr::V4(g) = group else { return Err(libc::EADDRNOTAVAIL) };
        let gr = self.groups.get_mut(&g).ok_or(libc::EADDRNOTAVAIL)?;
        let i = gr.joins.iter().position(|j| j.owner == owner && j.id == id).ok_or(libc::EADDRNOTAVAIL)?;
        gr.joins.remove(i);
        self.tidy();
        Ok(())
    }

    /// Every join for which `gone(owner, id)` holds goes (an ID destroyed, a client gone).
    pub(crate) fn drop_where(&mut self, gone: impl Fn(u32, u32) -> bool) {
        for g in self.groups.values_mut() {
            g.joins.retain(|j| !gone(j.owner, j.id));
        }
        self.tidy();
    }

    /// The IP membership goes with the last full member, the group with its last join.
    fn tidy(&mut self) {
        for g in self.groups.values_mut() {
            if !g.joins.iter().any(|j| !j.send_only) {
                g.sock = None;
            }
        }
        self.groups.retain(|_, g| !g.joins.is_empty());
    }

    /// The member sockets, to poll without the state's lock: a socket that a leave drops
    /// meanwhile closes (and leaves its IP group) when the poller lets go of it too.
    pub(crate) fn sockets(&self) -> Vec<Arc<GroupSocket>> {
        self.groups.values().filter_map(|g| g.sock.clone()).collect()
    }

    /// Takes what the member sockets hold (at most `max` datagrams per group), handing each to
    /// `f` with its sender and group.
    pub(crate) fn receive(&self, buf: &mut [u8], max: usize, f: &mut dyn FnMut(SocketAddr, Ipv4Addr, &[u8])) -> usize {
        let mut n = 0;
        for (g, gr) in &self.groups {
            let Some(s) = gr.sock.as_ref() else { continue };
            for _ in 0..max {
                match s.recv(buf) {
                    Ok((len, from)) => {
                        n += 1;
                        f(from, *g, &buf[..len]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => break,
                }
            }
        }
        n
    }

    /// The groups and their members.
    pub(crate) fn info(&self) -> Vec<GroupInfo> {
        self.groups
            .iter()
            .map(|(g, gr)| GroupInfo {
                group: *g,
                full: gr.joins.iter().filter(|j| !j.send_only).count() as u32,
                send_only: gr.joins.iter().filter(|j| j.send_only).count() as u32,
                ip_member: gr.sock.is_some(),
                providers: 0,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LO: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));

    fn igmp_has(g: Ipv4Addr) -> bool {
        // /proc/net/igmp lists each interface's groups as hex in network order read as a
        // little-endian u32 (e.g. 239.1.2.3 is 030201EF).
        let want = format!("{:08X}", u32::from_le_bytes(g.octets()));
        std::fs::read_to_string("/proc/net/igmp").is_ok_and(|t| t.contains(&want))
    }

    #[test]
    fn the_ip_membership_follows_the_full_members() {
        let g = Ipv4Addr::new(239, 77, 12, 34);
        let mut gs = Groups::default();
        // Two processes' IDs join; one also has a send-only join.
        gs.join(1, 10, IpAddr::V4(g), false, LO, 0).unwrap();
        gs.join(2, 20, IpAddr::V4(g), false, LO, 0).unwrap();
        gs.join(2, 21, IpAddr::V4(g), true, LO, 0).unwrap();
        assert_eq!(gs.info()[0], GroupInfo { group: g, full: 2, send_only: 1, ip_member: true, providers: 0 });
        assert!(igmp_has(g), "the device joined the IP group");
        // The first leaves: the other still holds the membership.
        gs.leave(1, 10, IpAddr::V4(g)).unwrap();
        assert!(gs.info()[0].ip_member && igmp_has(g));
        assert_eq!(gs.leave(1, 10, IpAddr::V4(g)), Err(libc::EADDRNOTAVAIL), "a second leave");
        // The second process dies: its joins go (the full and the send-only one), and with the
        // last full member the IP membership.
        gs.drop_where(|o, _| o == 2);
        assert!(gs.info().is_empty());
        assert!(!igmp_has(g), "the device left the IP group with its last full member");
    }

    #[test]
    fn bad_groups_and_the_group_limit() {
        let mut gs = Groups::default();
        assert_eq!(gs.join(1, 1, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), false, LO, 0), Err(libc::EINVAL));
        assert_eq!(gs.join(1, 1, "ff0e::1".parse().unwrap(), false, LO, 0), Err(ENOTSUPP));
        for k in 0..MAX_GROUPS {
            let g = Ipv4Addr::new(239, 88, (k / 256) as u8, (k % 256) as u8);
            gs.join(1, 1, IpAddr::V4(g), true, LO, 0).unwrap();
        }
        let more = IpAddr::V4(Ipv4Addr::new(239, 89, 0, 1));
        assert_eq!(gs.join(1, 1, more, true, LO, 0), Err(libc::ENOMEM));
        assert!(gs.sockets().is_empty(), "send-only joins hold no socket");
        gs.drop_where(|_, _| true);
        assert!(gs.info().is_empty());
    }
}
