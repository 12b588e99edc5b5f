//! Exact incremental tokenization for sessions (DESIGN.md §7). Agents resend a long transcript
//! after a small append; re-tokenizing it all would grow TTFT with the history. A session keeps
//! the last text with its ids; a continuation keeps the cached ids before a *safe cut* (a
//! position where tokenization provably splits) and tokenizes only the rest. Contract: the ids
//! always equal full tokenization.
//!
//! - [`cut_rule_for`]: whether a tokenizer can be spliced, from its own pipeline.
//! - [`CutRule`]: the safe-cut rule; [`Splicer`]: splice one session (window widening, fallback).
//! - [`SessionStore`]: sessions by id or by longest common prefix, LRU under a byte limit.
//! - [`SessionTokenizer`]: what the tokenizer actor calls.
//! - [`VerifySampler`], [`VerifyJob`]: the shadow verifier's sampling, check and reproducer.

mod eligibility;
mod safe_cut;
mod session;
mod session_tokenizer;
mod splice;
mod store;
mod verify;

#[cfg(test)]
mod campaign_tests;
#[cfg(test)]
mod safe_cut_tests;
#[cfg(test)]
pub(crate) mod test_tokenizers;

pub use eligibility::{cut_rule_for, Ineligible, RegexFamily};
pub use safe_cut::{AddedTokenGuard, CutRule};
pub use session::{common_prefix_len, Session};
pub use session_tokenizer::{EncodePath, Encoded, SessionConfig, SessionTokenizer};
pub use splice::{Continuation, CutWindow, FallbackReason, Splicer, SplicingSwitch};
pub use store::{PrefixMatch, SessionStore, FINGERPRINT_BYTES};
pub use verify::{Mismatch, VerifyJob, VerifySampler};
