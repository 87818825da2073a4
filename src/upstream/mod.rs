//! Upstream routes: which model server a call goes to, and the client that
//! takes it there (`clients`: hyper's HTTP/1 connections, pooled per
//! thread by `plain`, for plain HTTP; reqwest for https; `body`: the
//! answer, whichever fetched it). A route is a pool of one or more
//! replicas ([`pool`]).
//! Connection errors are retried, on another replica when the pool has
//! one; nothing else is (a model call is not idempotent once the server has
//! seen it).

mod body;
mod clients;
pub mod engine;
mod plain;
pub mod pool;

pub use body::{Body, ReadError, Response};

use crate::config::{ConfigError, RouteConfig, RouteKind};
use crate::dialect::capture::CaptureKind;
use crate::dialect::translate::Unsupported;
use crate::dialect::WireApi;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
pub use pool::Lease;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Why an upstream call failed before a response arrived.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// could not connect to the upstream: {0}
    #[error("could not connect to the upstream: {0}")]
    Connect(String),
    /// the upstream did not answer within {0:?}
    #[error("the upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// the upstream request failed: {0}
    #[error("the upstream request failed: {0}")]
    Request(String),
}

/// One named upstream.
pub struct Route {
    pub name: String,
    pub pool: pool::Pool,
    health_interval: Duration,
    api_key: Option<String>,
    patterns: Vec<String>,
    model_map: BTreeMap<String, String>,
    clients: clients::Clients,
    connect_retries: u32,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    pub kind: RouteKind,
    /// Wire APIs the upstream serves natively.
    apis: Vec<WireApi>,
    pub unsupported: Unsupported,
    /// How to ask the upstream for token ids and logprobs, for vLLM and
    /// SGLang routes.
    pub capture: Option<CaptureKind>,
}

impl Route {
    fn new(c: &RouteConfig) -> Result<Self, ConfigError> {
        let api_key = match &c.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                ConfigError::Invalid(format!(
                    "route {:?}: environment variable {var} is not set",
                    c.name
                ))
            })?),
            None => None,
        };
        if let Some(k) = &api_key {
            crate::redact::register_secret(k);
        }
        let urls = c.replica_urls();
        for url in &urls {
            if let Ok(u) = reqwest::Url::parse(url) {
                if let Some(p) = u.password() {
                    crate::redact::register_secret(p);
                }
            }
        }
        // TLS to https upstreams uses rustls with the `ring` provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let clients = clients::Clients::new(clients::ClientOptions {
            connect_timeout: Duration::from_millis(c.connect_timeout_ms),
            pool_max_idle: c.pool_max_idle,
        })
        .map_err(|e| ConfigError::Invalid(format!("route {:?}: {e}", c.name)))?;
        let pool = pool::Pool::new(
            &urls,
            c.policy,
            c.affinity_margin,
            Duration::from_millis(c.down_cooldown_ms),
        )
        .map_err(|e| ConfigError::Invalid(format!("route {:?}: {e}", c.name)))?;
        Ok(Self {
            name: c.name.clone(),
            pool,
            health_interval: Duration::from_millis(c.health_interval_ms),
            api_key,
            patterns: c.models.clone(),
            model_map: c.model_map.clone(),
            clients,
            connect_retries: c.connect_retries,
            response_timeout: Duration::from_secs_f64(c.response_timeout_secs),
            idle_timeout: Duration::from_secs_f64(c.idle_timeout_secs),
            kind: c.kind,
            apis: c.apis.clone().unwrap_or_else(|| c.kind.apis().to_vec()),
            unsupported: c.unsupported,
            capture: match c.kind {
                // The embedded model answers in vLLM's shape.
                RouteKind::Vllm | RouteKind::Embedded => Some(CaptureKind::Vllm),
                RouteKind::Sglang => Some(CaptureKind::Sglang),
                _ => None,
            },
        })
    }

    /// The API to speak upstream for a call in `api`: the same one when the
    /// upstream serves it, Chat Completions when the call can be translated
    /// to it, else `None`.
    pub fn plan(&self, api: WireApi) -> Option<WireApi> {
        if self.apis.contains(&api) {
            Some(api)
        } else if matches!(api, WireApi::Responses | WireApi::Messages)
            && self.apis.contains(&WireApi::ChatCompletions)
        {
            Some(WireApi::ChatCompletions)
        } else {
            None
        }
    }

    /// The wire APIs the upstream serves natively, for error messages.
    pub fn api_names(&self) -> String {
        self.apis
            .iter()
            .map(|a| a.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn serves(&self, model: &str) -> bool {
        self.model_map.contains_key(model)
            || self.patterns.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => model.starts_with(prefix),
                None => p == model,
            })
    }

    /// The model name to send upstream.
    pub fn upstream_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.model_map.get(model).map_or(model, String::as_str)
    }

    /// Model names this route lists explicitly (for `GET /v1/models`).
    pub fn listed_models(&self) -> impl Iterator<Item = &str> {
        self.patterns
            .iter()
            .filter(|p| !p.ends_with('*'))
            .map(String::as_str)
            .chain(self.model_map.keys().map(String::as_str))
    }

    /// Where the call's key goes: the route's own key (when it has one) in
    /// the header its kind of server reads (`x-api-key` for Anthropic,
    /// `Authorization: Bearer` otherwise); else the harness's own, moved
    /// from `x-api-key` to a Bearer token when a Messages call was
    /// translated for a server that takes Bearer tokens. `headers` is
    /// copied, on its first change, only where it changes.
    fn place_key(&self, headers: &mut Cow<'_, HeaderMap>, translated: bool) {
        if let Some(key) = &self.api_key {
            let headers = headers.to_mut();
            headers.remove(http::header::AUTHORIZATION);
            headers.remove("x-api-key");
            if self.kind == RouteKind::Anthropic {
                if let Ok(v) = HeaderValue::from_str(key) {
                    headers.insert("x-api-key", v);
                }
            } else if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
                headers.insert(http::header::AUTHORIZATION, v);
            }
        } else if translated && headers.contains_key("x-api-key") {
            let headers = headers.to_mut();
            if let Some(k) = headers.remove("x-api-key") {
                if !headers.contains_key(http::header::AUTHORIZATION) {
                    let bearer = [b"Bearer ", k.as_bytes()].concat();
                    if let Ok(v) = HeaderValue::from_bytes(&bearer) {
                        headers.insert(http::header::AUTHORIZATION, v);
                    }
                }
            }
        }
    }

    /// `headers` as they go to this route's server: [`Self::place_key`]'s
    /// changes, and the `anthropic-version` an Anthropic server requires.
    /// Borrowed when there is nothing to change (the usual case), so that a
    /// call does not copy its headers for it.
    fn placed<'h>(&self, headers: &'h HeaderMap, translated: bool) -> Cow<'h, HeaderMap> {
        let mut headers = Cow::Borrowed(headers);
        self.place_key(&mut headers, translated);
        if self.kind == RouteKind::Anthropic && !headers.contains_key("anthropic-version") {
            headers
                .to_mut()
                .insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        }
        headers
    }

    /// Send a request to a replica's `url + endpoint` and wait (at most
    /// `response_timeout`) for the response head. The replica is the pool's
    /// pick for `rollout`; a connection error marks it down and the call
    /// goes to the next one (a pool of one retries it `connect_retries`
    /// times). A 5xx answer marks the replica down and is passed on.
    /// `translated`: the body is a translation into another API than the
    /// harness's.
    pub async fn send(
        &self,
        method: Method,
        endpoint: &str,
        headers: &HeaderMap,
        body: Bytes,
        translated: bool,
        rollout: Option<&str>,
    ) -> Result<Sent, UpstreamError> {
        let headers = self.placed(headers, translated);
        let single = self.pool.snapshot().len() == 1;
        let mut tried: Vec<Arc<pool::Replica>> = Vec::new();
        let mut attempt = 0;
        let mut last = UpstreamError::Connect("the route has no replica".into());
        let mut repinned = false;
        loop {
            let Some(mut lease) = self.pool.pick(rollout, &tried) else {
                return Err(last);
            };
            repinned |= lease.repinned;
            lease.repinned = repinned;
            let one = Request {
                method: &method,
                endpoint,
                headers: &headers,
                body: &body,
            };
            let sent = match lease.replica.is_plain() {
                true => self.send_plain(&lease.replica, one).await,
                false => self.send_tls(&lease.replica, one).await,
            };
            match sent {
                Ok(resp) => {
                    if resp.status().is_server_error() && !single {
                        self.pool.mark_down(&lease.replica);
                    }
                    return Ok(Sent { resp, lease });
                }
                Err(Failed::Connect(e)) if single && attempt < self.connect_retries => {
                    attempt += 1;
                    tracing::debug!(route = %self.name, attempt, error = %e, "retrying upstream connect");
                    tokio::time::sleep(Duration::from_millis(50 << attempt.min(6))).await;
                }
                Err(Failed::Connect(e)) => {
                    last = UpstreamError::Connect(e);
                    if single {
                        return Err(last);
                    }
                    tracing::warn!(route = %self.name, replica = %lease.replica.redacted, error = %last, "replica unreachable; failing over");
                    self.pool.mark_down(&lease.replica);
                    tried.push(lease.replica.clone());
                    repinned = rollout.is_some();
                }
                Err(Failed::Other(e)) => return Err(e),
            }
        }
    }

    /// One try on a plain-HTTP replica, over this thread's connections to
    /// it (`plain`).
    async fn send_plain(
        &self,
        replica: &pool::Replica,
        r: Request<'_>,
    ) -> Result<Response, Failed> {
        let bad_url =
            |e: String| Failed::Other(UpstreamError::Request(format!("bad upstream URL: {e}")));
        let (Some(origin), Some(host)) = (&replica.origin, &replica.host) else {
            return Err(bad_url("no host".into()));
        };
        let uri = match replica.plain_endpoint(r.endpoint) {
            Some(u) => u.clone(),
            None => format!("{}{}", replica.url, r.endpoint)
                .parse::<http::Uri>()
                .map_err(|e| bad_url(e.to_string()))
                .and_then(|u| pool::origin_form(&u).ok_or_else(|| bad_url("no path".into())))?,
        };
        let mut req = http::Request::new(http_body_util::Full::new(r.body.clone()));
        *req.method_mut() = r.method.clone();
        *req.uri_mut() = uri;
        // Built with room for `Host`: a clone has none, and growing it
        // cost more than the copy.
        let sent = req.headers_mut();
        sent.reserve(r.headers.len() + 1);
        for (k, v) in r.headers {
            sent.append(k.clone(), v.clone());
        }
        sent.insert(http::header::HOST, host.clone());
        // Boxed as built: held inline, its 1.7 KB were copied into each
        // future around it (the timeout's, this one's, the call's).
        let send = crate::http::pinned(|| self.clients.get().plain.send(origin, req));
        match tokio::time::timeout(self.response_timeout, send).await {
            Err(_) => Err(Failed::Other(UpstreamError::Timeout(self.response_timeout))),
            Ok(Ok((resp, held))) => Ok(resp.map(|b| Body::Plain(b, Some(held)))),
            Ok(Err(e)) if e.is_connect() => Err(Failed::Connect(error_chain(&e))),
            Ok(Err(e)) => Err(Failed::Other(UpstreamError::Request(error_chain(&e)))),
        }
    }

    /// One try on a TLS replica (or one with credentials in its URL), with
    /// reqwest.
    async fn send_tls(&self, replica: &pool::Replica, r: Request<'_>) -> Result<Response, Failed> {
        let url = match replica.endpoint(r.endpoint) {
            Some(u) => u.clone(),
            None => {
                reqwest::Url::parse(&format!("{}{}", replica.url, r.endpoint)).map_err(|e| {
                    Failed::Other(UpstreamError::Request(format!("bad upstream URL: {e}")))
                })?
            }
        };
        let req = self
            .clients
            .tls()
            .request(r.method.clone(), url)
            .headers(r.headers.clone())
            .body(r.body.clone());
        let timeout = UpstreamError::Timeout(self.response_timeout);
        match tokio::time::timeout(self.response_timeout, req.send()).await {
            Err(_) => Err(Failed::Other(timeout)),
            Ok(Ok(resp)) => Ok(http::Response::from(resp).map(Body::Tls)),
            Ok(Err(e)) if e.is_connect() => Err(Failed::Connect(error_chain(&e))),
            Ok(Err(e)) if e.is_timeout() => Err(Failed::Other(timeout)),
            Ok(Err(e)) => Err(Failed::Other(UpstreamError::Request(error_chain(&e)))),
        }
    }

    /// Replace the route's replicas with `urls` (`POST /v1/admin/resume`
    /// with `urls`; see [`pool::Pool::replace`]): the same checks as the
    /// config's `urls`, and none for an embedded route, whose one replica
    /// is its in-process model server. Calls already sent finish where they
    /// are; the next calls, and the probes, see the new set.
    pub fn replace_urls(&self, urls: &[String]) -> Result<pool::Change, String> {
        if self.kind == RouteKind::Embedded {
            return Err("an embedded route runs its model in-process and takes no url".into());
        }
        let change = self.pool.replace(urls)?;
        for url in &change.joined {
            if let Ok(u) = reqwest::Url::parse(url) {
                if let Some(p) = u.password() {
                    crate::redact::register_secret(p);
                }
            }
        }
        Ok(change)
    }

    /// POST `body` (JSON, or nothing) to `path` at every replica's origin
    /// (its base URL less a trailing `/v1`), waiting at most `wait` for
    /// each: every replica's answer (status and JSON body) or why there was
    /// none, in replica order. How [`engine`] reaches a server's own
    /// weight and pause endpoints.
    pub(crate) async fn post_each(
        &self,
        path: &str,
        body: Option<Bytes>,
        wait: Duration,
    ) -> Vec<Loaded> {
        let set = self.pool.snapshot();
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let mut headers = Cow::Owned(headers);
        self.place_key(&mut headers, false);
        let headers = headers.into_owned();
        let loads = set.replicas().iter().map(|r| {
            let origin = r.url.strip_suffix("/v1").unwrap_or(&r.url);
            let url = format!("{origin}{path}");
            let req = self
                .clients
                .tls()
                .post(url)
                .headers(headers.clone())
                .body(body.clone().unwrap_or_default())
                .timeout(wait);
            async move {
                let answer = match req.send().await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let mut body = Body::Tls(http::Response::from(resp).into_body());
                        match read_body(&mut body, 1 << 20, wait).await {
                            Ok(b) => Ok((
                                status,
                                serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null),
                            )),
                            Err(e) => Err(e.to_string()),
                        }
                    }
                    Err(e) => Err(error_chain(&e)),
                };
                Loaded {
                    replica: r.redacted.clone(),
                    endpoint: path.to_owned(),
                    answer,
                }
            }
        });
        futures_util::future::join_all(loads).await
    }

    /// Probe every replica of a pool (`GET <url>/models`) every
    /// `health_interval_ms`, for as long as the route lives; each round
    /// probes the replicas the pool has then. A pool of one is not probed
    /// (it has nowhere else to send a call), but the loop runs on, since a
    /// resume may give the route more replicas. Embedded routes, which
    /// always have one, have no loop.
    pub fn start_health(self: &Arc<Self>) {
        if self.kind == RouteKind::Embedded || self.health_interval.is_zero() {
            return;
        }
        let route = Arc::downgrade(self);
        let every = self.health_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(r) = route.upgrade() else { return };
                let set = r.pool.snapshot();
                if set.len() < 2 {
                    continue;
                }
                for replica in set.replicas() {
                    let Some(url) = replica.endpoint("/models") else {
                        continue;
                    };
                    let probe = r
                        .clients
                        .tls()
                        .get(url.clone())
                        .timeout(every.min(Duration::from_secs(2)));
                    match probe.send().await {
                        Ok(resp) if !resp.status().is_server_error() => r.pool.mark_up(replica),
                        _ => r.pool.down_for(replica, every * 2),
                    }
                }
            }
        });
    }
}

/// One replica's answer to a weight load: its status and JSON body, or
/// why none came.
#[derive(Debug)]
pub struct Loaded {
    /// The replica's base URL, redacted.
    pub replica: String,
    /// The server's endpoint that was called (`/collective_rpc`, ...).
    pub endpoint: String,
    pub answer: Result<(u16, serde_json::Value), String>,
}

impl Loaded {
    /// It answered 2xx with `success` not false.
    pub fn succeeded(&self) -> bool {
        matches!(&self.answer, Ok((s, v)) if (200..300).contains(s)
            && v.get("success").and_then(serde_json::Value::as_bool) != Some(false))
    }
}

/// An upstream's answer head, and the replica that gave it (counted in
/// flight until the call is done with it).
pub struct Sent {
    pub resp: Response,
    pub lease: Lease,
}

/// One request to one replica.
#[derive(Clone, Copy)]
struct Request<'a> {
    method: &'a Method,
    endpoint: &'a str,
    headers: &'a HeaderMap,
    body: &'a Bytes,
}

/// Why one try failed: a connection error (retried, or failed over), or
/// anything else (the call's error).
enum Failed {
    Connect(String),
    Other(UpstreamError),
}

/// An error and its sources on one line, redacted: an HTTP client's error
/// text carries the full URL, query string and userinfo included.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    crate::redact::redacted(&s)
}

/// Why a response body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// the upstream's body stalled for {0:?}
    #[error("the upstream's body stalled for {0:?}")]
    Stalled(Duration),
    /// the upstream's answer exceeds {0} bytes
    #[error("the upstream's answer exceeds {0} bytes (server.max_response_bytes)")]
    TooLarge(usize),
    /// the upstream closed the response midway: {0}
    #[error("the upstream closed the response midway: {0}")]
    Dropped(String),
}

/// Read a response body whole: at most `limit` bytes, with no silence
/// longer than `idle` between two pieces.
pub async fn read_body(body: &mut Body, limit: usize, idle: Duration) -> Result<Bytes, BodyError> {
    let mut buf = bytes::BytesMut::new();
    loop {
        match crate::http::within(idle, body.chunk()).await {
            Err(_) => return Err(BodyError::Stalled(idle)),
            Ok(Ok(Some(c))) => {
                if buf.len() + c.len() > limit {
                    return Err(BodyError::TooLarge(limit));
                }
                buf.extend_from_slice(&c);
            }
            Ok(Ok(None)) => return Ok(buf.freeze()),
            Ok(Err(e)) => return Err(BodyError::Dropped(error_chain(&*e))),
        }
    }
}

/// All routes, and the default one.
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
    default: Option<Arc<Route>>,
}

impl RouteTable {
    /// The routes `configs` name; `default` is the default route's name.
    pub fn new(configs: &[RouteConfig], default: Option<&str>) -> Result<Self, ConfigError> {
        let routes: Vec<Arc<Route>> = configs
            .iter()
            .map(|r| Route::new(r).map(Arc::new))
            .collect::<Result<_, _>>()?;
        let default = default.and_then(|d| routes.iter().find(|r| r.name == d).cloned());
        Ok(Self { routes, default })
    }

    /// The route serving `model`, else the default route.
    pub fn select(&self, model: Option<&str>) -> Option<&Arc<Route>> {
        model
            .and_then(|m| self.routes.iter().find(|r| r.serves(m)))
            .or(self.default.as_ref())
    }

    pub fn default_route(&self) -> Option<&Arc<Route>> {
        self.default.as_ref()
    }

    pub fn all(&self) -> &[Arc<Route>] {
        &self.routes
    }
}

#[cfg(test)]
mod tests;
