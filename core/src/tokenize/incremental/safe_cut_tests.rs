//! The safe-cut rule on its own: which tokenizers get one, hand-picked traps, and property
//! tests on generated strings (every position the rule calls safe really splits tokenization).

use proptest::prelude::*;

use super::eligibility::{cut_rule_for, RegexFamily};
use super::safe_cut::{AddedTokenGuard, CutRule};
use super::test_tokenizers::{campaign_tokenizers, gpt2_style, PIECES, SPECIALS};
use crate::tokenize::test_support::{llama3, metaspace_tokenizer, qwen3};
use crate::tokenize::TextTokenizer;

fn rule(tok: &TextTokenizer) -> CutRule {
    cut_rule_for(tok.raw()).unwrap_or_else(|e| panic!("{}: {e}", tok.name()))
}

fn safe_cuts(rule: &CutRule, text: &str) -> Vec<usize> {
    (0..=text.len()).filter(|&p| rule.is_safe_cut(text, p)).collect()
}

#[test]
fn families_are_read_from_the_tokenizers_themselves() {
    assert_eq!(rule(&gpt2_style()).family(), RegexFamily::Gpt2);
    if let Some(q) = qwen3() {
        assert_eq!(rule(&q).family(), RegexFamily::Qwen2);
    }
    if let Some(l) = llama3() {
        assert_eq!(rule(&l).family(), RegexFamily::Cl100k);
    }
    let err = cut_rule_for(metaspace_tokenizer().raw()).unwrap_err();
    assert!(err.to_string().contains("not understood"), "{err}");
}

#[test]
fn hand_picked_traps() {
    let gpt2 = rule(&gpt2_style());
    let cl100k = CutRule::new(RegexFamily::Cl100k, AddedTokenGuard::default());
    // a space after a word; never before a space that follows whitespace
    assert_eq!(safe_cuts(&gpt2, "ab cd"), vec![2]);
    assert_eq!(safe_cuts(&gpt2, "ab  cd"), vec![2]);
    // punctuation after a letter, but not an apostrophe (contractions)
    assert_eq!(safe_cuts(&gpt2, "ab.c"), vec![2]);
    assert!(safe_cuts(&gpt2, "don't").is_empty());
    // a newline then text: GPT-2's regex keeps a text-final " \n" whole
    assert_eq!(safe_cuts(&cl100k, "a \nb"), vec![1, 3]);
    assert_eq!(safe_cuts(&gpt2, "a \nb"), vec![1]);
    assert_eq!(safe_cuts(&gpt2, "a\nb"), vec![2]);
    assert!(safe_cuts(&gpt2, "a\n/b").is_empty());
    // never before a combining mark or any non-ASCII character
    assert!(safe_cuts(&gpt2, "cafe\u{301}").is_empty());
    assert!(safe_cuts(&gpt2, "a中文").is_empty());
    // never inside a special token, even where a rule would allow it
    assert_eq!(safe_cuts(&gpt2, "x<|im_end|> y"), vec![1, 11]);
    assert_eq!(safe_cuts(&cl100k, "x<|im_end|> y"), vec![1, 5, 9, 11], "without the guard");
}

fn generated_text() -> impl Strategy<Value = String> {
    prop::collection::vec(0..PIECES.len(), 1..48).prop_map(|ix| ix.into_iter().map(|i| PIECES[i]).collect())
}

/// `encode(text) == encode(text[..p]) ++ encode(text[p..])` at every safe cut `p`.
fn check_every_safe_cut(tok: &TextTokenizer, text: &str) -> Result<(), TestCaseError> {
    let rule = rule(tok);
    let full = tok.encode(text, false).unwrap();
    for p in safe_cuts(&rule, text) {
        let mut split = tok.encode(&text[..p], false).unwrap();
        split.extend(tok.encode(&text[p..], false).unwrap());
        prop_assert_eq!(&split, &full, "{}: cut at {} of {:?}", tok.name(), p, text);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn every_safe_cut_splits_tokenization_exactly(text in generated_text()) {
        for (_, tok) in campaign_tokenizers() {
            check_every_safe_cut(&tok, &text)?;
        }
    }

    #[test]
    fn safe_cuts_avoid_specials_ends_and_non_ascii(text in generated_text()) {
        let rule = rule(&gpt2_style());
        for p in safe_cuts(&rule, &text) {
            prop_assert!(p > 0 && p < text.len() && text.as_bytes()[p].is_ascii());
            for special in SPECIALS {
                let inside = text.match_indices(special).any(|(at, s)| at < p && p < at + s.len());
                prop_assert!(!inside, "cut {} inside {} in {:?}", p, special, text);
            }
        }
    }
}
