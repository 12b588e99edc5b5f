//! Every ready configuration under `config/` parses, passes its checks, and prepares an
//! engine config (with its presets shrunk to `tiny` so that the test stays fast).

use std::path::{Path, PathBuf};

use tokenrouter::config::{ModelCache, Preset, ServerConfig, TokenizerChoice};

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
    for expected in ["demo.yaml", "ensemble.yaml", "random.yaml", "rstitch.yaml", "single.yaml"] {
        assert!(names.iter().any(|n| n == expected), "config/{expected} is missing: {names:?}");
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ModelCache::new(cache_dir.path(), TokenizerChoice::BuiltIn);
    for file in &files {
        let config = ServerConfig::load(file).unwrap_or_else(|e| panic!("{e}"));
        config.check().unwrap_or_else(|e| panic!("{}: {e}", file.display()));
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
