//! Wire formats: zero-copy views and high-level representations of every header softrdma speaks.
//!
//! The layout follows smoltcp's `wire` module. Each header has its own file holding
//! - a `Packet<T: AsRef<[u8]>>` view over a byte buffer, with getters (and `set_*` setters when
//!   `T: AsMut<[u8]>`) whose field positions live in a `mod field` of ranges;
//! - a `Repr`, the header as plain values, with `parse`, `emit` and `buffer_len`.
//!
//! # The contract for untrusted input
//! Bytes from the wire or from a capture file are untrusted. Build views with `new_checked`:
//! it validates every length the accessors rely on, and once it has succeeded **no accessor
//! panics**. `new_unchecked` is for buffers the caller sized itself (emitting); on such a view an
//! accessor may panic if the buffer is too short. `Repr::parse` additionally rejects values the
//! format does not allow (a wrong IP version, a reserved GRH next header, ...).
//!
//! Unknown code points round-trip: an unknown [`EtherType`], [`IpProtocol`] or [`NakCode`] keeps
//! its value, and an [`Opcode`] is a plain `u8` whose table entry may be absent.
//!
//! # Layers
//! - L2/L3/L4: [`ethernet`], [`ipv4`], [`ipv6`], [`udp`], and [`grh`] (the IB Global Route Header,
//!   carried directly over Ethernet by RoCEv1, ethertype 0x8915).
//! - IB transport: [`bth`] and the extension headers [`rdeth`], [`deth`], [`xrceth`], [`reth`],
//!   [`atomiceth`], [`aeth`], [`atomicacketh`], [`immdt`], [`ieth`]; [`opcode`] says which of them
//!   each opcode carries; [`ib`] is the whole transport packet (BTH to ICRC); [`icrc`] computes the
//!   invariant CRC; [`roce`] puts it all together as RoCEv2 (IPv4/IPv6 + UDP 4791) or RoCEv1 frames.
//! - Communication Management (IBTA Vol 1 ch. 12), carried in 256-byte MADs on QP1: [`mad`] (the
//!   MAD common header and the CM attribute IDs), then one file per message, each with its view
//!   (`Cm...Packet`) and `Cm...Repr`: [`cm_req`] (with the path block in [`cm_path`]), [`cm_mra`],
//!   [`cm_rej`], [`cm_rep`], [`cm_rtu`], [`cm_dreq`], [`cm_drep`], [`cm_sidr_req`],
//!   [`cm_sidr_rep`], [`cm_lap`] (its alternate path read into a [`CmPathRepr`]), [`cm_apr`];
//!   [`cma_hdr`], the rdma_cm IP header in REQ/SIDR_REQ private data; and [`cm`], a whole CM MAD
//!   as values (the [`CmMessage`] over the eleven messages, [`CmMadRepr`] with the header).

use core::ops::{Range, RangeFrom};

/// A byte range of a fixed-position field.
pub(crate) type Field = Range<usize>;
/// The bytes from an offset to the end of the buffer.
#[allow(dead_code)]
pub(crate) type Rest = RangeFrom<usize>;

/// Why a buffer could not be read as the header asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the named header (or a length it declares) does.
    #[error("{0} truncated")]
    Truncated(&'static str),
    /// A field holds a value the format does not allow; the text says which.
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

/// Result of parsing or emitting wire data.
pub type Result<T> = core::result::Result<T, Error>;

/// Declares a `u8`/`u16` code-point enum whose unknown values round-trip as `Unknown(value)`.
macro_rules! enum_with_unknown {
    (
        $( #[$enum_attr:meta] )*
        pub enum $name:ident($ty:ty) {
            $(
              $( #[$variant_attr:meta] )*
              $variant:ident = $value:expr
            ),+ $(,)?
        }
    ) => {
        $( #[$enum_attr] )*
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Clone, Copy)]
        pub enum $name {
            $(
              $( #[$variant_attr] )*
              $variant
            ),*,
            /// A value this implementation does not know; kept as received.
            Unknown($ty)
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant ),*,
                    other => $name::Unknown(other)
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value ),*,
                    $name::Unknown(other) => other
                }
            }
        }
    }
}

/// Generates a view named `$name` over a buffer that must hold at least `$len` bytes: the struct,
/// `new_unchecked`, `new_checked`, `check_len` and `into_inner`. `$what` names the header in the
/// [`Error::Truncated`] of a short buffer; `$holds` says, in the docs, what the buffer must hold.
macro_rules! header_view {
    ($name:ident, $len:expr, $what:expr, $holds:literal, $doc:expr) => {
        #[doc = $doc]
        #[derive(Debug, PartialEq, Eq, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length (for buffers the caller sized).
            pub const fn new_unchecked(buffer: T) -> $name<T> {
                $name { buffer }
            }

            #[doc = concat!("Wraps a buffer after checking that it holds ", $holds, ".")]
            pub fn new_checked(buffer: T) -> $crate::wire::Result<$name<T>> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            #[doc = concat!("Checks that the buffer holds ", $holds, "; after that no accessor panics.")]
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::wire::Error::Truncated($what))
                } else {
                    Ok(())
                }
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

/// Generates the common part of a fixed-length header view through [`header_view!`]: the struct
/// `Packet`, `new_unchecked`, `new_checked`, `check_len`, `into_inner`, and the `HEADER_LEN`
/// constant.
macro_rules! fixed_header_packet {
    ($len:expr, $what:expr, $doc:expr) => {
        /// Length of this header in bytes.
        pub const HEADER_LEN: usize = $len;

        header_view!(Packet, HEADER_LEN, $what, "the whole header", $doc);
    };
}

/// Generates a view named `$name` over a packet whose header declares how long it is (IPv4,
/// IPv6, UDP, the IB transport packet): the struct, `new_unchecked`, `new_checked` and
/// `into_inner`. The file writes the `check_len` that `new_checked` runs (what "holds the packet"
/// means depends on the header's length fields), and any shorter check beside it.
macro_rules! packet_view {
    ($name:ident, $doc:expr) => {
        #[doc = $doc]
        #[derive(Debug, PartialEq, Eq, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking it.
            pub const fn new_unchecked(buffer: T) -> $name<T> {
                $name { buffer }
            }

            /// Wraps a buffer after [`check_len`](Self::check_len).
            pub fn new_checked(buffer: T) -> $crate::wire::Result<$name<T>> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

/// Generates `Repr::parse`, `Repr::buffer_len` and `Repr::emit` of a fixed-length header whose
/// `Repr` holds one field per `$get / $set` pair, named as the view's getter: `parse` checks the
/// length and reads each field through its getter, `emit` writes each through its setter, in the
/// order given. `$what` names the header in the docs ("a RETH").
macro_rules! fixed_header_repr {
    ($what:expr; $( $get:ident / $set:ident ),+ $(,)?) => {
        impl Repr {
            #[doc = concat!("Reads ", $what, ".")]
            pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> $crate::wire::Result<Repr> {
                p.check_len()?;
                Ok(Repr { $( $get: p.$get() ),+ })
            }
            /// Bytes the header takes.
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }
            #[doc = concat!("Writes ", $what, ".")]
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
                $( p.$set(self.$get); )+
            }
        }
    };
}

/// Generates the tests of a fixed-length header (one made with [`fixed_header_packet!`] and
/// [`fixed_header_repr!`]) against a sample: `HEADER_BYTES`, the header's bytes, and `REPR`, the
/// `Repr` of the `$value`s. `deconstruct`: each getter reads its value from the bytes;
/// `construct`: the setters, over a buffer of ones, write the bytes (a reserved bit must come out
/// zero); `parse`: `Repr::parse` reads `REPR`, and a buffer one byte short is refused; `emit`:
/// `REPR.emit`, over ones too, writes the bytes. Invoked inside the file's test module.
#[cfg(test)]
macro_rules! fixed_header_tests {
    (
        $( #[$sample_doc:meta] )*
        static HEADER_BYTES = $bytes:expr;
        $( $get:ident / $set:ident = $value:expr ),+ $(,)?
    ) => {
        $( #[$sample_doc] )*
        static HEADER_BYTES: [u8; HEADER_LEN] = $bytes;
        const REPR: Repr = Repr { $( $get: $value ),+ };

        #[test]
        fn deconstruct() {
            let p = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
            $( assert_eq!(p.$get(), $value); )+
        }
        #[test]
        fn construct() {
            let mut b = [0xffu8; HEADER_LEN];
            let mut p = Packet::new_unchecked(&mut b[..]);
            $( p.$set($value); )+
            assert_eq!(b, HEADER_BYTES);
        }
        #[test]
        fn parse() {
            assert_eq!(Repr::parse(&Packet::new_checked(&HEADER_BYTES[..]).unwrap()), Ok(REPR));
            assert!(Packet::new_checked(&HEADER_BYTES[..HEADER_LEN - 1]).is_err());
        }
        #[test]
        fn emit() {
            let mut b = [0xffu8; HEADER_LEN];
            REPR.emit(&mut Packet::new_unchecked(&mut b[..]));
            assert_eq!(b, HEADER_BYTES);
        }
    };
}

/// Generates a 4-byte extended transport header that carries one field (IETH, ImmDt, RDETH,
/// XRCETH): the view (through [`fixed_header_packet!`]) with the field's getter and setter, the
/// `Repr` with `parse`, `buffer_len` and `emit` (through [`fixed_header_repr!`]), and the tests
/// that read, write, parse and emit a sample (through [`fixed_header_tests!`]). A field of 32
/// bits fills the header; one of 24 bits follows a reserved byte that the setter zeroes (IBTA
/// Vol 1 9.3: reserved fields are sent as 0).
macro_rules! word_header {
    (
        $what:literal;
        $( #[$field_doc:meta] )*
        $get:ident / $set:ident : $bits:tt bits;
        sample: $bytes:expr => $value:expr, $( #[$sample_doc:meta] )*
    ) => {
        fixed_header_packet!(4, $what, concat!("A view of the ", $what, " header."));

        impl<T: AsRef<[u8]>> Packet<T> {
            $( #[$field_doc] )*
            pub fn $get(&self) -> u32 {
                word_header!(@get $bits, self.buffer.as_ref())
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Sets the field (a reserved byte before it is zeroed).
            pub fn $set(&mut self, v: u32) {
                word_header!(@set $bits, self.buffer.as_mut(), v)
            }
        }

        #[doc = concat!("The ", $what, " header as values.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct Repr {
            $( #[$field_doc] )*
            pub $get: u32,
        }

        fixed_header_repr!(concat!("the ", $what, " header"); $get / $set);

        #[cfg(test)]
        mod test {
            use super::*;

            fixed_header_tests! {
                $( #[$sample_doc] )*
                static HEADER_BYTES = $bytes;
                $get / $set = $value
            }
        }
    };
    (@get 32, $b:expr) => { $crate::wire::be::u32($b, 0..4) };
    (@get 24, $b:expr) => { $crate::wire::be::u24($b, 1..4) };
    (@set 32, $b:expr, $v:expr) => { $crate::wire::be::set_u32($b, 0..4, $v) };
    (@set 24, $b:expr, $v:expr) => {{
        let b = $b;
        b[0] = 0;
        $crate::wire::be::set_u24(b, 1..4, $v & 0x00ff_ffff)
    }};
}

/// Generates the view of one CM message (IBTA Vol 1 12.6) through [`header_view!`]: the struct
/// named `$name`, `new_unchecked`, `new_checked`, `check_len` and `into_inner`. Every CM message
/// view covers the whole MAD data area after the 24-byte MAD header ([`mad::MAD_DATA_LEN`] = 232
/// bytes: the fixed part and the private data), with offsets counted from its start as in
/// `ibta_vol1_c12.h`.
macro_rules! cm_message_packet {
    ($name:ident, $what:expr, $doc:expr) => {
        header_view!($name, $crate::wire::mad::MAD_DATA_LEN, $what, "the whole MAD data area", $doc);
    };
}

/// Big-endian field access helpers shared by the header views.
pub(crate) mod be {
    use super::Field;

    #[inline]
    pub(crate) fn u16(b: &[u8], f: Field) -> u16 {
        let b = &b[f];
        u16::from_be_bytes([b[0], b[1]])
    }
    #[inline]
    pub(crate) fn u24(b: &[u8], f: Field) -> u32 {
        let b = &b[f];
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    #[inline]
    pub(crate) fn u32(b: &[u8], f: Field) -> u32 {
        let b = &b[f];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    #[inline]
    pub(crate) fn u64(b: &[u8], f: Field) -> u64 {
        let b = &b[f];
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_be_bytes(a)
    }
    #[inline]
    pub(crate) fn set_u16(b: &mut [u8], f: Field, v: u16) {
        b[f].copy_from_slice(&v.to_be_bytes())
    }
    #[inline]
    pub(crate) fn set_u24(b: &mut [u8], f: Field, v: u32) {
        b[f].copy_from_slice(&v.to_be_bytes()[1..])
    }
    #[inline]
    pub(crate) fn set_u32(b: &mut [u8], f: Field, v: u32) {
        b[f].copy_from_slice(&v.to_be_bytes())
    }
    #[inline]
    pub(crate) fn set_u64(b: &mut [u8], f: Field, v: u64) {
        b[f].copy_from_slice(&v.to_be_bytes())
    }
}

/// Access to fields narrower than a byte, placed as IBTA's tables place them: `Byte[Bit]`, where
/// bit 0 is the most significant bit of the byte (IBTA Vol 1 12.6, the message tables).
pub(crate) mod bits {
    /// Reads the `width`-bit field of byte `at` that starts `offset` bits below its top bit.
    #[inline]
    pub(crate) fn get(b: &[u8], at: usize, offset: u32, width: u32) -> u8 {
        let shift = 8 - offset - width;
        (b[at] >> shift) & mask(width)
    }
    /// Writes the low `width` bits of `v` into that field, leaving the byte's other bits as they are.
    #[inline]
    pub(crate) fn set(b: &mut [u8], at: usize, offset: u32, width: u32, v: u8) {
        let shift = 8 - offset - width;
        let m = mask(width) << shift;
        b[at] = (b[at] & !m) | ((v << shift) & m);
    }
    #[inline]
    fn mask(width: u32) -> u8 {
        ((1u16 << width) - 1) as u8
    }
}

pub mod checksum;
mod psn;

pub mod ethernet;
pub mod grh;
pub mod ipv4;
pub mod ipv6;
pub mod udp;

pub mod aeth;
pub mod atomicacketh;
pub mod atomiceth;
pub mod bth;
pub mod deth;
pub mod ieth;
pub mod immdt;
pub mod rdeth;
pub mod reth;
pub mod xrceth;

pub mod ib;
pub mod icrc;
pub mod opcode;
pub mod roce;

pub mod cm;
pub mod cm_apr;
pub mod cm_drep;
pub mod cm_dreq;
pub mod cm_lap;
pub mod cm_mra;
pub mod cm_path;
pub mod cm_rej;
pub mod cm_rep;
pub mod cm_req;
pub mod cm_rtu;
pub mod cm_sidr_rep;
pub mod cm_sidr_req;
pub mod cma_hdr;
pub mod mad;

pub use self::psn::Psn;

pub use self::ethernet::{Address as EthernetAddress, EtherType, Frame as EthernetFrame, Repr as EthernetRepr};
pub use self::grh::{Gid, Packet as GrhPacket, Repr as GrhRepr};
pub use self::ipv4::{IpProtocol, Packet as Ipv4Packet, Repr as Ipv4Repr};
pub use self::ipv6::{Packet as Ipv6Packet, Repr as Ipv6Repr};
pub use self::udp::{Packet as UdpPacket, Repr as UdpRepr, ROCE_V2_PORT};

pub use self::aeth::{Msn, NakCode, Packet as AethPacket, Repr as AethRepr, Syndrome};
pub use self::atomicacketh::{Packet as AtomicAckEthPacket, Repr as AtomicAckEthRepr};
pub use self::atomiceth::{Packet as AtomicEthPacket, Repr as AtomicEthRepr};
pub use self::bth::{Packet as BthPacket, Qpn, Repr as BthRepr};
pub use self::deth::{Packet as DethPacket, Repr as DethRepr};
pub use self::ieth::{Packet as IethPacket, Repr as IethRepr};
pub use self::immdt::{Packet as ImmDtPacket, Repr as ImmDtRepr};
pub use self::rdeth::{Packet as RdethPacket, Repr as RdethRepr};
pub use self::reth::{Packet as RethPacket, Repr as RethRepr};
pub use self::xrceth::{Packet as XrcEthPacket, Repr as XrcEthRepr};

pub use self::ib::{Packet as IbPacket, Repr as IbRepr};
pub use self::opcode::{Headers, OpKind, Opcode, OpcodeInfo, Position, Transport};
pub use self::roce::{FrameRepr as RoceFrameRepr, L3Repr};

pub use self::cm::{CmMadRepr, CmMessage};
pub use self::cm_apr::{CmAprPacket, CmAprRepr, APR_ADD_INFO_LEN, APR_PRIVATE_DATA_LEN};
pub use self::cm_drep::{CmDrepPacket, CmDrepRepr, DREP_PRIVATE_DATA_LEN};
pub use self::cm_dreq::{CmDreqPacket, CmDreqRepr, DREQ_PRIVATE_DATA_LEN};
pub use self::cm_lap::{CmLapPacket, CmLapRepr, LAP_PRIVATE_DATA_LEN};
pub use self::cm_mra::{CmMraPacket, CmMraRepr, MRA_PRIVATE_DATA_LEN};
pub use self::cm_path::{CmPathPacket, CmPathRepr, CM_PATH_LEN};
pub use self::cm_rej::{CmRejPacket, CmRejRepr, REJ_ARI_LEN, REJ_PRIVATE_DATA_LEN};
pub use self::cm_rep::{CmRepPacket, CmRepRepr, REP_PRIVATE_DATA_LEN};
pub use self::cm_req::{CmReqPacket, CmReqRepr, REQ_PRIVATE_DATA_LEN};
pub use self::cm_rtu::{CmRtuPacket, CmRtuRepr, RTU_PRIVATE_DATA_LEN};
pub use self::cm_sidr_rep::{CmSidrRepPacket, CmSidrRepRepr, SIDR_REP_ADD_INFO_LEN, SIDR_REP_PRIVATE_DATA_LEN};
pub use self::cm_sidr_req::{CmSidrReqPacket, CmSidrReqRepr, SIDR_REQ_PRIVATE_DATA_LEN};
pub use self::cma_hdr::{CmaHdrPacket, CmaHdrRepr, CMA_HDR_LEN};
pub use self::mad::{
    CmAttr, MadPacket, MadRepr, CM_CLASS_VERSION, MAD_BASE_VERSION, MAD_DATA_LEN, MAD_HEADER_LEN, MAD_LEN,
    MAD_METHOD_SEND, MGMT_CLASS_CM,
};
