//! Synthetic prompt text of a given length in tokens. With the server's tokenizer
//! the length is exact; without one, one common English word counts as one token
//! (close for BPE vocabularies, where such words are single tokens).

use std::path::Path;

use anyhow::Context;
use tokenizers::Tokenizer;
use tokenrouter_core::rng::SplitMix64;

/// Common English words: most are one token, with their leading space, in every
/// BPE vocabulary we serve, which makes "n words ≈ n tokens" a good first guess.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "that",
    "with",
    "as",
    "on",
    "by",
    "at",
    "from",
    "his",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "has",
    "had",
    "first",
    "one",
    "their",
    "its",
    "new",
    "after",
    "but",
    "who",
    "not",
    "they",
    "have",
    "her",
    "she",
    "two",
    "been",
    "other",
    "when",
    "there",
    "all",
    "during",
    "into",
    "school",
    "time",
    "may",
    "years",
    "more",
    "most",
    "only",
    "over",
    "city",
    "some",
    "world",
    "would",
    "where",
    "later",
    "up",
    "such",
    "used",
    "many",
    "can",
    "state",
    "about",
    "national",
    "out",
    "known",
    "university",
    "united",
    "then",
    "made",
    "also",
    "system",
    "number",
    "between",
    "three",
    "water",
    "light",
    "house",
    "small",
    "large",
    "model",
    "token",
    "route",
    "answer",
    "question",
    "value",
    "point",
    "line",
    "table",
    "field",
    "group",
    "order",
    "power",
    "market",
    "river",
    "music",
    "story",
    "paper",
    "method",
    "result",
    "change",
    "problem",
    "game",
    "team",
    "north",
    "south",
    "east",
    "west",
    "early",
    "long",
    "great",
    "high",
    "old",
    "young",
    "part",
    "place",
    "case",
    "week",
    "company",
    "program",
    "work",
    "life",
    "hand",
    "home",
    "area",
    "money",
    "study",
    "book",
    "word",
    "side",
    "kind",
    "head",
    "fact",
    "month",
    "night",
    "law",
    "car",
    "idea",
    "body",
    "level",
    "office",
    "door",
    "health",
    "art",
    "war",
    "history",
    "party",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "food",
    "plan",
    "data",
    "code",
    "file",
    "test",
    "list",
    "step",
];

/// Makes prompt text and counts tokens the way the server will.
pub struct PromptMaker {
    tokenizer: Option<Tokenizer>,
}

impl PromptMaker {
    /// Without a tokenizer: words stand for tokens.
    pub fn approximate() -> Self {
        PromptMaker { tokenizer: None }
    }

    /// `path` is a tokenizer.json or a folder that holds one.
    pub fn with_tokenizer(path: &Path) -> anyhow::Result<Self> {
        Ok(PromptMaker { tokenizer: Some(load_tokenizer(path)?) })
    }

    pub fn is_exact(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// Tokens in `text` (no special tokens: chat templates add their own).
    pub fn count(&self, text: &str) -> usize {
        match &self.tokenizer {
            Some(t) => t.encode_fast(text, false).map(|e| e.len()).unwrap_or(0),
            None => text.split_whitespace().count(),
        }
    }

    /// Text of `tokens` tokens (exactly, with a tokenizer), drawn from `rng`.
    pub fn text(&self, tokens: usize, rng: &mut SplitMix64) -> String {
        let mut words: Vec<&str> = (0..tokens).map(|_| word(rng)).collect();
        let Some(tokenizer) = &self.tokenizer else { return words.join(" ") };
        // A word is sometimes two tokens: drop or add words until the count is
        // right. Each pass moves by the whole error, so a few passes suffice.
        for _ in 0..16 {
            let text = words.join(" ");
            let count = self.count(&text);
            if count == tokens {
                return text;
            }
            if count > tokens {
                words.truncate(words.len().saturating_sub((count - tokens).div_ceil(2)).max(1));
            } else {
                words.extend((count..tokens).map(|_| word(rng)));
            }
        }
        cut_to_tokens(tokenizer, &words.join(" "), tokens)
    }
}

/// `path` is a tokenizer.json or a folder that holds one.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
    Tokenizer::from_file(&file)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("loading tokenizer {}", file.display()))
}

fn word(rng: &mut SplitMix64) -> &'static str {
    WORDS[rng.below(WORDS.len() as u64) as usize]
}

/// Last resort for an odd vocabulary: the text of the first `tokens` ids, which
/// re-encodes to that many tokens unless the cut splits a merge.
fn cut_to_tokens(tokenizer: &Tokenizer, text: &str, tokens: usize) -> String {
    let ids = tokenizer.encode_fast(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default();
    tokenizer.decode(&ids[..tokens.min(ids.len())], false).unwrap_or_else(|_| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3() -> Option<PromptMaker> {
        let dir = tokenrouter_core::assets::tokenizer_dir("qwen3")?;
        Some(PromptMaker::with_tokenizer(&dir).unwrap())
    }

    #[test]
    fn without_a_tokenizer_words_count_as_tokens() {
        let p = PromptMaker::approximate();
        let text = p.text(100, &mut SplitMix64(1));
        assert_eq!(text.split(' ').count(), 100);
        assert_eq!(p.count(&text), 100);
        assert!(!p.is_exact());
    }

    #[test]
    fn the_same_seed_gives_the_same_text() {
        let p = PromptMaker::approximate();
        assert_eq!(p.text(50, &mut SplitMix64(3)), p.text(50, &mut SplitMix64(3)));
        assert_ne!(p.text(50, &mut SplitMix64(3)), p.text(50, &mut SplitMix64(4)));
    }

    #[test]
    fn with_the_qwen3_tokenizer_lengths_are_exact() {
        let Some(p) = qwen3() else { return };
        let mut rng = SplitMix64(9);
        for n in [1, 2, 5, 17, 100, 409, 2048, 8192] {
            let text = p.text(n, &mut rng);
            assert_eq!(p.count(&text), n, "{n} tokens asked");
        }
    }

    #[test]
    fn a_missing_tokenizer_file_names_the_path() {
        let e = PromptMaker::with_tokenizer(Path::new("/nonexistent/tok")).err().unwrap();
        assert!(format!("{e:#}").contains("/nonexistent/tok"), "{e:#}");
    }
}
