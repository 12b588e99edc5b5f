//! The catalog's caches: a bounded LRU of request-made policies, configured policies
//! never evicted, and weight files read once however many parameter sets use them.

use std::sync::Arc;

use serde_json::json;
use tokenrouter_core::policy::weights::TensorSource;
use tokenrouter_core::policy::{CiterRouter, ModelInfo, PolicyContext};

use super::*;

const HIDDEN: usize = 16;

fn infos() -> Vec<ModelInfo> {
    ["small", "large"].iter().map(|n| ModelInfo { name: n.to_string(), hidden_size: HIDDEN, vocab_size: 100 }).collect()
}

/// A catalog whose default is `always` and which allows `citer` reading a router file
/// written into `dir` (the file's path is configured, as only the config may name files).
fn citer_catalog(dir: &std::path::Path) -> PolicyCatalog {
    let mut random = TensorSource::random(3);
    CiterRouter::new(&mut random, HIDDEN).unwrap();
    random.save(&dir.join("citer.safetensors")).unwrap();
    let allowed = vec![("citer".to_string(), json!({"weights": "citer.safetensors"}))];
    let ctx = PolicyContext { base_dir: Some(dir.to_path_buf()), ..PolicyContext::default() };
    PolicyCatalog::new("always", &json!(null), &allowed, infos(), ctx).unwrap()
}

#[test]
fn distinct_parameter_sets_stay_within_the_bound_and_share_one_weight_file() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = citer_catalog(dir.path());
    assert_eq!(catalog.shared_weights().reads(), 1, "the configured citer read its file");
    for i in 0..3 * REQUEST_POLICY_CACHE {
        let tau = json!({ "tau": 0.5 + i as f64 / 1e4 });
        catalog.build("citer", Some(&tau)).unwrap();
        assert!(catalog.cached_request_policies() <= REQUEST_POLICY_CACHE);
    }
    assert_eq!(catalog.cached_request_policies(), REQUEST_POLICY_CACHE);
    assert_eq!(catalog.shared_weights().reads(), 1, "no parameter set read the router file again");
}

#[test]
fn a_repeat_hits_the_cache_until_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = citer_catalog(dir.path());
    let first = catalog.build("citer", Some(&json!({"tau": 0.9, "small": 0}))).unwrap();
    // Key order does not matter: parameters are compared canonically.
    let again = catalog.build("citer", Some(&json!({"small": 0, "tau": 0.9}))).unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    for i in 0..REQUEST_POLICY_CACHE {
        catalog.build("citer", Some(&json!({ "tau": 0.1 + i as f64 / 1e4 }))).unwrap();
    }
    let rebuilt = catalog.build("citer", Some(&json!({"tau": 0.9, "small": 0}))).unwrap();
    assert!(!Arc::ptr_eq(&first, &rebuilt), "the least recently used was evicted");
}

#[test]
fn configured_policies_are_never_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = citer_catalog(dir.path());
    let configured = catalog.build("citer", None).unwrap();
    let default = catalog.default_policy();
    for i in 0..2 * REQUEST_POLICY_CACHE {
        catalog.build("citer", Some(&json!({ "tau": 0.2 + i as f64 / 1e4 }))).unwrap();
    }
    assert!(Arc::ptr_eq(&configured, &catalog.build("citer", Some(&json!({}))).unwrap()));
    assert!(Arc::ptr_eq(&default, &catalog.build("default", None).unwrap()));
}
