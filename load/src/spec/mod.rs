//! The speculative-decoding benchmark: the same requests with and without drafts, in
//! alternating phases on one running server, so the two see the same machine.

pub mod prompts;
