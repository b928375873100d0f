//! The receive-posting schedule a recorded responder's ACK credit counts imply.
//!
//! The credit count of an RC ACK (IBTA 9.7.7.2, end-to-end flow control) is the number of receive
//! WQEs the responder has left, rounded down to the AETH's code table (Table 44: codes 0..30 for
//! 0, 1, 2, 3, 4, 6, 8, 12, ... 32768; 31 means no credit information). It falls by one for each
//! message that consumes a receive (a SEND, a WRITE with immediate) and rises only when the
//! application posts receives, which the capture does not show. So a recorded sequence of credit
//! counts is not compared with one fixed queue depth: it is explained by a posting schedule, the
//! total number of receives posted before each request, that never decreases. An ACK of code `k`
//! after `c` consuming messages says `count(k) <= posted - c < count(k + 1)`.
//!
//! [`infer`] finds the schedule that posts as late as possible (each total the smallest the
//! constraints so far allow, and at least one receive per consuming message), which is the one
//! most likely to meet every later upper bound too: if it fails one, no schedule meets it, and the
//! sequence is a real mismatch. The replay then posts by that schedule and compares softrdma's
//! codes with the recorded ones as usual.

use softrdma_engine::wire::aeth;

/// One request as the schedule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Request {
    /// It consumes a receive (the first time its PSN is seen).
    pub(super) consumes: bool,
    /// The credit code of the recorded ACK of this request, if it has one with a count.
    pub(super) ack_code: Option<u8>,
}

/// Why no schedule explains a recorded sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unexplained {
    /// The request whose ACK cannot be met (an index into the requests).
    pub(super) at: usize,
    /// Its credit code.
    pub(super) code: u8,
    /// Messages that had consumed a receive by then.
    pub(super) consumed: usize,
    /// Receives the schedule had to post by then (the earlier ACKs demand them).
    pub(super) posted: usize,
}

impl Unexplained {
    pub(super) fn describe(&self) -> String {
        let (lo, hi) = range(self.code);
        let left = self.posted.saturating_sub(self.consumed);
        format!(
            "no receive-posting schedule explains credit code {:#04x} ({}) after {} consuming messages: earlier ACKs need {} receives posted by then, which leaves {left}, and receives are only ever added (IBTA 9.7.7.2)",
            self.code,
            match hi {
                Some(h) => format!("{lo}..{h} WQEs"),
                None => format!("{lo} or more WQEs"),
            },
            self.consumed,
            self.posted,
        )
    }
}

/// The receive WQEs a credit code stands for: at least the code's count, below the next code's
/// (Table 44; the largest code has no upper bound).
pub(super) fn range(code: u8) -> (usize, Option<usize>) {
    let lo = aeth::credit_count(code).unwrap_or(0) as usize;
    let hi = if code < 30 { aeth::credit_count(code + 1).map(|n| n as usize - 1) } else { None };
    (lo, hi)
}

/// The total receives to have posted before each request is fed (non-decreasing), or the first
/// ACK no schedule explains; with that error, the schedule up to it (and kept level after) so that
/// the rest of the replay still runs.
pub(super) fn infer(reqs: &[Request]) -> (Vec<usize>, Option<Unexplained>) {
    let mut out = Vec::with_capacity(reqs.len());
    let (mut posted, mut consumed) = (0usize, 0usize);
    let mut err = None;
    for (i, r) in reqs.iter().enumerate() {
        if r.consumes {
            consumed += 1;
            // The receive this message takes was there when it came.
            posted = posted.max(consumed);
        }
        if let (Some(code), None) = (r.ack_code, &err) {
            let (lo, hi) = range(code);
            posted = posted.max(consumed + lo);
            if hi.is_some_and(|h| posted > consumed + h) {
                err = Some(Unexplained { at: i, code, consumed, posted });
            }
        }
        out.push(posted);
    }
    (out, err)
}

/// The schedule in a line for the report: the totals where they change, by request index.
pub(super) fn describe(schedule: &[usize], psn_of: impl Fn(usize) -> u32) -> String {
    let mut steps = Vec::new();
    let mut last = 0;
    for (i, &p) in schedule.iter().enumerate() {
        if p != last {
            steps.push(format!("{} by PSN {}", p, psn_of(i)));
            last = p;
        }
    }
    let total = steps.len();
    if total > 8 {
        steps.truncate(8);
        steps.push(format!("... ({total} steps in all)"));
    }
    format!(
        "receives posted by the schedule the recorded credit counts imply (IBTA 9.7.7.2: counts fall by one per consuming message and rise only by posting), as late as they allow: {} receives in all ({})",
        schedule.last().copied().unwrap_or(0),
        steps.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(code: Option<u8>) -> Request {
        Request { consumes: true, ack_code: code }
    }

    #[test]
    fn credits_that_fall_and_then_rise_are_a_late_posting_schedule() {
        // 4 then 3 then 2 WQEs left after SENDs 1..3 (nothing reposted), then 4 after the 4th
        // (three posted late).
        let (s, err) = infer(&[send(Some(4)), send(Some(3)), send(Some(2)), send(Some(4))]);
        assert_eq!(err, None);
        assert_eq!(s, vec![5, 5, 5, 8]);
    }

    #[test]
    fn credits_kept_at_one_code_post_one_receive_per_send() {
        // Code 9 (24..31 WQEs) throughout: the application reposts; the minimal schedule keeps
        // 24 left.
        let (s, err) = infer(&[send(Some(9)), send(Some(9)), send(Some(9))]);
        assert_eq!(err, None);
        assert_eq!(s, vec![25, 26, 27]);
    }

    #[test]
    fn a_count_that_falls_faster_than_the_messages_consume_is_unexplained() {
        // 4 left after one SEND, then 2 after the next: two receives gone for one message.
        let (_, err) = infer(&[send(Some(4)), send(Some(2))]);
        let e = err.expect("no schedule explains it");
        assert_eq!((e.at, e.code, e.consumed, e.posted), (1, 2, 2, 5));
        assert!(e.describe().contains("no receive-posting schedule explains credit code 0x02"));
    }

    #[test]
    fn requests_that_consume_nothing_and_acks_without_counts_constrain_nothing_but_the_receives_taken() {
        let write = Request { consumes: false, ack_code: Some(0) };
        let (s, err) = infer(&[send(None), write, send(None)]);
        assert_eq!(err, None);
        assert_eq!(s, vec![1, 1, 2]);
        // The largest code has no upper bound.
        assert_eq!(range(30), (32768, None));
        assert_eq!(range(8), (16, Some(23)));
    }
}
