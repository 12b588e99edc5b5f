//! With the `cuda` feature: compiles the CUDA backend's kernels with nvcc into PTX for
//! compute capability 8.0 (which any newer card's driver JIT-compiles) and a cubin for
//! sm_90a (Hopper, loaded as it is), both embedded in the library. No GPU is needed
//! here; `scripts/cuda-toolkit.sh` fetches nvcc from PyPI.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const KERNELS: &str = "src/model/cuda/kernels.cu";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed={KERNELS}");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=NVCC");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let nvcc = find_nvcc();
    compile(&nvcc, &["--ptx", "-arch=sm_80"], &out.join("kernels_sm80.ptx"));
    compile(&nvcc, &["--cubin", "-arch=sm_90a"], &out.join("kernels_sm90a.cubin"));
}

fn find_nvcc() -> PathBuf {
    if let Some(nvcc) = env::var_os("NVCC") {
        return PathBuf::from(nvcc);
    }
    if let Some(home) = env::var_os("CUDA_HOME") {
        let nvcc = Path::new(&home).join("bin/nvcc");
        if nvcc.exists() {
            return nvcc;
        }
    }
    PathBuf::from("nvcc")
}

fn compile(nvcc: &Path, mode: &[&str], output: &Path) {
    let status = Command::new(nvcc)
        .args(mode)
        .args(["-O3", "-std=c++17", "-o"])
        .arg(output)
        .arg(KERNELS)
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "the `cuda` feature compiles its kernels with nvcc, which could not run ({}: {e}). \
                 Fetch CUDA's compiler with `eval \"$(scripts/cuda-toolkit.sh)\"` (PyPI wheels, no GPU needed) \
                 or set CUDA_HOME / NVCC.",
                nvcc.display()
            )
        });
    assert!(status.success(), "nvcc failed on {KERNELS} ({mode:?})");
}
