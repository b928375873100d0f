//! A datagram rsocket's UD QPs: one per local address, with its CQ, buffers and posted
//! receives, and the address handles to the peers (rdma-core's ds_create_qp, udp_svc_create_ah).

use std::ffi::c_int;
use std::net::SocketAddr;

use super::wire::{ds_header, to_c, GRH_LEN, RECV_FLAG};
use super::{last, Dgram};
use crate::cma::for_rsockets::*;
use crate::cma::{api, lock};
use crate::cma_ffi as c;
use crate::ffi;
use crate::rsocket::config::SNDLOWAT;
use crate::rsocket::data::Region;
use crate::rsocket::stream::set_nonblock;
use crate::Errno;

/// Page-aligned memory without a registration of its own (the send buffer, registered once
/// per QP).
pub(super) struct Mem {
    pub(super) ptr: *mut u8,
    pub(super) layout: std::alloc::Layout,
}

impl Mem {
    pub(super) fn new(len: usize) -> Result<Mem, Errno> {
        let layout = std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(4096), 4096)
            .map_err(|_| Errno(libc::ENOMEM))?;
        // SAFETY: a non-zero layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        Ok(Mem { ptr, layout })
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// One UD QP of the socket, for one local address.
pub(super) struct DsQp {
    pub(super) id: *mut c::rdma_cm_id,
    pub(super) local: SocketAddr,
    pub(super) hdr: Vec<u8>,
    pub(super) channel: *mut ffi::ibv_comp_channel,
    pub(super) cq: *mut ffi::ibv_cq,
    pub(super) qp: *mut ffi::ibv_qp,
    pub(super) rbuf: Option<Region>,
    pub(super) smr: *mut ffi::ibv_mr,
    /// The address handle to this QP itself (for data that arrived over UDP).
    pub(super) self_ah: *mut ffi::ibv_ah,
    pub(super) cq_armed: bool,
}

impl Drop for DsQp {
    fn drop(&mut self) {
        let api = api();
        // SAFETY: our objects; the QP first, so nothing lands in the buffers after.
        unsafe {
            if !self.qp.is_null() {
                rdma_destroy_qp(self.id);
            }
            if !self.self_ah.is_null() {
                (api.destroy_ah)(self.self_ah);
            }
            self.rbuf = None;
            if !self.smr.is_null() {
                (api.dereg_mr)(self.smr);
            }
            crate::rsocket::stream::destroy_cq_and_id(self.id, self.cq, self.channel);
        }
    }
}

impl Dgram {
    /// rdma-core's ds_create_qp: an rdma_cm ID of the UDP port space bound to the local address,
    /// its UD QP with a CQ and completion channel, the receive buffer, the posted receives.
    pub(super) fn create_qp(&self, src: SocketAddr) -> Result<usize, Errno> {
        let api = api();
        let mut id = std::ptr::null_mut();
        // SAFETY: a synchronous ID.
        if unsafe { rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), c::RDMA_PS_UDP) } != 0 {
            return Err(last());
        }
        let mut q = DsQp {
            id,
            local: src,
            hdr: ds_header(&src),
            channel: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            rbuf: None,
            smr: std::ptr::null_mut(),
            self_ah: std::ptr::null_mut(),
            cq_armed: false,
        };
        let ca = to_c(&src);
        // SAFETY: our ID and an address.
        if unsafe { rdma_bind_addr(id, ca.as_ptr() as *mut _) } != 0 {
            return Err(last());
        }
        let (sq, rq, inline, rbuf_size, sbuf_ptr, sbuf_size) = {
            let st = lock(&self.st);
            let m = st.sbuf.as_ref().ok_or(Errno(libc::EINVAL))?;
            (st.sq_size, st.rq_size, st.sq_inline, st.rbuf_size, m.ptr, st.sbuf_size)
        };
        // SAFETY: verbs calls on the ID's context; each object is kept in `q` (Drop frees).
        unsafe {
            let (verbs, pd) = crate::rsocket::ctx::data_context((*id).verbs)?;
            q.channel = (api.create_comp_channel)(verbs);
            if q.channel.is_null() {
                return Err(last());
            }
            set_nonblock((*q.channel).fd);
            q.cq = (api.create_cq)(verbs, sq as c_int + rq as c_int, id.cast(), q.channel, 0);
            if q.cq.is_null() {
                return Err(last());
            }
            (*id).recv_cq_channel = q.channel;
            (*id).send_cq_channel = q.channel;
            (*id).recv_cq = q.cq;
            (*id).send_cq = q.cq;
            let mut qa = ffi::ibv_qp_init_attr {
                qp_context: id.cast(),
                send_cq: q.cq,
                recv_cq: q.cq,
                qp_type: ffi::IBV_QPT_UD,
                sq_sig_all: 1,
                cap: ffi::ibv_qp_cap {
                    max_send_wr: sq as u32,
                    max_recv_wr: rq as u32,
                    max_send_sge: 1,
                    max_recv_sge: 2,
                    max_inline_data: inline as u32,
                },
                ..Default::default()
            };
            if rdma_create_qp(id, pd, &mut qa) != 0 {
                return Err(last());
            }
            q.qp = (*id).qp;
            lock(&self.st).sq_inline = qa.cap.max_inline_data.min(u16::MAX as u32) as u16;
            q.rbuf = Some(Region::new(pd, rbuf_size as usize + GRH_LEN, ffi::IBV_ACCESS_LOCAL_WRITE)?);
            q.smr = (api.reg_mr)(pd, sbuf_ptr.cast(), sbuf_size as usize, ffi::IBV_ACCESS_LOCAL_WRITE as c_int);
            if q.smr.is_null() {
                return Err(last());
            }
        }
        q.self_ah = self.make_ah(&q, src)?;
        for i in 0..rq as u32 {
            post_recv(&q, rbuf_size, i * SNDLOWAT)?;
        }
        let mut st = lock(&self.st);
        st.qps.push(q);
        Ok(st.qps.len() - 1)
    }

    /// An address handle on `q`'s device to `to`, from the path rdma_cm resolves (rdma-core's
    /// udp_svc_create_ah). RoCE needs the GRH: the path's GIDs, and the source GID's index.
    pub(super) fn make_ah(&self, q: &DsQp, to: SocketAddr) -> Result<*mut ffi::ibv_ah, Errno> {
        let api = api();
        let mut id = std::ptr::null_mut();
        // SAFETY: a synchronous ID, destroyed below.
        if unsafe { rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), c::RDMA_PS_UDP) } != 0 {
            return Err(last());
        }
        let src = to_c(&SocketAddr::new(q.local.ip(), 0));
        let dst = to_c(&to);
        // SAFETY: our temporary ID; addresses; its path once resolved.
        let r = unsafe {
            (|| {
                if rdma_resolve_addr(id, src.as_ptr() as *mut _, dst.as_ptr() as *mut _, 2000) != 0 {
                    return Err(last());
                }
                if rdma_resolve_route(id, 2000) != 0 {
                    return Err(last());
                }
                let p = (*id).route.path_rec;
                if p.is_null() {
                    return Err(Errno(libc::EHOSTUNREACH));
                }
                let p = &*p;
                let verbs = (*q.id).verbs;
                let port = (*q.id).port_num;
                let mut sgid_index = 0u8;
                for i in 0..16 {
                    let mut g = ffi::ibv_gid::default();
                    if (api.query_gid)(verbs, port, i, &mut g) == 0 && g.raw == p.sgid.raw {
                        sgid_index = i as u8;
                        break;
                    }
                }
                let mut a = ffi::ibv_ah_attr {
                    is_global: 1,
                    grh: ffi::ibv_global_route {
                        dgid: p.dgid,
                        flow_label: u32::from_be(p.flow_label),
                        sgid_index,
                        hop_limit: p.hop_limit.max(1),
                        traffic_class: p.traffic_class,
                    },
                    dlid: u16::from_be(p.dlid),
                    sl: p.sl,
                    static_rate: p.rate,
                    port_num: port,
                    ..Default::default()
                };
                let ah = (api.create_ah)((*q.id).pd, &mut a);
                if ah.is_null() {
                    return Err(last());
                }
                Ok(ah)
            })()
        };
        // SAFETY: the temporary ID.
        unsafe { rdma_destroy_id(id) };
        r
    }
}

/// A receive of one datagram slot: the GRH into the buffer's tail, the datagram at `off`.
pub(super) fn post_recv(q: &DsQp, rbuf_size: u32, off: u32) -> Result<(), Errno> {
    let rb = q.rbuf.as_ref().expect("made with the QP");
    let mut sges = [
        ffi::ibv_sge { addr: rb.addr() + rbuf_size as u64, length: GRH_LEN as u32, lkey: rb.lkey() },
        ffi::ibv_sge { addr: rb.addr() + off as u64, length: SNDLOWAT, lkey: rb.lkey() },
    ];
    let mut wr = ffi::ibv_recv_wr {
        wr_id: RECV_FLAG | off as u64,
        sg_list: sges.as_mut_ptr(),
        num_sge: 2,
        ..Default::default()
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: our QP; the request lives across the call.
    let r = unsafe { ((*(*q.qp).context).ops.post_recv.ok_or(Errno(libc::ENOSYS))?)(q.qp, &mut wr, &mut bad) };
    if r != 0 {
        return Err(Errno(r));
    }
    Ok(())
}
