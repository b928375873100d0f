//! The requester's window of unacknowledged PSNs ([`Window`]): how many PSNs may be outstanding
//! now, shrunk on loss and grown by acknowledgements, with the probe that ends a stall. The
//! requester (`req`) asks it whether the next packet may leave and tells it what left; the
//! completer (`comp`) tells it what was acknowledged, lost or RNR-NAKed. It changes no packet's
//! format, PSN or order, only when the next new packet may leave.

use crate::time::{Duration, Instant};
use crate::wire::Psn;

/// The requester keeps at most this many PSNs unacknowledged. IBTA leaves the limit to the
/// implementation (9.7.7.2.1: credits limit only SENDs). Without it, a queue of large WRITEs is
/// blasted at once, overflows the receiver's socket buffer, and go-back-N resends all of it
/// again, until the retry count runs out. rxe keeps 128 (RXE_MAX_UNACKED_PSNS); 256 (1 MiB at
/// MTU 4096) keeps a provider's ib_write_bw 64 KiB moving while the receiving process's progress
/// thread is woken: 1.3 GB/s with 128, 1.8-2.2 with 256 or 512 in the same rounds (BENCHMARKS.md,
/// "The window"). The window shrinks under loss (`Window`).
pub const MAX_UNACKED_PSNS: i32 = 256;

/// The smallest window [`Window`] shrinks to, in PSNs.
pub(crate) const MIN_UNACKED_PSNS: u32 = 8;

/// The requester's window of unacknowledged PSNs: at most [`MAX_UNACKED_PSNS`], halved on a loss
/// and grown again by acknowledgements (additive increase, multiplicative decrease, as a TCP
/// sender's congestion window; issue 21).
///
/// Why: go-back-N is the wire behaviour (IBTA 9.7.5.1.2: the responder accepts requests only in
/// PSN order, NAKs the first out-of-sequence one and silently drops the rest until the expected
/// PSN comes; 9.7.5.2: the requester resends from the NAKed PSN). Every packet the requester sent
/// after a lost one is therefore sent twice, so a loss costs about the window in flight. IBTA
/// does not fix how many packets a requester keeps unacknowledged nor how fast it sends (the
/// end-to-end credits of 9.7.7.2 bound only SENDs' receive WQEs, and RoCEv2's congestion control,
/// Annex A17, has the requester lower its rate on congestion); an HCA bounds its outstanding
/// packets by its own resources. Shrinking the window where loss is seen is such a bound; it
/// changes no packet's format, PSN or order, only when the next new packet may leave.
/// Without loss the window stays at its maximum: lossless behaviour is unchanged.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// PSNs that may be unacknowledged now.
    pub(crate) cwnd: u32,
    /// Below this the window grows by every acknowledged PSN (slow start, after a timeout);
    /// above it by one PSN per window acknowledged.
    ssthresh: u32,
    /// PSNs acknowledged towards the next additive step.
    acked: u32,
    /// Losses before this PSN belong to a window already shrunk for (one decrease per window).
    recover: Option<Psn>,
    /// Smoothed round trip from a packet asking for an ACK to the ACK that covers it, in ns
    /// (0: not measured yet); sets the window probe's delay.
    srtt_ns: u64,
    /// The packet being timed for [`Window::srtt_ns`]: its PSN and when it left (a first
    /// transmission only: a resend's ACK could answer either copy, as TCP's Karn rule says).
    sample: Option<(Psn, Instant)>,
    /// When a requester stopped by this window lets one packet more out ([`Window::on_blocked`]).
    pub(crate) probe_at: Option<Instant>,
    /// One packet beyond the window may leave now, asking for an ACK.
    probe: bool,
    /// That probe went out: no second one before an acknowledgement or a resend.
    probed: bool,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            cwnd: MAX_UNACKED_PSNS as u32,
            ssthresh: MAX_UNACKED_PSNS as u32,
            acked: 0,
            recover: None,
            srtt_ns: 0,
            sample: None,
            probe_at: None,
            probe: false,
            probed: false,
        }
    }
}

/// The shortest delay before a window probe (the round trip measured on a loopback device can
/// be a few microseconds; a probe is one packet, but not one per scheduling hiccup).
const MIN_PROBE_DELAY_NS: u64 = 50_000;

impl Window {
    /// `n` PSNs were acknowledged at `now`; the oldest unacknowledged PSN is now `comp_psn`.
    pub(crate) fn on_ack(&mut self, n: u32, comp_psn: Psn, now: Instant) {
        if self.recover.is_some_and(|r| comp_psn.distance(r) >= 0) {
            self.recover = None;
        }
        // The window moved: a probe armed or sent for the stall before is over.
        self.probe_at = None;
        self.probe = false;
        self.probed = false;
        if let Some((psn, sent)) = self.sample {
            if comp_psn.distance(psn) > 0 {
                let rtt = now.saturating_since(sent).0;
                // As TCP's SRTT (RFC 6298): 7/8 of the old estimate, 1/8 of the new sample.
                self.srtt_ns = if self.srtt_ns == 0 { rtt } else { (self.srtt_ns * 7 + rtt) / 8 };
                self.sample = None;
            }
        }
        let max = MAX_UNACKED_PSNS as u32;
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(n).min(self.ssthresh);
            return;
        }
        self.acked = self.acked.saturating_add(n);
        while self.acked >= self.cwnd && self.cwnd < max {
            self.acked -= self.cwnd;
            self.cwnd += 1;
        }
        if self.cwnd >= max {
            self.cwnd = max;
            self.acked = 0;
        }
    }

    /// A PSN sequence NAK or an implicit NAK reported `psn` lost while PSNs up to `sent_high`
    /// were out: halve the window, once per window.
    pub(crate) fn on_loss(&mut self, psn: Psn, sent_high: Psn) {
        self.on_resend();
        if self.recover.is_some_and(|r| psn.distance(r) < 0) {
            return;
        }
        self.ssthresh = (self.cwnd / 2).max(MIN_UNACKED_PSNS);
        self.cwnd = self.ssthresh;
        self.acked = 0;
        self.recover = Some(sent_high);
    }

    /// The local ACK timer expired: start again from the smallest window.
    pub(crate) fn on_timeout(&mut self, sent_high: Psn) {
        self.on_resend();
        self.ssthresh = (self.cwnd / 2).max(MIN_UNACKED_PSNS);
        self.cwnd = MIN_UNACKED_PSNS;
        self.acked = 0;
        self.recover = Some(sent_high);
    }

    /// An RNR NAK: the responder has no receive WQE for the NAKed PSN (IBTA 9.7.5.2.8) and drops
    /// what was pipelined behind it, so after the RNR wait everything from that PSN goes again.
    /// The resend starts from the smallest window and grows back by slow start to the window
    /// it had (`ssthresh` keeps it): a responder that is still short of WQEs answers the first
    /// few packets with the next RNR NAK instead of having the whole window (up to
    /// [`MAX_UNACKED_PSNS`], 1 MiB at MTU 4096) resent and dropped each time, and one that
    /// caught up has its window back within a few round trips. The RNR is not a loss: the
    /// window it returns to is not halved.
    pub(crate) fn on_rnr(&mut self) {
        self.on_resend();
        self.ssthresh = self.ssthresh.max(self.cwnd);
        self.cwnd = MIN_UNACKED_PSNS;
        self.acked = 0;
    }

    /// The requester goes back to resend (a NAK, an implicit NAK, the ACK timer, an RNR NAK):
    /// no probe is pending, and the round trip being timed is void (Karn).
    pub(crate) fn on_resend(&mut self) {
        self.probe_at = None;
        self.probe = false;
        self.probed = false;
        self.sample = None;
    }

    /// How many PSNs may be unacknowledged now: the window, plus one while a probe is due.
    pub(crate) fn limit(&self) -> i32 {
        self.cwnd as i32 + i32::from(self.probe)
    }

    /// The window stopped a requester that has more to send, at `now`: after about two round
    /// trips without an acknowledgement, one packet beyond the window goes out asking for an
    /// ACK (a window probe; [`Window::probe_due`]).
    ///
    /// Why: a requester held by its own window sends nothing until an ACK comes, so when the
    /// ACK answering the window is lost (a responder may coalesce all the window's ACKs into one,
    /// IBTA 9.7.5.1.2), or the window's last packets are, nothing is left in flight that
    /// could draw an ACK or a PSN sequence NAK, and only the local ACK timer (IBTA 9.7.6.1.3;
    /// seconds as rdma_cm sets it) would end the stall. The probe is the next request in PSN
    /// order, so the responder answers it as any other: an ACK covering the window (the ACK
    /// was lost), or a sequence NAK for the first missing PSN (9.7.5.1.2: the window's tail
    /// was lost). As TCP's tail loss probe (RFC 8985), one per stall; the timer stays the last
    /// resort when the probe or its answer is lost too.
    ///
    /// Only while the window is below its maximum, i.e. after a loss: at the full window of
    /// [`MAX_UNACKED_PSNS`] the requester waits as before (as rxe does), so that a lossless run
    /// sends exactly the packets it sent before, whatever the timing (a probe depends on the
    /// clock; `softrdma pcap replay` of a lossless trace compares every packet).
    pub(crate) fn on_blocked(&mut self, now: Instant) {
        if self.probed || self.probe || self.probe_at.is_some() || self.srtt_ns == 0 {
            return;
        }
        if self.cwnd >= MAX_UNACKED_PSNS as u32 {
            return;
        }
        let delay = (2 * self.srtt_ns).max(MIN_PROBE_DELAY_NS);
        self.probe_at = Some(now + Duration::from_nanos(delay));
    }

    /// The probe's time came: one packet more may leave.
    pub(crate) fn probe_due(&mut self, now: Instant) {
        if self.probe_at.is_some_and(|t| t <= now) {
            self.probe_at = None;
            self.probe = true;
        }
    }

    /// A packet with PSN `psn` left at `now`, `beyond` the window (the probe), `ack_req` set,
    /// `first` time sent (not a resend).
    pub(crate) fn on_sent(&mut self, psn: Psn, now: Instant, beyond: bool, ack_req: bool, first: bool) {
        if beyond {
            self.probe = false;
            self.probed = true;
        }
        if ack_req && first && self.sample.is_none() {
            self.sample = Some((psn, now));
        }
    }
}
