//! `librdmacm.so.1`: loads for every program that links it, so their verbs parts run; the
//! connection manager itself (CM MADs over the wire, event channels) is not built yet, so
//! every call fails with ENOSYS after one line on stderr saying so. No call pretends to work.

use std::ffi::{c_int, c_void};
use std::sync::Once;

use crate::set_errno;

static SAID: Once = Once::new();

fn not_yet(name: &str) {
    SAID.call_once(|| {
        eprintln!("softrdma: rdma_cm is not implemented yet ({name} and every other librdmacm call fail with ENOSYS)");
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

/// Functions that return a pointer: NULL with errno ENOSYS.
macro_rules! enosys_ptr {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            not_yet(stringify!($name));
            std::ptr::null_mut()
        }
    )*};
}

/// Functions that return nothing: nothing was made, so there is nothing to free.
macro_rules! noop_void {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

enosys_int!(
    rdma_accept,
    rdma_ack_cm_event,
    rdma_bind_addr,
    rdma_connect,
    rdma_create_ep,
    rdma_create_id,
    rdma_create_qp,
    rdma_create_qp_ex,
    rdma_create_srq,
    rdma_create_srq_ex,
    rdma_disconnect,
    rdma_establish,
    rdma_get_cm_event,
    rdma_get_remote_ece,
    rdma_get_request,
    rdma_init_qp_attr,
    rdma_join_multicast,
    rdma_join_multicast_ex,
    rdma_leave_multicast,
    rdma_listen,
    rdma_migrate_id,
    rdma_notify,
    rdma_reject,
    rdma_reject_ece,
    rdma_resolve_addr,
    rdma_resolve_route,
    rdma_set_local_ece,
    rdma_set_option,
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

enosys_ptr!(rdma_create_event_channel, rdma_get_devices);

noop_void!(rdma_destroy_event_channel, rdma_destroy_qp, rdma_destroy_ep, rdma_destroy_srq, rdma_free_devices);

/// `rdma_destroy_id`: no id was ever made; ENOSYS.
#[no_mangle]
pub extern "C" fn rdma_destroy_id() -> c_int {
    not_yet("rdma_destroy_id");
    -1
}

/// The port of an id: none exists.
#[no_mangle]
pub extern "C" fn rdma_get_src_port() -> u16 {
    not_yet("rdma_get_src_port");
    0
}

#[no_mangle]
pub extern "C" fn rdma_get_dst_port() -> u16 {
    not_yet("rdma_get_dst_port");
    0
}
