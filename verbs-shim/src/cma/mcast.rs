//! Multicast: `rdma_join_multicast[_ex]` and `rdma_leave_multicast`.

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::{c_int, c_void};

use softrdma_device::proto::Request;
use softrdma_engine::verbs::QpType;

use super::id::{first, id_mut};
use super::{api, cm_call, id_of, lock, sockaddr_from, McJoin};
use crate::cma_ffi as c;
use crate::{ffi, minus1_call, Errno, EINVAL};

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut c::rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    minus1_call(|| {
        join(id, addr, false, context)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut c::rdma_cm_id,
    attr: *mut c::rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    minus1_call(|| {
        let a = crate::nonnull(attr)?;
        // librdmacm's checks, in its order.
        if a.comp_mask >= c::RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(Errno(libc::ENOTSUP));
        }
        if a.comp_mask & c::RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || a.comp_mask & c::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || a.join_flags >= c::RDMA_MC_JOIN_FLAG_RESERVED
        {
            return Err(EINVAL);
        }
        join(id, a.addr as *mut libc::sockaddr, a.join_flags == c::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, context)?;
        Ok(0)
    })
}

/// rdma_join_multicast2: the ID's device joins the group; RDMA_CM_EVENT_MULTICAST_JOIN follows on
/// the ID's channel, where the QP is attached (ucma_process_join).
pub(super) fn join(
    id: *mut c::rdma_cm_id,
    addr: *mut libc::sockaddr,
    send_only: bool,
    context: *mut c_void,
) -> Result<(), Errno> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let i = id_of(id)?;
    let group = sockaddr_from(addr).ok_or(EINVAL)?.ip();
    let mut st = lock(&i.st);
    // The kernel's rdma_join_multicast: a UD ID whose address is bound or resolved.
    if st.qp_type != QpType::Ud || st.bound.is_none() {
        return Err(EINVAL);
    }
    let p = first(&st)?;
    let handle = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    st.mcs.push(McJoin { handle, group, context, send_only, attached: false });
    drop(st);
    if let Err(e) = cm_call(&p.dev, &Request::CmJoin { id: p.id, group, send_only, user: handle }, &[]) {
        lock(&i.st).mcs.retain(|m| m.handle != handle);
        return Err(e);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut c::rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let group = sockaddr_from(addr).ok_or(EINVAL)?.ip();
        let mut st = lock(&i.st);
        // librdmacm: a group this ID did not join is EADDRNOTAVAIL.
        let k = st.mcs.iter().position(|m| m.group == group).ok_or(Errno(libc::EADDRNOTAVAIL))?;
        let mc = st.mcs.remove(k);
        let p = first(&st)?;
        drop(st);
        let qp = id_mut(id)?.qp as *mut ffi::ibv_qp;
        if mc.attached && !qp.is_null() {
            let gid = ffi::ibv_gid { raw: softrdma_device::proto::gid_of(group) };
            // SAFETY: libibverbs on the ID's QP.
            unsafe { (api().detach_mcast)(qp, &gid, 0) };
        }
        cm_call(&p.dev, &Request::CmLeave { id: p.id, group }, &[])?;
        Ok(0)
    })
}
