//! Every ready configuration under `config/` parses, passes its checks, and prepares an
//! engine config (with its presets shrunk to `tiny` so that the test stays fast).

use std::path::{Path, PathBuf};

use tokenrouter::config::{KnownModel, ModelCache, Preset, ServerConfig, TokenizerChoice};

fn config_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_ready_config_loads_checks_and_prepares() {
    let files = config_files();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for expected in [
        "demo.yaml",
        "ensemble.yaml",
        "random.yaml",
        "rstitch.yaml",
        "single.yaml",
        "smollm2.yaml",
        "smollm2-routed.yaml",
    ] {
        assert!(names.iter().any(|n| n == expected), "config/{expected} is missing: {names:?}");
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ModelCache::new(cache_dir.path(), TokenizerChoice::BuiltIn);
    for file in &files {
        let config = ServerConfig::load(file).unwrap_or_else(|e| panic!("{e}"));
        config.check_with(&cache).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // A known model is prepared from its file, which only the test assets have.
        if config.models.iter().any(|m| m.source.is_some()) && tokenrouter::core::assets::smollm2_gguf().is_none() {
            continue;
        }
        let mut small = config.clone();
        for model in &mut small.models {
            if model.preset.is_some() {
                model.preset = Some(Preset::Tiny);
            }
        }
        let prepared = small.prepare(&cache, None).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(prepared.engine.models.len(), config.models.len(), "{}", file.display());
        assert_eq!(prepared.engine.default_policy.name(), config.policy.name, "{}", file.display());
        for allowed in &config.policy.allowed {
            prepared.catalog.build(&allowed.name, None).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
    }
}

#[test]
fn the_ensemble_has_three_models_and_single_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    assert_eq!(ServerConfig::load(&dir.join("ensemble.yaml")).unwrap().models.len(), 3);
    let single = ServerConfig::load(&dir.join("single.yaml")).unwrap();
    assert_eq!((single.models.len(), single.policy.name.as_str()), (1, "always"));
}

/// `serve --model NAME` runs these: the same configurations as the files.
#[test]
fn the_built_in_configurations_are_the_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    for name in ["smollm2", "smollm2-routed"] {
        let mut file = ServerConfig::load(&dir.join(format!("{name}.yaml"))).unwrap();
        file.base_dir = ".".into();
        assert_eq!(tokenrouter::config::builtin_config(name).unwrap(), file, "{name}");
    }
    assert_eq!(tokenrouter::config::builtin_config("demo").unwrap(), tokenrouter::config::demo_config());
    let e = tokenrouter::config::builtin_config("gpt5").unwrap_err();
    assert!(e.contains("smollm2-routed"), "{e}");
}

#[test]
fn the_smollm2_configs_pair_a_real_model_with_a_preset_of_its_vocabulary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let single = ServerConfig::load(&dir.join("smollm2.yaml")).unwrap();
    assert_eq!(single.models.len(), 1);
    assert_eq!(single.models[0].source, Some(KnownModel::Smollm2));
    let routed = ServerConfig::load(&dir.join("smollm2-routed.yaml")).unwrap();
    assert_eq!(routed.models[0].preset, Some(Preset::Tiny));
    assert_eq!(routed.models[0].tokenizer, Some(KnownModel::Smollm2));
    assert_eq!(routed.models[1].source, Some(KnownModel::Smollm2));
    assert_eq!(routed.policy.name, "random");
}

#[test]
fn a_model_entry_takes_one_of_path_preset_and_source() {
    let base = Path::new(".");
    let both = "models:\n  - {name: m, preset: tiny, source: smollm2}\n";
    let e = ServerConfig::from_yaml_str(both, base).unwrap_err().to_string();
    assert!(e.contains("models[0]: give one of `preset`, `source`, not several"), "{e}");
    let stray = "models:\n  - {name: m, source: smollm2, tokenizer: smollm2}\n";
    let e = ServerConfig::from_yaml_str(stray, base).unwrap_err().to_string();
    assert!(e.contains("models[0].tokenizer: only preset models take a tokenizer"), "{e}");
    let unknown = "models:\n  - {name: m, source: gpt5}\n";
    let e = ServerConfig::from_yaml_str(unknown, base).unwrap_err().to_string();
    assert!(e.contains("models[0].source") && e.contains("smollm2"), "{e}");
}
