//! Incremental tokenization through the engine's tokenizer actor: a growing conversation, named
//! and anonymous, gives exactly the ids of full tokenization, with every splice shadow-verified.

use tempfile::TempDir;
use tokenrouter_actors::{Engine, EngineConfig, ModelSpec, StepLimits};
use tokenrouter_core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter_core::model::presets::preset;
use tokenrouter_core::model::LoadOptions;
use tokenrouter_core::policy::{self, ModelInfo, PolicyContext};
use tokenrouter_core::sched::BatchingRule;
use tokenrouter_core::tokenize::incremental::SessionConfig;
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

async fn qwen3_engine() -> Option<(Engine, TempDir)> {
    let tokenizer = tokenrouter_core::assets::tokenizer_dir("qwen3")?;
    let dir = TempDir::new().unwrap();
    write_random_model(&preset("tiny").unwrap(), &InitOptions { seed: 1, std: 0.1 }, dir.path()).unwrap();
    copy_tokenizer(&tokenizer, dir.path()).unwrap();
    let info = ModelInfo { name: "m0".into(), hidden_size: 64, vocab_size: 151_936 };
    let config = EngineConfig {
        models: vec![ModelSpec {
            name: "m0".into(),
            path: dir.path().to_path_buf(),
            load: LoadOptions { kv_budget_bytes: 8 << 20, ..LoadOptions::default() },
        }],
        default_policy: policy::build("always", &serde_json::json!({}), &[info], &PolicyContext::default()).unwrap(),
        batching: BatchingRule::eager(1),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    };
    Some((Engine::start(config).await.unwrap(), dir))
}

fn message(role: &str, text: String) -> ChatMessage {
    serde_json::from_value(serde_json::json!({ "role": role, "content": text })).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_continuations_equal_full_tokenization() {
    let Some((engine, _dir)) = qwen3_engine().await else { return };
    engine.configure_sessions(SessionConfig { verify_fraction: 1.0, ..SessionConfig::default() }).unwrap();
    let tokenizer = engine.tokenizer().unwrap().clone();
    let system = "You are a coding agent. Read the files, then edit them.\n".repeat(40);
    let mut messages = vec![message("system", system)];
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    for turn in 0..12 {
        messages.push(message("user", format!("Step {turn}: run `cargo test -p core` and fix the {turn}th failure.")));
        let session = (turn % 2 == 0).then(|| "agent-1".to_string());
        let rendered = engine.chat_in_session(messages.clone(), options.clone(), session).await.unwrap();
        assert_eq!(rendered.ids, tokenizer.encode(&rendered.text, false).unwrap(), "turn {turn}");
        messages.push(message("assistant", format!("fn fix_{turn}() {{ let x = {turn}; }}\nDone with step {turn}.")));
        let prompt = format!("{}\n// completion {turn}", rendered.text);
        let ids = engine.encode_in_session(prompt.clone(), true, Some("completion".into())).await.unwrap();
        assert_eq!(ids, tokenizer.encode(&prompt, true).unwrap(), "completion turn {turn}");
    }
    engine.shutdown().await;
}
