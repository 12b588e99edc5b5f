//! Compiling a request's grammar (structured outputs) before admission: off the async
//! threads (a large schema takes milliseconds to seconds) and within a time limit. The
//! choices of one request (`n`) arrive one after another with the same grammar: the
//! last compiled one is kept, and they get fresh copies of it instead of compiles.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokenrouter_core::constrain::{ConstraintError, GrammarCompiler, GrammarSpec, TokenConstraint};
use tokenrouter_core::tokenize::TextTokenizer;

use crate::error::EngineError;

/// How long compiling one grammar may take before the request is refused.
const COMPILE_LIMIT: Duration = Duration::from_secs(10);

/// The engine's grammar compiler, built on first use (it reads the whole vocabulary).
pub(crate) struct Grammars {
    tokenizer: Option<TextTokenizer>,
    vocab: usize,
    compiler: OnceLock<Result<Arc<GrammarCompiler>, String>>,
    last: parking_lot::Mutex<Option<Compiled>>,
    /// Grammars compiled so far (copies of the last one not counted).
    compiles: AtomicUsize,
}

/// A compiled grammar, its parse never advanced, with what it was compiled from.
struct Compiled {
    spec: GrammarSpec,
    stop_ids: Vec<u32>,
    constraint: TokenConstraint,
}

impl Grammars {
    pub(crate) fn new(tokenizer: Option<TextTokenizer>, vocab: usize) -> Self {
        Self {
            tokenizer,
            vocab,
            compiler: OnceLock::new(),
            last: parking_lot::Mutex::new(None),
            compiles: AtomicUsize::new(0),
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

    /// A fresh constraint for a request whose output ends at `stop_ids`.
    pub(crate) async fn compile(
        self: &Arc<Self>,
        spec: GrammarSpec,
        stop_ids: Vec<u32>,
    ) -> Result<Arc<TokenConstraint>, EngineError> {
        if let Some(copy) = self.copy_of_last(&spec, &stop_ids) {
            return Ok(Arc::new(copy));
        }
        let grammars = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            let constraint = grammars.compile_now(&spec, &stop_ids)?;
            *grammars.last.lock() = Some(Compiled { constraint: constraint.fresh(), spec, stop_ids });
            Ok(constraint)
        });
        match tokio::time::timeout(COMPILE_LIMIT, job).await {
            Ok(Ok(compiled)) => compiled.map(Arc::new),
            Ok(Err(panicked)) => Err(EngineError::Internal(format!("compiling the grammar failed: {panicked}"))),
            Err(_) => Err(EngineError::InvalidGrammar(format!(
                "the grammar took longer than {}s to compile; simplify it",
                COMPILE_LIMIT.as_secs()
            ))),
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
        let grammars = Arc::new(Grammars::new(Some(tokenizer), vocab));
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
}
