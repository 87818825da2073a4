//! SFT export: one conversation per trajectory segment, in OpenAI chat
//! format with tools and a loss weight per message, as Parquet and JSONL
//! (`--trainer generic`) or as native nested Parquet for verl
//! (`--trainer verl`), plus the token-exact form (`sft_tokens`) where calls
//! captured token ids.

use super::credit::{self, Signal, StepScores};
use super::native::{self, json_field};
use super::parquet_out::{list_of, ParquetOut};
use super::read::{self, CallRec, RolloutInfo};
use super::sft_tokens::{self, TokenWriter};
use super::trajectory::{self, content_text};
use super::{write_err, ExportError, Filters, MismatchLog, Report, SampleMeta};
use arrow::array::{
    Array, ArrayRef, Float32Array, Float64Array, Int64Array, ListArray, RecordBatch, StringArray,
    StructArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
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

/// How `tool_calls[].function.arguments` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Arguments {
    /// The parsed JSON value: `arrow.json` text in Parquet, a native value
    /// in JSONL and for verl. Arguments that are not valid JSON stay the
    /// model's string (a JSON string value) and are counted.
    #[default]
    Object,
    /// The JSON string as the model produced it.
    String,
}

/// The files `export sft` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SftTrainer {
    /// OUT/sft.parquet (tools and arguments as `arrow.json`) and OUT/sft.jsonl.
    #[default]
    Generic,
    /// OUT/verl/sft-00000.parquet, …: messages and tools as native nested
    /// columns, one file per distinct Arrow type (verl's MultiTurnSFTDataset).
    Verl,
}

impl ToolCall {
    /// The arguments as a JSON value, and whether they were valid JSON
    /// (if not: the model's string as a JSON string).
    pub fn arguments_value(&self) -> (Value, bool) {
        match serde_json::from_str::<Value>(&self.arguments) {
            Ok(v) => (v, true),
            Err(_) => (Value::String(self.arguments.clone()), false),
        }
    }

    /// The `arrow.json` text of the arguments in object mode: the model's
    /// text when it is JSON, else the model's string as a JSON string.
    pub fn arguments_json_text(&self) -> String {
        match serde_json::from_str::<Value>(&self.arguments) {
            Ok(_) => self.arguments.clone(),
            Err(_) => Value::String(self.arguments.clone()).to_string(),
        }
    }
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
        self.to_value_with(with_reasoning, Arguments::String)
    }

    /// As [`Msg::to_value`], arguments written as `args` says.
    pub fn to_value_with(&self, with_reasoning: bool, args: Arguments) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), json!(self.role));
        m.insert("content".into(), json!(self.content));
        m.insert(
            "tool_calls".into(),
            match &self.tool_calls {
                Some(c) => Value::Array(
                    c.iter()
                        .map(|c| {
                            let a = match args {
                                Arguments::Object => c.arguments_value().0,
                                Arguments::String => json!(c.arguments),
                            };
                            json!({"id": c.id, "type": c.kind, "function": {"name": c.name, "arguments": a}})
                        })
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

fn function_fields(args: Arguments) -> Fields {
    Fields::from(vec![
        Field::new("name", DataType::Utf8, true),
        match args {
            Arguments::Object => json_field("arguments", true),
            Arguments::String => Field::new("arguments", DataType::Utf8, true),
        },
    ])
}

fn tool_call_fields(args: Arguments) -> Fields {
    Fields::from(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("type", DataType::Utf8, true),
        Field::new("function", DataType::Struct(function_fields(args)), true),
    ])
}

fn message_fields(with_reasoning: bool, args: Arguments) -> Fields {
    let mut f = vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
        Field::new(
            "tool_calls",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(tool_call_fields(args)),
                true,
            ))),
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
    messages_type_with(with_reasoning, Arguments::String)
}

/// As [`messages_type`], `arguments` typed as `args` says (`arrow.json` for objects).
pub fn messages_type_with(with_reasoning: bool, args: Arguments) -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(message_fields(with_reasoning, args)),
        true,
    )))
}

fn offsets(lens: impl Iterator<Item = usize>) -> OffsetBuffer<i32> {
    OffsetBuffer::from_lengths(lens)
}

/// Build a `messages` column from rows of messages.
pub fn messages_array(rows: &[&[Msg]], with_reasoning: bool) -> ArrayRef {
    messages_array_with(rows, with_reasoning, Arguments::String)
}

/// As [`messages_array`], arguments written as `args` says.
pub fn messages_array_with(rows: &[&[Msg]], with_reasoning: bool, args: Arguments) -> ArrayRef {
    let all: Vec<&Msg> = rows.iter().flat_map(|r| r.iter()).collect();
    let calls: Vec<&ToolCall> = all
        .iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .collect();
    let arguments: Vec<String> = match args {
        Arguments::Object => calls.iter().map(|c| c.arguments_json_text()).collect(),
        Arguments::String => calls.iter().map(|c| c.arguments.clone()).collect(),
    };
    let function = StructArray::new(
        function_fields(args),
        vec![
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.name))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(arguments)),
        ],
        None,
    );
    let call_struct = StructArray::new(
        tool_call_fields(args),
        vec![
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.id))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.kind))),
            Arc::new(function),
        ],
        None,
    );
    let tool_calls = ListArray::new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(tool_call_fields(args)),
            true,
        )),
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
    let msgs = StructArray::new(message_fields(with_reasoning, args), cols, None);
    Arc::new(ListArray::new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(message_fields(with_reasoning, args)),
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
    /// `tools` exactly as the call recorded it.
    pub tools_text: Option<String>,
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
    pub arguments: Arguments,
    pub trainer: SftTrainer,
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
        let tools_text = last
            .and_then(|c| c.tools.as_deref())
            .and_then(|t| Some((serde_json::from_str::<Value>(t).ok()?, t)))
            .filter(|(t, _)| t.as_array().is_some_and(|a| !a.is_empty()));
        let (tools, tools_text) = match tools_text {
            Some((v, t)) => (Some(v), Some(t.to_owned())),
            None => (None, None),
        };
        out.push(SftSample {
            sample_id: format!("{rollout_id}:{}", seg.index),
            rollout_id: rollout_id.to_owned(),
            segment: seg.index as i64,
            messages: msgs.iter().map(Msg::from_value).collect(),
            tools,
            tools_text,
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

/// The counts only `export sft` has, in `OUT/sft_report.json`.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct SftCounts {
    /// `--arguments`: `object` or `string`.
    pub arguments: String,
    /// `--trainer`: `generic` or `verl`.
    pub trainer: String,
    /// Tool calls of the exported samples whose arguments are not valid
    /// JSON (kept as the model's string).
    pub arguments_not_json: usize,
    /// Rows of `sft_tokens.parquet`.
    pub token_samples: usize,
    /// Segments rebuilt from the calls with token ids.
    pub token_segments: usize,
    /// Token segments dropped by the filters.
    pub token_filtered: usize,
    /// Token samples cut by `--truncate-failed`.
    pub token_truncated: usize,
    /// Token segments dropped by `--truncate-failed` (no step of theirs before the signal).
    pub token_dropped_by_truncation: usize,
    /// SFT samples with a call that has no token ids (so not, or not
    /// wholly, in `sft_tokens.parquet`).
    pub samples_without_token_ids: usize,
    /// `--trainer verl`: rows written under `verl/`.
    pub verl_samples: usize,
    /// `--trainer verl`: files written (one per distinct Arrow type).
    pub verl_files: usize,
    /// `--trainer verl`: rows whose tool-call arguments were written as
    /// strings, because as objects they would not read back exactly (calls
    /// whose arguments have different keys or types within one row).
    pub verl_arguments_as_string: usize,
    /// `--trainer verl`: rows left out, because their tools (or messages)
    /// have no exact native Arrow form (e.g. tools whose parameters differ
    /// within one row would gain each other's keys as nulls).
    pub verl_skipped: usize,
}

/// The columns of every SFT file after `messages` and `tools`.
fn meta_fields() -> Vec<Field> {
    let f = |n: &str, t: DataType| Field::new(n, t, true);
    vec![
        f("loss_weights", list_of(DataType::Float32)),
        f("reward", DataType::Float64),
        f("status", DataType::Utf8),
        f("model", DataType::Utf8),
        f("harness", DataType::Utf8),
        Field::new("rule", DataType::Utf8, false),
        Field::new("group", DataType::Utf8, false),
        f("sequences", list_of(DataType::Int64)),
    ]
}

fn schema_with(messages: DataType, tools: Field) -> SchemaRef {
    let mut f = vec![
        Field::new("sample_id", DataType::Utf8, false),
        Field::new("rollout_id", DataType::Utf8, false),
        Field::new("segment", DataType::Int64, false),
        Field::new("messages", messages, true),
        tools,
    ];
    f.extend(meta_fields());
    Arc::new(Schema::new(f))
}

/// The schema of `sft.parquet`.
pub fn sft_schema(args: Arguments) -> SchemaRef {
    schema_with(messages_type_with(true, args), json_field("tools", true))
}

fn batch_with(
    schema: SchemaRef,
    rows: &[&SftSample],
    messages: ArrayRef,
    tools: ArrayRef,
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let strs = |it: Vec<Option<&str>>| Arc::new(StringArray::from(it)) as ArrayRef;
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
    RecordBatch::try_new(
        schema,
        vec![
            strs(rows.iter().map(|r| Some(r.sample_id.as_str())).collect()),
            strs(rows.iter().map(|r| Some(r.rollout_id.as_str())).collect()),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.segment))),
            messages,
            tools,
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

fn sft_batch(rows: &[SftSample], args: Arguments) -> Result<RecordBatch, arrow::error::ArrowError> {
    let refs: Vec<&SftSample> = rows.iter().collect();
    let msgs: Vec<&[Msg]> = rows.iter().map(|r| r.messages.as_slice()).collect();
    let tools = Arc::new(StringArray::from_iter(
        rows.iter().map(|r| r.tools_text.as_deref()),
    ));
    batch_with(
        sft_schema(args),
        &refs,
        messages_array_with(&msgs, true, args),
        tools,
    )
}

fn sft_json(r: &SftSample, args: Arguments) -> Value {
    json!({
        "sample_id": r.sample_id,
        "rollout_id": r.rollout_id,
        "segment": r.segment,
        "messages": r.messages.iter().map(|m| m.to_value_with(true, args)).collect::<Vec<_>>(),
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

/// Tool calls of `s` whose arguments are not valid JSON.
fn arguments_not_json(s: &SftSample) -> usize {
    s.messages
        .iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .filter(|c| serde_json::from_str::<Value>(&c.arguments).is_err())
        .count()
}

/// Writes SFT samples to `sft.parquet` and `sft.jsonl`.
pub struct SftWriter {
    pq: ParquetOut,
    jsonl: std::io::BufWriter<std::fs::File>,
    jsonl_path: PathBuf,
    pending: Vec<SftSample>,
    args: Arguments,
}

impl SftWriter {
    pub fn create(out: &Path, args: Arguments) -> Result<SftWriter, ExportError> {
        let jsonl_path = out.join("sft.jsonl");
        let f = std::fs::File::create(&jsonl_path).map_err(|e| write_err(&jsonl_path, e))?;
        Ok(SftWriter {
            pq: ParquetOut::create(out.join("sft.parquet"), sft_schema(args))?,
            jsonl: std::io::BufWriter::new(f),
            jsonl_path,
            pending: vec![],
            args,
        })
    }

    pub fn push(&mut self, s: SftSample) -> Result<(), ExportError> {
        let line = serde_json::to_string(&sft_json(&s, self.args))
            .map_err(|e| write_err(&self.jsonl_path, e))?;
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
        let b = sft_batch(&self.pending, self.args).map_err(|e| write_err(&self.pq.path, e))?;
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

/// A row for verl: its messages and tools as JSON whose native Arrow
/// types read back exactly.
struct VerlRow {
    sample: SftSample,
    messages: Value,
    tools: Value,
}

/// The native form of a sample for verl, or `None` (left out). Returns
/// whether its arguments had to be written as strings.
fn verl_row(s: SftSample, args: Arguments) -> Option<((DataType, DataType), VerlRow, bool)> {
    let as_json = |a| {
        Value::Array(
            s.messages
                .iter()
                .map(|m| m.to_value_with(true, a))
                .collect(),
        )
    };
    let (messages, m_ty, as_string) = match native::exact(&as_json(args)) {
        Ok((t, _)) => (as_json(args), t, false),
        Err(_) if args == Arguments::Object => {
            let m = as_json(Arguments::String);
            let (t, _) = native::exact(&m).ok()?;
            (m, t, true)
        }
        Err(_) => return None,
    };
    // No tools is an empty list, not null: pandas reads a null as `pd.NA`,
    // which `apply_chat_template(tools=...)` would try to iterate; an empty
    // list renders no tools block.
    let tools = s.tools.clone().unwrap_or_else(|| Value::Array(vec![]));
    let t_ty = native::exact(&tools).ok()?.0;
    Some((
        (m_ty, t_ty),
        VerlRow {
            sample: s,
            messages,
            tools,
        },
        as_string,
    ))
}

struct VerlFile {
    key: (DataType, DataType),
    out: ParquetOut,
    pending: Vec<VerlRow>,
}

impl VerlFile {
    fn schema(key: &(DataType, DataType)) -> SchemaRef {
        schema_with(key.0.clone(), Field::new("tools", key.1.clone(), true))
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let err = |e: native::NotNative| write_err(&self.out.path, e);
        let m: Vec<Option<&Value>> = self.pending.iter().map(|r| Some(&r.messages)).collect();
        let t: Vec<Option<&Value>> = self.pending.iter().map(|r| Some(&r.tools)).collect();
        let messages = native::build(&self.key.0, &m).map_err(err)?;
        let tools = native::build(&self.key.1, &t).map_err(err)?;
        let rows: Vec<&SftSample> = self.pending.iter().map(|r| &r.sample).collect();
        let b = batch_with(Self::schema(&self.key), &rows, messages, tools)
            .map_err(|e| write_err(&self.out.path, e))?;
        self.pending.clear();
        self.out.write(&b)
    }
}

/// Writes SFT samples for verl: `verl/sft-00000.parquet`, …, one file per
/// distinct (messages, tools) Arrow type, numbered in order of first use.
pub struct VerlWriter {
    dir: PathBuf,
    files: Vec<VerlFile>,
    args: Arguments,
}

/// Is `name` one of the files [`VerlWriter`] writes?
fn is_verl_part(name: &str) -> bool {
    name.strip_prefix("sft-")
        .and_then(|n| n.strip_suffix(".parquet"))
        .is_some_and(|n| n.len() == 5 && n.bytes().all(|b| b.is_ascii_digit()))
}

impl VerlWriter {
    /// Create `OUT/verl/`, removing the parts an earlier export left there.
    pub fn create(out: &Path, args: Arguments) -> Result<VerlWriter, ExportError> {
        let dir = out.join("verl");
        std::fs::create_dir_all(&dir).map_err(|e| write_err(&dir, e))?;
        for e in std::fs::read_dir(&dir).map_err(|e| write_err(&dir, e))? {
            let p = e.map_err(|e| write_err(&dir, e))?.path();
            if p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_verl_part)
            {
                std::fs::remove_file(&p).map_err(|e| write_err(&p, e))?;
            }
        }
        Ok(VerlWriter {
            dir,
            files: vec![],
            args,
        })
    }

    /// Write `s`, counting into `c`.
    pub fn push(&mut self, s: SftSample, c: &mut SftCounts) -> Result<(), ExportError> {
        let Some((key, row, as_string)) = verl_row(s, self.args) else {
            c.verl_skipped += 1;
            return Ok(());
        };
        c.verl_samples += 1;
        c.verl_arguments_as_string += usize::from(as_string);
        let i = match self.files.iter().position(|f| f.key == key) {
            Some(i) => i,
            None => {
                let path = self
                    .dir
                    .join(format!("sft-{:05}.parquet", self.files.len()));
                let out = ParquetOut::create(path, VerlFile::schema(&key))?;
                self.files.push(VerlFile {
                    key,
                    out,
                    pending: vec![],
                });
                self.files.len() - 1
            }
        };
        let f = &mut self.files[i];
        f.pending.push(row);
        if f.pending.len() >= 256 {
            f.flush()?;
        }
        Ok(())
    }

    pub fn finish(self) -> Result<Vec<String>, ExportError> {
        let mut names = vec![];
        for (i, mut f) in self.files.into_iter().enumerate() {
            f.flush()?;
            f.out.close()?;
            names.push(format!("verl/sft-{i:05}.parquet"));
        }
        Ok(names)
    }
}

enum Writer {
    Generic(Box<SftWriter>),
    Verl(VerlWriter),
}

/// `rollcall export sft`.
pub fn export(shards: &Path, out: &Path, opts: &SftOptions) -> Result<Report, ExportError> {
    super::prepare_out(out)?;
    let rollouts = read::read_rollouts(shards)?;
    let mut report = Report {
        kind: "sft".into(),
        ..Default::default()
    };
    let mut counts = SftCounts {
        arguments: match opts.arguments {
            Arguments::Object => "object",
            Arguments::String => "string",
        }
        .into(),
        trainer: match opts.trainer {
            SftTrainer::Generic => "generic",
            SftTrainer::Verl => "verl",
        }
        .into(),
        ..Default::default()
    };
    let mut log = MismatchLog::create(out, "sft")?;
    let mut w = match opts.trainer {
        SftTrainer::Generic => Writer::Generic(Box::new(SftWriter::create(out, opts.arguments)?)),
        SftTrainer::Verl => Writer::Verl(VerlWriter::create(out, opts.arguments)?),
    };
    let mut tokens = TokenWriter::new(out.join("sft_tokens.parquet"));
    let mut mm = vec![];
    let pass = super::Pass {
        label: "export sft",
        group_by: opts.group_by.as_deref(),
        tokens_only: false,
    };
    report.calls = super::each_rollout(shards, out, &rollouts, &pass, |calls, info| {
        let no_ids: HashSet<i64> = calls
            .iter()
            .filter(|c| c.status == "ok" && !c.has_token_ids())
            .map(|c| c.sequence)
            .collect();
        for s in rollout_samples(calls, info, opts, &mut report, &mut mm) {
            report.samples += 1;
            counts.arguments_not_json += arguments_not_json(&s);
            if s.sequences.iter().any(|q| no_ids.contains(q)) {
                counts.samples_without_token_ids += 1;
            }
            match &mut w {
                Writer::Generic(g) => g.push(s)?,
                Writer::Verl(v) => v.push(s, &mut counts)?,
            }
        }
        for t in sft_tokens::rollout_samples(calls, info, opts, &mut report, &mut counts) {
            tokens.push(t)?;
        }
        log.write(&mm)?;
        mm.clear();
        Ok(())
    })?;
    report.mismatches = log.count;
    log.finish()?;
    report.files = match w {
        Writer::Generic(g) => g.finish()?,
        Writer::Verl(v) => v.finish()?,
    };
    counts.verl_files = report
        .files
        .iter()
        .filter(|f| f.starts_with("verl/"))
        .count();
    if tokens.finish()? {
        report.files.push("sft_tokens.parquet".into());
    }
    report.files.push("sft_mismatches.jsonl".into());
    report.sft = Some(counts);
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

    fn sample(id: &str, msgs: Vec<Value>, tools: Option<Value>) -> SftSample {
        SftSample {
            sample_id: id.into(),
            rollout_id: id.into(),
            segment: 0,
            loss_weights: msgs.iter().map(|_| 0.0).collect(),
            messages: msgs.iter().map(Msg::from_value).collect(),
            tools_text: tools.as_ref().map(Value::to_string),
            tools,
            reward: None,
            status: None,
            model: None,
            harness: None,
            rule: "full".into(),
            group: id.into(),
            sequences: vec![0],
        }
    }

    fn call(id: &str, name: &str, args: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
    }

    fn bash_tool() -> Value {
        json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}}}])
    }

    #[test]
    fn arguments_as_objects_or_strings() {
        let m = Msg::from_value(&json!({"role": "assistant", "content": "",
            "tool_calls": [call("a", "bash", "{\"command\": \"ls\"}"), call("b", "bash", "ls -la")]}));
        let o = m.to_value_with(true, Arguments::Object);
        assert_eq!(
            o["tool_calls"][0]["function"]["arguments"],
            json!({"command": "ls"})
        );
        assert_eq!(o["tool_calls"][1]["function"]["arguments"], json!("ls -la"));
        let s = m.to_value_with(true, Arguments::String);
        assert_eq!(
            s["tool_calls"][0]["function"]["arguments"],
            json!("{\"command\": \"ls\"}")
        );
        let calls = m.tool_calls.clone().unwrap_or_default();
        // The arrow.json text: the model's JSON text, or a JSON string of its text.
        assert_eq!(calls[0].arguments_json_text(), "{\"command\": \"ls\"}");
        assert_eq!(calls[1].arguments_json_text(), "\"ls -la\"");
        let smp = sample(
            "r",
            vec![
                json!({"role": "user", "content": "x"}),
                json!({"role": "assistant", "tool_calls": [call("a", "bash", "{}"), call("b", "bash", "{nope")]}),
            ],
            None,
        );
        assert_eq!(arguments_not_json(&smp), 1);
    }

    #[test]
    fn sft_parquet_types_tools_and_arguments_as_arrow_json() {
        use arrow::array::AsArray;
        let tools = bash_tool();
        let s = sample(
            "r",
            vec![
                json!({"role": "user", "content": "x"}),
                json!({"role": "assistant", "tool_calls": [call("a", "bash", "{\"command\":\"ls\"}")]}),
            ],
            Some(tools),
        );
        // Recorded text with its own spacing is kept byte for byte.
        let s = SftSample {
            tools_text: Some("[ {\"type\": \"function\"} ]".into()),
            ..s
        };
        for args in [Arguments::Object, Arguments::String] {
            let b = sft_batch(std::slice::from_ref(&s), args).expect("batch");
            let schema = b.schema();
            let ext = |f: &Field| f.metadata().get(native::EXTENSION_NAME_KEY).cloned();
            let tf = schema.field_with_name("tools").expect("tools");
            assert_eq!(ext(tf).as_deref(), Some("arrow.json"));
            let tools = b.column_by_name("tools").expect("tools").as_string::<i32>();
            assert_eq!(tools.value(0), "[ {\"type\": \"function\"} ]");
            let DataType::List(m) = schema
                .field_with_name("messages")
                .expect("m")
                .data_type()
                .clone()
            else {
                panic!("messages is a list");
            };
            let DataType::Struct(mf) = m.data_type() else {
                panic!("struct")
            };
            let (_, tc) = mf.find("tool_calls").expect("tool_calls");
            let DataType::List(tci) = tc.data_type() else {
                panic!("list")
            };
            let DataType::Struct(tcf) = tci.data_type() else {
                panic!("struct")
            };
            let (_, f) = tcf.find("function").expect("function");
            let DataType::Struct(ff) = f.data_type() else {
                panic!("struct")
            };
            let (_, a) = ff.find("arguments").expect("arguments");
            assert_eq!(ext(a).is_some(), args == Arguments::Object, "{args:?}");
        }
    }

    #[test]
    fn verl_rows_are_native_and_exact_or_fall_back() {
        let user = json!({"role": "user", "content": "x"});
        // One argument shape: native objects.
        let one = sample(
            "a",
            vec![
                user.clone(),
                json!({"role": "assistant", "tool_calls": [
            call("1", "bash", "{\"command\": \"ls\"}"), call("2", "bash", "{\"command\": \"pwd\"}")]}),
            ],
            Some(bash_tool()),
        );
        let ((m_ty, t_ty), row, as_string) = verl_row(one, Arguments::Object).expect("native");
        assert!(!as_string);
        assert_eq!(
            row.messages[1]["tool_calls"][1]["function"]["arguments"],
            json!({"command": "pwd"})
        );
        assert!(m_ty.to_string().contains("command"), "{m_ty}");
        assert!(t_ty.to_string().contains("required"), "{t_ty}");
        let a = native::build(&m_ty, &[Some(&row.messages)]).expect("build");
        assert!(native::same(
            &native::value_at(a.as_ref(), 0),
            &row.messages
        ));
        // Two shapes in one row would unify (a key added as null): strings.
        let two = sample(
            "b",
            vec![
                user.clone(),
                json!({"role": "assistant", "tool_calls": [
            call("1", "bash", "{\"command\": \"ls\"}"), call("2", "write", "{\"path\": \"a\", \"text\": \"b\"}")]}),
            ],
            None,
        );
        let ((m_ty, t_ty), row, as_string) = verl_row(two, Arguments::Object).expect("strings");
        assert!(as_string);
        assert_eq!(
            t_ty.to_string(),
            DataType::new_list(DataType::Null, true).to_string(),
            "no tools: an empty list"
        );
        assert_eq!(
            row.messages[1]["tool_calls"][1]["function"]["arguments"],
            json!("{\"path\": \"a\", \"text\": \"b\"}")
        );
        assert!(!m_ty.to_string().contains("command"), "{m_ty}");
        // Empty arguments have no native form either.
        let empty = sample(
            "c",
            vec![
                user.clone(),
                json!({"role": "assistant", "tool_calls": [call("1", "now", "{}")]}),
            ],
            None,
        );
        assert!(verl_row(empty, Arguments::Object).expect("strings").2);
        // Tools whose parameters differ within the row: left out.
        let tools = json!([
            {"type": "function", "function": {"name": "bash", "parameters": {"properties": {"command": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "write", "parameters": {"properties": {"path": {"type": "string"}}}}},
        ]);
        assert!(verl_row(sample("d", vec![user], Some(tools)), Arguments::Object).is_none());
    }

    #[test]
    fn verl_files_split_by_type_and_stale_parts_go() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("verl")).expect("mkdir");
        std::fs::write(dir.path().join("verl/sft-00007.parquet"), b"old").expect("stale");
        std::fs::write(dir.path().join("verl/notes.txt"), b"mine").expect("other");
        let mut w = VerlWriter::create(dir.path(), Arguments::Object).expect("create");
        let mut c = SftCounts::default();
        let user = json!({"role": "user", "content": "x"});
        let asst =
            |args: &str| json!({"role": "assistant", "tool_calls": [call("1", "bash", args)]});
        w.push(
            sample(
                "a",
                vec![user.clone(), asst("{\"command\": \"ls\"}")],
                Some(bash_tool()),
            ),
            &mut c,
        )
        .expect("a");
        w.push(
            sample("b", vec![user.clone(), asst("{\"path\": \"x\"}")], None),
            &mut c,
        )
        .expect("b");
        w.push(
            sample(
                "c",
                vec![user.clone(), asst("{\"command\": \"pwd\"}")],
                Some(bash_tool()),
            ),
            &mut c,
        )
        .expect("c");
        let files = w.finish().expect("finish");
        assert_eq!(
            files,
            vec!["verl/sft-00000.parquet", "verl/sft-00001.parquet"]
        );
        assert_eq!(
            (c.verl_samples, c.verl_skipped, c.verl_arguments_as_string),
            (3, 0, 0)
        );
        assert!(!dir.path().join("verl/sft-00007.parquet").exists());
        assert!(dir.path().join("verl/notes.txt").exists());
        let f = std::fs::File::open(dir.path().join("verl/sft-00000.parquet")).expect("open");
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
            .expect("reader")
            .build()
            .expect("build");
        let rows: usize = r.map(|b| b.expect("batch").num_rows()).sum();
        assert_eq!(rows, 2);
        assert!(
            is_verl_part("sft-00012.parquet")
                && !is_verl_part("sft-1.parquet")
                && !is_verl_part("x.parquet")
        );
    }
}
