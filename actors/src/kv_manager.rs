//! Joint KV admission for colocated models. A request reserves its prompt and a
//! bounded share of its output (`output_headroom`, not `max_tokens`) on every model it
//! may visit; it grows past that on demand, and under pressure the subservers evict
//! pending KV and preempt waiting requests for recompute, and end an output that
//! cannot grow with `finish_reason: length`. So a request without `max_tokens` is
//! served, and only a prompt that cannot fit is refused. When the reservation does not
//! fit now, the request waits in a bounded queue for a bounded time.
//!
//! [`KvLedger`] is the plain state (unit-tested below); [`KvAdmission`] shares it
//! between the engine's tasks and wakes the waiters it admits.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tokenrouter_core::sched::RequestId;
use tokio::sync::oneshot;

use crate::error::EngineError;

#[derive(Debug, Clone, serde::Serialize)]
pub struct KvUsage {
    /// What each model holds at most (alone on its budget, when it shares one).
    pub capacity_tokens: Vec<usize>,
    pub reserved_tokens: usize,
    pub admitted: usize,
    pub waiting: usize,
    /// The storage pages colocated models share, and how many admitted requests reserve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_pages: Option<SharedPagesUsage>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SharedPagesUsage {
    pub total: usize,
    pub reserved: usize,
}

/// Models that draw K/V pages from one budget: a request reserves, on that budget,
/// the pages each of them needs for its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPages {
    pub total: usize,
    /// (model index, tokens per block, pages per block).
    pub members: Vec<(usize, usize, usize)>,
}

impl SharedPages {
    /// Pages `tokens` take on every member (or on `only`, when it is one).
    fn pages_for(&self, tokens: usize, only: Option<usize>) -> usize {
        let members = self.members.iter().filter(|m| only.is_none_or(|o| o == m.0));
        members.map(|&(_, block, pages)| tokens.div_ceil(block) * pages).sum()
    }

    /// The most tokens a request can hold on every member at once.
    fn joint_tokens(&self) -> usize {
        let (mut low, mut high) = (0, self.total.saturating_mul(self.members.iter().map(|m| m.1).max().unwrap_or(1)));
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            if self.pages_for(mid, None) <= self.total {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        low
    }
}

/// How requests are admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// Output tokens reserved at admission beyond the prompt (at most `max_tokens`).
    pub output_headroom: usize,
    /// Requests that may wait for KV; more are refused (429 over HTTP).
    pub max_waiting: usize,
    /// Longest wait for KV before the request is refused (503 with Retry-After).
    pub kv_wait_timeout: Duration,
    /// Longest a request may run from submission, waiting included (10 minutes by
    /// default, so that no request can go without an end); `None`: no limit besides
    /// the one a request brings.
    pub request_timeout: Option<Duration>,
    /// Colocated candle models share one K/V budget (the sum of theirs), split by
    /// demand; off: each keeps its own `kv_budget_bytes`.
    pub share_kv: bool,
    /// Longest a request waits for its grammar to compile, queueing included (400).
    pub grammar_compile_timeout: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            output_headroom: 256,
            max_waiting: 1024,
            kv_wait_timeout: Duration::from_secs(60),
            request_timeout: Some(Duration::from_secs(600)),
            share_kv: true,
            grammar_compile_timeout: Duration::from_secs(10),
        }
    }
}

/// What a request needs of the KV: its prompt, of which `cached` tokens every model
/// holds in its prefix cache now (shared, so not charged again), and its output bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvNeed {
    pub prompt: usize,
    pub cached: usize,
    pub max_tokens: usize,
    /// The one model the request can visit (its policy never moves it); `None`: any.
    pub only: Option<usize>,
}

impl KvNeed {
    pub fn new(prompt: usize, max_tokens: usize) -> Self {
        KvNeed { prompt, cached: 0, max_tokens, only: None }
    }

    pub fn with_cached(self, cached: usize) -> Self {
        KvNeed { cached: cached.min(self.prompt), ..self }
    }

    /// The request stays on `model`: nothing is reserved on the others.
    pub fn only_on(self, model: Option<usize>) -> Self {
        KvNeed { only: model, ..self }
    }

    fn covers(&self, model: usize) -> bool {
        self.only.is_none_or(|m| m == model)
    }
}

/// Whether a request holds its reservation now or waits for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    Queued,
}

pub struct KvLedger {
    names: Vec<String>,
    capacity: Vec<usize>,
    headroom: usize,
    max_waiting: usize,
    /// Tokens reserved, once per request (as `usage` reports them).
    reserved: usize,
    /// Tokens reserved on each model.
    reserved_on: Vec<usize>,
    reservations: HashMap<RequestId, Reservation>,
    waiting: VecDeque<(RequestId, Reservation)>,
    shared: Option<SharedPages>,
    reserved_pages: usize,
}

/// What one request holds: tokens on every model, and pages of the shared budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reservation {
    tokens: usize,
    pages: usize,
    only: Option<usize>,
}

impl Reservation {
    fn covers(&self, model: usize) -> bool {
        self.only.is_none_or(|m| m == model)
    }
}

impl KvLedger {
    pub fn new(names: Vec<String>, capacity_tokens: Vec<usize>, config: &AdmissionConfig) -> Self {
        KvLedger {
            reserved_on: vec![0; names.len()],
            names,
            capacity: capacity_tokens,
            headroom: config.output_headroom,
            max_waiting: config.max_waiting,
            reserved: 0,
            reservations: HashMap::new(),
            waiting: VecDeque::new(),
            shared: None,
            reserved_pages: 0,
        }
    }

    /// Colocated models draw from one budget of pages: reservations on them are
    /// counted there, by what each member needs, rather than per model.
    pub fn with_shared_pages(mut self, shared: SharedPages) -> Self {
        self.shared = Some(shared);
        self
    }

    fn is_shared(&self, model: usize) -> bool {
        self.shared.as_ref().is_some_and(|s| s.members.iter().any(|m| m.0 == model))
    }

    /// The most tokens a request can reserve: what the smallest unshared model it may
    /// visit holds, and what the shared budget holds on all its members at once (a
    /// request that stays on one model: what that model holds).
    fn most_tokens(&self, need: &KvNeed) -> usize {
        if let Some(m) = need.only {
            return self.capacity.get(m).copied().unwrap_or(0);
        }
        let unshared = (0..self.capacity.len()).filter(|&m| !self.is_shared(m)).map(|m| self.capacity[m]);
        let joint = self.shared.as_ref().map(SharedPages::joint_tokens);
        unshared.chain(joint).min().unwrap_or(0)
    }

    /// The tokens a request reserves: the part of its prompt not already cached, and
    /// its output up to the headroom, never more than the smallest model holds (the
    /// output grows on demand; cached blocks that leave before it runs are recomputed
    /// under the subservers' preemption, as any growth is).
    pub fn reservation(&self, need: KvNeed) -> usize {
        let fresh = need.prompt - need.cached.min(need.prompt);
        (fresh + need.max_tokens.min(self.headroom)).min(self.most_tokens(&need)).max(fresh)
    }

    /// [`reservation`](Self::reservation) with the shared pages it takes (at most all
    /// of them: a prompt that fits each model alone is admitted when the budget is
    /// empty, and the subservers evict pending KV to run it).
    fn reserve_for(&self, need: KvNeed) -> Reservation {
        let tokens = self.reservation(need);
        let pages = self.shared.as_ref().map_or(0, |s| s.pages_for(tokens, need.only).min(s.total));
        Reservation { tokens, pages, only: need.only }
    }

    /// Admits a request, queues it, or refuses it: a prompt (and its first output
    /// token) that no amount of waiting makes fit, or a full queue.
    pub fn request(&mut self, id: RequestId, need: KvNeed) -> Result<Admission, EngineError> {
        if let Some((i, &capacity)) =
            self.capacity.iter().enumerate().find(|&(m, &c)| need.covers(m) && need.prompt + 1 > c)
        {
            return Err(EngineError::TooLarge { needed: need.prompt + 1, capacity, model: self.names[i].clone() });
        }
        let wanted = self.reserve_for(need);
        if self.waiting.is_empty() && self.fits(wanted) {
            self.hold(id, wanted);
            return Ok(Admission::Admitted);
        }
        if self.waiting.len() >= self.max_waiting {
            return Err(EngineError::QueueFull { limit: self.max_waiting });
        }
        self.waiting.push_back((id, wanted));
        Ok(Admission::Queued)
    }

    /// The request ended or gave up waiting (either is fine, and so is a second
    /// release); returns the waiting requests this admitted, oldest first.
    pub fn release(&mut self, id: RequestId) -> Vec<RequestId> {
        if let Some(held) = self.reservations.remove(&id) {
            self.reserved -= held.tokens;
            self.reserved_pages -= held.pages;
            for m in (0..self.reserved_on.len()).filter(|&m| held.only.is_none_or(|o| o == m)) {
                self.reserved_on[m] -= held.tokens;
            }
        }
        self.waiting.retain(|(w, _)| *w != id);
        self.admit_waiting()
    }

    pub fn is_admitted(&self, id: RequestId) -> bool {
        self.reservations.contains_key(&id)
    }

    pub fn usage(&self) -> KvUsage {
        KvUsage {
            capacity_tokens: self.capacity.clone(),
            reserved_tokens: self.reserved,
            admitted: self.reservations.len(),
            waiting: self.waiting.len(),
            shared_pages: self
                .shared
                .as_ref()
                .map(|s| SharedPagesUsage { total: s.total, reserved: self.reserved_pages }),
        }
    }

    fn fits(&self, wanted: Reservation) -> bool {
        let mut unshared = (0..self.capacity.len()).filter(|&m| !self.is_shared(m) && wanted.covers(m));
        let tokens_fit = unshared.all(|m| self.reserved_on[m] + wanted.tokens <= self.capacity[m]);
        tokens_fit && self.shared.as_ref().is_none_or(|s| self.reserved_pages + wanted.pages <= s.total)
    }

    fn hold(&mut self, id: RequestId, wanted: Reservation) {
        self.reserved += wanted.tokens;
        self.reserved_pages += wanted.pages;
        for m in (0..self.reserved_on.len()).filter(|&m| wanted.covers(m)) {
            self.reserved_on[m] += wanted.tokens;
        }
        self.reservations.insert(id, wanted);
    }

    /// Admits from the front of the queue while the oldest fits (first come, first
    /// served: a small request does not overtake a large one forever).
    fn admit_waiting(&mut self) -> Vec<RequestId> {
        let mut admitted = Vec::new();
        while let Some(&(id, wanted)) = self.waiting.front() {
            if !self.fits(wanted) {
                break;
            }
            self.waiting.pop_front();
            self.hold(id, wanted);
            admitted.push(id);
        }
        admitted
    }
}

/// The ledger shared by the engine, with a wake-up for each waiting request.
pub struct KvAdmission {
    inner: parking_lot::Mutex<(KvLedger, HashMap<RequestId, oneshot::Sender<()>>)>,
    wait_limit: Duration,
}

impl KvAdmission {
    pub fn new(ledger: KvLedger, wait_limit: Duration) -> Self {
        KvAdmission { inner: parking_lot::Mutex::new((ledger, HashMap::new())), wait_limit }
    }

    /// Refusals come at once; the returned ticket resolves when the request holds its
    /// reservation or its wait ran out.
    pub fn request(&self, id: RequestId, need: KvNeed) -> Result<Ticket, EngineError> {
        let mut inner = self.inner.lock();
        match inner.0.request(id, need)? {
            Admission::Admitted => Ok(Ticket::Admitted),
            Admission::Queued => {
                let (tx, rx) = oneshot::channel();
                inner.1.insert(id, tx);
                Ok(Ticket::Waiting { rx, since: Instant::now(), limit: self.wait_limit })
            }
        }
    }

    pub fn release(&self, id: RequestId) {
        let mut inner = self.inner.lock();
        let (ledger, waiters) = &mut *inner;
        waiters.remove(&id);
        let mut admitted = ledger.release(id);
        while let Some(next) = admitted.pop() {
            // A waiter that is gone gives its reservation straight back.
            let woken = waiters.remove(&next).is_some_and(|tx| tx.send(()).is_ok());
            if !woken {
                admitted.extend(ledger.release(next));
            }
        }
    }

    pub fn usage(&self) -> KvUsage {
        self.inner.lock().0.usage()
    }
}

pub enum Ticket {
    Admitted,
    Waiting { rx: oneshot::Receiver<()>, since: Instant, limit: Duration },
}

impl Ticket {
    /// Waits for the reservation; on time-out the caller releases the request.
    pub async fn wait(self) -> Result<(), EngineError> {
        match self {
            Ticket::Admitted => Ok(()),
            Ticket::Waiting { rx, since, limit } => match tokio::time::timeout(limit, rx).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(EngineError::Internal("the KV admission queue dropped a request".into())),
                Err(_) => Err(EngineError::Overloaded {
                    waited: since.elapsed(),
                    retry_after: limit.div_f64(4.0).max(Duration::from_secs(1)),
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(capacity: &[usize], headroom: usize, max_waiting: usize) -> KvLedger {
        let config = AdmissionConfig { output_headroom: headroom, max_waiting, ..AdmissionConfig::default() };
        let names = (0..capacity.len()).map(|i| format!("m{i}")).collect();
        KvLedger::new(names, capacity.to_vec(), &config)
    }

    #[test]
    fn waiting_requests_are_admitted_in_arrival_order() {
        let mut l = ledger(&[100, 200], 10, 8);
        assert_eq!(l.request(1, KvNeed::new(50, 10)).unwrap(), Admission::Admitted); // 60
        assert_eq!(l.request(2, KvNeed::new(50, 10)).unwrap(), Admission::Queued); // 60 more does not fit 100
        assert_eq!(l.request(3, KvNeed::new(5, 1)).unwrap(), Admission::Queued, "a small one waits behind the queue");
        assert_eq!(l.release(1), vec![2, 3]);
        assert_eq!(l.usage().reserved_tokens, 66);
        assert!(l.is_admitted(2) && l.is_admitted(3));
    }

    #[test]
    fn the_oldest_waiter_is_not_overtaken() {
        let mut l = ledger(&[100], 0, 8);
        l.request(1, KvNeed::new(60, 1)).unwrap();
        assert_eq!(l.request(2, KvNeed::new(50, 1)).unwrap(), Admission::Queued);
        assert_eq!(l.request(3, KvNeed::new(10, 1)).unwrap(), Admission::Queued);
        l.release(3);
        assert_eq!(l.usage().waiting, 1, "a waiter that gives up leaves the queue");
        assert_eq!(l.release(1), vec![2]);
    }

    #[test]
    fn only_a_prompt_that_cannot_fit_is_too_large() {
        let mut l = ledger(&[100, 40], 256, 8);
        match l.request(1, KvNeed::new(40, 10_000)) {
            Err(EngineError::TooLarge { model, needed, capacity }) => {
                assert_eq!((model.as_str(), needed, capacity), ("m1", 41, 40));
            }
            other => panic!("{other:?}"),
        }
        // No max_tokens (the whole context) is fine: the reservation is capped.
        assert_eq!(l.request(2, KvNeed::new(30, 32_768)).unwrap(), Admission::Admitted);
        assert_eq!(l.usage().reserved_tokens, 40);
    }

    #[test]
    fn admission_reserves_headroom_not_max_tokens() {
        let mut worst_case = ledger(&[16_384], usize::MAX, 1000);
        let mut by_use = ledger(&[16_384], 256, 1000);
        let admitted = |l: &mut KvLedger| {
            (0..100).filter(|&i| l.request(i, KvNeed::new(20, 4000)).unwrap() == Admission::Admitted).count()
        };
        assert_eq!(admitted(&mut worst_case), 4);
        assert_eq!(admitted(&mut by_use), 59);
    }

    #[test]
    fn a_cached_prompt_is_charged_only_for_what_is_not_shared() {
        // Agent turns resending a 6,000-token transcript that every model holds cached.
        let mut l = ledger(&[16_384, 16_384], 256, 1000);
        let turn = KvNeed::new(6_000, 1024);
        assert_eq!(l.reservation(turn), 6_256);
        assert_eq!(l.reservation(turn.with_cached(5_984)), 272);
        assert_eq!(l.reservation(KvNeed::new(10, 5).with_cached(50)), 5, "never below zero");
        let admitted = (0..100).filter(|&i| l.request(i, turn.with_cached(5_984)).unwrap() == Admission::Admitted);
        assert_eq!(admitted.count(), 60, "16,384 / 272");
        // The prompt must still fit on its own, cached or not.
        let err = l.request(200, KvNeed::new(20_000, 1).with_cached(19_000)).unwrap_err();
        assert!(matches!(err, EngineError::TooLarge { needed: 20_001, .. }));
    }

    /// The demo pair on 512 MiB of 8 KiB pages: the small model's 16-token block takes
    /// one page, the large model's 32.
    fn demo_shared() -> SharedPages {
        SharedPages { total: 65_536, members: vec![(0, 16, 1), (1, 16, 32)] }
    }

    #[test]
    fn a_shared_budget_admits_by_what_each_member_needs() {
        let shared = demo_shared();
        assert_eq!(shared.pages_for(276, None), 18 * 33);
        assert_eq!(shared.pages_for(276, Some(1)), 18 * 32);
        assert_eq!(shared.joint_tokens(), 65_536 / 33 * 16, "whole blocks on both models");
        let config = AdmissionConfig { output_headroom: 256, max_waiting: 1000, ..AdmissionConfig::default() };
        let names = vec!["small".to_string(), "large".to_string()];
        // The same 512 MiB split 256/256 between the models, or shared.
        let mut split = KvLedger::new(names.clone(), vec![524_288, 16_384], &config);
        let mut joint = KvLedger::new(names, vec![1_048_576, 32_768], &config).with_shared_pages(shared);
        let admitted = |l: &mut KvLedger| {
            (0..1000).filter(|&i| l.request(i, KvNeed::new(20, 4000)).unwrap() == Admission::Admitted).count()
        };
        assert_eq!(admitted(&mut split), 59);
        assert_eq!(admitted(&mut joint), 65_536 / 594, "the large model gets the pages the small one does not use");
        assert_eq!(joint.usage().shared_pages, Some(SharedPagesUsage { total: 65_536, reserved: 110 * 594 }));
        // A prompt that fits the large model alone waits for the whole budget, not forever.
        let mut ledger = KvLedger::new(vec!["s".into(), "l".into()], vec![1_048_576, 32_768], &config)
            .with_shared_pages(demo_shared());
        assert_eq!(ledger.request(1, KvNeed::new(32_000, 1)).unwrap(), Admission::Admitted);
        assert_eq!(ledger.usage().shared_pages.unwrap().reserved, 65_536);
        assert_eq!(ledger.request(2, KvNeed::new(10, 1)).unwrap(), Admission::Queued);
        assert_eq!(ledger.release(1), vec![2]);
        ledger.release(2);
        assert_eq!(ledger.usage().shared_pages.unwrap().reserved, 0);
        assert!(matches!(ledger.request(3, KvNeed::new(32_768, 1)), Err(EngineError::TooLarge { .. })));
    }

    #[test]
    fn a_request_that_stays_on_one_model_reserves_there_only() {
        let mut l = ledger(&[1_000, 100], 10, 100);
        // Too large for m1, but it never goes there.
        assert_eq!(l.request(1, KvNeed::new(500, 10).only_on(Some(0))).unwrap(), Admission::Admitted);
        assert!(matches!(l.request(2, KvNeed::new(500, 10).only_on(Some(1))), Err(EngineError::TooLarge { .. })));
        // m1 is untouched: a request that may visit both still fits there.
        assert_eq!(l.request(3, KvNeed::new(80, 10)).unwrap(), Admission::Admitted);
        assert_eq!(l.request(4, KvNeed::new(400, 10).only_on(Some(0))).unwrap(), Admission::Queued);
        assert_eq!(l.release(1), vec![4]);
        for id in [3, 4] {
            l.release(id);
        }
        assert_eq!(l.usage().reserved_tokens, 0);
        // On a shared budget, pinned to the small model: one page a block, not 33.
        let config = AdmissionConfig { output_headroom: 256, max_waiting: 1000, ..AdmissionConfig::default() };
        let names = vec!["small".to_string(), "large".to_string()];
        let mut joint = KvLedger::new(names, vec![1_048_576, 32_768], &config).with_shared_pages(demo_shared());
        let admitted = (0..1000)
            .filter(|&i| joint.request(i, KvNeed::new(20, 4000).only_on(Some(0))).unwrap() == Admission::Admitted);
        assert_eq!(admitted.count(), 1000, "18 pages each: 65,536 hold 3,640");
    }

    #[test]
    fn a_full_queue_refuses_and_double_or_unknown_releases_are_harmless() {
        let mut l = ledger(&[10], 0, 1);
        l.request(1, KvNeed::new(8, 1)).unwrap();
        assert_eq!(l.request(2, KvNeed::new(8, 1)).unwrap(), Admission::Queued);
        assert!(matches!(l.request(3, KvNeed::new(8, 1)), Err(EngineError::QueueFull { limit: 1 })));
        assert!(l.release(99).is_empty(), "a request that never arrived");
        assert_eq!(l.release(1), vec![2]);
        assert!(l.release(1).is_empty(), "released twice");
        assert_eq!(l.usage().reserved_tokens, 8);
        l.release(2);
        assert_eq!((l.usage().reserved_tokens, l.usage().admitted, l.usage().waiting), (0, 0, 0));
    }

    #[tokio::test]
    async fn a_waiter_is_woken_by_a_release_and_a_gone_waiter_gives_its_turn_away() {
        let admission = KvAdmission::new(ledger(&[10], 0, 8), Duration::from_secs(5));
        assert!(matches!(admission.request(1, KvNeed::new(8, 1)).unwrap(), Ticket::Admitted));
        let gone = admission.request(2, KvNeed::new(8, 1)).unwrap();
        let waiting = admission.request(3, KvNeed::new(8, 1)).unwrap();
        drop(gone);
        admission.release(2); // what the request's guard does when its waiter is dropped
        admission.release(1);
        waiting.wait().await.unwrap();
        assert_eq!(admission.usage().admitted, 1);
    }

    #[tokio::test]
    async fn a_wait_that_runs_out_is_overloaded() {
        let admission = KvAdmission::new(ledger(&[10], 0, 8), Duration::from_millis(50));
        admission.request(1, KvNeed::new(8, 1)).unwrap();
        let ticket = admission.request(2, KvNeed::new(8, 1)).unwrap();
        assert!(matches!(ticket.wait().await, Err(EngineError::Overloaded { .. })));
    }
}
