//! RL export: token-exact samples, one per trajectory segment.
//!
//! The response interleaves actions and observations: the completion ids of
//! call 1, then the observation tokens (the next call's prompt ids beyond
//! the previous prompt + completion), then the completion ids of call 2, …
//! The loss mask is 1 on sampled tokens and 0 on observations; logprobs are
//! the rollout's own on sampled tokens and 0.0 on observations. Calls
//! without token ids are excluded and counted, never re-tokenized.

use super::groups::GroupBuffer;
use super::parquet_out::{list_of, ParquetOut};
use super::read::{self, CallRec, RolloutInfo};
use super::trajectory;
use super::{ExportError, Filters, MismatchLog, Report, SampleMeta};
use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray, StructArray,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use std::path::Path;
use std::sync::Arc;

/// Column names and shapes for a trainer: the names its own entry points
/// read, so a row goes in as it is (see `docs/datasets.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Trainer {
    /// Our names: group, prompt_ids, response_ids, loss_mask, logprobs, reward.
    #[default]
    Generic,
    /// verl: the fields of `AgentLoopOutput` (prompt_ids, response_ids,
    /// response_mask, response_logprobs, reward_score, num_turns, metrics,
    /// extra_fields with uid and rollcall's own columns).
    Verl,
    /// slime: the fields of `Sample` (group_index, index, rollout_id as an
    /// integer, tokens, response_length, loss_mask, rollout_log_probs,
    /// reward, status as slime's value, metadata with rollcall's columns).
    Slime,
    /// TRL: what a GRPO `rollout_func` returns (prompt_ids, completion_ids,
    /// logprobs, env_mask) plus reward.
    Trl,
}

/// One RL sample.
#[derive(Debug, Clone, PartialEq)]
pub struct RlSample {
    pub sample_id: String,
    pub rollout_id: String,
    pub segment: i64,
    pub group: String,
    pub group_index: i64,
    pub index: i64,
    /// The rollout's number in output order (slime's integer `rollout_id`).
    pub rollout_index: i64,
    /// Messages the segment's last call saw, plus its answer (verl's `num_turns`).
    pub num_turns: i64,
    pub prompt_ids: Vec<i32>,
    pub response_ids: Vec<i32>,
    pub loss_mask: Vec<i32>,
    pub logprobs: Vec<f32>,
    pub reward: Option<f64>,
    pub status: Option<String>,
    pub model: Option<String>,
    pub sequences: Vec<i64>,
}

/// RL options.
#[derive(Debug, Clone, Default)]
pub struct RlOptions {
    pub filters: Filters,
    pub trainer: Trainer,
    pub group_by: Option<String>,
    /// Keep exactly this many samples per group: a group's first N in
    /// output order (rollout id, then segment); groups with fewer dropped.
    pub group_size: Option<usize>,
    pub missing_reward: MissingReward,
}

/// What to do with a sample whose rollout has no reward (never finished, or
/// finished without one). Applied after the filters, before `--group-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MissingReward {
    /// Leave the sample out (counted as `missing_reward`).
    #[default]
    Drop,
    /// Give it reward 0.0 (counted as `missing_reward`).
    Zero,
    /// Stop the export with an error naming the rollout.
    Error,
}

/// Writes samples in order, numbering `index` and `group_index`.
struct RlOut {
    w: ParquetOut,
    trainer: Trainer,
    pending: Vec<RlSample>,
    pending_tokens: usize,
    samples: usize,
    groups: i64,
    last_group: Option<String>,
    /// Rollouts numbered in output order (slime's integer `rollout_id`).
    rollouts: i64,
    last_rollout: Option<String>,
}

impl RlOut {
    fn push(&mut self, mut s: RlSample) -> Result<(), ExportError> {
        if self.last_group.as_deref() != Some(s.group.as_str()) {
            if self.last_group.is_some() {
                self.groups += 1;
            }
            self.last_group = Some(s.group.clone());
        }
        s.group_index = self.groups;
        if self.last_rollout.as_deref() != Some(s.rollout_id.as_str()) {
            if self.last_rollout.is_some() {
                self.rollouts += 1;
            }
            self.last_rollout = Some(s.rollout_id.clone());
        }
        s.rollout_index = self.rollouts;
        s.index = self.samples as i64;
        self.samples += 1;
        self.pending_tokens += s.prompt_ids.len() + s.response_ids.len();
        self.pending.push(s);
        if self.pending.len() >= 256 || self.pending_tokens >= 4 << 20 {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        if !self.pending.is_empty() {
            let b = batch(self.trainer, &self.pending)
                .map_err(|e| super::write_err(&self.w.path, e))?;
            self.w.write(&b)?;
            self.pending.clear();
            self.pending_tokens = 0;
        }
        Ok(())
    }
}

/// Build a rollout's RL samples (without `group_index` / `index`).
pub fn rollout_samples(
    calls: &[CallRec],
    info: Option<&RolloutInfo>,
    opts: &RlOptions,
    report: &mut Report,
    mismatches: &mut Vec<trajectory::Mismatch>,
) -> Vec<RlSample> {
    report.rollouts += 1;
    let ok: Vec<&CallRec> = calls.iter().filter(|c| c.status == "ok").collect();
    report.skipped_not_ok += calls.len() - ok.len();
    let with_ids: Vec<&CallRec> = ok.iter().copied().filter(|c| c.has_token_ids()).collect();
    report.skipped_no_token_ids += ok.len() - with_ids.len();
    // Every call here has token ids: matched on tokens, no JSON parsed.
    let (_, segs) = trajectory::rebuild(&with_ids, false, mismatches);
    report.segments += segs.len();
    let rollout_id = calls.first().map_or("", |c| c.rollout_id.as_str());
    let group = super::group_of(rollout_id, info, opts.group_by.as_deref());
    let mut out = vec![];
    for seg in &segs {
        let seg_calls: Vec<&CallRec> = seg.turns.iter().map(|&k| with_ids[k]).collect();
        let meta = SampleMeta::of(&seg_calls, info);
        if !opts.filters.keep(&meta) {
            report.filtered += 1;
            continue;
        }
        let t = interleave(&seg_calls);
        report.missing_logprobs += t.missing_logprobs;
        out.push(RlSample {
            sample_id: format!("{rollout_id}:{}", seg.index),
            rollout_id: rollout_id.to_owned(),
            segment: seg.index as i64,
            group: group.clone(),
            group_index: 0,
            index: 0,
            rollout_index: 0,
            num_turns: seg_calls.last().map_or(0, |c| {
                c.history_len.unwrap_or_else(|| {
                    c.messages.as_deref().map_or(0, |m| {
                        serde_json::from_str::<Vec<serde::de::IgnoredAny>>(m)
                            .map_or(0, |v| v.len() as i64)
                    })
                }) + 1
            }),
            prompt_ids: t.prompt_ids,
            response_ids: t.response_ids,
            loss_mask: t.loss_mask,
            logprobs: t.logprobs,
            reward: meta.reward,
            status: meta.status,
            model: meta.model,
            sequences: seg_calls.iter().map(|c| c.sequence).collect(),
        });
    }
    out
}

/// The token-exact ids of a segment's calls (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interleaved {
    /// The first call's prompt ids.
    pub prompt_ids: Vec<i32>,
    /// Completions and observation tokens, interleaved.
    pub response_ids: Vec<i32>,
    /// 1 on sampled (completion) tokens, 0 on observations.
    pub loss_mask: Vec<i32>,
    /// The rollout's logprobs on sampled tokens (NaN where missing), 0.0 on observations.
    pub logprobs: Vec<f32>,
    /// Per call: where its completion lies in `response_ids` (empty for a call without ids).
    pub completions: Vec<std::ops::Range<usize>>,
    /// Sampled tokens whose logprob was not recorded.
    pub missing_logprobs: usize,
}

/// Interleave a segment's calls (in order, each extending the one before)
/// into prompt ids and response ids with their loss mask and logprobs.
/// Calls without token ids are skipped.
pub fn interleave(seg_calls: &[&CallRec]) -> Interleaved {
    let mut s = Interleaved::default();
    let mut seen = 0usize; // prompt + completion tokens of the previous call
    for (k, c) in seg_calls.iter().enumerate() {
        let (Some(p), Some(comp)) = (&c.prompt_ids, &c.completion_ids) else {
            s.completions
                .push(s.response_ids.len()..s.response_ids.len());
            continue;
        };
        if k == 0 {
            s.prompt_ids = p.clone();
        } else {
            let obs = p.get(seen..).unwrap_or(&[]);
            s.response_ids.extend_from_slice(obs);
            s.loss_mask.extend(std::iter::repeat_n(0, obs.len()));
            s.logprobs.extend(std::iter::repeat_n(0.0, obs.len()));
        }
        let start = s.response_ids.len();
        s.response_ids.extend_from_slice(comp);
        s.completions.push(start..s.response_ids.len());
        s.loss_mask.extend(std::iter::repeat_n(1, comp.len()));
        for j in 0..comp.len() {
            let lp = c
                .completion_logprobs
                .as_ref()
                .and_then(|l| l.get(j).copied())
                .filter(|x| !x.is_nan());
            if lp.is_none() {
                s.missing_logprobs += 1;
            }
            s.logprobs.push(lp.map_or(f32::NAN, |x| x as f32));
        }
        seen = p.len() + comp.len();
    }
    s
}

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
    Reward,
    Status,
    SlimeStatus,
    Model,
    Sequences,
    /// verl's `AgentLoopMetrics`, at its defaults (rollcall does not time them).
    VerlMetrics,
    /// A struct of rollcall's own columns (verl's `extra_fields`, slime's
    /// `metadata`): the group under this name, then [`TAIL`].
    Extra(&'static str),
}

/// rollcall's own columns, kept with every sample.
const TAIL: &[(&str, Col)] = &[
    ("sample_id", Col::SampleId),
    ("rollout_id", Col::RolloutId),
    ("segment", Col::Segment),
    ("status", Col::Status),
    ("model", Col::Model),
    ("sequences", Col::Sequences),
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
                ("extra_fields", Extra("uid")),
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
                ("reward", Reward),
                ("status", SlimeStatus),
                ("metadata", Extra("group")),
            ]
        }
        Trainer::Trl => vec![
            ("group", Group),
            ("prompt_ids", PromptIds),
            ("completion_ids", ResponseIds),
            ("env_mask", LossMask),
            ("logprobs", Logprobs),
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
        Col::Reward => (DataType::Float64, true),
        Col::Sequences => (list_of(DataType::Int64), false),
        Col::VerlMetrics => (DataType::Struct(verl_metrics_fields()), false),
        Col::Extra(group) => (DataType::Struct(extra_fields(group)), false),
    };
    Field::new(name, ty, null)
}

fn extra_columns(group: &'static str) -> impl Iterator<Item = (&'static str, Col)> {
    std::iter::once((group, Col::Group)).chain(TAIL.iter().copied())
}

fn extra_fields(group: &'static str) -> Fields {
    extra_columns(group).map(|(n, c)| field(n, c)).collect()
}

fn schema(t: Trainer) -> SchemaRef {
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
        Col::Reward => Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.reward))),
        Col::Sequences => Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Int64, true)),
            OffsetBuffer::from_lengths(rows.iter().map(|r| r.sequences.len())),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().flat_map(|r| r.sequences.iter().copied()),
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
        Col::Extra(group) => Arc::new(StructArray::new(
            extra_fields(group),
            extra_columns(group).map(|(_, c)| column(c, rows)).collect(),
            None,
        )),
    }
}

fn batch(t: Trainer, rows: &[RlSample]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let cols = columns(t)
        .into_iter()
        .map(|(_, c)| column(c, rows))
        .collect();
    RecordBatch::try_new(schema(t), cols)
}

/// `rollcall export rl`: writes `OUT/rl.parquet`.
pub fn export(shards: &Path, out: &Path, opts: &RlOptions) -> Result<Report, ExportError> {
    if opts.group_size == Some(0) {
        return Err(ExportError::Arg {
            what: "--group-size".into(),
            why: "must be at least 1".into(),
        });
    }
    super::prepare_out(out)?;
    let rollouts = read::read_rollouts(shards)?;
    let mut report = Report {
        kind: "rl".into(),
        ..Default::default()
    };
    let mut log = MismatchLog::create(out, "rl")?;
    let mut w = RlOut {
        w: ParquetOut::create(out.join("rl.parquet"), schema(opts.trainer))?,
        trainer: opts.trainer,
        pending: vec![],
        pending_tokens: 0,
        samples: 0,
        groups: 0,
        last_group: None,
        rollouts: 0,
        last_rollout: None,
    };
    let mut whole = opts.group_size.map(GroupBuffer::new);
    let mut mm = vec![];
    let pass = super::Pass {
        label: "export rl",
        group_by: opts.group_by.as_deref(),
        tokens_only: true,
    };
    report.calls = super::each_rollout(shards, out, &rollouts, &pass, |calls, info| {
        for mut s in rollout_samples(calls, info, opts, &mut report, &mut mm) {
            if s.reward.is_none() {
                match opts.missing_reward {
                    MissingReward::Drop => {
                        report.missing_reward += 1;
                        continue;
                    }
                    MissingReward::Zero => {
                        report.missing_reward += 1;
                        s.reward = Some(0.0);
                    }
                    MissingReward::Error => {
                        return Err(ExportError::MissingReward {
                            rollout_id: s.rollout_id,
                        })
                    }
                }
            }
            match &mut whole {
                Some(b) => {
                    let key = s.group.clone();
                    for s in b.push(&key, s).into_iter().flatten() {
                        w.push(s)?;
                    }
                }
                None => w.push(s)?,
            }
        }
        log.write(&mm)?;
        mm.clear();
        Ok(())
    })?;
    if let Some(b) = &mut whole {
        for s in b.finish().into_iter().flatten() {
            w.push(s)?;
        }
        report.incomplete_groups = b.incomplete_groups;
        report.dropped_by_group_size = b.dropped;
    }
    w.flush()?;
    w.w.close()?;
    report.samples = w.samples;
    report.mismatches = log.count;
    log.finish()?;
    *report.rules.entry("full".into()).or_default() += report.samples;
    report.files = vec!["rl.parquet".into(), "rl_mismatches.jsonl".into()];
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tok_call(seq: i64, prompt: Vec<i32>, completion: Vec<i32>) -> CallRec {
        CallRec {
            rollout_id: "r1".into(),
            sequence: seq,
            wire_api: "chat_completions".into(),
            status: "ok".into(),
            messages: Some(json!([{"role": "user", "content": "x"}]).to_string()),
            response_message: Some(json!({"role": "assistant", "content": "y"}).to_string()),
            completion_logprobs: Some(completion.iter().map(|&t| -(t as f64) / 10.0).collect()),
            prompt_ids: Some(prompt),
            completion_ids: Some(completion),
            ..Default::default()
        }
    }

    #[test]
    fn loss_mask_and_logprobs_at_the_token_level() {
        let calls = vec![
            tok_call(0, vec![1, 2], vec![3, 4]),
            // observation 5, 6
            tok_call(1, vec![1, 2, 3, 4, 5, 6], vec![7]),
            // a call that failed: skipped, counted
            CallRec {
                status: "failed".into(),
                sequence: 2,
                ..tok_call(2, vec![], vec![])
            },
            // observation 8
            tok_call(3, vec![1, 2, 3, 4, 5, 6, 7, 8], vec![9, 10]),
            // no token ids: excluded
            CallRec {
                prompt_ids: None,
                completion_ids: None,
                ..tok_call(4, vec![], vec![])
            },
        ];
        let info = RolloutInfo {
            status: "success".into(),
            reward: Some(1.0),
            metadata: Some(r#"{"group": "task-a"}"#.into()),
            finished_at: 1,
        };
        let mut report = Report::default();
        let mut mm = vec![];
        let s = rollout_samples(
            &calls,
            Some(&info),
            &RlOptions::default(),
            &mut report,
            &mut mm,
        );
        assert_eq!(s.len(), 1, "{mm:?}");
        let s = &s[0];
        assert_eq!(s.prompt_ids, vec![1, 2]);
        assert_eq!(s.response_ids, vec![3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(s.loss_mask, vec![1, 1, 0, 0, 1, 0, 1, 1]);
        assert_eq!(
            s.logprobs,
            vec![-0.3, -0.4, 0.0, 0.0, -0.7, 0.0, -0.9, -1.0]
        );
        assert_eq!(s.reward, Some(1.0));
        assert_eq!(s.group, "task-a");
        assert_eq!(s.sequences, vec![0, 1, 3]);
        assert_eq!(report.skipped_not_ok, 1);
        assert_eq!(report.skipped_no_token_ids, 1);
        assert_eq!(report.missing_logprobs, 0);
    }

    #[test]
    fn a_token_mismatch_splits_rl_samples_sharing_the_reward() {
        let calls = vec![
            tok_call(0, vec![1, 2], vec![3]),
            tok_call(1, vec![1, 9, 9], vec![4]),
        ];
        let info = RolloutInfo {
            status: "failure".into(),
            reward: Some(0.0),
            ..Default::default()
        };
        let mut report = Report::default();
        let mut mm = vec![];
        let s = rollout_samples(
            &calls,
            Some(&info),
            &RlOptions::default(),
            &mut report,
            &mut mm,
        );
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].segment, s[1].segment), (0, 1));
        assert_eq!(s[1].prompt_ids, vec![1, 9, 9]);
        assert!(s.iter().all(|x| x.reward == Some(0.0) && x.group == "r1"));
        assert_eq!(mm.len(), 1);
        assert_eq!(mm[0].token_index, Some(1));
    }

    #[test]
    fn trainer_shapes_have_their_names() {
        let names = |t| {
            schema(t)
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        };
        // Exactly the trainers' own field names (verl's AgentLoopOutput,
        // slime's Sample): anything else is dropped or rejected there.
        assert_eq!(
            names(Trainer::Verl),
            [
                "prompt_ids",
                "response_ids",
                "response_mask",
                "response_logprobs",
                "reward_score",
                "num_turns",
                "metrics",
                "extra_fields"
            ]
        );
        assert_eq!(
            names(Trainer::Slime),
            [
                "group_index",
                "index",
                "rollout_id",
                "tokens",
                "response_length",
                "loss_mask",
                "rollout_log_probs",
                "reward",
                "status",
                "metadata"
            ]
        );
        for n in [
            "prompt_ids",
            "completion_ids",
            "env_mask",
            "logprobs",
            "reward",
        ] {
            assert!(names(Trainer::Trl).contains(&n.to_owned()), "trl {n}");
        }
        assert_eq!(slime_status(Some("success")), "completed");
        assert_eq!(slime_status(Some("failure")), "completed");
        assert_eq!(slime_status(Some("timeout")), "truncated");
        assert_eq!(slime_status(Some("cancelled")), "aborted");
        assert_eq!(slime_status(None), "aborted");
        assert_eq!(slime_status(Some("failed")), "failed");
        let s = RlSample {
            sample_id: "r:0".into(),
            rollout_id: "r".into(),
            segment: 0,
            group: "g".into(),
            group_index: 0,
            index: 0,
            rollout_index: 0,
            num_turns: 2,
            prompt_ids: vec![1, 2],
            response_ids: vec![3],
            loss_mask: vec![1],
            logprobs: vec![-0.5],
            reward: None,
            status: None,
            model: None,
            sequences: vec![0],
        };
        for t in [
            Trainer::Generic,
            Trainer::Verl,
            Trainer::Slime,
            Trainer::Trl,
        ] {
            let b = batch(t, std::slice::from_ref(&s)).expect("batch");
            assert_eq!(b.num_rows(), 1);
        }
        let b = batch(Trainer::Slime, &[s]).expect("batch");
        let tokens = b.column_by_name("tokens").expect("tokens");
        use arrow::array::AsArray;
        let t = tokens.as_list::<i32>().value(0);
        assert_eq!(
            t.as_primitive::<arrow::datatypes::Int32Type>()
                .values()
                .to_vec(),
            vec![1, 2, 3]
        );
    }
}
