//! The CM LAP and APR messages (IBTA Vol 1 12.8.1 and 12.8.2, tables 115 and 116; attributes
//! 0x0019 and 0x001A): load an alternate path into a connection, and the answer.
//!
//! The LAP carries the same path values as a REQ path block, in its own order (the traffic class
//! shares the flow label's word, the hop limit comes before the rate); they are read into a
//! [`CmPathRepr`]. Offsets count from the end of the MAD header, as in Linux `include/rdma/ibta_vol1_c12.h`.

use super::cm::{check_area, check_width, write_area};
use super::cm_path::{gid, set_flow_label, CmPathRepr};
use super::mad::MAD_DATA_LEN;
use super::{be, bits, Result};

/// Bytes of LAP private data (IBTA Vol 1 table 115; Linux `IB_CM_LAP_PRIVATE_DATA_SIZE`).
pub const LAP_PRIVATE_DATA_LEN: usize = 168;
/// Bytes of APR private data (IBTA Vol 1 table 116; Linux `IB_CM_APR_PRIVATE_DATA_SIZE`).
pub const APR_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of the APR additional information area.
pub const APR_ADD_INFO_LEN: usize = 72;

mod field {
    use super::super::{Field, Rest};
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;

    // LAP. Bytes 8-11 are reserved.
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
    pub(super) const LAP_PRIVATE_DATA: Rest = 64..;

    // APR.
    pub(super) const ADD_INFO_LEN: usize = 8;
    pub(super) const AP_STATUS: usize = 9;
    // Bytes 10-11 are reserved.
    pub(super) const ADD_INFO: Field = 12..84;
    pub(super) const APR_PRIVATE_DATA: Rest = 84..;
}

cm_message_packet!(CmLapPacket, "CM LAP", "A view of a CM LAP (the MAD data area).");
cm_message_packet!(CmAprPacket, "CM APR", "A view of a CM APR (the MAD data area).");

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
        &self.buffer.as_ref()[field::LAP_PRIVATE_DATA][..LAP_PRIVATE_DATA_LEN]
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
        &mut self.buffer.as_mut()[field::LAP_PRIVATE_DATA][..LAP_PRIVATE_DATA_LEN]
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
        p.buffer.as_mut()[..field::LAP_PRIVATE_DATA.start].fill(0);
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

impl<T: AsRef<[u8]>> CmAprPacket<T> {
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::LOCAL_COMM_ID)
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(self.buffer.as_ref(), field::REMOTE_COMM_ID)
    }
    /// Additional information length.
    pub fn add_info_len(&self) -> u8 {
        self.buffer.as_ref()[field::ADD_INFO_LEN]
    }
    /// AP status (IBTA Vol 1 table 117: 0 loaded, 1 invalid comm ID, ...).
    pub fn status(&self) -> u8 {
        self.buffer.as_ref()[field::AP_STATUS]
    }
    /// The additional information area (72 bytes).
    pub fn add_info(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ADD_INFO]
    }
    /// The private data area (148 bytes once checked).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::APR_PRIVATE_DATA][..APR_PRIVATE_DATA_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmAprPacket<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::LOCAL_COMM_ID, v)
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, v: u32) {
        be::set_u32(self.buffer.as_mut(), field::REMOTE_COMM_ID, v)
    }
    /// Sets the additional information length.
    pub fn set_add_info_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::ADD_INFO_LEN] = v;
    }
    /// Sets the AP status.
    pub fn set_status(&mut self, v: u8) {
        self.buffer.as_mut()[field::AP_STATUS] = v;
    }
    /// The additional information area, writable.
    pub fn add_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ADD_INFO]
    }
    /// The private data area, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::APR_PRIVATE_DATA][..APR_PRIVATE_DATA_LEN]
    }
}

/// An APR as values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmAprRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Additional information length, kept as sent: it is not checked against `add_info`.
    pub add_info_len: u8,
    /// AP status.
    pub status: u8,
    /// Additional information: the whole 72-byte area on parse; on emit at most 72 bytes, zero-padded.
    pub add_info: Vec<u8>,
    /// Private data: the whole 148-byte area on parse; on emit at most 148 bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl CmAprRepr {
    /// Reads an APR.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmAprPacket<&T>) -> Result<CmAprRepr> {
        p.check_len()?;
        Ok(CmAprRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            add_info_len: p.add_info_len(),
            status: p.status(),
            add_info: p.add_info().to_vec(),
            private_data: p.private_data().to_vec(),
        })
    }
    /// Bytes the message takes (the whole MAD data area).
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }
    /// Writes the APR over the whole data area, reserved bytes zero. Fails, writing nothing, when
    /// an area is too long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmAprPacket<T>) -> Result<()> {
        check_area(&self.add_info, APR_ADD_INFO_LEN, "CM APR additional information longer than 72 bytes")?;
        check_area(&self.private_data, APR_PRIVATE_DATA_LEN, "CM APR private data longer than 148 bytes")?;
        p.check_len()?;
        p.buffer.as_mut()[..field::ADD_INFO.start].fill(0);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_add_info_len(self.add_info_len);
        p.set_status(self.status);
        write_area(p.add_info_mut(), &self.add_info);
        write_area(p.private_data_mut(), &self.private_data);
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::wire::cm::{captured, CmMadRepr, CmMessage};
    use crate::wire::Error;

    // A LAP loading the alternate path 192.0.2.1 -> 192.0.2.2 for QP 0x000167: flow label 0x2BBA0
    // (its word shared with traffic class 0x28), hop limit 64, rate 6, SL 3, subnet local, ACK
    // timeout 19; one private data byte.
    static LAP_BYTES: [u8; 65] = [
        0x71, 0xef, 0x75, 0x29, 0xc2, 0x5b, 0x8b, 0x76, 0, 0, 0, 0, 0x00, 0x01, 0x67, 0xb0, 0, 0, 0, 0, 0xff, 0xff,
        0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
        192, 0, 2, 2, 0x2b, 0xba, 0x00, 0x28, 0x40, 0x06, 0x38, 0x98, 0x42,
    ];
    // Its APR: status 0 (alternate path loaded), 1 byte of additional information, 1 of private data.
    static APR_BYTES: [u8; 85] = [
        0xc2, 0x5b, 0x8b, 0x76, 0x71, 0xef, 0x75, 0x29, 0x01, 0x00, 0x00, 0x00, 0x5c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa1,
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
    fn apr() -> CmAprRepr {
        let mut add_info = vec![0; 72];
        add_info[0] = 0x5c;
        let mut private_data = vec![0; 148];
        private_data[0] = 0xa1;
        CmAprRepr {
            local_comm_id: 0xc25b_8b76,
            remote_comm_id: 0x71ef_7529,
            add_info_len: 1,
            status: 0,
            add_info,
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

        let b = captured::data_area(&APR_BYTES);
        let p = CmAprPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.local_comm_id(), p.remote_comm_id()), (0xc25b_8b76, 0x71ef_7529));
        assert_eq!((p.add_info_len(), p.status(), p.add_info()[0]), (1, 0, 0x5c));
        assert_eq!((p.private_data().len(), p.private_data()[0]), (148, 0xa1));
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

        let mut b = vec![0u8; 232];
        let mut p = CmAprPacket::new_unchecked(&mut b[..]);
        p.set_local_comm_id(0xc25b_8b76);
        p.set_remote_comm_id(0x71ef_7529);
        p.set_add_info_len(1);
        p.set_status(0);
        p.add_info_mut()[0] = 0x5c;
        p.private_data_mut()[0] = 0xa1;
        assert_eq!(b, captured::data_area(&APR_BYTES));
    }

    #[test]
    fn parse() {
        let b = captured::data_area(&LAP_BYTES);
        assert_eq!(CmLapRepr::parse(&CmLapPacket::new_checked(&b[..]).unwrap()), Ok(lap()));
        assert_eq!(CmLapPacket::new_checked(&b[..64]), Err(Error::Truncated("CM LAP")));
        let b = captured::data_area(&APR_BYTES);
        assert_eq!(CmAprRepr::parse(&CmAprPacket::new_checked(&b[..]).unwrap()), Ok(apr()));
        assert_eq!(CmAprPacket::new_checked(&b[..84]), Err(Error::Truncated("CM APR")));
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

        let mut b = vec![0x99u8; 232];
        apr().emit(&mut CmAprPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, captured::data_area(&APR_BYTES));
        assert!(CmAprRepr { add_info: vec![0; 73], ..apr() }
            .emit(&mut CmAprPacket::new_unchecked(&mut b[..]))
            .is_err());
    }

    #[test]
    fn whole_mad_round_trip() {
        for msg in [CmMessage::Lap(lap()), CmMessage::Apr(apr())] {
            let mad = CmMadRepr { tid: 7, attr_mod: 0, msg };
            let mut b = [0u8; 256];
            mad.emit(&mut b).unwrap();
            assert_eq!(CmMadRepr::parse(&b), Ok(mad));
        }
    }
}
