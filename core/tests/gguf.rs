//! `model::gguf`: an HF folder written as GGUF reads back with llama.cpp's names,
//! hyper-parameters, the whole vocabulary, and weights within the type's precision.

use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device};
use tempfile::TempDir;
use tokenrouter_core::model::config::ModelConfig;
use tokenrouter_core::model::gguf::{write_gguf, GgufType};
use tokenrouter_core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::weights::Checkpoint;

/// A tiny Qwen3 with the real tokenizer (its vocabulary size), or None without it.
fn tiny_qwen3() -> Option<TempDir> {
    let tokenizer = tokenrouter_core::assets::tokenizer_dir("qwen3")?;
    let dir = TempDir::new().unwrap();
    let config = qwen3_shaped(256, 2, 4, 2, 512, 151_936);
    write_random_model(&config, &InitOptions { seed: 5, std: 0.05 }, dir.path()).unwrap();
    copy_tokenizer(&tokenizer, dir.path()).unwrap();
    Some(dir)
}

fn read(path: &Path) -> (Content, std::fs::File) {
    let mut file = std::fs::File::open(path).unwrap();
    (Content::read(&mut file).unwrap(), file)
}

#[test]
fn every_type_reads_back_with_names_metadata_and_close_weights() {
    let Some(model) = tiny_qwen3() else {
        eprintln!("skipped: the Qwen3 tokenizer is not fetched (run .ci/run)");
        return;
    };
    let config = ModelConfig::from_file(&model.path().join("config.json")).unwrap();
    let checkpoint = Checkpoint::open(model.path(), DType::F32).unwrap();
    for (ty, tolerance) in [(GgufType::F32, 0.0), (GgufType::F16, 1e-3), (GgufType::Q8_0, 1e-2), (GgufType::Q4K, 0.15)]
    {
        let out = model.path().join("model.gguf");
        write_gguf(model.path(), &out, ty).unwrap();
        let (content, mut file) = read(&out);
        let meta = |k: &str| content.metadata.get(k).unwrap_or_else(|| panic!("{ty:?}: no {k}"));
        assert_eq!(meta("general.architecture").to_string().unwrap(), "qwen3");
        assert_eq!(meta("qwen3.block_count").to_u32().unwrap(), 2);
        assert_eq!(meta("qwen3.attention.head_count_kv").to_u32().unwrap(), config.num_kv_heads as u32);
        assert_eq!(meta("tokenizer.ggml.tokens").to_vec().unwrap().len(), config.vocab_size);
        assert!(meta("tokenizer.ggml.merges").to_vec().unwrap().len() > 100_000);
        assert_eq!(content.tensor_infos.len(), checkpoint.shapes().len(), "{ty:?}");
        for (hf, gguf) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight"),
            ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
            ("model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
        ] {
            let shape = checkpoint.shapes().into_iter().find(|(n, _)| n == hf).unwrap().1;
            let want = checkpoint.load(hf, &shape).unwrap();
            let got = content.tensor(&mut file, gguf, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
            assert_eq!(got.dims(), want.dims(), "{ty:?} {gguf}");
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let error = (got - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(error <= tolerance * scale, "{ty:?} {gguf}: error {error} at scale {scale}");
        }
    }
}

#[test]
fn a_folder_without_a_tokenizer_is_refused_with_its_path() {
    let dir = TempDir::new().unwrap();
    write_random_model(&qwen3_shaped(32, 1, 2, 1, 64, 300), &InitOptions::default(), dir.path()).unwrap();
    let e = write_gguf(dir.path(), &dir.path().join("x.gguf"), GgufType::F16).unwrap_err();
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}
