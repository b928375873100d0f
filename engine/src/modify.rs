//! Which `modify_qp` attribute masks are legal: the QP state transition table.
//!
//! This is a port of the semantics of the Linux kernel's `qp_state_table` and `ib_modify_qp_is_ok()`
//! (drivers/infiniband/core/verbs.c), which encode the IBTA Vol 1 Modify Queue Pair verb (section
//! 11.2.4) and its table of required and optional attributes per state transition (Table 95),
//! together with the QP state diagram of section 10.3.1. For every (current, next) state pair the
//! table says whether the transition exists at all and, for each transport service, which attributes
//! the mask must carry and which it may carry.
//!
//! The rule, as the kernel applies it:
//! - the transition must be in the table (`valid`); the set is the same for every QP type;
//! - every required attribute must be in the mask;
//! - the mask may hold nothing beyond required | optional | STATE. STATE is always accepted and
//!   never listed; CUR_STATE is accepted only where the table lists it as optional, and never unless
//!   the current state is RTR, RTS, SQD or SQE;
//! - a mask without STATE is checked as the transition from the current state to itself, so "modify
//!   without a state change" is legal only from INIT, RTS and SQD (and from RESET and ERR with an
//!   empty mask).
//!
//! Only the rows of our QP types are ported: RC, UC, UD, XRC initiator and XRC target. The kernel's
//! SMI/GSI and RAW_PACKET columns are left out, so IBV_QP_RATE_LIMIT (optional only for
//! RAW_PACKET) is never accepted here.
//!
//! `softrdma` uses [`check`] to decide when `ibv_modify_qp` fails with EINVAL, before any attribute
//! value is looked at; see [`ModifyError`] and its conversion into [`VerbsError::Inval`].

use crate::verbs::{AttrMask, QpState, QpType, VerbsError};

/// Why a modify_qp mask is refused (all map to EINVAL in verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ModifyError {
    /// The QP state diagram has no edge from `from` to `to`.
    #[error("invalid QP state transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// The mask lacks attributes the transition requires (the ones listed).
    #[error("modify_qp mask lacks required attributes {0:?}")]
    MissingAttributes(AttrMask),
    /// The mask carries attributes the transition does not accept (the ones listed).
    #[error("modify_qp mask carries attributes not accepted here {0:?}")]
    UnexpectedAttributes(AttrMask),
}

impl From<ModifyError> for VerbsError {
    fn from(_: ModifyError) -> VerbsError {
        // Kernel: every `!ib_modify_qp_is_ok()` becomes -EINVAL.
        VerbsError::Inval
    }
}

/// The attributes a `modify_qp` from `from` to `to` must carry for a `qp_type` QP, not counting
/// STATE itself; `None` when the transition is invalid.
///
/// This is the kernel's `qp_state_table[from][to].req_param[qp_type]`.
pub const fn required(qp_type: QpType, from: QpState, to: QpState) -> Option<AttrMask> {
    match transition(from, to) {
        Some(t) => Some(t.required.get(qp_type)),
        None => None,
    }
}

/// The attributes a `modify_qp` from `from` to `to` may carry besides the required ones and STATE
/// (CUR_STATE included where it is accepted); `None` when the transition is invalid.
///
/// This is the kernel's `qp_state_table[from][to].opt_param[qp_type]`.
pub const fn optional(qp_type: QpType, from: QpState, to: QpState) -> Option<AttrMask> {
    match transition(from, to) {
        Some(t) => Some(t.optional.get(qp_type)),
        None => None,
    }
}

/// Checks a `modify_qp` attribute mask, as `ib_modify_qp_is_ok()` does.
///
/// `from` is the QP's current state (rxe takes `attr.cur_qp_state` instead when the mask has
/// CUR_STATE). `to` is the requested state: `attr.qp_state` when the mask has STATE, `from` otherwise.
///
/// Beyond the kernel function, a state change (`from != to`) whose mask lacks STATE is refused with
/// [`ModifyError::MissingAttributes`]`(STATE)`: the kernel's callers cannot build that call, since
/// they derive the next state from the mask, so it can only be a caller bug.
pub const fn check(qp_type: QpType, from: QpState, to: QpState, mask: AttrMask) -> Result<(), ModifyError> {
    let Some(t) = transition(from, to) else {
        // Kernel: `if (!qp_state_table[cur_state][next_state].valid) return false;`
        return Err(ModifyError::InvalidTransition { from, to });
    };
    let required = t.required.get(qp_type);
    let optional = t.optional.get(qp_type);

    if from.to_ibv() != to.to_ibv() && !mask.contains(AttrMask::STATE) {
        // Callers derive `to` from STATE; a state change without it is not a request the kernel sees.
        return Err(ModifyError::MissingAttributes(AttrMask::STATE));
    }
    // Kernel: `if ((mask & req_param) != req_param) return false;`
    let missing = required.difference(mask);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes(missing));
    }
    // Kernel: CUR_STATE is refused unless the current state is RTR, RTS, SQD or SQE. For our types
    // the table alone already implies it: only cells leaving those states list CUR_STATE.
    if mask.contains(AttrMask::CUR_STATE) && !matches!(from, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
    {
        return Err(ModifyError::UnexpectedAttributes(AttrMask::CUR_STATE));
    }
    // Kernel: `if (mask & ~(req_param | opt_param | IB_QP_STATE)) return false;`
    let extra = mask.difference(required.union(optional).union(AttrMask::STATE));
    if !extra.is_empty() {
        return Err(ModifyError::UnexpectedAttributes(extra));
    }
    Ok(())
}

/// One mask per QP type, laid out like the kernel's `req_param[]` / `opt_param[]` arrays.
#[derive(Debug, Clone, Copy)]
struct PerType {
    ud: AttrMask,
    uc: AttrMask,
    rc: AttrMask,
    xrc_ini: AttrMask,
    xrc_tgt: AttrMask,
}

impl PerType {
    /// No attribute for any type (the kernel's zero-initialized array).
    const NONE: PerType = PerType::same(AttrMask::EMPTY);

    /// The same mask for every type.
    const fn same(m: AttrMask) -> PerType {
        PerType { ud: m, uc: m, rc: m, xrc_ini: m, xrc_tgt: m }
    }

    /// The mask of one type.
    const fn get(self, t: QpType) -> AttrMask {
        match t {
            QpType::Ud => self.ud,
            QpType::Uc => self.uc,
            QpType::Rc => self.rc,
            QpType::XrcIni => self.xrc_ini,
            QpType::XrcTgt => self.xrc_tgt,
        }
    }
}

/// One valid cell of the state table.
#[derive(Debug, Clone, Copy)]
struct Transition {
    required: PerType,
    optional: PerType,
}

impl Transition {
    /// A transition that needs and takes nothing but STATE (to RESET, to ERR, RESET to RESET).
    const BARE: Transition = Transition { required: PerType::NONE, optional: PerType::NONE };
}

/// The union of a list of masks, usable in constants.
const fn all(list: &[AttrMask]) -> AttrMask {
    let mut m = AttrMask::EMPTY;
    let mut i = 0;
    while i < list.len() {
        m = m.union(list[i]);
        i += 1;
    }
    m
}

// Short names for the table below, so each row reads like the kernel's.
const ACCESS: AttrMask = AttrMask::ACCESS_FLAGS;
const ALT: AttrMask = AttrMask::ALT_PATH;
const AV: AttrMask = AttrMask::AV;
const CUR: AttrMask = AttrMask::CUR_STATE;
const DEST_QPN: AttrMask = AttrMask::DEST_QPN;
const MAX_DEST_RD: AttrMask = AttrMask::MAX_DEST_RD_ATOMIC;
const MAX_QP_RD: AttrMask = AttrMask::MAX_QP_RD_ATOMIC;
const MIG: AttrMask = AttrMask::PATH_MIG_STATE;
const MIN_RNR: AttrMask = AttrMask::MIN_RNR_TIMER;
const MTU: AttrMask = AttrMask::PATH_MTU;
const PKEY: AttrMask = AttrMask::PKEY_INDEX;
const PORT: AttrMask = AttrMask::PORT;
const QKEY: AttrMask = AttrMask::QKEY;
const RETRY: AttrMask = AttrMask::RETRY_CNT;
const RNR_RETRY: AttrMask = AttrMask::RNR_RETRY;
const RQ_PSN: AttrMask = AttrMask::RQ_PSN;
const SQ_PSN: AttrMask = AttrMask::SQ_PSN;
const TIMEOUT: AttrMask = AttrMask::TIMEOUT;

/// The optional attributes of RTS->RTS and SQD->RTS (kernel rows `[RTS][RTS]`, `[SQD][RTS]`);
/// RTR->RTS takes the same ones on top of its required set.
const TO_RTS_OPTIONAL: PerType = PerType {
    ud: all(&[CUR, QKEY]),
    uc: all(&[CUR, ALT, ACCESS, MIG]),
    rc: all(&[CUR, ALT, ACCESS, MIN_RNR, MIG]),
    // The initiator has no responder, so no RNR timer to set.
    xrc_ini: all(&[CUR, ALT, ACCESS, MIG]),
    xrc_tgt: all(&[CUR, ALT, ACCESS, MIN_RNR, MIG]),
};

/// The kernel's `qp_state_table[from][to]` for our QP types; `None` where `.valid` is 0.
///
/// IBTA 10.3.1: any state may go to RESET, any state but RESET to ERR; the others follow the
/// RESET -> INIT -> RTR -> RTS <-> SQD path, SQE goes back only to RTS, and a QP may stay in INIT,
/// RTS or SQD while changing attributes. RESET may "stay" in RESET, ERR in ERR, with no attribute.
const fn transition(from: QpState, to: QpState) -> Option<Transition> {
    use QpState::*;
    Some(match (from, to) {
        // Kernel qp_state_table[RESET][RESET], [*][RESET] and [non-RESET][ERR]: STATE only.
        (_, Reset) => Transition::BARE,
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => Transition::BARE,

        // Kernel qp_state_table[RESET][INIT]: port, P_Key and the access rights (Q_Key for UD).
        (Reset, Init) => Transition {
            required: PerType {
                ud: all(&[PKEY, PORT, QKEY]),
                uc: all(&[PKEY, PORT, ACCESS]),
                rc: all(&[PKEY, PORT, ACCESS]),
                xrc_ini: all(&[PKEY, PORT, ACCESS]),
                xrc_tgt: all(&[PKEY, PORT, ACCESS]),
            },
            optional: PerType::NONE,
        },

        // Kernel qp_state_table[INIT][INIT]: the RESET->INIT attributes, all optional.
        (Init, Init) => Transition {
            required: PerType::NONE,
            optional: PerType {
                ud: all(&[PKEY, PORT, QKEY]),
                uc: all(&[PKEY, PORT, ACCESS]),
                rc: all(&[PKEY, PORT, ACCESS]),
                xrc_ini: all(&[PKEY, PORT, ACCESS]),
                xrc_tgt: all(&[PKEY, PORT, ACCESS]),
            },
        },

        // Kernel qp_state_table[INIT][RTR]: the remote end and the receive side. Only types with
        // a responder (RC, XRC target) take the RDMA READ/atomic depth and the RNR NAK timer.
        (Init, Rtr) => Transition {
            required: PerType {
                ud: AttrMask::EMPTY,
                uc: all(&[AV, MTU, DEST_QPN, RQ_PSN]),
                rc: all(&[AV, MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD, MIN_RNR]),
                xrc_ini: all(&[AV, MTU, DEST_QPN, RQ_PSN]),
                xrc_tgt: all(&[AV, MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD, MIN_RNR]),
            },
            optional: PerType {
                ud: all(&[PKEY, QKEY]),
                uc: all(&[ALT, ACCESS, PKEY]),
                rc: all(&[ALT, ACCESS, PKEY]),
                xrc_ini: all(&[ALT, ACCESS, PKEY]),
                xrc_tgt: all(&[ALT, ACCESS, PKEY]),
            },
        },

        // Kernel qp_state_table[RTR][RTS]: the send side. RC and the XRC initiator need the
        // retry machinery; the XRC target, which never sends requests, still needs TIMEOUT.
        (Rtr, Rts) => Transition {
            required: PerType {
                ud: SQ_PSN,
                uc: SQ_PSN,
                rc: all(&[TIMEOUT, RETRY, RNR_RETRY, SQ_PSN, MAX_QP_RD]),
                xrc_ini: all(&[TIMEOUT, RETRY, RNR_RETRY, SQ_PSN, MAX_QP_RD]),
                xrc_tgt: all(&[TIMEOUT, SQ_PSN]),
            },
            optional: TO_RTS_OPTIONAL,
        },

        // Kernel qp_state_table[RTS][RTS] and [SQD][RTS]: nothing required.
        (Rts | Sqd, Rts) => Transition { required: PerType::NONE, optional: TO_RTS_OPTIONAL },

        // Kernel qp_state_table[RTS][SQD]: only the "SQ drained" event request (marked "???" for
        // XRC_TGT in the kernel, kept as written).
        (Rts, Sqd) => Transition { required: PerType::NONE, optional: PerType::same(AttrMask::EN_SQD_ASYNC_NOTIFY) },

        // Kernel qp_state_table[SQD][SQD]: the widest row; path and retry parameters may change
        // while the send queue is drained.
        (Sqd, Sqd) => Transition {
            required: PerType::NONE,
            optional: PerType {
                ud: all(&[PKEY, QKEY]),
                uc: all(&[AV, ALT, ACCESS, PKEY, MIG]),
                rc: all(&[
                    PORT,
                    AV,
                    TIMEOUT,
                    RETRY,
                    RNR_RETRY,
                    MAX_QP_RD,
                    MAX_DEST_RD,
                    ALT,
                    ACCESS,
                    PKEY,
                    MIN_RNR,
                    MIG,
                ]),
                // RC's row minus the responder's MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER.
                xrc_ini: all(&[PORT, AV, TIMEOUT, RETRY, RNR_RETRY, MAX_QP_RD, ALT, ACCESS, PKEY, MIG]),
                // RC's row minus the requester's RETRY_CNT, RNR_RETRY and MAX_QP_RD_ATOMIC.
                xrc_tgt: all(&[PORT, AV, TIMEOUT, MAX_DEST_RD, ALT, ACCESS, PKEY, MIN_RNR, MIG]),
            },
        },

        // Kernel qp_state_table[SQE][RTS]: only UD and UC list anything. RC and XRC QPs go to ERR,
        // not SQE, on a send error (IBTA 10.3.1), so for them this edge takes STATE alone.
        (Sqe, Rts) => Transition {
            required: PerType::NONE,
            optional: PerType {
                ud: all(&[CUR, QKEY]),
                uc: all(&[CUR, ACCESS]),
                rc: AttrMask::EMPTY,
                xrc_ini: AttrMask::EMPTY,
                xrc_tgt: AttrMask::EMPTY,
            },
        },

        // Everything else has `.valid = 0`: RESET->{RTR,RTS,SQD,SQE,ERR}, INIT->{RTS,SQD,SQE},
        // RTR->{INIT,RTR,SQD,SQE}, RTS->{INIT,RTR,SQE}, SQD->{INIT,RTR,SQE}, SQE->{INIT,RTR,SQD,SQE},
        // ERR->{INIT,RTR,RTS,SQD,SQE}.
        _ => return None,
    })
}

#[cfg(test)]
mod test {
    use super::*;
    use QpState::Err as Error;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};

    const TYPES: [QpType; 5] = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::XrcIni, QpType::XrcTgt];

    /// Every attribute bit `AttrMask` names.
    const KNOWN: [AttrMask; 22] = [
        AttrMask::STATE,
        AttrMask::CUR_STATE,
        AttrMask::EN_SQD_ASYNC_NOTIFY,
        AttrMask::ACCESS_FLAGS,
        AttrMask::PKEY_INDEX,
        AttrMask::PORT,
        AttrMask::QKEY,
        AttrMask::AV,
        AttrMask::PATH_MTU,
        AttrMask::TIMEOUT,
        AttrMask::RETRY_CNT,
        AttrMask::RNR_RETRY,
        AttrMask::RQ_PSN,
        AttrMask::MAX_QP_RD_ATOMIC,
        AttrMask::ALT_PATH,
        AttrMask::MIN_RNR_TIMER,
        AttrMask::SQ_PSN,
        AttrMask::MAX_DEST_RD_ATOMIC,
        AttrMask::PATH_MIG_STATE,
        AttrMask::CAP,
        AttrMask::DEST_QPN,
        AttrMask::RATE_LIMIT,
    ];

    /// The kernel's `.valid = 1` cells, written out independently of `transition`.
    const VALID: [(QpState, QpState); 22] = [
        (Reset, Reset),
        (Reset, Init),
        (Init, Reset),
        (Init, Error),
        (Init, Init),
        (Init, Rtr),
        (Rtr, Reset),
        (Rtr, Error),
        (Rtr, Rts),
        (Rts, Reset),
        (Rts, Error),
        (Rts, Rts),
        (Rts, Sqd),
        (Sqd, Reset),
        (Sqd, Error),
        (Sqd, Rts),
        (Sqd, Sqd),
        (Sqe, Reset),
        (Sqe, Error),
        (Sqe, Rts),
        (Error, Reset),
        (Error, Error),
    ];

    const STATE: AttrMask = AttrMask::STATE;

    /// The mask with `STATE` added.
    fn with_state(m: AttrMask) -> AttrMask {
        m | STATE
    }

    #[test]
    fn rc_reset_to_init_requires_pkey_port_access() {
        // kernel qp_state_table[IB_QPS_RESET][IB_QPS_INIT].req_param[IB_QPT_RC]
        let req = AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        assert_eq!(required(QpType::Rc, Reset, Init), Some(req));
        assert_eq!(optional(QpType::Rc, Reset, Init), Some(AttrMask::EMPTY));
        assert_eq!(check(QpType::Rc, Reset, Init, with_state(req)), Ok(()));
        assert_eq!(
            check(QpType::Rc, Reset, Init, with_state(AttrMask::PKEY_INDEX | AttrMask::PORT)),
            Err(ModifyError::MissingAttributes(AttrMask::ACCESS_FLAGS))
        );
        assert_eq!(
            check(QpType::Rc, Reset, Init, STATE),
            Err(ModifyError::MissingAttributes(AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS))
        );
        // Q_Key is a datagram attribute.
        assert_eq!(
            check(QpType::Rc, Reset, Init, with_state(req | AttrMask::QKEY)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::QKEY))
        );
    }

    #[test]
    fn rc_init_to_rtr_requires_av_mtu_dest_qpn_rq_psn_max_dest_rd_atomic_min_rnr_timer() {
        // kernel qp_state_table[IB_QPS_INIT][IB_QPS_RTR].req_param[IB_QPT_RC] / .opt_param[IB_QPT_RC]
        let req = AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        assert_eq!(required(QpType::Rc, Init, Rtr), Some(req));
        assert_eq!(
            optional(QpType::Rc, Init, Rtr),
            Some(AttrMask::ALT_PATH | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX)
        );
        assert_eq!(check(QpType::Rc, Init, Rtr, with_state(req)), Ok(()));
        assert_eq!(check(QpType::Rc, Init, Rtr, with_state(req | AttrMask::PKEY_INDEX)), Ok(()));
        assert_eq!(
            check(QpType::Rc, Init, Rtr, with_state(req.difference(AttrMask::MIN_RNR_TIMER))),
            Err(ModifyError::MissingAttributes(AttrMask::MIN_RNR_TIMER))
        );
        // The port is fixed at RESET->INIT (or INIT->INIT); SQ_PSN belongs to RTR->RTS.
        assert_eq!(
            check(QpType::Rc, Init, Rtr, with_state(req | AttrMask::PORT | AttrMask::SQ_PSN)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::PORT | AttrMask::SQ_PSN))
        );
    }

    #[test]
    fn rc_rtr_to_rts_requires_timeout_retry_rnr_sq_psn_max_rd_atomic() {
        // kernel qp_state_table[IB_QPS_RTR][IB_QPS_RTS].req_param[IB_QPT_RC] / .opt_param[IB_QPT_RC]
        let req = AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        assert_eq!(required(QpType::Rc, Rtr, Rts), Some(req));
        assert_eq!(
            optional(QpType::Rc, Rtr, Rts),
            Some(
                AttrMask::CUR_STATE
                    | AttrMask::ALT_PATH
                    | AttrMask::ACCESS_FLAGS
                    | AttrMask::MIN_RNR_TIMER
                    | AttrMask::PATH_MIG_STATE
            )
        );
        assert_eq!(check(QpType::Rc, Rtr, Rts, with_state(req)), Ok(()));
        assert_eq!(
            check(QpType::Rc, Rtr, Rts, with_state(AttrMask::SQ_PSN)),
            Err(ModifyError::MissingAttributes(
                AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC
            ))
        );
        // The remote end was fixed at INIT->RTR.
        assert_eq!(
            check(QpType::Rc, Rtr, Rts, with_state(req | AttrMask::DEST_QPN)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::DEST_QPN))
        );
    }

    #[test]
    fn uc_init_to_rtr_takes_no_rd_atomic_or_min_rnr_timer() {
        // kernel qp_state_table[IB_QPS_INIT][IB_QPS_RTR].req_param[IB_QPT_UC]
        let req = AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
        assert_eq!(required(QpType::Uc, Init, Rtr), Some(req));
        assert_eq!(check(QpType::Uc, Init, Rtr, with_state(req)), Ok(()));
        assert_eq!(
            check(QpType::Uc, Init, Rtr, with_state(req | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER))
        );
    }

    #[test]
    fn uc_rtr_to_rts_requires_only_sq_psn() {
        // kernel qp_state_table[IB_QPS_RTR][IB_QPS_RTS].req_param[IB_QPT_UC] = IB_QP_SQ_PSN
        assert_eq!(required(QpType::Uc, Rtr, Rts), Some(AttrMask::SQ_PSN));
        assert_eq!(check(QpType::Uc, Rtr, Rts, with_state(AttrMask::SQ_PSN)), Ok(()));
        // No retry machinery on an unreliable service.
        assert_eq!(
            check(QpType::Uc, Rtr, Rts, with_state(AttrMask::SQ_PSN | AttrMask::TIMEOUT | AttrMask::RETRY_CNT)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::TIMEOUT | AttrMask::RETRY_CNT))
        );
    }

    #[test]
    fn ud_reset_to_init_requires_qkey_and_no_access_flags() {
        // kernel qp_state_table[IB_QPS_RESET][IB_QPS_INIT].req_param[IB_QPT_UD]
        let req = AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
        assert_eq!(required(QpType::Ud, Reset, Init), Some(req));
        assert_eq!(check(QpType::Ud, Reset, Init, with_state(req)), Ok(()));
        assert_eq!(
            check(QpType::Ud, Reset, Init, with_state(AttrMask::PKEY_INDEX | AttrMask::PORT)),
            Err(ModifyError::MissingAttributes(AttrMask::QKEY))
        );
        assert_eq!(
            check(QpType::Ud, Reset, Init, with_state(req | AttrMask::ACCESS_FLAGS)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::ACCESS_FLAGS))
        );
    }

    #[test]
    fn ud_init_to_rtr_requires_nothing_and_rtr_to_rts_only_sq_psn() {
        // kernel qp_state_table[IB_QPS_INIT][IB_QPS_RTR]: no req_param[IB_QPT_UD],
        // opt_param[IB_QPT_UD] = PKEY_INDEX | QKEY.
        assert_eq!(required(QpType::Ud, Init, Rtr), Some(AttrMask::EMPTY));
        assert_eq!(optional(QpType::Ud, Init, Rtr), Some(AttrMask::PKEY_INDEX | AttrMask::QKEY));
        assert_eq!(check(QpType::Ud, Init, Rtr, STATE), Ok(()));
        // A datagram QP has no single remote end.
        assert_eq!(
            check(QpType::Ud, Init, Rtr, with_state(AttrMask::AV | AttrMask::DEST_QPN)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::AV | AttrMask::DEST_QPN))
        );
        // kernel qp_state_table[IB_QPS_RTR][IB_QPS_RTS]: req_param[IB_QPT_UD] = SQ_PSN,
        // opt_param[IB_QPT_UD] = CUR_STATE | QKEY.
        assert_eq!(required(QpType::Ud, Rtr, Rts), Some(AttrMask::SQ_PSN));
        assert_eq!(optional(QpType::Ud, Rtr, Rts), Some(AttrMask::CUR_STATE | AttrMask::QKEY));
    }

    #[test]
    fn xrc_ini_init_to_rtr_takes_no_max_dest_rd_atomic_or_min_rnr_timer() {
        // kernel qp_state_table[IB_QPS_INIT][IB_QPS_RTR].req_param[IB_QPT_XRC_INI]: the UC set,
        // while [IB_QPT_XRC_TGT] is the RC set.
        let uc_set = AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
        let rc_set = uc_set | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        assert_eq!(required(QpType::XrcIni, Init, Rtr), Some(uc_set));
        assert_eq!(required(QpType::XrcTgt, Init, Rtr), Some(rc_set));
        assert_eq!(
            check(QpType::XrcIni, Init, Rtr, with_state(rc_set)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER))
        );
        assert_eq!(
            check(QpType::XrcTgt, Init, Rtr, with_state(uc_set)),
            Err(ModifyError::MissingAttributes(AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER))
        );
    }

    #[test]
    fn xrc_ini_rtr_to_rts_requires_the_rc_set_but_takes_no_min_rnr_timer() {
        // kernel qp_state_table[IB_QPS_RTR][IB_QPS_RTS].req_param[IB_QPT_XRC_INI] / .opt_param[IB_QPT_XRC_INI]
        let req = AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        assert_eq!(required(QpType::XrcIni, Rtr, Rts), required(QpType::Rc, Rtr, Rts));
        assert_eq!(required(QpType::XrcIni, Rtr, Rts), Some(req));
        assert_eq!(
            optional(QpType::XrcIni, Rtr, Rts),
            Some(AttrMask::CUR_STATE | AttrMask::ALT_PATH | AttrMask::ACCESS_FLAGS | AttrMask::PATH_MIG_STATE)
        );
        assert_eq!(
            check(QpType::XrcIni, Rtr, Rts, with_state(req | AttrMask::MIN_RNR_TIMER)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::MIN_RNR_TIMER))
        );
    }

    #[test]
    fn xrc_tgt_rtr_to_rts_requires_only_timeout_and_sq_psn() {
        // kernel qp_state_table[IB_QPS_RTR][IB_QPS_RTS].req_param[IB_QPT_XRC_TGT] = TIMEOUT | SQ_PSN;
        // .opt_param[IB_QPT_XRC_TGT] is RC's.
        let req = AttrMask::TIMEOUT | AttrMask::SQ_PSN;
        assert_eq!(required(QpType::XrcTgt, Rtr, Rts), Some(req));
        assert_eq!(optional(QpType::XrcTgt, Rtr, Rts), optional(QpType::Rc, Rtr, Rts));
        assert_eq!(check(QpType::XrcTgt, Rtr, Rts, with_state(req)), Ok(()));
        assert_eq!(
            check(QpType::XrcTgt, Rtr, Rts, with_state(AttrMask::SQ_PSN)),
            Err(ModifyError::MissingAttributes(AttrMask::TIMEOUT))
        );
        // The target never sends requests: no retry counts, no outstanding-read limit.
        assert_eq!(
            check(
                QpType::XrcTgt,
                Rtr,
                Rts,
                with_state(req | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC)
            ),
            Err(ModifyError::UnexpectedAttributes(
                AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC
            ))
        );
    }

    #[test]
    fn sqd_to_sqd_splits_rc_attributes_between_xrc_ini_and_xrc_tgt() {
        // kernel qp_state_table[IB_QPS_SQD][IB_QPS_SQD].opt_param[...]
        let ini = AttrMask::PORT
            | AttrMask::AV
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC
            | AttrMask::ALT_PATH
            | AttrMask::ACCESS_FLAGS
            | AttrMask::PKEY_INDEX
            | AttrMask::PATH_MIG_STATE;
        let tgt = AttrMask::PORT
            | AttrMask::AV
            | AttrMask::TIMEOUT
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::ALT_PATH
            | AttrMask::ACCESS_FLAGS
            | AttrMask::PKEY_INDEX
            | AttrMask::MIN_RNR_TIMER
            | AttrMask::PATH_MIG_STATE;
        assert_eq!(optional(QpType::XrcIni, Sqd, Sqd), Some(ini));
        assert_eq!(optional(QpType::XrcTgt, Sqd, Sqd), Some(tgt));
        assert_eq!(optional(QpType::Rc, Sqd, Sqd), Some(ini | tgt));
        // UC and UD cannot move to another port while drained.
        assert_eq!(
            optional(QpType::Uc, Sqd, Sqd),
            Some(
                AttrMask::AV
                    | AttrMask::ALT_PATH
                    | AttrMask::ACCESS_FLAGS
                    | AttrMask::PKEY_INDEX
                    | AttrMask::PATH_MIG_STATE
            )
        );
        assert_eq!(optional(QpType::Ud, Sqd, Sqd), Some(AttrMask::PKEY_INDEX | AttrMask::QKEY));
        for t in TYPES {
            assert_eq!(required(t, Sqd, Sqd), Some(AttrMask::EMPTY));
        }
        assert_eq!(check(QpType::Ud, Sqd, Sqd, AttrMask::PORT), Err(ModifyError::UnexpectedAttributes(AttrMask::PORT)));
    }

    #[test]
    fn sqe_to_rts_takes_attributes_only_for_ud_and_uc() {
        // kernel qp_state_table[IB_QPS_SQE][IB_QPS_RTS].opt_param: UD = CUR_STATE | QKEY,
        // UC = CUR_STATE | ACCESS_FLAGS, no entry for RC / XRC.
        assert_eq!(optional(QpType::Ud, Sqe, Rts), Some(AttrMask::CUR_STATE | AttrMask::QKEY));
        assert_eq!(optional(QpType::Uc, Sqe, Rts), Some(AttrMask::CUR_STATE | AttrMask::ACCESS_FLAGS));
        for t in [QpType::Rc, QpType::XrcIni, QpType::XrcTgt] {
            assert_eq!(required(t, Sqe, Rts), Some(AttrMask::EMPTY));
            assert_eq!(optional(t, Sqe, Rts), Some(AttrMask::EMPTY));
            assert_eq!(check(t, Sqe, Rts, STATE), Ok(()));
            assert_eq!(
                check(t, Sqe, Rts, with_state(AttrMask::CUR_STATE)),
                Err(ModifyError::UnexpectedAttributes(AttrMask::CUR_STATE))
            );
        }
    }

    #[test]
    fn invalid_transitions_refused() {
        // kernel qp_state_table: these cells have `.valid = 0`.
        let cases = [
            (Reset, Rtr),
            (Reset, Error),
            (Init, Rts),
            (Rtr, Rtr),
            (Rtr, Sqd),
            (Rts, Rtr),
            (Sqd, Sqe),
            (Sqe, Sqe),
            (Error, Rts),
            (Error, Init),
        ];
        for t in TYPES {
            for (from, to) in cases {
                assert_eq!(required(t, from, to), None, "{t:?} {from:?}->{to:?}");
                assert_eq!(optional(t, from, to), None, "{t:?} {from:?}->{to:?}");
                assert_eq!(
                    check(t, from, to, STATE),
                    Err(ModifyError::InvalidTransition { from, to }),
                    "{t:?} {from:?}->{to:?}"
                );
            }
        }
    }

    #[test]
    fn any_state_to_reset_and_any_but_reset_to_err_with_just_state() {
        // kernel qp_state_table[*][IB_QPS_RESET] and [*][IB_QPS_ERR] = { .valid = 1 }, except
        // [IB_QPS_RESET][IB_QPS_ERR], which is absent (IBTA 10.3.1: RESET cannot go to ERR).
        for t in TYPES {
            for from in QpState::ALL {
                assert_eq!(required(t, from, Reset), Some(AttrMask::EMPTY));
                assert_eq!(optional(t, from, Reset), Some(AttrMask::EMPTY));
                assert_eq!(check(t, from, Reset, STATE), Ok(()));
                assert_eq!(
                    check(t, from, Reset, with_state(AttrMask::PORT)),
                    Err(ModifyError::UnexpectedAttributes(AttrMask::PORT))
                );
                if from == Reset {
                    assert_eq!(check(t, from, Error, STATE), Err(ModifyError::InvalidTransition { from, to: Error }));
                } else {
                    assert_eq!(check(t, from, Error, STATE), Ok(()));
                }
            }
        }
    }

    #[test]
    fn extra_attributes_refused() {
        // kernel ib_modify_qp_is_ok: `mask & ~(req_param | opt_param | IB_QP_STATE)` fails.
        let init = AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        // CAP is never in the table (resizing a QP is a driver extension).
        assert_eq!(
            check(QpType::Rc, Reset, Init, with_state(init | AttrMask::CAP)),
            Err(ModifyError::UnexpectedAttributes(AttrMask::CAP))
        );
        // Bits the table does not know are refused too.
        assert_eq!(
            check(QpType::Rc, Reset, Init, with_state(init) | AttrMask(1 << 30)),
            Err(ModifyError::UnexpectedAttributes(AttrMask(1 << 30)))
        );
        // PATH_MTU and DEST_QPN cannot change after INIT->RTR.
        assert_eq!(
            check(QpType::Rc, Rts, Rts, AttrMask::PATH_MTU | AttrMask::DEST_QPN),
            Err(ModifyError::UnexpectedAttributes(AttrMask::PATH_MTU | AttrMask::DEST_QPN))
        );
    }

    #[test]
    fn rate_limit_is_never_accepted_for_our_types() {
        // kernel qp_state_table[IB_QPS_RTR][IB_QPS_RTS] and [IB_QPS_RTS][IB_QPS_RTS] list
        // IB_QP_RATE_LIMIT only in opt_param[IB_QPT_RAW_PACKET].
        for t in TYPES {
            for (from, to) in VALID {
                let base = required(t, from, to).unwrap() | STATE;
                assert_eq!(
                    check(t, from, to, base | AttrMask::RATE_LIMIT),
                    Err(ModifyError::UnexpectedAttributes(AttrMask::RATE_LIMIT)),
                    "{t:?} {from:?}->{to:?}"
                );
            }
        }
    }

    #[test]
    fn en_sqd_async_notify_only_on_rts_to_sqd() {
        // kernel qp_state_table[IB_QPS_RTS][IB_QPS_SQD].opt_param = IB_QP_EN_SQD_ASYNC_NOTIFY for
        // every type (with a "???" for XRC_TGT); no other cell lists it.
        for t in TYPES {
            assert_eq!(optional(t, Rts, Sqd), Some(AttrMask::EN_SQD_ASYNC_NOTIFY));
            assert_eq!(check(t, Rts, Sqd, with_state(AttrMask::EN_SQD_ASYNC_NOTIFY)), Ok(()));
            for (from, to) in VALID {
                if (from, to) != (Rts, Sqd) {
                    assert!(!optional(t, from, to).unwrap().intersects(AttrMask::EN_SQD_ASYNC_NOTIFY));
                }
            }
        }
    }

    #[test]
    fn cur_state_only_where_the_table_lists_it() {
        // kernel ib_modify_qp_is_ok: CUR_STATE needs a current state of RTR, RTS, SQD or SQE, and
        // then must be in opt_param: [RTR][RTS], [RTS][RTS], [SQD][RTS], [SQE][RTS] (UD, UC).
        let cur = AttrMask::CUR_STATE;
        assert_eq!(check(QpType::Rc, Rts, Rts, cur), Ok(()));
        assert_eq!(check(QpType::Rc, Sqd, Rts, with_state(cur)), Ok(()));
        assert_eq!(check(QpType::Ud, Sqe, Rts, with_state(cur)), Ok(()));
        let rts = AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        assert_eq!(check(QpType::Rc, Rtr, Rts, with_state(rts | cur)), Ok(()));
        for (from, to) in
            [(Init, Init), (Reset, Init), (Init, Rtr), (Error, Error), (Rts, Sqd), (Sqd, Sqd), (Rts, Error)]
        {
            let base = required(QpType::Rc, from, to).unwrap() | STATE;
            assert_eq!(
                check(QpType::Rc, from, to, base | cur),
                Err(ModifyError::UnexpectedAttributes(cur)),
                "{from:?}->{to:?}"
            );
        }
    }

    #[test]
    fn modify_without_state_change_only_from_init_rts_sqd() {
        // A mask without STATE is checked as qp_state_table[cur][cur] (drivers pass
        // next_state = cur_state): valid for RESET, INIT, RTS, SQD, ERR; not for RTR or SQE.
        assert_eq!(check(QpType::Rc, Init, Init, AttrMask::ACCESS_FLAGS), Ok(()));
        assert_eq!(check(QpType::Rc, Rts, Rts, AttrMask::ACCESS_FLAGS | AttrMask::MIN_RNR_TIMER), Ok(()));
        assert_eq!(check(QpType::Rc, Sqd, Sqd, AttrMask::AV | AttrMask::TIMEOUT), Ok(()));
        assert_eq!(check(QpType::Rc, Reset, Reset, AttrMask::EMPTY), Ok(()));
        assert_eq!(
            check(QpType::Rc, Reset, Reset, AttrMask::PORT),
            Err(ModifyError::UnexpectedAttributes(AttrMask::PORT))
        );
        assert_eq!(
            check(QpType::Rc, Rtr, Rtr, AttrMask::ACCESS_FLAGS),
            Err(ModifyError::InvalidTransition { from: Rtr, to: Rtr })
        );
        assert_eq!(
            check(QpType::Ud, Sqe, Sqe, AttrMask::QKEY),
            Err(ModifyError::InvalidTransition { from: Sqe, to: Sqe })
        );
        // The same request with STATE naming the current state is equally fine.
        assert_eq!(check(QpType::Rc, Rts, Rts, with_state(AttrMask::ACCESS_FLAGS)), Ok(()));
    }

    #[test]
    fn state_change_without_state_attribute_refused() {
        // Not in the kernel function: its callers cannot ask for this (no STATE means next = cur).
        let init = AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        assert_eq!(check(QpType::Rc, Reset, Init, init), Err(ModifyError::MissingAttributes(STATE)));
        assert_eq!(check(QpType::Rc, Rts, Error, AttrMask::EMPTY), Err(ModifyError::MissingAttributes(STATE)));
    }

    #[test]
    fn all_state_pairs_agree_with_the_table() {
        let mut valid = 0;
        for t in TYPES {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let cell = format!("{t:?} {from:?}->{to:?}");
                    let listed = VALID.contains(&(from, to));
                    let (req, opt) = match (required(t, from, to), optional(t, from, to)) {
                        (Some(req), Some(opt)) => (req, opt),
                        (None, None) => {
                            assert!(!listed, "{cell}: missing from the port");
                            assert_eq!(
                                check(t, from, to, STATE),
                                Err(ModifyError::InvalidTransition { from, to }),
                                "{cell}"
                            );
                            continue;
                        }
                        _ => panic!("{cell}: required and optional disagree on validity"),
                    };
                    assert!(listed, "{cell}: not a kernel transition");
                    valid += 1;
                    // The kernel never lists STATE, never requires CUR_STATE, never lists a bit twice.
                    assert!(!req.intersects(STATE | AttrMask::CUR_STATE), "{cell}");
                    assert!(!opt.intersects(STATE), "{cell}");
                    assert!(!req.intersects(opt), "{cell}");
                    if opt.contains(AttrMask::CUR_STATE) {
                        assert!(matches!(from, Rtr | Rts | Sqd | Sqe), "{cell}");
                    }
                    let allowed = req | opt | STATE;
                    assert_eq!(check(t, from, to, req | STATE), Ok(()), "{cell}");
                    assert_eq!(check(t, from, to, allowed), Ok(()), "{cell}");
                    for bit in KNOWN {
                        if req.contains(bit) {
                            assert_eq!(
                                check(t, from, to, allowed.difference(bit)),
                                Err(ModifyError::MissingAttributes(bit)),
                                "{cell} {bit:?}"
                            );
                        } else if allowed.contains(bit) {
                            assert_eq!(check(t, from, to, req | STATE | bit), Ok(()), "{cell} {bit:?}");
                        } else {
                            assert_eq!(
                                check(t, from, to, req | STATE | bit),
                                Err(ModifyError::UnexpectedAttributes(bit)),
                                "{cell} {bit:?}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(valid, VALID.len() * TYPES.len());
    }

    #[test]
    fn errors_name_the_attributes_and_are_einval() {
        let e = check(QpType::Ud, Reset, Init, with_state(AttrMask::PKEY_INDEX)).unwrap_err();
        assert_eq!(e.to_string(), "modify_qp mask lacks required attributes AttrMask(PORT|QKEY)");
        let e = ModifyError::UnexpectedAttributes(AttrMask::RATE_LIMIT);
        assert_eq!(e.to_string(), "modify_qp mask carries attributes not accepted here AttrMask(RATE_LIMIT)");
        let e = ModifyError::InvalidTransition { from: Reset, to: Rts };
        assert_eq!(e.to_string(), "invalid QP state transition Reset -> Rts");
        assert_eq!(VerbsError::from(e), VerbsError::Inval);
        assert_eq!(VerbsError::from(e).errno(), 22);
    }
}
