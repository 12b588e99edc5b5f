//! Speculative decoding through the server on the real SmolLM2-135M-Instruct, on the
//! candle and the llama.cpp backend: an edit of code the prompt quotes comes out the
//! same with and without drafts (greedy and seeded sampling), `speculative: ngram` and
//! a `prediction` keep drafted tokens, usage reports them as OpenAI does, and the trace
//! marks them. On llama.cpp, whose kernels are not batch-invariant, a drafted run may
//! leave the plain one only where the plain run's top two choices were a near-tie.
//! Without the asset these skip and say so (they fail under
//! TOKENROUTER_REQUIRE_ASSETS=1, as in CI).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::http_support::{spawn_serve, ServeProcess, Setup, TestServer};

const EDIT: &str = "Here is a Python function:\n\n```python\ndef total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price * item.quantity\n    return subtotal * (1 + tax_rate)\n```\n\nRepeat the function exactly, renamed to compute_total.";

/// The server pins a card-like step cost (a guess costs little beside a step), so how
/// many guesses are drafted does not depend on this machine's load.
fn serve(gguf: &Path, backend: &str, dir: &Path) -> ServeProcess {
    let config = dir.join(format!("{backend}.yaml"));
    let yaml = format!(
        "models:\n  - name: smollm2\n    path: {}\n    backend: {backend}\n    max_context: 2048\nscheduler:\n  startup_profile: false\n  speculative: {{step_cost: {{fixed_ms: 10, per_token_ms: 0.05}}}}\n",
        gguf.display()
    );
    std::fs::write(&config, yaml).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenrouter"));
    command.env("TOKENROUTER_CACHE", dir.join("cache")).env("TOKENROUTER_OFFLINE", "1").env("TOKENROUTER_THREADS", "2");
    command
        .args(["serve", "--config", config.to_str().unwrap(), "--port", "0", "--no-warm-up"])
        .stderr(Stdio::inherit());
    spawn_serve(command, Duration::from_secs(300))
}

fn chat(url: &str, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{ "role": "user", "content": EDIT }],
        "temperature": 0,
        "max_tokens": 90,
        "routing": { "trace": true },
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (status, value) = post(url, &body);
    assert_eq!(status, 200, "{value}");
    value
}

fn post(url: &str, body: &Value) -> (u16, Value) {
    post_path(url, "/v1/chat/completions", body)
}

/// A 200 answer from another route.
fn post_to(url: &str, path: &str, body: &Value) -> Value {
    let (status, value) = post_path(url, path, body);
    assert_eq!(status, 200, "{path}: {value}");
    value
}

fn post_path(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(format!("{url}{path}"))
            .timeout(Duration::from_secs(300))
            .json(body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    })
}

fn text(response: &Value) -> &str {
    response["choices"][0]["message"]["content"].as_str().unwrap()
}

fn drafted_marks(response: &Value) -> usize {
    let marks = response["choices"][0]["routing_drafted"].as_array().expect("a speculating trace marks drafts");
    marks.iter().filter(|m| m.as_bool() == Some(true)).count()
}

/// Where a drafted run's text leaves the plain run's, the plain run's top two choices at
/// that token were this close (logprob nats) or closer: llama.cpp's kernels are not
/// batch-invariant (a verify step's logits stay within 2e-2 of one-by-one decoding,
/// core/tests/llamacpp.rs), so a near-tie may fall either way. Candle's are, and its
/// outputs must match exactly.
const LLAMACPP_NEAR_TIE: f64 = 0.25;

/// `got` equals `want` on candle; on llama.cpp it may leave it only at a near-tie of
/// `plain` (which asked for `top_logprobs: 2`).
fn assert_same_output(backend: &str, what: &str, got: &str, want: &str, plain: &Value) {
    if backend == "candle" || got == want {
        assert_eq!(got, want, "{backend}: {what}");
        return;
    }
    let diverges_at = got.bytes().zip(want.bytes()).take_while(|(a, b)| a == b).count();
    let tokens = plain["choices"][0]["logprobs"]["content"].as_array().expect("the plain run's logprobs");
    let mut end = 0;
    let token = tokens
        .iter()
        .find(|t| {
            end += t["bytes"].as_array().map_or(0, Vec::len);
            end > diverges_at
        })
        .unwrap_or_else(|| panic!("{backend}: {what}: no token at byte {diverges_at}"));
    let top = token["top_logprobs"].as_array().unwrap();
    let margin = top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap();
    assert!(
        margin <= LLAMACPP_NEAR_TIE,
        "{backend}: {what} leaves the plain output at byte {diverges_at} ({token}), where its top two choices \
         were {margin:.3} apart:\n got: {got:?}\nwant: {want:?}"
    );
    eprintln!("{backend}: {what} leaves the plain output at byte {diverges_at}, a near-tie ({margin:.3} nats)");
}

#[test]
fn drafts_change_nothing_of_the_output_on_both_backends_and_are_reported() {
    let Some(gguf) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let dir = TempDir::new().unwrap();
    for backend in ["candle", "llamacpp"] {
        if backend == "llamacpp" && !cfg!(feature = "llamacpp") {
            eprintln!("llamacpp: not in this build (--features llamacpp)");
            continue;
        }
        let server = serve(&gguf, backend, dir.path());
        let plain = chat(&server.url, json!({ "logprobs": true, "top_logprobs": 2 }));
        let want = text(&plain).to_string();
        eprintln!("{backend}: {want:?}");
        assert!(want.contains("compute_total"), "{want}");
        assert_eq!(plain["usage"]["speculation"]["drafted_tokens"], 0);
        assert!(plain["choices"][0].get("routing_drafted").is_none(), "no draft marks without speculation");

        let ngram = chat(&server.url, json!({ "speculative": { "method": "ngram", "max_tokens": 8 } }));
        assert_same_output(backend, "ngram drafts", text(&ngram), &want, &plain);
        let usage = &ngram["usage"];
        let accepted = usage["speculation"]["accepted_tokens"].as_u64().unwrap();
        assert!(accepted >= 10, "{backend}: quoting the prompt keeps drafts: {usage}");
        assert_eq!(drafted_marks(&ngram), accepted as usize, "{backend}: the trace marks each kept draft token");

        let suffix = chat(&server.url, json!({ "speculative": { "method": "suffix" } }));
        assert_same_output(backend, "suffix drafts", text(&suffix), &want, &plain);
        let usage = &suffix["usage"]["speculation"];
        assert!(usage["accepted_tokens"].as_u64().unwrap() >= 10, "{backend}: suffix drafts are kept: {usage}");

        // The agents' routes take the same extension and report it the same way.
        let responses = post_to(
            &server.url,
            "/v1/responses",
            &json!({ "input": EDIT, "temperature": 0, "max_output_tokens": 90, "store": false,
                     "speculative": { "method": "suffix" } }),
        );
        let responses_text = responses["output"][0]["content"][0]["text"].as_str().unwrap_or_default();
        assert_same_output(backend, "Responses with suffix drafts", responses_text, &want, &plain);
        let usage = &responses["usage"]["speculation"];
        assert!(usage["accepted_tokens"].as_u64().unwrap() >= 10, "{backend}: Responses: {usage}");
        let messages = post_to(
            &server.url,
            "/v1/messages",
            &json!({ "model": "smollm2", "messages": [{ "role": "user", "content": EDIT }], "temperature": 0,
                     "max_tokens": 90, "speculative": { "method": "suffix" } }),
        );
        let messages_text = messages["content"][0]["text"].as_str().unwrap_or_default();
        assert_same_output(backend, "Messages with suffix drafts", messages_text, &want, &plain);
        let usage = &messages["usage"]["speculation"];
        assert!(usage["accepted_tokens"].as_u64().unwrap() >= 10, "{backend}: Messages: {usage}");

        let predicted = chat(&server.url, json!({ "prediction": { "type": "content", "content": want } }));
        assert_same_output(backend, "a right prediction", text(&predicted), &want, &plain);
        let details = &predicted["usage"]["completion_tokens_details"];
        let completion = predicted["usage"]["completion_tokens"].as_u64().unwrap();
        let kept = details["accepted_prediction_tokens"].as_u64().unwrap();
        // Only past a llama.cpp near-tie (above) does a right prediction stop being right.
        if text(&predicted) == want {
            assert_eq!(details["rejected_prediction_tokens"], 0, "{backend}: {details}");
        }
        assert!(kept * 10 >= completion * 7, "{backend}: a right prediction is kept: {details} of {completion}");

        // A grammar: the output is the constrained one with or without drafts, a right
        // prediction is kept, and a prediction the grammar forbids is never drafted.
        let json_only = json!({ "response_format": { "type": "json_object" }, "max_tokens": 40,
                                "logprobs": true, "top_logprobs": 2 });
        let plain_json = chat(&server.url, json_only.clone());
        let want_json = text(&plain_json).to_string();
        let mut right = json_only.clone();
        right["prediction"] = json!({ "type": "content", "content": want_json });
        let right = chat(&server.url, right);
        assert_same_output(backend, "a grammar and a right prediction", text(&right), &want_json, &plain_json);
        let details = &right["usage"]["completion_tokens_details"];
        assert!(details["accepted_prediction_tokens"].as_u64().unwrap() >= 10, "{backend}: {details}");
        let mut forbidden = json_only.clone();
        forbidden["prediction"] = json!({ "type": "content", "content": "Sure" });
        let forbidden = chat(&server.url, forbidden);
        assert_same_output(backend, "a grammar and a wrong prediction", text(&forbidden), &want_json, &plain_json);
        assert_eq!(forbidden["usage"]["speculation"]["drafted_tokens"], 0, "{backend}: the grammar cuts every guess");

        let wrong = chat(&server.url, json!({ "prediction": { "type": "content", "content": "SELECT * FROM t;" } }));
        assert_same_output(backend, "a wrong prediction", text(&wrong), &want, &plain);

        // llama.cpp sums a many-token step in another order than a one-token step, so a
        // verify step's logits differ from plain decoding's by float noise, which may tip
        // a sampled draw; candle's kernels give every row the same sums either way.
        if backend == "candle" {
            let sampled = json!({ "temperature": 0.8, "seed": 11 });
            let mut with_drafts = sampled.clone();
            with_drafts["speculative"] = json!({ "method": "ngram" });
            assert_eq!(text(&chat(&server.url, with_drafts)), text(&chat(&server.url, sampled)), "seeded sampling");
        }
    }
}

#[test]
fn bad_speculative_fields_are_refused_by_name() {
    let Some(gguf) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let dir = TempDir::new().unwrap();
    let server = serve(&gguf, "candle", dir.path());
    for (extra, param) in [
        (json!({ "speculative": { "method": "medusa" } }), "speculative.method"),
        (json!({ "speculative": { "method": "draft" } }), "speculative.method"),
        (json!({ "speculative": { "method": "ngram", "max_tokens": 0 } }), "speculative.max_tokens"),
        (json!({ "speculative": { "method": "ngram", "depth": 3 } }), "speculative"),
        (json!({ "prediction": { "type": "content" } }), "prediction.content"),
        (json!({ "prediction": "text" }), "prediction"),
    ] {
        let mut body = json!({ "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 4 });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, error) = post(&server.url, &body);
        assert_eq!(status, 400, "{extra}: {error}");
        let got = error["error"]["param"].as_str().unwrap_or_default();
        assert!(got.starts_with(param), "{extra}: param {got:?} in {error}");
    }
}

/// `speculative: {method: draft}` over HTTP, on a pair whose small model is the large
/// one's twin (the same weights) and a policy that keeps every request on the large
/// model: the small model's rounds are kept, greedy and seeded, the text is the large
/// model's alone, usage and the trace report the kept tokens, and all K/V comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_model_over_http_changes_nothing_and_its_rounds_are_kept() {
    let setup = Setup { policy: ("always".into(), json!({ "model": "large" })), seed_step: 0, ..Setup::default() };
    let Some(server) = TestServer::start_setup(setup, futures::future::pending()).await else { return };
    for sampling in [json!({ "temperature": 0 }), json!({ "temperature": 0.8, "seed": 5 })] {
        let mut plain = crate::http_support::chat("Name three rivers.", 24, 3);
        plain.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
        plain["routing"] = json!({ "trace": true });
        let mut drafted = plain.clone();
        drafted["speculative"] = json!({ "method": "draft", "max_tokens": 6 });
        let (status, want) = server.post_json("/v1/chat/completions", &plain).await;
        assert_eq!(status, 200, "{want}");
        let (status, got) = server.post_json("/v1/chat/completions", &drafted).await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["choices"][0]["routing_trace"], want["choices"][0]["routing_trace"], "{sampling}");
        assert_eq!(text(&got), text(&want), "{sampling}");
        let usage = &got["usage"]["speculation"];
        let accepted = usage["accepted_tokens"].as_u64().unwrap();
        assert!(accepted >= 12, "{sampling}: a twin's rounds are kept: {usage}");
        assert_eq!(drafted_marks(&got), accepted as usize, "{sampling}: the trace marks each kept token");
    }
    server.wait_all_kv_free().await;
    server.stop().await;
}
