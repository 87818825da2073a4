//! Weight sync, behind admin keys (`server.admin_keys_env`; never a client
//! key, and refused when none is configured):
//!
//! ```text
//! POST /v1/admin/pause    {"mode": "hold" | "abort", "route"?: NAME}
//! POST /v1/admin/resume   {"policy_version"?: N, "route"?: NAME, "urls"?: [URL, ...]}
//! GET  /v1/admin/status   [?route=NAME]
//! ```
//!
//! Without `route`, every route. See [`super::pause`] for what the modes do.
//!
//! `urls` on a resume replaces one route's replicas (so it needs `route`),
//! checked as the config checks a route's `urls` (at least one, `http://`
//! or `https://`, none twice); a bad list is a 400 and changes nothing, the
//! gate included. The new set takes effect before the gate opens, so held
//! and cut calls go to it; calls already sent finish where they are
//! (`upstream::pool` says what joins and leaves keep). A route that is not
//! paused takes `urls` too: the resume then just swaps its replicas.
//!
//! Every answer is the status of the routes it names: per route `paused`,
//! `policy_version`, `held_calls` and `replicas` (the base URLs now,
//! redacted).

use super::layer::client_key::client_key;
use super::pause::{Gate, Mode};
use super::State;
use crate::http::{json_response, ProxyBody};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pause {
    mode: Mode,
    route: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resume {
    policy_version: Option<i64>,
    route: Option<String>,
    /// The route's new replica set.
    urls: Option<Vec<String>>,
}

fn error(status: u16, code: &str, message: String) -> Response<ProxyBody> {
    json_response(
        status,
        &json!({"error": {"type": "invalid_request_error", "code": code, "message": message}}),
    )
}

/// No route is called this.
struct UnknownRoute(String);

impl UnknownRoute {
    fn answer(self) -> Response<ProxyBody> {
        error(
            404,
            "unknown_route",
            format!("no route is called {:?}", self.0),
        )
    }
}

/// The gates a request names: one route's, or all.
fn gates<'a>(
    state: &'a State,
    route: Option<&str>,
) -> Result<Vec<(&'a String, &'a Arc<Gate>)>, UnknownRoute> {
    match route {
        None => Ok(state.gates.all().collect()),
        Some(r) => match state.gates.all().find(|(n, _)| n.as_str() == r) {
            Some(g) => Ok(vec![g]),
            None => Err(UnknownRoute(r.to_owned())),
        },
    }
}

fn status(state: &State, gates: &[(&String, &Arc<Gate>)]) -> serde_json::Value {
    let routes: serde_json::Map<String, serde_json::Value> = gates
        .iter()
        .map(|(n, g)| {
            let replicas: Vec<String> = state
                .routes
                .all()
                .iter()
                .find(|r| &r.name == *n)
                .map(|r| {
                    r.pool
                        .snapshot()
                        .replicas()
                        .iter()
                        .map(|x| crate::redact::redacted(&x.url))
                        .collect()
                })
                .unwrap_or_default();
            (
                (*n).clone(),
                json!({"paused": g.paused(), "policy_version": g.version(), "held_calls": g.waiting(), "replicas": replicas}),
            )
        })
        .collect();
    json!({ "routes": routes })
}

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<ProxyBody> {
    let Some(keys) = &state.admin_keys else {
        return error(
            403,
            "admin_disabled",
            "the admin endpoints are off: set server.admin_keys_env to a variable holding admin keys".into(),
        );
    };
    if !client_key(req.headers()).is_some_and(|k| keys.contains(k)) {
        return error(
            401,
            "invalid_admin_key",
            "an admin key is required (Authorization: Bearer, or x-api-key)".into(),
        );
    }
    let path = req.uri().path().to_owned();
    let query_route = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("route=")))
        .map(str::to_owned);
    let method = req.method().clone();
    let body = match Limited::new(req.into_body(), 64 << 10).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(400, "bad_body", format!("could not read the body: {e}")),
    };
    let parse_err = |e: serde_json::Error| error(400, "invalid_body", e.to_string());
    match (method, path.as_str()) {
        (Method::GET, "/v1/admin/status") => match gates(&state, query_route.as_deref()) {
            Ok(g) => json_response(200, &status(&state, &g)),
            Err(r) => r.answer(),
        },
        (Method::POST, "/v1/admin/pause") => {
            let p: Pause = match serde_json::from_slice(&body) {
                Ok(p) => p,
                Err(e) => return parse_err(e),
            };
            match gates(&state, p.route.as_deref()) {
                Ok(g) => {
                    for (name, gate) in &g {
                        gate.pause(p.mode);
                        tracing::info!(route = %name, mode = ?p.mode, "route paused");
                    }
                    json_response(200, &status(&state, &g))
                }
                Err(r) => r.answer(),
            }
        }
        (Method::POST, "/v1/admin/resume") => {
            let r: Resume = match serde_json::from_slice(if body.is_empty() { b"{}" } else { &body }) {
                Ok(r) => r,
                Err(e) => return parse_err(e),
            };
            let g = match gates(&state, r.route.as_deref()) {
                Ok(g) => g,
                Err(r) => return r.answer(),
            };
            if let Some(urls) = &r.urls {
                let Some(name) = &r.route else {
                    return error(
                        400,
                        "invalid_body",
                        "`urls` replaces one route's replicas: name it with `route`".into(),
                    );
                };
                let Some(route) = state.routes.all().iter().find(|x| &x.name == name) else {
                    return UnknownRoute(name.clone()).answer();
                };
                match route.replace_urls(urls) {
                    Ok(change) => tracing::info!(
                        route = %name,
                        joined = ?change.joined.iter().map(|u| crate::redact::redacted(u)).collect::<Vec<_>>(),
                        left = ?change.left.iter().map(|u| crate::redact::redacted(u)).collect::<Vec<_>>(),
                        "route replicas replaced"
                    ),
                    Err(e) => {
                        return error(
                            400,
                            "invalid_urls",
                            crate::redact::redacted(&format!("route {name:?}: {e}")),
                        )
                    }
                }
            }
            for (name, gate) in &g {
                gate.resume(r.policy_version);
                tracing::info!(route = %name, policy_version = gate.version(), "route resumed");
            }
            json_response(200, &status(&state, &g))
        }
        (_, p) => error(
            404,
            "unknown_url",
            format!("{p}: the admin endpoints are POST /v1/admin/pause, POST /v1/admin/resume, GET /v1/admin/status"),
        ),
    }
}
