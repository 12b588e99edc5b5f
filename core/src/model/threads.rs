//! The one place that decides how many threads compute uses.
//!
//! candle's matmul (gemm) and our kernels both run on rayon. Left to defaults, several
//! pools can spin against each other on a 2-core machine (seen: a 15x slowdown), so
//! the count is set once, before any compute, from `TOKENROUTER_THREADS`, else
//! `RAYON_NUM_THREADS`, else the number of cores. The same first call tunes the
//! allocator for compute's large, short-lived buffers.

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
        // candle's elementwise ops run on a pool of its own whose workers spin 25,000
        // rounds before sleeping: on 2 cores that spinning took a core from the next
        // matmul (13% of a 128-token prefill's CPU time). Sleep almost at once instead.
        if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
            std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "200");
        }
        // Fails only if a global pool already exists, which then was built from the
        // same variables on first use.
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
        keep_freed_memory();
        n
    })
}

/// Every step allocates buffers of megabytes (a batch's logits: 19 MB at 32 rows of a
/// 152K vocabulary) and frees them. By default glibc serves those with fresh `mmap`s
/// or trims them back to the kernel on free, so each step faults every page in again
/// and the kernel zeroes it (measured: a tenth of a 32-row decode step on `small`).
/// Keeping freed memory in the heap up to glibc's largest threshold (32 MiB) makes the
/// next step reuse it; larger buffers still come and go by `mmap`.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before compute starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

/// Threads of a llama.cpp context: the model's own count, else the process's. ggml
/// keeps its own workers (OpenMP), outside rayon's pools, so this is where both meet.
pub fn llama_threads(requested: Option<usize>) -> usize {
    requested.unwrap_or_else(|| configure(None))
}

fn env_count(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok().filter(|&n| n > 0)
}

/// One thread at the lowest scheduling priority, for work that must not take compute
/// from the models (the planner's searches while serving): it runs on idle cycles.
pub fn background_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "tokenrouter-background".to_string())
            .start_handler(|_| lower_this_thread_priority())
            .build()
            .ok()
    })
    .as_ref()
}

fn lower_this_thread_priority() {
    // SAFETY: gettid and setpriority only read their arguments; on Linux a thread id
    // names one thread, whose nice value alone changes.
    #[cfg(target_os = "linux")]
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}
