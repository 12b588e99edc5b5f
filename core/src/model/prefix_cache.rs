//! The index of a pool's cached prefix blocks: which full blocks hold the K/V of which
//! tokens, and which of them no sequence holds (evictable, least recently freed first).
//!
//! Blocks are keyed as vLLM keys them: a hash chained over the block's tokens and its
//! parent's hash, so a key names the whole prefix up to the block's end. A radix tree
//! (SGLang) finds the same matches; chained hashes win here because a lookup is one
//! hash-map probe per block with no tree to rebalance on eviction, and the pool's
//! blocks are already the unit of sharing. Each entry also keeps its tokens and parent
//! key, and a lookup compares them, so a hash collision can never serve wrong K/V.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use lru::LruCache;

/// The key a chain starts from (the parent of a sequence's first block).
pub const ROOT_KEY: u64 = 0x9e37_79b9_7f4a_7c15;

/// The key of a full block holding `tokens`, after the block whose key is `parent`.
pub fn chain_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What the cache did, cumulatively.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefixCacheStats {
    /// Sequences that looked for a cached prefix.
    pub lookups: u64,
    /// Tokens those sequences could have reused at most (whole blocks before their last token).
    pub lookup_tokens: u64,
    /// Tokens reused.
    pub hit_tokens: u64,
    /// Cached blocks given to new K/V because the pool had no other free block.
    pub evicted_blocks: u64,
}

struct Entry {
    key: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

pub(crate) struct PrefixIndex {
    by_key: HashMap<u64, u32>,
    entries: HashMap<u32, Entry>,
    /// Cached blocks no sequence holds, least recently freed first, with the group
    /// clock when each was freed (to compare with other pools of the group).
    evictable: LruCache<u32, u64>,
    pub(crate) stats: PrefixCacheStats,
}

impl PrefixIndex {
    pub(crate) fn new() -> Self {
        PrefixIndex {
            by_key: HashMap::new(),
            entries: HashMap::new(),
            evictable: LruCache::unbounded(),
            stats: PrefixCacheStats::default(),
        }
    }

    pub(crate) fn evictable(&self) -> usize {
        self.evictable.len()
    }

    #[cfg(test)]
    pub(crate) fn is_parked(&self, block: u32) -> bool {
        self.evictable.contains(&block)
    }

    pub(crate) fn is_cached(&self, block: u32) -> bool {
        self.entries.contains_key(&block)
    }

    /// The cached block that continues the chain at `parent` with exactly `tokens`.
    pub(crate) fn find(&self, parent: u64, tokens: &[u32]) -> Option<(u32, u64)> {
        let key = chain_key(parent, tokens);
        let block = *self.by_key.get(&key)?;
        let entry = &self.entries[&block];
        (entry.parent == parent && *entry.tokens == *tokens).then_some((block, key))
    }

    /// Indexes `block` as holding `tokens` after `parent`, unless an equal block is
    /// indexed already (the duplicate then stays private). Returns the block's key and
    /// whether the block is now indexed.
    pub(crate) fn insert(&mut self, block: u32, parent: u64, tokens: &[u32]) -> (u64, bool) {
        let key = chain_key(parent, tokens);
        if self.by_key.contains_key(&key) || self.entries.contains_key(&block) {
            return (key, false);
        }
        self.by_key.insert(key, block);
        self.entries.insert(block, Entry { key, parent, tokens: tokens.into() });
        (key, true)
    }

    /// Forgets `block` (its holder is about to overwrite it).
    pub(crate) fn remove(&mut self, block: u32) {
        if let Some(entry) = self.entries.remove(&block) {
            self.by_key.remove(&entry.key);
        }
        self.evictable.pop(&block);
    }

    /// A cached block lost its last holder, at `clock`.
    pub(crate) fn park(&mut self, block: u32, clock: u64) {
        self.evictable.put(block, clock);
    }

    /// When the least recently freed evictable block was freed.
    pub(crate) fn oldest_park(&self) -> Option<u64> {
        self.evictable.peek_lru().map(|(_, &clock)| clock)
    }

    /// A parked block has a holder again.
    pub(crate) fn unpark(&mut self, block: u32) {
        self.evictable.pop(&block);
    }

    /// Takes the least recently freed cached block out of the cache, for reuse.
    pub(crate) fn evict_one(&mut self) -> Option<u32> {
        let (block, _) = self.evictable.pop_lru()?;
        self.remove(block);
        self.stats.evicted_blocks += 1;
        Some(block)
    }

    /// Drops every parked block from the cache; returns them.
    pub(crate) fn flush(&mut self) -> Vec<u32> {
        let mut freed = Vec::with_capacity(self.evictable.len());
        while let Some((block, _)) = self.evictable.pop_lru() {
            self.remove(block);
            freed.push(block);
        }
        freed
    }
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex").field("evictable", &self.evictable()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_over_the_whole_prefix() {
        let a = chain_key(ROOT_KEY, &[1, 2]);
        let b = chain_key(ROOT_KEY, &[3, 4]);
        assert_ne!(chain_key(a, &[5, 6]), chain_key(b, &[5, 6]));
        assert_eq!(chain_key(a, &[5, 6]), chain_key(chain_key(ROOT_KEY, &[1, 2]), &[5, 6]));
    }

    #[test]
    fn a_lookup_checks_tokens_and_parent_not_only_the_key() {
        let mut index = PrefixIndex::new();
        let (key, cached) = index.insert(7, ROOT_KEY, &[1, 2]);
        assert!(cached);
        assert_eq!(index.find(ROOT_KEY, &[1, 2]), Some((7, key)));
        // Forge a collision: the key now points at an entry with other tokens.
        index.by_key.insert(chain_key(ROOT_KEY, &[9, 9]), 7);
        assert_eq!(index.find(ROOT_KEY, &[9, 9]), None);
    }

    #[test]
    fn duplicates_stay_private_and_eviction_is_least_recently_freed_first() {
        let mut index = PrefixIndex::new();
        index.insert(1, ROOT_KEY, &[1]);
        index.insert(2, ROOT_KEY, &[1]);
        assert!(index.is_cached(1) && !index.is_cached(2));
        index.insert(3, ROOT_KEY, &[2]);
        index.park(3, 1);
        index.park(1, 2);
        assert_eq!(index.oldest_park(), Some(1));
        assert_eq!(index.evict_one(), Some(3));
        assert!(index.find(ROOT_KEY, &[2]).is_none());
        index.unpark(1);
        assert_eq!(index.evict_one(), None);
    }
}
