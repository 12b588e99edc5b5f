//! `tokenization`: session-incremental tokenization (DESIGN.md §7). A request that continues
//! a conversation (by `session_id` / `X-Session-Id`, or by a long common prefix with a recent
//! prompt) re-tokenizes only its end; a sampled shadow verifier re-checks spliced results.

use serde::Deserialize;
use tokenrouter_core::tokenize::incremental::{CutWindow, SessionConfig};

use super::error::Problems;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizationSection {
    /// Keep sessions and splice continuations; off: every prompt is tokenized in full.
    #[serde(default = "defaults::sessions")]
    pub sessions: bool,
    /// Memory for stored sessions; the least recently used go first.
    #[serde(default = "defaults::session_memory_mib")]
    pub session_memory_mib: u64,
    /// A prompt without a session id continues a stored session only when they share at
    /// least this many leading bytes.
    #[serde(default = "defaults::min_prefix_bytes")]
    pub min_prefix_bytes: usize,
    /// How far back from the first changed byte a safe cut is looked for first.
    #[serde(default = "defaults::cut_window_bytes")]
    pub cut_window_bytes: usize,
    /// The window grows ×4 up to this; beyond it the prompt is tokenized in full.
    #[serde(default = "defaults::max_cut_window_bytes")]
    pub max_cut_window_bytes: usize,
    /// Fraction of spliced prompts re-tokenized in full off the request path.
    #[serde(default = "defaults::verify_fraction")]
    pub verify_fraction: f64,
}

impl Default for TokenizationSection {
    fn default() -> Self {
        TokenizationSection {
            sessions: defaults::sessions(),
            session_memory_mib: defaults::session_memory_mib(),
            min_prefix_bytes: defaults::min_prefix_bytes(),
            cut_window_bytes: defaults::cut_window_bytes(),
            max_cut_window_bytes: defaults::max_cut_window_bytes(),
            verify_fraction: defaults::verify_fraction(),
        }
    }
}

impl TokenizationSection {
    pub fn session_config(&self) -> SessionConfig {
        SessionConfig {
            enabled: self.sessions,
            max_bytes: (self.session_memory_mib << 20) as usize,
            min_prefix_bytes: self.min_prefix_bytes,
            window: CutWindow { initial_bytes: self.cut_window_bytes, max_bytes: self.max_cut_window_bytes },
            verify_fraction: self.verify_fraction,
        }
    }

    pub(super) fn check(&self, p: &mut Problems) {
        p.positive("tokenization.cut_window_bytes", self.cut_window_bytes as u64);
        if self.max_cut_window_bytes < self.cut_window_bytes {
            p.push("tokenization.max_cut_window_bytes", "must be at least cut_window_bytes");
        }
        if !(0.0..=1.0).contains(&self.verify_fraction) {
            p.push("tokenization.verify_fraction", format!("must be in [0, 1], got {}", self.verify_fraction));
        }
    }
}

mod defaults {
    use tokenrouter_core::tokenize::incremental::SessionConfig;

    pub fn sessions() -> bool {
        SessionConfig::default().enabled
    }

    pub fn session_memory_mib() -> u64 {
        (SessionConfig::default().max_bytes >> 20) as u64
    }

    pub fn min_prefix_bytes() -> usize {
        SessionConfig::default().min_prefix_bytes
    }

    pub fn cut_window_bytes() -> usize {
        SessionConfig::default().window.initial_bytes
    }

    pub fn max_cut_window_bytes() -> usize {
        SessionConfig::default().window.max_bytes
    }

    pub fn verify_fraction() -> f64 {
        SessionConfig::default().verify_fraction
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::ServerConfig;
    use super::*;

    const MODELS: &str = "models:\n  - {name: a, preset: tiny}\n";

    fn parse(extra: &str) -> Result<ServerConfig, super::super::ConfigError> {
        ServerConfig::from_yaml_str(&format!("{MODELS}{extra}"), Path::new("."))
    }

    #[test]
    fn defaults_keys_and_checks() {
        assert_eq!(parse("").unwrap().tokenization.session_config(), SessionConfig::default());
        let c = parse("tokenization: {sessions: false, session_memory_mib: 8, verify_fraction: 0.5}\n").unwrap();
        let s = c.tokenization.session_config();
        assert!(!s.enabled);
        assert_eq!((s.max_bytes, s.verify_fraction), (8 << 20, 0.5));
        let e = parse("tokenization: {verify_fraction: 2}\n").unwrap_err();
        assert!(e.mentions("tokenization.verify_fraction"), "{e}");
        let e = parse("tokenization: {cut_window_bytes: 4096, max_cut_window_bytes: 1024}\n").unwrap_err();
        assert!(e.mentions("tokenization.max_cut_window_bytes"), "{e}");
        assert!(parse("tokenization: {window: 3}\n").is_err());
    }
}
