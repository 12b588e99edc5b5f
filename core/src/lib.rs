pub mod model;
pub mod policy;
pub mod sched;
