//! How the device reaches its clients' memory (docs/architecture.md D3):
//! `process_vm_readv`/`process_vm_writev` on the client's pid, after the engine has checked the
//! key, bounds and access rights against its memory region table. A device running in its client's
//! own process (a provider) reaches that process's memory by guarded copies instead
//! ([`crate::guard`]: no system call, and a fault on memory the program has unmapped fails the
//! access instead of crashing the program): the buffers the client posted itself (receives, READ
//! and atomic results, [`Memory::write_local`]), a peer's RDMA WRITE, and what a READ response or a
//! send reads. Atomics keep to the system calls.
//!
//! Atomics are a read and a write under the device lock, so they are atomic with respect to every
//! other RDMA atomic on the device (IBV_ATOMIC_HCA, what `ibv_query_device` reports), as on an HCA;
//! they are not atomic with respect to the client's own CPU stores, as on most HCAs.
//!
//! Ordering: applications poll the last byte of an RDMA WRITE. The engine writes a message packet
//! by packet in PSN order; within one call the kernel copies the iovecs front to back, and x86
//! stores become visible in program order, so the last cache line of a message lands last.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use crate::arena::{Arena, STAGING_LEN, STAGING_OFF};
use crate::proto::{self, MemOp, MemReply};

use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;
use softrdma_engine::copy::{copy_bytes, extend_bytes, lead_in, lead_out};
use softrdma_engine::memory::{AtomicOp, AtomicStart, Memory, MemoryError, Owner};

/// Keyed by owners and request numbers (ours): a fast hash, looked up on every access.
type HashMap<K, V> = std::collections::HashMap<K, V, rustc_hash::FxBuildHasher>;

/// The memory of every attached client, by owner.
#[derive(Default)]
pub struct ProcessMemory {
    pids: HashMap<Owner, i32>,
    /// Owners that are this very process (a provider's, a device embedded in its program): the
    /// buffers they post themselves are written directly ([`Memory::write_local`]).
    local: std::collections::HashSet<Owner, rustc_hash::FxBuildHasher>,
    /// Each client's arena: received data for a staged receive lands in its staging area.
    arenas: HashMap<Owner, Arc<Arena>>,
    /// Clients whose memory the kernel does not let the device reach: the way to their helper.
    helpers: HashMap<Owner, HelperLink>,
    /// Numbers the requests to helpers (and an atomic's ticket is its request's number).
    next_request: u64,
    /// Atomics sent to a helper: whose, and the original value once it came (`Err`: it failed).
    atomics: HashMap<u64, (Owner, Option<Result<u64, MemoryError>>)>,
    /// Accesses that would have blocked (see [`Memory::would_block_count`]).
    would_block: u64,
    /// The last write sent to a helper since the last [`Memory::write_fence`]: whose, and its
    /// number on that helper's link.
    last_write: Option<(Owner, u64)>,
    /// Failed cross-process accesses (the client unmapped the buffer, or the kernel refused).
    pub faults: u64,
    /// Cross-process reads (process_vm_readv calls).
    pub reads: u64,
    /// Cross-process writes (process_vm_writev calls).
    pub writes: u64,
    /// Accesses served by clients' memory helpers.
    pub helper_ops: u64,
    /// Accesses to this process's own memory by guarded copy ([`crate::guard`]).
    pub guarded_copies: u64,
    /// This process's own memory is reached like another's (system calls), not by guarded
    /// copies ([`ProcessMemory::set_guarded`]).
    unguarded: bool,
    /// Writes accepted but not yet made (see [`ProcessMemory::flush`]): owner, remote address,
    /// and the data's place in `pending_data`.
    pending: Vec<(Owner, u64, std::ops::Range<usize>)>,
    pending_data: Vec<u8>,
    /// Bytes read ahead (see [`Memory::read_ahead`]): whose, from where, and where in
    /// `ahead_data` they start (a lead-in that keeps the kernel's copy fast: `copy::lead_in`).
    ahead: Option<(Owner, u64, usize)>,
    ahead_data: Vec<u8>,
}

/// The most a read ahead fetches in one call.
const READ_AHEAD: usize = 256 << 10;

/// At most this many bytes or writes wait for a flush; one more flushes first.
const PENDING_BYTES: usize = 1 << 20;
const PENDING_WRITES: usize = 1024;

impl ProcessMemory {
    /// Whether this process's own memory is reached by guarded copies (the default where they
    /// are available, [`crate::guard`]) or, with `false`, by the system calls that reach another
    /// process's (`$SOFTRDMA_GUARDED_COPY=0` sets it so, to compare the two), except the buffers
    /// the process posted itself, which it then copies unguarded.
    pub fn set_guarded(&mut self, on: bool) {
        self.unguarded = !on;
    }

    /// Maps an owner to its process.
    pub fn attach(&mut self, owner: Owner, pid: i32) {
        self.pids.insert(owner, pid);
        if pid == std::process::id() as i32 {
            self.local.insert(owner);
        } else {
            self.local.remove(&owner);
        }
    }

    /// Reaches an owner's memory through its helper instead of process_vm_readv/writev, waiting
    /// at most [`HELPER_TIMEOUT`] for each answer (then the helper is gone, and so is the way to
    /// that memory: its accesses fail, as faults). `wake` is told when an answer arrives.
    pub fn attach_helper(&mut self, owner: Owner, sock: UnixStream, wake: OwnedFd) {
        self.attach_helper_timeout(owner, sock, wake, HELPER_TIMEOUT);
    }

    /// [`ProcessMemory::attach_helper`] with another time limit per answer.
    pub fn attach_helper_timeout(&mut self, owner: Owner, sock: UnixStream, wake: OwnedFd, timeout: Duration) {
        let _ = sock.set_read_timeout(Some(timeout));
        let _ = sock.set_write_timeout(Some(timeout));
        let (to_worker, requests) = channel();
        let (answers, from_worker) = channel();
        let applied = Arc::new(AtomicU64::new(0));
        let done = applied.clone();
        let spawned = std::thread::Builder::new().name(format!("softrdma-helper-{owner}")).spawn(move || {
            crate::signals::keep_off_this_thread();
            helper_link_worker(&sock, &requests, &answers, &done, &wake)
        });
        let mut link = HelperLink {
            to_worker,
            from_worker,
            writes: 0,
            applied,
            applied_seen: 0,
            reads: HashMap::default(),
            fetched: Vec::new(),
            gone: false,
        };
        link.gone = spawned.is_err();
        self.helpers.insert(owner, link);
    }

    /// Whether `owner`'s memory is reached through its memory helper.
    pub fn has_helper(&self, owner: Owner) -> bool {
        self.helpers.contains_key(&owner)
    }

    /// Writes sent to `owner`'s memory helper so far (0 without one): the client lets its
    /// helper make as many before it shows a completion the device produced after them.
    pub fn helper_writes(&self, owner: Owner) -> u64 {
        self.helpers.get(&owner).map_or(0, |h| h.writes)
    }

    /// Takes in what the helpers answered since the last round: the reads answered become what
    /// this round's accesses find (the last round's are dropped: a helper's memory may have
    /// changed since), the atomics their results. Returns whether anything came, so that the
    /// engine retries what waited ([`softrdma_engine::device::Device::memory_ready`]).
    pub fn helper_round(&mut self) -> bool {
        let mut news = false;
        for (&owner, h) in self.helpers.iter_mut() {
            h.fetched.clear();
            let applied = h.applied.load(Ordering::Acquire);
            if applied != h.applied_seen {
                // Writes landed: answers that waited for them (Memory::fence_passed) may go.
                h.applied_seen = applied;
                news = true;
            }
            loop {
                let (id, answer) = match h.from_worker.try_recv() {
                    Ok(a) => a,
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        news |= !h.gone;
                        h.gone = true;
                        break;
                    }
                };
                news = true;
                let Some(answer) = answer else {
                    // The helper did not answer in time, or its socket closed.
                    tracing::warn!(owner, "a client's memory helper stopped answering: its memory is out of reach");
                    h.gone = true;
                    continue;
                };
                if let Some(&(addr, need)) = h.reads.get(&id) {
                    h.reads.remove(&id);
                    let got = match answer {
                        MemReply::Ok(v) if v.len() >= need => Ok(v),
                        _ => Err(()),
                    };
                    h.fetched.push((addr, need, got));
                } else if let Some((_, slot)) = self.atomics.get_mut(&id) {
                    *slot = Some(match answer {
                        MemReply::Ok(v) if v.len() == 8 => Ok(u64::from_ne_bytes(v[..8].try_into().expect("8 bytes"))),
                        _ => Err(MemoryError { addr: 0, len: 8 }),
                    });
                } else {
                    // A write that failed (the client unmapped the buffer): lost, as a DMA into
                    // memory its owner gave up.
                    self.faults += 1;
                }
            }
            if h.gone {
                for (_, slot) in self.atomics.values_mut().filter(|(o, r)| *o == owner && r.is_none()) {
                    *slot = Some(Err(MemoryError { addr: 0, len: 8 }));
                }
            }
        }
        news
    }

    /// Reads through `owner`'s helper: from what it answered this round, or (not there yet) asks
    /// for `want` bytes (at least `buf.len()`) and reports a would-be block.
    fn helper_read(&mut self, owner: Owner, addr: u64, buf: &mut [u8], want: usize) -> Result<(), MemoryError> {
        let len = buf.len();
        let err = MemoryError { addr, len };
        let Some(h) = self.helpers.get_mut(&owner) else { return Err(err) };
        if h.gone {
            self.faults += 1;
            return Err(err);
        }
        let end = addr.checked_add(len as u64).ok_or(err)?;
        for (base, need, got) in &h.fetched {
            let Some(off) = addr.checked_sub(*base) else { continue };
            match got {
                Ok(v) if end <= base + v.len() as u64 => {
                    copy_bytes(buf, &v[off as usize..off as usize + len]);
                    return Ok(());
                }
                Err(()) if off < *need as u64 => {
                    self.faults += 1;
                    return Err(err);
                }
                _ => {}
            }
        }
        let asked = h.reads.values().any(|&(base, need)| addr >= base && end <= base + need as u64);
        if !asked {
            self.next_request += 1;
            let id = self.next_request;
            if h.to_worker.send((id, MemOp::Read { addr, len: want.max(len) as u32 })).is_err() {
                h.gone = true;
                self.faults += 1;
                return Err(err);
            }
            h.reads.insert(id, (addr, len));
            self.reads += 1;
            self.helper_ops += 1;
        }
        self.would_block += 1;
        Err(err)
    }

    /// Writes through `owner`'s helper, without waiting: the helper makes the writes in order,
    /// before the reads and atomics asked after them, and the client before it shows a later
    /// completion ([`ProcessMemory::helper_writes`]).
    fn helper_write(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let err = MemoryError { addr, len: data.len() };
        let Some(h) = self.helpers.get_mut(&owner) else { return Err(err) };
        let end = addr.saturating_add(data.len() as u64);
        h.fetched.retain(|(b, _, got)| {
            let e = b.saturating_add(got.as_ref().map_or(0, |v| v.len() as u64));
            e <= addr || *b >= end
        });
        self.next_request += 1;
        if h.gone || h.to_worker.send((self.next_request, MemOp::Write { addr, data: data.to_vec() })).is_err() {
            h.gone = true;
            self.faults += 1;
            return Err(err);
        }
        h.writes += 1;
        self.last_write = Some((owner, h.writes));
        self.writes += 1;
        self.helper_ops += 1;
        Ok(())
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
                    let remote = remote_ranges(run);
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
        self.local.remove(&owner);
        self.arenas.remove(&owner);
        self.helpers.remove(&owner);
        self.atomics.retain(|_, (o, _)| *o != owner);
    }

    /// Whether `[addr, addr+len)` of `owner` is written directly by [`Memory::write_local`]: the
    /// owner is this process and reaches its memory itself (no helper), and the range is not
    /// staging.
    fn direct(&self, owner: Owner, addr: u64, len: usize) -> bool {
        len > 0
            && self.local.contains(&owner)
            && ProcessMemory::staging(addr, len).is_none()
            && !self.helpers.contains_key(&owner)
    }

    /// Whether `[addr, addr+len)` of `owner` is this process's own memory, reached by a guarded
    /// copy ([`crate::guard`]): what a peer's WRITE lands in and a READ or send is read from,
    /// with no system call, and a fault there fails the access instead of crashing the program.
    fn guarded(&self, owner: Owner, addr: u64, len: usize) -> bool {
        self.direct(owner, addr, len) && self.guard_on()
    }

    fn guard_on(&self) -> bool {
        !self.unguarded && crate::guard::available()
    }

    /// A guarded copy's result: a fault is counted, as a failed cross-process access is.
    fn guarded_result(&mut self, ok: bool, addr: u64, len: usize) -> Result<(), MemoryError> {
        self.guarded_copies += 1;
        if ok {
            Ok(())
        } else {
            self.faults += 1;
            Err(MemoryError { addr, len })
        }
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
    fn would_block_count(&self) -> u64 {
        self.would_block
    }

    fn write_fence(&mut self) -> u64 {
        // A token: the owner above bit 40, the write's number on its helper link below.
        self.last_write.take().map_or(0, |(owner, n)| (u64::from(owner) << 40) | (n & FENCE_MASK))
    }

    fn fence_passed(&mut self, token: u64) -> bool {
        let owner = (token >> 40) as Owner;
        let passed = match self.helpers.get(&owner) {
            // Gone (its writes failed, as DMA into memory its owner gave up) or never a helper.
            None => true,
            Some(h) => h.gone || h.applied.load(Ordering::Acquire) & FENCE_MASK >= token & FENCE_MASK,
        };
        if !passed {
            self.would_block += 1;
        }
        passed
    }

    fn start_atomic(&mut self, owner: Owner, addr: u64, op: AtomicOp) -> Result<AtomicStart, MemoryError> {
        let Some(h) = self.helpers.get_mut(&owner) else {
            let orig = match op {
                AtomicOp::CompareSwap { compare, swap } => self.compare_swap(owner, addr, compare, swap)?,
                AtomicOp::FetchAdd { add } => self.fetch_add(owner, addr, add)?,
            };
            return Ok(AtomicStart::Done(orig));
        };
        let err = MemoryError { addr, len: 8 };
        // The helper runs it between the accesses sent before and after it: atomic with respect
        // to every access of this device, as the read-then-write under the device lock is.
        let (compare, value) = match op {
            AtomicOp::CompareSwap { compare, swap } => (Some(compare), swap),
            AtomicOp::FetchAdd { add } => (None, add),
        };
        h.fetched.retain(|(b, _, got)| {
            let e = b.saturating_add(got.as_ref().map_or(0, |v| v.len() as u64));
            e <= addr || *b >= addr + 8
        });
        self.next_request += 1;
        let id = self.next_request;
        if h.gone || h.to_worker.send((id, MemOp::Atomic { addr, compare, value })).is_err() {
            h.gone = true;
            self.faults += 1;
            return Err(err);
        }
        // Counted as the read and the write it is.
        self.reads += 1;
        self.writes += 1;
        self.helper_ops += 2;
        if self.atomics.len() >= MAX_ATOMICS_WAITING {
            // Answers nobody collected (their QPs went away): the oldest go.
            let mut ids: Vec<u64> = self.atomics.keys().copied().collect();
            ids.sort_unstable();
            for old in &ids[..ids.len() / 2] {
                self.atomics.remove(old);
            }
        }
        self.atomics.insert(id, (owner, None));
        Ok(AtomicStart::Later(id))
    }

    fn atomic_result(&mut self, ticket: u64) -> Option<Result<u64, MemoryError>> {
        match self.atomics.get(&ticket) {
            None => Some(Err(MemoryError { addr: 0, len: 8 })),
            Some((_, None)) => {
                self.would_block += 1;
                None
            }
            Some((_, Some(_))) => self.atomics.remove(&ticket).and_then(|(_, r)| r),
        }
    }

    fn read_ahead(&mut self, owner: Owner, addr: u64, buf: &mut [u8], avail: u64) -> Result<(), MemoryError> {
        let len = buf.len();
        if self.guarded(owner, addr, len) {
            // Reading the program's memory costs no more than reading ahead would.
            return self.read(owner, addr, buf);
        }
        let inside = |base: u64, have: usize| {
            addr.checked_sub(base).is_some_and(|o| o.checked_add(len as u64).is_some_and(|e| e <= have as u64))
        };
        if let Some((o, base, lead)) = self.ahead {
            if o == owner && inside(base, self.ahead_data.len() - lead) {
                let at = lead + (addr - base) as usize;
                copy_bytes(buf, &self.ahead_data[at..at + len]);
                return Ok(());
            }
        }
        let want = (avail.min(READ_AHEAD as u64) as usize).max(len);
        if self.helpers.contains_key(&owner) && ProcessMemory::staging(addr, len).is_none() {
            return self.helper_read(owner, addr, buf, want);
        }
        if want <= len || ProcessMemory::staging(addr, len).is_some() {
            return self.read(owner, addr, buf);
        }
        self.flush();
        let pid = self.pid(owner, addr, len)?;
        self.reads += 1;
        self.ahead = None;
        let mut data = std::mem::take(&mut self.ahead_data);
        data.resize(want + 64, 0);
        let lead = lead_in(data.as_ptr(), addr);
        let remote = [RemoteIoVec { base: addr as usize, len: want }];
        // The kernel stops at the first page it cannot read: what came before is good.
        let got = process_vm_readv(pid, &mut [IoSliceMut::new(&mut data[lead..lead + want])], &remote).unwrap_or(0);
        if got < len {
            self.ahead_data = data;
            self.faults += 1;
            return Err(MemoryError { addr, len });
        }
        data.truncate(lead + got);
        copy_bytes(buf, &data[lead..lead + len]);
        self.ahead_data = data;
        self.ahead = Some((owner, addr, lead));
        Ok(())
    }

    fn read(&mut self, owner: Owner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let len = buf.len();
        if len == 0 {
            return Ok(());
        }
        if self.guarded(owner, addr, len) {
            if !self.pending.is_empty() {
                self.flush();
            }
            self.ahead = None;
            let ok = crate::guard::read(addr, buf);
            return self.guarded_result(ok, addr, len);
        }
        if self.helpers.contains_key(&owner) {
            // What follows tends to be read next (a READ response, packet after packet).
            return self.helper_read(owner, addr, buf, HELPER_READ_AHEAD);
        }
        // A read may cover bytes a pending write changes, and a read is a fresh look: what was
        // read ahead before may be stale by now (the first packet of a READ response).
        self.flush();
        self.ahead = None;
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

    /// A buffer this process posted itself (a receive's, a READ's or atomic's destination), when
    /// the device runs in that process: copied directly, after the writes that wait for a flush
    /// (they came first). The engine has checked the key, the region's bounds and its access.
    /// The copy is guarded ([`crate::guard`]): a buffer the program unmapped while registered
    /// fails the work request (a local protection error) instead of crashing the program. Where
    /// guarded copies are not available (not x86-64 Linux) it is a plain copy.
    fn write_local(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let len = data.len();
        if !self.direct(owner, addr, len) {
            return self.write(owner, addr, data);
        }
        if addr.checked_add(len as u64).is_none_or(|e| e > isize::MAX as u64) || addr == 0 {
            return Err(MemoryError { addr, len });
        }
        self.ahead = None;
        if !self.pending.is_empty() {
            self.flush();
        }
        if self.guard_on() {
            let ok = crate::guard::write(addr, data);
            return self.guarded_result(ok, addr, len);
        }
        // SAFETY: `[addr, addr + len)` lies in a memory region of this process (the engine
        // checked the key and bounds against the region, registered by this process) and is a
        // buffer the program posted for this work request and may not touch until its
        // completion; `data` is the engine's packet buffer, which does not overlap it.
        let dst = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
        copy_bytes(dst, data);
        Ok(())
    }

    fn write(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let len = data.len();
        if len == 0 {
            return Ok(());
        }
        // What was read ahead may be what this changes.
        self.ahead = None;
        if self.guarded(owner, addr, len) {
            // A peer's WRITE into this process's own memory: no system call. Into a buffer the
            // program unmapped it is lost and counted, as a write behind that fails at its
            // flush is (and as a NIC's DMA into pinned pages their owner gave up would be).
            if !self.pending.is_empty() {
                self.flush();
            }
            let ok = crate::guard::write(addr, data);
            let _ = self.guarded_result(ok, addr, len);
            return Ok(());
        }
        if let Some(off) = ProcessMemory::staging(addr, len) {
            return match self.arenas.get(&owner) {
                Some(a) if a.stage_write(off, data) => Ok(()),
                _ => Err(MemoryError { addr, len }),
            };
        }
        if self.helpers.contains_key(&owner) {
            return self.helper_write(owner, addr, data);
        }
        self.pid(owner, addr, len)?;
        if self.pending.len() >= PENDING_WRITES || self.pending_data.len() + len > PENDING_BYTES {
            self.flush();
        }
        // A lead-in keeps the kernel's copy out of the aliasing distances (`copy::lead_out`).
        self.pending_data.reserve(data.len() + 64);
        let lead = lead_out(addr, self.pending_data.as_ptr().wrapping_add(self.pending_data.len()));
        self.pending_data.resize(self.pending_data.len() + lead, 0);
        let start = self.pending_data.len();
        extend_bytes(&mut self.pending_data, data);
        self.pending.push((owner, addr, start..start + len));
        Ok(())
    }
}

/// The target ranges of a run of pending writes: writes that continue one another (a message's
/// packets) are one range. The kernel pins and copies a range's pages together, where it takes
/// the target's memory map lock and looks up the mapping once per range (ib_write_bw 64 KiB: the
/// receiving thread's `process_vm_writev` went from 27% to 21% of its time, BENCHMARKS.md).
fn remote_ranges(run: &[(Owner, u64, std::ops::Range<usize>)]) -> Vec<RemoteIoVec> {
    let mut remote: Vec<RemoteIoVec> = Vec::with_capacity(run.len());
    for (_, a, r) in run {
        match remote.last_mut() {
            Some(last) if (last.base as u64).checked_add(last.len as u64) == Some(*a) => last.len += r.len(),
            _ => remote.push(RemoteIoVec { base: *a as usize, len: r.len() }),
        }
    }
    remote
}

/// How long the device waits for a memory helper's answer before it takes the helper for gone.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(1);

/// The most a helper read fetches beyond what was asked (the rest of a READ response).
const HELPER_READ_AHEAD: usize = 64 << 10;

/// The bits of a write fence token that number a helper's writes.
const FENCE_MASK: u64 = (1 << 40) - 1;

/// Atomics whose answers may wait to be collected; beyond, the oldest half goes.
const MAX_ATOMICS_WAITING: usize = 4096;

/// The device's side of a client's memory helper: requests go to a thread of the device that
/// talks to the helper ([`helper_link_worker`]), so the device thread never waits for a client.
/// Reads and atomics report a would-be block ([`Memory::would_block_count`]) until the answer
/// comes; writes go without waiting.
struct HelperLink {
    to_worker: Sender<(u64, MemOp)>,
    /// Answers: a request's number and the reply (`None`: the helper is gone). Writes that
    /// succeeded are not answered.
    from_worker: Receiver<(u64, Option<MemReply>)>,
    /// Writes sent (see [`ProcessMemory::helper_writes`]).
    writes: u64,
    /// Writes the helper has made (answered), counted by the link's thread.
    applied: Arc<AtomicU64>,
    /// `applied` at the last round.
    applied_seen: u64,
    /// Reads asked for: number -> (address, bytes needed).
    reads: HashMap<u64, (u64, usize)>,
    /// This round's answered reads: address, bytes needed, the bytes (`Err`: a fault).
    fetched: Vec<(u64, usize, Result<Vec<u8>, ()>)>,
    /// The helper stopped answering (or its socket closed).
    gone: bool,
}

/// Passes requests to a client's helper one at a time and hands the answers back, telling the
/// device thread through `wake`. Ends when the device drops the link or the helper does not
/// answer within the socket's time limits (the socket closes: the client's helper ends too).
fn helper_link_worker(
    sock: &UnixStream,
    requests: &Receiver<(u64, MemOp)>,
    answers: &Sender<(u64, Option<MemReply>)>,
    applied: &AtomicU64,
    wake: &OwnedFd,
) {
    let tell = || {
        let _ = nix::unistd::write(wake, &1u64.to_ne_bytes());
    };
    while let Ok((id, op)) = requests.recv() {
        let write = matches!(op, MemOp::Write { .. });
        let reply = proto::send(sock, &op, &[]).ok().and_then(|()| proto::recv::<MemReply>(sock).ok()).map(|r| r.0);
        let gone = reply.is_none();
        if write && !gone {
            applied.fetch_add(1, Ordering::Release);
            // The device may be waiting for it (an ACK behind it: Memory::fence_passed).
            tell();
        }
        if !write || !matches!(reply, Some(MemReply::Ok(_))) {
            if answers.send((id, reply)).is_err() {
                return;
            }
            tell();
        }
        if gone {
            return;
        }
    }
}

/// A client's count of what its memory helper has done, for [`HelperProgress::wait_for_writes`].
#[derive(Debug, Default)]
pub struct HelperProgress {
    writes: AtomicU64,
    gone: AtomicBool,
}

impl HelperProgress {
    /// Waits until the helper has made `n` writes (or ended): the device sends its writes
    /// without waiting, and a completion it produced after them ([`crate::proto::CqEntry`]'s
    /// `helper_writes`) must not be seen before the data it completes.
    pub fn wait_for_writes(&self, n: u64) {
        while self.writes.load(Ordering::Acquire) < n && !self.gone.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
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
/// side of the fallback), counting its writes in `progress`. Accesses go through
/// process_vm_readv/writev on this very process, which the kernel allows when it refuses others,
/// so a bad address is a fault, not a crash. A read answers what is readable from its address
/// on (the device reads ahead; it checks that what it needs came).
pub fn serve_helper(sock: UnixStream, progress: Arc<HelperProgress>) {
    let me = Pid::this();
    let read = |addr: u64, len: usize| -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let remote = [RemoteIoVec { base: addr as usize, len }];
        let n = process_vm_readv(me, &mut [IoSliceMut::new(&mut buf)], &remote).unwrap_or(0);
        buf.truncate(n);
        buf
    };
    let write = |addr: u64, data: &[u8]| {
        let remote = [RemoteIoVec { base: addr as usize, len: data.len() }];
        matches!(process_vm_writev(me, &[IoSlice::new(data)], &remote), Ok(n) if n == data.len())
    };
    while let Ok((op, _)) = proto::recv::<MemOp>(&sock) {
        let reply = match op {
            MemOp::Read { addr, len } => MemReply::Ok(read(addr, len as usize)),
            MemOp::Write { addr, data } => {
                let ok = write(addr, &data);
                progress.writes.fetch_add(1, Ordering::Release);
                if ok {
                    MemReply::Ok(Vec::new())
                } else {
                    MemReply::Fault
                }
            }
            MemOp::Atomic { addr, compare, value } => {
                // One request at a time: atomic with respect to the device's other accesses.
                let old = read(addr, 8);
                match <[u8; 8]>::try_from(old.as_slice()).map(u64::from_ne_bytes) {
                    Ok(v) => {
                        let new = match compare {
                            Some(c) if c == v => Some(value),
                            Some(_) => None,
                            None => Some(v.wrapping_add(value)),
                        };
                        if new.is_none_or(|n| write(addr, &n.to_ne_bytes())) {
                            MemReply::Ok(old)
                        } else {
                            MemReply::Fault
                        }
                    }
                    Err(_) => MemReply::Fault,
                }
            }
        };
        if proto::send(&sock, &reply, &[]).is_err() {
            break;
        }
    }
    progress.gone.store(true, Ordering::Release);
}

#[cfg(test)]
mod tests;
