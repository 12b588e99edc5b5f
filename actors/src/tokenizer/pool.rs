//! Threads of their own for tokenizing. Tokenizing a long prompt takes as long as it takes (a 4 MiB
//! prompt: seconds); on the async runtime it would stall every task sharing that worker, and
//! inside the actor's handler every request queued behind it. As TGI's validation workers: a
//! bounded channel feeds a few OS threads, so several prompts tokenize at once.

use std::panic::AssertUnwindSafe;

/// One unit of work: tokenize and reply.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Jobs that may wait per thread before `submit` waits too (back-pressure for the actor's
/// mailbox, not a limit callers see: the actor keeps accepting messages up to its own queue).
const QUEUE_PER_WORKER: usize = 64;

/// Overrides the number of tokenizer threads.
pub const THREADS_VAR: &str = "TOKENROUTER_TOKENIZER_THREADS";

pub struct TokenizerPool {
    jobs: flume::Sender<Job>,
}

#[derive(Debug, thiserror::Error)]
#[error("the tokenizer threads have stopped")]
pub struct PoolStopped;

impl TokenizerPool {
    /// Starts `workers` threads (at least one); they end once this pool is dropped and the jobs
    /// already queued are done.
    pub fn spawn(workers: usize) -> std::io::Result<Self> {
        let workers = workers.max(1);
        let (jobs, queue) = flume::bounded::<Job>(QUEUE_PER_WORKER * workers);
        for i in 0..workers {
            let queue = queue.clone();
            std::thread::Builder::new().name(format!("tokenizer-{i}")).spawn(move || run(queue))?;
        }
        tracing::debug!(workers, "tokenizer threads started");
        Ok(TokenizerPool { jobs })
    }

    /// Queues `job`; waits (without blocking the runtime) only while the queue is full.
    pub async fn submit(&self, job: impl FnOnce() + Send + 'static) -> Result<(), PoolStopped> {
        self.jobs.send_async(Box::new(job)).await.map_err(|_| PoolStopped)
    }
}

fn run(queue: flume::Receiver<Job>) {
    for job in queue.iter() {
        // A panicking job drops its reply port (its caller gets an error); the thread
        // must survive it, or the pool would shrink until requests hang.
        if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
            metrics::counter!("tokenrouter_tokenize_panics_total").increment(1);
            tracing::error!("a tokenizer job panicked; its request gets an error");
        }
    }
}

/// `$TOKENROUTER_TOKENIZER_THREADS`, else two threads (one on a single core): enough for a long
/// prompt not to hold up short ones, while leaving the cores to the models.
pub fn default_workers() -> usize {
    let from_env = std::env::var(THREADS_VAR).ok().and_then(|v| v.trim().parse::<usize>().ok());
    from_env.filter(|&n| n > 0).unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.min(2)
    })
}
