//! Export at scale: generate call rows into shards (synthetic but shaped
//! like real agent rollouts: multi-turn tool calling, prompts that extend
//! turn by turn, token ids and logprobs, an occasional compaction), then run
//! the SFT and RL exports and print rows/s and peak RSS (VmHWM, reset
//! between phases through /proc/self/clear_refs). Two shapes, each with the
//! same number of rows:
//!
//! - `many`: rollouts of 6 to 14 calls each (one agent run per rollout);
//! - `one`: every call in a single rollout, shaped like the `untagged`
//!   rollout: many short independent conversations (1 to 5 calls, some with
//!   a tool call), 64 open at a time, interleaved call by call.
//!
//! `cargo bench --bench export` (1,000,000 rows); `EXPORT_BENCH_ROWS=N`
//! for another size, `EXPORT_BENCH_SHAPE=many|one` for one shape only,
//! `EXPORT_BENCH_DIR=PATH` for the scratch directory.

use rollcall::config::ShardConfig;
use rollcall::export::{rl, sft};
use rollcall::record::shard::ShardWriter;
use rollcall::record::{CallRow, RolloutRow};
use serde_json::{json, Value};
use std::time::Instant;

fn peak_rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn reset_peak() {
    // Hand the previous phase's freed heap back first, so that its
    // leftovers do not count as the next phase's peak.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
    // "5" resets the peak RSS (Linux >= 4.0); ignored elsewhere.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Deterministic "tokenizer": one id per 4 bytes of text.
fn tokens(text: &str, salt: u64) -> Vec<i32> {
    text.as_bytes()
        .chunks(4)
        .enumerate()
        .map(|(i, c)| {
            let mut h = salt ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for b in c {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
            (h % 150_000) as i32
        })
        .collect()
}

const SYSTEM: &str = "You are a software engineering agent. You can run shell commands with the bash tool. \
Work step by step, inspect the repository before editing, run the tests after each change, and stop when they pass.";

fn call_row(
    rid: &str,
    seq: i64,
    msgs: &[Value],
    answer: &Value,
    prompt: &[i32],
    completion: &[i32],
) -> CallRow {
    let tools = json!([{"type": "function", "function": {"name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]);
    let messages = Value::Array(msgs.to_vec()).to_string();
    CallRow {
        replica: None,
        policy_version: None,
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
        status: "ok".into(),
        http_status: Some(200),
        failure_class: None,
        failure_message: None,
        request: format!("{{\"model\":\"qwen3-coder\",\"messages\":{messages}}}"),
        upstream_request: None,
        response: Some(answer.to_string()),
        response_raw: None,
        messages: Some(messages),
        tools: Some(tools.to_string()),
        response_message: Some(answer.to_string()),
        tool_calls: None,
        finish_reason: Some("tool_calls".into()),
        received_at: 1_767_225_600_000_000 + seq * 1_000_000,
        first_byte_at: None,
        done_at: None,
        prompt_tokens: Some(prompt.len() as i64),
        completion_tokens: Some(completion.len() as i64),
        total_tokens: Some((prompt.len() + completion.len()) as i64),
        cached_tokens: None,
        reasoning_tokens: None,
        token_capture: "ids_and_logprobs".into(),
        prompt_token_ids: Some(prompt.to_vec()),
        completion_token_ids: Some(completion.to_vec()),
        prompt_logprobs: None,
        completion_logprobs: Some(
            (0..completion.len())
                .map(|i| -0.05 * (i % 7) as f64)
                .collect(),
        ),
        user_agent: Some("bench-agent/1.0".into()),
        upstream_api: None,
        upstream_response_raw: None,
    }
}

/// Write `rows` call rows in one rollout, `untagged`: short independent
/// conversations, 64 open at once, interleaved; returns (calls, rollouts).
fn generate_untagged(cfg: &ShardConfig, rows: usize) -> (usize, usize) {
    struct Conv {
        id: usize,
        msgs: Vec<Value>,
        prompt: Vec<i32>,
        turn: usize,
        turns: usize,
    }
    let mut calls_w = ShardWriter::<CallRow>::new(cfg).expect("calls writer");
    let mut open: Vec<Conv> = vec![];
    let (mut next_id, mut rng) = (0usize, 0x9e37_79b9_7f4a_7c15u64);
    let mut rand = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n.max(1) as u64) as usize
    };
    for seq in 0..rows {
        while open.len() < 64 {
            let id = next_id;
            next_id += 1;
            let msgs = vec![
                json!({"role": "system", "content": "You are a helpful assistant."}),
                json!({"role": "user", "content": format!("Question {id}: how do I read a file line by line in Python?")}),
            ];
            let prompt = msgs
                .iter()
                .flat_map(|m| tokens(m["content"].as_str().unwrap_or(""), id as u64))
                .collect();
            open.push(Conv {
                id,
                msgs,
                prompt,
                turn: 0,
                turns: 1 + (id * 7919) % 5,
            });
        }
        let i = rand(open.len());
        let c = &mut open[i];
        let last = c.turn + 1 == c.turns;
        let answer = if last || c.turn % 2 == 1 {
            json!({"role": "assistant", "content": format!("Use `for line in open(path):` (answer {}).", c.turn)})
        } else {
            json!({"role": "assistant", "content": "",
                   "tool_calls": [{"id": format!("call_{}_{}", c.id, c.turn), "type": "function",
                                   "function": {"name": "bash", "arguments": json!({"command": format!("python -c 'print({})'", c.turn)}).to_string()}}]})
        };
        let completion = tokens(&answer.to_string(), (c.id as u64) ^ ((c.turn as u64) << 20));
        let row = call_row(
            "untagged",
            seq as i64,
            &c.msgs,
            &answer,
            &c.prompt,
            &completion,
        );
        if calls_w.push(row, 0).expect("push") {
            calls_w.publish().expect("publish");
        }
        c.prompt.extend_from_slice(&completion);
        c.msgs.push(answer);
        let obs = if c.turn.is_multiple_of(2) && !last {
            json!({"role": "tool", "tool_call_id": format!("call_{}_{}", c.id, c.turn), "content": format!("{}", c.turn)})
        } else {
            json!({"role": "user", "content": "Thanks. And with an index?"})
        };
        c.prompt.extend(tokens(&obs.to_string(), 7));
        c.msgs.push(obs);
        c.turn += 1;
        if c.turn == c.turns {
            open.swap_remove(i);
        }
    }
    calls_w.publish().expect("publish");
    // Like the real `untagged` rollout: never finished (no reward).
    (rows, 1)
}

/// Write about `rows` call rows; returns (calls, rollouts).
fn generate(cfg: &ShardConfig, rows: usize) -> (usize, usize) {
    let mut calls_w = ShardWriter::<CallRow>::new(cfg).expect("calls writer");
    let mut rolls_w = ShardWriter::<RolloutRow>::new(cfg).expect("rollouts writer");
    let (mut n, mut r) = (0usize, 0usize);
    while n < rows {
        let rid = format!("rollout-{r:07}");
        let turns = 6 + (r * 7919) % 9; // 6..14 calls
        let salt = r as u64;
        let mut msgs = vec![
            json!({"role": "system", "content": SYSTEM}),
            json!({"role": "user", "content": format!("Fix issue #{r}: the parser rejects empty input files. Make tests/test_parse.py pass.")}),
        ];
        let mut prompt: Vec<i32> = msgs
            .iter()
            .flat_map(|m| tokens(m["content"].as_str().unwrap_or(""), salt))
            .collect();
        for k in 0..turns {
            if n >= rows {
                break;
            }
            // Every 40th rollout compacts its history halfway.
            if r % 40 == 0 && k == turns / 2 {
                msgs = vec![
                    json!({"role": "user", "content": format!("Summary of the work so far on issue #{r}: inspected the parser, found the empty-input branch. Continue.")}),
                ];
                prompt = tokens(msgs[0]["content"].as_str().unwrap_or(""), salt ^ 1);
            }
            let last = k + 1 == turns;
            let answer = if last {
                json!({"role": "assistant", "content": "The tests pass now: the parser returns an empty document for empty input."})
            } else {
                let cmd = format!("cd /repo && sed -n '{},{}p' src/parser.py && python -m pytest tests/test_parse.py -q -k case_{k}", k * 40, k * 40 + 40);
                json!({"role": "assistant", "content": format!("Step {k}: let me look at the next part."),
                       "tool_calls": [{"id": format!("call_{r}_{k}"), "type": "function",
                                       "function": {"name": "bash", "arguments": json!({"command": cmd}).to_string()}}]})
            };
            let completion = tokens(&answer.to_string(), salt ^ ((k as u64) << 20));
            let row = call_row(&rid, k as i64, &msgs, &answer, &prompt, &completion);
            if calls_w.push(row, 0).expect("push") {
                calls_w.publish().expect("publish");
            }
            n += 1;
            prompt.extend_from_slice(&completion);
            msgs.push(answer);
            if !last {
                let out = if k % 5 == 3 {
                    "Traceback (most recent call last):\n  File \"tests/test_parse.py\", line 12\nAssertionError: expected []".to_owned()
                } else {
                    format!("{{\"exit_code\": 0, \"output\": \"def parse(text):\\n    if not text: ...  # line {k}\\n1 passed\"}}")
                };
                let obs = json!({"role": "tool", "tool_call_id": format!("call_{r}_{k}"), "content": out});
                prompt.extend(tokens(&obs.to_string(), salt ^ 7));
                msgs.push(obs);
            }
        }
        let finish = RolloutRow {
            record_id: format!("fin-{r}"),
            rollout_id: rid,
            status: if r % 3 == 0 { "success" } else { "failure" }.into(),
            reward: Some(if r % 3 == 0 { 1.0 } else { 0.0 }),
            metadata: Some(
                json!({"group": format!("task-{}", r % 2000), "harness": "bench-agent"})
                    .to_string(),
            ),
            finished_at: 1_767_225_600_000_000 + r as i64,
            calls: turns as i64,
        };
        if rolls_w.push(finish, 0).expect("push") {
            rolls_w.publish().expect("publish");
        }
        r += 1;
    }
    calls_w.publish().expect("publish");
    rolls_w.publish().expect("publish");
    (n, r)
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let m = e.metadata().ok();
            match m {
                Some(m) if m.is_dir() => dir_bytes(&e.path()),
                Some(m) => m.len(),
                None => 0,
            }
        })
        .sum()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it with
    // no such flag: then do a quick smoke run.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let rows: usize = std::env::var("EXPORT_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 2_000 } else { 1_000_000 });
    let only = std::env::var("EXPORT_BENCH_SHAPE").ok();
    let base = std::env::var_os("EXPORT_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("rollcall-export-bench-{}", std::process::id()));
    for shape in ["many", "one"] {
        if only.as_deref().is_some_and(|o| o != shape) {
            continue;
        }
        run(shape, rows, &base.join(shape));
    }
    let _ = std::fs::remove_dir_all(&base);
}

fn run(shape: &str, rows: usize, base: &std::path::Path) {
    let cfg = ShardConfig {
        dir: base.join("shards"),
        ..ShardConfig::default()
    };
    reset_peak();
    let t = Instant::now();
    let (calls, rollouts) = if shape == "one" {
        generate_untagged(&cfg, rows)
    } else {
        generate(&cfg, rows)
    };
    let gen = t.elapsed().as_secs_f64();
    println!(
        "[{shape}] generate: {calls} call rows, {rollouts} rollouts, {:.1} MiB of shards in {gen:.1}s ({:.0} rows/s), peak RSS {:.0} MiB",
        dir_bytes(&cfg.dir) as f64 / (1 << 20) as f64,
        calls as f64 / gen,
        peak_rss_mib()
    );

    reset_peak();
    let t = Instant::now();
    let r =
        sft::export(&cfg.dir, &base.join("sft"), &sft::SftOptions::default()).expect("sft export");
    let s = t.elapsed().as_secs_f64();
    println!(
        "[{shape}] export sft: {} call rows -> {} samples ({} segments, {} mismatches) in {s:.1}s: {:.0} rows/s, peak RSS {:.0} MiB, output {:.1} MiB",
        r.calls,
        r.samples,
        r.segments,
        r.mismatches,
        r.calls as f64 / s,
        peak_rss_mib(),
        dir_bytes(&base.join("sft")) as f64 / (1 << 20) as f64
    );
    assert_eq!(r.calls, calls);
    let _ = std::fs::remove_dir_all(base.join("sft"));

    reset_peak();
    let t = Instant::now();
    // The `untagged` rollout has no finish row: keep its samples (reward 0).
    let opts = rl::RlOptions {
        missing_reward: rl::MissingReward::Zero,
        ..Default::default()
    };
    let r = rl::export(&cfg.dir, &base.join("rl"), &opts).expect("rl export");
    let s = t.elapsed().as_secs_f64();
    println!(
        "[{shape}] export rl:  {} call rows -> {} samples ({} segments, {} mismatches) in {s:.1}s: {:.0} rows/s, peak RSS {:.0} MiB, output {:.1} MiB",
        r.calls,
        r.samples,
        r.segments,
        r.mismatches,
        r.calls as f64 / s,
        peak_rss_mib(),
        dir_bytes(&base.join("rl")) as f64 / (1 << 20) as f64
    );
    assert_eq!(r.calls, calls);
    let _ = std::fs::remove_dir_all(base);
}
