//! The Atomic Acknowledge Extended Transport Header (IBTA Vol 1 9.3.6): the original value at
//! the target of an atomic operation.

use super::be;

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

fixed_header_repr!("an AtomicAckETH"; orig_rem_data / set_orig_rem_data);

#[cfg(test)]
mod test {
    use super::*;

    fixed_header_tests! {
        static HEADER_BYTES = [0, 0, 0, 0, 0, 0, 0x22, 0x22];
        orig_rem_data / set_orig_rem_data = 0x2222,
    }
}
