//! The Datagram Extended Transport Header (IBTA Vol 1 9.3.2): Q_Key and source QP of a UD packet.

use super::{be, Qpn};

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

fixed_header_repr!("a DETH"; qkey / set_qkey, src_qp / set_src_qp);

#[cfg(test)]
mod test {
    use super::*;

    fixed_header_tests! {
        /// The DETH of golden packet g4.
        static HEADER_BYTES = [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x46];
        qkey / set_qkey = 0x1111_1111,
        src_qp / set_src_qp = Qpn::new(0x46),
    }
}
