//! The Atomic Extended Transport Header (IBTA Vol 1 9.3.4): target and operands of
//! CMP_SWAP and FETCH_ADD.

use super::be;

mod field {
    use super::super::Field;
    pub(super) const VA: Field = 0..8;
    pub(super) const RKEY: Field = 8..12;
    pub(super) const SWAP_ADD: Field = 12..20;
    pub(super) const COMPARE: Field = 20..28;
}

fixed_header_packet!(28, "AtomicETH", "A view of an AtomicETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::VA)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::RKEY)
    }
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::SWAP_ADD)
    }
    /// Compare value (CMP_SWAP).
    pub fn compare(&self) -> u64 {
        be::u64(self.buffer.as_ref(), field::COMPARE)
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
    /// Sets the swap/add data.
    pub fn set_swap_add(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::SWAP_ADD, v)
    }
    /// Sets the compare data.
    pub fn set_compare(&mut self, v: u64) {
        be::set_u64(self.buffer.as_mut(), field::COMPARE, v)
    }
}

/// An AtomicETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap or add data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

fixed_header_repr!("an AtomicETH"; va / set_va, rkey / set_rkey, swap_add / set_swap_add, compare / set_compare);

#[cfg(test)]
mod test {
    use super::*;

    fixed_header_tests! {
        /// The AtomicETH of coverage.pcap frame 7 (CMP_SWAP va 0x3000 rkey 0x66 swap 0x1111 cmp 0x2222).
        static HEADER_BYTES = [
            0, 0, 0, 0, 0, 0, 0x30, 0, 0, 0, 0, 0x66, 0, 0, 0, 0, 0, 0, 0x11, 0x11, 0, 0, 0, 0, 0, 0, 0x22, 0x22,
        ];
        va / set_va = 0x3000,
        rkey / set_rkey = 0x66,
        swap_add / set_swap_add = 0x1111,
        compare / set_compare = 0x2222,
    }
}
