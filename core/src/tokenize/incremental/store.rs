//! Where sessions live between requests: keyed by an explicit id, or (without one) found by the
//! longest common prefix with recently seen texts. Bounded by bytes; the least recently used
//! session goes first. A session is taken out while a request works on it and put back after,
//! so the caller mutates it without holding a borrow of the store.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, BuildHasherDefault};

use super::session::{common_prefix_len, Session};

/// Anonymous sessions are indexed by a hash of their first bytes: only texts that share them
/// can share a useful prefix, so a lookup compares against few candidates.
pub const FINGERPRINT_BYTES: usize = 256;

/// An anonymous match whose common prefix ends further than this before the cached text's end
/// is another conversation branching off (same system prompt, a retried turn): it gets a copy,
/// so the original conversation keeps its session.
const TAIL_EDIT_BYTES: usize = 4096;

type SlotId = u64;

struct Entry {
    session: Session,
    name: Option<String>,
    fingerprint: Option<u64>,
    last_used: u64,
    bytes: usize,
}

/// What an anonymous lookup found.
pub struct PrefixMatch {
    pub session: Session,
    /// Bytes shared with the new text.
    pub common_prefix: usize,
    /// The session is a copy; the original stays stored.
    pub forked: bool,
}

/// Sessions under a byte limit.
pub struct SessionStore {
    entries: HashMap<SlotId, Entry>,
    named: HashMap<String, SlotId>,
    by_fingerprint: HashMap<u64, Vec<SlotId>>,
    /// last-used tick → slot; the first entry is evicted first.
    lru: BTreeMap<u64, SlotId>,
    next_slot: SlotId,
    tick: u64,
    bytes: usize,
    max_bytes: usize,
}

impl SessionStore {
    pub fn new(max_bytes: usize) -> Self {
        SessionStore {
            entries: HashMap::new(),
            named: HashMap::new(),
            by_fingerprint: HashMap::new(),
            lru: BTreeMap::new(),
            next_slot: 0,
            tick: 0,
            bytes: 0,
            max_bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held by stored sessions.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes out the session named `name`.
    pub fn take_named(&mut self, name: &str) -> Option<Session> {
        let slot = *self.named.get(name)?;
        Some(self.remove(slot).session)
    }

    /// The anonymous session sharing the longest prefix with `text`, if at least `min_prefix`
    /// bytes: taken out when `text` continues it near its end, copied otherwise.
    pub fn take_longest_prefix(&mut self, text: &str, min_prefix: usize) -> Option<PrefixMatch> {
        let fingerprint = fingerprint(text)?;
        let candidates = self.by_fingerprint.get(&fingerprint)?;
        let (slot, common_prefix) = candidates
            .iter()
            .map(|&slot| (slot, common_prefix_len(self.entries[&slot].session.text(), text)))
            .max_by_key(|&(_, common)| common)?;
        if common_prefix < min_prefix.max(FINGERPRINT_BYTES) {
            return None;
        }
        let cached_len = self.entries[&slot].session.text().len();
        if cached_len - common_prefix > TAIL_EDIT_BYTES {
            let entry = self.entries.get_mut(&slot).expect("candidates are stored");
            let session = entry.session.clone();
            self.touch(slot);
            return Some(PrefixMatch { session, common_prefix, forked: true });
        }
        let session = self.remove(slot).session;
        Some(PrefixMatch { session, common_prefix, forked: false })
    }

    /// Stores `session` (named, or anonymous when `name` is `None`), then evicts the least
    /// recently used sessions until the store fits its limit. Not kept: a session larger than the
    /// limit, and anonymous sessions shorter than the fingerprint (they could never be found).
    pub fn put(&mut self, session: Session, name: Option<String>) {
        if let Some(old) = name.as_ref().and_then(|n| self.named.get(n).copied()) {
            self.remove(old);
        }
        if session.bytes() > self.max_bytes {
            return;
        }
        let fingerprint = match &name {
            Some(_) => None,
            None => match fingerprint(session.text()) {
                Some(f) => Some(f),
                None => return,
            },
        };
        let slot = self.next_slot;
        self.next_slot += 1;
        self.tick += 1;
        let bytes = session.bytes();
        if let Some(n) = &name {
            self.named.insert(n.clone(), slot);
        }
        if let Some(f) = fingerprint {
            self.by_fingerprint.entry(f).or_default().push(slot);
        }
        self.lru.insert(self.tick, slot);
        self.bytes += bytes;
        self.entries.insert(slot, Entry { session, name, fingerprint, last_used: self.tick, bytes });
        self.evict_to_limit();
    }

    fn evict_to_limit(&mut self) {
        while self.bytes > self.max_bytes {
            let Some((_, &slot)) = self.lru.iter().next() else { break };
            self.remove(slot);
        }
    }

    fn touch(&mut self, slot: SlotId) {
        self.tick += 1;
        let entry = self.entries.get_mut(&slot).expect("touched slots are stored");
        self.lru.remove(&entry.last_used);
        entry.last_used = self.tick;
        self.lru.insert(self.tick, slot);
    }

    fn remove(&mut self, slot: SlotId) -> Entry {
        let entry = self.entries.remove(&slot).expect("removed slots are stored");
        self.lru.remove(&entry.last_used);
        self.bytes -= entry.bytes;
        if let Some(name) = &entry.name {
            self.named.remove(name);
        }
        if let Some(f) = entry.fingerprint {
            let slots = self.by_fingerprint.get_mut(&f).expect("fingerprinted slots are indexed");
            slots.retain(|&s| s != slot);
            if slots.is_empty() {
                self.by_fingerprint.remove(&f);
            }
        }
        entry
    }
}

/// Hash of the first [`FINGERPRINT_BYTES`] bytes; `None` for shorter texts.
fn fingerprint(text: &str) -> Option<u64> {
    let head = text.as_bytes().get(..FINGERPRINT_BYTES)?;
    Some(BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(text: &str) -> Session {
        let mut s = Session::default();
        s.reset(text);
        s
    }

    #[test]
    fn named_sessions_come_back_and_replace_their_predecessor() {
        let mut store = SessionStore::new(1 << 20);
        store.put(session("one"), Some("a".into()));
        store.put(session("two"), Some("a".into()));
        assert_eq!(store.len(), 1);
        assert_eq!(store.take_named("a").unwrap().text(), "two");
        assert!(store.take_named("a").is_none());
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn anonymous_lookup_picks_the_longest_prefix_and_forks_early_branches() {
        let system = "s".repeat(2 * FINGERPRINT_BYTES);
        let mut store = SessionStore::new(1 << 20);
        store.put(session(&format!("{system} first conversation")), None);
        store.put(session(&format!("{system} second conversation")), None);
        store.put(session("too short to be found"), None);
        assert_eq!(store.len(), 2);
        let hit = store.take_longest_prefix(&format!("{system} second conversation, more"), 64).unwrap();
        assert!(!hit.forked);
        assert_eq!(hit.common_prefix, system.len() + " second conversation".len());
        assert_eq!(store.len(), 1);
        assert!(store.take_longest_prefix(&format!("{system} first"), 64).is_some());
        let branch = format!("{system} first{}", "x".repeat(TAIL_EDIT_BYTES + 10));
        store.put(session(&branch), None);
        let fork = store.take_longest_prefix(&format!("{system} first conversation again"), 64).unwrap();
        assert!(fork.forked, "the common prefix ends far before the cached text's end");
        assert_eq!(store.len(), 1, "the original stays");
        assert!(store.take_longest_prefix(&"t".repeat(1000), 64).is_none());
        assert!(store.take_longest_prefix(&system, 4 * FINGERPRINT_BYTES).is_none(), "below min_prefix");
    }

    #[test]
    fn the_byte_limit_evicts_the_least_recently_used() {
        let text = |c: char| c.to_string().repeat(FINGERPRINT_BYTES + 100);
        let one = session(&text('a')).bytes();
        let mut store = SessionStore::new(2 * one);
        store.put(session(&text('a')), None);
        store.put(session(&text('b')), Some("b".into()));
        store.put(session(&text('c')), None);
        assert_eq!(store.len(), 2);
        assert!(store.take_longest_prefix(&text('a'), 64).is_none(), "the oldest went first");
        assert!(store.take_named("b").is_some());
        assert!(store.bytes() <= 2 * one);
        store.put(session(&"z".repeat(10 * one)), None);
        assert!(store.bytes() <= 2 * one, "a session over the limit is not kept");
    }
}
