//! The server: bind, read a request, answer it whole or as a stream of
//! events, injecting the faults its model name asks for.

use crate::answer::Answer;
use crate::faults::{dropped, error, error_for, failed_event, malformed, stream_error_event};
use crate::options::{kind_of, opts, Apis, Kind, Opts};
use bytes::Bytes;
use http::{header, Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rollcall::http::{bytes_response, json_response, serve_plain, Chunk, ProxyBody};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Bind and serve `apis` until the process ends. Prints nothing; returns
/// the address and the accept loop.
pub(crate) async fn bind(
    addr: SocketAddr,
    apis: Apis,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    // Numbers the requests, for the ids in the answers.
    let counter = Arc::new(AtomicU64::new(0));
    serve_plain(addr, move |req| {
        let counter = counter.clone();
        async move { handle(req, &counter, apis).await }
    })
    .await
}

async fn handle(req: Request<Incoming>, counter: &AtomicU64, apis: Apis) -> Response<ProxyBody> {
    let path = req.uri().path().to_owned();
    if req.method() == Method::GET {
        return match path.as_str() {
            "/v1/models" => json_response(
                200,
                &json!({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "rollcall-scripted"}]}),
            ),
            _ => error(404, "not found"),
        };
    }
    let kind = kind_of(&path);
    if let Some(k) = kind {
        if !apis.serves(k) {
            return error(
                404,
                &format!("scripted upstream does not serve {path} (--apis {apis})"),
            );
        }
    }
    let Ok(body) = req.into_body().collect().await else {
        return error_for(kind, 400, "could not read body");
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return error_for(kind, 400, "body is not JSON");
    };
    let n = counter.fetch_add(1, Ordering::Relaxed);
    let model_full = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("scripted")
        .to_owned();
    let (_, mut o) = opts(&model_full);
    if let Some(times) = o.fault_times {
        if seen_before(&body) >= times {
            o.fault = None;
        }
    }
    if !o.ttfb.is_zero() {
        tokio::time::sleep(o.ttfb).await;
    }
    match o.fault.as_deref() {
        Some("500") => return error_for(kind, 500, "scripted internal error"),
        Some("429") => return error_for(kind, 429, "scripted rate limit"),
        Some("400") => return error_for(kind, 400, "scripted bad request"),
        Some("timeout") => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Some("garbage") => return bytes_response(200, "application/json", "<html>not json</html>"),
        _ => {}
    }
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if o.fault.as_deref() == Some("malformed") {
        return malformed(kind, stream);
    }
    let Some(kind) = kind else {
        return error(404, &format!("scripted upstream does not serve {path}"));
    };
    if kind == Kind::CountTokens {
        let n = body.to_string().split_whitespace().count();
        return json_response(200, &json!({"input_tokens": n}));
    }
    let answer = Answer::decide(kind, &body, &model_full, n);
    if !stream {
        let text = answer.whole().to_string();
        if o.fault.as_deref() == Some("drop") {
            return dropped(text);
        }
        return bytes_response(200, "application/json", text);
    }
    stream_events(kind, answer.events(o.events), &o)
}

/// Send `events` as a server-sent event stream, paced by `delay_ms`, cut
/// by the stream faults (`drop` halfway, `failed` and `stream_error` after
/// two events).
fn stream_events(kind: Kind, events: Vec<String>, o: &Opts) -> Response<ProxyBody> {
    let (tx, rx) = mpsc::channel::<Chunk>(16);
    let fault = o.fault.clone();
    let delay = o.delay;
    tokio::spawn(async move {
        let total = events.len();
        for (i, ev) in events.into_iter().enumerate() {
            if fault.as_deref() == Some("drop") && i == total / 2 {
                let _ = tx.send(Err(std::io::Error::other("scripted drop"))).await;
                return;
            }
            let cut = match fault.as_deref() {
                Some("failed") if i == 2 => Some(failed_event(kind)),
                Some("stream_error") if i == 2 => Some(stream_error_event(kind)),
                _ => None,
            };
            if let Some(event) = cut {
                let _ = tx.send(Ok(Bytes::from(event))).await;
                return;
            }
            if tx.send(Ok(Bytes::from(ev))).await.is_err() {
                return;
            }
            if !delay.is_zero() && i + 1 < total {
                tokio::time::sleep(delay).await;
            }
        }
    });
    let mut r = Response::new(ProxyBody::Stream(rx));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        "text/event-stream".parse().expect("ct"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, "no-cache".parse().expect("cc"));
    r
}

/// How many times this exact body was seen before (for `fault_times`).
fn seen_before(body: &Value) -> u32 {
    use std::collections::HashMap;
    use std::hash::{Hash, Hasher};
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.to_string().hash(&mut h);
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if seen.len() > 100_000 {
        seen.clear();
    }
    let n = seen.entry(h.finish()).or_insert(0);
    *n += 1;
    *n - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn serve(apis: Apis) -> String {
        let (addr, fut) = bind("127.0.0.1:0".parse().unwrap(), apis).await.unwrap();
        tokio::spawn(fut);
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn messages_over_http_with_errors_and_apis() {
        let base = serve(Apis::ALL).await;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let body = json!({"model": "m", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hello"}]});
        let r = client
            .post(format!("{base}/v1/messages?beta=true"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["content"][0]["text"], "Reply to: hello");
        assert_eq!(v["usage"]["output_tokens"], json!("Reply to: hello".len()));

        let mut stream = body.clone();
        stream["stream"] = json!(true);
        let r = client
            .post(format!("{base}/v1/messages"))
            .json(&stream)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()[reqwest::header::CONTENT_TYPE],
            "text/event-stream"
        );
        let text = r.text().await.unwrap();
        assert!(text.starts_with("event: message_start\ndata: {"));
        assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));

        let mut faulty = body.clone();
        faulty["model"] = json!("m@fault=429");
        let r = client
            .post(format!("{base}/v1/messages"))
            .json(&faulty)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");

        faulty["model"] = json!("m@fault=stream_error");
        faulty["stream"] = json!(true);
        let text = client
            .post(format!("{base}/v1/messages"))
            .json(&faulty)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // Compare the error event as JSON: serde_json keeps insertion order
        // (`preserve_order`), so its key order is not the test's business.
        let last = text
            .trim_end()
            .rsplit("\n\n")
            .next()
            .unwrap_or_default()
            .to_owned();
        let data = last
            .strip_prefix("event: error\ndata: ")
            .unwrap_or_default();
        assert_eq!(
            serde_json::from_str::<Value>(data).ok(),
            Some(
                json!({"type": "error", "error": {"type": "api_error", "message": "scripted stream error"}})
            ),
            "{text}"
        );

        let r = client
            .post(format!("{base}/v1/messages/count_tokens"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        assert!(v["input_tokens"].as_i64().unwrap() > 0);

        // A chat-only upstream refuses the others with an OpenAI error.
        let chat_only = serve("chat".parse().unwrap()).await;
        let r = client
            .post(format!("{chat_only}/v1/messages?beta=true"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["error"]["message"],
            "scripted upstream does not serve /v1/messages (--apis chat)"
        );
        let r = client
            .post(format!("{chat_only}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}
