//! The optional `routing` object of a request, and the seam through which the
//! server's configuration decides which policies a request may choose.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use tokenrouter_core::policy::Policy;

use super::error::ApiError;

/// `"routing": {"policy": "rstitch", "params": {"tau": 0.05}, "trace": true}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RoutingRequest {
    /// A policy name among those the server allows; the default policy when absent.
    #[serde(default)]
    pub policy: Option<String>,
    /// The policy's parameters (its config keys).
    #[serde(default)]
    pub params: Option<Value>,
    /// Report which model produced each token.
    #[serde(default)]
    pub trace: bool,
}

/// Turns a request's `routing` object into the policy to run it with. `Ok(None)`
/// means the engine's default policy. Refusals are 400s with `param` pointing into
/// `routing` (e.g. `routing.policy`).
pub trait PolicyResolver: Send + Sync + 'static {
    fn resolve(&self, routing: Option<&RoutingRequest>) -> Result<Option<Arc<dyn Policy>>, ApiError>;

    /// The names `routing.policy` may take, for `/openapi.json`; empty when unknown.
    fn policy_names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Allows only the engine's default policy (what a server without a policy catalog
/// offers): a request may name it, but not choose another or change its parameters.
#[derive(Debug, Clone)]
pub struct DefaultPolicyOnly {
    /// The default policy's name, as `Policy::name` spells it.
    pub default_name: String,
}

impl DefaultPolicyOnly {
    pub fn new(default: &dyn Policy) -> Self {
        DefaultPolicyOnly { default_name: default.name().to_string() }
    }
}

impl PolicyResolver for DefaultPolicyOnly {
    fn policy_names(&self) -> Vec<String> {
        vec![self.default_name.clone(), "default".into()]
    }

    fn resolve(&self, routing: Option<&RoutingRequest>) -> Result<Option<Arc<dyn Policy>>, ApiError> {
        let Some(routing) = routing else { return Ok(None) };
        if let Some(name) = routing.policy.as_deref() {
            if name != self.default_name && name != "default" {
                let message = format!(
                    "policy `{name}` is not allowed on this server; only the default `{}` is",
                    self.default_name
                );
                return Err(ApiError::bad_request(message, Some("routing.policy")));
            }
        }
        let has_params = match &routing.params {
            None | Some(Value::Null) => false,
            Some(Value::Object(map)) => !map.is_empty(),
            Some(_) => true,
        };
        if has_params {
            return Err(ApiError::bad_request(
                "this server does not allow changing the policy's parameters",
                Some("routing.params"),
            ));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_policy_without_parameters_is_allowed() {
        let r = DefaultPolicyOnly { default_name: "random".into() };
        assert!(r.resolve(None).unwrap().is_none());
        let named = |policy: &str| RoutingRequest { policy: Some(policy.into()), ..RoutingRequest::default() };
        assert!(r.resolve(Some(&named("random"))).unwrap().is_none());
        assert!(r.resolve(Some(&RoutingRequest { trace: true, ..RoutingRequest::default() })).unwrap().is_none());
        let refused = |routing: &RoutingRequest| r.resolve(Some(routing)).err().expect("refused");
        assert_eq!(refused(&named("rstitch")).param(), Some("routing.policy"));
        let with_params = RoutingRequest { params: Some(serde_json::json!({"p": 0.9})), ..RoutingRequest::default() };
        assert_eq!(refused(&with_params).param(), Some("routing.params"));
    }
}
