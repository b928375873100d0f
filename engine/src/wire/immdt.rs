//! The Immediate Data Extended Transport Header (IBTA Vol 1 9.3.5): 4 opaque bytes delivered in
//! the receive completion of a SEND or RDMA WRITE "with immediate".

word_header! {
    "ImmDt";
    /// The immediate data, read big-endian (the bytes as on the wire).
    imm / set_imm : 32 bits;
    sample: [0xde, 0xad, 0xbe, 0xef] => 0xdead_beef,
    /// The ImmDt of golden packet g5.
}
