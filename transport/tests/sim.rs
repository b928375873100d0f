//! The simulated wire, driven by small test endpoints: timing, counters, every fault, partitions,
//! timers, determinism per seed, and the livelock limits.

use std::collections::{BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use softrdma_engine::time::{Duration, Instant};
use softrdma_transport::faults::Faults;
use softrdma_transport::sim::{
    Datagram, Endpoint, Limits, LinkConfig, Partition, RunStats, Sim, SimError, WireStats, DUPLICATE_GAP,
};

// ---------------------------------------------------------------------------------------------
// Addresses, time and payloads.

const ROCE_PORT: u16 = 4791;

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, host))
}

fn sock(host: u8) -> SocketAddr {
    SocketAddr::new(ip(host), ROCE_PORT)
}

fn us(n: u64) -> Instant {
    Instant(Duration::from_micros(n).as_nanos())
}

fn ms(n: u64) -> Instant {
    Instant(Duration::from_millis(n).as_nanos())
}

/// FNV-1a: every single-bit change of the input changes it, so test receivers detect corruption
/// the way an engine detects it through the ICRC.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &b| (hash ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// A numbered payload of `len >= 8` bytes: sequence number, filler, checksum.
fn message(seq: u32, len: usize) -> Vec<u8> {
    assert!(len >= 8);
    let mut payload = seq.to_be_bytes().to_vec();
    payload.extend((0..len - 8).map(|i| (i as u32 ^ seq) as u8));
    let check = fnv1a(&payload);
    payload.extend(check.to_be_bytes());
    payload
}

/// The sequence number of an intact [`message`]; `None` if it was corrupted.
fn parse(payload: &[u8]) -> Option<u32> {
    let (body, check) = payload.split_at(payload.len().checked_sub(4)?);
    if body.len() < 4 || fnv1a(body).to_be_bytes() != check {
        return None;
    }
    Some(u32::from_be_bytes(body[..4].try_into().unwrap()))
}

// ---------------------------------------------------------------------------------------------
// Test endpoints.

/// Sends `count` numbered datagrams to `to` as soon as it is polled.
#[derive(Debug)]
struct Ping {
    addr: IpAddr,
    outbox: VecDeque<Datagram>,
}

impl Ping {
    fn new(host: u8, to: SocketAddr, count: u32, len: usize) -> Ping {
        let outbox = (0..count).map(|seq| Datagram { src: sock(host), dst: to, payload: message(seq, len) }).collect();
        Ping { addr: ip(host), outbox }
    }
}

impl Endpoint for Ping {
    fn addr(&self) -> IpAddr {
        self.addr
    }
    fn handle_datagram(&mut self, _now: Instant, _d: Datagram) {}
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        self.outbox.pop_front()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {
        unreachable!("a ping has no timer")
    }
}

/// Records every arrival.
#[derive(Debug)]
struct Sink {
    addr: IpAddr,
    received: Vec<(Instant, Vec<u8>)>,
}

impl Sink {
    fn new(host: u8) -> Sink {
        Sink { addr: ip(host), received: Vec::new() }
    }
    fn seqs(&self) -> Vec<u32> {
        self.received.iter().map(|(_, p)| parse(p).expect("intact")).collect()
    }
    fn times(&self) -> Vec<Instant> {
        self.received.iter().map(|&(t, _)| t).collect()
    }
}

impl Endpoint for Sink {
    fn addr(&self) -> IpAddr {
        self.addr
    }
    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        self.received.push((now, d.payload));
    }
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        None
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {
        unreachable!("a sink has no timer")
    }
}

/// A stop-and-wait reliable sender: one message outstanding, retransmitted every `rto` until
/// acknowledged, given up after `max_retries` retransmissions.
#[derive(Debug)]
struct StopAndWait {
    addr: IpAddr,
    peer: SocketAddr,
    total: u32,
    len: usize,
    rto: Duration,
    max_retries: u32,
    /// The message awaiting its ACK.
    next: u32,
    retries_left: u32,
    send_now: bool,
    deadline: Option<Instant>,
    transmissions: u32,
    acked_at: Vec<(u32, Instant)>,
    corrupt_dropped: u32,
    gave_up_at: Option<Instant>,
}

impl StopAndWait {
    fn new(host: u8, peer: SocketAddr, total: u32, len: usize, rto: Duration, max_retries: u32) -> StopAndWait {
        StopAndWait {
            addr: ip(host),
            peer,
            total,
            len,
            rto,
            max_retries,
            next: 0,
            retries_left: max_retries,
            send_now: total > 0,
            deadline: None,
            transmissions: 0,
            acked_at: Vec::new(),
            corrupt_dropped: 0,
            gave_up_at: None,
        }
    }
}

impl Endpoint for StopAndWait {
    fn addr(&self) -> IpAddr {
        self.addr
    }
    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        match parse(&d.payload) {
            None => self.corrupt_dropped += 1,
            Some(seq) if seq == self.next && self.gave_up_at.is_none() => {
                self.acked_at.push((seq, now));
                self.next += 1;
                self.retries_left = self.max_retries;
                self.deadline = None;
                self.send_now = self.next < self.total;
            }
            Some(_) => {} // an old ACK of a retransmission
        }
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        if !self.send_now {
            return None;
        }
        self.send_now = false;
        self.transmissions += 1;
        self.deadline = Some(now + self.rto);
        Some(Datagram {
            src: SocketAddr::new(self.addr, ROCE_PORT),
            dst: self.peer,
            payload: message(self.next, self.len),
        })
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }
    fn handle_timeout(&mut self, now: Instant) {
        assert!(now >= self.deadline.expect("woken without a deadline"), "woken early");
        self.deadline = None;
        if self.retries_left == 0 {
            self.gave_up_at = Some(now);
        } else {
            self.retries_left -= 1;
            self.send_now = true;
        }
    }
}

/// The stop-and-wait receiver: delivers each message once and in order, (re-)acknowledges
/// every intact one, drops corrupted ones.
#[derive(Debug)]
struct Receiver {
    addr: IpAddr,
    expected: u32,
    arrivals: Vec<(Instant, Vec<u8>)>,
    delivered: Vec<(u32, Instant)>,
    corrupt_dropped: u32,
    outbox: VecDeque<Datagram>,
}

impl Receiver {
    fn new(host: u8) -> Receiver {
        Receiver {
            addr: ip(host),
            expected: 0,
            arrivals: Vec::new(),
            delivered: Vec::new(),
            corrupt_dropped: 0,
            outbox: VecDeque::new(),
        }
    }
}

impl Endpoint for Receiver {
    fn addr(&self) -> IpAddr {
        self.addr
    }
    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        self.arrivals.push((now, d.payload.clone()));
        let Some(seq) = parse(&d.payload) else {
            self.corrupt_dropped += 1;
            return;
        };
        if seq == self.expected {
            self.delivered.push((seq, now));
            self.expected += 1;
        }
        if seq < self.expected {
            self.outbox.push_back(Datagram { src: d.dst, dst: d.src, payload: message(seq, 8) });
        }
    }
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        self.outbox.pop_front()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {
        unreachable!("the receiver has no timer")
    }
}

/// Re-arms its timer `period` after every expiry, forever: a livelock.
#[derive(Debug)]
struct Spinner {
    addr: IpAddr,
    period: Duration,
    next: Instant,
    fired: u64,
}

impl Spinner {
    fn new(host: u8, period: Duration) -> Spinner {
        Spinner { addr: ip(host), period, next: Instant::ZERO + period, fired: 0 }
    }
}

impl Endpoint for Spinner {
    fn addr(&self) -> IpAddr {
        self.addr
    }
    fn handle_datagram(&mut self, _now: Instant, _d: Datagram) {}
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        None
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Some(self.next)
    }
    fn handle_timeout(&mut self, now: Instant) {
        assert!(now >= self.next, "woken early");
        self.fired += 1;
        self.next = now + self.period;
    }
}

/// A one-shot timer that each arrival moves to the next deadline of `moves`.
#[derive(Debug)]
struct Mover {
    addr: IpAddr,
    deadline: Option<Instant>,
    moves: VecDeque<Instant>,
    fired_at: Vec<Instant>,
}

impl Endpoint for Mover {
    fn addr(&self) -> IpAddr {
        self.addr
    }
    fn handle_datagram(&mut self, _now: Instant, _d: Datagram) {
        self.deadline = self.moves.pop_front();
    }
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        None
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }
    fn handle_timeout(&mut self, now: Instant) {
        assert!(now >= self.deadline.expect("woken without a deadline"), "woken early");
        self.fired_at.push(now);
        self.deadline = None;
    }
}

/// Every test endpoint, so that one `Sim` can hold different kinds.
#[derive(Debug)]
enum Node {
    Ping(Ping),
    Sink(Sink),
    Sender(StopAndWait),
    Receiver(Receiver),
    Spinner(Spinner),
    Mover(Mover),
}

macro_rules! each_node {
    ($node:expr, $n:ident => $body:expr) => {
        match $node {
            Node::Ping($n) => $body,
            Node::Sink($n) => $body,
            Node::Sender($n) => $body,
            Node::Receiver($n) => $body,
            Node::Spinner($n) => $body,
            Node::Mover($n) => $body,
        }
    };
}

impl Endpoint for Node {
    fn addr(&self) -> IpAddr {
        each_node!(self, n => n.addr())
    }
    fn handle_datagram(&mut self, now: Instant, d: Datagram) {
        each_node!(self, n => n.handle_datagram(now, d))
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        each_node!(self, n => n.poll_transmit(now))
    }
    fn poll_timeout(&self) -> Option<Instant> {
        each_node!(self, n => n.poll_timeout())
    }
    fn handle_timeout(&mut self, now: Instant) {
        each_node!(self, n => n.handle_timeout(now))
    }
}

impl Node {
    fn sink(&self) -> &Sink {
        match self {
            Node::Sink(s) => s,
            other => panic!("not a sink: {other:?}"),
        }
    }
    fn sender(&self) -> &StopAndWait {
        match self {
            Node::Sender(s) => s,
            other => panic!("not a sender: {other:?}"),
        }
    }
    fn receiver(&self) -> &Receiver {
        match self {
            Node::Receiver(r) => r,
            other => panic!("not a receiver: {other:?}"),
        }
    }
    fn spinner(&self) -> &Spinner {
        match self {
            Node::Spinner(s) => s,
            other => panic!("not a spinner: {other:?}"),
        }
    }
    fn mover(&self) -> &Mover {
        match self {
            Node::Mover(m) => m,
            other => panic!("not a mover: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Harness.

const GIGABIT: u64 = 1_000_000_000;

fn link(latency_us: u64, bandwidth_bits_per_sec: u64) -> LinkConfig {
    LinkConfig { latency: Duration::from_micros(latency_us), jitter: Duration::ZERO, bandwidth_bits_per_sec }
}

fn run_to_idle(sim: &mut Sim<Node>) -> RunStats {
    let run = sim.run(Limits::default()).expect("the simulation goes idle");
    assert!(sim.is_idle());
    assert!(!sim.step(), "an idle simulation has nothing to step");
    run
}

/// A ping (node 0) sending `count` datagrams of `len` bytes to a sink (node 1).
fn ping_sink(count: u32, len: usize, link: LinkConfig, faults: Faults, seed: u64) -> Sim<Node> {
    let nodes = vec![Node::Ping(Ping::new(1, sock(2), count, len)), Node::Sink(Sink::new(2))];
    Sim::new(nodes, link, faults, seed)
}

/// A stop-and-wait sender (node 0, 10.0.0.1) and its receiver (node 1, 10.0.0.2).
fn stop_and_wait(
    total: u32,
    len: usize,
    rto_us: u64,
    max_retries: u32,
    link: LinkConfig,
    faults: Faults,
    seed: u64,
) -> Sim<Node> {
    let sender = StopAndWait::new(1, sock(2), total, len, Duration::from_micros(rto_us), max_retries);
    Sim::new(vec![Node::Sender(sender), Node::Receiver(Receiver::new(2))], link, faults, seed)
}

// ---------------------------------------------------------------------------------------------
// A faultless wire: timing and counters.

#[test]
fn no_faults_delivers_in_order_after_serialization_plus_latency() {
    // 1000 bytes at 1 Gbit/s take 8 us on the link; then 10 us of latency.
    let mut sim = ping_sink(5, 1000, link(10, GIGABIT), Faults::none(), 1);
    let run = run_to_idle(&mut sim);

    let sink = sim.endpoint(1).sink();
    assert_eq!(sink.seqs(), vec![0, 1, 2, 3, 4]);
    assert_eq!(sink.times(), vec![us(18), us(26), us(34), us(42), us(50)]);
    for (seq, (_, payload)) in sink.received.iter().enumerate() {
        assert_eq!(payload, &message(seq as u32, 1000));
    }
    assert_eq!(run, RunStats { steps: 5, arrivals: 5, timeouts: 0, started_at: Instant::ZERO, ended_at: us(50) });
    assert_eq!(sim.now(), us(50));
    let expected = WireStats { sent: 5, bytes_sent: 5000, delivered: 5, bytes_delivered: 5000, ..WireStats::default() };
    assert_eq!(*sim.stats(), expected);
}

#[test]
fn bandwidth_serializes_ten_1250_byte_datagrams_at_10_mbit_in_10_ms() {
    let mut sim = ping_sink(10, 1250, link(5, 10_000_000), Faults::none(), 1);
    let run = run_to_idle(&mut sim);

    let expected: Vec<Instant> = (1..=10).map(|k| ms(k) + Duration::from_micros(5)).collect();
    assert_eq!(sim.endpoint(1).sink().times(), expected);
    assert_eq!(run.ended_at, ms(10) + Duration::from_micros(5));
    assert_eq!(sim.stats().bytes_delivered, 12_500);
}

#[test]
fn same_instant_events_run_in_scheduling_order() {
    // Zero latency, infinite bandwidth: everything arrives at t = 0, in the order it was sent
    // (endpoint 0 is drained before endpoint 1).
    let second = Ping {
        addr: ip(2),
        outbox: (10..12).map(|seq| Datagram { src: sock(2), dst: sock(3), payload: message(seq, 8) }).collect(),
    };
    let nodes = vec![Node::Ping(Ping::new(1, sock(3), 2, 8)), Node::Ping(second), Node::Sink(Sink::new(3))];
    let mut sim = Sim::new(nodes, LinkConfig::default(), Faults::none(), 1);
    run_to_idle(&mut sim);

    let sink = sim.endpoint(2).sink();
    assert_eq!(sink.times(), vec![Instant::ZERO; 4]);
    assert_eq!(sink.seqs(), vec![0, 1, 10, 11]);
    assert_eq!(sim.stats().delivered, 4);
}

#[test]
fn unroutable_datagrams_are_counted_and_dropped() {
    let nodes = vec![Node::Ping(Ping::new(1, sock(99), 3, 100)), Node::Sink(Sink::new(2))];
    let mut sim = Sim::new(nodes, link(10, 0), Faults::none(), 1);
    let run = run_to_idle(&mut sim);

    assert_eq!(run.steps, 0);
    assert!(sim.endpoint(1).sink().received.is_empty());
    let expected = WireStats { sent: 3, bytes_sent: 300, unroutable: 3, ..WireStats::default() };
    assert_eq!(*sim.stats(), expected);
}

#[test]
fn work_posted_between_runs_leaves_at_the_current_time() {
    let mut sim = ping_sink(1, 1000, link(10, GIGABIT), Faults::none(), 1);
    run_to_idle(&mut sim);
    assert_eq!(sim.now(), us(18));

    // The caller pokes an endpoint; the next run flushes it onto the wire at 18 us.
    let Node::Ping(ping) = sim.endpoint_mut(0) else { unreachable!() };
    ping.outbox.push_back(Datagram { src: sock(1), dst: sock(2), payload: message(7, 1000) });
    let run = run_to_idle(&mut sim);

    assert_eq!(run.started_at, us(18));
    assert_eq!(run.ended_at, us(36));
    assert_eq!(sim.endpoint(1).sink().seqs(), vec![0, 7]);
}

#[test]
fn step_puts_work_posted_since_the_last_event_on_the_wire() {
    let mut sim = ping_sink(0, 8, link(10, 0), Faults::none(), 1);
    assert!(!sim.step());

    let Node::Ping(ping) = sim.endpoint_mut(0) else { unreachable!() };
    ping.outbox.push_back(Datagram { src: sock(1), dst: sock(2), payload: message(3, 8) });
    assert!(sim.step(), "the posted datagram is in flight");
    assert_eq!(sim.now(), us(10));
    assert_eq!(sim.endpoint(1).sink().seqs(), vec![3]);
    assert!(!sim.step());
}

#[test]
fn idle_simulation_steps_nothing() {
    let mut sim = Sim::new(vec![Node::Sink(Sink::new(1))], LinkConfig::default(), Faults::none(), 1);
    assert!(sim.is_idle());
    assert!(!sim.step());
    let run = sim.run(Limits::default()).unwrap();
    assert_eq!(run, RunStats::default());
    assert_eq!(*sim.stats(), WireStats::default());
}

#[test]
#[should_panic(expected = "share the address")]
fn two_endpoints_with_one_address_are_refused() {
    Sim::new(vec![Node::Sink(Sink::new(1)), Node::Sink(Sink::new(1))], LinkConfig::default(), Faults::none(), 1);
}

// ---------------------------------------------------------------------------------------------
// Loss and partitions.

#[test]
fn partition_between_two_nodes_drops_everything_and_sender_gives_up() {
    let cut = Partition::between(ip(1), ip(2), Instant::ZERO, Partition::FOREVER);
    let mut sim = stop_and_wait(1, 64, 100, 3, link(5, 0), Faults::none(), 1);
    sim.partitions_mut().push(cut);
    let run = run_to_idle(&mut sim);

    // Sent at 0, 100, 200, 300 us; the fourth timeout (400 us) exhausts the 3 retries.
    let sender = sim.endpoint(0).sender();
    assert_eq!(sender.transmissions, 4);
    assert_eq!(sender.gave_up_at, Some(us(400)));
    assert!(sender.acked_at.is_empty());
    assert!(sim.endpoint(1).receiver().arrivals.is_empty());
    assert_eq!(run, RunStats { steps: 4, arrivals: 0, timeouts: 4, started_at: Instant::ZERO, ended_at: us(400) });
    let expected = WireStats { sent: 4, bytes_sent: 256, partitioned: 4, ..WireStats::default() };
    assert_eq!(*sim.stats(), expected);
}

#[test]
fn loss_probability_one_drops_everything_and_sender_gives_up() {
    let faults = Faults { loss: 1.0, ..Faults::none() };
    let mut sim = stop_and_wait(1, 64, 100, 3, link(5, 0), faults, 1);
    run_to_idle(&mut sim);

    assert_eq!(sim.endpoint(0).sender().gave_up_at, Some(us(400)));
    assert!(sim.endpoint(1).receiver().arrivals.is_empty());
    let expected = WireStats { sent: 4, bytes_sent: 256, lost: 4, ..WireStats::default() };
    assert_eq!(*sim.stats(), expected);
}

#[test]
fn partition_window_heals_and_a_retransmission_gets_through() {
    // Cut until 250 us: the sends at 0, 100 and 200 us are dropped, the one at 300 us arrives at
    // 305 us and its ACK at 310 us.
    let cut = Partition::between(ip(1), ip(2), Instant::ZERO, us(250));
    let mut sim = stop_and_wait(1, 64, 100, 3, link(5, 0), Faults::none(), 1);
    sim.partitions_mut().push(cut);
    run_to_idle(&mut sim);

    assert_eq!(sim.endpoint(1).receiver().delivered, vec![(0, us(305))]);
    let sender = sim.endpoint(0).sender();
    assert_eq!(sender.acked_at, vec![(0, us(310))]);
    assert_eq!(sender.gave_up_at, None);
    let stats = sim.stats();
    assert_eq!((stats.sent, stats.partitioned, stats.delivered), (5, 3, 2));
}

#[test]
fn one_way_partition_drops_only_the_acks() {
    let cut = Partition::one_way(ip(2), ip(1), Instant::ZERO, Partition::FOREVER);
    let mut sim = stop_and_wait(1, 64, 100, 3, link(5, 0), Faults::none(), 1);
    sim.partitions_mut().push(cut);
    run_to_idle(&mut sim);

    let receiver = sim.endpoint(1).receiver();
    assert_eq!(receiver.arrivals.len(), 4);
    assert_eq!(receiver.delivered, vec![(0, us(5))]);
    assert_eq!(sim.endpoint(0).sender().gave_up_at, Some(us(400)));
    let stats = sim.stats();
    assert_eq!((stats.sent, stats.delivered, stats.partitioned), (8, 4, 4));
}

// ---------------------------------------------------------------------------------------------
// Corruption, duplication, reordering, jitter.

#[test]
fn corrupt_probability_one_flips_exactly_one_bit_of_every_delivered_payload() {
    let faults = Faults { corrupt: 1.0, ..Faults::none() };
    let mut sim = ping_sink(20, 64, link(10, GIGABIT), faults, 3);
    run_to_idle(&mut sim);

    let sink = sim.endpoint(1).sink();
    assert_eq!(sink.received.len(), 20);
    let mut flipped_bits = BTreeSet::new();
    for (seq, (_, got)) in sink.received.iter().enumerate() {
        let sent = message(seq as u32, 64);
        assert_eq!(got.len(), sent.len());
        let diff: Vec<u8> = got.iter().zip(&sent).map(|(a, b)| a ^ b).collect();
        assert_eq!(diff.iter().map(|d| d.count_ones()).sum::<u32>(), 1, "datagram {seq}");
        let byte = diff.iter().position(|&d| d != 0).unwrap();
        flipped_bits.insert(byte * 8 + diff[byte].trailing_zeros() as usize);
        assert_eq!(parse(got), None, "the checksum catches the flip");
    }
    assert!(flipped_bits.len() > 10, "the flipped bit is drawn at random: {flipped_bits:?}");
    assert_eq!(sim.stats().corrupted, 20);
    assert_eq!(sim.stats().delivered, 20);
}

#[test]
fn the_faults_delay_adds_to_every_datagram_and_reorder_delay_on_top() {
    // 1000 bytes at 1 Gbit/s: 8 us on the link, 10 us of latency, 7 us of added delay.
    let faults = Faults { delay: Duration::from_micros(7), ..Faults::none() };
    let mut sim = ping_sink(3, 1000, link(10, GIGABIT), faults, 1);
    run_to_idle(&mut sim);
    assert_eq!(sim.endpoint(1).sink().times(), vec![us(25), us(33), us(41)]);

    let faults = Faults {
        delay: Duration::from_micros(7),
        reorder: 1.0,
        reorder_delay: Duration::from_micros(20),
        ..Faults::none()
    };
    let mut sim = ping_sink(3, 1000, link(10, GIGABIT), faults, 1);
    run_to_idle(&mut sim);
    assert_eq!(sim.endpoint(1).sink().times(), vec![us(45), us(53), us(61)]);
    assert_eq!(sim.stats().reordered, 3);
}

#[test]
fn duplicate_probability_one_delivers_each_datagram_twice() {
    let faults = Faults { duplicate: 1.0, ..Faults::none() };
    let mut sim = ping_sink(10, 100, link(10, 0), faults, 1);
    run_to_idle(&mut sim);

    // All sent at 0: first copies at 10 us, second copies DUPLICATE_GAP later, each in order.
    assert_eq!(DUPLICATE_GAP, Duration::from_micros(1));
    let sink = sim.endpoint(1).sink();
    let expected_seqs: Vec<u32> = (0..10).chain(0..10).collect();
    assert_eq!(sink.seqs(), expected_seqs);
    let expected_times: Vec<Instant> = [us(10); 10].into_iter().chain([us(11); 10]).collect();
    assert_eq!(sink.times(), expected_times);
    let expected = WireStats {
        sent: 10,
        bytes_sent: 1000,
        delivered: 20,
        bytes_delivered: 2000,
        duplicated: 10,
        ..WireStats::default()
    };
    assert_eq!(*sim.stats(), expected);
}

#[test]
fn reorder_lets_later_datagrams_overtake_held_ones_and_all_arrive() {
    // 8 us apart on the link, 10 us latency; a held datagram arrives 20 us late.
    let faults = Faults { reorder: 0.5, reorder_delay: Duration::from_micros(20), ..Faults::none() };
    let mut sim = ping_sink(10, 1000, link(10, GIGABIT), faults, 11);
    run_to_idle(&mut sim);

    let sink = sim.endpoint(1).sink();
    let seqs = sink.seqs();
    let mut sorted = seqs.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).collect::<Vec<u32>>(), "every datagram arrives once");
    assert_ne!(seqs, sorted, "seed 11 reorders");

    let mut held = 0;
    for (&seq, time) in seqs.iter().zip(sink.times()) {
        let nominal = us(8 * (u64::from(seq) + 1) + 10);
        if time == nominal + Duration::from_micros(20) {
            held += 1;
        } else {
            assert_eq!(time, nominal, "datagram {seq}");
        }
    }
    assert_eq!(sim.stats().reordered, held);
    assert!((1..10).contains(&held), "held {held} of 10");
}

#[test]
fn reorder_probability_one_delays_every_datagram_and_keeps_their_order() {
    let faults = Faults { reorder: 1.0, reorder_delay: Duration::from_micros(20), ..Faults::none() };
    let mut sim = ping_sink(5, 1000, link(10, GIGABIT), faults, 1);
    run_to_idle(&mut sim);

    let sink = sim.endpoint(1).sink();
    assert_eq!(sink.seqs(), vec![0, 1, 2, 3, 4]);
    assert_eq!(sink.times(), vec![us(38), us(46), us(54), us(62), us(70)]);
    assert_eq!(sim.stats().reordered, 5);
}

#[test]
fn jitter_delays_each_datagram_by_at_most_the_jitter() {
    let link = LinkConfig { jitter: Duration::from_micros(5), ..link(10, GIGABIT) };
    let mut sim = ping_sink(100, 1000, link, Faults::none(), 5);
    run_to_idle(&mut sim);

    let sink = sim.endpoint(1).sink();
    assert_eq!(sink.received.len(), 100);
    let mut extra = BTreeSet::new();
    for (&seq, time) in sink.seqs().iter().zip(sink.times()) {
        let nominal = us(8 * (u64::from(seq) + 1) + 10);
        assert!(time >= nominal && time <= nominal + Duration::from_micros(5), "datagram {seq} at {time}");
        extra.insert(time - nominal);
    }
    assert!(extra.len() > 50, "jitter is drawn per datagram: {} distinct values", extra.len());
}

// ---------------------------------------------------------------------------------------------
// Determinism.

/// Everything observable about one lossy stop-and-wait run.
#[derive(Debug, PartialEq)]
struct Outcome {
    stats: WireStats,
    run: RunStats,
    /// Every datagram the receiver saw, corrupted or not, with its arrival time.
    receiver_arrivals: Vec<(Instant, Vec<u8>)>,
    delivered: Vec<(u32, Instant)>,
    acked_at: Vec<(u32, Instant)>,
    corrupt_dropped: u32,
}

fn lossy_run(seed: u64) -> Outcome {
    let link = LinkConfig {
        latency: Duration::from_micros(10),
        jitter: Duration::from_micros(3),
        bandwidth_bits_per_sec: GIGABIT,
    };
    let faults = Faults {
        loss: 0.2,
        duplicate: 0.1,
        reorder: 0.1,
        reorder_delay: Duration::from_micros(20),
        corrupt: 0.1,
        ..Faults::none()
    };
    let mut sim = stop_and_wait(40, 256, 100, 50, link, faults, seed);
    let run = run_to_idle(&mut sim);
    let (sender, receiver) = (sim.endpoint(0).sender(), sim.endpoint(1).receiver());
    Outcome {
        stats: *sim.stats(),
        run,
        receiver_arrivals: receiver.arrivals.clone(),
        delivered: receiver.delivered.clone(),
        acked_at: sender.acked_at.clone(),
        corrupt_dropped: sender.corrupt_dropped + receiver.corrupt_dropped,
    }
}

#[test]
fn same_seed_gives_identical_stats_and_trace() {
    let first = lossy_run(7);
    let second = lossy_run(7);
    assert_eq!(first, second);

    // The run is worth comparing: every fault fired, and the protocol still delivered all.
    let stats = first.stats;
    assert!(stats.lost > 0 && stats.duplicated > 0 && stats.reordered > 0 && stats.corrupted > 0, "{stats:?}");
    assert_eq!(first.delivered.iter().map(|&(seq, _)| seq).collect::<Vec<_>>(), (0..40).collect::<Vec<_>>());
    assert_eq!(first.acked_at.len(), 40);
    assert_eq!(stats.delivered, stats.sent - stats.partitioned - stats.unroutable - stats.lost + stats.duplicated);
    // Loss is decided before corruption, so every corrupted datagram arrives, once or twice.
    assert!(first.corrupt_dropped as u64 >= stats.corrupted && first.corrupt_dropped as u64 <= 2 * stats.corrupted);
}

#[test]
fn different_seeds_give_different_traces() {
    let (one, two) = (lossy_run(1), lossy_run(2));
    assert_ne!(one.receiver_arrivals, two.receiver_arrivals);
    assert_ne!(one.stats, two.stats);
    // Both still deliver everything exactly once, in order.
    for outcome in [&one, &two] {
        assert_eq!(outcome.delivered.iter().map(|&(seq, _)| seq).collect::<Vec<_>>(), (0..40).collect::<Vec<_>>());
    }
}

// ---------------------------------------------------------------------------------------------
// Timers and livelock.

#[test]
fn step_limit_fires_for_a_timer_rearmed_forever() {
    let mut sim = Sim::new(
        vec![Node::Spinner(Spinner::new(1, Duration::from_micros(1)))],
        LinkConfig::default(),
        Faults::none(),
        1,
    );
    let err = sim.run(Limits { max_steps: 1000, max_time: Duration::from_millis(1000) }).unwrap_err();

    let expected = RunStats { steps: 1000, arrivals: 0, timeouts: 1000, started_at: Instant::ZERO, ended_at: us(1000) };
    assert_eq!(err, SimError::StepLimit(expected));
    assert_eq!(sim.endpoint(0).spinner().fired, 1000);
    assert_eq!(sim.now(), us(1000));
    assert!(!sim.is_idle());
}

#[test]
fn step_limit_fires_for_a_timer_rearmed_at_the_same_instant() {
    let mut sim =
        Sim::new(vec![Node::Spinner(Spinner::new(1, Duration::ZERO))], LinkConfig::default(), Faults::none(), 1);
    let err = sim.run(Limits { max_steps: 500, ..Limits::default() }).unwrap_err();

    assert!(matches!(err, SimError::StepLimit(_)));
    assert_eq!(err.stats().timeouts, 500);
    assert_eq!(sim.now(), Instant::ZERO, "virtual time never moved");
}

#[test]
fn time_limit_fires_when_the_next_event_is_past_max_time() {
    let mut sim = Sim::new(
        vec![Node::Spinner(Spinner::new(1, Duration::from_micros(1)))],
        LinkConfig::default(),
        Faults::none(),
        1,
    );
    let err = sim.run(Limits { max_steps: u64::MAX, max_time: Duration::from_micros(100) }).unwrap_err();

    // Wake-ups at 1..=100 us run; the one at 101 us is past the limit.
    let expected = RunStats { steps: 100, arrivals: 0, timeouts: 100, started_at: Instant::ZERO, ended_at: us(100) };
    assert_eq!(err, SimError::TimeLimit(expected));
    assert_eq!(
        err.to_string(),
        "simulation still busy at virtual time 0.000100000s (time limit reached after 100 steps)"
    );
}

#[test]
fn run_until_processes_events_up_to_the_deadline_then_advances_time() {
    let mut sim = Sim::new(
        vec![Node::Spinner(Spinner::new(1, Duration::from_micros(10)))],
        LinkConfig::default(),
        Faults::none(),
        1,
    );
    let run = sim.run_until(us(35), 100).unwrap();

    assert_eq!(run, RunStats { steps: 3, arrivals: 0, timeouts: 3, started_at: Instant::ZERO, ended_at: us(35) });
    assert_eq!(sim.now(), us(35));
    assert_eq!(sim.run_until(us(39), 100).unwrap().steps, 0);
    assert_eq!(sim.run_until(us(40), 100).unwrap().steps, 1);
}

/// A ping (node 0) whose one datagram reaches a mover (node 1) at 10 us.
fn mover_sim(initial: Instant, moved_to: Instant) -> Sim<Node> {
    let mover = Mover { addr: ip(2), deadline: Some(initial), moves: VecDeque::from([moved_to]), fired_at: Vec::new() };
    Sim::new(vec![Node::Ping(Ping::new(1, sock(2), 1, 8)), Node::Mover(mover)], link(10, 0), Faults::none(), 1)
}

#[test]
fn a_deadline_moved_later_is_not_woken_at_the_stale_time() {
    let mut sim = mover_sim(us(100), us(500));
    let run = run_to_idle(&mut sim);

    assert_eq!(sim.endpoint(1).mover().fired_at, vec![us(500)]);
    // The arrival and one wake-up; the stale 100 us wake-up is not an event.
    assert_eq!(run, RunStats { steps: 2, arrivals: 1, timeouts: 1, started_at: Instant::ZERO, ended_at: us(500) });
}

#[test]
fn a_deadline_moved_earlier_fires_once_at_the_new_time() {
    let mut sim = mover_sim(us(100), us(50));
    let run = run_to_idle(&mut sim);

    assert_eq!(sim.endpoint(1).mover().fired_at, vec![us(50)]);
    assert_eq!(run.ended_at, us(50));
    assert_eq!(run.timeouts, 1);
}

#[test]
fn a_deadline_already_past_fires_at_once() {
    // Moved at 10 us to 3 us: due immediately, so it fires at 10 us, never before.
    let mut sim = mover_sim(us(100), us(3));
    run_to_idle(&mut sim);

    assert_eq!(sim.endpoint(1).mover().fired_at, vec![us(10)]);
}
