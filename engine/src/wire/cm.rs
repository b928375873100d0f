//! A whole CM MAD (IBTA Vol 1 12.6): the MAD common header of the CM class and one of the eleven
//! messages, as values.
//!
//! [`CmMadRepr::parse`] takes untrusted bytes (a UD SEND payload received on QP1) and never panics:
//! it requires a 256-byte MAD of base version 1, class 0x07, class version 2, method Send and a
//! known attribute. [`CmMadRepr::emit`] writes all 256 bytes, unused ones zero.
//!
//! These two are the top-level entry: their `parse` and `emit` take byte slices (the MAD, or
//! its data area), where every other CM `Repr` takes the view of its own header.

use super::cm_apr::{CmAprPacket, CmAprRepr};
use super::cm_drep::{CmDrepPacket, CmDrepRepr};
use super::cm_dreq::{CmDreqPacket, CmDreqRepr};
use super::cm_lap::{CmLapPacket, CmLapRepr};
use super::cm_mra::{CmMraPacket, CmMraRepr};
use super::cm_rej::{CmRejPacket, CmRejRepr};
use super::cm_rep::{CmRepPacket, CmRepRepr};
use super::cm_req::{CmReqPacket, CmReqRepr};
use super::cm_rtu::{CmRtuPacket, CmRtuRepr};
use super::cm_sidr_rep::{CmSidrRepPacket, CmSidrRepRepr};
use super::cm_sidr_req::{CmSidrReqPacket, CmSidrReqRepr};
use super::cma_hdr::{CmaHdrPacket, CmaHdrRepr};
use super::mad::{
    CmAttr, MadPacket, MadRepr, CM_CLASS_VERSION, MAD_BASE_VERSION, MAD_DATA_LEN, MAD_LEN, MAD_METHOD_SEND,
    MGMT_CLASS_CM,
};
use super::{Error, Result};

/// `msg_rejected` / `msg_mraed` value: the REQ (IBTA Vol 1 tables 107 and 108).
pub const CM_MSG_REQ: u8 = 0;
/// `msg_rejected` / `msg_mraed` value: the REP.
pub const CM_MSG_REP: u8 = 1;
/// `msg_rejected` / `msg_mraed` value: other (a LAP).
pub const CM_MSG_OTHER: u8 = 2;

/// One CM message, by attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// REQ (attribute 0x0010).
    Req(CmReqRepr),
    /// MRA (0x0011).
    Mra(CmMraRepr),
    /// REJ (0x0012).
    Rej(CmRejRepr),
    /// REP (0x0013).
    Rep(CmRepRepr),
    /// RTU (0x0014).
    Rtu(CmRtuRepr),
    /// DREQ (0x0015).
    Dreq(CmDreqRepr),
    /// DREP (0x0016).
    Drep(CmDrepRepr),
    /// SIDR_REQ (0x0017).
    SidrReq(CmSidrReqRepr),
    /// SIDR_REP (0x0018).
    SidrRep(CmSidrRepRepr),
    /// LAP (0x0019).
    Lap(CmLapRepr),
    /// APR (0x001A).
    Apr(CmAprRepr),
}

impl CmMessage {
    /// The attribute ID that carries this message.
    pub fn attr(&self) -> CmAttr {
        match self {
            CmMessage::Req(_) => CmAttr::Req,
            CmMessage::Mra(_) => CmAttr::Mra,
            CmMessage::Rej(_) => CmAttr::Rej,
            CmMessage::Rep(_) => CmAttr::Rep,
            CmMessage::Rtu(_) => CmAttr::Rtu,
            CmMessage::Dreq(_) => CmAttr::Dreq,
            CmMessage::Drep(_) => CmAttr::Drep,
            CmMessage::SidrReq(_) => CmAttr::SidrReq,
            CmMessage::SidrRep(_) => CmAttr::SidrRep,
            CmMessage::Lap(_) => CmAttr::Lap,
            CmMessage::Apr(_) => CmAttr::Apr,
        }
    }

    /// The sender's Local Communication ID (for SIDR, the Request ID).
    pub fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(m) => m.request_id,
            CmMessage::Lap(m) => m.local_comm_id,
            CmMessage::Apr(m) => m.local_comm_id,
        }
    }

    /// The Remote Communication ID, for the messages that carry one (all but REQ and SIDR).
    pub fn remote_comm_id(&self) -> Option<u32> {
        match self {
            CmMessage::Req(_) | CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => None,
            CmMessage::Mra(m) => Some(m.remote_comm_id),
            CmMessage::Rej(m) => Some(m.remote_comm_id),
            CmMessage::Rep(m) => Some(m.remote_comm_id),
            CmMessage::Rtu(m) => Some(m.remote_comm_id),
            CmMessage::Dreq(m) => Some(m.remote_comm_id),
            CmMessage::Drep(m) => Some(m.remote_comm_id),
            CmMessage::Lap(m) => Some(m.remote_comm_id),
            CmMessage::Apr(m) => Some(m.remote_comm_id),
        }
    }

    /// The Service ID, for REQ, SIDR_REQ and SIDR_REP.
    pub fn service_id(&self) -> Option<u64> {
        match self {
            CmMessage::Req(m) => Some(m.service_id),
            CmMessage::SidrReq(m) => Some(m.service_id),
            CmMessage::SidrRep(m) => Some(m.service_id),
            _ => None,
        }
    }

    /// The whole private-data area of the message.
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmMessage::Req(m) => &m.private_data,
            CmMessage::Mra(m) => &m.private_data,
            CmMessage::Rej(m) => &m.private_data,
            CmMessage::Rep(m) => &m.private_data,
            CmMessage::Rtu(m) => &m.private_data,
            CmMessage::Dreq(m) => &m.private_data,
            CmMessage::Drep(m) => &m.private_data,
            CmMessage::SidrReq(m) => &m.private_data,
            CmMessage::SidrRep(m) => &m.private_data,
            CmMessage::Lap(m) => &m.private_data,
            CmMessage::Apr(m) => &m.private_data,
        }
    }

    /// The rdma_cm IP header opening the private data of a REQ or SIDR_REQ, when it parses as one
    /// (Linux `cma.c`: other messages and AF_IB connections carry none).
    pub fn cma_hdr(&self) -> Option<CmaHdrRepr> {
        let data = match self {
            CmMessage::Req(m) => &m.private_data,
            CmMessage::SidrReq(m) => &m.private_data,
            _ => return None,
        };
        CmaHdrRepr::parse(&CmaHdrPacket::new_checked(&data[..]).ok()?).ok()
    }

    /// Reads the message `attr` names from the MAD data area (the 232 bytes after the header).
    pub fn parse(attr: CmAttr, data: &[u8]) -> Result<CmMessage> {
        Ok(match attr {
            CmAttr::Req => CmMessage::Req(CmReqRepr::parse(&CmReqPacket::new_checked(data)?)?),
            CmAttr::Mra => CmMessage::Mra(CmMraRepr::parse(&CmMraPacket::new_checked(data)?)?),
            CmAttr::Rej => CmMessage::Rej(CmRejRepr::parse(&CmRejPacket::new_checked(data)?)?),
            CmAttr::Rep => CmMessage::Rep(CmRepRepr::parse(&CmRepPacket::new_checked(data)?)?),
            CmAttr::Rtu => CmMessage::Rtu(CmRtuRepr::parse(&CmRtuPacket::new_checked(data)?)?),
            CmAttr::Dreq => CmMessage::Dreq(CmDreqRepr::parse(&CmDreqPacket::new_checked(data)?)?),
            CmAttr::Drep => CmMessage::Drep(CmDrepRepr::parse(&CmDrepPacket::new_checked(data)?)?),
            CmAttr::SidrReq => CmMessage::SidrReq(CmSidrReqRepr::parse(&CmSidrReqPacket::new_checked(data)?)?),
            CmAttr::SidrRep => CmMessage::SidrRep(CmSidrRepRepr::parse(&CmSidrRepPacket::new_checked(data)?)?),
            CmAttr::Lap => CmMessage::Lap(CmLapRepr::parse(&CmLapPacket::new_checked(data)?)?),
            CmAttr::Apr => CmMessage::Apr(CmAprRepr::parse(&CmAprPacket::new_checked(data)?)?),
            CmAttr::Unknown(_) => return Err(Error::Malformed("unknown CM attribute")),
        })
    }

    /// Writes the message into the MAD data area (at least 232 bytes), unused bytes zero.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        match self {
            CmMessage::Req(m) => m.emit(&mut CmReqPacket::new_checked(data)?),
            CmMessage::Mra(m) => m.emit(&mut CmMraPacket::new_checked(data)?),
            CmMessage::Rej(m) => m.emit(&mut CmRejPacket::new_checked(data)?),
            CmMessage::Rep(m) => m.emit(&mut CmRepPacket::new_checked(data)?),
            CmMessage::Rtu(m) => m.emit(&mut CmRtuPacket::new_checked(data)?),
            CmMessage::Dreq(m) => m.emit(&mut CmDreqPacket::new_checked(data)?),
            CmMessage::Drep(m) => m.emit(&mut CmDrepPacket::new_checked(data)?),
            CmMessage::SidrReq(m) => m.emit(&mut CmSidrReqPacket::new_checked(data)?),
            CmMessage::SidrRep(m) => m.emit(&mut CmSidrRepPacket::new_checked(data)?),
            CmMessage::Lap(m) => m.emit(&mut CmLapPacket::new_checked(data)?),
            CmMessage::Apr(m) => m.emit(&mut CmAprPacket::new_checked(data)?),
        }
    }
}

/// A CM MAD as values: what the common header says beyond the fixed CM class values, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMadRepr {
    /// TransactionID. Linux sets it to `(agent hi_tid << 32) | local comm ID` (in CPU byte order);
    /// REP and RTU reuse the REQ's, DREP and REJ echo the one they answer.
    pub tid: u64,
    /// AttributeModifier (0 unless ECE is in use).
    pub attr_mod: u32,
    /// The message; its attribute ID is [`CmMessage::attr`].
    pub msg: CmMessage,
}

impl CmMadRepr {
    /// Reads a CM MAD from untrusted bytes. The MAD must be at least 256 bytes (more is ignored),
    /// of base version 1, class CM (0x07), class version 2 and method Send (IBTA Vol 1 12.6.1:
    /// CM uses only Send; Linux `mad.c` drops others), and carry a known CM attribute.
    /// The status and class-specific fields are not checked.
    pub fn parse(mad: &[u8]) -> Result<CmMadRepr> {
        if mad.len() < MAD_LEN {
            return Err(Error::Truncated("CM MAD"));
        }
        let packet = MadPacket::new_checked(&mad[..MAD_LEN])?;
        let header = MadRepr::parse(&packet)?;
        if header.base_version != MAD_BASE_VERSION {
            return Err(Error::Malformed("MAD base version is not 1"));
        }
        if header.mgmt_class != MGMT_CLASS_CM {
            return Err(Error::Malformed("MAD class is not CM (0x07)"));
        }
        if header.class_version != CM_CLASS_VERSION {
            return Err(Error::Malformed("CM class version is not 2"));
        }
        if header.method != MAD_METHOD_SEND {
            return Err(Error::Malformed("CM MAD method is not Send"));
        }
        let msg = CmMessage::parse(CmAttr::from(header.attr_id), packet.payload())?;
        Ok(CmMadRepr { tid: header.tid, attr_mod: header.attr_mod, msg })
    }

    /// Bytes the MAD takes.
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes the 256-byte MAD into `buf[..256]`: the header (base version 1, class 0x07, class
    /// version 2, method Send, status and class-specific 0, the message's attribute ID), the
    /// message, and zeros everywhere else. Fails, writing nothing, when `buf` is short or a value
    /// does not fit its field (private data longer than its area, a QPN wider than 24 bits, ...).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < MAD_LEN {
            return Err(Error::Truncated("CM MAD"));
        }
        let mut data = [0u8; MAD_DATA_LEN];
        self.msg.emit(&mut data)?;
        let header = MadRepr {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: MAD_METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid: self.tid,
            attr_id: self.msg.attr().into(),
            attr_mod: self.attr_mod,
        };
        let mut packet = MadPacket::new_unchecked(&mut buf[..MAD_LEN]);
        header.emit(&mut packet)?;
        packet.payload_mut().copy_from_slice(&data);
        Ok(())
    }
}

/// Fails with `what` when `v` needs more than `width` bits (an emit-time check of a Repr value).
pub(super) fn check_width(v: impl Into<u64>, width: u32, what: &'static str) -> Result<()> {
    if v.into() >> width != 0 {
        Err(Error::Malformed(what))
    } else {
        Ok(())
    }
}

/// Fails with `what` when `data` is longer than an area of `len` bytes.
pub(super) fn check_area(data: &[u8], len: usize, what: &'static str) -> Result<()> {
    if data.len() > len {
        Err(Error::Malformed(what))
    } else {
        Ok(())
    }
}

/// Writes `data` at the start of an area and zeroes the rest of it (the caller checked its length).
pub(super) fn write_area(area: &mut [u8], data: &[u8]) {
    area[..data.len()].copy_from_slice(data);
    area[data.len()..].fill(0);
}

/// Test support: the CM MADs of the hardware captures in `../shared/reference/cm/*.cm.hex`, and a
/// whole-MAD round trip for the messages no capture holds.
#[cfg(test)]
pub(crate) mod captured {
    /// Offset of the MAD in a captured frame: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + DETH 8.
    const MAD_OFFSET: usize = 62;

    /// The frames of a `.cm.hex` file: tshark hex dumps (`-x`), one frame per blank-line-separated
    /// block; each line is a 4-digit offset, two spaces, up to 16 hex bytes, then the ASCII column.
    pub(crate) fn frames(name: &str) -> Vec<Vec<u8>> {
        let path = format!("{}/../../shared/reference/cm/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut frames = vec![];
        let mut cur = vec![];
        for line in text.lines() {
            if line.trim().is_empty() {
                if !cur.is_empty() {
                    frames.push(std::mem::take(&mut cur));
                }
                continue;
            }
            let hex = line.get(6..line.len().min(54)).unwrap_or("");
            cur.extend(hex.split_whitespace().map(|t| u8::from_str_radix(t, 16).unwrap()));
        }
        if !cur.is_empty() {
            frames.push(cur);
        }
        frames
    }

    /// The 256-byte MADs of a `.cm.hex` file, in capture order (REQ, REP, RTU, DREQ, DREP).
    pub(crate) fn mads(name: &str) -> Vec<Vec<u8>> {
        frames(name).into_iter().map(|f| f[MAD_OFFSET..MAD_OFFSET + 256].to_vec()).collect()
    }

    /// A MAD data area: `prefix` followed by zeros up to 232 bytes.
    pub(crate) fn data_area(prefix: &[u8]) -> Vec<u8> {
        area(super::MAD_DATA_LEN, prefix)
    }

    /// An area of `len` bytes: `prefix` followed by zeros.
    pub(crate) fn area(len: usize, prefix: &[u8]) -> Vec<u8> {
        let mut v = prefix.to_vec();
        v.resize(len, 0);
        v
    }

    /// The GID of an IPv4 address (`::ffff:a.b.c.d`, as RoCE path GIDs are).
    pub(crate) fn mapped(a: [u8; 4]) -> [u8; 16] {
        core::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
    }

    /// A header generated by [`cm_header!`] (a CM message or a REQ path block), as the tests
    /// below see it.
    pub(crate) trait Header: Sized + Clone + PartialEq + core::fmt::Debug {
        /// Bytes of the view.
        const LEN: usize;
        /// Reads the values from `b` (through a checked view).
        fn parse_bytes(b: &[u8]) -> crate::wire::Result<Self>;
        /// Builds a checked view of `b`, dropping it.
        fn check_len_of(b: &[u8]) -> crate::wire::Result<()>;
        /// Emits the values into `b`.
        fn emit_bytes(&self, b: &mut [u8]) -> crate::wire::Result<()>;
        /// Calls each field's setter (or writes its area) with the values, and nothing else.
        fn write_each(&self, b: &mut [u8]) -> crate::wire::Result<()>;
        /// Asserts that each field's getter of a view of `b` reads the values.
        fn assert_reads(&self, b: &[u8]);
        /// The values with the trailing zeros of each area cut off.
        fn trimmed(&self) -> Self;
    }

    /// `bytes` followed by zeros up to the length of `H`'s view.
    fn padded<H: Header>(bytes: &[u8]) -> Vec<u8> {
        assert!(bytes.len() <= H::LEN);
        let mut v = bytes.to_vec();
        v.resize(H::LEN, 0);
        v
    }

    /// Each getter of a view of `bytes` (zero-padded) reads its value in `expected`.
    pub(crate) fn deconstruct<H: Header>(bytes: &[u8], expected: &H) {
        expected.assert_reads(&padded::<H>(bytes));
    }

    /// The setters, given the values of `expected` on a zeroed buffer, write `bytes` (zero-padded).
    pub(crate) fn construct<H: Header>(bytes: &[u8], expected: &H) {
        let mut b = vec![0u8; H::LEN];
        expected.write_each(&mut b).unwrap();
        assert_eq!(b, padded::<H>(bytes));
    }

    /// `bytes` (zero-padded) parse as `expected`, and a view of any shorter buffer is refused as a
    /// truncated `what`.
    pub(crate) fn parse<H: Header>(what: &'static str, bytes: &[u8], expected: &H) {
        let b = padded::<H>(bytes);
        assert_eq!(H::parse_bytes(&b), Ok(expected.clone()));
        for n in 0..H::LEN {
            assert_eq!(H::check_len_of(&b[..n]), Err(crate::wire::Error::Truncated(what)), "{n} bytes");
        }
    }

    /// `expected` emits `bytes` (zero-padded) over a buffer of `fill` bytes, and so does it with
    /// its areas cut short (they are zero-padded); each of `bad` fails as malformed, writing nothing.
    pub(crate) fn emit<H: Header>(bytes: &[u8], expected: &H, fill: u8, bad: &[H]) {
        let want = padded::<H>(bytes);
        let mut b = vec![fill; H::LEN];
        expected.emit_bytes(&mut b).unwrap();
        assert_eq!(b, want);
        b.fill(fill);
        expected.trimmed().emit_bytes(&mut b).unwrap();
        assert_eq!(b, want, "short areas are zero-padded");
        for r in bad {
            assert!(matches!(r.emit_bytes(&mut b), Err(crate::wire::Error::Malformed(_))), "{r:?}");
            assert_eq!(b, want, "a failed emit writes nothing: {r:?}");
        }
    }

    /// The tests `deconstruct`, `construct`, `parse` and `emit` (the functions of these names
    /// above) of a header whose view names itself `$what` in its errors, read from `$bytes`
    /// (zero-padded to its length) as `$repr`, emitted over `$fill` bytes, and which refuses to
    /// emit each of the `bad` values.
    macro_rules! header_tests {
        ($what:literal, $bytes:expr, $repr:expr, $fill:literal $(, bad: [$($bad:expr),* $(,)?])? $(,)?) => {
            #[test]
            fn deconstruct() {
                $crate::wire::cm::captured::deconstruct(&$bytes, &$repr);
            }

            #[test]
            fn construct() {
                $crate::wire::cm::captured::construct(&$bytes, &$repr);
            }

            #[test]
            fn parse() {
                $crate::wire::cm::captured::parse($what, &$bytes, &$repr);
            }

            #[test]
            fn emit() {
                $crate::wire::cm::captured::emit(&$bytes, &$repr, $fill, &[$($($bad),*)?]);
            }
        };
    }
    pub(crate) use header_tests;

    /// Emits `msg` in a whole MAD with TID `tid`, checks that the attribute ID names it, and that
    /// the MAD parses back equal.
    pub(crate) fn mad_round_trip(tid: u64, msg: super::CmMessage) {
        let mad = super::CmMadRepr { tid, attr_mod: 0, msg };
        let mut b = [0u8; 256];
        mad.emit(&mut b).unwrap();
        assert_eq!(u16::from_be_bytes([b[16], b[17]]), u16::from(mad.msg.attr()));
        assert_eq!(super::CmMadRepr::parse(&b), Ok(mad));
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm_dreq::CmDreqRepr;

    #[test]
    fn every_captured_mad_round_trips_byte_for_byte() {
        let expected = [CmAttr::Req, CmAttr::Rep, CmAttr::Rtu, CmAttr::Dreq, CmAttr::Drep];
        for name in ["write.cm.hex", "read2.cm.hex", "send.cm.hex", "nvme-discover2.cm.hex"] {
            let mads = captured::mads(name);
            assert_eq!(mads.len(), 5, "{name}");
            for (mad, attr) in mads.iter().zip(expected) {
                let repr = CmMadRepr::parse(mad).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(repr.msg.attr(), attr, "{name}");
                let mut out = [0xeeu8; 256];
                repr.emit(&mut out).unwrap();
                assert_eq!(&out[..], &mad[..], "{name} {attr:?}");
            }
        }
    }

    #[test]
    fn write_capture_header_and_ids() {
        let mads = captured::mads("write.cm.hex");
        let req = CmMadRepr::parse(&mads[0]).unwrap();
        assert_eq!((req.tid, req.attr_mod), (0x0000_000b_2975_ef71, 0));
        assert_eq!(req.msg.local_comm_id(), 0x71ef_7529);
        assert_eq!(req.msg.remote_comm_id(), None);
        assert_eq!(req.msg.service_id(), Some(0x0000_0000_0106_00ac));
        assert_eq!(req.msg.cma_hdr().map(|h| h.port), Some(50775));
        let rep = CmMadRepr::parse(&mads[1]).unwrap();
        assert_eq!(rep.tid, req.tid, "REP reuses the REQ's TID");
        assert_eq!(rep.msg.remote_comm_id(), Some(0x71ef_7529));
        assert_eq!(rep.msg.cma_hdr(), None);
    }

    #[test]
    fn untrusted_header_values_are_errors() {
        let good = captured::mads("write.cm.hex").remove(3);
        assert!(matches!(CmMadRepr::parse(&good).unwrap().msg, CmMessage::Dreq(CmDreqRepr { .. })));
        assert_eq!(CmMadRepr::parse(&good[..255]), Err(Error::Truncated("CM MAD")));
        for (at, value, why) in [
            (0, 2, "MAD base version is not 1"),
            (1, 0x03, "MAD class is not CM (0x07)"),
            (2, 1, "CM class version is not 2"),
            (3, 0x83, "CM MAD method is not Send"),
            (17, 0x01, "unknown CM attribute"),
            (17, 0x1b, "unknown CM attribute"),
        ] {
            let mut bad = good.clone();
            bad[at] = value;
            assert_eq!(CmMadRepr::parse(&bad), Err(Error::Malformed(why)));
        }
        let mut longer = good.clone();
        longer.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(CmMadRepr::parse(&longer), CmMadRepr::parse(&good), "bytes past 256 are ignored");
    }

    #[test]
    fn emit_checks_before_writing() {
        let mut repr = CmMadRepr::parse(&captured::mads("write.cm.hex")[3]).unwrap();
        let mut short = [0u8; 255];
        assert_eq!(repr.emit(&mut short), Err(Error::Truncated("CM MAD")));
        if let CmMessage::Dreq(d) = &mut repr.msg {
            d.private_data = vec![1; 221];
        }
        let mut out = [0x77u8; 256];
        assert!(matches!(repr.emit(&mut out), Err(Error::Malformed(_))));
        assert_eq!(out, [0x77u8; 256], "a failed emit writes nothing");
    }
}
