pub mod assets;
pub mod model;
pub mod policy;
pub mod pool;
pub mod rng;
pub mod sched;
pub mod sse;
pub mod tokenize;
