//! Completion channels and completion queues, including the extended CQ (`ibv_cq_ex`:
//! start_poll / next_poll / end_poll and the `ibv_wc_read_*` accessors).

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use softrdma_device::verbs::{CompletionChannel, CompletionQueue, WorkCompletion};

use crate::callback::Ours;
use crate::context::{ctx_of, lock, nonblocking, Ctx};
use crate::ffi;
use crate::{errno_call, into_c, minus1_call, nonnull, ptr_call, Errno, EINVAL};

/// A completion channel: its fd is readable while CQ events wait.
#[repr(C)]
pub(crate) struct Channel {
    pub(crate) ch: ffi::ibv_comp_channel,
    pub(crate) inner: Option<CompletionChannel>,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ffi::ibv_context) -> *mut ffi::ibv_comp_channel {
    ptr_call(|| {
        let ctx = ctx_of(context)?;
        let inner = ctx.dev.create_comp_channel()?;
        // Blocking unless the program makes it non-blocking (ibv_get_cq_event then returns
        // EAGAIN instead of waiting, as with a uverbs event file).
        clear_nonblock(inner.as_fd().as_raw_fd());
        let ch = ffi::ibv_comp_channel { context, fd: inner.as_fd().as_raw_fd(), refcnt: 0 };
        Ok(into_c(Channel { ch, inner: Some(inner) }) as *mut ffi::ibv_comp_channel)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ffi::ibv_comp_channel) -> c_int {
    errno_call(|| {
        let c = nonnull(channel)?;
        if c.refcnt > 0 {
            return Err(Errno(libc::EBUSY));
        }
        // SAFETY: ibv_destroy_comp_channel(3): `channel` (non-NULL) is a Channel this library
        // made, destroyed once and not used after success.
        unsafe { crate::mem::destroy_obj(channel as *mut Channel, |c| &mut c.inner, |i| i.destroy()) }
    })
}

/// Clears O_NONBLOCK on an event fd the device made, so the flag says what the program wants.
pub(crate) fn clear_nonblock(fd: c_int) {
    // SAFETY: fcntl on a descriptor this library owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// Extended-poll state: the completions read from the ring and the one being looked at.
#[derive(Default)]
struct PollState {
    pending: VecDeque<WorkCompletion>,
    cur: Option<WorkCompletion>,
}

/// A completion queue. Its C structure is always an `ibv_cq_ex` (whose start is `ibv_cq`).
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) ex: ffi::ibv_cq_ex,
    pub(crate) ctx: *const Ctx,
    pub(crate) inner: Option<CompletionQueue>,
    /// Locked by each poll once the extended API is in use (`extended`): threads may poll one
    /// CQ at once, as libibverbs allows.
    poll: std::sync::Mutex<PollState>,
    /// Whether `ibv_start_poll` was ever called on this CQ: until then `poll` holds nothing
    /// and `ibv_poll_cq` leaves its lock alone (a lock less per empty poll).
    extended: std::sync::atomic::AtomicBool,
}

pub(crate) fn cq_of<'a>(p: *mut ffi::ibv_cq) -> Result<&'a Cq, Errno> {
    // SAFETY: every ibv_cq this library hands out is the first field of a Cq.
    let cq = unsafe { (p as *mut Cq).as_ref() }.ok_or(EINVAL)?;
    cq.inner.as_ref().ok_or(EINVAL)?;
    Ok(cq)
}

impl Cq {
    pub(crate) fn inner(&self) -> &CompletionQueue {
        self.inner.as_ref().expect("checked by cq_of")
    }
}

/// A CQ of `context`, with `channel` (NULL for none).
///
/// # Safety
/// `channel` is NULL or a completion channel this library made and the program has not destroyed.
unsafe fn create(
    context: *mut ffi::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut Cq, Errno> {
    let ctx = ctx_of(context)?;
    if cqe < 1 || cqe as u32 > ctx.info.limits.max_cqe || !(0..1).contains(&comp_vector) {
        return Err(EINVAL);
    }
    // SAFETY: per the contract, `channel` is NULL or a live Channel (its ibv_comp_channel first).
    let ch = match unsafe { (channel as *mut Channel).as_ref() } {
        Some(c) => Some(c.inner.as_ref().ok_or(EINVAL)?),
        None => None,
    };
    let inner = ctx.dev.create_cq(cqe as u32, ch)?;
    // SAFETY: as above; the program does not use the channel's refcnt itself.
    if let Some(c) = unsafe { channel.as_mut() } {
        c.refcnt += 1;
    }
    let mut ex = ffi::ibv_cq_ex { context, channel, cq_context, handle: inner.id().0, cqe, ..Default::default() };
    fill_ex(&mut ex);
    let cq = into_c(Cq { ex, ctx, inner: Some(inner), poll: Default::default(), extended: Default::default() });
    // SAFETY: into_c has just made `cq`; nothing else references it yet.
    lock(&ctx.cqs).insert(unsafe { &*cq }.inner().id().0, cq as usize);
    Ok(cq)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ffi::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ffi::ibv_cq {
    // SAFETY: ibv_create_cq(3): `channel` is NULL or one of the program's completion channels.
    ptr_call(|| Ok(unsafe { create(context, cqe, cq_context, channel, comp_vector) }? as *mut ffi::ibv_cq))
}

/// The completion fields `ibv_wc_read_*` can give here.
const WC_FLAGS_SUPPORTED: u64 = (ffi::IBV_WC_EX_WITH_BYTE_LEN
    | ffi::IBV_WC_EX_WITH_IMM
    | ffi::IBV_WC_EX_WITH_QP_NUM
    | ffi::IBV_WC_EX_WITH_SRC_QP
    | ffi::IBV_WC_EX_WITH_SLID
    | ffi::IBV_WC_EX_WITH_SL
    | ffi::IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

ffi_callback! {
    #[on_panic = crate::callback::null_eio()]
    fn create_cq_ex(
        context: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_cq_init_attr_ex,
    ) -> *mut ffi::ibv_cq_ex {
        ptr_call(|| {
            let a = nonnull(attr)?;
            if a.comp_mask & !(ffi::IBV_CQ_INIT_ATTR_MASK_FLAGS | ffi::IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
                return Err(EINVAL);
            }
            if a.comp_mask & ffi::IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null() {
                // Parent domains are not modelled.
                return Err(Errno(libc::EOPNOTSUPP));
            }
            if a.wc_flags & !WC_FLAGS_SUPPORTED != 0 {
                // Timestamps, CVLAN, flow tags, tag matching: no such hardware here.
                return Err(Errno(libc::EOPNOTSUPP));
            }
            if a.comp_mask & ffi::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !(ffi::IBV_CREATE_CQ_ATTR_SINGLE_THREADED | ffi::IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) != 0
            {
                return Err(Errno(libc::EOPNOTSUPP));
            }
            // SAFETY: ibv_create_cq_ex(3): `attr->channel` is NULL or one of the program's
            // channels.
            let cq = unsafe { create(context, a.cqe as c_int, a.cq_context, a.channel, a.comp_vector as c_int) }?;
            Ok(cq as *mut ffi::ibv_cq_ex)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ffi::ibv_cq) -> c_int {
    errno_call(|| {
        let c = cq_of(cq)?;
        // SAFETY: `c.ctx` is the context the CQ was made in, which the program may not close
        // before destroying the CQ.
        let (ctx, id, channel) = (unsafe { &*c.ctx }, c.inner().id().0, c.ex.channel);
        // SAFETY: ibv_destroy_cq(3): `cq` (accepted by cq_of) is a Cq of this library, destroyed
        // once and not used after success.
        unsafe { crate::mem::destroy_obj(cq as *mut Cq, |c| &mut c.inner, |i| i.destroy()) }?;
        lock(&ctx.cqs).remove(&id);
        // SAFETY: the CQ's channel is NULL or a live channel: its refcnt keeps the program from
        // destroying it (EBUSY) while this CQ used it.
        if let Some(ch) = unsafe { channel.as_mut() } {
            ch.refcnt -= 1;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ffi::ibv_cq, cqe: c_int) -> c_int {
    errno_call(|| {
        let c = cq_of(cq)?;
        // SAFETY: `c.ctx` is the CQ's context, open while the CQ exists.
        let ctx = unsafe { &*c.ctx };
        if cqe < 1 || cqe as u32 > ctx.info.limits.max_cqe {
            return Err(EINVAL);
        }
        c.inner().resize(cqe as u32)?;
        // SAFETY: cq_of accepted `cq` as a live CQ of this library.
        unsafe { (*cq).cqe = cqe };
        Ok(())
    })
}

/// An `ibv_wc` from a softrdma completion.
pub(crate) fn to_wc(w: &WorkCompletion) -> ffi::ibv_wc {
    let mut flags = 0;
    let mut un = ffi::ibv_wc__bindgen_ty_1 { imm_data: 0 };
    if let Some(imm) = w.imm {
        flags |= ffi::IBV_WC_WITH_IMM;
        un.imm_data = imm.to_be();
    } else if let Some(rkey) = w.invalidated_rkey {
        flags |= ffi::IBV_WC_WITH_INV;
        un.invalidated_rkey = rkey;
    }
    if w.grh {
        flags |= ffi::IBV_WC_GRH;
    }
    ffi::ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: 0,
        byte_len: w.byte_len,
        __bindgen_anon_1: un,
        qp_num: w.qp_num.value(),
        src_qp: w.src_qp.value(),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: roce_packet_type(w),
        dlid_path_bits: 0,
    }
}

/// What a RoCE UD receive reports in `ibv_wc.sl`: the network header type of the received
/// packet, as ConnectX does (its CQE's L3 header type lands in the SL bits; the kernel reads it
/// the same way to fill `ib_wc.network_hdr_type`): 2 for IPv4, 1 for IPv6, 0 for a RoCEv1 GRH.
/// On RoCE there is no SL on the wire (the priority is in the VLAN tag or DSCP), and UCX's
/// ud_verbs reads this value to know how long the destination GID in the GRH slot is (4 bytes
/// for IPv4). Completions without a GRH slot report 0.
fn roce_packet_type(w: &WorkCompletion) -> u8 {
    match (w.grh, w.src) {
        (true, Some(std::net::IpAddr::V4(_))) => 2,
        (true, Some(std::net::IpAddr::V6(_))) => 1,
        _ => 0,
    }
}

ffi_callback! {
    #[on_panic = crate::callback::minus1_eio()]
    fn poll_cq(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
        minus1_call(|| {
            let c = cq_of(cq)?;
            if n < 0 || (n > 0 && wc.is_null()) {
                return Err(EINVAL);
            }
            let mut st = c.extended.load(std::sync::atomic::Ordering::Acquire).then(|| lock(&c.poll));
            let mut k = 0usize;
            // Completions an extended poll read but did not hand out come first.
            while let Some(st) = st.as_mut().filter(|_| k < n as usize) {
                let Some(w) = st.pending.pop_front() else { break };
                // SAFETY: ibv_poll_cq(3): `wc` (non-NULL, checked) points to `n` writable ibv_wc,
                // and k < n.
                unsafe { *wc.add(k) = to_wc(&w) };
                k += 1;
            }
            if k < n as usize {
                for w in c.inner().poll((n as usize - k) as u32)? {
                    // SAFETY: as above: the device returns at most n - k completions, so k < n.
                    unsafe { *wc.add(k) = to_wc(&w) };
                    k += 1;
                }
            }
            if k == 0 && !c.inner().application_driven() {
                // Programs spin on an empty CQ (a NIC needs no CPU to make progress; this device
                // does): give the CPU away so the device thread runs when cores are few. On the
                // provider path this poll did the device's work itself (BENCHMARKS.md "Without the
                // signal mask": the yield only cost a system call per empty poll there).
                std::thread::yield_now();
            }
            Ok(k as c_int)
        })
    }
}

ffi_callback! {
    #[on_panic = crate::callback::eio()]
    fn req_notify_cq(cq: *mut ffi::ibv_cq, solicited_only: c_int) -> c_int {
        errno_call(|| {
            let c = cq_of(cq)?;
            // Without a channel the request is accepted and nothing is ever signalled (as rxe).
            if c.ex.channel.is_null() {
                return Ok(());
            }
            c.inner().req_notify(solicited_only != 0)?;
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ffi::ibv_comp_channel,
    cq: *mut *mut ffi::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    minus1_call(|| {
        // SAFETY: ibv_get_cq_event(3): `channel` is NULL or a live completion channel of the
        // program (a Channel, its ibv_comp_channel first).
        let ch = unsafe { (channel as *mut Channel).as_ref() }.ok_or(EINVAL)?;
        let inner = ch.inner.as_ref().ok_or(EINVAL)?;
        let ctx = ctx_of(ch.ch.context)?;
        let wait = if nonblocking(ch.ch.fd) { Some(Duration::ZERO) } else { None };
        loop {
            let Some(id) = inner.get_cq_event(wait)? else { return Err(Errno(libc::EAGAIN)) };
            // An event for a CQ the program has destroyed since is dropped.
            let Some(p) = lock(&ctx.cqs).get(&id.0).copied() else { continue };
            // SAFETY: ctx.cqs holds only live Cqs (ibv_destroy_cq removes a CQ before returning).
            let c = unsafe { &*(p as *const Cq) };
            // SAFETY: `cq` and `cq_context` are NULL or writable slots of the caller.
            unsafe {
                if let Some(out) = cq.as_mut() {
                    *out = p as *mut ffi::ibv_cq;
                }
                if let Some(out) = cq_context.as_mut() {
                    *out = c.ex.cq_context;
                }
            }
            return Ok(0);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ffi::ibv_cq, n: u32) {
    // SAFETY: ibv_ack_cq_events(3): `cq` is NULL or a CQ the program has not destroyed (it
    // must acknowledge events before destroying it).
    if let Some(c) = unsafe { cq.as_mut() } {
        c.comp_events_completed = c.comp_events_completed.wrapping_add(n);
    }
}

pub(crate) fn fill_ops(v: &mut ffi::verbs_context) {
    v.context.ops.poll_cq = Some(poll_cq);
    v.context.ops.req_notify_cq = Some(req_notify_cq);
    v.create_cq_ex = Some(create_cq_ex);
}

// The extended CQ: start_poll reads the first completion (ENOENT when none), next_poll the next,
// end_poll ends the batch; the accessors read the current one.

impl Ours<ffi::ibv_cq_ex> {
    /// The Cq behind an extended CQ.
    fn cq(&self) -> &Cq {
        // SAFETY: an Ours is a live object of this library (Ours::new), and every ibv_cq_ex this
        // library hands out is the first field of a Cq (`create`).
        unsafe { &*(self.as_ptr() as *const Cq) }
    }
}

/// The next completion of an extended poll (0), or ENOENT.
fn advance(cq: Ours<ffi::ibv_cq_ex>) -> c_int {
    let Ok(c) = cq_of(cq.as_ptr() as *mut ffi::ibv_cq) else { return libc::EINVAL };
    c.extended.store(true, std::sync::atomic::Ordering::Release);
    let mut st = lock(&c.poll);
    if st.pending.is_empty() {
        match c.inner().poll(16) {
            Ok(ws) => st.pending.extend(ws),
            Err(e) => return crate::errno_of(&e),
        }
    }
    match st.pending.pop_front() {
        Some(w) => {
            // SAFETY: cq_of accepted `cq`, a live CQ; its status and wr_id are the fields the
            // program reads after start_poll/next_poll.
            unsafe {
                (*cq.as_ptr()).status = w.status as u32;
                (*cq.as_ptr()).wr_id = w.wr_id;
            }
            st.cur = Some(w);
            0
        }
        None => {
            st.cur = None;
            libc::ENOENT
        }
    }
}

ffi_callback! {
    /// `ibv_start_poll`.
    #[on_panic = crate::callback::eio()]
    fn start_poll(cq: Ours<ffi::ibv_cq_ex>, attr: *mut ffi::ibv_poll_cq_attr) -> c_int {
        // SAFETY: ibv_start_poll(3): `attr` is NULL or a readable ibv_poll_cq_attr.
        if let Some(a) = unsafe { attr.as_ref() } {
            if a.comp_mask != 0 {
                return libc::EINVAL;
            }
        }
        advance(cq)
    }
}

ffi_callback! {
    /// `ibv_next_poll`.
    #[on_panic = crate::callback::eio()]
    fn next_poll(cq: Ours<ffi::ibv_cq_ex>) -> c_int {
        advance(cq)
    }
}

ffi_callback! {
    /// `ibv_end_poll`.
    #[on_panic = ()]
    fn end_poll(cq: Ours<ffi::ibv_cq_ex>) {
        lock(&cq.cq().poll).cur = None;
    }
}

/// The current completion of an extended poll (all-zero outside a batch).
fn cur(cq: Ours<ffi::ibv_cq_ex>) -> ffi::ibv_wc {
    match &lock(&cq.cq().poll).cur {
        Some(w) => to_wc(w),
        None => ffi::ibv_wc::default(),
    }
}

/// The `ibv_wc_read_*` accessors: each reads its field of the current completion (0 on a panic).
macro_rules! read_ops {
    ($($name:ident -> $ty:ty: |$w:ident| $read:expr;)*) => {$(
        ffi_callback! {
            #[on_panic = 0]
            fn $name(cq: Ours<ffi::ibv_cq_ex>) -> $ty {
                let $w = cur(cq);
                $read
            }
        }
    )*};
}

read_ops! {
    read_opcode -> ffi::ibv_wc_opcode: |w| w.opcode;
    read_vendor_err -> u32: |w| w.vendor_err;
    read_byte_len -> u32: |w| w.byte_len;
    // SAFETY: both members of the union are u32, and to_wc always initializes one of them.
    read_imm_data -> u32: |w| unsafe { w.__bindgen_anon_1.imm_data };
    read_qp_num -> u32: |w| w.qp_num;
    read_src_qp -> u32: |w| w.src_qp;
    read_wc_flags -> u32: |w| w.wc_flags;
    read_slid -> u32: |w| u32::from(w.slid);
    read_sl -> u8: |w| w.sl;
    read_dlid_path_bits -> u8: |w| w.dlid_path_bits;
}

fn fill_ex(ex: &mut ffi::ibv_cq_ex) {
    ex.start_poll = Some(start_poll);
    ex.next_poll = Some(next_poll);
    ex.end_poll = Some(end_poll);
    ex.read_opcode = Some(read_opcode);
    ex.read_vendor_err = Some(read_vendor_err);
    ex.read_byte_len = Some(read_byte_len);
    ex.read_imm_data = Some(read_imm_data);
    ex.read_qp_num = Some(read_qp_num);
    ex.read_src_qp = Some(read_src_qp);
    ex.read_wc_flags = Some(read_wc_flags);
    ex.read_slid = Some(read_slid);
    ex.read_sl = Some(read_sl);
    ex.read_dlid_path_bits = Some(read_dlid_path_bits);
}

/// A CQ with its callbacks and no device CQ behind it (as a destroyed one), for their tests.
#[cfg(test)]
pub(crate) fn unbacked() -> Box<Cq> {
    let mut ex = ffi::ibv_cq_ex::default();
    fill_ex(&mut ex);
    let ctx = std::ptr::null();
    Box::new(Cq { ex, ctx, inner: None, poll: Default::default(), extended: Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_device::verbs::{Qpn, WcOpcode, WcStatus};

    fn wc(opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion {
            wr_id: 7,
            status: WcStatus::Success,
            opcode,
            byte_len: 100,
            imm: None,
            invalidated_rkey: None,
            qp_num: Qpn::new(0x12),
            src_qp: Qpn::new(0x34),
            grh: false,
            src: None,
        }
    }

    #[test]
    fn completions_convert_as_ibv_wc() {
        let mut w = wc(WcOpcode::RecvRdmaWithImm);
        w.imm = Some(0x0102_0304);
        w.grh = true;
        let c = to_wc(&w);
        assert_eq!(
            (c.wr_id, c.opcode, c.byte_len, c.qp_num, c.src_qp),
            (7, ffi::IBV_WC_RECV_RDMA_WITH_IMM, 100, 0x12, 0x34)
        );
        assert_eq!(c.wc_flags, ffi::IBV_WC_WITH_IMM | ffi::IBV_WC_GRH);
        // imm_data is in network order in memory: the wire bytes 01 02 03 04.
        // SAFETY: both union members are u32, and to_wc initialized one.
        assert_eq!(unsafe { c.__bindgen_anon_1.imm_data }.to_ne_bytes(), [1, 2, 3, 4]);
        let mut w = wc(WcOpcode::Recv);
        w.invalidated_rkey = Some(0xabcd);
        let c = to_wc(&w);
        assert_eq!(c.wc_flags, ffi::IBV_WC_WITH_INV);
        // SAFETY: as above.
        assert_eq!(unsafe { c.__bindgen_anon_1.invalidated_rkey }, 0xabcd);
        let mut w = wc(WcOpcode::RdmaRead);
        w.status = WcStatus::RemAccessErr;
        let c = to_wc(&w);
        assert_eq!((c.status, c.opcode, c.wc_flags), (ffi::IBV_WC_REM_ACCESS_ERR, ffi::IBV_WC_RDMA_READ, 0));
    }

    #[test]
    fn ud_receives_report_the_network_header_type_in_sl() {
        let mut w = wc(WcOpcode::Recv);
        assert_eq!(to_wc(&w).sl, 0, "no GRH slot, no packet type");
        w.grh = true;
        w.src = Some("10.0.0.2".parse().unwrap());
        assert_eq!(to_wc(&w).sl, 2, "RoCEv2 over IPv4");
        w.src = Some("fe80::2".parse().unwrap());
        assert_eq!(to_wc(&w).sl, 1, "RoCEv2 over IPv6");
    }
}
