//! Structured outputs through the routed engine: with a JSON schema on, batched routed
//! serving still equals the sequential reference (each constrained by the same
//! grammar), and every output is JSON that satisfies its schema, on random weights.

use serde_json::{json, Value};
use tokenrouter_core::constrain::{GrammarCompiler, GrammarSpec};
use tokenrouter_core::tokenize::TextTokenizer;

use super::*;

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}},
            "required": ["colors"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "point": {"type": "object", "properties": {
                "x": {"type": "integer", "minimum": -5, "maximum": 5},
                "y": {"type": "integer", "minimum": -5, "maximum": 5}},
                "required": ["x", "y"], "additionalProperties": false},
            "ok": {"type": "boolean"}},
            "required": ["point", "ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "level": {"enum": ["low", "mid", "high"]},
            "note": {"type": "string", "maxLength": 4}},
            "required": ["level"], "additionalProperties": false}),
    ]
}

/// The checks these schemas need (a subset of JSON Schema); the Python client tests
/// validate with the `jsonschema` package on more shapes.
fn violations(value: &Value, schema: &Value, path: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            found.push(format!("{path}: {value} not in {allowed:?}"));
        }
    }
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => found.extend(object_violations(value, schema, path)),
        Some("array") => {
            let Some(items) = value.as_array() else { return vec![format!("{path}: not an array")] };
            if bound("minItems").is_some_and(|m| (items.len() as f64) < m)
                || bound("maxItems").is_some_and(|m| (items.len() as f64) > m)
            {
                found.push(format!("{path}: {} items", items.len()));
            }
            for (i, item) in items.iter().enumerate() {
                found.extend(violations(item, &schema["items"], &format!("{path}[{i}]")));
            }
        }
        // JSON Schema counts any number with no fraction as an integer (`-0` too).
        Some("integer") => match value.as_f64().filter(|n| n.fract() == 0.0) {
            Some(n) if bound("minimum").is_none_or(|m| n >= m) && bound("maximum").is_none_or(|m| n <= m) => {}
            _ => found.push(format!("{path}: {value} is not an integer in bounds")),
        },
        Some("string") => match value.as_str() {
            Some(s) if bound("maxLength").is_none_or(|m| s.chars().count() as f64 <= m) => {}
            _ => found.push(format!("{path}: {value} is not a short enough string")),
        },
        Some("boolean") if !value.is_boolean() => found.push(format!("{path}: {value} is not a boolean")),
        _ => {}
    }
    found
}

fn object_violations(value: &Value, schema: &Value, path: &str) -> Vec<String> {
    let Some(object) = value.as_object() else { return vec![format!("{path}: not an object")] };
    let properties = schema["properties"].as_object().cloned().unwrap_or_default();
    let mut found: Vec<String> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|key| !object.contains_key(*key))
        .map(|key| format!("{path}: missing {key}"))
        .collect();
    for (key, item) in object {
        match properties.get(key) {
            Some(sub) => found.extend(violations(item, sub, &format!("{path}.{key}"))),
            None => found.push(format!("{path}: unexpected key {key}")),
        }
    }
    found
}

fn constrained_request(m: &Models, i: u64) -> (GenerateRequest, Value) {
    let schema = schemas()[i as usize % 4].clone();
    let mut r = GenerateRequest::new(request(i).prompt, 160);
    r.prompt = r.prompt.iter().map(|&t| (t as u64 * 7919 % m.vocab as u64) as u32).collect();
    r.sampling =
        SamplingParams { temperature: if i % 2 == 0 { 0.0 } else { 0.9 }, seed: 500 + i, ..Default::default() };
    r.grammar = Some(GrammarSpec::JsonSchema { schema: schema.clone(), strict: true });
    (r, schema)
}

/// The reference's outputs for `n` constrained requests, with the engine's stop ids.
fn constrained_reference(
    m: &Models,
    policy: Arc<dyn Policy>,
    stop_ids: &[u32],
    n: u64,
) -> HashMap<u64, ReferenceOutput> {
    let tokenizer = TextTokenizer::from_folder(m.dirs[0].path()).unwrap();
    let compiler = GrammarCompiler::new(&tokenizer, m.vocab).unwrap();
    run_reference(m, n, |i| {
        let (r, _) = constrained_request(m, i);
        let constraint = compiler.compile(r.grammar.as_ref().unwrap(), stop_ids).unwrap();
        RequestSpec {
            id: i,
            prompt: r.prompt,
            max_tokens: r.max_tokens,
            sampling: r.sampling,
            stop_ids: stop_ids.to_vec(),
            policy: policy.clone(),
            constraint: Some(Arc::new(constraint)),
            speculation: None,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_routed_serving_equals_the_reference_and_every_output_validates() {
    let Some(m) = qwen3_models(&[BackendKind::Candle, BackendKind::Candle]) else { return };
    let policy = random_qwen3(0.3);
    let engine = Engine::start(engine_config(&m, policy.clone(), &[2, 2])).await.unwrap();
    let tokenizer = engine.tokenizer().expect("the models carry Qwen3's tokenizer").clone();
    let mut stop_ids: Vec<u32> = engine.model_configs().iter().flat_map(|c| c.eos_token_ids.clone()).collect();
    stop_ids.extend(tokenizer.eos_token_ids());
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let n = 12;
    let want = constrained_reference(&m, policy, &stop_ids, n);
    let tasks: Vec<_> = (0..n)
        .rev()
        .map(|i| {
            let engine = engine.clone();
            let (r, schema) = constrained_request(&m, i);
            tokio::spawn(async move { (i, schema, collect(&engine, r).await) })
        })
        .collect();
    let mut models_used = std::collections::HashSet::new();
    for task in tasks {
        let (i, schema, (tokens, end)) = task.await.unwrap();
        assert!(matches!(end, GenerationEvent::Finished { .. }), "request {i}: {end:?}");
        want[&i].check(&tokens, 1e-4).unwrap_or_else(|e| panic!("request {i}: {e}"));
        let ids: Vec<u32> = tokens.iter().map(|&(t, _)| t).filter(|t| !stop_ids.contains(t)).collect();
        let text = tokenizer.decode(&ids, true).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("request {i}: {e}: {text:?}"));
        assert_eq!(violations(&value, &schema, "$"), Vec::<String>::new(), "request {i}: {text}");
        models_used.extend(tokens.iter().map(|&(_, model)| model));
    }
    assert_eq!(models_used.len(), 2, "both models wrote constrained tokens");
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}
