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

/// Generates the getters and setters of a CM view's fields, one line a field:
/// `/// doc` then `getter / setter: kind(position)` and, for the kinds whose values [`cm_header!`]
/// checks, `, "the error text"`. Positions count from the start of the view, as the IBTA tables
/// (and `ibta_vol1_c12.h`) count them; a bit offset counts from the top bit of its byte. The kinds:
/// - `u8(at)`, `u16(range)`, `u32(range)`, `u64(range)`: big-endian integers;
/// - `u24(range)`, and `u24[h, m, l]` for one whose three bytes are apart (REP's vendor ID): 24
///   bits in a `u32`, whose high byte the setter drops;
/// - `bits(at, offset, width)`, a `u8`, and `bit(at, offset)`, a `bool`: part of byte `at`, the
///   setter leaving the byte's other bits as they are;
/// - `flow_label(range)`: 20 bits at the top of a 32-bit word, the setter keeping its low 12 bits;
/// - `gid(range)`: 16 bytes as a `[u8; 16]`;
/// - `area(at, LEN)`: the `LEN` bytes from `at`, as a slice; the "setter" names its writable twin;
/// - `path(range)`: a REQ path block as a [`cm_path::CmPathPacket`]; likewise;
/// - `by_hand(Type)`: nothing here. The view's getter and setter of that name are written by hand
///   (a `Type` out, a `Type` in); [`cm_header!`] gives the field a place in the `Repr`, unchecked;
/// - `nested(Type)`: likewise, but the setter takes a `&Type`, and the `Repr`'s `check` calls
///   `Type::check`.
macro_rules! cm_fields {
    (impl $view:ident {
        $( $(#[$doc:meta])* $get:ident / $set:ident : $kind:ident $spec:tt $(, $err:literal)? ; )*
    }) => {
        impl<T: AsRef<[u8]>> $view<T> {
            $( cm_fields!(@get $kind $spec, $get, $(#[$doc])*); )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            $( cm_fields!(@set $kind $spec, $get, $set); )*
        }
    };

    (@get u8 ($at:expr), $($g:tt)*) => { cm_fields!(@getter u8, b => b[$at], $($g)*); };
    (@get u16 ($r:expr), $($g:tt)*) => { cm_fields!(@getter u16, b => $crate::wire::be::u16(b, $r), $($g)*); };
    (@get u24 ($r:expr), $($g:tt)*) => { cm_fields!(@getter u32, b => $crate::wire::be::u24(b, $r), $($g)*); };
    (@get u24 [$h:expr, $m:expr, $l:expr], $($g:tt)*) => {
        cm_fields!(@getter u32, b => u32::from(b[$h]) << 16 | u32::from(b[$m]) << 8 | u32::from(b[$l]), $($g)*);
    };
    (@get u32 ($r:expr), $($g:tt)*) => { cm_fields!(@getter u32, b => $crate::wire::be::u32(b, $r), $($g)*); };
    (@get u64 ($r:expr), $($g:tt)*) => { cm_fields!(@getter u64, b => $crate::wire::be::u64(b, $r), $($g)*); };
    (@get bits ($at:expr, $off:expr, $w:expr), $($g:tt)*) => {
        cm_fields!(@getter u8, b => $crate::wire::bits::get(b, $at, $off, $w), $($g)*);
    };
    (@get bit ($at:expr, $off:expr), $($g:tt)*) => {
        cm_fields!(@getter bool, b => $crate::wire::bits::get(b, $at, $off, 1) != 0, $($g)*);
    };
    (@get flow_label ($r:expr), $($g:tt)*) => {
        cm_fields!(@getter u32, b => $crate::wire::be::u32(b, $r) >> 12, $($g)*);
    };
    (@get gid ($r:expr), $($g:tt)*) => {
        cm_fields!(@getter [u8; 16], b => $crate::wire::cm_path::gid(b, $r), $($g)*);
    };
    (@get area ($at:expr, $len:ident), $get:ident, $(#[$doc:meta])*) => {
        cm_fields!(@getter &[u8], b => &b[$at..$at + $len], $get, $(#[$doc])*
            #[doc = concat!("\n[`", stringify!($len), "`] bytes once checked.")]);
    };
    (@get path ($r:expr), $($g:tt)*) => {
        cm_fields!(@getter $crate::wire::cm_path::CmPathPacket<&[u8]>,
            b => $crate::wire::cm_path::CmPathPacket::new_unchecked(&b[$r]), $($g)*);
    };
    (@get by_hand $ty:tt, $($g:tt)*) => {};
    (@get nested $ty:tt, $($g:tt)*) => {};
    (@getter $ty:ty, $b:ident => $read:expr, $get:ident, $(#[$doc:meta])*) => {
        $(#[$doc])*
        pub fn $get(&self) -> $ty {
            let $b = self.buffer.as_ref();
            $read
        }
    };

    (@set u8 ($at:expr), $($s:tt)*) => { cm_fields!(@setter u8, "", (b, v) => b[$at] = v, $($s)*); };
    (@set u16 ($r:expr), $($s:tt)*) => {
        cm_fields!(@setter u16, "", (b, v) => $crate::wire::be::set_u16(b, $r, v), $($s)*);
    };
    (@set u24 ($r:expr), $($s:tt)*) => {
        cm_fields!(@setter u32, " (the low 24 bits of `v`)", (b, v) => $crate::wire::be::set_u24(b, $r, v), $($s)*);
    };
    (@set u24 [$h:expr, $m:expr, $l:expr], $($s:tt)*) => {
        cm_fields!(@setter u32, " (the low 24 bits of `v`)", (b, v) => {
            b[$h] = (v >> 16) as u8;
            b[$m] = (v >> 8) as u8;
            b[$l] = v as u8;
        }, $($s)*);
    };
    (@set u32 ($r:expr), $($s:tt)*) => {
        cm_fields!(@setter u32, "", (b, v) => $crate::wire::be::set_u32(b, $r, v), $($s)*);
    };
    (@set u64 ($r:expr), $($s:tt)*) => {
        cm_fields!(@setter u64, "", (b, v) => $crate::wire::be::set_u64(b, $r, v), $($s)*);
    };
    (@set bits ($at:expr, $off:expr, $w:literal), $($s:tt)*) => {
        cm_fields!(@setter u8, concat!(" (the low ", $w, " bits of `v`; the byte's other bits are left alone)"),
            (b, v) => $crate::wire::bits::set(b, $at, $off, $w, v), $($s)*);
    };
    (@set bit ($at:expr, $off:expr), $($s:tt)*) => {
        cm_fields!(@setter bool, " (the byte's other bits are left alone)",
            (b, v) => $crate::wire::bits::set(b, $at, $off, 1, u8::from(v)), $($s)*);
    };
    (@set flow_label ($r:expr), $($s:tt)*) => {
        cm_fields!(@setter u32, " (the low 20 bits of `v`; the low 12 bits of the word are left alone)",
            (b, v) => $crate::wire::cm_path::set_flow_label(b, $r, v), $($s)*);
    };
    (@set gid ($r:expr), $($s:tt)*) => {
        cm_fields!(@setter [u8; 16], "", (b, v) => b[$r].copy_from_slice(&v), $($s)*);
    };
    (@set area ($at:expr, $len:ident), $($s:tt)*) => {
        cm_fields!(@writable &mut [u8], b => &mut b[$at..$at + $len], $($s)*);
    };
    (@set path ($r:expr), $($s:tt)*) => {
        cm_fields!(@writable $crate::wire::cm_path::CmPathPacket<&mut [u8]>,
            b => $crate::wire::cm_path::CmPathPacket::new_unchecked(&mut b[$r]), $($s)*);
    };
    (@set by_hand $ty:tt, $($s:tt)*) => {};
    (@set nested $ty:tt, $($s:tt)*) => {};
    (@setter $ty:ty, $note:expr, ($b:ident, $v:ident) => $write:expr, $get:ident, $set:ident) => {
        #[doc = concat!("Sets [`", stringify!($get), "`](Self::", stringify!($get), ")", $note, ".")]
        pub fn $set(&mut self, $v: $ty) {
            let $b = self.buffer.as_mut();
            $write;
        }
    };
    (@writable $ty:ty, $b:ident => $expr:expr, $get:ident, $set:ident) => {
        #[doc = concat!("[`", stringify!($get), "`](Self::", stringify!($get), "), writable.")]
        pub fn $set(&mut self) -> $ty {
            let $b = self.buffer.as_mut();
            $expr
        }
    };
}

/// Generates a CM header of fixed length `$len`: its view through [`header_view!`], the fields'
/// accessors through [`cm_fields!`] (and a compile-time check that each lies within `$len`), and
/// the `Repr` with a field for each (in the order given), `parse`, `check` (each field in the
/// order given: a width, an area's length, a path's or nested value's own `check`; the first to
/// fail names the error), `emit` (the whole `$len` bytes: zeros, then each field) and
/// `buffer_len`. Under `cfg(test)` it implements [`cm::captured::Header`] for the tests of
/// `cm::captured`.
macro_rules! cm_header {
    (
        view $view:ident($len:expr, $what:literal, $holds:literal, $view_doc:expr);
        $(#[$repr_attr:meta])*
        repr $repr:ident;
        fields { $( $(#[$doc:meta])* $get:ident / $set:ident : $kind:ident $spec:tt $(, $err:literal)? ; )* }
    ) => {
        header_view!($view, $len, $what, $holds, $view_doc);

        cm_fields! { impl $view { $( $(#[$doc])* $get / $set : $kind $spec $(, $err)? ; )* } }

        const _: () = { $( cm_header!(@within $kind $spec, $len, $get); )* };

        $(#[$repr_attr])*
        pub struct $repr {
            $( $(#[$doc])* #[doc = cm_header!(@note $kind $spec)] pub $get: cm_header!(@ty $kind $spec), )*
        }

        impl $repr {
            #[doc = concat!("Reads a ", $what, ". Any values are accepted: the caller (the CM state machine; for a \
                MAD header, its class) judges them.")]
            pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &$view<&T>) -> $crate::wire::Result<$repr> {
                p.check_len()?;
                Ok($repr { $( $get: cm_header!(@parse $kind $spec, p, $get), )* })
            }

            #[doc = concat!("Bytes it takes: ", $holds, ".")]
            pub const fn buffer_len(&self) -> usize {
                $len
            }

            /// Fails when a value does not fit its field or an area is too long.
            pub fn check(&self) -> $crate::wire::Result<()> {
                $( cm_header!(@check $kind $spec, self.$get $(, $err)?); )*
                Ok(())
            }

            #[doc = concat!("Writes the ", $what, " over ", $holds, ", reserved bits zero. Fails, writing nothing, \
                when [`", stringify!($repr), "::check`] does or the buffer is short.")]
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut $view<T>) -> $crate::wire::Result<()> {
                self.check()?;
                p.check_len()?;
                p.buffer.as_mut()[..$len].fill(0);
                self.write_fields(p)
            }

            /// Sets each field of `p` (a checked `self`, a buffer of the whole length).
            fn write_fields<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut $view<T>) -> $crate::wire::Result<()> {
                $( cm_header!(@write $kind $spec, p, self.$get, $set); )*
                Ok(())
            }
        }

        #[cfg(test)]
        impl $crate::wire::cm::captured::Header for $repr {
            const LEN: usize = $len;
            fn parse_bytes(b: &[u8]) -> $crate::wire::Result<Self> {
                Self::parse(&$view::new_checked(b)?)
            }
            fn check_len_of(b: &[u8]) -> $crate::wire::Result<()> {
                $view::new_checked(b).map(drop)
            }
            fn emit_bytes(&self, b: &mut [u8]) -> $crate::wire::Result<()> {
                self.emit(&mut $view::new_unchecked(b))
            }
            fn write_each(&self, b: &mut [u8]) -> $crate::wire::Result<()> {
                self.write_fields(&mut $view::new_unchecked(b))
            }
            fn assert_reads(&self, b: &[u8]) {
                let p = $view::new_checked(b).unwrap();
                $( cm_header!(@assert $kind $spec, p, self.$get, $get); )*
            }
            fn trimmed(&self) -> Self {
                #[allow(unused_mut)] // a header without areas changes nothing
                let mut r = self.clone();
                $( cm_header!(@trim $kind $spec, r.$get); )*
                r
            }
        }
    };

    (@ty u8 $s:tt) => { u8 };
    (@ty u16 $s:tt) => { u16 };
    (@ty u24 $s:tt) => { u32 };
    (@ty u32 $s:tt) => { u32 };
    (@ty u64 $s:tt) => { u64 };
    (@ty bits $s:tt) => { u8 };
    (@ty bit $s:tt) => { bool };
    (@ty flow_label $s:tt) => { u32 };
    (@ty gid $s:tt) => { [u8; 16] };
    (@ty area $s:tt) => { Vec<u8> };
    (@ty path $s:tt) => { $crate::wire::cm_path::CmPathRepr };
    (@ty by_hand ($ty:ty)) => { $ty };
    (@ty nested ($ty:ty)) => { $ty };

    (@note area ($at:expr, $len:ident)) => {
        concat!(
            "\nThe whole area ([`", stringify!($len), "`] bytes) on parse; on emit at most that many bytes, ",
            "zero-padded."
        )
    };
    (@note $kind:ident $s:tt) => { "" };

    (@within by_hand $s:tt, $len:expr, $get:ident) => {};
    (@within nested $s:tt, $len:expr, $get:ident) => {};
    (@within $kind:ident $s:tt, $len:expr, $get:ident) => {
        assert!(cm_header!(@bytes $kind $s).end <= $len, concat!(stringify!($get), " ends past the view"))
    };
    (@bytes u8 ($at:expr)) => { $at..$at + 1 };
    (@bytes u24 [$h:expr, $m:expr, $l:expr]) => { $h..$l + 1 };
    (@bytes bits ($at:expr, $off:expr, $w:expr)) => { $at..$at + 1 };
    (@bytes bit ($at:expr, $off:expr)) => { $at..$at + 1 };
    (@bytes area ($at:expr, $len:ident)) => { $at..$at + $len };
    (@bytes $kind:ident ($r:expr)) => { $r };

    (@parse area $s:tt, $p:ident, $get:ident) => { $p.$get().to_vec() };
    (@parse path $s:tt, $p:ident, $get:ident) => { $crate::wire::cm_path::CmPathRepr::parse(&$p.$get())? };
    (@parse $kind:ident $s:tt, $p:ident, $get:ident) => { $p.$get() };

    (@check u24 $s:tt, $v:expr, $err:literal) => { $crate::wire::cm::check_width($v, 24, $err)? };
    (@check bits ($at:expr, $off:expr, $w:expr), $v:expr, $err:literal) => {
        $crate::wire::cm::check_width($v, $w, $err)?
    };
    (@check flow_label $s:tt, $v:expr, $err:literal) => { $crate::wire::cm::check_width($v, 20, $err)? };
    (@check area ($at:expr, $len:ident), $v:expr, $err:literal) => { $crate::wire::cm::check_area(&$v, $len, $err)? };
    (@check path $s:tt, $v:expr) => { $v.check()? };
    (@check nested $s:tt, $v:expr) => { $v.check()? };
    (@check u8 $s:tt, $v:expr) => {};
    (@check u16 $s:tt, $v:expr) => {};
    (@check u32 $s:tt, $v:expr) => {};
    (@check u64 $s:tt, $v:expr) => {};
    (@check bit $s:tt, $v:expr) => {};
    (@check gid $s:tt, $v:expr) => {};
    (@check by_hand $s:tt, $v:expr) => {};

    (@write area $s:tt, $p:ident, $v:expr, $set:ident) => { $crate::wire::cm::write_area($p.$set(), &$v) };
    (@write path $s:tt, $p:ident, $v:expr, $set:ident) => { $v.emit(&mut $p.$set())? };
    (@write nested $s:tt, $p:ident, $v:expr, $set:ident) => { $p.$set(&$v) };
    (@write $kind:ident $s:tt, $p:ident, $v:expr, $set:ident) => { $p.$set($v) };

    (@assert area $s:tt, $p:ident, $v:expr, $get:ident) => { assert_eq!($p.$get(), &$v[..], stringify!($get)) };
    (@assert path $s:tt, $p:ident, $v:expr, $get:ident) => {
        assert_eq!($crate::wire::cm_path::CmPathRepr::parse(&$p.$get()).as_ref(), Ok(&$v), stringify!($get))
    };
    (@assert $kind:ident $s:tt, $p:ident, $v:expr, $get:ident) => { assert_eq!($p.$get(), $v, stringify!($get)) };

    (@trim area $s:tt, $v:expr) => {
        while $v.last() == Some(&0) {
            $v.pop();
        }
    };
    (@trim $kind:ident $s:tt, $v:expr) => {};
}

/// Generates one CM message (IBTA Vol 1 12.6) through [`cm_header!`]: the view `$view` over the
/// whole MAD data area after the 24-byte MAD header ([`mad::MAD_DATA_LEN`] = 232 bytes: the
/// fixed part and the private data, offsets counted from its start as in `ibta_vol1_c12.h`), and
/// the `Repr` `$repr` (documented by the doc comments before `fields`), with `Debug`, `Clone`,
/// `PartialEq`, `Eq` and `Default`.
macro_rules! cm_message {
    ($view:ident, $repr:ident, $what:literal; $(#[$repr_doc:meta])* fields { $($fields:tt)* }) => {
        cm_header! {
            view $view($crate::wire::mad::MAD_DATA_LEN, $what, "the whole MAD data area",
                concat!("A view of a ", $what, " (the MAD data area)."));
            $(#[$repr_doc])*
            #[derive(Debug, Clone, PartialEq, Eq, Default)]
            repr $repr;
            fields { $($fields)* }
        }
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
