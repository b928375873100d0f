//! How the device reaches its clients' memory (design D3): `process_vm_readv`/`process_vm_writev`
//! on the client's pid, after the engine has checked the key, bounds and access rights against its
//! memory region table.
//!
//! Atomics are a read and a write under the device lock, so they are atomic with respect to every
//! other RDMA atomic on the device (IBV_ATOMIC_HCA, what `ibv_query_device` reports), as on an HCA;
//! they are not atomic with respect to the client's own CPU stores, as on most HCAs.
//!
//! Ordering: applications poll the last byte of an RDMA WRITE. The engine writes a message packet
//! by packet in PSN order; within one call the kernel copies the iovecs front to back, and x86
//! stores become visible in program order, so the last cache line of a message lands last.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

use std::os::unix::net::UnixStream;

use crate::arena::{Arena, STAGING_LEN, STAGING_OFF};
use crate::proto::{self, MemOp, MemReply};

use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;
use softrdma_engine::memory::{Memory, MemoryError, Owner};

/// The memory of every attached client, by owner.
#[derive(Default)]
pub struct ProcessMemory {
    pids: HashMap<Owner, i32>,
    /// Each client's arena: received data for a staged receive lands in its staging area.
    arenas: HashMap<Owner, Arc<Arena>>,
    /// Clients whose memory the kernel does not let the device reach: their helper's socket.
    helpers: HashMap<Owner, UnixStream>,
    /// Failed cross-process accesses (the client unmapped the buffer, or the kernel refused).
    pub faults: u64,
    /// Cross-process reads (process_vm_readv calls).
    pub reads: u64,
    /// Cross-process writes (process_vm_writev calls).
    pub writes: u64,
    /// Accesses served by clients' memory helpers.
    pub helper_ops: u64,
    /// Writes accepted but not yet made (see [`ProcessMemory::flush`]): owner, remote address,
    /// and the data's place in `pending_data`.
    pending: Vec<(Owner, u64, std::ops::Range<usize>)>,
    pending_data: Vec<u8>,
    /// Bytes read ahead (see [`Memory::read_ahead`]): whose, from where, and how many are valid.
    ahead: Option<(Owner, u64)>,
    ahead_data: Vec<u8>,
}

/// The most a read ahead fetches in one call.
const READ_AHEAD: usize = 256 << 10;

/// At most this many bytes or writes wait for a flush; one more flushes first.
const PENDING_BYTES: usize = 1 << 20;
const PENDING_WRITES: usize = 1024;

impl ProcessMemory {
    /// Maps an owner to its process.
    pub fn attach(&mut self, owner: Owner, pid: i32) {
        self.pids.insert(owner, pid);
    }

    /// Reaches an owner's memory through its helper instead of process_vm_readv/writev. Calls
    /// wait at most a second for the helper (then the access fails, as a fault).
    pub fn attach_helper(&mut self, owner: Owner, sock: UnixStream) {
        let _ = sock.set_read_timeout(Some(std::time::Duration::from_secs(1)));
        self.helpers.insert(owner, sock);
    }

    fn helper(&mut self, owner: Owner, op: MemOp) -> Option<Vec<u8>> {
        let sock = self.helpers.get(&owner)?;
        self.helper_ops += 1;
        let r = proto::send(sock, &op, &[]).ok().and_then(|()| proto::recv::<MemReply>(sock).ok());
        match r {
            Some((MemReply::Ok(v), _)) => Some(v),
            Some((MemReply::Fault, _)) => None,
            None => {
                // A helper that does not answer is gone: so is the way to that memory.
                self.helpers.remove(&owner);
                None
            }
        }
    }

    /// Gives an owner's staging addresses ([`STAGE_VA`] ..) their arena.
    pub fn attach_arena(&mut self, owner: Owner, arena: Arc<Arena>) {
        self.arenas.insert(owner, arena);
    }

    /// The process of an owner.
    pub fn pid_of(&self, owner: Owner) -> Option<i32> {
        self.pids.get(&owner).copied()
    }

    /// Makes every pending write, in the order they were accepted: one process_vm_writev per run
    /// of consecutive writes to one owner (up to 1024 iovecs), instead of one call per packet.
    ///
    /// The device calls it before anything can observe the data: before it sends the ACKs and
    /// READ responses and writes the completions that follow the packets, and before any read or
    /// atomic (which may touch the same bytes). Every write was checked against the MR table when
    /// it was accepted; one that fails here (the client unmapped a registered buffer, or exited)
    /// is counted in `faults` and lost, as a DMA into a buffer its owner gave up would be.
    pub fn flush(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let mut i = 0;
        while i < pending.len() {
            let owner = pending[i].0;
            let mut j = i;
            while j < pending.len() && pending[j].0 == owner && j - i < 1024 {
                j += 1;
            }
            let run = &pending[i..j];
            let want: usize = run.iter().map(|(_, _, r)| r.len()).sum();
            let done = match self.pids.get(&owner) {
                Some(&pid) => {
                    self.writes += 1;
                    let local: Vec<IoSlice<'_>> =
                        run.iter().map(|(_, _, r)| IoSlice::new(&self.pending_data[r.clone()])).collect();
                    let remote: Vec<RemoteIoVec> =
                        run.iter().map(|(_, a, r)| RemoteIoVec { base: *a as usize, len: r.len() }).collect();
                    process_vm_writev(Pid::from_raw(pid), &local, &remote).is_ok_and(|n| n == want)
                }
                None => false,
            };
            if !done {
                // Find the writes that fail one by one (the kernel stops at the first bad one).
                for (o, a, r) in run {
                    let ok = match self.pids.get(o) {
                        Some(&pid) => {
                            self.writes += 1;
                            let data = &self.pending_data[r.clone()];
                            let remote = [RemoteIoVec { base: *a as usize, len: r.len() }];
                            process_vm_writev(Pid::from_raw(pid), &[IoSlice::new(data)], &remote)
                                .is_ok_and(|n| n == r.len())
                        }
                        None => false,
                    };
                    if !ok {
                        self.faults += 1;
                    }
                }
            }
            i = j;
        }
        self.pending_data.clear();
        self.pending = pending;
        self.pending.clear();
    }

    /// Drops what was read ahead. The device calls it when it takes new work requests from the
    /// rings (a buffer's owner may have changed it since its last request completed) and on every
    /// verbs call (MRs may have changed).
    pub fn forget_read_ahead(&mut self) {
        self.ahead = None;
    }

    /// Forgets an owner.
    pub fn detach(&mut self, owner: Owner) {
        self.ahead = None;
        self.flush();
        self.pids.remove(&owner);
        self.arenas.remove(&owner);
        self.helpers.remove(&owner);
    }

    /// The staging offset of `[addr, addr+len)` if it is a staging address range.
    fn staging(addr: u64, len: usize) -> Option<usize> {
        let rel = addr.checked_sub(STAGE_VA)?;
        (rel.checked_add(len as u64)? <= STAGING_LEN as u64).then_some(STAGING_OFF + rel as usize)
    }

    fn pid(&self, owner: Owner, addr: u64, len: usize) -> Result<Pid, MemoryError> {
        self.pids.get(&owner).map(|p| Pid::from_raw(*p)).ok_or(MemoryError { addr, len })
    }
}

impl Memory for ProcessMemory {
    fn read_ahead(&mut self, owner: Owner, addr: u64, buf: &mut [u8], avail: u64) -> Result<(), MemoryError> {
        let len = buf.len();
        let inside = |base: u64, have: usize| {
            addr.checked_sub(base).is_some_and(|o| o.checked_add(len as u64).is_some_and(|e| e <= have as u64))
        };
        if let Some((o, base)) = self.ahead {
            if o == owner && inside(base, self.ahead_data.len()) {
                let at = (addr - base) as usize;
                buf.copy_from_slice(&self.ahead_data[at..at + len]);
                return Ok(());
            }
        }
        let want = (avail.min(READ_AHEAD as u64) as usize).max(len);
        if want <= len || self.helpers.contains_key(&owner) || ProcessMemory::staging(addr, len).is_some() {
            return self.read(owner, addr, buf);
        }
        self.flush();
        let pid = self.pid(owner, addr, len)?;
        self.reads += 1;
        self.ahead = None;
        let mut data = std::mem::take(&mut self.ahead_data);
        data.resize(want, 0);
        let remote = [RemoteIoVec { base: addr as usize, len: want }];
        // The kernel stops at the first page it cannot read: what came before is good.
        let got = process_vm_readv(pid, &mut [IoSliceMut::new(&mut data)], &remote).unwrap_or(0);
        if got < len {
            self.ahead_data = data;
            self.faults += 1;
            return Err(MemoryError { addr, len });
        }
        data.truncate(got);
        buf.copy_from_slice(&data[..len]);
        self.ahead_data = data;
        self.ahead = Some((owner, addr));
        Ok(())
    }

    fn read(&mut self, owner: Owner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let len = buf.len();
        if len == 0 {
            return Ok(());
        }
        if self.helpers.contains_key(&owner) {
            self.reads += 1;
            return match self.helper(owner, MemOp::Read { addr, len: len as u32 }) {
                Some(v) if v.len() == len => {
                    buf.copy_from_slice(&v);
                    Ok(())
                }
                _ => {
                    self.faults += 1;
                    Err(MemoryError { addr, len })
                }
            };
        }
        // A read may cover bytes a pending write changes.
        self.flush();
        let pid = self.pid(owner, addr, len)?;
        self.reads += 1;
        let remote = [RemoteIoVec { base: addr as usize, len }];
        match process_vm_readv(pid, &mut [IoSliceMut::new(buf)], &remote) {
            Ok(n) if n == len => Ok(()),
            _ => {
                self.faults += 1;
                Err(MemoryError { addr, len })
            }
        }
    }

    fn write(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let len = data.len();
        if len == 0 {
            return Ok(());
        }
        // What was read ahead may be what this changes.
        self.ahead = None;
        if let Some(off) = ProcessMemory::staging(addr, len) {
            return match self.arenas.get(&owner) {
                Some(a) if a.stage_write(off, data) => Ok(()),
                _ => Err(MemoryError { addr, len }),
            };
        }
        if self.helpers.contains_key(&owner) {
            self.writes += 1;
            return match self.helper(owner, MemOp::Write { addr, data: data.to_vec() }) {
                Some(_) => Ok(()),
                None => {
                    self.faults += 1;
                    Err(MemoryError { addr, len })
                }
            };
        }
        self.pid(owner, addr, len)?;
        if self.pending.len() >= PENDING_WRITES || self.pending_data.len() + len > PENDING_BYTES {
            self.flush();
        }
        let start = self.pending_data.len();
        self.pending_data.extend_from_slice(data);
        self.pending.push((owner, addr, start..start + len));
        Ok(())
    }
}

/// Where the staging area of a client's arena appears to the engine: a device-internal memory
/// region of every PD covers `[STAGE_VA, STAGE_VA + STAGING_LEN)`. The address is not canonical
/// on x86-64 (no user mapping can be there), so it never names client memory.
pub const STAGE_VA: u64 = 0xffff_c000_0000_0000;

/// Whether the device can read process `pid`'s memory: the word at `probe` must hold
/// [`crate::proto::PROBE`].
pub fn can_reach(pid: i32, probe: u64) -> bool {
    let mut m = ProcessMemory::default();
    m.attach(0, pid);
    let mut b = [0u8; 8];
    m.read(0, probe, &mut b).is_ok() && u64::from_ne_bytes(b) == crate::proto::PROBE
}

/// Whether `[addr, addr+len)` lies in mappings of process `pid` that are readable (and writable
/// when `write`), from /proc/PID/maps: what pinning the pages would check (the kernel's
/// ib_umem_get fails with EFAULT otherwise).
pub fn range_mapped(pid: i32, addr: u64, len: u64, write: bool) -> bool {
    let Some(end) = addr.checked_add(len) else { return false };
    if len == 0 {
        return true;
    }
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return false };
    let mut covered = addr;
    let mut ranges: Vec<(u64, u64, bool, bool)> = maps
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (a, b) = it.next()?.split_once('-')?;
            let perms = it.next()?.as_bytes();
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                perms.first() == Some(&b'r'),
                perms.get(1) == Some(&b'w'),
            ))
        })
        .collect();
    ranges.sort_unstable();
    for (s, e, r, w) in ranges {
        if e <= covered || s > covered {
            continue;
        }
        if !r || (write && !w) {
            return false;
        }
        covered = e;
        if covered >= end {
            return true;
        }
    }
    false
}

/// Serves the device's [`MemOp`]s on this process's memory until the socket closes (the client
/// side of the fallback). Accesses go through process_vm_readv/writev on this very process, which
/// the kernel allows when it refuses others, so a bad address is a fault, not a crash.
pub fn serve_helper(sock: UnixStream) {
    let me = Pid::this();
    while let Ok((op, _)) = proto::recv::<MemOp>(&sock) {
        let reply = match op {
            MemOp::Read { addr, len } => {
                let mut buf = vec![0u8; len as usize];
                let remote = [RemoteIoVec { base: addr as usize, len: len as usize }];
                match process_vm_readv(me, &mut [IoSliceMut::new(&mut buf)], &remote) {
                    Ok(n) if n == len as usize => MemReply::Ok(buf),
                    _ => MemReply::Fault,
                }
            }
            MemOp::Write { addr, data } => {
                let remote = [RemoteIoVec { base: addr as usize, len: data.len() }];
                match process_vm_writev(me, &[IoSlice::new(&data)], &remote) {
                    Ok(n) if n == data.len() => MemReply::Ok(Vec::new()),
                    _ => MemReply::Fault,
                }
            }
        };
        if proto::send(&sock, &reply, &[]).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_own_process() {
        let mut buf = vec![7u8; 64];
        let mut m = ProcessMemory::default();
        m.attach(1, std::process::id() as i32);
        let addr = buf.as_mut_ptr() as u64;
        m.write(1, addr + 8, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 4];
        m.read(1, addr + 7, &mut out).unwrap();
        assert_eq!(out, [7, 1, 2, 3]);
        assert_eq!(m.fetch_add(1, addr + 16, 5).unwrap(), u64::from_ne_bytes([7; 8]));
        assert_eq!(m.compare_swap(1, addr + 16, 1, 9).unwrap(), u64::from_ne_bytes([7; 8]) + 5);
        assert!(m.read(2, addr, &mut out).is_err(), "unknown owner");
        assert!(m.read(1, 8, &mut out).is_err(), "unmapped address");
        assert_eq!(m.faults, 1);
        std::hint::black_box(&buf);
    }

    #[test]
    fn mapped_ranges() {
        let v = vec![0u8; 1 << 16];
        let pid = std::process::id() as i32;
        assert!(range_mapped(pid, v.as_ptr() as u64, v.len() as u64, true));
        assert!(!range_mapped(pid, 4096, 4096, false));
        assert!(!range_mapped(pid, u64::MAX - 1, 4, false));
        // Code is mapped but not writable.
        let f = mapped_ranges as fn() as usize as u64;
        assert!(range_mapped(pid, f, 16, false));
        assert!(!range_mapped(pid, f, 16, true));
    }
}
