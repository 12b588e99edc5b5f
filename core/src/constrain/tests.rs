use serde_json::{json, Value};

use super::*;
use crate::rng::SplitMix64;
use crate::tokenize::test_support::qwen3;

/// Qwen3's vocabulary, as the demo models use it (logits are 151,936 wide).
const MODEL_VOCAB: usize = 151_936;

pub(crate) fn compiler() -> Option<(GrammarCompiler, TextTokenizer)> {
    let tokenizer = qwen3()?;
    Some((GrammarCompiler::new(&tokenizer, MODEL_VOCAB).expect("Qwen3's vocabulary reads as bytes"), tokenizer))
}

/// How a walk ended: the text, and whether the grammar completed (or a stop token came).
pub(crate) struct Walk {
    pub text: String,
    pub ended: bool,
}

/// Draws uniformly among the allowed tokens until the grammar completes, a stop token
/// is drawn, or `limit` tokens: the worst case of a model that knows nothing.
pub(crate) fn random_walk(constraint: &TokenConstraint, tokenizer: &TextTokenizer, seed: u64, limit: usize) -> Walk {
    let mut rng = SplitMix64(seed);
    let mut output = Vec::new();
    let stops = tokenizer.eos_token_ids();
    for _ in 0..limit {
        match constraint.next(&output) {
            Next::Allowed(mask) => {
                let pick = (rng.next_u64() % mask.allowed_count() as u64) as usize;
                let token = (0..MODEL_VOCAB as u32).filter(|&t| mask.allows(t)).nth(pick).expect("in the mask");
                if stops.contains(&token) {
                    return Walk { text: tokenizer.decode(&output, true).unwrap(), ended: true };
                }
                output.push(token);
            }
            Next::Complete => return Walk { text: tokenizer.decode(&output, true).unwrap(), ended: true },
            Next::Failed(message) => panic!("the walk failed: {message}"),
        }
    }
    Walk { text: tokenizer.decode(&output, true).unwrap(), ended: false }
}

fn schema_constraint(compiler: &GrammarCompiler, schema: Value) -> TokenConstraint {
    compiler.compile(&GrammarSpec::JsonSchema { schema, strict: true }, &[]).expect("the schema compiles")
}

#[test]
fn random_walks_through_a_schema_end_in_valid_json() {
    let Some((compiler, tokenizer)) = compiler() else { return };
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
        },
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    for seed in 0..12 {
        let constraint = schema_constraint(&compiler, schema.clone());
        let walk = random_walk(&constraint, &tokenizer, seed, 200);
        assert!(walk.ended, "seed {seed}: no end within 200 tokens: {}", walk.text);
        let value: Value = serde_json::from_str(&walk.text).unwrap_or_else(|e| panic!("{e}: {}", walk.text));
        assert!(value["name"].as_str().is_some_and(|n| n.chars().count() <= 8), "{value}");
        assert!(value["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)), "{value}");
        let no_tags = Vec::new();
        let tags = value.get("tags").map_or(Some(&no_tags), Value::as_array).expect("tags is an array");
        assert!(tags.len() <= 3 && tags.iter().all(|t| t == "red" || t == "green"), "{value}");
        let keys = value.as_object().unwrap().keys().filter(|k| !["name", "age", "tags"].contains(&k.as_str()));
        assert_eq!(keys.count(), 0, "no other keys: {value}");
    }
}

#[test]
fn a_regex_allows_exactly_its_language_and_ends_at_a_stop_token() {
    let Some((compiler, tokenizer)) = compiler() else { return };
    let stop = tokenizer.eos_token_ids()[0];
    let constraint = compiler.compile(&GrammarSpec::Regex("(yes|no)".into()), &[stop]).unwrap();
    for seed in 0..8 {
        let walk = random_walk(&constraint, &tokenizer, seed, 10);
        assert!(walk.ended && (walk.text == "yes" || walk.text == "no"), "{:?}", walk.text);
    }
    let yes = tokenizer.encode("yes", false).unwrap();
    match constraint.next(&yes) {
        Next::Allowed(mask) => assert!(mask.allows(stop) && mask.allowed_count() == 1, "only the stop token"),
        Next::Complete => {}
        Next::Failed(m) => panic!("{m}"),
    }
}

#[test]
fn the_mask_sets_every_disallowed_logit_to_minus_infinity() {
    let Some((compiler, tokenizer)) = compiler() else { return };
    let constraint = compiler.compile(&GrammarSpec::Regex("[0-9]+".into()), &[]).unwrap();
    let Next::Allowed(mask) = constraint.next(&[]) else { panic!("a mask") };
    let mut logits = vec![1.0f32; MODEL_VOCAB];
    mask.apply(&mut logits);
    let kept: Vec<u32> = (0..MODEL_VOCAB as u32).filter(|&t| logits[t as usize] == 1.0).collect();
    assert_eq!(kept.len(), mask.allowed_count());
    for &t in &kept {
        let text = tokenizer.decode(&[t], false).unwrap();
        assert!(!text.is_empty() && text.chars().all(|c| c.is_ascii_digit()), "token {t} {text:?}");
    }
    // A shorter row (a model's padded vocabulary cut to the shared one) is masked too.
    let mut short = vec![1.0f32; 1000];
    mask.apply(&mut short);
    assert!(short.iter().zip(0u32..).all(|(&x, t)| (x == 1.0) == mask.allows(t)));
}

#[test]
fn the_state_follows_rewinds_and_replays_of_the_output() {
    let Some((compiler, tokenizer)) = compiler() else { return };
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let shared = schema_constraint(&compiler, schema.clone());
    let text = |t: &str| tokenizer.encode(t, false).unwrap();
    let long = text(r#"{"a":12"#);
    let short = text(r#"{"a":"#);
    // Forward, then back (a crashed step's commits lost), then a different branch.
    let _ = shared.next(&long);
    let after_rewind = mask_of(shared.next(&short));
    let fresh = mask_of(schema_constraint(&compiler, schema.clone()).next(&short));
    assert_eq!(after_rewind, fresh, "a rewind gives the fresh state's mask");
    let branch = text(r#"{"a":7}"#);
    assert!(matches!(shared.next(&branch), Next::Complete | Next::Allowed(_)));
    let wrong = text(r#"{"b"#);
    assert!(matches!(shared.next(&wrong), Next::Failed(_)), "an output outside the grammar fails");
    assert_eq!(mask_of(shared.next(&short)), fresh, "and the state recovers after the failure");
}

fn mask_of(next: Next) -> Vec<u32> {
    match next {
        Next::Allowed(mask) => (0..MODEL_VOCAB as u32).filter(|&t| mask.allows(t)).collect(),
        other => panic!("expected a mask, got {other:?}"),
    }
}

#[test]
fn bad_grammars_are_refused_with_the_reason() {
    let Some((compiler, _)) = compiler() else { return };
    for spec in [
        GrammarSpec::Lark("start: ( unbalanced".into()),
        GrammarSpec::Regex("a(".into()),
        GrammarSpec::JsonSchema { schema: json!({"type": "no-such-type"}), strict: true },
    ] {
        match compiler.compile(&spec, &[]) {
            Err(ConstraintError::InvalidGrammar(reason)) => assert!(!reason.is_empty()),
            other => panic!("{spec:?}: {other:?}"),
        }
    }
}

#[test]
fn a_draft_is_valid_as_far_as_the_grammar_allows_it_and_checking_changes_nothing() {
    let Some((compiler, tokenizer)) = compiler() else { return };
    let stop = tokenizer.eos_token_ids()[0];
    let constraint = compiler.compile(&GrammarSpec::Regex("[0-9]+".into()), &[stop]).unwrap();
    let digits = tokenizer.encode("1234567", false).unwrap();
    let letters = tokenizer.encode(" abc", false).unwrap();
    assert!(digits.len() >= 2, "{digits:?}");
    let draft = [digits.clone(), letters.clone()].concat();
    assert_eq!(constraint.valid_prefix(&[], &draft), digits.len());
    assert_eq!(constraint.valid_prefix(&[], &letters), 0);
    // After some output: its continuation and a stop token where the grammar may end.
    let ending = [digits[1..].to_vec(), vec![stop]].concat();
    assert_eq!(constraint.valid_prefix(&digits[..1], &ending), ending.len());
    // Checking a draft leaves the parse where the output is.
    match constraint.next(&digits[..1]) {
        Next::Allowed(mask) => assert!(mask.allows(digits[1]) && !mask.allows(letters[0])),
        other => panic!("{other:?}"),
    }
}
