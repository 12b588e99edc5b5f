//! `tokenrouter model import` end to end: the real SmolLM2 GGUF (fetched by `.ci/run`) to a
//! folder that `tokenrouter generate` answers from; bad input fails with the reason.

use std::process::{Command, Output};

use tempfile::TempDir;

fn tokenrouter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokenrouter"))
        .args(args)
        .env("TOKENROUTER_THREADS", "2")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn an_imported_smollm2_answers_through_generate() {
    let Some(gguf) = tokenrouter::core::assets::smollm2_gguf() else { return };
    let dir = TempDir::new().unwrap();
    let folder = dir.path().join("smollm2");
    let out = tokenrouter(&["model", "import", "--gguf", gguf.to_str().unwrap(), "--out", folder.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("LlamaForCausalLM") && stdout.contains("30 layers"), "{stdout}");
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(folder.join(file).is_file(), "{file} written");
    }
    // ChatML as the GGUF's template renders it (system prompt included).
    let prompt = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
                  <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let out = tokenrouter(&["generate", "--model", folder.to_str().unwrap(), "--prompt", prompt, "--max-tokens", "32"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Paris"), "{stdout}");
    assert!(stderr.contains("finish: Stop"), "ends by EOS: {stderr}");
}

#[test]
fn a_missing_gguf_or_a_quantized_dtype_fails_with_the_reason() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("absent.gguf");
    let out = tokenrouter(&["model", "import", "--gguf", missing.to_str().unwrap(), "--out", "unused"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("absent.gguf") && stderr.contains("missing"), "{stderr}");

    let out = tokenrouter(&["model", "import", "--gguf", "x.gguf", "--out", "unused", "--dtype", "q4_k"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("f32 or f16"), "{stderr}");
}
