//! The verbs vocabulary the engine speaks, with libibverbs' numeric values wherever the C ABI has
//! them (`enum ibv_qp_type`, `ibv_qp_state`, `ibv_qp_attr_mask`, `ibv_access_flags`,
//! `ibv_wc_status`, `ibv_wc_opcode`), so the verbs shim can pass them through unchanged.

use core::fmt;

/// A queue pair's transport service (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpType {
    /// Reliable Connected (IBV_QPT_RC = 2).
    Rc,
    /// Unreliable Connected (IBV_QPT_UC = 3).
    Uc,
    /// Unreliable Datagram (IBV_QPT_UD = 4).
    Ud,
    /// XRC initiator, send side (IBV_QPT_XRC_SEND = 9).
    XrcIni,
    /// XRC target, receive side (IBV_QPT_XRC_RECV = 10).
    XrcTgt,
}

impl QpType {
    /// The `ibv_qp_type` value.
    pub const fn to_ibv(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
            QpType::XrcIni => 9,
            QpType::XrcTgt => 10,
        }
    }

    /// From an `ibv_qp_type` value.
    pub const fn from_ibv(v: u32) -> Option<QpType> {
        Some(match v {
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            9 => QpType::XrcIni,
            10 => QpType::XrcTgt,
            _ => return None,
        })
    }
}

/// A queue pair's state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpState {
    /// IBV_QPS_RESET = 0.
    Reset,
    /// IBV_QPS_INIT = 1.
    Init,
    /// IBV_QPS_RTR = 2: ready to receive.
    Rtr,
    /// IBV_QPS_RTS = 3: ready to send.
    Rts,
    /// IBV_QPS_SQD = 4: send queue drained.
    Sqd,
    /// IBV_QPS_SQE = 5: send queue error.
    Sqe,
    /// IBV_QPS_ERR = 6.
    Err,
}

impl QpState {
    /// Every state, in `ibv_qp_state` order.
    pub const ALL: [QpState; 7] =
        [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err];

    /// The `ibv_qp_state` value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// From an `ibv_qp_state` value.
    pub const fn from_ibv(v: u32) -> Option<QpState> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }
}

macro_rules! flags {
    ($(#[$m:meta])* pub struct $name:ident: $t:ty { $( $(#[$fm:meta])* const $f:ident = $v:expr; )* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub struct $name(pub $t);

        impl $name {
            $( $(#[$fm])* pub const $f: $name = $name($v); )*
            /// No flag.
            pub const EMPTY: $name = $name(0);
            /// Both sets.
            pub const fn union(self, o: $name) -> $name { $name(self.0 | o.0) }
            /// Whether every flag of `o` is set.
            pub const fn contains(self, o: $name) -> bool { self.0 & o.0 == o.0 }
            /// Whether any flag of `o` is set.
            pub const fn intersects(self, o: $name) -> bool { self.0 & o.0 != 0 }
            /// The flags of `self` not in `o`.
            pub const fn difference(self, o: $name) -> $name { $name(self.0 & !o.0) }
            /// Whether no flag is set.
            pub const fn is_empty(self) -> bool { self.0 == 0 }
        }

        impl core::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, o: $name) -> $name { self.union(o) }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                write!(f, "{}(", stringify!($name))?;
                $( if self.0 & $v != 0 { if !first { f.write_str("|")?; } first = false; f.write_str(stringify!($f))?; } )*
                let known = 0 $( | $v )*;
                if self.0 & !known != 0 { if !first { f.write_str("|")?; } write!(f, "{:#x}", self.0 & !known)?; }
                f.write_str(")")
            }
        }
    };
}

flags! {
    /// Which attributes a `modify_qp` call sets (`enum ibv_qp_attr_mask`).
    pub struct AttrMask: u32 {
        /// IBV_QP_STATE.
        const STATE = 1 << 0;
        /// IBV_QP_CUR_STATE.
        const CUR_STATE = 1 << 1;
        /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// IBV_QP_ACCESS_FLAGS.
        const ACCESS_FLAGS = 1 << 3;
        /// IBV_QP_PKEY_INDEX.
        const PKEY_INDEX = 1 << 4;
        /// IBV_QP_PORT.
        const PORT = 1 << 5;
        /// IBV_QP_QKEY.
        const QKEY = 1 << 6;
        /// IBV_QP_AV.
        const AV = 1 << 7;
        /// IBV_QP_PATH_MTU.
        const PATH_MTU = 1 << 8;
        /// IBV_QP_TIMEOUT.
        const TIMEOUT = 1 << 9;
        /// IBV_QP_RETRY_CNT.
        const RETRY_CNT = 1 << 10;
        /// IBV_QP_RNR_RETRY.
        const RNR_RETRY = 1 << 11;
        /// IBV_QP_RQ_PSN.
        const RQ_PSN = 1 << 12;
        /// IBV_QP_MAX_QP_RD_ATOMIC.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// IBV_QP_ALT_PATH.
        const ALT_PATH = 1 << 14;
        /// IBV_QP_MIN_RNR_TIMER.
        const MIN_RNR_TIMER = 1 << 15;
        /// IBV_QP_SQ_PSN.
        const SQ_PSN = 1 << 16;
        /// IBV_QP_MAX_DEST_RD_ATOMIC.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// IBV_QP_PATH_MIG_STATE.
        const PATH_MIG_STATE = 1 << 18;
        /// IBV_QP_CAP.
        const CAP = 1 << 19;
        /// IBV_QP_DEST_QPN.
        const DEST_QPN = 1 << 20;
        /// IBV_QP_RATE_LIMIT.
        const RATE_LIMIT = 1 << 25;
    }
}

flags! {
    /// Access rights of a memory region or a QP (`enum ibv_access_flags`).
    pub struct Access: u32 {
        /// IBV_ACCESS_LOCAL_WRITE.
        const LOCAL_WRITE = 1 << 0;
        /// IBV_ACCESS_REMOTE_WRITE.
        const REMOTE_WRITE = 1 << 1;
        /// IBV_ACCESS_REMOTE_READ.
        const REMOTE_READ = 1 << 2;
        /// IBV_ACCESS_REMOTE_ATOMIC.
        const REMOTE_ATOMIC = 1 << 3;
        /// IBV_ACCESS_MW_BIND.
        const MW_BIND = 1 << 4;
        /// IBV_ACCESS_ZERO_BASED.
        const ZERO_BASED = 1 << 5;
    }
}

/// The status of a work completion (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u32)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    Success = 0,
    /// IBV_WC_LOC_LEN_ERR: a received message did not fit the receive buffer.
    LocLenErr = 1,
    /// IBV_WC_LOC_QP_OP_ERR.
    LocQpOpErr = 2,
    /// IBV_WC_LOC_EEC_OP_ERR.
    LocEecOpErr = 3,
    /// IBV_WC_LOC_PROT_ERR: a local key or access check failed.
    LocProtErr = 4,
    /// IBV_WC_WR_FLUSH_ERR: the QP was in the error state.
    WrFlushErr = 5,
    /// IBV_WC_MW_BIND_ERR.
    MwBindErr = 6,
    /// IBV_WC_BAD_RESP_ERR: an unexpected response opcode.
    BadRespErr = 7,
    /// IBV_WC_LOC_ACCESS_ERR.
    LocAccessErr = 8,
    /// IBV_WC_REM_INV_REQ_ERR: the responder NAKed "invalid request".
    RemInvReqErr = 9,
    /// IBV_WC_REM_ACCESS_ERR: the responder NAKed "remote access error".
    RemAccessErr = 10,
    /// IBV_WC_REM_OP_ERR: the responder NAKed "remote operational error".
    RemOpErr = 11,
    /// IBV_WC_RETRY_EXC_ERR: the transport retry counter ran out.
    RetryExcErr = 12,
    /// IBV_WC_RNR_RETRY_EXC_ERR: the RNR retry counter ran out.
    RnrRetryExcErr = 13,
    /// IBV_WC_LOC_RDD_VIOL_ERR.
    LocRddViolErr = 14,
    /// IBV_WC_REM_INV_RD_REQ_ERR.
    RemInvRdReqErr = 15,
    /// IBV_WC_REM_ABORT_ERR.
    RemAbortErr = 16,
    /// IBV_WC_INV_EECN_ERR.
    InvEecnErr = 17,
    /// IBV_WC_INV_EEC_STATE_ERR.
    InvEecStateErr = 18,
    /// IBV_WC_FATAL_ERR.
    FatalErr = 19,
    /// IBV_WC_RESP_TIMEOUT_ERR.
    RespTimeoutErr = 20,
    /// IBV_WC_GENERAL_ERR.
    GeneralErr = 21,
}

/// What a work completion completes (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u32)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    Send = 0,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite = 1,
    /// IBV_WC_RDMA_READ.
    RdmaRead = 2,
    /// IBV_WC_COMP_SWAP.
    CompSwap = 3,
    /// IBV_WC_FETCH_ADD.
    FetchAdd = 4,
    /// IBV_WC_BIND_MW.
    BindMw = 5,
    /// IBV_WC_LOCAL_INV.
    LocalInv = 6,
    /// IBV_WC_ATOMIC_WRITE.
    AtomicWrite = 9,
    /// IBV_WC_RECV.
    Recv = 128,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm = 129,
}

/// The error a verbs call fails with: the errno libibverbs returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum VerbsError {
    /// EPERM (1): not allowed from user space.
    #[error("operation not permitted (EPERM)")]
    Perm,
    /// ENOENT (2): no such object.
    #[error("no such object (ENOENT)")]
    NoEnt,
    /// EAGAIN (11): try again / nothing to join.
    #[error("resource temporarily unavailable (EAGAIN)")]
    Again,
    /// ENOMEM (12): a queue is full or a limit is exceeded.
    #[error("out of resources (ENOMEM)")]
    NoMem,
    /// EACCES (13).
    #[error("permission denied (EACCES)")]
    Access,
    /// EFAULT (14): a memory range the process does not have (reg_mr).
    #[error("bad address (EFAULT)")]
    Fault,
    /// EBUSY (16): the object is still in use.
    #[error("object in use (EBUSY)")]
    Busy,
    /// EINVAL (22): an invalid argument or attribute mask.
    #[error("invalid argument (EINVAL)")]
    Inval,
    /// EOPNOTSUPP (95).
    #[error("operation not supported (EOPNOTSUPP)")]
    NotSupp,
    /// EINTR (4): a blocking wait was interrupted by a signal whose handler does not restart
    /// system calls (no SA_RESTART), as the kernel's read(2) of a completion channel is.
    #[error("interrupted (EINTR)")]
    Intr,
}

impl VerbsError {
    /// The errno value.
    pub const fn errno(self) -> i32 {
        match self {
            VerbsError::Perm => 1,
            VerbsError::NoEnt => 2,
            VerbsError::Again => 11,
            VerbsError::NoMem => 12,
            VerbsError::Access => 13,
            VerbsError::Fault => 14,
            VerbsError::Busy => 16,
            VerbsError::Inval => 22,
            VerbsError::NotSupp => 95,
            VerbsError::Intr => 4,
        }
    }
}

/// IB path MTU (`enum ibv_mtu`: 1 = 256 ... 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Bytes of payload per packet.
    pub const fn bytes(self) -> usize {
        128 << (self as usize)
    }

    /// From an `ibv_mtu` value.
    pub const fn from_ibv(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The largest MTU not above `bytes` (at least 256).
    pub const fn at_most(bytes: usize) -> Mtu {
        if bytes >= 4096 {
            Mtu::Mtu4096
        } else if bytes >= 2048 {
            Mtu::Mtu2048
        } else if bytes >= 1024 {
            Mtu::Mtu1024
        } else if bytes >= 512 {
            Mtu::Mtu512
        } else {
            Mtu::Mtu256
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn ibv_values() {
        assert_eq!(QpState::from_ibv(3), Some(QpState::Rts));
        assert_eq!(QpState::Err.to_ibv(), 6);
        assert_eq!(QpState::from_ibv(7), None);
        assert_eq!(QpType::from_ibv(9), Some(QpType::XrcIni));
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(WcOpcode::RecvRdmaWithImm as u32, 129);
        assert_eq!(AttrMask::DEST_QPN.0, 1 << 20);
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::at_most(1500), Mtu::Mtu1024);
        assert_eq!(VerbsError::Inval.errno(), 22);
        assert_eq!(format!("{:?}", AttrMask::STATE | AttrMask::PORT), "AttrMask(STATE|PORT)");
    }
}
