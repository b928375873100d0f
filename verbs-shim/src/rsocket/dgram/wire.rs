//! Datagram rsockets' wire: rdma-core's UDP header (the first datagrams, over the UDP socket)
//! and UD header (every datagram between the QPs), and socket address conversions.

use std::ffi::c_int;
use std::net::SocketAddr;

use crate::rsocket::opts::Addr;

pub(super) const UDP_TAG: u32 = 0x5555_5555;
pub(super) const UDP_HDR_V4: usize = 16;
pub(super) const UDP_HDR_V6: usize = 28;
pub(super) const HDR_V4: usize = 8;
pub(super) const HDR_V6: usize = 24;
pub(super) const GRH_LEN: usize = 40;
pub(super) const OP_DATA: u8 = 0;
pub(super) const OP_CTRL: u8 = 7;
pub(super) const RECV_FLAG: u64 = 1 << 63;

/// A socket address as Rust's, from a sockaddr of this library or the program.
pub(super) fn to_std(a: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: `a` is a sockaddr_in or sockaddr_in6 (checked by family).
    unsafe {
        match (*a).sa_family as c_int {
            libc::AF_INET => {
                let s = &*(a as *const libc::sockaddr_in);
                Some(SocketAddr::from((u32::from_be(s.sin_addr.s_addr).to_be_bytes(), u16::from_be(s.sin_port))))
            }
            libc::AF_INET6 => {
                let s = &*(a as *const libc::sockaddr_in6);
                Some(SocketAddr::from((s.sin6_addr.s6_addr, u16::from_be(s.sin6_port))))
            }
            _ => None,
        }
    }
}

pub(super) fn to_c(a: &SocketAddr) -> Addr {
    let (ss, len) = crate::ksock::sockaddr(a);
    Addr { ss, len }
}

/// The UD header of datagrams from `a` (rdma-core's ds_header).
pub(super) fn ds_header(a: &SocketAddr) -> Vec<u8> {
    let mut h = vec![];
    match a {
        SocketAddr::V4(v) => {
            h.extend([4, HDR_V4 as u8]);
            h.extend(v.port().to_be_bytes());
            h.extend(v.ip().octets());
        }
        SocketAddr::V6(v) => {
            h.extend([6, HDR_V6 as u8]);
            h.extend(v.port().to_be_bytes());
            h.extend(v.flowinfo().to_be_bytes());
            h.extend(v.ip().octets());
        }
    }
    h
}

/// The source a received UD header names, if it is a valid one of at most `avail` bytes.
pub(super) fn parse_header(b: &[u8]) -> Option<(SocketAddr, usize)> {
    match (b.first(), b.get(1)) {
        (Some(4), Some(&l)) if l as usize == HDR_V4 && b.len() >= HDR_V4 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            Some((SocketAddr::from(([b[4], b[5], b[6], b[7]], port)), HDR_V4))
        }
        (Some(6), Some(&l)) if l as usize == HDR_V6 && b.len() >= HDR_V6 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            Some((SocketAddr::V6(std::net::SocketAddrV6::new(ip.into(), port, flow, 0)), HDR_V6))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_headers_are_rdma_cores() {
        let a: SocketAddr = "10.1.2.3:4791".parse().expect("address");
        let h = ds_header(&a);
        assert_eq!(h, [4, 8, 0x12, 0xB7, 10, 1, 2, 3]);
        assert_eq!(parse_header(&h), Some((a, HDR_V4)));
        let v6: SocketAddr = "[fe80::1]:7174".parse().expect("address");
        let h6 = ds_header(&v6);
        assert_eq!(h6.len(), HDR_V6);
        assert_eq!(parse_header(&h6).map(|p| p.0), Some(v6));
        // Untrusted: a wrong length or version, or too few bytes, is no header.
        assert_eq!(parse_header(&[4, 24, 0, 0, 1, 2, 3, 4]), None);
        assert_eq!(parse_header(&[5, 8, 0, 0, 1, 2, 3, 4]), None);
        assert_eq!(parse_header(&h[..6]), None);
    }
}
