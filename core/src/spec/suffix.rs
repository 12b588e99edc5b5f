//! Suffix drafts (SuffixDecoding): a trie of every short run of tokens a text holds,
//! each with how often it occurred, so the text's tail is looked up in one walk and
//! continued the way it most often went on. One per request over its prompt and output,
//! grown as tokens are committed; one per model over recent outputs, bounded in nodes
//! and evicting whole outputs oldest first.

use std::collections::VecDeque;

use foldhash::HashMap;

/// Longest run indexed: a match and the draft that continues it fit in this many tokens.
pub const SUFFIX_DEPTH: usize = 32;
/// A draft goes on only while the chance all its guesses are right stays above this.
const MIN_PATH_CHANCE: f64 = 0.1;
const NONE: u32 = u32::MAX;
const ROOT: u32 = 0;

#[derive(Debug, Clone)]
struct Node {
    /// Occurrences of the run from the root to here.
    count: u32,
    token: u32,
    parent: u32,
    first_child: u32,
    next_sibling: u32,
    prev_sibling: u32,
}

/// A continuation found in a trie: the guessed tokens, the length of the run it
/// continues, and the expected number of guesses kept (the sum of each prefix's chance).
#[derive(Debug, Clone, PartialEq)]
pub struct SuffixDraft {
    pub tokens: Vec<u32>,
    pub match_len: usize,
    pub expected_kept: f64,
}

/// Every run of at most [`SUFFIX_DEPTH`] tokens of the text added, as a trie with counts.
#[derive(Debug, Clone)]
pub struct SuffixTrie {
    nodes: Vec<Node>,
    index: HashMap<(u32, u32), u32>,
    free: Vec<u32>,
    /// Nodes of the runs ending at the last token appended, by length (1 first).
    open: Vec<u32>,
}

impl Default for SuffixTrie {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixTrie {
    pub fn new() -> Self {
        let root =
            Node { count: 0, token: NONE, parent: NONE, first_child: NONE, next_sibling: NONE, prev_sibling: NONE };
        SuffixTrie { nodes: vec![root], index: HashMap::default(), free: Vec::new(), open: Vec::new() }
    }

    /// Nodes in use, the root aside.
    pub fn nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    /// What the trie holds in memory, about: its node slots and its index.
    pub fn bytes(&self) -> usize {
        let index_entry = std::mem::size_of::<((u32, u32), u32)>() + 1;
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.index.capacity() * index_entry
            + self.free.capacity() * 4
            + self.open.capacity() * 4
    }

    /// Appends one token to the text: counts each run that ends with it.
    pub fn push(&mut self, token: u32) {
        let mut open = std::mem::take(&mut self.open);
        open.truncate(SUFFIX_DEPTH - 1);
        let mut next = Vec::with_capacity(open.len() + 1);
        for parent in std::iter::once(ROOT).chain(open.iter().copied()) {
            next.push(self.increment(parent, token));
        }
        self.open = next;
    }

    /// Adds a text of its own (not continuing the one before).
    pub fn insert(&mut self, tokens: &[u32]) {
        self.open.clear();
        tokens.iter().for_each(|&t| self.push(t));
        self.open.clear();
    }

    /// Takes back a text [`insert`](Self::insert) added: every run it counted.
    pub fn remove(&mut self, tokens: &[u32]) {
        for start in 0..tokens.len() {
            let run = &tokens[start..tokens.len().min(start + SUFFIX_DEPTH)];
            let mut path = Vec::with_capacity(run.len());
            let mut node = ROOT;
            for &t in run {
                match self.index.get(&(node, t)) {
                    Some(&child) => {
                        path.push(child);
                        node = child;
                    }
                    None => break,
                }
            }
            // Deepest first: a run never occurs more often than the runs it extends.
            for &n in path.iter().rev() {
                self.nodes[n as usize].count -= 1;
                if self.nodes[n as usize].count == 0 {
                    self.release(n);
                }
            }
        }
        self.open.clear();
    }

    /// The continuation of `context`'s tail that most likely follows, from runs of at
    /// least `min_match` tokens: of every length matched, the one whose greedy path
    /// expects the most kept guesses (a long match is surer, a short one reaches further).
    /// `context_is_text`: the context is the text pushed so far, whose tail runs the trie
    /// already holds (no walk from the root) and whose tail occurrence has no
    /// continuation, so it is not counted against the others. Ties go to the longer match.
    pub fn draft(&self, context: &[u32], min_match: usize, limit: usize, context_is_text: bool) -> Option<SuffixDraft> {
        let longest = context.len().min(SUFFIX_DEPTH - 1);
        let mut best: Option<SuffixDraft> = None;
        for match_len in min_match.max(1)..=longest {
            let node = match context_is_text {
                true => self.open.get(match_len - 1).copied(),
                false => self.find(&context[context.len() - match_len..]),
            };
            // Every run a text holds holds its own tail: where a run is missing, so is any longer one.
            let Some(node) = node else { break };
            let candidate = self.follow(node, match_len, limit, u32::from(context_is_text));
            if !candidate.tokens.is_empty() && best.as_ref().is_none_or(|b| candidate.expected_kept >= b.expected_kept)
            {
                best = Some(candidate);
            }
        }
        best
    }

    fn find(&self, run: &[u32]) -> Option<u32> {
        run.iter().try_fold(ROOT, |node, &t| self.index.get(&(node, t)).copied())
    }

    /// The most counted path down from `node` (a run of `depth` tokens), while its chance
    /// holds; `uncontinued` of the node's occurrences cannot continue (the text's tail).
    fn follow(&self, mut node: u32, depth: usize, limit: usize, mut uncontinued: u32) -> SuffixDraft {
        let (mut tokens, mut chance, mut expected_kept) = (Vec::new(), 1.0, 0.0);
        while tokens.len() < limit.min(SUFFIX_DEPTH - depth) {
            let total = self.nodes[node as usize].count - uncontinued;
            uncontinued = 0;
            let Some(child) = self.children(node).max_by_key(|&c| self.nodes[c as usize].count) else { break };
            let next_chance = chance * f64::from(self.nodes[child as usize].count) / f64::from(total.max(1));
            if next_chance < MIN_PATH_CHANCE {
                break;
            }
            chance = next_chance;
            expected_kept += chance;
            tokens.push(self.nodes[child as usize].token);
            node = child;
        }
        SuffixDraft { tokens, match_len: depth, expected_kept }
    }

    fn children(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let first = self.nodes[node as usize].first_child;
        std::iter::successors((first != NONE).then_some(first), |&c| {
            let next = self.nodes[c as usize].next_sibling;
            (next != NONE).then_some(next)
        })
    }

    fn increment(&mut self, parent: u32, token: u32) -> u32 {
        if let Some(&child) = self.index.get(&(parent, token)) {
            self.nodes[child as usize].count += 1;
            return child;
        }
        let first = self.nodes[parent as usize].first_child;
        let node = Node { count: 1, token, parent, first_child: NONE, next_sibling: first, prev_sibling: NONE };
        let child = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if first != NONE {
            self.nodes[first as usize].prev_sibling = child;
        }
        self.nodes[parent as usize].first_child = child;
        self.index.insert((parent, token), child);
        child
    }

    /// Unlinks a node whose count reached zero (its children already have).
    fn release(&mut self, n: u32) {
        let Node { token, parent, next_sibling, prev_sibling, .. } = self.nodes[n as usize].clone();
        if prev_sibling == NONE {
            self.nodes[parent as usize].first_child = next_sibling;
        } else {
            self.nodes[prev_sibling as usize].next_sibling = next_sibling;
        }
        if next_sibling != NONE {
            self.nodes[next_sibling as usize].prev_sibling = prev_sibling;
        }
        self.index.remove(&(parent, token));
        self.free.push(n);
    }
}

/// One model's record of recent outputs for suffix drafts, within a node budget.
#[derive(Debug)]
pub struct SuffixCache {
    trie: SuffixTrie,
    outputs: VecDeque<Vec<u32>>,
    max_nodes: usize,
}

impl SuffixCache {
    pub fn new(max_nodes: usize) -> Self {
        SuffixCache { trie: SuffixTrie::new(), outputs: VecDeque::new(), max_nodes }
    }

    /// Adds a finished output, evicting the oldest ones while over budget (of an output
    /// too long for the whole budget, its end), so the trie never holds more than twice
    /// the budget's nodes.
    pub fn add(&mut self, output: &[u32]) {
        let output = &output[output.len().saturating_sub(self.max_nodes / SUFFIX_DEPTH)..];
        if output.is_empty() {
            return;
        }
        self.trie.insert(output);
        self.outputs.push_back(output.to_vec());
        while self.trie.nodes() > self.max_nodes {
            let Some(oldest) = self.outputs.pop_front() else { break };
            self.trie.remove(&oldest);
        }
    }

    pub fn draft(&self, context: &[u32], min_match: usize, limit: usize) -> Option<SuffixDraft> {
        self.trie.draft(context, min_match, limit, false)
    }

    pub fn nodes(&self) -> usize {
        self.trie.nodes()
    }

    pub fn outputs(&self) -> usize {
        self.outputs.len()
    }

    /// Memory held: the trie and the outputs kept to evict them by.
    pub fn bytes(&self) -> usize {
        self.trie.bytes() + self.outputs.iter().map(|o| o.capacity() * 4).sum::<usize>()
    }
}
