//! Loading refuses broken checkpoints with messages that say what is wrong.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use tempfile::TempDir;
use tokenrouter_core::model::init::{write_random_model, InitOptions};
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::{CandleBackend, LoadOptions, ModelError};

fn model_dir() -> TempDir {
    let dir = TempDir::new().unwrap();
    let config = qwen3_shaped(32, 1, 2, 1, 64, 50);
    write_random_model(&config, &InitOptions::default(), dir.path()).unwrap();
    dir
}

fn load_err(dir: &std::path::Path) -> ModelError {
    match CandleBackend::load(dir, &LoadOptions::default()) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e,
    }
}

fn edit_config(dir: &TempDir, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn a_written_random_model_loads() {
    let dir = model_dir();
    CandleBackend::load(dir.path(), &LoadOptions::default()).unwrap();
}

#[test]
fn missing_folder_is_named() {
    let err = load_err(std::path::Path::new("/no/such/model"));
    assert!(matches!(err, ModelError::MissingFolder(_)), "{err}");
    assert!(err.to_string().contains("/no/such/model"));
}

#[test]
fn missing_weights_file_is_named() {
    let dir = model_dir();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn missing_config_is_named() {
    let dir = model_dir();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert!(load_err(dir.path()).to_string().contains("config.json"));
}

#[test]
fn unknown_architecture_is_named() {
    let dir = model_dir();
    edit_config(&dir, |v| v["architectures"] = serde_json::json!(["GPTNeoXForCausalLM"]));
    let err = load_err(dir.path()).to_string();
    assert!(err.contains("GPTNeoXForCausalLM") && err.contains("Qwen3ForCausalLM"), "{err}");
}

#[test]
fn shape_that_disagrees_with_config_names_the_tensor() {
    let dir = model_dir();
    edit_config(&dir, |v| v["intermediate_size"] = 96.into());
    let err = load_err(dir.path());
    match &err {
        ModelError::ShapeMismatch { name, expected, found } => {
            assert_eq!(name, "model.layers.0.mlp.gate_proj.weight");
            assert_eq!((expected.as_slice(), found.as_slice()), (&[96, 32][..], &[64, 32][..]));
        }
        other => panic!("wrong error: {other}"),
    }
}

#[test]
fn missing_tensor_is_named() {
    let dir = model_dir();
    let path = dir.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    tensors.remove("model.layers.0.self_attn.k_norm.weight");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let err = load_err(dir.path());
    assert!(err.to_string().contains("model.layers.0.self_attn.k_norm.weight"), "{err}");
}

#[test]
fn integer_weights_are_refused_by_name() {
    let dir = model_dir();
    let path = dir.path().join("model.safetensors");
    let mut tensors: HashMap<String, Tensor> = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    tensors.insert("model.norm.weight".into(), Tensor::zeros(32, candle_core::DType::U8, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let err = load_err(dir.path()).to_string();
    assert!(err.contains("model.norm.weight") && err.contains("dtype"), "{err}");
}
