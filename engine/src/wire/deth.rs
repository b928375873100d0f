//! The Datagram Extended Transport Header (IBTA Vol 1 9.3.2): Q_Key and source QP of a UD packet.

use super::{be, Qpn, Result};

mod field {
    use super::super::Field;
    pub(super) const QKEY: Field = 0..4;
    // Byte 4 is reserved.
    pub(super) const SRC_QP: Field = 5..8;
}

fixed_header_packet!(8, "DETH", "A view of a DETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::QKEY)
    }
    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(be::u24(self.buffer.as_ref(), field::SRC_QP))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::QKEY, v)
    }
    /// Sets the source QP (and zeroes the reserved byte).
    pub fn set_src_qp(&mut self, q: Qpn) {
        self.buffer.as_mut()[4] = 0;
        be::set_u24(self.buffer.as_mut(), field::SRC_QP, q.value())
    }
}

/// A DETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP.
    pub src_qp: Qpn,
}

impl Repr {
    /// Reads a DETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { qkey: p.qkey(), src_qp: p.src_qp() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the DETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_qkey(self.qkey);
        p.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The DETH of golden packet g4.
    static HEADER_BYTES: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x46];
    const REPR: Repr = Repr { qkey: 0x1111_1111, src_qp: Qpn::new(0x46) };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!((p.qkey(), p.src_qp()), (0x1111_1111, Qpn::new(0x46)));
    }
    #[test]
    fn construct() {
        let mut b = [0xffu8; 8];
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_qkey(0x1111_1111);
        p.set_src_qp(Qpn::new(0x46));
        assert_eq!(b, HEADER_BYTES);
    }
    #[test]
    fn parse() {
        assert_eq!(Repr::parse(&Packet::new_checked(&HEADER_BYTES[..]).unwrap()), Ok(REPR));
        assert!(Packet::new_checked(&HEADER_BYTES[..7]).is_err());
    }
    #[test]
    fn emit() {
        let mut b = [0u8; 8];
        REPR.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, HEADER_BYTES);
    }
}
