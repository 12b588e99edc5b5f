//! Writing planned thresholds back into a configuration file.

use std::path::Path;

use anyhow::{bail, Context};
use serde_yaml_ng::{Mapping, Value};

use super::ServerConfig;

/// Puts `table` (N → one threshold per model, in engine order) into the config at
/// `path` as `scheduler.thresholds.<model>: {N: B, ...}`, keeping every other key.
/// `names`, when a running server gave them, must be the file's models in order. The
/// result is loaded back and checked before it replaces the file.
pub fn write_threshold_table(
    path: &Path,
    names: Option<&[String]>,
    table: &[(usize, Vec<usize>)],
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut doc: Value = serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let models = model_names(&doc).with_context(|| format!("{}: no `models` list with names", path.display()))?;
    if let Some(names) = names {
        if names != models.as_slice() {
            bail!("the server's models {names:?} are not the file's models {models:?}");
        }
    }
    if let Some((_, row)) = table.iter().find(|(_, row)| row.len() != models.len()) {
        bail!("{} thresholds for the file's {} models", row.len(), models.len());
    }
    let thresholds = scheduler_thresholds(&mut doc)?;
    for (i, name) in models.iter().enumerate() {
        let by_n: Mapping = table.iter().map(|(n, row)| (Value::from(*n as u64), Value::from(row[i] as u64))).collect();
        thresholds.insert(Value::from(name.as_str()), Value::Mapping(by_n));
    }
    let out = serde_yaml_ng::to_string(&doc)?;
    let checked = path.with_extension("planned.yaml");
    std::fs::write(&checked, &out).with_context(|| format!("writing {}", checked.display()))?;
    let loaded = ServerConfig::load(&checked);
    if let Err(e) = loaded {
        let _ = std::fs::remove_file(&checked);
        bail!("the planned configuration does not load: {e}");
    }
    std::fs::rename(&checked, path).with_context(|| format!("replacing {}", path.display()))
}

fn model_names(doc: &Value) -> Option<Vec<String>> {
    doc.get("models")?.as_sequence()?.iter().map(|m| m.get("name")?.as_str().map(str::to_string)).collect()
}

fn scheduler_thresholds(doc: &mut Value) -> anyhow::Result<&mut Mapping> {
    let root = doc.as_mapping_mut().context("the configuration is not a mapping")?;
    let scheduler = root.entry(Value::from("scheduler")).or_insert_with(|| Value::Mapping(Mapping::new()));
    if scheduler.is_null() {
        *scheduler = Value::Mapping(Mapping::new());
    }
    let scheduler = scheduler.as_mapping_mut().context("`scheduler` is not a mapping")?;
    let thresholds = scheduler.entry(Value::from("thresholds")).or_insert_with(|| Value::Mapping(Mapping::new()));
    if !thresholds.is_mapping() {
        *thresholds = Value::Mapping(Mapping::new());
    }
    Ok(thresholds.as_mapping_mut().expect("made a mapping above"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAIR: &str = "# demo pair\nmodels:\n  - name: small\n    preset: tiny\n  - name: large\n    preset: tiny\nscheduler:\n  max_wait_ms: 20\n";

    #[test]
    fn the_table_lands_in_the_scheduler_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pair.yaml");
        std::fs::write(&path, PAIR).unwrap();
        write_threshold_table(&path, None, &[(1, vec![1, 1]), (8, vec![3, 2])]).unwrap();
        let config = ServerConfig::load(&path).unwrap();
        let rule = config.batching_rule().unwrap();
        assert_eq!(rule.effective(8), vec![3, 2]);
        assert_eq!(rule.effective(4), vec![1, 1]);
        assert_eq!(config.scheduler.max_wait_ms, Some(20));
    }

    #[test]
    fn mismatches_and_deadlocks_leave_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pair.yaml");
        std::fs::write(&path, PAIR).unwrap();
        let other = vec!["a".to_string(), "b".to_string()];
        assert!(write_threshold_table(&path, Some(&other), &[(1, vec![1, 1])]).is_err());
        assert!(write_threshold_table(&path, None, &[(1, vec![1, 1, 1])]).is_err());
        let e = write_threshold_table(&path, None, &[(2, vec![2, 2])]).unwrap_err();
        assert!(e.to_string().contains("does not load"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), PAIR);
    }
}
