//! The one place that decides how many threads compute uses.
//!
//! candle's matmul (gemm) and our kernels both run on rayon. Left to defaults, several
//! pools can spin against each other on a 2-core machine (seen: a 15x slowdown), so
//! the count is set once, before any compute, from `TOKENROUTER_THREADS`, else
//! `RAYON_NUM_THREADS`, else the number of cores.

use std::sync::OnceLock;

static CONFIGURED: OnceLock<usize> = OnceLock::new();

/// Sets the compute thread count for the process (first call wins) and returns it.
pub fn configure(requested: Option<usize>) -> usize {
    *CONFIGURED.get_or_init(|| {
        let n = requested
            .or_else(|| env_count("TOKENROUTER_THREADS"))
            .or_else(|| env_count("RAYON_NUM_THREADS"))
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        // candle reads these when it sizes gemm's parallelism; set them before it does.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
        // Fails only if a global pool already exists, which then was built from the
        // same variables on first use.
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
        n
    })
}

/// Threads of a llama.cpp context: the model's own count, else the process's. ggml
/// keeps its own workers (OpenMP), outside rayon's pools, so this is where both meet.
pub fn llama_threads(requested: Option<usize>) -> usize {
    requested.unwrap_or_else(|| configure(None))
}

fn env_count(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok().filter(|&n| n > 0)
}
