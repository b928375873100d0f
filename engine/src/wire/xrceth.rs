//! The XRC Extended Transport Header (IBTA Vol 1 Annex A14): the XRC SRQ a request is for.

use super::{be, Result};

mod field {
    use super::super::Field;
    // Byte 0 is reserved.
    pub(super) const XRC_SRQ: Field = 1..4;
}

fixed_header_packet!(4, "XRCETH", "A view of an XRCETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The XRC SRQ number (24 bits).
    pub fn xrc_srqn(&self) -> u32 {
        be::u24(self.buffer.as_ref(), field::XRC_SRQ)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the XRC SRQ number (and zeroes the reserved byte).
    pub fn set_xrc_srqn(&mut self, v: u32) {
        self.buffer.as_mut()[0] = 0;
        be::set_u24(self.buffer.as_mut(), field::XRC_SRQ, v & 0x00ff_ffff)
    }
}

/// An XRCETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// XRC SRQ number (24 bits).
    pub xrc_srqn: u32,
}

impl Repr {
    /// Reads an XRCETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { xrc_srqn: p.xrc_srqn() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the XRCETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_xrc_srqn(self.xrc_srqn);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The XRCETH of coverage.pcap frame 13 (XRC SEND_ONLY to SRQ 0x99).
    static HEADER_BYTES: [u8; 4] = [0, 0, 0, 0x99];
    const REPR: Repr = Repr { xrc_srqn: 0x99 };

    #[test]
    fn deconstruct() {
        assert_eq!(Packet::new_checked(&HEADER_BYTES[..]).unwrap().xrc_srqn(), 0x99);
    }
    #[test]
    fn construct() {
        let mut b = [0xffu8; 4];
        Packet::new_unchecked(&mut b[..]).set_xrc_srqn(0x99);
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
