//! Work requests and work completions as the engine takes and gives them.

use crate::verbs::{WcOpcode, WcStatus};
use crate::wire::Qpn;

/// A scatter/gather element: `length` bytes at `addr` in the memory region of `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// What a send work request does (`ibv_wr_opcode`, with its operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm {
        /// Immediate data (as the 4 wire bytes read big-endian).
        imm: u32,
    },
    /// SEND with invalidate.
    SendWithInv {
        /// The remote key to invalidate at the responder.
        rkey: u32,
    },
    /// RDMA WRITE.
    Write {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data.
    WriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ.
    Read {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Atomic compare and swap of 8 bytes.
    CompareSwap {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// Bind a memory window (IBV_WR_BIND_MW, and what `ibv_bind_mw` posts for type 1): a local
    /// operation, executed in send-queue order.
    BindMw {
        /// The window's current R_Key.
        mw_rkey: u32,
        /// Its R_Key once bound (same index, new key byte).
        new_rkey: u32,
        /// The region the window lies in.
        mr_lkey: u32,
        /// Start of the window.
        addr: u64,
        /// Length of the window.
        length: u64,
        /// Rights it grants (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC).
        access: crate::verbs::Access,
    },
    /// Invalidate a type 2 window by R_Key (IBV_WR_LOCAL_INV).
    LocalInv {
        /// The R_Key to invalidate.
        rkey: u32,
    },
    /// ATOMIC WRITE of 8 bytes (IBV_WR_ATOMIC_WRITE, IBTA 1.5): the value is the WR's data (an
    /// 8-byte gather list or inline data), written at an 8-byte aligned remote address as one
    /// store; RC and XRC only.
    AtomicWrite {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key (needs REMOTE_WRITE).
        rkey: u32,
    },
    /// Atomic fetch and add of 8 bytes.
    FetchAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
}

impl SendOp {
    /// The completion opcode.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }

    /// Whether the responder answers with data (READ, atomics).
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(self, SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// Whether it takes a receive WQE at the responder (SEND, RDMA WRITE with immediate): the
    /// requests that end-to-end credits bound (IBTA 9.7.7.2).
    pub const fn consumes_recv_wqe(self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } | SendOp::WriteWithImm { .. }
        )
    }

    /// Whether it is a local operation (no packet: bind, invalidate).
    pub const fn is_local(self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
    }

    /// Whether it takes one of the initiator's max_rd_atomic slots: READ, the atomics and ATOMIC
    /// WRITE (rxe's check_init_depth counts it too; the responder keeps a resource for each).
    pub const fn uses_rd_atomic(self) -> bool {
        self.is_read_or_atomic() || matches!(self, SendOp::AtomicWrite { .. })
    }

    /// Whether it is an atomic.
    pub const fn is_atomic(self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local buffers: gathered for SEND/WRITE, scattered into for READ, the 8-byte result for atomics.
    pub sg_list: Vec<Sge>,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Wait for every earlier READ and atomic to complete first (IBV_SEND_FENCE).
    pub fence: bool,
    /// Set the Solicited Event bit on the last packet (IBV_SEND_SOLICITED).
    pub solicited: bool,
    /// Copy the data at post time (IBV_SEND_INLINE); no lkey check.
    pub inline: bool,
    /// XRC: the SRQ number at the target this request is for (`qp_type.xrc.remote_srqn`).
    pub remote_srqn: u32,
    /// UD: where the datagram goes (`wr.ud`).
    pub ud: Option<UdDest>,
}

/// The destination of a UD send (`ibv_send_wr.wr.ud`): an address handle and the remote QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct UdDest {
    /// The destination address (the address handle's GID, as an IP address).
    pub dest: std::net::IpAddr,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key; with the high bit set the QP's own Q_Key is used (IBTA 10.2.5).
    pub remote_qkey: u32,
}

impl SendWr {
    /// A signaled request with no flags.
    pub fn new(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            fence: false,
            solicited: false,
            inline: false,
            remote_srqn: 0,
            ud: None,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where received data goes.
    pub sg_list: Vec<Sge>,
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data, if the message carried some.
    pub imm: Option<u32>,
    /// The remote key the message invalidated, if it was a SEND with invalidate.
    pub invalidated_rkey: Option<u32>,
    /// The local QP.
    pub qp_num: Qpn,
    /// The remote QP (UD receive completions).
    pub src_qp: Qpn,
    /// The receive buffer starts with the 40-byte GRH slot (IBV_WC_GRH, UD receives).
    pub grh: bool,
    /// The sender's address (UD receives: for `ibv_create_ah_from_wc`).
    pub src: Option<std::net::IpAddr>,
}
