//! The Atomic Acknowledge Extended Transport Header (IBTA Vol 1 9.3.6): the original value at
//! the target of an atomic operation.

use super::{be, Result};

mod field {
    use super::super::Field;
    pub(super) const ORIG_REM_DATA: Field = 0..8;
}

fixed_header_packet!(8, "AtomicAckETH", "A view of an AtomicAckETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The value the target held before the atomic operation.
    pub fn orig_rem_data(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::ORIG_REM_DATA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the original remote data.
    pub fn set_orig_rem_data(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::ORIG_REM_DATA, v)
    }
}

/// An AtomicAckETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Original remote data.
    pub orig_rem_data: u64,
}

impl Repr {
    /// Reads an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { orig_rem_data: p.orig_rem_data() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_orig_rem_data(self.orig_rem_data);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    static HEADER_BYTES: [u8; 8] = [0, 0, 0, 0, 0, 0, 0x22, 0x22];
    const REPR: Repr = Repr { orig_rem_data: 0x2222 };

    #[test]
    fn deconstruct() {
        assert_eq!(Packet::new_checked(&HEADER_BYTES[..]).unwrap().orig_rem_data(), 0x2222);
    }
    #[test]
    fn construct() {
        let mut b = [0xffu8; 8];
        Packet::new_unchecked(&mut b[..]).set_orig_rem_data(0x2222);
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
