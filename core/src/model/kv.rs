//! Paged KV accounting: a pool of fixed-size blocks and per-request block tables that
//! return their blocks to the pool when dropped.
//!
//! The pool only hands out block *ids*; the backend owns the storage the ids index.
//! Keeping ownership of ids in the sequence handle means a request that is cancelled,
//! finished or evicted frees its KV by being dropped, wherever that happens.

use std::sync::{Arc, Mutex, MutexGuard};

use super::error::{ModelError, Result};

#[derive(Debug)]
struct FreeList {
    free: Vec<u32>,
    total: usize,
    next_sequence: u64,
    /// Forgotten K/V, for backends whose storage is keyed by sequence rather than by
    /// block id (llama.cpp): they apply these before their next forward.
    trims: Option<Vec<Trim>>,
}

/// K/V of `sequence` from position `from` on was forgotten; `from == 0` also means
/// the sequence may be gone for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trim {
    pub sequence: u64,
    pub from: usize,
}

/// A pool of `total_blocks` blocks of `block_size` token slots each.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    free: Arc<Mutex<FreeList>>,
}

/// Capacity and use of a pool, in blocks and tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KvCapacity {
    pub block_size: usize,
    pub total_blocks: usize,
    pub free_blocks: usize,
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
        Self::with_trims(total_blocks, block_size, None)
    }

    /// A pool that also records every [`Trim`], for [`take_trims`](Self::take_trims).
    pub fn recording_trims(total_blocks: usize, block_size: usize) -> Self {
        Self::with_trims(total_blocks, block_size, Some(Vec::new()))
    }

    fn with_trims(total_blocks: usize, block_size: usize, trims: Option<Vec<Trim>>) -> Self {
        assert!(block_size > 0, "block size must be positive");
        // Pop from the end hands out low ids first, which keeps early storage hot.
        let free = (0..total_blocks as u32).rev().collect();
        let list = FreeList { free, total: total_blocks, next_sequence: 0, trims };
        BlockPool { block_size, free: Arc::new(Mutex::new(list)) }
    }

    /// Trims recorded since the last call, oldest first (empty unless recording).
    pub fn take_trims(&self) -> Vec<Trim> {
        self.lock().trims.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record_trim(&self, trim: Trim) {
        if let Some(trims) = self.lock().trims.as_mut() {
            trims.push(trim);
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn capacity(&self) -> KvCapacity {
        let list = self.lock();
        KvCapacity { block_size: self.block_size, total_blocks: list.total, free_blocks: list.free.len() }
    }

    /// A new, empty sequence drawing from this pool.
    pub fn new_sequence(&self) -> KvSeq {
        let id = {
            let mut list = self.lock();
            list.next_sequence += 1;
            list.next_sequence
        };
        KvSeq { id, blocks: Vec::new(), len: 0, pool: self.clone() }
    }

    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether two handles draw from the same pool.
    pub fn same_pool(&self, other: &BlockPool) -> bool {
        Arc::ptr_eq(&self.free, &other.free)
    }

    fn lock(&self) -> MutexGuard<'_, FreeList> {
        // A panic while holding this lock cannot leave the list inconsistent (every
        // mutation is a single push/pop/truncate), so a poisoned lock is still usable.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, count: usize) -> Result<Vec<u32>> {
        let mut list = self.lock();
        if list.free.len() < count {
            return Err(ModelError::OutOfBlocks { needed: count, free: list.free.len(), block_size: self.block_size });
        }
        let at = list.free.len() - count;
        Ok(list.free.split_off(at))
    }

    fn give_back(&self, blocks: impl IntoIterator<Item = u32>) {
        self.lock().free.extend(blocks);
    }
}

/// One request's KV on one model: its block table and how many token positions hold
/// computed K/V. Dropping it returns the blocks to the pool.
#[derive(Debug)]
pub struct KvSeq {
    /// Unique within its pool.
    id: u64,
    blocks: Vec<u32>,
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

    /// Forgets K/V from position `len` on, and frees blocks no longer needed.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.pool.record_trim(Trim { sequence: self.id, from: len });
        }
        self.len = self.len.min(len);
        let keep = self.pool.blocks_for_tokens(self.len);
        if keep < self.blocks.len() {
            self.pool.give_back(self.blocks.drain(keep..));
        }
    }

    /// Frees every block: the request will recompute its KV if it returns.
    pub fn clear(&mut self) {
        self.truncate(0);
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
        if self.len > 0 {
            self.pool.record_trim(Trim { sequence: self.id, from: 0 });
        }
        if !self.blocks.is_empty() {
            self.pool.give_back(self.blocks.drain(..));
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
    fn a_recording_pool_logs_rewinds_and_drops_only() {
        let pool = BlockPool::recording_trims(8, 4);
        let mut a = pool.new_sequence();
        let b = pool.new_sequence();
        assert_ne!(a.id(), b.id());
        a.reserve(10).unwrap();
        a.set_computed(10);
        a.truncate(12);
        a.truncate(6);
        drop(b); // never computed anything: nothing to forget
        let a_id = a.id();
        drop(a);
        let trims = pool.take_trims();
        assert_eq!(trims, vec![Trim { sequence: a_id, from: 6 }, Trim { sequence: a_id, from: 0 }]);
        assert!(pool.take_trims().is_empty());
        assert!(BlockPool::new(4, 4).take_trims().is_empty());
    }
}
