//! Datagrams the kernel handed to the wrong member of the device's steered port go on to their
//! owner ([`softrdma_transport::relay`]): a provider hands what is not its own to the daemon; the
//! daemon handles what is its own and passes the rest on the owner's link.

use super::*;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

use softrdma_transport::relay::{self, Frame, Link};
use softrdma_transport::steer::{block_of, dest_qpn, BLOCKS, DAEMON_INDEX};

/// Most frames one look at a link takes (the rest wait for the next look).
const FRAMES_PER_LOOK: usize = 256;

/// A set of QPN blocks.
#[derive(Clone)]
struct Blocks(Box<[u64; (BLOCKS as usize).div_ceil(64)]>);

impl Blocks {
    fn none() -> Blocks {
        Blocks(Box::new([0; (BLOCKS as usize).div_ceil(64)]))
    }

    fn contains(&self, block: u32) -> bool {
        self.0.get(block as usize / 64).is_some_and(|w| w & (1 << (block % 64)) != 0)
    }

    fn set(&mut self, block: u32, on: bool) {
        if let Some(w) = self.0.get_mut(block as usize / 64) {
            if on {
                *w |= 1 << (block % 64);
            } else {
                *w &= !(1 << (block % 64));
            }
        }
    }
}

/// This device layer's side of the relay.
pub(super) struct Relay {
    /// Blocks whose datagrams are not this layer's to handle: for a provider every block but its
    /// own, for the daemon the blocks given to providers.
    foreign: Blocks,
    /// Links by the member index at their other end: a provider's one link is the daemon's
    /// ([`DAEMON_INDEX`]); the daemon has one per provider.
    links: BTreeMap<u32, Arc<Link>>,
    /// A provider (its link goes to the daemon and it never passes a relayed datagram on).
    provider: bool,
    /// Frames received from the socket for others, with their destination QPN, waiting to go
    /// when the receive call ends.
    out: Vec<(u32, Vec<u8>)>,
    buf: Vec<u8>,
    /// The daemon: multicast groups with QPs of providers attached, by member index (how many).
    groups: BTreeMap<Ipv4Addr, BTreeMap<u32, u32>>,
}

impl Relay {
    /// No links (an unsteered device, or the daemon before its first provider).
    pub(super) fn new() -> Relay {
        Relay {
            foreign: Blocks::none(),
            links: BTreeMap::new(),
            provider: false,
            out: Vec::new(),
            buf: Vec::new(),
            groups: BTreeMap::new(),
        }
    }

    /// A provider's: `blocks` are its own, `link` goes to the daemon.
    pub(super) fn provider(blocks: &[u32], link: Link) -> Relay {
        let mut foreign = Blocks::none();
        for b in 0..BLOCKS {
            foreign.set(b, true);
        }
        for &b in blocks {
            foreign.set(b, false);
        }
        let mut r = Relay::new();
        r.foreign = foreign;
        r.provider = true;
        r.links.insert(DAEMON_INDEX, Arc::new(link));
        r
    }

    /// The daemon: a new provider's link (member `index`).
    pub(super) fn add_link(&mut self, index: u32, link: Link) {
        self.links.insert(index, Arc::new(link));
    }

    /// The daemon: member `index`'s client is gone.
    pub(super) fn remove_link(&mut self, index: u32) {
        self.links.remove(&index);
        for members in self.groups.values_mut() {
            members.remove(&index);
        }
        self.groups.retain(|_, m| !m.is_empty());
    }

    /// The daemon: a QP of member `index` attached to (`on`) or detached from `group`.
    pub(super) fn attach_group(&mut self, index: u32, group: Ipv4Addr, on: bool) {
        let members = self.groups.entry(group).or_default();
        let n = members.entry(index).or_insert(0);
        if on {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                members.remove(&index);
            }
        }
        self.groups.retain(|_, m| !m.is_empty());
    }

    /// The daemon: each group it passes on, with how many providers it passes it to.
    pub(super) fn group_members(&self) -> impl Iterator<Item = (Ipv4Addr, u32)> + '_ {
        self.groups.iter().map(|(g, m)| (*g, m.len() as u32))
    }

    /// The daemon: passes a datagram of `group` from `from` to every member with QPs attached
    /// to it. Returns the frames sent and those lost (a full link drops, as a full socket would).
    pub(super) fn pass_group(&self, from: SocketAddr, group: Ipv4Addr, payload: &[u8]) -> (u64, u64) {
        let Some(members) = self.groups.get(&group) else { return (0, 0) };
        let mut frame = Vec::with_capacity(relay::HEADER_LEN + payload.len());
        let f = Frame { src: from, dst: Some(IpAddr::V4(group)), segment: 0, payload };
        if !relay::encode(&mut frame, &f) {
            return (0, members.len() as u64);
        }
        let (mut sent, mut lost) = (0, 0);
        for index in members.keys() {
            match self.links.get(index).map(|l| l.send(&frame)) {
                Some(Ok(())) => sent += 1,
                _ => lost += 1,
            }
        }
        (sent, lost)
    }

    /// The daemon: the blocks given to providers changed.
    pub(super) fn set_foreign(&mut self, blocks: impl Iterator<Item = u32>) {
        self.foreign = Blocks::none();
        for b in blocks {
            self.foreign.set(b, true);
        }
    }

    /// The links' ends, for the device thread's wait.
    pub(super) fn links(&self) -> Vec<Arc<Link>> {
        self.links.values().cloned().collect()
    }

    /// Whether a datagram from the socket is another member's; if so it is kept, with what the
    /// kernel said about it, to go on when the receive call ends ([`State::send_relayed`]).
    pub(super) fn takes(&mut self, d: &softrdma_transport::udp::Datagram<'_>) -> bool {
        if self.links.is_empty() {
            return false;
        }
        let Some(qpn) = dest_qpn(d.payload).filter(|&q| self.foreign.contains(block_of(q))) else {
            return false;
        };
        let mut frame = Vec::with_capacity(relay::HEADER_LEN + d.payload.len());
        let f = Frame { src: d.src, dst: d.dst, segment: d.segment, payload: d.payload };
        relay::encode(&mut frame, &f) && {
            self.out.push((qpn, frame));
            true
        }
    }
}

impl State {
    /// Sends the datagrams the last receive kept for other members: a provider's to the daemon,
    /// the daemon's to the provider its steering names.
    pub(super) fn send_relayed(&mut self) {
        if self.relay.out.is_empty() {
            return;
        }
        let out = std::mem::take(&mut self.relay.out);
        for (qpn, frame) in out {
            let to = if self.relay.provider {
                DAEMON_INDEX
            } else {
                self.udp.steering().map_or(DAEMON_INDEX, |s| s.owner(qpn))
            };
            if to == DAEMON_INDEX && !self.relay.provider {
                // Its block came back to the daemon meanwhile: handle it here.
                if let Some(f) = relay::decode(&frame) {
                    self.handle_relayed(f);
                }
                continue;
            }
            self.relay_to(to, &frame);
        }
    }

    fn relay_to(&mut self, to: u32, frame: &[u8]) {
        match self.relay.links.get(&to).map(|l| l.send(frame)) {
            Some(Ok(())) => self.io.relayed += 1,
            _ => self.io.relay_lost += 1,
        }
    }

    /// Reads what the links bring (at most [`FRAMES_PER_LOOK`] per link) and handles it: a
    /// provider handles its own and drops the rest; the daemon handles its own and passes the
    /// others on to their owner, never back to the link they came from. Returns the frames read.
    pub(super) fn receive_relay(&mut self) -> usize {
        let mut buf = std::mem::take(&mut self.relay.buf);
        buf.resize(relay::MAX_FRAME, 0);
        let links: Vec<(u32, Arc<Link>)> = self.relay.links.iter().map(|(i, l)| (*i, l.clone())).collect();
        let mut n = 0;
        for (from, link) in links {
            for _ in 0..FRAMES_PER_LOOK {
                let len = match link.recv(&mut buf) {
                    Ok(Some(f)) => f.len(),
                    _ => break,
                };
                n += 1;
                let Some(f) = relay::decode(&buf[..len]) else {
                    self.io.relay_lost += 1;
                    continue;
                };
                if self.relay.provider && f.dst.is_some_and(|d| d.is_multicast()) {
                    // A group datagram the daemon passes on: for this process's QPs in the
                    // group, but not one of this engine's own sends (delivered internally).
                    // The daemon captured it as it received it.
                    let own = f.src.ip() == self.addr() && self.dev.config().flow_ports.contains(f.src.port());
                    if !own {
                        let (now, addr) = (self.now(), self.addr());
                        let (src, dst, segment) = (f.src, f.dst, f.segment);
                        super::datapath::deliver(
                            &mut self.dev,
                            &mut None,
                            now,
                            addr,
                            src,
                            dst,
                            segment,
                            f.payload,
                            true,
                        );
                    }
                    continue;
                }
                let qpn = dest_qpn(f.payload).unwrap_or(0);
                let owner = if self.relay.provider {
                    if self.relay.foreign.contains(block_of(qpn)) {
                        None
                    } else {
                        Some(DAEMON_INDEX)
                    }
                } else {
                    Some(self.udp.steering().map_or(DAEMON_INDEX, |s| s.owner(qpn)))
                };
                match owner {
                    // Ours (a provider's "daemon index" here means: handled by this layer).
                    Some(DAEMON_INDEX) => self.handle_relayed(f),
                    Some(to) if to != from => {
                        let frame = buf[..len].to_vec();
                        self.relay_to(to, &frame);
                    }
                    _ => self.io.relay_lost += 1,
                }
            }
        }
        self.relay.buf = buf;
        n
    }

    /// A relayed datagram, handled as if this layer's socket had received it.
    fn handle_relayed(&mut self, f: Frame<'_>) {
        let (now, addr, own_icrc) = (self.now(), self.addr(), self.loopback_icrc());
        let State { dev, tap, .. } = self;
        super::datapath::deliver(dev, tap, now, addr, f.src, f.dst, f.segment, f.payload, own_icrc);
    }
}
