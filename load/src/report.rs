//! The output of a run: a JSON document (what was run, the summary, every request)
//! and a CSV with one row per request, for plotting and for comparing runs.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::record::{RequestRecord, CSV_HEADER};
use crate::soak::SoakReport;
use crate::stats::Summary;

/// What was run, so a result file explains itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub target: String,
    /// What `GET /v1/models` answered.
    pub served_models: Vec<String>,
    pub workload: String,
    pub endpoint: String,
    /// e.g. "closed loop, 4 clients" or "open loop, Poisson 2 jobs/s".
    pub load: String,
    pub scale: f64,
    pub input_scale: f64,
    pub turns: usize,
    /// 0: no limit (a soak, bounded by `duration_s`).
    pub max_requests: usize,
    pub duration_s: f64,
    /// Fraction of requests the client hung up on mid-stream.
    #[serde(default)]
    pub hangup_fraction: f64,
    pub seed: u64,
    /// The tokenizer that sized prompts; absent when words stood for tokens.
    pub tokenizer: Option<String>,
    pub trace: Option<String>,
    /// The command line.
    pub command: Vec<String>,
    /// Seconds since 1970 when the run started.
    pub started_unix_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub run: RunInfo,
    pub summary: Summary,
    /// Faults injected, the server's memory and the leak check, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakReport>,
    pub requests: Vec<RequestRecord>,
}

impl Report {
    /// The summary as printed at the end of a run, with the soak's findings.
    pub fn render(&self) -> String {
        let soak = self.soak.as_ref().map(SoakReport::render).unwrap_or_default();
        format!("{}{soak}", self.summary.render())
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        write_file(path, text.as_bytes())
    }

    pub fn write_csv(&self, path: &Path) -> anyhow::Result<()> {
        let mut out = Vec::new();
        writeln!(out, "{CSV_HEADER}")?;
        for r in &self.requests {
            writeln!(out, "{}", r.csv_row())?;
        }
        write_file(path, &out)
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}
