//! The accounting state behind [`BlockPool`](super::kv::BlockPool)s: one or more
//! models' block pools over one set of storage pages.
//!
//! A pool's block ids are virtual: a block holds storage only while a sequence holds
//! it or the prefix cache keeps it, as `pages_per_block` pages of its group. Pools in
//! one group (colocated models on one budget) draw pages from one free list, so the
//! split between models follows demand: a model that needs room takes free pages, then
//! the group's least recently freed cached blocks, its own or another model's. A model
//! alone is a group of one whose page is its block.

use super::prefix_cache::PrefixIndex;

/// What a pool records for a backend that keys K/V by sequence (see [`BlockPool::recording_events`](super::kv::BlockPool::recording_events)).
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

#[derive(Debug)]
pub(crate) struct PoolState {
    /// Block ids that hold no pages.
    free: Vec<u32>,
    /// How many sequences hold each block.
    pub(crate) holders: Vec<u32>,
    pub(crate) next_sequence: u64,
    pages_per_block: usize,
    /// `pages_per_block` page ids per block; meaningful while the block holds pages.
    block_pages: Vec<u32>,
    /// Blocks given new pages since the storage last looked (see [`PoolGroup::sync_pages`]).
    remapped: Vec<u32>,
    paged_storage: bool,
    /// What happened to sequences and cached blocks, for backends whose storage is
    /// keyed by sequence rather than by block id (llama.cpp): they replay it before
    /// their next forward.
    pub(crate) events: Option<Vec<KvEvent>>,
    /// Full blocks kept for reuse by later sequences with the same prefix.
    pub(crate) prefixes: Option<PrefixIndex>,
}

impl PoolState {
    pub(crate) fn record(&mut self, event: KvEvent) {
        if let Some(events) = self.events.as_mut() {
            events.push(event);
        }
    }

    fn evictable(&self) -> usize {
        self.prefixes.as_ref().map_or(0, PrefixIndex::evictable)
    }

    pub(crate) fn pages_per_block(&self) -> usize {
        self.pages_per_block
    }

    pub(crate) fn total_blocks(&self) -> usize {
        self.holders.len()
    }

    /// Blocks some sequence holds.
    pub(crate) fn held_blocks(&self) -> usize {
        self.holders.iter().filter(|&&h| h > 0).count()
    }
}

/// What a pool in a group is made of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolShape {
    pub(crate) pages_per_block: usize,
    /// Storage reads pages through [`PoolGroup::sync_pages`] (candle); else page ids
    /// are only counted (llama.cpp keys its own storage by sequence).
    pub(crate) paged_storage: bool,
    pub(crate) recording: bool,
    pub(crate) caching: bool,
}

#[derive(Debug)]
pub(crate) struct PoolGroup {
    pub(crate) pools: Vec<PoolState>,
    free_pages: Vec<u32>,
    total_pages: usize,
    /// Orders cached blocks across pools by when they were freed.
    clock: u64,
}

impl PoolGroup {
    pub(crate) fn new(total_pages: usize, shapes: &[PoolShape]) -> Self {
        let pools = shapes
            .iter()
            .map(|s| {
                let n = s.pages_per_block.max(1);
                let blocks = total_pages / n;
                PoolState {
                    // Pop from the end hands out low ids first.
                    free: (0..blocks as u32).rev().collect(),
                    holders: vec![0; blocks],
                    next_sequence: 0,
                    pages_per_block: n,
                    block_pages: vec![0; blocks * n],
                    remapped: Vec::new(),
                    paged_storage: s.paged_storage,
                    events: s.recording.then(Vec::new),
                    prefixes: s.caching.then(PrefixIndex::new),
                }
            })
            .collect();
        // Low pages first too, which keeps early storage hot.
        let free_pages = (0..total_pages as u32).rev().collect();
        PoolGroup { pools, free_pages, total_pages, clock: 0 }
    }

    /// Every block id of every pool is free, held or parked exactly once, and every page
    /// is free or belongs to exactly one held or parked block.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut pages = self.free_pages.clone();
        for (i, pool) in self.pools.iter().enumerate() {
            let n = pool.pages_per_block;
            let mut seen = vec![0u8; pool.holders.len()];
            for &b in &pool.free {
                seen[b as usize] += 1;
            }
            for b in 0..pool.holders.len() {
                let parked = pool.prefixes.as_ref().is_some_and(|x| x.is_parked(b as u32));
                if pool.holders[b] > 0 || parked {
                    seen[b] += 1;
                    pages.extend_from_slice(&pool.block_pages[b * n..(b + 1) * n]);
                }
                assert_eq!(seen[b], 1, "pool {i} block {b}: holders {}, parked {parked}", pool.holders[b]);
            }
        }
        pages.sort_unstable();
        let want: Vec<u32> = (0..self.total_pages as u32).collect();
        assert_eq!(pages, want, "pages");
    }

    pub(crate) fn total_pages(&self) -> usize {
        self.total_pages
    }

    pub(crate) fn free_pages(&self) -> usize {
        self.free_pages.len()
    }

    /// Blocks pool `p` could take now: its own free and cached ones, as far as the
    /// group's free pages and every pool's cached pages allow.
    pub(crate) fn available(&self, p: usize) -> usize {
        let pool = &self.pools[p];
        let evictable_pages: usize = self.pools.iter().map(|q| q.evictable() * q.pages_per_block).sum();
        let by_pages = (self.free_pages.len() + evictable_pages) / pool.pages_per_block;
        by_pages.min(pool.free.len() + pool.evictable())
    }

    pub(crate) fn cached_blocks(&self, p: usize) -> usize {
        self.pools[p].evictable()
    }

    /// One block for new K/V in pool `p`: pages from the free list, else from the
    /// group's least recently freed cached blocks.
    pub(crate) fn take_one(&mut self, p: usize) -> Option<u32> {
        let n = self.pools[p].pages_per_block;
        while self.free_pages.len() < n || self.pools[p].free.is_empty() {
            let victim = if self.pools[p].free.is_empty() { Some(p) } else { self.oldest_cached_pool() };
            self.evict_from(victim?)?;
        }
        let pool = &mut self.pools[p];
        let block = pool.free.pop().expect("checked above");
        let at = block as usize * n;
        for slot in &mut pool.block_pages[at..at + n] {
            *slot = self.free_pages.pop().expect("checked above");
        }
        if pool.paged_storage {
            pool.remapped.push(block);
        }
        pool.holders[block as usize] = 1;
        Some(block)
    }

    /// The pool whose least recently freed cached block is the oldest in the group.
    fn oldest_cached_pool(&self) -> Option<usize> {
        (0..self.pools.len())
            .filter_map(|q| Some((self.pools[q].prefixes.as_ref()?.oldest_park()?, q)))
            .min()
            .map(|(_, q)| q)
    }

    /// Evicts pool `q`'s least recently freed cached block, freeing its pages.
    fn evict_from(&mut self, q: usize) -> Option<()> {
        let block = self.pools[q].prefixes.as_mut()?.evict_one()?;
        self.pools[q].record(KvEvent::Uncache { block });
        self.free_block(q, block);
        Some(())
    }

    /// `block` of pool `p` holds nothing of value any more: its pages go back.
    pub(crate) fn free_block(&mut self, p: usize, block: u32) {
        let pool = &mut self.pools[p];
        let at = block as usize * pool.pages_per_block;
        self.free_pages.extend_from_slice(&pool.block_pages[at..at + pool.pages_per_block]);
        pool.free.push(block);
    }

    pub(crate) fn hold(&mut self, p: usize, block: u32) {
        let pool = &mut self.pools[p];
        let holders = &mut pool.holders[block as usize];
        *holders += 1;
        if *holders == 1 {
            if let Some(index) = pool.prefixes.as_mut() {
                index.unpark(block);
            }
        }
    }

    pub(crate) fn let_go(&mut self, p: usize, block: u32) {
        let pool = &mut self.pools[p];
        let holders = &mut pool.holders[block as usize];
        debug_assert!(*holders > 0, "block {block} released more often than held");
        *holders = holders.saturating_sub(1);
        if *holders > 0 {
            return;
        }
        self.clock += 1;
        match pool.prefixes.as_mut() {
            Some(index) if index.is_cached(block) => index.park(block, self.clock),
            _ => self.free_block(p, block),
        }
    }

    /// Drops pool `p`'s cached blocks that no sequence holds; returns them.
    pub(crate) fn flush(&mut self, p: usize) -> Vec<u32> {
        let freed = self.pools[p].prefixes.as_mut().map(PrefixIndex::flush).unwrap_or_default();
        for &block in &freed {
            self.pools[p].record(KvEvent::Uncache { block });
            self.free_block(p, block);
        }
        freed
    }

    /// Copies the pages of pool `p`'s blocks that changed since the last call into
    /// `table` (`pages_per_block` entries per block id).
    pub(crate) fn sync_pages(&mut self, p: usize, table: &mut [u32]) {
        let pool = &mut self.pools[p];
        let n = pool.pages_per_block;
        for block in pool.remapped.drain(..) {
            let at = block as usize * n;
            table[at..at + n].copy_from_slice(&pool.block_pages[at..at + n]);
        }
    }
}
