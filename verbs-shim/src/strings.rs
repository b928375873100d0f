//! The `*_str` helpers and the rate conversions of libibverbs (pure functions of their
//! arguments). The verbs that have no meaning on this device are in `unsupported.rs`.

use std::ffi::{c_char, c_int};

use crate::ffi;

macro_rules! cstr {
    ($s:expr) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: ffi::ibv_wc_status) -> *const c_char {
    match status {
        ffi::IBV_WC_SUCCESS => cstr!("success"),
        ffi::IBV_WC_LOC_LEN_ERR => cstr!("local length error"),
        ffi::IBV_WC_LOC_QP_OP_ERR => cstr!("local QP operation error"),
        ffi::IBV_WC_LOC_EEC_OP_ERR => cstr!("local EE context operation error"),
        ffi::IBV_WC_LOC_PROT_ERR => cstr!("local protection error"),
        ffi::IBV_WC_WR_FLUSH_ERR => cstr!("Work Request Flushed Error"),
        ffi::IBV_WC_MW_BIND_ERR => cstr!("memory management operation error"),
        ffi::IBV_WC_BAD_RESP_ERR => cstr!("bad response error"),
        ffi::IBV_WC_LOC_ACCESS_ERR => cstr!("local access error"),
        ffi::IBV_WC_REM_INV_REQ_ERR => cstr!("remote invalid request error"),
        ffi::IBV_WC_REM_ACCESS_ERR => cstr!("remote access error"),
        ffi::IBV_WC_REM_OP_ERR => cstr!("remote operation error"),
        ffi::IBV_WC_RETRY_EXC_ERR => cstr!("transport retry counter exceeded"),
        ffi::IBV_WC_RNR_RETRY_EXC_ERR => cstr!("RNR retry counter exceeded"),
        ffi::IBV_WC_LOC_RDD_VIOL_ERR => cstr!("local RDD violation error"),
        ffi::IBV_WC_REM_INV_RD_REQ_ERR => cstr!("remote invalid RD request"),
        ffi::IBV_WC_REM_ABORT_ERR => cstr!("aborted error"),
        ffi::IBV_WC_INV_EECN_ERR => cstr!("invalid EE context number"),
        ffi::IBV_WC_INV_EEC_STATE_ERR => cstr!("invalid EE context state"),
        ffi::IBV_WC_FATAL_ERR => cstr!("fatal error"),
        ffi::IBV_WC_RESP_TIMEOUT_ERR => cstr!("response timeout error"),
        ffi::IBV_WC_GENERAL_ERR => cstr!("general error"),
        ffi::IBV_WC_TM_ERR => cstr!("TM error"),
        ffi::IBV_WC_TM_RNDV_INCOMPLETE => cstr!("TM software rendezvous"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: ffi::ibv_node_type) -> *const c_char {
    match t {
        ffi::IBV_NODE_CA => cstr!("InfiniBand channel adapter"),
        ffi::IBV_NODE_SWITCH => cstr!("InfiniBand switch"),
        ffi::IBV_NODE_ROUTER => cstr!("InfiniBand router"),
        ffi::IBV_NODE_RNIC => cstr!("iWARP NIC"),
        ffi::IBV_NODE_USNIC => cstr!("usNIC"),
        ffi::IBV_NODE_USNIC_UDP => cstr!("usNIC UDP"),
        ffi::IBV_NODE_UNSPECIFIED => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: ffi::ibv_port_state) -> *const c_char {
    match s {
        ffi::IBV_PORT_NOP => cstr!("no state change (NOP)"),
        ffi::IBV_PORT_DOWN => cstr!("down"),
        ffi::IBV_PORT_INIT => cstr!("init"),
        ffi::IBV_PORT_ARMED => cstr!("armed"),
        ffi::IBV_PORT_ACTIVE => cstr!("active"),
        ffi::IBV_PORT_ACTIVE_DEFER => cstr!("active defer"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: ffi::ibv_event_type) -> *const c_char {
    match e {
        ffi::IBV_EVENT_CQ_ERR => cstr!("CQ error"),
        ffi::IBV_EVENT_QP_FATAL => cstr!("local work queue catastrophic error"),
        ffi::IBV_EVENT_QP_REQ_ERR => cstr!("invalid request local work queue error"),
        ffi::IBV_EVENT_QP_ACCESS_ERR => cstr!("local access violation work queue error"),
        ffi::IBV_EVENT_COMM_EST => cstr!("communication established"),
        ffi::IBV_EVENT_SQ_DRAINED => cstr!("send queue drained"),
        ffi::IBV_EVENT_PATH_MIG => cstr!("path migrated"),
        ffi::IBV_EVENT_PATH_MIG_ERR => cstr!("path migration request error"),
        ffi::IBV_EVENT_DEVICE_FATAL => cstr!("local catastrophic error"),
        ffi::IBV_EVENT_PORT_ACTIVE => cstr!("port active"),
        ffi::IBV_EVENT_PORT_ERR => cstr!("port error"),
        ffi::IBV_EVENT_LID_CHANGE => cstr!("LID change"),
        ffi::IBV_EVENT_PKEY_CHANGE => cstr!("P_Key change"),
        ffi::IBV_EVENT_SM_CHANGE => cstr!("SM change"),
        ffi::IBV_EVENT_SRQ_ERR => cstr!("SRQ catastrophic error"),
        ffi::IBV_EVENT_SRQ_LIMIT_REACHED => cstr!("SRQ limit reached"),
        ffi::IBV_EVENT_QP_LAST_WQE_REACHED => cstr!("last WQE reached"),
        ffi::IBV_EVENT_CLIENT_REREGISTER => cstr!("client reregistration"),
        ffi::IBV_EVENT_GID_CHANGE => cstr!("GID table change"),
        ffi::IBV_EVENT_WQ_FATAL => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}

/// (rate enum, multiple of 2.5 Gb/s, Mb/s) for every IBTA static rate.
const RATES: &[(u32, c_int, c_int)] = &[
    (ffi::IBV_RATE_2_5_GBPS, 1, 2500),
    (ffi::IBV_RATE_5_GBPS, 2, 5000),
    (ffi::IBV_RATE_10_GBPS, 4, 10000),
    (ffi::IBV_RATE_20_GBPS, 8, 20000),
    (ffi::IBV_RATE_30_GBPS, 12, 30000),
    (ffi::IBV_RATE_40_GBPS, 16, 40000),
    (ffi::IBV_RATE_60_GBPS, 24, 60000),
    (ffi::IBV_RATE_80_GBPS, 32, 80000),
    (ffi::IBV_RATE_120_GBPS, 48, 120000),
    (ffi::IBV_RATE_14_GBPS, 5, 14062),
    (ffi::IBV_RATE_56_GBPS, 22, 56250),
    (ffi::IBV_RATE_112_GBPS, 45, 112500),
    (ffi::IBV_RATE_168_GBPS, 67, 168750),
    (ffi::IBV_RATE_25_GBPS, 10, 25781),
    (ffi::IBV_RATE_100_GBPS, 40, 103125),
    (ffi::IBV_RATE_200_GBPS, 80, 206250),
    (ffi::IBV_RATE_300_GBPS, 120, 309375),
    (ffi::IBV_RATE_28_GBPS, 11, 28125),
    (ffi::IBV_RATE_50_GBPS, 20, 53125),
    (ffi::IBV_RATE_400_GBPS, 160, 425000),
    (ffi::IBV_RATE_600_GBPS, 240, 637500),
];

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: ffi::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(0, |r| r.1)
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> ffi::ibv_rate {
    RATES.iter().find(|r| r.1 == mult).map_or(ffi::IBV_RATE_MAX, |r| r.0)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: ffi::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(0, |r| r.2)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ffi::ibv_rate {
    RATES.iter().find(|r| r.2 == mbps).map_or(ffi::IBV_RATE_MAX, |r| r.0)
}
