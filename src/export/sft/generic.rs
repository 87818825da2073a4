//! `--trainer generic`: `OUT/sft.parquet` (tools and arguments as
//! `arrow.json`) and `OUT/sft.jsonl`, and the sample columns every SFT
//! Parquet file shares (`schema_with`, `batch_with`).

use super::messages::{messages_array_with, messages_type_with, offsets, Msg};
use super::{Arguments, SftSample};
use crate::export::native::json_field;
use crate::export::parquet_out::{list_of, ParquetOut};
use crate::export::{write_err, ExportError};
use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int64Array, ListArray, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

pub(super) fn schema_with(messages: DataType, tools: Field) -> SchemaRef {
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

pub(super) fn batch_with(
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

pub(super) fn sft_batch(
    rows: &[SftSample],
    args: Arguments,
) -> Result<RecordBatch, arrow::error::ArrowError> {
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
