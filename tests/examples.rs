//! The Rust examples run and succeed, so they stay true. `cargo test` and nextest build the
//! examples beside the tests; one that is missing follows the asset rule (fails under
//! `TOKENROUTER_REQUIRE_ASSETS=1`, as in CI; skips, saying so, elsewhere).

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/<name>`, which cargo builds alongside the tests.
fn example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("examples").join(name);
    if path.is_file() {
        Some(path)
    } else {
        tokenrouter::core::assets::missing(format_args!("example {} was not built", path.display()))
    }
}

fn run(name: &str) -> Option<String> {
    let path = example(name)?;
    let out = Command::new(&path).env("TOKENROUTER_THREADS", "2").env("RUST_LOG", "warn").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{name} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    Some(stdout)
}

#[test]
fn library_example_streams_a_routed_request() {
    let Some(out) = run("library") else { return };
    assert!(out.contains("@small") && out.contains("Length"), "{out}");
}

#[test]
fn custom_policy_example_serves_its_policy() {
    let Some(out) = run("custom_policy") else { return };
    assert!(out.contains("\"large\"") && out.contains("tokens_per_model"), "{out}");
}
