//! The dispatcher against scripted pool members: decisions at the boundary, spill-over
//! of a mis-routed request, and calibration from finished requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokenrouter_actors::tokenizer::RenderedChat;
use tokenrouter_actors::{EngineError, GenerateRequest, GenerationEvent, Usage};
use tokenrouter_core::pool::{Category, EstimatorConfig, PoolChoice};
use tokenrouter_core::sched::FinishReason;
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

use super::{Member, Pool, PoolDispatcher};
use crate::http::{EngineStats, EventStream, Generator};

/// Finishes every request at once, reporting its prompt size; counts requests.
#[derive(Default)]
struct Finisher {
    served: AtomicUsize,
}

impl Generator for Finisher {
    fn model_names(&self) -> Vec<String> {
        vec!["m".into()]
    }

    fn max_context(&self) -> usize {
        1 << 20
    }

    fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        self.served.fetch_add(1, Ordering::SeqCst);
        let usage = Usage { prompt_tokens: request.prompt.len(), ..Usage::default() };
        let done = GenerationEvent::Finished { reason: FinishReason::Length, usage, text: String::new(), stop: None };
        async move { Ok(Box::pin(futures::stream::iter([done])) as EventStream) }.boxed()
    }

    fn chat(&self, _: Vec<ChatMessage>, _: RenderOptions) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        async { Err(EngineError::Config("no tokenizer".into())) }.boxed()
    }

    fn encode(&self, _: String, _: bool) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        async { Err(EngineError::Config("no tokenizer".into())) }.boxed()
    }

    fn token_text(&self, id: u32) -> String {
        format!("<{id}>")
    }

    fn stats(&self) -> BoxFuture<'_, EngineStats> {
        async { EngineStats::default() }.boxed()
    }

    fn ready(&self) -> BoxFuture<'_, bool> {
        async { true }.boxed()
    }
}

struct Fixture {
    dispatcher: PoolDispatcher,
    short: Arc<Finisher>,
    long: Arc<Finisher>,
}

fn fixture(short_context: usize, long_context: usize) -> Fixture {
    let (short, long) = (Arc::new(Finisher::default()), Arc::new(Finisher::default()));
    let pool = |choice, max_context, member: &Arc<Finisher>| Pool {
        choice,
        max_context,
        members: vec![Member::new(member.clone(), 4)],
    };
    let dispatcher = PoolDispatcher::new(
        pool(PoolChoice::Short, short_context, &short),
        pool(PoolChoice::Long, long_context, &long),
        long.clone(),
        EstimatorConfig::default(),
    );
    Fixture { dispatcher, short, long }
}

/// Submits and drains the stream, so that feedback is applied.
async fn run(d: &PoolDispatcher, prompt_tokens: usize, max_tokens: usize, text: Option<&str>) {
    let request = GenerateRequest::new(vec![7; prompt_tokens], max_tokens);
    let events = d.generate_with_text(request, text).await.unwrap();
    let events: Vec<_> = events.collect().await;
    assert!(matches!(events.last(), Some(GenerationEvent::Finished { .. })));
}

fn served(f: &Fixture) -> (usize, usize) {
    (f.short.served.load(Ordering::SeqCst), f.long.served.load(Ordering::SeqCst))
}

#[tokio::test]
async fn exact_sizes_at_the_boundary_go_short_and_one_more_goes_long() {
    let f = fixture(1024, 8192);
    run(&f.dispatcher, 1000, 24, None).await;
    assert_eq!(served(&f), (1, 0), "1000 + 24 = 1024 fits the short pool");
    run(&f.dispatcher, 1001, 24, None).await;
    assert_eq!(served(&f), (1, 1));
    let routes = f.dispatcher.learning().snapshot().routes;
    assert_eq!((routes.short, routes.long, routes.spilled, routes.cautious), (1, 1, 0, 0));
}

#[tokio::test]
async fn estimated_budgets_decide_at_the_boundary() {
    let f = fixture(1024, 8192);
    // Prose prior 4.2 − 0.42 = 3.78 bytes per token: 3780 bytes are 1000 tokens.
    let text = |bytes: usize| "a".repeat(bytes);
    run(&f.dispatcher, 1000, 24, Some(&text(3780))).await;
    assert_eq!(served(&f), (1, 0));
    let f = fixture(1024, 8192);
    run(&f.dispatcher, 1000, 24, Some(&text(3781))).await;
    assert_eq!(served(&f), (0, 1), "one byte more is 1001 estimated tokens");
    assert_eq!(f.dispatcher.learning().snapshot().routes.cautious, 1);
}

#[tokio::test]
async fn a_request_the_short_pool_refuses_is_served_by_the_long_pool() {
    let f = fixture(1024, 8192);
    // 400 bytes look like ~106 tokens, but the prompt has 3000: the short pool refuses.
    run(&f.dispatcher, 3000, 16, Some(&"word ".repeat(80))).await;
    assert_eq!(served(&f), (0, 1), "served once, by the long pool");
    let routes = f.dispatcher.learning().snapshot().routes;
    assert_eq!((routes.short, routes.spilled), (1, 1));
    assert_eq!(routes.misroute_rate(), 1.0);
}

#[tokio::test]
async fn finished_requests_calibrate_their_category() {
    let f = fixture(1024, 8192);
    for _ in 0..200 {
        run(&f.dispatcher, 500, 8, Some(&"fn f() { x = [1]; }\n    ".repeat(50))).await;
    }
    let snapshot = f.dispatcher.learning().snapshot();
    let (_, code, _, mape) = snapshot.categories.iter().find(|c| c.0 == Category::Code).copied().unwrap();
    assert_eq!(code.observations, 200);
    let truth = "fn f() { x = [1]; }\n    ".len() as f64 * 50.0 / 500.0;
    assert!((code.ratio - truth).abs() < 0.01 * truth, "ĉ {} vs {truth}", code.ratio);
    assert!(mape.unwrap() < 0.3, "{mape:?}");
}

#[tokio::test]
async fn too_long_for_every_pool_is_a_request_error() {
    let f = fixture(1024, 2048);
    let request = GenerateRequest::new(vec![7; 3000], 16);
    let error = f.dispatcher.generate_with_text(request, None).await.err().unwrap();
    assert!(matches!(error, EngineError::InvalidRequest(ref m) if m.contains("long pool")), "{error:?}");
    assert_eq!(served(&f), (0, 0));
}
