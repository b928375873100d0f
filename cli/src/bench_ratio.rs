//! The ratio rows of `softrdma bench`: each target of the issues, as our figure over the
//! reference measured in the same run, on each data path. A reference outside what this kind of
//! machine gives (a limit that collapsed under load, a latency a stalled run inflated) makes the
//! ratio meaningless: the verdict is "reference invalid", never "met".

use crate::bench::Table;

/// Issue 21's targets that compare a softrdma figure with a reference of the same run: what,
/// our figure's key (before the data path's suffix), its unit, the reference's key, the target
/// as printed, and its test.
type Target = (&'static str, &'static str, &'static str, &'static str, &'static str, fn(f64) -> bool);

const TARGETS: [Target; 13] = [
    (
        "ib_send_lat 2 B across / busy-poll UDP one-way",
        "ib_send_lat_2_across",
        "us",
        "udp_busy_oneway_us",
        "<= 1.3",
        |v| v <= 1.3,
    ),
    // Not a target: the same latency over the floor of what an RC SEND ping-pong puts on the
    // wire per one-way (the SEND and the ACK of the peer's SEND, crate::bench_floor).
    (
        "ib_send_lat 2 B across / busy-poll UDP one-way of a message and its ACK",
        "ib_send_lat_2_across",
        "us",
        "udp_pair_oneway_us",
        "-",
        |_| true,
    ),
    (
        "ib_write_lat 2 B across / busy-poll UDP one-way",
        "ib_write_lat_2_across",
        "us",
        "udp_busy_oneway_us",
        "<= 2",
        |v| v <= 2.0,
    ),
    ("ib_write_bw 64 KiB across / UDP GSO+GRO", "ib_write_bw_65536_across", "gbps", "udp_gsogro_gbps", ">= 0.5", |v| {
        v >= 0.5
    }),
    // Not a target: the same bandwidth over the floor of a software RoCE sender, a 64 KiB WRITE's
    // packets with their ICRCs through the socket and nothing else (crate::bench_floor::bulk).
    (
        "ib_write_bw 64 KiB across / UDP floor of a WRITE's packets with their ICRCs",
        "ib_write_bw_65536_across",
        "gbps",
        "roce_write_floor_gbps",
        "-",
        |_| true,
    ),
    (
        "ib_write_bw 64 KiB across / UCX tcp put bw",
        "ib_write_bw_65536_across",
        "gbps",
        "ucx_put_bw_gbps",
        ">= 2",
        |v| v >= 2.0,
    ),
    (
        "ib_send_bw 64 B across msg rate / UCX tcp tag_bw",
        "ib_send_bw_64_across",
        "mpps",
        "ucx_tag_bw_64_mps",
        ">= 4",
        |v| v >= 4.0,
    ),
    (
        "ib_write_bw 64 KiB within / cold memcpy",
        "ib_write_bw_65536_within",
        "gbps",
        "memcpy_cold_gbps",
        ">= 0.6",
        |v| v >= 0.6,
    ),
    // Not a target: the same over the floor of those packets through the socket without ICRCs
    // (a device's processes exchange them without one unless it captures or injects faults).
    (
        "ib_write_bw 64 KiB within / UDP floor of a WRITE's packets",
        "ib_write_bw_65536_within",
        "gbps",
        "roce_write_floor_no_icrc_gbps",
        "-",
        |_| true,
    ),
    // Issue 54, target 3: a program that sleeps on its completion channel, against the same
    // sleep on a UDP socket (one wake-up a one-way, as a NIC's completion event costs).
    (
        "ibv_rc_pingpong -e 64 B across round trip / blocking UDP RTT",
        "rc_pingpong_e_64_across",
        "us",
        "udp_block_rtt_us",
        "<= 1.3",
        |v| v <= 1.3,
    ),
    (
        "qperf -cm1 rc_lat 64 B within / blocking UDP one-way",
        "qperf_rc_lat_64_within",
        "us",
        "udp_block_oneway_us",
        "<= 1.3",
        |v| v <= 1.3,
    ),
    ("ib_send_lat 2 B across / UCX tcp tag_lat", "ib_send_lat_2_across", "us", "ucx_tag_lat_us", "< 1", |v| v < 1.0),
    ("ib_send_lat 2 B across / libfabric tcp fi_pingpong", "ib_send_lat_2_across", "us", "fi_lat_us", "-", |v| v < 1.0),
];

/// Adds the ratio rows: issue 21's targets on each of `paths` (name, key suffix), then the
/// rdma_cm ones.
pub(crate) fn rows(t: &mut Table, paths: &[(&str, &str)]) {
    t.v.insert("memcpy_cold_gbps".into(), t.get("memcpy_cold_gbs").unwrap_or(f64::NAN) * 8.0);
    for &(path, suffix) in paths {
        for (what, ours, unit, reference, target, ok) in TARGETS {
            let v = ratio_verdict(
                t.get(&format!("{ours}{suffix}_{unit}")),
                t.get(reference),
                plausible(reference),
                target,
                ok,
            );
            t.row("ratio", format!("{what}, {path} path"), v);
        }
        // The tails: send latency's p99 within 3x its median, write latency's p99 under 50 us.
        let lat = |t: &Table, prog: &str, unit: &str| t.get(&format!("{prog}_2_across{suffix}_{unit}"));
        let (p50, p99) = (lat(t, "ib_send_lat", "us"), lat(t, "ib_send_lat", "p99_us"));
        let v = ratio_verdict(p99, p50, f64::MIN_POSITIVE..=f64::INFINITY, "<= 3", |v| v <= 3.0);
        t.row("ratio", format!("ib_send_lat 2 B across p99 / p50, {path} path"), v);
        let v = match lat(t, "ib_write_lat", "p99_us") {
            Some(v) => format!("{v:.2} us (target < 50 us: {})", if v < 50.0 { "met" } else { "missed" }),
            None => "NaN (not measured)".to_owned(),
        };
        t.row("ratio", format!("ib_write_lat 2 B across p99, {path} path"), v);
    }
    let v = ratio_verdict(
        t.get("cmtime_connect_us"),
        t.get("udp_block_rtt_us"),
        plausible("udp_block_rtt_us"),
        "<= 10",
        |v| v <= 10.0,
    );
    t.row("ratio", "cmtime connect step (us per connection) / blocking UDP RTT", v);
    let cps = t.get("cmtime_conn_per_s").unwrap_or(f64::NAN);
    t.row(
        "ratio",
        "cmtime connections per second / 20,000",
        format!("{:.3} (target >= 1: {})", cps / 20_000.0, if cps >= 20_000.0 { "met" } else { "missed" }),
    );
}

/// What a reference measurement may be on this kind of machine (loopback, 2 cores) for a ratio
/// against it to mean anything: bandwidths and message rates have a floor (about a twentieth of
/// what they measure here), latencies a ceiling (about twenty times). A run outside it happened
/// on a machine too loaded to measure.
fn plausible(reference: &str) -> std::ops::RangeInclusive<f64> {
    match reference {
        "udp_gsogro_gbps" | "roce_write_floor_gbps" | "roce_write_floor_no_icrc_gbps" => 2.0..=f64::INFINITY,
        "ucx_put_bw_gbps" => 0.25..=f64::INFINITY,
        "memcpy_cold_gbps" => 2.0..=f64::INFINITY,
        "ucx_tag_bw_64_mps" => 0.01..=f64::INFINITY,
        "udp_busy_oneway_us" | "udp_pair_oneway_us" => 0.1..=40.0,
        "ucx_tag_lat_us" => 0.1..=150.0,
        "fi_lat_us" => 0.1..=200.0,
        "udp_block_rtt_us" => 0.1..=400.0,
        "udp_block_oneway_us" => 0.05..=200.0,
        _ => f64::MIN_POSITIVE..=f64::INFINITY,
    }
}

/// The ratio ours / reference with its verdict against the target.
fn ratio_verdict(
    ours: Option<f64>,
    reference: Option<f64>,
    plausible: std::ops::RangeInclusive<f64>,
    target: &str,
    ok: fn(f64) -> bool,
) -> String {
    let (Some(o), Some(x)) = (ours, reference) else {
        return "NaN (not measured)".to_owned();
    };
    if !plausible.contains(&x) {
        return format!(
            "{:.3} (reference invalid: {x:.3} measured, outside {}..{} on this machine; re-run on a quieter one)",
            o / x,
            plausible.start(),
            plausible.end()
        );
    }
    let v = o / x;
    let verdict = if target == "-" {
        "no target".to_owned()
    } else {
        format!("target {target}: {}", if ok(v) { "met" } else { "missed" })
    };
    format!("{v:.3} ({verdict})")
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_collapsed_reference_is_invalid_never_met() {
        // The --quick run under load: "UDP plain 0.01 Gbit/s" made 13.7 look met.
        let v = ratio_verdict(Some(0.137), Some(0.01), plausible("udp_gsogro_gbps"), ">= 0.5", |v| v >= 0.5);
        assert!(v.contains("reference invalid") && !v.contains("met"), "{v}");
        // A stalled latency reference makes any latency look good.
        let v = ratio_verdict(Some(20.0), Some(900.0), plausible("udp_busy_oneway_us"), "<= 1.5", |v| v <= 1.5);
        assert!(v.contains("reference invalid"), "{v}");
    }

    #[test]
    fn a_plausible_reference_gives_the_verdict() {
        let v = ratio_verdict(Some(9.0), Some(56.7), plausible("udp_gsogro_gbps"), ">= 0.5", |v| v >= 0.5);
        assert_eq!(v, "0.159 (target >= 0.5: missed)");
        let v = ratio_verdict(Some(3.0), Some(2.2), plausible("udp_busy_oneway_us"), "<= 1.5", |v| v <= 1.5);
        assert_eq!(v, "1.364 (target <= 1.5: met)");
        assert_eq!(ratio_verdict(None, Some(1.0), plausible("x"), "-", |_| true), "NaN (not measured)");
    }
}
