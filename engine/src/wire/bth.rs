//! The Base Transport Header (IBTA Vol 1 9.2): the 12 bytes every IB transport packet starts with.

use core::fmt;

use super::{be, Opcode, Psn, Result};

/// A 24-bit queue pair number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Qpn(u32);

impl Qpn {
    /// The QPN field mask (24 bits).
    pub const MASK: u32 = 0x00ff_ffff;
    /// QP1, the General Services Interface QP (CM MADs).
    pub const GSI: Qpn = Qpn(1);
    /// The multicast QPN 0xFFFFFF (IBTA Vol 1 ch. 9, BTH DestQP).
    pub const MULTICAST: Qpn = Qpn(Self::MASK);

    /// Makes a QPN from the low 24 bits of `value`.
    pub const fn new(value: u32) -> Qpn {
        Qpn(value & Self::MASK)
    }

    /// The QPN as an integer.
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

mod field {
    use super::super::Field;
    pub(super) const OPCODE: usize = 0;
    /// SE (bit 7), M (bit 6), PadCnt (bits 5-4), TVer (bits 3-0).
    pub(super) const FLAGS: usize = 1;
    pub(super) const PKEY: Field = 2..4;
    /// FECN (bit 7), BECN (bit 6), 6 reserved bits: masked to ones by the ICRC.
    pub(super) const FECN_BECN: usize = 4;
    pub(super) const DEST_QP: Field = 5..8;
    /// AckReq (bit 7), 7 reserved bits.
    pub(super) const ACK_REQ: usize = 8;
    pub(super) const PSN: Field = 9..12;
}

/// Offset of the FECN/BECN byte, which the ICRC masks (RoCEv2 Annex A17.4.3.1).
pub const FECN_BECN_OFFSET: usize = field::FECN_BECN;

fixed_header_packet!(12, "BTH", "A view of a BTH (and whatever follows it in the buffer).");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }

    /// Solicited Event.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }

    /// MigReq (path migration).
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }

    /// Pad count: bytes of padding after the payload (0-3).
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }

    /// Transport header version (0 today; IBTA Vol 1 ch. 9, BTH TVer).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0xf
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::PKEY)
    }

    /// Forward ECN (RoCEv2: set by the receiver side when the IP header was CE-marked).
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & 0x80 != 0
    }

    /// Backward ECN (set in a CNP).
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & 0x40 != 0
    }

    /// The 6 reserved bits after FECN/BECN.
    pub fn resv6(&self) -> u8 {
        self.buffer.as_ref()[field::FECN_BECN] & 0x3f
    }

    /// Destination QP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(be::u24(self.buffer.as_ref(), field::DEST_QP))
    }

    /// AckReq: the requester asks for an acknowledgement of this packet.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }

    /// The 7 reserved bits after AckReq.
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & 0x7f
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be::u24(self.buffer.as_ref(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = op.0;
    }

    /// Sets SE, M, PadCnt and TVer.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.buffer.as_mut()[field::FLAGS] =
            (u8::from(solicited) << 7) | (u8::from(mig_req) << 6) | ((pad_count & 3) << 4) | (tver & 0xf);
    }

    /// Sets the MigReq bit alone.
    pub fn set_mig_req(&mut self, v: bool) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !0x40) | (u8::from(v) << 6);
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::PKEY, v)
    }

    /// Sets FECN and BECN (the reserved bits are written as zero, as IBTA requires of reserved fields).
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::FECN_BECN] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }

    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, q: Qpn) {
        be::set_u24(self.buffer.as_mut(), field::DEST_QP, q.value())
    }

    /// Sets AckReq (the reserved bits are written as zero).
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = u8::from(v) << 7;
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        be::set_u24(self.buffer.as_mut(), field::PSN, psn.value())
    }
}

/// A BTH as values. Reserved bits are not kept: they are sent as zero and ignored on receipt
/// (IBTA Vol 1 ch. 9: reserved fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited Event.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// Pad count (0-3).
    pub pad_count: u8,
    /// Transport header version (4 bits).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// A BTH for `opcode` to `dest_qp` at `psn`, every other field at its everyday value: the
    /// default partition key 0xFFFF, TVer 0, no pad, and no flag set (SE, MigReq, FECN, BECN,
    /// AckReq). Change the others with struct update syntax:
    /// `Repr { ack_req: true, ..Repr::new(opcode, dest_qp, psn) }`.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Repr {
        Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Reads a BTH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            tver: packet.tver(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the BTH into a buffer of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_opcode(self.opcode);
        packet.set_flags(self.solicited, self.mig_req, self.pad_count, self.tver);
        packet.set_pkey(self.pkey);
        packet.set_fecn_becn(self.fecn, self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::Error;

    // The BTH of golden packet g4 (UD SEND_ONLY, SE, PadCnt 2, QP 0x45, PSN 16).
    static HEADER_BYTES: [u8; 12] = [0x64, 0xa0, 0xff, 0xff, 0x00, 0x00, 0x00, 0x45, 0x00, 0x00, 0x00, 0x10];

    fn repr() -> Repr {
        Repr { solicited: true, pad_count: 2, ..Repr::new(Opcode::UD_SEND_ONLY, Qpn::new(0x45), Psn::new(16)) }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::UD_SEND_ONLY);
        assert!(p.solicited());
        assert!(!p.mig_req());
        assert_eq!(p.pad_count(), 2);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), 0xffff);
        assert!(!p.fecn() && !p.becn());
        assert_eq!(p.dest_qp(), Qpn::new(0x45));
        assert!(!p.ack_req());
        assert_eq!(p.psn(), Psn::new(16));
    }

    #[test]
    fn construct() {
        let mut b = [0xeeu8; 12];
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_opcode(Opcode::UD_SEND_ONLY);
        p.set_flags(true, false, 2, 0);
        p.set_pkey(0xffff);
        p.set_fecn_becn(false, false);
        p.set_dest_qp(Qpn::new(0x45));
        p.set_ack_req(false);
        p.set_psn(Psn::new(16));
        assert_eq!(b, HEADER_BYTES);
    }

    #[test]
    fn parse() {
        assert_eq!(Repr::parse(&Packet::new_checked(&HEADER_BYTES[..]).unwrap()).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut b = [0u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, HEADER_BYTES);
    }

    #[test]
    fn ecn_bits_and_reserved() {
        let mut b = HEADER_BYTES;
        b[4] = 0xff;
        b[8] = 0xff;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.fecn() && p.becn() && p.ack_req());
        assert_eq!((p.resv6(), p.resv7()), (0x3f, 0x7f));
    }

    #[test]
    fn short() {
        assert_eq!(Packet::new_checked(&HEADER_BYTES[..11]), Err(Error::Truncated("BTH")));
    }
}
