//! The upstream client against scripted servers on loopback sockets: text split
//! inside a character between reads, and upstreams that stall before the response
//! head or in the middle of the stream.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokenrouter_actors::{EngineError, GenerateRequest, GenerationEvent};

use super::{Upstream, UpstreamTimeouts};
use crate::http::Generator;

/// Reads one HTTP request (head and a Content-Length body).
fn read_request(stream: &mut TcpStream) {
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        seen.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&seen).to_lowercase();
    let length = head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
    stream.read_exact(&mut vec![0u8; length]).unwrap();
}

/// A server that answers one request by writing `pieces` apart in time, then
/// holds the connection open for `hold` (a stall) before closing it.
fn scripted_server(pieces: Vec<Vec<u8>>, hold: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        read_request(&mut stream);
        for piece in pieces {
            // A write failing means the client left; that is its right.
            if stream.write_all(&piece).and_then(|_| stream.flush()).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        std::thread::sleep(hold);
    });
    url
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";

fn short_timeouts() -> UpstreamTimeouts {
    UpstreamTimeouts { connect_s: 1.0, head_s: 0.3, idle_s: 0.3 }
}

async fn collect(upstream: &Upstream) -> Vec<GenerationEvent> {
    let events = upstream.generate(GenerateRequest::new(vec![1, 2, 3], 4)).await.unwrap();
    events.collect().await
}

fn texts(events: &[GenerationEvent]) -> String {
    let text = events.iter().filter_map(|e| match e {
        GenerationEvent::Token { text, .. } => Some(text.as_str()),
        _ => None,
    });
    text.collect()
}

#[tokio::test]
async fn a_character_split_between_reads_arrives_whole() {
    let body = "data: {\"choices\":[{\"text\":\"h\u{e9}llo \u{4e16}\u{754c}\",\"token_ids\":[5,6]}]}\r\n\r\n\
                : keep-alive\n\n\
                data: {\"choices\":[{\"text\":\"!\",\"token_ids\":[7],\"finish_reason\":\"length\"}]}\n\n\
                data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
    let bytes = body.as_bytes();
    // Cut inside 世 (3 bytes) and between the \r and \n of the first event's end.
    let inside = body.find('\u{4e16}').unwrap() + 1;
    let in_crlf = body.find("\r\n").unwrap() + 1;
    let pieces =
        vec![HEAD.to_vec(), bytes[..inside].to_vec(), bytes[inside..in_crlf].to_vec(), bytes[in_crlf..].to_vec()];
    let upstream = Upstream::new(&scripted_server(pieces, Duration::ZERO), short_timeouts()).unwrap();
    let events = collect(&upstream).await;
    assert_eq!(texts(&events), "h\u{e9}llo \u{4e16}\u{754c}!", "{events:?}");
    let tokens: Vec<u32> = events
        .iter()
        .filter_map(|e| if let GenerationEvent::Token { token, .. } = e { Some(*token) } else { None })
        .collect();
    assert_eq!(tokens, [5, 6, 7]);
    match events.last() {
        Some(GenerationEvent::Finished { usage, .. }) => {
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 3))
        }
        other => panic!("the stream must finish: {other:?}"),
    }
}

#[tokio::test]
async fn an_upstream_that_accepts_and_never_answers_fails_at_the_head_limit() {
    // Accepts (the kernel does, from the backlog) and never reads or writes.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let upstream = Upstream::new(&url, short_timeouts()).unwrap();
    let started = Instant::now();
    let error = upstream.generate(GenerateRequest::new(vec![1], 4)).await.err().expect("a stalled upstream fails");
    let waited = started.elapsed();
    let message = error.to_string();
    assert!(message.contains("timed out") && message.contains("no response head within 0.3 s"), "{message}");
    assert!(matches!(error, EngineError::UpstreamTimeout(_)), "a 504, not a 500: {error:?}");
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(3), "{waited:?}");
    assert!(!upstream.ready().await, "a silent upstream is not ready");
    drop(listener);
}

#[tokio::test]
async fn an_upstream_that_stalls_mid_stream_ends_the_stream_with_an_error() {
    let first = b"data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[9]}]}\n\n".to_vec();
    let upstream =
        Upstream::new(&scripted_server(vec![HEAD.to_vec(), first], Duration::from_secs(5)), short_timeouts()).unwrap();
    let started = Instant::now();
    let events = collect(&upstream).await;
    assert!(started.elapsed() < Duration::from_secs(3), "ended at the idle limit, not the server's close");
    assert_eq!(texts(&events), "a");
    match events.last() {
        Some(GenerationEvent::Error { message, error, .. }) => {
            assert!(message.contains("timed out: nothing for 0.3 s"), "{message}");
            assert!(matches!(error, EngineError::UpstreamTimeout(_)), "{error:?}");
        }
        other => panic!("the stream must end with an error: {other:?}"),
    }
}

#[tokio::test]
async fn a_body_that_ends_early_is_an_error_and_done_without_usage_finishes() {
    let cut = b"data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[9]}]}\n\n".to_vec();
    let upstream =
        Upstream::new(&scripted_server(vec![HEAD.to_vec(), cut.clone()], Duration::ZERO), short_timeouts()).unwrap();
    let events = collect(&upstream).await;
    assert!(
        matches!(events.last(), Some(GenerationEvent::Error { message, .. }) if message.contains("ended before")),
        "{events:?}"
    );
    let done = [HEAD.to_vec(), cut, b"data: [DONE]\n\n".to_vec()].to_vec();
    let upstream = Upstream::new(&scripted_server(done, Duration::ZERO), short_timeouts()).unwrap();
    match collect(&upstream).await.last() {
        Some(GenerationEvent::Finished { usage, .. }) => {
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 1))
        }
        other => panic!("[DONE] finishes: {other:?}"),
    }
}

#[test]
fn timeouts_have_defaults_and_refuse_nonsense() {
    let t: UpstreamTimeouts = serde_json::from_str(r#"{"idle_s": 0.5}"#).unwrap();
    assert_eq!((t.connect_s, t.head_s, t.idle_s), (5.0, 60.0, 0.5));
    assert!(t.problems().is_empty());
    let bad = UpstreamTimeouts { connect_s: 0.0, head_s: f64::NAN, idle_s: 1.0 };
    let keys: Vec<&str> = bad.problems().iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["connect_s", "head_s"]);
    assert!(Upstream::new("http://127.0.0.1:1", bad).is_err());
}

#[tokio::test]
async fn text_without_token_ids_fails_naming_the_upstream() {
    let body = b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n".to_vec();
    let url = scripted_server(vec![HEAD.to_vec(), body], Duration::ZERO);
    let upstream = Upstream::new(&url, short_timeouts()).unwrap();
    let events = collect(&upstream).await;
    assert_eq!(texts(&events), "", "no token is invented: {events:?}");
    match events.last() {
        Some(GenerationEvent::Error { message, .. }) => {
            assert!(message.contains(&url) && message.contains("without token_ids"), "{message}")
        }
        other => panic!("the stream must end with an error: {other:?}"),
    }
}

#[tokio::test]
async fn text_of_tokens_already_reported_rides_with_the_next_event() {
    // A stop-string prefix held back, then released without new tokens: tokenrouter
    // sends it with `token_ids: []`.
    let body = "data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[9]}]}\n\n\
                data: {\"choices\":[{\"text\":\"b\",\"token_ids\":[]}]}\n\n\
                data: {\"choices\":[{\"text\":\"c\",\"token_ids\":[10]}]}\n\n\
                data: {\"choices\":[{\"text\":\"d\",\"token_ids\":[]}]}\n\n\
                data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
    let url = scripted_server(vec![HEAD.to_vec(), body.as_bytes().to_vec()], Duration::ZERO);
    let events = collect(&Upstream::new(&url, short_timeouts()).unwrap()).await;
    let tokens: Vec<(u32, &str)> = events
        .iter()
        .filter_map(|e| {
            if let GenerationEvent::Token { token, text, .. } = e {
                Some((*token, text.as_str()))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(tokens, [(9, "a"), (10, "bc")]);
    match events.last() {
        Some(GenerationEvent::Finished { text, usage, .. }) => {
            assert_eq!((text.as_str(), usage.completion_tokens), ("d", 2))
        }
        other => panic!("the stream must finish: {other:?}"),
    }
}

#[tokio::test]
async fn a_malformed_chunk_ends_the_stream_with_an_error() {
    let body = b"data: {\"choices\":[{\"text\":5,\"token_ids\":[1]}]}\n\ndata: [DONE]\n\n".to_vec();
    let url = scripted_server(vec![HEAD.to_vec(), body], Duration::ZERO);
    let events = collect(&Upstream::new(&url, short_timeouts()).unwrap()).await;
    match events.last() {
        Some(GenerationEvent::Error { message, .. }) => assert!(message.contains("malformed chunk"), "{message}"),
        other => panic!("the stream must end with an error: {other:?}"),
    }
}
