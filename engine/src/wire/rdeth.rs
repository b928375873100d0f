//! The Reliable Datagram Extended Transport Header (IBTA Vol 1 9.3.1): the EE context of an RD
//! packet. softrdma does not implement RD; the header exists so RD traces decode.

use super::{be, Result};

mod field {
    use super::super::Field;
    // Byte 0 is reserved.
    pub(super) const EE_CONTEXT: Field = 1..4;
}

fixed_header_packet!(4, "RDETH", "A view of an RDETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The EE context (24 bits).
    pub fn ee_context(&self) -> u32 {
        be::u24(self.buffer.as_ref(), field::EE_CONTEXT)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the EE context (and zeroes the reserved byte).
    pub fn set_ee_context(&mut self, v: u32) {
        self.buffer.as_mut()[0] = 0;
        be::set_u24(self.buffer.as_mut(), field::EE_CONTEXT, v & 0x00ff_ffff)
    }
}

/// An RDETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// EE context (24 bits).
    pub ee_context: u32,
}

impl Repr {
    /// Reads an RDETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { ee_context: p.ee_context() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the RDETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_ee_context(self.ee_context);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The RDETH of an RD packet for EE context 0x99.
    static HEADER_BYTES: [u8; 4] = [0, 0, 0, 0x99];
    const REPR: Repr = Repr { ee_context: 0x99 };

    #[test]
    fn deconstruct() {
        assert_eq!(Packet::new_checked(&HEADER_BYTES[..]).unwrap().ee_context(), 0x99);
    }
    #[test]
    fn construct() {
        let mut b = [0xffu8; 4];
        Packet::new_unchecked(&mut b[..]).set_ee_context(0x99);
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
