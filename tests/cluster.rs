//! Subservers on other hosts: an in-process front with model `m1` on a `tokenrouter
//! node` child process. Routed output still equals the sequential reference; killing
//! the node mid-run ends or resumes every request; a wrong cookie is refused. A second
//! test puts the node in another network namespace (root only).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster_support::*;
use crate::tls_support::TestCerts;
use tokenrouter::actors::remote::{FrontTls, LinkState, NodeStatus};
use tokenrouter::actors::{Engine, Fault, GenerationEvent};

const REQUESTS: u64 = 12;

/// Runs requests `0..REQUESTS` concurrently and checks each against the reference.
async fn check_reference(engine: &Engine, m: &Models, max_tokens: usize) {
    let ids: Vec<u64> = (0..REQUESTS).collect();
    let want = reference_outputs(m, &ids, max_tokens);
    let tasks: Vec<_> = ids
        .iter()
        .map(|&i| {
            let engine = engine.clone();
            tokio::spawn(async move { (i, collect(&engine, request(i, max_tokens), Duration::from_secs(60)).await) })
        })
        .collect();
    for task in tasks {
        let (i, (tokens, end)) = task.await.unwrap();
        assert!(matches!(end, GenerationEvent::Finished { .. }), "request {i}: {end:?}");
        assert_matches(&tokens, &want[&i], &format!("request {i}"));
    }
}

async fn assert_both_models_worked(engine: &Engine) {
    // The node's snapshot comes with the heartbeat: wait for one taken after the work.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = engine.stats().await;
        let moved = stats.len() == 2 && stats.iter().all(|s| s.stats.handoffs_in > 0);
        if moved {
            break;
        }
        assert!(Instant::now() < deadline, "requests moved both ways: {stats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes = engine.nodes();
    assert_eq!(nodes.len(), 1);
    assert!(nodes[0].messages_out > 0 && nodes[0].bytes_in > 0, "{nodes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_holds_with_the_large_model_on_another_process() {
    let m = models();
    let address = format!("127.0.0.1:{}", free_port());
    let _node = NodeProcess::start(m.dirs[1].path(), &address, COOKIE, &[]);
    let engine = Engine::start_clustered(engine_config(&m, &[2, 1]), Some(cluster(&[address], COOKIE))).await.unwrap();
    check_reference(&engine, &m, 16).await;
    assert_both_models_worked(&engine).await;
    // Stats arrive on the heartbeat: wait for a snapshot after the work.
    let deadline = Instant::now() + Duration::from_secs(5);
    while engine.stats().await[1].kv.free_blocks != engine.stats().await[1].kv.total_blocks {
        assert!(Instant::now() < deadline, "the node freed every request's KV");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    engine.shutdown().await;
}

/// Output length of the requests a node loss interrupts (long enough to be mid-run).
const LONG: usize = 300;

/// Starts `n` long requests, runs `during` (a kill) once the first has streamed two
/// tokens, and returns every request's tokens and final event.
async fn run_through(engine: &Engine, n: u64, during: impl FnOnce()) -> Vec<(u64, Vec<(u32, usize)>, GenerationEvent)> {
    let mut streams = Vec::new();
    for i in 0..n {
        streams.push((i, engine.generate(request(i, LONG)).await.unwrap()));
    }
    let mut out = Vec::new();
    let mut during = Some(during);
    for (i, mut stream) in streams {
        let mut tokens = Vec::new();
        loop {
            let event = tokio::time::timeout(Duration::from_secs(30), futures::StreamExt::next(&mut stream))
                .await
                .unwrap_or_else(|_| panic!("request {i} hung after the node was lost"))
                .expect("a final event");
            match event {
                GenerationEvent::Token { token, model, .. } => {
                    tokens.push((token, model));
                    if tokens.len() == 2 {
                        if let Some(kill) = during.take() {
                            kill();
                        }
                    }
                }
                end => {
                    out.push((i, tokens, end));
                    break;
                }
            }
        }
    }
    out
}

/// The node's status once `ok` holds (within 5 s).
async fn wait_for_node(engine: &Engine, ok: impl Fn(&NodeStatus) -> bool) -> NodeStatus {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let node = engine.nodes().remove(0);
        if ok(&node) {
            return node;
        }
        assert!(Instant::now() < deadline, "{node:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_node_ends_every_request_and_a_replacement_resumes_them() {
    let m = models();
    let addresses = [format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port())];
    let mut primary = NodeProcess::start(m.dirs[1].path(), &addresses[0], COOKIE, &[]);

    // Without a replacement: every request ends, those that needed the node with an error.
    let mut alone = cluster(&addresses[..1], COOKIE);
    alone.resume_timeout = Duration::from_secs(2);
    let engine = Engine::start_clustered(engine_config(&m, &[1, 1]), Some(alone)).await.unwrap();
    let started = Instant::now();
    let ended = run_through(&engine, 6, || primary.kill()).await;
    assert!(started.elapsed() < Duration::from_secs(30));
    let errors: Vec<String> = ended
        .iter()
        .filter_map(|(_, _, e)| match e {
            GenerationEvent::Error { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert!(!errors.is_empty(), "the random policy sends every long request to m1 at some point");
    assert!(errors.iter().all(|e| e.contains("was lost")), "{errors:?}");
    wait_for_node(&engine, |n| n.losses == 1 && n.state == LinkState::Failed).await;
    // The request actors release after the final event: give them a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    while engine.active_requests() > 0 {
        assert!(Instant::now() < deadline, "{} requests still active", engine.active_requests());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, end) = collect(&engine, request(3, 40), Duration::from_secs(10)).await;
    assert!(matches!(end, GenerationEvent::Error { .. }), "with the node gone a request that needs it fails at once");
    engine.shutdown().await;

    // With a replacement: every request resumes there and still equals the reference.
    let mut primary = NodeProcess::start(m.dirs[1].path(), &addresses[0], COOKIE, &[]);
    let _replacement = NodeProcess::start(m.dirs[1].path(), &addresses[1], COOKIE, &[]);
    let engine = Engine::start_clustered(engine_config(&m, &[1, 1]), Some(cluster(&addresses, COOKIE))).await.unwrap();
    assert_eq!(engine.nodes()[0].serving.as_deref(), Some(addresses[0].as_str()), "the primary serves first");
    let ended = run_through(&engine, 6, || primary.kill()).await;
    let want = reference_outputs(&m, &(0..6).collect::<Vec<_>>(), LONG);
    for (i, tokens, end) in &ended {
        assert!(matches!(end, GenerationEvent::Finished { .. }), "request {i}: {end:?}");
        assert_matches(tokens, &want[i], &format!("request {i} across the loss"));
    }
    let node = wait_for_node(&engine, |n| n.losses == 1 && n.state == LinkState::Up).await;
    assert_eq!(node.serving.as_deref(), Some(addresses[1].as_str()), "{node:?}");
    assert!(node.resumed > 0, "{node:?}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_cookie_is_refused() {
    let m = models();
    let address = format!("127.0.0.1:{}", free_port());
    let _node = NodeProcess::start(m.dirs[1].path(), &address, COOKIE, &[]);
    let started = Instant::now();
    let err = Engine::start_clustered(engine_config(&m, &[1, 1]), Some(cluster(&[address], "not-the-cookie")))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("cookie"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(15), "refused promptly, not at the connect timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_when_certificates_are_configured() {
    let certs = match TestCerts::make() {
        Ok(c) => c,
        Err(e) => {
            println!("skipped: cannot make test certificates ({e})");
            return;
        }
    };
    let m = models();
    let address = format!("127.0.0.1:{}", free_port());
    let tls_args = ["--tls-cert", &certs.path("node.pem"), "--tls-key", &certs.path("node.key")];
    let _node = NodeProcess::start_with(m.dirs[1].path(), &address, COOKIE, &[], &tls_args);
    let mut plain = cluster(&[address.clone()], COOKIE);
    plain.connect_timeout = Duration::from_secs(3);
    assert!(Engine::start_clustered(engine_config(&m, &[1, 1]), Some(plain)).await.is_err(), "plain TCP to a TLS node");
    let mut secure = cluster(&[address], COOKIE);
    secure.tls = Some(FrontTls { ca: certs.path("ca.pem").into(), server_name: None });
    let engine = Engine::start_clustered(engine_config(&m, &[1, 1]), Some(secure)).await.unwrap();
    check_reference(&engine, &m, 16).await;
    assert_both_models_worked(&engine).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_obeys_injected_faults_only_when_it_allows_them() {
    let m = models();
    for allowed in [false, true] {
        let address = format!("127.0.0.1:{}", free_port());
        let extra: &[&str] = if allowed { &["--allow-fault-injection"] } else { &[] };
        let _node = NodeProcess::start_with(m.dirs[1].path(), &address, COOKIE, &[], extra);
        let engine =
            Engine::start_clustered(engine_config(&m, &[1, 1]), Some(cluster(&[address], COOKIE))).await.unwrap();
        // The fault travels ahead of the requests: the node's model would panic at its
        // first step, and its requests resume (so they still match the reference).
        engine.inject_fault(1, Fault::Step).unwrap();
        check_reference(&engine, &m, 16).await;
        assert_both_models_worked(&engine).await;
        let want = u64::from(allowed);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let restarts = engine.stats().await.get(1).map(|s| s.restarts);
            if restarts == Some(want) {
                break;
            }
            assert!(Instant::now() < deadline, "allowed: {allowed}, the node's restarts: {restarts:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_warms_its_model_up_before_serving_unless_told_not_to() {
    // Far above what the tiny model and the process need: only a warm-up that commits
    // the K/V pages makes the node's memory grow by this much.
    const KV_MIB: u64 = 512;
    let m = models();
    for warm in [true, false] {
        let address = format!("127.0.0.1:{}", free_port());
        let extra: &[&str] = if warm { &[] } else { &["--no-warm-up"] };
        let node = NodeProcess::start_with_kv(m.dirs[1].path(), &address, COOKIE, extra, KV_MIB as usize);
        let idle = node.resident_mib();
        // The node loads its model when the front greets it, and welcomes it once loaded.
        let engine =
            Engine::start_clustered(engine_config(&m, &[1, 1]), Some(cluster(&[address], COOKIE))).await.unwrap();
        let serving = node.resident_mib();
        engine.shutdown().await;
        match warm {
            true => assert!(serving >= idle + KV_MIB * 9 / 10, "warm: {idle} MiB idle, {serving} MiB serving"),
            false => assert!(serving < idle + KV_MIB / 4, "--no-warm-up: {idle} MiB idle, {serving} MiB serving"),
        }
    }
}

/// A network namespace joined to this one by a veth pair; removed when dropped.
struct Netns {
    name: String,
}

impl Netns {
    fn create(name: &str, host_ip: &str, ns_ip: &str) -> Result<Netns, String> {
        let ns = Netns { name: name.to_string() };
        let veth_host = format!("{name}-h");
        let veth_ns = format!("{name}-n");
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", name],
            vec!["link", "add", &veth_host, "type", "veth", "peer", "name", &veth_ns],
            vec!["link", "set", &veth_ns, "netns", name],
            vec!["addr", "add", host_ip, "dev", &veth_host],
            vec!["link", "set", &veth_host, "up"],
            vec!["-n", name, "addr", "add", ns_ip, "dev", &veth_ns],
            vec!["-n", name, "link", "set", &veth_ns, "up"],
            vec!["-n", name, "link", "set", "lo", "up"],
        ];
        for step in steps {
            let out = Command::new("ip").args(&step).output().map_err(|e| format!("ip: {e}"))?;
            if !out.status.success() {
                return Err(format!("ip {}: {}", step.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &format!("{}-h", self.name)]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_holds_across_network_namespaces() {
    if not_root() {
        println!("skipped: making network namespaces needs root");
        return;
    }
    // Per-process names and subnet: two test runs on one machine must not collide.
    let pid = std::process::id();
    let name = format!("trc{}", pid % 100_000);
    let subnet = format!("10.{}.{}", 200 + pid % 50, (pid / 50) % 250);
    let ns = match Netns::create(&name, &format!("{subnet}.1/30"), &format!("{subnet}.2/30")) {
        Ok(ns) => ns,
        Err(e) => {
            println!("skipped: cannot make a network namespace here ({e})");
            return;
        }
    };
    let m = models();
    let address = format!("{subnet}.2:{}", 17_000 + pid % 1000);
    let _node = NodeProcess::start(m.dirs[1].path(), &address, COOKIE, &["ip", "netns", "exec", &ns.name]);
    let engine = Engine::start_clustered(engine_config(&m, &[1, 1]), Some(cluster(&[address], COOKIE))).await.unwrap();
    check_reference(&engine, &m, 16).await;
    assert_both_models_worked(&engine).await;
    engine.shutdown().await;

    // A partition (no FIN, no RST: the link just goes quiet) is found by the heartbeat.
    let mut quick = cluster(&[_node.address.clone()], COOKIE);
    quick.resume_timeout = Duration::from_secs(1);
    let engine = Engine::start_clustered(engine_config(&m, &[1, 1]), Some(quick)).await.unwrap();
    let veth = format!("{}-h", ns.name);
    let ended = run_through(&engine, 4, || {
        let out = Command::new("ip").args(["link", "set", &veth, "down"]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    })
    .await;
    assert!(ended.iter().any(|(_, _, e)| matches!(e, GenerationEvent::Error { .. })), "the partition was noticed");
    wait_for_node(&engine, |n| n.state == LinkState::Failed).await;
    engine.shutdown().await;
}

fn not_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() != "0").unwrap_or(true)
}
