//! Paged KV accounting: a pool of fixed-size blocks and per-request block tables that
//! return their blocks to the pool when dropped.
//!
//! The pool only hands out block *ids*; the backend owns the storage the ids index.
//! Keeping ownership of ids in the sequence handle means a request that is cancelled,
//! finished or evicted frees its KV by being dropped, wherever that happens.

use std::sync::{Arc, Mutex, MutexGuard};

use super::error::{ModelError, Result};
use super::prefix_cache::{PrefixCacheStats, PrefixIndex, ROOT_KEY};

#[derive(Debug)]
struct PoolState {
    /// Blocks that hold nothing of value.
    free: Vec<u32>,
    /// How many sequences hold each block.
    holders: Vec<u32>,
    next_sequence: u64,
    /// What happened to sequences and cached blocks, for backends whose storage is
    /// keyed by sequence rather than by block id (llama.cpp): they replay it before
    /// their next forward.
    events: Option<Vec<KvEvent>>,
    /// Full blocks kept for reuse by later sequences with the same prefix.
    prefixes: Option<PrefixIndex>,
}

impl PoolState {
    fn record(&mut self, event: KvEvent) {
        if let Some(events) = self.events.as_mut() {
            events.push(event);
        }
    }

    fn available(&self) -> usize {
        self.free.len() + self.prefixes.as_ref().map_or(0, PrefixIndex::evictable)
    }

    /// One block for new K/V: a free one, else the least recently freed cached one.
    fn take_one(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let block = self.prefixes.as_mut()?.evict_one()?;
                self.record(KvEvent::Uncache { block });
                block
            }
        };
        self.holders[block as usize] = 1;
        Some(block)
    }

    fn hold(&mut self, block: u32) {
        let holders = &mut self.holders[block as usize];
        *holders += 1;
        if *holders == 1 {
            if let Some(index) = self.prefixes.as_mut() {
                index.unpark(block);
            }
        }
    }

    fn let_go(&mut self, block: u32) {
        let holders = &mut self.holders[block as usize];
        debug_assert!(*holders > 0, "block {block} released more often than held");
        *holders = holders.saturating_sub(1);
        if *holders > 0 {
            return;
        }
        match self.prefixes.as_mut() {
            Some(index) if index.is_cached(block) => index.park(block),
            _ => self.free.push(block),
        }
    }
}

/// What a pool records for a backend that keys K/V by sequence (see [`BlockPool::recording_events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// K/V of `sequence` from position `from` on was forgotten; `dropped`: the sequence
    /// is gone for good.
    Trim { sequence: u64, from: usize, dropped: bool },
    /// `sequence`'s full block at `index` (positions `index * block_size..`) entered the
    /// prefix cache as `block`.
    Seal { sequence: u64, block: u32, index: usize },
    /// The empty `sequence` took cached `blocks` as its first positions.
    Attach { sequence: u64, blocks: Vec<u32> },
    /// `block` left the prefix cache (taken for new K/V, or about to be rewritten).
    Uncache { block: u32 },
}

/// A pool of `total_blocks` blocks of `block_size` token slots each.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    state: Arc<Mutex<PoolState>>,
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
}

impl KvCapacity {
    pub fn used_blocks(&self) -> usize {
        self.total_blocks - self.free_blocks
    }
    pub fn total_tokens(&self) -> usize {
        self.total_blocks * self.block_size
    }
}

impl BlockPool {
    pub fn new(total_blocks: usize, block_size: usize) -> Self {
        Self::with_state(total_blocks, block_size, None, None)
    }

    /// A pool that keeps sealed full blocks for reuse (see [`KvSeq::attach_cached_prefix`]),
    /// for backends that store K/V by block id.
    pub fn caching_prefixes(total_blocks: usize, block_size: usize) -> Self {
        Self::with_state(total_blocks, block_size, None, Some(PrefixIndex::new()))
    }

    /// A pool that records every [`KvEvent`], for [`take_events`](Self::take_events), so
    /// that a backend keyed by sequence can follow; with `caching`, it keeps a prefix cache.
    pub fn recording_events(total_blocks: usize, block_size: usize, caching: bool) -> Self {
        Self::with_state(total_blocks, block_size, Some(Vec::new()), caching.then(PrefixIndex::new))
    }

    fn with_state(
        total_blocks: usize,
        block_size: usize,
        events: Option<Vec<KvEvent>>,
        prefixes: Option<PrefixIndex>,
    ) -> Self {
        assert!(block_size > 0, "block size must be positive");
        // Pop from the end hands out low ids first, which keeps early storage hot.
        let free = (0..total_blocks as u32).rev().collect();
        let state = PoolState { free, holders: vec![0; total_blocks], next_sequence: 0, events, prefixes };
        BlockPool { block_size, state: Arc::new(Mutex::new(state)) }
    }

    /// Events recorded since the last call, oldest first (empty unless recording).
    pub fn take_events(&self) -> Vec<KvEvent> {
        self.lock().events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record(&self, event: KvEvent) {
        self.lock().record(event);
    }

    /// Takes `blocks` out of the prefix cache (a backend that can no longer keep their
    /// K/V); a block no sequence holds becomes plainly free. Records nothing.
    pub fn uncache(&self, blocks: &[u32]) {
        let mut state = self.lock();
        for &block in blocks {
            let Some(index) = state.prefixes.as_mut() else { return };
            if !index.is_cached(block) {
                continue;
            }
            index.remove(block);
            if state.holders[block as usize] == 0 {
                state.free.push(block);
            }
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn capacity(&self) -> KvCapacity {
        let state = self.lock();
        KvCapacity {
            block_size: self.block_size,
            total_blocks: state.holders.len(),
            free_blocks: state.available(),
            cached_blocks: state.prefixes.as_ref().map_or(0, PrefixIndex::evictable),
        }
    }

    pub fn caches_prefixes(&self) -> bool {
        self.lock().prefixes.is_some()
    }

    /// What the prefix cache did so far (zeros when it is off).
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.lock().prefixes.as_ref().map(|p| p.stats).unwrap_or_default()
    }

    /// Drops every cached block no sequence holds.
    pub fn flush_prefix_cache(&self) {
        let mut state = self.lock();
        let freed = state.prefixes.as_mut().map(PrefixIndex::flush).unwrap_or_default();
        for &block in &freed {
            state.record(KvEvent::Uncache { block });
        }
        state.free.extend(freed);
    }

    /// A new, empty sequence drawing from this pool.
    pub fn new_sequence(&self) -> KvSeq {
        let id = {
            let mut state = self.lock();
            state.next_sequence += 1;
            state.next_sequence
        };
        KvSeq { id, blocks: Vec::new(), keys: Vec::new(), len: 0, pool: self.clone() }
    }

    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether two handles draw from the same pool.
    pub fn same_pool(&self, other: &BlockPool) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Every mutation under this lock completes or leaves only counters behind that a
        // panic cannot half-update, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, count: usize) -> Result<Vec<u32>> {
        let mut state = self.lock();
        let available = state.available();
        if available < count {
            return Err(ModelError::OutOfBlocks { needed: count, free: available, block_size: self.block_size });
        }
        Ok((0..count).map_while(|_| state.take_one()).collect())
    }

    /// Lets go of `blocks`, last first: a sequence's tail blocks are the least likely to
    /// be shared, so they should be the first cached blocks to go.
    fn let_go(&self, blocks: impl DoubleEndedIterator<Item = u32>) {
        let mut state = self.lock();
        blocks.rev().for_each(|b| state.let_go(b));
    }

    /// Holds the longest chain of cached blocks that `tokens` starts with, up to
    /// `max_blocks` of them, and returns them with their keys.
    fn hold_cached_prefix(&self, sequence: u64, tokens: &[u32], max_blocks: usize) -> (Vec<u32>, Vec<u64>) {
        let mut state = self.lock();
        let Some(index) = state.prefixes.as_ref() else { return (Vec::new(), Vec::new()) };
        let (mut blocks, mut keys) = (Vec::new(), Vec::new());
        let mut parent = ROOT_KEY;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let Some((block, key)) = index.find(parent, chunk) else { break };
            blocks.push(block);
            keys.push(key);
            parent = key;
        }
        blocks.iter().for_each(|&b| state.hold(b));
        if let Some(index) = state.prefixes.as_mut() {
            index.stats.lookups += 1;
            index.stats.lookup_tokens += (max_blocks * self.block_size) as u64;
            index.stats.hit_tokens += (blocks.len() * self.block_size) as u64;
        }
        if !blocks.is_empty() {
            state.record(KvEvent::Attach { sequence, blocks: blocks.clone() });
        }
        (blocks, keys)
    }

    /// How many leading tokens of `tokens` a new sequence would find cached now, in
    /// whole blocks before the last token (see [`KvSeq::attach_cached_prefix`]); holds
    /// nothing, so the blocks may be gone by the time the request runs.
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> usize {
        let state = self.lock();
        let Some(index) = state.prefixes.as_ref() else { return 0 };
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
        let mut state = self.lock();
        let (key, cached) = state.prefixes.as_mut()?.insert(block, parent, tokens);
        if cached {
            state.record(KvEvent::Seal { sequence, block, index });
        }
        Some(key)
    }

    /// Makes `block` safe for its holder to overwrite: forgets it in the cache when
    /// the holder is alone with it; otherwise `false` (others read it: do not write).
    fn unseal_for_writing(&self, block: u32) -> bool {
        let mut state = self.lock();
        if state.holders[block as usize] > 1 {
            return false;
        }
        if state.prefixes.as_ref().is_some_and(|index| index.is_cached(block)) {
            state.prefixes.as_mut().expect("checked").remove(block);
            state.record(KvEvent::Uncache { block });
        }
        true
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
mod tests {
    use super::*;

    #[test]
    fn dropping_a_sequence_returns_its_blocks() {
        let pool = BlockPool::new(10, 4);
        {
            let mut a = pool.new_sequence();
            a.reserve(9).unwrap();
            assert_eq!(a.blocks().len(), 3);
            assert_eq!(pool.capacity().free_blocks, 7);
        }
        assert_eq!(pool.capacity().free_blocks, 10);
    }

    #[test]
    fn running_out_is_an_error_that_changes_nothing() {
        let pool = BlockPool::new(3, 4);
        let mut a = pool.new_sequence();
        a.reserve(8).unwrap();
        let mut b = pool.new_sequence();
        let err = b.reserve(8).unwrap_err();
        assert!(matches!(err, ModelError::OutOfBlocks { needed: 2, free: 1, .. }));
        assert!(b.blocks().is_empty());
        assert_eq!(pool.capacity().free_blocks, 1);
    }

    #[test]
    fn truncate_frees_trailing_blocks_only() {
        let pool = BlockPool::new(8, 4);
        let mut a = pool.new_sequence();
        a.reserve(12).unwrap();
        a.set_computed(12);
        a.truncate(5);
        assert_eq!(a.len(), 5);
        assert_eq!(a.blocks().len(), 2);
        assert_eq!(pool.capacity().free_blocks, 6);
        a.clear();
        assert_eq!(pool.capacity().free_blocks, 8);
    }

    #[test]
    fn slots_walk_the_block_table() {
        let pool = BlockPool::new(8, 4);
        let mut noise = pool.new_sequence();
        noise.reserve(4).unwrap();
        let mut a = pool.new_sequence();
        a.reserve(6).unwrap();
        let (b0, o0) = a.slot(0);
        let (b1, o1) = a.slot(5);
        assert_eq!((b0, o0), (a.blocks()[0], 0));
        assert_eq!((b1, o1), (a.blocks()[1], 1));
        assert_ne!(b0, noise.blocks()[0]);
    }

    #[test]
    fn a_recording_pool_logs_rewinds_and_drops() {
        let pool = BlockPool::recording_events(8, 4, false);
        let mut a = pool.new_sequence();
        let b = pool.new_sequence();
        assert_ne!(a.id(), b.id());
        a.reserve(10).unwrap();
        a.set_computed(10);
        a.truncate(12);
        a.truncate(6);
        let (a_id, b_id) = (a.id(), b.id());
        drop(b);
        drop(a);
        let trim = |sequence, from, dropped| KvEvent::Trim { sequence, from, dropped };
        assert_eq!(pool.take_events(), vec![trim(a_id, 6, false), trim(b_id, 0, true), trim(a_id, 0, true)]);
        assert!(pool.take_events().is_empty());
        let quiet = BlockPool::new(4, 4);
        drop(quiet.new_sequence());
        assert!(quiet.take_events().is_empty());
    }

    #[test]
    fn a_recording_cache_logs_seals_attaches_and_what_leaves_it() {
        let pool = BlockPool::recording_events(3, 2, true);
        let a = computed(&pool, &[1, 2, 3, 4]);
        let mut b = pool.new_sequence();
        assert_eq!(b.attach_cached_prefix(&[1, 2, 3, 4, 5]), 4);
        let (a_id, b_id, blocks) = (a.id(), b.id(), a.blocks().to_vec());
        drop((a, b));
        // Three blocks: the free one first, then the least recently freed cached one.
        let mut c = pool.new_sequence();
        c.reserve(4).unwrap();
        let events = pool.take_events();
        assert_eq!(
            events,
            vec![
                KvEvent::Seal { sequence: a_id, block: blocks[0], index: 0 },
                KvEvent::Seal { sequence: a_id, block: blocks[1], index: 1 },
                KvEvent::Attach { sequence: b_id, blocks: blocks.clone() },
                KvEvent::Trim { sequence: a_id, from: 0, dropped: true },
                KvEvent::Trim { sequence: b_id, from: 0, dropped: true },
                KvEvent::Uncache { block: blocks[1] },
            ]
        );
        pool.uncache(&[blocks[0]]);
        assert_eq!(pool.capacity().cached_blocks, 0);
        assert_eq!(pool.capacity().free_blocks, 1);
    }
    /// A sequence that computed `tokens` and offered its full blocks to the cache.
    fn computed(pool: &BlockPool, tokens: &[u32]) -> KvSeq {
        let mut seq = pool.new_sequence();
        seq.reserve(tokens.len()).unwrap();
        seq.set_computed(tokens.len());
        seq.seal_full_blocks(tokens);
        seq
    }

    #[test]
    fn a_later_sequence_reuses_sealed_blocks_and_shares_them() {
        let pool = BlockPool::caching_prefixes(16, 4);
        let first = computed(&pool, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let mut second = pool.new_sequence();
        // Two whole blocks match; the third differs.
        assert_eq!(second.attach_cached_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 11, 12]), 8);
        assert_eq!(second.blocks(), &first.blocks()[..2]);
        assert_eq!(second.len(), 8);
        assert_eq!(pool.capacity().free_blocks, 13, "shared blocks count once");
        let stats = pool.prefix_cache_stats();
        assert_eq!((stats.lookups, stats.lookup_tokens, stats.hit_tokens), (1, 8, 8));
        // The last token is always left to compute, even when every block matches.
        let mut third = pool.new_sequence();
        assert_eq!(third.attach_cached_prefix(&[1, 2, 3, 4, 5, 6, 7, 8]), 4);
        // A different first block matches nothing, however the rest looks.
        let mut other = pool.new_sequence();
        assert_eq!(other.attach_cached_prefix(&[0, 2, 3, 4, 5, 6, 7, 8, 9]), 0);
    }

    #[test]
    fn held_blocks_are_never_evicted_and_a_flush_frees_everything() {
        let pool = BlockPool::caching_prefixes(4, 2);
        let running = computed(&pool, &[1, 2, 3, 4]);
        drop(computed(&pool, &[5, 6, 7, 8]));
        let cap = pool.capacity();
        assert_eq!((cap.free_blocks, cap.cached_blocks), (2, 2));
        // New K/V may take the parked blocks, never the running sequence's.
        let mut hungry = pool.new_sequence();
        hungry.reserve(4).unwrap();
        assert!(hungry.blocks().iter().all(|b| !running.blocks().contains(b)));
        assert_eq!(pool.prefix_cache_stats().evicted_blocks, 2);
        assert!(hungry.reserve(6).is_err(), "the running sequence's blocks are not free");
        let mut again = pool.new_sequence();
        assert_eq!(again.attach_cached_prefix(&[5, 6, 7, 8, 9]), 0, "evicted blocks are forgotten");
        assert_eq!(again.attach_cached_prefix(&[1, 2, 3, 4, 9]), 4);
        drop((running, hungry, again));
        assert_eq!(pool.capacity().free_blocks, 4);
        assert_eq!(pool.capacity().cached_blocks, 2);
        pool.flush_prefix_cache();
        let cap = pool.capacity();
        assert_eq!((cap.free_blocks, cap.cached_blocks), (4, 0));
    }

    #[test]
    fn eviction_takes_the_least_recently_freed_block_and_tails_first() {
        let pool = BlockPool::caching_prefixes(4, 2);
        drop(computed(&pool, &[1, 2, 3, 4]));
        drop(computed(&pool, &[5, 6, 7, 8]));
        let mut one = pool.new_sequence();
        one.reserve(2).unwrap();
        // [1, 2, 3, 4]'s tail block went first; its head still matches.
        let mut probe = pool.new_sequence();
        assert_eq!(probe.attach_cached_prefix(&[1, 2, 3, 4, 0]), 2);
        drop(probe);
        let mut probe = pool.new_sequence();
        assert_eq!(probe.attach_cached_prefix(&[5, 6, 7, 8, 0]), 4);
    }

    #[test]
    fn rewinding_into_a_shared_block_lets_go_of_it_and_into_a_private_one_unseals_it() {
        let pool = BlockPool::caching_prefixes(8, 4);
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut a = computed(&pool, &tokens);
        let mut b = pool.new_sequence();
        b.attach_cached_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        // a shares both blocks with b: a rewind to 6 must not write into block 1.
        a.truncate(6);
        assert_eq!((a.len(), a.blocks().len()), (4, 1));
        drop(b);
        // Alone with a sealed block, a sequence may rewrite it; the cache forgets it.
        let mut c = pool.new_sequence();
        assert_eq!(c.attach_cached_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), 8);
        drop(a);
        c.truncate(6);
        assert_eq!(c.len(), 6);
        let mut d = pool.new_sequence();
        assert_eq!(d.attach_cached_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), 4);
    }

    #[test]
    fn a_pool_without_a_cache_frees_blocks_at_once() {
        let pool = BlockPool::new(4, 2);
        drop(computed(&pool, &[1, 2, 3, 4]));
        assert_eq!(pool.capacity().cached_blocks, 0);
        let mut seq = pool.new_sequence();
        assert_eq!(seq.attach_cached_prefix(&[1, 2, 3, 4, 5]), 0);
        assert!(!pool.caches_prefixes());
    }
}
