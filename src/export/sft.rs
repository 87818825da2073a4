//! SFT export: one conversation per trajectory segment, in OpenAI chat
//! format with tools and a loss weight per message, as Parquet and JSONL.

use super::credit::{self, Signal, StepScores};
use super::read::{self, CallRec, RolloutInfo};
use super::trajectory::{self, content_text};
use super::{write_err, ExportError, Filters, MismatchLog, Report, SampleMeta};
use arrow::array::{
    Array, ArrayRef, Float32Array, Float64Array, Int64Array, ListArray, RecordBatch, StringArray,
    StructArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One tool call of a message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub kind: String,
    pub name: String,
    pub arguments: String,
}

/// One chat message, content as text.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    pub role: String,
    pub content: String,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    pub reasoning_content: Option<String>,
}

impl Msg {
    /// A normalized chat message (from the `messages` / `response_message` columns).
    pub fn from_value(v: &Value) -> Msg {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let tool_calls = v.get("tool_calls").and_then(Value::as_array).and_then(|a| {
            (!a.is_empty()).then(|| {
                a.iter()
                    .map(|c| {
                        let f = c.get("function").unwrap_or(c);
                        ToolCall {
                            id: c.get("id").and_then(Value::as_str).unwrap_or("").to_owned(),
                            kind: c
                                .get("type")
                                .and_then(Value::as_str)
                                .unwrap_or("function")
                                .to_owned(),
                            name: f
                                .get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                            arguments: match f.get("arguments") {
                                Some(Value::String(a)) => a.clone(),
                                None | Some(Value::Null) => "{}".to_owned(),
                                Some(a) => a.to_string(),
                            },
                        }
                    })
                    .collect()
            })
        });
        Msg {
            role: s("role").unwrap_or_else(|| "user".into()),
            content: content_text(v.get("content")),
            tool_calls,
            tool_call_id: s("tool_call_id"),
            reasoning_content: s("reasoning_content").filter(|r| !r.is_empty()),
        }
    }

    /// As a JSON object with every key present (null where absent), so
    /// readers infer one schema for all rows.
    pub fn to_value(&self, with_reasoning: bool) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), json!(self.role));
        m.insert("content".into(), json!(self.content));
        m.insert(
            "tool_calls".into(),
            match &self.tool_calls {
                Some(c) => Value::Array(
                    c.iter()
                        .map(|c| json!({"id": c.id, "type": c.kind, "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect(),
                ),
                None => Value::Null,
            },
        );
        m.insert("tool_call_id".into(), json!(self.tool_call_id));
        if with_reasoning {
            m.insert("reasoning_content".into(), json!(self.reasoning_content));
        }
        Value::Object(m)
    }
}

fn tool_call_type() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("type", DataType::Utf8, true),
        Field::new(
            "function",
            DataType::Struct(Fields::from(vec![
                Field::new("name", DataType::Utf8, true),
                Field::new("arguments", DataType::Utf8, true),
            ])),
            true,
        ),
    ]))
}

fn message_fields(with_reasoning: bool) -> Fields {
    let mut f = vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
        Field::new(
            "tool_calls",
            DataType::List(Arc::new(Field::new("item", tool_call_type(), true))),
            true,
        ),
        Field::new("tool_call_id", DataType::Utf8, true),
    ];
    if with_reasoning {
        f.push(Field::new("reasoning_content", DataType::Utf8, true));
    }
    Fields::from(f)
}

/// The Arrow type of a `messages` column: list<struct<role, content,
/// tool_calls: list<struct<id, type, function: struct<name, arguments>>>,
/// tool_call_id[, reasoning_content]>>.
pub fn messages_type(with_reasoning: bool) -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(message_fields(with_reasoning)),
        true,
    )))
}

fn offsets(lens: impl Iterator<Item = usize>) -> OffsetBuffer<i32> {
    OffsetBuffer::from_lengths(lens)
}

/// Build a `messages` column from rows of messages.
pub fn messages_array(rows: &[&[Msg]], with_reasoning: bool) -> ArrayRef {
    let all: Vec<&Msg> = rows.iter().flat_map(|r| r.iter()).collect();
    let calls: Vec<&ToolCall> = all
        .iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .collect();
    let function = StructArray::new(
        match tool_call_type() {
            DataType::Struct(f) => match &f[2].data_type() {
                DataType::Struct(ff) => ff.clone(),
                _ => Fields::empty(),
            },
            _ => Fields::empty(),
        },
        vec![
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.name))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                calls.iter().map(|c| &c.arguments),
            )),
        ],
        None,
    );
    let call_struct = StructArray::new(
        match tool_call_type() {
            DataType::Struct(f) => f,
            _ => Fields::empty(),
        },
        vec![
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.id))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.kind))),
            Arc::new(function),
        ],
        None,
    );
    let tool_calls = ListArray::new(
        Arc::new(Field::new("item", tool_call_type(), true)),
        offsets(
            all.iter()
                .map(|m| m.tool_calls.as_ref().map_or(0, Vec::len)),
        ),
        Arc::new(call_struct),
        Some(NullBuffer::from_iter(
            all.iter().map(|m| m.tool_calls.is_some()),
        )),
    );
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(all.iter().map(|m| &m.role))),
        Arc::new(StringArray::from_iter_values(
            all.iter().map(|m| &m.content),
        )),
        Arc::new(tool_calls),
        Arc::new(StringArray::from_iter(
            all.iter().map(|m| m.tool_call_id.as_deref()),
        )),
    ];
    if with_reasoning {
        cols.push(Arc::new(StringArray::from_iter(
            all.iter().map(|m| m.reasoning_content.as_deref()),
        )));
    }
    let msgs = StructArray::new(message_fields(with_reasoning), cols, None);
    Arc::new(ListArray::new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(message_fields(with_reasoning)),
            true,
        )),
        offsets(rows.iter().map(|r| r.len())),
        Arc::new(msgs),
        None,
    ))
}

/// Read a `messages` column back (Orchard import, tests).
pub fn messages_from_array(a: &dyn Array, row: usize) -> Option<Vec<Value>> {
    use arrow::array::AsArray;
    if a.is_null(row) {
        return None;
    }
    let list = a.as_list_opt::<i32>()?.value(row);
    let st = list.as_struct_opt()?;
    let field = |name: &str| st.column_by_name(name);
    let text = |c: Option<&ArrayRef>, i: usize| -> Value {
        match c {
            Some(c) if !c.is_null(i) => c
                .as_string_opt::<i32>()
                .map_or(Value::Null, |s| json!(s.value(i))),
            _ => Value::Null,
        }
    };
    let mut out = Vec::with_capacity(st.len());
    for i in 0..st.len() {
        let mut m = Map::new();
        m.insert("role".into(), text(field("role"), i));
        m.insert("content".into(), text(field("content"), i));
        if let Some(tc) = field("tool_calls").filter(|c| !c.is_null(i)) {
            let calls = tc.as_list_opt::<i32>().map(|l| l.value(i));
            if let Some(cs) = calls.as_ref().and_then(|c| c.as_struct_opt()) {
                let f = cs
                    .column_by_name("function")
                    .and_then(|f| f.as_struct_opt());
                let v: Vec<Value> = (0..cs.len())
                    .map(|j| {
                        json!({
                            "id": text(cs.column_by_name("id"), j),
                            "type": text(cs.column_by_name("type"), j),
                            "function": {
                                "name": f.map_or(Value::Null, |f| text(f.column_by_name("name"), j)),
                                "arguments": f.map_or(Value::Null, |f| text(f.column_by_name("arguments"), j)),
                            }
                        })
                    })
                    .collect();
                m.insert("tool_calls".into(), Value::Array(v));
            }
        }
        let id = text(field("tool_call_id"), i);
        if !id.is_null() {
            m.insert("tool_call_id".into(), id);
        }
        let r = text(field("reasoning_content"), i);
        if !r.is_null() {
            m.insert("reasoning_content".into(), r);
        }
        out.push(Value::Object(m));
    }
    Some(out)
}

/// One SFT sample.
#[derive(Debug, Clone, PartialEq)]
pub struct SftSample {
    pub sample_id: String,
    pub rollout_id: String,
    pub segment: i64,
    pub messages: Vec<Msg>,
    pub tools: Option<Value>,
    pub loss_weights: Vec<f32>,
    pub reward: Option<f64>,
    pub status: Option<String>,
    pub model: Option<String>,
    pub harness: Option<String>,
    pub rule: String,
    pub group: String,
    /// Sequences of the calls the segment was rebuilt from.
    pub sequences: Vec<i64>,
}

/// SFT options.
#[derive(Debug, Clone, Default)]
pub struct SftOptions {
    pub filters: Filters,
    pub step_scores: Option<StepScores>,
    pub truncate_failed: Option<Signal>,
    pub group_by: Option<String>,
}

/// Build a rollout's SFT samples, counting into `report`.
pub fn rollout_samples(
    calls: &[CallRec],
    info: Option<&RolloutInfo>,
    opts: &SftOptions,
    report: &mut Report,
    mismatches: &mut Vec<trajectory::Mismatch>,
) -> Vec<SftSample> {
    report.rollouts += 1;
    let ok: Vec<&CallRec> = calls.iter().filter(|c| c.status == "ok").collect();
    report.skipped_not_ok += calls.len() - ok.len();
    let failed: Vec<i64> = calls
        .iter()
        .filter(|c| c.status == "failed")
        .map(|c| c.sequence)
        .collect();
    let (turns, segs) = trajectory::rebuild(&ok, true, mismatches);
    report.segments += segs.len();
    let rollout_id = calls.first().map_or("", |c| c.rollout_id.as_str());
    let group = super::group_of(rollout_id, info, opts.group_by.as_deref());
    let unresolved = credit::unresolved(info);
    let mut out = vec![];
    for seg in &segs {
        let seg_calls: Vec<&CallRec> = seg.turns.iter().map(|&k| turns[k].call).collect();
        let meta = SampleMeta::of(&seg_calls, info);
        if !opts.filters.keep(&meta) {
            report.filtered += 1;
            continue;
        }
        let (mut msgs, mut origin) = trajectory::conversation(&turns, seg);
        let mut rule = vec![];
        if let (Some(sig), true) = (opts.truncate_failed, unresolved) {
            let first = seg_calls.first().map_or(0, |c| c.sequence);
            if let Some(keep) = credit::truncation(&msgs, &origin, sig, &failed, first) {
                if keep == 0
                    || !msgs[..keep]
                        .iter()
                        .any(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                {
                    report.dropped_by_truncation += 1;
                    continue;
                }
                if keep < msgs.len() {
                    msgs.truncate(keep);
                    origin.truncate(keep);
                    report.truncated += 1;
                    rule.push(format!("truncated:{}", sig.name()));
                }
            }
        }
        let (weights, scored) =
            credit::loss_weights(&msgs, &origin, rollout_id, opts.step_scores.as_ref());
        if scored {
            rule.insert(0, "step_scores".into());
        }
        let rule = if rule.is_empty() {
            "full".to_owned()
        } else {
            rule.join("+")
        };
        *report.rules.entry(rule.clone()).or_default() += 1;
        let last = seg_calls.last();
        let tools = last
            .and_then(|c| c.tools.as_deref())
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
            .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
        out.push(SftSample {
            sample_id: format!("{rollout_id}:{}", seg.index),
            rollout_id: rollout_id.to_owned(),
            segment: seg.index as i64,
            messages: msgs.iter().map(Msg::from_value).collect(),
            tools,
            loss_weights: weights,
            reward: meta.reward,
            status: meta.status,
            model: meta.model,
            harness: meta.harness,
            rule,
            group: group.clone(),
            sequences: seg_calls.iter().map(|c| c.sequence).collect(),
        });
    }
    out
}

fn sft_schema() -> SchemaRef {
    let f = |n: &str, t: DataType| Field::new(n, t, true);
    Arc::new(Schema::new(vec![
        Field::new("sample_id", DataType::Utf8, false),
        Field::new("rollout_id", DataType::Utf8, false),
        Field::new("segment", DataType::Int64, false),
        f("messages", messages_type(true)),
        f("tools", DataType::Utf8),
        f(
            "loss_weights",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
        ),
        f("reward", DataType::Float64),
        f("status", DataType::Utf8),
        f("model", DataType::Utf8),
        f("harness", DataType::Utf8),
        Field::new("rule", DataType::Utf8, false),
        Field::new("group", DataType::Utf8, false),
        f(
            "sequences",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
        ),
    ]))
}

fn sft_batch(rows: &[SftSample]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let strs = |it: Vec<Option<&str>>| Arc::new(StringArray::from(it)) as ArrayRef;
    let msgs: Vec<&[Msg]> = rows.iter().map(|r| r.messages.as_slice()).collect();
    let weights = Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        offsets(rows.iter().map(|r| r.loss_weights.len())),
        Arc::new(Float32Array::from_iter_values(
            rows.iter().flat_map(|r| r.loss_weights.iter().copied()),
        )),
        None,
    ));
    let seqs = Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Int64, true)),
        offsets(rows.iter().map(|r| r.sequences.len())),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().flat_map(|r| r.sequences.iter().copied()),
        )),
        None,
    ));
    let tools: Vec<Option<String>> = rows
        .iter()
        .map(|r| r.tools.as_ref().map(Value::to_string))
        .collect();
    RecordBatch::try_new(
        sft_schema(),
        vec![
            strs(rows.iter().map(|r| Some(r.sample_id.as_str())).collect()),
            strs(rows.iter().map(|r| Some(r.rollout_id.as_str())).collect()),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.segment))),
            messages_array(&msgs, true),
            strs(tools.iter().map(|t| t.as_deref()).collect()),
            weights,
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.reward))),
            strs(rows.iter().map(|r| r.status.as_deref()).collect()),
            strs(rows.iter().map(|r| r.model.as_deref()).collect()),
            strs(rows.iter().map(|r| r.harness.as_deref()).collect()),
            strs(rows.iter().map(|r| Some(r.rule.as_str())).collect()),
            strs(rows.iter().map(|r| Some(r.group.as_str())).collect()),
            seqs,
        ],
    )
}

fn sft_json(r: &SftSample) -> Value {
    json!({
        "sample_id": r.sample_id,
        "rollout_id": r.rollout_id,
        "segment": r.segment,
        "messages": r.messages.iter().map(|m| m.to_value(true)).collect::<Vec<_>>(),
        "tools": r.tools,
        "loss_weights": r.loss_weights,
        "reward": r.reward,
        "status": r.status,
        "model": r.model,
        "harness": r.harness,
        "rule": r.rule,
        "group": r.group,
        "sequences": r.sequences,
    })
}

/// Parquet writer properties for exports: zstd, no per-run metadata.
pub(crate) fn writer_props() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(8192))
        .set_max_row_group_bytes(Some(64 << 20))
        .build()
}

/// A Parquet file written batch by batch.
pub(crate) struct ParquetOut {
    pub path: PathBuf,
    w: ArrowWriter<std::fs::File>,
}

impl ParquetOut {
    pub fn create(path: PathBuf, schema: SchemaRef) -> Result<ParquetOut, ExportError> {
        let f = std::fs::File::create(&path).map_err(|e| write_err(&path, e))?;
        let w = ArrowWriter::try_new(f, schema, Some(writer_props()))
            .map_err(|e| write_err(&path, e))?;
        Ok(ParquetOut { path, w })
    }

    pub fn write(&mut self, b: &RecordBatch) -> Result<(), ExportError> {
        self.w.write(b).map_err(|e| write_err(&self.path, e))
    }

    pub fn close(self) -> Result<(), ExportError> {
        self.w.close().map_err(|e| write_err(&self.path, e))?;
        Ok(())
    }
}

/// Writes SFT samples to `sft.parquet` and `sft.jsonl`.
pub struct SftWriter {
    pq: ParquetOut,
    jsonl: std::io::BufWriter<std::fs::File>,
    jsonl_path: PathBuf,
    pending: Vec<SftSample>,
}

impl SftWriter {
    pub fn create(out: &Path) -> Result<SftWriter, ExportError> {
        let jsonl_path = out.join("sft.jsonl");
        let f = std::fs::File::create(&jsonl_path).map_err(|e| write_err(&jsonl_path, e))?;
        Ok(SftWriter {
            pq: ParquetOut::create(out.join("sft.parquet"), sft_schema())?,
            jsonl: std::io::BufWriter::new(f),
            jsonl_path,
            pending: vec![],
        })
    }

    pub fn push(&mut self, s: SftSample) -> Result<(), ExportError> {
        let line =
            serde_json::to_string(&sft_json(&s)).map_err(|e| write_err(&self.jsonl_path, e))?;
        writeln!(self.jsonl, "{line}").map_err(|e| write_err(&self.jsonl_path, e))?;
        self.pending.push(s);
        if self.pending.len() >= 256 {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let b = sft_batch(&self.pending).map_err(|e| write_err(&self.pq.path, e))?;
        self.pending.clear();
        self.pq.write(&b)
    }

    pub fn finish(mut self) -> Result<Vec<String>, ExportError> {
        self.flush()?;
        self.jsonl
            .into_inner()
            .map_err(|e| write_err(&self.jsonl_path, e.error()))?;
        self.pq.close()?;
        Ok(vec!["sft.parquet".into(), "sft.jsonl".into()])
    }
}

/// `rollcall export sft`.
pub fn export(shards: &Path, out: &Path, opts: &SftOptions) -> Result<Report, ExportError> {
    super::prepare_out(out)?;
    let rollouts = read::read_rollouts(shards)?;
    let mut report = Report {
        kind: "sft".into(),
        ..Default::default()
    };
    let mut log = MismatchLog::create(out, "sft")?;
    let mut w = SftWriter::create(out)?;
    let mut mm = vec![];
    let pass = super::Pass {
        label: "export sft",
        group_by: opts.group_by.as_deref(),
        tokens_only: false,
    };
    report.calls = super::each_rollout(shards, out, &rollouts, &pass, |calls, info| {
        for s in rollout_samples(calls, info, opts, &mut report, &mut mm) {
            report.samples += 1;
            w.push(s)?;
        }
        log.write(&mm)?;
        mm.clear();
        Ok(())
    })?;
    report.mismatches = log.count;
    log.finish()?;
    report.files = w.finish()?;
    report.files.push("sft_mismatches.jsonl".into());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_column_round_trips() {
        let v = [
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
            json!({"role": "assistant", "content": null, "reasoning_content": "think",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c", "content": "x"}),
        ];
        let msgs: Vec<Msg> = v.iter().map(Msg::from_value).collect();
        assert_eq!(msgs[0].content, "hi");
        assert_eq!(msgs[1].content, "");
        let a = messages_array(&[&msgs, &[]], true);
        let back = messages_from_array(a.as_ref(), 0).expect("row");
        let again: Vec<Msg> = back.iter().map(Msg::from_value).collect();
        assert_eq!(again, msgs);
        assert_eq!(messages_from_array(a.as_ref(), 1), Some(vec![]));
    }
}
