//! The Immediate Data Extended Transport Header (IBTA Vol 1 9.3.5): 4 opaque bytes delivered in
//! the receive completion of a SEND or RDMA WRITE "with immediate".

use super::{be, Result};

mod field {
    use super::super::Field;
    pub(super) const IMM: Field = 0..4;
}

fixed_header_packet!(4, "ImmDt", "A view of an ImmDt header.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate data, read big-endian (the bytes as on the wire).
    pub fn imm(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::IMM)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the immediate data (written big-endian).
    pub fn set_imm(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::IMM, v)
    }
}

/// An ImmDt header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Immediate data (big-endian reading of the 4 wire bytes).
    pub imm: u32,
}

impl Repr {
    /// Reads an ImmDt header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { imm: p.imm() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the ImmDt header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_imm(self.imm);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The ImmDt of golden packet g5.
    static HEADER_BYTES: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];
    const REPR: Repr = Repr { imm: 0xdead_beef };

    #[test]
    fn deconstruct() {
        assert_eq!(Packet::new_checked(&HEADER_BYTES[..]).unwrap().imm(), 0xdead_beef);
    }
    #[test]
    fn construct() {
        let mut b = [0u8; 4];
        Packet::new_unchecked(&mut b[..]).set_imm(0xdead_beef);
        assert_eq!(b, HEADER_BYTES);
    }
    #[test]
    fn parse() {
        assert_eq!(Repr::parse(&Packet::new_checked(&HEADER_BYTES[..]).unwrap()), Ok(REPR));
        assert!(Packet::new_checked(&HEADER_BYTES[..3]).is_err());
    }
    #[test]
    fn emit() {
        let mut b = [0u8; 4];
        REPR.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, HEADER_BYTES);
    }
}
