//! librdmacm's rsocket family (`rsocket`, `rbind`, ... `riowrite`): not built yet, so every call
//! fails with ENOSYS after one line on stderr saying so. No call pretends to work. The rest of
//! librdmacm is in `cma`.

use std::sync::Once;

use crate::set_errno;

static SAID: Once = Once::new();

fn not_yet(name: &str) {
    SAID.call_once(|| {
        eprintln!("softrdma: rsockets are not implemented yet ({name} and the other r* calls fail with ENOSYS)");
    });
    set_errno(libc::ENOSYS);
}

/// Functions that return an int (or ssize_t/off_t): -1 with errno ENOSYS. The arguments are
/// not read, so they are not declared (the C calling convention lets the callee ignore them).
macro_rules! enosys_int {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            not_yet(stringify!($name));
            -1
        }
    )*};
}

enosys_int!(
    raccept,
    rbind,
    rclose,
    rconnect,
    rfcntl,
    rgetpeername,
    rgetsockname,
    rgetsockopt,
    riomap,
    riounmap,
    riowrite,
    rlisten,
    rpoll,
    rread,
    rreadv,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rselect,
    rsend,
    rsendmsg,
    rsendto,
    rsetsockopt,
    rshutdown,
    rsocket,
    rwrite,
    rwritev,
);
