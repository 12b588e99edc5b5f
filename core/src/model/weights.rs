//! Reading tensors from a Hugging Face checkpoint: one or several safetensors files,
//! checked by name and shape against the config, converted to the runtime dtype.

use std::path::{Path, PathBuf};

use candle_core::{safetensors::MmapedSafetensors, DType, Device, Tensor};

use super::error::{ModelError, Result};

/// The checkpoint's tensors, memory-mapped, with checks on every read.
pub struct Checkpoint {
    tensors: MmapedSafetensors,
    dtype: DType,
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
    pub fn open(dir: &Path, dtype: DType) -> Result<Self> {
        let files = safetensor_files(dir)?;
        // Safety: the files are memory-mapped read-only; as for every mmap loader, the
        // caller must not truncate them while the model is loading.
        let tensors = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| ModelError::InvalidConfig {
            path: dir.to_path_buf(),
            message: format!("bad safetensors: {e}"),
        })?;
        Ok(Checkpoint { tensors, dtype })
    }

    /// Every tensor's name and shape, sorted by name.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut all: Vec<(String, Vec<usize>)> =
            self.tensors.tensors().into_iter().map(|(name, view)| (name, view.shape().to_vec())).collect();
        all.sort();
        all
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.get(name).is_ok()
    }

    /// Loads `name`, checking that its shape is `shape`, converted to the runtime dtype.
    pub fn load(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load_as(name, shape, self.dtype)
    }

    /// [`load`](Self::load) in f32 whatever the load dtype (straight from the file's
    /// precision): norms, biases, and other vectors that meet activations directly.
    pub fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load_as(name, shape, DType::F32)
    }

    fn load_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let view = self.tensors.get(name).map_err(|_| ModelError::MissingTensor { name: name.to_string() })?;
        if view.shape() != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        use safetensors::Dtype as S;
        if !matches!(view.dtype(), S::F32 | S::F16 | S::BF16 | S::F64) {
            return Err(ModelError::UnsupportedDtype { name: name.to_string(), dtype: format!("{:?}", view.dtype()) });
        }
        let tensor = self.tensors.load(name, &Device::Cpu)?;
        Ok(tensor.to_dtype(dtype)?)
    }
}

fn safetensor_files(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Err(ModelError::MissingFolder(dir.to_path_buf()));
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        return shard_files(&index, dir);
    }
    Err(ModelError::MissingFile(single))
}

fn shard_files(index: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(|e| ModelError::io(index, e))?;
    let bad = |message: String| ModelError::InvalidConfig { path: index.to_path_buf(), message };
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let files: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    match files.iter().find(|f| !f.is_file()) {
        Some(missing) => Err(ModelError::MissingFile(missing.clone())),
        None => Ok(files),
    }
}
