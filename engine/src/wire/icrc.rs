//! The Invariant CRC (ICRC) of RoCE packets.
//!
//! RoCEv2 (IBTA Annex A17.4.3.1, verified against thousands of hardware packets; see
//! `../shared/reference/wire/README.md`): a standard CRC-32 (IEEE 802.3, the zlib one) over
//! eight bytes of 0xFF (standing in for the LRH), then the IP header, UDP header, BTH,
//! extension headers, payload and pad, with the variant fields set to all ones:
//! IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and hop limit; the UDP
//! checksum; the BTH byte holding FECN, BECN and 6 reserved bits. The IPv4 identification is
//! covered. The CRC is appended least-significant byte first.
//!
//! RoCEv1 (Annex A16): the same over the GRH instead of IP and UDP (GRH traffic class, flow label
//! and hop limit masked).

use super::{bth, ipv4, ipv6, udp, Error, Result};

/// Length of the ICRC.
pub const LEN: usize = 4;

/// CRC-32 over any data followed by its own CRC (least-significant byte first) yields this.
pub const RESIDUE: u32 = 0x2144_df1c;

/// Bytes copied (and masked) into a stack buffer before hashing. Hashing them in one call with
/// the 8 bytes of 0xFF lets crc32fast use its wide (PCLMULQDQ) path, which needs at least 128
/// bytes; the masked fields all lie in the first 80 bytes (IPv4 with 40 bytes of options).
const PREFIX: usize = 120;

fn mask_ipv6_like(b: &mut [u8]) {
    b[0] |= 0x0f; // traffic class, high nibble
    b[1] = 0xff; // traffic class low nibble, flow label high nibble
    b[2] = 0xff;
    b[3] = 0xff;
    b[7] = 0xff; // hop limit
}

/// CRC-32 over 8 x 0xFF, then `data` with `mask` applied to a copy of its first bytes.
fn crc_masked(data: &[u8], mask: impl FnOnce(&mut [u8])) -> u32 {
    let mut buf = [0xffu8; 8 + PREFIX];
    let n = data.len().min(PREFIX);
    buf[8..8 + n].copy_from_slice(&data[..n]);
    mask(&mut buf[8..8 + n]);
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..8 + n]);
    h.update(&data[n..]);
    h.finalize()
}

/// The ICRC of a RoCEv2 packet. `l3` runs from the first byte of the IPv4 or IPv6 header to the
/// end of the pad, without the ICRC itself.
pub fn roce_v2(l3: &[u8]) -> Result<u32> {
    let first = *l3.first().ok_or(Error::Truncated("IP header"))?;
    let (ip_len, v6) = match first >> 4 {
        4 => (usize::from(first & 0x0f) * 4, false),
        6 => (ipv6::HEADER_LEN, true),
        _ => return Err(Error::Malformed("not an IPv4 or IPv6 header")),
    };
    if ip_len < ipv4::HEADER_LEN {
        return Err(Error::Malformed("IPv4 header length below 20 bytes"));
    }
    if l3.len() < ip_len + udp::HEADER_LEN + bth::HEADER_LEN {
        return Err(Error::Truncated("BTH"));
    }
    Ok(crc_masked(l3, |p| mask_v2(p, ip_len, v6)))
}

/// The ICRC of a RoCEv1 packet. `grh` runs from the first byte of the GRH to the end of the pad,
/// without the ICRC.
pub fn roce_v1(grh: &[u8]) -> Result<u32> {
    if grh.len() < ipv6::HEADER_LEN + bth::HEADER_LEN {
        return Err(Error::Truncated("BTH"));
    }
    Ok(crc_masked(grh, |p| {
        mask_ipv6_like(p);
        p[ipv6::HEADER_LEN + bth::FECN_BECN_OFFSET] = 0xff;
    }))
}

/// The ICRC of a RoCEv2 packet given as its parts: the IPv4 or IPv6 header and the UDP header as
/// they are (or would be) on the wire, and the transport packet without its ICRC. A receiver that
/// only sees the UDP payload rebuilds the headers from what the socket tells it; a sender computes
/// the ICRC before the kernel writes the real headers.
pub fn roce_v2_parts(ip_udp: &[u8], transport: &[u8]) -> Result<u32> {
    let first = *ip_udp.first().ok_or(Error::Truncated("IP header"))?;
    let (ip_len, v6) = match first >> 4 {
        4 => (usize::from(first & 0x0f) * 4, false),
        6 => (ipv6::HEADER_LEN, true),
        _ => return Err(Error::Malformed("not an IPv4 or IPv6 header")),
    };
    if ip_len < ipv4::HEADER_LEN || ip_udp.len() != ip_len + udp::HEADER_LEN {
        return Err(Error::Malformed("IP and UDP headers of the wrong length"));
    }
    if transport.len() < bth::HEADER_LEN {
        return Err(Error::Truncated("BTH"));
    }
    // One masked copy of the headers and the start of the transport packet, hashed in one call
    // with the 8 bytes of 0xFF, then the rest straight from the caller's buffer.
    let mut buf = [0xffu8; 8 + PREFIX];
    let h = ip_udp.len();
    let t = transport.len().min(PREFIX - h);
    buf[8..8 + h].copy_from_slice(ip_udp);
    buf[8 + h..8 + h + t].copy_from_slice(&transport[..t]);
    mask_v2(&mut buf[8..8 + h + t], ip_len, v6);
    let mut c = crc32fast::Hasher::new();
    c.update(&buf[..8 + h + t]);
    c.update(&transport[t..]);
    Ok(c.finalize())
}

/// Sets the ICRC's variant fields of a RoCEv2 packet (IP header of `ip_len` bytes first) to ones.
fn mask_v2(p: &mut [u8], ip_len: usize, v6: bool) {
    if v6 {
        mask_ipv6_like(p);
    } else {
        p[1] = 0xff; // TOS
        p[8] = 0xff; // TTL
        p[10] = 0xff; // header checksum
        p[11] = 0xff;
    }
    p[ip_len + 6] = 0xff; // UDP checksum
    p[ip_len + 7] = 0xff;
    p[ip_len + udp::HEADER_LEN + bth::FECN_BECN_OFFSET] = 0xff;
}

/// Reads the ICRC stored in the last four bytes of `packet` (least-significant byte first).
pub fn stored(packet: &[u8]) -> Option<u32> {
    let n = packet.len().checked_sub(LEN)?;
    let b = &packet[n..];
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Checks the ICRC of a whole RoCEv2 packet (`l3` from the IP header through the ICRC).
pub fn verify_roce_v2(l3: &[u8]) -> Result<bool> {
    let body = l3.len().checked_sub(LEN).ok_or(Error::Truncated("ICRC"))?;
    Ok(roce_v2(&l3[..body])? == stored(l3).unwrap_or(0))
}

/// Checks the ICRC of a whole RoCEv1 packet (`grh` from the GRH through the ICRC).
pub fn verify_roce_v1(grh: &[u8]) -> Result<bool> {
    let body = grh.len().checked_sub(LEN).ok_or(Error::Truncated("ICRC"))?;
    Ok(roce_v1(&grh[..body])? == stored(grh).unwrap_or(0))
}

#[cfg(test)]
mod test {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    // Golden packet g1 (Ethernet frame): its L3 part starts at byte 14.
    const G1: &str = "02000000000202000000000108004500003c000040004011b6adc0000201c0000202c00012b7002800000400ffff000000128000000148656c6c6f2c20526f43457632212121aae4f0d2";
    // Golden packet g5 (IPv6).
    const G5: &str = "02000000000202000000000186dd66a123450034114020010db800000000000000000000000120010db8000000000000000000000002c00412b7003400000b80ffff0000007780ffffff00000000000010001234567800000008deadbeef010203040506070803008677";

    #[test]
    fn golden_ipv4() {
        let f = hex(G1);
        let l3 = &f[14..];
        assert_eq!(roce_v2(&l3[..l3.len() - 4]).unwrap(), 0xd2f0_e4aa);
        assert!(verify_roce_v2(l3).unwrap());
    }

    #[test]
    fn golden_ipv6() {
        let f = hex(G5);
        assert_eq!(roce_v2(&f[14..f.len() - 4]).unwrap(), 0x7786_0003);
    }

    #[test]
    fn residue_property() {
        let f = hex(G1);
        let l3 = &f[14..];
        let icrc = roce_v2(&l3[..l3.len() - 4]).unwrap();
        // Masked bytes do not matter; covered ones do.
        let mut m = l3.to_vec();
        m[1] = 0x12; // TOS
        m[8] = 1; // TTL
        m[20 + 8 + 4] = 0xc0; // FECN/BECN
        assert_eq!(roce_v2(&m[..m.len() - 4]).unwrap(), icrc);
        m[5] = 7; // IPv4 ID is covered
        assert_ne!(roce_v2(&m[..m.len() - 4]).unwrap(), icrc);
        let mut masked = vec![0xffu8; 8];
        masked.extend_from_slice(l3);
        masked[8 + 1] = 0xff;
        masked[8 + 8] = 0xff;
        masked[8 + 10] = 0xff;
        masked[8 + 11] = 0xff;
        masked[8 + 26] = 0xff;
        masked[8 + 27] = 0xff;
        masked[8 + 32] = 0xff;
        assert_eq!(crc32fast::hash(&masked), RESIDUE);
    }

    #[test]
    fn parts_equal_whole() {
        let f = hex(G1);
        let l3 = &f[14..f.len() - 4];
        assert_eq!(roce_v2_parts(&l3[..28], &l3[28..]).unwrap(), 0xd2f0_e4aa);
        let f = hex(G5);
        let l3 = &f[14..f.len() - 4];
        assert_eq!(roce_v2_parts(&l3[..48], &l3[48..]).unwrap(), 0x7786_0003);
    }

    #[test]
    fn short_inputs_are_errors() {
        assert!(roce_v2(&[]).is_err());
        assert!(roce_v2(&[0x45; 30]).is_err());
        assert!(roce_v2(&[0x41; 60]).is_err());
        assert!(roce_v1(&[0x60; 51]).is_err());
        assert!(verify_roce_v2(&[0x45, 0, 0]).is_err());
    }
}
