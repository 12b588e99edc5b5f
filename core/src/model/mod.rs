//! The model runtime: HF checkpoints, a transformer forward over varlen batches, paged
//! KV, sampling, and random-weight models for tests and demos.

pub mod attention;
mod attention_kernel;
pub mod backend;
pub mod candle_backend;
pub mod config;
pub mod cuda;
pub mod device;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod gguf_import;
pub mod gguf_read;
pub mod gguf_tokenizer;
pub mod huge_pages;
pub mod init;
pub mod kv;
pub mod kv_arena;
mod kv_group;
pub mod linear;
#[cfg(feature = "llamacpp")]
pub mod llamacpp;
pub mod load;
pub mod machine;
pub mod matmul;
pub mod model_files;
mod ops;
pub mod panels;
pub mod prefix_cache;
pub mod presets;
pub mod profile;
pub mod projection;
pub mod qmatmul;
pub mod quantized;
pub mod rope;
pub mod sampler;
pub mod sequence_map;
pub mod simd;
pub mod threads;
pub mod transformer;
pub mod warmup;
pub mod weights;
mod zeroed_pages;

pub use backend::{Backend, BackendKind, ForwardOutput, LoadOptions, RowInput, StepCostSource, WeightDtype};
pub use candle_backend::CandleBackend;
pub use config::{Arch, ModelConfig};
pub use device::DeviceSpec;
pub use error::{ModelError, Result};
pub use kv::{BlockPool, KvCapacity, KvEvent, KvSeq, SharedPoolSpec};
pub use kv_arena::{share_device_kv, share_kv, KvDtype, KvGeometry, SharedKv};
pub use load::{effective_kv_dtype, load_backend};
pub use model_files::read_model_config;
pub use prefix_cache::PrefixCacheStats;
