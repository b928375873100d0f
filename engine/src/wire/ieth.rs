//! The Invalidate Extended Transport Header (IBTA Vol 1 9.3.7): the R_Key a SEND with
//! invalidate asks the responder to invalidate.

word_header! {
    "IETH";
    /// The R_Key to invalidate.
    rkey / set_rkey : 32 bits;
    sample: [0, 0, 0x12, 0x34] => 0x1234,
    /// The IETH of coverage.pcap frame 11 (RC SEND_ONLY_WITH_INVALIDATE, rkey 0x1234).
}
