//! The Reliable Datagram Extended Transport Header (IBTA Vol 1 9.3.1): the EE context of an RD
//! packet. softrdma does not implement RD; the header exists so RD traces decode.

word_header! {
    "RDETH";
    /// The EE context (24 bits; byte 0 is reserved).
    ee_context / set_ee_context : 24 bits;
    sample: [0, 0, 0, 0x99] => 0x99,
    /// The RDETH of an RD packet for EE context 0x99.
}
