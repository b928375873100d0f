//! The device's data path: the socket and the rings into the engine, the engine's packets out
//! through fault injection, GSO, internal loopback and the capture, completions and events back
//! into the clients' rings.

use super::*;

/// The GSO send being built.
pub(super) struct Gso {
    pub(super) enabled: bool,
    pub(super) dst: IpAddr,
    pub(super) dqpn: u32,
    pub(super) sport: u16,
    pub(super) seg: usize,
    pub(super) n: usize,
    pub(super) closed: bool,
    /// The packets: the batches in `ready`, then the batch being built from `start` to
    /// `used`, and room for that batch to grow to a whole GSO send and one packet more (the
    /// engine builds packets there: `State::pump_with`). Its length never changes.
    pub(super) buf: Vec<u8>,
    pub(super) used: usize,
    pub(super) start: usize,
    /// Batches complete but not sent: they leave with the one being built at the next flush, in
    /// one `sendmmsg` per source port (`RoceUdp::send_many`).
    pub(super) ready: Vec<Ready>,
}

/// A complete GSO batch in [`Gso::buf`], waiting for the flush.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ready {
    dst: IpAddr,
    sport: u16,
    seg: usize,
    start: usize,
    len: usize,
    n: usize,
}

impl Gso {
    /// A builder of up to [`GSO_BATCHES`] GSO sends a flush (one with `SOFTRDMA_SEND_MANY=0`).
    pub(super) fn new(enabled: bool, dst: IpAddr) -> Gso {
        let batches = if super::config::tuning().send_many { GSO_BATCHES } else { 1 };
        Gso {
            enabled,
            dst,
            dqpn: 0,
            sport: 0,
            seg: 0,
            n: 0,
            closed: false,
            buf: vec![0; batches * udp::MAX_GSO_BYTES + PACKET_ROOM],
            used: 0,
            start: 0,
            ready: Vec::with_capacity(batches),
        }
    }

    /// The IPv4 ID the next packet gets if it joins the send being built (0 if a new one starts).
    pub(super) fn next_id(&self) -> u16 {
        if self.enabled && self.n > 0 && !self.closed && self.n < MAX_GSO_SEGMENTS {
            self.n as u16
        } else {
            0
        }
    }

    /// Whether the batch being built can be set aside for the flush and a new one begin after
    /// it: fewer than [`GSO_BATCHES`] batches, and room after it for a whole send and a packet.
    fn can_set_aside(&self) -> bool {
        self.ready.len() + 1 < GSO_BATCHES && self.used + udp::MAX_GSO_BYTES + PACKET_ROOM <= self.buf.len()
    }

    /// Sets the batch being built aside (it has packets); the next begins where it ends.
    fn set_aside(&mut self) {
        self.ready.push(Ready {
            dst: self.dst,
            sport: self.sport,
            seg: self.seg,
            start: self.start,
            len: self.used - self.start,
            n: self.n,
        });
        self.start = self.used;
        self.n = 0;
    }
}

/// The most GSO sends one flush makes (in one `sendmmsg` when they share a source port): the
/// SENDs an application posted between two polls (UCX posts a 64 KiB eager message as 8 SENDs
/// of 8 KiB, each a send of its own: their last packets are short), or a 64 KiB WRITE's two.
/// `softrdma bench`'s cluster floor rows measure what one call for several saves.
const GSO_BATCHES: usize = 8;

/// The most a packet the engine builds takes (4096 bytes of payload and the headers).
pub(super) const PACKET_ROOM: usize = 4096 + 256;

/// Most segments in one GSO send: 64 is what 6.1 kernels take (newer ones take 128).
const MAX_GSO_SEGMENTS: usize = 64;

/// Flips one bit of a packet (fault injection), if asked.
fn flip_bit(d: &mut [u8], bit: Option<usize>) {
    if let Some(b) = bit.filter(|b| b / 8 < d.len()) {
        d[b / 8] ^= 1 << (b % 8);
    }
}

/// Moves one ring's entries into the engine through `post`: a full engine queue stops it with the
/// rest left in the ring (`backlog`), a refused entry is counted and dropped, an entry that does
/// not decode stops it and marks the client `bad`. Returns how many entries were taken.
fn drain<E: for<'de> serde::Deserialize<'de>>(
    arena: &Arena,
    ring: &RingDesc,
    io: &mut IoCounters,
    backlog: &mut bool,
    bad: &mut bool,
    mut post: impl FnMut(E) -> Result<(), VerbsError>,
) -> usize {
    arena.consume::<E>(ring, usize::MAX, |v| match v {
        Some(e) => match post(e) {
            Err(VerbsError::NoMem) => {
                *backlog = true;
                false
            }
            r => {
                io.ring_rejected += u64::from(r.is_err());
                true
            }
        },
        None => {
            io.ring_malformed += 1;
            *bad = true;
            false
        }
    })
}

/// Publishes how many of the requests posted on QP `qpn`'s send queue ring have left the
/// queue: taken from the ring and no longer in the engine's send queue (completed, flushed or
/// refused). The client refuses a post with ENOMEM once max_send_wr are outstanding
/// (`ibv_post_send`), counting the ring and the engine's queue together.
fn publish_retired(arena: &Arena, ring: &RingDesc, dev: &Device<ProcessMemory>, qpn: Qpn) {
    let queued = dev.send_queue_len(qpn).unwrap_or(0) as u32;
    arena.set_retired(ring, arena.consumed(ring).wrapping_sub(queued));
}

/// A receive the client asked to stage gets one SGE over a fresh piece of the staging area
/// instead of its own, once its own SGEs pass the engine's checks (otherwise the engine sees them
/// as they are, and reports what is wrong as it would); the staging is remembered by token.
fn redirect(
    dev: &Device<ProcessMemory>,
    pd: Option<PdId>,
    e: RecvEntry,
    staging: &mut Allocator,
    staged: &mut HashMap<u64, Staged>,
    stage_mrs: &HashMap<PdId, u32>,
) -> RecvWr {
    let RecvEntry { mut wr, stage } = e;
    let (Some(pd), true) = (pd, stage) else { return wr };
    let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    let ok = len <= u64::from(u32::MAX) && wr.sg_list.iter().all(|s| dev.sge_ok(pd, s, Access::LOCAL_WRITE));
    let (Some(&lkey), true) = (stage_mrs.get(&pd), ok) else { return wr };
    let Some(off) = staging.alloc(len as usize) else { return wr };
    staged.insert(wr.wr_id, Staged { off, len: len as u32, sges: wr.sg_list.clone() });
    let addr = STAGE_VA + (off - STAGING_OFF) as u64;
    wr.sg_list = vec![softrdma_engine::wr::Sge { addr, length: len as u32, lkey }];
    wr
}

/// A staged receive that the engine did not take (it stays in the ring, or is dropped): neither
/// is its staging.
fn unstage(staging: &mut Allocator, staged: &mut HashMap<u64, Staged>, token: u64) {
    if let Some(st) = staged.remove(&token) {
        staging.free(st.off, st.len as usize);
    }
}

/// Hands a received datagram to the engine (from the socket, or passed on by another member of
/// the port: `relay`), captured first: `src` sent it to `dst` (the kernel's word; `None`: not
/// said), `segment` is its place in a GRO run. `own_icrc` says whether the engines of this
/// device put an ICRC on packets to its own address ([`State::loopback_icrc`]: the device
/// captures or injects faults); when they do not, a datagram from this address to it is
/// another engine's of this device (a provider's, or the daemon's), sent without one, and is
/// taken as internal loopback.
#[allow(clippy::too_many_arguments)]
pub(super) fn deliver(
    dev: &mut Device<ProcessMemory>,
    tap: &mut Option<Capture>,
    now: Instant,
    addr: IpAddr,
    src: std::net::SocketAddr,
    dst: Option<IpAddr>,
    segment: u16,
    payload: &[u8],
    own_icrc: bool,
) {
    let (sport, src) = (src.port(), src.ip());
    let dst = dst.filter(|a| *a != addr);
    // The place in a GRO buffer is the IPv4 ID a GSO sender gave it (a hint).
    let ip_id = (segment > 0).then_some(segment);
    trace_packet("rx", payload);
    let meta = RecvMeta { src, src_port: sport, ip_id, dst };
    // (A host that forges this device's own address as the source is not what the ICRC guards
    // against: it protects a packet from a wire's errors, IBTA A17.4.3.1.)
    if src == addr && dst.is_none() && !own_icrc {
        dev.handle_internal_packet(now, meta, payload);
    } else {
        dev.handle_packet(now, meta, payload);
    }
    // Captured once the engine has checked it: the IPv4 ID its ICRC holds for is then known (the
    // capture writer solves it only for a packet the check did not take). Whatever the engine
    // answers leaves later, through the transmit path, so the capture keeps the order. A
    // datagram from this device's own address came from a provider sharing the port (or from
    // the daemon, to a provider), which captured it as it sent it: once per packet, as internal
    // loopback.
    if let Some(t) = tap.as_mut().filter(|_| src != addr) {
        t.write(src, dst.unwrap_or(addr), sport, payload, dev.last_rx_ipv4_id());
    }
}

/// One line per packet at TRACE level (`SOFTRDMA_LOG=trace`): direction, opcode, PSN, AckReq.
fn trace_packet(dir: &str, p: &[u8]) {
    if p.len() >= 12 && tracing::enabled!(tracing::Level::TRACE) {
        let psn = u32::from_be_bytes([0, p[9], p[10], p[11]]);
        let qpn = u32::from_be_bytes([0, p[5], p[6], p[7]]);
        tracing::trace!(dir, opcode = p[0], qpn, psn, ack_req = p[8] >> 7, len = p.len());
    }
}

/// The QP an affiliated async event names.
fn event_qp(e: AsyncEvent) -> Option<softrdma_engine::wire::Qpn> {
    match e {
        AsyncEvent::CommEst(q)
        | AsyncEvent::SqDrained(q)
        | AsyncEvent::QpFatal(q)
        | AsyncEvent::QpReqErr(q)
        | AsyncEvent::QpAccessErr(q)
        | AsyncEvent::LastWqeReached(q) => Some(q),
        AsyncEvent::CqErr(_) | AsyncEvent::SrqLimitReached(_) => None,
    }
}

impl State {
    /// The engine's time: that of the call in progress if one set it ([`State::hold_clock`]).
    pub(super) fn now(&self) -> Instant {
        self.clock.unwrap_or_else(|| self.read_clock())
    }

    fn read_clock(&self) -> Instant {
        Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Reads the clock and keeps that time for [`State::now`] until [`State::release_clock`]
    /// (a call's work takes microseconds; the engine's timers are in milliseconds). Returns it,
    /// and whether this call holds it (false: an outer call does, and releases it).
    pub(super) fn hold_clock(&mut self) -> (Instant, bool) {
        match self.clock {
            Some(t) => (t, false),
            None => {
                let t = self.read_clock();
                self.clock = Some(t);
                (t, true)
            }
        }
    }

    /// Reads the clock again for a call that holds it (between batches of a long receive).
    pub(super) fn refresh_clock(&mut self) {
        if self.clock.is_some() {
            self.clock = Some(self.read_clock());
        }
    }

    pub(super) fn release_clock(&mut self, held: bool) {
        if held {
            self.clock = None;
        }
    }

    pub(super) fn addr(&self) -> IpAddr {
        self.dev.config().addr
    }

    /// Reads one batch of datagrams (at most the transport's receive budget) and hands them to
    /// the engine; returns how many. The caller pumps after every batch: answers (ACKs, READ
    /// responses) must not wait until the socket is empty, or a sender retransmitting faster than
    /// we drain would never hear from us.
    pub(super) fn receive(&mut self) -> usize {
        self.receive_with(false)
    }

    /// [`State::receive`] for a spinning application poll: after a read that found the socket
    /// empty, the next one asks for a lone buffer (`RoceUdp::recv_lone`); a caller that
    /// wants the rest of a burst calls [`State::receive`] next.
    pub(super) fn receive_spin(&mut self) -> usize {
        let n = self.receive_with(self.spin_found_empty);
        self.spin_found_empty = n == 0;
        n
    }

    fn receive_with(&mut self, lone: bool) -> usize {
        // Work posted before these packets arrived must be in the engine when they are handled
        // (a receive posted before the peer's SEND was posted is there for it, as on an HCA).
        let moved = self.service_rings();
        self.io.ring_wqes += moved as u64;
        let now = self.now();
        let addr = self.addr();
        let own_icrc = self.loopback_icrc();
        let State { udp, dev, tap, io, relay, .. } = self;
        let mut each = |d: softrdma_transport::udp::Datagram<'_>| {
            io.udp_rcvd += 1;
            // Another member's (a GRO run the kernel gave to the owner of its first segment):
            // it goes on to its owner, which captures and handles it (`relay`).
            if relay.takes(&d) {
                return;
            }
            deliver(dev, tap, now, addr, d.src, d.dst, d.segment, d.payload, own_icrc);
        };
        let r = if lone { udp.recv_lone(&mut each) } else { udp.recv(&mut each) };
        self.send_relayed();
        r.unwrap_or(0)
    }

    /// Moves everything that can move: due timers, delayed packets, the engine's transmissions
    /// and the internal loopback, until nothing is left (bounded), then routes events.
    pub(super) fn pump(&mut self) {
        self.pump_with(true);
    }

    /// [`State::pump`], or with `transmit` off everything but the engine's transmissions and
    /// the internal loopback: what an application's poll does before it returns completions
    /// (the answers follow, see [`super::Hca::drive`]).
    pub(super) fn pump_with(&mut self, transmit: bool) {
        let (_, held) = self.hold_clock();
        // Answers a poll held back go now, after the requests a post just made: a SEND and
        // the ACK before it leave in one GSO send.
        let requester_first = transmit && self.tx_owed;
        for round in 0..1024 {
            let ring_work = self.service_rings();
            self.io.ring_wqes += ring_work as u64;
            let now = self.now();
            if self.dev.poll_timeout().is_some_and(|t| t <= now) {
                self.dev.handle_timeout(now);
            }
            while self.delayed.peek().is_some_and(|d| d.0.at <= now) {
                let d = self.delayed.pop().expect("peeked").0;
                self.deliver(d.dst, d.sport, &d.data, d.icrc_id, d.flip);
            }
            // Data the packets handled so far wrote is in place before any answer to them leaves.
            self.dev.memory().flush();
            // What memory helpers answered: the QPs that waited for it go again.
            if self.dev.memory().helper_round() {
                self.dev.memory_ready();
            }
            // Completions are visible before the answers leave (a responder's receive completion
            // does not wait for the ACK it sends, IBTA 9.7.5.1 and 10.8.1 tie neither to the
            // other): the application polling this CQ need not wait for our send syscalls.
            // Once per pump: the scan visits every CQ of every client.
            if round == 0 {
                self.fill_cq_rings();
            }
            if !transmit {
                break;
            }
            let loopback_icrc = self.loopback_icrc();
            let mut buf = std::mem::take(&mut self.buf);
            let mut sent = 0;
            loop {
                // The engine computes the ICRC for the IPv4 ID the packet gets if it joins the
                // GSO send being built (Linux numbers segments 0, 1, 2, ...); `wire` corrects it
                // when the packet does not.
                let id = self.gso.next_id();
                let opts = TransmitOptions { ip_id: id, loopback_icrc, requester_first };
                if self.gso.enabled && !self.faults.is_active() {
                    // Built in place, at the end of the GSO batch it most likely joins: no copy
                    // of the packet into the batch (4 KiB a packet in a bulk transfer).
                    let at = self.gso.used;
                    let room = &mut self.gso.buf[at..at + PACKET_ROOM];
                    let Some(t) = self.dev.poll_transmit_with(now, room, opts) else { break };
                    trace_packet("tx", &self.gso.buf[at..at + t.len]);
                    self.emit_placed(t, id);
                } else {
                    let Some(t) = self.dev.poll_transmit_with(now, &mut buf, opts) else { break };
                    trace_packet("tx", &buf[..t.len]);
                    self.emit(now, t, &buf[..t.len], id);
                }
                sent += 1;
                if sent == 256 {
                    break;
                }
            }
            self.flush();
            self.buf = buf;
            let mut moved = 0;
            let addr = self.addr();
            while let Some((sport, data, dst)) = self.loopback.pop_front() {
                self.io.loopback += 1;
                let meta = RecvMeta { src: addr, src_port: sport, ip_id: None, dst };
                if loopback_icrc {
                    self.dev.handle_packet(now, meta, &data);
                } else {
                    self.dev.handle_internal_packet(now, meta, &data);
                }
                moved += 1;
            }
            if sent == 0 && moved == 0 && ring_work == 0 {
                break;
            }
        }
        if requester_first {
            self.tx_owed = false;
        }
        // ... and before their completions are seen.
        self.dev.memory().flush();
        self.fill_cq_rings();
        self.route_events();
        let now = self.now();
        self.cm.route(&mut self.dev, now, &self.name);
        if self.publisher.is_some() {
            self.publish(false);
        }
        self.release_clock(held);
    }

    /// A provider's report to its daemon (`Request::Publish`): its counters when they changed
    /// and [`PUBLISH_INTERVAL_MS`] passed (the progress thread pumps at least that often), or
    /// with `force`. (Its captured packets go to the daemon through its capture ring.)
    ///
    /// Only a forced report (the device stops, the process exits) is sent from here. Any other
    /// waits in `unsent` (a later one replaces it) for the device thread, which sends it with the state unlocked
    /// ([`State::take_unsent`]). The report is a call that waits for the daemon's answer, and
    /// the daemon's thread has to be scheduled for it: on a machine whose cores the programs
    /// keep busy that took up to a scheduler tick (~4 ms here), while every thread of the
    /// program that wanted the state waited on its lock (the stalls of perftest's 64-byte
    /// rates: BENCHMARKS.md, "The provider's report").
    pub(super) fn publish(&mut self, force: bool) {
        if self.publisher.is_none() {
            return;
        }
        // Every pump comes here: nothing but a clock comparison unless something is due.
        let now = self.now();
        let due = now.saturating_since(self.last_publish).as_nanos() >= PUBLISH_INTERVAL_MS * 1_000_000;
        if !force && !due {
            return;
        }
        let Some(p) = self.publisher.clone() else { return };
        let totals = (*self.dev.counters(), self.io_stats(), self.dev.next_qpn());
        if self.published == Some(totals) {
            // Nothing new; a forced report still sends what waits.
            if let Some(report) = self.unsent.take().filter(|_| force) {
                (p.0)(report);
            }
            return;
        }
        self.last_publish = now;
        self.published = Some(totals);
        // A later report replaces one still waiting: its totals include the earlier's.
        let report = Published { counters: totals.0, io: totals.1, next_qpn: totals.2 };
        self.unsent = None;
        if force {
            (p.0)(report);
        } else {
            self.unsent = Some(report);
        }
    }

    /// The report [`State::publish`] left for the device thread, and who sends it: the caller
    /// sends it once it has let the state's lock go.
    pub(super) fn take_unsent(&mut self) -> Option<(Publisher, Published)> {
        let report = self.unsent.take()?;
        self.publisher.clone().map(|p| (p, report))
    }

    /// A packet the engine wrote, its ICRC computed for IPv4 ID `icrc_id`: through the fault
    /// injector (dropped, duplicated, delayed, corrupted) to `deliver`.
    pub(super) fn emit(&mut self, now: Instant, t: Transmit, data: &[u8], icrc_id: u16) {
        let mut copies = std::mem::take(&mut self.copies);
        // The engine wrote the BTH first (the sampler reads its opcode for `ack_loss`).
        self.faults.decide(now, data, &mut copies);
        for c in &copies {
            if c.at > now {
                self.seq += 1;
                let d = Delayed {
                    at: c.at,
                    seq: self.seq,
                    dst: t.dst,
                    sport: t.src_port,
                    data: data.to_vec(),
                    icrc_id,
                    flip: c.flip_bit,
                };
                self.delayed.push(Reverse(d));
            } else {
                self.deliver(t.dst, t.src_port, data, icrc_id, c.flip_bit);
            }
        }
        self.copies = copies;
    }

    /// Whether packets to this device's own address need an ICRC (internal loopback, and those
    /// between the engines of the device's processes): only where someone can see it (a
    /// capture) or break it (fault injection). Both are the device's settings, which every
    /// process of the device holds alike (`softrdma up --pcap/--faults`), so a receiver of this
    /// device knows whether its sender put one on.
    pub(super) fn loopback_icrc(&self) -> bool {
        self.tap.is_some() || self.faults.is_active()
    }

    /// Recomputes an IPv4 packet's ICRC for IPv4 ID `to` if it was computed for `from`.
    pub(super) fn fix_icrc(&self, dst: IpAddr, sport: u16, seg: &mut [u8], from: u16, to: u16) {
        if from == to || !matches!((self.addr(), dst), (IpAddr::V4(_), IpAddr::V4(_))) || seg.len() < icrc::LEN {
            return;
        }
        // A packet to this device's own address went without one (`State::loopback_icrc`).
        if dst == self.addr() && !self.loopback_icrc() {
            return;
        }
        let (hdr, n) = ip_udp_header(self.addr(), dst, sport, seg.len(), to);
        if let Ok(crc) = icrc::roce_v2_parts(&hdr[..n], &seg[..seg.len() - icrc::LEN]) {
            IbPacket::new_unchecked(seg).set_icrc(crc);
        }
    }

    /// One packet onto the wire, or through internal loopback when it is for this device
    /// (a NIC loops back traffic between its own QPs; so do we, still through engine and tap).
    /// Its ICRC is for IPv4 ID `icrc_id`; `flip` is a bit the fault injector corrupts after the
    /// ICRC is made right for the ID the packet carries, so that the corruption stays detectable.
    pub(super) fn deliver(&mut self, dst: IpAddr, sport: u16, data: &[u8], icrc_id: u16, flip: Option<usize>) {
        let addr = self.addr();
        let mcast = dst.is_multicast();
        // On a steered port, a QP of this address may live in another process: through the
        // port (which steers it) unless this engine runs it.
        let local = dst == addr && softrdma_transport::steer::dest_qpn(data).is_none_or(|q| self.dev.owns_qpn(q));
        if !local {
            self.wire(dst, sport, data, icrc_id, flip);
        }
        if local || mcast {
            // Internal loopback carries IPv4 ID 0.
            let mut d = Vec::with_capacity(data.len());
            softrdma_engine::copy::extend_bytes(&mut d, data);
            if self.loopback_icrc() {
                self.fix_icrc(dst, sport, &mut d, icrc_id, 0);
            }
            flip_bit(&mut d, flip);
            if local {
                self.capture(dst, sport, &d, 0);
            }
            self.loopback.push_back((sport, d, mcast.then_some(dst)));
        }
    }

    /// Writes a packet to the capture as it went out, with the IPv4 ID it carried.
    pub(super) fn capture(&mut self, dst: IpAddr, sport: u16, data: &[u8], ip_id: u16) {
        let addr = self.addr();
        if let Some(tap) = self.tap.as_mut() {
            tap.write(addr, dst, sport, data, Some(ip_id));
        }
    }

    /// One packet for the UDP socket. With GSO, consecutive packets to the same destination and
    /// from the same source port, of one size (the last may be shorter), leave in one send of up
    /// to 64 segments (docs/architecture.md D5). Linux numbers the segments' IPv4 IDs 0, 1, 2, ...
    /// and the ICRC covers the ID, so segment k's ICRC is recomputed for ID k.
    pub(super) fn wire(&mut self, dst: IpAddr, sport: u16, data: &[u8], icrc_id: u16, flip: Option<usize>) {
        if !self.gso.enabled {
            let mut fixed;
            let mut data = data;
            if icrc_id != 0 || flip.is_some() {
                fixed = data.to_vec();
                self.fix_icrc(dst, sport, &mut fixed, icrc_id, 0);
                flip_bit(&mut fixed, flip);
                data = &fixed;
            }
            self.capture(dst, sport, data, 0);
            match self.udp.send(dst, sport, data) {
                Ok(()) => self.io.udp_sent += 1,
                Err(_) => self.io.send_errors += 1,
            }
            return;
        }
        if data.len() > PACKET_ROOM {
            // Larger than anything the engine builds: alone, after the batch.
            self.flush();
            self.capture(dst, sport, data, 0);
            match self.udp.send(dst, sport, data) {
                Ok(()) => self.io.udp_sent += 1,
                Err(_) => self.io.send_errors += 1,
            }
            return;
        }
        // The packet goes where the batch being built ends (the batch may leave first, see
        // `wire_placed`).
        let at = self.gso.used;
        softrdma_engine::copy::copy_bytes(&mut self.gso.buf[at..at + data.len()], data);
        self.wire_placed(dst, sport, data.len(), icrc_id, flip);
    }

    /// [`State::wire`] of the packet already at the end of the GSO batch being built (at
    /// `gso.buf[gso.used..]`, `len` bytes): it joins the batch, or the batch leaves and the packet
    /// moves to the start of the next one.
    fn wire_placed(&mut self, dst: IpAddr, sport: u16, len: usize, icrc_id: u16, flip: Option<usize>) {
        let at = self.gso.used;
        let b = &self.gso;
        // One destination QP per GSO send: a receiver's steered port picks the socket for the
        // whole run by its first segment.
        let dqpn = softrdma_transport::steer::dest_qpn(&b.buf[at..at + len]).unwrap_or(u32::MAX);
        let fits = b.n > 0
            && b.dst == dst
            && b.dqpn == dqpn
            && b.sport == sport
            && !b.closed
            && len <= b.seg
            && b.n < MAX_GSO_SEGMENTS
            && at - b.start + len <= udp::MAX_GSO_BYTES;
        if !fits {
            // The batch being built is complete: it waits for the flush beside the others, or
            // they all leave now and this packet moves to the buffer's start.
            if self.gso.n > 0 && self.gso.can_set_aside() {
                self.gso.set_aside();
            } else {
                self.flush();
            }
            let b = &mut self.gso;
            if at != b.used {
                b.buf.copy_within(at..at + len, b.used);
            }
            b.dst = dst;
            b.dqpn = dqpn;
            b.sport = sport;
            b.seg = len;
            b.closed = false;
        }
        let k = self.gso.n as u16;
        let start = self.gso.used;
        let mut buf = std::mem::take(&mut self.gso.buf);
        let seg = &mut buf[start..start + len];
        self.fix_icrc(dst, sport, seg, icrc_id, k);
        flip_bit(seg, flip);
        self.capture(dst, sport, seg, k);
        self.gso.buf = buf;
        self.gso.used += len;
        self.gso.n += 1;
        // A shorter segment can only be the last of a GSO send.
        self.gso.closed = len < self.gso.seg;
    }

    /// A packet the engine built in place at the end of the GSO batch (see [`State::pump_with`]):
    /// to the wire from there, or, for this device's own QPs and multicast groups, copied out
    /// and delivered as [`State::emit`] does (no fault injection is on).
    fn emit_placed(&mut self, t: Transmit, icrc_id: u16) {
        let at = self.gso.used;
        let data = &self.gso.buf[at..at + t.len];
        let addr = self.addr();
        let local = t.dst == addr && softrdma_transport::steer::dest_qpn(data).is_none_or(|q| self.dev.owns_qpn(q));
        if local || t.dst.is_multicast() {
            let d = data.to_vec();
            self.deliver(t.dst, t.src_port, &d, icrc_id, None);
        } else {
            self.wire_placed(t.dst, t.src_port, t.len, icrc_id, None);
        }
    }

    /// Sends the GSO batches set aside and the one being built, if any: the batches of one
    /// source port (one socket) in one `sendmmsg`, in the order they were built.
    pub(super) fn flush(&mut self) {
        if self.gso.n > 0 {
            self.gso.set_aside();
        }
        if self.gso.ready.is_empty() {
            return;
        }
        let mut ready = std::mem::take(&mut self.gso.ready);
        let buf = &self.gso.buf;
        let mut i = 0;
        while i < ready.len() {
            let first = ready[i];
            let group = ready[i..].iter().take_while(|r| r.sport == first.sport).count();
            let batches = &ready[i..i + group];
            let bytes = |r: &Ready| &buf[r.start..r.start + r.len];
            if group == 1 {
                let r = if first.n == 1 {
                    self.udp.send(first.dst, first.sport, bytes(&first))
                } else {
                    self.udp.send_segments(first.dst, first.sport, bytes(&first), first.seg)
                };
                match r {
                    Ok(()) => self.io.udp_sent += first.n as u64,
                    Err(_) => self.io.send_errors += first.n as u64,
                }
            } else {
                // At most GSO_BATCHES: on the stack, no allocation a flush.
                let mut msgs: [(IpAddr, &[u8], usize); GSO_BATCHES] = [(first.dst, &[], 0); GSO_BATCHES];
                for (m, r) in msgs.iter_mut().zip(batches) {
                    *m = (r.dst, bytes(r), r.seg);
                }
                let all: u64 = batches.iter().map(|r| r.n as u64).sum();
                match self.udp.send_many(first.sport, &msgs[..group]) {
                    Ok(()) => self.io.udp_sent += all,
                    Err(failed) => {
                        let lost: u64 = failed.iter().map(|&(k, _)| batches[k].n as u64).sum();
                        self.io.udp_sent += all - lost;
                        self.io.send_errors += lost;
                    }
                }
            }
            i += group;
        }
        ready.clear();
        let b = &mut self.gso;
        b.ready = ready;
        b.n = 0;
        b.used = 0;
        b.start = 0;
    }

    /// Async events to their owners; completion channel events for armed CQs.
    pub(super) fn route_events(&mut self) {
        while let Some(e) = self.dev.poll_event() {
            let owner = match e {
                AsyncEvent::CqErr(c) => self.owner_of(|o| o.cqs.contains(&c)),
                AsyncEvent::SrqLimitReached(s) => self.owner_of(|o| o.srqs.contains(&s)),
                _ => event_qp(e).and_then(|q| self.owner_of(|o| o.qps.contains(&q))),
            };
            if let Some(c) = owner.and_then(|o| self.clients.get_mut(&o)) {
                c.events.push_back(ClientEvent { event: e, handle: None });
                let _ = c.event_fd.write(1);
            } else if let Some(q) = event_qp(e).filter(|q| self.dev.is_unowned_tgt_qp(*q)) {
                // A receive QP the device owns (the seed's ibv_alloc_xrc_rcv_qp): nobody to
                // deliver to, so its events go to the device's log, as the kernel's went to
                // /var/log/messages.
                tracing::warn!(qpn = q.value(), event = ?e, "async event of a device-owned XRC receive QP");
            }
        }
        while let Some(h) = self.dev.poll_handle_event() {
            if let Some(c) = self.clients.get_mut(&h.owner) {
                c.events.push_back(ClientEvent { event: h.event, handle: Some(h.handle) });
                let _ = c.event_fd.write(1);
            }
        }
        let mut fired = Vec::new();
        let mut disarmed = 0;
        for (cq, w) in self.cqs.iter_mut() {
            let Some(n) = self.dev.cq_counts(*cq) else { continue };
            let now = if w.solicited_only { n.solicited } else { n.added };
            if w.armed && now > w.seen {
                w.armed = false;
                disarmed += 1;
                if let Some(ch) = w.channel {
                    fired.push((ch, *cq));
                }
            }
        }
        self.armed_cqs -= disarmed;
        for (ch, cq) in fired {
            if let Some(c) = self.channels.get_mut(&ch) {
                c.events.push_back(cq);
                let _ = c.fd.write(1);
            }
        }
    }

    /// Group datagrams the member sockets hold, into the engine as from the wire.
    pub(super) fn receive_groups(&mut self) -> usize {
        let now = self.now();
        let addr = self.addr();
        let mut buf = std::mem::take(&mut self.buf);
        if buf.len() < 65536 {
            buf.resize(65536, 0);
        }
        let own_ports = self.dev.config().flow_ports;
        let State { groups, dev, tap, io, relay, .. } = self;
        let n = groups.receive(&mut buf, 64, &mut |from, g, data| {
            // Providers with QPs in the group get it through their links (but for its own
            // sends, a provider skips what it gets back).
            let (sent, lost) = relay.pass_group(from, g, data);
            io.relayed += sent;
            io.relay_lost += lost;
            // This engine's own sends come back through the kernel's multicast loopback; it
            // already delivered them internally. A provider's (from the device's address but
            // another source port) are for this engine's QPs too; their sender captured them.
            let from_here = from.ip() == addr;
            if from_here && own_ports.contains(from.port()) {
                return;
            }
            io.udp_rcvd += 1;
            let dst = IpAddr::V4(g);
            let meta = RecvMeta { src: from.ip(), src_port: from.port(), ip_id: None, dst: Some(dst) };
            trace_packet("rx", data);
            dev.handle_packet(now, meta, data);
            // Captured after the check, with the IPv4 ID it found (as `deliver` does).
            if let Some(t) = tap.as_mut().filter(|_| !from_here) {
                t.write(from.ip(), dst, from.port(), data, dev.last_rx_ipv4_id());
            }
        });
        self.buf = buf;
        n
    }

    /// Sets every client's doorbell suppression flag.
    pub(super) fn set_polling(&self, on: bool) {
        for c in self.clients.values() {
            c.arena.polling().store(u32::from(on), Ordering::SeqCst);
        }
    }

    /// Moves work the clients posted on their rings into the engine, receive queues first (so a
    /// SEND posted together with its peer's receive finds it). A WQE is copied out of shared
    /// memory before it is decoded and checked; a full engine queue leaves the rest in the ring
    /// for later (backpressure). Returns how many WQEs moved.
    pub(super) fn service_rings(&mut self) -> usize {
        let State { clients, dev, io, .. } = self;
        let mut moved = 0;
        let mut misbehaving = Vec::new();
        for (&owner, c) in clients.iter_mut() {
            let mut bad = false;
            // Staging space the client has scattered from and given back.
            if c.arena.pending(&c.release) > 0 {
                let Client { arena, release, staging, .. } = &mut *c;
                arena.consume::<(u64, u32)>(release, usize::MAX, |v| match v {
                    Some((off, len))
                        if off as usize >= STAGING_OFF
                            && (off as usize).saturating_add(len as usize) <= STAGING_OFF + STAGING_LEN =>
                    {
                        staging.free(off as usize, len as usize);
                        true
                    }
                    _ => {
                        bad = true;
                        false
                    }
                });
            }
            let posted = c.arena.posted().load(Ordering::Acquire);
            if posted == c.seen_posted && !c.backlog && !bad {
                continue;
            }
            c.seen_posted = posted;
            c.backlog = false;
            let mut backlog = false;
            let Client { arena, rq, srq_rings, sq, staging, staged, stage_mrs, qp_pd, srq_pd, .. } = &mut *c;
            // A receive the client asked to stage gets one SGE over a fresh piece of the staging
            // area instead of its own, once its own SGEs pass the engine's checks (otherwise the
            // engine sees them as they are, and reports what is wrong as it would).
            for (q, r) in rq.iter() {
                moved += drain(arena, r, io, &mut backlog, &mut bad, |e: RecvEntry| {
                    let token = e.wr.wr_id;
                    let wr = redirect(dev, qp_pd.get(q).copied(), e, staging, staged, stage_mrs);
                    dev.post_recv(*q, wr).inspect_err(|_| unstage(staging, staged, token))
                });
            }
            for (s, r) in srq_rings.iter() {
                moved += drain(arena, r, io, &mut backlog, &mut bad, |e: RecvEntry| {
                    let token = e.wr.wr_id;
                    let wr = redirect(dev, srq_pd.get(s).copied(), e, staging, staged, stage_mrs);
                    dev.post_srq_recv(*s, wr).inspect_err(|_| unstage(staging, staged, token))
                });
            }
            for (q, r) in sq.iter() {
                let n =
                    drain(arena, r, io, &mut backlog, &mut bad, |e: SendEntry| dev.post_send_inline(*q, e.wr, e.data));
                if n > 0 {
                    // A refused request left the queue at once.
                    publish_retired(arena, r, dev, *q);
                }
                moved += n;
            }
            c.backlog = backlog;
            if bad {
                misbehaving.push(owner);
            }
        }
        // A ring entry that does not decode is a malformed message: that client is cut off and
        // its objects destroyed; nobody else notices.
        for owner in misbehaving {
            tracing::warn!(owner, "disconnecting a client that wrote a malformed entry to its rings");
            self.detach(owner);
        }
        if moved > 0 {
            // New requests come after completions their owner saw: it may have refilled buffers.
            self.dev.memory().forget_read_ahead();
        }
        moved
    }

    /// Receives of client `owner` for its QP `qpn`, straight into the engine (a provider's
    /// `ibv_post_recv`, see [`super::Hca::post_recv`]): staged as from its ring. On a request the
    /// engine refuses, the ones before it stay posted; returns that error and its index.
    pub(super) fn post_recv_direct(
        &mut self,
        owner: u32,
        qpn: Qpn,
        entries: Vec<RecvEntry>,
    ) -> Result<(), (VerbsError, usize)> {
        let State { clients, dev, io, .. } = self;
        let Some(c) = clients.get_mut(&owner).filter(|c| c.rq.contains_key(&qpn)) else {
            return Err((VerbsError::Inval, 0));
        };
        let Client { staging, staged, stage_mrs, qp_pd, .. } = &mut *c;
        for (index, e) in entries.into_iter().enumerate() {
            let token = e.wr.wr_id;
            let wr = redirect(dev, qp_pd.get(&qpn).copied(), e, staging, staged, stage_mrs);
            if let Err(err) = dev.post_recv(qpn, wr) {
                unstage(staging, staged, token);
                return Err((err, index));
            }
            io.ring_wqes += 1;
        }
        Ok(())
    }

    /// Sends the answers a poll held back ([`super::Hca::drive`]), if any.
    pub(super) fn send_owed(&mut self) {
        if self.tx_owed {
            self.pump();
        }
    }

    /// Sends every packet the fault injector delays, now: what a stopping device (or exiting
    /// process) had already put "on the wire" still arrives, as a network delivers a packet its
    /// sender no longer exists for. Dropping them would lose, e.g., a reordered final ACK, and
    /// a peer whose retries never run out (Linux rxe does not count down a retry_cnt of 7) would
    /// then resend its last request for ever.
    pub(super) fn send_delayed_now(&mut self) {
        if self.delayed.is_empty() {
            return;
        }
        while let Some(Reverse(d)) = self.delayed.pop() {
            self.deliver(d.dst, d.sport, &d.data, d.icrc_id, d.flip);
        }
        self.flush();
    }

    /// Whether the progress thread may hold back the acknowledgements of what it just received
    /// for the application's next post: an application thread posted a send within
    /// [`super::progress::HOLD_AFTER_POST`] and nothing was held back since (once per post, so
    /// a program that posted once and then only receives delays one acknowledgement at most,
    /// by at most HELD_ANSWER_WAIT).
    pub(super) fn hold_for_post(&self) -> bool {
        self.posted_send
            && self.last_post.is_some_and(|t| {
                self.now().saturating_since(t).as_nanos() < super::progress::HOLD_AFTER_POST.as_nanos() as u64
            })
    }

    /// Moves completions from the engine's CQs into the clients' completion rings, as far as
    /// the rings have room (what does not fit waits in the engine's CQ, which overflows at its
    /// own capacity).
    pub(super) fn fill_cq_rings(&mut self) {
        let State { clients, dev, cqes_written, .. } = self;
        for (&owner, c) in clients.iter_mut() {
            let helper_writes = dev.memory_ref().helper_writes(owner);
            // A client with a memory helper waits for the helper's writes before it sees a
            // completion (CqEntry::helper_writes): its completions go through the rings.
            let direct = !dev.memory_ref().has_helper(owner);
            for (cq, r) in &c.cq_rings {
                if let Some(seen) = c.direct_cqs.get_mut(cq).filter(|_| direct) {
                    // Polled straight from the engine: only counted (what the progress policy
                    // reads as "completions came").
                    if let Some(n) = dev.cq_counts(*cq) {
                        *cqes_written += n.added.wrapping_sub(*seen);
                        *seen = n.added;
                    }
                    continue;
                }
                if dev.cq_counts(*cq).is_none_or(|n| n.held == 0) {
                    continue;
                }
                let free = c.arena.free(r) as usize;
                for wc in dev.poll_cq(*cq, free) {
                    // A staged receive's completion says where its data is.
                    let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                    let stage = if recv { c.staged.remove(&wc.wr_id) } else { None };
                    if let (false, Some(sq)) = (recv, c.sq.get(&wc.qp_num)) {
                        // Before the completion: a client that sees it may post again.
                        publish_retired(&c.arena, sq, dev, wc.qp_num);
                    }
                    let e = CqEntry { wc, stage: stage.map(|st| (st.off as u64, st.len)), helper_writes };
                    let _ = c.arena.produce(r, &e);
                    *cqes_written += 1;
                }
            }
        }
    }
}
