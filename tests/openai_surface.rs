//! The OpenAI surface beyond one plain sample, over real HTTP against the engine on
//! two tiny random models: `n` choices, `logit_bias`, structured outputs, and
//! `/tokenize` / `/detokenize`. Tests skip, saying why, without the Qwen3 tokenizer.

mod http_support;

use http_support::*;
use serde_json::{json, Value};

fn choice_text(choice: &Value) -> String {
    choice["message"]["content"].as_str().or(choice["text"].as_str()).unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_are_each_reproducible_with_their_seed_streamed_or_not() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let mut body = chat("Tell me something.", 8, 11);
    body["temperature"] = json!(0.9);
    body["n"] = json!(3);
    let (status, whole) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(whole["usage"]["completion_tokens"], 24, "three outputs of 8");
    let texts: Vec<String> = choices.iter().map(choice_text).collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "seeds differ per choice: {texts:?}");
    for (i, text) in texts.iter().enumerate() {
        let mut alone = chat("Tell me something.", 8, 11 + i as u64);
        alone["temperature"] = json!(0.9);
        let (_, one) = s.post_json("/v1/chat/completions", &alone).await;
        assert_eq!(&choice_text(&one["choices"][0]), text, "choice {i} is the n = 1 output of seed 11 + {i}");
    }
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let chunks = sse_chunks(&s.post("/v1/chat/completions", &body).await.text().await.unwrap());
    for (i, text) in texts.iter().enumerate() {
        let of_choice: Vec<&Value> =
            chunks.iter().filter_map(|c| c["choices"].get(0)).filter(|c| c["index"] == i).collect();
        let streamed: String = of_choice.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
        assert_eq!(&streamed, text, "choice {i} streamed");
        assert_eq!(of_choice.iter().filter(|c| !c["finish_reason"].is_null()).count(), 1, "one finish per choice");
    }
    let usage: Vec<&Value> = chunks.iter().filter(|c| c.get("usage").is_some_and(|u| !u.is_null())).collect();
    assert_eq!(usage.len(), 1, "one usage chunk for all choices");
    assert_eq!(usage[0]["usage"], whole["usage"]);
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logit_bias_of_100_makes_greedy_output_that_token_on_both_endpoints() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let bias = json!({ "1000": 100, "1001": -100 });
    let mut body = chat("Anything.", 5, 1);
    body["temperature"] = json!(0);
    body["logit_bias"] = bias.clone();
    body["return_token_ids"] = json!(true);
    let (status, chat_out) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{chat_out}");
    assert_eq!(chat_out["choices"][0]["token_ids"], json!(vec![1000; 5]), "{chat_out}");
    let completion = json!({ "prompt": [9707, 11], "max_tokens": 5, "temperature": 0, "ignore_eos": true,
        "logit_bias": bias, "return_token_ids": true });
    let (status, text_out) = s.post_json("/v1/completions", &completion).await;
    assert_eq!(status, 200, "{text_out}");
    assert_eq!(text_out["choices"][0]["token_ids"], json!(vec![1000; 5]), "{text_out}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regex_and_a_lark_grammar_shape_the_output_on_random_weights() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    for seed in 0..4 {
        let mut body = chat("Answer.", 40, seed);
        body["temperature"] = json!(1.0);
        body["response_format"] = json!({ "type": "regex", "regex": "(yes|no), [0-9]{3}" });
        let (status, out) = s.post_json("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{out}");
        let text = choice_text(&out["choices"][0]);
        let (word, digits) = text.split_once(", ").unwrap_or_else(|| panic!("{text:?}"));
        assert!(["yes", "no"].contains(&word) && digits.len() == 3 && digits.chars().all(|c| c.is_ascii_digit()));
        assert_eq!(out["choices"][0]["finish_reason"], "stop", "the grammar's end ends the output");
        body["response_format"] =
            json!({ "type": "grammar", "grammar": "start: \"[\" item (\",\" item)* \"]\"\nitem: \"a\" | \"b\"" });
        let (status, out) = s.post_json("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{out}");
        let text = choice_text(&out["choices"][0]);
        let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
        let valid = inner.is_some_and(|items| items.split(',').all(|i| i == "a" || i == "b"));
        let finished = out["choices"][0]["finish_reason"] == "stop";
        assert!(valid || !finished, "a finished output is in the language: {text:?}");
    }
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_round_trip() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let (status, tokens) = s.post_json("/tokenize", &json!({ "prompt": "Hello world" })).await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["tokens"], json!([9707, 1879]), "Qwen3's ids");
    assert_eq!(tokens["count"], 2);
    assert!(tokens["max_model_len"].as_u64().unwrap() > 0);
    let (status, text) = s.post_json("/detokenize", &json!({ "tokens": [9707, 1879] })).await;
    assert_eq!((status, text["prompt"].clone()), (200, json!("Hello world")));
    let messages = json!({ "messages": [{"role": "user", "content": "Hi"}] });
    let (status, chat_tokens) = s.post_json("/tokenize", &messages).await;
    assert_eq!(status, 200, "{chat_tokens}");
    let ids = chat_tokens["tokens"].clone();
    let (_, rendered) = s.post_json("/detokenize", &json!({ "tokens": ids })).await;
    let rendered = rendered["prompt"].as_str().unwrap();
    assert!(rendered.starts_with("<|im_start|>user\nHi<|im_end|>") && rendered.ends_with("assistant\n"), "{rendered}");
    let (status, bad) = s.post_json("/detokenize", &json!({ "tokens": [u32::MAX] })).await;
    assert_eq!(status, 400);
    assert_envelope(&bad, Some("tokens"));
    let (status, both) = s.post_json("/tokenize", &json!({ "prompt": "a", "messages": [] })).await;
    assert_eq!(status, 400, "{both}");
    s.stop().await;
}
