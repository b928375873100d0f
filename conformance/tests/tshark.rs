//! Cross-check against an independent decoder: tshark (Wireshark 4.0) reads the same frames and
//! must see the same BTH and extension-header fields and the same ICRC bytes as softrdma's
//! decoder. Inputs: frames softrdma's encoder emits for every opcode (several seeds), the golden
//! packets, and the real hardware and rxe captures. The CM MADs of the captures are compared field
//! by field too (`cm_mads_agree_with_tshark`).
//!
//! tshark is installed by scripts/install-deps.sh. Without it this test fails, unless
//! SOFTRDMA_SKIP_TSHARK=1 says to skip it (for machines where it cannot be installed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use softrdma_conformance::shared_dir;
use softrdma_engine::wire::{CmMadRepr, CmMessage};
use softrdma_pcap::analyze::{summarize, FrameSummary};
use softrdma_pcap::{samples, PcapWriter, Reader, Resolution};

fn tshark_available() -> bool {
    if std::env::var_os("SOFTRDMA_SKIP_TSHARK").is_some() {
        eprintln!("SOFTRDMA_SKIP_TSHARK is set: tshark cross-check skipped");
        return false;
    }
    let ok = Command::new("tshark").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok, "tshark is not installed: run scripts/install-deps.sh (or set SOFTRDMA_SKIP_TSHARK=1)");
    true
}

/// Runs the shared extraction script; one map of non-empty fields per frame.
fn tshark_rows(file: &Path) -> Vec<HashMap<String, String>> {
    let script = shared_dir().join("reference/wire/tshark_extract.sh");
    rows(file, Command::new("sh").arg(&script).arg(file).output().expect("run tshark_extract.sh"))
}

/// tshark's tab-separated fields on `file` (a header row, then a row per frame): one map of
/// non-empty fields per frame.
fn rows(file: &Path, out: Output) -> Vec<HashMap<String, String>> {
    assert!(out.status.success(), "tshark failed on {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header row").split('\t').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split('\t'))
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad hex {s}")),
        None => s.parse().unwrap_or_else(|_| panic!("bad number {s}")),
    }
}

fn hexbytes(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap_or_else(|_| panic!("bad bytes {s}"))
}

fn ours(file: &Path) -> Vec<FrameSummary> {
    Reader::open(file)
        .expect("open")
        .map(|r| {
            let r = r.expect("record");
            summarize(r.index, r.linktype, &r.data, r.is_truncated())
        })
        .collect()
}

/// Records a mismatch when tshark shows a field with another value than softrdma's.
fn eq(bad: &mut Vec<String>, what: &str, theirs: Option<u64>, mine: Option<u64>) {
    if let Some(x) = theirs {
        if Some(x) != mine {
            bad.push(format!("{what}: tshark {x:#x}, softrdma {mine:x?}"));
        }
    }
}

/// Compares one frame; returns the mismatches.
fn compare(s: &FrameSummary, t: &HashMap<String, String>) -> Vec<String> {
    let mut bad = Vec::new();
    let get = |k: &str| t.get(k).map(|v| num(v));
    // Only the IB dissector's own verdict counts: a ULP heuristic (e.g. Mellanox EoIB on an empty
    // UD payload) may call the payload malformed.
    let tshark_malformed = t.get("_ws.malformed").is_some_and(|m| m.contains(": IB]"));
    let Some(ib) = &s.ib else {
        if t.contains_key("infiniband.bth.opcode") {
            bad.push("tshark sees an IB packet, softrdma does not".into());
        }
        return bad;
    };
    let rd = ib.headers.bth.is_some_and(|b| b.opcode.transport() == softrdma_engine::wire::Transport::Rd);
    if tshark_malformed && ib.error.is_none() && !s.truncated && !rd {
        bad.push("tshark: malformed, softrdma: no error".into());
    }
    let Some(b) = ib.headers.bth else {
        if t.contains_key("infiniband.bth.opcode") {
            bad.push("tshark read a BTH softrdma did not".into());
        }
        return bad;
    };
    if !t.contains_key("infiniband.bth.opcode") {
        bad.push("softrdma read a BTH tshark did not".into());
        return bad;
    }
    eq(&mut bad, "opcode", get("infiniband.bth.opcode"), Some(b.opcode.0.into()));
    eq(&mut bad, "se", get("infiniband.bth.se"), Some(b.solicited.into()));
    eq(&mut bad, "m", get("infiniband.bth.m"), Some(b.mig_req.into()));
    eq(&mut bad, "padcnt", get("infiniband.bth.padcnt"), Some(b.pad_count.into()));
    eq(&mut bad, "tver", get("infiniband.bth.tver"), Some(b.tver.into()));
    eq(&mut bad, "pkey", get("infiniband.bth.p_key"), Some(b.pkey.into()));
    eq(&mut bad, "destqp", get("infiniband.bth.destqp"), Some(b.dest_qp.value().into()));
    eq(&mut bad, "ackreq", get("infiniband.bth.a"), Some(b.ack_req.into()));
    eq(&mut bad, "psn", get("infiniband.bth.psn"), Some(b.psn.value().into()));
    // tshark shows the BTH byte holding FECN/BECN as "reserved".
    if let Some(r) = t.get("infiniband.reserved") {
        let byte = hexbytes(r) as u8;
        eq(&mut bad, "fecn", Some(u64::from(byte >> 7)), Some(b.fecn.into()));
        eq(&mut bad, "becn", Some(u64::from((byte >> 6) & 1)), Some(b.becn.into()));
    }
    // RD (opcodes 0x40-0x5f): tshark 4.0 reads the extension headers 8 bytes past the BTH, as in
    // Mellanox's DC transport (the only RD-space traffic in the wild: dc-small.pcap), while
    // softrdma lays RD out as IBTA Vol 1 9.2 specifies (BTH, RDETH, DETH, ...). Only the BTH is
    // compared for RD.
    if rd {
        return bad;
    }
    let h = &ib.headers;
    // tshark reuses the RETH fields for the AtomicETH's VA and R_Key.
    let va = h.reth.map(|x| x.va).or(h.atomiceth.map(|x| x.va));
    let rkey = h.reth.map(|x| u64::from(x.rkey)).or(h.atomiceth.map(|x| u64::from(x.rkey)));
    eq(&mut bad, "reth.va", get("infiniband.reth.va"), va);
    eq(&mut bad, "reth.rkey", get("infiniband.reth.r_key"), rkey);
    eq(&mut bad, "reth.dmalen", get("infiniband.reth.dmalen"), h.reth.map(|x| x.dma_len.into()));
    eq(&mut bad, "rdeth.eecnxt", get("infiniband.rdeth.eecnxt"), h.rdeth.map(|x| x.ee_context.into()));
    eq(&mut bad, "deth.qkey", get("infiniband.deth.q_key"), h.deth.map(|x| x.qkey.into()));
    eq(&mut bad, "deth.srcqp", get("infiniband.deth.srcqp"), h.deth.map(|x| x.src_qp.value().into()));
    eq(&mut bad, "atomiceth.swap", get("infiniband.atomiceth.swapdt"), h.atomiceth.map(|x| x.swap_add));
    eq(&mut bad, "atomiceth.cmp", get("infiniband.atomiceth.cmpdt"), h.atomiceth.map(|x| x.compare));
    eq(&mut bad, "aeth.syndrome", get("infiniband.aeth.syndrome"), h.aeth.map(|x| x.syndrome.to_byte().into()));
    eq(&mut bad, "aeth.msn", get("infiniband.aeth.msn"), h.aeth.map(|x| x.msn.value().into()));
    eq(&mut bad, "atomicacketh", get("infiniband.atomicacketh.origremdt"), h.atomicacketh.map(|x| x.orig_rem_data));
    eq(&mut bad, "immdt", t.get("infiniband.immdt").map(|v| hexbytes(v)), h.immdt.map(|x| x.imm.into()));
    eq(&mut bad, "ieth", t.get("infiniband.ieth").map(|v| hexbytes(v)), h.ieth.map(|x| x.rkey.into()));
    // tshark prints the ICRC's wire bytes read big-endian.
    let icrc = ib.icrc.map(|c| u64::from(u32::from_be_bytes(c)));
    if !s.truncated {
        eq(&mut bad, "icrc", get("infiniband.invariant.crc"), icrc);
    }
    // tshark's payload field includes the pad.
    if let (Some(d), false, Some(n)) = (t.get("data.data"), s.truncated, ib.payload_len) {
        eq(&mut bad, "payload+pad length", Some(d.len() as u64 / 2), Some((n + usize::from(b.pad_count)) as u64));
    }
    bad
}

fn cross_check(file: &Path) -> usize {
    let theirs = tshark_rows(file);
    let mine = ours(file);
    assert_eq!(theirs.len(), mine.len(), "{}: frame counts differ", file.display());
    let mut problems = Vec::new();
    let mut ib = 0;
    for (s, t) in mine.iter().zip(&theirs) {
        if t.contains_key("infiniband.bth.opcode") {
            ib += 1;
        }
        for p in compare(s, t) {
            problems.push(format!("{} frame {}: {p}", file.display(), s.frame));
        }
    }
    assert!(problems.is_empty(), "{} mismatches:\n{}", problems.len(), problems.join("\n"));
    ib
}

/// The shared captures (`*.pcap` in the shared captures directory), sorted.
fn captures() -> Vec<PathBuf> {
    let dir = shared_dir().join("captures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    files
}

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softrdma-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Every opcode our encoder emits, for several seeds, decodes the same in tshark.
#[test]
fn emitted_packets_of_every_opcode_agree_with_tshark() {
    if !tshark_available() {
        return;
    }
    for seed in [1u64, 2, 3, 0xfeed] {
        let frames = samples::every_opcode(seed);
        let path = temp_file(&format!("every-opcode-{seed}.pcap"));
        let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap(), Resolution::Micro).unwrap();
        for (i, f) in frames.iter().enumerate() {
            w.write_packet(i as u64 * 1000, &f.frame, f.frame.len() as u32).unwrap();
        }
        w.finish().unwrap();
        let n = cross_check(&path);
        assert_eq!(n, frames.len(), "tshark should see every frame as IB");
    }
}

/// The golden packets and the coverage set decode the same in tshark.
#[test]
fn golden_packets_agree_with_tshark() {
    if !tshark_available() {
        return;
    }
    let g = shared_dir().join("reference/wire/golden");
    for f in ["golden.pcap", "coverage.pcap", "cx4lx_cnp.pcap"] {
        cross_check(&g.join(f));
    }
}

/// Real captures (hardware and rxe) decode the same in tshark, truncated frames included.
#[test]
fn real_captures_agree_with_tshark() {
    if !tshark_available() {
        return;
    }
    let files = captures();
    assert!(files.len() >= 10, "captures missing in {}", shared_dir().join("captures").display());
    let mut total = 0;
    for f in &files {
        total += cross_check(f);
    }
    assert!(total > 3000, "only {total} IB frames compared");
}

// ---------------------------------------------------------------------------------------------
// CM MADs (IBTA Vol 1 ch. 12): every field tshark shows for a CM message must agree with our Repr.

/// The MAD header fields and every field tshark 4.0 has for CM messages. tshark 4.0 dissects REQ,
/// REP, RTU, REJ, DREQ and DREP only (it has no fields for MRA, SIDR, LAP or APR). Names from
/// `tshark -G fields | grep infiniband`.
const CM_FIELDS: &[&str] = &[
    "infiniband.mad.baseversion",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.classversion",
    "infiniband.mad.method",
    "infiniband.mad.status",
    "infiniband.mad.classspecific",
    "infiniband.mad.transactionid",
    "infiniband.mad.attributeid",
    "infiniband.mad.attributemodifier",
    // REQ.
    "infiniband.cm.req",
    "infiniband.cm.req.serviceid",
    "infiniband.cm.req.localcaguid",
    "infiniband.cm.req.localqkey",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.req.responderres",
    "infiniband.cm.req.localeecn",
    "infiniband.cm.req.initdepth",
    "infiniband.cm.req.remoteeecn",
    "infiniband.cm.req.remoteresptout",
    "infiniband.cm.req.transpsvctype",
    "infiniband.cm.req.e2eflowctrl",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.req.localresptout",
    "infiniband.cm.req.retrcount",
    "infiniband.cm.req.pkey",
    "infiniband.cm.req.pppmtu",
    "infiniband.cm.req.rdcexist",
    "infiniband.cm.req.rnrretrcount",
    "infiniband.cm.req.maxcmretr",
    "infiniband.cm.req.srq",
    "infiniband.cm.req.ext_transport",
    "infiniband.cm.req.prim_locallid",
    "infiniband.cm.req.prim_remotelid",
    "infiniband.cm.req.prim_localgid",
    "infiniband.cm.req.prim_remotegid",
    "infiniband.cm.req.prim_localgid_ipv4",
    "infiniband.cm.req.prim_remotegid_ipv4",
    "infiniband.cm.req.prim_flowlabel",
    "infiniband.cm.req.prim_pktrate",
    "infiniband.cm.req.prim_tfcclass",
    "infiniband.cm.req.prim_hoplim",
    "infiniband.cm.req.prim_sl",
    "infiniband.cm.req.prim_subnetlocal",
    "infiniband.cm.req.prim_localacktout",
    "infiniband.cm.req.alt_locallid",
    "infiniband.cm.req.alt_remotelid",
    "infiniband.cm.req.alt_localgid",
    "infiniband.cm.req.alt_remotegid",
    "infiniband.cm.req.alt_flowlabel",
    "infiniband.cm.req.alt_pktrate",
    "infiniband.cm.req.alt_tfcclass",
    "infiniband.cm.req.alt_hoplim",
    "infiniband.cm.req.alt_sl",
    "infiniband.cm.req.alt_subnetlocal",
    "infiniband.cm.req.alt_localacktout",
    "infiniband.cm.req.private",
    "infiniband.cm.req.ip_cm",
    "infiniband.cm.req.ip_cm.majv",
    "infiniband.cm.req.ip_cm.minv",
    "infiniband.cm.req.ip_cm.ipv",
    "infiniband.cm.req.ip_cm.sport",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
    "infiniband.cm.req.ip_cm.sip6",
    "infiniband.cm.req.ip_cm.dip6",
    "infiniband.cm.req.ip_cm.private",
    // REP.
    "infiniband.cm.rep",
    "infiniband.cm.rep.remotecommid",
    "infiniband.cm.rep.localqkey",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.localeecn",
    "infiniband.cm.rep.startpsn",
    "infiniband.cm.rep.respres",
    "infiniband.cm.rep.initdepth",
    "infiniband.cm.rep.tgtackdelay",
    "infiniband.cm.rep.failoveracc",
    "infiniband.cm.rep.e2eflowctrl",
    "infiniband.cm.rep.rnrretrcount",
    "infiniband.cm.rep.srq",
    "infiniband.cm.rep.localcaguid",
    "infiniband.cm.rep.private",
    // RTU.
    "infiniband.cm.rtu.localcommid",
    "infiniband.cm.rtu.remotecommid",
    "infiniband.cm.rtu.private",
    // REJ.
    "infiniband.cm.rej.localcommid",
    "infiniband.cm.rej.remotecommid",
    "infiniband.cm.rej.msgrej",
    "infiniband.cm.rej.rejinfolen",
    "infiniband.cm.rej.reason",
    "infiniband.cm.rej.ari",
    "infiniband.cm.rej.private",
    // DREQ (tshark files its Remote QPN/EECN under "req").
    "infiniband.cm.dreq.localcommid",
    "infiniband.cm.dreq.remotecommid",
    "infiniband.cm.req.remoteqpneecn",
    "infiniband.cm.dreq.private",
    // DREP.
    "infiniband.cm.drsp.localcommid",
    "infiniband.cm.drsp.remotecommid",
    "infiniband.cm.drsp.private",
];

/// tshark's CM fields, one map of non-empty fields per frame; the same ULP heuristics disabled as
/// in the shared extraction script (`--disable-protocol rpcordma` above all).
fn tshark_cm_rows(file: &Path) -> Vec<HashMap<String, String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-n").arg("-r").arg(file);
    for p in ["rpcordma", "smb_direct", "nvme-rdma", "iser", "lnet", "smc", "infiniband_sdp", "fcoib"] {
        cmd.args(["--disable-protocol", p]);
    }
    cmd.args(["-T", "fields", "-E", "header=y", "-E", "separator=/t", "-E", "occurrence=f", "-e", "frame.number"]);
    for f in CM_FIELDS {
        cmd.args(["-e", f]);
    }
    rows(file, cmd.output().expect("run tshark"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Compares CM fields of one MAD: numbers, and byte strings (hex) or addresses as text.
struct CmCheck<'a> {
    t: &'a HashMap<String, String>,
    bad: Vec<String>,
    compared: usize,
}

impl CmCheck<'_> {
    fn num(&mut self, field: &str, mine: impl Into<u64>) {
        if let Some(v) = self.t.get(field) {
            self.compared += 1;
            let (theirs, mine) = (num(v), mine.into());
            if theirs != mine {
                self.bad.push(format!("{field}: tshark {theirs:#x}, softrdma {mine:#x}"));
            }
        }
    }
    fn text(&mut self, field: &str, mine: &str) {
        if let Some(v) = self.t.get(field) {
            self.compared += 1;
            if v != mine {
                self.bad.push(format!("{field}: tshark {v}, softrdma {mine}"));
            }
        }
    }
    /// A GID: tshark shows an IPv4-mapped one as the IPv4 address (`*_ipv4`), others as IPv6 text.
    fn gid(&mut self, field: &str, mine: [u8; 16]) {
        let v6 = std::net::Ipv6Addr::from(mine);
        self.text(field, &v6.to_string());
        match v6.to_ipv4_mapped() {
            Some(v4) => self.text(&format!("{field}_ipv4"), &v4.to_string()),
            None => assert!(!self.t.contains_key(&format!("{field}_ipv4")), "{field}: tshark saw IPv4"),
        }
    }
    /// The flow label / packet rate word (IBTA Vol 1 12.6.5: flow label 20 bits, 6 reserved, rate
    /// 6 bits). tshark 4.0.17 misdecodes it (../shared/reference/cm/README.md, "tshark bug": it
    /// shows 0x2bb / 0x2b for the raw bytes `2b ba 00 06`): it takes the flow label from the three
    /// bytes at the word's start and the rate from its first byte. So our values are checked
    /// against the raw bytes, and tshark's must be either right or exactly that misreading (a
    /// fixed tshark passes; any other disagreement is reported).
    fn flow_label_and_rate(&mut self, prefix: &str, raw: [u8; 4], flow_label: u32, rate: u8) {
        let raw_flow = (u32::from(raw[0]) << 12) | (u32::from(raw[1]) << 4) | (u32::from(raw[2]) >> 4);
        let raw_rate = raw[3] & 0x3f;
        if (flow_label, rate) != (raw_flow, raw_rate) {
            self.bad.push(format!(
                "{prefix} flow label/rate: raw {raw_flow:#x}/{raw_rate}, softrdma {flow_label:#x}/{rate}"
            ));
        }
        let misread_flow = u64::from(u32::from_be_bytes([0, raw[0], raw[1], raw[2]]) >> 12);
        let misread_rate = u64::from(raw[0] & 0x3f);
        for (field, right, misread) in [
            (format!("{prefix}_flowlabel"), u64::from(flow_label), misread_flow),
            (format!("{prefix}_pktrate"), u64::from(rate), misread_rate),
        ] {
            if let Some(v) = self.t.get(&field) {
                self.compared += 1;
                let theirs = num(v);
                if theirs != right && theirs != misread {
                    self.bad
                        .push(format!("{field}: tshark {theirs:#x}, softrdma {right:#x}, raw misread {misread:#x}"));
                }
            }
        }
    }
}

/// Compares one CM MAD (`mad`: its 256 raw bytes) with tshark's fields.
fn compare_cm(mad: &[u8], repr: &CmMadRepr, t: &HashMap<String, String>) -> (Vec<String>, usize) {
    let mut c = CmCheck { t, bad: Vec::new(), compared: 0 };
    c.num("infiniband.mad.baseversion", 1u8);
    c.num("infiniband.mad.mgmtclass", 0x07u8);
    c.num("infiniband.mad.classversion", 2u8);
    c.num("infiniband.mad.method", 0x03u8);
    c.num("infiniband.mad.status", 0u8);
    c.num("infiniband.mad.classspecific", 0u8);
    c.num("infiniband.mad.transactionid", repr.tid);
    c.num("infiniband.mad.attributeid", u16::from(repr.msg.attr()));
    c.num("infiniband.mad.attributemodifier", repr.attr_mod);
    let data = &mad[24..];
    match &repr.msg {
        CmMessage::Req(r) => {
            c.num("infiniband.cm.req", r.local_comm_id);
            c.num("infiniband.cm.req.serviceid", r.service_id);
            c.num("infiniband.cm.req.localcaguid", r.local_ca_guid);
            c.num("infiniband.cm.req.localqkey", r.local_qkey);
            c.num("infiniband.cm.req.localqpn", r.local_qpn);
            c.num("infiniband.cm.req.responderres", r.responder_resources);
            c.num("infiniband.cm.req.localeecn", r.local_eecn);
            c.num("infiniband.cm.req.initdepth", r.initiator_depth);
            c.num("infiniband.cm.req.remoteeecn", r.remote_eecn);
            c.num("infiniband.cm.req.remoteresptout", r.remote_cm_response_timeout);
            c.num("infiniband.cm.req.transpsvctype", r.transport);
            c.num("infiniband.cm.req.e2eflowctrl", r.e2e_flow_control);
            c.num("infiniband.cm.req.startpsn", r.starting_psn);
            c.num("infiniband.cm.req.localresptout", r.local_cm_response_timeout);
            c.num("infiniband.cm.req.retrcount", r.retry_count);
            c.num("infiniband.cm.req.pkey", r.pkey);
            c.num("infiniband.cm.req.pppmtu", r.path_mtu);
            c.num("infiniband.cm.req.rdcexist", r.rdc_exists);
            c.num("infiniband.cm.req.rnrretrcount", r.rnr_retry_count);
            c.num("infiniband.cm.req.maxcmretr", r.max_cm_retries);
            c.num("infiniband.cm.req.srq", r.srq);
            c.num("infiniband.cm.req.ext_transport", r.extended_transport);
            // The path blocks: REQ bytes 52-95 (primary) and 96-139 (alternate).
            for (prefix, p, at) in [("prim", &r.primary_path, 52), ("alt", &r.alternate_path, 96)] {
                let f = |name: &str| format!("infiniband.cm.req.{prefix}_{name}");
                c.num(&f("locallid"), p.local_lid);
                c.num(&f("remotelid"), p.remote_lid);
                if prefix == "prim" {
                    c.gid(&f("localgid"), p.local_gid);
                    c.gid(&f("remotegid"), p.remote_gid);
                } else {
                    // tshark shows the alternate GIDs as plain bytes.
                    c.text(&f("localgid"), &hex(&p.local_gid));
                    c.text(&f("remotegid"), &hex(&p.remote_gid));
                }
                let word = [data[at + 36], data[at + 37], data[at + 38], data[at + 39]];
                c.flow_label_and_rate(&format!("infiniband.cm.req.{prefix}"), word, p.flow_label, p.packet_rate);
                c.num(&f("tfcclass"), p.traffic_class);
                c.num(&f("hoplim"), p.hop_limit);
                c.num(&f("sl"), p.sl);
                c.num(&f("subnetlocal"), p.subnet_local);
                c.num(&f("localacktout"), p.local_ack_timeout);
            }
            // Private data: tshark shows it whole (`private`), or, when it reads an IP CM header,
            // whole as `ip_cm` with the header's fields and the consumer data after it.
            c.text("infiniband.cm.req.private", &hex(&r.private_data));
            c.text("infiniband.cm.req.ip_cm", &hex(&r.private_data));
            if t.contains_key("infiniband.cm.req.ip_cm") {
                let h = repr.msg.cma_hdr().expect("tshark reads an IP CM header, softrdma does not");
                c.num("infiniband.cm.req.ip_cm.majv", 0u8);
                c.num("infiniband.cm.req.ip_cm.minv", 0u8);
                c.num("infiniband.cm.req.ip_cm.ipv", if h.src.is_ipv4() { 4u8 } else { 6 });
                c.num("infiniband.cm.req.ip_cm.sport", h.port);
                let (sip, dip) = if h.src.is_ipv4() { ("sip4", "dip4") } else { ("sip6", "dip6") };
                c.text(&format!("infiniband.cm.req.ip_cm.{sip}"), &h.src.to_string());
                c.text(&format!("infiniband.cm.req.ip_cm.{dip}"), &h.dst.to_string());
                c.text("infiniband.cm.req.ip_cm.private", &hex(&r.private_data[36..]));
            }
        }
        CmMessage::Rep(r) => {
            c.num("infiniband.cm.rep", r.local_comm_id);
            c.num("infiniband.cm.rep.remotecommid", r.remote_comm_id);
            c.num("infiniband.cm.rep.localqkey", r.local_qkey);
            c.num("infiniband.cm.rep.localqpn", r.local_qpn);
            c.num("infiniband.cm.rep.localeecn", r.local_eecn);
            c.num("infiniband.cm.rep.startpsn", r.starting_psn);
            c.num("infiniband.cm.rep.respres", r.responder_resources);
            c.num("infiniband.cm.rep.initdepth", r.initiator_depth);
            c.num("infiniband.cm.rep.tgtackdelay", r.target_ack_delay);
            c.num("infiniband.cm.rep.failoveracc", r.failover_accepted);
            c.num("infiniband.cm.rep.e2eflowctrl", r.e2e_flow_control);
            c.num("infiniband.cm.rep.rnrretrcount", r.rnr_retry_count);
            c.num("infiniband.cm.rep.srq", r.srq);
            c.num("infiniband.cm.rep.localcaguid", r.local_ca_guid);
            c.text("infiniband.cm.rep.private", &hex(&r.private_data));
        }
        CmMessage::Rtu(r) => {
            c.num("infiniband.cm.rtu.localcommid", r.local_comm_id);
            c.num("infiniband.cm.rtu.remotecommid", r.remote_comm_id);
            c.text("infiniband.cm.rtu.private", &hex(&r.private_data));
        }
        CmMessage::Rej(r) => {
            c.num("infiniband.cm.rej.localcommid", r.local_comm_id);
            c.num("infiniband.cm.rej.remotecommid", r.remote_comm_id);
            c.num("infiniband.cm.rej.msgrej", r.msg_rejected);
            c.num("infiniband.cm.rej.rejinfolen", r.reject_info_len);
            c.num("infiniband.cm.rej.reason", r.reason);
            c.text("infiniband.cm.rej.ari", &hex(&r.ari));
            c.text("infiniband.cm.rej.private", &hex(&r.private_data));
        }
        CmMessage::Dreq(r) => {
            c.num("infiniband.cm.dreq.localcommid", r.local_comm_id);
            c.num("infiniband.cm.dreq.remotecommid", r.remote_comm_id);
            c.num("infiniband.cm.req.remoteqpneecn", r.remote_qpn);
            c.text("infiniband.cm.dreq.private", &hex(&r.private_data));
        }
        CmMessage::Drep(r) => {
            c.num("infiniband.cm.drsp.localcommid", r.local_comm_id);
            c.num("infiniband.cm.drsp.remotecommid", r.remote_comm_id);
            c.text("infiniband.cm.drsp.private", &hex(&r.private_data));
        }
        // tshark 4.0 has no fields for these: only the MAD header is compared.
        CmMessage::Mra(_) | CmMessage::SidrReq(_) | CmMessage::SidrRep(_) | CmMessage::Lap(_) | CmMessage::Apr(_) => {}
    }
    (c.bad, c.compared)
}

/// Every CM MAD of the shared captures: tshark and softrdma see the same MADs on the same frames,
/// and every field tshark shows agrees with the Repr.
#[test]
fn cm_mads_agree_with_tshark() {
    if !tshark_available() {
        return;
    }
    let files = captures();
    let mut problems = Vec::new();
    let mut mads = 0;
    for file in &files {
        let theirs = tshark_cm_rows(file);
        let records: Vec<_> = Reader::open(file).expect("open").map(|r| r.expect("record")).collect();
        assert_eq!(theirs.len(), records.len(), "{}: frame counts differ", file.display());
        for (r, t) in records.iter().zip(&theirs) {
            let s = summarize(r.index, r.linktype, &r.data, r.is_truncated());
            let tshark_cm = t.get("infiniband.mad.mgmtclass").is_some_and(|c| num(c) == 0x07);
            let ours = s.ib.as_ref().and_then(|ib| ib.cm.as_ref());
            let at = format!("{} frame {}", file.display(), r.index);
            match (ours, tshark_cm) {
                (Some(Ok(repr)), true) => {
                    // The MAD is the UD payload: the 256 bytes before the ICRC (no pad, no trailer).
                    let mad = &r.data[r.data.len() - 260..r.data.len() - 4];
                    let (bad, compared) = compare_cm(mad, repr, t);
                    assert!(compared >= 12, "{at}: only {compared} tshark fields compared");
                    problems.extend(bad.into_iter().map(|p| format!("{at}: {p}")));
                    mads += 1;
                }
                (Some(Ok(_)), false) => problems.push(format!("{at}: softrdma reads a CM MAD, tshark does not")),
                (Some(Err(e)), true) => problems.push(format!("{at}: tshark reads a CM MAD, softrdma: {e}")),
                (None, true) => problems.push(format!("{at}: tshark reads a CM MAD on a frame softrdma skips")),
                (Some(Err(_)) | None, false) => {}
            }
        }
    }
    assert!(problems.is_empty(), "{} mismatches:\n{}", problems.len(), problems.join("\n"));
    // REQ, REP, RTU, DREQ, DREP in each of write, read2, send and nvme-discover2.
    assert_eq!(mads, 20, "CM MADs compared");
}
