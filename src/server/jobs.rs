//! `/v1/jobs[/...]`: the job API that `app` mounts ([`State::jobs`]). The
//! server checks the key (an admin key where `server.admin_keys_env` names
//! some, else a client key where those are configured), reads the body
//! (at most `server.max_body_bytes`) and hands the request on.

use super::layer::client_key::client_key;
use super::State;
use crate::http::{json_response, ProxyBody};
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::json;
use std::sync::Arc;

fn error(status: u16, code: &str, message: &str) -> Response<ProxyBody> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error", "code": code}}),
    )
}

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<ProxyBody> {
    let Some(handler) = state.jobs.get().cloned() else {
        return error(
            404,
            "jobs_disabled",
            "this server runs no job API (it is part of `rollcall serve`; jobs.enabled = false turns it off)",
        );
    };
    let keys = state.admin_keys.as_ref().or(state.client_keys.as_ref());
    if let Some(keys) = keys {
        if !client_key(req.headers()).is_some_and(|k| keys.contains(k)) {
            let which = if state.admin_keys.is_some() {
                "an admin key"
            } else {
                "a client key"
            };
            return error(
                401,
                "invalid_key",
                &format!("the job API needs {which} (Authorization: Bearer, or x-api-key)"),
            );
        }
    }
    let (head, body) = req.into_parts();
    let body = match Limited::new(body, state.server.max_body_bytes)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(
                413,
                "bad_body",
                &format!(
                    "could not read the body (at most server.max_body_bytes = {}): {e}",
                    state.server.max_body_bytes
                ),
            )
        }
    };
    handler(Request::from_parts(head, body)).await
}
