//! `report.md`: what was run and on what, throughput by system and concurrency,
//! the ratios the benchmark exists for (the engine against every other system),
//! per-concurrency details, the charts, and every command.

use std::fmt::Write;

use super::{Cell, Matrix};
use crate::stats::quantile;

/// The system whose throughput is divided by every other's.
pub const ENGINE: &str = "engine";
/// Systems that run one model, without a policy, say so with this policy.
pub const NO_POLICY: &str = "-";

/// What the report says besides the numbers.
pub struct Context<'a> {
    pub title: &'a str,
    /// Markdown describing the machine, models, commit and load (written by run-bench).
    pub preamble: &'a str,
    /// Every command run, one per line.
    pub commands: &'a str,
    /// Observations written after the run (`notes.md`), shown after the ratios.
    pub notes: &'a str,
    /// PNG file names (relative to the report) with their captions.
    pub charts: &'a [(String, String)],
}

pub fn render(matrix: &Matrix, context: &Context<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n\n{}\n", context.title, context.preamble.trim_end());
    out.push_str(&throughput_table(matrix));
    out.push_str(&ratio_table(matrix));
    if !context.notes.trim().is_empty() {
        let _ = writeln!(out, "## Notes\n\n{}\n", context.notes.trim_end());
    }
    out.push_str(&details(matrix));
    out.push_str("## Charts\n\n");
    for (file, caption) in context.charts {
        let _ = writeln!(out, "![{caption}]({file})\n");
    }
    let _ = writeln!(out, "## Commands\n\n```\n{}\n```", context.commands.trim_end());
    out
}

fn series_name(system: &str, policy: &str) -> String {
    if policy == NO_POLICY {
        system.to_string()
    } else {
        format!("{system}, {policy}")
    }
}

fn header(out: &mut String, first: &str, columns: &[String]) {
    let _ = writeln!(out, "| {first} | {} |", columns.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(columns.len()));
}

fn concurrency_columns(matrix: &Matrix) -> Vec<String> {
    matrix.concurrencies().iter().map(|c| format!("N = {c}")).collect()
}

/// Mean throughput per series and concurrency, with the spread of repeats.
fn throughput_table(matrix: &Matrix) -> String {
    let mut out = String::from("## Throughput (output tokens/s, closed loop, N clients)\n\n");
    header(&mut out, "system, policy", &concurrency_columns(matrix));
    for (system, policy) in matrix.series() {
        let cells: Vec<String> = matrix
            .concurrencies()
            .into_iter()
            .map(|c| matrix.cell(&system, &policy, c).map_or("—".to_string(), |cell| throughput_text(&cell)))
            .collect();
        let _ = writeln!(out, "| {} | {} |", series_name(&system, &policy), cells.join(" | "));
    }
    out.push('\n');
    out
}

fn throughput_text(cell: &Cell<'_>) -> String {
    let values: Vec<f64> = cell.runs.iter().map(|r| r.report.summary.throughput_tok_s).collect();
    if values.len() == 1 {
        return format!("{:.1}", values[0]);
    }
    let (lo, hi) = values.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    format!("{:.1} ({lo:.1}–{hi:.1}, {} runs)", cell.throughput(), values.len())
}

/// One comparison: the engine's series against another system's.
struct Ratio {
    label: String,
    engine_policy: String,
    other: (String, String),
}

/// The engine against every other system: per policy against systems that route
/// with the same policy, and every engine policy against single-model systems.
fn comparisons(matrix: &Matrix) -> Vec<Ratio> {
    let series = matrix.series();
    let engine_policies: Vec<&String> = series.iter().filter(|(s, _)| s == ENGINE).map(|(_, p)| p).collect();
    let mut ratios = Vec::new();
    for (system, policy) in series.iter().filter(|(s, _)| s != ENGINE) {
        for engine_policy in &engine_policies {
            let same_policy = *engine_policy == policy;
            if policy != NO_POLICY && !same_policy {
                continue;
            }
            let label = if same_policy {
                format!("engine ÷ {system} ({policy})")
            } else {
                format!("engine ({engine_policy}) ÷ {system}")
            };
            ratios.push(Ratio {
                label,
                engine_policy: engine_policy.to_string(),
                other: (system.clone(), policy.clone()),
            });
        }
    }
    ratios
}

fn ratio_table(matrix: &Matrix) -> String {
    let mut out = String::from("## Throughput ratios\n\n");
    let ratios = comparisons(matrix);
    if ratios.is_empty() {
        out.push_str("No system to compare the engine with.\n\n");
        return out;
    }
    header(&mut out, "comparison", &concurrency_columns(matrix));
    for r in &ratios {
        let cells: Vec<String> = matrix
            .concurrencies()
            .into_iter()
            .map(|c| {
                let engine = matrix.cell(ENGINE, &r.engine_policy, c).map(|cell| cell.throughput());
                let other = matrix.cell(&r.other.0, &r.other.1, c).map(|cell| cell.throughput());
                match (engine, other) {
                    (Some(e), Some(o)) if o > 0.0 => format!("{:.2}×", e / o),
                    _ => "—".to_string(),
                }
            })
            .collect();
        let _ = writeln!(out, "| {} | {} |", r.label, cells.join(" | "));
    }
    out.push('\n');
    out
}

/// Per concurrency: completions, throughput, TTFT and latency percentiles, per-user
/// speed, where the tokens came from and the machine's load when the run began.
fn details(matrix: &Matrix) -> String {
    let mut out = String::from("## Details by concurrency\n\n");
    let columns = [
        "done/failed",
        "tok/s",
        "TTFT p50 / p90 (s)",
        "latency p50 / p90 / p99 (s)",
        "per-user tok/s",
        "tokens by model",
        "load avg at start",
    ]
    .map(String::from);
    for (c, cells) in matrix.grid() {
        let _ = writeln!(out, "### N = {c}\n");
        header(&mut out, "system, policy", &columns);
        for ((system, policy), cell) in cells {
            let _ = writeln!(out, "| {} | {} |", series_name(&system, &policy), detail_row(&cell).join(" | "));
        }
        out.push('\n');
    }
    out
}

fn detail_row(cell: &Cell<'_>) -> Vec<String> {
    let (done, failed) = cell
        .runs
        .iter()
        .fold((0, 0), |(d, f), r| (d + r.report.summary.requests_done, f + r.report.summary.requests_failed));
    let (ttft, latency) = (cell.ttfts(), cell.latencies());
    let q = |v: &[f64], p: f64| quantile(v, p).map_or("—".to_string(), |x| format!("{x:.2}"));
    let user: Vec<f64> = cell.runs.iter().filter_map(|r| r.report.summary.user_tok_s.map(|u| u.mean)).collect();
    let loads: Vec<String> = cell.runs.iter().map(|r| format!("{:.2}", r.load_before)).collect();
    vec![
        format!("{done}/{failed}"),
        format!("{:.1}", cell.throughput()),
        format!("{} / {}", q(&ttft, 0.5), q(&ttft, 0.9)),
        format!("{} / {} / {}", q(&latency, 0.5), q(&latency, 0.9), q(&latency, 0.99)),
        format!("{:.1}", user.iter().sum::<f64>() / user.len().max(1) as f64),
        model_shares(cell),
        loads.join(", "),
    ]
}

/// "small 90% · large 10%" over every completed request of the cell.
fn model_shares(cell: &Cell<'_>) -> String {
    let mut totals = std::collections::BTreeMap::<String, u64>::new();
    for r in &cell.runs {
        for (model, n) in &r.report.summary.tokens_per_model {
            *totals.entry(model.clone()).or_default() += n;
        }
    }
    let all = totals.values().sum::<u64>().max(1) as f64;
    let parts: Vec<String> = totals.iter().map(|(m, n)| format!("{m} {:.0}%", 100.0 * *n as f64 / all)).collect();
    if parts.is_empty() {
        "—".to_string()
    } else {
        parts.join(" · ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::tests::folder;

    #[test]
    fn the_report_has_throughput_ratios_details_charts_and_commands() {
        let dir = folder(&[
            ("engine", "random p=0.1", 1, 10.0),
            ("standard", "random p=0.1", 1, 4.0),
            ("llm-only", "-", 1, 5.0),
            ("engine", "rstitch", 1, 6.0),
            ("engine", "random p=0.1", 4, 30.0),
            ("llm-only", "-", 4, 20.0),
        ]);
        let m = Matrix::load(dir.path()).unwrap();
        let charts = [("throughput.png".to_string(), "throughput".to_string())];
        let ctx = Context { title: "Bench", preamble: "Machine: x", commands: "a\nb", notes: "", charts: &charts };
        let md = render(&m, &ctx);
        assert!(md.starts_with("# Bench\n\nMachine: x"), "{md}");
        assert!(md.contains("| engine, random p=0.1 | 10.0 | 30.0 |"), "{md}");
        assert!(md.contains("| standard, random p=0.1 | 4.0 | — |"), "{md}");
        assert!(md.contains("| engine ÷ standard (random p=0.1) | 2.50× | — |"), "{md}");
        assert!(md.contains("| engine (random p=0.1) ÷ llm-only | 2.00× | 1.50× |"), "{md}");
        assert!(md.contains("| engine (rstitch) ÷ llm-only | 1.20× | — |"), "{md}");
        assert!(!md.contains("engine ÷ standard (rstitch)"), "no standard rstitch run: {md}");
        assert!(md.contains("### N = 4") && md.contains("large 10% · small 90%"), "{md}");
        assert!(md.contains("![throughput](throughput.png)") && md.contains("```\na\nb\n```"), "{md}");
    }
}
