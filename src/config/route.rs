//! The `[[routes]]` section: one named upstream, its replicas and kind, and
//! an embedded route's model.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    /// Base URL including the version prefix, e.g. `http://127.0.0.1:8000/v1`.
    /// Not given for `kind = "embedded"`, whose server runs in-process.
    #[serde(default)]
    pub url: String,
    /// More replicas of the same model server (a pool, with `url` as its
    /// first member when both are given); see `docs/serving.md`.
    #[serde(default)]
    pub urls: Vec<String>,
    /// How a pool's replica is chosen for a call.
    #[serde(default)]
    pub policy: Policy,
    /// `affinity`: a rollout leaves its replica when that one has this many
    /// more calls in flight than the least-loaded healthy replica.
    #[serde(default = "defaults::affinity_margin")]
    pub affinity_margin: usize,
    /// Active health probes of a pool's replicas (`GET <url>/models`), every
    /// this many ms; 0 turns them off.
    #[serde(default = "defaults::health_interval_ms")]
    pub health_interval_ms: u64,
    /// A replica marked down by a failed call (connect error, 5xx) takes no
    /// new calls for this long, unless a probe finds it up first.
    #[serde(default = "defaults::down_cooldown_ms")]
    pub down_cooldown_ms: u64,
    /// Environment variable holding the upstream API key.
    pub api_key_env: Option<String>,
    /// Model names this route serves. `*` at the end matches a prefix.
    #[serde(default)]
    pub models: Vec<String>,
    /// Rename models on the way upstream: harness name → upstream name.
    #[serde(default)]
    pub model_map: BTreeMap<String, String>,
    #[serde(default = "defaults::connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Time allowed until the upstream's response headers arrive.
    #[serde(default = "defaults::response_timeout_secs")]
    pub response_timeout_secs: f64,
    /// Longest silence allowed between two pieces of a response body.
    #[serde(default = "defaults::idle_timeout_secs")]
    pub idle_timeout_secs: f64,
    /// Retries on connection errors (nothing else is retried).
    #[serde(default = "defaults::connect_retries")]
    pub connect_retries: u32,
    /// Idle connections kept per replica by each serving thread (each one
    /// closed after 90 s idle).
    #[serde(default = "defaults::pool_max_idle")]
    pub pool_max_idle: usize,
    /// What kind of server the upstream is; it decides which wire APIs it
    /// serves natively and how token ids are asked for.
    #[serde(default)]
    pub kind: RouteKind,
    /// Override the wire APIs the upstream serves natively
    /// (`chat_completions`, `responses`, `completions`, `messages`). Calls in
    /// another API are translated to Chat Completions when it is served.
    pub apis: Option<Vec<crate::dialect::WireApi>>,
    /// What translation does with constructs Chat Completions cannot
    /// express: `drop` them with a logged warning, or `reject` the call.
    #[serde(default)]
    pub unsupported: crate::dialect::translate::Unsupported,
    /// The model of a `kind = "embedded"` route (`[routes.embedded]`).
    #[serde(default)]
    pub embedded: EmbeddedConfig,
}

/// How an embedded route's model is run: the `[routes.embedded]` table.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// The GGUF file; by default the model `rollcall model fetch` caches.
    pub model_file: Option<PathBuf>,
    /// The model name served (`/v1/models`); by default the file's stem.
    pub name: Option<String>,
    /// `max_tokens` for calls that set none (vLLM would use the whole
    /// remaining context, which a small model fills with rambling).
    pub default_max_tokens: usize,
    /// `temperature` for calls that set none.
    pub default_temperature: f64,
    /// KV caches kept for conversations in progress.
    pub kv_slots: usize,
    /// Generations queued behind the one running; a call beyond them is
    /// answered 503 with `Retry-After` at once.
    pub queue: usize,
    /// Hold every weight as f32 (4 bytes a parameter) instead of in its
    /// Q4_0, Q4_1 or Q8_0 blocks. The answers are the same either way (the
    /// products are computed in f32 on the exact dequantized values); the
    /// blocks are several times smaller and faster to decode with.
    pub dequantize: bool,
    /// Threads the model computes on; 0: one per core.
    pub threads: usize,
}

/// Most `threads` an embedded model computes on.
pub const MAX_MODEL_THREADS: usize = 1024;
/// Most KV caches (and generations decoding together) an embedded model
/// keeps.
pub const MAX_KV_SLOTS: usize = 256;

impl EmbeddedConfig {
    /// `threads` and `kv_slots` within their bounds.
    pub fn validate(&self) -> Result<(), super::ConfigError> {
        if self.threads > MAX_MODEL_THREADS {
            return Err(super::ConfigError::Invalid(format!(
                "embedded.threads is {}; at most {MAX_MODEL_THREADS} (0: one per core)",
                self.threads
            )));
        }
        if !(1..=MAX_KV_SLOTS).contains(&self.kv_slots) {
            return Err(super::ConfigError::Invalid(format!(
                "embedded.kv_slots is {}; between 1 and {MAX_KV_SLOTS}",
                self.kv_slots
            )));
        }
        Ok(())
    }
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            model_file: None,
            name: None,
            default_max_tokens: 1024,
            default_temperature: 1.0,
            kv_slots: 4,
            queue: 64,
            dequantize: false,
            threads: 0,
        }
    }
}

/// The kind of model server behind a route.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    /// OpenAI or a server that speaks its full API: Chat Completions,
    /// Responses and Completions (Messages calls are translated to Chat).
    #[default]
    Openai,
    /// Anthropic or an Anthropic-compatible server: Messages only. The key
    /// goes in `x-api-key`.
    Anthropic,
    /// A server that speaks only Chat Completions and Completions
    /// (llama.cpp, most open-model servers): Responses and Messages calls
    /// are translated.
    Chat,
    /// vLLM: Chat Completions and Completions, asked for token ids and logprobs.
    Vllm,
    /// SGLang: Chat Completions and Completions, asked for token ids and logprobs.
    Sglang,
    /// A GGUF model run in-process on the CPU (`[routes.embedded]`): Chat
    /// Completions in vLLM's shape, token ids and logprobs included.
    Embedded,
}

mod defaults {
    pub fn affinity_margin() -> usize {
        8
    }
    pub fn health_interval_ms() -> u64 {
        2_000
    }
    pub fn down_cooldown_ms() -> u64 {
        5_000
    }
    pub fn connect_timeout_ms() -> u64 {
        5_000
    }
    pub fn response_timeout_secs() -> f64 {
        600.0
    }
    pub fn idle_timeout_secs() -> f64 {
        300.0
    }
    pub fn connect_retries() -> u32 {
        2
    }
    pub fn pool_max_idle() -> usize {
        512
    }
}

impl RouteKind {
    /// The wire APIs this kind of server serves natively.
    pub fn apis(self) -> &'static [crate::dialect::WireApi] {
        use crate::dialect::WireApi::*;
        match self {
            RouteKind::Openai => &[ChatCompletions, Responses, Completions],
            RouteKind::Anthropic => &[Messages],
            RouteKind::Chat | RouteKind::Vllm | RouteKind::Sglang => {
                &[ChatCompletions, Completions]
            }
            RouteKind::Embedded => &[ChatCompletions, Completions],
        }
    }
}

impl RouteConfig {
    /// A route with default settings, as `--upstream URL` creates.
    pub fn new(name: &str, url: &str) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            api_key_env: None,
            models: Vec::new(),
            model_map: BTreeMap::new(),
            connect_timeout_ms: defaults::connect_timeout_ms(),
            response_timeout_secs: defaults::response_timeout_secs(),
            idle_timeout_secs: defaults::idle_timeout_secs(),
            connect_retries: defaults::connect_retries(),
            pool_max_idle: defaults::pool_max_idle(),
            kind: RouteKind::default(),
            apis: None,
            unsupported: Default::default(),
            embedded: Default::default(),
            urls: Vec::new(),
            policy: Policy::default(),
            affinity_margin: defaults::affinity_margin(),
            health_interval_ms: defaults::health_interval_ms(),
            down_cooldown_ms: defaults::down_cooldown_ms(),
        }
    }

    /// Every replica's base URL: `url`, then `urls`.
    pub fn replica_urls(&self) -> Vec<String> {
        std::iter::once(&self.url)
            .filter(|u| !u.is_empty())
            .chain(&self.urls)
            .cloned()
            .collect()
    }
}

/// A pool's replica URLs, as the config and `POST /v1/admin/resume` take
/// them: at least one, each `http://` or `https://`, none twice (a trailing
/// `/` aside: a replica is known by its URL).
pub fn check_replica_urls(urls: &[String]) -> Result<(), String> {
    if urls.is_empty() {
        return Err("no replica url given".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for u in urls {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(format!("url {u:?} must start with http:// or https://"));
        }
        if !seen.insert(u.trim_end_matches('/')) {
            return Err(format!("url {u:?} is given twice"));
        }
    }
    Ok(())
}

/// How a pool's replica is chosen (`policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// A rollout sticks to one replica (consistent hashing of its id), so
    /// its KV and prefix cache stay warm; it is re-pinned when that replica
    /// is down or loaded `affinity_margin` calls beyond the least-loaded.
    #[default]
    Affinity,
    /// The healthy replica with the fewest calls in flight.
    LeastLoaded,
    /// Healthy replicas in turn.
    RoundRobin,
}
