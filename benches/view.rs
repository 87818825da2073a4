//! `rollcall view` at scale: generate the shards of 100,000 rollouts (1 to
//! 5 calls each with a short multi-turn conversation, a finish row for nine
//! in ten, groups of 8 samples per task), start the real `rollcall view`
//! binary on them, and time over HTTP on loopback the pages a researcher
//! asks for: the first list page (HTML with the plots, and as JSON), a page
//! filtered by status and reward, a page sorted by a column, and a
//! full-text search over the messages (each search new, so read from the
//! shards, then its next page, from the cache). Prints, per request, the
//! median, fastest and slowest time of several, and the index build time
//! (start to the ready line) and the server's RSS. A program that prints
//! numbers; it asserts no time.
//!
//! `cargo bench --bench view`; `VIEW_BENCH_ROLLOUTS=N` for another size,
//! `VIEW_BENCH_DIR=PATH` for the scratch directory (else a temporary one).

use rollcall::config::ShardConfig;
use rollcall::record::shard::ShardWriter;
use rollcall::record::{CallRow, RolloutRow};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WORDS: &[&str] = &[
    "parser",
    "tokenizer",
    "cache",
    "scheduler",
    "router",
    "config",
    "logger",
    "encoder",
    "decoder",
    "planner",
    "indexer",
    "resolver",
];
const REPEATS: usize = 9;

fn call_row(rid: &str, seq: i64, messages: String, answer: String, start: i64) -> CallRow {
    CallRow {
        replica: None,
        policy_version: Some(seq / 3),
        policy_version_end: None,
        resent: 0,
        continued: Vec::new(),
        attempt: 0,
        attempt_of: None,
        side_call: false,
        repinned: false,
        call_id: format!("{rid}-{seq:04}"),
        rollout_id: rid.to_owned(),
        sequence: seq,
        wire_api: "chat_completions".into(),
        route: Some("vllm".into()),
        model: Some("qwen3-coder".into()),
        upstream_model: None,
        stream: true,
        status: if seq == 2 { "failed" } else { "ok" }.into(),
        http_status: Some(200),
        failure_class: None,
        failure_message: None,
        request: format!("{{\"model\":\"qwen3-coder\",\"messages\":{messages}}}"),
        upstream_request: None,
        response: Some(answer.clone()),
        response_raw: None,
        messages: Some(messages),
        tools: None,
        response_message: Some(answer),
        tool_calls: None,
        finish_reason: Some("stop".into()),
        received_at: start + seq * 2_000_000,
        first_byte_at: None,
        done_at: Some(start + seq * 2_000_000 + 1_500_000),
        prompt_tokens: Some(200 + seq * 150),
        completion_tokens: Some(40 + seq),
        total_tokens: Some(240 + seq * 151),
        cached_tokens: None,
        reasoning_tokens: None,
        token_capture: "none".into(),
        prompt_token_ids: None,
        completion_token_ids: None,
        prompt_logprobs: None,
        completion_logprobs: None,
        user_agent: Some("bench-agent/1.0".into()),
        upstream_api: None,
        upstream_response_raw: None,
    }
}

/// Write `n` rollouts' calls and finish rows; returns the calls written.
fn generate(cfg: &ShardConfig, n: usize) -> usize {
    let mut calls_w = ShardWriter::<CallRow>::new(cfg).expect("calls writer");
    let mut fins_w = ShardWriter::<RolloutRow>::new(cfg).expect("rollouts writer");
    let mut written = 0;
    for i in 0..n {
        let rid = format!("bench-{i:06}");
        let word = WORDS[i % WORDS.len()];
        let start = 1_767_225_600_000_000 + i as i64 * 10_000_000;
        let mut msgs = vec![
            json!({"role": "system", "content": "You are a software engineering agent. Run commands with the bash tool."}),
            json!({"role": "user", "content": format!("Fix issue #{i}: the {word} fails on input {} with a KeyError.", i * 7 % 10_007)}),
        ];
        for seq in 0..(1 + i % 5) as i64 {
            let answer = json!({"role": "assistant",
                "content": format!("Step {seq}: I will read src/{word}.py and run the tests (issue {i}).")});
            let row = call_row(
                &rid,
                seq,
                serde_json::Value::Array(msgs.clone()).to_string(),
                answer.to_string(),
                start,
            );
            if calls_w.push(row, 0).expect("push call") {
                calls_w.publish().expect("publish calls");
            }
            written += 1;
            msgs.push(answer);
            msgs.push(json!({"role": "user", "content": format!("The tests printed {} failures.", seq % 3)}));
        }
        if i % 10 != 9 {
            let status = match i % 10 {
                0..=6 => "completed",
                7 => "timeout",
                _ => "failure",
            };
            let reward = (status == "completed").then(|| ((i * 37) % 11) as f64 / 10.0);
            let fin = RolloutRow {
                record_id: format!("fin-{i}"),
                rollout_id: rid,
                status: status.into(),
                reward: reward.map(|r| r.min(1.0)),
                metadata: Some(
                    json!({"task": format!("task-{}", i / 8), "harness": "mini-swe-agent"})
                        .to_string(),
                ),
                finished_at: start + 20_000_000,
                calls: (1 + i % 5) as i64,
            };
            if fins_w.push(fin, 0).expect("push finish") {
                fins_w.publish().expect("publish rollouts");
            }
        }
    }
    calls_w.publish().expect("publish calls");
    fins_w.publish().expect("publish rollouts");
    written
}

/// `GET path`, the whole answer read; the time it took.
fn get(addr: &str, path: &str) -> Duration {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut body = Vec::new();
    s.read_to_end(&mut body).expect("read");
    let took = t.elapsed();
    let head = String::from_utf8_lossy(&body[..body.len().min(16)]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    took
}

fn proc_kib(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let med = times[times.len() / 2];
    println!(
        "{what:<44} {:>9.1} {:>9.1} {:>9.1} {:>4}",
        ms(med),
        ms(times[0]),
        ms(times[times.len() - 1]),
        times.len()
    );
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let n: usize = std::env::var("VIEW_BENCH_ROLLOUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir =
        std::env::var("VIEW_BENCH_DIR").map_or_else(|_| tmp.path().join("shards"), Into::into);
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = ShardConfig {
        dir: dir.clone(),
        max_rows: 50_000,
        ..ShardConfig::default()
    };
    let t = Instant::now();
    let calls = generate(&cfg, n);
    println!(
        "generated {n} rollouts, {calls} calls in {:.1} s ({})",
        t.elapsed().as_secs_f64(),
        dir.display()
    );

    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(["view", "--shards"])
        .arg(&dir)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rollcall view");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    let built = t.elapsed();
    let pid = child.id();
    let _guard = Kill(child);
    let addr = line
        .trim()
        .strip_prefix("rollcall view listening on http://")
        .unwrap_or_else(|| panic!("not the ready line: {line:?}"))
        .to_owned();
    println!(
        "index built in {:.2} s (start to ready); RSS {:.0} MiB",
        built.as_secs_f64(),
        proc_kib(pid, "VmRSS:") / 1024.0
    );
    println!();
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>4}",
        "request", "median ms", "min ms", "max ms", "n"
    );
    let times = |path: &str| (0..REPEATS).map(|_| get(&addr, path)).collect::<Vec<_>>();
    row("first page (HTML, with plots)", times("/"));
    row("first page (JSON)", times("/api/rollouts"));
    row(
        "filter: status completed, reward >= 0.5",
        times("/?status=completed&min_reward=0.5"),
    );
    row(
        "filter (JSON): status + reward range",
        times("/api/rollouts?status=completed&min_reward=0.3&max_reward=0.8"),
    );
    row("sorted: tokens, descending", times("/?sort=tokens&desc=1"));
    row(
        "sorted + filtered, page 20",
        times("/?sort=duration&status=timeout&page=20"),
    );
    row(
        "id/harness/group contains (q=task-42)",
        times("/?q=task-42"),
    );
    // Each search new: read from the shards.
    let fresh: Vec<Duration> = (0..REPEATS)
        .map(|k| get(&addr, &format!("/?text=on+input+{}+with", 1000 + k * 13)))
        .collect();
    row("full-text search, new text (reads shards)", fresh);
    get(&addr, "/?text=src%2Fparser.py");
    row(
        "full-text search, next page (cached)",
        times("/?text=src%2Fparser.py&page=1"),
    );
    println!();
    println!(
        "server RSS {:.0} MiB, peak {:.0} MiB",
        proc_kib(pid, "VmRSS:") / 1024.0,
        proc_kib(pid, "VmHWM:") / 1024.0
    );
}
