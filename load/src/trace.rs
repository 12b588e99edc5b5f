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

/// Parses the CSV (header required, columns in any order). Rows are sorted by
/// arrival, so replay can walk them in order.
pub fn parse_trace(text: &str) -> anyhow::Result<Vec<TraceRow>> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines.next().context("the trace is empty")?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let find = |name: &str| {
        columns.iter().position(|c| c.eq_ignore_ascii_case(name)).with_context(|| {
            format!("no `{name}` column (expected TIMESTAMP,ContextTokens,GeneratedTokens; got `{header}`)")
        })
    };
    let (time, context, generated) = (find("TIMESTAMP")?, find("ContextTokens")?, find("GeneratedTokens")?);
    let mut rows = Vec::new();
    for (i, line) in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |c: usize| fields.get(c).copied().with_context(|| format!("line {}: too few columns", i + 1));
        let number = |c: usize| -> anyhow::Result<u32> {
            let f = field(c)?;
            f.parse().with_context(|| format!("line {}: `{f}` is not a token count", i + 1))
        };
        let at = field(time).and_then(|f| timestamp_seconds(f).with_context(|| format!("line {}", i + 1)))?;
        rows.push(TraceRow { at_s: at, context_tokens: number(context)?, generated_tokens: number(generated)? });
    }
    anyhow::ensure!(!rows.is_empty(), "the trace has a header but no rows");
    rows.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let first = rows[0].at_s;
    for row in &mut rows {
        row.at_s -= first;
    }
    Ok(rows)
}

/// `2023-11-16 18:17:03.9799600` as seconds since 1970 (UTC; only differences matter).
fn timestamp_seconds(s: &str) -> anyhow::Result<f64> {
    let bad = || anyhow::anyhow!("`{s}` is not a timestamp like 2023-11-16 18:17:03.97");
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(bad)?;
    let ymd: Vec<i64> = date.split('-').map(str::parse).collect::<Result<_, _>>().map_err(|_| bad())?;
    let hms: Vec<f64> = time.split(':').map(str::parse).collect::<Result<_, _>>().map_err(|_| bad())?;
    let (&[y, m, d], &[h, min, sec]) = (&ymd[..], &hms[..]) else { return Err(bad()) };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    Ok(days_from_civil(y, m, d) as f64 * 86_400.0 + h * 3_600.0 + min * 60.0 + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm),
/// so a trace that crosses midnight or a month end keeps its gaps.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse_with_times_relative_to_the_first() {
        let rows = parse_trace(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:17:04.0319600,3180,8\n\
             2023-11-16 18:17:03.9799600,4808,10\n\
             2023-11-17 00:00:00.5,110,27\n",
        )
        .unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!((rows[0].context_tokens, rows[0].generated_tokens, rows[0].at_s), (4808, 10, 0.0));
        assert!((rows[1].at_s - 0.052).abs() < 1e-6, "{rows:?}");
        let to_midnight = 6.0 * 3600.0 - (17.0 * 60.0 + 3.97996) + 0.5;
        assert!((rows[2].at_s - to_midnight).abs() < 1e-6, "crossing midnight: {rows:?}");
    }

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2023, 11, 16), 19_677);
    }

    #[test]
    fn column_order_is_free_and_errors_say_where() {
        let rows = parse_trace("GeneratedTokens,TIMESTAMP,ContextTokens\n5,2023-01-01 00:00:00,7\n").unwrap();
        assert_eq!((rows[0].context_tokens, rows[0].generated_tokens), (7, 5));
        let e = format!("{:#}", parse_trace("a,b\n1,2\n").unwrap_err());
        assert!(e.contains("no `TIMESTAMP` column"), "{e}");
        let e = format!("{:#}", parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,2\n").unwrap_err());
        assert!(e.contains("line 2") && e.contains("not a timestamp"), "{e}");
        let e = format!(
            "{:#}",
            parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 0:0:0,-1,2\n").unwrap_err()
        );
        assert!(e.contains("not a token count"), "{e}");
        assert!(parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n").is_err());
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
