//! How a backend that keys K/V by sequence id (llama.cpp) follows the engine's block
//! pool, prefix cache included.
//!
//! The pool records what happens to sequences and cached blocks ([`KvEvent`]); the
//! backend replays the events here before its next forward. A cached block's K/V are
//! cells of one backend sequence, its *home* (the sequence that computed it). A request
//! that reuses cached blocks gets a fresh id that shares the home's cells (in llama.cpp's
//! unified cache a cell carries several sequence ids; nothing is copied). When a home's
//! request ends or rewinds past a block that stays cached, the home id lives on as a
//! *zombie* that keeps only its cached blocks' cells, until they leave the cache or the
//! id is needed for a new request (oldest zombie first).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::error::{ModelError, Result};
use super::kv::{BlockPool, KvEvent};

/// The cell operations a sequence-keyed backend offers.
pub trait SequenceCells {
    /// Forgets `seq`'s K/V at positions `from..to` (`None`: to the end).
    fn forget(&mut self, seq: i32, from: usize, to: Option<usize>);
    /// Gives `dst` `src`'s K/V at positions `from..to`.
    fn share(&mut self, src: i32, dst: i32, from: usize, to: usize);
}

pub struct SequenceMap {
    block_size: usize,
    id_of: HashMap<u64, i32>,
    free: Vec<i32>,
    /// Cached block → its home id and its index in the home's sequence.
    home_of: HashMap<u32, (i32, usize)>,
    /// Per home id: block index → cached block.
    homes: HashMap<i32, BTreeMap<usize, u32>>,
    /// Ids that only keep cached blocks' cells, oldest first.
    zombies: VecDeque<i32>,
}

impl SequenceMap {
    pub fn new(max_sequences: usize, block_size: usize) -> Self {
        SequenceMap {
            block_size,
            id_of: HashMap::new(),
            free: (0..max_sequences as i32).rev().collect(),
            home_of: HashMap::new(),
            homes: HashMap::new(),
            zombies: VecDeque::new(),
        }
    }

    pub fn id_of(&self, sequence: u64) -> Option<i32> {
        self.id_of.get(&sequence).copied()
    }

    /// Ids a new sequence could take now, zombies included.
    pub fn available_ids(&self) -> usize {
        self.free.len() + self.zombies.len()
    }

    pub fn zombies(&self) -> usize {
        self.zombies.len()
    }

    /// The id of `sequence`, taking a fresh one (from a zombie if need be) if it has none.
    pub fn id_for(&mut self, sequence: u64, cells: &mut impl SequenceCells, pool: &BlockPool) -> Option<i32> {
        if let Some(id) = self.id_of(sequence) {
            return Some(id);
        }
        let id = self.fresh_id(cells, pool, &[])?;
        self.id_of.insert(sequence, id);
        Some(id)
    }

    /// Replays the pool's events in order.
    pub fn apply(&mut self, events: Vec<KvEvent>, cells: &mut impl SequenceCells, pool: &BlockPool) -> Result<()> {
        for (i, event) in events.iter().enumerate() {
            match event {
                KvEvent::Trim { sequence, from, dropped } => {
                    self.trim(*sequence, *from, *dropped, cells, pool, &events[i + 1..]);
                }
                KvEvent::Seal { sequence, block, index } => match self.id_of(*sequence) {
                    Some(id) => self.make_home(*block, id, *index),
                    // Its K/V were never computed here: nothing to share.
                    None => pool.uncache(&[*block]),
                },
                KvEvent::Attach { sequence, blocks } => {
                    self.attach(*sequence, blocks, cells, pool, &events[i..])?;
                }
                KvEvent::Uncache { block } => self.uncache(*block, cells),
            }
        }
        Ok(())
    }

    fn make_home(&mut self, block: u32, id: i32, index: usize) {
        self.home_of.insert(block, (id, index));
        self.homes.entry(id).or_default().insert(index, block);
    }

    fn attach(
        &mut self,
        sequence: u64,
        blocks: &[u32],
        cells: &mut impl SequenceCells,
        pool: &BlockPool,
        pending: &[KvEvent],
    ) -> Result<()> {
        let id = match self.id_of(sequence) {
            Some(id) => id,
            None => self.fresh_id(cells, pool, pending).ok_or_else(|| {
                ModelError::BadBatch("no sequence id is free for a request that reuses cached K/V".into())
            })?,
        };
        self.id_of.insert(sequence, id);
        let bs = self.block_size;
        // One share per run of blocks with the same home: each share scans the whole cache.
        let mut run: Option<(i32, usize)> = None;
        for (index, block) in blocks.iter().enumerate() {
            let &(home, _) = self
                .home_of
                .get(block)
                .ok_or_else(|| ModelError::BadBatch(format!("cached block {block} has no K/V on this backend")))?;
            match run {
                Some((h, _)) if h == home => {}
                Some((h, start)) => {
                    cells.share(h, id, start * bs, index * bs);
                    run = Some((home, index));
                }
                None => run = Some((home, index)),
            }
        }
        if let Some((home, start)) = run {
            cells.share(home, id, start * bs, blocks.len() * bs);
        }
        Ok(())
    }

    fn trim(
        &mut self,
        sequence: u64,
        from: usize,
        dropped: bool,
        cells: &mut impl SequenceCells,
        pool: &BlockPool,
        pending: &[KvEvent],
    ) {
        let Some(id) = self.id_of(sequence) else { return };
        let bs = self.block_size;
        let keeps_cached = self.homes.get(&id).is_some_and(|h| h.keys().any(|&index| (index + 1) * bs > from));
        if !keeps_cached {
            cells.forget(id, from, None);
            if dropped || from == 0 {
                self.id_of.remove(&sequence);
                self.free.push(id);
            }
            return;
        }
        self.id_of.remove(&sequence);
        if !dropped && from > 0 {
            // The request goes on under a new id sharing its surviving prefix.
            match self.fresh_id(cells, pool, pending) {
                Some(next) => {
                    cells.share(id, next, 0, from);
                    self.id_of.insert(sequence, next);
                }
                None => {
                    self.id_of.insert(sequence, id);
                    self.give_up_homes_from(id, from, pool);
                    cells.forget(id, from, None);
                    return;
                }
            }
        }
        self.become_zombie(id, cells);
    }

    /// Keeps only the cells of the blocks `id` is home to.
    fn become_zombie(&mut self, id: i32, cells: &mut impl SequenceCells) {
        let bs = self.block_size;
        let mut kept_to = 0;
        for &index in self.homes.get(&id).map(|h| h.keys()).into_iter().flatten() {
            if index * bs > kept_to {
                cells.forget(id, kept_to, Some(index * bs));
            }
            kept_to = (index + 1) * bs;
        }
        cells.forget(id, kept_to, None);
        self.zombies.push_back(id);
    }

    fn give_up_homes_from(&mut self, id: i32, from: usize, pool: &BlockPool) {
        let bs = self.block_size;
        let Some(homes) = self.homes.get_mut(&id) else { return };
        let first = from / bs;
        let gone: Vec<u32> = homes.split_off(&first).into_values().collect();
        for block in &gone {
            self.home_of.remove(block);
        }
        pool.uncache(&gone);
    }

    fn uncache(&mut self, block: u32, cells: &mut impl SequenceCells) {
        let Some((home, index)) = self.home_of.remove(&block) else { return };
        let homes = self.homes.entry(home).or_default();
        homes.remove(&index);
        let empty = homes.is_empty();
        if empty {
            self.homes.remove(&home);
        }
        // A live home still reads those cells; a zombie kept them only for the cache.
        if let Some(pos) = self.zombies.iter().position(|&z| z == home) {
            let bs = self.block_size;
            cells.forget(home, index * bs, Some((index + 1) * bs));
            if empty {
                self.zombies.remove(pos);
                self.free.push(home);
            }
        }
    }

    /// A free id, or the oldest zombie's, its blocks leaving the cache; never a zombie
    /// whose blocks an attach among the `pending` events still has to read.
    fn fresh_id(&mut self, cells: &mut impl SequenceCells, pool: &BlockPool, pending: &[KvEvent]) -> Option<i32> {
        if let Some(id) = self.free.pop() {
            return Some(id);
        }
        let protect = self.homes_attached_by(pending);
        let pos = self.zombies.iter().position(|z| !protect.contains(z))?;
        let zombie = self.zombies.remove(pos).expect("position is in range");
        let blocks: Vec<u32> = self.homes.remove(&zombie).map(|h| h.into_values().collect()).unwrap_or_default();
        for block in &blocks {
            self.home_of.remove(block);
        }
        pool.uncache(&blocks);
        cells.forget(zombie, 0, None);
        Some(zombie)
    }

    /// Homes of the blocks that attaches among `events` will read.
    fn homes_attached_by(&self, events: &[KvEvent]) -> HashSet<i32> {
        events
            .iter()
            .filter_map(|e| match e {
                KvEvent::Attach { blocks, .. } => Some(blocks),
                _ => None,
            })
            .flatten()
            .filter_map(|b| self.home_of.get(b).map(|h| h.0))
            .collect()
    }
}

#[cfg(test)]
#[path = "sequence_map_tests.rs"]
mod tests;
