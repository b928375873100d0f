//! Contexts: `ibv_open_device` gives a `verbs_context` (the extended context rdma-core's inline
//! functions reach through `abi_compat` and `sz`) whose `ibv_context` is what the program holds;
//! device, port and GID queries; async events.

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use softrdma_device::proto::{ClientEvent, DeviceInfo};
use softrdma_device::verbs::Context;
use softrdma_engine::device::AsyncEvent;

use crate::device::{dev_of, guid_be};
use crate::ffi;
use crate::{errno_call, minus1_call, nonnull, ptr_call, Errno, EINVAL};

/// An open device: the extended context C sees, and the softrdma context behind it.
#[repr(C)]
pub(crate) struct Ctx {
    /// Must be first: `verbs_context` ends with the `ibv_context` the program holds.
    pub(crate) vctx: ffi::verbs_context,
    pub(crate) dev: Context,
    pub(crate) info: DeviceInfo,
    /// This context's objects by number, for events that name them: QPs (by QPN; XRC target QP
    /// handles by handle), CQs, SRQs. Values are the C object's address.
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    pub(crate) tgt_handles: Mutex<HashMap<u32, usize>>,
    /// OFED XRC receive QP registrations (`ibv_create/reg_xrc_rcv_qp`): handle -> QPN. Their
    /// events carry IBV_XRC_QP_EVENT_FLAG and the QP number, as OFED delivered them.
    pub(crate) xrc_rcv: Mutex<HashMap<u32, u32>>,
    pub(crate) cqs: Mutex<HashMap<u32, usize>>,
    pub(crate) srqs: Mutex<HashMap<u32, usize>>,
    /// IBV_EVENT_DEVICE_FATAL was reported.
    fatal_reported: AtomicBool,
}

// SAFETY: the C structure's pointers are the program's; the maps are locked.
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shim's context behind an `ibv_context` pointer (container of).
pub(crate) fn ctx_of<'a>(c: *mut ffi::ibv_context) -> Result<&'a Ctx, Errno> {
    if c.is_null() {
        return Err(EINVAL);
    }
    let off = std::mem::offset_of!(ffi::verbs_context, context);
    // SAFETY: every ibv_context this library hands out is the `context` field of a `Ctx`'s
    // verbs_context, which is the first field of the (repr(C)) Ctx.
    Ok(unsafe { &*((c as *mut u8).sub(off) as *const Ctx) })
}

impl Ctx {
    pub(crate) fn c(&self) -> *mut ffi::ibv_context {
        &self.vctx.context as *const ffi::ibv_context as *mut ffi::ibv_context
    }
}

/// Whether an fd was made non-blocking by the program (then event calls do not wait).
pub(crate) fn nonblocking(fd: c_int) -> bool {
    // SAFETY: fcntl F_GETFL on any fd number is harmless.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

thread_local! {
    /// Set while librdmacm opens its devices' contexts with `SOFTRDMA_CM_DATAPATH=device`: those
    /// stay on the device path.
    pub(crate) static DEVICE_PATH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The data path (`SOFTRDMA_DATAPATH`): `provider` (the default) runs the engine for this
/// process's own QPs in this process, on a socket of the daemon's steered port
/// ([`Context::provider`]); `device` has the daemon run them. A daemon that cannot steer its port
/// leaves a provider on the device path (with a warning when provider was asked for by name).
///
/// Contexts librdmacm opens follow the same choice unless `SOFTRDMA_CM_DATAPATH=device`
/// ([`DEVICE_PATH`]).
fn open_context(name: &str) -> softrdma_device::verbs::Result<Context> {
    let path = std::env::var("SOFTRDMA_DATAPATH");
    let provider = match path.as_deref() {
        Ok("device") => false,
        Ok("provider") | Ok("") | Err(_) => true,
        Ok(other) => {
            eprintln!("softrdma: SOFTRDMA_DATAPATH={other:?} is neither provider nor device; using provider");
            true
        }
    };
    if provider && !DEVICE_PATH.get() {
        match Context::provider(name) {
            Ok(c) => return Ok(c),
            // Said only when asked for: by default a device that cannot steer its port (the
            // kernel refused the group or its program) quietly runs the QPs itself.
            Err(e) if path.is_ok_and(|p| p == "provider") => {
                eprintln!("softrdma: {name}: no provider data path ({e}); the device runs this process's QPs")
            }
            Err(_) => {}
        }
    }
    Context::open(name)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ffi::ibv_device) -> *mut ffi::ibv_context {
    ptr_call(|| {
        let d = dev_of(device)?;
        let dev = open_context(&d.name).map_err(|e| {
            eprintln!("softrdma: cannot open {}: {e}", d.name);
            Errno(libc::ENODEV)
        })?;
        let mut vctx = ffi::verbs_context { sz: std::mem::size_of::<ffi::verbs_context>(), ..Default::default() };
        crate::cq::fill_ops(&mut vctx);
        crate::qp::fill_ops(&mut vctx);
        crate::mem::fill_ops(&mut vctx);
        fill_ops(&mut vctx);
        let c = &mut vctx.context;
        c.device = device;
        // A real descriptor, as the uverbs file is (programs dup or poll it); it carries no
        // commands here (the device connection does), so it is /dev/null, closed with the context.
        // SAFETY: a NUL-terminated literal path; open(2) only reads it.
        c.cmd_fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        c.async_fd = dev.event_fd().as_raw_fd();
        crate::cq::clear_nonblock(c.async_fd);
        c.num_comp_vectors = 1;
        c.abi_compat = usize::MAX as *mut libc::c_void; // __VERBS_ABI_IS_EXTENDED
        c.ops._compat_query_device = Some(ibv_query_device);
        c.ops._compat_query_port = Some(ibv_query_port);
        let ctx = Box::new(Ctx {
            vctx,
            info: d.info.clone(),
            dev,
            qps: Default::default(),
            tgt_handles: Default::default(),
            xrc_rcv: Default::default(),
            cqs: Default::default(),
            srqs: Default::default(),
            fatal_reported: AtomicBool::new(false),
        });
        Ok(Box::leak(ctx).c())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ffi::ibv_context) -> c_int {
    errno_call(|| {
        let ctx = ctx_of(context)? as *const Ctx as *mut Ctx;
        // SAFETY: ctx_of accepted `context` as a Ctx that ibv_open_device leaked from a Box; per
        // ibv_close_device(3) the program closes it once, after destroying what it made in it.
        let cmd_fd = unsafe { (*ctx).vctx.context.cmd_fd };
        if cmd_fd >= 0 {
            // SAFETY: cmd_fd is the /dev/null descriptor ibv_open_device opened for this context
            // alone; it is closed only here.
            unsafe { libc::close(cmd_fd) };
        }
        // The connection closes with it; the device destroys what the program left, as uverbs
        // does when a context's file is closed.
        // SAFETY: as above, `ctx` came from Box::leak and is released once, here.
        drop(unsafe { Box::from_raw(ctx) });
        Ok(())
    })
}

/// The device attributes (rxe's, from the device's limits).
pub(crate) fn device_attr(info: &DeviceInfo) -> ffi::ibv_device_attr {
    let l = info.limits;
    let mut a = ffi::ibv_device_attr::default();
    let fw = env!("CARGO_PKG_VERSION");
    for (d, b) in a.fw_ver.iter_mut().zip(fw.bytes()) {
        *d = b as libc::c_char;
    }
    a.node_guid = guid_be(info);
    a.sys_image_guid = guid_be(info);
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = info.vendor_id;
    a.vendor_part_id = 0;
    a.hw_ver = 0;
    a.max_qp = l.max_qp as c_int;
    a.max_qp_wr = l.max_qp_wr as c_int;
    a.device_cap_flags = ffi::IBV_DEVICE_BAD_PKEY_CNTR
        | ffi::IBV_DEVICE_BAD_QKEY_CNTR
        | ffi::IBV_DEVICE_AUTO_PATH_MIG
        | ffi::IBV_DEVICE_CHANGE_PHY_PORT
        | ffi::IBV_DEVICE_UD_AV_PORT_ENFORCE
        | ffi::IBV_DEVICE_PORT_ACTIVE_EVENT
        | ffi::IBV_DEVICE_SYS_IMAGE_GUID
        | ffi::IBV_DEVICE_RC_RNR_NAK_GEN
        | ffi::IBV_DEVICE_SRQ_RESIZE
        | ffi::IBV_DEVICE_MEM_WINDOW
        | ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B
        | ffi::IBV_DEVICE_MEM_MGT_EXTENSIONS
        | ffi::IBV_DEVICE_XRC;
    a.max_sge = l.max_sge as c_int;
    a.max_sge_rd = l.max_sge as c_int;
    a.max_cq = 1 << 14;
    a.max_cqe = l.max_cqe as c_int;
    a.max_mr = 1 << 18;
    a.max_pd = 1 << 15;
    a.max_qp_rd_atom = c_int::from(l.max_qp_rd_atom);
    a.max_res_rd_atom = c_int::from(l.max_qp_rd_atom) * 1024;
    a.max_qp_init_rd_atom = c_int::from(l.max_qp_init_rd_atom);
    a.atomic_cap = ffi::IBV_ATOMIC_HCA;
    a.max_mw = 1 << 16;
    a.max_mcast_grp = softrdma_device::mcast::MAX_GROUPS as c_int;
    a.max_mcast_qp_attach = 56;
    a.max_total_mcast_qp_attach = 0x70000;
    a.max_ah = 1 << 15;
    a.max_srq = 1 << 11;
    a.max_srq_wr = l.max_qp_wr as c_int;
    a.max_srq_sge = l.max_sge as c_int;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    a
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut ffi::ibv_context, attr: *mut ffi::ibv_device_attr) -> c_int {
    errno_call(|| {
        let ctx = ctx_of(context)?;
        *nonnull(attr)? = device_attr(&ctx.info);
        Ok(())
    })
}

ffi_callback! {
    /// `ibv_query_device_ex`: the caller's structure may be older (smaller) than ours; fill what it
    /// has (the `attr_size` contract).
    #[on_panic = crate::callback::eio()]
    fn query_device_ex(
        context: *mut ffi::ibv_context,
        input: *const ffi::ibv_query_device_ex_input,
        attr: *mut ffi::ibv_device_attr_ex,
        attr_size: usize,
    ) -> c_int {
        errno_call(|| {
            let ctx = ctx_of(context)?;
            // SAFETY: ibv_query_device_ex(3): `input` is NULL or a readable
            // ibv_query_device_ex_input.
            if let Some(i) = unsafe { input.as_ref() } {
                if i.comp_mask != 0 {
                    return Err(EINVAL);
                }
            }
            if attr.is_null() || attr_size < std::mem::size_of::<ffi::ibv_device_attr>() {
                return Err(EINVAL);
            }
            let mut ex = ffi::ibv_device_attr_ex { orig_attr: device_attr(&ctx.info), ..Default::default() };
            ex.phys_port_cnt_ex = 1;
            ex.device_cap_flags_ex = u64::from(ex.orig_attr.device_cap_flags);
            let n = attr_size.min(std::mem::size_of::<ffi::ibv_device_attr_ex>());
            // SAFETY: `attr` is non-NULL (checked) and, by the attr_size contract, has attr_size
            // writable bytes; n <= attr_size and `ex` is a local, so the copy stays inside both.
            unsafe {
                std::ptr::write_bytes(attr as *mut u8, 0, attr_size);
                std::ptr::copy_nonoverlapping(&ex as *const _ as *const u8, attr as *mut u8, n);
            }
            Ok(())
        })
    }
}

/// The port (there is one: port 1). Link layer Ethernet, state ACTIVE, RoCEv2 GID at index 0.
pub(crate) fn port_attr(info: &DeviceInfo) -> ffi::ibv_port_attr {
    ffi::ibv_port_attr {
        state: ffi::IBV_PORT_ACTIVE,
        max_mtu: ffi::IBV_MTU_4096,
        active_mtu: info.active_mtu as u32,
        gid_tbl_len: GID_TABLE_LEN as c_int,
        port_cap_flags: ffi::IBV_PORT_CM_SUP | ffi::IBV_PORT_REINIT_SUP | ffi::IBV_PORT_VENDOR_CLASS_SUP,
        max_msg_sz: info.limits.max_msg_size,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,  // 1X
        active_speed: 32, // 25 Gb/s (EDR) per lane, what rxe reports on a fast link
        phys_state: 5,    // LinkUp
        link_layer: ffi::IBV_LINK_LAYER_ETHERNET as u8,
        flags: 0,
        port_cap_flags2: 0,
    }
}

ffi_callback! {
    /// `ibv_query_port` of programs built against current headers (the `port_attr_len` contract).
    #[on_panic = crate::callback::eio()]
    fn query_port_ex(
        context: *mut ffi::ibv_context,
        port: u8,
        attr: *mut ffi::ibv_port_attr,
        len: usize,
    ) -> c_int {
        errno_call(|| {
            let ctx = ctx_of(context)?;
            if port != 1 || attr.is_null() {
                return Err(EINVAL);
            }
            // The port_attr_len contract: fill what the caller's structure has, never more.
            let a = port_attr(&ctx.info);
            let n = len.min(std::mem::size_of::<ffi::ibv_port_attr>());
            // SAFETY: `attr` is non-NULL (checked) with `len` writable bytes (the port_attr_len
            // contract); n <= len and `a` is a local.
            unsafe {
                std::ptr::write_bytes(attr as *mut u8, 0, len);
                std::ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n);
            }
            Ok(())
        })
    }
}

/// The context's own ops (the queries with a size contract).
pub(crate) fn fill_ops(v: &mut ffi::verbs_context) {
    v.query_port = Some(query_port_ex);
    v.query_device_ex = Some(query_device_ex);
}

/// The exported `ibv_query_port` (programs built against old headers, and the fallback of the
/// inline one): the structure of the oldest ABI.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ffi::ibv_context,
    port: u8,
    attr: *mut ffi::_compat_ibv_port_attr,
) -> c_int {
    // rdma-core keeps that structure private (the header only declares it): it is ibv_port_attr
    // without port_cap_flags2 and what follows, 48 bytes.
    const COMPAT_PORT_ATTR_LEN: usize = std::mem::offset_of!(ffi::ibv_port_attr, port_cap_flags2);
    // SAFETY: the caller's `attr` is NULL or a writable _compat_ibv_port_attr, which is exactly
    // COMPAT_PORT_ATTR_LEN bytes; `context` is passed on as received.
    unsafe { query_port_ex(context, port, attr as *mut ffi::ibv_port_attr, COMPAT_PORT_ATTR_LEN) }
}

/// The port's GID table: index 0 is the device's address (its RoCEv2 GID); the other entries
/// are empty, as a port's unused entries are (all-zero through ibv_query_gid, ENODATA through
/// ibv_query_gid_ex); beyond the table is EINVAL.
const GID_TABLE_LEN: u32 = 16;

/// The GID at `index`: Some for index 0, None for an empty entry; EINVAL outside the table.
fn gid_at(ctx: &Ctx, port: u32, index: u32) -> Result<Option<[u8; 16]>, Errno> {
    if port != 1 || index >= GID_TABLE_LEN {
        return Err(EINVAL);
    }
    Ok((index == 0).then_some(ctx.info.gid))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ffi::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ffi::ibv_gid,
) -> c_int {
    minus1_call(|| {
        let ctx = ctx_of(context)?;
        if index < 0 {
            return Err(EINVAL);
        }
        nonnull(gid)?.raw = gid_at(ctx, u32::from(port), index as u32)?.unwrap_or([0; 16]);
        Ok(0)
    })
}

/// The interface index of the device's address (0 when no interface holds it), by the rule of
/// `softrdma_transport::interface_of`.
fn ifindex_of(addr: std::net::IpAddr) -> u32 {
    let Some(name) = softrdma_transport::interface_of(addr).and_then(|n| std::ffi::CString::new(n).ok()) else {
        return 0;
    };
    // SAFETY: `name` is a NUL-terminated string that lives across the call, and if_nametoindex(3)
    // only reads it.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

fn gid_entry(ctx: &Ctx) -> ffi::ibv_gid_entry {
    ffi::ibv_gid_entry {
        gid: ffi::ibv_gid { raw: ctx.info.gid },
        gid_index: 0,
        port_num: 1,
        gid_type: ffi::IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ifindex_of(ctx.info.addr),
    }
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ffi::ibv_context,
    port: u32,
    index: u32,
    entry: *mut ffi::ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    errno_call(|| {
        let ctx = ctx_of(context)?;
        if flags != 0 || entry.is_null() || entry_size < std::mem::size_of::<ffi::ibv_gid_entry>() {
            return Err(EINVAL);
        }
        if gid_at(ctx, port, index)?.is_none() {
            return Err(Errno(libc::ENODATA));
        }
        // SAFETY: `entry` is non-NULL with at least one ibv_gid_entry of room (entry_size,
        // checked).
        unsafe { *entry = gid_entry(ctx) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ffi::ibv_context,
    entries: *mut ffi::ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let r = minus1_call(|| {
        let ctx = ctx_of(context)?;
        if flags != 0 || entries.is_null() || entry_size < std::mem::size_of::<ffi::ibv_gid_entry>() {
            return Err(EINVAL);
        }
        if max == 0 {
            return Err(EINVAL);
        }
        // SAFETY: `entries` is non-NULL with room for max >= 1 entries of entry_size >=
        // size_of::<ibv_gid_entry>() (both checked).
        unsafe { *entries = gid_entry(ctx) };
        Ok(1)
    });
    if r < 0 {
        -(crate::last_errno() as isize)
    } else {
        r as isize
    }
}

/// `ibv_query_gid_type` (libibverbs-private, used by perftest and rdma_cm): index 0 is RoCEv2
/// (IBV_GID_TYPE_SYSFS_ROCE_V2 = 1). Exported under every private node by c/symver.c.
#[no_mangle]
pub unsafe extern "C" fn softrdma_query_gid_type(
    context: *mut ffi::ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    minus1_call(|| {
        let ctx = ctx_of(context)?;
        // An empty entry has no type (its sysfs file is unreadable): EINVAL.
        gid_at(ctx, u32::from(port), index)?.ok_or(EINVAL)?;
        *nonnull(ty)? = 1;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ffi::ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    minus1_call(|| {
        ctx_of(context)?;
        if port != 1 || index != 0 {
            return Err(EINVAL);
        }
        *nonnull(pkey)? = 0xffffu16.to_be();
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(context: *mut ffi::ibv_context, port: u8, pkey: u16) -> c_int {
    minus1_call(|| {
        ctx_of(context)?;
        if port != 1 || u16::from_be(pkey) & 0x7fff != 0x7fff {
            return Err(EINVAL);
        }
        Ok(0)
    })
}

/// The C object an async event names in this context, or None when the program no longer has it.
fn event_element(ctx: &Ctx, e: &ClientEvent) -> Option<(ffi::ibv_event_type, ffi::ibv_async_event__bindgen_ty_1)> {
    use ffi::ibv_async_event__bindgen_ty_1 as El;
    if let Some(qpn) = e.handle.and_then(|h| lock(&ctx.xrc_rcv).get(&h).copied()) {
        return crate::ofed_xrc::rcv_qp_event(e.event, qpn);
    }
    let qp = |qpn: softrdma_engine::wire::Qpn| -> Option<El> {
        let p = match e.handle {
            Some(h) => lock(&ctx.tgt_handles).get(&h).copied(),
            None => lock(&ctx.qps).get(&qpn.value()).copied(),
        }?;
        Some(El { qp: p as *mut ffi::ibv_qp })
    };
    Some(match e.event {
        AsyncEvent::CommEst(q) => (ffi::IBV_EVENT_COMM_EST, qp(q)?),
        AsyncEvent::SqDrained(q) => (ffi::IBV_EVENT_SQ_DRAINED, qp(q)?),
        AsyncEvent::QpFatal(q) => (ffi::IBV_EVENT_QP_FATAL, qp(q)?),
        AsyncEvent::QpReqErr(q) => (ffi::IBV_EVENT_QP_REQ_ERR, qp(q)?),
        AsyncEvent::QpAccessErr(q) => (ffi::IBV_EVENT_QP_ACCESS_ERR, qp(q)?),
        AsyncEvent::LastWqeReached(q) => (ffi::IBV_EVENT_QP_LAST_WQE_REACHED, qp(q)?),
        AsyncEvent::CqErr(cq) => {
            let p = lock(&ctx.cqs).get(&cq.0).copied()?;
            (ffi::IBV_EVENT_CQ_ERR, El { cq: p as *mut ffi::ibv_cq })
        }
        AsyncEvent::SrqLimitReached(n) => {
            let p = lock(&ctx.srqs).get(&n).copied()?;
            (ffi::IBV_EVENT_SRQ_LIMIT_REACHED, El { srq: p as *mut ffi::ibv_srq })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ffi::ibv_context,
    event: *mut ffi::ibv_async_event,
) -> c_int {
    minus1_call(|| {
        let ctx = ctx_of(context)?;
        let out = nonnull(event)?;
        let nb = nonblocking(ctx.dev.event_fd().as_fd().as_raw_fd());
        loop {
            let got = ctx.dev.get_async_event(if nb { Some(Duration::ZERO) } else { None });
            match got {
                Ok(Some(e)) => {
                    if let Some((ty, el)) = event_element(ctx, &e) {
                        out.event_type = ty;
                        out.element = el;
                        return Ok(0);
                    }
                }
                Ok(None) => return Err(Errno(libc::EAGAIN)),
                Err(softrdma_device::verbs::Error::Device(_)) => {
                    // The device went away: report it once, then fail (IBV_EVENT_DEVICE_FATAL).
                    if ctx.fatal_reported.swap(true, Ordering::SeqCst) {
                        return Err(Errno(libc::EIO));
                    }
                    out.event_type = ffi::IBV_EVENT_DEVICE_FATAL;
                    out.element = ffi::ibv_async_event__bindgen_ty_1 { port_num: 1 };
                    return Ok(0);
                }
                Err(e) => return Err(e.into()),
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ffi::ibv_async_event) {
    // SAFETY: ibv_ack_async_event(3): `event` is NULL or an event ibv_get_async_event filled in.
    let Some(e) = (unsafe { event.as_ref() }) else { return };
    match e.event_type {
        ffi::IBV_EVENT_CQ_ERR => {
            // SAFETY: for a CQ event ibv_get_async_event set the `cq` member, a CQ the program
            // may not destroy before acknowledging its events.
            if let Some(cq) = unsafe { e.element.cq.as_mut() } {
                cq.async_events_completed += 1;
            }
        }
        ffi::IBV_EVENT_SRQ_LIMIT_REACHED | ffi::IBV_EVENT_SRQ_ERR => {
            // SAFETY: for an SRQ event the `srq` member is set, an SRQ kept until acknowledged.
            if let Some(srq) = unsafe { e.element.srq.as_mut() } {
                srq.events_completed += 1;
            }
        }
        ffi::IBV_EVENT_COMM_EST
        | ffi::IBV_EVENT_SQ_DRAINED
        | ffi::IBV_EVENT_QP_FATAL
        | ffi::IBV_EVENT_QP_REQ_ERR
        | ffi::IBV_EVENT_QP_ACCESS_ERR
        | ffi::IBV_EVENT_QP_LAST_WQE_REACHED
        | ffi::IBV_EVENT_PATH_MIG
        | ffi::IBV_EVENT_PATH_MIG_ERR => {
            // SAFETY: for a QP event the `qp` member is set, a QP kept until acknowledged.
            if let Some(qp) = unsafe { e.element.qp.as_mut() } {
                qp.events_completed += 1;
            }
        }
        _ => {}
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    // Nothing to do: the device never maps this process's memory (it copies through the
    // kernel), so a forked child cannot corrupt registered pages. Success, as with a kernel
    // that has copy-on-fork for pinned pages.
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> ffi::ibv_fork_status {
    ffi::IBV_FORK_UNNEEDED
}
