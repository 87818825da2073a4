//! Weight sync, behind admin keys (`server.admin_keys_env`; never a client
//! key, and refused when none is configured):
//!
//! ```text
//! POST /v1/admin/pause    {"mode": "hold" | "abort" | "keep", "route"?: NAME}
//! POST /v1/admin/resume   {"policy_version"?: N, "route"?: NAME, "urls"?: [URL, ...]}
//! POST /v1/admin/load     {"route": NAME, "model_path": PATH, "policy_version"?: N, "force"?: bool}
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
//! `keep` (vLLM routes only; any other route is a 400 naming it) closes the
//! gate and then asks every replica to freeze its requests in place
//! (`upstream::engine`); the resume opens the gate and then lets the
//! replicas go on. A replica that refuses either is a 502 with every
//! replica's answer (`upstream`); a refused pause opens the gate again.
//!
//! `load` puts new weights on one route's replicas without restarting
//! anything, with the servers' own reload (`upstream::engine`: vLLM's
//! `reload_weights`, SGLang's and the embedded model's
//! `/update_weights_from_disk`, where `force` accepts a tokenizer change);
//! a route of another kind is a 400. `model_path` is a Hugging Face
//! checkpoint directory (or a GGUF file for the embedded model). On an
//! open gate the load pauses the route first (`keep` where the route can,
//! so that streams freeze rather than run on during the reload; else
//! `hold`), and resumes it when every replica has answered: with
//! `policy_version` when all succeeded, on the version it had when one
//! failed. Held calls thus run on the new weights, and the rows say so. On
//! a gate already paused (the trainer's own pause, load, resume) the load
//! leaves it paused, and `policy_version` belongs to the resume. The
//! answer adds `loaded`: each replica's answer. A failed load is a 502.
//!
//! Every answer is the status of the routes it names: per route `paused`,
//! `policy_version`, `held_calls` and `replicas` (the base URLs now,
//! redacted).

use super::layer::client_key::client_key;
use super::pause::{Gate, Mode};
use super::State;
use crate::http::{json_response, ProxyBody};
use crate::upstream::engine::{Refused, Reload};
use crate::upstream::{Loaded, Route};
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Load {
    route: String,
    model_path: String,
    policy_version: Option<i64>,
    #[serde(default)]
    force: bool,
}

/// The longest a replica may take to load new weights.
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

fn error(status: u16, code: &str, message: String) -> Response<ProxyBody> {
    json_response(
        status,
        &json!({"error": {"type": "invalid_request_error", "code": code, "message": message}}),
    )
}

/// How long a replica may take to pause or resume in place.
const PAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Every replica's answer, as the admin answers show them.
fn answers(loaded: &[Loaded]) -> serde_json::Value {
    loaded
        .iter()
        .map(|x| match &x.answer {
            Ok((s, body)) => {
                json!({"replica": x.replica, "status": s, "success": x.succeeded(), "answer": body})
            }
            Err(e) => json!({"replica": x.replica, "status": null, "success": false, "error": e}),
        })
        .collect()
}

/// The routes a request names, with their gates.
fn routes_of<'a>(state: &'a State, g: &[(&String, &Arc<Gate>)]) -> Vec<&'a Arc<Route>> {
    g.iter()
        .filter_map(|(n, _)| state.routes.all().iter().find(|r| &r.name == *n))
        .collect()
}

/// Freeze `routes`' servers in place (`keep`); on the first refusal, the
/// servers already frozen go on again. Every replica's answer, and whether
/// all paused.
async fn freeze(routes: &[&Arc<Route>]) -> (Vec<Loaded>, bool) {
    let mut all = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let loaded = r.pause_in_place(PAUSE_WAIT).await.unwrap_or_default();
        let ok = loaded.iter().all(Loaded::succeeded);
        all.extend(loaded);
        if !ok {
            for r in &routes[..=i] {
                let _ = r.resume_in_place(PAUSE_WAIT).await;
            }
            return (all, false);
        }
    }
    (all, true)
}

/// Let `routes`' servers generate again after a `keep` pause.
async fn thaw(routes: &[&Arc<Route>]) -> (Vec<Loaded>, bool) {
    let mut all = Vec::new();
    for r in routes {
        all.extend(r.resume_in_place(PAUSE_WAIT).await.unwrap_or_default());
    }
    let ok = all.iter().all(Loaded::succeeded);
    (all, ok)
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
            let g = match gates(&state, p.route.as_deref()) {
                Ok(g) => g,
                Err(r) => return r.answer(),
            };
            let routes = routes_of(&state, &g);
            if p.mode == Mode::Keep {
                if let Some(r) = routes.iter().find(|r| !r.pauses_in_place()) {
                    let e = crate::upstream::engine::Refused::NoKeep(r.kind);
                    return error(400, "keep_unsupported", format!("route {:?}: {e}", r.name));
                }
            }
            for (name, gate) in &g {
                gate.pause(p.mode);
                tracing::info!(route = %name, mode = ?p.mode, "route paused");
            }
            if p.mode != Mode::Keep {
                return json_response(200, &status(&state, &g));
            }
            let (loaded, ok) = freeze(&routes).await;
            if !ok {
                for (_, gate) in &g {
                    gate.resume(None);
                }
                let answers = crate::redact::redacted(&format!("{loaded:?}"));
                tracing::warn!(%answers, "a keep pause was refused upstream; the routes are open again");
            }
            let mut v = status(&state, &g);
            v["upstream"] = answers(&loaded);
            json_response(if ok { 200 } else { 502 }, &v)
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
            // Routes frozen in place go on once their gate is open, so that
            // their streams see the new version before its first token.
            let kept: Vec<(&String, &Arc<Gate>)> = g
                .iter()
                .filter(|(_, gate)| gate.paused() == Some(Mode::Keep))
                .copied()
                .collect();
            for (name, gate) in &g {
                gate.resume(r.policy_version);
                tracing::info!(route = %name, policy_version = gate.version(), "route resumed");
            }
            if kept.is_empty() {
                return json_response(200, &status(&state, &g));
            }
            let (loaded, ok) = thaw(&routes_of(&state, &kept)).await;
            if !ok {
                let answers = crate::redact::redacted(&format!("{loaded:?}"));
                tracing::warn!(%answers, "a replica did not resume after a keep pause");
            }
            let mut v = status(&state, &g);
            v["upstream"] = answers(&loaded);
            json_response(if ok { 200 } else { 502 }, &v)
        }
        (Method::POST, "/v1/admin/load") => match serde_json::from_slice(&body) {
            Ok(l) => load(&state, l).await,
            Err(e) => parse_err(e),
        },
        (_, p) => error(
            404,
            "unknown_url",
            format!("{p}: the admin endpoints are POST /v1/admin/pause, POST /v1/admin/resume, POST /v1/admin/load, GET /v1/admin/status"),
        ),
    }
}

/// `POST /v1/admin/load`: see the module's doc.
async fn load(state: &State, l: Load) -> Response<ProxyBody> {
    let (Some(route), Ok(g)) = (
        state.routes.all().iter().find(|r| r.name == l.route),
        gates(state, Some(&l.route)),
    ) else {
        return UnknownRoute(l.route).answer();
    };
    let Some(&(name, gate)) = g.first() else {
        return UnknownRoute(l.route).answer();
    };
    let opens = gate.paused().is_none();
    if !opens && l.policy_version.is_some() {
        return error(
            400,
            "invalid_body",
            format!("route {name:?} is paused: its resume gives the policy version, not the load"),
        );
    }
    let reload = Reload {
        model_path: &l.model_path,
        policy_version: l.policy_version,
        force: l.force,
    };
    if let Err(e) = route.can_reload(&reload) {
        let code = match e {
            Refused::MissingPath(_) => "model_path_missing",
            _ => "reload_unsupported",
        };
        return error(400, code, format!("route {name:?}: {e}"));
    }
    let keep = opens && route.pauses_in_place();
    if opens {
        gate.pause(if keep { Mode::Keep } else { Mode::Hold });
    }
    let started = std::time::Instant::now();
    let mut upstream = Vec::new();
    let frozen = !keep || {
        let (answers, ok) = freeze(&[route]).await;
        upstream = answers;
        ok
    };
    let loaded = match frozen {
        true => route.load_weights(&reload, LOAD_WAIT).await,
        false => Ok(Vec::new()),
    };
    // (checked above: a refusal here is a failed load like any other)
    let loaded = loaded.unwrap_or_default();
    let ok = frozen && !loaded.is_empty() && loaded.iter().all(Loaded::succeeded);
    if opens {
        gate.resume(if ok { l.policy_version } else { None });
    }
    if keep && frozen {
        let (answers, _) = thaw(&[route]).await;
        upstream.extend(answers);
    }
    let ms = started.elapsed().as_millis() as u64;
    if ok {
        tracing::info!(route = %name, load_ms = ms, policy_version = gate.version(), "route weights loaded");
    } else {
        let answers = crate::redact::redacted(&format!("{loaded:?} {upstream:?}"));
        tracing::warn!(route = %name, %answers, "route weights not loaded");
    }
    let mut v = status(state, &g);
    v["load_ms"] = json!(ms);
    v["loaded"] = answers(&loaded);
    if !upstream.is_empty() {
        v["upstream"] = answers(&upstream);
    }
    json_response(if ok { 200 } else { 502 }, &v)
}
