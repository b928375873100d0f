//! Protection domains, memory regions, memory windows, address handles and XRC domains.

use std::ffi::{c_int, c_void};
use std::fs::File;
use std::mem::ManuallyDrop;
use std::net::IpAddr;
use std::os::fd::FromRawFd;

use softrdma_device::verbs::{Access, MemoryWindow, ProtectionDomain, RawMr, SendOp, SendWr, XrcDomain};

use crate::context::{ctx_of, Ctx};
use crate::ffi;
use crate::{errno_call, into_c, nonnull, ptr_call, Errno, EINVAL};

/// A protection domain.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) pd: ffi::ibv_pd,
    pub(crate) inner: Option<ProtectionDomain>,
}

pub(crate) fn pd_of<'a>(p: *mut ffi::ibv_pd) -> Result<&'a mut Pd, Errno> {
    // SAFETY: every ibv_pd this library hands out is the first field of a Pd.
    let pd = unsafe { (p as *mut Pd).as_mut() }.ok_or(EINVAL)?;
    if pd.inner.is_none() {
        return Err(EINVAL);
    }
    Ok(pd)
}

impl Pd {
    pub(crate) fn inner(&self) -> &ProtectionDomain {
        self.inner.as_ref().expect("checked by pd_of")
    }
}

/// Destroys the softrdma object behind a C object: on success the C object is freed; on an
/// error (EBUSY...) it stays as it was.
///
/// # Safety
/// `obj` is NULL or a pointer `into_c` returned for a `C` that no one else uses during the call;
/// once this returns Ok it is freed and must not be used again.
pub(crate) unsafe fn destroy_obj<C, T>(
    obj: *mut C,
    slot: impl FnOnce(&mut C) -> &mut Option<T>,
    destroy: impl FnOnce(T) -> Result<(), (T, softrdma_device::verbs::Error)>,
) -> Result<(), Errno> {
    // SAFETY: per the contract, `obj` is NULL or a live, unaliased `C`.
    let c = unsafe { obj.as_mut() }.ok_or(EINVAL)?;
    let s = slot(c);
    let inner = s.take().ok_or(EINVAL)?;
    match destroy(inner) {
        Ok(()) => {
            // SAFETY: `obj` came from into_c (a Box) and `c`, the last use of it, is done.
            drop(unsafe { Box::from_raw(obj) });
            Ok(())
        }
        Err((inner, e)) => {
            *s = Some(inner);
            Err(e.into())
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ffi::ibv_context) -> *mut ffi::ibv_pd {
    ptr_call(|| {
        let ctx = ctx_of(context)?;
        let inner = ctx.dev.alloc_pd()?;
        let pd = ffi::ibv_pd { context, handle: 0 };
        Ok(into_c(Pd { pd, inner: Some(inner) }) as *mut ffi::ibv_pd)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ffi::ibv_pd) -> c_int {
    // SAFETY: ibv_dealloc_pd(3): `pd` is NULL or a Pd this library made (its C structure is the
    // first field), destroyed once and not used after success.
    errno_call(|| unsafe { destroy_obj(pd as *mut Pd, |p| &mut p.inner, |i| i.destroy()) })
}

/// A memory region of the program's memory.
#[repr(C)]
pub(crate) struct Mr {
    pub(crate) mr: ffi::ibv_mr,
    pub(crate) inner: Option<RawMr>,
    /// The access flags it was registered with (ibv_rereg_mr keeps them unless told otherwise).
    pub(crate) access: c_int,
}

/// The access flags a region may have: the IBTA ones; IBV_ACCESS_OPTIONAL_RANGE bits are hints
/// a device may ignore (rdma-core masks them when unsupported); on-demand paging is not modelled.
fn mr_access(access: c_int) -> Result<Access, Errno> {
    let a = access as u32;
    if a & ffi::IBV_ACCESS_ON_DEMAND != 0 {
        return Err(Errno(libc::EOPNOTSUPP));
    }
    let known = ffi::IBV_ACCESS_LOCAL_WRITE
        | ffi::IBV_ACCESS_REMOTE_WRITE
        | ffi::IBV_ACCESS_REMOTE_READ
        | ffi::IBV_ACCESS_REMOTE_ATOMIC
        | ffi::IBV_ACCESS_MW_BIND
        | ffi::IBV_ACCESS_ZERO_BASED
        | ffi::IBV_ACCESS_HUGETLB
        | ffi::IB_UVERBS_ACCESS_OPTIONAL_RANGE;
    if a & !known != 0 {
        return Err(EINVAL);
    }
    // IBTA 10.6.3.1 (and the kernel's ib_check_mr_access): remote write or atomic access needs
    // local write.
    if a & (ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_ATOMIC) != 0 && a & ffi::IBV_ACCESS_LOCAL_WRITE == 0 {
        return Err(EINVAL);
    }
    Ok(Access(a & 0x3f))
}

/// Registers `[addr, addr+len)` in `pd`.
///
/// # Safety
/// ibv_reg_mr(3)'s contract: the range stays allocated until the region is deregistered (the
/// device reads and writes it in this process's memory meanwhile).
unsafe fn reg(pd: *mut ffi::ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_int) -> Result<*mut Mr, Errno> {
    let p = pd_of(pd)?;
    let acc = mr_access(access)?;
    if iova != addr as u64 {
        // The device's regions are addressed by virtual address; an IOVA other than the
        // address is not modelled.
        return Err(Errno(libc::EOPNOTSUPP));
    }
    if addr.is_null() && len > 0 {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: this function's contract is reg_mr_raw's: the range outlives the registration.
    let raw = unsafe { p.inner().reg_mr_raw(addr as u64, len as u64, acc) }?;
    let k = raw.keys();
    let mr = ffi::ibv_mr { context: p.pd.context, pd, addr, length: len, handle: 0, lkey: k.lkey, rkey: k.rkey };
    Ok(into_c(Mr { mr, inner: Some(raw), access }))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: ibv_reg_mr(3): the program keeps `addr`..`addr+len` allocated until ibv_dereg_mr.
    ptr_call(|| Ok(unsafe { reg(pd, addr, len, addr as u64, access) }? as *mut ffi::ibv_mr))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ffi::ibv_mr {
    // SAFETY: as for ibv_reg_mr, the program keeps the range allocated until ibv_dereg_mr.
    ptr_call(|| Ok(unsafe { reg(pd, addr, len, iova, access) }? as *mut ffi::ibv_mr))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ffi::ibv_mr {
    // SAFETY: as for ibv_reg_mr, the program keeps the range allocated until ibv_dereg_mr.
    ptr_call(|| Ok(unsafe { reg(pd, addr, len, iova, access as c_int) }? as *mut ffi::ibv_mr))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ffi::ibv_pd,
    _offset: u64,
    _len: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ffi::ibv_mr {
    ptr_call(|| Err(Errno(libc::EOPNOTSUPP)))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ffi::ibv_mr) -> c_int {
    // SAFETY: ibv_dereg_mr(3): `mr` is NULL or a Mr this library made (its C structure is the
    // first field), destroyed once and not used after success.
    errno_call(|| unsafe { destroy_obj(mr as *mut Mr, |m| &mut m.inner, |i| i.destroy()) })
}

/// `ibv_rereg_mr`: a new translation, PD or access for the region, in place: its keys stay (as
/// on rxe and hardware), so a peer holding the R_Key keeps using it. Returns 0 or an
/// `ibv_rereg_mr_err_code` with errno set.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ffi::ibv_mr,
    flags: c_int,
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    let r = crate::guarded(|| {
        // SAFETY: ibv_rereg_mr(3): `mr` is NULL or a region from ibv_reg_mr (an Mr, its
        // ibv_mr first), not deregistered, and not used by another thread during the call.
        let m = unsafe { (mr as *mut Mr).as_mut() }.ok_or(EINVAL)?;
        let f = flags as u32;
        if f == 0 || f & !ffi::IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
            return Err(EINVAL);
        }
        let new_pd = if f & ffi::IBV_REREG_MR_CHANGE_PD != 0 { Some(pd_of(pd)?) } else { None };
        let range = if f & ffi::IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            if addr.is_null() || len == 0 {
                return Err(EINVAL);
            }
            Some((addr as u64, len as u64))
        } else {
            None
        };
        let acc = if f & ffi::IBV_REREG_MR_CHANGE_ACCESS != 0 { Some(mr_access(access)?) } else { None };
        let inner = m.inner.as_mut().ok_or(EINVAL)?;
        // SAFETY: with IBV_REREG_MR_CHANGE_TRANSLATION the program keeps the new range
        // allocated until the region is deregistered, as for ibv_reg_mr.
        unsafe { inner.rereg(new_pd.as_ref().map(|p| p.inner()), range, acc) }?;
        if let Some((a, l)) = range {
            m.mr.addr = a as *mut c_void;
            m.mr.length = l as usize;
        }
        if new_pd.is_some() {
            m.mr.pd = pd;
        }
        if acc.is_some() {
            m.access = access;
        }
        Ok(())
    });
    match r {
        Ok(()) => 0,
        Err(Errno(e)) => {
            crate::set_errno(e);
            ffi::IBV_REREG_MR_ERR_INPUT
        }
    }
}

/// A memory window.
#[repr(C)]
pub(crate) struct Mw {
    pub(crate) mw: ffi::ibv_mw,
    pub(crate) inner: Option<MemoryWindow>,
}

ffi_callback! {
    #[on_panic = crate::callback::null_eio()]
    fn alloc_mw(pd: *mut ffi::ibv_pd, ty: ffi::ibv_mw_type) -> *mut ffi::ibv_mw {
        ptr_call(|| {
            let p = pd_of(pd)?;
            let t = match ty {
                ffi::IBV_MW_TYPE_1 => 1,
                ffi::IBV_MW_TYPE_2 => 2,
                _ => return Err(EINVAL),
            };
            let inner = p.inner().alloc_mw(t)?;
            let mw = ffi::ibv_mw { context: p.pd.context, pd, rkey: inner.rkey(), handle: 0, type_: ty };
            Ok(into_c(Mw { mw, inner: Some(inner) }) as *mut ffi::ibv_mw)
        })
    }
}

ffi_callback! {
    #[on_panic = crate::callback::eio()]
    fn dealloc_mw(mw: *mut ffi::ibv_mw) -> c_int {
        // SAFETY: ibv_dealloc_mw(3): `mw` is NULL or a Mw this library made (its C structure is the
        // first field), destroyed once and not used after success.
        errno_call(|| unsafe { destroy_obj(mw as *mut Mw, |m| &mut m.inner, |i| i.destroy()) })
    }
}

/// The bind operation of a `ibv_mw_bind_info` for window `mw` (its next R_Key).
///
/// # Safety
/// `mw` is NULL or a window this library made, and `info.mr` NULL or one of its regions, neither
/// destroyed.
pub(crate) unsafe fn bind_op(mw: *mut ffi::ibv_mw, rkey: u32, info: &ffi::ibv_mw_bind_info) -> Result<SendOp, Errno> {
    // SAFETY: per the contract, both are NULL or live objects of this library.
    let (mw, mr) = unsafe { (mw.as_ref().ok_or(EINVAL)?, info.mr.as_ref()) };
    let access = Access(info.mw_access_flags & 0x3f);
    Ok(SendOp::BindMw {
        mw_rkey: mw.rkey,
        new_rkey: rkey,
        mr_lkey: mr.map(|m| m.lkey).unwrap_or(0),
        addr: info.addr,
        length: info.length,
        access,
    })
}

ffi_callback! {
    /// `ibv_bind_mw` (type 1): a bind work request on the QP; the window's R_Key becomes the next
    /// one.
    #[on_panic = crate::callback::eio()]
    fn bind_mw(qp: *mut ffi::ibv_qp, mw: *mut ffi::ibv_mw, bind: *mut ffi::ibv_mw_bind) -> c_int {
        errno_call(|| {
            let b = nonnull(bind)?;
            let w = nonnull(mw)?;
            let new_rkey = MemoryWindow::inc_rkey(w.rkey);
            // SAFETY: ibv_bind_mw(3): `mw` is a live window (non-NULL, checked) and
            // `bind_info.mr` NULL or a live region of the program.
            let op = unsafe { bind_op(mw, new_rkey, &b.bind_info) }?;
            let mut wr = SendWr::new(b.wr_id, op, Vec::new());
            wr.signaled = b.send_flags & ffi::IBV_SEND_SIGNALED != 0;
            wr.fence = b.send_flags & ffi::IBV_SEND_FENCE != 0;
            crate::qp::post_one(qp, wr)?;
            w.rkey = new_rkey;
            Ok(())
        })
    }
}

pub(crate) fn fill_ops(v: &mut ffi::verbs_context) {
    v.context.ops.alloc_mw = Some(alloc_mw);
    v.context.ops.dealloc_mw = Some(dealloc_mw);
    v.context.ops.bind_mw = Some(bind_mw);
    v.open_xrcd = Some(open_xrcd);
    v.close_xrcd = Some(close_xrcd);
}

/// An address handle: where UD datagrams go.
#[repr(C)]
pub(crate) struct Ah {
    pub(crate) ah: ffi::ibv_ah,
    pub(crate) dest: IpAddr,
}

/// The IP address of a RoCEv2 GID (IPv4-mapped GIDs are IPv4 addresses).
pub(crate) fn gid_ip(raw: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The destination of an address vector. RoCE needs the GRH (the GID is the IP address): the
/// kernel refuses an AV without it (EINVAL), and so do we.
pub(crate) fn av_dest(a: &ffi::ibv_ah_attr) -> Result<IpAddr, Errno> {
    if a.is_global == 0 || a.port_num > 1 {
        return Err(EINVAL);
    }
    // SAFETY: the GID is 16 plain bytes in either view of the union.
    Ok(gid_ip(unsafe { a.grh.dgid.raw }))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ffi::ibv_pd, attr: *mut ffi::ibv_ah_attr) -> *mut ffi::ibv_ah {
    ptr_call(|| {
        let p = pd_of(pd)?;
        let dest = av_dest(nonnull(attr)?)?;
        Ok(into_c(Ah { ah: ffi::ibv_ah { context: p.pd.context, pd, handle: 0 }, dest }) as *mut ffi::ibv_ah)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ffi::ibv_ah) -> c_int {
    errno_call(|| {
        if ah.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: ibv_destroy_ah(3): `ah` (non-NULL) came from ibv_create_ah, an Ah that into_c
        // boxed, and is destroyed once.
        drop(unsafe { Box::from_raw(ah as *mut Ah) });
        Ok(())
    })
}

/// The sender of a UD receive, from the 40-byte GRH slot at the start of its buffer: for RoCEv2
/// over IPv4 the slot holds the IPv4 header in bytes 20-39 (source address at 32), otherwise a
/// GRH whose SGID is at bytes 8-23.
fn grh_source(grh: &[u8; 40]) -> ([u8; 16], u8, u32, u8) {
    if grh[20] >> 4 == 4 {
        let v4 = std::net::Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        (v4.to_ipv6_mapped().octets(), grh[28], 0, grh[21])
    } else {
        let mut g = [0u8; 16];
        g.copy_from_slice(&grh[8..24]);
        let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        (g, grh[7], vtf & 0xfffff, ((vtf >> 20) & 0xff) as u8)
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ffi::ibv_context,
    port: u8,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    attr: *mut ffi::ibv_ah_attr,
) -> c_int {
    crate::minus1_call(|| {
        ctx_of(context)?;
        let wc = nonnull(wc)?;
        let out = nonnull(attr)?;
        if wc.wc_flags & ffi::IBV_WC_GRH == 0 || grh.is_null() {
            // RoCE addresses need the GRH.
            return Err(EINVAL);
        }
        // SAFETY: ibv_init_ah_from_wc(3): with IBV_WC_GRH set, `grh` (non-NULL, checked) points
        // to the 40-byte GRH the receive buffer starts with.
        let bytes = unsafe { &*(grh as *const [u8; 40]) };
        let (sgid, hop, flow, tclass) = grh_source(bytes);
        *out = ffi::ibv_ah_attr::default();
        out.is_global = 1;
        out.port_num = port;
        out.grh.dgid.raw = sgid;
        out.grh.flow_label = flow;
        out.grh.hop_limit = hop.max(1);
        out.grh.traffic_class = tclass;
        out.grh.sgid_index = 0;
        out.dlid = wc.slid;
        out.sl = wc.sl;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ffi::ibv_pd,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    port: u8,
) -> *mut ffi::ibv_ah {
    ptr_call(|| {
        let p = pd_of(pd)?;
        let mut attr = ffi::ibv_ah_attr::default();
        // SAFETY: `wc` and `grh` are the program's, as ibv_create_ah_from_wc(3) requires them
        // (a completion and its GRH); `attr` is a local.
        if unsafe { ibv_init_ah_from_wc(p.pd.context, port, wc, grh, &mut attr) } != 0 {
            return Err(Errno(crate::last_errno()));
        }
        // SAFETY: `pd` was accepted by pd_of and `attr` is a local.
        let ah = unsafe { ibv_create_ah(pd, &mut attr) };
        if ah.is_null() {
            return Err(Errno(crate::last_errno()));
        }
        Ok(ah)
    })
}

/// An XRC domain.
#[repr(C)]
pub(crate) struct Xrcd {
    pub(crate) xrcd: ffi::ibv_xrcd,
    pub(crate) inner: Option<XrcDomain>,
}

pub(crate) fn xrcd_of<'a>(p: *mut ffi::ibv_xrcd) -> Result<&'a Xrcd, Errno> {
    // SAFETY: every ibv_xrcd this library hands out is the first field of an Xrcd.
    let x = unsafe { (p as *mut Xrcd).as_ref() }.ok_or(EINVAL)?;
    x.inner.as_ref().ok_or(EINVAL)?;
    Ok(x)
}

ffi_callback! {
    /// `ibv_open_xrcd`: the domain of the file `fd` names (shared with every process that opens the
    /// same file) or, with fd -1, a private one. The device keeps its own reference to the file.
    #[on_panic = crate::callback::null_eio()]
    fn open_xrcd(
        context: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_xrcd_init_attr,
    ) -> *mut ffi::ibv_xrcd {
        ptr_call(|| {
            let ctx: &Ctx = ctx_of(context)?;
            let a = nonnull(attr)?;
            let need = ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS;
            if a.comp_mask & need != need || a.comp_mask & !(ffi::IBV_XRCD_INIT_ATTR_RESERVED - 1) != 0 {
                return Err(EINVAL);
            }
            // SAFETY: ibv_open_xrcd(3): `fd` is -1 or the program's open descriptor, which
            // open_domain only borrows for the call.
            let inner = unsafe { open_domain(ctx, a.fd, a.oflags) }?;
            Ok(into_c(Xrcd { xrcd: ffi::ibv_xrcd { context }, inner: Some(inner) }) as *mut ffi::ibv_xrcd)
        })
    }
}

/// The device's XRC domain for `ibv_open_xrcd` / OFED's `ibv_open_xrc_domain`: the one of the
/// file `fd` names, or a private one for fd -1 (which needs O_CREAT: the kernel's EAGAIN when
/// there is nothing to open, ib_uverbs_open_xrcd).
///
/// # Safety
/// `fd` is -1 or a descriptor that stays open for the call; it is borrowed, never closed.
pub(crate) unsafe fn open_domain(ctx: &Ctx, fd: c_int, oflags: c_int) -> Result<XrcDomain, Errno> {
    let create = oflags & libc::O_CREAT != 0;
    let exclusive = oflags & libc::O_EXCL != 0;
    if fd == -1 {
        if !create {
            return Err(Errno(libc::EAGAIN));
        }
        return Ok(ctx.dev.open_xrcd(None, create, exclusive)?);
    }
    if fd < 0 {
        return Err(Errno(libc::EBADF));
    }
    // Borrowed: the program keeps its descriptor.
    // SAFETY: per the contract `fd` is open for the call, and ManuallyDrop keeps the File from
    // closing it.
    let f = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    Ok(ctx.dev.open_xrcd(Some(&f), create, exclusive)?)
}

ffi_callback! {
    #[on_panic = crate::callback::eio()]
    fn close_xrcd(xrcd: *mut ffi::ibv_xrcd) -> c_int {
        // SAFETY: ibv_close_xrcd(3): `xrcd` is NULL or a Xrcd this library made (its C structure
        // is the first field), destroyed once and not used after success.
        errno_call(|| unsafe { destroy_obj(xrcd as *mut Xrcd, |x| &mut x.inner, |i| i.destroy()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_map_to_addresses() {
        let v4: std::net::Ipv4Addr = "10.1.2.3".parse().unwrap();
        assert_eq!(gid_ip(v4.to_ipv6_mapped().octets()), IpAddr::V4(v4));
        let v6: std::net::Ipv6Addr = "fe80::1".parse().unwrap();
        assert_eq!(gid_ip(v6.octets()), IpAddr::V6(v6));
    }

    #[test]
    fn the_grh_slot_gives_the_sender() {
        // RoCEv2 over IPv4: the IPv4 header sits in bytes 20-39, source address at 32.
        let mut slot = [0u8; 40];
        slot[20] = 0x45;
        slot[21] = 0x08; // TOS
        slot[28] = 63; // TTL
        slot[32..36].copy_from_slice(&[192, 168, 7, 9]);
        let (gid, hop, _, tclass) = grh_source(&slot);
        assert_eq!(gid_ip(gid), IpAddr::V4("192.168.7.9".parse().unwrap()));
        assert_eq!((hop, tclass), (63, 0x08));
        // A GRH (IPv6 / RoCEv1): the SGID at bytes 8-23.
        let mut grh = [0u8; 40];
        grh[0] = 0x60;
        grh[7] = 5;
        let src: std::net::Ipv6Addr = "2001:db8::7".parse().unwrap();
        grh[8..24].copy_from_slice(&src.octets());
        let (gid, hop, _, _) = grh_source(&grh);
        assert_eq!((gid_ip(gid), hop), (IpAddr::V6(src), 5));
    }

    #[test]
    fn mr_access_follows_the_kernel_rules() {
        let lw = ffi::IBV_ACCESS_LOCAL_WRITE as c_int;
        let rw = ffi::IBV_ACCESS_REMOTE_WRITE as c_int;
        let ra = ffi::IBV_ACCESS_REMOTE_ATOMIC as c_int;
        assert!(mr_access(lw | rw).is_ok());
        // Remote write or atomic without local write: EINVAL.
        assert_eq!(mr_access(rw).err().map(|e| e.0), Some(libc::EINVAL));
        assert_eq!(mr_access(ra).err().map(|e| e.0), Some(libc::EINVAL));
        // On-demand paging is not modelled; an unknown bit is invalid; relaxed ordering is a hint.
        assert_eq!(mr_access(ffi::IBV_ACCESS_ON_DEMAND as c_int).err().map(|e| e.0), Some(libc::EOPNOTSUPP));
        assert_eq!(mr_access(1 << 30).err().map(|e| e.0), Some(libc::EINVAL));
        let relaxed = ffi::IBV_ACCESS_RELAXED_ORDERING as c_int;
        assert_eq!(mr_access(lw | relaxed).unwrap(), Access::LOCAL_WRITE);
    }
}
