//! Responses kept for `previous_response_id` and `GET /v1/responses/{id}`: bounded in
//! entries, in tokens (a kept conversation costs what its transcript holds) and in time
//! to live, least recently used out first. An entry belongs to the API key that made
//! it: another key finds nothing, exactly as if the id did not exist.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lru::LruCache;
use serde_json::Value;

/// Who made a response: a digest of the API key it came with (all zeros where the
/// server takes no keys).
pub type Owner = [u8; 32];

#[derive(Debug, Clone, PartialEq)]
pub struct StoreLimits {
    pub max_entries: usize,
    /// Prompt and output tokens of all kept responses together.
    pub max_tokens: usize,
    pub ttl: Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits { max_entries: 10_000, max_tokens: 8_000_000, ttl: Duration::from_secs(3600) }
    }
}

/// One kept response.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub owner: Owner,
    /// The first response of the conversation: its turns share a tokenization session.
    pub chain: String,
    /// The conversation as chat messages, the response's own output last (the request's
    /// `instructions` are not part of it: each request gives its own).
    pub messages: Vec<Value>,
    /// The response object, as `GET` returns it.
    pub response: Value,
    /// Prompt and output tokens.
    pub tokens: usize,
}

struct Entry {
    stored: StoredResponse,
    at: Instant,
}

pub struct ResponseStore {
    limits: StoreLimits,
    inner: Mutex<Inner>,
}

struct Inner {
    entries: LruCache<String, Entry>,
    tokens: usize,
}

impl ResponseStore {
    pub fn new(limits: StoreLimits) -> Self {
        ResponseStore { limits, inner: Mutex::new(Inner { entries: LruCache::unbounded(), tokens: 0 }) }
    }

    pub fn limits(&self) -> &StoreLimits {
        &self.limits
    }

    /// Keeps `stored` under `id`, evicting the least recently used entries past the
    /// bounds. A response larger than the whole token budget is not kept.
    pub fn insert(&self, id: String, stored: StoredResponse) -> bool {
        self.insert_at(id, stored, Instant::now())
    }

    fn insert_at(&self, id: String, stored: StoredResponse, now: Instant) -> bool {
        if stored.tokens > self.limits.max_tokens || self.limits.max_entries == 0 {
            return false;
        }
        let mut inner = self.lock();
        let tokens = stored.tokens;
        if let Some(old) = inner.entries.put(id, Entry { stored, at: now }) {
            inner.tokens -= old.stored.tokens;
        }
        inner.tokens += tokens;
        while inner.entries.len() > self.limits.max_entries || inner.tokens > self.limits.max_tokens {
            match inner.entries.pop_lru() {
                Some((_, evicted)) => inner.tokens -= evicted.stored.tokens,
                None => break,
            }
        }
        true
    }

    /// The response `id` if `owner` made it and it is still kept (a use counts as recent).
    pub fn get(&self, id: &str, owner: &Owner) -> Option<StoredResponse> {
        self.get_at(id, owner, Instant::now())
    }

    fn get_at(&self, id: &str, owner: &Owner, now: Instant) -> Option<StoredResponse> {
        let mut inner = self.lock();
        let entry = inner.entries.get(id)?;
        let expired = now.saturating_duration_since(entry.at) > self.limits.ttl;
        let found = (!expired && &entry.stored.owner == owner).then(|| entry.stored.clone());
        if expired {
            inner.remove(id);
        }
        found
    }

    /// Forgets `id` if `owner` made it; whether it was there.
    pub fn remove(&self, id: &str, owner: &Owner) -> bool {
        let mut inner = self.lock();
        if inner.entries.peek(id).is_none_or(|e| &e.stored.owner != owner) {
            return false;
        }
        inner.remove(id);
        true
    }

    /// A panic elsewhere while the lock was held left the maps consistent (every
    /// change is one call), so the store goes on.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Entries and tokens kept now.
    pub fn size(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.tokens)
    }
}

impl Inner {
    /// An expired entry is dropped when it is next asked for; until then it is among the
    /// least recently used, so the bounds evict it first (no scan of every entry per request).
    fn remove(&mut self, id: &str) {
        if let Some(entry) = self.entries.pop(id) {
            self.tokens -= entry.stored.tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(owner: u8, tokens: usize) -> StoredResponse {
        StoredResponse {
            owner: [owner; 32],
            chain: "resp_root".into(),
            messages: vec![json!({"role": "user", "content": "hi"})],
            response: json!({"id": "x"}),
            tokens,
        }
    }

    fn store(max_entries: usize, max_tokens: usize, ttl_s: u64) -> ResponseStore {
        ResponseStore::new(StoreLimits { max_entries, max_tokens, ttl: Duration::from_secs(ttl_s) })
    }

    #[test]
    fn entries_past_the_count_or_token_bound_leave_least_recently_used_first() {
        let s = store(3, 100, 60);
        for id in ["a", "b", "c"] {
            assert!(s.insert(id.into(), stored(1, 10)));
        }
        assert!(s.get("a", &[1; 32]).is_some(), "a is now the most recently used");
        s.insert("d".into(), stored(1, 10));
        assert!(s.get("b", &[1; 32]).is_none(), "b was least recently used");
        assert_eq!(s.size(), (3, 30));
        // 75 tokens more make 105 of 100: c, the least recently used, goes.
        s.insert("e".into(), stored(1, 75));
        assert_eq!(s.size(), (3, 95));
        assert!(s.get("c", &[1; 32]).is_none());
        assert!(s.get("d", &[1; 32]).is_some() && s.get("a", &[1; 32]).is_some());
        // 20 more: e (now least recent) goes, within both bounds again.
        s.insert("f".into(), stored(1, 20));
        assert_eq!(s.size(), (3, 40));
        assert!(s.get("e", &[1; 32]).is_none());
        assert!(!s.insert("huge".into(), stored(1, 101)), "over the whole budget: not kept");
        assert_eq!(s.size(), (3, 40));
    }

    #[test]
    fn another_key_finds_nothing_and_cannot_delete() {
        let s = store(10, 100, 60);
        s.insert("a".into(), stored(1, 5));
        assert_eq!(s.get("a", &[2; 32]), None);
        assert!(!s.remove("a", &[2; 32]));
        assert_eq!(s.get("a", &[1; 32]).map(|r| r.tokens), Some(5));
        assert!(s.remove("a", &[1; 32]));
        assert_eq!((s.get("a", &[1; 32]), s.size()), (None, (0, 0)));
    }

    #[test]
    fn entries_expire_after_their_time_to_live() {
        let s = store(10, 100, 60);
        let start = Instant::now();
        s.insert_at("old".into(), stored(1, 5), start);
        s.insert_at("new".into(), stored(1, 7), start + Duration::from_secs(50));
        let later = start + Duration::from_secs(61);
        assert_eq!(s.get_at("old", &[1; 32], later), None);
        assert_eq!(s.get_at("old", &[1; 32], start), None, "an expired entry is gone once found expired");
        assert!(s.get_at("new", &[1; 32], later).is_some());
        assert_eq!(s.size(), (1, 7));
    }

    #[test]
    fn replacing_an_id_counts_its_tokens_once() {
        let s = store(10, 100, 60);
        s.insert("a".into(), stored(1, 40));
        s.insert("a".into(), stored(1, 30));
        assert_eq!(s.size(), (1, 30));
    }
}
