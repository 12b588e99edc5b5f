//! Tests of the policy registry (a separate file keeps registry.rs short).

use serde_json::json;

use super::*;
use crate::model::init::{write_random_model, InitOptions};
use crate::model::presets::qwen3_shaped;
use crate::policy::{Decision, EntryRequest, ModelIndex, PolicyState, RouteRow};

const HIDDEN: usize = 32;
const VOCAB: usize = 300;

fn models(n: usize) -> Vec<ModelInfo> {
    ["small", "large", "third"][..n]
        .iter()
        .map(|name| ModelInfo { name: name.to_string(), hidden_size: HIDDEN, vocab_size: VOCAB })
        .collect()
}

fn build_ok(name: &str, params: Value) -> Arc<dyn Policy> {
    build(name, &params, &models(2), &PolicyContext::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn build_err(name: &str, params: Value, models: &[ModelInfo], ctx: &PolicyContext) -> String {
    match build(name, &params, models, ctx) {
        Ok(_) => panic!("{name} with {params} should be refused"),
        Err(e) => e.to_string(),
    }
}

fn entry(policy: &dyn Policy, prompt_len: usize) -> ModelIndex {
    let prompt = vec![1; prompt_len];
    let mut state = PolicyState::default();
    policy.entry_model(&mut EntryRequest { request_id: 0, prompt: &prompt, max_tokens: 4, state: &mut state })
}

/// A random small model folder (embedding table + config) for R2R.
fn model_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen3_shaped(HIDDEN, 1, 2, 1, 64, VOCAB);
    write_random_model(&config, &InitOptions::default(), dir.path()).unwrap();
    dir
}

#[test]
fn every_simple_policy_builds_with_its_defaults() {
    for name in ["random", "rstitch", "colm", "citer", "always"] {
        let policy = build_ok(name, Value::Null);
        assert_eq!(policy.name(), name);
        assert_eq!(entry(policy.as_ref(), 3), 0);
    }
    assert_eq!(build_ok("me", json!({"weights": [1, 1]})).name(), "me");
    assert_eq!(build_ok("glimprouter", json!({"boundary_tokens": [5]})).name(), "glimprouter");
    assert_eq!(build_ok("query-level", json!({"prompt_len_above": 2})).name(), "query-level");
}

#[test]
fn unknown_names_and_keys_are_refused_by_name() {
    let error = build_err("oracle", Value::Null, &models(2), &PolicyContext::default());
    assert!(error.contains("`oracle`") && error.contains("`rstitch`"), "{error}");
    let error = build_err("rstitch", json!({"tau": 0.1, "temperature": 1}), &models(2), &PolicyContext::default());
    assert!(error.contains("`temperature`") && error.contains("`tau`"), "{error}");
    let error = build_err("always", json!({"p": 1}), &models(2), &PolicyContext::default());
    assert!(error.contains("`p`"), "{error}");
    let error = build_err("random", json!({"p": 1.5}), &models(2), &PolicyContext::default());
    assert!(error.contains("`p` must be in [0, 1]"), "{error}");
    let error = build_err("random", Value::Null, &models(1), &PolicyContext::default());
    assert!(error.contains("two models"), "{error}");
}

#[test]
fn models_are_named_or_indexed() {
    let policy = build("always", &json!({"model": "third"}), &models(3), &PolicyContext::default()).unwrap();
    assert_eq!(entry(policy.as_ref(), 1), 2);
    let policy =
        build("random", &json!({"small": "large", "large": 0}), &models(2), &PolicyContext::default()).unwrap();
    assert_eq!(entry(policy.as_ref(), 1), 1);
    let error = build_err("always", json!({"model": "huge"}), &models(2), &PolicyContext::default());
    assert!(error.contains("`huge`"), "{error}");
}

#[test]
fn colm_reserves_its_defer_slot() {
    let policy = build_ok("colm", Value::Null);
    assert_eq!(policy.reserved_logit(0), Some(VOCAB - 1));
    assert_eq!(policy.reserved_logit(1), None);
    assert_eq!(build_ok("colm", json!({"defer_index": 7})).reserved_logit(0), Some(7));
    let error = build_err("colm", json!({"defer_index": VOCAB}), &models(2), &PolicyContext::default());
    assert!(error.contains("`defer_index`"), "{error}");
}

#[test]
fn ensemble_weights_take_a_list_or_named_models() {
    let by_name = build("me", &json!({"weights": {"third": 1.0}}), &models(3), &PolicyContext::default()).unwrap();
    assert_eq!(entry(by_name.as_ref(), 1), 2, "only the named model has weight");
    for bad in [json!({}), json!({"weights": [1, 1, 1]}), json!({"weights": [1, 0]}), json!({"weights": "even"})] {
        let error = build_err("me", bad.clone(), &models(2), &PolicyContext::default());
        assert!(error.contains("`weights`"), "{bad}: {error}");
    }
}

#[test]
fn query_level_takes_exactly_one_rule() {
    let long = build_ok("query-level", json!({"prompt_len_above": 2}));
    assert_eq!((entry(long.as_ref(), 2), entry(long.as_ref(), 3)), (0, 1));
    assert_eq!(entry(build_ok("query-level", json!({"random": 1.0})).as_ref(), 1), 1);
    for bad in [json!({}), json!({"random": 0.5, "prompt_len_above": 3}), json!({"random": 2})] {
        assert!(build_err("query-level", bad, &models(2), &PolicyContext::default()).contains("`"));
    }
}

#[test]
fn r2r_reads_the_small_models_embedding_table() {
    let error = build_err("r2r", Value::Null, &models(2), &PolicyContext::default());
    assert!(error.contains("embedding"), "{error}");

    let folder = model_folder();
    let ctx = PolicyContext { model_dirs: vec![folder.path().to_path_buf()], ..Default::default() };
    let policy = build("r2r", &json!({"threshold": 0.0}), &models(2), &ctx).unwrap();
    assert!(policy.needs_hidden(0) && !policy.needs_hidden(1));
    let (logits, hidden) = (vec![0.5f32; VOCAB], vec![0.1f32; HIDDEN]);
    let mut state = PolicyState::default();
    let row = RouteRow {
        request_id: 0,
        model: 0,
        logits: &logits,
        hidden: Some(&hidden),
        sampled: 3,
        output: &[],
        state: &mut state,
    };
    assert_eq!(policy.route(&mut [row]), vec![Decision::Move { to: 1, commit: false }]);

    let mut wide = models(2);
    wide[0].hidden_size = HIDDEN * 2;
    let error = build_err("r2r", Value::Null, &wide, &ctx);
    assert!(error.contains("hidden size"), "{error}");
}

#[test]
fn learned_routers_load_weights_relative_to_the_base_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut random = crate::policy::weights::TensorSource::random(9);
    crate::policy::citer::CiterRouter::new(&mut random, HIDDEN).unwrap();
    random.save(&dir.path().join("citer.safetensors")).unwrap();
    let ctx = PolicyContext { base_dir: Some(dir.path().to_path_buf()), ..Default::default() };
    assert!(build("citer", &json!({"weights": "citer.safetensors"}), &models(2), &ctx).is_ok());
    let error = build_err("citer", json!({"weights": "absent.safetensors"}), &models(2), &ctx);
    assert!(error.contains("absent.safetensors"), "{error}");
    let mut wide = models(2);
    wide[0].hidden_size = HIDDEN + 1;
    assert!(build("citer", &json!({"weights": "citer.safetensors"}), &wide, &ctx).is_err());
}

#[test]
fn glimprouter_derives_boundaries_from_the_tokenizer() {
    // A word-level tokenizer: decoding one id gives its vocabulary string.
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "unk_token": "[UNK]",
                  "vocab": {"[UNK]": 0, "a": 1, "\n\n": 2, "b.\n\nSo": 3, "\n": 4}},
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let ctx = PolicyContext { model_dirs: vec![dir.path().to_path_buf()], ..Default::default() };

    let glimp = build("glimprouter", &Value::Null, &models(2), &ctx).unwrap();
    let mut state = PolicyState::default();
    let logits = vec![0.0f32; 8];
    let mut on_large = |sampled| {
        let row = RouteRow {
            request_id: 0,
            model: 1,
            logits: &logits,
            hidden: None,
            sampled,
            output: &[1],
            state: &mut state,
        };
        glimp.route(&mut [row])[0]
    };
    let back = Decision::Move { to: 0, commit: true };
    assert_eq!([on_large(2), on_large(3), on_large(4), on_large(1)], [back, back, Decision::Stay, Decision::Stay]);

    let error = build_err("glimprouter", Value::Null, &models(2), &PolicyContext::default());
    assert!(error.contains("boundary_tokens"), "{error}");
    let both = json!({"boundary_tokens": [2], "boundary_text": "\n"});
    assert!(build_err("glimprouter", both, &models(2), &ctx).contains("not both"));
    assert!(build_err("glimprouter", json!({"boundary_text": "zzz"}), &models(2), &ctx).contains("no boundary"));
}
