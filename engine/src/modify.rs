//! QP state transitions and their attribute masks (being written).
