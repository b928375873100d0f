//! The CM LAP message (IBTA Vol 1 12.8.1, table 115; attribute 0x0019): load an alternate path
//! into a connection. The answer is the [`super::cm_apr`].
//!
//! The LAP carries the same path values as a REQ path block, in its own order (the traffic class
//! shares the flow label's word, the hop limit comes before the rate); they are read into a
//! [`CmPathRepr`].
//!
//! Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, check_width, write_area};
use super::cm_path::{gid, set_flow_label, CmPathRepr};
use super::mad::MAD_DATA_LEN;
use super::{be, bits, Result};

/// Bytes of LAP private data (IBTA Vol 1 table 115; Linux `IB_CM_LAP_PRIVATE_DATA_SIZE`).
pub const LAP_PRIVATE_DATA_LEN: usize = 168;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    // Bytes 8-11 are reserved.
    pub(super) const REMOTE_QPN: Field = 12..15;
    /// Remote CM response timeout (5), reserved (3).
    pub(super) const REMOTE_CM_RESPONSE_TIMEOUT: usize = 15;
    // Bytes 16-19 are reserved.
    pub(super) const ALT_LOCAL_LID: Field = 20..22;
    pub(super) const ALT_REMOTE_LID: Field = 22..24;
    pub(super) const ALT_LOCAL_GID: Field = 24..40;
    pub(super) const ALT_REMOTE_GID: Field = 40..56;
    /// Flow label (20), reserved (4), traffic class (8).
    pub(super) const ALT_FLOW_LABEL: Field = 56..60;
    pub(super) const ALT_TRAFFIC_CLASS: usize = 59;
    pub(super) const ALT_HOP_LIMIT: usize = 60;
    /// Reserved (2), packet rate (6).
    pub(super) const ALT_PACKET_RATE: usize = 61;
    /// SL (4), subnet local (1), reserved (3).
    pub(super) const ALT_SL_SUBNET_LOCAL: usize = 62;
    /// Local ACK timeout (5), reserved (3).
    pub(super) const ALT_LOCAL_ACK_TIMEOUT: usize = 63;
    pub(super) const PRIVATE_DATA: Rest = 64..;
}

cm_message_packet!(CmLapPacket, "CM LAP", "A view of a CM LAP (the MAD data area).");

impl<T: AsRef<[u8]>> CmLapPacket<T> {
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Remote QPN/EECN (24 bits).
    pub fn remote_qpn(&self) -> u32 {
        be::u24(self.buffer.as_ref(), field::REMOTE_QPN)
    }
    /// Remote CM response timeout (5 bits).
    pub fn remote_cm_response_timeout(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::REMOTE_CM_RESPONSE_TIMEOUT, 0, 5)
    }
    /// Alternate local port LID.
    pub fn alt_local_lid(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::ALT_LOCAL_LID)
    }
    /// Alternate remote port LID.
    pub fn alt_remote_lid(&self) -> u16 {
        be::u16(self.buffer.as_ref(), field::ALT_REMOTE_LID)
    }
    /// Alternate local port GID.
    pub fn alt_local_gid(&self) -> [u8; 16] {
        gid(self.buffer.as_ref(), field::ALT_LOCAL_GID)
    }
    /// Alternate remote port GID.
    pub fn alt_remote_gid(&self) -> [u8; 16] {
        gid(self.buffer.as_ref(), field::ALT_REMOTE_GID)
    }
    /// Alternate flow label (20 bits).
    pub fn alt_flow_label(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::ALT_FLOW_LABEL) >> 12
    }
    /// Alternate traffic class.
    pub fn alt_traffic_class(&self) -> u8 {
        self.buffer.as_ref()[field::ALT_TRAFFIC_CLASS]
    }
    /// Alternate hop limit.
    pub fn alt_hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::ALT_HOP_LIMIT]
    }
    /// Alternate packet rate (6 bits).
    pub fn alt_packet_rate(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::ALT_PACKET_RATE, 2, 6)
    }
    /// Alternate SL (4 bits).
    pub fn alt_sl(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::ALT_SL_SUBNET_LOCAL, 0, 4)
    }
    /// Alternate subnet local.
    pub fn alt_subnet_local(&self) -> bool {
        bits::get(self.buffer.as_ref(), field::ALT_SL_SUBNET_LOCAL, 4, 1) != 0
    }
    /// Alternate local ACK timeout (5 bits).
    pub fn alt_local_ack_timeout(&self) -> u8 {
        bits::get(self.buffer.as_ref(), field::ALT_LOCAL_ACK_TIMEOUT, 0, 5)
    }
    /// The private data area (168 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA][..LAP_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmLapPacket<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::LOCAL_COMM_ID, v)
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REMOTE_COMM_ID, v)
    }
    /// Sets the Remote QPN/EECN (low 24 bits of `v`).
    pub fn set_remote_qpn(&mut self, v: u32) {
        be::set_u24(self.buffer.as_mut(), field::REMOTE_QPN, v)
    }
    /// Sets the remote CM response timeout (low 5 bits of `v`).
    pub fn set_remote_cm_response_timeout(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::REMOTE_CM_RESPONSE_TIMEOUT, 0, 5, v)
    }
    /// Sets the alternate local port LID.
    pub fn set_alt_local_lid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::ALT_LOCAL_LID, v)
    }
    /// Sets the alternate remote port LID.
    pub fn set_alt_remote_lid(&mut self, v: u16) {
        be::set_u16(self.buffer.as_mut(), field::ALT_REMOTE_LID, v)
    }
    /// Sets the alternate local port GID.
    pub fn set_alt_local_gid(&mut self, v: [u8; 16]) {
        self.buffer.as_mut()[field::ALT_LOCAL_GID].copy_from_slice(&v)
    }
    /// Sets the alternate remote port GID.
    pub fn set_alt_remote_gid(&mut self, v: [u8; 16]) {
        self.buffer.as_mut()[field::ALT_REMOTE_GID].copy_from_slice(&v)
    }
    /// Sets the alternate flow label (low 20 bits of `v`), leaving the traffic class alone.
    pub fn set_alt_flow_label(&mut self, v: u32) {
        set_flow_label(self.buffer.as_mut(), field::ALT_FLOW_LABEL, v)
    }
    /// Sets the alternate traffic class.
    pub fn set_alt_traffic_class(&mut self, v: u8) {
        self.buffer.as_mut()[field::ALT_TRAFFIC_CLASS] = v;
    }
    /// Sets the alternate hop limit.
    pub fn set_alt_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::ALT_HOP_LIMIT] = v;
    }
    /// Sets the alternate packet rate (low 6 bits of `v`).
    pub fn set_alt_packet_rate(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::ALT_PACKET_RATE, 2, 6, v)
    }
    /// Sets the alternate SL (low 4 bits of `v`).
    pub fn set_alt_sl(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::ALT_SL_SUBNET_LOCAL, 0, 4, v)
    }
    /// Sets alternate subnet local.
    pub fn set_alt_subnet_local(&mut self, v: bool) {
        bits::set(self.buffer.as_mut(), field::ALT_SL_SUBNET_LOCAL, 4, 1, u8::from(v))
    }
    /// Sets the alternate local ACK timeout (low 5 bits of `v`).
    pub fn set_alt_local_ack_timeout(&mut self, v: u8) {
        bits::set(self.buffer.as_mut(), field::ALT_LOCAL_ACK_TIMEOUT, 0, 5, v)
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA][..LAP_PRIVATE_DATA_LEN]
    }
}

/// A LAP as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmLapRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits).
    pub remote_qpn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// The alternate path to load.
    pub alternate_path: CmPathRepr,
    /// Private data: the whole 168-byte area on parse; on emit at most 168 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmLapRepr {
    /// Reads a LAP.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmLapPacket<&T>) -> Result<CmLapRepr> {
        p.check_len()?;
        Ok(CmLapRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn: p.remote_qpn(),
            remote_cm_response_timeout: p.remote_cm_response_timeout(),
            alternate_path: CmPathRepr {
                local_lid: p.alt_local_lid(),
                remote_lid: p.alt_remote_lid(),
                local_gid: p.alt_local_gid(),
                remote_gid: p.alt_remote_gid(),
                flow_label: p.alt_flow_label(),
                packet_rate: p.alt_packet_rate(),
                traffic_class: p.alt_traffic_class(),
                hop_limit: p.alt_hop_limit(),
                sl: p.alt_sl(),
                subnet_local: p.alt_subnet_local(),
                local_ack_timeout: p.alt_local_ack_timeout(),
            },
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Fails when a value does not fit its field or the private data is longer than 168 bytes.
    pub fn check(&self) -> Result<()> {
        check_width(self.remote_qpn, 24, "CM LAP remote QPN wider than 24 bits")?;
        check_width(self.remote_cm_response_timeout, 5, "CM LAP remote CM response timeout wider than 5 bits")?;
        self.alternate_path.check()?;
        check_area(&self.private_data, LAP_PRIVATE_DATA_LEN, "CM LAP private data longer than 168 bytes")
    }
    /// Writes the LAP over the whole data area, reserved bits zero. Fails, writing nothing, when
    /// [`CmLapRepr::check`] does.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmLapPacket<T>) -> Result<()> {
        self.check()?;
        p.check_len()?;
        p.buffer.as_mut()[..field::PRIVATE_DATA.start].fill(0);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_remote_qpn(self.remote_qpn);
        p.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        let a = &self.alternate_path;
        p.set_alt_local_lid(a.local_lid);
        p.set_alt_remote_lid(a.remote_lid);
        p.set_alt_local_gid(a.local_gid);
        p.set_alt_remote_gid(a.remote_gid);
        p.set_alt_flow_label(a.flow_label);
        p.set_alt_traffic_class(a.traffic_class);
        p.set_alt_hop_limit(a.hop_limit);
        p.set_alt_packet_rate(a.packet_rate);
        p.set_alt_sl(a.sl);
        p.set_alt_subnet_local(a.subnet_local);
        p.set_alt_local_ack_timeout(a.local_ack_timeout);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMessage};
    use crate::wire::Error;

    // A LAP loading the alternate path 192.0.2.1 -> 192.0.2.2 for QP 0x000167: flow label 0x2BBA0
    // (its word shared with traffic class 0x28), hop limit 64, rate 6, SL 3, subnet local, ACK
    // timeout 19; one private data byte.
    static LAP_BYTES: [u8; 65] = [
        0x71, 0xef, 0x75, 0x29, 0xc2, 0x5b, 0x8b, 0x76, 0, 0, 0, 0, 0x00, 0x01, 0x67, 0xb0, 0, 0, 0, 0, 0xff, 0xff,
        0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
        192, 0, 2, 2, 0x2b, 0xba, 0x00, 0x28, 0x40, 0x06, 0x38, 0x98, 0x42,
    ];

    fn mapped(a: [u8; 4]) -> [u8; 16] {
        core::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
    }

    fn lap() -> CmLapRepr {
        let mut private_data = vec![0; 168];
        private_data[0] = 0x42;
        CmLapRepr {
            local_comm_id: 0x71ef_7529,
            remote_comm_id: 0xc25b_8b76,
            remote_qpn: 0x167,
            remote_cm_response_timeout: 22,
            alternate_path: CmPathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: mapped([192, 0, 2, 1]),
                remote_gid: mapped([192, 0, 2, 2]),
                flow_label: 0x2bba0,
                packet_rate: 6,
                traffic_class: 0x28,
                hop_limit: 64,
                sl: 3,
                subnet_local: true,
                local_ack_timeout: 19,
            },
            private_data,
        }
    }

    #[test]
    fn deconstruct() {
        let b = captured::data_area(&LAP_BYTES);
        let p = CmLapPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id()), (0x71ef_7529, 0xc25b_8b76));
        assert_eq!((p.remote_qpn(), p.remote_cm_response_timeout()), (0x167, 22));
        assert_eq!((p.alt_local_lid(), p.alt_remote_lid()), (0xffff, 0xffff));
        assert_eq!((&p.alt_local_gid()[12..], &p.alt_remote_gid()[12..]), (&[192, 0, 2, 1][..], &[192, 0, 2, 2][..]));
        assert_eq!((p.alt_flow_label(), p.alt_traffic_class(), p.alt_hop_limit()), (0x2bba0, 0x28, 64));
        assert_eq!((p.alt_packet_rate(), p.alt_sl(), p.alt_subnet_local()), (6, 3, true));
        assert_eq!(p.alt_local_ack_timeout(), 19);
        assert_eq!((p.private_data().len(), p.private_data()[0]), (168, 0x42));
    }

    #[test]
    fn construct() {
        let mut b = vec![0u8; 232];
        let mut p = CmLapPacket::new_unchecked(&mut b[..]);
        p.set_local_comm_id(0x71ef_7529);
        p.set_remote_comm_id(0xc25b_8b76);
        p.set_remote_qpn(0x167);
        p.set_remote_cm_response_timeout(22);
        p.set_alt_local_lid(0xffff);
        p.set_alt_remote_lid(0xffff);
        p.set_alt_local_gid(mapped([192, 0, 2, 1]));
        p.set_alt_remote_gid(mapped([192, 0, 2, 2]));
        p.set_alt_traffic_class(0x28);
        p.set_alt_flow_label(0x2bba0);
        p.set_alt_hop_limit(64);
        p.set_alt_packet_rate(6);
        p.set_alt_sl(3);
        p.set_alt_subnet_local(true);
        p.set_alt_local_ack_timeout(19);
        p.private_data_mut()[0] = 0x42;
        assert_eq!(b, captured::data_area(&LAP_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&LAP_BYTES);
        assert_eq!(CmLapRepr::parse(&CmLapPacket::new_checked(&b[..]).unwrap()), Ok(lap()));
        assert_eq!(CmLapPacket::new_checked(&b[..64]), Err(Error::Truncated("CM LAP")));
    }

    #[test]
    fn emit() {
        let mut b = vec![0x99u8; 232];
        lap().emit(&mut CmLapPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&LAP_BYTES));
        let mut wide = lap();
        wide.alternate_path.sl = 16;
        assert!(wide.emit(&mut CmLapPacket::new_unchecked(&mut b[..])).is_err());
        assert!(CmLapRepr { remote_qpn: 1 << 24, ..lap() }.emit(&mut CmLapPacket::new_unchecked(&mut b[..])).is_err());
    }

    #[test]
    fn whole_mad_round_trip() {
        captured::mad_round_trip(7, CmMessage::Lap(lap()));
    }
}
