//! Planner inputs read off a running server's `/v1/stats`.

use anyhow::{bail, Context};
use tokenrouter_core::sched::planner::{input_from_stats, PlannerInput};
use tokenrouter_core::sched::SubserverStats;

/// The server's model names and the planner input its counters imply since it started.
pub fn input_from_server(base: &str, max_batch: usize) -> anyhow::Result<(PlannerInput, Vec<String>)> {
    let url = stats_url(base);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let body: serde_json::Value = runtime.block_on(async {
        let response = reqwest::get(&url).await.with_context(|| format!("asking {url}"))?;
        if !response.status().is_success() {
            bail!("{url} answered {}", response.status());
        }
        response.json().await.with_context(|| format!("{url} did not answer JSON"))
    })?;
    let (names, stats) = parse_stats(&body).with_context(|| format!("reading {url}"))?;
    let input = input_from_stats(&stats, &[], 0, max_batch)?;
    Ok((input, names))
}

/// The planner input pooled over every point of a `tokenrouter sweep --check-plan`
/// JSON file, and the model names.
pub fn input_from_sweep(path: &std::path::Path, max_batch: usize) -> anyhow::Result<(PlannerInput, Vec<String>)> {
    let body = read_json(path)?;
    let points = body["points"].as_array().with_context(|| format!("{}: no `points` list", path.display()))?;
    let mut pooled: Vec<SubserverStats> = Vec::new();
    let mut names = Vec::new();
    for point in points {
        let (point_names, stats) = parse_stats(point).with_context(|| format!("a point of {}", path.display()))?;
        if pooled.is_empty() {
            (pooled, names) = (vec![SubserverStats::default(); stats.len()], point_names);
        }
        pooled.iter_mut().zip(&stats).for_each(|(sum, s)| *sum = sum.plus(s));
    }
    Ok((input_from_stats(&pooled, &[], 0, max_batch)?, names))
}

/// The planner input from saved `/v1/stats` answers of one server: one file (everything
/// since it started) or two (what it served between them), and the model names.
pub fn input_from_saved_stats(
    paths: &[std::path::PathBuf],
    max_batch: usize,
) -> anyhow::Result<(PlannerInput, Vec<String>)> {
    let read = |path: &std::path::PathBuf| {
        parse_stats(&read_json(path)?).with_context(|| format!("reading {}", path.display()))
    };
    let (names, stats) = match paths {
        [only] => read(only)?,
        [before, after] => {
            let ((names, earlier), (later_names, later)) = (read(before)?, read(after)?);
            if names != later_names {
                bail!("{} and {} are of different models", before.display(), after.display());
            }
            (names, later.iter().zip(&earlier).map(|(now, then)| now.since(then)).collect())
        }
        _ => bail!("--from-stats takes one file, or two (before, after); got {}", paths.len()),
    };
    Ok((input_from_stats(&stats, &[], 0, max_batch)?, names))
}

fn read_json(path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `http://host:port`, `.../metrics` or `.../v1/stats` all mean the same server.
fn stats_url(base: &str) -> String {
    let trimmed = base.trim_end_matches('/');
    let root = trimmed.strip_suffix("/metrics").or_else(|| trimmed.strip_suffix("/v1/stats")).unwrap_or(trimmed);
    format!("{root}/v1/stats")
}

fn parse_stats(body: &serde_json::Value) -> anyhow::Result<(Vec<String>, Vec<SubserverStats>)> {
    let models = body["models"].as_array().context("no `models` list")?;
    if models.is_empty() {
        bail!("the server reports no models");
    }
    models
        .iter()
        .map(|m| {
            let name = m["model"].as_str().context("a model without a name")?.to_string();
            let stats: SubserverStats =
                serde_json::from_value(m["stats"].clone()).with_context(|| format!("stats of {name}"))?;
            Ok((name, stats))
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(|pairs| pairs.into_iter().unzip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_the_server_reaches_its_stats() {
        for base in ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/metrics"] {
            assert_eq!(stats_url(base), "http://127.0.0.1:8000/v1/stats");
        }
    }

    #[test]
    fn stats_json_round_trips_into_planner_counts() {
        let small = SubserverStats { rows: 10, tokens_committed: 8, handoffs_to: vec![0, 2], ..Default::default() };
        let body = serde_json::json!({ "models": [
            { "model": "small", "stats": serde_json::to_value(&small).unwrap() },
            { "model": "large", "stats": serde_json::to_value(SubserverStats::default()).unwrap() },
        ]});
        let (names, stats) = parse_stats(&body).unwrap();
        assert_eq!(names, vec!["small", "large"]);
        assert_eq!(stats[0], small);
        assert!(parse_stats(&serde_json::json!({ "models": [] })).is_err());
    }

    /// A saved `/v1/stats` body of two models whose small one ran `rows` rows of one token
    /// in `rows` steps of 5 ms, delegating `delegated` of them.
    fn saved(dir: &std::path::Path, name: &str, rows: u64, delegated: u64) -> std::path::PathBuf {
        let mut small = SubserverStats { rows, tokens_committed: rows - delegated, ..Default::default() };
        small.handoffs_to = vec![0, delegated];
        for _ in 0..rows {
            small.record_step(1, 1, std::time::Duration::from_millis(5));
            small.steps += 1;
        }
        let mut large = SubserverStats { rows: delegated, tokens_committed: delegated, ..Default::default() };
        large.handoffs_to = vec![delegated, 0];
        for _ in 0..delegated {
            large.record_step(1, 10, std::time::Duration::from_millis(20));
            large.steps += 1;
        }
        let body = serde_json::json!({ "models": [
            { "model": "small", "stats": serde_json::to_value(&small).unwrap() },
            { "model": "large", "stats": serde_json::to_value(&large).unwrap() },
        ]});
        let path = dir.join(name);
        std::fs::write(&path, body.to_string()).unwrap();
        path
    }

    #[test]
    fn two_saved_stats_give_what_was_served_between_them() {
        let dir = tempfile::tempdir().unwrap();
        // 100 rows delegating 10%, then 400 more delegating 50%.
        let before = saved(dir.path(), "before.json", 100, 10);
        let after = saved(dir.path(), "after.json", 500, 210);
        let (input, names) = input_from_saved_stats(&[before.clone(), after.clone()], 64).unwrap();
        assert_eq!(names, vec!["small", "large"]);
        assert!((input.route[0][1] - 0.5).abs() < 1e-12, "{:?}", input.route);
        let (since_start, _) = input_from_saved_stats(&[after.clone()], 64).unwrap();
        assert!((since_start.route[0][1] - 0.42).abs() < 1e-12, "{:?}", since_start.route);
        let e = input_from_saved_stats(&[before.clone(), after.clone(), after], 64).unwrap_err();
        assert!(e.to_string().contains("one file, or two"), "{e}");
    }
}
