//! What every handler shares: the generator, the policy resolver, keys, limits, the
//! admission semaphore and the shutting-down flag.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use sha2::{Digest, Sha256};
use tokenrouter_actors::tls::TlsAcceptor;
use tokenrouter_core::spec::Speculation;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use super::generator::Generator;
use super::responses::store::{ResponseStore, StoreLimits};
use super::routing::PolicyResolver;

#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Requests in flight (queued in the engine or generating) before new ones get 429.
    pub max_queued_requests: usize,
    /// Largest `max_tokens` a request may ask for; also the default when it asks none
    /// (capped by the room the context leaves).
    pub max_tokens_limit: usize,
    /// An SSE comment is sent after this long without an event, so proxies and
    /// clients do not time out an idle stream (e.g. one waiting for KV).
    pub keep_alive_interval: Duration,
    /// On shutdown, in-flight responses get this long to finish before they are
    /// cut (which cancels their requests).
    pub shutdown_grace: Duration,
    /// HTTP worker threads; actix's default (one per physical core) when `None`.
    pub workers: Option<usize>,
    /// How long a connection may wait for its next request, its first included (then a
    /// kept-alive connection closes, and a first request not yet whole gets 408). Longer
    /// than client pools keep idle connections (hyper 90 s, aiohttp 15 s, httpx 5 s) and
    /// than load balancers' idle limits (60 s is common), so the client side closes first:
    /// otherwise a request sent just as the server gives up on the connection fails.
    pub idle_connection: Duration,
    /// Bounds on the request fields whose size the client chooses.
    pub request: RequestLimits,
    /// Bounds on the responses kept for `previous_response_id` (`server.responses`).
    pub responses: StoreLimits,
}

/// Bounds on user-sized request fields, each refused with a 400 naming the field.
/// The body limit alone bounds bytes, not the work a field causes: every stop string
/// is matched at every step, and each alternative logprob is sorted and decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLimits {
    /// Strings in `stop`. OpenAI allows 4; vLLM has no cap. 16 serves clients written
    /// for vLLM (several end markers per template) while keeping per-step matching cheap.
    pub max_stop_strings: usize,
    /// Bytes of one stop string: longer ones are not end markers, and each costs a
    /// suffix match of its length at every step.
    pub max_stop_string_bytes: usize,
    /// Ids in `stop_token_ids` (vLLM's extension); each must be inside the vocabulary.
    pub max_stop_token_ids: usize,
    /// Alternatives per token in `top_logprobs` (chat) or `logprobs` (completions);
    /// OpenAI's cap is 20, and so is the sampler's.
    pub max_top_logprobs: usize,
    /// Prompt tokens; `None`: whatever the context leaves room for.
    pub max_prompt_tokens: Option<usize>,
    /// Bytes of `routing.params` as JSON: a few numbers, never a document.
    pub max_routing_params_bytes: usize,
    /// Bytes of `session_id` (or `X-Session-Id`): sessions are kept under their id.
    pub max_session_id_bytes: usize,
    /// Bytes of a `response_format`'s JSON schema (as JSON), Lark grammar or regex: its
    /// compile time grows with its size, and it compiles for every request.
    pub max_grammar_bytes: usize,
    /// Tools in `tools` (OpenAI's cap is 128).
    pub max_tools: usize,
    /// Bytes of all of `tools` as JSON: they are rendered into the prompt, and a forced
    /// call compiles their parameter schemas into a grammar.
    pub max_tool_schema_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_stop_strings: 16,
            max_stop_string_bytes: 256,
            max_stop_token_ids: 64,
            max_top_logprobs: 20,
            max_prompt_tokens: None,
            max_routing_params_bytes: 4096,
            max_session_id_bytes: 256,
            // Hand-written schemas and grammars are a few KiB; 64 KiB leaves room for
            // generated ones while a compile stays well under its time limit.
            max_grammar_bytes: 64 << 10,
            max_tools: 128,
            max_tool_schema_bytes: 256 << 10,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_queued_requests: 256,
            max_tokens_limit: 4096,
            keep_alive_interval: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            workers: None,
            idle_connection: Duration::from_secs(120),
            request: RequestLimits::default(),
            responses: StoreLimits::default(),
        }
    }
}

/// Shared by every worker (cloning shares it).
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<dyn Generator>,
    pub policies: Arc<dyn PolicyResolver>,
    /// Bearer keys; empty means no authentication.
    pub api_keys: Arc<Vec<String>>,
    pub limits: Limits,
    /// The id `/v1/models` advertises first; requests may name it or any engine model.
    pub served_model: String,
    /// Unix seconds the server started (`created` in `/v1/models`).
    pub created: u64,
    /// Renders `/metrics`; `None` serves an empty page (no recorder installed).
    pub metrics: Option<PrometheusHandle>,
    /// `POST /debug/fault` is served (config `debug.fault_injection`).
    pub fault_injection: bool,
    /// The last minutes of stats (`/v1/stats/history`), sampled while `run_server` serves.
    pub history: Arc<super::history::StatsHistory>,
    /// Connections are TLS with this (config `server.tls`); `None`: plain HTTP.
    pub tls: Option<TlsAcceptor>,
    /// Speculative decoding for requests that do not say (config `scheduler.speculative`).
    pub speculation: Option<Speculation>,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: Arc<ResponseStore>,
    /// Secret bytes that make stored ids unguessable.
    id_secret: Arc<[u8; 32]>,
    admission: Arc<Semaphore>,
    shutting_down: Arc<AtomicBool>,
    next_id: Arc<AtomicU64>,
}

impl AppState {
    /// A state with default limits, no keys, no metrics, and the first engine model's
    /// name as the served id; adjust with the `with_*` methods.
    pub fn new(engine: Arc<dyn Generator>, policies: Arc<dyn PolicyResolver>) -> Self {
        let served_model = engine.model_names().first().cloned().unwrap_or_else(|| "tokenrouter".into());
        let limits = Limits::default();
        let responses = Arc::new(ResponseStore::new(limits.responses.clone()));
        AppState {
            engine,
            policies,
            api_keys: Arc::new(Vec::new()),
            admission: Arc::new(Semaphore::new(limits.max_queued_requests)),
            limits,
            served_model,
            created: unix_now(),
            metrics: None,
            fault_injection: false,
            history: Arc::default(),
            tls: None,
            speculation: None,
            responses,
            id_secret: Arc::new(random_secret()),
            shutting_down: Arc::new(AtomicBool::new(false)),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.admission = Arc::new(Semaphore::new(limits.max_queued_requests));
        self.responses = Arc::new(ResponseStore::new(limits.responses.clone()));
        self.limits = limits;
        self
    }

    pub fn with_speculation(mut self, speculation: Option<Speculation>) -> Self {
        self.speculation = speculation;
        self
    }

    pub fn with_api_keys(mut self, keys: Vec<String>) -> Self {
        self.api_keys = Arc::new(keys);
        self
    }

    pub fn with_served_model(mut self, id: impl Into<String>) -> Self {
        self.served_model = id.into();
        self
    }

    pub fn with_fault_injection(mut self, on: bool) -> Self {
        self.fault_injection = on;
        self
    }

    pub fn with_tls(mut self, acceptor: TlsAcceptor) -> Self {
        self.tls = Some(acceptor);
        self
    }

    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// From now on `/health` answers 503 and new generation requests are refused.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// A slot among the requests in flight, held until the response ends (for a
    /// stream, until its body is finished or dropped).
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        if self.is_shutting_down() {
            return Err(ApiError::ShuttingDown);
        }
        self.admission.clone().try_acquire_owned().map_err(|_| {
            metrics::counter!("tokenrouter_http_rejected_total", "reason" => "queue_full").increment(1);
            ApiError::QueueFull { limit: self.limits.max_queued_requests }
        })
    }

    /// Generation requests holding an admission slot now.
    pub fn in_flight(&self) -> usize {
        self.limits.max_queued_requests.saturating_sub(self.admission.available_permits())
    }

    /// Requests may name the served id or any engine model; absent means the served id.
    /// Returns the name to echo in the response.
    pub fn check_model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match requested {
            None => Ok(self.served_model.clone()),
            Some(m) if m == self.served_model || self.engine.model_names().iter().any(|n| n == m) => Ok(m.to_string()),
            Some(m) => Err(ApiError::UnknownModel(m.to_string())),
        }
    }

    /// Token ids back to text (`/detokenize`, `echo`), on actix's blocking pool: a body
    /// of megabytes of ids takes long to decode, and on a worker thread it would stall
    /// every connection that worker serves.
    pub async fn decode(&self, ids: Vec<u32>) -> Result<String, ApiError> {
        let engine = self.engine.clone();
        let decoded = actix_web::web::block(move || engine.decode(ids)).await;
        decoded.map_err(|e| ApiError::Internal(format!("decoding did not finish: {e}")))?.map_err(ApiError::from)
    }

    /// A response id unique within the process (prefixed by the caller).
    pub fn next_response_id(&self) -> String {
        format!("{:x}{:08x}", self.created, self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// An id for a kept object (`resp_…`): 24 hex digits no client can guess, so an
    /// id seen by one client tells nothing of another's.
    pub fn new_stored_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let digest = Sha256::new().chain_update(*self.id_secret).chain_update(n.to_le_bytes()).finalize();
        let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
        format!("{prefix}_{hex}")
    }
}

/// 32 bytes from the kernel's generator; the clock and the process id where it cannot
/// be read (ids then stay unique, if not secret).
fn random_secret() -> [u8; 32] {
    use std::io::Read;
    let mut secret = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut secret));
    if read.is_err() {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let seed = Sha256::new().chain_update(nanos.to_le_bytes()).chain_update(std::process::id().to_le_bytes());
        secret.copy_from_slice(&seed.finalize());
    }
    secret
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
