//! Criterion benches of the recording path: assembling a row, writing rows
//! to a Parquet shard (rows/s), the shard thread's whole work for each call
//! of `make bench`'s proxy comparison, WAL framing, and stream scanning per
//! event.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rollcall::config::ShardConfig;
use rollcall::dialect::{terminal::Detector, WireApi};
use rollcall::record::row::CallRow;
use rollcall::record::shard::ShardWriter;
use rollcall::record::{CallBegin, CallMeta, CallOutcome, CallStatus, CompletedCall};
use std::sync::Arc;

fn stream_body(events: usize) -> String {
    let mut s = String::new();
    for i in 0..events {
        s.push_str(&format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n"
        ));
    }
    s.push_str("data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":64,\"total_tokens\":114}}\n\ndata: [DONE]\n\n");
    s
}

fn call(i: usize) -> CompletedCall {
    let request = serde_json::json!({
        "model": "bench", "stream": true,
        "messages": [{"role": "system", "content": "You are a coding agent. ".repeat(20)},
                     {"role": "user", "content": format!("task {i}: list the files")}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    });
    CompletedCall {
        begin: Arc::new(CallBegin {
            meta: CallMeta {
                call_id: uuid::Uuid::now_v7().to_string(),
                rollout_id: format!("rollout-{}", i % 64),
                sequence: (i / 64) as i64,
                wire_api: rollcall::dialect::WireApi::ChatCompletions,
                route: Some("default".into()),
                model: Some("bench".into()),
                upstream_model: Some("bench".into()),
                stream: true,
                received_at: 1_800_000_000_000_000,
                user_agent: Some("bench".into()),
                upstream_api: None,
                attempt: 0,
                attempt_of: None,
                side_call: false,
            },
            request: Bytes::from(request.to_string()),
            upstream_request: None,
            spans: None,
        }),
        outcome: CallOutcome {
            call_id: String::new(),
            status: CallStatus::Ok,
            http_status: Some(200),
            failure_class: None,
            failure_message: None,
            first_byte_at: Some(1_800_000_000_001_000),
            done_at: 1_800_000_000_002_000,
            replica: None,
            repinned: false,
            policy_version: None,
            policy_version_end: None,
            resent: 0,
            continued: Vec::new(),
        },
        response: Bytes::from(stream_body(64)),
        upstream_response: None,
    }
}

/// A whole (not streamed) Chat Completions call the size of `make bench`'s:
/// what the shard thread handles for each call the proxy bench sends.
fn whole_call(i: usize) -> CompletedCall {
    let mut c = call(i);
    let request = br#"{"model":"bench","stream":false,"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"List the files in the repository."}]}"#;
    let response = format!(
        r#"{{"id":"chatcmpl-scripted-{i}","object":"chat.completion","created":1700000000,"model":"bench","choices":[{{"index":0,"message":{{"role":"assistant","content":"Reply to: List the files in the repository."}},"finish_reason":"stop","logprobs":null}}],"usage":{{"prompt_tokens":6,"completion_tokens":43,"total_tokens":49,"prompt_tokens_details":{{"cached_tokens":0}},"completion_tokens_details":{{"reasoning_tokens":0}}}}}}"#
    );
    let begin = Arc::get_mut(&mut c.begin).expect("not shared");
    begin.meta.stream = false;
    begin.request = Bytes::from_static(request);
    c.response = Bytes::from(response);
    c
}

fn benches(c: &mut Criterion) {
    let calls: Vec<CompletedCall> = (0..1024).map(call).collect();
    let mut g = c.benchmark_group("record");
    g.throughput(Throughput::Elements(1));
    g.bench_function("assemble_row (64-event stream)", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % calls.len();
            CallRow::build(&calls[i])
        })
    });
    let rows: Vec<CallRow> = calls.iter().map(CallRow::build).collect();
    let dir = tempfile::tempdir().unwrap();
    let cfg = ShardConfig {
        dir: dir.path().to_path_buf(),
        max_rows: usize::MAX,
        max_bytes: usize::MAX,
        ..ShardConfig::default()
    };
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.sample_size(10);
    g.bench_function("shard_write rows (zstd, 1024 rows + publish)", |b| {
        b.iter(|| {
            let mut w = ShardWriter::<CallRow>::new(&cfg).unwrap();
            for r in &rows {
                w.push(r.clone(), 0).unwrap();
            }
            w.publish().unwrap()
        })
    });
    let whole: Vec<CompletedCall> = (0..4096).map(whole_call).collect();
    g.throughput(Throughput::Elements(whole.len() as u64));
    g.bench_function(
        "shard thread per whole call (build + write, 4096 rows + publish)",
        |b| {
            b.iter(|| {
                let mut w = ShardWriter::<CallRow>::new(&cfg).unwrap();
                for c in &whole {
                    w.push(CallRow::build(c), 0).unwrap();
                }
                w.publish().unwrap()
            })
        },
    );
    g.finish();

    let body = stream_body(64);
    let mut g = c.benchmark_group("stream");
    g.throughput(Throughput::Elements(65));
    g.bench_function("terminal_scan per event", |b| {
        b.iter(|| {
            let mut d = Detector::default();
            body.as_bytes()
                .chunks(180)
                .fold(false, |acc, ch| acc | d.feed(ch))
        })
    });
    g.bench_function("assemble chat stream per event", |b| {
        b.iter(|| WireApi::ChatCompletions.assemble(body.as_bytes(), true))
    });
    g.finish();

    let mut g = c.benchmark_group("wal");
    let req = calls[0].begin.request.clone();
    g.throughput(Throughput::Bytes(
        (req.len() + calls[0].response.len()) as u64,
    ));
    g.bench_function("encode begin+end frames", |b| {
        let mut buf = Vec::with_capacity(1 << 16);
        b.iter(|| {
            buf.clear();
            rollcall::record::wal::encode(
                &mut buf,
                rollcall::record::wal::Kind::Begin,
                b"{}",
                &req,
                b"",
            )
            .expect("a small frame");
            rollcall::record::wal::encode(
                &mut buf,
                rollcall::record::wal::Kind::End,
                b"{}",
                &calls[0].response,
                b"",
            )
            .expect("a small frame");
            buf.len()
        })
    });
    g.finish();
}

criterion_group!(record, benches);
criterion_main!(record);
