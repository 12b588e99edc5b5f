//! `tokenrouter plan` end to end: the threshold table from given latencies, written
//! into a config that loads back, and planner inputs read off a running server.

use std::process::{Command, Output};

use crate::http_support::{chat, test_limits, TestServer};
use serde_json::Value;
use tempfile::TempDir;
use tokenrouter::config::ServerConfig;

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokenrouter")).arg("plan").args(args).output().expect("the binary runs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn plans_per_concurrency_and_writes_the_table_into_a_config() {
    let dir = TempDir::new().unwrap();
    let (json, config) = (dir.path().join("plan.json"), dir.path().join("pair.yaml"));
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo.yaml"), &config).unwrap();
    let out = plan(&[
        "--latency-ms",
        "6.0,27.9",
        "--route",
        "0.35",
        "--concurrency",
        "1..6",
        "--json",
        json.to_str().unwrap(),
        "--write-config",
        config.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let plans: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(plans.len(), 6);
    // One request: 1/p small steps per token of which the last is replaced by a large step.
    let one = plans[0]["best"]["prediction"]["tokens_per_sec"].as_f64().unwrap();
    assert!((one - 1e3 / (6.0 + 0.35 * 27.9)).abs() < 1e-6, "{one}");
    let mut previous = 0.0;
    for p in &plans {
        let tps = p["best"]["prediction"]["tokens_per_sec"].as_f64().unwrap();
        assert!(tps > previous, "more requests in flight never lower the best throughput: {plans:?}");
        previous = tps;
    }
    let loaded = ServerConfig::load(&config).unwrap();
    let rule = loaded.batching_rule().unwrap();
    for p in &plans {
        let n = p["n"].as_u64().unwrap() as usize;
        let best: Vec<usize> = serde_json::from_value(p["best"]["thresholds"].clone()).unwrap();
        assert_eq!(rule.effective(n), best, "N = {n}");
    }
}

/// `--exclusive`: models that take turns on shared compute. One request never runs on
/// both at once, so N = 1 is predicted as side by side; more requests are predicted slower.
#[test]
fn models_taking_turns_are_planned_slower_beyond_one_request() {
    let dir = TempDir::new().unwrap();
    let best = |exclusive: bool| -> Vec<f64> {
        let json = dir.path().join(format!("plan-{exclusive}.json"));
        let mut args = vec!["--latency-ms", "6.0,27.9", "--route", "0.35", "--concurrency", "1,4", "--json"];
        args.push(json.to_str().unwrap());
        if exclusive {
            args.push("--exclusive");
        }
        let out = plan(&args);
        assert!(out.status.success(), "{}", text(&out));
        let plans: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        plans.iter().map(|p| p["best"]["prediction"]["tokens_per_sec"].as_f64().unwrap()).collect()
    };
    let (side_by_side, turns) = (best(false), best(true));
    assert!((side_by_side[0] - turns[0]).abs() < 1e-9, "{side_by_side:?} vs {turns:?}");
    assert!(turns[1] < side_by_side[1] * 0.97, "{side_by_side:?} vs {turns:?}");
}

#[test]
fn bad_plan_inputs_are_refused_with_reasons() {
    for (args, reason) in [
        (vec!["--route", "0.3"], "give step latencies"),
        (vec!["--latency-ms", "6,20", "--route", "1.5"], "a probability is in [0, 1]"),
        (vec!["--latency-ms", "6,20,30", "--route", "0.3"], "--route describes two models"),
        (vec!["--latency-ms", "6,0", "--route", "0.3"], "latencies must be positive"),
        (vec!["--latency-ms", "6,20", "--route-matrix", "0.5,0.4;1,0"], "routing row 0 sums to"),
        (vec!["--latency-ms", "6,20", "--route", "0.3", "--concurrency", "0..3"], "--concurrency"),
        (vec!["--latency-table", "1:6 x", "--latency-table", "1:20", "--route", "0.3"], "batch:ms"),
    ] {
        let out = plan(&args);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(text(&out).contains(reason), "{args:?}: {}", text(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_from_a_running_servers_counters() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    for seed in 0..4 {
        let (status, body) = s.post_json("/v1/chat/completions", &chat("Count to ten", 40, seed)).await;
        assert_eq!(status, 200, "{body}");
    }
    let url = s.url.clone();
    let out =
        tokio::task::spawn_blocking(move || plan(&["--from-metrics", &url, "--concurrency", "1,2,4"])).await.unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let printed = text(&out);
    assert!(
        printed.contains("2 models") && printed.lines().filter(|l| l.trim_start().starts_with('4')).count() >= 1,
        "{printed}"
    );
    s.stop().await;
}
