pub use tokenrouter_core as core;
