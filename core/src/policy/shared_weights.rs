//! Weight files read once and shared by every policy built from them. A server builds
//! a policy per distinct parameter set (`routing.params`): r2r at thresholds 0.3 and
//! 0.4 differ only in a number, and should not each read the router file and the small
//! model's embedding table (vocab × hidden f32, hundreds of MiB for a real model).
//! Candle tensors share their storage when cloned, so a handed-out clone costs nothing.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{Device, Tensor};

use super::error::PolicyError;

#[derive(Default)]
struct Loaded {
    /// Every tensor of a router file, by the file's path.
    router_files: HashMap<PathBuf, HashMap<String, Tensor>>,
    /// `model.embed_tokens.weight` of a model folder, by the folder.
    embedding_tables: HashMap<PathBuf, Tensor>,
    /// Files read so far (for tests and logs).
    reads: usize,
}

/// A cache of loaded weight files, keyed by path; cloning shares it. Entries live as
/// long as the cache: the paths come from the server's configuration (requests may not
/// name files), so they are few.
#[derive(Clone, Default)]
pub struct SharedWeights {
    loaded: Arc<Mutex<Loaded>>,
}

impl fmt::Debug for SharedWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let loaded = self.lock();
        f.debug_struct("SharedWeights")
            .field("router_files", &loaded.router_files.len())
            .field("embedding_tables", &loaded.embedding_tables.len())
            .finish()
    }
}

impl SharedWeights {
    /// Every tensor of the safetensors file at `path`, read on first use.
    pub fn router_file(&self, path: &Path) -> Result<HashMap<String, Tensor>, PolicyError> {
        // The lock is held while reading, so concurrent builds read a file once.
        let mut loaded = self.lock();
        if let Some(tensors) = loaded.router_files.get(path) {
            return Ok(tensors.clone());
        }
        let tensors = candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| PolicyError::Weights { path: path.to_path_buf(), message: e.to_string() })?;
        loaded.reads += 1;
        loaded.router_files.insert(path.to_path_buf(), tensors.clone());
        Ok(tensors)
    }

    /// The embedding table of the model folder `dir`, read on first use with `read`.
    pub fn embedding_table(
        &self,
        dir: &Path,
        read: impl FnOnce(&Path) -> Result<Tensor, PolicyError>,
    ) -> Result<Tensor, PolicyError> {
        let mut loaded = self.lock();
        if let Some(table) = loaded.embedding_tables.get(dir) {
            return Ok(table.clone());
        }
        let table = read(dir)?;
        loaded.reads += 1;
        loaded.embedding_tables.insert(dir.to_path_buf(), table.clone());
        Ok(table)
    }

    /// Files read from disk so far (router files and embedding tables).
    pub fn reads(&self) -> usize {
        self.lock().reads
    }

    fn lock(&self) -> MutexGuard<'_, Loaded> {
        // A panic while loading leaves no half-written entry: inserts happen after reads.
        self.loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    #[test]
    fn a_file_is_read_once_and_its_tensors_share_storage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.safetensors");
        let tensor = Tensor::arange(0f32, 6.0, &Device::Cpu).unwrap().reshape((2, 3)).unwrap();
        candle_core::safetensors::save(&HashMap::from([("w".to_string(), tensor)]), &path).unwrap();

        let shared = SharedWeights::default();
        let first = shared.router_file(&path).unwrap();
        let again = shared.clone().router_file(&path).unwrap();
        assert_eq!(shared.reads(), 1);
        let (a, b) = (first["w"].storage_and_layout().0, again["w"].storage_and_layout().0);
        assert!(std::ptr::eq(&*a, &*b), "the same storage, not a copy");
        drop((a, b));
        assert!(shared.router_file(&dir.path().join("absent.safetensors")).is_err());
        assert_eq!(shared.reads(), 1, "a failed read is not counted or cached");
    }

    #[test]
    fn an_embedding_table_is_read_once_per_folder() {
        let shared = SharedWeights::default();
        let mut calls = 0;
        for _ in 0..3 {
            shared
                .embedding_table(Path::new("/models/small"), |_| {
                    calls += 1;
                    Ok(Tensor::zeros((4, 2), DType::F32, &Device::Cpu)?)
                })
                .unwrap();
        }
        assert_eq!((calls, shared.reads()), (1, 1));
        shared
            .embedding_table(Path::new("/models/other"), |_| Ok(Tensor::zeros(1, DType::F32, &Device::Cpu)?))
            .unwrap();
        assert_eq!(shared.reads(), 2);
    }
}
