//! Running one case: the DUT's objects made through the agent, its QP brought to RTS against the
//! tester's QPN, then each step in order; the first step that does not hold ends the case.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::agent::{field, parse_u64, Agent, Answer};
use super::case::{Case, DutSetup, Step};
use super::packet::{describe, forge, judge};
use super::peer::Peer;
use super::vars::Vars;

/// The tester's own QPN (any 24-bit number: the tester has no QP table).
pub(crate) const TESTER_QPN: u32 = 0x00_c0de;

/// What the DUT and the tester are, for every case.
pub(crate) struct Bench {
    pub(crate) agent: Agent,
    pub(crate) peer: Peer,
    pub(crate) tester_gid: String,
}

/// The DUT's objects of one case, as the agent numbered them.
struct Objects {
    qp: u64,
    cq: u64,
}

pub(crate) fn gid_hex(a: IpAddr) -> String {
    let v6 = match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    v6.octets().iter().map(|b| format!("{b:02x}")).collect()
}

fn setup(b: &mut Bench, c: &Case, v: &mut Vars) -> Result<Objects, String> {
    let d: &DutSetup = &c.dut;
    b.agent.ok("reset")?;
    v.set("sq", u64::from(d.sq_psn));
    v.set("rq", u64::from(d.rq_psn));
    v.set("qpn", u64::from(TESTER_QPN));
    v.set("qkey", u64::from(d.qkey));
    v.set("mtu", u64::from(d.mtu));
    for (i, (len, access)) in d.mrs.iter().enumerate() {
        let m = b.agent.ok(&format!("mr len={len} access={access} fill={}", d.fill))?;
        let id = field(&m, "id")?;
        for k in ["addr", "lkey", "rkey"] {
            v.set(&format!("mr{id}.{k}"), field(&m, k)?);
        }
        v.set(&format!("mr{id}.len"), *len);
        if i == 0 {
            for k in ["addr", "lkey", "rkey", "len"] {
                v.set(&format!("mr.{k}"), v.get64(&format!("mr0.{k}"))?);
            }
        }
    }
    let cq = field(&b.agent.ok("cq cqe=256")?, "id")?;
    let mut srq = None;
    let qp;
    if c.transport == "xrc_tgt" {
        // An XRC domain, an XRC SRQ of it (whose CQ takes the receives) and the target QP in it.
        let x = field(&b.agent.ok("xrcd")?, "id")?;
        let s = b.agent.ok(&format!("srq type=xrc xrcd={x} cq={cq} max_wr=64"))?;
        srq = Some(field(&s, "id")?);
        v.set("srqn", field(&s, "srqn")?);
        if d.other_domain_srq {
            let x2 = field(&b.agent.ok("xrcd")?, "id")?;
            let s2 = b.agent.ok(&format!("srq type=xrc xrcd={x2} cq={cq} max_wr=64"))?;
            v.set("other_srqn", field(&s2, "srqn")?);
        }
        let q = b.agent.ok(&format!("qp type=xrc_tgt xrcd={x}"))?;
        qp = field(&q, "id")?;
        v.set("dut_qpn", field(&q, "qpn")?);
    } else {
        if d.srq {
            srq = Some(field(&b.agent.ok("srq max_wr=64")?, "id")?);
        }
        let srq_arg = srq.map_or(String::new(), |s| format!(" srq={s}"));
        let q = b.agent.ok(&format!("qp type={} cq={cq}{srq_arg}", c.transport))?;
        qp = field(&q, "id")?;
        v.set("dut_qpn", field(&q, "qpn")?);
    }
    if let Some(s) = srq {
        v.set("srq", s);
    }
    let order = ["reset", "init", "rtr", "rts"];
    let upto = order.iter().position(|s| *s == d.state).ok_or(format!("dut.state {:?}", d.state))?;
    if upto >= 1 {
        b.agent.ok(&format!("modify qp={qp} state=init access={} qkey={:#x}", d.access, d.qkey))?;
    }
    if upto >= 2 {
        b.agent.ok(&format!(
            "modify qp={qp} state=rtr mtu={} dest_qpn={TESTER_QPN} rq_psn={:#x} dgid={} min_rnr_timer={} max_dest_rd_atomic={}",
            d.mtu, d.rq_psn, b.tester_gid, d.min_rnr_timer, d.max_dest_rd_atomic
        ))?;
    }
    if upto >= 3 {
        b.agent.ok(&format!(
            "modify qp={qp} state=rts sq_psn={:#x} timeout={} retry_cnt={} rnr_retry={} max_rd_atomic={}",
            d.sq_psn, d.timeout, d.retry_cnt, d.rnr_retry, d.max_rd_atomic
        ))?;
    }
    for (i, (mr, off, len)) in d.recvs.iter().enumerate() {
        let target = srq.map_or(format!("qp={qp}"), |s| format!("srq={s}"));
        b.agent.ok(&format!("post_recv {target} mr={mr} off={off} len={len} wr_id={}", 100 + i))?;
    }
    Ok(Objects { qp, cq })
}

/// The agent command of a step with the case's QP and CQ filled in where the command needs one
/// and does not name it.
fn agent_command(raw: &str, v: &Vars, o: &Objects, tester_gid: &str) -> Result<String, String> {
    // `dgid=tester`: the tester's GID (a UD destination).
    let mut cmd = v.substitute(raw)?.replace("dgid=tester", &format!("dgid={tester_gid}"));
    let verb = cmd.split_whitespace().next().unwrap_or("").to_string();
    let names = |cmd: &str, k: &str| cmd.split_whitespace().any(|t| t.starts_with(&format!("{k}=")));
    if matches!(verb.as_str(), "post_send" | "post_recv" | "modify" | "query")
        && !names(&cmd, "qp")
        && !names(&cmd, "srq")
    {
        cmd.push_str(&format!(" qp={}", o.qp));
    }
    if verb == "poll" && !names(&cmd, "cq") {
        cmd.push_str(&format!(" cq={}", o.cq));
    }
    Ok(cmd)
}

pub(crate) const WC_STATUS: [&str; 22] = [
    "success",
    "loc_len_err",
    "loc_qp_op_err",
    "loc_eec_op_err",
    "loc_prot_err",
    "wr_flush_err",
    "mw_bind_err",
    "bad_resp_err",
    "loc_access_err",
    "rem_inv_req_err",
    "rem_access_err",
    "rem_op_err",
    "retry_exc_err",
    "rnr_retry_exc_err",
    "loc_rdd_viol_err",
    "rem_inv_rd_req_err",
    "rem_abort_err",
    "inv_eecn_err",
    "inv_eec_state_err",
    "fatal_err",
    "resp_timeout_err",
    "general_err",
];

fn wc_opcode(n: u64) -> String {
    match n {
        0 => "send".into(),
        1 => "rdma_write".into(),
        2 => "rdma_read".into(),
        3 => "comp_swap".into(),
        4 => "fetch_add".into(),
        5 => "bind_mw".into(),
        6 => "local_inv".into(),
        128 => "recv".into(),
        129 => "recv_rdma_with_imm".into(),
        n => format!("opcode {n}"),
    }
}

const QP_STATES: [&str; 7] = ["reset", "init", "rtr", "rts", "sqd", "sqe", "err"];

const EVENTS: [&str; 19] = [
    "cq_err",
    "qp_fatal",
    "qp_req_err",
    "qp_access_err",
    "comm_est",
    "sq_drained",
    "path_mig",
    "path_mig_err",
    "device_fatal",
    "port_active",
    "port_err",
    "lid_change",
    "pkey_change",
    "sm_change",
    "srq_err",
    "srq_limit_reached",
    "qp_last_wqe_reached",
    "client_reregister",
    "gid_change",
];

fn name_of(table: &[&str], n: u64) -> String {
    table.get(n as usize).map_or(format!("{n}"), |s| (*s).to_string())
}

fn step(b: &mut Bench, s: &Step, v: &mut Vars, o: &Objects) -> Result<(), String> {
    if let Some(raw) = &s.agent {
        b.agent.ok(&agent_command(raw, v, o, &b.tester_gid)?)?;
    } else if let Some(raw) = &s.agent_fails {
        let cmd = agent_command(raw, v, o, &b.tester_gid)?;
        match b.agent.call(&cmd)? {
            Answer::Ok(_) => return Err(format!("agent `{cmd}` succeeded; it must fail")),
            Answer::Err { errno, .. } => {
                let got = format!("{:?}", Errno::from_raw(errno));
                if let Some(want) = &s.errno {
                    if &got != want {
                        return Err(format!("agent `{cmd}` failed with {got}, expected {want}"));
                    }
                }
            }
        }
    } else if let Some(spec) = &s.send {
        let pkt = forge(spec, v, |p| b.peer.icrc_for(p))?;
        for _ in 0..spec.times.unwrap_or(1) {
            b.peer.send(&pkt)?;
        }
    } else if let Some(e) = &s.expect {
        let within = Duration::from_millis(e.within_ms.unwrap_or(1000));
        let until = Instant::now() + within;
        let mut skipped = Vec::new();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let Some(rx) = b.peer.next(left)? else {
                let also =
                    if skipped.is_empty() { String::new() } else { format!(" (skipped: {})", skipped.join("; ")) };
                return Err(format!("no matching packet from the DUT within {} ms{also}", within.as_millis()));
            };
            match judge(e, v, &rx.payload, rx.icrc_ok) {
                Ok(saved) => {
                    for (k, x) in saved {
                        v.set(&k, x);
                    }
                    break;
                }
                Err(why) if e.skip_other.unwrap_or(false) && skipped.len() < 10_000 => {
                    if skipped.len() < 4 {
                        skipped.push(why);
                    }
                }
                Err(why) => return Err(format!("the DUT sent {why}")),
            }
        }
    } else if let Some(ms) = s.silence_ms {
        if let Some(rx) = b.peer.next(Duration::from_millis(ms))? {
            return Err(format!("the DUT sent {} where it must stay silent ({ms} ms)", describe(&rx.payload)));
        }
    } else if let Some(w) = &s.wc {
        let ms = w.within_ms.unwrap_or(2000);
        let m = b.agent.ok(&format!("poll cq={} max=1 wait_ms={ms}", o.cq))?;
        if field(&m, "n")? == 0 {
            return Err(format!("no completion within {ms} ms, expected {}", w.status));
        }
        let wc = m.get("wc").cloned().unwrap_or_default();
        let f: Vec<u64> = wc.split(':').map(|x| parse_u64(x).unwrap_or(u64::MAX)).collect();
        if f.len() < 7 {
            return Err(format!("the agent's completion {wc:?} is not wr_id:status:opcode:byte_len:imm:src_qp:flags"));
        }
        let (wr_id, status, opcode, byte_len, imm) = (f[0], name_of(&WC_STATUS, f[1]), wc_opcode(f[2]), f[3], f[4]);
        let shown = format!("completion wr_id {wr_id} {status} {opcode} {byte_len} B");
        if status != w.status {
            return Err(format!("{shown}, expected {}", w.status));
        }
        if w.wr_id.is_some_and(|x| x != wr_id) {
            return Err(format!("{shown}, expected wr_id {}", w.wr_id.unwrap_or(0)));
        }
        // The opcode and length of an error completion are undefined (ibv_poll_cq(3)).
        if status == "success" {
            if let Some(op) = &w.opcode {
                if op != &opcode {
                    return Err(format!("{shown}, expected opcode {op}"));
                }
            }
            if w.byte_len.is_some_and(|x| u64::from(x) != byte_len) {
                return Err(format!("{shown}, expected {} B", w.byte_len.unwrap_or(0)));
            }
            if let Some(i) = &w.imm {
                let want = v.eval(i)? & 0xffff_ffff;
                if want != imm {
                    return Err(format!("{shown}: immediate {imm:#x}, expected {want:#x}"));
                }
            }
        }
    } else if let Some(ms) = s.no_wc_ms {
        let m = b.agent.ok(&format!("poll cq={} max=1 wait_ms={ms}", o.cq))?;
        if field(&m, "n")? != 0 {
            return Err(format!("a completion ({}) where none may come", m.get("wc").cloned().unwrap_or_default()));
        }
    } else if let Some(want) = &s.state {
        let m = b.agent.ok(&format!("query qp={}", o.qp))?;
        let got = name_of(&QP_STATES, field(&m, "state")?);
        if &got != want {
            return Err(format!("the DUT's QP is in {got}, expected {want}"));
        }
    } else if let Some(mem) = &s.mem {
        let want: Vec<u8> = match (&mem.data, mem.len) {
            (Some(h), _) => (0..h.len() / 2)
                .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).map_err(|_| format!("mem data {h:?}")))
                .collect::<Result<_, _>>()?,
            (None, Some(n)) => vec![mem.fill.unwrap_or(0); n as usize],
            (None, None) => return Err("mem: data or len".into()),
        };
        let m = b.agent.ok(&format!("read mr={} off={} len={}", mem.mr, mem.off, want.len()))?;
        let got = m.get("data").cloned().unwrap_or_default();
        let want_hex: String = want.iter().map(|b| format!("{b:02x}")).collect();
        if got != want_hex {
            let i = got.as_bytes().iter().zip(want_hex.as_bytes()).position(|(a, b)| a != b).unwrap_or(0) / 2;
            return Err(format!(
                "MR {} at {}: byte {i} is {}, expected {}",
                mem.mr,
                mem.off,
                got.get(2 * i..2 * i + 2).unwrap_or("?"),
                want_hex.get(2 * i..2 * i + 2).unwrap_or("?")
            ));
        }
    } else if let Some(e) = &s.event {
        let ms = e.within_ms.unwrap_or(2000);
        let m = b.agent.ok(&format!("event wait_ms={ms}"))?;
        if m.contains_key("none") {
            return Err(format!("no async event within {ms} ms, expected {}", e.kind));
        }
        let got = name_of(&EVENTS, field(&m, "type")?);
        if got != e.kind {
            return Err(format!("async event {got}, expected {}", e.kind));
        }
    } else if let Some(ms) = s.sleep_ms {
        std::thread::sleep(Duration::from_millis(ms));
    }
    Ok(())
}

/// What one case came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    /// A required behaviour did not hold, or the case could not be run: what differed.
    Fail(String),
    /// A choice the spec leaves open came out otherwise: what the DUT did.
    Deviation(String),
}

/// Runs one case; the step number and what differed on a failure.
pub(crate) fn run_case(b: &mut Bench, c: &Case) -> Verdict {
    let _ = b.peer.drain();
    let mut v = Vars::default();
    let o = match setup(b, c, &mut v) {
        Ok(o) => o,
        Err(e) => return Verdict::Fail(format!("setup: {e}")),
    };
    for (i, s) in c.steps.iter().enumerate() {
        if let Err(e) = step(b, s, &mut v, &o) {
            let why = format!("step {}: {e}", i + 1);
            return match c.kind {
                super::case::Kind::Required => Verdict::Fail(why),
                super::case::Kind::Choice => Verdict::Deviation(why),
            };
        }
    }
    Verdict::Pass
}
