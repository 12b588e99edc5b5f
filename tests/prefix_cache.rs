//! The prefix cache through HTTP: a conversation that resends its transcript reuses the
//! K/V of what it sent before, reports it as `usage.prompt_tokens_details.cached_tokens`,
//! and answers as a server without the cache does: token for token, or parting only at a
//! near tie (a cached prefix's K/V come from another batch shape, so they may differ in
//! the last bits, as vLLM's and SGLang's do).

use crate::http_support::{sse_chunks, Setup, TestServer};
use serde_json::{json, Value};

fn transcript(turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a careful assistant. ".repeat(12)})];
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("Question {turn}: how do caches work? ").repeat(6)}));
        messages.push(json!({"role": "assistant", "content": format!("Answer {turn}: by keeping things. ").repeat(5)}));
    }
    messages.push(json!({"role": "user", "content": "And then?"}));
    json!({
        "model": "tokenrouter-test",
        "messages": messages,
        "max_tokens": 12,
        "seed": 3,
        "temperature": 0.0,
        "logprobs": true,
        "top_logprobs": 2,
        "ignore_eos": true,
    })
}

fn cached_tokens(response: &Value) -> u64 {
    response["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens is reported")
}

struct Turn {
    /// Per output token: the token and the gap between the best two logprobs.
    tokens: Vec<(String, f64)>,
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// Each turn of a growing conversation.
async fn converse(server: &TestServer, turns: usize) -> Vec<Turn> {
    let mut out = Vec::new();
    for turn in 0..turns {
        let (status, response) = server.post_json("/v1/chat/completions", &transcript(turn)).await;
        assert_eq!(status, 200, "{response}");
        let tokens = response["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let top = t["top_logprobs"].as_array().unwrap();
                let gap = top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap();
                (t["token"].as_str().unwrap().to_string(), gap)
            })
            .collect();
        let prompt_tokens = response["usage"]["prompt_tokens"].as_u64().unwrap();
        out.push(Turn { tokens, prompt_tokens, cached_tokens: cached_tokens(&response) });
    }
    out
}

/// Greedy outputs agree up to the first place where the uncached one was a near tie.
fn assert_same_up_to_a_near_tie(cached: &Turn, plain: &Turn, turn: usize) {
    assert_eq!(cached.tokens.len(), plain.tokens.len());
    let parted = cached.tokens.iter().zip(&plain.tokens).position(|(a, b)| a.0 != b.0);
    if let Some(i) = parted {
        assert!(
            plain.tokens[i].1 < 1e-3,
            "turn {turn}: outputs part at token {i}, where the gap was {}",
            plain.tokens[i].1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_conversation_reuses_its_prefix_and_answers_as_without_the_cache() {
    let Some(cached) = TestServer::start_setup(Setup::default(), futures::future::pending()).await else { return };
    let with_cache = converse(&cached, 3).await;
    let uncached_setup = Setup { prefix_cache: false, ..Setup::default() };
    let uncached = TestServer::start_setup(uncached_setup, futures::future::pending()).await.unwrap();
    let without_cache = converse(&uncached, 3).await;
    for (turn, (cached, plain)) in with_cache.iter().zip(&without_cache).enumerate() {
        assert_same_up_to_a_near_tie(cached, plain, turn);
        assert_eq!(plain.cached_tokens, 0, "nothing is cached without the cache");
    }
    assert_eq!(with_cache[0].cached_tokens, 0, "the first turn finds nothing");
    for (turn, now) in with_cache.iter().enumerate().skip(1) {
        // The earlier turn's prompt, in whole 16-token blocks, is reused.
        let (hit, prompt, earlier) = (now.cached_tokens, now.prompt_tokens, with_cache[turn - 1].prompt_tokens);
        assert!(hit >= earlier - 16 - 8 && hit % 16 == 0 && hit < prompt, "turn {turn}: {hit} of {prompt}");
    }
    cached.wait_all_kv_free().await;
    let stats = cached.engine.stats().await;
    assert!(stats.iter().any(|s| s.kv.cached_blocks > 0), "blocks stay cached after the requests end");
    assert!(stats.iter().all(|s| s.stats.prefix_hit_tokens <= s.stats.prefix_lookup_tokens));
    cached.stop().await;
    uncached.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reports_cached_tokens_in_its_usage_chunk() {
    let Some(server) = TestServer::start_setup(Setup::default(), futures::future::pending()).await else { return };
    let mut body = transcript(1);
    server.post_json("/v1/chat/completions", &body).await;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = server.post("/v1/chat/completions", &body).await.text().await.unwrap();
    let chunks = sse_chunks(&text);
    let usage = chunks.iter().find(|c| !c["usage"].is_null()).expect("a usage chunk");
    let prompt = usage["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached_tokens(usage), (prompt - 1) / 16 * 16, "the whole prompt but its last token, in blocks");
    let metrics = server.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("tokenrouter_prefix_cache_hit_tokens_total"), "{metrics}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prefix_cache_drops_every_cached_block_and_the_next_request_computes_its_prompt_again() {
    let Some(server) = TestServer::start_setup(Setup::default(), futures::future::pending()).await else { return };
    let body = transcript(1);
    let (status, _) = server.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let (_, again) = server.post_json("/v1/chat/completions", &body).await;
    assert!(cached_tokens(&again) > 0, "the second send reuses the first one's prompt");
    server.wait_all_kv_free().await;
    let cached_before: usize = server.engine.stats().await.iter().map(|s| s.kv.cached_blocks).sum();
    assert!(cached_before > 0);

    let (status, reset) = server.post_json("/reset_prefix_cache", &json!({})).await;
    assert_eq!(status, 200, "{reset}");
    assert_eq!(reset["reset"], true, "{reset}");
    let models = reset["models"].as_array().unwrap();
    assert_eq!(models.len(), server.engine.model_names().len(), "{reset}");
    let dropped: u64 = models.iter().map(|m| m["dropped_blocks"].as_u64().unwrap()).sum();
    assert_eq!(dropped as usize, cached_before, "{reset}");
    let stats = server.engine.stats().await;
    assert!(stats.iter().all(|s| s.kv.cached_blocks == 0), "nothing stays cached");
    assert!(stats.iter().all(|s| s.kv.free_blocks == s.kv.total_blocks), "the blocks are free again");

    let (status, after) = server.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    assert_eq!(cached_tokens(&after), 0, "the prompt is computed again");
    let (_, reset) = server.post_json("/reset_prefix_cache", &json!({})).await;
    assert!(reset["models"].as_array().unwrap().iter().any(|m| m["dropped_blocks"].as_u64().unwrap() > 0));
    server.stop().await;
}
