//! Reading a policy's parameters (a JSON object from the config or the request) with
//! errors that name the key: unknown keys are refused, listing the known ones.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::delegate::ModelPair;
use super::error::PolicyError;
use super::{ModelIndex, ModelInfo};

pub(crate) struct Params<'a> {
    policy: &'a str,
    map: Map<String, Value>,
    known: Vec<&'static str>,
}

impl<'a> Params<'a> {
    /// `null` means no parameters; anything else must be an object.
    pub fn new(policy: &'a str, value: &Value) -> Result<Self, PolicyError> {
        let map = match value {
            Value::Null => Map::new(),
            Value::Object(map) => map.clone(),
            other => return Err(PolicyError::params(policy, format!("parameters must be an object, got {other}"))),
        };
        Ok(Params { policy, map, known: Vec::new() })
    }

    pub fn policy(&self) -> &str {
        self.policy
    }

    pub fn error(&self, message: impl Into<String>) -> PolicyError {
        PolicyError::params(self.policy, message)
    }

    /// Removes and parses `key`; `None` when absent (or null).
    pub fn take<T: DeserializeOwned>(&mut self, key: &'static str) -> Result<Option<T>, PolicyError> {
        self.known.push(key);
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => serde_json::from_value(value).map(Some).map_err(|e| self.error(format!("`{key}`: {e}"))),
        }
    }

    /// Removes `key` without parsing it (for keys with several accepted forms).
    pub fn take_raw(&mut self, key: &'static str) -> Option<Value> {
        self.known.push(key);
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// A finite number, `default` when absent.
    pub fn number(&mut self, key: &'static str, default: f64) -> Result<f64, PolicyError> {
        let value = self.take::<f64>(key)?.unwrap_or(default);
        match value.is_finite() {
            true => Ok(value),
            false => Err(self.error(format!("`{key}` must be a finite number, got {value}"))),
        }
    }

    /// A probability in [0, 1], `default` when absent.
    pub fn probability(&mut self, key: &'static str, default: f64) -> Result<f64, PolicyError> {
        let value = self.number(key, default)?;
        match (0.0..=1.0).contains(&value) {
            true => Ok(value),
            false => Err(self.error(format!("`{key}` must be in [0, 1], got {value}"))),
        }
    }

    /// A model given by name or index, `default` (an index) when absent.
    pub fn model(
        &mut self,
        key: &'static str,
        default: ModelIndex,
        models: &[ModelInfo],
    ) -> Result<ModelIndex, PolicyError> {
        let value = self.take_raw(key).unwrap_or(Value::from(default));
        resolve_model(self.policy, &value, models)
    }

    /// `small` (default model 0) and `large` (default model 1), distinct.
    pub fn pair(&mut self, models: &[ModelInfo]) -> Result<ModelPair, PolicyError> {
        if models.len() < 2 {
            return Err(self.error(format!("needs two models (small and large), the engine has {}", models.len())));
        }
        let pair = ModelPair { small: self.model("small", 0, models)?, large: self.model("large", 1, models)? };
        match pair.small == pair.large {
            true => Err(self.error(format!("`small` and `large` are the same model ({})", models[pair.small].name))),
            false => Ok(pair),
        }
    }

    /// Refuses whatever was not taken.
    pub fn finish(self) -> Result<(), PolicyError> {
        let Some(unknown) = self.map.keys().next() else { return Ok(()) };
        let expected = match self.known.is_empty() {
            true => "it takes no parameters".to_string(),
            false => format!("expected one of {}", quoted(&self.known)),
        };
        Err(self.error(format!("unknown parameter `{unknown}`; {expected}")))
    }
}

/// A model by name (as in the config) or by index.
pub(crate) fn resolve_model(policy: &str, value: &Value, models: &[ModelInfo]) -> Result<ModelIndex, PolicyError> {
    let found = match value {
        Value::Number(n) => n.as_u64().map(|i| i as usize).filter(|&i| i < models.len()),
        Value::String(name) => models.iter().position(|m| &m.name == name),
        _ => None,
    };
    found.ok_or_else(|| PolicyError::UnknownModel {
        policy: policy.to_string(),
        model: value.as_str().map_or_else(|| value.to_string(), str::to_string),
        known: models.iter().enumerate().map(|(i, m)| format!("{i}: {}", m.name)).collect::<Vec<_>>().join(", "),
    })
}

pub(crate) fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn models() -> Vec<ModelInfo> {
        ["small", "large"].iter().map(|n| ModelInfo { name: n.to_string(), hidden_size: 8, vocab_size: 16 }).collect()
    }

    #[test]
    fn values_defaults_and_unknown_keys() {
        let mut p = Params::new("x", &json!({"p": 0.25, "extra": 1})).unwrap();
        assert_eq!(p.probability("p", 0.5).unwrap(), 0.25);
        assert_eq!(p.number("tau", 0.03).unwrap(), 0.03);
        let error = p.finish().unwrap_err().to_string();
        assert!(error.contains("`extra`") && error.contains("`p`, `tau`"), "{error}");
    }

    #[test]
    fn type_and_range_errors_name_the_key() {
        let mut p = Params::new("x", &json!({"p": "high", "q": 2.0})).unwrap();
        assert!(p.probability("p", 0.5).unwrap_err().to_string().contains("`p`"));
        assert!(p.probability("q", 0.5).unwrap_err().to_string().contains("`q` must be in [0, 1]"));
        assert!(Params::new("x", &json!([1])).is_err());
        assert!(Params::new("x", &Value::Null).unwrap().finish().is_ok());
    }

    #[test]
    fn models_by_name_or_index() {
        let mut p = Params::new("x", &json!({"small": "large", "large": 0})).unwrap();
        assert_eq!(p.pair(&models()).unwrap(), ModelPair { small: 1, large: 0 });
        let mut same = Params::new("x", &json!({"large": "small"})).unwrap();
        assert!(same.pair(&models()).is_err());
        let mut unknown = Params::new("x", &json!({"small": "huge"})).unwrap();
        let error = unknown.pair(&models()).unwrap_err().to_string();
        assert!(error.contains("`huge`") && error.contains("0: small, 1: large"), "{error}");
        let mut out_of_range = Params::new("x", &json!({"model": 2})).unwrap();
        assert!(out_of_range.model("model", 0, &models()).is_err());
    }
}
