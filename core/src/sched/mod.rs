//! Scheduling: delayed batching, the per-model subserver state machine, and the
//! sequential reference that batched serving must reproduce.

pub mod batching;
pub mod planner;
pub mod reference;
pub mod request;
mod resident;
pub mod stats;
pub mod subserver;

pub use batching::{BatchingRule, Threshold};
pub use request::{rebuild, Arrival, Checkpoint, DraftLeg, FinishReason, RequestEvent, RequestId, RequestSpec, Travel};
pub use stats::SubserverStats;
pub use subserver::{ArrivalError, FaultPoint, StepOutcome, Subserver, SubserverConfig};
