//! The exported libibverbs functions that have no meaning on this device: fork-range bookkeeping
//! (nothing is pinned), the sysfs path, importing objects from another process's context, ECE,
//! and resolving a GID to a MAC. Those that cannot succeed fail with EOPNOTSUPP, as libibverbs
//! does on a provider without them.

use std::ffi::{c_char, c_int, c_void};

use crate::ffi;
use crate::set_errno;

/// Fork safety needs no pinned-page bookkeeping here (the device copies through the kernel).
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

fn not_supported_ptr<T>() -> *mut T {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// Importing a context shared by another process through its command fd: softrdma contexts are
/// connections to a device process, not kernel files, so there is nothing to import.
#[no_mangle]
pub extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ffi::ibv_context {
    not_supported_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_import_pd(_ctx: *mut ffi::ibv_context, _handle: u32) -> *mut ffi::ibv_pd {
    not_supported_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_unimport_pd(_pd: *mut ffi::ibv_pd) {}

#[no_mangle]
pub extern "C" fn ibv_import_mr(_pd: *mut ffi::ibv_pd, _handle: u32) -> *mut ffi::ibv_mr {
    not_supported_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_unimport_mr(_mr: *mut ffi::ibv_mr) {}

#[no_mangle]
pub extern "C" fn ibv_import_dm(_ctx: *mut ffi::ibv_context, _handle: u32) -> *mut ffi::ibv_dm {
    not_supported_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_unimport_dm(_dm: *mut ffi::ibv_dm) {}

/// Enhanced connection establishment is a vendor extension this device does not have.
#[no_mangle]
pub extern "C" fn ibv_query_ece(_qp: *mut ffi::ibv_qp, _ece: *mut ffi::ibv_ece) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_set_ece(_qp: *mut ffi::ibv_qp, _ece: *mut ffi::ibv_ece) -> c_int {
    libc::EOPNOTSUPP
}

/// Resolving a GID to an Ethernet address needs the kernel's neighbour table for a NIC; UDP
/// sockets do that themselves.
#[no_mangle]
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    _ctx: *mut ffi::ibv_context,
    _attr: *mut ffi::ibv_ah_attr,
    _mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    libc::EOPNOTSUPP
}
