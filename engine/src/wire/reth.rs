//! The RDMA Extended Transport Header (IBTA Vol 1 9.3.3): where an RDMA WRITE or READ goes.

use super::be;

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

fixed_header_repr!("a RETH"; va / set_va, rkey / set_rkey, dma_len / set_dma_len);

#[cfg(test)]
mod test {
    use super::*;

    fixed_header_tests! {
        /// The RETH of golden packet g2.
        static HEADER_BYTES = [0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, 0, 0, 0xab, 0xcd, 0, 0, 0x20, 0];
        va / set_va = 0x7f00_1234_5000,
        rkey / set_rkey = 0xabcd,
        dma_len / set_dma_len = 8192,
    }
}
