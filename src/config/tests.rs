//! Parsing and validation: every refusal names the key.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use tokenrouter_core::model::{BackendKind, WeightDtype};
use tokenrouter_core::policy::ModelInfo;
use tokenrouter_core::sched::Threshold;

use super::*;

const PAIR: &str = "
models:
  - name: small
    preset: tiny
  - name: large
    preset: small
";

fn parse(text: &str) -> Result<ServerConfig, ConfigError> {
    ServerConfig::from_yaml_str(text, Path::new("/etc/tokenrouter"))
}

/// The error of `text`, which must be refused.
fn refused(text: &str) -> ConfigError {
    match parse(text) {
        Ok(config) => panic!("accepted: {config:?}"),
        Err(e) => e,
    }
}

fn with_pair(rest: &str) -> String {
    format!("{PAIR}{rest}")
}

#[test]
fn a_minimal_config_gets_every_default() {
    let config = parse("models: [{name: m, path: models/m}]").unwrap();
    let m = &config.models[0];
    assert_eq!(m.dtype, WeightDtype::F32);
    assert_eq!((m.kv_budget_mib, m.block_size, m.max_context, m.threads, m.seed), (256, 16, None, None, None));
    assert_eq!(config.model_path(0).unwrap(), Path::new("/etc/tokenrouter/models/m"));
    assert_eq!(config.policy.name, "always");
    assert!(config.policy.allowed.is_empty());
    let s = &config.scheduler;
    assert_eq!(
        (s.max_batch_rows, s.prefill_chunk, s.step_token_budget, s.max_wait_ms, s.exclusive_compute),
        (64, 512, 1024, None, ExclusiveCompute::Auto)
    );
    let server = &config.server;
    assert_eq!((server.host.as_str(), server.port, server.max_body_bytes), ("127.0.0.1", 8000, 4 << 20));
    assert_eq!((server.max_queued_requests, server.max_tokens_limit, server.shutdown_grace_secs), (256, None, 10));
    assert!(server.api_keys.is_empty());
    assert_eq!(server.address(), "127.0.0.1:8000");
    assert_eq!(config.max_tokens_limit(32_768), 32_768);
}

#[test]
fn unknown_keys_are_refused_with_their_path() {
    let e = refused(&with_pair("server:\n  prot: 80\n"));
    assert!(e.to_string().starts_with("server.prot: unknown field `prot`"), "{e}");
    let e = refused("models:\n  - name: m\n    preset: tiny\n    colour: red\n");
    assert!(e.to_string().starts_with("models[0].colour: unknown field `colour`"), "{e}");
    let e = refused(&with_pair("polcy: {name: random}\n"));
    assert!(e.to_string().starts_with("polcy: unknown field `polcy`"), "{e}");
    let e = refused(&with_pair("policy:\n  name: random\n  allowed: [{name: random, parms: {}}]\n"));
    assert!(e.to_string().starts_with("policy.allowed[0].parms: unknown field"), "{e}");
}

#[test]
fn wrong_types_are_refused_with_their_path() {
    let e = refused("models:\n  - {name: a, preset: tiny}\n  - {name: b, preset: tiny, kv_budget_mib: x}\n");
    assert!(e.to_string().starts_with("models[1].kv_budget_mib: invalid type: string \"x\", expected u64"), "{e}");
    let e = refused(&with_pair("scheduler:\n  exclusive_compute: maybe\n"));
    assert!(e.to_string().starts_with("scheduler.exclusive_compute: invalid value"), "{e}");
    let e = refused(&with_pair("server:\n  api_keys: secret\n"));
    assert!(e.to_string().starts_with("server.api_keys: invalid type"), "{e}");
    let e = refused("models: {name: m}\n");
    assert!(e.to_string().starts_with("models: invalid type: map, expected a sequence"), "{e}");
}

#[test]
fn bad_values_are_refused_with_their_path() {
    let e = refused("models: [{name: m, preset: tiny, dtype: bf8}]");
    assert!(e.to_string().starts_with("models[0].dtype: unknown variant `bf8`, expected one of `f32`, `f16`"), "{e}");
    let e = refused("models: [{name: m, preset: huge}]");
    assert!(e.to_string().starts_with("models[0].preset: unknown variant `huge`"), "{e}");
    let e = refused(&with_pair("server: {max_queued_requests: -1}\n"));
    assert!(e.to_string().starts_with("server.max_queued_requests: invalid type: integer `-1`, expected usize"), "{e}");
    let e = refused(&with_pair("server: {port: 70000}\n"));
    assert!(e.to_string().starts_with("server.port: invalid value: integer `70000`, expected u16"), "{e}");
    let e = refused(&with_pair("scheduler: {thresholds: {large: -2}}\n"));
    assert!(e.to_string().starts_with("scheduler.thresholds.large: invalid value: integer `-2`"), "{e}");
}

#[test]
fn zero_sizes_are_refused_each_with_its_path() {
    let e = refused(
        "models: [{name: m, preset: tiny, kv_budget_mib: 0, block_size: 0, threads: 0, max_context: 1}]
scheduler: {max_batch_rows: 0, prefill_chunk: 0, step_token_budget: 0}
server: {port: 0, max_body_bytes: 0, max_queued_requests: 0, max_tokens_limit: 0, host: ''}
",
    );
    for path in [
        "models[0].kv_budget_mib",
        "models[0].block_size",
        "models[0].threads",
        "models[0].max_context",
        "scheduler.max_batch_rows",
        "scheduler.prefill_chunk",
        "scheduler.step_token_budget",
        "server.port",
        "server.max_body_bytes",
        "server.max_queued_requests",
        "server.max_tokens_limit",
        "server.host",
    ] {
        assert!(e.mentions(path), "no problem at {path}:\n{e}");
    }
    assert_eq!(e.problems.len(), 12, "{e}");
    assert!(refused("models: [{name: m, preset: tiny, block_size: 129}]").mentions("models[0].block_size"));
    let e = refused("models: [{name: m, preset: tiny, kv_dtype: bf16}]");
    assert!(e.to_string().contains("kv_dtype") && e.to_string().contains("f16"), "{e}");
}

#[test]
fn quantized_types_and_gguf_files_need_the_llamacpp_backend() {
    let config = parse("models: [{name: m, preset: tiny, backend: llamacpp, dtype: q8_0}]").unwrap();
    assert_eq!((config.models[0].backend, config.models[0].dtype), (BackendKind::Llamacpp, WeightDtype::Q8_0));
    // bf16 runs on either backend.
    let config = parse("models: [{name: m, preset: tiny, dtype: bf16}]").unwrap();
    assert_eq!((config.models[0].backend, config.models[0].dtype), (BackendKind::Candle, WeightDtype::Bf16));
    assert_eq!(parse("models: [{name: m, preset: tiny}]").unwrap().models[0].backend, BackendKind::Candle);
    let e = refused("models: [{name: m, preset: tiny, dtype: q4_k}]");
    assert!(e.mentions("models[0].dtype") && e.to_string().contains("backend: llamacpp"), "{e}");
    let e = refused("models: [{name: m, preset: tiny, backend: onnx}]");
    assert!(e.to_string().starts_with("models[0].backend: unknown variant `onnx`"), "{e}");

    let dir = tempfile::TempDir::new().unwrap();
    std::fs::write(dir.path().join("m.gguf"), b"GGUF").unwrap();
    let config = ServerConfig::from_yaml_str("models: [{name: m, path: m.gguf}]", dir.path()).unwrap();
    let e = config.check().unwrap_err();
    // A GGUF runs on either backend; this one is cut short, and says so at its key.
    assert!(e.mentions("models[0].path") && e.to_string().contains("m.gguf"), "{e}");
    let config = ServerConfig::from_yaml_str("models: [{name: m, path: nowhere}]", dir.path()).unwrap();
    assert!(config.check().unwrap_err().to_string().contains("is not a folder or a .gguf file"));
}

#[test]
fn models_need_unique_names_and_exactly_one_source() {
    let e = refused("models: [{name: m, preset: tiny}, {name: m, path: x}]");
    assert!(e.to_string().contains("models[1].name: `m` names two models"), "{e}");
    assert!(refused("models: [{name: m, preset: tiny, path: x}]")
        .to_string()
        .contains("models[0]: give one of `path`, `preset`, not several"));
    assert!(refused("models: [{name: m}]").mentions("models[0]"));
    assert!(refused("models: [{name: m, path: x, seed: 3}]").mentions("models[0].seed"));
    assert!(refused("models: []").mentions("models"));
    let e = refused("server: {port: 1}\n");
    assert!(e.to_string().contains("missing field `models`"), "{e}");
}

#[test]
fn hub_models_take_org_name_or_org_name_file() {
    let config =
        parse("models: [{name: a, hub: HuggingFaceTB/SmolLM2-135M}, {name: b, model: o/r-GGUF:m.gguf}]").unwrap();
    assert_eq!(config.hub_model(0).unwrap().repo, "HuggingFaceTB/SmolLM2-135M");
    assert_eq!(config.hub_model(1).unwrap().file.as_deref(), Some("m.gguf"), "`model:` spells `hub:` too");
    let e = refused("models: [{name: m, hub: not-an-id}]");
    assert!(e.to_string().contains("models[0].hub: \"not-an-id\" is not a Hub id"), "{e}");
    let e = refused("models: [{name: m, hub: o/r, preset: tiny}]");
    assert!(e.to_string().contains("give one of `preset`, `hub`, not several"), "{e}");
    let built = crate::config::builtin_config("o/r:m.gguf").unwrap();
    assert_eq!((built.models[0].name.as_str(), built.models[0].hub.as_deref()), ("m", Some("o/r:m.gguf")));
}

#[test]
fn thresholds_take_a_number_or_a_table_by_active_requests() {
    let config = parse(&with_pair(
        "scheduler:\n  thresholds:\n    large: {1: 1, 8: 2, 16: 4}\n    small: 1\n  max_wait_ms: 25\n",
    ))
    .unwrap();
    let rule = config.batching_rule().unwrap();
    assert_eq!(rule.thresholds, vec![Threshold::Fixed(1), Threshold::ByActive(vec![(1, 1), (8, 2), (16, 4)])]);
    assert_eq!(rule.max_wait, Some(std::time::Duration::from_millis(25)));
    assert_eq!(rule.effective(10), vec![1, 2]);
    // Models without a threshold launch eagerly.
    assert_eq!(parse(PAIR).unwrap().batching_rule().unwrap().thresholds, vec![Threshold::Fixed(1); 2]);
}

#[test]
fn the_planner_is_on_by_default_and_hand_thresholds_turn_it_off() {
    let default = parse(PAIR).unwrap().replan_config().expect("on by default");
    assert!(default.plan_at_start);
    assert_eq!(default.interval, std::time::Duration::from_secs(5));
    assert_eq!(parse(&with_pair("scheduler: {replan: false}\n")).unwrap().replan_config(), None);
    assert!(parse(&with_pair("scheduler: {replan: true}\n")).unwrap().replan_config().unwrap().plan_at_start);
    // Thresholds by hand win: no planner, unless asked for, and then no start-up plan.
    let by_hand = with_pair("scheduler: {thresholds: {large: 2}}\n");
    assert_eq!(parse(&by_hand).unwrap().replan_config(), None);
    let both = parse(&with_pair("scheduler: {thresholds: {large: 2}, replan: {}}\n")).unwrap();
    assert!(!both.replan_config().unwrap().plan_at_start);
    let e = refused(&with_pair("scheduler: {replan: 3}\n"));
    assert!(e.to_string().starts_with("scheduler.replan: invalid type"), "{e}");
}

#[test]
fn the_start_up_plan_assumes_the_workload_it_is_told() {
    let default = parse(PAIR).unwrap().replan_config().unwrap();
    assert_eq!(default.workload, tokenrouter_core::sched::planner::WorkloadPrior::default());
    let told = "scheduler: {replan: {expected_prompt_tokens: 100, expected_output_tokens: 64}}\n";
    let workload = parse(&with_pair(told)).unwrap().replan_config().unwrap().workload;
    assert_eq!((workload.prompt_tokens, workload.output_tokens), (100.0, 64.0));
    let e = refused(&with_pair("scheduler: {replan: {expected_prompt_tokens: -1}}\n"));
    assert!(e.to_string().contains("scheduler.replan.expected_prompt_tokens"), "{e}");
    let e = refused(&with_pair("scheduler: {replan: {expected_output_tokens: 0}}\n"));
    assert!(e.to_string().contains("scheduler.replan.expected_output_tokens"), "{e}");
}

#[test]
fn exclusive_compute_is_decided_from_where_the_models_run() {
    assert!(parse(PAIR).unwrap().exclusive_compute(), "two models on this host's CPU take turns");
    assert!(!parse(&with_pair("scheduler: {exclusive_compute: false}\n")).unwrap().exclusive_compute());
    assert!(parse(&with_pair("scheduler: {exclusive_compute: auto}\n")).unwrap().exclusive_compute());
    let one_cpu =
        "models:\n  - {name: small, preset: tiny}\n  - {name: large, preset: small, device: \"cuda:0\", dtype: bf16}\n";
    assert!(!parse(one_cpu).unwrap().exclusive_compute(), "a model on a card overlaps the CPU one");
    let e = refused(&with_pair("scheduler: {exclusive_compute: sometimes}\n"));
    assert!(e.to_string().starts_with("scheduler.exclusive_compute: invalid value"), "{e}");
}

#[test]
fn replanning_settings_have_defaults_and_checked_values() {
    let config = parse(&with_pair("scheduler:\n  max_batch_rows: 16\n  replan: {margin: 0.1}\n")).unwrap();
    let replan = config.replan_config().unwrap();
    assert_eq!((replan.interval, replan.margin, replan.max_batch), (std::time::Duration::from_secs(5), 0.1, 16));
    let e = refused(&with_pair("scheduler: {replan: {interval_s: 0, margin: -1}}\n"));
    assert!(e.to_string().contains("scheduler.replan.interval_s: must be at least 0.1 seconds"), "{e}");
    assert!(e.to_string().contains("scheduler.replan.margin: must be a non-negative fraction"), "{e}");
    let e = refused(&with_pair("scheduler: {replan: {every: 3}}\n"));
    assert!(e.to_string().contains("scheduler.replan.every: unknown field `every`"), "{e}");
}

#[test]
fn bad_thresholds_are_refused() {
    let e = refused(&with_pair("scheduler: {thresholds: {huge: 2}}\n"));
    assert!(e.to_string().contains("scheduler.thresholds.huge: no model is named `huge`; models: small, large"), "{e}");
    let e = refused(&with_pair("scheduler: {thresholds: {large: 0}}\n"));
    assert!(e.to_string().contains("scheduler.thresholds.large: a threshold is 0"), "{e}");
    let e = refused(&with_pair("scheduler: {thresholds: {small: {4: 3}, large: {4: 3}}}\n"));
    assert!(e.to_string().contains("scheduler.thresholds: thresholds [3, 3] at N = 4"), "{e}");
    let e = refused(&with_pair("scheduler: {thresholds: {large: {}}}\n"));
    assert!(e.to_string().starts_with("scheduler.thresholds.large: an empty table"), "{e}");
    let e = refused(&with_pair("scheduler: {thresholds: {large: [1, 2]}}\n"));
    assert!(e.to_string().starts_with("scheduler.thresholds.large: invalid type: sequence"), "{e}");
}

#[test]
fn unknown_policies_are_refused() {
    let e = refused(&with_pair("policy: {name: oracle}\n"));
    assert!(e.to_string().starts_with("policy.name: unknown policy `oracle`; known: random, rstitch"), "{e}");
    let e =
        refused(&with_pair("policy:\n  name: random\n  allowed: [{name: rstitch}, {name: magic}, {name: rstitch}]\n"));
    assert!(e.mentions("policy.allowed[1].name") && e.mentions("policy.allowed[2].name"), "{e}");
    assert!(refused(&with_pair("policy: {name: random, params: [1]}\n")).mentions("policy.params"));
}

#[test]
fn policy_parameters_are_checked_against_the_models() {
    let config = parse(&with_pair("policy: {name: random, params: {p: 2}}\n")).unwrap();
    let e = config.check().unwrap_err();
    assert!(e.to_string().starts_with("policy.params: policy `random`: `p` must be in [0, 1], got 2"), "{e}");
    let config =
        parse(&with_pair("policy: {name: rstitch, allowed: [{name: always, params: {model: huge}}]}\n")).unwrap();
    assert!(config
        .check()
        .unwrap_err()
        .to_string()
        .starts_with("policy.allowed[0].params: policy `always`: unknown model `huge`"));
    let config = parse("models: [{name: m, preset: tiny}]\npolicy: {name: random}\n").unwrap();
    assert!(config.check().unwrap_err().to_string().contains("needs two models"));
    let config = parse("models: [{name: m, path: nowhere}]").unwrap();
    assert!(config
        .check()
        .unwrap_err()
        .to_string()
        .starts_with("models[0].path: /etc/tokenrouter/nowhere is not a folder"));
    parse(&with_pair(
        "policy: {name: me, params: {weights: [1, 3]}, allowed: [{name: rstitch, params: {tau: 0.1}}]}\n",
    ))
    .unwrap()
    .check()
    .unwrap();
}

#[test]
fn errors_from_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "models: [{name: m, preset: tiny, kv_budget_mib: x}]").unwrap();
    let e = ServerConfig::load(&path).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}: models[0].kv_budget_mib: invalid type", path.display())), "{e}");
    let e = ServerConfig::load(&dir.path().join("absent.yaml")).unwrap_err();
    assert!(e.to_string().contains("cannot read the configuration"), "{e}");
    std::fs::write(&path, "models: [{name: m, preset: tiny}\n").unwrap();
    assert!(ServerConfig::load(&path).is_err());
}

#[test]
fn context_and_max_tokens_limits_take_the_tightest_cap() {
    let config = parse("models: [{name: a, preset: tiny, max_context: 4096}, {name: b, preset: tiny, max_context: 2048}]\nserver: {max_tokens_limit: 8000}").unwrap();
    assert_eq!(config.context_cap(), Some(2048));
    assert_eq!(config.max_context(32_768), 2048);
    assert_eq!(config.max_context(1024), 1024);
    assert_eq!(config.max_tokens_limit(32_768), 2048);
    let config =
        parse("models: [{name: a, preset: tiny}]\nserver: {max_tokens_limit: 100, host: '::1', port: 9}").unwrap();
    assert_eq!(config.max_tokens_limit(32_768), 100);
    assert_eq!(config.server.address(), "[::1]:9");
}

fn infos() -> Vec<ModelInfo> {
    ["small", "large"].iter().map(|n| ModelInfo { name: n.to_string(), hidden_size: 64, vocab_size: 1000 }).collect()
}

fn refused_policy<T>(result: Result<T, CatalogError>) -> CatalogError {
    match result {
        Ok(_) => panic!("the catalog built a policy it should refuse"),
        Err(e) => e,
    }
}

fn demo_catalog() -> PolicyCatalog {
    let allowed = vec![
        ("rstitch".to_string(), json!(null)),
        ("random".to_string(), json!(null)),
        ("always".to_string(), json!({"model": "large"})),
    ];
    PolicyCatalog::new("random", &json!({"p": 0.2}), &allowed, infos(), Default::default()).unwrap()
}

#[test]
fn the_catalog_refuses_policies_not_allowed() {
    let catalog = demo_catalog();
    assert_eq!(catalog.names(), vec!["always", "random", "rstitch"]);
    let e = refused_policy(catalog.build("colm", None));
    assert_eq!(e.param(), "routing.policy");
    assert_eq!(e.to_string(), "routing policy `colm` is not allowed on this server; allowed: always, random, rstitch");
    assert!(matches!(catalog.build("nonsense", None), Err(CatalogError::NotAllowed { .. })));
    let e = refused_policy(catalog.build("rstitch", Some(&json!({"tau": "high"}))));
    assert_eq!(e.param(), "routing.params");
    assert!(e.to_string().contains("`tau`"), "{e}");
    assert!(catalog.build("rstitch", Some(&json!([1]))).is_err());
    let e = refused_policy(catalog.build("rstitch", Some(&json!({"bogus": 1}))));
    assert!(e.to_string().contains("unknown parameter `bogus`"), "{e}");
}

#[test]
fn the_catalog_shares_one_policy_object_per_name_and_parameters() {
    let catalog = demo_catalog();
    let default = catalog.default_policy();
    assert_eq!(default.name(), "random");
    // The default's name without parameters, or with its own, is the default object.
    assert!(Arc::ptr_eq(&catalog.build("random", None).unwrap(), &default));
    assert!(Arc::ptr_eq(&catalog.resolve(None, None).unwrap(), &default));
    assert!(Arc::ptr_eq(&catalog.build("default", None).unwrap(), &default));
    assert!(Arc::ptr_eq(&catalog.build("random", Some(&json!({"p": 0.2}))).unwrap(), &default));
    let a = catalog.build("random", Some(&json!({"p": 0.7}))).unwrap();
    let b = catalog.build("random", Some(&json!({"p": 0.7}))).unwrap();
    assert!(Arc::ptr_eq(&a, &b) && !Arc::ptr_eq(&a, &default));
    let r1 = catalog.build("rstitch", None).unwrap();
    assert!(Arc::ptr_eq(&r1, &catalog.build("rstitch", Some(&json!({}))).unwrap()));
    assert!(!Arc::ptr_eq(&r1, &catalog.build("rstitch", Some(&json!({"tau": 0.5}))).unwrap()));
}

#[test]
fn request_parameters_override_the_configured_ones_but_not_file_paths() {
    let catalog = demo_catalog();
    let mut state = tokenrouter_core::policy::PolicyState::default();
    let mut entry =
        tokenrouter_core::policy::EntryRequest { request_id: 1, prompt: &[1], max_tokens: 4, state: &mut state };
    // `always` is configured on `large`; a request may move it back to `small`.
    assert_eq!(catalog.build("always", None).unwrap().entry_model(&mut entry), 1);
    assert_eq!(catalog.build("always", Some(&json!({"model": "small"}))).unwrap().entry_model(&mut entry), 0);
    let e = refused_policy(catalog.build("random", Some(&json!({"weights": "/etc/passwd"}))));
    assert!(e.to_string().contains("routing.params.weights: file paths are set in the server's configuration"), "{e}");
}

#[test]
fn the_demo_file_is_the_built_in_demo() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/demo.yaml");
    let mut file = ServerConfig::load(&path).unwrap();
    file.base_dir = demo_config().base_dir;
    assert_eq!(file, demo_config());
    demo_config().validate().unwrap();
    demo_config().check().unwrap();
}

#[test]
fn models_on_a_card_take_its_types_and_name_what_does_not_fit() {
    use tokenrouter_core::model::DeviceSpec;
    let config = parse("models: [{name: m, preset: tiny, device: 'cuda:1', dtype: bf16}]").unwrap();
    assert_eq!(config.models[0].device, DeviceSpec::Cuda(1));
    assert_eq!(parse("models: [{name: m, preset: tiny}]").unwrap().models[0].device, DeviceSpec::Cpu);
    let e = refused("models: [{name: m, preset: tiny, device: 'cuda:0'}]");
    assert!(e.mentions("models[0].dtype") && e.to_string().contains("bf16 or f16"), "{e}");
    let e = refused("models: [{name: m, preset: tiny, device: 'cuda:0', dtype: bf16, kv_dtype: f16, threads: 2}]");
    assert!(e.mentions("models[0].kv_dtype") && e.mentions("models[0].threads"), "{e}");
    let e = refused("models: [{name: m, preset: tiny, device: 'cuda:0', dtype: f16, backend: llamacpp}]");
    assert!(e.mentions("models[0].backend"), "{e}");
    assert!(parse("models: [{name: m, preset: tiny, device: tpu}]").unwrap_err().to_string().contains("cuda:N"));
}

#[cfg(not(feature = "cuda"))]
#[test]
fn a_build_without_cuda_says_how_to_get_it() {
    use tokenrouter_core::model::{load_backend, DeviceSpec, LoadOptions};
    let options = LoadOptions { device: DeviceSpec::Cuda(0), ..LoadOptions::default() };
    let e = load_backend(std::path::Path::new("/nonexistent"), &options).err().unwrap();
    assert!(e.to_string().contains("--features cuda"), "{e}");
}

#[test]
fn server_tls_reads_its_pem_files_at_start_and_names_what_is_wrong() {
    assert!(parse(PAIR).unwrap().server.tls.is_none(), "plain HTTP unless asked");
    let config = parse(&with_pair("server: {tls: {cert: certs/server.pem, key: certs/server.key}}")).unwrap();
    let tls = config.server.tls.as_ref().unwrap();
    assert_eq!((tls.cert.as_path(), tls.key.as_path()), (Path::new("certs/server.pem"), Path::new("certs/server.key")));
    let missing = tls.acceptor(&config.base_dir).err().expect("no such files");
    assert!(missing.mentions("server.tls"), "{missing}");
    assert!(missing.to_string().contains("/etc/tokenrouter/certs/server.pem"), "relative to the config: {missing}");

    let dir = tempfile::TempDir::new().unwrap();
    std::fs::write(dir.path().join("empty.pem"), "").unwrap();
    std::fs::write(dir.path().join("empty.key"), "").unwrap();
    let empty = ServerTlsSection { cert: "empty.pem".into(), key: "empty.key".into() };
    let error = empty.acceptor(dir.path()).err().expect("a file without a certificate");
    assert!(error.to_string().contains("no PEM certificate"), "{error}");

    assert!(refused(&with_pair("server: {tls: {cert: a.pem}}")).to_string().contains("key"));
}

#[test]
fn speculation_settings_reach_every_model_and_bad_ones_are_refused_by_key() {
    let config = parse(&format!(
        "{PAIR}scheduler:\n  speculative: {{step_cost: {{fixed_ms: 10, per_token_ms: 0.05}}, suffix_cache_nodes: 5000}}\n"
    ))
    .unwrap();
    let section = config.scheduler.speculative.as_ref().unwrap();
    assert_eq!(section.speculation(), None, "without a method, requests that say nothing do not speculate");
    let drafting = config.step_limits().drafting;
    assert_eq!(drafting.suffix_cache_nodes, 5000);
    let cost = drafting.step_cost.unwrap();
    assert!((cost.intercept - 0.010).abs() < 1e-12 && (cost.per_token - 0.00005).abs() < 1e-12, "{cost:?}");
    let config = parse(&format!("{PAIR}scheduler: {{speculative: {{method: suffix}}}}\n")).unwrap();
    let default = config.scheduler.speculative.as_ref().unwrap().speculation().unwrap();
    assert_eq!((default.method, default.max_tokens), (Some(tokenrouter_core::spec::SpeculationMethod::Suffix), 8));
    assert_eq!(config.step_limits().drafting, tokenrouter_core::spec::DraftingConfig::default());
    let config = parse(&format!("{PAIR}scheduler: {{speculative: {{method: draft, max_tokens: 5}}}}\n")).unwrap();
    let default = config.scheduler.speculative.as_ref().unwrap().speculation().unwrap();
    assert_eq!((default.method, default.max_tokens), (Some(tokenrouter_core::spec::SpeculationMethod::Draft), 5));
    let alone = refused("models:\n  - name: only\n    preset: tiny\nscheduler: {speculative: {method: draft}}\n");
    assert!(alone.to_string().contains("scheduler.speculative.method"), "{alone}");
    assert!(refused(&format!("{PAIR}scheduler: {{speculative: {{method: medusa}}}}\n")).to_string().contains("medusa"));
    for (yaml, key) in [
        ("{step_cost: {fixed_ms: -1, per_token_ms: 0}}", "scheduler.speculative.step_cost.fixed_ms"),
        ("{step_cost: {fixed_ms: 0, per_token_ms: 0}}", "scheduler.speculative.step_cost"),
        ("{step_cost: {fixed_ms: 1}}", "per_token_ms"),
    ] {
        let e = refused(&format!("{PAIR}scheduler: {{speculative: {yaml}}}\n"));
        assert!(e.to_string().contains(key), "{yaml}: {e}");
    }
}
