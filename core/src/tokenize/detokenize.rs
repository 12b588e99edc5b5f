//! `StreamDecoder`: incremental detokenization for streaming responses, the approach of TGI and vLLM.
//!
//! Decoding token by token does not work: a byte-level BPE token can hold half a UTF-8 character, and
//! metaspace tokenizers ("▁hello", Llama-2 style) strip the leading space of whatever they decode first.
//! So each step decodes a small window — the tokens already emitted since the previous emission (the
//! *prefix*) plus the new ones — and emits what the window adds beyond the prefix's text, but only once
//! it does not end in U+FFFD (an incomplete character). The deltas then concatenate to exactly
//! `decode(all_ids)` for byte-level tokenizers (Qwen3, Llama-3) and for byte-fallback tokenizers as long
//! as their byte runs are valid UTF-8 (for invalid runs, `decode` judges a whole run at once, which a
//! stream that already emitted part of it cannot match; it then emits the new tokens' own text).

use super::error::TokenizeError;
use super::tokenizer::TextTokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// How many trailing prompt ids seed the window in [`StreamDecoder::with_context`] (as vLLM does), so
/// the first generated token decodes with its leading space.
const CONTEXT_TOKENS: usize = 5;

pub struct StreamDecoder {
    tokenizer: TextTokenizer,
    skip_special_tokens: bool,
    /// Ids from the start of the current prefix; earlier ids are never decoded again.
    window: Vec<u32>,
    /// `window[..read]` is the prefix: already emitted, decodes to `prefix_text`.
    read: usize,
    prefix_text: String,
    token_count: usize,
}

impl StreamDecoder {
    /// A decoder whose deltas add up to `decode(all fed ids)`.
    pub fn new(tokenizer: TextTokenizer, skip_special_tokens: bool) -> Self {
        Self { tokenizer, skip_special_tokens, window: Vec::new(), read: 0, prefix_text: String::new(), token_count: 0 }
    }

    /// A decoder for text that continues `context` (the prompt): the deltas are what the generated ids
    /// add after it, e.g. " world" rather than "world" for a metaspace token "▁world".
    pub fn with_context(
        tokenizer: TextTokenizer,
        skip_special_tokens: bool,
        context: &[u32],
    ) -> Result<Self, TokenizeError> {
        let mut decoder = Self::new(tokenizer, skip_special_tokens);
        decoder.window = context[context.len().saturating_sub(CONTEXT_TOKENS)..].to_vec();
        decoder.read = decoder.window.len();
        decoder.prefix_text = decoder.decode(&decoder.window)?;
        Ok(decoder)
    }

    /// Feeds one generated id; returns the text it completes (often empty while a character is split
    /// across tokens, or for a skipped special token).
    pub fn step(&mut self, id: u32) -> Result<String, TokenizeError> {
        self.window.push(id);
        self.token_count += 1;
        let text = self.decode(&self.window)?;
        // Nothing new yet (e.g. a skipped special token): keep the window so that the next token still
        // decodes in context.
        if text.len() <= self.prefix_text.len() || text.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        self.emit(text)
    }

    /// Feeds several ids; returns their text (what the individual steps would have returned, joined).
    pub fn step_all(&mut self, ids: &[u32]) -> Result<String, TokenizeError> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.step(id)?);
        }
        Ok(out)
    }

    /// Flushes what is still held back (an incomplete character at the end of the stream decodes to
    /// U+FFFD, as in a full decode). The decoder can keep going afterwards.
    pub fn finish(&mut self) -> Result<String, TokenizeError> {
        if self.read == self.window.len() {
            return Ok(String::new());
        }
        let text = self.decode(&self.window)?;
        self.emit(text)
    }

    /// Ids fed so far (context not counted).
    pub fn token_count(&self) -> usize {
        self.token_count
    }

    /// Emits the window's text beyond the prefix, then makes the newly emitted ids the next prefix.
    fn emit(&mut self, window_text: String) -> Result<String, TokenizeError> {
        let delta = match window_text.strip_prefix(self.prefix_text.as_str()) {
            Some(delta) => delta.to_owned(),
            // Only for invalid byte-fallback runs, see the module comment.
            None => self.decode(&self.window[self.read..])?,
        };
        self.window.drain(..self.read);
        self.read = self.window.len();
        self.prefix_text = self.decode(&self.window)?;
        Ok(delta)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.tokenizer.decode(ids, self.skip_special_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::test_support::{llama3, metaspace_tokenizer, qwen3, SplitMix};

    /// Streams `ids` and checks every delta and their sum against a full decode.
    fn assert_stream_matches_decode(tok: &TextTokenizer, ids: &[u32], skip_special: bool) -> Vec<String> {
        let mut decoder = StreamDecoder::new(tok.clone(), skip_special);
        let mut deltas: Vec<String> = ids.iter().map(|&id| decoder.step(id).unwrap()).collect();
        deltas.push(decoder.finish().unwrap());
        assert_eq!(deltas.concat(), tok.decode(ids, skip_special).unwrap(), "ids {ids:?}");
        deltas
    }

    fn random_ids(rng: &mut SplitMix, vocab: usize, len: usize) -> Vec<u32> {
        (0..len).map(|_| rng.below(vocab as u64) as u32).collect()
    }

    #[test]
    fn random_qwen3_sequences_concatenate_to_the_full_decode() {
        let Some(tok) = qwen3() else { return };
        let mut rng = SplitMix(7);
        for round in 0..60 {
            let ids = random_ids(&mut rng, tok.vocab_size(), 1 + round % 40);
            assert_stream_matches_decode(&tok, &ids, round % 2 == 0);
        }
    }

    #[test]
    fn random_llama3_sequences_concatenate_to_the_full_decode() {
        let Some(tok) = llama3() else { return };
        let mut rng = SplitMix(11);
        for round in 0..60 {
            let ids = random_ids(&mut rng, tok.vocab_size(), 1 + round % 40);
            assert_stream_matches_decode(&tok, &ids, round % 2 == 1);
        }
    }

    #[test]
    fn random_single_byte_tokens_still_match_for_byte_level_bpe() {
        // Ids 0..256 of Qwen3 are single bytes: most sequences are invalid UTF-8 and many characters
        // are split, the hardest case for holding back.
        let Some(tok) = qwen3() else { return };
        let mut rng = SplitMix(3);
        for _ in 0..100 {
            let ids = random_ids(&mut rng, 256, 12);
            assert_stream_matches_decode(&tok, &ids, false);
        }
    }

    const SPLIT_TEXT: &str = "Hi 👋🏽 世界! café — 😀🎉 𝔘𝔫𝔦 ok";

    #[test]
    fn split_characters_are_held_back_not_replaced() {
        for tok in [qwen3(), llama3(), Some(metaspace_tokenizer())].into_iter().flatten() {
            let ids = tok.encode(SPLIT_TEXT, false).unwrap();
            let deltas = assert_stream_matches_decode(&tok, &ids, false);
            assert_eq!(deltas.concat(), SPLIT_TEXT, "{}", tok.name());
            assert!(deltas.iter().all(|d| !d.contains(REPLACEMENT)), "{}: {deltas:?}", tok.name());
            let held = deltas.iter().filter(|d| d.is_empty()).count();
            assert!(held > 1, "{}: expected some characters split across tokens: {deltas:?}", tok.name());
        }
    }

    #[test]
    fn metaspace_random_text_round_trips_through_the_stream() {
        let tok = metaspace_tokenizer();
        let pieces = ["hello", " world", "世", "界", "😀", "é", " ", "!", "€", "ok"];
        let mut rng = SplitMix(5);
        for _ in 0..100 {
            let text: String =
                (0..1 + rng.below(12)).map(|_| pieces[rng.below(pieces.len() as u64) as usize]).collect();
            let ids = tok.encode(&text, false).unwrap();
            let deltas = assert_stream_matches_decode(&tok, &ids, false);
            assert!(deltas.iter().all(|d| !d.contains(REPLACEMENT)), "{text:?}: {deltas:?}");
        }
    }

    #[test]
    fn metaspace_spaces_survive_between_words_and_skipped_specials() {
        let tok = metaspace_tokenizer();
        let hello = tok.token_to_id("▁hello").unwrap();
        let world = tok.token_to_id("▁world").unwrap();
        let ids = [hello, 2, world];
        let deltas = assert_stream_matches_decode(&tok, &ids, true);
        assert_eq!(deltas, ["hello", "", " world", ""]);
        assert_stream_matches_decode(&tok, &ids, false);
    }

    #[test]
    fn context_keeps_the_leading_space_of_the_first_generated_token() {
        let tok = metaspace_tokenizer();
        let prompt = tok.encode("hello", false).unwrap();
        let world = tok.token_to_id("▁world").unwrap();
        let mut plain = StreamDecoder::new(tok.clone(), false);
        assert_eq!(plain.step(world).unwrap(), "world");
        let mut continuing = StreamDecoder::with_context(tok.clone(), false, &prompt).unwrap();
        assert_eq!(continuing.step(world).unwrap(), " world");
        assert_eq!(continuing.token_count(), 1);
    }

    #[test]
    fn finish_flushes_an_incomplete_character_like_decode() {
        let Some(tok) = qwen3() else { return };
        // "ð" is Qwen3's byte-level token for the lone byte 0xF0, the start of a 4-byte character.
        let cut = [tok.encode("a", false).unwrap()[0], tok.token_to_id("ð").unwrap()];
        let deltas = assert_stream_matches_decode(&tok, &cut, false);
        assert_eq!(deltas, ["a", "", "\u{FFFD}"]);
        let ids = tok.encode("a😀", false).unwrap();
        let mut decoder = StreamDecoder::new(tok.clone(), false);
        assert_eq!(decoder.step_all(&ids).unwrap(), "a😀");
        assert_eq!(decoder.finish().unwrap(), "");
    }

    #[test]
    fn invalid_byte_fallback_runs_do_not_fail_the_stream() {
        let tok = metaspace_tokenizer();
        let byte = |b: u8| tok.token_to_id(&format!("<0x{b:02X}>")).unwrap();
        // "é" then a stray continuation byte: decode judges the run [C3 A9 A9] invalid as a whole.
        let ids = [byte(0xC3), byte(0xA9), byte(0xA9), tok.token_to_id("!").unwrap()];
        let mut decoder = StreamDecoder::new(tok.clone(), false);
        let text = decoder.step_all(&ids).unwrap() + &decoder.finish().unwrap();
        assert!(text.starts_with('é') && text.ends_with('!'), "{text:?}");
    }
}
