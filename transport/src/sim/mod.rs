//! A deterministic simulated wire: endpoints exchange UDP datagrams (RoCEv2 payloads) under
//! virtual time, with latency, bandwidth and seeded faults, and a driver runs them to quiescence.
//!
//! # The model
//!
//! A [`Sim`] owns its endpoints, one event queue and one RNG seeded by the caller. Events are
//! datagram arrivals and timer wake-ups, ordered by `(time, sequence)`: events at the same instant
//! run in the order they were scheduled. [`Sim::step`] advances virtual time to the next event
//! and processes it; [`Sim::run`] steps until the simulation is *idle*: no datagram in flight and
//! no endpoint with a timeout.
//!
//! After every event (and at the start of every step and run, to pick up what the caller did to an
//! endpoint in between) the sim *flushes*: for each endpoint in index order it drains
//! [`Endpoint::poll_transmit`] until `None`, putting each datagram on the wire at the current
//! time, then re-reads every [`Endpoint::poll_timeout`] and schedules a wake-up when a deadline
//! changed. A superseded deadline is never delivered: only the latest wake-up armed for an
//! endpoint is live, and [`Endpoint::handle_timeout`] is called only when `now` has reached the
//! endpoint's current `poll_timeout()`.
//!
//! # The wire
//!
//! A datagram of `len` bytes that endpoint `i` sends at `now`:
//! 1. is counted in [`WireStats::sent`] and queued on `i`'s own link: it starts when the link is
//!    free (`max(now, busy_until)`) and leaves `len * 8 / bandwidth` later, when the link is free
//!    again (per-sender FIFO; only the sender's link is modelled, no switch or receiver queue);
//! 2. is dropped if it leaves inside a [`Partition`] window that covers its addresses, then if
//!    no endpoint has its destination address (routing uses the IP address only, not the port);
//! 3. suffers faults, drawn from the RNG in this fixed order: the four draws of
//!    [`Faults::sample`] (loss, after which nothing more is drawn; corruption, then the bit index
//!    if the payload is not empty; duplication; reordering), then jitter (only when the link has
//!    jitter);
//! 4. arrives `latency + jitter` after it left, plus the faults' `delay`, plus `reorder_delay` if
//!    reordered; a duplicate (carrying the same, possibly corrupted, bytes) arrives
//!    [`DUPLICATE_GAP`] after it.
//!
//! The faults are the shared model of [`crate::faults`] (the one a device's transmit path uses
//! too) except its `seed`: every draw comes from the one RNG seeded by [`Sim::new`]. Partitions
//! are the simulator's own addition ([`Sim::partitions_mut`]).
//!
//! The same endpoints, configuration and seed give the same run, event for event.
//! Nothing here reads a real clock or spawns a thread.

mod config;
mod queue;
mod stats;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softrdma_engine::time::{Duration, Instant};

use crate::faults::{self, Faults};

pub use config::{Limits, LinkConfig, Partition, PartitionScope};
pub use stats::{RunStats, SimError, WireStats};

use queue::{Event, EventKind, EventQueue};

/// How long after the first copy a duplicated datagram's second copy arrives.
pub const DUPLICATE_GAP: Duration = Duration::from_micros(1);

/// One UDP datagram on the simulated wire; the payload is what follows the UDP header (for
/// RoCEv2: BTH, extension headers, payload, pad and ICRC).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Datagram {
    /// Sender's address and UDP port.
    pub src: SocketAddr,
    /// Receiver's address and UDP port; the sim routes on the address only.
    pub dst: SocketAddr,
    /// UDP payload.
    pub payload: Vec<u8>,
}

/// A node on the simulated wire, driven sans-IO style (the engine's device implements it through
/// an adapter).
///
/// The sim never calls an endpoint concurrently and always passes a `now` that never decreases.
pub trait Endpoint {
    /// The address the endpoint receives on; read once, when the [`Sim`] is built.
    fn addr(&self) -> IpAddr;

    /// A datagram arrives at `now`.
    fn handle_datagram(&mut self, now: Instant, datagram: Datagram);

    /// The next datagram to send at `now`, if any. Drained until `None` after every event, so it
    /// must eventually return `None`.
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram>;

    /// The endpoint's next timer deadline, if any. Re-read after every event.
    fn poll_timeout(&self) -> Option<Instant>;

    /// Called at `now >= poll_timeout()`. Unless it arms a new deadline, the endpoint should make
    /// `poll_timeout()` return a later instant or `None`, or it will be woken again at once.
    fn handle_timeout(&mut self, now: Instant);
}

impl<E: Endpoint + ?Sized> Endpoint for Box<E> {
    fn addr(&self) -> IpAddr {
        (**self).addr()
    }
    fn handle_datagram(&mut self, now: Instant, datagram: Datagram) {
        (**self).handle_datagram(now, datagram)
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        (**self).poll_transmit(now)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        (**self).poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now)
    }
}

/// The wake-up currently armed for one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ArmedTimer {
    /// The deadline the endpoint reported.
    deadline: Instant,
    /// Sequence number of the queued wake-up; any other wake-up for this endpoint is stale.
    seq: u64,
}

/// What processing one event did.
enum Processed {
    /// A datagram was handed to an endpoint.
    Arrival,
    /// A live timer came due; `fired` says whether `handle_timeout` was called.
    Timer { fired: bool },
}

/// A deterministic discrete-event network of endpoints. See the [module docs](self).
#[derive(Debug)]
pub struct Sim<E: Endpoint> {
    endpoints: Vec<E>,
    routes: HashMap<IpAddr, usize>,
    link: LinkConfig,
    faults: Faults,
    /// Windows in which the wire drops datagrams (the simulator's addition to the faults).
    partitions: Vec<Partition>,
    rng: ChaCha8Rng,
    now: Instant,
    queue: EventQueue,
    /// Per sender: when its link finishes serializing what it has been given.
    link_busy_until: Vec<Instant>,
    /// Per endpoint: the live wake-up, if any.
    armed: Vec<Option<ArmedTimer>>,
    /// Arrival events in the queue.
    in_flight: usize,
    stats: WireStats,
}

impl<E: Endpoint> Sim<E> {
    /// Builds a network of `endpoints` (index = position) over `link`, with `faults` drawn from an
    /// RNG seeded by `seed` (not `faults.seed`), at virtual time zero, without partitions.
    ///
    /// # Panics
    ///
    /// If two endpoints report the same [`Endpoint::addr`].
    pub fn new(endpoints: Vec<E>, link: LinkConfig, faults: Faults, seed: u64) -> Self {
        let mut routes = HashMap::with_capacity(endpoints.len());
        for (i, endpoint) in endpoints.iter().enumerate() {
            let addr = endpoint.addr();
            if let Some(other) = routes.insert(addr, i) {
                panic!("endpoints {other} and {i} share the address {addr}");
            }
        }
        let n = endpoints.len();
        Sim {
            endpoints,
            routes,
            link,
            faults,
            partitions: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: Instant::ZERO,
            queue: EventQueue::default(),
            link_busy_until: vec![Instant::ZERO; n],
            armed: vec![None; n],
            in_flight: 0,
            stats: WireStats::default(),
        }
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Endpoint `i`.
    ///
    /// # Panics
    ///
    /// If there is no endpoint `i`.
    pub fn endpoint(&self, i: usize) -> &E {
        &self.endpoints[i]
    }

    /// Endpoint `i`, to act on it (post work, change its state). What it wants to send as a result
    /// goes on the wire at the next [`flush`](Sim::flush), [`step`](Sim::step) or [`run`](Sim::run).
    ///
    /// # Panics
    ///
    /// If there is no endpoint `i`.
    pub fn endpoint_mut(&mut self, i: usize) -> &mut E {
        &mut self.endpoints[i]
    }

    /// All endpoints, by index.
    pub fn endpoints(&self) -> &[E] {
        &self.endpoints
    }

    /// Takes the endpoints back.
    pub fn into_endpoints(self) -> Vec<E> {
        self.endpoints
    }

    /// The link configuration.
    pub fn link(&self) -> &LinkConfig {
        &self.link
    }

    /// The link configuration, to change it; it applies to datagrams sent from now on.
    pub fn link_mut(&mut self) -> &mut LinkConfig {
        &mut self.link
    }

    /// The fault configuration.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The fault configuration, to change it; it applies to datagrams sent from now on.
    pub fn faults_mut(&mut self) -> &mut Faults {
        &mut self.faults
    }

    /// The partition windows.
    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    /// The partition windows, to add or remove some; they apply to datagrams sent from now on.
    pub fn partitions_mut(&mut self) -> &mut Vec<Partition> {
        &mut self.partitions
    }

    /// Counters of everything the wire did so far.
    pub fn stats(&self) -> &WireStats {
        &self.stats
    }

    /// Whether nothing is pending: no datagram in flight and no endpoint with a timeout (as of the
    /// last flush).
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.armed.iter().all(Option::is_none)
    }

    /// Collects every endpoint's [`Endpoint::poll_transmit`] at the current time, puts the
    /// datagrams on the wire, and re-reads every [`Endpoint::poll_timeout`].
    ///
    /// [`step`](Sim::step) and [`run`](Sim::run) flush before and after each event, so calling this
    /// is needed only to put datagrams on the wire without processing an event.
    pub fn flush(&mut self) {
        for i in 0..self.endpoints.len() {
            while let Some(datagram) = self.endpoints[i].poll_transmit(self.now) {
                self.transmit(i, datagram);
            }
        }
        for i in 0..self.endpoints.len() {
            let deadline = self.endpoints[i].poll_timeout();
            if deadline == self.armed[i].map(|armed| armed.deadline) {
                continue;
            }
            self.armed[i] = deadline.map(|deadline| {
                let at = deadline.max(self.now);
                let seq = self.queue.push(at, EventKind::Timer { endpoint: i });
                ArmedTimer { deadline, seq }
            });
        }
    }

    /// Flushes, then processes the next event (a datagram arrival or a timer wake-up), advancing
    /// virtual time to it, then flushes again. Returns `false`, doing nothing more, when the
    /// simulation is idle.
    pub fn step(&mut self) -> bool {
        self.flush();
        match self.next_live_event() {
            Some(event) => {
                self.process(event);
                true
            }
            None => false,
        }
    }

    /// Steps until the simulation is idle, or fails when `limits` are reached; either way the
    /// returned stats say what this run did.
    pub fn run(&mut self, limits: Limits) -> Result<RunStats, SimError> {
        let mut run = RunStats { started_at: self.now, ended_at: self.now, ..RunStats::default() };
        let time_limit = self.now + limits.max_time;
        self.flush();
        loop {
            self.discard_stale_timers();
            let Some(next) = self.queue.peek().map(|event| event.at) else { break };
            if run.steps >= limits.max_steps {
                run.ended_at = self.now;
                return Err(SimError::StepLimit(run));
            }
            if next > time_limit {
                run.ended_at = self.now;
                return Err(SimError::TimeLimit(run));
            }
            let event = self.queue.pop().expect("peeked above");
            self.account(&mut run, event);
        }
        run.ended_at = self.now;
        Ok(run)
    }

    /// Processes every event due at or before `deadline`, then advances virtual time to `deadline`
    /// (if it is later than now), whether or not the simulation is idle. Fails with
    /// [`SimError::StepLimit`] after `max_steps` events.
    pub fn run_until(&mut self, deadline: Instant, max_steps: u64) -> Result<RunStats, SimError> {
        let mut run = RunStats { started_at: self.now, ended_at: self.now, ..RunStats::default() };
        self.flush();
        loop {
            self.discard_stale_timers();
            match self.queue.peek() {
                Some(event) if event.at <= deadline => {}
                _ => break,
            }
            if run.steps >= max_steps {
                run.ended_at = self.now;
                return Err(SimError::StepLimit(run));
            }
            let event = self.queue.pop().expect("peeked above");
            self.account(&mut run, event);
        }
        self.now = self.now.max(deadline);
        run.ended_at = self.now;
        Ok(run)
    }

    /// Processes `event` and records it in `run`.
    fn account(&mut self, run: &mut RunStats, event: Event) {
        run.steps += 1;
        match self.process(event) {
            Processed::Arrival => run.arrivals += 1,
            Processed::Timer { fired } => run.timeouts += u64::from(fired),
        }
    }

    /// Pops stale wake-ups off the front of the queue, so that its head (if any) is live.
    fn discard_stale_timers(&mut self) {
        while let Some(event) = self.queue.peek() {
            if self.is_live(event) {
                return;
            }
            self.queue.pop();
        }
    }

    /// The next live event, removed from the queue.
    fn next_live_event(&mut self) -> Option<Event> {
        self.discard_stale_timers();
        self.queue.pop()
    }

    /// Arrivals are always live; a wake-up only while it is its endpoint's armed timer.
    fn is_live(&self, event: &Event) -> bool {
        match event.kind {
            EventKind::Arrival { .. } => true,
            EventKind::Timer { endpoint } => self.armed[endpoint].is_some_and(|armed| armed.seq == event.seq),
        }
    }

    /// Advances time to a live `event`, hands it to its endpoint, and flushes.
    fn process(&mut self, event: Event) -> Processed {
        debug_assert!(event.at >= self.now, "events never go back in time");
        self.now = event.at;
        let processed = match event.kind {
            EventKind::Arrival { to, datagram } => {
                self.in_flight -= 1;
                self.stats.delivered += 1;
                self.stats.bytes_delivered += datagram.payload.len() as u64;
                self.endpoints[to].handle_datagram(self.now, datagram);
                Processed::Arrival
            }
            EventKind::Timer { endpoint } => {
                self.armed[endpoint] = None;
                // Waking early is harmless: only a deadline the endpoint still reports, and that
                // has come, is handed to it.
                let due = self.endpoints[endpoint].poll_timeout().is_some_and(|deadline| deadline <= self.now);
                if due {
                    self.endpoints[endpoint].handle_timeout(self.now);
                }
                Processed::Timer { fired: due }
            }
        };
        self.flush();
        processed
    }

    /// Puts a datagram from endpoint `from` on the wire at the current time.
    fn transmit(&mut self, from: usize, mut datagram: Datagram) {
        let len = datagram.payload.len();
        self.stats.sent += 1;
        self.stats.bytes_sent += len as u64;

        let start = self.now.max(self.link_busy_until[from]);
        let departs = start + self.link.serialization_time(len);
        self.link_busy_until[from] = departs;

        let (src, dst) = (datagram.src.ip(), datagram.dst.ip());
        if self.partitions.iter().any(|partition| partition.drops(src, dst, departs)) {
            self.stats.partitioned += 1;
            return;
        }
        let Some(&to) = self.routes.get(&dst) else {
            self.stats.unroutable += 1;
            return;
        };

        // Fault draws, in the documented order; changing it changes every seeded run.
        let sample = self.faults.sample(&mut self.rng, &datagram.payload);
        if sample.lost {
            self.stats.lost += 1;
            return;
        }
        if let Some(bit) = sample.flip_bit {
            faults::flip_bit(&mut datagram.payload, bit);
            self.stats.corrupted += 1;
        }
        let jitter = match self.link.jitter {
            Duration::ZERO => Duration::ZERO,
            jitter => Duration(self.rng.random_range(0..=jitter.0)),
        };

        let arrives = departs + self.link.latency + jitter + self.faults.added_delay(&sample);
        if sample.reordered {
            self.stats.reordered += 1;
        }
        let duplicate = sample.duplicate;
        if duplicate {
            self.stats.duplicated += 1;
            self.schedule_arrival(arrives, to, datagram.clone());
            self.schedule_arrival(arrives + DUPLICATE_GAP, to, datagram);
        } else {
            self.schedule_arrival(arrives, to, datagram);
        }
    }

    /// Schedules `datagram` to reach endpoint `to` at `at`.
    fn schedule_arrival(&mut self, at: Instant, to: usize, datagram: Datagram) {
        self.in_flight += 1;
        self.queue.push(at, EventKind::Arrival { to, datagram });
    }
}
