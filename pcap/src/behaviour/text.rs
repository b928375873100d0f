//! The text report of `softrdma pcap behaviour`.

use super::accumulate::short_opcode;

use super::*;

/// Transports in the order the text shows them.
const TRANSPORT_ORDER: [&str; 7] = ["RC", "UC", "UD", "XRC", "RD", "CNP", "MANUFACTURER"];

/// Nanoseconds as a short human duration.
pub(super) fn duration(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}us", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.2}s", ns as f64 / 1e9),
    }
}

/// `median M (min A, max B, n N)`, or `none`.
fn samples_text(s: &Samples, unit: fn(u64) -> String) -> String {
    match s.summary() {
        None => "none".to_string(),
        Some(x) => format!("median {} (min {}, max {}, n={})", unit(x.median), unit(x.min), unit(x.max), x.n),
    }
}

/// `k:v k:v` of a map (the first ten entries), or `none`.
fn map_text<K: fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    const MAX: usize = 10;
    if m.is_empty() {
        return "none".to_string();
    }
    let mut parts = m.iter().take(MAX).map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>();
    if m.len() > MAX {
        parts.push(format!("... {} more", m.len() - MAX));
    }
    parts.join(" ")
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "-".to_string()
    } else {
        format!("{:.2}", a as f64 / b as f64)
    }
}

/// At most this many message shapes are listed in the text (all are in the JSON).
const MAX_SHAPES: usize = 8;

/// The lines of one set of measurements, as `(key, value)`.
fn stats_lines(s: &Stats) -> Vec<(&'static str, String)> {
    let mut l = Vec::new();
    let opcodes = s.opcodes.0.iter().map(|(op, n)| format!("{}:{n}", short_opcode(Opcode(*op)))).collect::<Vec<_>>();
    l.push(("opcodes", opcodes.join(" ")));
    let mut shapes: Vec<_> = s.shapes.iter().collect();
    shapes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut shown = shapes.iter().take(MAX_SHAPES).map(|(k, n)| format!("{n}x {k}")).collect::<Vec<_>>();
    if shapes.len() > MAX_SHAPES {
        shown.push(format!("... {} more", shapes.len() - MAX_SHAPES));
    }
    l.push(("shapes", if shown.is_empty() { "none".into() } else { shown.join(", ") }));
    let b = &s.bth;
    l.push((
        "bth",
        format!(
            "P_Key {}; MigReq {}, SE {}, FECN {}, BECN {} of {}",
            map_text(&b.pkeys),
            b.mig_req,
            b.solicited,
            b.fecn,
            b.becn,
            s.packets
        ),
    ));
    let a = &s.ackreq;
    l.push((
        "ackreq",
        format!(
            "ONLY/LAST {}/{}, FIRST/MIDDLE {}/{}; spacing {}",
            a.only_last_marked,
            a.only_last,
            a.first_middle_marked,
            a.first_middle,
            samples_text(&a.spacing, |n| n.to_string())
        ),
    ));
    let k = &s.acks;
    l.push((
        "acks",
        format!(
            "{} ACK packets ({} positive) for {} requests ({} requests/ACK); without AckReq {}",
            k.ack_packets,
            k.positive,
            s.requests,
            ratio(s.requests, k.ack_packets),
            k.without_ackreq
        ),
    ));
    l.push((
        "ack cover",
        format!(
            "messages/ACK {}; PSN advance {}",
            map_text(&k.messages_per_ack),
            samples_text(&k.psn_advance, |n| n.to_string())
        ),
    ));
    let e = &s.aeth;
    l.push((
        "aeth",
        format!(
            "ACK {} (credits {}), RNR NAK {} (timers {}), NAK {} ({}){}",
            e.ack,
            map_text(&e.credits),
            e.rnr_nak,
            map_text(&e.rnr_timers),
            e.nak,
            map_text(&e.nak_codes),
            if e.reserved > 0 { format!(", reserved {}", e.reserved) } else { String::new() }
        ),
    ));
    let mut steps = [0u64; 4];
    for (&d, &n) in &e.msn_steps {
        steps[match d {
            ..0 => 3,
            0 => 0,
            1 => 1,
            _ => 2,
        }] += n;
    }
    let steps = ["+0", "+1", ">+1", "<0"]
        .iter()
        .zip(steps)
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k}:{n}"))
        .collect::<Vec<_>>();
    l.push((
        "msn",
        format!(
            "first {}; steps {}",
            map_text(&e.first_msn),
            if steps.is_empty() { "none".to_string() } else { steps.join(" ") }
        ),
    ));
    let u = &s.udp;
    let one_port = u.sports.values().filter(|p| p.len() == 1).count();
    let distinct: BTreeSet<u16> = u.sports.values().flatten().copied().collect();
    let range = match (u.sport_in_c000_ffff, u.sport_below_c000) {
        (0, 0) => "no UDP".to_string(),
        (_, 0) => "all in 0xC000-0xFFFF".to_string(),
        (0, _) => "none in 0xC000-0xFFFF".to_string(),
        (i, o) => format!("{i} in 0xC000-0xFFFF, {o} below"),
    };
    l.push((
        "udp sport",
        format!(
            "{} sending QPs, {} on one port, {} distinct ports, {range}; dport {}",
            u.sports.len(),
            one_port,
            distinct.len(),
            map_text(&u.dports)
        ),
    ));
    let ip = &s.ip;
    let steps = |x: &Steps| format!("+1 {}/{} (same {}, other {})", x.plus_one, x.total(), x.same, x.other);
    l.push((
        "ipv4 id",
        if ip.ipv4 == 0 {
            "no IPv4".to_string()
        } else {
            format!(
                "per host pair {}; per QP {}; zero {}/{}",
                steps(&ip.ipv4_id_step_host_pair),
                steps(&ip.ipv4_id_step_qp),
                ip.ipv4_id_zero,
                ip.ipv4
            )
        },
    ));
    l.push((
        "ip",
        format!(
            "IPv4 {}, IPv6/GRH {}; TTL {}; DF {}/{}; DSCP {}; ECN {}; UDP csum zero {}, non-zero {}",
            ip.ipv4,
            ip.ipv6,
            map_text(&ip.ttl),
            ip.dont_frag,
            ip.ipv4,
            map_text(&ip.dscp),
            map_text(&ip.ecn),
            ip.udp_checksum_zero,
            ip.udp_checksum_nonzero
        ),
    ));
    let t = &s.timers;
    l.push((
        "ack time",
        format!(
            "{}; {} requests captured after their answer",
            samples_text(&t.ack_time_ns, duration),
            t.responses_before_request
        ),
    ));
    l.push(("read time", samples_text(&t.read_time_ns, duration)));
    l.push((
        "retransmit",
        format!(
            "{} packets in {} bursts ({} after NAK, {} after RNR NAK); gap {}",
            t.retransmitted,
            t.resend_bursts,
            t.bursts_after_nak,
            t.bursts_after_rnr,
            samples_text(&t.resend_gap_ns, duration)
        ),
    ));
    l.push((
        "icrc",
        format!(
            "valid {}, invalid {}, unchecked {}{}",
            s.icrc.valid,
            s.icrc.invalid,
            s.icrc.unchecked,
            if s.truncated > 0 { format!(" ({} truncated frames)", s.truncated) } else { String::new() }
        ),
    ));
    l
}

/// At most this many conversations are listed per transport in the text.
const MAX_CONVERSATION_LINES: usize = 12;

fn conversation_line(c: &Conversation) -> String {
    let qp = |q: Option<u32>| q.map_or_else(|| "?".to_string(), |q| format!("{q:#x}"));
    let resp_qps = if c.response_qps.is_empty() {
        "-".to_string()
    } else {
        c.response_qps.iter().map(|q| format!("{q:#x}")).collect::<Vec<_>>().join(",")
    };
    let mut shapes: Vec<_> = c.stats.shapes.iter().collect();
    shapes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let top = shapes.iter().take(2).map(|(k, n)| format!("{n}x {k}")).collect::<Vec<_>>().join(", ");
    format!(
        "{} > {} qp {} (back to qp {}): {} req, {} resp; {}",
        c.requester,
        c.responder,
        qp(c.request_qp),
        resp_qps,
        c.stats.requests,
        c.stats.responses,
        if top.is_empty() { "no messages".to_string() } else { top }
    )
}

/// The text section of one file.
pub fn text(r: &FileReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} frames, {} RoCE packets ({} not RoCE, {} truncated, {} malformed and {} without BTH skipped, {} unknown opcodes); ICRC valid {}, invalid {}, unchecked {}",
        r.file,
        r.frames,
        r.roce_packets,
        r.not_roce,
        r.truncated,
        r.skipped_malformed,
        r.skipped_no_bth,
        r.unknown_opcodes,
        r.icrc.valid,
        r.icrc.invalid,
        r.icrc.unchecked
    );
    if let Some(e) = &r.read_error {
        let _ = writeln!(out, "  file damaged after frame {}: {e}", r.frames);
    }
    let mut names: Vec<&str> = r.transports.keys().copied().collect();
    names.sort_by_key(|n| TRANSPORT_ORDER.iter().position(|t| t == n).unwrap_or(TRANSPORT_ORDER.len()));
    for name in names {
        let t = &r.transports[name];
        let s = &t.stats;
        let _ = writeln!(
            out,
            "{name}: {} packets ({} requests, {} responses, {} other), {} conversations",
            s.packets, s.requests, s.responses, s.other, t.conversations
        );
        for (k, v) in stats_lines(s) {
            let _ = writeln!(out, "  {:<12}{v}", format!("{k}:"));
        }
        let convs: Vec<_> = r.conversations.iter().filter(|c| c.transport == name).collect();
        for c in convs.iter().take(MAX_CONVERSATION_LINES) {
            let _ = writeln!(out, "  {:<12}{}", "conv:", conversation_line(c));
        }
        if convs.len() > MAX_CONVERSATION_LINES {
            let _ = writeln!(out, "  {:<12}... {} more (see --json)", "conv:", convs.len() - MAX_CONVERSATION_LINES);
        }
    }
    out
}
