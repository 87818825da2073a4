//! Teacher scores: the third shard series (`DIR/scores/`), written by
//! `rollcall score` beside the calls it scores, never into them.
//!
//! One row per scored call: the teacher's logprob of each of the call's
//! completion tokens given the exact prompt ids before it, aligned token for
//! token with `completion_token_ids`. A call scored again (another teacher,
//! or the same one later) gets another row; readers take the latest by
//! `scored_at`. Because the scores live in the shards directory, every
//! export reads them again: they survive any number of re-exports.

use super::shard::ShardRow;
use super::SCHEMA_VERSION;
use arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use std::sync::{Arc, OnceLock};

/// The teacher's logprobs of one call's completion.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreRow {
    /// UUIDv7 of this score record.
    pub record_id: String,
    pub rollout_id: String,
    pub sequence: i64,
    /// Where the teacher was asked: its base URL (without credentials), or
    /// `embedded:<model file>`.
    pub teacher: String,
    /// The model name the teacher answered with.
    pub teacher_model: Option<String>,
    /// One per completion token: log πt(token | prompt, earlier tokens).
    pub teacher_logprobs: Vec<f64>,
    /// Prompt tokens the teacher was given before the completion.
    pub prompt_tokens: i64,
    pub scored_at: i64,
}

impl ShardRow for ScoreRow {
    const KIND: &'static str = "scores";
    const PLAIN_COLUMNS: &'static [&'static str] = &["record_id"];

    fn schema() -> SchemaRef {
        static S: OnceLock<SchemaRef> = OnceLock::new();
        S.get_or_init(|| {
            let meta = [
                (
                    "rollcall.schema_version".to_string(),
                    SCHEMA_VERSION.to_string(),
                ),
                ("rollcall.kind".to_string(), "scores".to_string()),
            ];
            let list = DataType::List(Arc::new(Field::new("item", DataType::Float64, true)));
            let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            Arc::new(Schema::new_with_metadata(
                vec![
                    Field::new("schema_version", DataType::Int32, false),
                    Field::new("record_id", DataType::Utf8, false),
                    Field::new("rollout_id", DataType::Utf8, false),
                    Field::new("sequence", DataType::Int64, false),
                    Field::new("teacher", DataType::Utf8, false),
                    Field::new("teacher_model", DataType::Utf8, true),
                    Field::new("teacher_logprobs", list, false),
                    Field::new("prompt_tokens", DataType::Int64, false),
                    Field::new("scored_at", ts, false),
                ],
                meta.into_iter()
                    .collect::<std::collections::HashMap<String, String>>(),
            ))
        })
        .clone()
    }

    fn batch(rows: &[Self]) -> RecordBatch {
        let strs = |f: fn(&ScoreRow) -> Option<&str>| -> ArrayRef {
            Arc::new(StringArray::from_iter(rows.iter().map(f)))
        };
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![SCHEMA_VERSION; rows.len()])),
            strs(|r| Some(&r.record_id)),
            strs(|r| Some(&r.rollout_id)),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.sequence),
            )),
            strs(|r| Some(&r.teacher)),
            strs(|r| r.teacher_model.as_deref()),
            Arc::new(ListArray::new(
                Arc::new(Field::new("item", DataType::Float64, true)),
                OffsetBuffer::from_lengths(rows.iter().map(|r| r.teacher_logprobs.len())),
                Arc::new(Float64Array::from_iter_values(
                    rows.iter().flat_map(|r| r.teacher_logprobs.iter().copied()),
                )),
                None,
            )),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.prompt_tokens),
            )),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.scored_at))
                    .with_timezone("UTC"),
            ),
        ];
        RecordBatch::try_new(Self::schema(), cols).expect("columns match the scores schema")
    }

    fn size(&self) -> usize {
        128 + self.rollout_id.len() + self.teacher.len() + 8 * self.teacher_logprobs.len()
    }
}
