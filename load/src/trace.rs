//! The Azure LLM inference traces (2023): one request a row, with its arrival time
//! and its prompt and output sizes (`TIMESTAMP,ContextTokens,GeneratedTokens`).
//! Prompt text is not published, so replay sends synthetic text of those sizes.

use std::path::Path;

use anyhow::Context;

/// One traced request; `at_s` is seconds after the trace's first request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRow {
    pub at_s: f64,
    pub context_tokens: u32,
    pub generated_tokens: u32,
}

pub fn load_trace(path: &Path) -> anyhow::Result<Vec<TraceRow>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading trace {}", path.display()))?;
    parse_trace(&text).with_context(|| format!("in trace {}", path.display()))
}

/// Parses the CSV (header required, columns in any order; the parser is the one
/// the pool simulator uses). Rows are sorted by arrival, so replay can walk them in order.
pub fn parse_trace(text: &str) -> anyhow::Result<Vec<TraceRow>> {
    let arrivals = tokenrouter_core::pool::trace::parse_azure_csv(text)?;
    Ok(arrivals
        .into_iter()
        .map(|a| TraceRow { at_s: a.at_s, context_tokens: a.prompt_tokens, generated_tokens: a.output_tokens })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parsing itself is core::pool::trace's (tested there); here, that its rows
    /// keep their sizes and times under this crate's names.
    #[test]
    fn rows_keep_sizes_and_times_relative_to_the_first() {
        let rows = parse_trace(
            "GeneratedTokens,TIMESTAMP,ContextTokens\n8,2023-11-16 18:17:04.5,3180\n10,2023-11-16 18:17:04.0,4808\n",
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].context_tokens, rows[0].generated_tokens, rows[0].at_s), (4808, 10, 0.0));
        assert_eq!((rows[1].context_tokens, rows[1].generated_tokens), (3180, 8));
        assert!((rows[1].at_s - 0.5).abs() < 1e-9, "{rows:?}");
        let e = format!("{:#}", parse_trace("a,b\n1,2\n").unwrap_err());
        assert!(e.contains("no `TIMESTAMP` column"), "{e}");
    }

    #[test]
    fn the_fixture_sample_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/azure_conv_sample.csv");
        let rows = load_trace(&path).unwrap();
        assert_eq!(rows.len(), 200);
        assert!(rows.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        assert!(rows.iter().all(|r| r.context_tokens > 0 && r.generated_tokens > 0));
    }
}
