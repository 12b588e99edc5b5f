//! `tokenrouter chat --prompt` end to end: the binary against a server on loopback (two
//! tiny random models with the real Qwen3 tokenizer), reading the streamed answer, the
//! per-token models and the large model's share.

use std::process::Command;

use crate::http_support::*;
use serde_json::json;

/// Runs `tokenrouter chat ARGS` off the async runtime; returns (success, stdout, stderr).
async fn chat(args: Vec<String>) -> (bool, String, String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tokenrouter"))
            .arg("chat")
            .args(&args)
            .env("TOKENROUTER_THREADS", "1")
            .output()
            .expect("the binary runs")
    })
    .await
    .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn args(url: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--url", url, "--prompt", "Say hi", "--no-color", "--max-tokens", "12"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// "large-model share: 75.0% (large wrote 6 of 8 tokens; finish: stop)" → (6, 8, finish).
fn parse_summary(stdout: &str) -> (u64, u64, String) {
    let line = stdout.lines().find(|l| l.starts_with("large-model share: ")).unwrap_or_else(|| panic!("{stdout}"));
    let inner = line.split_once('(').unwrap().1.trim_end_matches(')');
    let (counts, finish) = inner.split_once("; finish: ").unwrap();
    let words: Vec<&str> = counts.split_whitespace().collect();
    assert_eq!(words[0], "large", "{line}");
    (words[2].parse().unwrap(), words[4].parse().unwrap(), finish.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_prompt_shows_the_answer_and_the_large_models_share() {
    let Some(server) = TestServer::start(test_limits(), Vec::new()).await else { return };
    let (ok, stdout, stderr) = chat(args(&server.url, &[])).await;
    assert!(ok, "{stdout}\n{stderr}");
    let (large, total, finish) = parse_summary(&stdout);
    let answer = stdout.lines().next().unwrap();
    // Random weights rarely stop: 12 tokens, ended by length (or sooner by EOS).
    assert!((1..=12).contains(&total) && large <= total, "{stdout}");
    assert!(finish == "length" || finish == "stop", "{stdout}");
    assert!(!answer.trim().is_empty(), "no answer text: {stdout}");
    // Runs written by the large model are marked; with p = 0.5 over 12 tokens the large
    // model writes some, and its marker appears exactly when it did.
    assert_eq!(answer.contains("[large: "), large > 0, "{stdout}");
    let percent = 100.0 * large as f64 / total as f64;
    assert!(stdout.contains(&format!("large-model share: {percent:.1}%")), "{stdout}");
    server.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_routes_everything_to_the_large_model_shows_a_full_share() {
    let policy = ("always", json!({ "model": "large" }));
    let server = TestServer::start_models(
        &["small", "large"],
        11,
        policy,
        test_limits(),
        Vec::new(),
        futures::future::pending(),
    )
    .await;
    let Some(server) = server else { return };
    let (ok, stdout, stderr) = chat(args(&server.url, &[])).await;
    assert!(ok, "{stdout}\n{stderr}");
    let (large, total, _) = parse_summary(&stdout);
    assert_eq!(large, total, "{stdout}");
    assert!(stdout.contains("large-model share: 100.0%"), "{stdout}");
    // The whole answer is one marked run.
    let answer = stdout.lines().next().unwrap();
    assert!(answer.starts_with("[large: ") && answer.ends_with(']'), "{answer:?}");
    server.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_sends_the_api_key_and_says_why_a_server_refuses() {
    let Some(server) = TestServer::start(test_limits(), vec!["sk-chat".into()]).await else { return };
    let (ok, stdout, stderr) = chat(args(&server.url, &["--api-key", "sk-chat"])).await;
    assert!(ok, "{stdout}\n{stderr}");
    parse_summary(&stdout);
    let (ok, _, stderr) = chat(args(&server.url, &[])).await;
    assert!(!ok);
    assert!(stderr.contains("HTTP 401"), "{stderr}");
    server.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_without_a_server_says_so() {
    let (ok, _, stderr) = chat(args("http://127.0.0.1:9", &[])).await;
    assert!(!ok);
    assert!(stderr.contains("cannot reach http://127.0.0.1:9"), "{stderr}");
}
