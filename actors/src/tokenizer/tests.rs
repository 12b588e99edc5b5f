//! The tokenizer threads: they run side by side, a huge prompt does not hold up a small one, and
//! every result (sessions spliced concurrently included) equals full tokenization.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::{select, Either};
use ractor::concurrency::{oneshot, OneshotReceiver};
use tokenrouter_core::rng::SplitMix64;
use tokenrouter_core::tokenize::incremental::SessionConfig;

use super::pool::TokenizerPool;
use super::*;
use tokenrouter_core::tokenize::incremental::SessionTokenizer;

type Reply<T> = OneshotReceiver<Result<T, TokenizeError>>;

/// A GPT-2-style byte-level BPE (every byte a token, plus a few merges), which sessions can
/// splice; built here so these tests run without fetched assets.
fn byte_level_tokenizer() -> TextTokenizer {
    let chars = byte_level_chars();
    let mut vocab: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("o", "n"), ("Ġ", "s"), ("e", "r")];
    vocab.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
    let vocab: serde_json::Map<String, serde_json::Value> =
        vocab.into_iter().enumerate().map(|(id, token)| (token, id.into())).collect();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                                         "use_regex": true});
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges.iter().map(|(a, b)| [*a, *b]).collect::<Vec<_>>()}
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    TextTokenizer::from_folder(dir.path()).expect("the synthetic tokenizer loads")
}

/// GPT-2's byte → character map: printable bytes stand for themselves, the others for 256, 257, ….
fn byte_level_chars() -> Vec<char> {
    let printable = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap()
            }
        })
        .collect()
}

/// The synthetic tokenizer, and the real Qwen3 one when fetched (the asset rule applies).
fn tokenizers() -> Vec<TextTokenizer> {
    let mut all = vec![byte_level_tokenizer()];
    if let Some(dir) = tokenrouter_core::assets::tokenizer_dir("qwen3") {
        all.push(TextTokenizer::from_folder(&dir).unwrap());
    }
    all
}

const WORDS: [&str; 16] =
    ["the", " the", " cat", " sat", " on", " a", " mat", ".", "\n", "  ", " 42", " x", "=", "(", "); ", " über"];

fn push_words(rng: &mut SplitMix64, text: &mut String, bytes: usize) {
    let goal = text.len() + bytes;
    while text.len() < goal {
        text.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
}

fn text_of(seed: u64, bytes: usize) -> String {
    let mut text = String::new();
    push_words(&mut SplitMix64(seed), &mut text, bytes);
    text
}

async fn send_encode(state: &mut TokenizerState, text: &str, session: Option<&str>) -> Reply<Vec<u32>> {
    let (reply, ids) = oneshot();
    let msg = TokenizerMsg::Encode {
        text: text.to_owned(),
        add_special_tokens: true,
        session: session.map(str::to_owned),
        reply: reply.into(),
    };
    state.dispatch(msg).await.unwrap();
    ids
}

#[tokio::test]
async fn the_pool_runs_two_jobs_at_once() {
    let pool = TokenizerPool::spawn(2).unwrap();
    let (signal, signalled) = std::sync::mpsc::channel::<()>();
    let (result, first_saw_second) = oneshot();
    // The first job waits for the second: with one thread at a time it would give up.
    let first = move || {
        let _ = result.send(signalled.recv_timeout(Duration::from_secs(60)).is_ok());
    };
    pool.submit(first).await.unwrap();
    pool.submit(move || signal.send(()).unwrap()).await.unwrap();
    assert!(first_saw_second.await.unwrap(), "the second job ran only after the first gave up waiting for it");
}

#[tokio::test]
async fn a_panicking_job_leaves_its_thread_working() {
    let pool = TokenizerPool::spawn(1).unwrap();
    pool.submit(|| panic!("a job fails")).await.unwrap();
    let (done, finished) = oneshot();
    pool.submit(move || {
        let _ = done.send(7);
    })
    .await
    .unwrap();
    assert_eq!(finished.await.unwrap(), 7);
}

/// A 4 MiB prompt sent first, a small one after: the small one's ids come back first.
/// Tokenized inline (as the actor once did), the small one would wait behind the huge one.
#[tokio::test]
async fn a_huge_prompt_does_not_hold_up_a_small_one() {
    let tokenizer = byte_level_tokenizer();
    let mut state = TokenizerState::start(tokenizer.clone(), 2).unwrap();
    let huge = text_of(1, 4 << 20);
    let small = "a small prompt";
    let huge_ids = send_encode(&mut state, &huge, None).await;
    let small_ids = send_encode(&mut state, small, None).await;
    let Either::Right((small_ids, huge_ids)) = select(huge_ids, small_ids).await else {
        panic!("the huge prompt finished first: the small one waited behind it");
    };
    assert_eq!(small_ids.unwrap().unwrap(), tokenizer.encode(small, true).unwrap());
    assert_eq!(huge_ids.await.unwrap().unwrap(), tokenizer.encode(&huge, true).unwrap());
}

/// Through the actor, as the engine calls it: ids and rendered chats equal direct tokenization.
#[tokio::test]
async fn the_actor_replies_with_the_ids_of_full_tokenization() {
    for tokenizer in tokenizers() {
        let (actor, handle) = Actor::spawn(None, TokenizerActor, tokenizer.clone()).await.unwrap();
        for (seed, bytes) in [(1, 0), (2, 10), (3, 3000), (4, 200_000)] {
            let text = text_of(seed, bytes);
            for add_special_tokens in [false, true] {
                let msg = |reply| TokenizerMsg::Encode { text: text.clone(), add_special_tokens, session: None, reply };
                let ids = ractor::call!(actor, msg).unwrap().unwrap();
                assert_eq!(ids, tokenizer.encode(&text, add_special_tokens).unwrap(), "{}", tokenizer.name());
            }
        }
        check_chat(&actor, &tokenizer).await;
        actor.stop(None);
        handle.await.unwrap();
    }
}

async fn check_chat(actor: &ActorRef<TokenizerMsg>, tokenizer: &TextTokenizer) {
    let messages: Vec<ChatMessage> =
        serde_json::from_value(serde_json::json!([{"role": "user", "content": text_of(9, 2000)}])).unwrap();
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let msg = |reply| TokenizerMsg::Chat { messages: messages.clone(), options: options.clone(), session: None, reply };
    let rendered = ractor::call!(actor, msg).unwrap();
    match ChatTemplate::from_config(tokenizer.config()) {
        Ok(template) => {
            let rendered = rendered.unwrap();
            assert_eq!(rendered.text, template.render(&messages, &options).unwrap());
            assert_eq!(rendered.ids, tokenizer.encode(&rendered.text, false).unwrap());
        }
        Err(_) => assert!(matches!(rendered, Err(TokenizeError::NoChatTemplate)), "{}", tokenizer.name()),
    }
}

/// One conversation: `turns` texts, each the last with an edited tail (as chat templates
/// replace their trailing generation prompt) and an append.
fn conversation(seed: u64, turns: usize) -> Vec<String> {
    let mut rng = SplitMix64(seed);
    let mut text = format!("conversation {seed}: ");
    push_words(&mut rng, &mut text, 2000);
    let mut texts = vec![text.clone()];
    for _ in 1..turns {
        let keep = text.floor_char_boundary(text.len() - rng.below(20) as usize);
        text.truncate(keep);
        let appended = 50 + rng.below(400) as usize;
        push_words(&mut rng, &mut text, appended);
        texts.push(text.clone());
    }
    texts
}

/// Threads sharing one store, named and anonymous sessions, two threads on one session id:
/// every result equals full tokenization, and splicing did happen.
#[test]
fn threads_sharing_the_session_store_splice_exactly() {
    for tokenizer in tokenizers() {
        let sessions = SessionTokenizer::new(tokenizer.clone(), SessionConfig::default());
        let spliced = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for t in 0..6u64 {
                let (sessions, spliced, tokenizer) = (&sessions, &spliced, &tokenizer);
                // Threads 4 and 5 both continue the session "shared", each with its own texts.
                let name = match t {
                    4 | 5 => Some("shared".to_owned()),
                    t if t % 2 == 0 => Some(format!("named-{t}")),
                    _ => None,
                };
                scope.spawn(move || {
                    for (turn, text) in conversation(t, 12).iter().enumerate() {
                        let add_special = turn % 3 == 0;
                        let encoded = sessions.encode(name.as_deref(), text, add_special).unwrap();
                        let full = tokenizer.encode(text, add_special).unwrap();
                        assert_eq!(encoded.ids, full, "{} thread {t} turn {turn}", tokenizer.name());
                        if encoded.path.splice_cut().is_some() {
                            spliced.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert!(spliced.load(Ordering::Relaxed) > 0, "{}: nothing was spliced", tokenizer.name());
    }
}

/// The same through the actor's dispatch: each turn sends every conversation's next text at
/// once (one session twice, with different texts), then checks every reply.
#[tokio::test]
async fn concurrent_requests_continue_their_sessions_exactly() {
    for tokenizer in tokenizers() {
        let mut state = TokenizerState::start(tokenizer.clone(), 3).unwrap();
        let conversations: Vec<Vec<String>> = (0..5).map(|seed| conversation(100 + seed, 8)).collect();
        for turn in 0..8 {
            let mut pending = Vec::new();
            for (i, texts) in conversations.iter().enumerate() {
                let session = (i % 2 == 0).then(|| format!("s{i}"));
                pending.push((&texts[turn], send_encode(&mut state, &texts[turn], session.as_deref()).await));
            }
            // A second request of session "s0", overlapping the first.
            let other = &conversations[1][turn];
            pending.push((other, send_encode(&mut state, other, Some("s0")).await));
            for (text, ids) in pending {
                assert_eq!(ids.await.unwrap().unwrap(), tokenizer.encode(text, true).unwrap(), "turn {turn}");
            }
            if turn == 4 {
                state.dispatch(TokenizerMsg::ConfigureSessions(SessionConfig::default())).await.unwrap();
            }
        }
    }
}
