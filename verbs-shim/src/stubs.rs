//! Stub `libmlx5.so.1` and `libefa.so.1`: perftest links them directly, pyverbs' provider
//! bindings (imported by every pyverbs test module) and UCX's libuct_ib (under LD_BIND_NOW)
//! resolve all their functions at load time.
//! The device is neither a Mellanox nor an EFA device (its vendor id is not theirs), so programs
//! take the plain verbs path; if they call a direct-verbs function anyway, it fails cleanly:
//! NULL or EOPNOTSUPP, never a pretended success. The list is what those binaries import, with
//! each function's return kind taken from rdma-core's mlx5dv.h and efadv.h.

use std::ffi::c_void;

use crate::set_errno;

macro_rules! unsupported_ptr {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    )*};
}

macro_rules! unsupported_int {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> i32 {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

/// Functions that return nothing (destroy/free of objects that cannot exist here).
macro_rules! unsupported_void {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

/// Predicates: no device here is an mlx5 or EFA device, and none has their features.
macro_rules! unsupported_bool {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> bool {
            false
        }
    )*};
}

unsupported_ptr!(
    efadv_cq_from_ibv_cq_ex,
    efadv_create_cq,
    efadv_create_driver_qp,
    efadv_create_qp_ex,
    mlx5dv_alloc_var,
    mlx5dv_create_cq,
    mlx5dv_create_flow,
    mlx5dv_create_flow_action_packet_reformat,
    mlx5dv_create_flow_matcher,
    mlx5dv_create_mkey,
    mlx5dv_create_qp,
    mlx5dv_crypto_login_create,
    mlx5dv_dek_create,
    mlx5dv_devx_alloc_msi_vector,
    mlx5dv_devx_alloc_uar,
    mlx5dv_devx_create_eq,
    mlx5dv_devx_create_event_channel,
    mlx5dv_devx_obj_create,
    mlx5dv_devx_umem_reg,
    mlx5dv_devx_umem_reg_ex,
    mlx5dv_dm_map_op_addr,
    mlx5dv_dr_action_create_default_miss,
    mlx5dv_dr_action_create_dest_array,
    mlx5dv_dr_action_create_dest_devx_tir,
    mlx5dv_dr_action_create_dest_ib_port,
    mlx5dv_dr_action_create_dest_ibv_qp,
    mlx5dv_dr_action_create_dest_table,
    mlx5dv_dr_action_create_dest_vport,
    mlx5dv_dr_action_create_drop,
    mlx5dv_dr_action_create_flow_counter,
    mlx5dv_dr_action_create_flow_sampler,
    mlx5dv_dr_action_create_modify_header,
    mlx5dv_dr_action_create_packet_reformat,
    mlx5dv_dr_action_create_pop_vlan,
    mlx5dv_dr_action_create_push_vlan,
    mlx5dv_dr_action_create_tag,
    mlx5dv_dr_domain_create,
    mlx5dv_dr_matcher_create,
    mlx5dv_dr_rule_create,
    mlx5dv_dr_table_create,
    mlx5dv_get_vfio_device_list,
    mlx5dv_open_device,
    mlx5dv_pp_alloc,
    mlx5dv_qp_ex_from_ibv_qp_ex,
    mlx5dv_sched_leaf_create,
    mlx5dv_sched_node_create,
);

unsupported_int!(
    _mlx5dv_mkey_check,
    _mlx5dv_query_port,
    efadv_query_ah,
    efadv_query_device,
    mlx5dv_crypto_login,
    mlx5dv_crypto_login_destroy,
    mlx5dv_crypto_login_query,
    mlx5dv_crypto_login_query_state,
    mlx5dv_crypto_logout,
    mlx5dv_dci_stream_id_reset,
    mlx5dv_dek_destroy,
    mlx5dv_dek_query,
    mlx5dv_destroy_flow_matcher,
    mlx5dv_destroy_mkey,
    mlx5dv_devx_destroy_eq,
    mlx5dv_devx_free_msi_vector,
    mlx5dv_devx_general_cmd,
    mlx5dv_devx_obj_destroy,
    mlx5dv_devx_obj_modify,
    mlx5dv_devx_obj_query,
    mlx5dv_devx_qp_modify,
    mlx5dv_devx_qp_query,
    mlx5dv_devx_query_eqn,
    mlx5dv_devx_subscribe_devx_event,
    mlx5dv_devx_umem_dereg,
    mlx5dv_dr_action_destroy,
    mlx5dv_dr_domain_destroy,
    mlx5dv_dr_domain_sync,
    mlx5dv_dr_matcher_destroy,
    mlx5dv_dr_matcher_set_layout,
    mlx5dv_dr_rule_destroy,
    mlx5dv_dr_table_destroy,
    mlx5dv_dump_dr_domain,
    mlx5dv_get_clock_info,
    mlx5dv_init_obj,
    mlx5dv_map_ah_to_qp,
    mlx5dv_modify_qp_lag_port,
    mlx5dv_modify_qp_sched_elem,
    mlx5dv_modify_qp_udp_sport,
    mlx5dv_qp_cancel_posted_send_wrs,
    mlx5dv_query_device,
    mlx5dv_query_qp_lag_port,
    mlx5dv_reserved_qpn_alloc,
    mlx5dv_reserved_qpn_dealloc,
    mlx5dv_sched_leaf_destroy,
    mlx5dv_sched_leaf_modify,
    mlx5dv_sched_node_destroy,
    mlx5dv_sched_node_modify,
    mlx5dv_vfio_get_events_fd,
    mlx5dv_vfio_process_events,
);

unsupported_void!(
    mlx5dv_devx_destroy_event_channel,
    mlx5dv_devx_free_uar,
    mlx5dv_dr_domain_allow_duplicate_rules,
    mlx5dv_free_var,
    mlx5dv_pp_free,
);

unsupported_bool!(mlx5dv_is_supported,);

/// `ssize_t mlx5dv_devx_get_event(...)`: -1 with errno, as a read would fail.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_get_event() -> isize {
    set_errno(libc::EOPNOTSUPP);
    -1
}
