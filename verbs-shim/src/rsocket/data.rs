//! The stream rsocket protocol (rdma-core's, message for message; docs/rsockets.md):
//!
//! - Every message is an RDMA WRITE WITH IMMEDIATE into a receive with no scatter list. The
//!   immediate's top three bits are the opcode: 0 data (bits 28:0 the bytes written into the
//!   peer's receive buffer), 4 credits ("SGL": bits 28:0 the peer's new sequence limit), 6 iomap
//!   entry written (bits 15:0 its index), 7 control (disconnect 0, keep-alive 1, shutdown 2).
//! - The receiver's buffer is used in halves. Each half is published by an RDMA WRITE of an
//!   `rs_sge` (address, rkey, length: 16 bytes in the receiver's byte order) into the sender's
//!   target SGL (two entries) with a credits message; the first half travels in the connection
//!   data. The sender fills a published half before it moves to the next.
//! - Credits count messages: the sender may send while its sequence number differs from the
//!   limit the receiver granted; the receiver grants rq_size more as its application consumes.
//!   Four sends are kept for control messages, so credits can always be returned.

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use super::config::{defaults, SNDLOWAT};
use super::opts::Addr;
use super::stream::*;
use super::{Cursor, Iov};
use crate::cma::{api, lock};
use crate::ffi;
use crate::Errno;

pub(super) const OP_DATA: u32 = 0;
/// Not on the wire: the wr_id of a direct (iomap) WRITE.
pub(super) const OP_WRITE: u32 = 2;
pub(super) const OP_SGL: u32 = 4;
pub(super) const OP_IOMAP_SGL: u32 = 6;
pub(super) const OP_CTRL: u32 = 7;
pub(super) const CTRL_DISCONNECT: u32 = 0;
pub(super) const CTRL_KEEPALIVE: u32 = 1;
pub(super) const CTRL_SHUTDOWN: u32 = 2;
/// Sends kept for control messages (rdma-core's RS_QP_CTRL_SIZE).
pub(super) const QP_CTRL_SIZE: u32 = 4;
const RECV_WR_FLAG: u64 = 1 << 63;
/// The first chunk of a send, doubled each chunk up to [`MAX_TRANSFER`] (rdma-core overlaps
/// copying with sending this way).
const OLAP_START_SIZE: u32 = 2048;
const MAX_TRANSFER: u32 = 65536;
/// The size of an `rs_sge` and of an `rs_iomap` on the wire.
pub(super) const SGE_LEN: usize = 16;
pub(super) const IOMAP_LEN: usize = 24;

pub(super) fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}

fn msg_op(m: u32) -> u32 {
    m >> 29
}

fn msg_data(m: u32) -> u32 {
    m & 0x1FFF_FFFF
}

#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub(super) struct RsSge {
    pub(super) addr: u64,
    pub(super) key: u32,
    pub(super) length: u32,
}

/// Page-aligned zeroed memory registered with the rsocket's PD (rdma-core's forksafe_alloc and
/// rdma_reg_msgs/rdma_reg_write).
pub(super) struct Region {
    ptr: *mut u8,
    layout: std::alloc::Layout,
    mr: *mut ffi::ibv_mr,
}

impl Region {
    pub(super) fn new(pd: *mut ffi::ibv_pd, len: usize, access: u32) -> Result<Region, Errno> {
        let layout = std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(4096), 4096)
            .map_err(|_| Errno(libc::ENOMEM))?;
        // SAFETY: a non-zero layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        // SAFETY: our PD and memory.
        let mr = unsafe { (api().reg_mr)(pd, ptr.cast(), len, access as c_int) };
        if mr.is_null() {
            let e = Errno(crate::last_errno());
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr, layout) };
            return Err(e);
        }
        Ok(Region { ptr, layout, mr })
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(super) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub(super) fn lkey(&self) -> u32 {
        // SAFETY: our MR.
        unsafe { (*self.mr).lkey }
    }

    pub(super) fn rkey(&self) -> u32 {
        // SAFETY: our MR.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our MR and memory.
        unsafe {
            (api().dereg_mr)(self.mr);
            std::alloc::dealloc(self.ptr, self.layout);
        }
    }
}

/// Everything of a stream rsocket behind its lock (rdma-core's struct rsocket, stream part).
pub(crate) struct State {
    pub(super) state: u32,
    pub(super) err: c_int,
    pub(super) shut_wr: bool,
    pub(super) swap_sgl: bool,
    pub(super) sq_size: u16,
    pub(super) rq_size: u16,
    pub(super) sq_inline: u16,
    pub(super) sbuf_size: u32,
    pub(super) rbuf_size: u32,
    pub(super) target_iomap_size: u16,
    pub(super) dst: Option<Addr>,
    pub(super) route: Option<Vec<u8>>,
    pub(super) cm_nonblock: bool,

    pub(super) channel: *mut ffi::ibv_comp_channel,
    pub(super) cq: *mut ffi::ibv_cq,
    pub(super) qp: *mut ffi::ibv_qp,
    pub(super) pd: *mut ffi::ibv_pd,
    pub(super) cq_armed: bool,

    pub(super) ctrl_seqno: u32,
    pub(super) ctrl_max_seqno: u32,
    pub(super) sseq_no: u16,
    pub(super) sseq_comp: u16,
    pub(super) rseq_no: u16,
    pub(super) rseq_comp: u16,

    pub(super) remote_sge: u32,
    pub(super) remote_sgl: RsSge,
    pub(super) remote_iomap: RsSge,
    /// The target SGL and target iomap, which the peer writes.
    pub(super) target: Option<Region>,
    pub(super) target_sge: usize,

    pub(super) rbuf: Option<Region>,
    pub(super) rbuf_bytes_avail: u32,
    pub(super) rbuf_free_offset: u32,
    pub(super) rbuf_offset: u32,
    /// Received messages not yet read: (opcode, bytes left).
    pub(super) rmsg: Vec<(u32, u32)>,
    pub(super) rmsg_head: usize,
    pub(super) rmsg_tail: usize,

    pub(super) sbuf: Option<Region>,
    pub(super) sbuf_bytes_avail: u32,
    /// Where the next send is staged in the send buffer (a ring).
    pub(super) ssgl_addr: u64,
    pub(super) sqe_avail: i32,

    pub(super) iomaps: super::iomap::Maps,
    pub(super) keepalive_time: u32,
    pub(super) keepalive: bool,
    pub(super) so_opts: u64,
    pub(super) tcp_opts: u64,
    pub(super) ipv6_opts: u64,
    pub(super) ip_tos: c_int,
}

// SAFETY: the raw pointers are this rsocket's verbs objects, used under the State's lock.
unsafe impl Send for State {}

impl State {
    pub(super) fn with_sizes(sq: u16, rq: u16, inline: u16, sbuf: u32, rbuf: u32, iomap: u16) -> State {
        State {
            state: S_INIT,
            err: 0,
            shut_wr: false,
            swap_sgl: false,
            sq_size: sq,
            rq_size: rq,
            sq_inline: inline,
            sbuf_size: sbuf,
            rbuf_size: rbuf,
            target_iomap_size: iomap,
            dst: None,
            route: None,
            cm_nonblock: false,
            channel: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            cq_armed: false,
            ctrl_seqno: 0,
            ctrl_max_seqno: QP_CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sge: 0,
            remote_sgl: RsSge::default(),
            remote_iomap: RsSge::default(),
            target: None,
            target_sge: 0,
            rbuf: None,
            rbuf_bytes_avail: 0,
            rbuf_free_offset: 0,
            rbuf_offset: 0,
            rmsg: Vec::new(),
            rmsg_head: 0,
            rmsg_tail: 0,
            sbuf: None,
            sbuf_bytes_avail: 0,
            ssgl_addr: 0,
            sqe_avail: 0,
            iomaps: Default::default(),
            keepalive_time: 0,
            keepalive: false,
            so_opts: 0,
            tcp_opts: 0,
            ipv6_opts: 0,
            ip_tos: 0,
        }
    }

    /// rdma-core's rs_init_bufs: the send buffer (with room for control messages when they
    /// cannot go inline), the target SGL and iomap, the receive buffer.
    pub(super) fn init_bufs(&mut self) -> Result<(), Errno> {
        let local = ffi::IBV_ACCESS_LOCAL_WRITE;
        let remote = ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE;
        self.sbuf_size = min_sbuf(self.sbuf_size);
        self.rbuf_size = self.rbuf_size.clamp(2 * SNDLOWAT, 1 << 28);
        self.rmsg = vec![(0, 0); self.rq_size as usize + 1];
        let mut sbuf_total = self.sbuf_size as usize;
        if (self.sq_inline as usize) < SGE_LEN {
            sbuf_total += SGE_LEN * QP_CTRL_SIZE as usize;
        }
        let sbuf = Region::new(self.pd, sbuf_total, local)?;
        let tlen = SGE_LEN * SGL_SIZE as usize + IOMAP_LEN * self.target_iomap_size as usize;
        let target = Region::new(self.pd, tlen, remote)?;
        let rbuf = Region::new(self.pd, self.rbuf_size as usize, remote)?;
        self.ssgl_addr = sbuf.addr();
        self.sbuf_bytes_avail = self.sbuf_size;
        self.sbuf = Some(sbuf);
        self.target = Some(target);
        self.rbuf = Some(rbuf);
        self.rbuf_free_offset = self.rbuf_size >> 1;
        self.rbuf_bytes_avail = self.rbuf_size >> 1;
        self.sqe_avail = self.sq_size as i32 - self.ctrl_max_seqno as i32;
        self.rseq_comp = self.rq_size >> 1;
        Ok(())
    }

    pub(super) fn release_bufs(&mut self) {
        self.iomaps.release();
        self.sbuf = None;
        self.target = None;
        self.rbuf = None;
    }

    // ---- the target SGL, which the peer writes ----

    fn target_ptr(&self, i: usize) -> *mut u8 {
        let t = self.target.as_ref().expect("a connected rsocket has its target SGL");
        t.ptr().wrapping_add(i * SGE_LEN)
    }

    pub(super) fn target(&self, i: usize) -> RsSge {
        let p = self.target_ptr(i);
        // SAFETY: entry i of our target SGL (i < SGL_SIZE); the peer may write it at any time,
        // so it is read as volatile.
        unsafe {
            RsSge {
                addr: std::ptr::read_volatile(p as *const u64),
                key: std::ptr::read_volatile(p.add(8) as *const u32),
                length: std::ptr::read_volatile(p.add(12) as *const u32),
            }
        }
    }

    pub(super) fn set_target(&mut self, i: usize, s: RsSge) {
        let p = self.target_ptr(i);
        // SAFETY: as in `target`.
        unsafe {
            std::ptr::write_volatile(p as *mut u64, s.addr);
            std::ptr::write_volatile(p.add(8) as *mut u32, s.key);
            std::ptr::write_volatile(p.add(12) as *mut u32, s.length);
        }
    }

    // ---- posting ----

    fn post(&self, wr: &mut ffi::ibv_send_wr) -> Result<(), Errno> {
        if self.qp.is_null() {
            return Err(Errno(libc::ENOTCONN));
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the work request and its scatter list live across the call.
        let r = unsafe {
            let f = (*(*self.qp).context).ops.post_send.ok_or(Errno(libc::ENOSYS))?;
            f(self.qp, wr, &mut bad)
        };
        if r != 0 {
            return Err(Errno(r));
        }
        Ok(())
    }

    fn write_wr(wr_id: u64, sgl: &mut [ffi::ibv_sge], op: u32, flags: u32, addr: u64, rkey: u32) -> ffi::ibv_send_wr {
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: if sgl.is_empty() { std::ptr::null_mut() } else { sgl.as_mut_ptr() },
            num_sge: sgl.len() as c_int,
            opcode: op,
            send_flags: flags,
            ..Default::default()
        };
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: addr, rkey };
        wr
    }

    /// A message without data: a zero-length RDMA WRITE WITH IMMEDIATE.
    pub(super) fn post_msg(&self, m: u32) -> Result<(), Errno> {
        let mut wr = Self::write_wr(m as u64, &mut [], ffi::IBV_WR_RDMA_WRITE_WITH_IMM, 0, 0, 0);
        wr.__bindgen_anon_1.imm_data = m.to_be();
        self.post(&mut wr)
    }

    pub(super) fn post_write(
        &self,
        sgl: &mut [ffi::ibv_sge],
        wr_data: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), Errno> {
        let mut wr = Self::write_wr(wr_data as u64, sgl, ffi::IBV_WR_RDMA_WRITE, flags, addr, rkey);
        self.post(&mut wr)
    }

    pub(super) fn post_write_msg(
        &self,
        sgl: &mut [ffi::ibv_sge],
        m: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), Errno> {
        let mut wr = Self::write_wr(m as u64, sgl, ffi::IBV_WR_RDMA_WRITE_WITH_IMM, flags, addr, rkey);
        wr.__bindgen_anon_1.imm_data = m.to_be();
        self.post(&mut wr)
    }

    pub(super) fn post_recv(&self) -> Result<(), Errno> {
        let mut wr = ffi::ibv_recv_wr { wr_id: RECV_WR_FLAG, ..Default::default() };
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; a receive with no scatter list.
        let r = unsafe {
            let f = (*(*self.qp).context).ops.post_recv.ok_or(Errno(libc::ENOSYS))?;
            f(self.qp, &mut wr, &mut bad)
        };
        if r != 0 {
            return Err(Errno(r));
        }
        Ok(())
    }

    /// Stages `len` bytes from `src` in the send buffer's ring: one scatter entry, or two when
    /// the ring wraps.
    pub(super) fn stage(&mut self, len: u32, src: &mut Cursor<'_>) -> ([ffi::ibv_sge; 2], usize) {
        let sbuf = self.sbuf.as_ref().expect("a connected rsocket has its send buffer");
        let (base, lkey) = (sbuf.addr(), sbuf.lkey());
        let end = base + self.sbuf_size as u64;
        let left = (end - self.ssgl_addr) as u32;
        let mut sges = [ffi::ibv_sge::default(); 2];
        if len <= left {
            src.read_to(self.ssgl_addr as *mut u8, len as usize);
            sges[0] = ffi::ibv_sge { addr: self.ssgl_addr, length: len, lkey };
            self.ssgl_addr = if len < left { self.ssgl_addr + len as u64 } else { base };
            (sges, 1)
        } else {
            src.read_to(self.ssgl_addr as *mut u8, left as usize);
            src.read_to(base as *mut u8, (len - left) as usize);
            sges[0] = ffi::ibv_sge { addr: self.ssgl_addr, length: left, lkey };
            sges[1] = ffi::ibv_sge { addr: base, length: len - left, lkey };
            self.ssgl_addr = base + (len - left) as u64;
            (sges, 2)
        }
    }

    /// rdma-core's rs_write_data: the target entry is advanced before the data is sent (the
    /// peer may replace a used-up entry as soon as the data arrives).
    fn write_data(&mut self, sgl: &mut [ffi::ibv_sge], len: u32, flags: u32) -> Result<(), Errno> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        let mut t = self.target(self.target_sge);
        let (addr, rkey) = (t.addr, t.key);
        t.addr = t.addr.wrapping_add(len as u64);
        t.length -= len;
        self.set_target(self.target_sge, t);
        if t.length == 0 {
            self.target_sge = (self.target_sge + 1) % SGL_SIZE as usize;
        }
        self.post_write_msg(sgl, msg(OP_DATA, len), flags, addr, rkey)
    }

    // ---- credits ----

    pub(super) fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.rbuf_size >> 1 || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.state & S_CONNECTED != 0
    }

    /// rdma-core's rs_send_credits: grants rq_size messages past those read, and with them the
    /// next free half of the receive buffer when there is one.
    fn send_credits(&mut self) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let limit = self.rseq_no as u32 + self.rq_size as u32;
        if self.rbuf_bytes_avail >= self.rbuf_size >> 1 {
            let rbuf = self.rbuf.as_ref().expect("a connected rsocket has its receive buffer");
            let mut s = RsSge {
                addr: rbuf.addr() + self.rbuf_free_offset as u64,
                key: rbuf.rkey(),
                length: self.rbuf_size >> 1,
            };
            if self.swap_sgl {
                s = RsSge { addr: s.addr.swap_bytes(), key: s.key.swap_bytes(), length: s.length.swap_bytes() };
            }
            let mut bytes = [0u8; SGE_LEN];
            bytes[0..8].copy_from_slice(&s.addr.to_ne_bytes());
            bytes[8..12].copy_from_slice(&s.key.to_ne_bytes());
            bytes[12..16].copy_from_slice(&s.length.to_ne_bytes());
            let (mut sge, flags) = if self.sq_inline as usize >= SGE_LEN {
                (ffi::ibv_sge { addr: bytes.as_ptr() as u64, length: SGE_LEN as u32, lkey: 0 }, ffi::IBV_SEND_INLINE)
            } else {
                let sbuf = self.sbuf.as_ref().expect("send buffer");
                let slot = self.sbuf_size as usize + SGE_LEN * (self.ctrl_seqno & (QP_CTRL_SIZE - 1)) as usize;
                // SAFETY: the control area after the send ring (allocated when inline is short).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), sbuf.ptr().add(slot), SGE_LEN) };
                (ffi::ibv_sge { addr: sbuf.addr() + slot as u64, length: SGE_LEN as u32, lkey: sbuf.lkey() }, 0)
            };
            let at = self.remote_sgl.addr.wrapping_add(self.remote_sge as u64 * SGE_LEN as u64);
            let r =
                self.post_write_msg(std::slice::from_mut(&mut sge), msg(OP_SGL, limit), flags, at, self.remote_sgl.key);
            if r.is_err() {
                self.fail(libc::EIO);
            }
            self.rbuf_bytes_avail -= self.rbuf_size >> 1;
            self.rbuf_free_offset += self.rbuf_size >> 1;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge = (self.remote_sge + 1) % self.remote_sgl.length;
        } else if self.post_msg(msg(OP_SGL, limit)).is_err() {
            self.fail(libc::EIO);
        }
    }

    pub(super) fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    fn fail(&mut self, e: c_int) {
        if self.state & S_CONNECTED != 0 {
            self.state = S_ERROR;
            self.err = e;
        }
    }

    // ---- completions ----

    /// rdma-core's rs_poll_cq: receives carry the peer's messages, send completions give back
    /// send queue entries and buffer space. A failed send ends the connection (EIO).
    pub(super) fn poll_cq(&mut self) -> Result<(), Errno> {
        if self.cq.is_null() {
            return Ok(());
        }
        let mut rcnt = 0u32;
        let mut wcs = [ffi::ibv_wc::default(); 16];
        // SAFETY: our CQ.
        let poll = unsafe { (*(*self.cq).context).ops.poll_cq.ok_or(Errno(libc::ENOSYS))? };
        'outer: loop {
            // SAFETY: our CQ and room for 16 completions.
            let n = unsafe { poll(self.cq, wcs.len() as c_int, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(Errno(libc::EIO));
            }
            for wc in &wcs[..n as usize] {
                if wc.wr_id & RECV_WR_FLAG != 0 {
                    if wc.status != ffi::IBV_WC_SUCCESS {
                        continue;
                    }
                    rcnt += 1;
                    if wc.wc_flags & ffi::IBV_WC_WITH_IMM == 0 {
                        continue;
                    }
                    // SAFETY: a completion with immediate data.
                    let m = u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data });
                    if self.received(m) {
                        break 'outer;
                    }
                } else {
                    let m = wc.wr_id as u32;
                    match msg_op(m) {
                        OP_SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                        OP_CTRL => {
                            self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                            if msg_data(m) == CTRL_DISCONNECT {
                                self.state = S_DISCONNECTED;
                            }
                        }
                        OP_IOMAP_SGL => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += IOMAP_LEN as u32;
                        }
                        _ => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += msg_data(m);
                        }
                    }
                    if wc.status != ffi::IBV_WC_SUCCESS {
                        self.fail(libc::EIO);
                    }
                }
            }
            if (n as usize) < wcs.len() {
                break;
            }
        }
        if self.state & S_CONNECTED != 0 {
            for _ in 0..rcnt {
                if let Err(Errno(e)) = self.post_recv() {
                    self.state = S_ERROR;
                    self.err = e;
                    return Err(Errno(e));
                }
            }
        }
        Ok(())
    }

    /// One message from the peer. Its fields are untrusted: a data length the receive buffer
    /// cannot hold ends the connection rather than read past the buffer. True when the
    /// connection is over (nothing more to take from the CQ for it).
    fn received(&mut self, m: u32) -> bool {
        match msg_op(m) {
            OP_SGL => self.sseq_comp = msg_data(m) as u16,
            OP_IOMAP_SGL | OP_WRITE => {}
            OP_CTRL => match msg_data(m) {
                CTRL_DISCONNECT => {
                    self.state = S_DISCONNECTED;
                    return true;
                }
                CTRL_SHUTDOWN => {
                    if self.state & S_WRITABLE != 0 {
                        self.state &= !S_READABLE;
                    } else {
                        self.state = S_DISCONNECTED;
                        return true;
                    }
                }
                _ => {}
            },
            OP_DATA => {
                let len = msg_data(m);
                let next = (self.rmsg_tail + 1) % self.rmsg.len();
                if len > self.rbuf_size || next == self.rmsg_head {
                    self.fail(libc::EPROTO);
                    return true;
                }
                self.rmsg[self.rmsg_tail] = (OP_DATA, len);
                self.rmsg_tail = next;
            }
            // Opcodes rdma-core reserves: ignored.
            _ => {}
        }
        false
    }

    // ---- tests the waits use ----

    pub(super) fn can_send(&self) -> bool {
        self.state & S_CONNECTED != 0
            && self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target(self.target_sge).length != 0
    }

    pub(super) fn conn_can_send(&self) -> bool {
        self.can_send() || self.state & S_WRITABLE == 0
    }

    pub(super) fn can_send_ctrl(&self) -> bool {
        self.ctrl_avail() || self.state & S_CONNECTED == 0
    }

    pub(super) fn have_rdata(&self) -> bool {
        self.rmsg_head != self.rmsg_tail
    }

    pub(super) fn conn_have_rdata(&self) -> bool {
        self.have_rdata() || self.state & S_READABLE == 0
    }

    pub(super) fn all_sends_done(&self) -> bool {
        (self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) as i32 + self.sqe_avail == self.sq_size as i32)
            || self.state & S_CONNECTED == 0
    }

    pub(super) fn is_armed(&self) -> bool {
        self.cq_armed
    }

    pub(super) fn any(&self) -> bool {
        true
    }

    fn arm(&mut self) {
        if self.cq.is_null() {
            return;
        }
        // SAFETY: our CQ.
        unsafe {
            if let Some(f) = (*(*self.cq).context).ops.req_notify_cq {
                f(self.cq, 0);
            }
        }
        self.cq_armed = true;
    }

    /// Copies received data into `dst` (rdma-core's rrecv inner loop, or rs_peek): from the
    /// receive ring, message by message. Returns the bytes copied.
    fn take(&mut self, dst: &mut Cursor<'_>, mut left: usize, peek: bool) -> usize {
        let want = left;
        let rbuf = self.rbuf.as_ref().expect("a connected rsocket has its receive buffer").ptr();
        let (mut head, mut off) = (self.rmsg_head, self.rbuf_offset);
        while left > 0 && head != self.rmsg_tail {
            let avail = self.rmsg[head].1 as usize;
            let mut rsize = if left < avail {
                if !peek {
                    self.rmsg[head].1 -= left as u32;
                }
                left
            } else {
                if !peek {
                    self.rseq_no = self.rseq_no.wrapping_add(1);
                }
                head = (head + 1) % self.rmsg.len();
                avail
            };
            left -= rsize;
            let end = (self.rbuf_size - off) as usize;
            if rsize > end {
                // SAFETY: within the receive buffer (off + end == rbuf_size).
                dst.write_from(unsafe { rbuf.add(off as usize) }, end);
                off = 0;
                rsize -= end;
                if !peek {
                    self.rbuf_bytes_avail += end as u32;
                }
            }
            // SAFETY: rsize <= rbuf_size - off: a message is never longer than the buffer
            // (checked on arrival), and the sender wrote it within one published half.
            dst.write_from(unsafe { rbuf.add(off as usize) }, rsize.min((self.rbuf_size - off) as usize));
            off += rsize as u32;
            if off >= self.rbuf_size {
                off = 0;
            }
            if !peek {
                self.rbuf_bytes_avail += rsize as u32;
            }
        }
        if !peek {
            self.rmsg_head = head;
            self.rbuf_offset = off;
        }
        want - left
    }
}

impl Stream {
    /// rdma-core's rs_process_cq: polls and retires completions until `test` holds; sleeps on
    /// the completion channel (and the CM channel, for a disconnect) when it may block.
    pub(super) fn process(&self, nonblock: bool, test: fn(&State) -> bool) -> Result<(), Errno> {
        loop {
            let (cq_fd, cm_fd) = {
                let mut st = lock(&self.st);
                st.update_credits();
                let r = st.poll_cq();
                if test(&st) {
                    st.update_credits();
                    return Ok(());
                }
                r?;
                if nonblock {
                    st.update_credits();
                    let cm = st.cm_nonblock;
                    drop(st);
                    // A program that only ever calls without blocking must still see the peer
                    // go (its CM's DISCONNECTED): rdma-core's connection service thread reads
                    // the CM channel for it; here the call does, when it has nothing else.
                    if cm && self.take_cm_events() {
                        continue;
                    }
                    return Err(Errno(libc::EAGAIN));
                }
                if !st.cq_armed {
                    st.arm();
                    continue;
                }
                st.update_credits();
                if st.channel.is_null() {
                    return Err(Errno(libc::ENOTCONN));
                }
                // SAFETY: our completion channel.
                (unsafe { (*st.channel).fd }, st.cm_nonblock.then_some(self.fd))
            };
            let _w = lock(&self.wait);
            if !lock(&self.st).cq_armed {
                continue;
            }
            let mut fds = vec![libc::pollfd { fd: cq_fd, events: libc::POLLIN, revents: 0 }];
            if let Some(fd) = cm_fd {
                fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
            }
            super::poll::block_on(&mut fds, defaults().wake_up_interval_ms)?;
            let mut woke = false;
            if fds[0].revents != 0 {
                woke |= self.take_cq_event();
            }
            if fds.len() > 1 && fds[1].revents != 0 {
                woke |= self.take_cm_events();
            }
            if woke {
                super::poll::notify_others();
            }
        }
    }

    /// rdma-core's rs_get_comp: spins for the configured polling time, then blocks.
    pub(super) fn get_comp(&self, nonblock: bool, test: fn(&State) -> bool) -> Result<(), Errno> {
        let start = Instant::now();
        let spin = Duration::from_micros(defaults().polling_time_us as u64);
        loop {
            match self.process(true, test) {
                Err(Errno(libc::EAGAIN)) if !nonblock => {}
                r => return r,
            }
            if start.elapsed() > spin {
                break;
            }
            std::hint::spin_loop();
        }
        self.process(false, test)
    }

    /// Takes the completion channel's event, if there is one. True if it took one.
    pub(super) fn take_cq_event(&self) -> bool {
        let st = lock(&self.st);
        if st.channel.is_null() {
            return false;
        }
        let (ch, cq) = (st.channel, st.cq);
        drop(st);
        let mut got = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: our non-blocking completion channel.
        if unsafe { (api().get_cq_event)(ch, &mut got, &mut ctx) } != 0 {
            return false;
        }
        // SAFETY: the event of our CQ.
        unsafe { (api().ack_cq_events)(cq, 1) };
        lock(&self.st).cq_armed = false;
        true
    }

    /// Reads the connection's CM events (the ID's channel is non-blocking once connected): a
    /// DISCONNECTED ends the connection as rdma-core's connection service does. True if any.
    pub(super) fn take_cm_events(&self) -> bool {
        if !lock(&self.st).cm_nonblock {
            return false;
        }
        let mut any = false;
        loop {
            let mut ev = std::ptr::null_mut();
            // SAFETY: our ID's own channel, non-blocking.
            if unsafe { crate::cma::for_rsockets::rdma_get_cm_event((*self.id).channel, &mut ev) } != 0 {
                return any;
            }
            any = true;
            // SAFETY: the event just read.
            let kind = unsafe { (*ev).event };
            if matches!(kind, crate::cma_ffi::RDMA_CM_EVENT_DISCONNECTED | crate::cma_ffi::RDMA_CM_EVENT_DEVICE_REMOVAL)
            {
                let mut st = lock(&self.st);
                if st.state & S_CONNECTED != 0 {
                    st.state = S_DISCONNECTED;
                }
            }
            // SAFETY: given back once.
            unsafe { crate::cma::for_rsockets::rdma_ack_cm_event(ev) };
        }
    }

    /// Waits while a background connect is in progress; EAGAIN for a non-blocking call.
    fn settle_connect(&self, flags: c_int) -> Result<(), Errno> {
        loop {
            let s = lock(&self.st).state;
            if s & S_OPENING == 0 {
                return match s {
                    S_INIT | S_BOUND | S_LISTENING => Err(Errno(libc::ENOTCONN)),
                    S_CONNECT_ERROR => Err(Errno(libc::ENOTCONN)),
                    _ => Ok(()),
                };
            }
            if self.nonblocking(flags) {
                return Err(Errno(libc::EAGAIN));
            }
            super::poll::block_on(
                &mut [libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(&self.wake),
                    events: libc::POLLIN,
                    revents: 0,
                }],
                100,
            )?;
        }
    }

    /// rsend/rsendv/rsendmsg (rdma-core's rsend): the data in chunks, each an RDMA WRITE WITH
    /// IMMEDIATE into the peer's published receive buffer, waiting for room and credits.
    pub(super) fn send(&self, iov: &Iov, flags: c_int) -> Result<usize, Errno> {
        self.settle_connect(flags)?;
        let len = iov.len();
        let nonblock = self.nonblocking(flags);
        if lock(&self.st).iomaps.pending() {
            self.send_iomaps(flags)?;
        }
        let mut src = Cursor::new(iov);
        let mut left = len;
        let mut olen = OLAP_START_SIZE;
        let mut err = None;
        while left > 0 {
            if !lock(&self.st).can_send() {
                if let Err(e) = self.get_comp(nonblock, State::conn_can_send) {
                    err = Some(e);
                    break;
                }
                let st = lock(&self.st);
                if st.state & S_WRITABLE == 0 {
                    err = Some(Errno(if st.shut_wr { libc::EPIPE } else { libc::ECONNRESET }));
                    break;
                }
                if !st.can_send() {
                    continue;
                }
            }
            let mut st = lock(&self.st);
            let mut xfer = if (olen as usize) < left {
                let x = olen;
                if olen < MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left as u32
            };
            xfer = xfer.min(st.sbuf_bytes_avail).min(st.target(st.target_sge).length);
            let inline = if xfer <= st.sq_inline as u32 { ffi::IBV_SEND_INLINE } else { 0 };
            let (mut sges, n) = st.stage(xfer, &mut src);
            if let Err(e) = st.write_data(&mut sges[..n], xfer, inline) {
                st.fail(libc::EIO);
                err = Some(e);
                break;
            }
            left -= xfer as usize;
        }
        match err {
            Some(e) if left == len => Err(e),
            _ => Ok(len - left),
        }
    }

    /// rrecv/rrecvv/rrecvmsg (rdma-core's rrecv): data already received, or the next to arrive;
    /// 0 once the peer has shut down and everything before was read.
    pub(super) fn recv(&self, iov: &Iov, flags: c_int) -> Result<usize, Errno> {
        self.settle_connect(flags)?;
        let len = iov.len();
        let nonblock = self.nonblocking(flags);
        let mut dst = Cursor::new(iov);
        let mut left = len;
        let mut err = None;
        loop {
            if !lock(&self.st).have_rdata() {
                if let Err(e) = self.get_comp(nonblock, State::conn_have_rdata) {
                    err = Some(e);
                    break;
                }
            }
            let mut st = lock(&self.st);
            if flags & libc::MSG_PEEK != 0 {
                left -= st.take(&mut dst, left, true);
                break;
            }
            left -= st.take(&mut dst, left, false);
            st.update_credits();
            if !(left > 0 && flags & libc::MSG_WAITALL != 0 && st.state & S_READABLE != 0) {
                break;
            }
        }
        match err {
            Some(e) if left == len => Err(e),
            _ => Ok(len - left),
        }
    }
}

/// `addr` of `len` bytes as a send's source.
pub(super) fn one(buf: *const c_void, len: usize) -> Iov {
    Iov { parts: vec![(buf as *mut u8, len)] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_the_opcode_in_the_top_three_bits() {
        assert_eq!(msg(OP_DATA, 4096), 0x0000_1000);
        assert_eq!(msg(OP_SGL, 384 + 7), 0x8000_0187);
        assert_eq!(msg(OP_IOMAP_SGL, 3), 0xC000_0003);
        assert_eq!(msg(OP_CTRL, CTRL_SHUTDOWN), 0xE000_0002);
        assert_eq!(msg_op(0xE000_0002), OP_CTRL);
        assert_eq!(msg_data(0x8000_0187), 391);
        // The data field is 29 bits: a larger value cannot reach the opcode.
        assert_eq!(msg(OP_DATA, u32::MAX), 0x1FFF_FFFF);
    }
}
