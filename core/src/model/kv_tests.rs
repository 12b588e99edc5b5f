//! Unit tests of block pools, sequences, the prefix cache and shared page groups.

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

/// Random work on two pools sharing pages (one and three pages a block): sequences
/// reserve, compute, seal, reuse cached prefixes, rewind and end. Whatever happens,
/// once every sequence is gone each pool can take back all its blocks.
#[test]
fn shared_pools_give_back_every_page_after_random_work() {
    use crate::rng::SplitMix64;
    let pools = BlockPool::shared(
        60,
        &[
            SharedPoolSpec { block_size: 2, pages_per_block: 1, prefix_cache: true },
            SharedPoolSpec { block_size: 2, pages_per_block: 3, prefix_cache: true },
        ],
    );
    let mut rng = SplitMix64(7);
    let mut live: Vec<(usize, KvSeq, Vec<u32>)> = Vec::new();
    for _ in 0..5000 {
        let p = (rng.next_u64() % 2) as usize;
        match rng.next_u64() % 5 {
            0 | 1 => {
                let tokens: Vec<u32> = (0..2 + rng.next_u64() % 9).map(|_| (rng.next_u64() % 3) as u32).collect();
                let mut seq = pools[p].new_sequence();
                let reused = seq.attach_cached_prefix(&tokens);
                if seq.reserve(tokens.len()).is_ok() {
                    seq.set_computed(tokens.len());
                    seq.seal_full_blocks(&tokens);
                    live.push((p, seq, tokens));
                } else {
                    assert!(reused <= tokens.len());
                }
            }
            2 if !live.is_empty() => {
                let i = (rng.next_u64() as usize) % live.len();
                let (_, seq, tokens) = &mut live[i];
                let keep = (rng.next_u64() as usize) % (tokens.len() + 1);
                seq.truncate(keep);
                tokens.truncate(seq.len());
            }
            _ if !live.is_empty() => {
                let i = (rng.next_u64() as usize) % live.len();
                live.swap_remove(i);
            }
            _ => {}
        }
        pools[0].check_invariants();
        for pool in &pools {
            let cap = pool.capacity();
            assert!(cap.free_blocks + cap.used_blocks <= cap.total_blocks, "{cap:?}");
        }
    }
    drop(live);
    for pool in &pools {
        let cap = pool.capacity();
        assert_eq!((cap.free_blocks, cap.used_blocks), (cap.total_blocks, 0), "{cap:?}");
    }
    assert_eq!(pools[0].group_pages().0, 60);
}
