//! How `softrdma pcap decode` prints a CM MAD (the `cm` object of the JSON, the `CM ...` part of a
//! text line). The decoding itself is `softrdma_pcap::analyze` ([`IbFrame::cm`]).
//!
//! [`IbFrame::cm`]: softrdma_pcap::analyze::IbFrame::cm

use std::fmt::Write as _;
use std::net::Ipv6Addr;

use serde_json::{json, Map, Value};
use softrdma_engine::wire::{CmMadRepr, CmMessage, CmPathRepr, Error as WireError};

fn hex64(v: u64) -> String {
    format!("{v:#018x}")
}

/// Bytes as hex, the trailing zeros dropped (private data areas are mostly zero padding).
fn hex_trimmed(b: &[u8]) -> String {
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    b[..end].iter().map(|x| format!("{x:02x}")).collect()
}

fn gid(g: [u8; 16]) -> String {
    Ipv6Addr::from(g).to_string()
}

fn path_json(p: &CmPathRepr) -> Value {
    json!({
        "local_lid": p.local_lid, "remote_lid": p.remote_lid,
        "local_gid": gid(p.local_gid), "remote_gid": gid(p.remote_gid),
        "flow_label": p.flow_label, "packet_rate": p.packet_rate, "traffic_class": p.traffic_class,
        "hop_limit": p.hop_limit, "sl": p.sl, "subnet_local": p.subnet_local,
        "local_ack_timeout": p.local_ack_timeout,
    })
}

/// The `cm` object of a frame: the MAD's values, or `{"error": ...}` when the payload on QP1 is
/// not a valid CM MAD.
pub(crate) fn cm_json(cm: &Result<CmMadRepr, WireError>) -> Value {
    let mad = match cm {
        Ok(mad) => mad,
        Err(e) => return json!({"error": e.to_string()}),
    };
    let mut m = Map::new();
    let attr = mad.msg.attr();
    m.insert("attr".into(), json!(format!("{:#06x}", u16::from(attr))));
    m.insert("attr_name".into(), json!(attr.name()));
    m.insert("tid".into(), json!(hex64(mad.tid)));
    m.insert("attr_mod".into(), json!(mad.attr_mod));
    m.insert("local_comm_id".into(), json!(mad.msg.local_comm_id()));
    if let Some(r) = mad.msg.remote_comm_id() {
        m.insert("remote_comm_id".into(), json!(r));
    }
    if let Some(sid) = mad.msg.service_id() {
        m.insert("service_id".into(), json!(hex64(sid)));
    }
    let mut put = |k: &str, v: Value| {
        m.insert(k.into(), v);
    };
    match &mad.msg {
        CmMessage::Req(r) => {
            put("vendor_id", json!(r.vendor_id));
            put("local_ca_guid", json!(hex64(r.local_ca_guid)));
            put("local_qkey", json!(r.local_qkey));
            put("local_qpn", json!(r.local_qpn));
            put("responder_resources", json!(r.responder_resources));
            put("local_eecn", json!(r.local_eecn));
            put("initiator_depth", json!(r.initiator_depth));
            put("remote_eecn", json!(r.remote_eecn));
            put("remote_cm_response_timeout", json!(r.remote_cm_response_timeout));
            put("transport", json!(r.transport));
            put("e2e_flow_control", json!(r.e2e_flow_control));
            put("starting_psn", json!(r.starting_psn));
            put("local_cm_response_timeout", json!(r.local_cm_response_timeout));
            put("retry_count", json!(r.retry_count));
            put("pkey", json!(r.pkey));
            put("path_mtu", json!(r.path_mtu));
            put("rdc_exists", json!(r.rdc_exists));
            put("rnr_retry_count", json!(r.rnr_retry_count));
            put("max_cm_retries", json!(r.max_cm_retries));
            put("srq", json!(r.srq));
            put("extended_transport", json!(r.extended_transport));
            put("primary_path", path_json(&r.primary_path));
            if r.alternate_path != CmPathRepr::default() {
                put("alternate_path", path_json(&r.alternate_path));
            }
        }
        CmMessage::Rep(r) => {
            put("local_qkey", json!(r.local_qkey));
            put("local_qpn", json!(r.local_qpn));
            put("local_eecn", json!(r.local_eecn));
            put("starting_psn", json!(r.starting_psn));
            put("vendor_id", json!(r.vendor_id));
            put("responder_resources", json!(r.responder_resources));
            put("initiator_depth", json!(r.initiator_depth));
            put("target_ack_delay", json!(r.target_ack_delay));
            put("failover_accepted", json!(r.failover_accepted));
            put("e2e_flow_control", json!(r.e2e_flow_control));
            put("rnr_retry_count", json!(r.rnr_retry_count));
            put("srq", json!(r.srq));
            put("local_ca_guid", json!(hex64(r.local_ca_guid)));
        }
        CmMessage::Rtu(_) | CmMessage::Drep(_) => {}
        CmMessage::Dreq(r) => put("remote_qpn", json!(r.remote_qpn)),
        CmMessage::Rej(r) => {
            put("msg_rejected", json!(r.msg_rejected));
            put("reject_info_len", json!(r.reject_info_len));
            put("reason", json!(r.reason));
            put("ari", json!(hex_trimmed(&r.ari)));
        }
        CmMessage::Mra(r) => {
            put("msg_mraed", json!(r.msg_mraed));
            put("service_timeout", json!(r.service_timeout));
        }
        CmMessage::SidrReq(r) => put("pkey", json!(r.pkey)),
        CmMessage::SidrRep(r) => {
            put("status", json!(r.status));
            put("add_info_len", json!(r.add_info_len));
            put("qpn", json!(r.qpn));
            put("qkey", json!(r.qkey));
            put("add_info", json!(hex_trimmed(&r.add_info)));
        }
        CmMessage::Lap(r) => {
            put("remote_qpn", json!(r.remote_qpn));
            put("remote_cm_response_timeout", json!(r.remote_cm_response_timeout));
            put("alternate_path", path_json(&r.alternate_path));
        }
        CmMessage::Apr(r) => {
            put("add_info_len", json!(r.add_info_len));
            put("status", json!(r.status));
            put("add_info", json!(hex_trimmed(&r.add_info)));
        }
    }
    if let Some(h) = mad.msg.cma_hdr() {
        put("cma_hdr", json!({"port": h.port, "src": h.src.to_string(), "dst": h.dst.to_string()}));
    }
    put("private_data", json!(hex_trimmed(mad.msg.private_data())));
    Value::Object(m)
}

/// The text of a CM MAD for the one-line format: ` CM ConnectRequest comm 0x.. sid 0x.. ...`.
pub(crate) fn cm_text(cm: &Result<CmMadRepr, WireError>) -> String {
    let mad = match cm {
        Ok(mad) => mad,
        Err(e) => return format!(" CM error: {e}"),
    };
    let mut l = format!(" CM {} comm {:#010x}", mad.msg.attr().name(), mad.msg.local_comm_id());
    if let Some(r) = mad.msg.remote_comm_id() {
        let _ = write!(l, " remote {r:#010x}");
    }
    if let Some(sid) = mad.msg.service_id() {
        let _ = write!(l, " sid {sid:#x}");
    }
    match &mad.msg {
        CmMessage::Req(r) => {
            let _ = write!(l, " qpn {:#x} psn {:#x}", r.local_qpn, r.starting_psn);
        }
        CmMessage::Rep(r) => {
            let _ = write!(l, " qpn {:#x} psn {:#x}", r.local_qpn, r.starting_psn);
        }
        CmMessage::Dreq(r) => {
            let _ = write!(l, " qpn {:#x}", r.remote_qpn);
        }
        CmMessage::Rej(r) => {
            let _ = write!(l, " reason {}", r.reason);
        }
        CmMessage::Mra(r) => {
            let _ = write!(l, " timeout {}", r.service_timeout);
        }
        CmMessage::SidrRep(r) => {
            let _ = write!(l, " status {} qpn {:#x} qkey {:#x}", r.status, r.qpn, r.qkey);
        }
        CmMessage::Lap(r) => {
            let _ = write!(l, " qpn {:#x}", r.remote_qpn);
        }
        CmMessage::Apr(r) => {
            let _ = write!(l, " status {}", r.status);
        }
        CmMessage::Rtu(_) | CmMessage::Drep(_) | CmMessage::SidrReq(_) => {}
    }
    if let Some(h) = mad.msg.cma_hdr() {
        let _ = write!(l, " ip {}:{} > {}", h.src, h.port, h.dst);
    }
    l
}
