//! Models by Hugging Face Hub id (`serve --model ORG/NAME`, `models[].hub` in a config):
//! the files a model needs are downloaded with `hf-hub` into the Hub's own cache layout
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), so files other
//! tools downloaded are reused and ours are theirs. Downloads resume where a broken one
//! stopped (hf-hub keeps the bytes it committed, in 10 MB chunks, in a `.sync.part` file);
//! each new file is checked against the size and, for LFS files, the SHA-256 the Hub
//! lists, and removed when it does not match. `HF_ENDPOINT`, `HF_TOKEN` (else the token
//! file `huggingface-cli login` writes) and `HF_HUB_OFFLINE` mean what they mean to
//! `huggingface_hub`.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use hf_hub::api::tokio::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};
use serde::Deserialize;
use sha2::{Digest, Sha256};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The Hub lists a repository's files with their sizes and LFS hashes on request.
const WITH_BLOBS: [(&str, &str); 1] = [("blobs", "true")];

/// `ORG/NAME` (a model folder: config, weights, tokenizer) or `ORG/NAME:FILE` (one GGUF
/// file of the repository).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModel {
    pub repo: String,
    pub file: Option<String>,
}

impl HubModel {
    /// Parses `ORG/NAME` or `ORG/NAME:FILE`; `None` when the text cannot be a Hub id.
    pub fn parse(text: &str) -> Option<HubModel> {
        let (repo, file) = match text.split_once(':') {
            Some((repo, file)) => (repo, Some(file.to_string())),
            None => (text, None),
        };
        let (org, name) = repo.split_once('/')?;
        let part_ok = |p: &str| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        let file_ok = file.as_deref().is_none_or(|f| !f.is_empty() && !f.starts_with('/') && !f.contains(".."));
        (part_ok(org) && part_ok(name) && file_ok).then(|| HubModel { repo: repo.to_string(), file })
    }

    /// The name a server gives the model: the repository's name, or the file's stem.
    pub fn short_name(&self) -> &str {
        match &self.file {
            Some(file) => Path::new(file).file_stem().and_then(|s| s.to_str()).unwrap_or(file),
            None => self.repo.split_once('/').map_or(self.repo.as_str(), |(_, name)| name),
        }
    }
}

impl fmt::Display for HubModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{}:{file}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

/// Where and how to reach the Hub; [`HubSettings::from_env`] reads what `huggingface_hub`
/// reads.
#[derive(Debug, Clone)]
pub struct HubSettings {
    pub endpoint: String,
    pub token: Option<String>,
    pub offline: bool,
    pub cache_dir: PathBuf,
}

impl HubSettings {
    pub fn from_env() -> HubSettings {
        let env = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
        let cache = match env("HF_HUB_CACHE") {
            Some(dir) => Cache::new(PathBuf::from(dir)),
            None => Cache::from_env(),
        };
        HubSettings {
            endpoint: env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token: env("HF_TOKEN").or_else(|| Cache::from_env().token()),
            offline: env("HF_HUB_OFFLINE").is_some_and(|v| is_truthy(&v)),
            cache_dir: cache.path().clone(),
        }
    }
}

fn is_truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}

/// What the Hub lists of one file.
#[derive(Debug, Clone, Deserialize)]
struct Listed {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Debug, Clone, Deserialize)]
struct LfsInfo {
    sha256: String,
    #[serde(default)]
    size: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Listing {
    sha: String,
    siblings: Vec<Listed>,
}

/// The model's local path, downloading what is missing: the snapshot folder for a model
/// folder, the file for `ORG/NAME:FILE`. Runs on a thread of its own, so it may be called
/// from inside an async runtime or outside one.
pub fn fetch(model: &HubModel, settings: &HubSettings, progress: Option<&MultiProgress>) -> Result<PathBuf, String> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the download runtime: {e}"))?;
                runtime.block_on(fetch_async(model, settings, progress))
            })
            .join()
            .unwrap_or_else(|_| Err(format!("downloading {model} failed unexpectedly")))
    })
}

/// The model from the cache alone, when every file it needs is there.
pub fn cached(model: &HubModel, settings: &HubSettings) -> Option<PathBuf> {
    // `get` looks in the snapshot the ref `main` points at.
    let repo = Cache::new(settings.cache_dir.clone()).model(model.repo.clone());
    match &model.file {
        Some(file) => repo.get(file),
        None => {
            let folder = repo.get("config.json")?.parent()?.to_path_buf();
            has_weights(&folder).then_some(folder)
        }
    }
}

fn has_weights(folder: &Path) -> bool {
    std::fs::read_dir(folder)
        .is_ok_and(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "safetensors")))
}

async fn fetch_async(
    model: &HubModel,
    settings: &HubSettings,
    progress: Option<&MultiProgress>,
) -> Result<PathBuf, String> {
    if settings.offline {
        return cached(model, settings).ok_or_else(|| {
            format!(
                "HF_HUB_OFFLINE is set and {model} is not in the Hub cache ({}); unset HF_HUB_OFFLINE to download it",
                settings.cache_dir.display()
            )
        });
    }
    let cache = Cache::new(settings.cache_dir.clone());
    let api = ApiBuilder::from_cache(cache.clone())
        .with_endpoint(settings.endpoint.clone())
        .with_token(settings.token.clone())
        .with_progress(false)
        .build()
        .map_err(|e| format!("cannot set up the Hub client: {e}"))?;
    let listing = match list(&api, model, &settings.endpoint).await {
        Ok(listing) => listing,
        Err(e) if e.unreachable => {
            return match cached(model, settings) {
                Some(path) => {
                    tracing::warn!(%model, why = %e.message, "the Hub cannot be reached: serving the cached files");
                    Ok(path)
                }
                None => {
                    Err(format!("{}; {model} is not in the Hub cache ({})", e.message, settings.cache_dir.display()))
                }
            };
        }
        Err(e) => return Err(e.message),
    };
    let wanted = files_to_fetch(model, &listing.siblings)?;
    let repo = api.repo(Repo::with_revision(model.repo.clone(), RepoType::Model, listing.sha.clone()));
    let cached_repo = cache.model(model.repo.clone());
    let snapshot = cached_repo.pointer_path(&listing.sha);
    for file in &wanted {
        let local = snapshot.join(&file.rfilename);
        if local.is_file() && size_matches(&local, file) {
            continue;
        }
        let bar = download_bar(progress, &file.rfilename);
        let path = repo
            .download_with_progress(&file.rfilename, bar.clone())
            .await
            .map_err(|e| describe(&e, model, &settings.endpoint).message)?;
        bar.finish_and_clear();
        verify(&path, file).inspect_err(|_| remove_download(&path))?;
    }
    // `download` records the commit under the ref it was asked for (the commit itself):
    // point `main` at it too, so the offline lookup finds this snapshot.
    cached_repo.create_ref(&listing.sha).map_err(|e| format!("{}: {e}", settings.cache_dir.display()))?;
    Ok(match &model.file {
        Some(file) => snapshot.join(file),
        None => snapshot,
    })
}

async fn list(api: &Api, model: &HubModel, endpoint: &str) -> Result<Listing, Failure> {
    let response = api
        .model(model.repo.clone())
        .info_request()
        .query(&WITH_BLOBS)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| describe(&ApiError::RequestError(e), model, endpoint))?;
    response.json::<Listing>().await.map_err(|e| Failure {
        message: format!("the Hub's file list for {} could not be read: {e}", model.repo),
        unreachable: false,
    })
}

/// Which of the repository's files the model needs: its config, tokenizer and
/// safetensors weights (top-level only), or the one file named.
fn files_to_fetch(model: &HubModel, listed: &[Listed]) -> Result<Vec<Listed>, String> {
    if let Some(file) = &model.file {
        return match listed.iter().find(|l| &l.rfilename == file) {
            Some(l) => Ok(vec![l.clone()]),
            None => Err(format!("{} has no file {file:?}{}", model.repo, gguf_hint(listed))),
        };
    }
    const WANTED: &[&str] = &[
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "model.safetensors.index.json",
    ];
    let top_level = listed.iter().filter(|l| !l.rfilename.contains('/'));
    let wanted: Vec<Listed> = top_level
        .filter(|l| WANTED.contains(&l.rfilename.as_str()) || l.rfilename.ends_with(".safetensors"))
        .cloned()
        .collect();
    if !wanted.iter().any(|l| l.rfilename == "config.json") {
        return Err(format!(
            "{} has no config.json: not a model this server can load{}",
            model.repo,
            gguf_hint(listed)
        ));
    }
    if !wanted.iter().any(|l| l.rfilename.ends_with(".safetensors")) {
        return Err(format!("{} has no .safetensors weights{}", model.repo, gguf_hint(listed)));
    }
    Ok(wanted)
}

/// Names the repository's GGUF files, which are served by `ORG/NAME:FILE`.
fn gguf_hint(listed: &[Listed]) -> String {
    let ggufs: Vec<&str> =
        listed.iter().map(|l| l.rfilename.as_str()).filter(|f| f.to_ascii_lowercase().ends_with(".gguf")).collect();
    match ggufs.is_empty() {
        true => String::new(),
        false => format!("; it holds GGUF files, served by naming one as ORG/NAME:FILE: {}", ggufs.join(", ")),
    }
}

fn expected_size(file: &Listed) -> Option<u64> {
    file.lfs.as_ref().and_then(|l| l.size).or(file.size)
}

fn size_matches(path: &Path, file: &Listed) -> bool {
    match (std::fs::metadata(path), expected_size(file)) {
        (Ok(meta), Some(size)) => meta.len() == size,
        (Ok(_), None) => true,
        (Err(_), _) => false,
    }
}

/// A new download holds the bytes the Hub listed: its size, and its SHA-256 for LFS files.
fn verify(path: &Path, file: &Listed) -> Result<(), String> {
    let name = &file.rfilename;
    let got = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
    if let Some(size) = expected_size(file) {
        if got != size {
            return Err(format!("{name}: downloaded {got} bytes where the Hub lists {size}; the file was removed"));
        }
    }
    if let Some(lfs) = &file.lfs {
        let digest = sha256_of(path)?;
        if !digest.eq_ignore_ascii_case(&lfs.sha256) {
            return Err(format!(
                "{name}: SHA-256 {digest} does not match the Hub's {}; the file was removed, run again to download it anew",
                lfs.sha256
            ));
        }
    }
    Ok(())
}

fn sha256_of(path: &Path) -> Result<String, String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Removes a refused download: the snapshot's link and the blob it points at.
fn remove_download(path: &Path) {
    if let Ok(blob) = std::fs::canonicalize(path) {
        let _ = std::fs::remove_file(blob);
    }
    let _ = std::fs::remove_file(path);
}

fn download_bar(progress: Option<&MultiProgress>, name: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
    let bar = match progress {
        Some(multi) => multi.add(bar),
        None => bar,
    };
    bar.set_message(name.to_string());
    bar
}

/// A failed Hub call, said as a user can act on it.
struct Failure {
    message: String,
    /// The Hub did not answer at all (as opposed to answering no).
    unreachable: bool,
}

fn describe(error: &ApiError, model: &HubModel, endpoint: &str) -> Failure {
    let request = match error {
        ApiError::RequestError(e) => Some(e),
        ApiError::TooManyRetries(inner) => match inner.as_ref() {
            ApiError::RequestError(e) => Some(e),
            _ => None,
        },
        _ => None,
    };
    let Some(e) = request else {
        return Failure { message: format!("downloading {model}: {error}"), unreachable: false };
    };
    if e.is_connect() || e.is_timeout() {
        return Failure {
            message: format!(
                "cannot reach the Hub at {endpoint} ({}); check the network or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use cached files",
                root_cause(e)
            ),
            unreachable: true,
        };
    }
    let message = match e.status().map(|s| s.as_u16()) {
        Some(401) | Some(403) => format!(
            "the Hub refused {model} ({}): it is gated or private; set HF_TOKEN to a token that may read it",
            e.status().map(|s| s.to_string()).unwrap_or_default()
        ),
        Some(404) => format!("the Hub at {endpoint} has no model {model}"),
        _ if e.is_body() || e.is_decode() || e.is_request() => {
            format!("downloading {model} broke off ({}); run again to resume where it stopped", root_cause(e))
        }
        _ => format!("downloading {model}: {}", root_cause(e)),
    };
    Failure { message, unreachable: false }
}

fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_parse_and_paths_do_not() {
        let m = HubModel::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
        assert_eq!((m.repo.as_str(), m.file.as_deref()), ("HuggingFaceTB/SmolLM2-135M-Instruct", None));
        assert_eq!(m.short_name(), "SmolLM2-135M-Instruct");
        let g = HubModel::parse("org/repo-GGUF:model.Q4_K_M.gguf").unwrap();
        assert_eq!(g.file.as_deref(), Some("model.Q4_K_M.gguf"));
        assert_eq!(g.short_name(), "model.Q4_K_M");
        assert_eq!(g.to_string(), "org/repo-GGUF:model.Q4_K_M.gguf");
        for not_an_id in ["demo", "./models/x", "/abs/path", "a/b/c", "org/", "/name", "../x", "org/n:../../etc"] {
            assert_eq!(HubModel::parse(not_an_id), None, "{not_an_id}");
        }
    }

    #[test]
    fn a_folder_model_takes_config_tokenizer_and_safetensors_only() {
        let listed = |names: &[&str]| -> Vec<Listed> {
            names.iter().map(|n| Listed { rfilename: n.to_string(), size: None, lfs: None }).collect()
        };
        let model = HubModel::parse("o/m").unwrap();
        let files = listed(&[
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "README.md",
            "pytorch_model.bin",
            "onnx/model.safetensors",
        ]);
        let names: Vec<String> = files_to_fetch(&model, &files).unwrap().into_iter().map(|l| l.rfilename).collect();
        assert_eq!(names, ["config.json", "model.safetensors", "tokenizer.json"]);
        let gguf_only = listed(&["README.md", "m.Q4_0.gguf", "m.Q8_0.gguf"]);
        let err = files_to_fetch(&model, &gguf_only).unwrap_err();
        assert!(err.contains("no config.json") && err.contains("m.Q4_0.gguf, m.Q8_0.gguf"), "{err}");
        let named = HubModel::parse("o/m:m.Q8_0.gguf").unwrap();
        assert_eq!(files_to_fetch(&named, &gguf_only).unwrap()[0].rfilename, "m.Q8_0.gguf");
        let missing = HubModel::parse("o/m:nope.gguf").unwrap();
        assert!(files_to_fetch(&missing, &gguf_only).unwrap_err().contains("no file \"nope.gguf\""));
    }

    #[test]
    fn truthy_values_are_huggingface_hubs() {
        for v in ["1", "true", "TRUE", "yes", "on"] {
            assert!(is_truthy(v), "{v}");
        }
        for v in ["0", "false", "no", "off", ""] {
            assert!(!is_truthy(v), "{v}");
        }
    }
}
