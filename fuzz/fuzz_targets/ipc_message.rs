//! Fuzzes the device's client protocol decoder with untrusted bytes, as a malicious local client
//! would send them on the device socket: framing (length prefix, size limit) and the postcard
//! body. Nothing may panic or allocate without bound; a message that decodes re-encodes to a
//! message that decodes the same.
#![no_main]

use std::io::Write;
use std::os::unix::net::UnixStream;

use libfuzzer_sys::fuzz_target;
use softrdma_device::proto::{self, Request};

fuzz_target!(|data: &[u8]| {
    // The body decoder alone.
    if let Ok(m) = postcard::from_bytes::<Request>(data) {
        let again = postcard::to_stdvec(&m).expect("a decoded message encodes");
        let back: Request = postcard::from_bytes(&again).expect("an encoded message decodes");
        assert_eq!(format!("{m:?}"), format!("{back:?}"));
    }
    // The framing, as the device reads a connection: frames until the first error.
    let (mut a, b) = UnixStream::pair().expect("socketpair");
    if data.len() > 64 * 1024 {
        return;
    }
    a.write_all(data).expect("write");
    drop(a);
    for _ in 0..64 {
        if proto::recv::<Request>(&b).is_err() {
            break;
        }
    }
});
