//! The Internet checksum (RFC 1071) used by the IPv4 header and UDP.

/// Adds `data` to a running ones'-complement sum (not yet folded).
pub fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// Folds a running sum into 16 bits (ones' complement addition), without complementing.
pub fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum of `data`: the complement of the folded sum.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(0, data))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: the sum of 0001 f203 f4f5 f6f7 is ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(0, &data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(fold(sum(0, &[0x12])), 0x1200);
    }
}
