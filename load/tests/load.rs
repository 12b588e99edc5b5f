//! The load generator against our real server: the HTTP API on a random loopback
//! port in front of the engine on two tiny random models with the real Qwen3
//! tokenizer (the same helper as the server's own HTTP tests). Tests skip, saying
//! why, when the tokenizer is not available (`.ci/run` fetches it).

#[path = "../../tests/http_support/mod.rs"]
mod http_support;

use std::path::Path;
use std::process::Command;

use clap::Parser;
use http_support::{qwen3_tokenizer, test_limits, TestServer};
use tokenrouter_load::record::{RequestRecord, CSV_HEADER};
use tokenrouter_load::{execute, LoadArgs, Report};

const BIN: &str = env!("CARGO_BIN_EXE_tokenrouter-load");

fn load_args(url: &str, tokenizer: &Path, extra: &[&str]) -> LoadArgs {
    let mut argv = vec!["tokenrouter-load", "--url", url, "--quiet", "--tokenizer", tokenizer.to_str().unwrap()];
    argv.extend_from_slice(extra);
    LoadArgs::try_parse_from(argv).unwrap()
}

/// What every completed request must show: the cap reached (ignore_eos), the
/// server's usage equal to the tokens seen streaming, tokens per model adding up,
/// and the first token no later than the end.
fn assert_complete(r: &RequestRecord) {
    assert!(r.ok, "{r:?}");
    assert_eq!(r.output_tokens, r.max_tokens as u64, "{r:?}");
    assert_eq!(r.streamed_tokens, Some(r.output_tokens), "usage vs streamed trace: {r:?}");
    assert_eq!(r.tokens_per_model.values().sum::<u64>(), r.output_tokens, "{r:?}");
    let ttft = r.ttft_s.expect("a first token");
    assert!(ttft > 0.0 && ttft <= r.latency_s, "{r:?}");
    assert!((r.tokens_per_s - r.output_tokens as f64 / r.latency_s).abs() < 1e-9);
    assert_eq!(r.finish_reason.as_deref(), Some("length"));
}

fn assert_summary_matches(report: &Report, requests: usize) {
    let s = &report.summary;
    assert_eq!((s.requests_done, s.requests_failed), (requests, 0), "{:?}", s.failures);
    assert_eq!(report.requests.len(), requests);
    assert_eq!(s.output_tokens, report.requests.iter().map(|r| r.output_tokens).sum::<u64>());
    assert!((s.throughput_tok_s - s.output_tokens as f64 / s.elapsed_s).abs() < 1e-6);
    let (ttft, latency) = (s.ttft_s.unwrap(), s.latency_s.unwrap());
    assert!(ttft.p50 <= ttft.p90 && ttft.p90 <= ttft.p99 && ttft.p99 <= latency.p99, "{s:?}");
    assert_eq!(s.tokens_per_model.values().sum::<u64>(), s.output_tokens);
    let indices: Vec<usize> = report.requests.iter().map(|r| r.index).collect();
    assert_eq!(indices, (0..requests).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_through_the_binary_completes_every_request_and_writes_json_and_csv() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let tokenizer = qwen3_tokenizer().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (json_path, csv_path) = (dir.path().join("out/run.json"), dir.path().join("out/run.csv"));
    let mut command = Command::new(BIN);
    command.args(["--url", &s.url, "--workload", "low-effort", "--clients", "3", "--requests", "6"]);
    command.args(["--scale", "0.01", "--input-scale", "0.2", "--routing-trace", "--seed", "3", "--tokenizer"]);
    command.arg(&tokenizer).arg("--json").arg(&json_path).arg("--csv").arg(&csv_path);
    // The server runs on this test's runtime: wait for the child off its workers.
    let output = tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("requests: 6 done, 0 failed"), "{stdout}");
    assert!(stdout.contains("throughput:") && stdout.contains("TTFT:") && stdout.contains("per model:"), "{stdout}");
    assert!(stderr.contains("low-effort") && stderr.contains("closed loop, 3 client(s)"), "{stderr}");

    let report: Report = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_summary_matches(&report, 6);
    for r in &report.requests {
        assert_complete(r);
        assert_eq!((r.max_tokens, r.turn_tokens), (20, 20));
        assert!(r.prompt_tokens > r.turn_tokens as u64, "the chat template adds tokens: {r:?}");
    }
    assert_eq!(report.run.workload, "low-effort");
    assert!(report.run.served_models.contains(&"tokenrouter-test".to_string()), "{:?}", report.run.served_models);

    let csv = std::fs::read_to_string(&csv_path).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert_eq!(lines.len(), 7, "{csv}");
    let column = |name: &str| CSV_HEADER.split(',').position(|c| c == name).unwrap();
    for (line, r) in lines[1..].iter().zip(&report.requests) {
        let fields: Vec<&str> = line.split(',').collect();
        assert_eq!(fields.len(), 18, "{line}");
        assert_eq!(fields[column("output_tokens")].parse::<u64>().unwrap(), r.output_tokens);
        assert_eq!(fields[column("ok")], "true");
        let ttft: f64 = fields[column("ttft_s")].parse().unwrap();
        assert!(ttft <= fields[column("latency_s")].parse::<f64>().unwrap());
    }
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_poisson_sessions_grow_their_context_turn_by_turn() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let tokenizer = qwen3_tokenizer().unwrap();
    let extra = ["--workload", "agentic", "--rate", "20", "--requests", "6", "--turns", "2", "--scale", "0.02"];
    let mut args = load_args(&s.url, &tokenizer, &extra);
    args.routing_trace = true;
    let report = execute(&args, futures::future::pending()).await.unwrap();
    assert_summary_matches(&report, 6);
    assert!(report.run.load.starts_with("open loop, Poisson"), "{}", report.run.load);
    for r in &report.requests {
        assert_complete(r);
        assert_eq!(r.max_tokens, 20);
        assert_eq!(r.turn_tokens, if r.turn == 0 { 164 } else { 7 }, "{r:?}");
    }
    for job in 0..3 {
        let turns: Vec<&RequestRecord> = report.requests.iter().filter(|r| r.job == job).collect();
        assert_eq!(turns.len(), 2, "job {job}: {turns:?}");
        let (first, second) = if turns[0].turn == 0 { (turns[0], turns[1]) } else { (turns[1], turns[0]) };
        // The second turn resends the first, its answer and the new user turn.
        let grown = first.prompt_tokens + first.output_tokens + second.turn_tokens as u64;
        assert!(second.prompt_tokens >= grown, "{first:?}\n{second:?}");
        assert!(second.start_s >= first.start_s + first.latency_s - 1e-3, "turns run in order");
        assert_eq!(first.cached_tokens, 0, "a fresh server has nothing cached for a new session: {first:?}");
    }
    let by_turn = &report.summary.by_turn;
    assert_eq!(by_turn.iter().map(|t| (t.turn, t.requests)).collect::<Vec<_>>(), [(1, 3), (2, 3)]);
    assert!(by_turn.iter().all(|t| t.ttft_s.is_some()), "{by_turn:?}");
    // The second turn resends the first (whole 16-token blocks of it are cached).
    assert!(by_turn[1].mean_cached_tokens >= 16.0, "{by_turn:?}");
    assert!(by_turn[1].mean_prompt_tokens > by_turn[0].mean_prompt_tokens, "{by_turn:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_replay_sends_exact_prompt_sizes_at_the_trace_times() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let tokenizer = qwen3_tokenizer().unwrap();
    let extra = ["--workload", "trace", "--replay", "--time-scale", "20", "--requests", "8", "--scale", "0.05"];
    let mut args = load_args(&s.url, &tokenizer, &extra);
    args.endpoint = tokenrouter_load::client::Endpoint::Completions;
    args.routing_trace = true;
    let report = execute(&args, futures::future::pending()).await.unwrap();
    assert_summary_matches(&report, 8);
    let rows = tokenrouter_load::trace::load_trace(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/azure_conv_sample.csv"),
    )
    .unwrap();
    for r in &report.requests {
        assert_complete(r);
        let row = &rows[r.job as usize];
        let scaled = |n: u32| ((n as f64 * 0.05).round() as usize).max(1);
        assert_eq!((r.turn_tokens, r.max_tokens), (scaled(row.context_tokens), scaled(row.generated_tokens)));
        assert_eq!(r.prompt_tokens, r.turn_tokens as u64, "completions prompts are sized exactly: {r:?}");
        assert!(r.start_s + 0.05 >= row.at_s / 20.0, "sent before its time: {r:?} vs {row:?}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_limit_cuts_requests_still_running() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let tokenizer = qwen3_tokenizer().unwrap();
    // 500-token outputs on a 2-core machine outlast a 0.3 s run with no grace.
    let extra = ["--clients", "2", "--duration", "0.3", "--grace", "0", "--scale", "0.245"];
    let report = execute(&load_args(&s.url, &tokenizer, &extra), futures::future::pending()).await.unwrap();
    let summary = &report.summary;
    eprintln!("{}", summary.render());
    assert!(summary.elapsed_s < 2.0, "the run ends at its limit: {summary:?}");
    assert!(!report.requests.is_empty());
    assert!(report.requests.iter().all(|r| r.ok || r.error.as_deref().unwrap().starts_with("cut:")), "{summary:?}");
    assert_eq!(summary.requests_done + summary.requests_failed, report.requests.len());
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[test]
fn non_loopback_targets_are_refused_before_any_request() {
    let output = Command::new(BIN).args(["--url", "http://10.1.2.3:8000", "--requests", "1"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refusing target `http://10.1.2.3:8000`"), "{stderr}");
    assert!(stderr.contains("127.0.0.1, ::1 or localhost"), "{stderr}");
}

#[test]
fn a_server_that_is_not_there_is_a_clear_error() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let args = LoadArgs::try_parse_from(["tokenrouter-load", "--url", "http://127.0.0.1:1", "--quiet"]).unwrap();
    let e = runtime.block_on(execute(&args, futures::future::pending())).unwrap_err().to_string();
    assert!(e.contains("no server answers at http://127.0.0.1:1"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_with_hangups_and_faults_loses_nothing_and_leaves_the_server_clean() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let tokenizer = qwen3_tokenizer().unwrap();
    // The server runs in this process: its RSS is ours.
    let pid = std::process::id().to_string();
    let extra = [
        "--clients",
        "4",
        "--duration",
        "3",
        "--hangup-fraction",
        "0.5",
        "--scale",
        "0.02",
        "--routing-trace",
        "--fault-every",
        "1",
        "--fault-models",
        "small,large",
        "--leak-check",
        "--leak-wait",
        "20",
        "--server-pid",
        &pid,
    ];
    let report = execute(&load_args(&s.url, &tokenizer, &extra), futures::future::pending()).await.unwrap();
    let summary = &report.summary;
    eprintln!("{}", report.render());
    assert_eq!(summary.requests_lost, 0, "{:?}", summary.failures);
    assert!(summary.requests_hung_up > 0 && summary.requests_done > 0, "{summary:?}");
    assert_eq!(report.run.max_requests, 0, "a soak has no request limit");
    for r in report.requests.iter().filter(|r| r.hung_up) {
        assert!(r.output_tokens < r.max_tokens as u64, "hung up before the end: {r:?}");
    }
    for r in report.requests.iter().filter(|r| r.ok) {
        assert_complete(r);
    }
    let soak = report.soak.as_ref().expect("the soak's findings");
    let faults = soak.faults.as_ref().unwrap();
    assert!(faults.attempts >= 1, "{faults:?}");
    // 200 when the server injects faults, 404 when injection is off: nothing else.
    assert_eq!((faults.injected + faults.refused, faults.errors), (faults.attempts, 0), "{faults:?}");
    let leaks = soak.leak_check.as_ref().unwrap();
    assert!(leaks.idle && leaks.clean, "{leaks:?}");
    assert_eq!(leaks.models.iter().map(|m| m.model.as_str()).collect::<Vec<_>>(), ["small", "large"]);
    let rss = soak.rss.as_ref().unwrap();
    assert!(rss.samples.len() >= 2 && rss.growth_pct.is_some() && rss.error.is_none(), "{rss:?}");
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[test]
fn soak_flags_are_checked_before_any_request() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let run = |extra: &[&str]| {
        let mut argv = vec!["tokenrouter-load", "--url", "http://127.0.0.1:1", "--quiet"];
        argv.extend_from_slice(extra);
        let args = LoadArgs::try_parse_from(argv).map_err(|e| e.to_string())?;
        runtime.block_on(execute(&args, futures::future::pending())).map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(run(&["--hangup-fraction", "1.5"]).unwrap_err().contains("--hangup-fraction must be in 0..=1"));
    assert!(run(&["--fault-every", "5"]).unwrap_err().contains("--fault-models"), "clap asks for the models");
    assert!(run(&["--fault-every", "0", "--fault-models", "a"]).unwrap_err().contains("--fault-every must be"));
    assert!(run(&["--server-pid", "4000000000"]).unwrap_err().contains("--server-pid 4000000000"));
    let soak_replay = run(&["--workload", "trace", "--replay", "--duration", "5"]).unwrap_err();
    assert!(soak_replay.contains("--replay needs --requests"), "{soak_replay}");
}
