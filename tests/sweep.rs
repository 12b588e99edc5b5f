//! `tokenrouter sweep` end to end on two tiny random models: the engine really runs
//! each feasible (N, B) point, and the CSV and PNG hold what it measured.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use tempfile::TempDir;

const P: f64 = 0.25;

fn tokenrouter(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenrouter"))
        .args(args)
        .env("TOKENROUTER_THREADS", "2")
        .output()
        .expect("the binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "tokenrouter {args:?} failed:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

fn tiny_model(dir: &Path, name: &str, seed: &str) -> String {
    let out = dir.join(name);
    tokenrouter(&["model", "init", "--preset", "tiny", "--seed", seed, "--out", out.to_str().unwrap()]);
    format!("{name}={}", out.display())
}

/// The CSV as rows of column name → cell (no cell here holds a quote inside).
fn read_csv(path: &Path) -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().map(split_csv);
    let header = lines.next().expect("a header");
    lines.map(|cells| header.iter().cloned().zip(cells).collect()).collect()
}

fn split_csv(line: &str) -> Vec<String> {
    let (mut cells, mut cell, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => cells.push(std::mem::take(&mut cell)),
            _ => cell.push(c),
        }
    }
    cells.push(cell);
    cells
}

fn number(row: &HashMap<String, String>, column: &str) -> f64 {
    row[column].parse().unwrap_or_else(|_| panic!("{column} = {:?} is not a number", row[column]))
}

#[test]
fn sweep_measures_every_feasible_point_and_writes_csv_and_chart() {
    let dir = TempDir::new().unwrap();
    let small = tiny_model(dir.path(), "small", "3");
    let large = tiny_model(dir.path(), "large", "4");
    let (csv, chart) = (dir.path().join("sweep.csv"), dir.path().join("sweep.png"));
    let check = dir.path().join("check.json");
    let p = P.to_string();
    let stdout = tokenrouter(&[
        "sweep",
        "--model",
        &small,
        "--model",
        &large,
        "--p",
        &p,
        "--concurrency",
        "2,3",
        "--grid",
        "1,2:1,2",
        "--prompt",
        "8",
        "--output",
        "24",
        "--warmup-s",
        "0.2",
        "--measure-s",
        "0.8",
        "--kv-mib",
        "64",
        "--csv",
        csv.to_str().unwrap(),
        "--chart",
        chart.to_str().unwrap(),
        "--check-plan",
        "--check-rounds",
        "2",
        "--check-json",
        check.to_str().unwrap(),
    ]);
    assert!(stdout.contains("tok/s") && stdout.contains("wrote"), "{stdout}");

    let rows = read_csv(&csv);
    let points: BTreeSet<(usize, String)> =
        rows.iter().map(|r| (number(r, "concurrency") as usize, r["thresholds"].clone())).collect();
    // (2,2) at N = 2 would break Σ(B_i − 1) < N and is left out.
    let expected: BTreeSet<(usize, String)> =
        [(2, "1,1"), (2, "1,2"), (2, "2,1"), (3, "1,1"), (3, "1,2"), (3, "2,1"), (3, "2,2")]
            .iter()
            .map(|(n, b)| (*n, b.to_string()))
            .collect();
    // The planner's picks join the grid's points when the grid lacked them.
    let outcome: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&check).unwrap()).unwrap();
    let checks = outcome["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2, "one check per N: {outcome}");
    let mut allowed = expected.clone();
    for c in checks {
        let n = c["concurrency"].as_u64().unwrap() as usize;
        let chosen: Vec<usize> = serde_json::from_value(c["chosen"].clone()).unwrap();
        assert!(chosen.iter().map(|b| b - 1).sum::<usize>() < n, "infeasible pick {chosen:?} at N={n}");
        let (measured, best) =
            (c["measured_tokens_per_sec"].as_f64().unwrap(), c["best_measured_tokens_per_sec"].as_f64().unwrap());
        assert!(measured > 0.0 && best > 0.0 && c["predicted_tokens_per_sec"].as_f64().unwrap() > 0.0, "{c}");
        // A pick other than the grid's best is measured again beside it.
        let rounds = c["confirm_rounds"].as_u64().unwrap();
        assert_eq!(rounds == 0, c["chosen"] == c["best_thresholds"], "{c}");
        if rounds > 0 {
            assert_eq!(rounds, 2, "--check-rounds 2: {c}");
            // The two means are those of the rounds reported beside them.
            for (figures, mean) in [("measured_rounds", measured), ("best_rounds", best)] {
                let each: Vec<f64> = serde_json::from_value(c[figures].clone()).unwrap();
                assert_eq!(each.len(), 2, "{c}");
                assert!((each.iter().sum::<f64>() / 2.0 - mean).abs() < 1e-9, "{c}");
            }
        }
        let label = chosen.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
        assert!(stdout.contains(&label), "{stdout}");
        allowed.insert((n, label));
    }
    assert!(expected.is_subset(&points) && points.is_subset(&allowed), "{points:?}");
    assert_eq!(rows.len(), points.len());

    for r in &rows {
        let n = number(r, "concurrency");
        assert!(number(r, "tokens_per_sec") > 0.0, "{r:?}");
        assert!(number(r, "small_steps") > 0.0 && number(r, "large_steps") > 0.0, "both models step: {r:?}");
        for m in ["small", "large"] {
            let batch = number(r, &format!("{m}_rows_per_step"));
            assert!((1.0..=n).contains(&batch), "{m} mean batch {batch} outside 1..={n}: {r:?}");
        }
        // Random routing delegates a position with probability p.
        let routed = number(r, "small_handoffs_per_row");
        assert!((routed - P).abs() < 0.15, "observed routing rate {routed} vs p = {P}: {r:?}");
        let predicted = number(r, "predicted_tokens_per_sec");
        assert!(predicted.is_finite() && predicted > 0.0, "{r:?}");
    }

    let png = std::fs::read(&chart).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000, "not a PNG: {} bytes", png.len());
}
