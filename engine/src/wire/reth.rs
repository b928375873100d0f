//! The RDMA Extended Transport Header (IBTA Vol 1 9.3.3): where an RDMA WRITE or READ goes.

use super::{be, Result};

mod field {
    use super::super::Field;
    pub(super) const VA: Field = 0..8;
    pub(super) const RKEY: Field = 8..12;
    pub(super) const DMA_LEN: Field = 12..16;
}

fixed_header_packet!(16, "RETH", "A view of a RETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address of the remote buffer.
    pub fn va(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::VA)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::RKEY)
    }
    /// Length of the whole RDMA operation in bytes.
    pub fn dma_len(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::VA, v)
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::RKEY, v)
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::DMA_LEN, v)
    }
}

/// A RETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl Repr {
    /// Reads a RETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { va: p.va(), rkey: p.rkey(), dma_len: p.dma_len() })
    }
    /// Bytes the header takes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The RETH of golden packet g2.
    static HEADER_BYTES: [u8; 16] = [0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, 0, 0, 0xab, 0xcd, 0, 0, 0x20, 0];
    const REPR: Repr = Repr { va: 0x7f00_1234_5000, rkey: 0xabcd, dma_len: 8192 };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!((p.va(), p.rkey(), p.dma_len()), (0x7f00_1234_5000, 0xabcd, 8192));
    }
    #[test]
    fn construct() {
        let mut b = [0u8; 16];
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_va(0x7f00_1234_5000);
        p.set_rkey(0xabcd);
        p.set_dma_len(8192);
        assert_eq!(b, HEADER_BYTES);
    }
    #[test]
    fn parse() {
        assert_eq!(Repr::parse(&Packet::new_checked(&HEADER_BYTES[..]).unwrap()), Ok(REPR));
        assert!(Packet::new_checked(&HEADER_BYTES[..15]).is_err());
    }
    #[test]
    fn emit() {
        let mut b = [0u8; 16];
        REPR.emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, HEADER_BYTES);
    }
}
