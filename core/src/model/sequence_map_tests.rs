use std::collections::{BTreeMap, HashMap};

use super::*;
use crate::model::kv::KvSeq;

/// llama.cpp's unified cache in miniature: each sequence id sees position → token.
#[derive(Default)]
struct FakeCells {
    seqs: HashMap<i32, BTreeMap<usize, u32>>,
}

impl SequenceCells for FakeCells {
    fn forget(&mut self, seq: i32, from: usize, to: Option<usize>) {
        if let Some(cells) = self.seqs.get_mut(&seq) {
            cells.retain(|&p, _| p < from || to.is_some_and(|t| p >= t));
        }
    }
    fn share(&mut self, src: i32, dst: i32, from: usize, to: usize) {
        let copied: Vec<(usize, u32)> = self
            .seqs
            .get(&src)
            .into_iter()
            .flatten()
            .filter(|(&p, _)| p >= from && p < to)
            .map(|(&p, &t)| (p, t))
            .collect();
        self.seqs.entry(dst).or_default().extend(copied);
    }
}

struct Harness {
    pool: BlockPool,
    map: SequenceMap,
    cells: FakeCells,
}

impl Harness {
    fn new(blocks: usize, max_sequences: usize) -> Self {
        Harness {
            pool: BlockPool::recording_events(blocks, 2, true),
            map: SequenceMap::new(max_sequences, 2),
            cells: FakeCells::default(),
        }
    }

    fn sync(&mut self) {
        let events = self.pool.take_events();
        self.map.apply(events, &mut self.cells, &self.pool).unwrap();
    }

    /// What a forward does: reuse the cache if empty, compute the rest, seal.
    fn compute(&mut self, seq: &mut KvSeq, tokens: &[u32]) {
        if seq.is_empty() {
            seq.attach_cached_prefix(tokens);
        }
        self.sync();
        seq.reserve(tokens.len()).unwrap();
        self.sync();
        let id = self.map.id_for(seq.id(), &mut self.cells, &self.pool).unwrap();
        let cells = self.cells.seqs.entry(id).or_default();
        cells.extend((seq.len()..tokens.len()).map(|p| (p, tokens[p])));
        seq.set_computed(tokens.len());
        seq.seal_full_blocks(tokens);
        self.sync();
    }

    /// The backend's view of a sequence equals its tokens, position by position.
    fn assert_sees(&self, seq: &KvSeq, tokens: &[u32]) {
        let id = self.map.id_of(seq.id()).expect("a computed sequence has an id");
        let seen: Vec<u32> = self.cells.seqs[&id].values().copied().collect();
        assert_eq!(self.cells.seqs[&id].keys().copied().collect::<Vec<_>>(), (0..seq.len()).collect::<Vec<_>>());
        assert_eq!(seen, tokens[..seq.len()]);
    }
}

#[test]
fn a_reused_prefix_shares_the_home_cells_even_after_the_home_ends() {
    let mut h = Harness::new(16, 8);
    let tokens = [1, 2, 3, 4, 5];
    let mut a = h.pool.new_sequence();
    h.compute(&mut a, &tokens);
    let mut b = h.pool.new_sequence();
    h.compute(&mut b, &[1, 2, 3, 4, 9, 9]);
    h.assert_sees(&b, &[1, 2, 3, 4, 9, 9]);
    assert_eq!(h.pool.prefix_cache_stats().hit_tokens, 4);
    let a_id = h.map.id_of(a.id()).unwrap();
    drop(a);
    drop(b);
    h.sync();
    assert_eq!(h.map.zombies(), 2, "each home keeps its cached blocks' cells (b sealed [9, 9])");
    assert_eq!(h.cells.seqs[&a_id].keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3], "and nothing else");
    let mut c = h.pool.new_sequence();
    h.compute(&mut c, &[1, 2, 3, 4, 7]);
    h.assert_sees(&c, &[1, 2, 3, 4, 7]);
    assert_eq!(h.pool.prefix_cache_stats().hit_tokens, 8);
    // A chain whose blocks live in two homes (a's first two, b's third).
    let mut d = h.pool.new_sequence();
    h.compute(&mut d, &[1, 2, 3, 4, 9, 9, 5]);
    h.assert_sees(&d, &[1, 2, 3, 4, 9, 9, 5]);
    assert_eq!(h.pool.prefix_cache_stats().hit_tokens, 14);
}

#[test]
fn evicted_blocks_free_the_zombie_cells_and_its_id() {
    let mut h = Harness::new(4, 8);
    let mut a = h.pool.new_sequence();
    h.compute(&mut a, &[1, 2, 3, 4, 5]);
    let a_id = h.map.id_of(a.id()).unwrap();
    drop(a);
    h.sync();
    let before = h.map.available_ids();
    // Four blocks of new K/V take the two cached ones.
    let mut b = h.pool.new_sequence();
    h.compute(&mut b, &[8, 8, 8, 8, 8, 8, 8, 8]);
    h.assert_sees(&b, &[8; 8]);
    assert_eq!(h.map.zombies(), 0);
    if h.map.id_of(b.id()) != Some(a_id) {
        assert!(h.cells.seqs[&a_id].is_empty(), "the zombie's cells went with its blocks");
    }
    assert_eq!(h.map.available_ids(), before - 1, "b took one id; the zombie's came back");
}

#[test]
fn a_rewind_past_cached_blocks_moves_the_request_to_a_new_id() {
    let mut h = Harness::new(16, 8);
    let tokens = [1, 2, 3, 4, 5, 6, 7];
    let mut a = h.pool.new_sequence();
    h.compute(&mut a, &tokens);
    let old = h.map.id_of(a.id()).unwrap();
    a.truncate(2);
    h.sync();
    let new = h.map.id_of(a.id()).unwrap();
    assert_ne!(old, new);
    h.compute(&mut a, &[1, 2, 6, 6, 6]);
    h.assert_sees(&a, &[1, 2, 6, 6, 6]);
    // The cached [3, 4] and [5, 6] blocks still serve others from the zombie.
    let mut b = h.pool.new_sequence();
    h.compute(&mut b, &[1, 2, 3, 4, 5, 6, 0]);
    h.assert_sees(&b, &[1, 2, 3, 4, 5, 6, 0]);
    assert_eq!(h.pool.prefix_cache_stats().hit_tokens, 6);
}

#[test]
fn a_clear_keeps_the_cache_and_the_request_recomputes_from_it() {
    let mut h = Harness::new(16, 8);
    let tokens = [1, 2, 3, 4, 5];
    let mut a = h.pool.new_sequence();
    h.compute(&mut a, &tokens);
    a.clear();
    h.sync();
    assert_eq!(h.map.id_of(a.id()), None);
    h.compute(&mut a, &tokens);
    h.assert_sees(&a, &tokens);
    assert_eq!(h.pool.prefix_cache_stats().hit_tokens, 4);
}

#[test]
fn when_ids_run_out_the_oldest_zombie_gives_way() {
    let mut h = Harness::new(32, 3);
    for first in [10, 20] {
        let mut s = h.pool.new_sequence();
        h.compute(&mut s, &[first, first, 0]);
    }
    h.sync();
    assert_eq!(h.map.zombies(), 2);
    let mut a = h.pool.new_sequence();
    h.compute(&mut a, &[30, 30, 0]);
    assert_eq!(h.map.available_ids(), 2, "the last free id went to a");
    // b reuses the younger zombie's block, so the older one gives its id.
    let mut b = h.pool.new_sequence();
    h.compute(&mut b, &[20, 20, 1]);
    h.assert_sees(&b, &[20, 20, 1]);
    assert_eq!(h.pool.prefix_cache_stats().hit_tokens, 2);
    assert_eq!(h.map.zombies(), 1);
    let mut c = h.pool.new_sequence();
    assert_eq!(c.attach_cached_prefix(&[10, 10, 1]), 0, "the reclaimed zombie's block left the cache");
}
