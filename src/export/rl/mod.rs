//! RL export: token-exact samples, one per trajectory segment.
//!
//! The response interleaves actions and observations: the completion ids of
//! call 1, then the observation tokens (the next call's prompt ids beyond
//! the previous prompt + completion), then the completion ids of call 2, …
//! The loss mask is 1 on sampled tokens and 0 on observations; logprobs are
//! the rollout's own on sampled tokens and 0.0 on observations. Calls
//! without token ids are excluded and counted, never re-tokenized.
//!
//! This file holds the samples, their interleaving and the export; the
//! columns of each trainer's shape are in [`columns`].

pub mod columns;
#[cfg(test)]
mod tests;

use super::groups::GroupBuffer;
use super::parquet_out::ParquetOut;
use super::read::{self, CallRec, RolloutInfo};
use super::trajectory;
use super::{ExportError, Filters, MismatchLog, Report, SampleMeta};
use columns::{batch, schema};
use std::path::Path;

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
    /// The policy version each of `sequences` was sent under (weight sync;
    /// null where not recorded): the version of each token span.
    pub policy_versions: Vec<Option<i64>>,
    /// The policy version that sampled each of `response_ids` (null on
    /// observation tokens): a call continued across an update changes
    /// version inside its completion.
    pub token_policy_versions: Vec<Option<i64>>,
    /// The teacher's logprobs (`rollcall score`) aligned with
    /// `response_ids` under the same loss mask: 0.0 on observations, NaN on
    /// a sampled token of an unscored call; null when no call of the
    /// segment was scored.
    pub teacher_logprobs: Option<Vec<f32>>,
}

impl RlSample {
    /// The oldest policy version among the sample's calls.
    pub fn policy_version(&self) -> Option<i64> {
        self.policy_versions.iter().flatten().min().copied()
    }
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
    /// Keep samples whose every call ran under a policy at most this many
    /// versions older than the newest one in the shards.
    pub max_staleness: Option<i64>,
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
        if t.teacher_logprobs.is_some() {
            report.missing_teacher_logprobs += t.missing_teacher_logprobs;
        }
        let mut token_policy_versions = vec![None; t.response_ids.len()];
        for (c, range) in seg_calls.iter().zip(&t.completions) {
            let versions = c.token_policy_versions(range.len());
            for (slot, v) in token_policy_versions[range.clone()]
                .iter_mut()
                .zip(versions)
            {
                *slot = v;
            }
        }
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
            policy_versions: seg_calls.iter().map(|c| c.policy_version).collect(),
            token_policy_versions,
            teacher_logprobs: t.teacher_logprobs,
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
    /// The teacher's logprobs, laid out as `logprobs` (NaN on the sampled
    /// tokens of unscored calls); `None` when no call was scored.
    pub teacher_logprobs: Option<Vec<f32>>,
    /// Sampled tokens without a teacher logprob, in a segment that has some.
    pub missing_teacher_logprobs: usize,
}

/// Interleave a segment's calls (in order, each extending the one before)
/// into prompt ids and response ids with their loss mask and logprobs.
/// Calls without token ids are skipped.
pub fn interleave(seg_calls: &[&CallRec]) -> Interleaved {
    let mut s = Interleaved::default();
    let scored = seg_calls.iter().any(|c| c.teacher_logprobs.is_some());
    let mut teacher: Vec<f32> = vec![];
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
            teacher.extend(std::iter::repeat_n(0.0, obs.len()));
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
            if scored {
                let t = c
                    .teacher_logprobs
                    .as_ref()
                    .and_then(|l| l.get(j).copied())
                    .filter(|x| !x.is_nan());
                if t.is_none() {
                    s.missing_teacher_logprobs += 1;
                }
                teacher.push(t.map_or(f32::NAN, |x| x as f32));
            }
        }
        seen = p.len() + comp.len();
    }
    s.teacher_logprobs = scored.then_some(teacher);
    s
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
    let rollouts = read::read_rollouts_at(shards, opts.filters.reward_revision)?;
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
    // Staleness is counted against the newest policy version recorded.
    let oldest_kept = match opts.max_staleness {
        Some(n) => read::latest_policy_version(shards)?.map(|latest| latest - n),
        None => None,
    };
    let pass = super::Pass {
        label: "export rl",
        group_by: opts.group_by.as_deref(),
        tokens_only: true,
        keep_side_calls: opts.filters.include_side_calls,
    };
    report.calls = super::each_rollout(shards, out, &rollouts, &pass, |calls, info| {
        for mut s in rollout_samples(calls, info, opts, &mut report, &mut mm) {
            if let Some(oldest) = oldest_kept {
                if s.policy_version().is_none_or(|v| v < oldest) {
                    report.stale += 1;
                    continue;
                }
            }
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
