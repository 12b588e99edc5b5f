//! The shadow verifier: a thread of its own that re-tokenizes sampled spliced results in full,
//! off the request path. A mismatch writes a reproducer file, logs it, and turns splicing off
//! for the tokenizer until restart.

use std::path::PathBuf;

use tokenrouter_core::tokenize::incremental::{SplicingSwitch, VerifyJob};
use tokenrouter_core::tokenize::TextTokenizer;

/// Checks waiting beyond this are dropped: the verifier samples, it must never hold requests up.
const QUEUE: usize = 16;

pub struct ShadowVerifier {
    jobs: flume::Sender<VerifyJob>,
}

impl ShadowVerifier {
    /// Starts the thread; it ends when this handle is dropped.
    pub fn spawn(tokenizer: TextTokenizer, switch: SplicingSwitch) -> std::io::Result<Self> {
        let (jobs, queue) = flume::bounded::<VerifyJob>(QUEUE);
        std::thread::Builder::new().name("tokenizer-verifier".into()).spawn(move || {
            for job in queue.iter() {
                verify(&tokenizer, &switch, &job);
            }
        })?;
        Ok(ShadowVerifier { jobs })
    }

    /// Queues a check without waiting.
    pub fn submit(&self, job: VerifyJob) {
        if self.jobs.try_send(job).is_err() {
            metrics::counter!("tokenrouter_tokenize_verifications_dropped_total").increment(1);
        }
    }
}

fn verify(tokenizer: &TextTokenizer, switch: &SplicingSwitch, job: &VerifyJob) {
    metrics::counter!("tokenrouter_tokenize_verifications_total").increment(1);
    let mismatch = match job.check(tokenizer) {
        Ok(None) => return,
        Ok(Some(m)) => m,
        Err(e) => return tracing::warn!(%e, "shadow verification could not tokenize"),
    };
    switch.turn_off();
    metrics::counter!("tokenrouter_tokenize_mismatches_total").increment(1);
    let reproducer = job.reproducer(tokenizer.name(), &mismatch);
    let written = write_reproducer(&reproducer);
    tracing::error!(
        tokenizer = tokenizer.name(),
        cut = job.cut,
        first_difference = mismatch.first_difference,
        reproducer = %written.as_ref().map_or_else(|e| format!("not written: {e}"), |p| p.display().to_string()),
        before_cut = %reproducer["before_cut"],
        after_cut = %reproducer["after_cut"],
        "spliced token ids differ from full tokenization; splicing is off for this tokenizer until restart"
    );
}

fn write_reproducer(reproducer: &serde_json::Value) -> std::io::Result<PathBuf> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let path = std::env::temp_dir().join(format!("tokenrouter-splice-mismatch-{stamp}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(reproducer)?)?;
    Ok(path)
}
