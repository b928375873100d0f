//! # softrdma-pcap
//! placeholder
