//! The files of the model runtime (core/src/model) and of the actors (actors/src) import
//! each other in one direction. In the runtime the `Backend` trait is a leaf every
//! backend imports and choosing and loading a backend sits above the backends; in the
//! actors the messages and the handles a request uses import no actor. Read from the
//! `use` lines (and paths in code) of the sources, comments and unit tests aside: a
//! module is a top-level file or folder of the tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module's source files, by the module's path below the root (a folder's `mod.rs`
/// is the folder itself).
fn sources(root: &Path) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(dir) = folders.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().with_extension("");
                let mut module: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if module.last().is_some_and(|m| m == "mod") {
                    module.pop();
                }
                out.insert(module, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    out
}

/// The code of a file without comments and without its unit-test module.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The top-level modules a file names through `super::…` (resolved from its own place)
/// or `prefix…` (the tree's path from its crate root, such as `crate::model::`).
fn references(module: &[String], text: &str, tops: &BTreeSet<String>, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for (at, _) in text.match_indices(prefix) {
        found.insert(ident(&text[at + prefix.len()..]));
    }
    for (at, _) in text.match_indices("super::") {
        let before = text[..at].chars().last();
        if before.is_some_and(|c| c == ':' || c.is_ascii_alphanumeric() || c == '_') {
            continue; // the second `super::` of a chain, or part of a longer path
        }
        let mut rest = &text[at..];
        let mut depth = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            depth += 1;
            rest = r;
        }
        // `super` from a folder's file names the folder's sibling only at its own depth.
        if depth == module.len() {
            found.insert(ident(rest));
        }
    }
    found.retain(|m| tops.contains(m) && Some(m) != module.first());
    found
}

/// Groups of modules that import each other in a circle.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in &edges[&m] {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|m| (m, reach(m))).collect();
    let mut groups: Vec<BTreeSet<String>> = Vec::new();
    for (m, r) in &reaches {
        if !r.contains(*m) || groups.iter().any(|g| g.contains(*m)) {
            continue;
        }
        groups.push(r.iter().filter(|o| reaches[o].contains(*m)).cloned().collect());
    }
    groups
}

/// Which top-level modules of the tree at `folder` (from the workspace root) each one
/// imports; `prefix` is the tree's path from its crate root.
fn import_graph(folder: &str, prefix: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
    let files = sources(&root);
    let tops: BTreeSet<String> = files.keys().filter_map(|m| m.first().cloned()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = tops.iter().map(|t| (t.clone(), BTreeSet::new())).collect();
    for (module, text) in files.iter().filter(|(m, _)| !m.is_empty()) {
        edges.get_mut(&module[0]).unwrap().extend(references(module, &code(text), &tops, prefix));
    }
    edges
}

/// The import graph of the modules under `dir` (more than `min_modules` of them, so the
/// sources were read), checked to have no circle.
fn acyclic_import_graph(dir: &str, prefix: &str, min_modules: usize) -> BTreeMap<String, BTreeSet<String>> {
    let edges = import_graph(dir, prefix);
    assert!(edges.len() > min_modules, "the sources were read: {:?}", edges.keys());
    assert_eq!(circles(&edges), Vec::<BTreeSet<String>>::new(), "modules that import each other in a circle");
    edges
}

#[test]
fn the_model_runtime_has_no_import_circle_and_the_backend_trait_is_a_leaf() {
    let edges = acyclic_import_graph("core/src/model", "crate::model::", 30);
    let backends = ["candle_backend", "llamacpp", "cuda", "load", "quantized", "warmup", "gguf_import", "transformer"];
    let trait_imports = &edges["backend"];
    assert!(backends.iter().all(|b| !trait_imports.contains(*b)), "backend.rs imports {trait_imports:?}");
    // The loader is what picks among them.
    assert!(edges["load"].contains("candle_backend") && edges["load"].contains("cuda"), "{:?}", edges["load"]);
}

#[test]
fn the_actors_have_no_import_circle_and_what_requests_use_imports_no_actor() {
    let edges = acyclic_import_graph("actors/src", "crate::", 15);
    let actors = ["engine", "compute", "request", "launch", "replan", "registry", "tokenizer", "remote"];
    for leaf in ["messages", "handles"] {
        let imports = &edges[leaf];
        let reached: Vec<&&str> = actors.iter().filter(|a| imports.contains(**a) && **a != "registry").collect();
        assert!(reached.is_empty(), "{leaf}.rs imports the actor modules {reached:?}");
    }
    // A request's actor, its launcher and the re-planner reach the engine only through its handles.
    for user in ["request", "launch", "replan"] {
        assert!(!edges[user].contains("engine") && edges[user].contains("handles"), "{user}: {:?}", edges[user]);
    }
}

#[test]
fn the_circle_finder_finds_circles() {
    let graph = |pairs: &[(&str, &str)]| {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            edges.entry(a.to_string()).or_default().insert(b.to_string());
            edges.entry(b.to_string()).or_default();
        }
        edges
    };
    let found = circles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("e", "f"), ("f", "e")]));
    let names: Vec<Vec<&str>> = found.iter().map(|g| g.iter().map(String::as_str).collect()).collect();
    assert_eq!(names, vec![vec!["a", "b", "c"], vec!["e", "f"]]);
    assert!(circles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    // `super::` from a folder's file names a sibling inside the folder, not a top module.
    let tops: BTreeSet<String> = ["cuda", "backend", "kv"].iter().map(|s| s.to_string()).collect();
    let inner = vec!["cuda".to_string(), "check".to_string()];
    let refs = references(&inner, "use super::backend::X;\nuse super::super::kv::Y;", &tops, "crate::model::");
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), vec!["kv".to_string()]);
}
