//! Where sessions live between requests: keyed by an explicit id, or (without one) found by the
//! longest common prefix with recently seen texts. Bounded by bytes; the least recently used
//! session goes first. A session is taken out while a request works on it and put back after,
//! so the caller mutates it without holding a borrow of the store.
//!
//! An unbounded [`LruCache`] keeps the sessions and their recency order; the store adds what it
//! cannot: the byte bound (evicting with `pop_lru` while over it) and the fingerprint index
//! that narrows an anonymous lookup to texts sharing the first bytes.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};

use lru::LruCache;

use super::session::{common_prefix_len, Session};

/// Anonymous sessions are indexed by a hash of their first bytes: only texts that share them
/// can share a useful prefix, so a lookup compares against few candidates.
pub const FINGERPRINT_BYTES: usize = 256;

/// An anonymous match whose common prefix ends further than this before the cached text's end
/// is another conversation branching off (same system prompt, a retried turn): it gets a copy,
/// so the original conversation keeps its session.
const TAIL_EDIT_BYTES: usize = 4096;

/// How a stored session is found again.
#[derive(Clone, PartialEq, Eq, Hash)]
enum SessionKey {
    /// By the id the client sent.
    Named(String),
    /// By prefix: `slot` tells apart sessions with the same `fingerprint`, under which the
    /// fingerprint index lists it.
    Anonymous { slot: u64, fingerprint: u64 },
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
    /// Least recently used first; unbounded in count, since the limit is on bytes.
    sessions: LruCache<SessionKey, Session>,
    /// Anonymous sessions' keys by fingerprint, in the order they were stored.
    by_fingerprint: HashMap<u64, Vec<SessionKey>>,
    next_slot: u64,
    bytes: usize,
    max_bytes: usize,
}

impl SessionStore {
    pub fn new(max_bytes: usize) -> Self {
        SessionStore {
            sessions: LruCache::unbounded(),
            by_fingerprint: HashMap::new(),
            next_slot: 0,
            bytes: 0,
            max_bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Bytes held by stored sessions.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes out the session named `name`.
    pub fn take_named(&mut self, name: &str) -> Option<Session> {
        self.remove(&SessionKey::Named(name.to_owned()))
    }

    /// The anonymous session sharing the longest prefix with `text`, if at least `min_prefix`
    /// bytes: taken out when `text` continues it near its end, copied otherwise.
    pub fn take_longest_prefix(&mut self, text: &str, min_prefix: usize) -> Option<PrefixMatch> {
        let (key, common_prefix) = self.longest_prefix_candidate(text)?;
        if common_prefix < min_prefix.max(FINGERPRINT_BYTES) {
            return None;
        }
        let cached = self.sessions.get(&key).expect("indexed sessions are stored");
        if cached.text().len() - common_prefix > TAIL_EDIT_BYTES {
            // `get` has marked the original as used: the branch it was copied for is recent use.
            return Some(PrefixMatch { session: cached.clone(), common_prefix, forked: true });
        }
        let session = self.remove(&key).expect("indexed sessions are stored");
        Some(PrefixMatch { session, common_prefix, forked: false })
    }

    /// Among sessions with `text`'s fingerprint, the one sharing the longest prefix with it
    /// (the latest stored on ties), and that prefix's length. Looking does not count as use.
    fn longest_prefix_candidate(&self, text: &str) -> Option<(SessionKey, usize)> {
        let candidates = self.by_fingerprint.get(&fingerprint(text)?)?;
        candidates
            .iter()
            .map(|key| {
                let cached = self.sessions.peek(key).expect("indexed sessions are stored");
                (key, common_prefix_len(cached.text(), text))
            })
            .max_by_key(|&(_, common)| common)
            .map(|(key, common)| (key.clone(), common))
    }

    /// Stores `session` (named, or anonymous when `name` is `None`), then evicts the least
    /// recently used sessions until the store fits its limit. Not kept: a session larger than the
    /// limit, and anonymous sessions shorter than the fingerprint (they could never be found).
    pub fn put(&mut self, session: Session, name: Option<String>) {
        if let Some(name) = &name {
            self.remove(&SessionKey::Named(name.clone()));
        }
        if session.bytes() > self.max_bytes {
            return;
        }
        let key = match name {
            Some(name) => SessionKey::Named(name),
            None => match fingerprint(session.text()) {
                Some(fingerprint) => self.index_anonymous(fingerprint),
                None => return,
            },
        };
        self.bytes += session.bytes();
        self.sessions.put(key, session);
        self.evict_to_limit();
    }

    /// A fresh key for an anonymous session, listed under its fingerprint.
    fn index_anonymous(&mut self, fingerprint: u64) -> SessionKey {
        let key = SessionKey::Anonymous { slot: self.next_slot, fingerprint };
        self.next_slot += 1;
        self.by_fingerprint.entry(fingerprint).or_default().push(key.clone());
        key
    }

    fn evict_to_limit(&mut self) {
        while self.bytes > self.max_bytes {
            let Some((key, session)) = self.sessions.pop_lru() else { break };
            self.forget(&key, &session);
        }
    }

    fn remove(&mut self, key: &SessionKey) -> Option<Session> {
        let session = self.sessions.pop(key)?;
        self.forget(key, &session);
        Some(session)
    }

    /// Drops what the store kept beside a session that has left `sessions`.
    fn forget(&mut self, key: &SessionKey, session: &Session) {
        // A stored session is never mutated, so it still holds the bytes it was counted with.
        self.bytes -= session.bytes();
        let SessionKey::Anonymous { fingerprint, .. } = key else { return };
        let keys = self.by_fingerprint.get_mut(fingerprint).expect("anonymous sessions are indexed");
        keys.retain(|k| k != key);
        if keys.is_empty() {
            self.by_fingerprint.remove(fingerprint);
        }
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

    #[test]
    fn a_forked_session_counts_as_used() {
        let text = |c: char| c.to_string().repeat(FINGERPRINT_BYTES + TAIL_EDIT_BYTES + 100);
        let one = session(&text('a')).bytes();
        let mut store = SessionStore::new(2 * one);
        store.put(session(&text('a')), None);
        store.put(session(&text('b')), None);
        let branch = format!("{}x", "a".repeat(FINGERPRINT_BYTES + 10));
        assert!(store.take_longest_prefix(&branch, 64).unwrap().forked);
        store.put(session(&text('c')), None);
        assert!(store.take_longest_prefix(&text('b'), 64).is_none(), "b became the least recently used");
        assert!(!store.take_longest_prefix(&text('a'), 64).unwrap().forked);
        assert!(store.take_longest_prefix(&text('c'), 64).is_some());
        assert_eq!((store.len(), store.bytes()), (0, 0));
    }
}
