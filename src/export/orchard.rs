//! Microsoft Orchard `swe` schema, both ways.
//!
//! Orchard's `swe` config (huggingface.co/datasets/microsoft/Orchard,
//! README `dataset_info`) has three columns: `messages`
//! (list<struct<role, content, tool_call_id, tool_calls: list<struct<id,
//! type, function: struct<name, arguments>>>>>), `tools` (string: a JSON
//! array) and `metadata` (string: a JSON object carrying `verify_status`,
//! among others).
//!
//! - import: each row becomes a rollout; one call per assistant message
//!   (request = the messages before it, response = it), and a finish row
//!   with reward 1.0 when `verify_status` is `success` (else 0.0), status
//!   `success` / `failure`, and the row's metadata kept as is.
//! - export: one row per trajectory segment; the metadata is the rollout's
//!   finish metadata plus `rollout_id`, `segment`, `reward`, `status`,
//!   `model` and `verify_status` (kept when present, else `success` for a
//!   resolved rollout and `failure` otherwise).

use super::parquet_out::ParquetOut;
use super::read::{self, RolloutInfo};
use super::sft::messages::{messages_array, messages_from_array, messages_type, Msg};
use super::sft::SftOptions;
use super::{credit, write_err, ExportError, Filters, MismatchLog, Report};
use crate::config::ShardConfig;
use crate::record::shard::ShardWriter;
use crate::record::{CallRow, RolloutRow};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Map, Value};
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

/// One Orchard row.
#[derive(Debug, Clone, PartialEq)]
pub struct OrchardRow {
    pub messages: Vec<Value>,
    pub tools: Option<String>,
    pub metadata: Option<String>,
}

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("messages", messages_type(false), true),
        Field::new("tools", DataType::Utf8, true),
        Field::new("metadata", DataType::Utf8, true),
    ]))
}

pub fn batch(rows: &[OrchardRow]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let msgs: Vec<Vec<Msg>> = rows
        .iter()
        .map(|r| r.messages.iter().map(Msg::from_value).collect())
        .collect();
    let refs: Vec<&[Msg]> = msgs.iter().map(Vec::as_slice).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            messages_array(&refs, false),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.tools.as_deref()),
            )) as ArrayRef,
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.metadata.as_deref()),
            )),
        ],
    )
}

/// Read an Orchard file (`.parquet`, or JSON lines otherwise).
pub fn read_rows(
    path: &Path,
    mut each: impl FnMut(usize, OrchardRow) -> Result<(), ExportError>,
) -> Result<usize, ExportError> {
    let name = path.display().to_string();
    let bad = |row: usize, why: String| ExportError::Input {
        file: name.clone(),
        row,
        why,
    };
    let file = std::fs::File::open(path).map_err(|e| ExportError::Io(format!("{name}: {e}")))?;
    let mut n = 0;
    if path.extension().is_some_and(|e| e == "parquet") {
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.with_batch_size(256).build())
            .map_err(|e| bad(0, e.to_string()))?;
        for b in reader {
            let b = b.map_err(|e| bad(n, e.to_string()))?;
            let Some(m) = b.column_by_name("messages") else {
                return Err(bad(n, "no messages column".into()));
            };
            let text = |c: &str, i: usize| -> Option<String> {
                let c = b.column_by_name(c)?;
                (!c.is_null(i)).then(|| c.as_string_opt::<i32>().map(|s| s.value(i).to_owned()))?
            };
            for i in 0..b.num_rows() {
                let messages = messages_from_array(m.as_ref(), i)
                    .ok_or_else(|| bad(n, "messages is not a list of messages".into()))?;
                each(
                    n,
                    OrchardRow {
                        messages,
                        tools: text("tools", i),
                        metadata: text("metadata", i),
                    },
                )?;
                n += 1;
            }
        }
        return Ok(n);
    }
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|e| bad(n, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| bad(n, e.to_string()))?;
        let messages = v
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .ok_or_else(|| bad(n, "no messages array".into()))?;
        let as_text = |v: Option<&Value>| match v {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => Some(v.to_string()),
        };
        each(
            n,
            OrchardRow {
                messages,
                tools: as_text(v.get("tools")),
                metadata: as_text(v.get("metadata")),
            },
        )?;
        n += 1;
    }
    Ok(n)
}

fn verified(meta: &Map<String, Value>) -> bool {
    match meta.get("verify_status") {
        Some(Value::String(s)) => s.eq_ignore_ascii_case("success"),
        Some(Value::Bool(b)) => *b,
        _ => false,
    }
}

/// The rows one Orchard row becomes: its calls and its finish row.
pub fn to_rollout(row: &OrchardRow, rollout_id: &str, now: i64) -> (Vec<CallRow>, RolloutRow) {
    let meta: Map<String, Value> = row
        .metadata
        .as_deref()
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default();
    let model = meta
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("orchard")
        .to_owned();
    let tools: Option<Value> = row
        .tools
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .filter(Value::is_array);
    let mut calls = vec![];
    for (i, m) in row.messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let history = Value::Array(row.messages[..i].to_vec());
        let mut req = json!({"model": model, "messages": history});
        if let Some(t) = &tools {
            req["tools"] = t.clone();
        }
        let tool_calls = m
            .get("tool_calls")
            .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
        let response = json!({"object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": m, "finish_reason": if tool_calls.is_some() {"tool_calls"} else {"stop"}}]});
        let seq = calls.len() as i64;
        calls.push(CallRow {
            replica: None,
            policy_version: None,
            policy_version_end: None,
            resent: 0,
            continued: Vec::new(),
            attempt: 0,
            attempt_of: None,
            side_call: false,
            repinned: false,
            call_id: uuid::Uuid::now_v7().to_string(),
            rollout_id: rollout_id.to_owned(),
            sequence: seq,
            wire_api: "chat_completions".into(),
            route: Some("orchard-import".into()),
            model: Some(model.clone()),
            upstream_model: None,
            stream: false,
            status: "ok".into(),
            http_status: Some(200),
            failure_class: None,
            failure_message: None,
            request: req.to_string(),
            upstream_request: None,
            response: Some(response.to_string()),
            response_raw: None,
            messages: Some(history.to_string()),
            tools: tools.as_ref().map(Value::to_string),
            response_message: Some(m.to_string()),
            tool_calls: tool_calls.map(Value::to_string),
            finish_reason: Some(
                if tool_calls.is_some() {
                    "tool_calls"
                } else {
                    "stop"
                }
                .into(),
            ),
            received_at: now,
            first_byte_at: None,
            done_at: Some(now),
            prompt_tokens: None,
            completion_tokens: None,
            total_tokens: None,
            cached_tokens: None,
            reasoning_tokens: None,
            token_capture: "none".into(),
            prompt_token_ids: None,
            completion_token_ids: None,
            prompt_logprobs: None,
            completion_logprobs: None,
            user_agent: Some("rollcall-import/orchard".into()),
            upstream_api: None,
            upstream_response_raw: None,
        });
    }
    let ok = verified(&meta);
    let finish = RolloutRow {
        record_id: uuid::Uuid::now_v7().to_string(),
        rollout_id: rollout_id.to_owned(),
        status: if ok { "success" } else { "failure" }.into(),
        reward: Some(if ok { 1.0 } else { 0.0 }),
        metadata: row.metadata.clone(),
        finished_at: now,
        calls: calls.len() as i64,
    };
    (calls, finish)
}

/// The rollout id of an imported row: `metadata.rollout_id` (with
/// `-s<segment>` for a later segment) when present, else `orchard-<stem>-<row>`.
fn import_id(row: &OrchardRow, stem: &str, n: usize) -> String {
    let meta: Option<Value> = row
        .metadata
        .as_deref()
        .and_then(|m| serde_json::from_str(m).ok());
    let rid = meta
        .as_ref()
        .and_then(|m| m.get("rollout_id"))
        .and_then(Value::as_str);
    let seg = meta
        .as_ref()
        .and_then(|m| m.get("segment"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    match rid {
        Some(r) if seg > 0 => format!("{r}-s{seg}"),
        Some(r) => r.to_owned(),
        None => format!("orchard-{stem}-{n:06}"),
    }
}

/// What an import wrote.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Imported {
    pub rollouts: usize,
    pub calls: usize,
}

/// `rollcall import orchard`: rows of `input` into shards under `shards`.
pub fn import(input: &Path, shards: &Path) -> Result<Imported, ExportError> {
    let cfg = ShardConfig {
        dir: shards.to_path_buf(),
        ..ShardConfig::default()
    };
    let werr = |e: &dyn std::fmt::Display| write_err(shards, e);
    let mut calls_w = ShardWriter::<CallRow>::new(&cfg).map_err(|e| werr(&e))?;
    let mut rolls_w = ShardWriter::<RolloutRow>::new(&cfg).map_err(|e| werr(&e))?;
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut done = Imported::default();
    let now = crate::now_micros();
    read_rows(input, |n, row| {
        let id = import_id(&row, &stem, n);
        let (calls, finish) = to_rollout(&row, &id, now);
        for c in calls {
            if calls_w.push(c, 0).map_err(|e| werr(&e))? {
                calls_w.publish().map_err(|e| werr(&e))?;
            }
            done.calls += 1;
        }
        if rolls_w.push(finish, 0).map_err(|e| werr(&e))? {
            rolls_w.publish().map_err(|e| werr(&e))?;
        }
        done.rollouts += 1;
        Ok(())
    })?;
    calls_w.publish().map_err(|e| werr(&e))?;
    rolls_w.publish().map_err(|e| werr(&e))?;
    Ok(done)
}

/// The metadata of an exported row.
fn export_metadata(s: &super::sft::SftSample, info: Option<&RolloutInfo>) -> String {
    let mut m: Map<String, Value> = info
        .and_then(|i| i.metadata.as_deref())
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default();
    if !m.contains_key("verify_status") {
        let status = if credit::unresolved(info) {
            "failure"
        } else {
            "success"
        };
        m.insert("verify_status".into(), json!(status));
    }
    m.insert("rollout_id".into(), json!(s.rollout_id));
    m.insert("segment".into(), json!(s.segment));
    m.insert("reward".into(), json!(s.reward));
    m.insert("status".into(), json!(s.status));
    if !m.contains_key("model") {
        m.insert("model".into(), json!(s.model));
    }
    Value::Object(m).to_string()
}

/// `rollcall export orchard`: writes `OUT/orchard.parquet`.
pub fn export(shards: &Path, out: &Path, filters: &Filters) -> Result<Report, ExportError> {
    super::prepare_out(out)?;
    let rollouts = read::read_rollouts_at(shards, filters.reward_revision)?;
    let mut report = Report {
        kind: "orchard".into(),
        ..Default::default()
    };
    let opts = SftOptions {
        filters: filters.clone(),
        ..Default::default()
    };
    let mut log = MismatchLog::create(out, "orchard")?;
    let mut w = ParquetOut::create(out.join("orchard.parquet"), schema())?;
    let mut pending = vec![];
    let mut mm = vec![];
    let pass = super::Pass {
        label: "export orchard",
        group_by: None,
        tokens_only: false,
        keep_side_calls: opts.filters.include_side_calls,
    };
    report.calls = super::each_rollout(shards, out, &rollouts, &pass, |calls, info| {
        for s in super::sft::rollout_samples(calls, info, &opts, &mut report, &mut mm) {
            report.samples += 1;
            pending.push(OrchardRow {
                messages: s.messages.iter().map(|m| m.to_value(false)).collect(),
                tools: s.tools.as_ref().map(Value::to_string),
                metadata: Some(export_metadata(&s, info)),
            });
        }
        if pending.len() >= 256 {
            w.write(&batch(&pending).map_err(|e| write_err(&w.path, e))?)?;
            pending.clear();
        }
        log.write(&mm)?;
        mm.clear();
        Ok(())
    })?;
    if !pending.is_empty() {
        w.write(&batch(&pending).map_err(|e| write_err(&w.path, e))?)?;
    }
    w.close()?;
    report.mismatches = log.count;
    log.finish()?;
    report.files = vec!["orchard.parquet".into(), "orchard_mismatches.jsonl".into()];
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> OrchardRow {
        OrchardRow {
            messages: vec![
                json!({"role": "system", "content": "You are a SWE agent."}),
                json!({"role": "user", "content": "Fix the bug in foo.py"}),
                json!({"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"cat foo.py\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "call_1", "content": "def foo(): return 1"}),
                json!({"role": "assistant", "content": "Fixed."}),
            ],
            tools: Some(r#"[{"type":"function","function":{"name":"bash","parameters":{"type":"object"}}}]"#.into()),
            metadata: Some(r#"{"instance_id":"x__y-1","verify_status":"success"}"#.into()),
        }
    }

    #[test]
    fn orchard_round_trip_through_shards() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("in.parquet");
        let mut w = ParquetOut::create(input.clone(), schema()).expect("create");
        let mut failing = row();
        failing.metadata = Some(r#"{"instance_id":"x__y-2","verify_status":"failed"}"#.into());
        w.write(&batch(&[row(), failing]).expect("batch"))
            .expect("write");
        w.close().expect("close");

        let shards = dir.path().join("shards");
        let got = import(&input, &shards).expect("import");
        assert_eq!(
            got,
            Imported {
                rollouts: 2,
                calls: 4
            }
        );
        let rolls = read::read_rollouts(&shards).expect("rollouts");
        let r0 = &rolls["orchard-in-000000"];
        assert_eq!((r0.status.as_str(), r0.reward), ("success", Some(1.0)));
        assert_eq!(rolls["orchard-in-000001"].reward, Some(0.0));

        let out = dir.path().join("out");
        let rep = export(&shards, &out, &Filters::default()).expect("export");
        assert_eq!((rep.samples, rep.mismatches), (2, 0));
        let mut rows = vec![];
        read_rows(&out.join("orchard.parquet"), |_, r| {
            rows.push(r);
            Ok(())
        })
        .expect("read back");
        rows.sort_by_key(|r| r.metadata.clone());
        let orig = row();
        let norm = |v: &[Value]| v.iter().map(Msg::from_value).collect::<Vec<_>>();
        assert_eq!(norm(&rows[0].messages), norm(&orig.messages));
        assert_eq!(
            rows[0]
                .tools
                .as_deref()
                .map(|t| serde_json::from_str::<Value>(t).ok()),
            orig.tools
                .as_deref()
                .map(|t| serde_json::from_str::<Value>(t).ok())
        );
        let meta: Value =
            serde_json::from_str(rows[0].metadata.as_deref().unwrap_or("{}")).expect("json");
        assert_eq!(meta["verify_status"], "success");
        assert_eq!(meta["instance_id"], "x__y-1");
        assert_eq!(meta["reward"], 1.0);
        let meta1: Value =
            serde_json::from_str(rows[1].metadata.as_deref().unwrap_or("{}")).expect("json");
        assert_eq!(meta1["verify_status"], "failed");

        // Exporting the imported shards again in Orchard form and importing
        // that gives the same rows (ids come from metadata.rollout_id now).
        let shards2 = dir.path().join("shards2");
        import(&out.join("orchard.parquet"), &shards2).expect("re-import");
        let out2 = dir.path().join("out2");
        export(&shards2, &out2, &Filters::default()).expect("re-export");
        let mut rows2 = vec![];
        read_rows(&out2.join("orchard.parquet"), |_, r| {
            rows2.push(r);
            Ok(())
        })
        .expect("read back");
        rows2.sort_by_key(|r| r.metadata.clone());
        assert_eq!(rows2, rows);
    }

    #[test]
    fn jsonl_rows_and_bad_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("in.jsonl");
        let r = row();
        let line = json!({"messages": r.messages, "tools": serde_json::from_str::<Value>(r.tools.as_deref().unwrap_or("[]")).ok(), "metadata": {"verify_status": "success"}});
        std::fs::write(&p, format!("{line}\n{{\"nope\": 1}}\n")).expect("write");
        let err = import(&p, &dir.path().join("s")).expect_err("row 1 has no messages");
        assert!(err.to_string().contains("row 1"), "{err}");
    }
}
