//! Models by Hugging Face Hub id, against a local stand-in for the Hub: `serve --model
//! ORG/NAME` downloads a model folder into the Hub cache and serves it; a GGUF file by
//! `ORG/NAME:FILE` gets its tokenizer rebuilt from its metadata; a broken download resumes
//! where it stopped; a file whose hash differs from the Hub's listing is refused and
//! removed; a gated repository needs the token; offline mode and an unreachable Hub use
//! the cache or say what is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;
use tokenrouter::config::{fetch_from_hub, HubModel, HubSettings};

use crate::http_support::{spawn_serve, ServeProcess};
use crate::hub_support::{HubFile, Quirks, StandInHub, COMMIT};

const MB: usize = 1_000_000;

fn settings(hub: &StandInHub, home: &Path) -> HubSettings {
    HubSettings { endpoint: hub.endpoint.clone(), token: None, offline: false, cache_dir: home.join("hub") }
}

/// Bytes no two files share by chance.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A model folder's files as the Hub would hold them (weights as LFS).
fn repo_files(folder: &Path) -> Vec<HubFile> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let lfs = name.ends_with(".safetensors") || name.ends_with(".gguf");
        files.push(HubFile::new(&name, std::fs::read(&path).unwrap(), lfs));
    }
    files.push(HubFile::new("README.md", b"# a model card\n".to_vec(), false));
    files.push(HubFile::new("pytorch_model.bin", noise(1000, 9), true));
    files
}

fn fetch(model: &str, settings: &HubSettings) -> Result<PathBuf, String> {
    fetch_from_hub(&HubModel::parse(model).unwrap(), settings, None)
}

#[test]
fn a_broken_download_resumes_where_it_stopped() {
    let weights = noise(25 * MB, 1);
    let hub = StandInHub::start(
        vec![("org/big", vec![HubFile::new("m.gguf", weights.clone(), true)])],
        Quirks { break_range_at: Some(10 * MB as u64), ..Quirks::default() },
    );
    let home = TempDir::new().unwrap();
    let err = fetch("org/big:m.gguf", &settings(&hub, home.path())).unwrap_err();
    assert!(err.contains("broke off") && err.contains("run again to resume"), "{err}");
    let path = fetch("org/big:m.gguf", &settings(&hub, home.path())).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), weights, "the resumed file is whole");
    let ranges = hub.ranges_of("m.gguf");
    // Each try opens with a one-byte probe of the file's size; the first fetched the first
    // 10 MB and broke in the second part, the second fetches only what was missing.
    let probes: Vec<usize> = ranges.iter().enumerate().filter(|(_, r)| *r == "bytes=0-0").map(|(i, _)| i).collect();
    assert_eq!(probes.len(), 2, "{ranges:?}");
    assert_eq!(ranges[1], format!("bytes=0-{}", 10 * MB - 1), "{ranges:?}");
    assert_eq!(
        ranges[probes[1] + 1..],
        [format!("bytes={}-{}", 10 * MB, 20 * MB - 1), format!("bytes={}-{}", 20 * MB, 25 * MB)],
        "the second try fetches only the missing parts: {ranges:?}"
    );
    let snapshot = home.path().join(format!("hub/models--org--big/snapshots/{COMMIT}/m.gguf"));
    assert_eq!(path, snapshot, "the Hub cache's own layout");
    let main = std::fs::read_to_string(home.path().join("hub/models--org--big/refs/main")).unwrap();
    assert_eq!(main, COMMIT);
}

#[test]
fn a_file_whose_hash_differs_from_the_listing_is_refused_and_removed() {
    let wrong = "ab".repeat(32);
    let hub = StandInHub::start(
        vec![("org/m", vec![HubFile::new("m.gguf", noise(MB, 2), true)])],
        Quirks { wrong_hash: Some(wrong.clone()), ..Quirks::default() },
    );
    let home = TempDir::new().unwrap();
    let err = fetch("org/m:m.gguf", &settings(&hub, home.path())).unwrap_err();
    assert!(err.contains("SHA-256") && err.contains(&wrong) && err.contains("removed"), "{err}");
    let repo = home.path().join("hub/models--org--m");
    assert!(!repo.join(format!("snapshots/{COMMIT}/m.gguf")).exists(), "no link to a refused file");
    let blobs: Vec<_> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    assert!(blobs.is_empty(), "the refused blob is deleted: {blobs:?}");
}

#[test]
fn a_gated_repository_needs_the_token() {
    let files = vec![HubFile::new("m.gguf", noise(1000, 3), true)];
    let gated = [("org/gated".to_string(), "hf_secret".to_string())].into_iter().collect();
    let hub = StandInHub::start(vec![("org/gated", files)], Quirks { gated, ..Quirks::default() });
    let home = TempDir::new().unwrap();
    let mut settings = settings(&hub, home.path());
    let err = fetch("org/gated:m.gguf", &settings).unwrap_err();
    assert!(err.contains("gated or private") && err.contains("HF_TOKEN"), "{err}");
    settings.token = Some("hf_secret".into());
    assert!(fetch("org/gated:m.gguf", &settings).unwrap().is_file());
}

#[test]
fn offline_and_unreachable_use_the_cache_or_say_what_is_missing() {
    let files = vec![HubFile::new("m.gguf", noise(1000, 4), true), HubFile::new("q4/m.gguf", noise(900, 5), true)];
    let hub = StandInHub::start(vec![("org/m", files)], Quirks::default());
    let home = TempDir::new().unwrap();
    let online = settings(&hub, home.path());
    let offline = HubSettings { offline: true, ..online.clone() };
    let err = fetch("org/m:m.gguf", &offline).unwrap_err();
    assert!(err.contains("HF_HUB_OFFLINE") && err.contains("not in the Hub cache"), "{err}");
    let downloaded = fetch("org/m:m.gguf", &online).unwrap();
    let requests = hub.ranges_of("m.gguf").len();
    assert_eq!(fetch("org/m:m.gguf", &offline).unwrap(), downloaded);
    assert_eq!(hub.ranges_of("m.gguf").len(), requests, "offline asks the Hub nothing");
    let nested = fetch("org/m:q4/m.gguf", &online).unwrap();
    assert!(nested.ends_with(format!("snapshots/{COMMIT}/q4/m.gguf")), "{}", nested.display());
    assert_eq!(fetch("org/m:q4/m.gguf", &offline).unwrap(), nested, "a file in a folder of the repository");

    // Nothing listens on a port just freed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let unreachable = HubSettings { endpoint: format!("http://{closed}"), ..online };
    assert_eq!(fetch("org/m:m.gguf", &unreachable).unwrap(), downloaded, "a cached model serves without the Hub");
    let err = fetch("org/other:m.gguf", &unreachable).unwrap_err();
    assert!(err.contains("cannot reach the Hub") && err.contains("not in the Hub cache"), "{err}");
    let err = fetch("org/nope:m.gguf", &settings(&hub, home.path())).unwrap_err();
    assert!(err.contains("has no model org/nope"), "{err}");
}

fn serve_from_hub(hub: &StandInHub, home: &Path, cache: &Path, model: &str) -> (ServeProcess, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenrouter"));
    command
        .env("TOKENROUTER_CACHE", cache)
        .env("TOKENROUTER_OFFLINE", "1")
        .env("TOKENROUTER_THREADS", "1")
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HOME", home)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .args(["serve", "--model", model, "--port", "0", "--no-warm-up"])
        .stderr(Stdio::inherit());
    let server = spawn_serve(command, Duration::from_secs(300));
    let url = server.url.clone();
    (server, url)
}

fn greedy_answer(url: &str, question: &str, max_tokens: usize) -> Value {
    let body = json!({
        "messages": [{ "role": "user", "content": question }],
        "temperature": 0,
        "max_tokens": max_tokens,
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let response = reqwest::Client::new().post(format!("{url}/v1/chat/completions")).json(&body).send().await;
        let response = response.unwrap();
        assert_eq!(response.status(), 200);
        response.json::<Value>().await.unwrap()
    })
}

#[test]
fn serve_model_by_hub_id_downloads_the_folder_and_answers() {
    let Some(_) = tokenrouter::core::assets::tokenizer_dir("qwen3") else { return };
    let (cache, home, models) = (TempDir::new().unwrap(), TempDir::new().unwrap(), TempDir::new().unwrap());
    let folder = models.path().join("tiny");
    let init = Command::new(env!("CARGO_BIN_EXE_tokenrouter"))
        .env("TOKENROUTER_CACHE", cache.path())
        .env("TOKENROUTER_OFFLINE", "1")
        .args(["model", "init", "--preset", "tiny", "--seed", "4", "--out", folder.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let hub = StandInHub::start(vec![("org/tiny-model", repo_files(&folder))], Quirks::default());
    let (server, url) = serve_from_hub(&hub, home.path(), cache.path(), "org/tiny-model");
    let answer = greedy_answer(&url, "Hi", 4);
    assert_eq!(answer["model"], "tiny-model", "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    drop(server);
    let snapshot = home.path().join(format!("hub/models--org--tiny-model/snapshots/{COMMIT}"));
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(snapshot.join(file).is_file(), "{file} in the snapshot");
    }
    for skipped in ["README.md", "pytorch_model.bin"] {
        assert!(!snapshot.join(skipped).exists(), "{skipped} is not needed and not fetched");
        assert!(hub.ranges_of(skipped).is_empty(), "{skipped} was not asked for");
    }
}

#[test]
fn serve_a_gguf_file_by_hub_id_rebuilds_its_tokenizer() {
    let Some(gguf) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let files = vec![
        HubFile::new("SmolLM2-135M-Instruct.Q4_1.gguf", std::fs::read(&gguf).unwrap(), true),
        HubFile::new("README.md", b"# GGUF files\n".to_vec(), false),
    ];
    let hub = StandInHub::start(vec![("org/SmolLM2-GGUF", files)], Quirks::default());
    let (cache, home) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let err = Command::new(env!("CARGO_BIN_EXE_tokenrouter"))
        .env("TOKENROUTER_CACHE", cache.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HOME", home.path())
        .args(["serve", "--model", "org/SmolLM2-GGUF", "--port", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(
        !err.status.success() && stderr.contains("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "names the GGUF files: {stderr}"
    );
    let (_server, url) =
        serve_from_hub(&hub, home.path(), cache.path(), "org/SmolLM2-GGUF:SmolLM2-135M-Instruct.Q4_1.gguf");
    let answer = greedy_answer(&url, "Name the capital of France.", 24);
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(text.contains("Paris"), "{answer}");
    assert_eq!(answer["model"], "SmolLM2-135M-Instruct.Q4_1", "{answer}");
}
