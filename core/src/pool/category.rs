//! A cheap content classifier for the estimator: bytes per token depend on the kind of
//! text (with Qwen3 and Llama-3, English ~4.4, source code ~4.2, Chinese ~3.8–4.2; with
//! smaller vocabularies CJK text falls to 1.5–2, three UTF-8 bytes per character and
//! about one character per token), so each category is calibrated on its own. Looking
//! at a bounded prefix keeps the cost O(1) per request whatever its size.

use serde::{Deserialize, Serialize};

/// The content categories the estimator calibrates separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    Prose,
    Code,
    Cjk,
}

impl Category {
    pub const ALL: [Category; 3] = [Category::Prose, Category::Code, Category::Cjk];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::Prose => "prose",
            Category::Code => "code",
            Category::Cjk => "cjk",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn parse(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.as_str().eq_ignore_ascii_case(name))
    }
}

/// Bytes looked at: enough to tell the categories apart, bounded so that a
/// multi-megabyte prompt costs the same as a short one.
pub const SAMPLE_BYTES: usize = 4096;

/// Share of sampled bytes that must belong to CJK characters.
const CJK_SHARE: f64 = 0.3;
/// Share of sampled bytes that are code punctuation (`{}()[];=<>`) or indentation.
const CODE_SHARE: f64 = 0.06;

/// The category of a prompt from its first [`SAMPLE_BYTES`] bytes.
pub fn classify(text: &[u8]) -> Category {
    let sample = &text[..text.len().min(SAMPLE_BYTES)];
    if sample.is_empty() {
        return Category::Prose;
    }
    let (mut cjk, mut code) = (0usize, 0usize);
    let mut after_newline = false;
    for &b in sample {
        // Lead bytes 0xE3..=0xED start the 3-byte UTF-8 sequences of the CJK blocks
        // (kana, CJK ideographs, Hangul); each such character is 3 bytes.
        if (0xE3..=0xED).contains(&b) {
            cjk += 3;
        }
        let indentation = after_newline && (b == b' ' || b == b'\t');
        if matches!(b, b'{' | b'}' | b'(' | b')' | b'[' | b']' | b';' | b'=' | b'<' | b'>') || indentation {
            code += 1;
        }
        after_newline = b == b'\n' || (after_newline && (b == b' ' || b == b'\t'));
    }
    let n = sample.len() as f64;
    if cjk as f64 / n >= CJK_SHARE {
        Category::Cjk
    } else if code as f64 / n >= CODE_SHARE {
        Category::Code
    } else {
        Category::Prose
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typical_texts_fall_into_their_category() {
        let prose = "The quick brown fox jumps over the lazy dog. It was a sunny day, and everyone was outside.";
        let code = "fn main() {\n    let x = vec![1, 2, 3];\n    for i in x { println!(\"{}\", i); }\n}\n";
        let cjk = "今日はとても良い天気です。我们明天去公园散步吧。오늘 날씨가 좋네요.";
        assert_eq!(classify(prose.as_bytes()), Category::Prose);
        assert_eq!(classify(code.as_bytes()), Category::Code);
        assert_eq!(classify(cjk.as_bytes()), Category::Cjk);
        assert_eq!(classify(b""), Category::Prose);
    }

    #[test]
    fn only_a_bounded_prefix_is_read() {
        let mut text = "plain words and more plain words ".repeat(200).into_bytes();
        text.extend("{}();=<>".repeat(10_000).bytes());
        assert_eq!(classify(&text), Category::Prose, "the code after the sample is not looked at");
    }

    #[test]
    fn names_round_trip() {
        for c in Category::ALL {
            assert_eq!(Category::parse(c.as_str()), Some(c));
        }
        assert_eq!(Category::parse("klingon"), None);
    }
}
