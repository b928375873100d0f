//! Payload copies that keep their speed whatever the buffers' addresses.
//!
//! A RoCE payload is copied a few times on its way (read ahead into a packet, packet into a GSO
//! batch, a received segment into the write-behind buffer), 4 KiB at a time at MTU 4096. glibc
//! copies that much with `rep movsb` (above its `rep_movsb_threshold`, 2,112 bytes on CPUs with
//! fast short REP MOV), and on AMD Zen `rep movsb` runs at a twentieth of its speed when the
//! destination lies just above the source modulo 4 KiB (measured on this project's 2-core EPYC
//! machines, 4 KiB copies of cached data: 3.1-3.4 GB/s for a distance of 1-15 bytes, 36-55 GB/s
//! for 16-63, 85-90 GB/s for 0 and 64 on; BENCHMARKS.md, "The 4 KiB aliasing copy"). That is the
//! distance a packet's payload has from the same payload in a page-aligned buffer: the BTH is 12
//! bytes. The sender of `ib_write_bw` spent 38% of its time in that one copy.
//!
//! [`copy_bytes`] and [`extend_bytes`] copy such a payload in pieces small enough for glibc's
//! vector loop (60 GB/s at the same distances); every other copy is one `memcpy`.

/// Largest piece copied at once when source and destination alias: below every glibc
/// `rep_movsb_threshold` (2,112 bytes and more), so the copy takes the vector loop.
const PIECE: usize = 1024;

/// Whether a `len`-byte copy from `src` to `dst` is one that `rep movsb` runs slowly: the
/// destination 1-63 bytes above the source modulo 4 KiB, and long enough for `rep movsb`.
pub fn aliasing(dst: *const u8, src: *const u8, len: usize) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    len > PIECE && (1..64).contains(&d)
}

/// How many bytes to leave free before the place a copy from `src` lands in our buffer, starting
/// at `dst`, so that the kernel's copy (`process_vm_readv`, `recvmsg`: `rep movsb` too) does not
/// alias ([`aliasing`]): 0 when it does not already, else the 1-63 bytes that put the
/// destination 64 bytes above the source modulo 4 KiB.
pub fn lead_in(dst: *const u8, src: u64) -> usize {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    if (1..64).contains(&d) {
        64 - d
    } else {
        0
    }
}

/// How many bytes to leave free before the place in our buffer, starting at `src`, from which
/// the kernel copies to `dst` (`process_vm_writev`, `sendmsg`), so that the copy does not alias
/// ([`aliasing`]): 0 when it does not already, else the 1-63 bytes that put the destination at
/// the same place as the source modulo 4 KiB.
pub fn lead_out(dst: u64, src: *const u8) -> usize {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    if (1..64).contains(&d) {
        d
    } else {
        0
    }
}

/// `dst.copy_from_slice(src)`, in pieces when the two alias ([`aliasing`]).
///
/// # Panics
/// When the lengths differ, as `copy_from_slice`.
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: destination and source lengths differ");
    if aliasing(dst.as_ptr(), src.as_ptr(), src.len()) {
        for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
            d.copy_from_slice(s);
        }
    } else {
        dst.copy_from_slice(src);
    }
}

/// `v.extend_from_slice(src)`, in pieces when the bytes' new place aliases `src` ([`aliasing`]).
pub fn extend_bytes(v: &mut Vec<u8>, src: &[u8]) {
    v.reserve(src.len());
    // After the reserve the vector does not move while it grows by `src.len()`.
    let end = v.as_ptr().wrapping_add(v.len());
    if aliasing(end, src.as_ptr(), src.len()) {
        for s in src.chunks(PIECE) {
            v.extend_from_slice(s);
        }
    } else {
        v.extend_from_slice(src);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn the_aliasing_distances_are_1_to_63_bytes_above_modulo_4_kib() {
        let base = 0x10_0000usize as *const u8;
        let at = |d: usize| base.wrapping_add(d);
        for d in [0, 64, 100, 4032, 4095, 4096, 8192] {
            assert!(!aliasing(at(d), base, 4096), "distance {d}");
        }
        for d in [1, 12, 28, 63, 4096 + 12, 3 * 4096 + 1] {
            assert!(aliasing(at(d), base, 4096), "distance {d}");
        }
        // Below the piece size a copy is one memcpy whatever the distance.
        assert!(!aliasing(at(12), base, PIECE));
        assert!(aliasing(at(12), base, PIECE + 1));
    }

    #[test]
    fn copies_every_byte_at_every_distance_and_length() {
        let src = pattern(3 * 4096 + 64);
        let mut dst = vec![0u8; 4 * 4096 + 128];
        for len in [0, 1, 1023, 1024, 1025, 2048, 4096, 4097, 3 * 4096 + 7] {
            for d in [0, 1, 5, 12, 28, 63, 64, 65, 4095] {
                let s = &src[..len];
                // Put the destination `d` bytes above the source modulo 4 KiB.
                let want = (src.as_ptr() as usize).wrapping_add(d) & 4095;
                let off = (want.wrapping_sub(dst.as_ptr() as usize)) & 4095;
                dst.fill(0xEE);
                copy_bytes(&mut dst[off..off + len], s);
                assert_eq!(&dst[off..off + len], s, "len {len} distance {d}");
                assert!(dst[..off].iter().all(|b| *b == 0xEE), "wrote before, len {len} distance {d}");
                assert!(dst[off + len..].iter().all(|b| *b == 0xEE), "wrote after, len {len} distance {d}");
            }
        }
    }

    #[test]
    fn extends_with_every_byte_whatever_the_vector_holds() {
        let src = pattern(2 * 4096 + 100);
        for len in [0, 7, 1024, 1025, 4096, 2 * 4096 + 100] {
            for d in [0, 1, 12, 28, 63, 64, 4095] {
                let mut v: Vec<u8> = Vec::with_capacity(8 * 4096);
                // Hold as many bytes as put the new ones `d` above the source modulo 4 KiB.
                let held = ((src.as_ptr() as usize).wrapping_add(d).wrapping_sub(v.as_ptr() as usize)) & 4095;
                v.extend(pattern(held));
                let end = v.as_ptr().wrapping_add(held);
                assert_eq!(aliasing(end, src.as_ptr(), len), len > PIECE && (1..64).contains(&d));
                extend_bytes(&mut v, &src[..len]);
                assert_eq!(v.len(), held + len);
                assert_eq!(&v[..held], &pattern(held)[..], "held bytes changed, len {len} distance {d}");
                assert_eq!(&v[held..], &src[..len], "len {len} distance {d}");
            }
        }
    }

    #[test]
    fn a_lead_takes_a_kernel_copy_out_of_the_aliasing_distances() {
        let base = 0x20_0000usize;
        for d in 0..4096 {
            // Into our buffer at `dst` from the owner's `src`: we may start later.
            let (dst, src) = ((base + d) as *const u8, base as u64);
            let lead = lead_in(dst, src);
            assert!(lead < 64);
            assert_eq!(lead == 0, !(1..64).contains(&d), "distance {d}");
            assert!(!aliasing(dst.wrapping_add(lead), src as *const u8, 4096), "distance {d} lead {lead}");
            // Out of our buffer at `src` to the owner's `dst`: we may start later.
            let (dst, src) = ((base + d) as u64, base as *const u8);
            let lead = lead_out(dst, src);
            assert!(lead < 64);
            assert!(!aliasing(dst as *const u8, src.wrapping_add(lead), 4096), "distance {d} lead {lead}");
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn copy_bytes_refuses_lengths_that_differ() {
        copy_bytes(&mut [0u8; 3], &[1, 2]);
    }
}
