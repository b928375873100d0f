//! Devices coming and going under rdma_cm (the kernel's cma_add_one / cma_process_remove), and
//! `rdma_get_devices`.

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::Arc;

use softrdma_device::proto::{Request, Response};

use super::addr::unattached;
use super::event::DEVICE_REMOVAL;
use super::id::{place, post_local};
use super::{cm_call, cma, lock, CmDev, Id, IdState};
use crate::{ffi, ptr_call, Errno};

/// RDMA_CM_EVENT_DEVICE_REMOVAL (cma_process_remove): device `dev` went away; every ID with a
/// place on it hears so on its channel, once. The IDs stay for the program to destroy.
pub(crate) fn device_removed(cma: &super::Cma, dev: &Arc<CmDev>) {
    // The live set stays locked: an ID being destroyed leaves it first, so none is freed here.
    let live = lock(&cma.live);
    for &p in live.iter() {
        // SAFETY: a live ID (see id_of).
        let id = unsafe { &*(p as *const Id) };
        let st = lock(&id.st);
        if st.on.iter().any(|pl| Arc::ptr_eq(&pl.dev, dev)) {
            let _ = post_local(id, &st, DEVICE_REMOVAL, 0);
        }
    }
}

/// The ID listens on `dev`: a device ID with the bound address, listening with `backlog`.
pub(super) fn listen_on(
    id: &Id,
    st: &mut IdState,
    dev: &Arc<CmDev>,
    bound: SocketAddr,
    backlog: u32,
) -> Result<(), Errno> {
    let p = place(id, st, dev)?;
    cm_call(dev, &Request::CmSetAddrs { id: p.id, local: Some(bound), remote: None, tos: st.tos }, &[])
        .or_else(|e| if e.0 == libc::EINVAL { Ok(Response::Ok) } else { Err(e) })?;
    cm_call(dev, &Request::CmListen { id: p.id, backlog }, &[])?;
    Ok(())
}

/// A device started after the program's first rdma_cm call: every wildcard listener listens on it
/// too, as the kernel's cma_add_one has each listener bound to a wildcard address listen on a new
/// ib_device (cma_listen_on_dev).
pub(crate) fn device_added(cma: &super::Cma, dev: &Arc<CmDev>) {
    let live = lock(&cma.live);
    for &p in live.iter() {
        // SAFETY: a live ID (see id_of).
        let id = unsafe { &*(p as *const Id) };
        let mut st = lock(&id.st);
        let Some(bound) = st.bound.filter(|b| unattached(cma, b.ip())) else { continue };
        if !st.listening || st.on.iter().any(|pl| Arc::ptr_eq(&pl.dev, dev)) {
            continue;
        }
        let backlog = st.backlog;
        if let Err(e) = listen_on(id, &mut st, dev, bound, backlog) {
            // The kernel logs and goes on when a listen on a new device fails.
            eprintln!("softrdma: rdma_cm: listening on new device {} failed: errno {}", dev.name, e.0);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ffi::ibv_context {
    ptr_call(|| {
        let cma = match cma() {
            Ok(c) => c,
            Err(e) => {
                if !num_devices.is_null() {
                    // SAFETY: the caller's int.
                    unsafe { *num_devices = 0 };
                }
                return Err(e);
            }
        };
        let devs = cma.devs();
        let n = devs.len();
        // SAFETY: a NULL-terminated array the caller frees with rdma_free_devices.
        let list =
            unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ffi::ibv_context>()) } as *mut *mut ffi::ibv_context;
        if list.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        for (k, d) in devs.iter().enumerate() {
            // SAFETY: n + 1 entries.
            unsafe { *list.add(k) = d.verbs };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's int.
            unsafe { *num_devices = n as c_int };
        }
        Ok(list)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ffi::ibv_context) {
    // SAFETY: from rdma_get_devices (calloc).
    unsafe { libc::free(list as *mut c_void) };
}
