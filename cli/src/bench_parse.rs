//! Reading what the programs `softrdma bench` runs print: perftest's result rows, udpbench's
//! RESULT line, ucx_perftest's and fi_pingpong's rows, cmtime's step table and lnet_bulk's final
//! line. Each returns None for output that holds no result (a program that failed).

use std::collections::BTreeMap;

/// One perftest result row.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Perf {
    /// Bandwidth tests: average MiB/s and million messages/s.
    pub(crate) mib_s: f64,
    pub(crate) mpps: f64,
    /// Latency tests (perftest's one-way figures): typical (median) and 99th percentile, us.
    pub(crate) lat_p50: f64,
    pub(crate) lat_p99: f64,
}

/// Parses the row under perftest's "#bytes" header.
pub(crate) fn parse_perftest(out: &str, lat: bool) -> Option<Perf> {
    let mut rows = out.lines().skip_while(|l| !l.contains("#bytes")).skip(1);
    let row = rows.find(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))?;
    let f: Vec<f64> = row.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    if lat {
        // bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
        (f.len() >= 8).then(|| Perf { lat_p50: f[4], lat_p99: f[7], ..Perf::default() })
    } else {
        // bytes iters peak avg msgrate
        (f.len() >= 5).then(|| Perf { mib_s: f[3], mpps: f[4], ..Perf::default() })
    }
}

/// `KEY=VALUE` fields of udpbench's RESULT line.
pub(crate) fn parse_udpbench(out: &str) -> Option<BTreeMap<String, f64>> {
    let line = out.lines().find(|l| l.starts_with("RESULT "))?;
    Some(
        line.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_owned(), v)))
            .collect(),
    )
}

/// ucx_perftest's final row (-f): iterations, p50, avg, overall (us), MiB/s avg, overall, msg/s
/// avg, overall.
pub(crate) fn parse_ucx(out: &str) -> Option<Vec<f64>> {
    out.lines()
        .rev()
        .map(|l| l.split_whitespace().filter_map(|x| x.parse::<f64>().ok()).collect::<Vec<_>>())
        .find(|f| f.len() == 8 && !out.is_empty())
}

/// fi_pingpong's result row: bytes, #sent, #ack, total, time, MB/s (10^6), us/xfer (one way),
/// Mxfers/s.
pub(crate) fn parse_fi(out: &str) -> Option<(f64, f64)> {
    let row = out.lines().skip_while(|l| !l.starts_with("bytes")).nth(1)?;
    let f: Vec<&str> = row.split_whitespace().collect();
    Some((f.get(5)?.parse().ok()?, f.get(6)?.parse().ok()?))
}

/// lnet_bulk's final line: `lnet_bulk: OK client ... MB/s X transfers/s Y ...` -> (X, Y).
pub(crate) fn parse_lnet_bulk(out: &str) -> Option<(f64, f64)> {
    let line = out.lines().find(|l| l.starts_with("lnet_bulk: OK client"))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let after = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1)).and_then(|v| v.parse().ok());
    Some((after("MB/s")?, after("transfers/s")?))
}

/// cmtime's table: `step : total ms  max ms  min us  us / conn` per step; the per-connection
/// figure under the step's name, and the connect step's total as `connect_total_ms`.
pub(crate) fn parse_cmtime(out: &str) -> Option<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let Some((name, rest)) = line.split_once(':') else { continue };
        let v: Vec<f64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if v.len() == 4 {
            let name = name.trim().to_owned();
            if name == "connect" {
                m.insert("connect_total_ms".into(), v[0]);
            }
            m.insert(name, v[3]);
        }
    }
    m.contains_key("connect").then_some(m)
}

/// rdma-core's ibv_*_pingpong final lines: "N iters in S seconds = U usec/iter". Each iteration
/// is one round trip (a send and the peer's answer), so U is the round trip in us.
pub(crate) fn parse_pingpong(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.contains(" iters in ") && l.ends_with("usec/iter"))?;
    let (_, rest) = line.rsplit_once(" = ")?;
    rest.trim_end_matches("usec/iter").trim().parse().ok()
}

/// qperf's latency figure ("    latency  =  84.2 us"), in us (it also prints ms and sec).
pub(crate) fn parse_qperf_latency(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.trim_start().starts_with("latency"))?;
    let mut f = line.split('=').nth(1)?.split_whitespace();
    let v: f64 = f.next()?.parse().ok()?;
    match f.next()? {
        "ns" => Some(v / 1000.0),
        "us" => Some(v),
        "ms" => Some(v * 1000.0),
        "sec" => Some(v * 1e6),
        _ => None,
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn perftest_rows_parse() {
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      1000             364.47             333.75 \t\t   0.005340\n";
        let p = parse_perftest(bw, false).unwrap();
        assert_eq!((p.mib_s, p.mpps), (333.75, 0.005340));
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       1000          57.54          652.79       90.63    \t       87.82       \t21.76  \t\t137.46  \t\t652.79 \n";
        let p = parse_perftest(lat, true).unwrap();
        assert_eq!((p.lat_p50, p.lat_p99), (90.63, 137.46));
        assert!(parse_perftest("Couldn't connect to 127.0.0.1:18515\n", false).is_none());
    }

    #[test]
    fn lnet_bulk_line_parses() {
        let out = "lnet_bulk: peer 0: 4 puts 4 gets 8388608 bytes depth 8\n\
                   lnet_bulk: OK client peers 8 transfers 64 bytes 67108864 MB/s 157.0 transfers/s 149.7 depth 63 verified\n";
        assert_eq!(parse_lnet_bulk(out), Some((157.0, 149.7)));
        assert_eq!(parse_lnet_bulk("lnet_bulk: FAILED client: 3 of 64 transfers\n"), None);
    }

    #[test]
    fn cmtime_rows_parse() {
        let out = "step              total ms     max ms     min us  us / conn\n\
                   create id    :        1.09       0.09       0.00       1.09\n\
                   resolve addr :       57.48       0.20      32.00      57.48\n\
                   connect      :      503.88     400.56    4080.00     503.88\n";
        let m = parse_cmtime(out).unwrap();
        assert_eq!(
            (m["create id"], m["resolve addr"], m["connect"], m["connect_total_ms"]),
            (1.09, 57.48, 503.88, 503.88)
        );
        assert!(parse_cmtime("step : total\nrdma_create_id: No such device\n").is_none());
    }

    #[test]
    fn peer_rows_parse() {
        let u = "|     Test     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |\n+----+\n                      100000      4.222     4.620     4.620       13.21      13.21      216472      216472\n";
        assert_eq!(parse_ucx(u).unwrap()[6], 216472.0);
        let f = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n2       10k     =10k     39k         0.13s      0.31       6.52       0.15\n";
        assert_eq!(parse_fi(f), Some((0.31, 6.52)));
        let r = parse_udpbench("x\nRESULT lat mode=busy rtt_p50_ns=5629 oneway_p50_ns=2814\n").unwrap();
        assert_eq!(r["oneway_p50_ns"], 2814.0);
    }

    #[test]
    fn pingpong_and_qperf_latency_parse() {
        let out = "  local address:  LID 0x0000, QPN 0x000011, PSN 0x5c2a1b, GID ::ffff:127.0.0.2\n\
                   128000 bytes in 0.03 seconds = 34.10 Mbit/sec\n\
                   1000 iters in 0.03 seconds = 30.03 usec/iter\n";
        assert_eq!(parse_pingpong(out), Some(30.03));
        assert_eq!(parse_pingpong("Couldn't connect to 127.0.0.1:18515\n"), None);
        assert_eq!(parse_qperf_latency("rc_lat:\n    latency  =  84.2 us\n"), Some(84.2));
        assert_eq!(parse_qperf_latency("rc_lat:\n    latency  =  1.5 ms\n"), Some(1500.0));
        assert_eq!(parse_qperf_latency("rc_lat:\nfailed to receive results: timed out\n"), None);
    }
}
