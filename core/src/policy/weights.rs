//! Where a learned router's tensors come from: a safetensors file (checked by name and
//! shape) or seeded random values (tests, demos). Every tensor handed out is remembered,
//! so a random router can be written to a file and loaded back identically.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::LayerNorm;

use super::error::PolicyError;
use super::policy_uniform;
use crate::model::linear::Linear;

/// PyTorch's `nn.LayerNorm` default, which the published routers were trained with.
pub const LAYER_NORM_EPS: f64 = 1e-5;

enum Origin {
    File { path: PathBuf, tensors: HashMap<String, Tensor> },
    Random { seed: u64 },
}

/// Tensors for one router, read from a file or drawn at random.
pub struct TensorSource {
    origin: Origin,
    handed_out: HashMap<String, Tensor>,
}

impl TensorSource {
    /// Reads every tensor of a safetensors file into memory (routers are small).
    pub fn open(path: &Path) -> Result<Self, PolicyError> {
        let tensors = candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| PolicyError::Weights { path: path.to_path_buf(), message: e.to_string() })?;
        Ok(TensorSource { origin: Origin::File { path: path.to_path_buf(), tensors }, handed_out: HashMap::new() })
    }

    /// The tensors of the file at `path`, already read (e.g. from [`SharedWeights`]).
    ///
    /// [`SharedWeights`]: super::shared_weights::SharedWeights
    pub fn from_file_tensors(path: &Path, tensors: HashMap<String, Tensor>) -> Self {
        TensorSource { origin: Origin::File { path: path.to_path_buf(), tensors }, handed_out: HashMap::new() }
    }

    /// Random weights: linear layers uniform with variance 1/fan_in (activations stay
    /// O(1) through deep stacks), biases zero, norms the identity.
    pub fn random(seed: u64) -> Self {
        TensorSource { origin: Origin::Random { seed }, handed_out: HashMap::new() }
    }

    pub fn is_random(&self) -> bool {
        matches!(self.origin, Origin::Random { .. })
    }

    /// The shape of `name` if the source holds it: stored in the file or, for random
    /// weights (whose shapes come from the caller), already drawn.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let held = match &self.origin {
            Origin::File { tensors, .. } => tensors.get(name),
            Origin::Random { .. } => self.handed_out.get(name),
        };
        held.map(|t| t.dims().to_vec())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.shape(name).is_some()
    }

    /// A tensor as f32; from a file it must have exactly `shape`.
    pub fn tensor(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor, PolicyError> {
        let tensor = match &self.origin {
            Origin::File { path, tensors } => checked(path, tensors, name, shape)?,
            Origin::Random { seed } => random_tensor(*seed, name, shape, init)?,
        };
        self.handed_out.insert(name.to_string(), tensor.clone());
        Ok(tensor)
    }

    /// `{prefix}.weight` `(out, in)` and `{prefix}.bias` `(out)`, as `nn.Linear` stores them.
    pub fn linear(&mut self, prefix: &str, input: usize, output: usize) -> Result<Linear, PolicyError> {
        let weight = self.tensor(&format!("{prefix}.weight"), &[output, input], Init::FanIn(input))?;
        let bias = self.tensor(&format!("{prefix}.bias"), &[output], Init::Zeros)?;
        Ok(Linear::new(&weight, Some(bias))?)
    }

    /// `{prefix}.weight` and `{prefix}.bias`, both `(dim)`.
    pub fn layer_norm(&mut self, prefix: &str, dim: usize) -> Result<LayerNorm, PolicyError> {
        let weight = self.tensor(&format!("{prefix}.weight"), &[dim], Init::Ones)?;
        let bias = self.tensor(&format!("{prefix}.bias"), &[dim], Init::Zeros)?;
        Ok(LayerNorm::new(weight, bias, LAYER_NORM_EPS))
    }

    /// Writes every tensor handed out so far, e.g. to save a random router.
    pub fn save(&self, path: &Path) -> Result<(), PolicyError> {
        candle_core::safetensors::save(&self.handed_out, path)
            .map_err(|e| PolicyError::Weights { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Where the tensors come from, for messages.
    pub fn describe(&self) -> String {
        match &self.origin {
            Origin::File { path, .. } => path.display().to_string(),
            Origin::Random { seed } => format!("random weights (seed {seed})"),
        }
    }
}

/// How a random tensor is filled.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    Zeros,
    Ones,
    /// Uniform in ±√(3/fan_in): variance 1/fan_in.
    FanIn(usize),
    /// Standard normal-ish scale 1 (uniform with unit variance), e.g. embedding tables.
    Unit,
}

fn checked(path: &Path, tensors: &HashMap<String, Tensor>, name: &str, shape: &[usize]) -> Result<Tensor, PolicyError> {
    let bad = |message: String| PolicyError::Weights { path: path.to_path_buf(), message };
    let tensor = tensors.get(name).ok_or_else(|| bad(format!("tensor `{name}` is missing")))?;
    if tensor.dims() != shape {
        return Err(bad(format!("tensor `{name}` has shape {:?}, expected {shape:?}", tensor.dims())));
    }
    Ok(tensor.to_dtype(DType::F32)?)
}

fn random_tensor(seed: u64, name: &str, shape: &[usize], init: Init) -> Result<Tensor, PolicyError> {
    let count: usize = shape.iter().product();
    let half_width = match init {
        Init::Zeros => return Ok(Tensor::zeros(shape, DType::F32, &Device::Cpu)?),
        Init::Ones => return Ok(Tensor::ones(shape, DType::F32, &Device::Cpu)?),
        Init::FanIn(fan_in) => (3.0 / fan_in.max(1) as f64).sqrt(),
        Init::Unit => 3f64.sqrt(),
    };
    // Keyed by the tensor's name, so adding a tensor never changes the others.
    let salt = name_hash(name);
    let values: Vec<f32> =
        (0..count).map(|i| ((policy_uniform(seed, i, salt) * 2.0 - 1.0) * half_width) as f32).collect();
    Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
}

/// FNV-1a: a stable hash (std's hasher may change between releases).
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tensors_are_reproducible_and_scaled() {
        let mut a = TensorSource::random(1);
        let mut b = TensorSource::random(1);
        let wa = a.tensor("w", &[64, 256], Init::FanIn(256)).unwrap();
        let wb = b.tensor("w", &[64, 256], Init::FanIn(256)).unwrap();
        let (va, vb) =
            (wa.flatten_all().unwrap().to_vec1::<f32>().unwrap(), wb.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        assert_eq!(va, vb);
        let variance = va.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / va.len() as f64;
        assert!((variance * 256.0 - 1.0).abs() < 0.1, "variance {variance}");
        let other = TensorSource::random(2).tensor("w", &[64, 256], Init::FanIn(256)).unwrap();
        assert_ne!(other.flatten_all().unwrap().to_vec1::<f32>().unwrap(), va);
    }

    #[test]
    fn saved_tensors_load_back_with_shape_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.safetensors");
        let mut random = TensorSource::random(5);
        random.linear("proj", 3, 2).unwrap();
        random.save(&path).unwrap();

        let mut file = TensorSource::open(&path).unwrap();
        assert_eq!(file.shape("proj.weight"), Some(vec![2, 3]));
        let loaded = file.tensor("proj.weight", &[2, 3], Init::Zeros).unwrap();
        let original = TensorSource::random(5).tensor("proj.weight", &[2, 3], Init::FanIn(3)).unwrap();
        assert_eq!(loaded.to_vec2::<f32>().unwrap(), original.to_vec2::<f32>().unwrap());

        let wrong = file.tensor("proj.weight", &[3, 2], Init::Zeros).unwrap_err().to_string();
        assert!(wrong.contains("proj.weight") && wrong.contains("[2, 3]"), "{wrong}");
        let missing = file.tensor("nope.weight", &[1], Init::Zeros).unwrap_err().to_string();
        assert!(missing.contains("nope.weight"), "{missing}");
        assert!(TensorSource::open(&dir.path().join("absent.safetensors")).is_err());
    }
}
