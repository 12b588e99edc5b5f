//! Whether the engine can serve now: what `/health` answers and `/v1/stats` shows.

use serde::Serialize;

/// One model's readiness.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelReadiness {
    pub model: String,
    pub ready: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The engine's readiness: ready when every model can serve and the tokenizer answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub models: Vec<ModelReadiness>,
    /// Whether the tokenizer actor answered; `None` where the models have no tokenizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<bool>,
}

impl Readiness {
    pub fn new(models: Vec<ModelReadiness>, tokenizer: Option<bool>) -> Self {
        let ready = models.iter().all(|m| m.ready) && tokenizer != Some(false);
        Readiness { ready, models, tokenizer }
    }

    /// What is wrong, in a sentence (`None` when ready).
    pub fn problem(&self) -> Option<String> {
        let mut problems: Vec<String> = self
            .models
            .iter()
            .filter(|m| !m.ready)
            .map(|m| format!("model {}: {}", m.model, m.reason.as_deref().unwrap_or("not ready")))
            .collect();
        if self.tokenizer == Some(false) {
            problems.push("the tokenizer is not answering".into());
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str, ready: bool) -> ModelReadiness {
        let reason = (!ready).then(|| "out of service".to_string());
        ModelReadiness { model: name.into(), ready, reason }
    }

    #[test]
    fn ready_only_when_every_model_and_the_tokenizer_are() {
        assert!(Readiness::new(vec![model("a", true), model("b", true)], Some(true)).ready);
        assert!(Readiness::new(vec![model("a", true)], None).ready, "no tokenizer is not a fault");
        let down = Readiness::new(vec![model("a", true), model("b", false)], Some(true));
        assert!(!down.ready);
        assert_eq!(down.problem().unwrap(), "model b: out of service");
        let mute = Readiness::new(vec![model("a", true)], Some(false));
        assert!(!mute.ready && mute.problem().unwrap().contains("tokenizer"));
    }
}
