//! The librdmacm structures, C against Rust: compiles `tests/abi/rdmacm_layout.c` with `cc`
//! against the installed `rdma/rdma_cma.h`, runs it (it calls nothing: the shim need not be
//! built), and compares each size and field offset it prints with `size_of` / `offset_of!` of
//! the shim's `cma_ffi` types. Any line that differs, or that one side has and the other lacks,
//! fails the test.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use softrdma_verbs_shim::cma_ffi::*;

mod common;
use common::{compile_c, shim_dir, text};

/// `name size` for a structure, then `name.field offset` for each field; a field may name a
/// C member (`src_sin`, of an anonymous union) and the Rust path to it
/// (`__bindgen_anon_1.src_sin`) separately.
macro_rules! layout {
    ($out:ident, $ty:ident { $($cname:literal => $($rpath:ident).+),* $(,)? }) => {
        $out.push((stringify!($ty).to_string(), size_of::<$ty>()));
        $( $out.push((format!("{}.{}", stringify!($ty), $cname), offset_of!($ty, $($rpath).+))); )*
    };
    ($out:ident, $ty:ident { $($field:ident),* $(,)? }) => {
        $out.push((stringify!($ty).to_string(), size_of::<$ty>()));
        $( $out.push((format!("{}.{}", stringify!($ty), stringify!($field)), offset_of!($ty, $field))); )*
    };
}

/// The Rust side, in the C program's order.
fn rust_layout() -> Vec<(String, usize)> {
    let mut v = Vec::new();
    layout!(
        v,
        rdma_cm_id {
            verbs,
            channel,
            context,
            qp,
            route,
            ps,
            port_num,
            event,
            send_cq_channel,
            send_cq,
            recv_cq_channel,
            recv_cq,
            srq,
            pd,
            qp_type,
        }
    );
    layout!(v, rdma_cm_event {
        "id" => id,
        "listen_id" => listen_id,
        "event" => event,
        "status" => status,
        "param" => param,
        "param.conn" => param.conn,
        "param.ud" => param.ud,
    });
    layout!(
        v,
        rdma_conn_param {
            private_data,
            private_data_len,
            responder_resources,
            initiator_depth,
            flow_control,
            retry_count,
            rnr_retry_count,
            srq,
            qp_num,
        }
    );
    layout!(v, rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey });
    layout!(v, rdma_event_channel { fd });
    layout!(
        v,
        rdma_addrinfo {
            ai_flags,
            ai_family,
            ai_qp_type,
            ai_port_space,
            ai_src_len,
            ai_dst_len,
            ai_src_addr,
            ai_dst_addr,
            ai_src_canonname,
            ai_dst_canonname,
            ai_route_len,
            ai_route,
            ai_connect_len,
            ai_connect,
            ai_next,
        }
    );
    layout!(v, rdma_route { addr, path_rec, num_paths });
    layout!(v, rdma_addr {
        "src_addr" => __bindgen_anon_1.src_addr,
        "src_sin" => __bindgen_anon_1.src_sin,
        "src_sin6" => __bindgen_anon_1.src_sin6,
        "src_storage" => __bindgen_anon_1.src_storage,
        "dst_addr" => __bindgen_anon_2.dst_addr,
        "dst_sin" => __bindgen_anon_2.dst_sin,
        "dst_sin6" => __bindgen_anon_2.dst_sin6,
        "dst_storage" => __bindgen_anon_2.dst_storage,
        "addr" => addr,
        "addr.ibaddr" => addr.ibaddr,
    });
    layout!(v, rdma_ib_addr { sgid, dgid, pkey });
    layout!(
        v,
        ibv_sa_path_rec {
            dgid,
            sgid,
            dlid,
            slid,
            raw_traffic,
            flow_label,
            hop_limit,
            traffic_class,
            reversible,
            numb_path,
            pkey,
            sl,
            mtu_selector,
            mtu,
            rate_selector,
            rate,
            packet_life_time_selector,
            packet_life_time,
            preference,
        }
    );
    layout!(v, rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr });
    v
}

#[test]
fn rdmacm_structures_match_the_c_compiler() {
    let work = tempfile::Builder::new().prefix("softrdma-rdmacm-layout-").tempdir().expect("temp dir");
    let bin = compile_c(&shim_dir(), "rdmacm_layout", work.path());
    let out = Command::new(&bin).output().expect("run rdmacm_layout");
    assert!(out.status.success(), "rdmacm_layout failed:\n{}", text(&out));

    let mut c = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let (name, n) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line from rdmacm_layout: {line:?}"));
        let n: usize = n.parse().unwrap_or_else(|_| panic!("bad number from rdmacm_layout: {line:?}"));
        assert!(c.insert(name.to_string(), n).is_none(), "rdmacm_layout printed {name} twice");
    }
    let rust = rust_layout();

    let mut problems = Vec::new();
    for (name, r) in &rust {
        match c.remove(name) {
            Some(n) if n == *r => {}
            Some(n) => problems.push(format!("{name}: C says {n}, cma_ffi says {r}")),
            None => problems.push(format!("{name}: checked in Rust, not printed by rdmacm_layout.c")),
        }
    }
    for name in c.keys() {
        problems.push(format!("{name}: printed by rdmacm_layout.c, not checked in Rust"));
    }
    assert!(problems.is_empty(), "librdmacm layout differs:\n{}", problems.join("\n"));
    assert!(rust.len() > 90, "only {} lines compared", rust.len());
}
