//! Addresses and routes: `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route`, the path
//! records librdmacm shows and takes (RDMA_OPTION_IB_PATH).

// The C types differ in width between the bindings of verbs.h and rdma_cma.h on other targets;
// the casts stay explicit.
#![allow(clippy::unnecessary_cast)]

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use softrdma_device::proto::{Request, Response};
use softrdma_engine::cm::PS_IPOIB;

use super::event::{ADDR_ERROR, ADDR_RESOLVED, ROUTE_ERROR};
use super::id::{complete, first, id_mut, place, post_local, route_resolved, set_route_addrs};
use super::qp::default_pd;
use super::{cm_call, cma, id_of, lock, ports, sockaddr_from, Id};
use crate::cma_ffi as c;
use crate::{ffi, minus1_call, Errno, EINVAL};

fn route_source(dst: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = crate::ksock::udp_bind(any).ok()?;
    let mut d = dst;
    if d.port() == 0 {
        d.set_port(9);
    }
    s.connect(d).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// An ID bound to `ip` belongs to no device: the wildcard, or a loopback address no device holds.
pub(super) fn unattached(cma: &super::Cma, ip: IpAddr) -> bool {
    ip.is_unspecified() || (ip.is_loopback() && cma.dev_by_addr(ip).is_none())
}

/// Why an address has no device, as the kernel's rdma_bind_addr says it: an address of no
/// interface fails in cma_translate_addr (EADDRNOTAVAIL); an address of an interface without an
/// RDMA device (eth0's address with no device on it) fails in cma_acquire_dev_by_src_ip (ENODEV).
fn no_device(ip: IpAddr) -> Errno {
    if crate::ksock::udp_bind(SocketAddr::new(ip, 0)).is_ok() {
        Errno(libc::ENODEV)
    } else {
        Errno(libc::EADDRNOTAVAIL)
    }
}

pub(super) fn bind_inner(id: &Id, cid: &mut c::rdma_cm_id, addr: SocketAddr) -> Result<(), Errno> {
    let cma = cma()?;
    let mut st = lock(&id.st);
    if st.bound.is_some() {
        return Err(EINVAL);
    }
    // The kernel binds only to an address of an RDMA device, the wildcard, or a loopback
    // address: that one binds without a device, like the wildcard (measured against rxe:
    // examples/c/cm_bind_probe.c in conformance/interop/rxe.sh; libfabric's verbs provider binds
    // "localhost" and then takes its source addresses from the devices).
    let dev = if unattached(cma, addr.ip()) {
        None
    } else {
        Some(cma.dev_by_addr(addr.ip()).ok_or_else(|| no_device(addr.ip()))?)
    };
    if dev.is_some() && st.ps == PS_IPOIB {
        // cma_acquire_dev_by_src_ip: an RDMA_PS_IPOIB ID takes only an IPoIB (InfiniBand link
        // layer) address; a RoCE device's address is EINVAL.
        return Err(EINVAL);
    }
    let (res, port) = ports::reserve(st.ps, addr)?;
    let bound = SocketAddr::new(addr.ip(), port);
    st.bound = Some(bound);
    st.port_lock = Some(res);
    if let Some(d) = dev {
        let p = place(id, &mut st, &d)?;
        cm_call(&p.dev, &Request::CmSetAddrs { id: p.id, local: Some(bound), remote: None, tos: st.tos }, &[])?;
        cid.verbs = d.verbs;
        // librdmacm's ucma_get_device: an ID on a device gets the device's default PD.
        if cid.pd.is_null() {
            cid.pd = default_pd(&d)? as _;
        }
    }
    set_route_addrs(cid, Some(bound), None);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut c::rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let a = sockaddr_from(addr).ok_or(EINVAL)?;
        bind_inner(i, id_mut(id)?, a)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut c::rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let cid = id_mut(id)?;
        let dst = sockaddr_from(dst_addr).ok_or(EINVAL)?;
        let cma = cma()?;
        let src = sockaddr_from(src_addr);
        if lock(&i.st).ps == PS_IPOIB && src.is_none_or(|s| s.ip().is_unspecified()) {
            // The kernel binds the ID to the wildcard and, the address resolved, fails to take a
            // RoCE device for it (cma_acquire_dev_by_src_ip: EINVAL for RDMA_PS_IPOIB off an
            // IPoIB netdev): ADDR_ERROR with status -EINVAL. (With a source address given, the
            // bind itself fails: EINVAL from this call.)
            if lock(&i.st).bound.is_none() {
                bind_inner(i, cid, SocketAddr::new(softrdma_engine::cm::unspecified_like(dst.ip()), 0))?;
            }
            let st = lock(&i.st);
            post_local(i, &st, ADDR_ERROR, -libc::EINVAL)?;
            drop(st);
            complete(id)?;
            return Ok(0);
        }
        if lock(&i.st).bound.is_none() {
            // The source: the one given, else the address the host's routing picks for the
            // destination; when that address has no device but the destination is a device's
            // own address, that device (the kernel loops a local RDMA address back through it).
            let ip = match src {
                Some(s) if !s.ip().is_unspecified() => Some(s.ip()),
                _ => route_source(dst),
            };
            let dev_ip = match ip {
                Some(ip) if cma.dev_by_addr(ip).is_some() => Some(ip),
                _ if cma.dev_by_addr(dst.ip()).is_some() => Some(dst.ip()),
                _ => None,
            };
            let Some(dev_ip) = dev_ip else {
                eprintln!(
                    "softrdma: rdma_resolve_addr: no softrdma device on {} (the route to {} leaves from it); start one with `softrdma up NAME --addr ADDR`",
                    ip.map_or("any address".to_owned(), |i| i.to_string()),
                    dst.ip()
                );
                let st = lock(&i.st);
                post_local(i, &st, ADDR_ERROR, -libc::ENODEV)?;
                drop(st);
                complete(id)?;
                return Ok(0);
            };
            bind_inner(i, cid, SocketAddr::new(dev_ip, src.map_or(0, |s| s.port())))?;
        }
        let mut st = lock(&i.st);
        let bound = st.bound.ok_or(EINVAL)?;
        let dev = match cma.dev_by_addr(bound.ip()) {
            Some(d) => d,
            None => {
                // Bound to the wildcard: the routing picks the device now.
                let ip = route_source(dst).filter(|ip| cma.dev_by_addr(*ip).is_some()).unwrap_or(dst.ip());
                cma.dev_by_addr(ip).ok_or(Errno(libc::ENODEV))?
            }
        };
        let local = SocketAddr::new(dev.addr, bound.port());
        let p = place(i, &mut st, &dev)?;
        cm_call(&p.dev, &Request::CmSetAddrs { id: p.id, local: Some(local), remote: Some(dst), tos: st.tos }, &[])?;
        st.remote = Some(dst);
        st.addr_resolved = true;
        cid.verbs = dev.verbs;
        if cid.pd.is_null() {
            cid.pd = default_pd(&dev)? as _;
        }
        set_route_addrs(cid, Some(local), Some(dst));
        post_local(i, &st, ADDR_RESOLVED, 0)?;
        drop(st);
        complete(id)?;
        Ok(0)
    })
}

/// The address vector toward a UD peer as the kernel makes it from a RoCE path
/// (ib_init_ah_attr_from_path): global, the peer's GID, the path's hop limit, traffic class and
/// flow label, GID index 0 of port 1.
pub(super) fn ud_ah_attr(local: SocketAddr, remote: SocketAddr, tos: u8) -> ffi::ibv_ah_attr {
    let r = path_record(local, remote, tos, 0);
    let mut a = ffi::ibv_ah_attr { is_global: 1, port_num: 1, sl: r.sl, ..Default::default() };
    a.grh.dgid.raw = softrdma_device::proto::gid_of(remote.ip());
    a.grh.hop_limit = r.hop_limit;
    a.grh.traffic_class = r.traffic_class;
    a.grh.flow_label = u32::from_be(r.flow_label);
    a.grh.sgid_index = 0;
    a
}

pub(super) fn path_record(local: SocketAddr, remote: SocketAddr, tos: u8, mtu: u8) -> c::ibv_sa_path_rec {
    // SAFETY: ibv_sa_path_rec is plain integers and GIDs (byte arrays): all-zero is valid.
    let mut r: c::ibv_sa_path_rec = unsafe { std::mem::zeroed() };
    r.sgid.raw = softrdma_device::proto::gid_of(local.ip());
    r.dgid.raw = softrdma_device::proto::gid_of(remote.ip());
    r.pkey = 0xffffu16.to_be();
    r.hop_limit = 64;
    r.traffic_class = tos;
    r.flow_label = softrdma_engine::cm::flow_label(local.port(), remote.port()).to_be();
    r.mtu = mtu;
    r.mtu_selector = 2;
    r.rate_selector = 2;
    r.packet_life_time = 18;
    r.packet_life_time_selector = 2;
    r.reversible = 1;
    r.numb_path = 1;
    r.sl = 0;
    r
}

/// The `ibv_sa_path_rec` librdmacm shows for a route.
pub(super) fn path_record_of(r: &softrdma_engine::cm::Route) -> c::ibv_sa_path_rec {
    // SAFETY: a plain C struct; zero is a valid value of every field.
    let mut p: c::ibv_sa_path_rec = unsafe { std::mem::zeroed() };
    p.sgid.raw = r.sgid;
    p.dgid.raw = r.dgid;
    p.pkey = 0xffffu16.to_be();
    p.hop_limit = r.hop_limit;
    p.traffic_class = r.traffic_class;
    p.flow_label = r.flow_label.to_be();
    p.sl = r.sl;
    p.mtu = r.mtu;
    p.mtu_selector = 2;
    p.rate = r.rate;
    p.rate_selector = 2;
    p.packet_life_time = r.packet_life_time;
    p.packet_life_time_selector = 2;
    p.reversible = 1;
    p.numb_path = 1;
    p
}

/// `struct ibv_path_data` (infiniband/sa.h): flags, reserved, then a 64-byte `struct
/// ibv_path_record` in SA wire format.
const PATH_DATA_LEN: usize = 72;
/// IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL: the one entry the
/// kernel takes (ucma_set_ib_path).
const PATH_FLAGS_PRIMARY_GMP: u32 = 1 | 2 | (8 | 32);

/// RDMA_OPTION_IB_PATH's records: the primary, bidirectional GMP one as a route, or EINVAL
/// (ucma_set_ib_path: a length that is not a whole number of records, or no such record).
pub(super) fn route_from_path_data(data: &[u8]) -> Result<softrdma_engine::cm::Route, Errno> {
    if data.is_empty() || data.len() % PATH_DATA_LEN != 0 {
        return Err(EINVAL);
    }
    let rec = data
        .chunks_exact(PATH_DATA_LEN)
        .find(|d| u32::from_ne_bytes([d[0], d[1], d[2], d[3]]) == PATH_FLAGS_PRIMARY_GMP)
        .ok_or(EINVAL)?;
    let p = &rec[8..];
    let gid = |o: usize| -> [u8; 16] { p[o..o + 16].try_into().expect("16 bytes") };
    let fl_hop = u32::from_be_bytes([p[44], p[45], p[46], p[47]]);
    Ok(softrdma_engine::cm::Route {
        dgid: gid(8),
        sgid: gid(24),
        flow_label: (fl_hop >> 8) & 0xf_ffff,
        hop_limit: fl_hop as u8,
        traffic_class: p[48],
        sl: (u16::from_be_bytes([p[52], p[53]]) & 0xf) as u8,
        mtu: p[54] & 0x3f,
        rate: p[55] & 0x3f,
        packet_life_time: p[56] & 0x3f,
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut c::rdma_cm_id, _timeout_ms: c_int) -> c_int {
    minus1_call(|| {
        let i = id_of(id)?;
        let st = lock(&i.st);
        // rdma_resolve_route: ADDR_RESOLVED -> ROUTE_QUERY, else EINVAL (once routed, again).
        if !st.addr_resolved || st.route_resolved {
            return Err(EINVAL);
        }
        let p = first(&st)?;
        // RoCE has no SA: the device builds the path record from the routing and neighbour
        // tables as the kernel's cma_resolve_iboe_route does, or takes it from its path cache.
        let route = match cm_call(&p.dev, &Request::CmResolveRoute(p.id), &[]) {
            Ok(Response::CmRoute { route, .. }) => route,
            Ok(_) => return Err(Errno(libc::EPROTO)),
            Err(Errno(e)) if e == libc::EINVAL || e == libc::ENOENT => return Err(Errno(e)),
            Err(Errno(e)) => {
                // No route to the destination: the route step fails as the kernel's work
                // handler fails it (RDMA_CM_EVENT_ROUTE_ERROR with the error).
                post_local(i, &st, ROUTE_ERROR, -e)?;
                drop(st);
                complete(id)?;
                return Ok(0);
            }
        };
        let mut rec = Box::new(path_record_of(&route));
        if let Some(t) = st.ack_timeout {
            rec.packet_life_time = t.saturating_sub(1);
        }
        route_resolved(id, i, st, rec)?;
        Ok(0)
    })
}
