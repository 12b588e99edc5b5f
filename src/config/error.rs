//! Configuration errors: every problem names the key it is about.

use std::fmt;
use std::path::{Path, PathBuf};

/// One thing wrong, at a key path such as `models[1].kv_budget_mib` (empty: the file as
/// a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path.is_empty() {
            true => f.write_str(&self.message),
            false => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// Why a configuration was refused: one or more problems, and the file they are in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, when the config came from one.
    pub origin: Option<PathBuf>,
    pub problems: Vec<Problem>,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { origin: None, problems: vec![Problem { path: path.into(), message: message.into() }] }
    }

    pub fn from_problems(problems: Vec<Problem>) -> Self {
        ConfigError { origin: None, problems }
    }

    pub fn with_origin(mut self, origin: &Path) -> Self {
        self.origin.get_or_insert_with(|| origin.to_path_buf());
        self
    }

    /// Whether any problem is at `path` (tests, and callers mapping errors to flags).
    pub fn mentions(&self, path: &str) -> bool {
        self.problems.iter().any(|p| p.path == path)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = self.origin.as_ref().map(|o| format!("{}: ", o.display())).unwrap_or_default();
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{prefix}{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Collects problems during validation.
#[derive(Default)]
pub(crate) struct Problems(Vec<Problem>);

impl Problems {
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem { path: path.into(), message: message.into() });
    }

    /// `value` must be at least 1.
    pub fn positive(&mut self, path: impl Into<String>, value: u64) {
        if value == 0 {
            self.push(path, "must be at least 1");
        }
    }

    pub fn absorb(&mut self, error: ConfigError) {
        self.0.extend(error.problems);
    }

    pub fn finish(self) -> Result<(), ConfigError> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(ConfigError::from_problems(self.0)),
        }
    }
}
