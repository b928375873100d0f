//! The relay: datagrams the kernel handed to the wrong member of a steered port go on to the
//! member that owns their destination QP (the data-path issue, item 2).
//!
//! A member can receive another member's datagrams when a NIC's GRO merged a run of one flow
//! whose segments name QPs of several processes (a UD QP reaching QPs of several processes, a
//! foreign sender mixing destination QPs in one flow, or any sender's GSO send that does): the
//! kernel picks the socket for the whole run by its first segment ([`crate::steer`]). Every
//! receiver therefore checks each segment's destination QPN against what it handles, and hands
//! the others on with what the kernel said about them (source address and port, destination
//! address, place in the GRO run: the ICRC covers the headers, so the owner needs them).
//!
//! The links: when a client joins the steered port, the daemon makes a Unix datagram socket pair,
//! keeps one end and hands the other over with the member socket. A client sends what is not its
//! own to the daemon; the daemon handles what is its own (QP1, XRC targets, the device path's QPs)
//! and passes the rest on the owner's link. A datagram crosses at most two links and never goes
//! back the way it came. A link that is full drops the datagram, as a full socket buffer does
//! (the transport's retries cover connected QPs; UD may lose it, as on a wire).
//!
//! A socket pair's sender is limited by its send buffer only (the kernel's datagram queue limit
//! applies to unconnected peers), so a burst of a GRO run's segments fits.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixDatagram;

/// Bytes of a frame before the datagram: version, flags, source port, place in the GRO run, a
/// reserved pair, the source address, the destination address (16 bytes each).
pub const HEADER_LEN: usize = 40;

/// The largest UDP payload a frame carries (an IPv4 datagram's most).
pub const MAX_PAYLOAD: usize = 65_507;

/// The largest frame.
pub const MAX_FRAME: usize = HEADER_LEN + MAX_PAYLOAD;

const VERSION: u8 = 1;
const SRC_V6: u8 = 1;
const HAS_DST: u8 = 2;
const DST_V6: u8 = 4;

/// Send buffer asked for on each end (the kernel caps it at `net.core.wmem_max`).
const LINK_BUFFER: usize = 4 << 20;

/// A misdelivered datagram and what the kernel said about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The sender's address and UDP source port.
    pub src: SocketAddr,
    /// The destination address, when it is not the device's own (a multicast group).
    pub dst: Option<IpAddr>,
    /// Its place in a GRO run (0: it came alone), the IPv4 ID hint of the ICRC check.
    pub segment: u16,
    /// The UDP payload: BTH through ICRC.
    pub payload: &'a [u8],
}

fn put_addr(out: &mut [u8], a: IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => {
            out[..4].copy_from_slice(&a.octets());
            false
        }
        IpAddr::V6(a) => {
            out.copy_from_slice(&a.octets());
            true
        }
    }
}

fn get_addr(b: &[u8], v6: bool) -> IpAddr {
    if v6 {
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[..16]);
        IpAddr::V6(Ipv6Addr::from(o))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    }
}

/// Appends `f` as a frame to `out`. A payload beyond [`MAX_PAYLOAD`] is no UDP datagram's: it
/// is not encoded (false).
pub fn encode(out: &mut Vec<u8>, f: &Frame<'_>) -> bool {
    if f.payload.len() > MAX_PAYLOAD {
        return false;
    }
    let mut h = [0u8; HEADER_LEN];
    h[0] = VERSION;
    let mut flags = 0;
    if put_addr(&mut h[8..24], f.src.ip()) {
        flags |= SRC_V6;
    }
    if let Some(d) = f.dst {
        flags |= HAS_DST;
        if put_addr(&mut h[24..40], d) {
            flags |= DST_V6;
        }
    }
    h[1] = flags;
    h[2..4].copy_from_slice(&f.src.port().to_be_bytes());
    h[4..6].copy_from_slice(&f.segment.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(f.payload);
    true
}

/// The frame in `buf`, or `None` if it is not one (another version, unknown flags, too short or
/// too long). The datagram itself is the receiver's to validate, as any from the wire.
pub fn decode(buf: &[u8]) -> Option<Frame<'_>> {
    if buf.len() < HEADER_LEN || buf.len() > MAX_FRAME || buf[0] != VERSION {
        return None;
    }
    let flags = buf[1];
    if flags & !(SRC_V6 | HAS_DST | DST_V6) != 0 || buf[6..8] != [0, 0] {
        return None;
    }
    let src = get_addr(&buf[8..24], flags & SRC_V6 != 0);
    let port = u16::from_be_bytes([buf[2], buf[3]]);
    let dst = (flags & HAS_DST != 0).then(|| get_addr(&buf[24..40], flags & DST_V6 != 0));
    Some(Frame {
        src: SocketAddr::new(src, port),
        dst,
        segment: u16::from_be_bytes([buf[4], buf[5]]),
        payload: &buf[HEADER_LEN..],
    })
}

/// One end of a link between a member and the daemon: nonblocking and close-on-exec.
#[derive(Debug)]
pub struct Link {
    sock: UnixDatagram,
}

impl Link {
    /// A new link: this end, and the other end's descriptor to hand over.
    pub fn pair() -> io::Result<(Link, OwnedFd)> {
        let (a, b) = UnixDatagram::pair()?;
        let theirs = Link::new(b)?;
        Ok((Link::new(a)?, theirs.sock.into()))
    }

    /// The end of a link handed over as `fd`.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Link> {
        Link::new(UnixDatagram::from(fd))
    }

    fn new(sock: UnixDatagram) -> io::Result<Link> {
        sock.set_nonblocking(true)?;
        let _ = socket2::SockRef::from(&sock).set_send_buffer_size(LINK_BUFFER);
        Ok(Link { sock })
    }

    /// Sends one frame; `WouldBlock` when the link is full (the frame is then lost).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.sock.send(frame).map(|_| ())
    }

    /// The next frame into `buf` (at least [`MAX_FRAME`] bytes, or longer frames are cut and then
    /// refused by [`decode`]); `None` when none waits.
    pub fn recv<'b>(&self, buf: &'b mut [u8]) -> io::Result<Option<&'b [u8]>> {
        match self.sock.recv(buf) {
            Ok(n) => Ok(Some(&buf[..n])),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for Link {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let v4: SocketAddr = "10.1.2.3:49152".parse().unwrap();
        let v6: SocketAddr = "[fd00::5]:4791".parse().unwrap();
        let payload: Vec<u8> = (0..300).map(|i| i as u8).collect();
        for (src, dst) in [(v4, None), (v6, Some("fd00::1".parse().unwrap())), (v4, Some("239.1.1.1".parse().unwrap()))]
        {
            let f = Frame { src, dst, segment: 7, payload: &payload };
            let mut out = Vec::new();
            assert!(encode(&mut out, &f));
            assert_eq!(out.len(), HEADER_LEN + payload.len());
            assert_eq!(decode(&out), Some(f));
            let mut bad = out.clone();
            bad[0] = 2;
            assert_eq!(decode(&bad), None, "another version");
            let mut bad = out.clone();
            bad[1] |= 0x80;
            assert_eq!(decode(&bad), None, "unknown flags");
            assert_eq!(decode(&out[..HEADER_LEN - 1]), None, "short");
        }
        let big = vec![0u8; MAX_PAYLOAD + 1];
        let mut out = Vec::new();
        assert!(!encode(&mut out, &Frame { src: v4, dst: None, segment: 0, payload: &big }));
        assert!(out.is_empty());
    }

    #[test]
    fn a_link_carries_frames_both_ways_and_says_when_empty() {
        let (a, theirs) = Link::pair().unwrap();
        let b = Link::from_fd(theirs).unwrap();
        let mut buf = vec![0u8; MAX_FRAME];
        assert_eq!(b.recv(&mut buf).unwrap(), None);
        a.send(b"one").unwrap();
        a.send(&vec![9u8; 60_000]).unwrap();
        b.send(b"back").unwrap();
        assert_eq!(b.recv(&mut buf).unwrap(), Some(&b"one"[..]));
        assert_eq!(b.recv(&mut buf).unwrap().map(|f| f.len()), Some(60_000));
        assert_eq!(a.recv(&mut buf).unwrap(), Some(&b"back"[..]));
        assert_eq!(b.recv(&mut buf).unwrap(), None);
    }
}
