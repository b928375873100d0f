//! Steering: the kernel hands each RoCE datagram to the socket of the process that owns its
//! destination QP (docs/architecture.md D2 revised; the data-path issue, item 2).
//!
//! A device's UDP port is a `SO_REUSEPORT` group of sockets that the device (the daemon) creates
//! itself: member 0 is its own receive socket, every further member is made for one client process
//! and handed to it (the daemon keeps its own copy, so a client's death or exit closes nothing in
//! the group and no member changes its index: the kernel fills a closed member's slot with the last
//! member, which would silently re-route another client's traffic). A classic BPF program attached
//! with `SO_ATTACH_REUSEPORT_CBPF` picks the member from the BTH destination QPN:
//!
//! - The program sees the UDP payload: `ld [4]` is BTH bytes 4..7 (a reserved byte and the 24-bit
//!   DestQP, IBTA 9.2); the QPN's high bits name a *block* of [`BLOCK_QPNS`] QPNs.
//! - QPNs are allocated in blocks; a block belongs to one member ([`Steering::assign_block`]), and
//!   the program maps the block to the member's index. The program is rebuilt and replaced each
//!   time a block changes hands.
//! - Everything else returns the daemon's index **explicitly**: QP0/QP1 (block 0, always the
//!   daemon's), the multicast QPN 0xFFFFFF (the last block, always the daemon's), QPNs of blocks
//!   nobody was given (XRC target QPs and the QPs of processes on the daemon path come from the
//!   daemon's own blocks), and garbage: a datagram shorter than 8 bytes makes the load fail, and a
//!   failing classic BPF program returns 0, which is the daemon's index. An index the program
//!   returns that is out of range would *not* mean the daemon: the kernel then picks a member by
//!   the flow hash, so the program never does that.
//!
//! Steering is a convenience, not a security boundary: any process of the same user may join the
//! group or replace its program (another user cannot bind the port at all: the kernel requires the
//! same uid for one group), and a datagram can be misdelivered: the kernel picks the socket of a
//! UDP GSO super-packet (on loopback) or of a GRO run by its first segment. softrdma's devices put
//! one destination QP in each GSO send, and on loopback the kernel merges nothing else, so there
//! nothing is misdelivered. A NIC's GRO (a real NIC, or veth with GRO turned on) merges
//! consecutive datagrams of one flow (same addresses and ports) when the member the kernel looks
//! up for the flow (by its hash: the program does not run there) has GRO on, which every member
//! has. Every QP sends from a source port of its own (hashed from its QPN over its process's pool,
//! providers included), so a connected QP's flow holds one destination QP; a UD QP reaching QPs
//! of several processes, or a foreign sender mixing destination QPs in one flow, still makes a
//! mixed flow, and so does a foreign sender's GSO send mixing destination QPs. The member that
//! gets such a run passes the segments that are not its own on to their owner through the relay
//! ([`crate::relay`]: a link from each client member to the daemon). Turning GRO off on every
//! member instead cost 2.5-3.5x of the 64-byte message rate between `softrdma cluster` hosts
//! (BENCHMARKS.md, "GRO on a NIC").
//! Whoever receives still validates every packet ([`Steering::owner`] and [`dest_qpn`] tell
//! whose it is).
//!
//! Cost, measured for this decision (busy-poll ping-pong between two processes, 2 cores): 2.06 us
//! one-way through a steered group against 2.01 us for a plain socket pair.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{self as nsock, sockopt};
use socket2::{SockAddr, Socket};

use crate::udp::{self, UdpError};

/// Bits of a QPN below the block number (the engine allocates QPNs by the same blocks).
pub const BLOCK_SHIFT: u32 = softrdma_engine::device::QPN_BLOCK_SHIFT;
/// QPNs per block (4096).
pub const BLOCK_QPNS: u32 = 1 << BLOCK_SHIFT;
/// Blocks in the 24-bit QPN space (4096).
pub const BLOCKS: u32 = 1 << (24 - BLOCK_SHIFT);
/// The member index of the daemon's own receive socket.
pub const DAEMON_INDEX: u32 = 0;
/// The largest classic BPF program the kernel accepts (`BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;

/// The block of a QPN.
pub fn block_of(qpn: u32) -> u32 {
    (qpn & 0x00FF_FFFF) >> BLOCK_SHIFT
}

/// The first QPN of a block.
pub fn block_start(block: u32) -> u32 {
    block << BLOCK_SHIFT
}

/// Whether a block can ever be a client's: block 0 holds QP0 and QP1 (the CM), the last block
/// the multicast QPN 0xFFFFFF; both stay the daemon's.
pub fn assignable(block: u32) -> bool {
    block != 0 && block < BLOCKS - 1
}

/// The BTH destination QPN of a RoCEv2 UDP payload, or `None` if it is too short to hold a BTH.
pub fn dest_qpn(payload: &[u8]) -> Option<u32> {
    let b = payload.get(4..8)?;
    Some(u32::from_be_bytes([0, b[1], b[2], b[3]]))
}

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
const BPF_ALU_AND_K: u16 = 0x04 | 0x50; // BPF_ALU | BPF_AND | BPF_K
const BPF_ALU_RSH_K: u16 = 0x04 | 0x70; // BPF_ALU | BPF_RSH | BPF_K
const BPF_JMP_JGT_K: u16 = 0x05 | 0x20; // BPF_JMP | BPF_JGT | BPF_K
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// One classic BPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

const fn stmt(code: u16, k: u32) -> Insn {
    Insn { code, jt: 0, jf: 0, k }
}

/// A run of consecutive blocks that steer to one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First block.
    pub first: u32,
    /// Last block (inclusive).
    pub last: u32,
    /// Member index.
    pub index: u32,
}

/// Runs of equal owners from a block table (block -> member index), in block order.
pub fn runs(owners: &BTreeMap<u32, u32>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (&block, &index) in owners {
        match out.last_mut() {
            Some(r) if r.index == index && r.last + 1 == block => r.last = block,
            _ => out.push(Run { first: block, last: block, index }),
        }
    }
    out
}

/// Most runs one program can steer: three instructions per run, four more around them.
pub const MAX_RUNS: usize = (MAX_INSNS - 4) / 3;

/// The steering program for `runs` (sorted, disjoint): the member of the run that holds the
/// datagram's destination block, else [`DAEMON_INDEX`].
///
/// ```text
///   ld  [4]              A = BTH bytes 4..7 (a short datagram fails here: the program returns 0)
///   and #0xffffff        the DestQP
///   rsh #12              its block
///   per run:  jgt #last, skip 2 ; jge #first, next, skip 1 ; ret #index
///   ret #0               nobody's: the daemon
/// ```
/// Each run costs three instructions and the scan is linear: a device with many clients whose
/// blocks are scattered pays a few nanoseconds per run and datagram; [`Steering`] keeps each
/// client's blocks together where it can.
pub fn program(runs: &[Run]) -> Vec<Insn> {
    let mut p = Vec::with_capacity(4 + 3 * runs.len());
    p.push(stmt(BPF_LD_W_ABS, 4));
    p.push(stmt(BPF_ALU_AND_K, 0x00FF_FFFF));
    p.push(stmt(BPF_ALU_RSH_K, BLOCK_SHIFT));
    for r in runs {
        // Above this run: skip its other two instructions.
        p.push(Insn { code: BPF_JMP_JGT_K, jt: 2, jf: 0, k: r.last });
        // Not above: inside if at or above its first block, else on to the next run.
        p.push(Insn { code: BPF_JMP_JGE_K, jt: 0, jf: 1, k: r.first });
        p.push(stmt(BPF_RET_K, r.index));
    }
    p.push(stmt(BPF_RET_K, DAEMON_INDEX));
    p
}

/// Runs a steering program on a UDP payload as the kernel would (a classic BPF interpreter for
/// the instructions [`program`] emits); for tests and for checking a program before it is
/// installed. Returns the member index, or `None` for an instruction it does not know.
pub fn run_program(p: &[Insn], payload: &[u8]) -> Option<u32> {
    let mut a: u32 = 0;
    let mut pc = 0usize;
    while let Some(i) = p.get(pc) {
        pc += 1;
        match i.code {
            BPF_LD_W_ABS => {
                let at = i.k as usize;
                match payload.get(at..at + 4) {
                    Some(w) => a = u32::from_be_bytes([w[0], w[1], w[2], w[3]]),
                    // A load beyond the packet ends the program with 0.
                    None => return Some(0),
                }
            }
            BPF_ALU_AND_K => a &= i.k,
            BPF_ALU_RSH_K => a = a.checked_shr(i.k).unwrap_or(0),
            BPF_JMP_JGT_K => pc += usize::from(if a > i.k { i.jt } else { i.jf }),
            BPF_JMP_JGE_K => pc += usize::from(if a >= i.k { i.jt } else { i.jf }),
            BPF_RET_K => return Some(i.k),
            _ => return None,
        }
    }
    None
}

/// A member socket made for a client: its index in the group and a duplicate of the socket to
/// hand over (the group keeps its own).
#[derive(Debug)]
pub struct Member {
    /// The member's index (what the program returns for its blocks).
    pub index: u32,
    /// The socket, close-on-exec and nonblocking, bound to the group's address.
    pub fd: OwnedFd,
}

/// The device's side of a steered port: the group's members and which blocks steer to them.
#[derive(Debug)]
pub struct Steering {
    local: SocketAddr,
    /// Every member, index = position; 0 is a duplicate of the daemon's receive socket.
    members: Vec<Socket>,
    /// Members free to give to the next client (their last client is gone; they own no block).
    spare: Vec<u32>,
    /// Block -> member, for the blocks given to members (the rest are the daemon's).
    owners: BTreeMap<u32, u32>,
    /// Times a program was installed.
    installs: u64,
}

impl Steering {
    /// Makes `daemon` (the device's receive socket, bound with `SO_REUSEPORT`, see
    /// [`udp::RoceUdp::bind`] with [`udp::UdpConfig::steered`]) member 0 and installs the program
    /// that steers everything to it.
    pub(crate) fn new(local: SocketAddr, daemon: &Socket) -> Result<Steering, UdpError> {
        let own = daemon.try_clone().map_err(|e| udp::setup_error(local, "duplicating the receive socket", e))?;
        let mut s = Steering { local, members: vec![own], spare: Vec::new(), owners: BTreeMap::new(), installs: 0 };
        s.install()
            .map_err(|e| udp::setup_error(local, "attaching the steering program (SO_ATTACH_REUSEPORT_CBPF)", e))?;
        Ok(s)
    }

    /// Members in the group, the daemon's included.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The member a datagram for `qpn` is steered to.
    pub fn owner(&self, qpn: u32) -> u32 {
        self.owners.get(&block_of(qpn)).copied().unwrap_or(DAEMON_INDEX)
    }

    /// The blocks given to `index`, in order.
    pub fn blocks_of(&self, index: u32) -> Vec<u32> {
        self.owners.iter().filter(|&(_, &i)| i == index).map(|(&b, _)| b).collect()
    }

    /// Every block given to a client member, in order.
    pub fn assigned_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.owners.keys().copied()
    }

    /// Times a steering program was installed (one at start, one per change of hands).
    pub fn installs(&self) -> u64 {
        self.installs
    }

    /// The program now installed.
    pub fn current_program(&self) -> Vec<Insn> {
        program(&runs(&self.owners))
    }

    /// A member for a new client: a spare one whose client is gone, else a new socket bound into
    /// the group. The socket has the receive options of the device's own (packet info, TTL, TOS),
    /// and is close-on-exec.
    pub fn add_member(&mut self) -> Result<Member, UdpError> {
        let index = match self.spare.pop() {
            Some(i) => i,
            None => {
                let s = udp::new_socket(self.local)?;
                nsock::setsockopt(&s, sockopt::ReusePort, &true)
                    .map_err(|e| udp::setup_error(self.local, "setting SO_REUSEPORT", e.into()))?;
                s.bind(&SockAddr::from(self.local)).map_err(|e| udp::bind_error(self.local, self.local.ip(), e))?;
                let _ = s.set_recv_buffer_size(udp::SOCKET_BUFFER_BYTES);
                udp::configure_receive(&s, self.local)?;
                self.members.push(s);
                (self.members.len() - 1) as u32
            }
        };
        let fd = self.members[index as usize]
            .try_clone()
            .map_err(|e| udp::setup_error(self.local, "duplicating a member socket", e))?;
        Ok(Member { index, fd: fd.into() })
    }

    /// Gives `index` a free block (next to its other blocks if one is free there, so its QPNs stay
    /// one run of the program) and installs the new program. `None` if `index` is not a client
    /// member, no block is free, or the program would grow beyond what the kernel takes; the
    /// caller then allocates from the daemon's blocks (the daemon path still works for them).
    ///
    /// `take` is asked about each candidate block and says whether the device can give it up
    /// (it has no QP there; it then stops allocating from it); a block it refuses is passed over.
    pub fn assign_block(&mut self, index: u32, mut take: impl FnMut(u32) -> bool) -> io::Result<Option<u32>> {
        if index == DAEMON_INDEX || index as usize >= self.members.len() || self.spare.contains(&index) {
            return Ok(None);
        }
        let free = |b: u32| assignable(b) && !self.owners.contains_key(&b);
        let mut candidates =
            self.blocks_of(index).into_iter().flat_map(|b| [b + 1, b.wrapping_sub(1)]).collect::<Vec<_>>();
        candidates.extend(1..BLOCKS - 1);
        let Some(block) = candidates.into_iter().find(|&b| free(b) && take(b)) else {
            return Ok(None);
        };
        self.owners.insert(block, index);
        if runs(&self.owners).len() > MAX_RUNS {
            self.owners.remove(&block);
            return Ok(None);
        }
        if let Err(e) = self.install() {
            self.owners.remove(&block);
            return Err(e);
        }
        Ok(Some(block))
    }

    /// Takes every block of `index` back (its client is gone or left the steered path) and keeps
    /// the member for the next client. Datagrams still queued in its socket are the next client's
    /// to drop: they name QPNs it does not have.
    pub fn release(&mut self, index: u32) -> io::Result<()> {
        if index == DAEMON_INDEX || index as usize >= self.members.len() || self.spare.contains(&index) {
            return Ok(());
        }
        self.owners.retain(|_, i| *i != index);
        self.spare.push(index);
        self.install()
    }

    /// Replaces the group's program with the one for the current blocks.
    fn install(&mut self) -> io::Result<()> {
        let p = self.current_program();
        let filters: Vec<libc::sock_filter> =
            p.iter().map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect();
        let prog = libc::sock_fprog { len: filters.len() as u16, filter: filters.as_ptr() as *mut libc::sock_filter };
        // SAFETY: setsockopt(2) with SO_ATTACH_REUSEPORT_CBPF reads a `sock_fprog` of the given
        // size; `prog` points at `filters`, which lives until the call returns, and the fd is the
        // group's own member 0, open for as long as `self`.
        let r = unsafe {
            libc::setsockopt(
                self.members[0].as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_REUSEPORT_CBPF,
                (&raw const prog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        self.installs += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bth(qpn: u32) -> Vec<u8> {
        let mut p = vec![0u8; 12];
        p[0] = 0x04; // RC SEND_ONLY
        p[4] = 0xAB; // reserved byte: must not matter
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p
    }

    #[test]
    fn the_program_maps_blocks_to_members_and_everything_else_to_the_daemon() {
        let mut owners = BTreeMap::new();
        for b in [3, 4, 5] {
            owners.insert(b, 1);
        }
        owners.insert(7, 2);
        owners.insert(8, 1);
        let r = runs(&owners);
        assert_eq!(r.len(), 3);
        let p = program(&r);
        let at = |qpn| run_program(&p, &bth(qpn)).unwrap();
        assert_eq!(at(block_start(3)), 1);
        assert_eq!(at(block_start(5) + BLOCK_QPNS - 1), 1);
        assert_eq!(at(block_start(6)), DAEMON_INDEX);
        assert_eq!(at(block_start(7) + 17), 2);
        assert_eq!(at(block_start(8)), 1);
        assert_eq!(at(block_start(9)), DAEMON_INDEX);
        assert_eq!(at(1), DAEMON_INDEX, "QP1");
        assert_eq!(at(0xFF_FFFF), DAEMON_INDEX, "multicast");
        assert_eq!(run_program(&p, &[0x04, 0, 0xff, 0xff, 0, 0]), Some(DAEMON_INDEX), "short");
        assert_eq!(run_program(&program(&[]), &bth(block_start(3))), Some(DAEMON_INDEX));
    }

    #[test]
    fn dest_qpn_reads_the_bth() {
        assert_eq!(dest_qpn(&bth(0x12_3456)), Some(0x12_3456));
        assert_eq!(dest_qpn(&[0; 7]), None);
    }
}
