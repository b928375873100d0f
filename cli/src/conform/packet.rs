//! Forging the tester's packets from a case's `send` and judging the DUT's against an `expect`.

use softrdma_engine::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Headers, IbPacket, IbRepr, IethRepr, ImmDtRepr, Msn,
    NakCode, Opcode, Position, Psn, Qpn, RethRepr, Syndrome, XrcEthRepr,
};

use super::case::{ExpectSpec, Num, SendSpec};
use super::vars::Vars;

/// An opcode by its table name (`RC_SEND_ONLY`) or number.
pub(crate) fn opcode(name: &str) -> Result<Opcode, String> {
    if let Some(h) = name.strip_prefix("0x") {
        return u8::from_str_radix(h, 16).map(Opcode).map_err(|_| format!("opcode {name:?}"));
    }
    (0..=255u8).map(Opcode).find(|o| o.name() == Some(name)).ok_or(format!("no opcode named {name:?}"))
}

/// A syndrome class or byte: ack, rnr, nak_seq, nak_inv, nak_rae, nak_rop, or 0xNN.
fn syndrome(name: &str, credits: Option<u8>, rnr_timer: Option<u8>) -> Result<Syndrome, String> {
    Ok(match name {
        "ack" => Syndrome::Ack { credits: credits.unwrap_or(31) },
        "rnr" => Syndrome::RnrNak { timer: rnr_timer.unwrap_or(1) },
        "nak_seq" => Syndrome::Nak(NakCode::PsnSequenceError),
        "nak_inv" => Syndrome::Nak(NakCode::InvalidRequest),
        "nak_rae" => Syndrome::Nak(NakCode::RemoteAccessError),
        "nak_rop" => Syndrome::Nak(NakCode::RemoteOperationalError),
        s => match s.strip_prefix("0x").and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(b) => Syndrome::from_byte(b),
            None => return Err(format!("syndrome {s:?}: not ack, rnr, nak_seq, nak_inv, nak_rae, nak_rop or 0xNN")),
        },
    })
}

/// The class name of a syndrome, as cases write it.
pub(crate) fn syndrome_name(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { .. } => "ack".into(),
        Syndrome::RnrNak { .. } => "rnr".into(),
        Syndrome::Nak(NakCode::PsnSequenceError) => "nak_seq".into(),
        Syndrome::Nak(NakCode::InvalidRequest) => "nak_inv".into(),
        Syndrome::Nak(NakCode::RemoteAccessError) => "nak_rae".into(),
        Syndrome::Nak(NakCode::RemoteOperationalError) => "nak_rop".into(),
        other => format!("{:#04x}", other.to_byte()),
    }
}

fn hex(s: &str) -> Result<Vec<u8>, String> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if s.len() % 2 != 0 {
        return Err(format!("hex {s:?} has an odd length"));
    }
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| format!("hex {s:?}"))).collect()
}

fn val(v: &Vars, n: &Option<Num>, dflt: u64) -> Result<u64, String> {
    n.as_ref().map_or(Ok(dflt), |n| v.eval(n))
}

/// Builds the UDP payload (BTH through ICRC) of a `send`; `icrc_for` computes the right ICRC.
pub(crate) fn forge(s: &SendSpec, v: &Vars, icrc_for: impl Fn(&[u8]) -> Option<u32>) -> Result<Vec<u8>, String> {
    let op = opcode(&s.op)?;
    let info = op.info();
    let headers = info.map_or(Headers::NONE, |i| i.headers);
    let payload = match (&s.payload, s.len) {
        (Some(h), _) => hex(h)?,
        (None, Some(n)) => vec![s.fill.unwrap_or(0xa5); n],
        (None, None) => Vec::new(),
    };
    let is_request = info.is_some_and(|i| i.kind.is_request());
    let ends = info.is_some_and(|i| matches!(i.position, Position::Last | Position::Only));
    let psn = val(v, &s.psn, u64::from(v.get("rq")?))? as u32;
    let mut bth = BthRepr::new(op, Qpn::new(val(v, &s.dqpn, u64::from(v.get("dut_qpn")?))? as u32), Psn::new(psn));
    bth.ack_req = s.ack_req.unwrap_or(is_request && ends && op.transport_is_rc());
    bth.solicited = s.se.unwrap_or(false);
    bth.mig_req = s.mig_req.unwrap_or(false);
    bth.pkey = val(v, &s.pkey, 0xffff)? as u16;
    bth.tver = s.tver.unwrap_or(0);
    bth.pad_count = IbRepr::pad_for(payload.len());
    let mut r = IbRepr::new(bth);
    r.payload_len = payload.len();
    if headers.contains(Headers::RETH) {
        r.reth = Some(RethRepr {
            va: val(v, &s.va, 0)?,
            rkey: val(v, &s.rkey, 0)? as u32,
            dma_len: val(v, &s.dma_len, payload.len() as u64)? as u32,
        });
    }
    if headers.contains(Headers::ATOMICETH) {
        r.atomiceth = Some(AtomicEthRepr {
            va: val(v, &s.va, 0)?,
            rkey: val(v, &s.rkey, 0)? as u32,
            swap_add: val(v, &s.swap, 0)?,
            compare: val(v, &s.compare, 0)?,
        });
    }
    if headers.contains(Headers::AETH) {
        r.aeth = Some(AethRepr {
            syndrome: syndrome(s.syndrome.as_deref().unwrap_or("ack"), s.credits, s.rnr_timer)?,
            msn: Msn::new(val(v, &s.msn, 0)? as u32),
        });
    }
    if headers.contains(Headers::ATOMICACKETH) {
        r.atomicacketh = Some(AtomicAckEthRepr { orig_rem_data: val(v, &s.orig, 0)? });
    }
    if headers.contains(Headers::IMMDT) {
        r.immdt = Some(ImmDtRepr { imm: val(v, &s.imm, 0)? as u32 });
    }
    if headers.contains(Headers::IETH) {
        r.ieth = Some(IethRepr { rkey: val(v, &s.rkey, 0)? as u32 });
    }
    if headers.contains(Headers::DETH) {
        r.deth = Some(DethRepr {
            qkey: val(v, &s.qkey, u64::from(v.get("qkey")?))? as u32,
            src_qp: Qpn::new(val(v, &s.src_qp, u64::from(v.get("qpn")?))? as u32),
        });
    }
    if headers.contains(Headers::XRCETH) {
        let dflt = v.get64("srqn").unwrap_or(0);
        r.xrceth = Some(XrcEthRepr { xrc_srqn: (val(v, &s.srqn, dflt)? & 0xff_ffff) as u32 });
    }
    if headers.contains(Headers::RDETH) {
        return Err(format!("{}: RD packets are not forged (softrdma has no RD service)", s.op));
    }
    let mut buf = vec![0u8; r.buffer_len()];
    r.emit(&mut buf).map_err(|e| format!("{}: {e}", s.op))?;
    IbPacket::new_unchecked(&mut buf[..]).payload_mut().copy_from_slice(&payload);
    let crc = icrc_for(&buf).ok_or("ICRC")?;
    let crc = if s.bad_icrc.unwrap_or(false) { !crc } else { crc };
    IbPacket::new_unchecked(&mut buf[..]).set_icrc(crc);
    if let Some(n) = s.truncate {
        buf.truncate(n);
    }
    Ok(buf)
}

trait RcOpcode {
    fn transport_is_rc(self) -> bool;
}

impl RcOpcode for Opcode {
    /// RC (0x00-0x1F) or XRC (0xA0-0xBF): the reliable connected services, whose requests ask
    /// for an ACK at a message's end.
    fn transport_is_rc(self) -> bool {
        matches!(self.0 >> 5, 0 | 5)
    }
}

/// Compares a packet from the DUT with an `expect`; `Err` describes the first difference.
/// `saved` receives the fields the expect names in `save`.
pub(crate) fn judge(e: &ExpectSpec, v: &Vars, payload: &[u8], icrc_ok: bool) -> Result<Vec<(String, u64)>, String> {
    let p = IbPacket::new_checked(payload).map_err(|err| format!("a malformed packet ({err})"))?;
    let r = IbRepr::parse(&p).map_err(|err| format!("a malformed packet ({err})"))?;
    let got = r.bth.opcode;
    let shown = format!("{got} PSN {:#x}", r.bth.psn.value());
    if !icrc_ok {
        return Err(format!("{shown} with a bad ICRC"));
    }
    let mismatch = |what: &str, want: String, have: String| -> Result<Vec<(String, u64)>, String> {
        Err(format!("{shown}: {what} {have}, expected {want}"))
    };
    if let Some(op) = &e.op {
        let want = opcode(op)?;
        if want != got {
            return Err(format!("{shown}, expected {op}"));
        }
    }
    let check = |what: &str, want: &Option<Num>, have: Option<u64>, mask: u64| -> Result<(), String> {
        if let Some(w) = want {
            let w = v.eval(w)? & mask;
            match have {
                Some(h) if h & mask == w => {}
                Some(h) => return Err(format!("{shown}: {what} {h:#x}, expected {w:#x}")),
                None => return Err(format!("{shown}: {what} absent, expected {w:#x}")),
            }
        }
        Ok(())
    };
    check("PSN", &e.psn, Some(u64::from(r.bth.psn.value())), 0xff_ffff)?;
    let dqpn = e.dqpn.clone().or(Some(Num::Expr("qpn".into())));
    check("destination QP", &dqpn, Some(u64::from(r.bth.dest_qp.value())), 0xff_ffff)?;
    check("P_Key", &e.pkey, Some(u64::from(r.bth.pkey)), 0xffff)?;
    if let Some(a) = e.ack_req {
        if a != r.bth.ack_req {
            return mismatch("AckReq", a.to_string(), r.bth.ack_req.to_string());
        }
    }
    if let Some(a) = e.se {
        if a != r.bth.solicited {
            return mismatch("SE", a.to_string(), r.bth.solicited.to_string());
        }
    }
    let all = u64::MAX;
    check("RETH VA", &e.va, r.reth.map(|x| x.va).or(r.atomiceth.map(|x| x.va)), all)?;
    check("R_Key", &e.rkey, r.reth.map(|x| u64::from(x.rkey)).or(r.atomiceth.map(|x| u64::from(x.rkey))), all)?;
    check("DMA length", &e.dma_len, r.reth.map(|x| u64::from(x.dma_len)), all)?;
    check("MSN", &e.msn, r.aeth.map(|x| u64::from(x.msn.value())), 0xff_ffff)?;
    check("original data", &e.orig, r.atomicacketh.map(|x| x.orig_rem_data), all)?;
    check("immediate", &e.imm, r.immdt.map(|x| u64::from(x.imm)), all)?;
    check("swap/add", &e.swap, r.atomiceth.map(|x| x.swap_add), all)?;
    check("compare", &e.compare, r.atomiceth.map(|x| x.compare), all)?;
    check("Q_Key", &e.qkey, r.deth.map(|x| u64::from(x.qkey)), all)?;
    check("source QP", &e.src_qp, r.deth.map(|x| u64::from(x.src_qp.value())), 0xff_ffff)?;
    check("XRC SRQ number", &e.srqn, r.xrceth.map(|x| u64::from(x.xrc_srqn)), 0xff_ffff)?;
    if let Some(s) = &e.syndrome {
        let Some(a) = r.aeth else { return mismatch("AETH", s.clone(), "absent".into()) };
        let have = syndrome_name(a.syndrome);
        if &have != s {
            return mismatch("syndrome", s.clone(), have);
        }
    }
    if let Some(c) = e.credits {
        match r.aeth.map(|a| a.syndrome) {
            Some(Syndrome::Ack { credits }) if credits == c => {}
            Some(Syndrome::Ack { credits }) => return mismatch("credit code", c.to_string(), credits.to_string()),
            _ => return mismatch("credit code", c.to_string(), "no ACK".into()),
        }
    }
    let body = p.payload();
    if let Some(n) = e.len {
        if body.len() != n {
            return mismatch("payload length", n.to_string(), body.len().to_string());
        }
    }
    if let Some(h) = &e.payload {
        let want = hex(h)?;
        if body != want.as_slice() {
            return Err(format!("{shown}: payload differs from the expected {} bytes", want.len()));
        }
    }
    if let Some(f) = e.fill {
        if let Some(i) = body.iter().position(|b| *b != f) {
            return Err(format!("{shown}: payload byte {i} is {:#04x}, expected {f:#04x}", body[i]));
        }
    }
    let mut saved = Vec::new();
    for (field, name) in e.save.iter().flatten() {
        let x = match field.as_str() {
            "psn" => u64::from(r.bth.psn.value()),
            "msn" => r.aeth.map_or(0, |a| u64::from(a.msn.value())),
            "va" => r.reth.map_or(0, |x| x.va),
            "rkey" => r.reth.map_or(0, |x| u64::from(x.rkey)),
            "dma_len" => r.reth.map_or(0, |x| u64::from(x.dma_len)),
            "src_qp" => r.deth.map_or(0, |x| u64::from(x.src_qp.value())),
            other => return Err(format!("save: no field {other:?} (psn, msn, va, rkey, dma_len, src_qp)")),
        };
        saved.push((name.clone(), x));
    }
    Ok(saved)
}

/// A short description of a packet for reports.
pub(crate) fn describe(payload: &[u8]) -> String {
    match IbPacket::new_checked(payload).and_then(|p| IbRepr::parse(&p)) {
        Ok(r) => {
            let mut s = format!("{} PSN {:#x} to QP {:#x}", r.bth.opcode, r.bth.psn.value(), r.bth.dest_qp.value());
            if let Some(a) = r.aeth {
                s.push_str(&format!(" {} MSN {}", syndrome_name(a.syndrome), a.msn.value()));
            }
            s
        }
        Err(e) => format!("a malformed packet ({e})"),
    }
}
