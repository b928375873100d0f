//! A whole IB transport packet: BTH, the extension headers its opcode names, payload, pad and
//! ICRC. This is the UDP payload of a RoCEv2 packet and what follows the GRH in RoCEv1.
//!
//! [`Packet::new_checked`] validates the layout against the opcode table (headers present,
//! pad count, payload allowed, 4-byte alignment) so that every accessor is then panic-free.

use super::opcode::CNP_RESERVED_LEN;
use super::{
    aeth, atomicacketh, atomiceth, bth, deth, icrc, ieth, immdt, rdeth, reth, xrceth, Error, Headers, Opcode,
    OpcodeInfo, Result,
};

packet_view!(Packet, "A view of an IB transport packet (BTH through ICRC).");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks the layout: the BTH, every extension header of the opcode and the ICRC are present;
    /// the pad count fits the payload; opcodes without payload carry none; the length is a
    /// multiple of 4 (IBTA 9.2.3: the pad aligns the payload to 4 bytes, every header is a
    /// multiple of 4 bytes).
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < bth::HEADER_LEN {
            return Err(Error::Truncated("BTH"));
        }
        let body_end = b.len().saturating_sub(icrc::LEN);
        let mut off = bth::HEADER_LEN;
        if let Some(info) = self.info() {
            off = info.header_len();
            if off > body_end {
                // Name the first header that does not fit.
                let mut end = bth::HEADER_LEN;
                for (h, len) in Headers::ORDER {
                    if info.headers.contains(h) {
                        end += len;
                        if end > body_end {
                            return Err(Error::Truncated(h.name()));
                        }
                    }
                }
            }
        }
        if b.len() < off + icrc::LEN {
            return Err(Error::Truncated("ICRC"));
        }
        let payload_and_pad = body_end - off;
        if usize::from(self.bth().pad_count()) > payload_and_pad {
            return Err(Error::Malformed("pad count exceeds the payload"));
        }
        if let Some(info) = self.info() {
            if !info.payload && payload_and_pad != 0 {
                return Err(Error::Malformed("payload on an opcode that carries none"));
            }
        }
        if b.len() % 4 != 0 {
            return Err(Error::Malformed("transport packet length not a multiple of 4"));
        }
        Ok(())
    }

    /// The BTH.
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(self.buffer.as_ref())
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[0])
    }

    /// The opcode's table row (`None` for reserved opcodes).
    pub fn info(&self) -> Option<&'static OpcodeInfo> {
        self.opcode().info()
    }

    /// The extension headers this packet carries.
    pub fn headers(&self) -> Headers {
        self.info().map_or(Headers::NONE, |i| i.headers)
    }

    /// Length of BTH and extension headers.
    pub fn header_len(&self) -> usize {
        self.info().map_or(bth::HEADER_LEN, |i| i.header_len())
    }

    /// The bytes of one extension header, if the opcode carries it.
    pub fn header(&self, h: Headers) -> Option<&[u8]> {
        self.header_in(self.info()?, h)
    }

    fn header_in(&self, info: &OpcodeInfo, h: Headers) -> Option<&[u8]> {
        let start = bth::HEADER_LEN + info.offset_of(h)?;
        Some(&self.buffer.as_ref()[start..start + h.header_len()])
    }

    fn payload_end(&self) -> usize {
        self.buffer.as_ref().len() - icrc::LEN - usize::from(self.bth().pad_count())
    }

    /// The payload, without pad.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.payload_end()]
    }

    /// The pad bytes (0-3).
    pub fn pad(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[self.payload_end()..b.len() - icrc::LEN]
    }

    /// Everything before the ICRC.
    pub fn body(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - icrc::LEN]
    }

    /// The ICRC as stored (least-significant byte first on the wire).
    pub fn icrc(&self) -> u32 {
        icrc::stored(self.buffer.as_ref()).unwrap_or(0)
    }

    /// The ICRC's four wire bytes.
    pub fn icrc_bytes(&self) -> [u8; 4] {
        self.icrc().to_le_bytes()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (s, e) = (self.header_len(), self.payload_end());
        &mut self.buffer.as_mut()[s..e]
    }

    /// Stores the ICRC in the last four bytes.
    pub fn set_icrc(&mut self, crc: u32) {
        let b = self.buffer.as_mut();
        let n = b.len() - icrc::LEN;
        b[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// The nine extension headers, in wire order, each as the name of its module (and of the view's
/// getter and the `Repr`'s field), its [`Headers`] flag and its name in the docs: the view's
/// getters and the `Repr`'s part of `parse`, `headers` and `emit`, one header at a time.
macro_rules! extension_headers {
    ($( $h:ident: $flag:ident, $name:literal; )+) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            $(
                #[doc = concat!("The ", $name, ", if present.")]
                pub fn $h(&self) -> Option<$h::Packet<&[u8]>> {
                    self.header(Headers::$flag).map($h::Packet::new_unchecked)
                }
            )+
        }

        impl Repr {
            /// Reads each extension header `info` names from the packet (checked: each is there).
            fn parse_extension_headers<T: AsRef<[u8]>>(&mut self, p: &Packet<T>, info: &OpcodeInfo) -> Result<()> {
                $(
                    self.$h = p.header_in(info, Headers::$flag)
                        .map(|b| $h::Repr::parse(&$h::Packet::new_unchecked(b)))
                        .transpose()?;
                )+
                Ok(())
            }

            /// The extension headers present in this repr.
            fn extension_headers(&self) -> Headers {
                let mut h = Headers::NONE;
                $(
                    if self.$h.is_some() {
                        h = h.union(Headers::$flag);
                    }
                )+
                h
            }

            /// Writes each extension header present at its offset, `at(flag)`, in `buf`.
            fn emit_extension_headers(&self, buf: &mut [u8], at: impl Fn(Headers) -> usize) {
                $(
                    if let Some(x) = self.$h {
                        x.emit(&mut $h::Packet::new_unchecked(&mut buf[at(Headers::$flag)..]));
                    }
                )+
            }
        }
    };
}

extension_headers! {
    rdeth: RDETH, "RDETH";
    deth: DETH, "DETH";
    xrceth: XRCETH, "XRCETH";
    reth: RETH, "RETH";
    atomiceth: ATOMICETH, "AtomicETH";
    aeth: AETH, "AETH";
    atomicacketh: ATOMICACKETH, "AtomicAckETH";
    immdt: IMMDT, "ImmDt";
    ieth: IETH, "IETH";
}

/// An IB transport packet's headers as values, and the payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The BTH. Its `pad_count` must make `payload_len + pad_count` a multiple of 4.
    pub bth: bth::Repr,
    /// RDETH (RD).
    pub rdeth: Option<rdeth::Repr>,
    /// DETH (UD, RD requests).
    pub deth: Option<deth::Repr>,
    /// XRCETH (XRC requests).
    pub xrceth: Option<xrceth::Repr>,
    /// RETH.
    pub reth: Option<reth::Repr>,
    /// AtomicETH.
    pub atomiceth: Option<atomiceth::Repr>,
    /// AETH.
    pub aeth: Option<aeth::Repr>,
    /// AtomicAckETH.
    pub atomicacketh: Option<atomicacketh::Repr>,
    /// Immediate data.
    pub immdt: Option<immdt::Repr>,
    /// IETH.
    pub ieth: Option<ieth::Repr>,
    /// Payload length in bytes, without pad.
    pub payload_len: usize,
}

impl Repr {
    /// A packet with this BTH, no extension headers and no payload.
    pub const fn new(bth: bth::Repr) -> Repr {
        Repr {
            bth,
            rdeth: None,
            deth: None,
            xrceth: None,
            reth: None,
            atomiceth: None,
            aeth: None,
            atomicacketh: None,
            immdt: None,
            ieth: None,
            payload_len: 0,
        }
    }

    /// The pad count that aligns a payload of `len` bytes to 4.
    pub const fn pad_for(len: usize) -> u8 {
        ((4 - len % 4) % 4) as u8
    }

    /// Reads a checked packet.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        let mut r = Repr::new(bth::Repr::parse(&p.bth())?);
        r.payload_len = p.payload().len();
        let Some(info) = p.info() else {
            return Ok(r);
        };
        // Each header the opcode carries is present: check_len saw to it.
        r.parse_extension_headers(p, info)?;
        Ok(r)
    }

    /// The extension headers this repr holds.
    pub fn headers(&self) -> Headers {
        let h = self.extension_headers();
        match self.bth.opcode.info() {
            Some(i) if i.headers.contains(Headers::CNP_RESERVED) => h.union(Headers::CNP_RESERVED),
            _ => h,
        }
    }

    /// Checks that the headers are the ones the opcode carries, that a payload appears only where
    /// allowed, and that the pad count aligns it.
    pub fn check(&self) -> Result<()> {
        let want = self.bth.opcode.info().map_or(Headers::NONE, |i| i.headers);
        if self.headers() != want {
            return Err(Error::Malformed("extension headers do not match the opcode"));
        }
        if self.bth.pad_count > 3 || (self.payload_len + usize::from(self.bth.pad_count)) % 4 != 0 {
            return Err(Error::Malformed("pad count does not align the payload to 4 bytes"));
        }
        if let Some(i) = self.bth.opcode.info() {
            if !i.payload && self.payload_len + usize::from(self.bth.pad_count) != 0 {
                return Err(Error::Malformed("payload on an opcode that carries none"));
            }
        }
        Ok(())
    }

    /// Length of BTH and extension headers: the opcode table's, for a repr that passes
    /// [`check`](Self::check).
    pub fn header_len(&self) -> usize {
        match self.bth.opcode.info() {
            Some(i) => i.header_len(),
            None => bth::HEADER_LEN + self.headers().len(),
        }
    }

    /// Bytes the whole transport packet takes, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + usize::from(self.bth.pad_count) + icrc::LEN
    }

    /// Writes BTH, extension headers and zero pad into `buf` (at least
    /// [`buffer_len`](Self::buffer_len) bytes; only that prefix is used). The payload (see
    /// [`Packet::payload_mut`]) and the ICRC are the caller's to write.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        self.check()?;
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(Error::Truncated("buffer for the transport packet"));
        }
        let buf = &mut buf[..len];
        self.bth.emit(&mut bth::Packet::new_unchecked(&mut buf[..]));
        let headers = self.headers();
        let at = |h: Headers| bth::HEADER_LEN + headers.offset_of(h).unwrap_or(0);
        self.emit_extension_headers(buf, at);
        if headers.contains(Headers::CNP_RESERVED) {
            let o = at(Headers::CNP_RESERVED);
            buf[o..o + CNP_RESERVED_LEN].fill(0);
        }
        let pad_start = len - icrc::LEN - usize::from(self.bth.pad_count);
        buf[pad_start..len - icrc::LEN].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::{NakCode, Psn, Qpn, Syndrome};

    // The transport part of golden packet g2: RC RDMA_WRITE_FIRST with RETH and 64 payload bytes.
    fn g2() -> Vec<u8> {
        let mut v = vec![0x06, 0x00, 0xff, 0xff, 0, 0, 0, 0x12, 0, 0, 0, 2];
        v.extend_from_slice(&[0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, 0, 0, 0xab, 0xcd, 0, 0, 0x20, 0]);
        v.extend(0u8..64);
        v.extend_from_slice(&[0xf8, 0x6b, 0xae, 0xe4]);
        v
    }

    fn g2_repr() -> Repr {
        let mut r = Repr::new(bth::Repr::new(Opcode::RC_RDMA_WRITE_FIRST, Qpn::new(0x12), Psn::new(2)));
        r.reth = Some(reth::Repr { va: 0x7f00_1234_5000, rkey: 0xabcd, dma_len: 8192 });
        r.payload_len = 64;
        r
    }

    #[test]
    fn deconstruct() {
        let b = g2();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_RDMA_WRITE_FIRST);
        assert_eq!(p.header_len(), 28);
        assert_eq!(p.reth().unwrap().dma_len(), 8192);
        assert!(p.aeth().is_none());
        assert_eq!(p.payload().len(), 64);
        assert_eq!(p.payload()[63], 63);
        assert!(p.pad().is_empty());
        assert_eq!(p.icrc_bytes(), [0xf8, 0x6b, 0xae, 0xe4]);
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 96];
        g2_repr().emit(&mut b).unwrap();
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.payload_mut().copy_from_slice(&(0u8..64).collect::<Vec<_>>());
        p.set_icrc(0xe4ae_6bf8);
        assert_eq!(b, g2());
    }

    #[test]
    fn parse() {
        let b = g2();
        assert_eq!(Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(), g2_repr());
    }

    #[test]
    fn emit() {
        let r = g2_repr();
        assert_eq!(r.buffer_len(), 96);
        let mut b = vec![0xaau8; 96];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..28], &g2()[..28]);
        assert!(r.emit(&mut [0u8; 95]).is_err());
    }

    #[test]
    fn layout_errors() {
        let b = g2();
        assert_eq!(Packet::new_checked(&b[..11]).unwrap_err(), Error::Truncated("BTH"));
        assert_eq!(Packet::new_checked(&b[..20]).unwrap_err(), Error::Truncated("RETH"));
        assert_eq!(Packet::new_checked(&b[..30]).unwrap_err(), Error::Truncated("RETH"));
        assert_eq!(Packet::new_checked(&b[..31]).unwrap_err(), Error::Truncated("RETH"));
        assert_eq!(
            Packet::new_checked(&b[..33]).unwrap_err(),
            Error::Malformed("transport packet length not a multiple of 4")
        );
        // An ACK with payload.
        let mut ack = vec![0x11, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0x1f, 0, 0, 1];
        ack.extend_from_slice(&[0; 8]);
        assert_eq!(
            Packet::new_checked(&ack[..]).unwrap_err(),
            Error::Malformed("payload on an opcode that carries none")
        );
        // A pad count larger than the payload.
        let mut send = vec![0x04, 0x30, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1];
        send.extend_from_slice(&[0; 4]);
        assert_eq!(Packet::new_checked(&send[..14]).unwrap_err(), Error::Truncated("ICRC"));
        assert_eq!(Packet::new_checked(&send[..]).unwrap_err(), Error::Malformed("pad count exceeds the payload"));
    }

    #[test]
    fn reserved_opcode_round_trips() {
        let b = [0x1f, 0, 0xff, 0xff, 0, 0, 0, 0x12, 0, 0, 0, 0x3d, 0x3f, 0x3f, 0x3f, 0x3f, 1, 2, 3, 4];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.info(), None);
        assert_eq!(p.payload(), &[0x3f; 4]);
        let r = Repr::parse(&p).unwrap();
        let mut out = [0u8; 20];
        r.emit(&mut out).unwrap();
        let mut q = Packet::new_unchecked(&mut out[..]);
        q.payload_mut().copy_from_slice(&[0x3f; 4]);
        q.set_icrc(p.icrc());
        assert_eq!(out, b);
    }

    #[test]
    fn check_rejects_inconsistent_reprs() {
        let mut r = g2_repr();
        r.reth = None;
        assert!(r.check().is_err());
        let mut r = g2_repr();
        r.aeth = Some(aeth::Repr { syndrome: Syndrome::Nak(NakCode::InvalidRequest), msn: aeth::Msn::new(0) });
        assert!(r.emit(&mut [0u8; 200]).is_err());
        let mut r = g2_repr();
        r.payload_len = 63;
        assert!(r.check().is_err());
        r.bth.pad_count = 1;
        assert!(r.check().is_ok());
    }
}
