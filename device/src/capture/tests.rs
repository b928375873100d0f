use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use proptest::prelude::*;
use softrdma_engine::device::ip_udp_header;
use softrdma_engine::wire::{ethernet, icrc, Ipv4Packet};

use super::ring::{Record, Ring, MIN_CAPACITY};
use super::*;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 51));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 52));

/// A RoCEv2 UDP payload (BTH, `len` payload bytes, ICRC) whose ICRC is right for IPv4 ID `id`
/// from `src` to `dst`; `seq` goes into the PSN and the payload.
fn packet(src: IpAddr, dst: IpAddr, sport: u16, id: u16, seq: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; 12 + len + icrc::LEN];
    p[0] = 0x04; // RC SEND only
    p[1] = 0x40;
    p[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
    p[5..8].copy_from_slice(&0x11u32.to_be_bytes()[1..]);
    p[9..12].copy_from_slice(&seq.to_be_bytes()[1..]);
    for (i, b) in p[12..12 + len].iter_mut().enumerate() {
        *b = (seq as usize + i) as u8;
    }
    let (hdr, n) = ip_udp_header(src, dst, sport, p.len(), id);
    let body = p.len() - icrc::LEN;
    let crc = icrc::roce_v2_parts(&hdr[..n], &p[..body]).unwrap();
    p[body..].copy_from_slice(&crc.to_le_bytes());
    p
}

fn read(path: &std::path::Path) -> Vec<softrdma_pcap::Record> {
    softrdma_pcap::Reader::open(path).unwrap().map(|r| r.unwrap()).collect()
}

/// The IPv4 ID and PSN of a captured frame, checking its ICRC and IPv4 checksum.
fn id_psn_checked(frame: &[u8]) -> (u16, u32) {
    let l3 = &frame[ethernet::HEADER_LEN..];
    assert!(icrc::verify_roce_v2(l3).unwrap(), "ICRC of a captured frame");
    let ip = Ipv4Packet::new_unchecked(l3);
    assert!(ip.verify_checksum(), "IPv4 header checksum");
    let bth = &l3[28..];
    (ip.ident(), u32::from_be_bytes([0, bth[9], bth[10], bth[11]]))
}

#[test]
fn sent_and_received_frames_reach_the_file_in_order_with_valid_icrcs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.pcap");
    let mut cap = Capture::to_file(&path, monotonic_ns()).unwrap();
    for seq in 0..2000u32 {
        let len = (seq as usize * 37) % 4096;
        if seq % 2 == 0 {
            // Sent, with the ID it left with.
            cap.write(A, B, 49152, &packet(A, B, 49152, seq as u16, seq, len), Some(seq as u16));
        } else {
            // Received: the writer recovers the sender's ID from the ICRC.
            let id = (seq as u16).wrapping_mul(7919);
            cap.write(B, A, 49153, &packet(B, A, 49153, id, seq, len), None);
        }
    }
    cap.finish();
    let recs = read(&path);
    assert_eq!(recs.len(), 2000);
    assert_eq!(cap.stats(), Some((2000, 0)));
    let mut last = 0;
    for (seq, r) in recs.iter().enumerate() {
        let (id, psn) = id_psn_checked(&r.data);
        assert_eq!(psn, seq as u32);
        let want = if seq % 2 == 0 { seq as u16 } else { (seq as u16).wrapping_mul(7919) };
        assert_eq!(id, want, "frame {seq}");
        assert!(r.timestamp_ns >= last);
        last = r.timestamp_ns;
    }
}

#[test]
fn an_ipv6_frame_gets_its_udp_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c6.pcap");
    let (a, b) = (IpAddr::V6(Ipv6Addr::LOCALHOST), IpAddr::V6("fd00::2".parse().unwrap()));
    let mut cap = Capture::to_file(&path, monotonic_ns()).unwrap();
    cap.write(a, b, 49152, &packet(a, b, 49152, 0, 1, 100), None);
    cap.finish();
    let recs = read(&path);
    assert_eq!(recs.len(), 1);
    let l3 = &recs[0].data[ethernet::HEADER_LEN..];
    let ip = softrdma_engine::wire::Ipv6Packet::new_unchecked(l3);
    let udp = softrdma_engine::wire::UdpPacket::new_unchecked(&l3[40..]);
    assert_ne!(udp.checksum(), 0);
    assert!(udp.verify_checksum_v6(ip.src_addr(), ip.dst_addr()));
    assert!(icrc::verify_roce_v2(l3).unwrap());
}

#[test]
fn rings_of_several_producers_merge_in_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.pcap");
    let mut own = Capture::to_file(&path, monotonic_ns()).unwrap();
    let writer = own.writer.take().unwrap();
    let mut others: Vec<Capture> = (1..=3u32)
        .map(|o| {
            let r = Arc::new(Ring::create(MIN_CAPACITY).unwrap());
            writer.add(r.clone(), Some(o));
            Capture::to_ring(r)
        })
        .collect();
    // Four producers on four threads; each frame names its producer and sequence.
    std::thread::scope(|s| {
        for (k, c) in std::iter::once(&mut own).chain(others.iter_mut()).enumerate() {
            s.spawn(move || {
                for seq in 0..3000u32 {
                    let p = packet(A, B, 49152 + k as u16, 0, seq, 64 + k * 100);
                    c.write(A, B, 49152 + k as u16, &p, Some(0));
                    if seq % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            });
        }
    });
    for o in 1..=3 {
        writer.close_owner(o);
    }
    writer.finish();
    let (frames, dropped) = writer.stats();
    let recs = read(&path);
    assert_eq!(recs.len() as u64, frames);
    assert_eq!(frames + dropped, 4 * 3000, "every frame written or counted");
    // Time order across rings, and each producer's own order kept.
    let mut next = [0u32; 4];
    let mut last = 0;
    for r in &recs {
        assert!(r.timestamp_ns >= last, "time order");
        last = r.timestamp_ns;
        let l4 = ethernet::HEADER_LEN + 20;
        let k = (u16::from_be_bytes([r.data[l4], r.data[l4 + 1]]) - 49152) as usize;
        let (_, psn) = id_psn_checked(&r.data);
        assert!(psn >= next[k], "producer {k}: {psn} after {}", next[k]);
        next[k] = psn + 1;
    }
}

#[test]
fn a_full_ring_drops_from_the_capture_and_counts() {
    let ring = Ring::create(MIN_CAPACITY).unwrap();
    let mut head = 0;
    let frame = [7u8; 1000];
    let mut written = 0;
    while ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame)) {
        written += 1;
    }
    assert!(written > 0 && written < MIN_CAPACITY / 1000);
    for _ in 0..9 {
        assert!(!ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame)));
    }
    assert_eq!(ring.dropped(), 10);
    // The consumer sees every frame that went in, then frees the space.
    let mut pos = ring.tail();
    let mut n = 0;
    while pos != ring.head() {
        let r: Record = ring.record_at(pos, ring.head()).unwrap();
        if !r.is_pad() {
            assert_eq!(ring.pcap_record(&r)[16..], frame[..]);
            n += 1;
        }
        pos = r.end();
    }
    assert_eq!(n, written);
    ring.release(pos);
    assert!(ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame)));
}

#[test]
fn a_ring_past_its_mark_waits_for_the_writer() {
    use std::time::{Duration, Instant};
    // Each attempt fills a ring to its mark (a quarter), then a "writer" frees it 3 ms later
    // while the producer waits (up to 100 ms) for it. A writer the machine runs late (a loaded CI
    // machine delays a thread's wake-up by tens of milliseconds) may free it after the producer
    // gave up: then the frame goes past the mark, and the attempt is repeated. An attempt whose
    // writer freed the room in time must have waited for it; none drops a frame.
    let mut on_time = 0;
    for _ in 0..50 {
        let ring = Arc::new(Ring::create(MIN_CAPACITY).unwrap());
        let mut head = 0;
        let frame = [3u8; 1000];
        // 15 records of 1,040 bytes: 15,600 of the 16,384 bytes below the 64 KiB ring's mark.
        for _ in 0..15 {
            assert!(ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame)));
        }
        assert_eq!(ring.waited_ns(), 0, "no wait below the mark");
        let t = Instant::now();
        let consumer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(3));
                ring.release(ring.head());
                t.elapsed()
            })
        };
        assert!(ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame)));
        let waited = t.elapsed();
        let freed_at = consumer.join().unwrap();
        assert_eq!(ring.dropped(), 0);
        if freed_at < Duration::from_millis(20) {
            assert!(waited >= Duration::from_millis(2), "it did not wait for the writer ({waited:?})");
            on_time += 1;
            if on_time == 3 {
                return;
            }
        }
    }
    panic!("the writer thread was late in 50 attempts ({on_time} on time): the machine is too loaded to tell");
}

#[test]
fn a_stalled_writers_ring_takes_frames_past_its_mark_without_waiting_until_it_is_full() {
    let ring = Ring::create(MIN_CAPACITY).unwrap();
    let mut head = 0;
    let frame = [9u8; 1000];
    let produce = |head: &mut u64| ring.produce(head, frame.len(), 0, |f| f.copy_from_slice(&frame));
    for _ in 0..15 {
        assert!(produce(&mut head));
    }
    // The 16th frame waits for a writer that frees nothing, then goes in past the mark.
    assert!(produce(&mut head));
    let waited = ring.waited_ns();
    assert!(waited >= 20_000_000, "one long wait for the writer ({waited} ns)");
    // The writer is stalled: the rest of the ring fills without another wait, then frames drop.
    let mut more = 0;
    while produce(&mut head) {
        more += 1;
    }
    assert_eq!(more, 63 - 16, "every record the ring holds (63 of 1,040 bytes in 64 KiB)");
    assert_eq!(ring.waited_ns(), waited, "no wait while the writer is stalled");
    assert_eq!(ring.dropped(), 1);
    // The writer frees one record: it is writing again, and the producer goes on at its pace
    // from where the ring stands (not waiting for it to come back down to the mark).
    let r: Record = ring.record_at(ring.tail(), ring.head()).unwrap();
    ring.release(r.end());
    assert!(produce(&mut head), "room for one");
    assert_eq!(ring.waited_ns(), waited, "the freed record is taken without a wait");
    // The next frame finds the ring full again: it waits for the writer, which frees nothing.
    assert!(!produce(&mut head));
    assert!(ring.waited_ns() > waited, "a writer that freed room is waited for again");
    assert_eq!(ring.dropped(), 2);
}

#[test]
fn a_writer_slower_than_the_producer_paces_it_without_losing_a_frame() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    // A writer that frees what the ring holds (at most 1 MiB) every 20 ms: ~50 MB/s, slower than
    // the producer and in bursts of a fifth of its FULL_WAIT, as a throttled disk takes a
    // capture. 60 MB through a 4 MiB ring take it over a second, most of it waiting: more than
    // half of a second's waits, long ones, so a budget that counted every long wait (not only
    // those in which the writer did not keep PACE_FLOOR) would be spent, and frames lost.
    let ring = Arc::new(Ring::create(4 << 20).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (ring, done) = (ring.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let (mut pos, head) = (ring.tail(), ring.head());
                while pos != head && pos - ring.tail() < 1 << 20 {
                    pos = ring.record_at(pos, head).unwrap().end();
                }
                ring.release(pos);
            }
        })
    };
    let frame = [4u8; 4000];
    let mut head = 0;
    let t = Instant::now();
    let mut written = 0;
    for _ in 0..15_000 {
        written += ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame)) as u32;
    }
    let took = t.elapsed();
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(ring.dropped(), 0, "{written} of 15,000 frames in {took:?}");
    assert!(took > Duration::from_millis(600), "it was paced ({took:?})");
}

#[test]
fn a_producers_long_waits_for_room_take_at_most_half_of_each_second() {
    use super::ring::WaitBudget;
    use std::time::Duration;
    let ms = |n: u64| n * 1_000_000;
    let b = WaitBudget::default();
    let t0 = ms(5_000);
    // A writer that freed nothing (the tail stays at 0).
    assert_eq!(b.allowed(t0, 0), Duration::from_millis(100), "a wait is at most FULL_WAIT");
    b.spend(Duration::from_millis(490), t0 + ms(490), 0);
    assert_eq!(b.allowed(t0 + ms(600), 0), Duration::from_millis(10), "what is left of the window's 500 ms");
    for i in 0..100 {
        b.spend(Duration::from_millis(1), t0 + ms(600 + i), 0);
    }
    assert_eq!(b.allowed(t0 + ms(700), 0), Duration::from_millis(10), "short waits (pacing) are free");
    b.spend(Duration::from_millis(10), t0 + ms(710), 0);
    assert!(b.allowed(t0 + ms(999), 0).is_zero(), "the budget is spent until the window ends");
    assert_eq!(b.allowed(t0 + ms(1_000), 0), Duration::from_millis(100), "a new window, a new budget");
    // A writer that frees 100 MB/s over the window, in bursts: its long waits are pacing, free.
    let t1 = t0 + ms(1_000);
    for i in 1..=9u64 {
        b.spend(Duration::from_millis(80), t1 + ms(100 * i), i * 10_000_000);
    }
    assert_eq!(b.allowed(t1 + ms(950), 90_000_000), Duration::from_millis(100), "720 ms of waits, none counted");
    // One that freed 1 MB in the window (1 MB/s): they count.
    let t2 = t1 + ms(1_000);
    assert_eq!(b.allowed(t2, 90_000_000), Duration::from_millis(100));
    b.spend(Duration::from_millis(450), t2 + ms(500), 91_000_000);
    assert_eq!(b.allowed(t2 + ms(500), 91_000_000), Duration::from_millis(50), "a slow writer's waits count");
}

/// A full ring whose writer frees its oldest record every `every`; `n` frames produced into it.
/// Returns the frames dropped and the time the producer spent.
fn produce_behind_a_writer(every: std::time::Duration, n: usize) -> (u64, std::time::Duration) {
    let ring = Arc::new(Ring::create(MIN_CAPACITY).unwrap());
    let mut head = 0;
    let frame = [5u8; 1000];
    for _ in 0..63 {
        assert!(ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame)));
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let (ring, done) = (ring.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(every);
                let tail = ring.tail();
                if tail != ring.head() {
                    let r: Record = ring.record_at(tail, ring.head()).unwrap();
                    ring.release(r.end());
                }
            }
        })
    };
    let t = std::time::Instant::now();
    for _ in 0..n {
        ring.produce(&mut head, frame.len(), 0, |f| f.copy_from_slice(&frame));
    }
    let took = t.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    consumer.join().unwrap();
    (ring.dropped(), took)
}

#[test]
fn a_writer_that_stays_behind_loses_frames_rather_than_pacing_the_producer() {
    // A writer that frees one record every 20 ms: each wait alone is shorter than FULL_WAIT, so
    // without the budget every frame would wait for it and none would drop.
    let (dropped, waited) = produce_behind_a_writer(std::time::Duration::from_millis(20), 60);
    assert!(dropped > 0, "frames dropped once the budget was spent");
    assert!(waited < std::time::Duration::from_millis(1_000), "60 waits of ~20 ms would take 1.2 s; took {waited:?}");
}

#[test]
fn a_ring_that_lies_about_itself_is_refused() {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(&vec![0u8; 4096 + MIN_CAPACITY]).unwrap();
    assert!(Ring::open(f.into()).is_err(), "no magic");
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(&vec![0u8; 4096 + 1000]).unwrap();
    assert!(Ring::open(f.into()).is_err(), "not a power of two");
    let r = Ring::create(MIN_CAPACITY).unwrap();
    let fd = r.fd().try_clone().unwrap();
    assert_eq!(Ring::open(fd).unwrap().capacity(), MIN_CAPACITY);
}

#[test]
fn a_broken_ring_is_dropped_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.pcap");
    let mut own = Capture::to_file(&path, monotonic_ns()).unwrap();
    let writer = own.writer.take().unwrap();
    let bad = Arc::new(Ring::create(MIN_CAPACITY).unwrap());
    writer.add(bad.clone(), Some(9));
    // A producer that writes a record claiming more than the ring holds.
    let mut head = 0;
    assert!(bad.produce(&mut head, 100, 0, |f| f.fill(1)));
    let rec = bad.record_at(0, head).unwrap();
    let whole = bad.pcap_record(&rec);
    let p = whole.as_mut_ptr();
    // SAFETY (test): the record header is the 16 bytes before its pcap record.
    unsafe { (p.sub(16) as *mut u32).write_unaligned(u32::MAX - 15) };
    for seq in 0..100 {
        own.write(A, B, 49152, &packet(A, B, 49152, 0, seq, 10), Some(0));
    }
    writer.finish();
    let (frames, lost) = writer.stats();
    assert_eq!(frames, 100);
    assert!(lost >= 1);
    assert_eq!(read(&path).len(), 100);
}

proptest! {
    /// Whatever a producer leaves in its ring, the consumer's checks hold: no panic, no record
    /// outside the ring.
    #[test]
    fn any_ring_contents_parse_or_break(words in proptest::collection::vec(any::<u32>(), 64), head in any::<u64>(), start in 0u64..256) {
        let ring = Ring::create(MIN_CAPACITY).unwrap();
        let mut h = 0;
        // Fill the first bytes with the words, as a record stream.
        ring.produce(&mut h, words.len() * 4 - 32, 0, |_| {});
        let r0 = ring.record_at(0, h).unwrap();
        let p = ring.pcap_record(&r0).as_mut_ptr();
        for (i, w) in words.iter().enumerate() {
            // SAFETY (test): inside the first record's bytes (its header included).
            unsafe { (p.sub(16).add(i * 4) as *mut u32).write_unaligned(*w) };
        }
        let mut pos = start * 16;
        for _ in 0..64 {
            match ring.record_at(pos, head) {
                Ok(r) => {
                    if !r.is_pad() {
                        let rec = ring.pcap_record(&r);
                        prop_assert!(16 + rec.len() <= r.len);
                    }
                    prop_assert!((r.pos % ring.capacity() as u64) as usize + r.len <= ring.capacity());
                    pos = r.end();
                }
                Err(_) => break,
            }
        }
    }
}
