//! The device's entry points, its sans-IO loop: datagrams in ([`Device::handle_packet`]: the
//! ICRC check, QP1's MADs to the CM, multicast to its members, the rest to their QP), packets out
//! ([`Device::poll_transmit`]: the CM's MADs, then the ready QPs in turn), and timers
//! ([`Device::poll_timeout`], [`Device::handle_timeout`]). What a QP does with each is
//! `dispatch`'s; here the QP is found, and after it ran queued to transmit and its timer refiled
//! (`touched`, `sync_timer`).

use std::net::IpAddr;

use super::{comp, ip_udp_header, packet, qp, Ctx, Device, IcrcPolicy, RecvMeta, Transmit, TransmitOptions, GSI_QKEY};
use crate::memory::Memory;
use crate::time::Instant;
use crate::wire::{icrc, BthPacket, BthRepr, DethRepr, IbPacket, IbRepr, Opcode, Qpn};

impl<M: Memory> Device<M> {
    /// Takes one datagram's UDP payload (BTH to ICRC). Untrusted: a malformed packet, a bad ICRC,
    /// an unknown QP or a packet for a QP that cannot take it is counted and dropped.
    pub fn handle_packet(&mut self, now: Instant, meta: RecvMeta, payload: &[u8]) {
        self.handle(now, meta, payload, true);
    }

    /// Takes a packet this device sent to itself through internal loopback (never on a wire)
    /// without an ICRC ([`TransmitOptions::loopback_icrc`] off): its ICRC was not computed, so it is not
    /// checked; everything else is, as for [`Device::handle_packet`].
    pub fn handle_internal_packet(&mut self, now: Instant, meta: RecvMeta, payload: &[u8]) {
        self.handle(now, meta, payload, false);
    }

    /// The IPv4 ID the last packet given to [`Device::handle_packet`] left its sender with, as
    /// its ICRC check found it (the hint it came with, or the ID solved from the ICRC); `None`
    /// when it was not checked or not IPv4. A capture of received packets rebuilds their IPv4
    /// header with it instead of solving the CRC a second time.
    pub fn last_rx_ipv4_id(&self) -> Option<u16> {
        self.last_rx_ipv4_id
    }

    fn handle(&mut self, now: Instant, meta: RecvMeta, payload: &[u8], verify: bool) {
        self.last_rx_ipv4_id = None;
        let Ok(pkt) = IbPacket::new_checked(payload) else {
            self.counters.malformed += 1;
            return;
        };
        // IBTA A17.4.3.1: verify the ICRC over the headers as the sender wrote them.
        let dst = meta.dst.unwrap_or(self.config.addr);
        let (hdr, n) = ip_udp_header(meta.src, dst, meta.src_port, payload.len(), meta.ip_id.unwrap_or(0));
        let v4 = matches!((meta.src, dst), (IpAddr::V4(_), IpAddr::V4(_)));
        match verify.then(|| icrc::roce_v2_parts(&hdr[..n], pkt.body())) {
            None => {}
            Some(Ok(c)) if c == pkt.icrc() && v4 => self.last_rx_ipv4_id = Some(meta.ip_id.unwrap_or(0)),
            Some(Ok(c)) if c == pkt.icrc() => {}
            Some(_) => {
                // The given ID is what the receiver knows or guesses (a raw socket's real ID, a
                // segment's place in a GRO buffer); under AnyIpv4Id a mismatch is solved anyway.
                let solved = (self.config.icrc == IcrcPolicy::AnyIpv4Id && matches!(dst, IpAddr::V4(_)))
                    .then(|| icrc::solve_ipv4_id(&hdr[..n], payload))
                    .flatten();
                let Some(id) = solved else {
                    self.counters.icrc_err += 1;
                    return;
                };
                if v4 {
                    self.last_rx_ipv4_id = Some(id);
                }
                self.counters.icrc_id_solved += 1;
            }
        }
        let bth = BthPacket::new_unchecked(payload);
        if bth.tver() != 0 {
            // IBTA 9.6 (transport header validation): TVer 0 is the only transport version; a
            // packet of another is dropped silently (rxe: hdr_check), counted as malformed.
            self.counters.malformed += 1;
            return;
        }
        let qpn = bth.dest_qp();
        if qpn == Qpn::GSI {
            self.handle_gsi(now, meta.src, &pkt);
            return;
        }
        if qpn == Qpn::MULTICAST {
            // A multicast datagram goes to every UD QP attached to the group (IBTA 10.5).
            let members = self.mcast.get(&dst).cloned().unwrap_or_default();
            if members.is_empty() {
                self.counters.unknown_qp += 1;
            }
            // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: a QP that asked for it does not hear its own
            // sends (this device's address and the QP as DETH's source QP).
            let own = (meta.src == self.config.addr).then(|| pkt.deth().map(|d| d.src_qp())).flatten();
            for q in members {
                if let Some(qp) = self.qps.get_mut(&q) {
                    if qp.block_self_mcast_lb && own == Some(q) {
                        continue;
                    }
                    let mut ctx = ctx!(self, now);
                    ctx.dst = dst;
                    if qp.handle_packet(&mut ctx, meta.src, &pkt) {
                        self.counters.rcvd_pkts += 1;
                    }
                }
                self.touched(q);
            }
            return;
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.counters.unknown_qp += 1;
            return;
        };
        let mut ctx = ctx!(self, now);
        if qp.handle_packet(&mut ctx, meta.src, &pkt) {
            self.counters.rcvd_pkts += 1;
        }
        self.touched(qpn);
    }

    /// A datagram for QP1, the GSI: a CM MAD. IBTA 13.4.6 / rxe_recv.c: UD SEND_ONLY, P_Key
    /// 0xFFFF (the default partition; rxe checks it with pkey_match), Q_Key 0x80010000
    /// (IB_QP1_QKEY); anything else is dropped and counted.
    fn handle_gsi(&mut self, now: Instant, src: IpAddr, pkt: &IbPacket<&[u8]>) {
        let bth = pkt.bth();
        let qkey_ok = pkt.deth().is_some_and(|d| d.qkey() == GSI_QKEY);
        if pkt.opcode() != Opcode::UD_SEND_ONLY || bth.pkey() & 0x7fff != 0x7fff || !qkey_ok {
            self.counters.malformed += 1;
            return;
        }
        self.counters.rcvd_pkts += 1;
        self.cm.handle_mad(now, src, pkt.payload());
    }

    /// The next MAD of the CM as a QP1 packet: UD SEND_ONLY to QP1, DETH Q_Key 0x80010000 and
    /// source QP 1, one PSN per MAD (IBTA 13.5; the kernel's MAD layer over rxe).
    fn poll_gsi(&mut self, now: Instant, buf: &mut [u8], opts: TransmitOptions) -> Option<Transmit> {
        let m = self.cm.poll_mad()?;
        let psn = self.gsi_psn;
        self.gsi_psn = psn + 1;
        let mut ib = IbRepr::new(BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: IbRepr::pad_for(m.mad.len()),
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::GSI,
            ack_req: false,
            psn,
        });
        ib.payload_len = m.mad.len();
        ib.deth = Some(DethRepr { qkey: GSI_QKEY, src_qp: Qpn::GSI });
        let mut ctx = ctx!(self, now);
        (ctx.ip_id, ctx.loopback_icrc) = (opts.ip_id, opts.loopback_icrc);
        let t = packet::emit(&mut ctx, Qpn::GSI, m.dst, buf, &ib, |_, out| {
            out.copy_from_slice(&m.mad);
            true
        });
        if t.is_some() {
            self.counters.sent_pkts += 1;
        }
        t
    }

    /// After a QP ran: queue it to transmit, and refile its timer.
    pub(super) fn touched(&mut self, qpn: Qpn) {
        if self.in_ready.insert(qpn) {
            self.ready.push_back(qpn);
        }
        self.sync_timer(qpn);
    }

    fn sync_timer(&mut self, qpn: Qpn) {
        let new = self.qps.get(&qpn).and_then(|q| q.poll_timeout());
        let old = self.armed.get(&qpn).copied();
        if new == old {
            return;
        }
        if let Some(t) = old {
            self.timers.remove(&(t, qpn));
            self.armed.remove(&qpn);
        }
        if let Some(t) = new {
            self.timers.insert((t, qpn));
            self.armed.insert(qpn, t);
        }
    }

    /// Writes the next packet to send into `buf` (at least MTU + 64 bytes) and says where it goes,
    /// with the default [`TransmitOptions`].
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.poll_transmit_with(now, buf, TransmitOptions::default())
    }

    /// [`Device::poll_transmit`], the packet's ICRC written as `opts` say.
    pub fn poll_transmit_with(&mut self, now: Instant, buf: &mut [u8], opts: TransmitOptions) -> Option<Transmit> {
        if let Some(t) = self.poll_gsi(now, buf, opts) {
            return Some(t);
        }
        while let Some(qpn) = self.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                self.in_ready.remove(&qpn);
                continue;
            };
            let blocked = self.mem.would_block_count();
            let mut ctx = ctx!(self, now);
            (ctx.ip_id, ctx.loopback_icrc) = (opts.ip_id, opts.loopback_icrc);
            let sent = qp.poll_transmit(&mut ctx, buf, opts.requester_first);
            self.sync_timer(qpn);
            if let Some(t) = sent {
                self.counters.sent_pkts += 1;
                self.ready.push_back(qpn);
                return Some(t);
            }
            self.in_ready.remove(&qpn);
            if self.mem.would_block_count() != blocked && !self.mem_waiters.contains(&qpn) {
                self.mem_waiters.push(qpn);
            }
        }
        None
    }

    /// The memory has news for accesses that would have blocked ([`Memory::would_block_count`]):
    /// the QPs that waited for them try again.
    pub fn memory_ready(&mut self) {
        for qpn in std::mem::take(&mut self.mem_waiters) {
            if self.qps.contains_key(&qpn) && self.in_ready.insert(qpn) {
                self.ready.push_back(qpn);
            }
        }
    }

    /// Whether a QP has responder packets to send (ACKs, NAKs, READ responses, atomic ACKs):
    /// answers to what it received.
    pub fn answers_pending(&self) -> bool {
        self.ready.iter().any(|q| self.qps.get(q).is_some_and(|qp| !qp.resp.out.is_empty()))
    }

    /// Whether all this device would send now is acknowledgements (ACKs and NAKs): no READ
    /// response or atomic acknowledge (a requester waits for its data), no requester packet (no
    /// QP has posted work left to send). What a host may let wait a little for the
    /// application's next post, to leave in the same send as it (IBTA 9.7.5.1 fixes no time
    /// for an acknowledgement, only that it comes before the requester's transport timer).
    pub fn only_acks_pending(&self) -> bool {
        let mut acks = false;
        for q in &self.ready {
            let Some(qp) = self.qps.get(q) else { continue };
            if qp.req.idx < qp.sq.len() || !qp.resp.out.iter().all(|o| matches!(o, qp::RespOut::Ack { .. })) {
                return false;
            }
            acks |= !qp.resp.out.is_empty();
        }
        acks
    }

    /// The earliest timer deadline of any QP.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.timers.first().map(|(t, _)| *t), self.cm.poll_timeout()].into_iter().flatten().min()
    }

    /// Fires QP `qpn`'s transport timer at `now` whether or not it was due (IBTA 9.7.6.1.3: go
    /// back to the oldest unacknowledged PSN, the window shrinks as on any timeout). A trace
    /// replay uses it to re-enact the timeouts a recorded requester took, whose timer value is
    /// not on the wire. Nothing happens when no sent request is outstanding.
    pub fn expire_transport_timer(&mut self, qpn: Qpn, now: Instant) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            let mut ctx = ctx!(self, now);
            comp::retransmit_timeout(qp, &mut ctx);
        }
        self.touched(qpn);
    }

    /// Runs every timer that is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
        }
        let due: Vec<Qpn> = self.timers.iter().take_while(|(t, _)| *t <= now).map(|(_, q)| *q).collect();
        for qpn in due {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                let mut ctx = ctx!(self, now);
                qp.handle_timeout(&mut ctx);
            }
            self.touched(qpn);
        }
    }
}
