//! The job API's endpoints, mounted by `app` under `/v1/jobs` on the
//! proxy's own port (behind admin keys where keys are configured):
//!
//! ```text
//! POST   /v1/jobs                      a job (spec::JobSpec) ─▶ 201 {"id", "state", ...}
//! GET    /v1/jobs                      {"jobs": [...]}
//! GET    /v1/jobs/{id}                 {"id", "state", "counts", ...}
//! DELETE /v1/jobs/{id}                 cancel; answers once the job has stopped (≤ 120 s)
//! GET    /v1/jobs/{id}/groups          ?after=CURSOR&limit=N&max_staleness=N&wait=SECS
//! POST   /v1/jobs/{id}/claim           {"task", "wait"?} ─▶ the next sample of the task's group no one took
//! ```
//!
//! A POST with the `key` of an existing job answers 200 with that job.
//!
//! Every error is `{"error": {"message", "type", "code"}}` with the status
//! [`JobError::status`] names.

use super::{JobError, Jobs};
use crate::http::{json_response, ProxyBody};
use ::http::{Method, Request, Response};
use bytes::Bytes;
use serde_json::json;
use std::time::Duration;

/// Groups per answer by default, and at most.
const DEFAULT_LIMIT: usize = 64;
const MAX_LIMIT: usize = 1024;
/// The longest `wait` a groups request may ask for.
const MAX_WAIT_SECS: f64 = 60.0;
/// How long a cancel waits for the job to stop before it answers.
const CANCEL_WAIT: Duration = Duration::from_secs(120);

fn error(e: &JobError) -> Response<ProxyBody> {
    let (status, code) = e.status();
    let kind = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    json_response(
        status,
        &json!({"error": {"message": crate::redact::redact(&e.to_string()), "type": kind, "code": code}}),
    )
}

fn bad(message: String) -> Response<ProxyBody> {
    error(&JobError::Spec(message))
}

fn method_not_allowed(allowed: &str) -> Response<ProxyBody> {
    json_response(
        405,
        &json!({"error": {"message": format!("use {allowed}"), "type": "invalid_request_error", "code": "method_not_allowed"}}),
    )
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Claim {
    task: String,
    #[serde(default)]
    wait: f64,
}

struct GroupsQuery {
    after: u64,
    limit: usize,
    max_staleness: Option<i64>,
    wait: Duration,
}

fn groups_query(q: Option<&str>) -> Result<GroupsQuery, String> {
    let mut out = GroupsQuery {
        after: 0,
        limit: DEFAULT_LIMIT,
        max_staleness: None,
        wait: Duration::ZERO,
    };
    for kv in q.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let whole = || {
            v.parse::<u64>()
                .map_err(|_| format!("{k} must be a whole number, got {v:?}"))
        };
        match k {
            "after" => out.after = whole()?,
            "limit" => out.limit = (whole()? as usize).clamp(1, MAX_LIMIT),
            "max_staleness" => out.max_staleness = Some(whole()?.min(i64::MAX as u64) as i64),
            "wait" => {
                let s: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| format!("wait must be seconds, got {v:?}"))?;
                out.wait = Duration::from_secs_f64(s.min(MAX_WAIT_SECS));
            }
            _ => {
                return Err(format!(
                    "unknown parameter {k:?} (after, limit, max_staleness, wait)"
                ))
            }
        }
    }
    Ok(out)
}

/// Answer one request under `/v1/jobs`.
pub async fn handle(jobs: Jobs, req: Request<Bytes>) -> Response<ProxyBody> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let rest = path.strip_prefix("/v1/jobs").unwrap_or("");
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method().clone();
    match parts.as_slice() {
        [] => match method {
            Method::POST => match jobs.submit(req.body()) {
                Ok((created, status)) => json_response(if created { 201 } else { 200 }, &status),
                Err(e) => error(&e),
            },
            Method::GET => match jobs.list() {
                Ok(list) => json_response(200, &json!({"jobs": list})),
                Err(e) => error(&e),
            },
            _ => method_not_allowed("POST or GET"),
        },
        [id] => match method {
            Method::GET => match jobs.get(id) {
                Ok(job) => json_response(200, &job.status()),
                Err(e) => error(&e),
            },
            Method::DELETE => match jobs.cancel(id, CANCEL_WAIT).await {
                Ok(status) => json_response(200, &status),
                Err(e) => error(&e),
            },
            _ => method_not_allowed("GET or DELETE"),
        },
        [id, "groups"] => {
            if method != Method::GET {
                return method_not_allowed("GET");
            }
            let q = match groups_query(req.uri().query()) {
                Ok(q) => q,
                Err(m) => return bad(m),
            };
            let job = match jobs.get(id) {
                Ok(j) => j,
                Err(e) => return error(&e),
            };
            if !q.wait.is_zero() {
                jobs.wait_for_groups(&job, q.after, q.wait).await;
            }
            match jobs.groups(&job, q.after, q.limit, q.max_staleness) {
                Ok(v) => json_response(200, &v),
                Err(e) => error(&e),
            }
        }
        [id, "claim"] => {
            if method != Method::POST {
                return method_not_allowed("POST");
            }
            let ask: Claim = match serde_json::from_slice(req.body()) {
                Ok(c) => c,
                Err(e) => return bad(format!("a claim is {{\"task\": ID, \"wait\"?: SECS}}: {e}")),
            };
            let job = match jobs.get(id) {
                Ok(j) => j,
                Err(e) => return error(&e),
            };
            let wait = Duration::from_secs_f64(ask.wait.clamp(0.0, MAX_WAIT_SECS));
            match jobs.claim(&job, &ask.task, wait).await {
                Ok(Some(v)) => json_response(200, &v),
                Ok(None) => json_response(
                    202,
                    &json!({"group": null, "state": job.status()["state"], "retry": true}),
                ),
                Err(e) => error(&e),
            }
        }
        _ => error(&JobError::NotFound(rest.trim_start_matches('/').to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_query_is_checked() {
        let q = groups_query(Some("after=3&limit=5000&max_staleness=1&wait=2.5")).unwrap();
        assert_eq!((q.after, q.limit, q.max_staleness), (3, MAX_LIMIT, Some(1)));
        assert_eq!(q.wait, Duration::from_millis(2500));
        assert_eq!(
            groups_query(Some("wait=999")).unwrap().wait,
            Duration::from_secs(60)
        );
        for bad in ["after=-1", "limit=x", "wait=nan", "cursor=2"] {
            assert!(groups_query(Some(bad)).is_err(), "{bad}");
        }
    }
}
