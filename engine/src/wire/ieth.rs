//! The Invalidate Extended Transport Header (IBTA Vol 1 9.3.7): the R_Key a SEND with
//! invalidate asks the responder to invalidate.

use super::{be, Result};

mod field {
    use super::super::Field;
    pub(super) const RKEY: Field = 0..4;
}

fixed_header_packet!(4, "IETH", "A view of an IETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::RKEY)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::RKEY, v)
    }
}

/// An IETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

impl Repr {
    /// Reads an IETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { rkey: p.rkey() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the IETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The IETH of coverage.pcap frame 11 (RC SEND_ONLY_WITH_INVALIDATE, rkey 0x1234).
    static HEADER_BYTES: [u8; 4] = [0, 0, 0x12, 0x34];
    const REPR: Repr = Repr { rkey: 0x1234 };

    #[test]
    fn deconstruct() {
        assert_eq!(Packet::new_checked(&HEADER_BYTES[..]).unwrap().rkey(), 0x1234);
    }
    #[test]
    fn construct() {
        let mut b = [0u8; 4];
        Packet::new_unchecked(&mut b[..]).set_rkey(0x1234);
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
