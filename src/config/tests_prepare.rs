//! Preparing configs: preset models written into a cache once, tokenizers, model
//! folders, and the engine config they make.

use std::path::Path;
use std::sync::Arc;

use tokenrouter_core::model::init::{write_random_model, InitOptions};
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::{Backend, CandleBackend, RowInput};
use tokenrouter_core::tokenize::{ChatMessage, ChatTemplate, RenderOptions, TextTokenizer};

use super::*;

/// The demo with its `small` preset swapped for a second `tiny`, to keep tests fast.
fn tiny_demo() -> ServerConfig {
    let mut config = demo_config();
    config.models[1].preset = Some(Preset::Tiny);
    config
}

fn builtin_cache(dir: &Path) -> ModelCache {
    ModelCache::new(dir, TokenizerChoice::BuiltIn)
}

fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

#[test]
fn the_builtin_tokenizer_round_trips_bytes_and_knows_chatml() {
    let dir = tempfile::tempdir().unwrap();
    let cache = builtin_cache(dir.path());
    let found = cache.tokenizer(None).unwrap();
    assert_eq!(found.kind, TokenizerKind::ByteLevel);
    let t = TextTokenizer::from_folder(&found.dir).unwrap();
    assert_eq!(t.vocab_size(), 259);
    let text = "Hello, wörld! 世界 🙂\n\ttabs";
    let ids = t.encode(text, false).unwrap();
    assert_eq!(ids.len(), text.len(), "one token per byte");
    assert_eq!(ids[0], u32::from(b'H'));
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    assert_eq!(
        t.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap(),
        vec![257, 117, 115, 101, 114, 10, 104, 105, 258]
    );
    assert_eq!(t.eos_token_ids(), &[258]);
    assert!(t.is_special(256) && t.is_special(257) && t.is_special(258));
    let template = ChatTemplate::from_folder(&found.dir).unwrap();
    let options = RenderOptions { add_generation_prompt: true, ..Default::default() };
    let rendered = template.render(&[ChatMessage::new("user", "Hi")], &options).unwrap();
    assert_eq!(rendered, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn the_demo_materializes_once_and_its_models_load() {
    let dir = tempfile::tempdir().unwrap();
    let cache = builtin_cache(dir.path());
    let config = tiny_demo();
    let prepared = config.prepare(&cache, None).unwrap();
    let engine = &prepared.engine;
    assert_eq!(engine.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["small", "large"]);
    assert_eq!(engine.default_policy.name(), "random");
    assert!(Arc::ptr_eq(&engine.default_policy, &prepared.catalog.default_policy()));
    assert_eq!(prepared.catalog.names(), ["always", "random", "rstitch"]);
    assert_eq!(engine.batching.thresholds.len(), 2);
    assert_eq!(engine.models[0].load.kv_budget_bytes, 256 << 20);
    assert_eq!(prepared.preset_tokenizer.as_ref().unwrap().kind, TokenizerKind::ByteLevel);
    let (a, b) = (&prepared.model_dirs[0], &prepared.model_dirs[1]);
    assert_eq!(a, &dir.path().join("models/tiny-seed1-bytes"));
    assert_eq!(b, &dir.path().join("models/tiny-seed2-bytes"));
    assert_ne!(
        std::fs::read(a.join("model.safetensors")).unwrap(),
        std::fs::read(b.join("model.safetensors")).unwrap()
    );

    for spec in &engine.models {
        let mut backend = CandleBackend::load(&spec.path, &spec.load).unwrap();
        assert_eq!(backend.config().vocab_size, 259);
        assert_eq!(backend.config().eos_token_ids, vec![258, 256]);
        let mut kv = backend.new_sequence();
        let tokens = [257, 117, 115, 101, 114, 10];
        let out = backend.forward(&mut [RowInput { kv: &mut kv, tokens: &tokens, start: 0 }], false).unwrap();
        assert_eq!(out.rows(), 1);
        assert!(out.row_logits(0).iter().all(|x| x.is_finite()));
        TextTokenizer::from_folder(&spec.path).unwrap();
    }

    // A second prepare reuses the folders; a folder that does not match is rewritten.
    let written = modified(&a.join("model.safetensors"));
    config.prepare(&builtin_cache(dir.path()), None).unwrap();
    assert_eq!(modified(&a.join("model.safetensors")), written);
    std::fs::write(b.join("tokenrouter-preset.json"), "{}").unwrap();
    config.prepare(&builtin_cache(dir.path()), None).unwrap();
    let marker: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(b.join("tokenrouter-preset.json")).unwrap()).unwrap();
    assert_eq!(marker["seed"], 2);
    let leftovers: Vec<_> =
        std::fs::read_dir(dir.path().join("models")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 2, "{leftovers:?}");
}

#[test]
fn presets_get_the_real_qwen3_tokenizer_when_it_is_at_hand() {
    let Some(_) = tokenrouter_core::assets::tokenizer_dir("qwen3") else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = ModelCache::new(dir.path(), TokenizerChoice::Auto { fetch: false });
    let mut config = tiny_demo();
    config.models.truncate(1);
    config.policy = PolicySection::default();
    let prepared = config.prepare(&cache, None).unwrap();
    assert_eq!(prepared.preset_tokenizer.unwrap().kind, TokenizerKind::Qwen3);
    assert_eq!(prepared.model_dirs[0], dir.path().join("models/tiny-seed1-qwen3"));
    assert_eq!(prepared.model_configs[0].vocab_size, 151_936);
    let t = TextTokenizer::from_folder(&prepared.model_dirs[0]).unwrap();
    assert_eq!(t.encode("<|im_end|>", false).unwrap(), vec![151_645]);
}

#[test]
fn folder_models_resolve_against_the_config_file_and_feed_folder_reading_policies() {
    let dir = tempfile::tempdir().unwrap();
    for (name, seed) in [("small", 1), ("large", 2)] {
        write_random_model(
            &qwen3_shaped(32, 1, 2, 1, 64, 300),
            &InitOptions { seed, std: 0.02 },
            &dir.path().join("m").join(name),
        )
        .unwrap();
    }
    let yaml = "
models:
  - {name: small, path: m/small, dtype: f16, kv_budget_mib: 8, block_size: 32, threads: 1, max_context: 512, kv_dtype: f16}
  - {name: large, path: m/large}
policy: {name: r2r, params: {threshold: 0.4}, seed: 5, allowed: [{name: glimprouter, params: {boundary_tokens: [10]}}]}
scheduler: {thresholds: {large: 2}, max_wait_ms: 5, max_batch_rows: 8, prefill_chunk: 64, step_token_budget: 128, exclusive_compute: true}
";
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, yaml).unwrap();
    let config = ServerConfig::load(&path).unwrap();
    config.check().unwrap();
    let prepared = config.prepare(&builtin_cache(&dir.path().join("cache")), None).unwrap();
    let engine = &prepared.engine;
    assert_eq!(engine.models[0].path, dir.path().join("m/small"));
    let load = &engine.models[0].load;
    assert_eq!(
        (load.dtype, load.kv_budget_bytes, load.block_size),
        (tokenrouter_core::model::WeightDtype::F16, 8 << 20, 32)
    );
    assert_eq!(engine.models[0].load.threads, Some(1));
    assert_eq!(
        (engine.models[0].load.kv_dtype, engine.models[1].load.kv_dtype),
        (tokenrouter_core::model::KvDtype::F16, tokenrouter_core::model::KvDtype::F32)
    );
    assert_eq!(engine.default_policy.name(), "r2r");
    assert!(engine.exclusive_compute);
    assert_eq!(
        (engine.limits.max_batch_rows, engine.limits.prefill_chunk, engine.limits.step_token_budget),
        (8, 64, 128)
    );
    assert_eq!(engine.batching.effective(10), vec![1, 2]);
    assert!(prepared.preset_tokenizer.is_none());
    assert!(!dir.path().join("cache").exists(), "no preset, nothing cached");
    assert_eq!(config.max_context(32_768), 512);
    prepared.catalog.build("glimprouter", Some(&serde_json::json!({"threshold": 0.5}))).unwrap();
}

#[test]
fn a_missing_model_folder_is_refused_at_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        ServerConfig::from_yaml_str("models: [{name: a, preset: tiny}, {name: b, path: absent}]", dir.path()).unwrap();
    let e = config.prepare(&builtin_cache(&dir.path().join("cache")), None).unwrap_err();
    assert!(e.to_string().starts_with("models[1].path: "), "{e}");
    assert!(e.to_string().ends_with("absent is not a folder or a .gguf file"), "{e}");
}

/// A GGUF file as a model: its metadata stands in for config.json, its folder holds the
/// tokenizer, and the llama.cpp backend loads it.
#[cfg(feature = "llamacpp")]
#[test]
fn a_gguf_file_prepares_and_loads_on_llamacpp() {
    use tokenrouter_core::model::gguf::{write_gguf, GgufType};
    use tokenrouter_core::model::init::copy_tokenizer;
    let Some(tokenizer) = tokenrouter_core::assets::tokenizer_dir("qwen3") else { return };
    let dir = tempfile::TempDir::new().unwrap();
    let (folder, gguf_dir) = (dir.path().join("hf"), dir.path().join("gguf"));
    std::fs::create_dir_all(&gguf_dir).unwrap();
    write_random_model(&qwen3_shaped(64, 2, 4, 2, 128, 151_936), &InitOptions { seed: 3, std: 0.1 }, &folder).unwrap();
    copy_tokenizer(&tokenizer, &folder).unwrap();
    copy_tokenizer(&tokenizer, &gguf_dir).unwrap();
    write_gguf(&folder, &gguf_dir.join("m.gguf"), GgufType::Q8_0).unwrap();

    let yaml = "models: [{name: m, path: gguf/m.gguf, backend: llamacpp, kv_budget_mib: 8}]";
    let config = ServerConfig::from_yaml_str(yaml, dir.path()).unwrap();
    config.check().unwrap();
    let prepared = config.prepare(&builtin_cache(dir.path()), None).unwrap();
    assert_eq!(prepared.model_dirs[0], gguf_dir);
    assert_eq!(prepared.model_configs[0].vocab_size, 151_936);
    let spec = &prepared.engine.models[0];
    assert_eq!(spec.path, gguf_dir.join("m.gguf"));
    let mut backend = tokenrouter_core::model::load_backend(&spec.path, &spec.load).unwrap();
    let mut kv = backend.new_sequence();
    let out = backend.forward(&mut [RowInput { kv: &mut kv, tokens: &[1, 2, 3], start: 0 }], false).unwrap();
    assert!(out.row_logits(0).iter().all(|x| x.is_finite()));
    TextTokenizer::from_folder(&prepared.model_dirs[0]).unwrap();
}
