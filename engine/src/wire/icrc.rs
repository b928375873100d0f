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

/// The most bytes copied (and masked) into a stack buffer before hashing: a packet this short is
/// hashed whole in one call with the 8 bytes of 0xFF. A longer one copies only up to its last
/// masked byte (at most 80 bytes in: IPv4 with 40 bytes of options) and hashes the rest straight
/// from its buffer: crc32fast's wide (PCLMULQDQ) path, which it takes for 64 bytes and more,
/// costs a fixed setup per call, and a short prefix is cheaper through its table path
/// (4 KiB packet: ~79 ns against ~97 with a 120-byte prefix).
const PREFIX: usize = 120;

fn mask_ipv6_like(b: &mut [u8]) {
    b[0] |= 0x0f; // traffic class, high nibble
    b[1] = 0xff; // traffic class low nibble, flow label high nibble
    b[2] = 0xff;
    b[3] = 0xff;
    b[7] = 0xff; // hop limit
}

/// CRC-32 over 8 x 0xFF, then `data` with `mask` applied to a copy of its first bytes: all of
/// them if they fit the copy, else its first `masked_end` (the masked fields all lie before;
/// see `roce_v2_parts` for why no more).
fn crc_masked(data: &[u8], masked_end: usize, mask: impl FnOnce(&mut [u8])) -> u32 {
    let mut buf = [0xffu8; 8 + PREFIX];
    let n = if data.len() <= PREFIX { data.len() } else { masked_end };
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
    Ok(crc_masked(l3, ip_len + udp::HEADER_LEN + bth::FECN_BECN_OFFSET + 1, |p| mask_v2(p, ip_len, v6)))
}

/// The ICRC of a RoCEv1 packet. `grh` runs from the first byte of the GRH to the end of the pad,
/// without the ICRC.
pub fn roce_v1(grh: &[u8]) -> Result<u32> {
    if grh.len() < ipv6::HEADER_LEN + bth::HEADER_LEN {
        return Err(Error::Truncated("BTH"));
    }
    Ok(crc_masked(grh, ipv6::HEADER_LEN + bth::FECN_BECN_OFFSET + 1, |p| {
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
    // with the 8 bytes of 0xFF, then the rest straight from the caller's buffer. A packet that
    // does not fit whole copies only as far as the last masked byte (the BTH's FECN/BECN byte;
    // see PREFIX).
    let mut buf = [0xffu8; 8 + PREFIX];
    let h = ip_udp.len();
    let t = if transport.len() <= PREFIX - h { transport.len() } else { bth::FECN_BECN_OFFSET + 1 };
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

    /// Packets of every length around the masked copy's size, and of 4 KiB, over IPv4 and IPv6:
    /// each way of computing the ICRC equals the CRC of a fully masked copy, whichever part of
    /// the packet the masked copy holds.
    #[test]
    fn every_length_equals_a_fully_masked_copy() {
        let reference = |p: &[u8], masked: &[usize]| {
            let mut m = vec![0xffu8; 8];
            m.extend_from_slice(p);
            for &i in masked {
                // Only the low nibble of an IPv6 header's first byte (traffic class) is masked.
                m[8 + i] = if i == 0 { m[8] | 0x0f } else { 0xff };
            }
            crc32fast::hash(&m)
        };
        for v6 in [false, true] {
            let ip_len = if v6 { 40 } else { 20 };
            let masked: Vec<usize> = if v6 { vec![0, 1, 2, 3, 7] } else { vec![1, 8, 10, 11] }
                .into_iter()
                .chain([ip_len + 6, ip_len + 7, ip_len + 8 + 4])
                .collect();
            for payload in (0..200).chain([4096, 4096 + 3]) {
                let len = ip_len + 8 + 12 + payload;
                let mut p: Vec<u8> = (0..len).map(|i| (i * 31 + payload) as u8).collect();
                p[0] = if v6 { 0x6a } else { 0x45 };
                let want = reference(&p, &masked);
                assert_eq!(roce_v2(&p).unwrap(), want, "v6 {v6} payload {payload}");
                assert_eq!(roce_v2_parts(&p[..ip_len + 8], &p[ip_len + 8..]).unwrap(), want);
                // The masked fields do not count.
                let mut q = p.clone();
                for &i in &masked {
                    q[i] ^= if i == 0 { 0x05 } else { 0x5a };
                }
                assert_eq!(roce_v2(&q).unwrap(), want);
                assert_eq!(roce_v2_parts(&q[..ip_len + 8], &q[ip_len + 8..]).unwrap(), want);
                if v6 {
                    // RoCEv1: a GRH (IPv6-like) and the BTH, no UDP header.
                    let g = &p[8..];
                    let gm: Vec<usize> = vec![0, 1, 2, 3, 7, 40 + 4];
                    assert_eq!(roce_v1(g).unwrap(), reference(g, &gm), "v1 payload {payload}");
                }
            }
        }
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

/// The reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xedb8_8320;

/// The raw (no pre- or post-inversion) reflected CRC-32 register after `data`, from `crc`.
fn raw_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (POLY & (crc & 1).wrapping_neg());
        }
    }
    crc
}

fn gf2_times(mat: &[u32; 32], mut vec: u32) -> u32 {
    let mut sum = 0;
    let mut i = 0;
    while vec != 0 {
        if vec & 1 != 0 {
            sum ^= mat[i];
        }
        vec >>= 1;
        i += 1;
    }
    sum
}

fn gf2_square(mat: &[u32; 32]) -> [u32; 32] {
    let mut sq = [0u32; 32];
    for (n, s) in sq.iter_mut().enumerate() {
        *s = gf2_times(mat, mat[n]);
    }
    sq
}

/// The linear operator "append `n` zero bytes" on a raw CRC register, as a 32x32 GF(2) matrix
/// (the square-and-multiply construction zlib's crc32_combine uses).
fn zeros_operator(mut n: usize) -> [u32; 32] {
    // Identity.
    let mut result = [0u32; 32];
    for (i, r) in result.iter_mut().enumerate() {
        *r = 1 << i;
    }
    // The operator for one zero bit, then squared to one zero byte.
    let mut op = [0u32; 32];
    op[0] = POLY;
    for (i, o) in op.iter_mut().enumerate().skip(1) {
        *o = 1 << (i - 1);
    }
    let op2 = gf2_square(&op);
    let op4 = gf2_square(&op2);
    let mut byte_op = gf2_square(&op4);
    while n > 0 {
        if n & 1 != 0 {
            let mut next = [0u32; 32];
            for (i, r) in next.iter_mut().enumerate() {
                *r = gf2_times(&byte_op, result[i]);
            }
            result = next;
        }
        n >>= 1;
        if n > 0 {
            byte_op = gf2_square(&byte_op);
        }
    }
    result
}

/// Finds an IPv4 identification for which the ICRC of a RoCEv2 packet over IPv4 is right, when the
/// receiver cannot see the ID (a plain UDP socket; docs/architecture.md D5). `ip_udp` holds the
/// IPv4 and UDP headers as rebuilt by the receiver (its ID field is ignored); `transport` is the
/// UDP payload with the ICRC.
///
/// The CRC is linear over GF(2), so the ICRC of the packet with ID `id` is the ICRC with ID 0
/// XOR a linear function of the 16 ID bits: a 32 x 16 system, solved by elimination. A corrupted
/// packet still passes with probability about 2^-16 (against 2^-32 with the ID known); IPv6 has no
/// ID and is checked exactly.
pub fn solve_ipv4_id(ip_udp: &[u8], transport: &[u8]) -> Option<u16> {
    if ip_udp.len() < ipv4::HEADER_LEN + udp::HEADER_LEN
        || ip_udp[0] >> 4 != 4
        || transport.len() < bth::HEADER_LEN + LEN
    {
        return None;
    }
    let body = &transport[..transport.len() - LEN];
    let stored = stored(transport)?;
    let mut zero_id = [0u8; 60 + udp::HEADER_LEN];
    let hl = ip_udp.len().min(zero_id.len());
    zero_id[..hl].copy_from_slice(&ip_udp[..hl]);
    zero_id[4] = 0;
    zero_id[5] = 0;
    let c0 = roce_v2_parts(&zero_id[..hl], body).ok()?;
    let target = c0 ^ stored;
    if target == 0 {
        return Some(0);
    }
    // Bytes of the CRC input after the ID field: the rest of the headers, then the body.
    let after = (hl - 6) + body.len();
    let shift = zeros_operator(after);
    // Column k: the effect on the CRC of bit k of the ID (the field is big-endian).
    let mut cols = [0u32; 16];
    for (k, c) in cols.iter_mut().enumerate() {
        let id = 1u16 << k;
        *c = gf2_times(&shift, raw_update(0, &id.to_be_bytes()));
    }
    // Gaussian elimination over GF(2): a basis of columns, each with the ID bits that make it.
    let mut basis: Vec<(u32, u16)> = Vec::with_capacity(16);
    for (k, &c) in cols.iter().enumerate() {
        let (mut v, mut m) = (c, 1u16 << k);
        for &(b, bm) in &basis {
            if v ^ b < v {
                v ^= b;
                m ^= bm;
            }
        }
        if v != 0 {
            basis.push((v, m));
            basis.sort_by_key(|b| std::cmp::Reverse(b.0));
        }
    }
    let (mut v, mut m) = (target, 0u16);
    for &(b, bm) in &basis {
        if v ^ b < v {
            v ^= b;
            m ^= bm;
        }
    }
    (v == 0).then_some(m)
}

#[cfg(test)]
mod solve_test {
    use super::*;

    #[test]
    fn zeros_operator_matches_crc_of_zero_bytes() {
        for n in [0usize, 1, 2, 7, 64, 1000, 4157] {
            let r = 0x1234_5678u32;
            let direct = raw_update(r, &vec![0u8; n]);
            assert_eq!(gf2_times(&zeros_operator(n), r), direct, "n = {n}");
        }
    }

    #[test]
    fn finds_the_id_a_sender_used() {
        // Golden packet g1 with its IPv4 ID set to each of several values and the ICRC recomputed:
        // the solver, told nothing of the ID, finds it.
        let g1: Vec<u8> = (0..148)
            .step_by(2)
            .map(|i| u8::from_str_radix(&"02000000000202000000000108004500003c000040004011b6adc0000201c0000202c00012b7002800000400ffff000000128000000148656c6c6f2c20526f43457632212121aae4f0d2"[i..i + 2], 16).unwrap())
            .collect();
        for id in [0u16, 1, 2, 0x718c, 0xffff, 0x8000] {
            let mut f = g1.clone();
            f[18..20].copy_from_slice(&id.to_be_bytes());
            let l3 = &f[14..];
            let crc = roce_v2(&l3[..l3.len() - 4]).unwrap();
            let n = f.len();
            f[n - 4..].copy_from_slice(&crc.to_le_bytes());
            let got = solve_ipv4_id(&f[14..42], &f[42..]).expect("solvable");
            assert_eq!(got, id);
            // A flipped payload bit is (almost always) not explained by any ID.
            let mut bad = f.clone();
            bad[60] ^= 0x04;
            assert_eq!(solve_ipv4_id(&bad[14..42], &bad[42..]), None);
        }
    }
}
