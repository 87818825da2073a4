//! The columns of `rl.parquet` in each trainer's shape (generic, verl,
//! slime, TRL): their names, Arrow types, and the arrays built from samples.

use super::{RlSample, Trainer};
use crate::export::parquet_out::list_of;
use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray, StructArray,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use std::sync::Arc;

#[derive(Clone, Copy)]
enum Col {
    SampleId,
    RolloutId,
    Segment,
    Group,
    GroupIndex,
    Index,
    RolloutIndex,
    NumTurns,
    PromptIds,
    ResponseIds,
    Tokens,
    ResponseLength,
    LossMask,
    Logprobs,
    /// The teacher's logprobs (`rollcall score`), null when unscored.
    TeacherLogprobs,
    Reward,
    Status,
    SlimeStatus,
    Model,
    Sequences,
    PolicyVersions,
    PolicyVersion,
    TokenPolicyVersions,
    /// verl's `AgentLoopMetrics`, at its defaults (rollcall does not time them).
    VerlMetrics,
    /// A struct of rollcall's own columns (verl's `extra_fields`, slime's
    /// `metadata`): the group under this name, then [`TAIL`], then (for a
    /// shape with no field of its own for them) the teacher's logprobs.
    Extra(&'static str, bool),
}

/// rollcall's own columns, kept with every sample.
const TAIL: &[(&str, Col)] = &[
    ("sample_id", Col::SampleId),
    ("rollout_id", Col::RolloutId),
    ("segment", Col::Segment),
    ("status", Col::Status),
    ("model", Col::Model),
    ("sequences", Col::Sequences),
    ("policy_versions", Col::PolicyVersions),
    ("policy_version", Col::PolicyVersion),
    ("token_policy_versions", Col::TokenPolicyVersions),
];

fn columns(t: Trainer) -> Vec<(&'static str, Col)> {
    use Col::*;
    let head: Vec<(&'static str, Col)> = match t {
        Trainer::Generic => vec![
            ("group", Group),
            ("prompt_ids", PromptIds),
            ("response_ids", ResponseIds),
            ("loss_mask", LossMask),
            ("logprobs", Logprobs),
            ("teacher_logprobs", TeacherLogprobs),
            ("reward", Reward),
        ],
        // Exactly `AgentLoopOutput`'s fields: pydantic ignores unknown keys,
        // so anything else would be lost without a word.
        Trainer::Verl => {
            return vec![
                ("prompt_ids", PromptIds),
                ("response_ids", ResponseIds),
                ("response_mask", LossMask),
                ("response_logprobs", Logprobs),
                ("reward_score", Reward),
                ("num_turns", NumTurns),
                ("metrics", VerlMetrics),
                // The group as `uid`: what GRPO groups by.
                ("extra_fields", Extra("uid", true)),
            ];
        }
        // Exactly `Sample`'s fields: `Sample(**row)` rejects any other key.
        Trainer::Slime => {
            return vec![
                ("group_index", GroupIndex),
                ("index", Index),
                ("rollout_id", RolloutIndex),
                ("tokens", Tokens),
                ("response_length", ResponseLength),
                ("loss_mask", LossMask),
                ("rollout_log_probs", Logprobs),
                // `Sample.teacher_log_probs`: what slime's OPD reads.
                ("teacher_log_probs", TeacherLogprobs),
                ("reward", Reward),
                ("status", SlimeStatus),
                ("metadata", Extra("group", false)),
            ];
        }
        Trainer::Trl => vec![
            ("group", Group),
            ("prompt_ids", PromptIds),
            ("completion_ids", ResponseIds),
            ("env_mask", LossMask),
            ("logprobs", Logprobs),
            ("teacher_logprobs", TeacherLogprobs),
            ("reward", Reward),
        ],
    };
    head.into_iter().chain(TAIL.iter().copied()).collect()
}

/// slime's `Sample.Status` value for a rollout's finish status (see
/// `docs/datasets.md`): a rollout that ran to its end is `completed` whatever
/// its grade, one cut short by time is `truncated`, one stopped from outside
/// (or never finished) is `aborted`, one whose harness failed is `failed`.
pub fn slime_status(status: Option<&str>) -> &'static str {
    let Some(s) = status else {
        return "aborted";
    };
    match s.to_ascii_lowercase().as_str() {
        "completed" | "complete" | "success" | "succeeded" | "passed" | "resolved" | "failure"
        | "unresolved" | "done" | "ok" => "completed",
        "timeout" | "timed_out" | "truncated" | "length" => "truncated",
        "cancelled" | "canceled" | "interrupted" | "aborted" | "killed" | "pending" => "aborted",
        _ => "failed",
    }
}

fn verl_metrics_fields() -> Fields {
    Fields::from(vec![
        Field::new("generate_sequences", DataType::Float64, false),
        Field::new("tool_calls", DataType::Float64, false),
        Field::new("compute_score", DataType::Float64, false),
        Field::new("num_preempted", DataType::Int64, false),
    ])
}

fn field(name: &str, c: Col) -> Field {
    let (ty, null) = match c {
        Col::SampleId | Col::RolloutId | Col::Group | Col::SlimeStatus => (DataType::Utf8, false),
        Col::Status | Col::Model => (DataType::Utf8, true),
        Col::Segment
        | Col::GroupIndex
        | Col::Index
        | Col::RolloutIndex
        | Col::NumTurns
        | Col::ResponseLength => (DataType::Int64, false),
        Col::PromptIds | Col::ResponseIds | Col::Tokens | Col::LossMask => {
            (list_of(DataType::Int32), false)
        }
        Col::Logprobs => (list_of(DataType::Float32), false),
        Col::TeacherLogprobs => (list_of(DataType::Float32), true),
        Col::Reward => (DataType::Float64, true),
        Col::Sequences => (list_of(DataType::Int64), false),
        Col::PolicyVersions | Col::TokenPolicyVersions => (list_of(DataType::Int64), false),
        Col::PolicyVersion => (DataType::Int64, true),
        Col::VerlMetrics => (DataType::Struct(verl_metrics_fields()), false),
        Col::Extra(group, teacher) => (DataType::Struct(extra_fields(group, teacher)), false),
    };
    Field::new(name, ty, null)
}

fn extra_columns(group: &'static str, teacher: bool) -> impl Iterator<Item = (&'static str, Col)> {
    let teacher = teacher.then_some(("teacher_logprobs", Col::TeacherLogprobs));
    std::iter::once((group, Col::Group))
        .chain(TAIL.iter().copied())
        .chain(teacher)
}

fn extra_fields(group: &'static str, teacher: bool) -> Fields {
    extra_columns(group, teacher)
        .map(|(n, c)| field(n, c))
        .collect()
}

pub(super) fn schema(t: Trainer) -> SchemaRef {
    Arc::new(Schema::new(
        columns(t)
            .into_iter()
            .map(|(name, c)| field(name, c))
            .collect::<Vec<_>>(),
    ))
}

fn int_lists<'a>(rows: impl Iterator<Item = Vec<&'a [i32]>> + Clone) -> ArrayRef {
    let lens = rows
        .clone()
        .map(|parts| parts.iter().map(|p| p.len()).sum());
    Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Int32, true)),
        OffsetBuffer::from_lengths(lens),
        Arc::new(Int32Array::from_iter_values(
            rows.flat_map(|parts| parts.into_iter().flatten().copied()),
        )),
        None,
    ))
}

fn column(c: Col, rows: &[RlSample]) -> ArrayRef {
    let strs = |f: fn(&RlSample) -> Option<&str>| -> ArrayRef {
        Arc::new(StringArray::from_iter(rows.iter().map(f)))
    };
    let ints = |f: fn(&RlSample) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(f)))
    };
    let floats =
        |v: f64| -> ArrayRef { Arc::new(Float64Array::from_iter_values(rows.iter().map(|_| v))) };
    match c {
        Col::SampleId => strs(|r| Some(&r.sample_id)),
        Col::RolloutId => strs(|r| Some(&r.rollout_id)),
        Col::Group => strs(|r| Some(&r.group)),
        Col::Status => strs(|r| r.status.as_deref()),
        Col::SlimeStatus => strs(|r| Some(slime_status(r.status.as_deref()))),
        Col::Model => strs(|r| r.model.as_deref()),
        Col::Segment => ints(|r| r.segment),
        Col::GroupIndex => ints(|r| r.group_index),
        Col::Index => ints(|r| r.index),
        Col::RolloutIndex => ints(|r| r.rollout_index),
        Col::NumTurns => ints(|r| r.num_turns),
        Col::ResponseLength => ints(|r| r.response_ids.len() as i64),
        Col::PromptIds => int_lists(rows.iter().map(|r| vec![r.prompt_ids.as_slice()])),
        Col::ResponseIds => int_lists(rows.iter().map(|r| vec![r.response_ids.as_slice()])),
        Col::Tokens => int_lists(
            rows.iter()
                .map(|r| vec![r.prompt_ids.as_slice(), r.response_ids.as_slice()]),
        ),
        Col::LossMask => int_lists(rows.iter().map(|r| vec![r.loss_mask.as_slice()])),
        Col::Logprobs => Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.logprobs.len())),
            Arc::new(Float32Array::from_iter_values(
                rows.iter().flat_map(|r| r.logprobs.iter().copied()),
            )),
            None,
        )),
        Col::TeacherLogprobs => {
            let lists = rows.iter().map(|r| r.teacher_logprobs.as_deref());
            Arc::new(ListArray::new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                OffsetBuffer::from_lengths(lists.clone().map(|l| l.map_or(0, <[f32]>::len))),
                Arc::new(Float32Array::from_iter_values(
                    lists.clone().flatten().flatten().copied(),
                )),
                Some(lists.map(|l| l.is_some()).collect()),
            ))
        }
        Col::Reward => Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.reward))),
        Col::Sequences => Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int64, true)),
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.sequences.len())),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().flat_map(|r| r.sequences.iter().copied()),
            )),
            None,
        )),
        Col::PolicyVersions => Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int64, true)),
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.policy_versions.len())),
            Arc::new(Int64Array::from_iter(
                rows.iter().flat_map(|r| r.policy_versions.iter().copied()),
            )),
            None,
        )),
        Col::PolicyVersion => Arc::new(Int64Array::from_iter(
            rows.iter().map(RlSample::policy_version),
        )),
        Col::TokenPolicyVersions => Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int64, true)),
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.token_policy_versions.len())),
            Arc::new(Int64Array::from_iter(
                rows.iter()
                    .flat_map(|r| r.token_policy_versions.iter().copied()),
            )),
            None,
        )),
        // AgentLoopMetrics' own defaults: not measured.
        Col::VerlMetrics => Arc::new(StructArray::new(
            verl_metrics_fields(),
            vec![
                floats(0.0),
                floats(0.0),
                floats(0.0),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|_| -1))),
            ],
            None,
        )),
        Col::Extra(group, teacher) => Arc::new(StructArray::new(
            extra_fields(group, teacher),
            extra_columns(group, teacher)
                .map(|(_, c)| column(c, rows))
                .collect(),
            None,
        )),
    }
}

pub(super) fn batch(
    t: Trainer,
    rows: &[RlSample],
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let cols = columns(t)
        .into_iter()
        .map(|(_, c)| column(c, rows))
        .collect();
    RecordBatch::try_new(schema(t), cols)
}
