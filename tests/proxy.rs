//! Integration tests: the real `rollcall` binary between reqwest and a real
//! upstream on loopback; shards read back with the `parquet` crate.
//! (tests/python/ repeats the contract with the openai SDK, pyarrow and DuckDB.)

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use bytes::Bytes;
use common::*;
use hyper::body::Frame;
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test]
async fn forwards_bytes_exactly_and_records_them() {
    let up = upstream::start(|_| {
        upstream::whole(200, "application/json", r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],  "vendor_field" : [1, 2.50]}"#)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &up.url, "");
    let body = "{ \"model\" : \"m\",\n \"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9 ☃\"}], \"vendor\": {\"x\": 1e3}, \"temperature\": 0.70 }";
    let resp = client()
        .post(format!("{}/rollouts/exact-1/v1/chat/completions", px.url))
        .header("x-vendor-header", "kept")
        .header("authorization", "Bearer sk-upstream-key-123")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = resp.bytes().await.unwrap();
    assert!(got.starts_with(br#"{"id":"x""#) && got.ends_with(br#""vendor_field" : [1, 2.50]}"#));
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body,
        body.as_bytes(),
        "request body must pass byte for byte"
    );
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].headers["x-vendor-header"], "kept");
    // No client keys configured: the harness's key is for the upstream.
    assert_eq!(
        seen[0].headers["authorization"],
        "Bearer sk-upstream-key-123"
    );
    let c = client();
    wait_published(&c, &px.url).await;
    px.stop();
    let rows = read_rows(&shards_dir(dir.path()), "calls");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["request"], body);
    assert_eq!(r["response_raw"].as_str().unwrap().as_bytes(), &got[..]);
    assert_eq!(r["rollout_id"], "exact-1");
    assert_eq!(r["status"], "ok");
    for v in r.values() {
        assert!(
            !v.to_string().contains("sk-upstream-key-123"),
            "a key was recorded"
        );
    }
}

#[tokio::test]
async fn streams_are_forwarded_as_they_arrive() {
    // The upstream sends one event, then waits for the test to have seen it
    // through the proxy before sending the rest. A buffering proxy hangs here.
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let gate_rx = std::sync::Mutex::new(Some(gate_rx));
    let up = upstream::start(move |_| {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let gate = gate_rx.lock().unwrap().take().unwrap();
        std::thread::spawn(move || {
            let ev = |s: &str| Ok(Frame::data(Bytes::from(format!("data: {s}\n\n"))));
            tx.blocking_send(ev(r#"{"id":"s","choices":[{"index":0,"delta":{"role":"assistant","content":"first"}}]}"#)).unwrap();
            gate.recv().unwrap();
            tx.blocking_send(ev(r#"{"id":"s","choices":[{"index":0,"delta":{"content":" second"},"finish_reason":"stop"}]}"#)).unwrap();
            tx.blocking_send(ev("[DONE]")).unwrap();
        });
        (200, vec![("content-type", "text/event-stream".to_owned())], rx)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &up.url, "");
    let mut resp = client()
        .post(format!("{}/rollouts/s1/v1/chat/completions", px.url))
        .body(r#"{"model":"m","stream":true,"messages":[]}"#)
        .send()
        .await
        .unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("first") {
        let chunk = tokio::time::timeout(Duration::from_secs(30), resp.chunk())
            .await
            .expect("first event must arrive before the upstream finishes")
            .unwrap()
            .unwrap();
        got.extend_from_slice(&chunk);
    }
    gate_tx.send(()).unwrap();
    while let Some(c) = resp.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert!(String::from_utf8_lossy(&got).ends_with("data: [DONE]\n\n"));
    wait_published(&client(), &px.url).await;
    px.stop();
    let rows = read_rows(&shards_dir(dir.path()), "calls");
    let resp: Value = serde_json::from_str(rows[0]["response"].as_str().unwrap()).unwrap();
    assert_eq!(resp["choices"][0]["message"]["content"], "first second");
    assert_eq!(rows[0]["finish_reason"], "stop");
}

#[tokio::test]
async fn model_map_rewrites_only_the_model() {
    let up = upstream::start(|s| {
        let v: Value = serde_json::from_slice(&s.body).unwrap();
        upstream::whole(
            200,
            "application/json",
            json!({"object": "chat.completion", "model": v["model"], "choices": []}).to_string(),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[[routes]]\nname = \"mapped\"\nurl = \"{}\"\nmodel_map = {{ \"gpt-4o\" = \"local-qwen\" }}\n",
        up.url
    );
    let px = proxy(dir.path(), &up.url, &extra);
    let body = r#"{"messages":[ {"role":"user","content":"x"} ],"model":"gpt-4o","n":1}"#;
    let r = client()
        .post(format!("{}/rollouts/map/v1/chat/completions", px.url))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sent = up.seen.lock().unwrap()[0].body.clone();
    assert_eq!(
        &sent[..],
        br#"{"messages":[ {"role":"user","content":"x"} ],"model":"local-qwen","n":1}"#
    );
    wait_published(&client(), &px.url).await;
    px.stop();
    let rows = read_rows(&shards_dir(dir.path()), "calls");
    assert_eq!(rows[0]["model"], "gpt-4o");
    assert_eq!(rows[0]["upstream_model"], "local-qwen");
    assert_eq!(rows[0]["route"], "mapped");
    assert_eq!(rows[0]["request"], body);
    assert_eq!(
        rows[0]["upstream_request"].as_str().unwrap().as_bytes(),
        &sent[..]
    );
}

#[tokio::test]
async fn only_connect_errors_are_retried() {
    let up = upstream::start(|_| {
        upstream::whole(
            500,
            "application/json",
            r#"{"error":{"message":"boom","type":"server_error"}}"#,
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &up.url, "");
    let r = client()
        .post(format!("{}/rollouts/r/v1/chat/completions", px.url))
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "boom");
    assert_eq!(
        up.seen.lock().unwrap().len(),
        1,
        "a 500 must not be retried"
    );
    drop(px);

    // Nothing listens on this port: connect errors, retried, then a 502.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", free.local_addr().unwrap());
    drop(free);
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &dead, "");
    let r = client()
        .post(format!("{}/rollouts/r/v1/responses", px.url))
        .body(r#"{"model":"m","input":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_connect");
    wait_published(&client(), &px.url).await;
    px.stop();
    let rows = read_rows(&shards_dir(dir.path()), "calls");
    assert_eq!(rows[0]["failure_class"], "upstream_connect");
    assert_eq!(rows[0]["wire_api"], "responses");
}

#[tokio::test]
async fn client_keys_are_checked_and_never_forwarded() {
    let up = upstream::start(|_| {
        upstream::whole(
            200,
            "application/json",
            r#"{"object":"chat.completion","choices":[]}"#,
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    // The key list comes from an environment variable the test sets for the child.
    std::env::set_var("ROLLCALL_TEST_KEYS", "key-a, key-b");
    let px = proxy(
        dir.path(),
        &up.url,
        "[server]\nclient_keys_env = \"ROLLCALL_TEST_KEYS\"\n",
    );
    let url = format!("{}/rollouts/k/v1/chat/completions", px.url);
    let body = r#"{"model":"m","messages":[]}"#;
    let c = client();
    let r = c.post(&url).body(body).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    assert_eq!(
        c.post(&url)
            .bearer_auth("nope")
            .body(body)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        c.post(&url)
            .bearer_auth("key-a")
            .body(body)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.post(&url)
            .header("x-api-key", "key-b")
            .body(body)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for s in up.seen.lock().unwrap().iter() {
        assert!(s.headers.get("authorization").is_none() && s.headers.get("x-api-key").is_none());
    }
}

#[tokio::test]
async fn shards_rotate_by_rows_and_publish_atomically() {
    let up = scripted_upstream();
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &format!("{}/v1", up.url), "max_rows = 3\n");
    let c = client();
    for i in 0..10 {
        let r = c
            .post(format!("{}/rollouts/rot/v1/chat/completions", px.url))
            .body(
                json!({"model": "m", "messages": [{"role": "user", "content": format!("n{i}")}]})
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_published(&c, &px.url).await;
    let files = std::fs::read_dir(shards_dir(dir.path()).join("calls"))
        .unwrap()
        .count();
    assert!(
        files >= 4,
        "10 rows at 3 per shard make at least 4 files, got {files}"
    );
    px.stop();
    let rows = read_rows(&shards_dir(dir.path()), "calls");
    let mut seqs: Vec<i64> = rows
        .iter()
        .map(|r| r["sequence"].as_i64().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(seqs, (0..10).collect::<Vec<_>>());
    let tmp = std::fs::read_dir(shards_dir(dir.path()).join(".tmp"))
        .unwrap()
        .count();
    assert_eq!(tmp, 0, "no half-written file is left after shutdown");
    let wal = std::fs::read_dir(shards_dir(dir.path()).join("wal"))
        .unwrap()
        .count();
    assert_eq!(wal, 0, "a clean shutdown leaves no WAL segment behind");
}

#[tokio::test]
async fn health_metrics_and_bad_requests() {
    let up = scripted_upstream();
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(
        dir.path(),
        &format!("{}/v1", up.url),
        "[server]\nmax_body_bytes = 1000\n[rollouts]\nuntagged = \"reject\"\n",
    );
    let c = client();
    let h = health(&c, &px.url).await;
    assert_eq!(h["status"], "ok");
    let chat = format!("{}/rollouts/bad/v1/chat/completions", px.url);
    let r = c.post(&chat).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .post(&chat)
        .body(format!(
            "{{\"model\":\"m\",\"x\":\"{}\"}}",
            "a".repeat(5000)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_too_large");
    let r = c
        .post(format!("{}/v1/embeddingz", px.url))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = c
        .post(format!("{}/v1/chat/completions", px.url))
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        400,
        "untagged calls are rejected when configured so"
    );
    let r = c
        .post(format!("{}/v1/chat/completions", px.url))
        .header("x-rollout-id", "hdr-1")
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "X-Rollout-Id tags a call");
    let r = c
        .post(format!("{}/rollouts/bad id/v1/chat/completions", px.url))
        .body("{}")
        .send()
        .await;
    if let Ok(r) = r {
        assert_eq!(r.status(), 400);
    }
    // A huge header is refused by the server, not by a panic.
    let r = c
        .post(&chat)
        .header("x-big", "b".repeat(100_000))
        .body("{}")
        .send()
        .await;
    if let Ok(r) = r {
        assert_eq!(r.status().as_u16(), 431);
    }
    wait_published(&c, &px.url).await;
    let m = c
        .get(format!("{}/metrics", px.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("rollcall_call_failures_total{class=\"body_too_large\"} 1"),
        "{m}"
    );
    assert!(m.contains("rollcall_shard_lag_rows 0"));
    px.stop();
    let rows = read_rows(&shards_dir(dir.path()), "calls");
    let classes: Vec<_> = rows
        .iter()
        .map(|r| r["failure_class"].as_str().unwrap_or("-").to_owned())
        .collect();
    assert!(
        classes.contains(&"bad_request".to_owned())
            && classes.contains(&"body_too_large".to_owned()),
        "{classes:?}"
    );
    assert!(rows.iter().any(|r| r["rollout_id"] == "hdr-1"));
}

/// A replica with credentials in its URL goes through the reqwest client
/// (built on each serving thread's first such call), which sends them as
/// basic auth; the password reaches no row.
#[tokio::test]
async fn a_replica_with_credentials_in_its_url_is_called_with_them() {
    let up = upstream::start(|_| {
        upstream::whole(200, "application/json", r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#)
    })
    .await;
    let with_creds = up
        .url
        .replacen("http://", "http://agent:replica-pw-4417@", 1);
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &with_creds, "");
    let c = client();
    for i in 0..3 {
        let resp = c
            .post(format!("{}/rollouts/creds-{i}/v1/chat/completions", px.url))
            .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.text().await.unwrap().contains(r#""content":"ok""#));
    }
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    // base64("agent:replica-pw-4417")
    assert_eq!(
        seen[0].headers["authorization"],
        "Basic YWdlbnQ6cmVwbGljYS1wdy00NDE3"
    );
    wait_published(&c, &px.url).await;
    px.stop();
    let rows = read_rows(&shards_dir(dir.path()), "calls");
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r["status"], "ok");
        for v in r.values() {
            assert!(
                !v.to_string().contains("replica-pw-4417"),
                "a password was recorded"
            );
        }
    }
}
