//! CM MADs in captures: every UD SEND_ONLY to QP1 of the hardware captures decodes as a CM MAD
//! (the connection set-up and tear-down of ../shared/reference/cm/README.md), no other frame does,
//! and a broken MAD on QP1 is reported on the MAD without making the IB packet malformed.

mod common;

use common::{read_all, shared};
use softrdma_engine::wire::{CmAttr, CmMessage, Error as WireError};
use softrdma_pcap::analyze::{summarize, FrameSummary};
use softrdma_pcap::Reader;

fn summaries(name: &str) -> Vec<FrameSummary> {
    let bytes = std::fs::read(shared().join("captures").join(name)).unwrap();
    let (records, err) = read_all(Reader::new(&bytes[..]).unwrap(), bytes.len());
    assert!(err.is_none(), "{name}: {err:?}");
    records.iter().map(|r| summarize(r.index, r.linktype, &r.data, r.is_truncated())).collect()
}

/// (frame number, attribute) of every CM MAD, in order.
fn cm_frames(name: &str) -> Vec<(u64, CmAttr)> {
    summaries(name)
        .iter()
        .filter_map(|s| {
            let cm = s.ib.as_ref()?.cm.as_ref()?;
            Some((s.frame, cm.as_ref().unwrap_or_else(|e| panic!("{name} frame {}: {e}", s.frame)).msg.attr()))
        })
        .collect()
}

#[test]
fn connection_set_up_and_tear_down_in_each_capture() {
    use CmAttr::*;
    // Frame numbers from the tshark decodes in ../shared/reference/cm/*.cm.txt.
    assert_eq!(cm_frames("write.pcap"), [(1, Req), (2, Rep), (3, Rtu), (16, Dreq), (17, Drep)]);
    assert_eq!(cm_frames("read2.pcap"), [(4, Req), (5, Rep), (6, Rtu), (15, Dreq), (16, Drep)]);
    assert_eq!(cm_frames("send.pcap"), [(1, Req), (2, Rep), (3, Rtu), (8, Dreq), (9, Drep)]);
    assert_eq!(cm_frames("nvme-discover2.pcap"), [(1, Req), (2, Rep), (3, Rtu), (28, Dreq), (31, Drep)]);
    // Data-path traffic only: no frame is taken for a MAD.
    assert_eq!(cm_frames("rocev2_test.pcap"), []);
    assert_eq!(cm_frames("rxe-rc-ud-pingpong-n20.pcap"), []);
}

#[test]
fn the_write_req_decodes_with_its_values() {
    let s = &summaries("write.pcap")[0];
    let cm = s.ib.as_ref().unwrap().cm.clone().unwrap().unwrap();
    assert_eq!(cm.tid, 0x0000_000b_2975_ef71);
    let CmMessage::Req(req) = &cm.msg else { panic!("not a REQ") };
    assert_eq!((req.service_id, req.local_qpn, req.starting_psn), (0x0000_0000_0106_00ac, 0x137, 0x9f_931b));
    assert_eq!(cm.msg.cma_hdr().unwrap().port, 50775);
}

#[test]
fn a_broken_mad_on_qp1_is_the_mads_error_not_the_packets() {
    let bytes = std::fs::read(shared().join("captures/write.pcap")).unwrap();
    let (records, _) = read_all(Reader::new(&bytes[..]).unwrap(), bytes.len());
    let mut frame = records[0].data.clone();
    // MAD byte 1 (management class) sits at 14 + 20 + 8 + 12 + 8 + 1 = 63. The ICRC covers it and
    // goes bad: that is the packet's own, separate verdict.
    frame[63] = 0x04;
    let s = summarize(1, records[0].linktype, &frame, false);
    let ib = s.ib.unwrap();
    assert_eq!(ib.cm, Some(Err(WireError::Malformed("MAD class is not CM (0x07)"))));
    assert_eq!(ib.error, None);
    assert!(ib.has_bad_icrc());
}
