//! The event queue: a min-heap ordered by `(time, sequence)`, so events at the same instant come
//! out in the order they were scheduled.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use softrdma_engine::time::Instant;

use super::Datagram;

/// Something that happens at an instant.
#[derive(Debug)]
pub(crate) enum EventKind {
    /// A datagram reaches endpoint `to`.
    Arrival { to: usize, datagram: Datagram },
    /// The timer armed for `endpoint` expires; live only while it is that endpoint's armed timer.
    Timer { endpoint: usize },
}

/// An event with its place in the order.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) at: Instant,
    pub(crate) seq: u64,
    pub(crate) kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Event) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest `(at, seq)` first.
    fn cmp(&self, other: &Event) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Pending events, earliest first, ties in scheduling order.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    heap: BinaryHeap<Event>,
    next_seq: u64,
}

impl EventQueue {
    /// Schedules `kind` at `at` and returns its sequence number (unique for this queue).
    pub(crate) fn push(&mut self, at: Instant, kind: EventKind) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Event { at, seq, kind });
        seq
    }

    /// The earliest event, if any.
    pub(crate) fn peek(&self) -> Option<&Event> {
        self.heap.peek()
    }

    /// Removes and returns the earliest event.
    pub(crate) fn pop(&mut self) -> Option<Event> {
        self.heap.pop()
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn queue_pops_by_time_then_in_scheduling_order() {
        let mut q = EventQueue::default();
        let late = q.push(Instant(20), EventKind::Timer { endpoint: 0 });
        let first = q.push(Instant(10), EventKind::Timer { endpoint: 1 });
        let second = q.push(Instant(10), EventKind::Timer { endpoint: 2 });
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|e| e.seq).collect();
        assert_eq!(order, vec![first, second, late]);
    }
}
