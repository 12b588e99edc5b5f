//! `citer` (CITER): a small MLP on the small model's last hidden state scores how safe
//! the small model's token is; a score below τ sends the position to the large model.
//!
//! Router file (safetensors), PyTorch `nn.Linear` layout, any depth ≥ 1:
//! `layers.{i}.weight` `(out_i, in_i)` and `layers.{i}.bias` `(out_i)`, with
//! `in_0 = hidden_size`, `in_{i+1} = out_i` and a last `out = 1`; ReLU between layers,
//! sigmoid on the output (the confidence score). Random weights use three layers,
//! `hidden → hidden/2 → hidden/4 → 1`.

use candle_core::{Device, Tensor};

use super::delegate::DelegatePolicy;
use super::error::PolicyError;
use super::weights::TensorSource;
use super::RouteRow;
use crate::model::linear::Linear;

/// The confidence MLP, run over all rows of a step at once.
pub struct CiterRouter {
    hidden: usize,
    layers: Vec<Linear>,
}

impl CiterRouter {
    /// Loads from `source`: the file's layer widths, or the random default widths.
    pub fn new(source: &mut TensorSource, hidden: usize) -> Result<Self, PolicyError> {
        let widths = layer_widths(source, hidden)?;
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| source.linear(&format!("layers.{i}"), w[0], w[1]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CiterRouter { hidden, layers })
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// Confidence scores in (0, 1) for `rows` hidden states of `hidden_size` each,
    /// concatenated.
    pub fn scores(&self, hidden_states: Vec<f32>, rows: usize) -> Result<Vec<f32>, PolicyError> {
        let mut x = Tensor::from_vec(hidden_states, (rows, self.hidden), &Device::Cpu)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = x.relu()?;
            }
        }
        Ok(candle_nn::ops::sigmoid(&x)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// `[hidden, out_0, out_1, …, 1]`: read from the file, or the random default.
fn layer_widths(source: &TensorSource, hidden: usize) -> Result<Vec<usize>, PolicyError> {
    if source.is_random() {
        return Ok(vec![hidden, (hidden / 2).max(1), (hidden / 4).max(1), 1]);
    }
    let mut widths = vec![hidden];
    while let Some(shape) = source.shape(&format!("layers.{}.weight", widths.len() - 1)) {
        widths.push(shape[0]);
    }
    if widths.len() < 2 || widths.last() != Some(&1) {
        return Err(PolicyError::Weights {
            path: source.describe().into(),
            message: "expected `layers.0.weight` … `layers.N.weight` ending in one output".into(),
        });
    }
    Ok(widths)
}

/// Parameters: `tau` (delegate when the confidence score < tau; default 0.98),
/// `weights` (router safetensors; default random with the context's seed), `small`, `large`.
pub struct CiterDelegate {
    router: CiterRouter,
    tau: f64,
}

impl CiterDelegate {
    pub const DEFAULT_TAU: f64 = 0.98;

    pub fn new(router: CiterRouter, tau: f64) -> Self {
        CiterDelegate { router, tau }
    }

    /// Scores of the rows that carry a hidden state of the right size (`None` for the
    /// others, which are never delegated), in one batched forward.
    pub fn row_scores(&self, rows: &[RouteRow<'_>]) -> Vec<Option<f32>> {
        let d = self.router.hidden_size();
        let valid: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].hidden.is_some_and(|h| h.len() == d)).collect();
        let mut scores = vec![None; rows.len()];
        if valid.is_empty() {
            return scores;
        }
        let inputs: Vec<f32> = valid.iter().flat_map(|&i| rows[i].hidden.unwrap_or_default().iter().copied()).collect();
        // A failed forward (it has no data-dependent failure mode) keeps every row.
        if let Ok(batch) = self.router.scores(inputs, valid.len()) {
            for (&i, score) in valid.iter().zip(batch) {
                scores[i] = Some(score);
            }
        }
        scores
    }
}

impl DelegatePolicy for CiterDelegate {
    fn name(&self) -> &str {
        "citer"
    }

    fn delegate(&self, rows: &mut [RouteRow<'_>]) -> Vec<bool> {
        self.row_scores(rows).into_iter().map(|s| s.is_some_and(|s| (s as f64) < self.tau)).collect()
    }

    fn needs_hidden(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delegate::tests::{route_all, RowData};
    use crate::policy::{BinaryAdapter, Decision, ModelPair, Policy};

    const HIDDEN: usize = 32;

    fn row_with_hidden(seed: usize) -> RowData {
        let mut data = RowData::new(0, vec![0.0; 8]);
        data.hidden = Some((0..HIDDEN).map(|i| ((i * 7 + seed * 13) % 11) as f32 / 5.0 - 1.0).collect());
        data
    }

    fn delegate(tau: f64) -> CiterDelegate {
        CiterDelegate::new(CiterRouter::new(&mut TensorSource::random(3), HIDDEN).unwrap(), tau)
    }

    #[test]
    fn batched_scores_equal_single_row_scores() {
        let policy = delegate(0.5);
        let mut batch: Vec<RowData> = (0..5).map(row_with_hidden).collect();
        let rows: Vec<RouteRow<'_>> = batch.iter_mut().map(RowData::row).collect();
        let together = policy.row_scores(&rows);
        assert!(together.iter().all(|s| s.is_some_and(|s| s > 0.0 && s < 1.0)));
        for (i, score) in together.iter().enumerate() {
            let mut alone = row_with_hidden(i);
            let single = policy.row_scores(&[alone.row()])[0];
            assert!((single.unwrap() - score.unwrap()).abs() < 1e-6);
        }
        let distinct = together.windows(2).any(|w| w[0] != w[1]);
        assert!(distinct, "the router must depend on its input: {together:?}");
    }

    #[test]
    fn tau_zero_never_delegates_and_above_one_always_does() {
        let mut rows: Vec<RowData> = (0..4).map(row_with_hidden).collect();
        let never = BinaryAdapter::new(delegate(0.0), ModelPair::default());
        let always = BinaryAdapter::new(delegate(1.01), ModelPair::default());
        assert!(route_all(&never, &mut rows).iter().all(|d| *d == Decision::Stay));
        assert!(route_all(&always, &mut rows).iter().all(|d| *d == Decision::Move { to: 1, commit: false }));
        assert!(always.needs_hidden(0) && !always.needs_hidden(1));
    }

    #[test]
    fn rows_without_a_usable_hidden_state_stay() {
        let always = BinaryAdapter::new(delegate(1.01), ModelPair::default());
        let mut short = row_with_hidden(0);
        short.hidden = Some(vec![0.0; HIDDEN - 1]);
        let mut rows = vec![RowData::new(0, vec![0.0; 8]), short, row_with_hidden(1)];
        let decisions = route_all(&always, &mut rows);
        assert_eq!(decisions, vec![Decision::Stay, Decision::Stay, Decision::Move { to: 1, commit: false }]);
    }

    #[test]
    fn router_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("citer.safetensors");
        let mut random = TensorSource::random(3);
        let original = CiterRouter::new(&mut random, HIDDEN).unwrap();
        random.save(&path).unwrap();
        let loaded = CiterRouter::new(&mut TensorSource::open(&path).unwrap(), HIDDEN).unwrap();
        let input: Vec<f32> = (0..2 * HIDDEN).map(|i| (i as f32).sin()).collect();
        assert_eq!(original.scores(input.clone(), 2).unwrap(), loaded.scores(input, 2).unwrap());
        assert_eq!(loaded.layers.len(), 3);
        let wrong_size = CiterRouter::new(&mut TensorSource::open(&path).unwrap(), HIDDEN + 1);
        assert!(wrong_size.is_err());
    }
}
