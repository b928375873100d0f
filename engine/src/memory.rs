//! How the engine reaches the memory of the processes it serves: only through [`Memory`], so the
//! same engine runs in the daemon (cross-process access), in process (plain pointers) and in tests
//! ([`VecMemory`]).

/// Who owns an address space (a client process); the engine passes the owner of the memory
/// region it checked.
pub type Owner = u32;

/// An access outside the memory the owner has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory access outside the owner's memory: {len} bytes at {addr:#x}")]
pub struct MemoryError {
    /// Start address.
    pub addr: u64,
    /// Length.
    pub len: usize,
}

/// Byte and 8-byte atomic access to the owners' memory. The engine checks keys, bounds and access
/// rights against its memory regions before every call; an implementation still fails rather than
/// touching memory it does not have.
pub trait Memory {
    /// Copies `buf.len()` bytes at `addr` into `buf`, as they are now (nothing read ahead before
    /// this call serves it or later reads).
    fn read(&mut self, owner: Owner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError>;
    /// The same as [`Memory::read`], saying that the `avail` bytes from `addr` (at least
    /// `buf.len()`) belong to the same buffer and will be read next (the rest of a message's
    /// SGE, packet after packet), so an implementation whose reads cost a system call may read
    /// ahead. The bytes may be read at any time from now until the next write through this
    /// `Memory`: the verbs forbid changing a buffer while its work request is outstanding.
    fn read_ahead(&mut self, owner: Owner, addr: u64, buf: &mut [u8], avail: u64) -> Result<(), MemoryError> {
        let _ = avail;
        self.read(owner, addr, buf)
    }
    /// Copies `data` to `addr`.
    fn write(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// The same as [`Memory::write`], into a buffer its owner posted itself: a receive WQE's
    /// scatter list (a SEND's data), a READ's or atomic's local destination. Unlike a remote
    /// peer's RDMA WRITE, the owner chose these addresses for this very work request, so an
    /// implementation that lives in the owner's process may copy there directly (the verbs
    /// forbid touching a posted buffer until its completion, IBTA 10.8.3). The default writes.
    fn write_local(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.write(owner, addr, data)
    }
    /// How many accesses so far failed only for now: the memory is reachable, but not at once (a
    /// client's memory helper is fetching it, as an HCA faults in a page of an on-demand-paging
    /// region). The engine compares the count before and after an access: an access that raised
    /// it is retried once [`crate::device::Device::memory_ready`] says the memory has news,
    /// instead of failing. Memories that always answer at once keep the default, 0.
    fn would_block_count(&self) -> u64 {
        0
    }
    /// A token for the writes made since the last call (0: none, or all are in place already):
    /// a memory whose writes land later gives one, and [`Memory::fence_passed`] says when they
    /// have. The responder takes one after each request, and its answers (ACK, READ response,
    /// atomic acknowledge) wait for it: a requester that sees the ACK of a WRITE may rely on the
    /// data being in place (IBTA 9.7.5.1.2: the responder acknowledges what it has executed).
    fn write_fence(&mut self) -> u64 {
        0
    }
    /// Whether the writes of `token` ([`Memory::write_fence`]) are in place (`false` is counted
    /// as a [`Memory::would_block_count`]).
    fn fence_passed(&mut self, token: u64) -> bool {
        let _ = token;
        true
    }
    /// Starts an atomic on the 8 bytes at `addr`: its original value now, or a ticket to ask
    /// [`Memory::atomic_result`] for it later (the atomic takes effect in order with this
    /// memory's other accesses either way). The default runs it now.
    fn start_atomic(&mut self, owner: Owner, addr: u64, op: AtomicOp) -> Result<AtomicStart, MemoryError> {
        let orig = match op {
            AtomicOp::CompareSwap { compare, swap } => self.compare_swap(owner, addr, compare, swap)?,
            AtomicOp::FetchAdd { add } => self.fetch_add(owner, addr, add)?,
        };
        Ok(AtomicStart::Done(orig))
    }
    /// The original value of the atomic started under `ticket`: `None` while it is still on its
    /// way (counted as a [`Memory::would_block_count`]). The default has no tickets.
    fn atomic_result(&mut self, ticket: u64) -> Option<Result<u64, MemoryError>> {
        let _ = ticket;
        Some(Err(MemoryError { addr: 0, len: 8 }))
    }
    /// Atomically: if the 8 bytes at `addr` (host order) equal `compare`, store `swap`; returns the
    /// original value (IBTA 9.4.5 CmpSwap). The default reads, then writes: atomic with respect
    /// to this device's own accesses, which is all a memory the engine alone writes needs.
    fn compare_swap(&mut self, owner: Owner, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(owner, addr, &mut b)?;
        let old = u64::from_ne_bytes(b);
        if old == compare {
            self.write(owner, addr, &swap.to_ne_bytes())?;
        }
        Ok(old)
    }
    /// Atomically adds `add` to the 8 bytes at `addr`; returns the original value (FetchAdd). The
    /// default reads, then writes (see [`Memory::compare_swap`]).
    fn fetch_add(&mut self, owner: Owner, addr: u64, add: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(owner, addr, &mut b)?;
        let old = u64::from_ne_bytes(b);
        self.write(owner, addr, &old.wrapping_add(add).to_ne_bytes())?;
        Ok(old)
    }
}

/// An 8-byte atomic (IBTA 9.4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// CmpSwap: store `swap` if the value equals `compare`.
    CompareSwap {
        /// Compared with.
        compare: u64,
        /// Stored on a match.
        swap: u64,
    },
    /// FetchAdd.
    FetchAdd {
        /// Added.
        add: u64,
    },
}

/// What [`Memory::start_atomic`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicStart {
    /// Executed: the original value.
    Done(u64),
    /// Executing: ask [`Memory::atomic_result`] with this ticket.
    Later(u64),
}

/// Test memory: one `Vec<u8>` per owner, mapped at a base address.
#[derive(Debug, Clone, Default)]
pub struct VecMemory {
    spaces: Vec<(Owner, u64, Vec<u8>)>,
}

impl VecMemory {
    /// No memory.
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Gives `owner` `len` zeroed bytes at `base`.
    pub fn add(&mut self, owner: Owner, base: u64, len: usize) {
        self.spaces.push((owner, base, vec![0; len]));
    }

    fn range(&mut self, owner: Owner, addr: u64, len: usize) -> Result<&mut [u8], MemoryError> {
        let err = MemoryError { addr, len };
        for (o, base, v) in &mut self.spaces {
            if *o != owner || addr < *base {
                continue;
            }
            let start = usize::try_from(addr - *base).map_err(|_| err)?;
            let end = start.checked_add(len).ok_or(err)?;
            if end <= v.len() {
                return Ok(&mut v[start..end]);
            }
        }
        Err(err)
    }

    /// Reads bytes (for tests to look at).
    pub fn get(&mut self, owner: Owner, addr: u64, len: usize) -> Vec<u8> {
        self.range(owner, addr, len).map(|s| s.to_vec()).unwrap_or_default()
    }

    /// Writes bytes (for tests to set up).
    pub fn set(&mut self, owner: Owner, addr: u64, data: &[u8]) {
        if let Ok(s) = self.range(owner, addr, data.len()) {
            s.copy_from_slice(data);
        }
    }
}

impl Memory for VecMemory {
    fn read(&mut self, owner: Owner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        buf.copy_from_slice(self.range(owner, addr, buf.len())?);
        Ok(())
    }

    fn write(&mut self, owner: Owner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.range(owner, addr, data.len())?.copy_from_slice(data);
        Ok(())
    }

    fn compare_swap(&mut self, owner: Owner, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        let s = self.range(owner, addr, 8)?;
        let old = u64::from_ne_bytes(s.try_into().map_err(|_| MemoryError { addr, len: 8 })?);
        if old == compare {
            s.copy_from_slice(&swap.to_ne_bytes());
        }
        Ok(old)
    }

    fn fetch_add(&mut self, owner: Owner, addr: u64, add: u64) -> Result<u64, MemoryError> {
        let s = self.range(owner, addr, 8)?;
        let old = u64::from_ne_bytes(s.try_into().map_err(|_| MemoryError { addr, len: 8 })?);
        s.copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
        Ok(old)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn bounds_and_owners() {
        let mut m = VecMemory::new();
        m.add(1, 0x1000, 16);
        m.write(1, 0x1008, &[1, 2, 3]).unwrap();
        assert_eq!(m.get(1, 0x1008, 3), vec![1, 2, 3]);
        assert!(m.write(1, 0x100e, &[0; 3]).is_err(), "past the end");
        assert!(m.write(2, 0x1000, &[0]).is_err(), "another owner");
        assert!(m.read(1, 0xfff, &mut [0; 1]).is_err(), "before the start");
        assert!(m.read(1, u64::MAX, &mut [0; 2]).is_err(), "overflow");
        assert_eq!(m.fetch_add(1, 0x1000, 5).unwrap(), 0);
        assert_eq!(m.compare_swap(1, 0x1000, 5, 9).unwrap(), 5);
        assert_eq!(m.compare_swap(1, 0x1000, 5, 7).unwrap(), 9);
        assert_eq!(m.fetch_add(1, 0x1000, 0).unwrap(), 9);
    }
}
