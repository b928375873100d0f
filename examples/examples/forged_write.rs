//! A forged RDMA WRITE with a guessed R_Key, sent from another user's own UDP socket to a device:
//! the isolation check of `scripts/test-isolation.sh` (root runs the device; the sender runs as a
//! spare uid through setpriv, so it owns nothing of root's but can reach the device's UDP port, as
//! any host on a RoCE network can).
//!
//! This program (root, as the device's owner) registers a region with remote write access and two
//! RC QPs in RTS that expect requests from `--from`; it builds RDMA WRITE ONLY packets with
//! softrdma's encoder (valid BTH, RETH and ICRC for the sender's address and port) and hands their
//! bytes to a python3 sender running as `--uid`, which sends them from its own socket and returns
//! what came back. Checked:
//! - the WRITE whose R_Key has the right index and guessed key bits (the low byte; an R_Key's key
//!   bits are random, IBTA 10.6.3.2) changes nothing, is answered with a NAK remote access error
//!   (IBTA 9.7.5.2.4, C9-82), and counts in `naks_sent.remote_access`;
//! - the same WRITE with the right R_Key, to the other QP, lands (so the check above could fail).
//!
//! Run it as root beside a device of root's:
//!
//!     softrdma up iso0 --addr 127.0.0.21 --port 47981
//!     cargo run --release -p softrdma-examples --example forged_write -- \
//!         --device iso0 --from 127.0.0.61 --port 47981 --uid 61234
//!
//! Exit status 0 when every check holds.

use std::net::IpAddr;
use std::process::{Command, ExitCode};

use softrdma_device::verbs::*;
use softrdma_engine::device::ip_udp_header;
use softrdma_engine::wire::{icrc, BthRepr, IbPacket, IbRepr, Opcode, Psn, Qpn, RethRepr};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// RDMA WRITE ONLY to `qpn` at `psn`, `payload` at `va` under `rkey`, with its ICRC for the
/// IPv4/UDP header the sender's socket will put on it (ID 0 and DF, as Linux sends).
fn write_only(
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
    (qpn, psn): (u32, u32),
    (va, rkey): (u64, u32),
    payload: &[u8],
) -> Vec<u8> {
    let mut ib = IbRepr::new(BthRepr {
        pad_count: IbRepr::pad_for(payload.len()),
        ack_req: true,
        ..BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, Qpn::new(qpn), Psn::new(psn))
    });
    ib.reth = Some(RethRepr { va, rkey, dma_len: payload.len() as u32 });
    ib.payload_len = payload.len();
    let mut buf = vec![0u8; ib.buffer_len()];
    ib.emit(&mut buf).expect("a buffer of buffer_len");
    IbPacket::new_unchecked(&mut buf[..]).payload_mut().copy_from_slice(payload);
    let (hdr, n) = ip_udp_header(src, dst, sport, buf.len(), 0);
    let body = buf.len() - icrc::LEN;
    let crc = icrc::roce_v2_parts(&hdr[..n], &buf[..body]).expect("IPv4 and UDP headers");
    IbPacket::new_unchecked(&mut buf[..]).set_icrc(crc);
    buf
}

/// Sends `pkt` as `uid` from `from:port` to `to:port`; returns the first datagram that came back
/// within a second, if any.
fn send_as(uid: &str, from: IpAddr, to: IpAddr, port: u16, pkt: &[u8]) -> std::result::Result<Option<Vec<u8>>, String> {
    let hex: String = pkt.iter().map(|b| format!("{b:02x}")).collect();
    let py = "import socket,sys\n\
              s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
              s.bind((sys.argv[1],int(sys.argv[3])))\n\
              s.sendto(bytes.fromhex(sys.argv[4]),(sys.argv[2],int(sys.argv[3])))\n\
              s.settimeout(1.0)\n\
              try:\n  print(s.recv(65536).hex())\n\
              except socket.timeout:\n  print('none')\n";
    let out = Command::new("setpriv")
        .args(["--reuid", uid, "--regid", uid, "--clear-groups", "python3", "-c", py])
        .args([from.to_string(), to.to_string(), port.to_string(), hex])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .map_err(|e| format!("running setpriv: {e}"))?;
    if !out.status.success() {
        return Err(format!("the sender failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if line == "none" {
        return Ok(None);
    }
    (0..line.len() / 2)
        .map(|i| u8::from_str_radix(&line[2 * i..2 * i + 2], 16))
        .collect::<std::result::Result<Vec<u8>, _>>()
        .map(Some)
        .map_err(|e| format!("the sender said {line:?}: {e}"))
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("forged_write: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> std::result::Result<bool, String> {
    let device = arg("--device").unwrap_or_else(|| "iso0".into());
    let from: IpAddr = arg("--from").ok_or("--from ADDR is required")?.parse().map_err(|e| format!("--from: {e}"))?;
    let port: u16 = arg("--port").unwrap_or_else(|| "4791".into()).parse().map_err(|e| format!("--port: {e}"))?;
    let uid = arg("--uid").ok_or("--uid UID is required")?;
    let e = |e: Error| e.to_string();
    let ctx = Context::open(&device).map_err(e)?;
    let to = ctx.gid_addr();
    let pd = ctx.alloc_pd().map_err(e)?;
    let cq = ctx.create_cq(16, None).map_err(e)?;
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).map_err(e)?;
    let (rkey, va) = (mr.rkey(), mr.addr());
    // Two QPs that expect requests from the sender's address (PSN 1000 first).
    let mut qps = Vec::new();
    for remote_qpn in [0x123, 0x124] {
        let qp = pd.qp_builder(QpType::Rc, &cq).build().map_err(e)?;
        let peer = Endpoint { addr: from, qpn: remote_qpn, psn: 1000 };
        qp.connect(77, &peer, &ConnectOptions::default()).map_err(e)?;
        qps.push(qp);
    }
    let naks = |ctx: &Context| ctx.counters().map(|(c, _)| c.naks_sent.remote_access).map_err(e);
    let before = naks(&ctx)?;
    let mut ok = true;

    // The guessed key: the right index, other key bits.
    let guessed = (rkey & !0xff) | ((rkey as u8).wrapping_add(0x5b) as u32);
    let pkt = write_only(from, port, to, (qps[0].qpn(), 1000), (va, guessed), &[0xab; 64]);
    let reply = send_as(&uid, from, to, port, &pkt)?;
    let untouched = mr.as_slice()[..64].iter().all(|&b| b == 0);
    let after = naks(&ctx)?;
    // The answer: an RC ACKNOWLEDGE (opcode 0x11) whose AETH syndrome says NAK remote access
    // error (0x60 | 2).
    let nak = reply.as_deref().is_some_and(|r| r.len() >= 16 && r[0] == 0x11 && r[12] == 0x62);
    println!(
        "{} WRITE from uid {uid}'s socket with a guessed R_Key ({guessed:#010x} for {rkey:#010x}): memory {}, answer {}, naks_sent.remote_access {before} -> {after}",
        if untouched && nak && after == before + 1 { "ok   " } else { "FAIL " },
        if untouched { "unchanged" } else { "CHANGED" },
        match &reply {
            Some(r) if r.len() >= 16 => format!("opcode {:#04x} syndrome {:#04x}", r[0], r[12]),
            Some(r) => format!("{} bytes", r.len()),
            None => "none".into(),
        }
    );
    ok &= untouched && nak && after == before + 1;

    // The control: the right key lands.
    let pkt = write_only(from, port, to, (qps[1].qpn(), 1000), (va, rkey), &[0xab; 64]);
    let reply = send_as(&uid, from, to, port, &pkt)?;
    let landed = mr.as_slice()[..64].iter().all(|&b| b == 0xab);
    let acked = reply.as_deref().is_some_and(|r| r.len() >= 16 && r[0] == 0x11 && r[12] >> 5 == 0);
    println!(
        "{} control: the same WRITE with the right R_Key to the other QP {} and was ACKed: {acked}",
        if landed && acked { "ok   " } else { "FAIL " },
        if landed { "landed" } else { "did NOT land" }
    );
    ok &= landed && acked;
    drop(qps);
    Ok(ok)
}
