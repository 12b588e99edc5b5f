//! Compiling a request's grammar (structured outputs) before admission: off the async
//! threads (a large schema takes milliseconds to seconds) and within a time limit.

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
}

impl Grammars {
    pub(crate) fn new(tokenizer: Option<TextTokenizer>, vocab: usize) -> Self {
        Self { tokenizer, vocab, compiler: OnceLock::new() }
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
        let grammars = self.clone();
        let job = tokio::task::spawn_blocking(move || grammars.compile_now(&spec, &stop_ids));
        match tokio::time::timeout(COMPILE_LIMIT, job).await {
            Ok(Ok(compiled)) => compiled.map(Arc::new),
            Ok(Err(panicked)) => Err(EngineError::Internal(format!("compiling the grammar failed: {panicked}"))),
            Err(_) => Err(EngineError::InvalidGrammar(format!(
                "the grammar took longer than {}s to compile; simplify it",
                COMPILE_LIMIT.as_secs()
            ))),
        }
    }

    fn compile_now(&self, spec: &GrammarSpec, stop_ids: &[u32]) -> Result<TokenConstraint, EngineError> {
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
