//! Replay of the connection manager's messages (IBTA Vol 1 chapter 12) in a capture: softrdma's
//! CM (the engine's `cm` module, as rdma_cm drives it) plays one side of each recorded connection
//! and what it sends is compared with what the recorded side sent.
//!
//! - **as responder** (the passive side): the recorded REQ reaches a listener on its service ID;
//!   softrdma accepts with the recorded REP's application values (QPN, responder resources,
//!   initiator depth, RNR retry count, SRQ, flow control, private data) and its REP is compared
//!   with the recorded one on what the CM itself decides: the comm ID and TID it echoes, Q_Key,
//!   target ACK delay, failover, vendor ID and attribute modifier (ECE). The recorded RTU is fed
//!   back; a DREQ from the active side is answered with a DREP (compared), and where the recorded
//!   passive side sent the DREQ, softrdma disconnects at that time and its DREQ is compared.
//! - **as requester** (the active side): softrdma connects with the recorded REQ's application
//!   values and addresses (the IP header of its private data) and its REQ is compared on what the
//!   CM decides: CM response timeouts, transport, P_Key, path MTU, max CM retries, the primary
//!   path (LIDs, GIDs, flow label, rate, traffic class, hop limit, SL, subnet local, local ACK
//!   timeout), the IP header; then the recorded REP is fed back (its comm ID rewritten to
//!   softrdma's) and the RTU compared, and the disconnection as above.
//!
//! Values chosen at random or by the host are never compared: comm IDs, starting PSNs, CA GUIDs,
//! the TID's agent half. Comm IDs in the recorded messages fed back are rewritten to softrdma's.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use softrdma_engine::cm::{Cm, CmConfig, CmEventKind, ConnParam, Ece, IdHandle};
use softrdma_engine::time::{Duration, Instant};
use softrdma_engine::verbs::{Mtu, QpType};
use softrdma_engine::wire::{CmMadRepr, CmMessage, CmPathRepr, CmaHdrPacket, CmaHdrRepr, MAD_LEN};

use crate::behaviour::Capture;
use crate::replay::{ConversationReport, Mismatch};

/// One recorded CM message.
#[derive(Debug, Clone)]
struct Msg {
    frame: u64,
    ts: u64,
    src: IpAddr,
    mad: CmMadRepr,
}

/// The messages of one connection, in capture order.
#[derive(Debug, Default)]
struct Conn {
    msgs: Vec<Msg>,
}

/// Groups the capture's CM MADs into connections by the REQ's comm ID (REP/REJ/MRA/RTU/DREQ/DREP
/// name it as their remote or local comm ID).
fn connections(cap: &Capture) -> Vec<Conn> {
    let mut conns: Vec<Conn> = Vec::new();
    // Either side's comm ID -> connection.
    let mut by_comm: HashMap<u32, usize> = HashMap::new();
    for p in &cap.packets {
        let Some(Ok(mad)) = &p.ib.cm else { continue };
        let m = Msg { frame: p.frame, ts: p.ts_ns, src: p.ib.src.to_canonical(), mad: mad.clone() };
        let (local, remote) = comm_ids(&mad.msg);
        let known = by_comm.get(&remote).or_else(|| by_comm.get(&local)).copied();
        let i = match (known, &mad.msg) {
            (Some(i), _) => i,
            (None, CmMessage::Req(_)) => {
                conns.push(Conn::default());
                conns.len() - 1
            }
            _ => continue,
        };
        if local != 0 {
            by_comm.insert(local, i);
        }
        conns[i].msgs.push(m);
    }
    conns
}

fn comm_ids(m: &CmMessage) -> (u32, u32) {
    match m {
        CmMessage::Req(r) => (r.local_comm_id, 0),
        CmMessage::Rep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rtu(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Drep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rej(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Mra(r) => (r.local_comm_id, r.remote_comm_id),
        _ => (0, 0),
    }
}

/// Rewrites the comm IDs of a recorded message for softrdma's CM: `ours` is softrdma's comm ID
/// (the side it plays), `theirs` the recorded peer's (kept).
fn retarget(m: &CmMessage, ours: u32) -> CmMessage {
    let mut m = m.clone();
    match &mut m {
        CmMessage::Rep(r) => r.remote_comm_id = ours,
        CmMessage::Rtu(r) => r.remote_comm_id = ours,
        CmMessage::Dreq(r) => r.remote_comm_id = ours,
        CmMessage::Drep(r) => r.remote_comm_id = ours,
        CmMessage::Rej(r) => r.remote_comm_id = ours,
        CmMessage::Mra(r) => r.remote_comm_id = ours,
        _ => {}
    }
    m
}

fn name(m: &CmMessage) -> &'static str {
    match m {
        CmMessage::Req(_) => "REQ",
        CmMessage::Rep(_) => "REP",
        CmMessage::Rtu(_) => "RTU",
        CmMessage::Dreq(_) => "DREQ",
        CmMessage::Drep(_) => "DREP",
        CmMessage::Rej(_) => "REJ",
        CmMessage::Mra(_) => "MRA",
        _ => "other",
    }
}

fn path_fields(prefix: &str, p: &CmPathRepr, out: &mut Vec<(String, String)>) {
    let f = |k: &str, v: String| (format!("{prefix} {k}"), v);
    out.push(f("local LID", format!("{:#06x}", p.local_lid)));
    out.push(f("remote LID", format!("{:#06x}", p.remote_lid)));
    out.push(f("flow label", format!("{:#x}", p.flow_label)));
    out.push(f("rate", p.packet_rate.to_string()));
    out.push(f("traffic class", p.traffic_class.to_string()));
    out.push(f("hop limit", p.hop_limit.to_string()));
    out.push(f("SL", p.sl.to_string()));
    out.push(f("subnet local", u8::from(p.subnet_local).to_string()));
    out.push(f("local ACK timeout", p.local_ack_timeout.to_string()));
}

/// The fields of a message the CM decides (not the application, not chance), named.
fn cm_fields(mad: &CmMadRepr) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = vec![("attribute modifier".into(), format!("{:#x}", mad.attr_mod))];
    match &mad.msg {
        CmMessage::Req(r) => {
            v.push(("service ID".into(), format!("{:#x}", r.service_id)));
            v.push(("Q_Key".into(), format!("{:#x}", r.local_qkey)));
            v.push(("vendor ID".into(), format!("{:#x}", r.vendor_id)));
            v.push(("remote CM response timeout".into(), r.remote_cm_response_timeout.to_string()));
            v.push(("local CM response timeout".into(), r.local_cm_response_timeout.to_string()));
            v.push(("transport".into(), r.transport.to_string()));
            v.push(("extended transport".into(), r.extended_transport.to_string()));
            v.push(("P_Key".into(), format!("{:#06x}", r.pkey)));
            v.push(("path MTU".into(), r.path_mtu.to_string()));
            v.push(("RDC exists".into(), u8::from(r.rdc_exists).to_string()));
            v.push(("max CM retries".into(), r.max_cm_retries.to_string()));
            path_fields("primary path", &r.primary_path, &mut v);
            let alt = r.alternate_path == CmPathRepr::default();
            v.push(("alternate path".into(), if alt { "none".into() } else { "present".into() }));
            let hdr = CmaHdrPacket::new_checked(&r.private_data[..]).ok().and_then(|p| CmaHdrRepr::parse(&p).ok());
            v.push((
                "IP header".into(),
                hdr.map_or("none".into(), |h| format!("port {} {} > {}", h.port, h.src, h.dst)),
            ));
        }
        CmMessage::Rep(r) => {
            v.push(("Q_Key".into(), format!("{:#x}", r.local_qkey)));
            v.push(("vendor ID".into(), format!("{:#x}", r.vendor_id)));
            v.push(("target ACK delay".into(), r.target_ack_delay.to_string()));
            v.push(("failover accepted".into(), r.failover_accepted.to_string()));
            v.push(("local EECN".into(), r.local_eecn.to_string()));
        }
        CmMessage::Rtu(r) => v.push(("private data length".into(), r.private_data.len().to_string())),
        CmMessage::Dreq(r) => v.push(("remote QPN".into(), format!("{:#x}", r.remote_qpn))),
        CmMessage::Drep(r) => v.push(("private data length".into(), r.private_data.len().to_string())),
        _ => {}
    }
    v
}

/// The side softrdma plays, and its CM.
struct Side {
    cm: Cm,
    h: Option<IdHandle>,
    now: Instant,
    sent: Vec<(Instant, CmMadRepr)>,
}

impl Side {
    fn new(addr: IpAddr, behaviour_cx: bool, mtu: Mtu, rate: u8) -> Side {
        let mut cfg = CmConfig::new(addr, 0x0002_c9ff_fe00_0001, mtu, 1);
        cfg.path_rate = rate;
        // The profile's CM values: ConnectX firmware's response timeout 22 and mlx5's target
        // ACK delay 16 (../shared/reference/cm); rxe's 20 and 15.
        if behaviour_cx {
            cfg.cm_response_timeout = 22;
            cfg.target_ack_delay = 16;
        }
        Side { cm: Cm::new(cfg), h: None, now: Instant::ZERO, sent: Vec::new() }
    }

    fn at(&mut self, t: Instant) {
        self.now = self.now.max(t);
        self.drain();
    }

    fn drain(&mut self) {
        while let Some(m) = self.cm.poll_mad() {
            if let Ok(mad) = CmMadRepr::parse(&m.mad) {
                self.sent.push((self.now, mad));
            }
        }
    }

    fn feed(&mut self, src: IpAddr, mad: &CmMadRepr) {
        let mut buf = [0u8; MAD_LEN];
        if mad.emit(&mut buf).is_ok() {
            self.cm.handle_mad(self.now, src, &buf);
        }
        self.drain();
    }

    /// Takes the events so far; the handle of a new connection (CONNECT_REQUEST) becomes the ID.
    fn events(&mut self) -> Vec<CmEventKind> {
        let mut kinds = Vec::new();
        while let Some(ev) = self.cm.poll_event() {
            if ev.kind == CmEventKind::ConnectRequest {
                self.h = Some(ev.id);
            }
            kinds.push(ev.kind);
        }
        kinds
    }
}

/// Replays the CM of each connection in the capture, as `role` ("responder": the passive side;
/// "requester": the active side).
pub(crate) fn replay_cm(cap: &Capture, cx: bool, role: &'static str) -> Vec<ConversationReport> {
    connections(cap).iter().filter_map(|c| replay_conn(c, cx, role)).collect()
}

fn report(req: &Msg, passive: IpAddr, role: &'static str) -> ConversationReport {
    ConversationReport::new("CM", role, (req.src, passive), (Some(1), Some(1)), req.frame)
}

fn replay_conn(c: &Conn, cx: bool, role: &'static str) -> Option<ConversationReport> {
    let req = c.msgs.first()?;
    let CmMessage::Req(rq) = &req.mad.msg else { return None };
    let passive_addr = c.msgs.iter().find(|m| m.src != req.src).map(|m| m.src);
    let Some(passive) = passive_addr else {
        let mut r = report(req, req.src, role);
        r.not_replayable = Some("one direction only: no answer to the REQ in the capture".into());
        return Some(r);
    };
    let mut r = report(req, passive, role);
    let active = req.src;
    let t0 = req.ts;
    let time = |m: &Msg| Instant::ZERO + Duration::from_nanos(m.ts.saturating_sub(t0));
    // The IP header rdma_cm puts first in the REQ's private data: the ports of both IDs.
    let Some(hdr) = CmaHdrPacket::new_checked(&rq.private_data[..]).ok().and_then(|p| CmaHdrRepr::parse(&p).ok())
    else {
        r.not_replayable = Some("the REQ carries no rdma_cm IP header: not an rdma_cm connection".into());
        return Some(r);
    };
    let ps = (rq.service_id >> 16) as u16;
    let port = rq.service_id as u16;
    if rq.service_id >> 32 != 0 || rq.service_id & 0xff00_0000 != 0x0100_0000 {
        r.not_replayable = Some(format!("service ID {:#x} is not an rdma_cm port space's", rq.service_id));
        return Some(r);
    }
    let rep = c.msgs.iter().find_map(|m| match &m.mad.msg {
        CmMessage::Rep(p) => Some((m, p.clone())),
        _ => None,
    });
    let qp_type = match rq.transport {
        1 => QpType::Uc,
        _ => QpType::Rc,
    };
    r.setup.push(format!(
        "service ID {:#x} (port space {ps:#06x}, port {port}); the application's values from the recorded REQ{}",
        rq.service_id,
        if rep.is_some() { " and REP" } else { "" }
    ));
    let me_addr = if role == "responder" { passive } else { active };
    // The port's properties, as the REQ shows them: its MTU (the interface's) and link rate.
    let mtu = Mtu::from_ibv(u32::from(rq.path_mtu)).unwrap_or(Mtu::Mtu1024);
    let rate = rq.primary_path.packet_rate;
    r.setup.push(format!(
        "the port's MTU {} and link rate code {rate} from the REQ (properties of the recorded host's port, not CM choices)",
        mtu.bytes()
    ));
    let mut side = Side::new(me_addr, cx, mtu, rate);
    // softrdma's comm ID, once it has one; the recorded one of the side softrdma plays.
    let mut recorded_mine = 0u32;
    let mut ours = 0u32;
    let mut expect: Vec<&Msg> = Vec::new();
    if role == "responder" {
        let h = side.cm.create_id(ps, qp_type);
        let local = SocketAddr::new(passive, port);
        if side.cm.set_addrs(h, Some(local), None, 0).and_then(|_| side.cm.listen(h, 16)).is_err() {
            r.not_replayable = Some("the listener could not be set up".into());
            return Some(r);
        }
    } else {
        let h = side.cm.create_id(ps, qp_type);
        side.h = Some(h);
        let local = SocketAddr::new(active, hdr.port);
        let remote = SocketAddr::new(passive, port);
        let p = ConnParam {
            private_data: rq.private_data.get(CmaHdrRepr::LEN..).map(trim_zeros).unwrap_or_default(),
            responder_resources: rq.responder_resources,
            initiator_depth: rq.initiator_depth,
            flow_control: rq.e2e_flow_control,
            retry_count: rq.retry_count,
            rnr_retry_count: rq.rnr_retry_count,
            srq: rq.srq,
            qp_num: rq.local_qpn,
            ece: Ece { vendor_id: rq.vendor_id, attr_mod: req.mad.attr_mod },
            qkey: 0,
        };
        if side
            .cm
            .set_addrs(h, Some(local), Some(remote), 0)
            .and_then(|_| side.cm.connect(Instant::ZERO, h, p))
            .is_err()
        {
            r.not_replayable = Some("softrdma's CM refused the connect".into());
            return Some(r);
        }
        side.drain();
        recorded_mine = rq.local_comm_id;
        expect.push(req);
    }
    for m in &c.msgs {
        let from_peer = (m.src == active) == (role == "responder");
        side.at(time(m));
        let (local, _) = comm_ids(&m.mad.msg);
        if from_peer {
            // The recorded peer's message, its comm ID for softrdma rewritten.
            let mut mad = m.mad.clone();
            mad.msg = retarget(&m.mad.msg, ours);
            side.feed(m.src, &mad);
            r.packets_replayed += 1;
            for ev in side.events() {
                let Some(h) = side.h else { continue };
                match ev {
                    CmEventKind::ConnectRequest => {
                        let Some((_, p)) = &rep else { continue };
                        let param = ConnParam {
                            private_data: trim_zeros(&p.private_data),
                            responder_resources: p.responder_resources,
                            initiator_depth: p.initiator_depth,
                            flow_control: p.e2e_flow_control,
                            retry_count: 0,
                            rnr_retry_count: p.rnr_retry_count,
                            srq: p.srq,
                            qp_num: p.local_qpn,
                            ece: Ece { vendor_id: p.vendor_id, attr_mod: 0 },
                            qkey: 0,
                        };
                        let _ = side.cm.accept(side.now, h, param);
                    }
                    CmEventKind::ConnectResponse => {
                        let _ = side.cm.establish(side.now, h);
                    }
                    CmEventKind::Disconnected => {
                        // rdma_cm answers a DREQ when its consumer calls rdma_disconnect.
                        let _ = side.cm.disconnect(side.now, h);
                    }
                    _ => {}
                }
            }
            side.drain();
        } else {
            // A message of the side softrdma plays: softrdma should have sent its own.
            if recorded_mine == 0 {
                recorded_mine = local;
            }
            if matches!(m.mad.msg, CmMessage::Dreq(_)) {
                if let Some(h) = side.h {
                    let _ = side.cm.disconnect(side.now, h);
                    side.drain();
                }
            }
            if !matches!(m.mad.msg, CmMessage::Req(_)) {
                expect.push(m);
            }
        }
        if ours == 0 {
            ours = side.sent.iter().map(|(_, s)| comm_ids(&s.msg).0).find(|&c| c != 0).unwrap_or(0);
        }
    }
    side.at(side.now + Duration::from_millis(10));
    r.packets_sent = side.sent.len() as u64;
    // Compare: each recorded message of softrdma's side with softrdma's message of the same kind,
    // in order (a resent one counts once).
    let mut used = vec![false; side.sent.len()];
    for m in expect {
        r.answers_expected += 1;
        let found = side.sent.iter().enumerate().find(|(i, (_, s))| !used[*i] && name(&s.msg) == name(&m.mad.msg));
        let Some((i, (_, s))) = found else {
            r.mismatches.push(Mismatch {
                frame: Some(m.frame),
                psn: 0,
                field: "message".into(),
                recorded: name(&m.mad.msg).into(),
                softrdma: "not sent".into(),
            });
            continue;
        };
        used[i] = true;
        let mut same = true;
        for ((field, a), (_, b)) in cm_fields(&m.mad).iter().zip(cm_fields(s)) {
            if *a != b {
                same = false;
                r.mismatches.push(Mismatch {
                    frame: Some(m.frame),
                    psn: 0,
                    field: format!("{} {field}", name(&m.mad.msg)),
                    recorded: a.clone(),
                    softrdma: b,
                });
            }
        }
        // The comm ID softrdma echoes is the recorded peer's (fed to it unchanged).
        let (_, remote_rec) = comm_ids(&m.mad.msg);
        let (_, remote_ours) = comm_ids(&s.msg);
        if remote_rec != remote_ours && !matches!(m.mad.msg, CmMessage::Req(_)) {
            same = false;
            r.mismatches.push(Mismatch {
                frame: Some(m.frame),
                psn: 0,
                field: format!("{} remote comm ID", name(&m.mad.msg)),
                recorded: format!("{remote_rec:#x}"),
                softrdma: format!("{remote_ours:#x}"),
            });
        }
        r.answers_matched += u64::from(same);
    }
    let extra: Vec<&str> = side.sent.iter().zip(&used).filter(|(_, u)| !**u).map(|((_, s), _)| name(&s.msg)).collect();
    if !extra.is_empty() {
        r.not_compared
            .push(format!("softrdma also sent {} (resends, or messages the capture does not hold)", extra.join(", ")));
    }
    r.not_compared
        .push("comm IDs, starting PSNs, CA GUIDs and the TID's agent half (chosen at random or by the host)".into());
    let _ = recorded_mine;
    Some(r)
}

/// Private data as the application gave it: the MAD pads it with zeros to its area's size.
fn trim_zeros(d: &[u8]) -> Vec<u8> {
    let end = d.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    d[..end].to_vec()
}
