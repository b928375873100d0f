//! The path block of a CM REQ (IBTA Vol 1 12.6.5, table 106, bytes 52-95 for the primary path and
//! 96-139 for the alternate one): the 44 bytes that tell the passive side how to reach the active
//! side. On RoCE the LIDs are 0xFFFF (permissive) and the GIDs are the IPv4-mapped addresses.
//!
//! The LAP message carries the same values in a different order (IBTA Vol 1 12.8.1, table 115);
//! [`super::cm_lap`] reads it into a [`CmPathRepr`] too.

use super::cm::check_width;
use super::{be, bits, Result};

mod field {
    use super::super::Field;
    pub(super) const LOCAL_LID: Field = 0..2;
    pub(super) const REMOTE_LID: Field = 2..4;
    pub(super) const LOCAL_GID: Field = 4..20;
    pub(super) const REMOTE_GID: Field = 20..36;
    /// Flow label (20 bits), reserved (6 bits), packet rate (6 bits).
    pub(super) const FLOW_LABEL_RATE: Field = 36..40;
    pub(super) const PACKET_RATE: usize = 39;
    pub(super) const TRAFFIC_CLASS: usize = 40;
    pub(super) const HOP_LIMIT: usize = 41;
    /// SL (4 bits), subnet local (1 bit), reserved (3 bits).
    pub(super) const SL_SUBNET_LOCAL: usize = 42;
    /// Local ACK timeout (5 bits), reserved (3 bits; in the alternate path of a REQ bit 5 is
    /// SAP-supported, which this implementation leaves zero).
    pub(super) const LOCAL_ACK_TIMEOUT: usize = 43;
}

/// Bytes of one path block in a REQ.
pub const CM_PATH_LEN: usize = 44;

header_view!(CmPathPacket, CM_PATH_LEN, "CM path", "the whole 44-byte block", "A view of a REQ path block.");

impl<T: AsRef<[u8]>> CmPathPacket<T> {
    /// Local port LID.
    pub fn local_lid(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::LOCAL_LID)
    }
    /// Remote port LID.
    pub fn remote_lid(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::REMOTE_LID)
    }
    /// Local port GID.
    pub fn local_gid(&self) -> [u8; 16] {
        gid(self.buffer.as_ref(), field::LOCAL_GID)
    }
    /// Remote port GID.
    pub fn remote_gid(&self) -> [u8; 16] {
        gid(self.buffer.as_ref(), field::REMOTE_GID)
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::FLOW_LABEL_RATE) >> 12
    }
    /// Packet rate (6 bits, IBTA Vol 1 table 225 encoding).
    pub fn packet_rate(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::PACKET_RATE, 2, 6)
    }
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        self.buffer.as_ref()[field::TRAFFIC_CLASS]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }
    /// Service level (4 bits).
    pub fn sl(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::SL_SUBNET_LOCAL, 0, 4)
    }
    /// Subnet local: the path stays in the local subnet.
    pub fn subnet_local(&self) -> bool {
        bits::get(self.buffer.as_ref(), field::SL_SUBNET_LOCAL, 4, 1) != 0
    }
    /// Local ACK timeout (5 bits: 4.096 us * 2^value).
    pub fn local_ack_timeout(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::LOCAL_ACK_TIMEOUT, 0, 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmPathPacket<T> {
    /// Sets the local port LID.
    pub fn set_local_lid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::LOCAL_LID, v)
    }
    /// Sets the remote port LID.
    pub fn set_remote_lid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::REMOTE_LID, v)
    }
    /// Sets the local port GID.
    pub fn set_local_gid(&mut self, v: [u8; 16]) {
        self.buffer.as_mut()[field::LOCAL_GID].copy_from_slice(&v)
    }
    /// Sets the remote port GID.
    pub fn set_remote_gid(&mut self, v: [u8; 16]) {
        self.buffer.as_mut()[field::REMOTE_GID].copy_from_slice(&v)
    }
    /// Sets the flow label (low 20 bits of `v`), leaving the reserved bits and the rate alone.
    pub fn set_flow_label(&mut self, v: u32) {
        set_flow_label(self.buffer.as_mut(), field::FLOW_LABEL_RATE, v)
    }
    /// Sets the packet rate (low 6 bits of `v`).
    pub fn set_packet_rate(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::PACKET_RATE, 2, 6, v)
    }
    /// Sets the traffic class.
    pub fn set_traffic_class(&mut self, v: u8) {
        self.buffer.as_mut()[field::TRAFFIC_CLASS] = v;
    }
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }
    /// Sets the service level (low 4 bits of `v`).
    pub fn set_sl(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::SL_SUBNET_LOCAL, 0, 4, v)
    }
    /// Sets subnet local.
    pub fn set_subnet_local(&mut self, v: bool) {
        bits::set(self.buffer.as_mut(), field::SL_SUBNET_LOCAL, 4, 1, u8::from(v))
    }
    /// Sets the local ACK timeout (low 5 bits of `v`).
    pub fn set_local_ack_timeout(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::LOCAL_ACK_TIMEOUT, 0, 5, v)
    }
}

/// Reads a 16-byte GID.
pub(super) fn gid(b: &[u8], f: super::Field) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[f]);
    g
}

/// Writes a 20-bit flow label into the top of the 32-bit word `f`, keeping its low 12 bits.
pub(super) fn set_flow_label(b: &mut [u8], f: super::Field, v: u32) {
    let word = be::u32(b, f.clone());
    be::set_u32(b, f, (word & 0xfff) | ((v & 0xf_ffff) << 12))
}

/// One path of a REQ (or the alternate path of a LAP) as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmPathRepr {
    /// Local port LID (0xFFFF, permissive, on RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl CmPathRepr {
    /// Reads a REQ path block.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmPathPacket<&T>) -> Result<CmPathRepr> {
        p.check_len()?;
        Ok(CmPathRepr {
            local_lid: p.local_lid(),
            remote_lid: p.remote_lid(),
            local_gid: p.local_gid(),
            remote_gid: p.remote_gid(),
            flow_label: p.flow_label(),
            packet_rate: p.packet_rate(),
            traffic_class: p.traffic_class(),
            hop_limit: p.hop_limit(),
            sl: p.sl(),
            subnet_local: p.subnet_local(),
            local_ack_timeout: p.local_ack_timeout(),
        })
    }
    /// Bytes the block takes in a REQ.
    pub const fn buffer_len(&self) -> usize {
        CM_PATH_LEN
    }
    /// Fails when a value does not fit its field.
    pub fn check(&self) -> Result<()> {
        check_width(self.flow_label, 20, "CM path flow label wider than 20 bits")?;
        check_width(self.packet_rate, 6, "CM path packet rate wider than 6 bits")?;
        check_width(self.sl, 4, "CM path SL wider than 4 bits")?;
        check_width(self.local_ack_timeout, 5, "CM path local ACK timeout wider than 5 bits")
    }
    /// Writes the block, reserved bits zero. Fails, writing nothing, when a value does not fit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmPathPacket<T>) -> Result<()> {
        self.check()?;
        p.check_len()?;
        p.buffer.as_mut()[..CM_PATH_LEN].fill(0);
        p.set_local_lid(self.local_lid);
        p.set_remote_lid(self.remote_lid);
        p.set_local_gid(self.local_gid);
        p.set_remote_gid(self.remote_gid);
        p.set_flow_label(self.flow_label);
        p.set_packet_rate(self.packet_rate);
        p.set_traffic_class(self.traffic_class);
        p.set_hop_limit(self.hop_limit);
        p.set_sl(self.sl);
        p.set_subnet_local(self.subnet_local);
        p.set_local_ack_timeout(self.local_ack_timeout);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // The primary path of the REQ in nvme-discover2.pcap (../shared/reference/cm/nvme-discover2.cm.hex,
    // MAD bytes 76-119): flow label 0x2BBA0, rate 6, hop limit 64, ACK timeout 19.
    static PATH_BYTES: [u8; 44] = [
        0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xac, 0x10, 0x00, 0x6e, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0xff, 0xff, 0xac, 0x10, 0x00, 0x67, 0x2b, 0xba, 0x00, 0x06, 0x00, 0x40, 0x00, 0x98,
    ];

    fn repr() -> CmPathRepr {
        CmPathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 172, 16, 0, 110],
            remote_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 172, 16, 0, 103],
            flow_label: 0x2bba0,
            packet_rate: 6,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        }
    }

    #[test]
    fn deconstruct() {
        let p = CmPathPacket::new_checked(&PATH_BYTES[..]).unwrap();
        assert_eq!((p.local_lid(), p.remote_lid()), (0xffff, 0xffff));
        assert_eq!(&p.local_gid()[12..], &[172, 16, 0, 110]);
        assert_eq!(&p.remote_gid()[12..], &[172, 16, 0, 103]);
        assert_eq!((p.flow_label(), p.packet_rate()), (0x2bba0, 6));
        assert_eq!((p.traffic_class(), p.hop_limit(), p.sl(), p.subnet_local()), (0, 64, 0, false));
        assert_eq!(p.local_ack_timeout(), 19);
    }
    #[test]
    fn construct() {
        let mut b = [0u8; 44];
        let mut p = CmPathPacket::new_unchecked(&mut b[..]);
        p.set_local_lid(0xffff);
        p.set_remote_lid(0xffff);
        p.set_local_gid(repr().local_gid);
        p.set_remote_gid(repr().remote_gid);
        p.set_flow_label(0x2bba0);
        p.set_packet_rate(6);
        p.set_hop_limit(64);
        p.set_local_ack_timeout(19);
        assert_eq!(b, PATH_BYTES);
    }
    #[test]
    fn setters_keep_neighbouring_bits() {
        let mut b = [0xffu8; 44];
        let mut p = CmPathPacket::new_unchecked(&mut b[..]);
        p.set_flow_label(0);
        p.set_packet_rate(0);
        p.set_sl(0);
        p.set_local_ack_timeout(0);
        // The 6 reserved bits between flow label and rate, the subnet-local bit and the 3 bits
        // after the ACK timeout survive.
        assert_eq!(&b[36..40], &[0x00, 0x00, 0x0f, 0xc0]);
        assert_eq!((b[42], b[43]), (0x0f, 0x07));
    }
    #[test]
    fn parse() {
        assert_eq!(CmPathRepr::parse(&CmPathPacket::new_checked(&PATH_BYTES[..]).unwrap()), Ok(repr()));
        assert!(CmPathPacket::new_checked(&PATH_BYTES[..43]).is_err());
    }
    #[test]
    fn emit() {
        let mut b = [0x5au8; 44];
        repr().emit(&mut CmPathPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, PATH_BYTES);
        let wide = CmPathRepr { flow_label: 0x10_0000, ..repr() };
        assert!(wide.emit(&mut CmPathPacket::new_unchecked(&mut b[..])).is_err());
        assert_eq!(b, PATH_BYTES, "a failed emit writes nothing");
    }
}
