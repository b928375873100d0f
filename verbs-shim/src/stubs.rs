//! Stub `libmlx5.so.1` and `libefa.so.1`: perftest links them directly. The device is neither
//! a Mellanox nor an EFA device (its vendor id is not theirs), so programs take the plain verbs
//! path; if they ask anyway, every direct-verbs call fails cleanly with EOPNOTSUPP.

use std::ffi::c_void;

use crate::set_errno;

macro_rules! unsupported_ptr {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    )*};
}

macro_rules! unsupported_int {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> i32 {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

unsupported_ptr!(
    mlx5dv_open_device,
    mlx5dv_create_qp,
    mlx5dv_create_mkey,
    mlx5dv_dek_create,
    mlx5dv_qp_ex_from_ibv_qp_ex,
    efadv_create_qp_ex,
);

unsupported_int!(
    mlx5dv_destroy_mkey,
    mlx5dv_crypto_login,
    mlx5dv_dek_destroy,
    mlx5dv_devx_general_cmd,
    mlx5dv_query_device,
    efadv_query_device,
);

/// `mlx5dv_is_supported`: no device here is an mlx5 device.
#[no_mangle]
pub extern "C" fn mlx5dv_is_supported() -> bool {
    false
}
