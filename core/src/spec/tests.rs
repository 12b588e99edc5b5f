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
    let d = ngram(8);
    let prompt = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19];
    let mut sequence = prompt.to_vec();
    sequence.extend([10, 11, 12]);
    let draft = d.propose(&sequence, prompt.len(), 16).expect("a 3-token match");
    // A 3-token match drafts 3 tokens, however many are allowed.
    assert_eq!((draft.tokens, draft.source, draft.match_len), (vec![13, 14, 15], DraftSource::Ngram, 3));
    sequence.extend([13, 14, 15, 16, 17]);
    let draft = d.propose(&sequence, prompt.len(), 16).expect("an 8-token match");
    assert_eq!(draft.tokens, vec![18, 19, 10, 11, 12, 13, 14, 15]);
    // The step's room caps it.
    assert_eq!(d.propose(&sequence, prompt.len(), 2).unwrap().tokens, vec![18, 19]);
    assert_eq!(d.propose(&sequence, prompt.len(), 0), None);
}

#[test]
fn misses_ask_longer_matches_and_an_accept_forgives_them() {
    let mut d = ngram(8);
    let sequence = [1, 2, 3, 4, 9, 9, 1, 2, 3];
    assert!(d.propose(&sequence, 0, 8).is_some());
    d.record(DraftSource::Ngram, 0);
    assert_eq!(d.propose(&sequence, 0, 8), None, "a 3-token match is no longer enough");
    d.record(DraftSource::Ngram, 1);
    assert!(d.propose(&sequence, 0, 8).is_some());
}

#[test]
fn without_a_method_or_prediction_nothing_is_drafted() {
    let d = Drafter::new(Speculation { method: None, max_tokens: 8, prediction: vec![] });
    assert_eq!(d.propose(&[1, 2, 3, 1, 2, 3], 0, 8), None);
}

#[test]
fn a_prediction_drafts_from_its_start_then_follows_the_output() {
    let prediction = vec![50, 51, 52, 53, 54, 55, 56];
    let mut d = Drafter::new(Speculation { method: None, max_tokens: 4, prediction });
    let prompt = [1, 2, 3];
    let draft = d.propose(&prompt, 3, 16).unwrap();
    assert_eq!((draft.tokens, draft.source), (vec![50, 51, 52, 53], DraftSource::Prediction));
    d.record(DraftSource::Prediction, 2);
    // The output took 50, 51 and then its own 60; after 60, 52 the prediction resumes at 53.
    let sequence = [1, 2, 3, 50, 51, 60, 52];
    assert_eq!(d.propose(&sequence, 3, 16).unwrap().tokens, vec![53, 54, 55, 56]);
    // An output that left the prediction behind drafts nothing from it.
    assert_eq!(d.propose(&[1, 2, 3, 70, 71], 3, 16), None);
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
