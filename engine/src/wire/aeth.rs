//! The ACK Extended Transport Header (IBTA Vol 1 9.3.6): syndrome and MSN of an acknowledgement.
//!
//! The syndrome byte (IBTA Vol 1 9.7.5.1, table 42): bit 7 reserved; bits 6-5 the kind
//! (00 ACK, 01 RNR NAK, 11 NAK, 10 reserved); bits 4-0 the credit count code (ACK), the RNR
//! timer code (RNR NAK) or the NAK code.

use core::fmt;

use super::be;

enum_with_unknown! {
    /// The NAK code of a NAK syndrome (IBTA Vol 1 table 43).
    pub enum NakCode(u8) {
        /// PSN sequence error: the responder saw a PSN ahead of the one it expected.
        PsnSequenceError = 0,
        /// Invalid request (unsupported opcode, bad length, ...).
        InvalidRequest = 1,
        /// Remote access error (R_Key, bounds or permission).
        RemoteAccessError = 2,
        /// Remote operational error.
        RemoteOperationalError = 3,
        /// Invalid RD request (reliable datagram).
        InvalidRdRequest = 4,
    }
}

/// A 24-bit Message Sequence Number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Msn(u32);

impl Msn {
    /// Makes an MSN from the low 24 bits of `value`.
    pub const fn new(value: u32) -> Msn {
        Msn(value & 0x00ff_ffff)
    }
    /// The MSN as an integer.
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Msn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The credit count code that means "no credit information" (IBTA 9.7.7.2.5); rxe always
/// sends it.
pub const CREDITS_INVALID: u8 = 0x1f;

/// Credits each credit-count code stands for (IBTA Vol 1 table 44); code 31 is "invalid".
const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
    8192, 12288, 16384, 24576, 32768,
];

/// The number of receive WQEs a credit code advertises, or `None` for the invalid code 31.
pub fn credit_count(code: u8) -> Option<u32> {
    CREDIT_TABLE.get(usize::from(code & 0x1f)).copied()
}

/// The largest credit code that does not overstate `available` receive WQEs.
pub fn credit_code(available: u32) -> u8 {
    CREDIT_TABLE.iter().rposition(|&c| c <= available).unwrap_or(0) as u8
}

/// The RNR NAK timer in nanoseconds for each 5-bit code (IBTA Vol 1 table 45): code 0 is
/// 655.36 ms, code 1 is 0.01 ms, up to 491.52 ms for code 31.
const RNR_TIMER_NS: [u64; 32] = [
    655_360_000,
    10_000,
    20_000,
    30_000,
    40_000,
    60_000,
    80_000,
    120_000,
    160_000,
    240_000,
    320_000,
    480_000,
    640_000,
    960_000,
    1_280_000,
    1_920_000,
    2_560_000,
    3_840_000,
    5_120_000,
    7_680_000,
    10_240_000,
    15_360_000,
    20_480_000,
    30_720_000,
    40_960_000,
    61_440_000,
    81_920_000,
    122_880_000,
    163_840_000,
    245_760_000,
    327_680_000,
    491_520_000,
];

/// How long a requester waits after an RNR NAK with this timer code, in nanoseconds.
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_TIMER_NS[usize::from(code & 0x1f)]
}

/// An AETH syndrome, decoded. Reserved encodings round-trip as [`Syndrome::Reserved`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with a credit count code (31: no credit information).
    Ack {
        /// Credit count code (5 bits); see [`credit_count`].
        credits: u8,
    },
    /// Receiver not ready: retry after the time the timer code names.
    RnrNak {
        /// RNR timer code (5 bits); see [`rnr_timer_ns`].
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A reserved encoding (bit 7 set, or kind 10), kept as received.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte.
    pub fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 0x3 {
            0 => Syndrome::Ack { credits: b & 0x1f },
            1 => Syndrome::RnrNak { timer: b & 0x1f },
            3 => Syndrome::Nak(NakCode::from(b & 0x1f)),
            _ => Syndrome::Reserved(b),
        }
    }

    /// Encodes the syndrome byte.
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | (u8::from(code) & 0x1f),
            Syndrome::Reserved(b) => b,
        }
    }

    /// Whether this is a positive ACK.
    pub fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

mod field {
    use super::super::Field;
    pub(super) const SYNDROME: usize = 0;
    pub(super) const MSN: Field = 1..4;
}

fixed_header_packet!(4, "AETH", "A view of an AETH.");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome_byte())
    }
    /// The message sequence number.
    pub fn msn(&self) -> Msn {
        Msn::new(be::u24(self.buffer.as_ref(), field::MSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = s.to_byte();
    }
    /// Sets the MSN.
    pub fn set_msn(&mut self, m: Msn) {
        be::set_u24(self.buffer.as_mut(), field::MSN, m.value())
    }
}

/// An AETH as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number.
    pub msn: Msn,
}

fixed_header_repr!("an AETH"; syndrome / set_syndrome, msn / set_msn);

#[cfg(test)]
mod test {
    use super::*;

    fixed_header_tests! {
        /// The AETH of golden packet g3: NAK, PSN sequence error, MSN 3.
        static HEADER_BYTES = [0x60, 0, 0, 3];
        syndrome / set_syndrome = Syndrome::Nak(NakCode::PsnSequenceError),
        msn / set_msn = Msn::new(3),
    }

    #[test]
    fn every_syndrome_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b, "syndrome {b:#04x}");
        }
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::Ack { credits: CREDITS_INVALID });
        assert_eq!(Syndrome::from_byte(0x2e), Syndrome::RnrNak { timer: 14 });
        assert_eq!(Syndrome::from_byte(0x62), Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(Syndrome::from_byte(0x6f), Syndrome::Nak(NakCode::Unknown(0xf)));
        assert_eq!(Syndrome::from_byte(0x41), Syndrome::Reserved(0x41));
        assert_eq!(Syndrome::from_byte(0x80), Syndrome::Reserved(0x80));
    }

    #[test]
    fn credit_and_timer_tables() {
        assert_eq!(credit_count(0), Some(0));
        assert_eq!(credit_count(5), Some(6));
        assert_eq!(credit_count(30), Some(32768));
        assert_eq!(credit_count(CREDITS_INVALID), None);
        assert_eq!(credit_code(0), 0);
        assert_eq!(credit_code(7), 5); // 6 credits: never overstate
        assert_eq!(credit_code(1_000_000), 30);
        for code in 0..31u8 {
            assert_eq!(credit_code(credit_count(code).unwrap()), code);
        }
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }
}
