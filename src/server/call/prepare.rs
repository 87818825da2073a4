//! A call before it is sent: its body read, its head (`model`, `stream`)
//! read, its route chosen, the API to speak upstream planned, the request
//! translated and asked for token capture where the route needs it.

use super::error::ProxyError;
use super::State;
use crate::dialect::capture::{self, Asked, CaptureKind};
use crate::dialect::head::Head;
use crate::dialect::WireApi;
use crate::dialect::{side_call, translate};
use crate::record::{CallBegin, CallMeta, RequestSpans};
use crate::upstream::Route;
use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::time::Duration;

/// Hop-by-hop headers, and those the proxy sets itself.
const DROP_REQUEST: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
    "x-rollout-id",
    "x-rollcall-budget",
];

/// Headers to send upstream: the client's, less hop-by-hop ones; the client's
/// credentials only when they are not rollcall's own client keys.
pub fn upstream_headers(client: &HeaderMap, keys_are_ours: bool) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(client.len());
    for (k, v) in client {
        let name = k.as_str();
        if DROP_REQUEST.contains(&name)
            || (keys_are_ours && (k == header::AUTHORIZATION || name == "x-api-key"))
        {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    h
}

/// Token capture on the upstream's answer: what to take out again before
/// the harness sees it.
pub struct Strip {
    pub kind: CaptureKind,
    pub api: WireApi,
    pub asked: Asked,
}

/// A call ready to send.
pub struct Prepared {
    pub begin: CallBegin,
    pub route: Arc<Route>,
    /// The harness's API.
    pub api: WireApi,
    /// The API spoken upstream.
    pub target: WireApi,
    /// The path under the route's base URL, with the harness's query.
    pub endpoint: String,
    pub strip: Option<Strip>,
}

impl Prepared {
    /// The call was translated to another API on its way upstream.
    pub fn translated(&self) -> bool {
        self.target != self.api
    }

    /// The body to send upstream.
    pub fn body(&self) -> Bytes {
        self.begin
            .upstream_request
            .clone()
            .unwrap_or_else(|| self.begin.request.clone())
    }
}

/// Prepare a call whose metadata `meta` holds; on failure, the call's begin
/// (with what was read of it) comes back with the error, to be recorded.
pub async fn prepare(
    state: &State,
    api: WireApi,
    mut meta: CallMeta,
    query: Option<&str>,
    body: hyper::body::Incoming,
) -> Result<Prepared, (CallBegin, ProxyError)> {
    let server = &state.server;
    let idle = Duration::from_secs_f64(server.client_idle_timeout_secs);
    let request = match read_request(body, server.max_body_bytes, idle).await {
        Ok(b) => b,
        Err(e) => return Err((begin(meta, Bytes::new(), None), e)),
    };
    macro_rules! bail {
        ($meta:expr, $e:expr) => {
            return Err((begin($meta, request, None), $e))
        };
    }
    // Validated once: the head's spans are then read as texts of it.
    let text = std::str::from_utf8(&request).ok();
    let mut head = match text.map_or_else(|| Head::read(&request), Head::read_text) {
        Ok(h) => h,
        Err(e) => bail!(meta, ProxyError::InvalidJson(e)),
    };
    let model = match head.model.take() {
        Some(serde_json::Value::String(m)) => Some(m),
        None => None,
        Some(other) => bail!(meta, ProxyError::InvalidModel(other)),
    };
    meta.stream = head.stream.unwrap_or(false);
    meta.side_call =
        text.is_some_and(|t| side_call::matches(&state.rollouts.side_calls, &head.shape(t)));
    let spans = RequestSpans {
        messages: head.messages,
        tools: head.tools,
    };
    meta.model = model.clone();
    let Some(route) = state.routes.select(model.as_deref()).cloned() else {
        bail!(meta, ProxyError::NoRoute(model));
    };
    meta.route = Some(route.name.clone());
    let upstream_model = model.as_deref().map(|m| route.upstream_model(m).to_owned());
    let Some(target) = route.plan(api) else {
        let e = ProxyError::UnsupportedApi {
            route: route.name.clone(),
            serves: route.api_names(),
            api: api.as_str(),
        };
        bail!(meta, e);
    };
    let mut endpoint = match query {
        Some(q) => format!("{}?{q}", api.endpoint()),
        None => api.endpoint().to_owned(),
    };
    let mut upstream_request = None;
    if target != api {
        let parsed: serde_json::Value = serde_json::from_slice(&request).unwrap_or_default();
        match translate::to_chat(api, &parsed, route.unsupported) {
            Ok(mut t) => {
                if !t.dropped.is_empty() {
                    tracing::warn!(
                        call_id = %meta.call_id,
                        rollout = %meta.rollout_id,
                        route = %route.name,
                        dropped = ?t.dropped,
                        "left out of the request translated to Chat Completions"
                    );
                }
                if let Some(u) = &upstream_model {
                    t.request["model"] = serde_json::json!(u);
                }
                meta.upstream_api = Some(target);
                upstream_request = Some(Bytes::from(
                    serde_json::to_vec(&t.request).unwrap_or_default(),
                ));
                endpoint = target.endpoint().to_owned();
            }
            Err(e) => bail!(meta, ProxyError::Untranslatable(e)),
        }
    } else if let (Some(m), Some(u)) = (&model, &upstream_model) {
        if m != u {
            upstream_request = rewrite_model(&request, u);
        }
    }
    // vLLM and SGLang routes: ask for token ids and logprobs.
    let mut strip = None;
    if let Some(kind) = route.capture.filter(|_| capture::applies(target)) {
        let base = upstream_request.as_ref().unwrap_or(&request);
        if let Ok(serde_json::Value::Object(mut m)) = serde_json::from_slice(base) {
            if let Ok(asked) = capture::prepare(kind, target, &mut m) {
                strip = Some(Strip {
                    kind,
                    api: target,
                    asked,
                });
                let body = serde_json::to_vec(&serde_json::Value::Object(m)).unwrap_or_default();
                upstream_request = Some(Bytes::from(body));
            }
        }
    }
    meta.upstream_model = upstream_model;
    let mut begin = begin(meta, request, upstream_request);
    begin.spans = Some(spans);
    Ok(Prepared {
        begin,
        route,
        api,
        target,
        endpoint,
        strip,
    })
}

fn begin(meta: CallMeta, request: Bytes, upstream_request: Option<Bytes>) -> CallBegin {
    CallBegin {
        meta,
        request,
        upstream_request,
        spans: None,
    }
}

/// Read the harness's request body: at most `max` bytes, with no silence
/// longer than `idle` between two pieces.
async fn read_request(
    body: hyper::body::Incoming,
    max: usize,
    idle: Duration,
) -> Result<Bytes, ProxyError> {
    let mut body = Limited::new(body, max);
    let mut buf = BytesMut::new();
    loop {
        let frame = match crate::http::within(idle, body.frame()).await {
            Err(_) => return Err(ProxyError::RequestStalled(idle)),
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(f)) => f,
        };
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                }
            }
            Err(e)
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                return Err(ProxyError::RequestTooLarge(max));
            }
            Err(e) => return Err(ProxyError::RequestUnreadable(e.to_string())),
        }
    }
}

/// A top-level JSON object with each value kept as its raw bytes.
struct RawObject(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<RawObject, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Box<RawValue>>()? {
                    out.push((k, v));
                }
                Ok(RawObject(out))
            }
        }
        d.deserialize_map(V)
    }
}
pub fn rewrite_model(body: &[u8], model: &str) -> Option<Bytes> {
    let obj: RawObject = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len() + model.len());
    out.push(b'{');
    for (i, (k, v)) in obj.0.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, k).ok()?;
        out.push(b':');
        if k == "model" {
            serde_json::to_writer(&mut out, model).ok()?;
        } else {
            out.extend_from_slice(v.get().as_bytes());
        }
    }
    out.push(b'}');
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_model_keeps_other_bytes() {
        let body = br#"{"model":"a","temperature":1.0e0,"messages":[{"role":"user","content":"h\u00e9"}],"x":{"y":[1,2]}}"#;
        let out = rewrite_model(body, "b").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"b","temperature":1.0e0,"messages":[{"role":"user","content":"h\u00e9"}],"x":{"y":[1,2]}}"#
        );
    }

    /// The spans found reading a request's head are the texts of its
    /// `messages` and `tools`, as the row would read them from the body.
    #[test]
    fn spans_are_the_request_texts_of_messages_and_tools() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            (
                r#"{"model":"m","messages":[{"role":"user","content":"h\u00e9 \n"}],"tools":[{"type":"function"}]}"#,
                r#"[{"role":"user","content":"h\u00e9 \n"}]"#,
                Some(r#"[{"type":"function"}]"#),
            ),
            (
                r#" { "tools" : null , "messages" :  [ 1 , 2 ] } "#,
                "[ 1 , 2 ]",
                None,
            ),
            (r#"{"model":"m"}"#, "[]", None),
            (
                r#"{"messages":null,"tools":{"a":[]}}"#,
                "[]",
                Some(r#"{"a":[]}"#),
            ),
        ];
        for (body, messages, tools) in cases {
            let b = body.as_bytes();
            let head = Head::read(b).unwrap();
            let spans = RequestSpans {
                messages: head.messages,
                tools: head.tools,
            };
            let (m, t) = spans.texts(b).unwrap();
            assert_eq!((m.as_str(), t.as_deref()), (*messages, *tools), "{body}");
        }
        let bad = RequestSpans {
            messages: Some(2..9),
            tools: None,
        };
        assert_eq!(bad.texts(b"{}"), None);
    }

    #[test]
    fn client_keys_are_not_forwarded_when_they_are_ours() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer secret".parse().unwrap());
        h.insert("x-api-key", "secret".parse().unwrap());
        h.insert("x-custom", "1".parse().unwrap());
        h.insert(header::HOST, "x".parse().unwrap());
        let out = upstream_headers(&h, true);
        assert!(out.get(header::AUTHORIZATION).is_none() && out.get("x-api-key").is_none());
        assert!(out.get(header::HOST).is_none());
        assert_eq!(out["x-custom"], "1");
        assert!(upstream_headers(&h, false)
            .get(header::AUTHORIZATION)
            .is_some());
    }
}
