//! Compiling a request's grammar (structured outputs) before admission: off the async
//! threads (a large schema takes milliseconds to seconds) and within a time limit. The
//! choices of one request (`n`) arrive one after another with the same grammar: the
//! last compiled one is kept, and they get fresh copies of it instead of compiles.
//!
//! A compile cannot be stopped once it runs (llguidance bounds its work with its own
//! fuel limits), so few run at once: a compile waits for a slot, and a request that
//! leaves or runs out of time while waiting never starts one. A compile that outlives
//! its request's limit keeps its slot until it ends, so abandoned compiles cannot pile
//! up and starve the machine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokenrouter_core::constrain::{ConstraintError, GrammarCompiler, GrammarSpec, TokenConstraint};
use tokenrouter_core::tokenize::TextTokenizer;

use crate::error::EngineError;

/// Where the compile time limit is set, for the refusal's message.
pub(crate) const COMPILE_LIMIT_KEY: &str = "admission.grammar_compile_timeout_s";

/// The engine's grammar compiler, built on first use (it reads the whole vocabulary).
pub(crate) struct Grammars {
    tokenizer: Option<TextTokenizer>,
    vocab: usize,
    compiler: OnceLock<Result<Arc<GrammarCompiler>, String>>,
    last: parking_lot::Mutex<Option<Compiled>>,
    /// Grammars compiled so far (copies of the last one not counted).
    compiles: AtomicUsize,
    /// Compiles that may run at once.
    slots: Arc<tokio::sync::Semaphore>,
    /// How long a request waits for its compile, queueing included.
    limit: Duration,
}

/// A compiled grammar, its parse never advanced, with what it was compiled from.
struct Compiled {
    spec: GrammarSpec,
    stop_ids: Vec<u32>,
    constraint: TokenConstraint,
}

impl Grammars {
    pub(crate) fn new(tokenizer: Option<TextTokenizer>, vocab: usize, limit: Duration) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self::with_slots(tokenizer, vocab, limit, (cores / 2).max(1))
    }

    fn with_slots(tokenizer: Option<TextTokenizer>, vocab: usize, limit: Duration, slots: usize) -> Self {
        Self {
            tokenizer,
            vocab,
            compiler: OnceLock::new(),
            last: parking_lot::Mutex::new(None),
            compiles: AtomicUsize::new(0),
            slots: Arc::new(tokio::sync::Semaphore::new(slots)),
            limit,
        }
    }

    /// Builds the compiler now (about a second for a 150k vocabulary), so that the
    /// first structured request does not wait for it.
    pub(crate) fn warm_up(self: &Arc<Self>) {
        if self.tokenizer.is_some() {
            let grammars = self.clone();
            tokio::task::spawn_blocking(move || {
                grammars.compiler.get_or_init(|| grammars.build_compiler());
            });
        }
    }

    /// A fresh constraint for a request whose output ends at `stop_ids`. Dropping the
    /// future while it waits for a slot cancels the compile.
    pub(crate) async fn compile(
        self: &Arc<Self>,
        spec: GrammarSpec,
        stop_ids: Vec<u32>,
    ) -> Result<Arc<TokenConstraint>, EngineError> {
        if let Some(copy) = self.copy_of_last(&spec, &stop_ids) {
            return Ok(Arc::new(copy));
        }
        match tokio::time::timeout(self.limit, self.compile_in_a_slot(spec, stop_ids)).await {
            Ok(compiled) => compiled.map(Arc::new),
            Err(_) => Err(EngineError::InvalidGrammar(format!(
                "the grammar took longer than {:.1}s to compile ({COMPILE_LIMIT_KEY}); simplify it",
                self.limit.as_secs_f64()
            ))),
        }
    }

    async fn compile_in_a_slot(
        self: &Arc<Self>,
        spec: GrammarSpec,
        stop_ids: Vec<u32>,
    ) -> Result<TokenConstraint, EngineError> {
        let slot = self.slots.clone().acquire_owned().await.map_err(|e| EngineError::Internal(e.to_string()))?;
        // Another choice of the same request may have compiled it while this one waited.
        if let Some(copy) = self.copy_of_last(&spec, &stop_ids) {
            return Ok(copy);
        }
        let grammars = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let constraint = grammars.compile_now(&spec, &stop_ids)?;
            *grammars.last.lock() = Some(Compiled { constraint: constraint.fresh(), spec, stop_ids });
            Ok(constraint)
        });
        match job.await {
            Ok(compiled) => compiled,
            Err(panicked) => Err(EngineError::Internal(format!("compiling the grammar failed: {panicked}"))),
        }
    }

    fn copy_of_last(&self, spec: &GrammarSpec, stop_ids: &[u32]) -> Option<TokenConstraint> {
        let last = self.last.lock();
        let last = last.as_ref().filter(|c| c.stop_ids == stop_ids && c.spec == *spec)?;
        Some(last.constraint.fresh())
    }

    fn compile_now(&self, spec: &GrammarSpec, stop_ids: &[u32]) -> Result<TokenConstraint, EngineError> {
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let compiler = self.compiler.get_or_init(|| self.build_compiler()).clone().map_err(EngineError::Internal)?;
        compiler.compile(spec, stop_ids).map_err(|e| match e {
            ConstraintError::InvalidGrammar(m) => EngineError::InvalidGrammar(m),
            ConstraintError::Tokenizer(m) => EngineError::InvalidRequest(m),
        })
    }

    fn build_compiler(&self) -> Result<Arc<GrammarCompiler>, String> {
        let tokenizer =
            self.tokenizer.as_ref().ok_or("structured outputs need a tokenizer; this engine's models have none")?;
        GrammarCompiler::new(tokenizer, self.vocab).map(Arc::new).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenrouter_core::constrain::Next;

    #[tokio::test]
    async fn the_choices_of_a_request_share_one_compile_and_parse_apart() {
        let Some(folder) = tokenrouter_core::assets::tokenizer_dir("qwen3") else { return };
        let tokenizer = TextTokenizer::from_folder(&folder).unwrap();
        let yes = tokenizer.encode("yes", false).unwrap();
        let vocab = tokenizer.vocab_size();
        let grammars = Arc::new(Grammars::new(Some(tokenizer), vocab, Duration::from_secs(10)));
        let spec = GrammarSpec::Regex("(yes|no)".into());
        let first = grammars.compile(spec.clone(), vec![7]).await.unwrap();
        let second = grammars.compile(spec.clone(), vec![7]).await.unwrap();
        assert_eq!(grammars.compiles.load(Ordering::Relaxed), 1, "the second choice copies the first's");
        assert!(!Arc::ptr_eq(&first, &second), "each choice parses its own output");
        assert!(matches!(first.next(&yes), Next::Complete | Next::Allowed(_)));
        assert!(matches!(second.next(&[]), Next::Allowed(_)), "a copy starts at the start");
        grammars.compile(spec, vec![8]).await.unwrap();
        grammars.compile(GrammarSpec::Regex("no".into()), vec![7]).await.unwrap();
        assert_eq!(grammars.compiles.load(Ordering::Relaxed), 3, "other stop ids or grammars compile");
    }

    /// A schema of `fields` properties: big enough to take a while to compile.
    fn wide_schema(fields: usize) -> GrammarSpec {
        let properties: serde_json::Map<String, serde_json::Value> = (0..fields)
            .map(|i| (format!("field_{i}"), serde_json::json!({"type": "string", "pattern": format!("[a-z]{{{i}}}x")})))
            .collect();
        let schema = serde_json::json!({"type": "object", "properties": properties, "required": properties.keys().collect::<Vec<_>>()});
        GrammarSpec::JsonSchema { schema, strict: true }
    }

    /// With one slot busy, a compile whose request leaves while it waits, or whose limit
    /// runs out while it waits, never runs; the refusal names the config key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_compile_whose_request_left_or_ran_out_of_time_while_queued_never_runs() {
        let Some(folder) = tokenrouter_core::assets::tokenizer_dir("qwen3") else { return };
        let tokenizer = TextTokenizer::from_folder(&folder).unwrap();
        let vocab = tokenizer.vocab_size();
        let grammars = Arc::new(Grammars::with_slots(Some(tokenizer), vocab, Duration::from_millis(50), 1));
        grammars.compiler.get_or_init(|| grammars.build_compiler());
        // Hold the only slot, as a long compile would.
        let held = grammars.slots.clone().acquire_owned().await.unwrap();
        let refused = grammars.compile(wide_schema(3), vec![7]).await.unwrap_err();
        assert!(refused.to_string().contains(COMPILE_LIMIT_KEY), "{refused}");
        let left = tokio::spawn({
            let grammars = grammars.clone();
            async move { grammars.compile(wide_schema(4), vec![7]).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        left.abort();
        let _ = left.await;
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(grammars.compiles.load(Ordering::Relaxed), 0, "no abandoned compile ran");
        grammars.compile(GrammarSpec::Regex("(yes|no)".into()), vec![7]).await.unwrap();
        assert_eq!(grammars.compiles.load(Ordering::Relaxed), 1);
    }
}
