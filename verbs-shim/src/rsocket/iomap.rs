//! Iomapped buffers (riomap, riounmap, riowrite): zero-copy transfers into a buffer the peer
//! mapped. The mapping side writes an `rs_iomap` entry (offset, then the buffer's address, rkey
//! and length: 24 bytes) into the peer's target iomap with an "iomap updated" message; the
//! writing side then RDMA WRITEs into the buffer directly (rdma-core's protocol).

use std::ffi::{c_int, c_void};

use super::data::{msg, State, IOMAP_LEN, OP_IOMAP_SGL, OP_WRITE, SGE_LEN};
use super::stream::{Stream, SGL_SIZE, S_WRITABLE};
use super::{Cursor, Iov};
use crate::cma::{api, lock};
use crate::ffi;
use crate::Errno;

struct IoMr {
    offset: u64,
    mr: *mut ffi::ibv_mr,
    /// The entry of the peer's target iomap it is published in; None for a local mapping.
    index: Option<u32>,
}

#[derive(Default)]
pub(crate) struct Maps {
    /// Mappings published (or local).
    list: Vec<IoMr>,
    /// Mappings to publish with the next send.
    queue: std::collections::VecDeque<IoMr>,
    /// Entries of the peer's target iomap in use.
    used: Vec<bool>,
}

impl Maps {
    pub(super) fn pending(&self) -> bool {
        !self.queue.is_empty()
    }

    pub(super) fn release(&mut self) {
        for m in self.list.drain(..).chain(self.queue.drain(..)) {
            // SAFETY: our MR.
            unsafe { (api().dereg_mr)(m.mr) };
        }
    }
}

impl State {
    /// Entry `i` of our target iomap (the peer writes it).
    fn target_iomap(&self, i: usize) -> (u64, u64, u32, u32) {
        let t = self.target.as_ref().expect("a connected rsocket has its target iomap");
        let p = t.ptr().wrapping_add(SGE_LEN * SGL_SIZE as usize + i * IOMAP_LEN);
        // SAFETY: entry i < target_iomap_size of our target region; volatile (the peer writes).
        unsafe {
            (
                std::ptr::read_volatile(p as *const u64),
                std::ptr::read_volatile(p.add(8) as *const u64),
                std::ptr::read_volatile(p.add(16) as *const u32),
                std::ptr::read_volatile(p.add(20) as *const u32),
            )
        }
    }

    /// The target iomap entry that covers `offset`: (offset, addr, rkey, length).
    fn find_iomap(&self, offset: u64) -> Option<(u64, u64, u32, u32)> {
        (0..self.target_iomap_size as usize)
            .map(|i| self.target_iomap(i))
            .find(|&(o, _, _, len)| len != 0 && offset >= o && offset < o.wrapping_add(len as u64))
    }
}

impl Stream {
    /// riomap: registers `buf` for the peer to write (PROT_WRITE), published with the next
    /// send, or for local use only. `offset` -1 maps it at its own address.
    pub(super) fn iomap(
        &self,
        buf: *mut c_void,
        len: usize,
        prot: c_int,
        _flags: c_int,
        offset: libc::off_t,
    ) -> Result<i64, Errno> {
        let mut st = lock(&self.st);
        if st.pd.is_null() || prot & !libc::PROT_WRITE != 0 {
            return Err(Errno(libc::EINVAL));
        }
        let mut access = ffi::IBV_ACCESS_LOCAL_WRITE;
        let index = if prot & libc::PROT_WRITE != 0 {
            let n = st.remote_iomap.length as usize;
            if st.iomaps.used.len() < n {
                st.iomaps.used.resize(n, false);
            }
            let i = st.iomaps.used.iter().position(|u| !u).ok_or(Errno(libc::ENOMEM))?;
            access |= ffi::IBV_ACCESS_REMOTE_WRITE;
            Some(i as u32)
        } else {
            None
        };
        // SAFETY: our PD; the program's buffer of `len` bytes.
        let mr = unsafe { (api().reg_mr)(st.pd, buf, len, access as c_int) };
        if mr.is_null() {
            return Err(Errno(crate::last_errno()));
        }
        let offset = if offset == -1 { buf as u64 } else { offset as u64 };
        let m = IoMr { offset, mr, index };
        match index {
            Some(i) => {
                st.iomaps.used[i as usize] = true;
                st.iomaps.queue.push_back(m);
            }
            None => st.iomaps.list.push(m),
        }
        Ok(offset as i64)
    }

    pub(super) fn iounmap(&self, buf: *mut c_void, len: usize) -> Result<(), Errno> {
        let mut st = lock(&self.st);
        // SAFETY: our MRs.
        let same = |m: &IoMr| unsafe { (*m.mr).addr == buf && (*m.mr).length == len };
        let m = if let Some(p) = st.iomaps.list.iter().position(same) {
            st.iomaps.list.remove(p)
        } else if let Some(p) = st.iomaps.queue.iter().position(same) {
            st.iomaps.queue.remove(p).expect("found")
        } else {
            return Err(Errno(libc::EINVAL));
        };
        if let Some(i) = m.index {
            if let Some(u) = st.iomaps.used.get_mut(i as usize) {
                *u = false;
            }
        }
        // SAFETY: our MR.
        unsafe { (api().dereg_mr)(m.mr) };
        Ok(())
    }

    /// Publishes the queued mappings (rdma-core's rs_send_iomaps).
    pub(super) fn send_iomaps(&self, flags: c_int) -> Result<(), Errno> {
        let nonblock = self.nonblocking(flags);
        loop {
            if !lock(&self.st).iomaps.pending() {
                return Ok(());
            }
            if !lock(&self.st).can_send() {
                self.get_comp(nonblock, State::conn_can_send)?;
                if lock(&self.st).state & S_WRITABLE == 0 {
                    return Err(Errno(libc::ECONNRESET));
                }
                continue;
            }
            let mut st = lock(&self.st);
            let Some(m) = st.iomaps.queue.pop_front() else { return Ok(()) };
            let index = m.index.expect("queued mappings are published ones");
            // SAFETY: our MR.
            let (addr, length, rkey) = unsafe { ((*m.mr).addr as u64, (*m.mr).length as u32, (*m.mr).rkey) };
            let mut e = [0u8; IOMAP_LEN];
            let (o, a, k, l) = if st.swap_sgl {
                (m.offset.swap_bytes(), addr.swap_bytes(), rkey.swap_bytes(), length.swap_bytes())
            } else {
                (m.offset, addr, rkey, length)
            };
            e[0..8].copy_from_slice(&o.to_ne_bytes());
            e[8..16].copy_from_slice(&a.to_ne_bytes());
            e[16..20].copy_from_slice(&k.to_ne_bytes());
            e[20..24].copy_from_slice(&l.to_ne_bytes());
            st.sseq_no = st.sseq_no.wrapping_add(1);
            st.sqe_avail -= 1;
            st.sbuf_bytes_avail -= IOMAP_LEN as u32;
            let at = st.remote_iomap.addr.wrapping_add(index as u64 * IOMAP_LEN as u64);
            let key = st.remote_iomap.key;
            let r = if st.sq_inline as usize >= IOMAP_LEN {
                let mut sge = ffi::ibv_sge { addr: e.as_ptr() as u64, length: IOMAP_LEN as u32, lkey: 0 };
                st.post_write_msg(
                    std::slice::from_mut(&mut sge),
                    msg(OP_IOMAP_SGL, index),
                    ffi::IBV_SEND_INLINE,
                    at,
                    key,
                )
            } else {
                let iov = super::data::one(e.as_ptr().cast(), IOMAP_LEN);
                let (mut sges, n) = st.stage(IOMAP_LEN as u32, &mut Cursor::new(&iov));
                st.post_write_msg(&mut sges[..n], msg(OP_IOMAP_SGL, index), 0, at, key)
            };
            st.iomaps.list.push(m);
            r?;
        }
    }

    /// riowrite: `count` bytes straight into the peer's mapped buffer at `offset` (RDMA WRITEs
    /// without immediate: the peer's application learns of them through its own protocol).
    pub(super) fn iowrite(
        &self,
        buf: *const c_void,
        count: usize,
        offset: libc::off_t,
        flags: c_int,
    ) -> Result<usize, Errno> {
        let nonblock = self.nonblocking(flags);
        if lock(&self.st).iomaps.pending() {
            self.send_iomaps(flags)?;
        }
        let iov: Iov = super::data::one(buf, count);
        let mut src = Cursor::new(&iov);
        let (mut left, mut offset) = (count, offset as u64);
        let mut olen = 2048u32;
        let mut iom: Option<(u64, u64, u32, u32)> = None;
        let mut err = None;
        while left > 0 {
            if iom.is_none_or(|(o, _, _, l)| offset >= o + l as u64) {
                iom = lock(&self.st).find_iomap(offset);
                if iom.is_none() {
                    break;
                }
            }
            let (io, ia, ik, il) = iom.expect("found above");
            if !lock(&self.st).can_send() {
                if let Err(e) = self.get_comp(nonblock, State::conn_can_send) {
                    err = Some(e);
                    break;
                }
                if lock(&self.st).state & S_WRITABLE == 0 {
                    err = Some(Errno(libc::ECONNRESET));
                    break;
                }
                continue;
            }
            let mut st = lock(&self.st);
            let mut xfer = if (olen as usize) < left {
                let x = olen;
                if olen < 65536 {
                    olen <<= 1;
                }
                x
            } else {
                left as u32
            };
            xfer = xfer.min(st.sbuf_bytes_avail).min((io + il as u64 - offset) as u32);
            let inline = if xfer <= st.sq_inline as u32 { ffi::IBV_SEND_INLINE } else { 0 };
            let (mut sges, n) = st.stage(xfer, &mut src);
            st.sqe_avail -= 1;
            st.sbuf_bytes_avail -= xfer;
            let at = ia.wrapping_add(offset - io);
            if let Err(e) = st.post_write(&mut sges[..n], msg(OP_WRITE, xfer), inline, at, ik) {
                err = Some(e);
                break;
            }
            left -= xfer as usize;
            offset += xfer as u64;
        }
        match err {
            Some(e) if left == count => Err(e),
            _ => Ok(count - left),
        }
    }
}
