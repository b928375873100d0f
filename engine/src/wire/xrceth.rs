//! The XRC Extended Transport Header (IBTA Vol 1 Annex A14): the XRC SRQ a request is for.

word_header! {
    "XRCETH";
    /// The XRC SRQ number (24 bits; byte 0 is reserved).
    xrc_srqn / set_xrc_srqn : 24 bits;
    sample: [0, 0, 0, 0x99] => 0x99,
    /// The XRCETH of coverage.pcap frame 13 (XRC SEND_ONLY to SRQ 0x99).
}
