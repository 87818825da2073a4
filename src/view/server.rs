//! The viewer's HTTP server: server-rendered pages (minijinja, escaped as
//! HTML), every asset in the binary, and the same data as JSON.
//!
//! | path | what |
//! |---|---|
//! | `GET /` | the rollouts list: `status`, `min_reward`, `max_reward`, `q` (text), `sort`, `desc`, `page` |
//! | `GET /api/rollouts` | the same page as JSON |

use super::index::{Column, Index, Query, Summary};
use crate::http::{bytes_response, json_response, ProxyBody};
use http::{Method, Request, Response};
use minijinja::{context, Environment};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

/// Rollouts per page.
pub const PAGE: usize = 50;

/// The list's columns: query key and heading.
const COLUMNS: &[(&str, &str)] = &[
    ("rollout_id", "rollout"),
    ("harness", "harness"),
    ("model", "model"),
    ("route", "route"),
    ("status", "status"),
    ("reward", "reward"),
    ("calls", "calls"),
    ("tokens", "tokens"),
    ("duration", "seconds"),
    ("group", "group"),
    ("policy_version", "policy"),
];

/// What the server holds: the index and its templates.
pub struct Viewer {
    index: Index,
    shards: String,
    env: Environment<'static>,
    statuses: Vec<String>,
}

impl Viewer {
    pub fn new(index: Index, shards: String) -> Viewer {
        let mut env = Environment::new();
        env.add_template("rollouts.html", include_str!("pages/rollouts.html"))
            .expect("the rollouts page parses");
        let mut statuses: BTreeSet<String> = index
            .rollouts
            .iter()
            .filter_map(|s| s.status.clone())
            .collect();
        statuses.insert("unfinished".into());
        Viewer {
            index,
            shards,
            env,
            statuses: statuses.into_iter().collect(),
        }
    }
}

/// A list request's parameters, as given (to write the links back).
#[derive(Debug, Default, Clone)]
struct Params {
    status: String,
    min_reward: String,
    max_reward: String,
    text: String,
    sort: String,
    desc: bool,
    page: usize,
}

impl Params {
    fn parse(query: Option<&str>) -> Result<(Params, Query), String> {
        let mut p = Params::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match k.as_ref() {
                "status" => p.status = v.into_owned(),
                "min_reward" => p.min_reward = v.trim().to_owned(),
                "max_reward" => p.max_reward = v.trim().to_owned(),
                "q" => p.text = v.into_owned(),
                "sort" => p.sort = v.into_owned(),
                "desc" => p.desc = matches!(v.as_ref(), "1" | "true"),
                "page" => {
                    p.page = v
                        .parse()
                        .map_err(|_| format!("page {v:?} is not a number"))?
                }
                _ => {}
            }
        }
        let num = |what: &str, s: &str| -> Result<Option<f64>, String> {
            if s.is_empty() {
                return Ok(None);
            }
            s.parse()
                .map(Some)
                .map_err(|_| format!("{what} {s:?} is not a number"))
        };
        let q = Query {
            status: Some(p.status.clone()).filter(|s| !s.is_empty()),
            min_reward: num("min_reward", &p.min_reward)?,
            max_reward: num("max_reward", &p.max_reward)?,
            text: Some(p.text.clone()).filter(|s| !s.is_empty()),
            sort: if p.sort.is_empty() {
                Column::default()
            } else {
                p.sort.parse()?
            },
            descending: p.desc,
            offset: p.page.saturating_mul(PAGE),
            limit: PAGE,
        };
        Ok((p, q))
    }

    /// The list's URL with these parameters, changed by `f`.
    fn href(&self, f: impl FnOnce(&mut Params)) -> String {
        let mut p = self.clone();
        f(&mut p);
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("status", p.status.as_str()),
            ("min_reward", &p.min_reward),
            ("max_reward", &p.max_reward),
            ("q", &p.text),
            ("sort", &p.sort),
        ] {
            if !v.is_empty() {
                s.append_pair(k, v);
            }
        }
        if p.desc {
            s.append_pair("desc", "1");
        }
        if p.page > 0 {
            s.append_pair("page", &p.page.to_string());
        }
        format!("/?{}", s.finish())
    }
}

fn row(s: &Summary) -> Value {
    json!({"rollout_id": s.rollout_id, "harness": s.harness, "model": s.model, "route": s.route,
        "status": s.status, "reward": s.reward, "revision": s.revision, "calls": s.calls,
        "failed_calls": s.failed_calls, "tokens": s.tokens,
        "seconds": s.seconds().map(|x| format!("{x:.1}")), "group": s.group,
        "policy": s.policy_versions.map(|(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}–{hi}") })})
}

fn page(v: &Viewer, req: &Request<hyper::body::Incoming>, as_json: bool) -> Response<ProxyBody> {
    let (p, q) = match Params::parse(req.uri().query()) {
        Ok(x) => x,
        Err(why) => return json_response(400, &json!({"error": {"message": why}})),
    };
    let found = v.index.query(&q);
    let rows: Vec<Value> = found.rows.iter().map(|s| row(s)).collect();
    if as_json {
        return json_response(
            200,
            &json!({"total": found.total, "offset": q.offset, "rows": rows}),
        );
    }
    let columns: Vec<Value> = COLUMNS
        .iter()
        .map(|(key, label)| {
            let href = p.href(|p| {
                p.desc = p.sort == *key && !p.desc;
                p.sort = (*key).to_owned();
                p.page = 0;
            });
            json!({"key": key, "label": label, "href": href})
        })
        .collect();
    let prev = (p.page > 0).then(|| p.href(|p| p.page -= 1));
    let next = (q.offset + PAGE < found.total).then(|| p.href(|p| p.page += 1));
    let shown_sort = if p.sort.is_empty() {
        "rollout_id"
    } else {
        p.sort.as_str()
    };
    let html = v.env.get_template("rollouts.html").and_then(|t| {
        t.render(context! {
            shards => v.shards.as_str(), statuses => minijinja::value::Serde(&v.statuses),
            columns => minijinja::value::Serde(&columns),
            rows => minijinja::value::Serde(&rows),
            total => found.total, all => v.index.rollouts.len(), prev => prev, next => next,
            q => context! { status => p.status, min_reward => p.min_reward, max_reward => p.max_reward,
                text => p.text, sort => shown_sort, desc => p.desc },
        })
    });
    match html {
        Ok(h) => bytes_response(200, "text/html; charset=utf-8", h),
        Err(e) => json_response(
            500,
            &json!({"error": {"message": format!("the page could not be rendered: {e}")}}),
        ),
    }
}

async fn handle(req: Request<hyper::body::Incoming>, v: Arc<Viewer>) -> Response<ProxyBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/") => page(&v, &req, false),
        (&Method::GET, "/api/rollouts") => page(&v, &req, true),
        _ => json_response(404, &json!({"error": {"message": "no such page"}})),
    }
}

/// Bind `addr` and serve the viewer until the process ends.
pub async fn bind(
    viewer: Viewer,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let v = Arc::new(viewer);
    crate::http::serve_plain(addr, move |req| handle(req, v.clone())).await
}
