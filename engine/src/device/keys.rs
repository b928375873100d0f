//! Memory keys: which L_Key/R_Key an engine gives a new memory region or window.
//!
//! A key is a 24-bit index and an 8-bit variant (the low byte; random, since any local user can
//! send to UDP 4791, docs/architecture.md D5), as an HCA's memory keys are an index into its
//! translation table plus a variant a consumer sees change when the index is reused. Regions and
//! windows share the indexes. An index is handed out again only once it is free, cyclically, so an
//! old key's index comes back as late as possible; before this allocator an engine numbered its
//! keys with a counter and, after 2^24 of them, a new region replaced a live one of the same index.
//!
//! Several engines answer for one device's keys: the daemon's, and one in each client process
//! that runs its own QPs (a provider). The daemon's engine also serves, under the provider's
//! key, RDMA to a provider's memory that arrives through an XRC target QP
//! ([`Device::alias_rkey`]), so the keys of all those engines must differ. They do by blocks of
//! indexes, as QPNs do: the daemon reserves a block for each provider
//! ([`Device::reserve_key_block`]) and never allocates from it; the provider allocates only from
//! its blocks ([`Device::restrict_keys_to`]) and asks for another when they are full
//! (`ENOMEM` from [`Device::reg_mr`] or [`Device::alloc_mw`] until it has one,
//! [`Device::add_key_block`]).

use std::collections::BTreeSet;

use super::Device;
use crate::memory::Memory;
use crate::verbs::VerbsError;

/// Key indexes come in blocks of 2^14 (1,023 blocks can go to providers, each 16,384 live
/// regions and windows; more blocks when a provider fills its own).
pub const KEY_BLOCK_SHIFT: u32 = 14;

/// The number of key indexes (24 bits).
const INDEXES: u32 = 1 << 24;

/// The block of a key index.
pub fn key_block(index: u32) -> u32 {
    (index & (INDEXES - 1)) >> KEY_BLOCK_SHIFT
}

const BLOCKS: u32 = INDEXES >> KEY_BLOCK_SHIFT;

/// Which key indexes an engine allocates from.
#[derive(Debug)]
pub(crate) struct KeySpace {
    /// Blocks this engine may not allocate from (the daemon's: the providers' blocks).
    reserved: BTreeSet<u32>,
    /// The only blocks this engine allocates from (a provider's); `None`: every block not
    /// reserved.
    only: Option<Vec<u32>>,
    /// Where the next search for a free index starts.
    next: u32,
}

impl Default for KeySpace {
    fn default() -> Self {
        KeySpace { reserved: BTreeSet::new(), only: None, next: 1 }
    }
}

impl<M: Memory> Device<M> {
    /// Whether key index `index` names no region or window of this engine.
    fn key_index_free(&self, index: u32) -> bool {
        !self.mrs.contains_key(&index) && !self.mws.contains_key(&index)
    }

    /// A new key (index and random variant) for a region or window; `ENOMEM` when every index
    /// this engine may use is taken. Index 0 is never used. The key is never one that an alias
    /// of this engine already answers to (an alias's block is reserved, so that only happens
    /// after a provider's blocks came back while a twin of its region lived on).
    pub(super) fn new_key(&mut self) -> Result<u32, VerbsError> {
        let index = self.free_key_index()?;
        loop {
            let key = (index << 8) | (self.rng.next_u32() & 0xff);
            if !self.rkey_aliases.contains_key(&key) {
                return Ok(key);
            }
        }
    }

    fn free_key_index(&mut self) -> Result<u32, VerbsError> {
        const IN_BLOCK: u32 = 1 << KEY_BLOCK_SHIFT;
        if let Some(blocks) = &self.keys.only {
            let span = blocks.len() as u32 * IN_BLOCK;
            let at = |i: u32| (blocks[(i / IN_BLOCK) as usize] << KEY_BLOCK_SHIFT) | (i % IN_BLOCK);
            // Resume after the last index handed out (its position among the blocks' indexes).
            let next = self.keys.next;
            let start =
                blocks.iter().position(|&b| b == key_block(next)).map_or(0, |p| p as u32 * IN_BLOCK + next % IN_BLOCK);
            for k in 0..span {
                let i = at((start + k) % span);
                if i != 0 && self.key_index_free(i) {
                    self.keys.next = at((start + k + 1) % span);
                    return Ok(i);
                }
            }
            return Err(VerbsError::NoMem);
        }
        let mut i = self.keys.next % INDEXES;
        for _ in 0..INDEXES {
            if self.keys.reserved.contains(&key_block(i)) {
                // The rest of a block that is someone else's.
                i = ((key_block(i) + 1) << KEY_BLOCK_SHIFT) % INDEXES;
                continue;
            }
            if i != 0 && self.key_index_free(i) {
                self.keys.next = (i + 1) % INDEXES;
                return Ok(i);
            }
            i = (i + 1) % INDEXES;
        }
        Err(VerbsError::NoMem)
    }

    /// Reserves a key block for a provider (see the module doc): one no region, window or alias
    /// of this engine has a key in, preferring the highest (this engine's own keys start at
    /// the bottom). `None` when none is left. Block 0 stays this engine's.
    pub fn reserve_key_block(&mut self) -> Option<u32> {
        let mut used: BTreeSet<u32> = self.mrs.keys().chain(self.mws.keys()).map(|&i| key_block(i)).collect();
        used.extend(self.rkey_aliases.keys().map(|&k| key_block(k >> 8)));
        let b = (1..BLOCKS).rev().find(|b| !self.keys.reserved.contains(b) && !used.contains(b))?;
        self.keys.reserved.insert(b);
        Some(b)
    }

    /// Gives a reserved key block back to this engine's allocation.
    pub fn release_key_block(&mut self, block: u32) {
        self.keys.reserved.remove(&block);
    }

    /// Makes this engine allocate keys only from `blocks` (a provider's, from its daemon's
    /// [`Device::reserve_key_block`]).
    pub fn restrict_keys_to(&mut self, blocks: Vec<u32>) {
        if let Some(&b) = blocks.first() {
            self.keys.next = b << KEY_BLOCK_SHIFT;
        }
        self.keys.only = Some(blocks);
    }

    /// One more block for an engine whose keys are restricted (after `ENOMEM`: its blocks were
    /// full); nothing for one that is not.
    pub fn add_key_block(&mut self, block: u32) {
        if let Some(blocks) = self.keys.only.as_mut() {
            if !blocks.contains(&block) {
                blocks.push(block);
                self.keys.next = block << KEY_BLOCK_SHIFT;
            }
        }
    }

    /// Whether this engine's keys are restricted to blocks it was given.
    pub fn keys_restricted(&self) -> bool {
        self.keys.only.is_some()
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::device::DeviceConfig;
    use crate::memory::VecMemory;
    use crate::verbs::Access;

    fn engine(seed: u64) -> Device<VecMemory> {
        Device::new(DeviceConfig::new("127.0.0.1".parse().unwrap(), seed), VecMemory::new())
    }

    const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

    /// A provider's keys all lie in its blocks, so the daemon can alias every one of them (before
    /// key blocks, both engines numbered from 1 with a random low byte: about one alias in 256
    /// collided with a key of the daemon's and failed).
    #[test]
    fn a_providers_keys_never_meet_the_daemons() {
        let (mut daemon, mut provider) = (engine(1), engine(2));
        let dpd = daemon.alloc_pd(1);
        let ppd = provider.alloc_pd(1);
        let b = daemon.reserve_key_block().unwrap();
        provider.restrict_keys_to(vec![b]);
        let twin = daemon.reg_mr(dpd, 0, 64, RW).unwrap();
        for i in 0..3000u64 {
            let own = daemon.reg_mr(dpd, i, 64, RW).unwrap();
            let theirs = provider.reg_mr(ppd, i, 64, RW).unwrap();
            assert_eq!(key_block(theirs.rkey >> 8), b);
            assert_ne!(key_block(own.rkey >> 8), b);
            daemon.alias_rkey(twin.lkey, theirs.rkey).unwrap();
            let w = provider.alloc_mw(ppd, 2).unwrap();
            assert_eq!(key_block(w >> 8), b);
        }
        // The daemon's own keys skip the reserved block, here starting just before it.
        daemon.keys.next = (b << KEY_BLOCK_SHIFT) - 2;
        let k: Vec<u32> = (0..4).map(|i| daemon.reg_mr(dpd, i, 64, RW).unwrap().lkey >> 8).collect();
        assert!(k.iter().all(|&i| key_block(i) != b), "{k:x?} in block {b}");
        // A block in use (the daemon's region just made, an alias) is never reserved.
        let taken: BTreeSet<u32> = k.iter().map(|&i| key_block(i)).collect();
        // (b is the highest block: the keys after it wrapped into block 0, the daemon's anyway.)
        let left = (1..BLOCKS).filter(|x| *x != b && !taken.contains(x)).count();
        for _ in 0..left {
            let r = daemon.reserve_key_block().unwrap();
            assert!(!taken.contains(&r) && r != b && r != 0);
        }
        assert_eq!(daemon.reserve_key_block(), None);
    }

    /// A full block is ENOMEM until its engine gets another, a freed index is reused (nothing
    /// live is ever replaced), and with a new random low byte the old key stays invalid unless
    /// the draw repeats it.
    #[test]
    fn a_full_block_is_enomem_and_freed_indexes_come_back() {
        let mut p = engine(3);
        let pd = p.alloc_pd(1);
        p.restrict_keys_to(vec![7]);
        let mut keys = Vec::new();
        for i in 0..(1u64 << KEY_BLOCK_SHIFT) {
            keys.push(p.reg_mr(pd, i, 8, RW).unwrap().lkey);
        }
        let indexes: BTreeSet<u32> = keys.iter().map(|k| k >> 8).collect();
        assert_eq!(indexes.len(), 1 << KEY_BLOCK_SHIFT, "an index handed out twice");
        assert_eq!(p.reg_mr(pd, 0, 8, RW), Err(VerbsError::NoMem));
        assert_eq!(p.alloc_mw(pd, 1), Err(VerbsError::NoMem));
        p.dereg_mr(keys[100]).unwrap();
        let again = p.reg_mr(pd, 0, 8, RW).unwrap().lkey;
        assert_eq!(again >> 8, keys[100] >> 8);
        // Every other region is still there, under its own key.
        for (i, &k) in keys.iter().enumerate().filter(|&(i, _)| i != 100) {
            assert!(p.mrs.get(&(k >> 8)).is_some_and(|m| m.lkey == k && m.addr == i as u64), "{k:#x}");
        }
        p.add_key_block(9);
        let k = p.reg_mr(pd, 0, 8, RW).unwrap().lkey;
        assert_eq!(key_block(k >> 8), 9);
    }

    /// An unrestricted engine's indexes wrap around the 24-bit space without replacing a live
    /// region: index 0 is skipped and so is every index in use.
    #[test]
    fn the_daemons_indexes_wrap_past_live_regions() {
        let mut d = engine(4);
        let pd = d.alloc_pd(1);
        let first = d.reg_mr(pd, 1, 8, RW).unwrap().lkey;
        assert_eq!(first >> 8, 1);
        d.keys.next = INDEXES - 1;
        let last = d.reg_mr(pd, 2, 8, RW).unwrap().lkey;
        let wrapped = d.reg_mr(pd, 3, 8, RW).unwrap().lkey;
        assert_eq!((last >> 8, wrapped >> 8), (INDEXES - 1, 2));
        assert_eq!(d.mrs.get(&1).map(|m| (m.lkey, m.addr)), Some((first, 1)));
    }
}
