//! Supervision and time limits: deadlines that strike while a request waits for KV,
//! panics in recovery, models that go out of service and come back from their weights,
//! a tokenizer actor that dies.

use super::*;

/// A budget that holds about three of these requests at once: the rest wait for KV.
fn scarce_kv(m: &mut Models) {
    for load in &mut m.load {
        load.kv_budget_bytes = 96 << 10;
    }
}

/// Requests whose deadlines (0–40 ms, at random) pass while they wait for KV, while
/// they are admitted, or while they run: each ends once, with its tokens or a 504,
/// and afterwards nothing is registered, active, reserved or held on any model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_that_pass_while_waiting_for_kv_leave_nothing_registered() {
    // A pause between a request actor's start and the rest of its launch: where a
    // deadline could once release the request before it was registered.
    tokenrouter_actors::set_launch_delay_for_tests(Duration::from_millis(2));
    let mut m = models(&[48, 64]);
    scarce_kv(&mut m);
    let mut config = engine_config(&m, random(0.3), &[1, 1]);
    config.admission.output_headroom = 16;
    let engine = Engine::start(config).await.unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut finished, mut late) = (0, 0);
    for wave in 0..40u64 {
        let mut clients = Vec::new();
        for i in 0..64u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut r = request(wave * 64 + i);
            r.max_tokens = 6;
            r.deadline = Some(Duration::from_micros(rng % 40_000));
            let engine = engine.clone();
            clients.push(tokio::spawn(async move {
                let mut stream = engine.generate(r).await.expect("admitted or queued");
                loop {
                    match tokio::time::timeout(Duration::from_secs(30), stream.next()).await.expect("no hang") {
                        Some(GenerationEvent::Token { .. }) => continue,
                        Some(GenerationEvent::Finished { .. }) => return true,
                        Some(GenerationEvent::Error { message, .. }) => {
                            assert!(message.contains("deadline exceeded"), "{message}");
                            return false;
                        }
                        None => panic!("a stream ended without a last event"),
                    }
                }
            }));
        }
        for client in clients {
            match client.await.unwrap() {
                true => finished += 1,
                false => late += 1,
            }
        }
    }
    eprintln!("deadlines: {finished} finished, {late} ran out of time");
    assert!(finished > 0 && late > 1000, "{finished} finished, {late} late: the deadlines must strike often");
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}

fn restarting_after(m: &Models, backoff: Duration, policy: Arc<dyn Policy>, thresholds: &[usize]) -> EngineConfig {
    let mut config = engine_config(m, policy, thresholds);
    config.supervision.restart_backoff = backoff;
    config.supervision.max_restart_backoff = backoff * 4;
    config
}

/// Waits for the next event, or fails the test after a minute.
async fn next_event(stream: &mut tokenrouter_actors::GenerationStream) -> Option<GenerationEvent> {
    tokio::time::timeout(Duration::from_secs(60), stream.next()).await.expect("no request hangs")
}

/// Runs `request(i)` to its end, and says whether it finished.
async fn finishes(engine: &Engine, i: u64) -> bool {
    let (tokens, end) = collect(engine, request(i)).await;
    matches!(end, GenerationEvent::Finished { .. }) && !tokens.is_empty()
}

/// Panics until the model gives up (each with a fresh request); the time it gave up.
async fn push_out_of_service(engine: &Engine, model: usize) -> std::time::Instant {
    for i in 0..10 {
        engine.inject_fault(model, Fault::Message).unwrap();
        if let (_, GenerationEvent::Error { message, .. }) = collect(engine, request(100 + i)).await {
            assert!(message.contains("out of service"), "{message}");
            return std::time::Instant::now();
        }
    }
    panic!("the model never gave up: {:?}", engine.stats().await);
}

/// A panic inside the recovery from a panic: the requests the model held end with an
/// error event (none hangs), the model is out of service, and it comes back from its
/// weights after the backoff and serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_recovering_ends_the_requests_with_an_error_and_the_model_reloads() {
    let m = models(&[48]);
    let engine = Engine::start(restarting_after(&m, Duration::from_millis(300), random(0.0), &[1])).await.unwrap();
    let mut r = request(1);
    r.max_tokens = 500;
    let mut stream = engine.generate(r).await.unwrap();
    assert!(matches!(next_event(&mut stream).await, Some(GenerationEvent::Token { .. })));
    engine.inject_fault(0, Fault::Recover).unwrap();
    engine.inject_fault(0, Fault::Step).unwrap();
    let end = loop {
        match next_event(&mut stream).await {
            Some(GenerationEvent::Token { .. }) => continue,
            other => break other,
        }
    };
    match end {
        Some(GenerationEvent::Error { message, .. }) => assert!(message.contains("out of service"), "{message}"),
        other => panic!("{other:?}"),
    }
    let mut back = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = engine.stats().await;
        if !stats[0].failed && stats[0].reloads == 1 {
            back = true;
            break;
        }
    }
    assert!(back, "the model did not reload: {:?}", engine.stats().await);
    assert!(finishes(&engine, 2).await);
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}

/// A model pushed out of service makes the engine not ready (its requests fail with
/// "out of service", a 503 over HTTP), reloads from its weights after the backoff,
/// and then the engine is ready and serves routed requests as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_out_of_service_reloads_from_its_weights_and_the_engine_is_ready_again() {
    let m = models(&[48, 64]);
    let backoff = Duration::from_millis(500);
    let engine = Engine::start(restarting_after(&m, backoff, random(0.3), &[1, 1])).await.unwrap();
    assert!(engine.readiness().await.ready);
    let died = push_out_of_service(&engine, 0).await;
    let readiness = engine.readiness().await;
    assert!(!readiness.ready && !readiness.models[0].ready && readiness.models[1].ready, "{readiness:?}");
    let mut ready_again = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if engine.readiness().await.ready {
            ready_again = Some(died.elapsed());
            break;
        }
    }
    let took = ready_again.expect("ready again after the reload");
    eprintln!("out of service to ready again: {took:?} (backoff {backoff:?})");
    assert!(took >= backoff / 2, "it waited for the backoff: {took:?}");
    for i in 0..6 {
        assert!(finishes(&engine, 200 + i).await);
    }
    let stats = engine.stats().await;
    assert_eq!(stats[0].reloads, 1, "{stats:?}");
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}
