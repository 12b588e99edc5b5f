//! The tokenizer we rebuild from SmolLM2's GGUF (`gguf_import::write_gguf_tokenizer`)
//! against llama.cpp's own on the same file (`llama_tokenize`): the same ids for 10,000
//! generated strings (prose, code, digits, whitespace runs, scripts, emoji, combining
//! marks, chat-template specials, mixed) and a list of nasty ones. Both sides match
//! control tokens written in the text, as our encode does, and add no BOS (SmolLM2's
//! vocabulary asks for none; asked to add specials, both still add none).

use tempfile::TempDir;
use tokenrouter_core::model::gguf_import::write_gguf_tokenizer;
use tokenrouter_core::model::llamacpp::LlamaCppBackend;
use tokenrouter_core::rng::SplitMix64;
use tokenrouter_core::tokenize::TextTokenizer;

use crate::support::{options, smollm2};

const GENERATED: usize = 10_000;

#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "quick", "Brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "don't", "it's", "we'll",
    "THEY'RE", "I'm", "you've", "he'd", "y'all", "naïve", "café", "über", "résumé", "Paris", "capital", "SmolLM",
    "tokenizer", "a", "I", "internationalization", "antidisestablishmentarianism", "Mr.", "e.g.", "U.S.A.",
];
const PUNCTUATION: &[&str] =
    &[".", ",", ";", ":", "!", "?", "'", "\"", "(", ")", "-", "—", "–", "…", "...", "?!", "''", "'s", "'S", "'ll"];
#[rustfmt::skip]
const CODE: &[&str] = &[
    "fn", "main()", "{", "}", "=>", "->", "::", "&&", "||", "!=", "===", "+=", "<<=", "#include", "<stdio.h>",
    "\"str\"", "'c'", "// comment", "/* x */", "self.x", "[0]", "x**2", "0x1F", "@decorator", "$var", "`tick`",
    "\\n", "let mut v = Vec::new();", "def f(x):", "return", "    ", "\t", "</div>", "&nbsp;",
    "println!(\"{}\", x);", "i++", "a_b_c", "CamelCase", "snake_case_name", "__init__",
];
#[rustfmt::skip]
const SCRIPTS: &[&str] = &[
    "東京", "漢字", "かな", "カタカナ", "한국어", "Москва", "Ελληνικά", "مرحبا", "بالعالم", "שלום", "עולם", "हिन्दी", "ไทย", "😀",
    "🦀", "🎉", "👨‍👩‍👧", "🇫🇷", "👍🏽", "❤️", "e\u{301}", "a\u{300}\u{316}", "n\u{303}", "\u{200d}", "\u{200b}",
    "\u{feff}", "\u{202e}", "\u{200f}", "½", "²", "٣٤", "१२", "①", "Ⅻ", "ß", "ﬁ", "𝔘𝔫𝔦", "∑", "≤", "€", "£", "¿",
    "¡", "Ω", "µ",
];
#[rustfmt::skip]
const SPECIALS: &[&str] = &[
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\n", "<|im_start|>assistant\n",
    "<|im_start|>system\n", "<|im_", "|>", "<|", "<|im_end", "<im_end>",
];
const WHITESPACE: &[char] = &[' ', ' ', ' ', ' ', '\t', '\n', '\n', '\r', '\u{a0}', '\u{3000}', '\u{2003}', '\u{b}'];
/// Ranges of long-assigned code points (no Unicode version disagreement) to draw from.
#[rustfmt::skip]
const CODE_POINTS: &[(u32, u32)] = &[
    (0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17F), (0x300, 0x36F), (0x3B1, 0x3C9), (0x400, 0x4FF), (0x5D0, 0x5EA),
    (0x620, 0x64A), (0x660, 0x669), (0x905, 0x939), (0x966, 0x96F), (0x2000, 0x200F), (0x2010, 0x2027),
    (0x3041, 0x3096), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0x1F300, 0x1F64F),
];

/// Strings that have broken tokenizers before: empty and whitespace-only texts, runs
/// before words, specials at edges and half-written, digit forms, joiners, controls.
fn nasty_strings() -> Vec<String> {
    #[rustfmt::skip]
    let fixed = [
        "", " ", "  ", "\n", "\n\n\n", "\t\t", " \n ", "\r\n", "\n \n", "a  b", "a \n b", "hello   ", "   world",
        "a\t\tb", " \t\n\r ", "x\u{a0}y", "\u{3000}", "\u{2028}", "\u{85}", "\u{0}", "\u{1}\u{7f}",
        "<|im_start|><|im_end|>", "<|im_start|>user\nHi<|im_end|>\n", " <|im_end|>", "<|im_end|> ",
        "  <|im_start|>  ", "<|im_start", "<|im_end|", "<<|im_start|>>", "<|endoftext|>", "\n<|im_end|>\n\n",
        "12345678901234567890", " 2024", "3.14159", "1,000,000", "-42e10", "x²+y²", "½ ¾", "٣٤٥", "१२३", "①②", "Ⅻ",
        "𝟙𝟚", "don't", "DON'T", "it's", "'s'", "''", "y'all'd've", "e\u{301}", "\u{301}", "a\u{300}\u{301}\u{302}",
        "👨‍👩‍👧‍👦", "🇫🇷🇩🇪", "👍🏽", "\u{200b}", "\u{feff}", "\u{200d}", "مرحبا بالعالم", "שלום עולם", "\u{202e}abc",
        "漢字かなカナ", "한국어", "ไทย", "fn main() {\n\tprintln!(\"hi\");\n}", "def f(x):\n    return x**2\n",
        "<div class=\"a\">&nbsp;</div>", "if (a&&b||!c) { x+=1; }",
    ];
    let repeated = [("a", 500), (" ", 100), ("\n", 50), ("1", 100), ("😀", 50), ("<|im_end|>", 20), (" \t", 40)];
    let mut strings: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
    strings.extend(repeated.iter().map(|(s, n)| s.repeat(*n)));
    strings
}

fn pick<'a>(rng: &mut SplitMix64, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len() as u64) as usize]
}

fn number(rng: &mut SplitMix64) -> String {
    let digits: String = (0..1 + rng.below(12)).map(|_| char::from(b'0' + rng.below(10) as u8)).collect();
    match rng.below(5) {
        0 => format!("-{digits}"),
        1 => format!("{digits}.{}", rng.below(1000)),
        2 => format!("{digits},{:03}", rng.below(1000)),
        _ => digits,
    }
}

fn whitespace_run(rng: &mut SplitMix64) -> String {
    (0..1 + rng.below(6)).map(|_| WHITESPACE[rng.below(WHITESPACE.len() as u64) as usize]).collect()
}

fn random_chars(rng: &mut SplitMix64) -> String {
    (0..1 + rng.below(5))
        .filter_map(|_| {
            let (lo, hi) = CODE_POINTS[rng.below(CODE_POINTS.len() as u64) as usize];
            char::from_u32(lo + rng.below((hi - lo + 1) as u64) as u32)
        })
        .collect()
}

/// One piece of a string in one of seven kinds: prose, code, digits, whitespace,
/// scripts and emoji, specials, arbitrary code points.
fn piece(rng: &mut SplitMix64, kind: u64) -> String {
    match kind {
        0 => format!("{}{}", pick(rng, WORDS), if rng.below(4) == 0 { pick(rng, PUNCTUATION) } else { "" }),
        1 => pick(rng, CODE).to_string(),
        2 => number(rng),
        3 => whitespace_run(rng),
        4 => pick(rng, SCRIPTS).to_string(),
        5 => pick(rng, SPECIALS).to_string(),
        _ => random_chars(rng),
    }
}

/// A string of 1–16 pieces, most of the kind `index` selects (so each kind leads in a
/// seventh of the strings), the rest of any kind, joined by a space or nothing.
fn generated_string(rng: &mut SplitMix64, index: usize) -> String {
    let main_kind = index as u64 % 7;
    let mut text = String::new();
    for _ in 0..1 + rng.below(16) {
        let kind = if rng.below(4) == 0 { rng.below(7) } else { main_kind };
        text.push_str(&piece(rng, kind));
        if rng.below(2) == 0 {
            text.push(' ');
        }
    }
    text
}

fn generated_strings(seed: u64, n: usize) -> Vec<String> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|i| generated_string(&mut rng, i)).collect()
}

/// Each string both sides encode differently (the string and both id lists), and how
/// many tokens llama.cpp gave in all.
fn divergences(ours: &TextTokenizer, llamacpp: &LlamaCppBackend, strings: &[String]) -> (Vec<String>, usize) {
    let mut divergences = Vec::new();
    let mut tokens = 0;
    for text in strings {
        let want = llamacpp.tokenize(text, false, true).unwrap();
        let got = ours.encode(text, false).unwrap();
        tokens += want.len();
        if got != want {
            divergences.push(format!("{text:?}\n  ours:      {got:?}\n  llama.cpp: {want:?}"));
        }
    }
    (divergences, tokens)
}

#[test]
fn smollm2_rebuilt_tokenizer_encodes_as_llamacpp_over_10k_strings() {
    let Some(gguf) = smollm2() else { return };
    let folder = TempDir::new().unwrap();
    write_gguf_tokenizer(&gguf, folder.path()).unwrap();
    let ours = TextTokenizer::from_folder(folder.path()).unwrap();
    let llamacpp = LlamaCppBackend::load(&gguf, &options()).unwrap();

    // The comparison can fail: llama.cpp reads a control token as one id only when asked.
    assert_eq!(llamacpp.tokenize("<|im_end|>", false, true).unwrap(), [2]);
    assert!(llamacpp.tokenize("<|im_end|>", false, false).unwrap().len() > 1);

    let nasty = nasty_strings();
    let mut strings = generated_strings(0x5EED_0018, GENERATED);
    strings.extend(nasty.iter().cloned());
    let (divergences, tokens) = divergences(&ours, &llamacpp, &strings);
    // Asked to add specials, neither adds a BOS to SmolLM2's texts.
    for text in &nasty {
        assert_eq!(ours.encode(text, true).unwrap(), llamacpp.tokenize(text, true, true).unwrap(), "{text:?}");
    }
    eprintln!("compared {} strings ({tokens} tokens); {} diverge", strings.len(), divergences.len());
    assert!(
        divergences.is_empty(),
        "{} of {} strings encode differently:\n{}",
        divergences.len(),
        strings.len(),
        divergences.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}
