//! Paged KV accounting: a pool of fixed-size blocks and per-request block tables that
//! return their blocks to the pool when dropped.
//!
//! The pool only hands out block *ids*; the backend owns the storage the ids index.
//! Keeping ownership of ids in the sequence handle means a request that is cancelled,
//! finished or evicted frees its KV by being dropped, wherever that happens.

use std::sync::{Arc, Mutex, MutexGuard};

use super::error::{ModelError, Result};
pub use super::kv_group::KvEvent;
use super::kv_group::{PoolGroup, PoolShape, PoolState};
use super::prefix_cache::{PrefixCacheStats, ROOT_KEY};

/// A pool of `total_blocks` blocks of `block_size` token slots each, alone or in a
/// group of pools that share one budget of storage pages (see [`BlockPool::shared`]).
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    /// This pool's place in its group.
    index: usize,
    group: Arc<Mutex<PoolGroup>>,
}

/// One pool of a group that shares storage pages: see [`BlockPool::shared`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPoolSpec {
    pub block_size: usize,
    /// Storage pages one block of this pool takes.
    pub pages_per_block: usize,
    pub prefix_cache: bool,
}

/// Capacity and use of a pool, in blocks and tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KvCapacity {
    pub block_size: usize,
    pub total_blocks: usize,
    /// Blocks new K/V can take: free ones and cached ones no request holds.
    pub free_blocks: usize,
    /// Of the free blocks, those that still hold a cached prefix.
    pub cached_blocks: usize,
    /// Blocks sequences hold. Alone, `total - free`; in a shared group the other
    /// models' use also takes from `free`.
    pub used_blocks: usize,
    /// Other models whose pools share this one's storage pages (0: a budget of its own).
    #[serde(default)]
    pub shared_with: usize,
}

impl KvCapacity {
    pub fn total_tokens(&self) -> usize {
        self.total_blocks * self.block_size
    }
}

impl BlockPool {
    pub fn new(total_blocks: usize, block_size: usize) -> Self {
        Self::alone(
            total_blocks,
            block_size,
            PoolShape { pages_per_block: 1, paged_storage: false, recording: false, caching: false },
        )
    }

    /// A pool that keeps sealed full blocks for reuse (see [`KvSeq::attach_cached_prefix`]),
    /// for backends that store K/V by block id.
    pub fn caching_prefixes(total_blocks: usize, block_size: usize) -> Self {
        Self::alone(
            total_blocks,
            block_size,
            PoolShape { pages_per_block: 1, paged_storage: false, recording: false, caching: true },
        )
    }

    /// A pool that records every [`KvEvent`], for [`take_events`](Self::take_events), so
    /// that a backend keyed by sequence can follow; with `caching`, it keeps a prefix cache.
    pub fn recording_events(total_blocks: usize, block_size: usize, caching: bool) -> Self {
        Self::alone(
            total_blocks,
            block_size,
            PoolShape { pages_per_block: 1, paged_storage: false, recording: true, caching },
        )
    }

    /// A pool whose storage the backend reads through [`sync_pages`](Self::sync_pages),
    /// alone on `total_blocks` pages of one block each.
    pub fn paged(total_blocks: usize, block_size: usize, prefix_cache: bool) -> Self {
        Self::alone(
            total_blocks,
            block_size,
            PoolShape { pages_per_block: 1, paged_storage: true, recording: false, caching: prefix_cache },
        )
    }

    /// Pools of colocated models on one budget of `total_pages` storage pages: each takes
    /// pages as its blocks need them, so the split follows demand. A pool that runs out
    /// of free pages evicts the group's least recently freed cached blocks, whichever
    /// model's they are; blocks that sequences hold are never taken.
    pub fn shared(total_pages: usize, specs: &[SharedPoolSpec]) -> Vec<BlockPool> {
        let shapes: Vec<PoolShape> = specs
            .iter()
            .map(|s| PoolShape {
                pages_per_block: s.pages_per_block,
                paged_storage: true,
                recording: false,
                caching: s.prefix_cache,
            })
            .collect();
        let group = Arc::new(Mutex::new(PoolGroup::new(total_pages, &shapes)));
        specs.iter().enumerate().map(|(index, s)| BlockPool::in_group(s.block_size, index, group.clone())).collect()
    }

    fn alone(total_blocks: usize, block_size: usize, shape: PoolShape) -> Self {
        BlockPool::in_group(block_size, 0, Arc::new(Mutex::new(PoolGroup::new(total_blocks, &[shape]))))
    }

    fn in_group(block_size: usize, index: usize, group: Arc<Mutex<PoolGroup>>) -> Self {
        assert!(block_size > 0, "block size must be positive");
        BlockPool { block_size, index, group }
    }

    /// Brings `table` (`pages_per_block` page ids per block id, see [`pages_per_block`](Self::pages_per_block))
    /// up to date with the pages this pool's blocks were given since the last call.
    pub fn sync_pages(&self, table: &mut [u32]) {
        let index = self.index;
        self.group().sync_pages(index, table);
    }

    pub fn pages_per_block(&self) -> usize {
        self.lock().pages_per_block()
    }

    /// Storage pages of the whole group, and how many are free (cached ones excluded).
    pub fn group_pages(&self) -> (usize, usize) {
        let group = self.group();
        (group.total_pages(), group.free_pages())
    }

    /// Events recorded since the last call, oldest first (empty unless recording).
    pub fn take_events(&self) -> Vec<KvEvent> {
        self.group().pools[self.index].events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record(&self, event: KvEvent) {
        self.group().pools[self.index].record(event);
    }

    /// Takes `blocks` out of the prefix cache (a backend that can no longer keep their
    /// K/V); a block no sequence holds becomes plainly free. Records nothing.
    pub fn uncache(&self, blocks: &[u32]) {
        let mut group = self.group();
        for &block in blocks {
            let pool = &mut group.pools[self.index];
            let Some(index) = pool.prefixes.as_mut() else { return };
            if !index.is_cached(block) {
                continue;
            }
            index.remove(block);
            if pool.holders[block as usize] == 0 {
                group.free_block(self.index, block);
            }
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn capacity(&self) -> KvCapacity {
        let group = self.group();
        let pool = &group.pools[self.index];
        KvCapacity {
            block_size: self.block_size,
            total_blocks: pool.total_blocks(),
            free_blocks: group.available(self.index),
            cached_blocks: group.cached_blocks(self.index),
            used_blocks: pool.held_blocks(),
            shared_with: group.pools.len() - 1,
        }
    }

    pub fn caches_prefixes(&self) -> bool {
        self.lock().prefixes.is_some()
    }

    /// What the prefix cache did so far (zeros when it is off).
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.lock().prefixes.as_ref().map(|p| p.stats).unwrap_or_default()
    }

    /// Drops every cached block no sequence holds; returns how many it dropped.
    pub fn flush_prefix_cache(&self) -> usize {
        self.group().flush(self.index).len()
    }

    /// A new, empty sequence drawing from this pool.
    pub fn new_sequence(&self) -> KvSeq {
        let id = {
            let mut group = self.group();
            let pool = &mut group.pools[self.index];
            pool.next_sequence += 1;
            pool.next_sequence
        };
        KvSeq { id, blocks: Vec::new(), keys: Vec::new(), len: 0, pool: self.clone() }
    }

    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether two handles draw from the same pool.
    pub fn same_pool(&self, other: &BlockPool) -> bool {
        Arc::ptr_eq(&self.group, &other.group) && self.index == other.index
    }

    fn group(&self) -> MutexGuard<'_, PoolGroup> {
        // Every mutation under this lock completes or leaves only counters behind that a
        // panic cannot half-update, so a poisoned lock is still usable.
        self.group.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.group().check_invariants();
    }

    /// This pool's own state, for what concerns no other pool of the group.
    fn lock(&self) -> PoolGuard<'_> {
        PoolGuard { group: self.group(), index: self.index }
    }

    fn take(&self, count: usize) -> Result<Vec<u32>> {
        let mut group = self.group();
        let available = group.available(self.index);
        if available < count {
            return Err(ModelError::OutOfBlocks { needed: count, free: available, block_size: self.block_size });
        }
        Ok((0..count).map_while(|_| group.take_one(self.index)).collect())
    }

    /// Lets go of `blocks`, last first: a sequence's tail blocks are the least likely to
    /// be shared, so they should be the first cached blocks to go.
    fn let_go(&self, blocks: impl DoubleEndedIterator<Item = u32>) {
        let mut group = self.group();
        blocks.rev().for_each(|b| group.let_go(self.index, b));
    }

    /// Holds the longest chain of cached blocks that `tokens` starts with, up to
    /// `max_blocks` of them, and returns them with their keys.
    fn hold_cached_prefix(&self, sequence: u64, tokens: &[u32], max_blocks: usize) -> (Vec<u32>, Vec<u64>) {
        let mut group = self.group();
        let Some(index) = group.pools[self.index].prefixes.as_ref() else { return (Vec::new(), Vec::new()) };
        let (mut blocks, mut keys) = (Vec::new(), Vec::new());
        let mut parent = ROOT_KEY;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let Some((block, key)) = index.find(parent, chunk) else { break };
            blocks.push(block);
            keys.push(key);
            parent = key;
        }
        blocks.iter().for_each(|&b| group.hold(self.index, b));
        let pool = &mut group.pools[self.index];
        if let Some(index) = pool.prefixes.as_mut() {
            index.stats.lookups += 1;
            index.stats.lookup_tokens += (max_blocks * self.block_size) as u64;
            index.stats.hit_tokens += (blocks.len() * self.block_size) as u64;
        }
        if !blocks.is_empty() {
            pool.record(KvEvent::Attach { sequence, blocks: blocks.clone() });
        }
        (blocks, keys)
    }

    /// How many leading tokens of `tokens` a new sequence would find cached now, in
    /// whole blocks before the last token (see [`KvSeq::attach_cached_prefix`]); holds
    /// nothing, so the blocks may be gone by the time the request runs.
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> usize {
        let pool = self.lock();
        let Some(index) = pool.prefixes.as_ref() else { return 0 };
        let max_blocks = tokens.len().saturating_sub(1) / self.block_size;
        let mut parent = ROOT_KEY;
        let mut found = 0;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let Some((_, key)) = index.find(parent, chunk) else { break };
            parent = key;
            found += 1;
        }
        found * self.block_size
    }

    /// Offers `sequence`'s full, computed block at `index` to the cache; returns its key.
    fn seal(&self, sequence: u64, index: usize, block: u32, parent: u64, tokens: &[u32]) -> Option<u64> {
        let mut pool = self.lock();
        let (key, cached) = pool.prefixes.as_mut()?.insert(block, parent, tokens);
        if cached {
            pool.record(KvEvent::Seal { sequence, block, index });
        }
        Some(key)
    }

    /// Makes `block` safe for its holder to overwrite: forgets it in the cache when
    /// the holder is alone with it; otherwise `false` (others read it: do not write).
    fn unseal_for_writing(&self, block: u32) -> bool {
        let mut pool = self.lock();
        if pool.holders[block as usize] > 1 {
            return false;
        }
        if pool.prefixes.as_ref().is_some_and(|index| index.is_cached(block)) {
            pool.prefixes.as_mut().expect("checked").remove(block);
            pool.record(KvEvent::Uncache { block });
        }
        true
    }
}

/// One pool's state inside its locked group.
struct PoolGuard<'a> {
    group: MutexGuard<'a, PoolGroup>,
    index: usize,
}

impl std::ops::Deref for PoolGuard<'_> {
    type Target = PoolState;
    fn deref(&self) -> &PoolState {
        &self.group.pools[self.index]
    }
}

impl std::ops::DerefMut for PoolGuard<'_> {
    fn deref_mut(&mut self) -> &mut PoolState {
        &mut self.group.pools[self.index]
    }
}

/// One request's KV on one model: its block table and how many token positions hold
/// computed K/V. Dropping it returns the blocks to the pool.
#[derive(Debug)]
pub struct KvSeq {
    /// Unique within its pool.
    id: u64,
    blocks: Vec<u32>,
    /// Cache keys of the leading full blocks, as far as they were sealed or reused.
    keys: Vec<u64>,
    len: usize,
    pool: BlockPool,
}

impl KvSeq {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Token positions with computed K/V.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Token slots held (computed or reserved).
    pub fn capacity_tokens(&self) -> usize {
        self.blocks.len() * self.pool.block_size
    }

    /// Blocks still to take from the pool so that `tokens` positions fit.
    pub fn blocks_missing_for(&self, tokens: usize) -> usize {
        self.pool.blocks_for_tokens(tokens).saturating_sub(self.blocks.len())
    }

    /// Makes room for `tokens` positions in total; on failure nothing changes.
    pub fn reserve(&mut self, tokens: usize) -> Result<()> {
        let missing = self.blocks_missing_for(tokens);
        if missing > 0 {
            self.blocks.extend(self.pool.take(missing)?);
        }
        Ok(())
    }

    /// Forgets K/V from position `len` on, and frees blocks no longer needed. A block
    /// that other sequences share is never written again: when `len` falls inside
    /// one, the sequence lets go of it and keeps less (check [`len`](Self::len)).
    pub fn truncate(&mut self, len: usize) {
        let before = self.len;
        self.len = self.len.min(len);
        let bs = self.pool.block_size;
        let whole = self.len / bs;
        if self.keys.len() > whole {
            self.keys.truncate(whole);
            let partial = self.len % bs != 0;
            if partial && !self.pool.unseal_for_writing(self.blocks[whole]) {
                self.len = whole * bs;
            }
        }
        if self.len < before {
            self.pool.record(KvEvent::Trim { sequence: self.id, from: self.len, dropped: false });
        }
        let keep = self.pool.blocks_for_tokens(self.len);
        if keep < self.blocks.len() {
            self.pool.let_go(self.blocks.drain(keep..));
        }
    }

    /// Frees every block: the request will recompute its KV if it returns (cached
    /// blocks among them may still spare it part of that).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// An empty sequence takes the longest cached prefix of `tokens` in whole blocks,
    /// always leaving the last token to compute (its logits are needed). Returns the
    /// positions reused, which are now computed.
    pub fn attach_cached_prefix(&mut self, tokens: &[u32]) -> usize {
        if !self.blocks.is_empty() || tokens.is_empty() {
            return 0;
        }
        let max_blocks = (tokens.len() - 1) / self.pool.block_size;
        let (blocks, keys) = self.pool.hold_cached_prefix(self.id, tokens, max_blocks);
        self.len = blocks.len() * self.pool.block_size;
        self.blocks = blocks;
        self.keys = keys;
        self.len
    }

    /// Offers every full computed block not yet offered to the pool's prefix cache.
    /// `tokens` are the sequence's tokens (at least its computed ones).
    pub fn seal_full_blocks(&mut self, tokens: &[u32]) {
        let bs = self.pool.block_size;
        let full = self.len.min(tokens.len()) / bs;
        for i in self.keys.len()..full {
            let parent = self.keys.last().copied().unwrap_or(ROOT_KEY);
            match self.pool.seal(self.id, i, self.blocks[i], parent, &tokens[i * bs..(i + 1) * bs]) {
                Some(key) => self.keys.push(key),
                None => return,
            }
        }
    }

    /// Records that K/V for positions up to `len` are now computed. The backend calls
    /// this after writing them.
    pub(crate) fn set_computed(&mut self, len: usize) {
        debug_assert!(len <= self.capacity_tokens());
        self.len = len;
    }

    /// (block id, offset in block) of a token position.
    pub fn slot(&self, position: usize) -> (u32, usize) {
        let bs = self.pool.block_size;
        (self.blocks[position / bs], position % bs)
    }
}

impl Drop for KvSeq {
    fn drop(&mut self) {
        self.pool.record(KvEvent::Trim { sequence: self.id, from: 0, dropped: true });
        if !self.blocks.is_empty() {
            self.pool.let_go(self.blocks.drain(..));
        }
    }
}

#[cfg(test)]
#[path = "kv_tests.rs"]
mod tests;
