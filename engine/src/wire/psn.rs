//! The 24-bit Packet Sequence Number with modular ordering.

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, Sub};

/// A Packet Sequence Number: 24 bits, compared modulo 2^24 (IBTA Vol 1 9.7.1).
///
/// `a < b` when `b` is ahead of `a` by less than half the sequence space (2^23). Two PSNs exactly
/// 2^23 apart are incomparable (`partial_cmp` returns `None`): the IBTA window rules never need
/// to order them, and pretending otherwise would break antisymmetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The PSN field mask (24 bits).
    pub const MASK: u32 = 0x00ff_ffff;
    /// Half of the PSN space: the IBTA window for "ahead" and "behind".
    pub const HALF: u32 = 1 << 23;

    /// Makes a PSN from the low 24 bits of `value`.
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    /// The PSN as a plain integer in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The signed distance `self - other` in `(-2^23, 2^23]`, modulo 2^24.
    pub const fn distance(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to sign-extend it.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

impl Add<u32> for Psn {
    type Output = Psn;
    fn add(self, rhs: u32) -> Psn {
        Psn::new(self.0.wrapping_add(rhs))
    }
}

impl Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, rhs: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(rhs))
    }
}

impl Sub<Psn> for Psn {
    type Output = i32;
    fn sub(self, rhs: Psn) -> i32 {
        self.distance(rhs)
    }
}

impl PartialOrd for Psn {
    fn partial_cmp(&self, other: &Psn) -> Option<Ordering> {
        let d = self.0.wrapping_sub(other.0) & Self::MASK;
        match d {
            0 => Some(Ordering::Equal),
            d if d == Self::HALF => None,
            d if d < Self::HALF => Some(Ordering::Greater),
            _ => Some(Ordering::Less),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn masks_to_24_bits() {
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
        assert_eq!(Psn::new(0xff_ffff) + 1, Psn::new(0));
        assert_eq!(Psn::new(0) - 1, Psn::new(0xff_ffff));
    }

    #[test]
    fn orders_across_wraparound() {
        let last = Psn::new(0xff_fffe);
        let first = Psn::new(3);
        assert!(last < first);
        assert!(first > last);
        assert_eq!(first - last, 5);
        assert_eq!(last - first, -5);
        assert!(Psn::new(10) > Psn::new(9));
        assert!(Psn::new(9) < Psn::new(10));
        assert!(Psn::new(7) <= Psn::new(7));
    }

    #[test]
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn half_space_is_incomparable() {
        let a = Psn::new(0);
        let b = Psn::new(Psn::HALF);
        assert_eq!(a.partial_cmp(&b), None);
        assert_eq!(b.partial_cmp(&a), None);
        assert!(!(a < b) && !(b < a));
        // One step closer and the order is defined again, in both directions.
        assert!(Psn::new(Psn::HALF - 1) > a);
        assert!(Psn::new(Psn::HALF + 1) < a);
    }

    #[test]
    fn distance_range() {
        assert_eq!(Psn::new(Psn::HALF - 1).distance(Psn::new(0)), (Psn::HALF - 1) as i32);
        assert_eq!(Psn::new(Psn::HALF + 1).distance(Psn::new(0)), -((Psn::HALF - 1) as i32));
    }
}
