//! The engine with the real Qwen3 tokenizer: chat templates, streamed text, stop
//! strings across token boundaries, deadlines, and the shared-tokenizer check.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use tempfile::TempDir;
use tokenrouter_actors::{Engine, EngineConfig, EngineError, GenerateRequest, GenerationEvent, ModelSpec, StepLimits};
use tokenrouter_core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter_core::model::presets::preset;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::LoadOptions;
use tokenrouter_core::policy::{self, ModelInfo, PolicyContext};
use tokenrouter_core::sched::{BatchingRule, FinishReason};
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

fn assets(name: &str) -> Option<PathBuf> {
    tokenrouter_core::assets::tokenizer_dir(name)
}

fn tiny_with_tokenizer(seed: u64, tokenizer: &PathBuf) -> TempDir {
    let dir = TempDir::new().unwrap();
    write_random_model(&preset("tiny").unwrap(), &InitOptions { seed, std: 0.1 }, dir.path()).unwrap();
    copy_tokenizer(tokenizer, dir.path()).unwrap();
    dir
}

fn config(dirs: &[&TempDir]) -> EngineConfig {
    let infos: Vec<ModelInfo> =
        (0..dirs.len()).map(|i| ModelInfo { name: format!("m{i}"), hidden_size: 64, vocab_size: 151_936 }).collect();
    let p = if dirs.len() > 1 { serde_json::json!({ "p": 0.3 }) } else { serde_json::json!({ "p": 0.0 }) };
    let name = if dirs.len() > 1 { "random" } else { "always" };
    let params = if dirs.len() > 1 { p } else { serde_json::json!({}) };
    EngineConfig {
        models: dirs
            .iter()
            .enumerate()
            .map(|(i, d)| ModelSpec {
                name: format!("m{i}"),
                path: d.path().to_path_buf(),
                // The stop-string test replays a sampled request and expects the same
                // tokens; the replay's prompt comes from the prefix cache and its tail runs
                // in a few-row step. Rows are bit-equal at every batch size, so that holds.
                load: LoadOptions { kv_budget_bytes: 8 << 20, prefix_cache: true, ..LoadOptions::default() },
            })
            .collect(),
        default_policy: policy::build(name, &params, &infos, &PolicyContext::default()).unwrap(),
        batching: BatchingRule::eager(dirs.len()),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    }
}

struct Output {
    ids: Vec<u32>,
    text: String,
    end: GenerationEvent,
}

async fn run(engine: &Engine, r: GenerateRequest) -> Output {
    let mut stream = engine.generate(r).await.unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(event) = tokio::time::timeout(Duration::from_secs(60), stream.next()).await.expect("no hang") {
        match event {
            GenerationEvent::Token { token, text: delta, .. } => {
                ids.push(token);
                text.push_str(&delta);
            }
            end => {
                if let GenerationEvent::Finished { text: tail, .. } = &end {
                    text.push_str(tail);
                }
                return Output { ids, text, end };
            }
        }
    }
    panic!("no final event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_prompt_streams_text_equal_to_full_decode_and_stops_on_strings() {
    let Some(qwen) = assets("qwen3") else { return };
    let (a, b) = (tiny_with_tokenizer(1, &qwen), tiny_with_tokenizer(2, &qwen));
    let engine = Engine::start(config(&[&a, &b])).await.unwrap();
    let chat = engine
        .chat(
            vec![ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hello, 世界!")],
            RenderOptions { add_generation_prompt: true, ..RenderOptions::default() },
        )
        .await
        .unwrap();
    assert!(chat.text.ends_with("<|im_start|>assistant\n"), "{}", chat.text);
    let mut r = GenerateRequest::new(chat.ids.clone(), 40);
    r.sampling = SamplingParams { temperature: 1.0, seed: 5, ..SamplingParams::default() };
    r.ignore_eos = true;
    let full = run(&engine, r.clone()).await;
    let decoded = engine.tokenizer().unwrap().decode(&full.ids, true).unwrap();
    assert_eq!(full.text, decoded);
    assert!(matches!(full.end, GenerationEvent::Finished { reason: FinishReason::Length, .. }));

    // A stop string taken from the middle of that output, likely spanning tokens.
    let chars: Vec<char> = full.text.chars().collect();
    let (from, len) = (chars.len() / 2, 3.min(chars.len() - chars.len() / 2));
    let stop: String = chars[from..from + len].iter().collect();
    let expected: String = full.text[..full.text.find(&stop).unwrap()].to_string();
    r.stop = vec![stop.clone()];
    let stopped = run(&engine, r).await;
    assert_eq!(stopped.text, expected);
    match stopped.end {
        GenerationEvent::Finished { reason: FinishReason::Stop, stop: Some(s), .. } => assert_eq!(s, stop),
        other => panic!("{other:?}"),
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_the_request_with_an_error() {
    let Some(qwen) = assets("qwen3") else { return };
    let a = tiny_with_tokenizer(3, &qwen);
    let engine = Engine::start(config(&[&a])).await.unwrap();
    let ids = engine.encode("Tell me a long story.".into(), false).await.unwrap();
    let mut r = GenerateRequest::new(ids, 10_000);
    r.ignore_eos = true;
    r.deadline = Some(Duration::from_millis(200));
    let out = run(&engine, r).await;
    match out.end {
        GenerationEvent::Error { message, usage, .. } => {
            assert!(message.contains("deadline"), "{message}");
            assert_eq!(usage.completion_tokens, out.ids.len());
        }
        other => panic!("{other:?}"),
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_with_different_tokenizers_are_refused() {
    let (Some(qwen), Some(llama)) = (assets("qwen3"), assets("llama3")) else { return };
    let (a, b) = (tiny_with_tokenizer(4, &qwen), tiny_with_tokenizer(5, &llama));
    let err = Engine::start(config(&[&a, &b])).await.err().expect("refused");
    assert!(matches!(err, EngineError::Config(_)) && err.to_string().contains("tokenizer"), "{err}");
}

/// A tokenizer actor that dies is started again: the engine reports itself not ready
/// only until then, and tokenizes as before (a session configured earlier included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tokenizer_actor_is_respawned() {
    let Some(qwen) = assets("qwen3") else { return };
    let a = tiny_with_tokenizer(4, &qwen);
    let engine = Engine::start(config(&[&a])).await.unwrap();
    let before = engine.encode("Hello, world".into(), false).await.unwrap();
    assert_eq!(engine.readiness().await.tokenizer, Some(true));
    engine.inject_tokenizer_fault().unwrap();
    let mut answers = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Ok(ids) = engine.encode("Hello, world".into(), false).await {
            answers = Some(ids);
            break;
        }
    }
    assert_eq!(answers.expect("the tokenizer came back"), before);
    let readiness = engine.readiness().await;
    assert!(readiness.ready, "{readiness:?}");
    engine.shutdown().await;
}
