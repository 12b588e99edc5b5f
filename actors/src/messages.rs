//! The messages actors and compute threads receive, in a module that imports no actor:
//! whoever may send one (a request actor, the engine, a peer's compute thread, a remote
//! model's link) depends on this file and on the handles in `handles`, not on the
//! receiver's code.

use flume::Sender;
use tokenrouter_core::model::{BlockPool, KvCapacity, ModelConfig};
use tokenrouter_core::sched::planner::LatencyTable;
use tokenrouter_core::sched::{Arrival, BatchingRule, RequestEvent, RequestId, SubserverConfig, SubserverStats};

use crate::error::EngineError;

/// Bound of every compute inbox. In-flight messages are bounded by active requests;
/// this only guards against a runaway producer.
pub(crate) const INBOX_CAPACITY: usize = 65_536;

/// What a compute thread (or a remote model's link) is told, in order, through its one
/// bounded inbox.
pub(crate) enum ComputeMsg {
    /// The engine-wide settings, once every model has loaded.
    Start(SubserverConfig, BatchingRule),
    Arrive(Arrival),
    Release(RequestId),
    SetActive(usize),
    SetRule(BatchingRule),
    Stats(Sender<SubserverSnapshot>),
    /// Drop the cached prefix blocks no request holds; the answer is how many.
    FlushPrefixCache(Sender<usize>),
    /// Test hook: panic at a chosen point, as a bug would.
    InjectFault(Fault),
    Shutdown,
}

/// Where an injected panic strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The next step, before its forward.
    Step,
    /// The next step, after its first row's decision was applied.
    MidApply,
    /// The handling of the next arrival, after the subserver took it in.
    Message,
    /// The recovery after the next panic (arm a panic with another fault too).
    Recover,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SubserverSnapshot {
    pub model: String,
    pub ready: usize,
    pub pending: usize,
    pub threshold: usize,
    pub kv: KvCapacity,
    pub stats: SubserverStats,
    pub restarts: u64,
    /// Requests rebuilt here from their committed tokens after a restart.
    #[serde(default)]
    pub resumed: u64,
    /// Out of service after repeated panics (until it has reloaded from its weights).
    #[serde(default)]
    pub failed: bool,
    /// Times it reloaded from its weights after going out of service.
    #[serde(default)]
    pub reloads: u64,
}

/// One model's answer to a prefix-cache flush.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PrefixFlush {
    pub model: String,
    /// Cached blocks dropped; `None` (null in JSON) where the model did not answer (a remote model,
    /// which keeps its cache, or one that did not answer in time).
    pub dropped_blocks: Option<usize>,
}

/// What a loaded model reports before serving.
pub(crate) struct Loaded {
    pub config: ModelConfig,
    pub capacity: KvCapacity,
    /// The model's block pool, where it is in this process (for admission to look
    /// up cached prefixes).
    pub pool: Option<BlockPool>,
    /// Its cost by tokens fed, saved or measured at start-up, for the planner.
    pub step_cost: Option<LatencyTable>,
}

/// What a request's actor is told: its events from the compute threads, and endings.
pub enum RequestMsg {
    Event(RequestEvent),
    /// The client went away.
    Cancel,
    /// The engine ends the request (shutting down, deadline).
    Abort(EngineError),
    /// Test hook: fail as a bug in this actor would.
    InjectPanic,
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for RequestMsg {}

/// What the re-planning actor is told.
pub enum ReplanMsg {
    /// Plan the thresholds per N before anything was served, at this delegation rate.
    PlanAtStart(f64),
    Tick,
    /// The thresholds were set by hand.
    SetRule(BatchingRule),
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for ReplanMsg {}
