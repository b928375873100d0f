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

    /// The RDETH, if present.
    pub fn rdeth(&self) -> Option<rdeth::Packet<&[u8]>> {
        self.header(Headers::RDETH).map(rdeth::Packet::new_unchecked)
    }
    /// The DETH, if present.
    pub fn deth(&self) -> Option<deth::Packet<&[u8]>> {
        self.header(Headers::DETH).map(deth::Packet::new_unchecked)
    }
    /// The XRCETH, if present.
    pub fn xrceth(&self) -> Option<xrceth::Packet<&[u8]>> {
        self.header(Headers::XRCETH).map(xrceth::Packet::new_unchecked)
    }
    /// The RETH, if present.
    pub fn reth(&self) -> Option<reth::Packet<&[u8]>> {
        self.header(Headers::RETH).map(reth::Packet::new_unchecked)
    }
    /// The AtomicETH, if present.
    pub fn atomiceth(&self) -> Option<atomiceth::Packet<&[u8]>> {
        self.header(Headers::ATOMICETH).map(atomiceth::Packet::new_unchecked)
    }
    /// The AETH, if present.
    pub fn aeth(&self) -> Option<aeth::Packet<&[u8]>> {
        self.header(Headers::AETH).map(aeth::Packet::new_unchecked)
    }
    /// The AtomicAckETH, if present.
    pub fn atomicacketh(&self) -> Option<atomicacketh::Packet<&[u8]>> {
        self.header(Headers::ATOMICACKETH).map(atomicacketh::Packet::new_unchecked)
    }
    /// The ImmDt, if present.
    pub fn immdt(&self) -> Option<immdt::Packet<&[u8]>> {
        self.header(Headers::IMMDT).map(immdt::Packet::new_unchecked)
    }
    /// The IETH, if present.
    pub fn ieth(&self) -> Option<ieth::Packet<&[u8]>> {
        self.header(Headers::IETH).map(ieth::Packet::new_unchecked)
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
        let hdr = |h: Headers| p.header_in(info, h);
        r.rdeth = hdr(Headers::RDETH).map(|b| rdeth::Repr::parse(&rdeth::Packet::new_unchecked(b))).transpose()?;
        r.deth = hdr(Headers::DETH).map(|b| deth::Repr::parse(&deth::Packet::new_unchecked(b))).transpose()?;
        r.xrceth = hdr(Headers::XRCETH).map(|b| xrceth::Repr::parse(&xrceth::Packet::new_unchecked(b))).transpose()?;
        r.reth = hdr(Headers::RETH).map(|b| reth::Repr::parse(&reth::Packet::new_unchecked(b))).transpose()?;
        r.atomiceth = hdr(Headers::ATOMICETH)
            .map(|b| atomiceth::Repr::parse(&atomiceth::Packet::new_unchecked(b)))
            .transpose()?;
        r.aeth = hdr(Headers::AETH).map(|b| aeth::Repr::parse(&aeth::Packet::new_unchecked(b))).transpose()?;
        r.atomicacketh = hdr(Headers::ATOMICACKETH)
            .map(|b| atomicacketh::Repr::parse(&atomicacketh::Packet::new_unchecked(b)))
            .transpose()?;
        r.immdt = hdr(Headers::IMMDT).map(|b| immdt::Repr::parse(&immdt::Packet::new_unchecked(b))).transpose()?;
        r.ieth = hdr(Headers::IETH).map(|b| ieth::Repr::parse(&ieth::Packet::new_unchecked(b))).transpose()?;
        Ok(r)
    }

    /// The extension headers this repr holds.
    pub fn headers(&self) -> Headers {
        let mut h = Headers::NONE;
        let mut add = |present: bool, x: Headers| {
            if present {
                h = h.union(x);
            }
        };
        add(self.rdeth.is_some(), Headers::RDETH);
        add(self.deth.is_some(), Headers::DETH);
        add(self.xrceth.is_some(), Headers::XRCETH);
        add(self.reth.is_some(), Headers::RETH);
        add(self.atomiceth.is_some(), Headers::ATOMICETH);
        add(self.aeth.is_some(), Headers::AETH);
        add(self.atomicacketh.is_some(), Headers::ATOMICACKETH);
        add(self.immdt.is_some(), Headers::IMMDT);
        add(self.ieth.is_some(), Headers::IETH);
        if let Some(i) = self.bth.opcode.info() {
            add(i.headers.contains(Headers::CNP_RESERVED), Headers::CNP_RESERVED);
        }
        h
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
        if let Some(x) = self.rdeth {
            x.emit(&mut rdeth::Packet::new_unchecked(&mut buf[at(Headers::RDETH)..]));
        }
        if let Some(x) = self.deth {
            x.emit(&mut deth::Packet::new_unchecked(&mut buf[at(Headers::DETH)..]));
        }
        if let Some(x) = self.xrceth {
            x.emit(&mut xrceth::Packet::new_unchecked(&mut buf[at(Headers::XRCETH)..]));
        }
        if let Some(x) = self.reth {
            x.emit(&mut reth::Packet::new_unchecked(&mut buf[at(Headers::RETH)..]));
        }
        if let Some(x) = self.atomiceth {
            x.emit(&mut atomiceth::Packet::new_unchecked(&mut buf[at(Headers::ATOMICETH)..]));
        }
        if let Some(x) = self.aeth {
            x.emit(&mut aeth::Packet::new_unchecked(&mut buf[at(Headers::AETH)..]));
        }
        if let Some(x) = self.atomicacketh {
            x.emit(&mut atomicacketh::Packet::new_unchecked(&mut buf[at(Headers::ATOMICACKETH)..]));
        }
        if let Some(x) = self.immdt {
            x.emit(&mut immdt::Packet::new_unchecked(&mut buf[at(Headers::IMMDT)..]));
        }
        if let Some(x) = self.ieth {
            x.emit(&mut ieth::Packet::new_unchecked(&mut buf[at(Headers::IETH)..]));
        }
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
        let mut r = Repr::new(bth::Repr {
            opcode: Opcode::RC_RDMA_WRITE_FIRST,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12),
            ack_req: false,
            psn: Psn::new(2),
        });
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
