//! Request streams for the cost model and the simulator: arrival time and exact sizes
//! per request, from an Azure LLM inference trace (2023) CSV
//! (`TIMESTAMP,ContextTokens,GeneratedTokens`) or from a Poisson generator whose sizes
//! follow quantile tables.

use crate::rng::SplitMix64;

/// One request; `at_s` is seconds after the stream's start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    pub at_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

impl Arrival {
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens as usize + self.output_tokens as usize
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TraceError {
    #[error("the trace is empty")]
    Empty,
    #[error("no `{0}` column (expected TIMESTAMP,ContextTokens,GeneratedTokens)")]
    MissingColumn(&'static str),
    #[error("line {line}: {message}")]
    BadLine { line: usize, message: String },
    #[error("quantile table: {0}")]
    BadQuantiles(String),
}

/// Parses an Azure trace CSV (header required, columns in any order); rows come out
/// sorted by arrival, times relative to the first.
pub fn parse_azure_csv(text: &str) -> Result<Vec<Arrival>, TraceError> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines.next().ok_or(TraceError::Empty)?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let find = |name: &'static str| {
        columns.iter().position(|c| c.eq_ignore_ascii_case(name)).ok_or(TraceError::MissingColumn(name))
    };
    let (time, context, generated) = (find("TIMESTAMP")?, find("ContextTokens")?, find("GeneratedTokens")?);
    let mut rows = Vec::new();
    for (i, line) in lines {
        let bad = |message: String| TraceError::BadLine { line: i + 1, message };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |c: usize| fields.get(c).copied().ok_or_else(|| bad("too few columns".into()));
        let count = |c: usize| {
            let f = field(c)?;
            f.parse::<u32>().map_err(|_| bad(format!("`{f}` is not a token count")))
        };
        let at_s = timestamp_seconds(field(time)?)
            .ok_or_else(|| bad(format!("`{}` is not a timestamp like 2023-11-16 18:17:03.97", fields[time])))?;
        rows.push(Arrival { at_s, prompt_tokens: count(context)?, output_tokens: count(generated)? });
    }
    if rows.is_empty() {
        return Err(TraceError::Empty);
    }
    rows.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let first = rows[0].at_s;
    rows.iter_mut().for_each(|r| r.at_s -= first);
    Ok(rows)
}

/// `2023-11-16 18:17:03.9799600` as seconds since 1970 (only differences matter; days
/// count, so a trace that crosses midnight keeps its gaps).
fn timestamp_seconds(s: &str) -> Option<f64> {
    let (date, time) = s.split_once([' ', 'T'])?;
    let ymd: Vec<i64> = date.split('-').map(str::parse).collect::<Result<_, _>>().ok()?;
    let hms: Vec<f64> = time.split(':').map(str::parse).collect::<Result<_, _>>().ok()?;
    let (&[y, m, d], &[h, min, sec]) = (&ymd[..], &hms[..]) else { return None };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Days since 1970-01-01 of a Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3_600.0 + min * 60.0 + sec)
}

/// A distribution given by quantiles, sampled by linear interpolation between them:
/// `[(0.0, 10), (0.5, 900), (0.99, 4000), (1.0, 8000)]`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantileTable {
    points: Vec<(f64, f64)>,
}

impl QuantileTable {
    /// Needs quantiles from 0 to 1, both increasing, values ≥ 1.
    pub fn new(points: Vec<(f64, f64)>) -> Result<Self, TraceError> {
        let bad = |m: &str| Err(TraceError::BadQuantiles(m.to_string()));
        if points.len() < 2 || points[0].0 != 0.0 || points[points.len() - 1].0 != 1.0 {
            return bad("give at least the 0 and 1 quantiles");
        }
        if points.windows(2).any(|w| w[1].0 <= w[0].0 || w[1].1 < w[0].1) {
            return bad("quantiles and values must increase");
        }
        if points[0].1 < 1.0 {
            return bad("values must be at least 1 token");
        }
        Ok(QuantileTable { points })
    }

    /// The value at quantile `u` in [0, 1].
    pub fn at(&self, u: f64) -> f64 {
        let i = self.points.partition_point(|p| p.0 < u).clamp(1, self.points.len() - 1);
        let ((q0, v0), (q1, v1)) = (self.points[i - 1], self.points[i]);
        v0 + (v1 - v0) * ((u - q0) / (q1 - q0)).clamp(0.0, 1.0)
    }

    /// The quantile table of observed values (for replaying a trace's sizes at another rate).
    pub fn from_samples(mut values: Vec<f64>, quantiles: &[f64]) -> Result<Self, TraceError> {
        if values.is_empty() {
            return Err(TraceError::Empty);
        }
        values.sort_by(f64::total_cmp);
        let pick = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize].max(1.0);
        let mut points: Vec<(f64, f64)> = Vec::new();
        for &q in [0.0].iter().chain(quantiles).chain(&[1.0]) {
            if points.last().is_none_or(|p| p.0 < q) {
                points.push((q, pick(q).max(points.last().map_or(0.0, |p| p.1))));
            }
        }
        QuantileTable::new(points)
    }
}

/// A stationary Poisson stream of `count` requests at `rate` per second, prompt and
/// output sizes drawn independently from their tables.
pub fn poisson_stream(
    rate: f64,
    count: usize,
    prompt: &QuantileTable,
    output: &QuantileTable,
    seed: u64,
) -> Vec<Arrival> {
    let mut rng = SplitMix64(seed);
    let mut at_s = 0.0;
    (0..count)
        .map(|_| {
            at_s += -rng.open_unit().ln() / rate;
            let prompt_tokens = prompt.at(rng.open_unit()).round() as u32;
            let output_tokens = output.at(rng.open_unit()).round() as u32;
            Arrival { at_s, prompt_tokens, output_tokens }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_rows_parse_sorted_and_relative() {
        let rows = parse_azure_csv(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:17:04.0319600,3180,8\n\
             2023-11-16 18:17:03.9799600,4808,10\n\
             2023-11-17 00:00:00.5,110,27\n",
        )
        .unwrap();
        assert_eq!((rows[0].prompt_tokens, rows[0].output_tokens, rows[0].at_s), (4808, 10, 0.0));
        assert!((rows[1].at_s - 0.052).abs() < 1e-6);
        let to_midnight = 6.0 * 3600.0 - (17.0 * 60.0 + 3.97996) + 0.5;
        assert!((rows[2].at_s - to_midnight).abs() < 1e-6, "{rows:?}");
        assert!(matches!(parse_azure_csv("a,b\n1,2\n"), Err(TraceError::MissingColumn("TIMESTAMP"))));
        let bad = parse_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 0:0:0,x,2\n");
        assert!(matches!(bad, Err(TraceError::BadLine { line: 2, .. })));
    }

    #[test]
    fn column_order_is_free_and_errors_say_where() {
        let rows = parse_azure_csv("GeneratedTokens,TIMESTAMP,ContextTokens\n5,2023-01-01 00:00:00,7\n").unwrap();
        assert_eq!((rows[0].prompt_tokens, rows[0].output_tokens), (7, 5));
        let e = parse_azure_csv("a,b\n1,2\n").unwrap_err().to_string();
        assert!(e.contains("no `TIMESTAMP` column"), "{e}");
        let e = parse_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,2\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("not a timestamp"), "{e}");
        let e = parse_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 0:0:0,-1,2\n").unwrap_err();
        assert!(e.to_string().contains("not a token count"), "{e}");
        assert!(parse_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n").is_err());
    }

    #[test]
    fn the_fixture_sample_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../load/fixtures/azure_conv_sample.csv");
        let rows = parse_azure_csv(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(rows.len(), 200);
    }

    #[test]
    fn quantile_tables_interpolate_and_poisson_streams_keep_their_rate() {
        let t = QuantileTable::new(vec![(0.0, 10.0), (0.5, 100.0), (1.0, 1000.0)]).unwrap();
        assert_eq!((t.at(0.0), t.at(0.25), t.at(0.5), t.at(0.75), t.at(1.0)), (10.0, 55.0, 100.0, 550.0, 1000.0));
        assert!(QuantileTable::new(vec![(0.0, 5.0), (0.5, 4.0), (1.0, 9.0)]).is_err());
        let stream = poisson_stream(20.0, 20_000, &t, &t, 1);
        let rate = stream.len() as f64 / stream.last().unwrap().at_s;
        assert!((rate - 20.0).abs() < 0.5, "rate {rate}");
        let below = stream.iter().filter(|a| a.prompt_tokens <= 100).count() as f64 / stream.len() as f64;
        assert!((below - 0.5).abs() < 0.02, "median share {below}");
        let back = QuantileTable::from_samples(stream.iter().map(|a| a.prompt_tokens as f64).collect(), &[0.5]);
        assert!((back.unwrap().at(0.5) - 100.0).abs() < 3.0);
    }
}
