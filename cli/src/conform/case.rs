//! A conformance case as data (conformance/cases/CHAPTER/NAME.toml): the rule it checks, how the
//! device under test's QP is set up, and the steps: what the agent does on the DUT, what the
//! tester puts on the wire, and what must come back (docs/conform.md has the format).

use std::collections::BTreeMap;

use serde::Deserialize;

/// Whether a mismatch is a failure (the spec requires the behaviour) or a deviation (the spec
/// leaves it open and the case checks one implementation's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    #[default]
    Required,
    Choice,
}

/// One case file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Case {
    /// What the case checks, in a sentence.
    pub(crate) title: String,
    /// The rule: an IBTA section or compliance statement, or "rxe choice"/"ConnectX choice".
    pub(crate) rule: String,
    #[serde(default)]
    pub(crate) kind: Kind,
    /// The DUT's QP type: rc, uc, ud, xrc_ini (an XRC send QP) or xrc_tgt (an XRC receive QP in
    /// an XRC domain, with an XRC SRQ of that domain: variable `srqn`).
    pub(crate) transport: String,
    #[serde(default)]
    pub(crate) dut: DutSetup,
    #[serde(rename = "step", default)]
    pub(crate) steps: Vec<Step>,
}

/// How the DUT's objects are made and its QP brought to RTS (each field has the everyday value
/// as its default).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct DutSetup {
    /// QP access flags (INIT): lw, rw, rr, ra, comma-separated.
    pub(crate) access: String,
    /// Memory regions: each `[len, "access"]`; mr0, mr1, ... in the steps.
    pub(crate) mrs: Vec<(u64, String)>,
    /// The byte every MR starts filled with.
    pub(crate) fill: u8,
    /// The DUT's first send PSN (its requests and the tester's responses to them).
    pub(crate) sq_psn: u32,
    /// The PSN the DUT's responder expects first (the tester's requests).
    pub(crate) rq_psn: u32,
    pub(crate) mtu: u32,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) qkey: u32,
    /// Receives posted before the first step: each `[mr, off, len]`, wr_id 100, 101, ...
    pub(crate) recvs: Vec<(u32, u64, u64)>,
    /// Bring the QP only to this state (init, rtr); default rts.
    pub(crate) state: String,
    /// Make the QP with an SRQ.
    pub(crate) srq: bool,
    /// xrc_tgt: a second XRC domain with an XRC SRQ of its own (variable `other_srqn`).
    pub(crate) other_domain_srq: bool,
}

impl Default for DutSetup {
    fn default() -> Self {
        DutSetup {
            access: "lw,rw,rr,ra".into(),
            mrs: vec![(4096, "lw,rw,rr,ra".into())],
            fill: 0,
            sq_psn: 0x100,
            rq_psn: 0x800,
            mtu: 1024,
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            qkey: 0x1111_1111,
            recvs: Vec::new(),
            state: "rts".into(),
            srq: false,
            other_domain_srq: false,
        }
    }
}

/// A number, or an expression over the case's variables (`sq+1`, `mr0.addr+64`, `dut_qpn`).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub(crate) enum Num {
    Int(i64),
    Expr(String),
}

/// One step: exactly one of its fields is set.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Step {
    /// An agent command, with `${expr}` substituted.
    pub(crate) agent: Option<String>,
    /// An agent command that must fail (with the errno named, when given).
    pub(crate) agent_fails: Option<String>,
    /// A packet the tester sends to the DUT.
    pub(crate) send: Option<SendSpec>,
    /// The next packet from the DUT must match.
    pub(crate) expect: Option<ExpectSpec>,
    /// No packet from the DUT for this many ms.
    pub(crate) silence_ms: Option<u64>,
    /// A completion the DUT's CQ must report.
    pub(crate) wc: Option<WcSpec>,
    /// No completion on the DUT's CQ for this many ms.
    pub(crate) no_wc_ms: Option<u64>,
    /// The DUT QP's state (reset, init, rtr, rts, sqd, sqe, err).
    pub(crate) state: Option<String>,
    /// Bytes of a DUT MR.
    pub(crate) mem: Option<MemSpec>,
    /// An async event the DUT must report.
    pub(crate) event: Option<EventSpec>,
    /// Wait.
    pub(crate) sleep_ms: Option<u64>,
    /// Errno for `agent_fails` (name, e.g. EINVAL); any failure when absent.
    pub(crate) errno: Option<String>,
}

/// A packet to send. Fields left out take the everyday value for the opcode.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct SendSpec {
    pub(crate) op: String,
    pub(crate) psn: Option<Num>,
    pub(crate) dqpn: Option<Num>,
    pub(crate) ack_req: Option<bool>,
    pub(crate) se: Option<bool>,
    pub(crate) mig_req: Option<bool>,
    pub(crate) pkey: Option<Num>,
    pub(crate) tver: Option<u8>,
    /// Payload bytes (filled with `fill`, default 0xA5) or `payload` as hex.
    pub(crate) len: Option<usize>,
    pub(crate) fill: Option<u8>,
    pub(crate) payload: Option<String>,
    pub(crate) va: Option<Num>,
    pub(crate) rkey: Option<Num>,
    pub(crate) dma_len: Option<Num>,
    /// ack, rnr, nak_seq, nak_inv, nak_rae, nak_rop, or a syndrome byte.
    pub(crate) syndrome: Option<String>,
    pub(crate) credits: Option<u8>,
    pub(crate) rnr_timer: Option<u8>,
    pub(crate) msn: Option<Num>,
    pub(crate) orig: Option<Num>,
    pub(crate) imm: Option<Num>,
    pub(crate) swap: Option<Num>,
    pub(crate) compare: Option<Num>,
    pub(crate) qkey: Option<Num>,
    pub(crate) src_qp: Option<Num>,
    /// The XRCETH's SRQ number (default: the case's `srqn`).
    pub(crate) srqn: Option<Num>,
    /// Flip the ICRC's bits.
    pub(crate) bad_icrc: Option<bool>,
    /// Send only the first N bytes of the UDP payload.
    pub(crate) truncate: Option<usize>,
    /// Send the same packet this many times.
    pub(crate) times: Option<u32>,
}

/// What the DUT's next packet must be. Fields left out are not checked.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExpectSpec {
    pub(crate) op: Option<String>,
    pub(crate) psn: Option<Num>,
    pub(crate) dqpn: Option<Num>,
    pub(crate) ack_req: Option<bool>,
    pub(crate) se: Option<bool>,
    pub(crate) len: Option<usize>,
    pub(crate) payload: Option<String>,
    pub(crate) fill: Option<u8>,
    pub(crate) va: Option<Num>,
    pub(crate) rkey: Option<Num>,
    pub(crate) dma_len: Option<Num>,
    pub(crate) syndrome: Option<String>,
    pub(crate) credits: Option<u8>,
    pub(crate) msn: Option<Num>,
    pub(crate) orig: Option<Num>,
    pub(crate) imm: Option<Num>,
    pub(crate) swap: Option<Num>,
    pub(crate) compare: Option<Num>,
    pub(crate) qkey: Option<Num>,
    pub(crate) src_qp: Option<Num>,
    pub(crate) pkey: Option<Num>,
    /// The XRCETH's SRQ number.
    pub(crate) srqn: Option<Num>,
    /// How long to wait for it (default 1000 ms).
    pub(crate) within_ms: Option<u64>,
    /// Skip packets that do not match (retransmissions, other ACKs) until one does.
    pub(crate) skip_other: Option<bool>,
    /// Remember fields of the matched packet under names (`{ psn = "p" }`) for later steps.
    pub(crate) save: Option<BTreeMap<String, String>>,
}

/// A completion the DUT must report.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct WcSpec {
    /// success, rem_access_err, retry_exc_err, ... (ibv_wc_status without IBV_WC_ and _ERR kept).
    pub(crate) status: String,
    pub(crate) wr_id: Option<u64>,
    /// send, rdma_write, rdma_read, comp_swap, fetch_add, recv, recv_rdma_with_imm.
    pub(crate) opcode: Option<String>,
    pub(crate) byte_len: Option<u32>,
    pub(crate) imm: Option<Num>,
    pub(crate) within_ms: Option<u64>,
}

/// Bytes a DUT MR must hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MemSpec {
    pub(crate) mr: u32,
    pub(crate) off: u64,
    /// Hex, or `len` bytes of `fill`.
    pub(crate) data: Option<String>,
    pub(crate) len: Option<u64>,
    pub(crate) fill: Option<u8>,
}

/// An async event the DUT must report.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventSpec {
    /// qp_fatal, qp_req_err, qp_access_err, comm_est, sq_drained, path_mig, ...
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) within_ms: Option<u64>,
}

impl Case {
    /// Parses a case file; the error names what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Case, String> {
        let c: Case = toml::from_str(text).map_err(|e| e.to_string())?;
        if !matches!(c.transport.as_str(), "rc" | "uc" | "ud" | "xrc_ini" | "xrc_tgt") {
            return Err(format!("transport {:?}: not rc, uc, ud, xrc_ini or xrc_tgt", c.transport));
        }
        for (i, s) in c.steps.iter().enumerate() {
            let set = [
                s.agent.is_some(),
                s.agent_fails.is_some(),
                s.send.is_some(),
                s.expect.is_some(),
                s.silence_ms.is_some(),
                s.wc.is_some(),
                s.no_wc_ms.is_some(),
                s.state.is_some(),
                s.mem.is_some(),
                s.event.is_some(),
                s.sleep_ms.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if set != 1 {
                return Err(format!("step {}: {set} actions (one per step)", i + 1));
            }
            if s.errno.is_some() && s.agent_fails.is_none() {
                return Err(format!("step {}: errno without agent_fails", i + 1));
            }
        }
        if c.steps.is_empty() {
            return Err("no steps".into());
        }
        Ok(c)
    }
}
