//! The Rust examples run and succeed, so they stay true.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/<name>`, which cargo builds alongside the tests.
fn example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("examples").join(name);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipping: {} was not built", path.display());
        None
    }
}

fn run(name: &str) -> String {
    let Some(path) = example(name) else { return String::new() };
    let out = Command::new(&path).env("TOKENROUTER_THREADS", "2").env("RUST_LOG", "warn").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{name} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn library_example_streams_a_routed_request() {
    let out = run("library");
    if !out.is_empty() {
        assert!(out.contains("@small") && out.contains("Length"), "{out}");
    }
}

#[test]
fn custom_policy_example_serves_its_policy() {
    let out = run("custom_policy");
    if !out.is_empty() {
        assert!(out.contains("\"large\"") && out.contains("tokens_per_model"), "{out}");
    }
}
