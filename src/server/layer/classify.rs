//! What a request is, decided from its head alone, once, for every layer
//! after it: health and metrics, an admin endpoint, a call to proxy (with
//! the rollout its path names), or a request refused for its path.

use super::ready;
use crate::dialect::{ApiError, WireApi};
use crate::record::check_rollout_id;
use http::{Method, Request};
use std::convert::Infallible;
use std::task::{Context, Poll};

/// What kind of request it is.
#[derive(Debug, Clone)]
pub enum Kind {
    /// `GET /healthz`, `GET /metrics`: open, never counted as a call.
    Health,
    /// A path rollcall cannot even split: refused before any key check.
    Malformed(ApiError),
    /// A rollout's finish, `/v1/models`.
    Admin,
    /// `/v1/admin/*`: weight sync (pause, resume, status), behind admin keys.
    Control,
    /// `/v1/jobs[/...]`: the job API, mounted by `app`; behind admin keys
    /// where they are configured, else client keys.
    Jobs,
    /// A call to proxy.
    Call,
    /// Refused for its path or method (after the key check), answered in
    /// this API's format.
    Refused(WireApi, ApiError),
}

/// A request's [`Kind`], the wire API its path names (Chat Completions when
/// none: the format of a refusal for its key), and the rollout its path
/// names when that is a valid id and the path is a wire API's (under which
/// a call refused for its key or for want of a slot is recorded).
#[derive(Debug, Clone)]
pub struct Dispatch {
    pub kind: Kind,
    pub api: WireApi,
    pub rollout: Option<String>,
}

fn not_found(path: &str) -> ApiError {
    ApiError::new(
        404,
        "invalid_request_error",
        "unknown_url",
        format!("rollcall does not serve {path}; endpoints are /v1/chat/completions, /v1/responses, /v1/completions, /v1/messages and /v1/models, optionally under /rollouts/<id>"),
    )
}

/// Classify a request by its method and path.
pub fn classify(method: &Method, path: &str) -> Dispatch {
    let chat = WireApi::ChatCompletions;
    let of = |kind, api, rollout| Dispatch { kind, api, rollout };
    if matches!(path, "/healthz" | "/metrics") && method == Method::GET {
        return of(Kind::Health, chat, None);
    }
    if path.starts_with("/v1/admin/") {
        return of(Kind::Control, chat, None);
    }
    if path == "/v1/jobs" || path.starts_with("/v1/jobs/") {
        return of(Kind::Jobs, chat, None);
    }
    let (rollout, rest) = match path.strip_prefix("/rollouts/") {
        Some(r) => match r.split_once('/') {
            Some((id, rest)) => (Some(id), rest),
            None => return of(Kind::Malformed(not_found(path)), chat, None),
        },
        None => (None, path.strip_prefix('/').unwrap_or(path)),
    };
    let endpoint = rest.strip_prefix("v1").unwrap_or(rest);
    let wire = WireApi::from_endpoint(endpoint);
    let api = wire.unwrap_or(chat);
    let known = rollout
        .filter(|id| check_rollout_id(id).is_ok())
        .filter(|_| wire.is_some())
        .map(str::to_owned);
    if path == "/v1/rollouts/feed"
        || (path.starts_with("/v1/rollouts/")
            && (path.ends_with("/finish") || path.ends_with("/budget")))
    {
        return of(Kind::Admin, api, known);
    }
    if let Some(Err(e)) = rollout.map(check_rollout_id) {
        return of(Kind::Refused(chat, e.into()), api, None);
    }
    if rest == "v1/models" {
        return of(Kind::Admin, api, known);
    }
    match wire {
        Some(_) if method == Method::POST => of(Kind::Call, api, known),
        Some(_) => {
            let err = ApiError::new(
                405,
                "invalid_request_error",
                "method_not_allowed",
                format!("{endpoint} takes POST"),
            );
            of(Kind::Refused(api, err), api, known)
        }
        None => of(Kind::Refused(chat, not_found(path)), chat, None),
    }
}

/// The layer that classifies every request.
#[derive(Clone, Default)]
pub struct ClassifyLayer;

impl<S> tower::Layer<S> for ClassifyLayer {
    type Service = Classify<S>;
    fn layer(&self, inner: S) -> Classify<S> {
        Classify { inner }
    }
}

#[derive(Clone)]
pub struct Classify<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for Classify<S>
where
    S: tower::Service<Request<B>, Error = Infallible> + Clone,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        let d = classify(req.method(), req.uri().path());
        req.extensions_mut().insert(d);
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(method: Method, path: &str) -> (String, Option<String>) {
        let d = classify(&method, path);
        let k = match d.kind {
            Kind::Health => "health".to_owned(),
            Kind::Malformed(e) => format!("malformed {}", e.code),
            Kind::Admin => "admin".to_owned(),
            Kind::Control => "control".to_owned(),
            Kind::Jobs => "jobs".to_owned(),
            Kind::Call => format!("call {}", d.api.as_str()),
            Kind::Refused(api, e) => format!("refused {} {}", e.code, api.as_str()),
        };
        (k, d.rollout)
    }

    #[test]
    fn paths_are_classified_once() {
        let r = |s: &str| Some(s.to_owned());
        assert_eq!(kind(Method::GET, "/healthz"), ("health".into(), None));
        assert_eq!(
            kind(Method::POST, "/healthz").0,
            "refused unknown_url chat_completions"
        );
        assert_eq!(
            kind(Method::POST, "/rollouts/r1/v1/messages"),
            ("call messages".into(), r("r1"))
        );
        assert_eq!(
            kind(Method::POST, "/v1/responses"),
            ("call responses".into(), None)
        );
        assert_eq!(
            kind(Method::GET, "/rollouts/r1/v1/chat/completions"),
            (
                "refused method_not_allowed chat_completions".into(),
                r("r1")
            )
        );
        assert_eq!(
            kind(Method::POST, "/rollouts/r1").0,
            "malformed unknown_url"
        );
        assert_eq!(
            kind(Method::POST, "/rollouts/bad id/v1/messages"),
            ("refused invalid_rollout_id chat_completions".into(), None)
        );
        assert_eq!(kind(Method::POST, "/v1/rollouts/r1/finish").0, "admin");
        assert_eq!(kind(Method::PUT, "/v1/rollouts/r1/budget").0, "admin");
        assert_eq!(kind(Method::GET, "/v1/rollouts/feed").0, "admin");
        assert_eq!(kind(Method::POST, "/v1/jobs").0, "jobs");
        assert_eq!(kind(Method::GET, "/v1/jobs/job-1/groups").0, "jobs");
        assert_ne!(kind(Method::GET, "/v1/jobsx").0, "jobs");
        assert_eq!(
            kind(Method::GET, "/rollouts/r1/v1/models"),
            ("admin".into(), None)
        );
    }
}
