//! The benchmark report: `load/run-bench` runs a matrix of systems (the engine,
//! standard serving, LLM-only, llama.cpp) × policies × concurrencies, each run a
//! `tokenrouter-load --json` file listed in `matrix.tsv`; this module reads them
//! back and writes `report.md` with tables, throughput ratios and PNG charts.

pub mod charts;
pub mod markdown;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::report::Report;

/// The manifest's name inside a report folder.
pub const MATRIX: &str = "matrix.tsv";

/// One run of the matrix.
#[derive(Debug, Clone)]
pub struct Run {
    /// "engine", "standard", "llm-only", "llama.cpp llm-only", ...
    pub system: String,
    /// "random p=0.1", "rstitch", "r2r", or "-" for single-model systems.
    pub policy: String,
    pub concurrency: usize,
    /// The 1-minute load average when the run started (other work on the machine).
    pub load_before: f64,
    pub report: Report,
}

/// The runs of one (system, policy) at one concurrency, repeats together.
#[derive(Debug, Clone)]
pub struct Cell<'a> {
    pub runs: Vec<&'a Run>,
}

impl Cell<'_> {
    /// Mean throughput over the repeats (output tokens / elapsed, per run).
    pub fn throughput(&self) -> f64 {
        let sum: f64 = self.runs.iter().map(|r| r.report.summary.throughput_tok_s).sum();
        sum / self.runs.len().max(1) as f64
    }

    /// Latencies of every completed request of every repeat, sorted.
    pub fn latencies(&self) -> Vec<f64> {
        let mut v: Vec<f64> =
            self.runs.iter().flat_map(|r| &r.report.requests).filter(|q| q.ok).map(|q| q.latency_s).collect();
        v.sort_by(f64::total_cmp);
        v
    }

    pub fn ttfts(&self) -> Vec<f64> {
        let mut v: Vec<f64> =
            self.runs.iter().flat_map(|r| &r.report.requests).filter(|q| q.ok).filter_map(|q| q.ttft_s).collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

/// A system with a policy: one line of a chart, one row group of a table.
pub type SeriesKey = (String, String);

/// Every run, grouped: series (in the order they first appear) → concurrency → cell.
pub struct Matrix {
    pub runs: Vec<Run>,
}

impl Matrix {
    /// Reads `matrix.tsv` (system, policy, concurrency, load average, JSON path
    /// relative to the folder) and every JSON it names.
    pub fn load(dir: &Path) -> anyhow::Result<Matrix> {
        let path = dir.join(MATRIX);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut runs = Vec::new();
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')) {
            let run = parse_line(dir, line).with_context(|| format!("{}:{}", path.display(), n + 1))?;
            runs.push(run);
        }
        anyhow::ensure!(!runs.is_empty(), "{} lists no runs", path.display());
        Ok(Matrix { runs })
    }

    pub fn series(&self) -> Vec<SeriesKey> {
        let mut keys: Vec<SeriesKey> = Vec::new();
        for r in &self.runs {
            let key = (r.system.clone(), r.policy.clone());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    pub fn concurrencies(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.runs.iter().map(|r| r.concurrency).collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    pub fn cell(&self, system: &str, policy: &str, concurrency: usize) -> Option<Cell<'_>> {
        let runs: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.system == system && r.policy == policy && r.concurrency == concurrency)
            .collect();
        (!runs.is_empty()).then_some(Cell { runs })
    }

    /// Cells by series and concurrency, for tables and charts.
    pub fn grid(&self) -> BTreeMap<usize, Vec<(SeriesKey, Cell<'_>)>> {
        let mut grid = BTreeMap::new();
        for c in self.concurrencies() {
            let cells = self
                .series()
                .into_iter()
                .filter_map(|key| self.cell(&key.0, &key.1, c).map(|cell| (key, cell)))
                .collect();
            grid.insert(c, cells);
        }
        grid
    }
}

fn parse_line(dir: &Path, line: &str) -> anyhow::Result<Run> {
    let fields: Vec<&str> = line.split('\t').collect();
    let [system, policy, concurrency, load, json] = fields[..] else {
        anyhow::bail!("expected 5 tab-separated fields (system, policy, concurrency, load, json), got {line:?}");
    };
    let json_path: PathBuf = dir.join(json);
    let text = std::fs::read_to_string(&json_path).with_context(|| format!("reading {}", json_path.display()))?;
    let report: Report = serde_json::from_str(&text).with_context(|| format!("parsing {}", json_path.display()))?;
    Ok(Run {
        system: system.to_string(),
        policy: policy.to_string(),
        concurrency: concurrency.parse().context("concurrency")?,
        load_before: load.parse().unwrap_or(f64::NAN),
        report,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::RequestRecord;
    use crate::report::RunInfo;
    use crate::stats::Summary;

    pub fn report(tok_s: f64, latencies: &[f64]) -> Report {
        let requests: Vec<RequestRecord> = latencies
            .iter()
            .enumerate()
            .map(|(i, &l)| RequestRecord {
                index: i,
                job: i as u64,
                turn: 0,
                start_s: 0.0,
                ok: true,
                ttft_s: Some(l / 10.0),
                latency_s: l,
                prompt_tokens: 100,
                cached_tokens: 0,
                turn_tokens: 100,
                output_tokens: 10,
                streamed_tokens: None,
                max_tokens: 10,
                tokens_per_s: 10.0 / l,
                tokens_per_model: BTreeMap::from([("small".to_string(), 9), ("large".to_string(), 1)]),
                finish_reason: Some("length".into()),
                error: None,
                hung_up: false,
            })
            .collect();
        let mut summary = Summary::new(&requests, 1.0);
        summary.throughput_tok_s = tok_s;
        let run = RunInfo {
            target: "t".into(),
            served_models: vec![],
            workload: "low-effort".into(),
            endpoint: "completions".into(),
            load: "closed loop".into(),
            scale: 0.01,
            input_scale: 1.0,
            turns: 1,
            max_requests: 4,
            duration_s: 10.0,
            hangup_fraction: 0.0,
            seed: 0,
            tokenizer: None,
            trace: None,
            command: vec!["tokenrouter-load".into(), "--clients".into(), "4".into()],
            started_unix_s: 0.0,
        };
        Report { run, summary, soak: None, requests }
    }

    /// A report folder with these (system, policy, concurrency, throughput) runs.
    pub fn folder(runs: &[(&str, &str, usize, f64)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("runs")).unwrap();
        let mut matrix = String::from("# system\tpolicy\tconcurrency\tload\tjson\n");
        for (i, (system, policy, c, tok_s)) in runs.iter().enumerate() {
            let json = format!("runs/{i}.json");
            report(*tok_s, &[0.5, 1.0, 1.5]).write_json(&dir.path().join(&json)).unwrap();
            matrix.push_str(&format!("{system}\t{policy}\t{c}\t0.50\t{json}\n"));
        }
        std::fs::write(dir.path().join(MATRIX), matrix).unwrap();
        dir
    }

    #[test]
    fn the_matrix_groups_runs_by_series_and_concurrency_and_averages_repeats() {
        let dir = folder(&[
            ("engine", "random p=0.1", 1, 10.0),
            ("standard", "random p=0.1", 1, 4.0),
            ("engine", "random p=0.1", 4, 30.0),
            ("engine", "random p=0.1", 1, 12.0),
        ]);
        let m = Matrix::load(dir.path()).unwrap();
        assert_eq!(m.concurrencies(), vec![1, 4]);
        assert_eq!(m.series().len(), 2);
        let cell = m.cell("engine", "random p=0.1", 1).unwrap();
        assert_eq!((cell.runs.len(), cell.throughput()), (2, 11.0));
        assert_eq!(cell.latencies(), vec![0.5, 0.5, 1.0, 1.0, 1.5, 1.5]);
        assert!(m.cell("standard", "random p=0.1", 4).is_none());
        assert_eq!(m.grid()[&4].len(), 1);
    }

    #[test]
    fn a_bad_line_names_the_file_and_line() {
        let dir = folder(&[("engine", "-", 1, 1.0)]);
        std::fs::write(dir.path().join(MATRIX), "engine\t-\t1\n").unwrap();
        let e = format!("{:#}", Matrix::load(dir.path()).err().unwrap());
        assert!(e.contains("matrix.tsv:1") && e.contains("5 tab-separated fields"), "{e}");
    }
}
