//! Never lose a call, never stop recording: the real `rollcall` binary in
//! front of an upstream with bad habits (malformed streams, `response.failed`,
//! answers too large), harnesses that hang up or stop reading, a stalled or
//! failing write-ahead log (`ROLLCALL_TEST_WAL_HOOK`), and keys in query
//! strings. Each test names the defect it guards against.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use bytes::Bytes;
use common::*;
use hyper::body::Frame;
use serde_json::Value;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn sse(events: &[&str]) -> upstream::Reply {
    let (tx, rx) = tokio::sync::mpsc::channel(events.len().max(1));
    for e in events {
        tx.try_send(Ok(Frame::data(Bytes::from(e.to_string()))))
            .unwrap();
    }
    (
        200,
        vec![("content-type", "text/event-stream".to_owned())],
        rx,
    )
}

/// An upstream that holds each request open for `hold`, then answers.
async fn slow_upstream(hold: Duration) -> upstream::Upstream {
    upstream::start(move |_| {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        std::thread::spawn(move || {
            std::thread::sleep(hold);
            let _ = tx.blocking_send(Ok(Frame::data(Bytes::from_static(
                br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"late"}}]}"#,
            ))));
        });
        (
            200,
            vec![("content-type", "application/json".to_owned())],
            rx,
        )
    })
    .await
}

/// Rows of the calls shards once `n` are published (polling, no restart).
async fn rows_when(
    dir: &std::path::Path,
    n: usize,
) -> Vec<std::collections::BTreeMap<String, Value>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = read_rows(&shards_dir(dir), "calls");
        if rows.len() >= n {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} rows published",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn wal_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(shards_dir(dir).join("wal"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Defect 1: a Responses stream whose `response` is a string and that never
/// completes panicked the shard thread; recording stopped for good and every
/// restart panicked in replay.
#[tokio::test]
async fn a_malformed_stream_is_a_row_and_recording_goes_on() {
    let up = upstream::start(|s| {
        if String::from_utf8_lossy(&s.body).contains("bad") {
            sse(&[
                "event: response.created\ndata: {\"type\":\"response.created\",\"response\":\"oops\"}\n\n",
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"x\"}\n\n",
            ])
        } else {
            upstream::whole(200, "application/json", r#"{"id":"r","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"fine"}]}]}"#)
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client();
    let px = proxy(dir.path(), &up.url, "");
    let r = c
        .post(format!("{}/rollouts/m1/v1/responses", px.url))
        .body(r#"{"model":"m","input":"bad","stream":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let r = c
        .post(format!("{}/rollouts/m1/v1/responses", px.url))
        .body(r#"{"model":"m","input":"good"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rows = rows_when(dir.path(), 2).await;
    let h = health(&c, &px.url).await;
    assert_eq!(h["status"], "ok", "{h}");
    let bad = rows.iter().find(|r| r["sequence"] == 0).unwrap();
    assert_eq!(bad["status"], "failed");
    assert!(
        bad["response_raw"].as_str().unwrap().contains("oops"),
        "raw bytes kept"
    );
    let good = rows.iter().find(|r| r["sequence"] == 1).unwrap();
    assert_eq!(good["status"], "ok");
    px.stop();
    // A restart on the same shards starts and sees both rows once.
    let px = proxy(dir.path(), &up.url, "");
    px.stop();
    assert_eq!(read_rows(&shards_dir(dir.path()), "calls").len(), 2);
}

/// Defect 4: a stream ending in `response.failed` was recorded as `ok`.
#[tokio::test]
async fn response_failed_and_incomplete_are_failure_rows() {
    let up = upstream::start(|s| {
        let failed = String::from_utf8_lossy(&s.body).contains("fail");
        let (kind, status) = if failed { ("response.failed", "failed") } else { ("response.incomplete", "incomplete") };
        let last = format!("event: {kind}\ndata: {{\"type\":\"{kind}\",\"response\":{{\"id\":\"r\",\"object\":\"response\",\"status\":\"{status}\",\"output\":[]}}}}\n\n");
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tx.try_send(Ok(Frame::data(Bytes::from("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[]}}\n\n")))).unwrap();
        tx.try_send(Ok(Frame::data(Bytes::from(last)))).unwrap();
        (200, vec![("content-type", "text/event-stream".to_owned())], rx)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let c = client();
    let px = proxy(dir.path(), &up.url, "");
    for input in ["fail", "cut"] {
        let r = c
            .post(format!("{}/rollouts/f1/v1/responses", px.url))
            .body(format!(
                r#"{{"model":"m","input":"{input}","stream":true}}"#
            ))
            .send()
            .await
            .unwrap();
        let _ = r.bytes().await;
    }
    let rows = rows_when(dir.path(), 2).await;
    px.stop();
    let class =
        |seq: i64| rows.iter().find(|r| r["sequence"] == seq).unwrap()["failure_class"].clone();
    assert_eq!(class(0), "upstream_failed");
    assert_eq!(class(1), "upstream_incomplete");
    assert!(rows.iter().all(|r| r["status"] == "failed"));
}

/// Defect 2: a harness that hung up while the upstream was still working left
/// its call open in the WAL; its row appeared only after a restart and its
/// segment was never collected.
// Blocking sockets beside an upstream served by this runtime: two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_up_gets_its_row_at_once_and_leaves_no_wal() {
    let up = slow_upstream(Duration::from_secs(3)).await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &up.url, "");
    let addr = px.url.trim_start_matches("http://").to_owned();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hang"}]}"#;
    {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "POST /rollouts/h1/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    } // hang up while the upstream works
    let rows = rows_when(dir.path(), 1).await;
    assert_eq!(rows[0]["status"], "failed");
    assert_eq!(rows[0]["failure_class"], "client_disconnected");
    px.stop();
    assert_eq!(
        wal_files(dir.path()),
        Vec::<std::path::PathBuf>::new(),
        "a graceful stop leaves no WAL"
    );
    assert_eq!(
        read_rows(&shards_dir(dir.path()), "calls").len(),
        1,
        "exactly once"
    );
}

/// Defect 3: a key in the query string reached the shard and the log through
/// the upstream client's error text.
#[tokio::test]
async fn a_key_in_the_query_string_is_redacted() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 9 of loopback: the upstream is unreachable.
    let px = proxy(
        dir.path(),
        "http://127.0.0.1:9/v1",
        "[[routes]]\nname = \"x\"\nurl = \"http://127.0.0.1:9/v1\"\nconnect_retries = 0\n",
    );
    let c = client();
    let r = c
        .post(format!(
            "{}/rollouts/q1/v1/chat/completions?api-key=SECRET-KEY-123456&beta=true",
            px.url
        ))
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let text = r.text().await.unwrap();
    assert!(!text.contains("SECRET-KEY-123456"), "{text}");
    let rows = rows_when(dir.path(), 1).await;
    px.stop();
    let msg = rows[0]["failure_message"].as_str().unwrap().to_owned();
    assert!(!msg.contains("SECRET-KEY-123456"), "{msg}");
    for v in rows[0].values() {
        let v = v.to_string();
        assert!(
            !v.contains("SECRET-KEY-123456") || v.contains("\"request\""),
            "{v}"
        );
    }
}

fn hook_file(dir: &std::path::Path, state: &str) -> std::path::PathBuf {
    let p = dir.join("wal-hook");
    std::fs::write(&p, state).unwrap();
    p
}

/// The crash test's deterministic half: with the WAL stalled, a whole body,
/// a stream's terminal chunk, and the head of a stream that started during
/// the stall are withheld until the WAL has what they depend on (so a call
/// whose head a client saw is always on disk, and a SIGKILL leaves it as an
/// `incomplete` row).
#[tokio::test]
async fn answers_wait_for_the_wal() {
    type Tail = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;
    let tails: Arc<Mutex<Vec<Tail>>> = Arc::default();
    let up = upstream::start({
        let tails = tails.clone();
        move |s| {
            if String::from_utf8_lossy(&s.body).contains("\"stream\":true") {
                // The first chunk now; the terminal one when the test says.
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                let part = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"part\"}}]}\n\n";
                tx.try_send(Ok(Frame::data(Bytes::from(part)))).unwrap();
                tails.lock().unwrap().push(tx);
                (200, vec![("content-type", "text/event-stream".to_owned())], rx)
            } else {
                upstream::whole(200, "application/json", r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"whole"}}]}"#)
            }
        }
    })
    .await;
    let end = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let dir = tempfile::tempdir().unwrap();
    let hook = hook_file(dir.path(), "");
    let px = proxy_env(
        dir.path(),
        &up.url,
        "",
        &[("ROLLCALL_TEST_WAL_HOOK", hook.to_str().unwrap())],
    );
    let c = client();
    let stream_req = |c: &reqwest::Client| {
        c.post(format!("{}/rollouts/w1/v1/chat/completions", px.url))
            .body(r#"{"model":"m","messages":[],"stream":true}"#)
            .send()
    };
    // A stream whose start is in the WAL: head and first chunk flow.
    let mut stream = stream_req(&c).await.unwrap();
    let mut got = Vec::new();
    let first = stream.chunk().await.unwrap().unwrap();
    got.extend_from_slice(&first);
    assert!(String::from_utf8_lossy(&got).contains("part"));
    std::fs::write(&hook, "stall").unwrap();
    let whole = tokio::spawn({
        let (c, url) = (c.clone(), px.url.clone());
        async move {
            c.post(format!("{url}/rollouts/w1/v1/chat/completions"))
                .body(r#"{"model":"m","messages":[]}"#)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
        }
    });
    let late = tokio::spawn({
        let c = c.clone();
        let f = stream_req(&c);
        async move { f.await.unwrap() }
    });
    let tail = tails.lock().unwrap().remove(0);
    tail.send(Ok(Frame::data(Bytes::from(end)))).await.unwrap();
    drop(tail);
    // Nothing more while the WAL is stalled: no terminal chunk, no whole
    // body, no head for the stream that began during the stall.
    let more = tokio::time::timeout(Duration::from_millis(800), stream.chunk()).await;
    assert!(
        more.is_err(),
        "the terminal chunk went out before the WAL had the call"
    );
    assert!(
        !whole.is_finished(),
        "the whole body went out before the WAL had the call"
    );
    assert!(
        !late.is_finished(),
        "a stream's head went out before the WAL had its start"
    );
    std::fs::write(&hook, "").unwrap();
    while let Some(c) = stream.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert!(String::from_utf8_lossy(&got).ends_with("data: [DONE]\n\n"));
    assert!(String::from_utf8_lossy(&whole.await.unwrap()).contains("whole"));
    let mut late = late.await.unwrap();
    let tail = tails.lock().unwrap().remove(0);
    tail.send(Ok(Frame::data(Bytes::from(end)))).await.unwrap();
    drop(tail);
    let mut got = Vec::new();
    while let Some(c) = late.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert!(String::from_utf8_lossy(&got).ends_with("data: [DONE]\n\n"));
    let rows = rows_when(dir.path(), 3).await;
    assert!(rows.iter().all(|r| r["status"] == "ok"));
    px.stop();
}

/// Fail closed: a call whose end the WAL could not take is not answered as
/// a success; a torn write does not corrupt the segment; recording resumes
/// by itself once writes succeed again.
#[tokio::test]
async fn a_failing_wal_fails_closed_and_recovers() {
    let up = upstream::start(|_| {
        upstream::whole(
            200,
            "application/json",
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}"#,
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let hook = hook_file(dir.path(), "");
    let px = proxy_env(
        dir.path(),
        &up.url,
        "",
        &[("ROLLCALL_TEST_WAL_HOOK", hook.to_str().unwrap())],
    );
    let c = client();
    let call = |n: u32| {
        let (c, url) = (c.clone(), px.url.clone());
        async move {
            c.post(format!("{url}/rollouts/d1/v1/messages"))
                .body(format!(r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"user","content":"n{n}"}}]}}"#))
                .send()
                .await
                .unwrap()
        }
    };
    // The route speaks Chat Completions: the Messages call is translated,
    // and its error must come back in Anthropic's format.
    let _ = call(0).await;
    for (i, state) in ["fail", "torn"].into_iter().enumerate() {
        std::fs::write(&hook, state).unwrap();
        let r = call(1 + i as u32).await;
        assert_eq!(r.status(), 503, "{state}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("could not record"),
            "{v}"
        );
        let h = health(&c, &px.url).await;
        assert_eq!(h["status"], "unhealthy", "{h}");
    }
    std::fs::write(&hook, "").unwrap();
    let r = call(3).await;
    assert_eq!(r.status(), 200);
    let rows = rows_when(dir.path(), 4).await;
    assert_eq!(health(&c, &px.url).await["status"], "ok");
    let metrics = c
        .get(format!("{}/metrics", px.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("rollcall_unrecorded_calls_total 2"),
        "{metrics}"
    );
    px.stop();
    let mut by_seq: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r["sequence"].as_i64().unwrap(),
                r["status"].clone(),
                r["failure_class"].clone(),
            )
        })
        .collect();
    by_seq.sort_by_key(|r| r.0);
    assert_eq!(by_seq[0].1, "ok");
    assert_eq!(
        (by_seq[1].1.clone(), by_seq[1].2.clone()),
        ("failed".into(), "internal".into())
    );
    assert_eq!(
        (by_seq[2].1.clone(), by_seq[2].2.clone()),
        ("failed".into(), "internal".into())
    );
    assert_eq!(by_seq[3].1, "ok");
    // After the stop nothing is left to replay, and a restart adds nothing.
    assert!(wal_files(dir.path()).is_empty());
    let px = proxy(dir.path(), &up.url, "");
    px.stop();
    assert_eq!(read_rows(&shards_dir(dir.path()), "calls").len(), 4);
}

/// With `on_wal_error = "serve"` the answer goes out anyway and the call is
/// recorded once the WAL takes writes again.
#[tokio::test]
async fn on_wal_error_serve_answers_and_records_later() {
    let up = upstream::start(|_| {
        upstream::whole(
            200,
            "application/json",
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}"#,
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let hook = hook_file(dir.path(), "fail");
    let px = proxy_env(
        dir.path(),
        &up.url,
        "on_wal_error = \"serve\"\n",
        &[("ROLLCALL_TEST_WAL_HOOK", hook.to_str().unwrap())],
    );
    let c = client();
    let r = c
        .post(format!("{}/rollouts/s1/v1/chat/completions", px.url))
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    std::fs::write(&hook, "").unwrap();
    let rows = rows_when(dir.path(), 1).await;
    px.stop();
    assert_eq!(rows[0]["status"], "ok");
}

/// Response buffers were bounded only by the stream's duration.
#[tokio::test]
async fn answers_past_max_response_bytes_are_failed_and_recorded() {
    let up = upstream::start(|s| {
        let big = "x".repeat(40_000);
        if String::from_utf8_lossy(&s.body).contains("\"stream\":true") {
            let ev = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{big}\"}}}}]}}\n\n"
            );
            let (tx, rx) = tokio::sync::mpsc::channel(8);
            for _ in 0..4 {
                tx.try_send(Ok(Frame::data(Bytes::from(ev.clone()))))
                    .unwrap();
            }
            (
                200,
                vec![("content-type", "text/event-stream".to_owned())],
                rx,
            )
        } else {
            upstream::whole(
                200,
                "application/json",
                format!(r#"{{"pad":"{big}{big}{big}"}}"#),
            )
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(
        dir.path(),
        &up.url,
        "[server]\nmax_response_bytes = 100000\n",
    );
    let c = client();
    let r = c
        .post(format!("{}/rollouts/b1/v1/chat/completions", px.url))
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let r = c
        .post(format!("{}/rollouts/b1/v1/chat/completions", px.url))
        .body(r#"{"model":"m","messages":[],"stream":true}"#)
        .send()
        .await
        .unwrap();
    let mut r = r;
    let mut got = Vec::new();
    let mut cut = false;
    loop {
        match r.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break,
            Err(_) => {
                cut = true;
                break;
            }
        }
    }
    assert!(
        cut,
        "a stream cut at the cap must not end like a complete one"
    );
    assert!(String::from_utf8_lossy(&got).contains("response_too_large"));
    let rows = rows_when(dir.path(), 2).await;
    px.stop();
    assert!(
        rows.iter()
            .all(|r| r["failure_class"] == "response_too_large"),
        "{rows:?}"
    );
    assert!(rows
        .iter()
        .all(|r| r["response_raw"].as_str().map_or(0, str::len) <= 100_000 + 1000));
}

/// A harness that stops reading a stream no longer blocks the pump forever,
/// and a stream holds its call slot until its last byte.
// Blocking sockets beside an upstream served by this runtime: two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_time_out_and_streams_hold_their_slot() {
    let up = upstream::start(|s| {
        if String::from_utf8_lossy(&s.body).contains("\"stream\":true") {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            std::thread::spawn(move || {
                let ev = format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
                    "y".repeat(60_000)
                );
                for _ in 0..2000 {
                    if tx
                        .blocking_send(Ok(Frame::data(Bytes::from(ev.clone()))))
                        .is_err()
                    {
                        return;
                    }
                }
                let _ = tx.blocking_send(Ok(Frame::data(Bytes::from("data: [DONE]\n\n"))));
            });
            (
                200,
                vec![("content-type", "text/event-stream".to_owned())],
                rx,
            )
        } else {
            upstream::whole(
                200,
                "application/json",
                r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}"#,
            )
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(
        dir.path(),
        &up.url,
        "[server]\nmax_concurrent_calls = 1\nqueue_timeout_secs = 0.3\nclient_idle_timeout_secs = 1.0\n",
    );
    let addr = px.url.trim_start_matches("http://").to_owned();
    let body = r#"{"model":"m","messages":[],"stream":true}"#;
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "POST /rollouts/slow/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut head = [0u8; 256];
    let _ = s.read(&mut head).unwrap();
    // The stream holds the only slot: another call waits, then gets 503.
    let c = client();
    let r = c
        .post(format!("{}/rollouts/other/v1/chat/completions", px.url))
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    // We never read again: after the idle timeout the stream is given up.
    let rows = rows_when(dir.path(), 2).await;
    let slow = rows
        .iter()
        .find(|r| r["rollout_id"] == "slow")
        .expect("the slow reader's row");
    assert_eq!(slow["failure_class"], "client_timeout", "{slow:?}");
    let other = rows.iter().find(|r| r["rollout_id"] == "other").unwrap();
    assert_eq!(other["failure_class"], "overloaded");
    // Its slot is free again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .post(format!("{}/rollouts/other/v1/chat/completions", px.url))
            .body(r#"{"model":"m","messages":[]}"#)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never released");
    }
    drop(s);
    let metrics = c
        .get(format!("{}/metrics", px.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("rollcall_rejected_calls_total{reason=\"overloaded\"}"),
        "{metrics}"
    );
    px.stop();
}

/// There was no timeout on reading a request body (slowloris).
// Blocking sockets beside an upstream served by this runtime: two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_times_out() {
    let up = slow_upstream(Duration::from_millis(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(
        dir.path(),
        &up.url,
        "[server]\nclient_idle_timeout_secs = 0.5\n",
    );
    let addr = px.url.trim_start_matches("http://").to_owned();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "POST /rollouts/sl/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{{\"model\":").unwrap();
    let mut resp = String::new();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    resp.push_str(&String::from_utf8_lossy(&buf[..n]));
    assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
    let rows = rows_when(dir.path(), 1).await;
    px.stop();
    assert_eq!(rows[0]["failure_class"], "client_timeout");
}

/// Rejected calls left no trace: they are counted by reason, and recorded
/// when their rollout is known; `unauthorized` is produced.
#[tokio::test]
async fn rejected_calls_are_counted_and_recorded() {
    let up = slow_upstream(Duration::from_millis(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let key_var = "ROLLCALL_TEST_RESILIENCE_KEYS";
    let px = proxy_env(
        dir.path(),
        &up.url,
        &format!("[server]\nclient_keys_env = \"{key_var}\"\n"),
        &[(key_var, "good-key-123456")],
    );
    let c = client();
    let r = c
        .post(format!("{}/rollouts/r1/v1/chat/completions", px.url))
        .header("authorization", "Bearer wrong-key-999999")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(format!("{}/rollouts/bad id/v1/chat/completions", px.url))
        .header("authorization", "Bearer good-key-123456")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let metrics = c
        .get(format!("{}/metrics", px.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("rollcall_rejected_calls_total{reason=\"invalid_api_key\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rollcall_rejected_calls_total{reason=\"invalid_rollout_id\"} 1"),
        "{metrics}"
    );
    let rows = rows_when(dir.path(), 1).await;
    px.stop();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["rollout_id"], "r1");
    assert_eq!(rows[0]["failure_class"], "unauthorized");
    assert!(!rows[0]
        .values()
        .any(|v| v.to_string().contains("wrong-key-999999")));
}

/// The `/models` answer was read with no size limit.
#[tokio::test]
async fn a_huge_models_answer_is_not_passed_on() {
    let up = upstream::start(|_| {
        upstream::whole(
            200,
            "application/json",
            format!(r#"{{"data":"{}"}}"#, "m".repeat(5 << 20)),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &up.url, "");
    let r = client()
        .get(format!("{}/v1/models", px.url))
        .send()
        .await
        .unwrap();
    // No model is named in the config to list instead: a clear 502.
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("exceeds"),
        "{v}"
    );
    px.stop();
}
