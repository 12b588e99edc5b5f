pub mod assets;
pub mod model;
pub mod policy;
pub mod sched;
pub mod tokenize;
