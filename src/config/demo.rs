//! The built-in demo that `tokenrouter serve` runs without a config file: two
//! random-weight Qwen3-shaped models (the `tiny` and `small` presets) routed by the
//! `random` policy. `config/demo.yaml` is the same configuration as a file.

use std::path::{Path, PathBuf};

use tokenrouter_core::model::gguf_read::is_gguf_file;

use serde_json::json;

use super::hub::HubModel;
use super::scheduler::SchedulerSection;
use super::schema::{AllowedPolicy, ModelEntry, PolicySection, Preset, ServerSection};
use super::ServerConfig;

/// The demo: `small` (the `tiny` preset, seed 1) and `large` (the `small` preset,
/// seed 2), policy `random` with p = 0.2; requests may pick `rstitch`, `random` or
/// `always`. On first use `prepare` writes both models into the cache (about 40 MB and
/// 410 MB with the Qwen3 tokenizer, a few seconds).
pub fn demo_config() -> ServerConfig {
    ServerConfig {
        models: vec![ModelEntry::preset("small", Preset::Tiny, 1), ModelEntry::preset("large", Preset::Small, 2)],
        policy: PolicySection {
            name: "random".to_string(),
            params: json!({ "p": 0.2 }),
            seed: 0,
            allowed: ["rstitch", "random", "always"].into_iter().map(AllowedPolicy::named).collect(),
        },
        scheduler: SchedulerSection::default(),
        server: ServerSection::default(),
        admission: Default::default(),
        supervision: Default::default(),
        debug: Default::default(),
        pools: None,
        tokenization: Default::default(),
        cluster: None,
        base_dir: PathBuf::from("."),
    }
}

/// A Hugging Face folder (with config.json) or a GGUF file.
fn is_model_path(path: &Path) -> bool {
    path.join("config.json").is_file() || is_gguf_file(path)
}

/// One model served alone from `path` (`serve --model PATH`), named by its folder or
/// file stem; a GGUF file without tokenizer files beside it gets its tokenizer rebuilt
/// from its metadata when the config is prepared.
fn single_model_config(path: &Path) -> ServerConfig {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    single_model(ModelEntry::path(&model_name(&stem), path))
}

/// One model served alone from the Hub (`serve --model ORG/NAME[:FILE]`), named by the
/// repository (or the file's stem); downloaded when the config is prepared.
fn hub_model_config(id: &HubModel) -> ServerConfig {
    single_model(ModelEntry::hub(&model_name(id.short_name()), &id.to_string()))
}

fn model_name(stem: &str) -> String {
    let name: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    if name.is_empty() {
        "model".to_string()
    } else {
        name
    }
}

fn single_model(model: ModelEntry) -> ServerConfig {
    let mut config = demo_config();
    config.models = vec![model];
    config.policy = PolicySection::default();
    config
}

/// The configurations `serve --model NAME` and `chat --model NAME` run.
pub const BUILTIN_CONFIG_NAMES: &[&str] = &["demo", "smollm2", "smollm2-routed"];

/// A built-in configuration by name: `demo` (the above), or `smollm2` / `smollm2-routed`,
/// the files `config/smollm2.yaml` and `config/smollm2-routed.yaml` compiled in (they name
/// no relative paths, so the folder they resolve against does not matter).
pub fn builtin_config(name: &str) -> Result<ServerConfig, String> {
    let text = match name {
        "demo" => return Ok(demo_config()),
        "smollm2" => include_str!("../../config/smollm2.yaml"),
        "smollm2-routed" => include_str!("../../config/smollm2-routed.yaml"),
        other if is_model_path(Path::new(other)) => return Ok(single_model_config(Path::new(other))),
        other if !Path::new(other).exists() && HubModel::parse(other).is_some() => {
            return Ok(hub_model_config(&HubModel::parse(other).expect("parsed above")))
        }
        other => {
            return Err(format!(
                "{other:?} is neither a built-in configuration ({}) nor a model folder or .gguf file, \
                 and not a Hub id (ORG/NAME, or ORG/NAME:FILE for a GGUF file)",
                BUILTIN_CONFIG_NAMES.join(", ")
            ))
        }
    };
    ServerConfig::from_yaml_str(text, std::path::Path::new(".")).map_err(|e| format!("built-in `{name}`: {e}"))
}
