//! What a route's model servers offer to weight sync, by kind: new weights
//! from a checkpoint on disk, and pausing generation in place.
//!
//! - vLLM (`kind = "vllm"`; the endpoints exist when the server runs with
//!   `VLLM_SERVER_DEV_MODE=1`): weights through
//!   `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`,
//!   then `POST /update_weight_version` with the policy version; generation
//!   paused in place by `POST /pause?mode=keep` (requests in flight freeze
//!   where they are) and continued by `POST /resume`.
//! - SGLang and the embedded model: `POST /update_weights_from_disk`
//!   (`model_path`, `weight_version`, `force`); no pause in place.
//! - Any other kind: neither; asking is a [`Refused`] error.
//!
//! vLLM 0.32's engine dies when `reload_weights` fails (a path it cannot
//! read ends the server, not just the request): where every replica is on
//! this machine (a loopback address), a `model_path` that does not exist
//! here is refused before any server sees it.

use super::{Loaded, Route};
use crate::config::RouteKind;
use bytes::Bytes;
use serde_json::json;
use std::time::Duration;

/// What was asked cannot be done on the route's servers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// a route of kind {0:?} has no weight reload rollcall knows (vllm, sglang and embedded routes have one)
    #[error("a route of kind {0:?} has no weight reload rollcall knows (vllm, sglang and embedded routes have one)")]
    NoReload(RouteKind),
    /// a route of kind {0:?} cannot pause generation in place: `keep` needs a vllm route (`hold` and `abort` work on any route)
    #[error("a route of kind {0:?} cannot pause generation in place: `keep` needs a vllm route (`hold` and `abort` work on any route)")]
    NoKeep(RouteKind),
    /// model_path {0:?} does not exist (the route's servers run on this machine, and vLLM's engine would die on it)
    #[error("model_path {0:?} does not exist (the route's servers run on this machine, and vLLM's engine would die on it)")]
    MissingPath(String),
}

/// New weights for a route's replicas.
pub struct Reload<'a> {
    /// A checkpoint the servers can read: a Hugging Face directory (vLLM,
    /// SGLang, embedded) or a GGUF file (embedded).
    pub model_path: &'a str,
    pub policy_version: Option<i64>,
    /// Accept a tokenizer change (embedded model).
    pub force: bool,
}

/// Why vLLM's development endpoints may be missing.
const VLLM_DEV: &str =
    "vLLM serves /collective_rpc, /pause and /resume only when started with VLLM_SERVER_DEV_MODE=1";

impl Route {
    /// `keep` pauses work on this route.
    pub fn pauses_in_place(&self) -> bool {
        self.kind == RouteKind::Vllm
    }

    /// Every replica is at a loopback address.
    fn on_this_machine(&self) -> bool {
        self.pool.snapshot().replicas().iter().all(|r| {
            reqwest::Url::parse(&r.url).is_ok_and(|u| match u.host_str() {
                Some("localhost") => true,
                Some(h) => h
                    .trim_matches(|c| c == '[' || c == ']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|a| a.is_loopback()),
                None => false,
            })
        })
    }

    /// Whether [`Route::load_weights`] would send `r` to the servers: asked
    /// before the route is paused for it.
    pub fn can_reload(&self, r: &Reload<'_>) -> Result<(), Refused> {
        match self.kind {
            RouteKind::Vllm => {
                if self.on_this_machine() && !std::path::Path::new(r.model_path).exists() {
                    return Err(Refused::MissingPath(r.model_path.to_owned()));
                }
                Ok(())
            }
            RouteKind::Sglang | RouteKind::Embedded => Ok(()),
            k => Err(Refused::NoReload(k)),
        }
    }

    /// Load new weights on every replica, waiting at most `wait` for each.
    pub async fn load_weights(
        &self,
        r: &Reload<'_>,
        wait: Duration,
    ) -> Result<Vec<Loaded>, Refused> {
        self.can_reload(r)?;
        match self.kind {
            RouteKind::Vllm => {
                let body =
                    json!({"method": "reload_weights", "kwargs": {"weights_path": r.model_path}});
                let mut loaded = self
                    .post_each("/collective_rpc", Some(body.to_string().into()), wait)
                    .await;
                if let Some(v) = r.policy_version {
                    let version = Bytes::from(json!({"new_version": v.to_string()}).to_string());
                    let tagged = self
                        .post_each("/update_weight_version", Some(version), wait)
                        .await;
                    for (l, t) in loaded.iter_mut().zip(tagged) {
                        if l.succeeded() && !t.succeeded() {
                            *l = t;
                        }
                    }
                }
                Ok(hinted(loaded, VLLM_DEV))
            }
            RouteKind::Sglang | RouteKind::Embedded => {
                let mut body = json!({"model_path": r.model_path});
                if r.force {
                    body["force"] = json!(true);
                }
                if let Some(v) = r.policy_version {
                    body["weight_version"] = json!(v.to_string());
                }
                let loaded = self
                    .post_each(
                        "/update_weights_from_disk",
                        Some(body.to_string().into()),
                        wait,
                    )
                    .await;
                Ok(hinted(
                    loaded,
                    "SGLang's endpoint is /update_weights_from_disk; a server without it offers no reload",
                ))
            }
            k => Err(Refused::NoReload(k)),
        }
    }

    /// Freeze generation on every replica, requests in flight included
    /// (vLLM's `keep`); new requests wait at the servers too.
    pub async fn pause_in_place(&self, wait: Duration) -> Result<Vec<Loaded>, Refused> {
        if !self.pauses_in_place() {
            return Err(Refused::NoKeep(self.kind));
        }
        Ok(hinted(
            self.post_each("/pause?mode=keep", Some(Bytes::from_static(b"{}")), wait)
                .await,
            VLLM_DEV,
        ))
    }

    /// Let every replica generate again after [`Route::pause_in_place`].
    pub async fn resume_in_place(&self, wait: Duration) -> Result<Vec<Loaded>, Refused> {
        if !self.pauses_in_place() {
            return Err(Refused::NoKeep(self.kind));
        }
        Ok(hinted(
            self.post_each("/resume", Some(Bytes::from_static(b"{}")), wait)
                .await,
            VLLM_DEV,
        ))
    }
}

/// A replica that answered 404 or 405 does not serve the endpoint: say why
/// that may be, in its answer.
fn hinted(mut loaded: Vec<Loaded>, hint: &str) -> Vec<Loaded> {
    for l in &mut loaded {
        if let Ok((404 | 405, _)) = &l.answer {
            l.answer = Err(format!(
                "the server has no POST {} (it answered {}): {hint}",
                l.endpoint,
                l.answer.as_ref().map(|a| a.0).unwrap_or_default()
            ));
        }
    }
    loaded
}
