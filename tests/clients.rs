//! The real binary served over HTTP and used by real clients: the official `openai`
//! Python client, curl with SSE, headless Chromium on the dashboard, and a graceful
//! stop on SIGTERM, and HTTPS (`server.tls`) to a client that trusts the test CA. Tools
//! that CI installs (`.ci/run`) are skipped with a printed reason where missing.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::http_support::{spawn_serve, ServeProcess};
use crate::tls_support::TestCerts;
use tempfile::TempDir;

const CONFIG: &str = "
models:
  - name: small
    preset: tiny
    seed: 1
  - name: large
    preset: tiny
    seed: 2
policy:
  name: random
  params: { p: 0.3 }
";

struct Server {
    process: ServeProcess,
    url: String,
    _dir: TempDir,
}

/// Starts `tokenrouter serve` on a free port with two tiny models; None without the
/// Qwen3 tokenizer (which CI fetches).
fn start() -> Option<Server> {
    start_with(CONFIG)
}

/// [`start`] with this configuration.
fn start_with(config_text: &str) -> Option<Server> {
    tokenrouter::core::assets::tokenizer_dir("qwen3")?;
    let assets = tokenrouter::core::assets::assets_dir();
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("serve.yaml");
    std::fs::write(&config, config_text).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenrouter"));
    command
        .args(["serve", "--config", config.to_str().unwrap(), "--port", "0"])
        .env("TOKENROUTER_CACHE", dir.path().join("cache"))
        .env("TOKENROUTER_ASSETS", &assets)
        .env("TOKENROUTER_THREADS", "2")
        .env("RUST_LOG", "warn");
    let process = spawn_serve(command, Duration::from_secs(120));
    let url = process.url.clone();
    Some(Server { process, url, _dir: dir })
}

/// The program `$var` (else `default`) when it runs. One `.ci/run` always installs follows the
/// asset rule (skip, or fail under TOKENROUTER_REQUIRE_ASSETS=1); others skip (curl, and
/// chromium, whose apt-get install `.ci/run` lets fail).
fn tool(var: &str, default: &str, ci_installs: bool) -> Option<String> {
    let path = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let found = Command::new(&path).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    match (found, ci_installs) {
        (true, _) => Some(path),
        (false, true) => tokenrouter::core::assets::missing(format_args!("{path} (set {var}; .ci/run installs it)")),
        (false, false) => {
            eprintln!("skipping: {path} not available (set {var})");
            None
        }
    }
}

/// Runs `examples/<script>` with a Python that has `modules` against a fresh server;
/// its stdout, or None where the test skips.
fn run_python_example(script: &str, modules: &str) -> Option<String> {
    let python = tool("TOKENROUTER_PYTHON", "python3", true)?;
    let import = format!("import {modules}");
    let has_modules = Command::new(&python).args(["-c", &import]).status().map(|s| s.success()).unwrap_or(false);
    if !has_modules {
        return tokenrouter::core::assets::missing(format_args!("the packages {modules} for {python}"));
    }
    let server = start()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(script);
    let out = Command::new(&python).arg(script).args(["--base-url", &format!("{}/v1", server.url)]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    Some(stdout)
}

#[test]
fn the_official_openai_client_streams_and_reads_usage() {
    let Some(stdout) = run_python_example("openai_client.py", "openai") else { return };
    assert!(stdout.contains("streamed") && stdout.contains("completion:"), "{stdout}");
}

/// Pydantic parsing, schemas validated by `jsonschema`, logit_bias, `n = 3` choices each
/// reproducible with its seed, and refusals by name,
/// on random weights through the routed pair.
#[test]
fn the_official_openai_client_gets_structured_outputs_and_refusals() {
    let Some(stdout) = run_python_example("structured_outputs.py", "openai, jsonschema") else { return };
    for line in ["parsed:", "validated 30 outputs", "logit_bias:", "n = 3: three choices", "refused by name:"] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
}

/// Tool calls forced on random weights: streamed and assembled, named, Pydantic-parsed,
/// and a call with its result sent back through the template.
#[test]
fn the_official_openai_client_gets_tool_calls() {
    let Some(stdout) = run_python_example("tool_calls.py", "openai, jsonschema") else { return };
    for line in ["streamed call:", "named call: get_time(", "round trip:", "parsed arguments: GetWeather("] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
}

/// The Messages API through Anthropic's own SDK: a message, a stream, a forced tool
/// call and its result sent back, the call streamed, count_tokens, a refusal by name.
#[test]
fn the_official_anthropic_client_gets_messages_streams_and_tool_use() {
    let Some(stdout) = run_python_example("anthropic_client.py", "anthropic") else { return };
    for line in [
        "message:",
        "count_tokens:",
        "streamed",
        "tool call: get_weather(",
        "round trip:",
        "streamed tool call:",
        "refused by name:",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
}

/// `responses.create`, `responses.stream`, `responses.parse` into a Pydantic model, a
/// function call round trip through `previous_response_id`, retrieve and delete.
#[test]
fn the_official_openai_client_speaks_the_responses_api() {
    let Some(stdout) = run_python_example("responses_client.py", "openai, pydantic") else { return };
    for line in [
        "response:",
        "streamed",
        "parsed: City(",
        "tool call: get_weather(",
        "round trip:",
        "input items:",
        "retrieved and deleted:",
        "refused by name:",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
}

#[test]
fn curl_example_streams_sse_with_routing_trace() {
    let Some(_) = tool("CURL", "curl", false) else { return };
    let Some(server) = start() else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/curl.sh");
    let out = Command::new("bash").arg(script).arg(&server.url).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("data: [DONE]"), "{stdout}");
    assert!(stdout.contains("\"routing\""), "the trace is in the chunks: {stdout}");
    assert!(stdout.contains("\"chat.completion\""), "{stdout}");
}

#[test]
fn dashboard_loads_in_headless_chromium_and_shows_both_models() {
    let Some(chromium) = tool("CHROMIUM", "chromium", false) else { return };
    let Some(curl) = tool("CURL", "curl", false) else { return };
    let Some(server) = start() else { return };
    // Under load, and long enough for the history to hold a few samples (one every 2 s).
    let body = r#"{"model": "small", "prompt": "load for the charts", "max_tokens": 400, "ignore_eos": true}"#;
    let mut load: Vec<Child> = (0..3)
        .map(|_| {
            Command::new(&curl)
                .args(["-s", "-o", "/dev/null", "-H", "Content-Type: application/json", "-d", body])
                .arg(format!("{}/v1/completions", server.url))
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(&curl).args(["-s", &format!("{}/v1/stats/history", server.url)]).output().unwrap();
        let history: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if history["samples"].as_array().is_some_and(|s| s.len() >= 3) {
            break;
        }
        assert!(Instant::now() < deadline, "no history: {history}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&out_dir).unwrap();
    let profile = TempDir::new().unwrap();
    let url = format!("{}/dashboard", server.url);
    let flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=4000",
        "--window-size=1300,700",
    ];
    let user_data = format!("--user-data-dir={}", profile.path().display());
    let dom = Command::new(&chromium).args(flags).arg(&user_data).arg("--dump-dom").arg(&url).output().unwrap();
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(html.contains("subserver small") && html.contains("subserver large"), "{html}");
    for chart in ["Throughput", "Time to first token", "Queue", "KV blocks: small", "KV blocks: large", "Restarts"] {
        assert!(html.contains(chart), "no {chart:?} chart: {html}");
    }
    assert!(html.contains("aria-label=\"actor tree\""), "no actor picture: {html}");
    let shot = out_dir.join("dashboard.png");
    let _ = Command::new(&chromium)
        .args(flags)
        .arg(&user_data)
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output();
    assert!(shot.is_file(), "no screenshot at {}", shot.display());
    for mut client in load.drain(..) {
        let _ = client.kill();
        let _ = client.wait();
    }
    eprintln!("dashboard screenshot: {}", shot.display());
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let Some(mut server) = start() else { return };
    let pid = server.process.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = server.process.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            return;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn with_server_tls_it_serves_https_and_plain_http_gets_no_answer() {
    let certs = match TestCerts::make() {
        Ok(certs) => certs,
        Err(e) => return tokenrouter::core::assets::missing(format_args!("test certificates ({e})")).unwrap_or(()),
    };
    let tls =
        format!("server:\n  tls: {{cert: \"{}\", key: \"{}\"}}\n", certs.path("node.pem"), certs.path("node.key"));
    let Some(server) = start_with(&format!("{CONFIG}{tls}")) else { return };
    let addr: std::net::SocketAddr = server.url.strip_prefix("https://").expect("an https:// URL").parse().unwrap();

    // Plain HTTP to the TLS port: the handshake fails, and no HTTP response comes back.
    let mut plain = std::net::TcpStream::connect(addr).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    plain.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/"), "plain HTTP was answered: {:?}", String::from_utf8_lossy(&answer));

    let body = r#"{"prompt": "Hello", "max_tokens": 4, "ignore_eos": true, "seed": 1}"#;
    let (status, response) = certs.https_request(addr, "POST", "/v1/completions", body).unwrap();
    assert_eq!(status, 200, "{response}");
    let completion: serde_json::Value = serde_json::from_str(&response).unwrap();
    assert_eq!(completion["usage"]["completion_tokens"], 4, "{completion}");
    assert!(completion["choices"][0]["text"].is_string(), "{completion}");
}
