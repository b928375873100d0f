//! The verbs calls librdmacm makes, through libibverbs' exported symbols.
//!
//! `librdmacm.so.1` is linked from the same static library as `libibverbs.so.1`, so it carries a
//! private copy of every `ibv_*` function. Contexts, PDs and QPs that a program shares between
//! the two libraries (`id->verbs`, `id->qp`, `ibv_alloc_pd(id->verbs)`) must all come from the one
//! libibverbs the program uses, as they do with rdma-core: so librdmacm looks the verbs up in the
//! process's global scope (dlsym), and only falls back to its own copy where there is none (this
//! crate's own tests, where both are one).

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::ffi;

#[allow(clippy::type_complexity)]
pub(crate) struct Api {
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ffi::ibv_device,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut ffi::ibv_device),
    pub(crate) open_device: unsafe extern "C" fn(*mut ffi::ibv_device) -> *mut ffi::ibv_context,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut ffi::ibv_context) -> *mut ffi::ibv_pd,
    pub(crate) create_qp: unsafe extern "C" fn(*mut ffi::ibv_pd, *mut ffi::ibv_qp_init_attr) -> *mut ffi::ibv_qp,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut ffi::ibv_qp, *mut ffi::ibv_qp_attr, c_int) -> c_int,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut ffi::ibv_qp) -> c_int,
    pub(crate) create_cq: unsafe extern "C" fn(
        *mut ffi::ibv_context,
        c_int,
        *mut c_void,
        *mut ffi::ibv_comp_channel,
        c_int,
    ) -> *mut ffi::ibv_cq,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut ffi::ibv_cq) -> c_int,
    pub(crate) create_comp_channel: unsafe extern "C" fn(*mut ffi::ibv_context) -> *mut ffi::ibv_comp_channel,
    pub(crate) destroy_comp_channel: unsafe extern "C" fn(*mut ffi::ibv_comp_channel) -> c_int,
    pub(crate) create_srq: unsafe extern "C" fn(*mut ffi::ibv_pd, *mut ffi::ibv_srq_init_attr) -> *mut ffi::ibv_srq,
    pub(crate) destroy_srq: unsafe extern "C" fn(*mut ffi::ibv_srq) -> c_int,
    pub(crate) query_device: unsafe extern "C" fn(*mut ffi::ibv_context, *mut ffi::ibv_device_attr) -> c_int,
    pub(crate) attach_mcast: unsafe extern "C" fn(*mut ffi::ibv_qp, *const ffi::ibv_gid, u16) -> c_int,
    pub(crate) detach_mcast: unsafe extern "C" fn(*mut ffi::ibv_qp, *const ffi::ibv_gid, u16) -> c_int,
    // The rest are rsockets' (src/rsocket): memory, completion events, ports and address handles.
    pub(crate) reg_mr: unsafe extern "C" fn(*mut ffi::ibv_pd, *mut c_void, usize, c_int) -> *mut ffi::ibv_mr,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut ffi::ibv_mr) -> c_int,
    pub(crate) get_cq_event:
        unsafe extern "C" fn(*mut ffi::ibv_comp_channel, *mut *mut ffi::ibv_cq, *mut *mut c_void) -> c_int,
    pub(crate) ack_cq_events: unsafe extern "C" fn(*mut ffi::ibv_cq, u32),
    pub(crate) create_ah: unsafe extern "C" fn(*mut ffi::ibv_pd, *mut ffi::ibv_ah_attr) -> *mut ffi::ibv_ah,
    pub(crate) destroy_ah: unsafe extern "C" fn(*mut ffi::ibv_ah) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut ffi::ibv_context, u8, c_int, *mut ffi::ibv_gid) -> c_int,
}

fn lookup<T: Copy>(name: &CStr, fallback: T) -> T {
    // SAFETY: dlsym with RTLD_DEFAULT only searches the global scope; a symbol found under
    // that name is libibverbs' function of the same C signature.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return fallback;
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is a function pointer type of the symbol's signature (same size as a pointer).
    unsafe { std::mem::transmute_copy(&p) }
}

/// The verbs, resolved once.
pub(crate) fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| Api {
        get_device_list: lookup(c"ibv_get_device_list", crate::device::ibv_get_device_list as _),
        free_device_list: lookup(c"ibv_free_device_list", crate::device::ibv_free_device_list as _),
        open_device: lookup(c"ibv_open_device", crate::context::ibv_open_device as _),
        alloc_pd: lookup(c"ibv_alloc_pd", crate::mem::ibv_alloc_pd as _),
        create_qp: lookup(c"ibv_create_qp", crate::qp::ibv_create_qp as _),
        modify_qp: lookup(c"ibv_modify_qp", crate::qp::ibv_modify_qp as _),
        destroy_qp: lookup(c"ibv_destroy_qp", crate::qp::ibv_destroy_qp as _),
        create_cq: lookup(c"ibv_create_cq", crate::cq::ibv_create_cq as _),
        destroy_cq: lookup(c"ibv_destroy_cq", crate::cq::ibv_destroy_cq as _),
        create_comp_channel: lookup(c"ibv_create_comp_channel", crate::cq::ibv_create_comp_channel as _),
        destroy_comp_channel: lookup(c"ibv_destroy_comp_channel", crate::cq::ibv_destroy_comp_channel as _),
        create_srq: lookup(c"ibv_create_srq", crate::qp::ibv_create_srq as _),
        destroy_srq: lookup(c"ibv_destroy_srq", crate::qp::ibv_destroy_srq as _),
        query_device: lookup(c"ibv_query_device", crate::context::ibv_query_device as _),
        attach_mcast: lookup(c"ibv_attach_mcast", crate::qp::ibv_attach_mcast as _),
        detach_mcast: lookup(c"ibv_detach_mcast", crate::qp::ibv_detach_mcast as _),
        reg_mr: lookup(c"ibv_reg_mr", crate::mem::ibv_reg_mr as _),
        dereg_mr: lookup(c"ibv_dereg_mr", crate::mem::ibv_dereg_mr as _),
        get_cq_event: lookup(c"ibv_get_cq_event", crate::cq::ibv_get_cq_event as _),
        ack_cq_events: lookup(c"ibv_ack_cq_events", crate::cq::ibv_ack_cq_events as _),
        create_ah: lookup(c"ibv_create_ah", crate::mem::ibv_create_ah as _),
        destroy_ah: lookup(c"ibv_destroy_ah", crate::mem::ibv_destroy_ah as _),
        query_gid: lookup(c"ibv_query_gid", crate::context::ibv_query_gid as _),
    })
}
