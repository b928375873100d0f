//! What happens to a QP: a packet for it arrives (the requester's answers go to the completer,
//! requests to the responder of its service), it may send (the responder's answers first, then
//! the requester's requests), a timer expires. The roles (req, comp, resp, unreliable) work on the
//! QP's state (qp) and on what they share (packet, window); only this module calls them.

use std::net::IpAddr;

use super::qp::Qp;
use super::{comp, req, resp, unreliable, AsyncEvent, Ctx, Transmit};
use crate::memory::Memory;
use crate::verbs::{QpState, QpType};
use crate::wire::{IbPacket, Transport};

impl Qp {
    /// Dispatches a checked packet: requests to the responder, responses to the completer.
    /// Returns whether the QP accepted it.
    pub(crate) fn handle_packet<M: Memory>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        src: IpAddr,
        pkt: &IbPacket<&[u8]>,
    ) -> bool {
        let op = pkt.opcode();
        let Some(info) = op.info() else { return false };
        // The opcode's transport must be the QP's (a packet of another service is dropped).
        let ok = matches!(
            (self.qp_type, op.transport(), info.kind.is_request()),
            (QpType::Rc, Transport::Rc, _)
                | (QpType::Uc, Transport::Uc, true)
                | (QpType::Ud, Transport::Ud, true)
                | (QpType::XrcIni, Transport::Xrc, false)
                | (QpType::XrcTgt, Transport::Xrc, true)
        );
        if !ok {
            ctx.counters.malformed += 1;
            return false;
        }
        // P_Key: only the default partition exists (IBTA 10.9: packets of another partition are
        // dropped and counted).
        if pkt.bth().pkey() & 0x7fff != 0x7fff {
            ctx.counters.malformed += 1;
            return false;
        }
        if self.qp_type == QpType::Ud {
            if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                return false;
            }
            unreliable::handle_ud(self, ctx, src, ctx.dst, pkt);
            return true;
        }
        // A connected QP only talks to its peer (the responder's address check, as rxe's
        // check_addr).
        if src != self.attr.dest {
            return false;
        }
        if info.kind.is_request() {
            if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                return false;
            }
            if self.state == QpState::Rtr && !self.resp.comm_est_sent {
                // IBTA 11.6.2: COMM_EST when the first packet arrives in RTR.
                self.resp.comm_est_sent = true;
                self.raise(ctx, AsyncEvent::CommEst(self.qpn));
            }
            if self.qp_type == QpType::Uc {
                unreliable::handle_uc(self, ctx, pkt);
            } else {
                // The answers to this request wait for what it wrote (Memory::write_fence).
                let _ = ctx.mem.write_fence();
                resp::handle_request(self, ctx, pkt);
                let f = ctx.mem.write_fence();
                if f != 0 {
                    self.resp.fences.retain(|&g| g >> 40 != f >> 40);
                    self.resp.fences.push(f);
                }
            }
            true
        } else {
            if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                return false;
            }
            comp::handle_response(self, ctx, pkt);
            true
        }
    }

    /// The QP's next packet: its responder's answers first, or with `requester_first` its
    /// requester's packets first ([`super::TransmitOptions::requester_first`]).
    pub(crate) fn poll_transmit<M: Memory>(
        &mut self,
        ctx: &mut Ctx<'_, M>,
        buf: &mut [u8],
        requester_first: bool,
    ) -> Option<Transmit> {
        if !requester_first {
            if let Some(t) = resp::poll_transmit(self, ctx, buf) {
                return Some(t);
            }
        }
        let t = req::poll_transmit(self, ctx, buf);
        if requester_first && t.is_none() {
            if let Some(t) = resp::poll_transmit(self, ctx, buf) {
                return Some(t);
            }
        }
        // SQ_DRAINED: in SQD, once no message that had started is still outstanding (IBTA
        // 11.6.3); work posted after entering SQD waits and does not count.
        if t.is_none() && self.state == QpState::Sqd && !self.req.drained_reported && !self.sq.iter().any(|w| w.started)
        {
            self.req.drained_reported = true;
            self.raise(ctx, AsyncEvent::SqDrained(self.qpn));
        }
        t
    }

    pub(crate) fn handle_timeout<M: Memory>(&mut self, ctx: &mut Ctx<'_, M>) {
        if self.comp.rnr_until.is_some_and(|t| t <= ctx.now) {
            // The RNR wait is over: resend from the NAKed PSN (already rewound), under a
            // transport timer started now.
            self.comp.rnr_until = None;
            self.rearm(ctx);
        }
        if self.comp.retrans_at.is_some_and(|t| t <= ctx.now) {
            comp::retransmit_timeout(self, ctx);
        }
        // A requester stopped by its window lets one packet more out (window::Window::on_blocked);
        // the device runs the QP's transmit after its timers.
        self.comp.window.probe_due(ctx.now);
    }
}
