use super::*;

fn ngram(max_tokens: usize) -> Drafter {
    Drafter::new(Speculation { method: Some(SpeculationMethod::Ngram), max_tokens, prediction: vec![] })
}

#[test]
fn the_longest_match_wins_then_the_latest() {
    //            0  1  2  3  4  5  6  7  8  9 10 11
    let corpus = [1, 2, 3, 9, 5, 2, 3, 7, 0, 2, 3, 8];
    // Tail [1, 2, 3]: matched whole at 0..3 (continues with 9); [2, 3] alone twice more.
    assert_eq!(longest_match(&corpus, &[4, 1, 2, 3], 1, 64, None), Some((3, 3)));
    // Tail [7, 2, 3] matches only [2, 3], three times: the latest (ending at 11) wins.
    assert_eq!(longest_match(&corpus, &[7, 2, 3], 1, 64, None), Some((11, 2)));
    // Near 4: the match ending at or after 4 and nearest it.
    assert_eq!(longest_match(&corpus, &[7, 2, 3], 1, 64, Some(4)), Some((7, 2)));
    assert_eq!(longest_match(&corpus, &[7, 2, 3], 1, 64, Some(0)), Some((3, 2)));
    // Too short, or nowhere.
    assert_eq!(longest_match(&corpus, &[7, 2, 3], 3, 64, None), None);
    assert_eq!(longest_match(&corpus, &[42], 1, 64, None), None);
    // The match is capped at max_len (ties then go to the latest).
    assert_eq!(longest_match(&corpus, &[1, 2, 3], 1, 2, None), Some((11, 2)));
}

#[test]
fn a_sequence_never_matches_its_own_tail() {
    let sequence = [5, 6, 7, 8, 5, 6, 7];
    // [5, 6, 7] occurred at 0..3 and continued with 8; the tail itself has no continuation.
    assert_eq!(longest_match(&sequence, &sequence, 1, 64, None), Some((3, 3)));
    assert_eq!(longest_match(&[1, 2, 3], &[1, 2, 3], 1, 64, None), None);
}

#[test]
fn ngram_drafts_continue_the_repeat_and_grow_with_the_match() {
    let mut d = ngram(8);
    let prompt = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19];
    let mut sequence = prompt.to_vec();
    sequence.extend([10, 11, 12]);
    let draft = d.propose(&sequence, prompt.len(), 16, None).expect("a 3-token match");
    // A 3-token match drafts 3 tokens, however many are allowed.
    assert_eq!((draft.tokens, draft.source, draft.match_len), (vec![13, 14, 15], DraftSource::Ngram, 3));
    sequence.extend([13, 14, 15, 16, 17]);
    let draft = d.propose(&sequence, prompt.len(), 16, None).expect("an 8-token match");
    assert_eq!(draft.tokens, vec![18, 19, 10, 11, 12, 13, 14, 15]);
    // The step's room caps it.
    assert_eq!(d.propose(&sequence, prompt.len(), 2, None).unwrap().tokens, vec![18, 19]);
    assert_eq!(d.propose(&sequence, prompt.len(), 0, None), None);
}

#[test]
fn misses_ask_longer_matches_and_an_accept_forgives_them() {
    let mut d = ngram(8);
    let sequence = [1, 2, 3, 4, 9, 9, 1, 2, 3];
    assert!(d.propose(&sequence, 0, 8, None).is_some());
    d.record(DraftSource::Ngram, 0);
    assert_eq!(d.propose(&sequence, 0, 8, None), None, "a 3-token match is no longer enough");
    d.record(DraftSource::Ngram, 1);
    assert!(d.propose(&sequence, 0, 8, None).is_some());
}

#[test]
fn without_a_method_or_prediction_nothing_is_drafted() {
    let mut d = Drafter::new(Speculation { method: None, max_tokens: 8, prediction: vec![] });
    assert_eq!(d.propose(&[1, 2, 3, 1, 2, 3], 0, 8, None), None);
}

#[test]
fn a_prediction_drafts_from_its_start_then_follows_the_output() {
    let prediction = vec![50, 51, 52, 53, 54, 55, 56];
    let mut d = Drafter::new(Speculation { method: None, max_tokens: 4, prediction });
    let prompt = [1, 2, 3];
    let draft = d.propose(&prompt, 3, 16, None).unwrap();
    assert_eq!((draft.tokens, draft.source), (vec![50, 51, 52, 53], DraftSource::Prediction));
    d.record(DraftSource::Prediction, 2);
    // The output took 50, 51 and then its own 60; after 60, 52 the prediction resumes at 53.
    let sequence = [1, 2, 3, 50, 51, 60, 52];
    assert_eq!(d.propose(&sequence, 3, 16, None).unwrap().tokens, vec![53, 54, 55, 56]);
    // An output that left the prediction behind drafts nothing from it.
    assert_eq!(d.propose(&[1, 2, 3, 70, 71], 3, 16, None), None);
}

#[test]
fn keep_chances_are_kept_by_match_length() {
    let mut table = KeepTable::default();
    assert!((table.chance(3) - 0.7).abs() < 1e-9);
    for _ in 0..30 {
        table.record(2, 5, 0);
        table.record(40, 10, 10);
    }
    assert!(table.chance(2) < 0.3, "2 and 3 share a class: {}", table.chance(2));
    assert!(table.chance(33) > 0.95, "32..63 share a class");
    // Guesses after the first rejected one are not counted: nothing is known of them.
    table.record(4, 6, 1);
    assert!((table.chance(5) - 8.0 / 12.0).abs() < 1e-9, "the 2nd guess of a 4-match, rejected, counts at 5");
    assert!((table.chance(8) - 0.7).abs() < 1e-9, "an unmeasured class keeps its prior");
    assert!((table.chance(500) - 0.7).abs() < 1e-9, "64 and more");
}

fn suffix(max_tokens: usize) -> Drafter {
    Drafter::new(Speculation { method: Some(SpeculationMethod::Suffix), max_tokens, prediction: vec![] })
}

/// Every run of at most `SUFFIX_DEPTH` tokens, counted by brute force.
fn run_counts(texts: &[Vec<u32>]) -> std::collections::HashMap<Vec<u32>, u32> {
    let mut counts = std::collections::HashMap::new();
    for text in texts {
        for start in 0..text.len() {
            for end in start + 1..=text.len().min(start + SUFFIX_DEPTH) {
                *counts.entry(text[start..end].to_vec()).or_insert(0) += 1;
            }
        }
    }
    counts
}

#[test]
fn the_suffix_trie_holds_every_short_run_once_per_occurrence_and_forgets_removed_text() {
    let mut rng = 7u64;
    let mut next = move |m: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) % m
    };
    // Small alphabets repeat runs; one long text is longer than the depth.
    let texts: Vec<Vec<u32>> =
        (0..12).map(|i| (0..5 + next(60) + 40 * (i == 3) as u64).map(|_| next(4) as u32).collect()).collect();
    let mut trie = SuffixTrie::new();
    for t in &texts {
        trie.insert(t);
    }
    assert_eq!(trie.nodes(), run_counts(&texts).len(), "one node per distinct run");
    // Taking half the texts back leaves exactly the other half's runs.
    for t in texts.iter().step_by(2) {
        trie.remove(t);
    }
    let kept: Vec<Vec<u32>> = texts.iter().skip(1).step_by(2).cloned().collect();
    assert_eq!(trie.nodes(), run_counts(&kept).len());
    // A text appended token by token indexes what inserting it whole does.
    let mut grown = SuffixTrie::new();
    texts[3].iter().for_each(|&t| grown.push(t));
    let mut whole = SuffixTrie::new();
    whole.insert(&texts[3]);
    assert_eq!(grown.nodes(), whole.nodes());
    // Everything taken back: nothing left.
    for t in &kept {
        trie.remove(t);
    }
    assert_eq!(trie.nodes(), 0);
}

#[test]
fn suffix_drafts_follow_the_most_frequent_continuation() {
    let mut trie = SuffixTrie::new();
    // After [1, 2, 3]: [4, 5] three times, [9] once.
    for text in [vec![1, 2, 3, 4, 5], vec![7, 1, 2, 3, 4, 5, 6], vec![1, 2, 3, 9], vec![0, 1, 2, 3, 4, 5]] {
        trie.insert(&text);
    }
    let draft = trie.draft(&[8, 1, 2, 3], 2, 8, false).unwrap();
    assert_eq!(draft.tokens[..2], [4, 5]);
    assert_eq!(draft.match_len, 3);
    assert!((draft.expected_kept - (0.75 + 0.75)).abs() < 0.3, "{draft:?}");
    // A continuation nobody took more than once in ten is not guessed.
    let mut noisy = SuffixTrie::new();
    for k in 0..12 {
        noisy.insert(&[1, 2, 3, 100 + k]);
    }
    assert_eq!(noisy.draft(&[1, 2, 3], 1, 8, false), None);
    assert_eq!(trie.draft(&[42, 43], 1, 8, false), None);
}

#[test]
fn suffix_drafts_read_the_requests_own_text_and_other_outputs() {
    let mut d = suffix(8);
    let prompt: Vec<u32> = (10..30).collect();
    let mut sequence = prompt.clone();
    sequence.extend([10, 11, 12]);
    // Its own prompt: the repeat's continuation, once seen and never contradicted.
    let draft = d.propose(&sequence, prompt.len(), 16, None).expect("the prompt repeats");
    assert_eq!(draft.tokens, (13..21).collect::<Vec<u32>>());
    assert_eq!(draft.source, DraftSource::Suffix);
    // Text the request never saw, in another request's output.
    let mut cache = SuffixCache::new(1 << 16);
    cache.add(&[50, 51, 52, 53, 54, 55]);
    let mut d = suffix(8);
    let sequence = [1, 2, 50, 51, 52];
    assert_eq!(d.propose(&sequence, 2, 16, None), None);
    assert_eq!(d.propose(&sequence, 2, 16, Some(&cache)).unwrap().tokens, vec![53, 54, 55]);
    // After a rewind the request's own index is rebuilt from what the sequence holds now.
    let mut d = suffix(8);
    d.propose(&[5, 6, 7, 8, 9, 5, 6, 7], 0, 8, None).unwrap();
    d.rewind(3);
    assert_eq!(d.propose(&[5, 6, 7, 1, 2, 5, 6, 7], 0, 8, None).unwrap().tokens, vec![1, 2, 5, 6, 7]);
}

/// The suffix cache's worst case per node of its budget (docs/configuration.md says it).
const BYTES_PER_BUDGET_NODE: usize = 192;

#[test]
fn the_suffix_cache_stays_within_its_node_budget_and_keeps_the_newest_outputs() {
    let budget = 20_000;
    let mut cache = SuffixCache::new(budget);
    let mut rng = 11u64;
    let mut next = move || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as u32
    };
    let mut peak_bytes = 0;
    for i in 0..400 {
        // Outputs of 50 to 550 tokens, some longer than the whole budget allows.
        let len = if i % 97 == 0 { 5_000 } else { 50 + next() as usize % 500 };
        let output: Vec<u32> = (0..len).map(|_| next() % 5_000).collect();
        cache.add(&output);
        assert!(cache.nodes() <= budget, "{} nodes after output {i}", cache.nodes());
        peak_bytes = peak_bytes.max(cache.bytes());
        // The newest output is always there to draft from.
        let probe = &output[output.len() - 40..output.len() - 4];
        assert_eq!(cache.draft(probe, 3, 4).map(|d| d.tokens), Some(output[output.len() - 4..].to_vec()));
    }
    assert!(cache.outputs() < 400, "old outputs were evicted");
    // Memory: slots for at most twice the budget's nodes (an output is added before the
    // oldest go), 37 bytes each with its index entry, in containers that grow by doubling.
    assert!(peak_bytes <= budget * BYTES_PER_BUDGET_NODE, "{peak_bytes} bytes at most");
    assert!(peak_bytes >= budget * 37, "{peak_bytes} bytes: the estimate counts the nodes");
}

fn draft_model_drafter(max_tokens: usize) -> Drafter {
    Drafter::new(Speculation { method: Some(SpeculationMethod::Draft), max_tokens, prediction: vec![] })
}

/// Rounds asked of a draft model start at 4, grow by two when kept whole and shrink by
/// one when cut, within 1..=max_tokens; its guesses never come from `propose`.
#[test]
fn draft_model_rounds_grow_when_kept_and_shrink_when_cut() {
    let mut d = draft_model_drafter(8);
    assert_eq!(d.propose(&[1, 2, 3, 1, 2, 3, 1, 2], 2, 8, None), None);
    assert_eq!(d.next_round(), Some(4));
    d.record_round(4, 4);
    assert_eq!(d.next_round(), Some(6));
    d.record_round(6, 6);
    assert_eq!(d.next_round(), Some(8), "never past max_tokens");
    d.record_round(8, 3);
    assert_eq!(d.next_round(), Some(7));
    assert_eq!(draft_model_drafter(2).next_round(), Some(2));
    assert_eq!(ngram(8).next_round(), None, "only method draft asks for rounds");
}

/// Rounds that keep nothing double the plain run before the next (1, 3, 7, ... 63
/// tokens), so a draft model that never agrees is asked about once every 64 tokens;
/// a round that keeps something ends the backoff.
#[test]
fn draft_model_rounds_that_keep_nothing_back_off() {
    let mut d = draft_model_drafter(8);
    let mut plain_runs = Vec::new();
    for _ in 0..8 {
        let k = d.next_round().expect("a round after the plain run");
        d.record_round(k, 0);
        let mut plain = 0;
        while d.next_round().is_none() {
            plain += 1;
        }
        plain_runs.push(plain);
    }
    assert_eq!(plain_runs, [1, 3, 7, 15, 31, 63, 63, 63]);
    d.record_round(1, 1);
    assert!(d.next_round().is_some(), "a kept round ends the backoff");
    let mut newcomer = draft_model_drafter(8);
    newcomer.start_backed_off(3);
    assert_eq!((0..8).filter(|_| newcomer.next_round().is_none()).count(), 7, "starts where 3 misses left off");
    newcomer.start_backed_off(0);
    assert!(newcomer.next_round().is_some());
}
