//! Datasets from shards: SFT conversations, token-exact RL samples, the
//! Orchard `swe` schema (both ways), and `inspect`. See `docs/datasets.md`.
//!
//! Every export runs the same pipeline in bounded memory: finish rows are
//! read into a map (one per rollout), calls are streamed out of the shards
//! and hash-partitioned by their rollout's group into spill files (`read`),
//! then each partition is loaded, sorted, split into rollouts ordered by
//! (group, rollout id), and each rollout is rebuilt into trajectory segments
//! (`trajectory`, linear in the rollout's data) and written out. The output
//! order is fixed (partition, group, rollout id, segment): every group's
//! rows are contiguous, and the same shards always give byte-identical
//! files.

pub mod credit;
#[cfg(test)]
mod determinism_tests;
pub mod groups;
pub mod inspect;
pub mod native;
pub mod orchard;
mod parquet_out;
pub mod progress;
pub mod read;
pub mod rl;
#[cfg(test)]
mod scale_tests;
pub mod sft;
pub mod sft_tokens;
pub mod time;
pub mod trajectory;

use progress::Progress;
use read::partition::{self, Groups, Partitions};
use read::{CallRec, RolloutInfo};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use trajectory::Mismatch;

/// Errors of the export commands.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// shards directory {0} does not exist
    #[error("shards directory {0} does not exist")]
    NoDir(String),
    /// no shards in {0}
    #[error("no shards in {0}")]
    NoShards(String),
    /// cannot read shard {path}: {message}
    #[error("cannot read shard {path}: {message}")]
    Shard { path: String, message: String },
    /// {0}
    #[error("{0}")]
    Io(String),
    /// {file} line {line}: {why}
    #[error("{file} line {line}: {why}")]
    StepScores {
        file: String,
        line: usize,
        why: String,
    },
    /// cannot write {path}: {message}
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
    /// bad {what}: {why}
    #[error("bad {what}: {why}")]
    Arg { what: String, why: String },
    /// {file} row {row}: {why}
    #[error("{file} row {row}: {why}")]
    Input {
        file: String,
        row: usize,
        why: String,
    },
    /// rollout {rollout_id:?} has no reward (--missing-reward error) ...
    #[error(
        "rollout {rollout_id:?} has no reward (not finished, or finished without one); \
         finish it with a reward, or pass --missing-reward drop or zero"
    )]
    MissingReward { rollout_id: String },
}

pub(crate) fn write_err(p: &Path, e: impl std::fmt::Display) -> ExportError {
    ExportError::Write {
        path: p.display().to_string(),
        message: e.to_string(),
    }
}

/// Which samples to keep. Each filter applies to a trajectory segment.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Filters {
    /// Keep rollouts with reward >= this (rollouts without a reward are dropped).
    #[arg(long)]
    pub min_reward: Option<f64>,
    /// Keep rollouts with reward <= this (rollouts without a reward are dropped).
    #[arg(long)]
    pub max_reward: Option<f64>,
    /// Keep rollouts finished with this status (repeatable).
    #[arg(long)]
    pub status: Vec<String>,
    /// Keep rollouts whose harness (finish metadata `harness`, else the
    /// user agent) contains this text, case-insensitively.
    #[arg(long)]
    pub harness: Option<String>,
    /// Keep segments whose last call asked for this model.
    #[arg(long)]
    pub model: Option<String>,
    /// Keep segments whose last call went through this route.
    #[arg(long)]
    pub route: Option<String>,
    /// Keep segments whose first call arrived at or after this time (RFC 3339).
    #[arg(long, value_parser = time::parse_rfc3339)]
    pub since: Option<i64>,
    /// Keep segments whose first call arrived before this time (RFC 3339).
    #[arg(long, value_parser = time::parse_rfc3339)]
    pub until: Option<i64>,
    /// Keep rollouts finished with status `infra_error` (an infrastructure
    /// fault of `rollcall batch`, not the agent's doing: dropped by default).
    #[arg(long)]
    pub include_infra_errors: bool,
    /// Keep samples that Balanced Adaptive Rollout left out of their group
    /// (finish metadata `bar.kept` false: dropped by default).
    #[arg(long)]
    pub include_dropped: bool,
    /// Keep calls marked `side_call` (a harness's title generation and the
    /// like, by its adapter's rules: left out by default).
    #[arg(long)]
    pub include_side_calls: bool,
    /// Which reward revision of each rollout to use: `latest` (the last
    /// re-scoring by `rollcall reward` or `judge`), `original` (as
    /// finished), or a revision number N (the latest at most N).
    #[arg(long, default_value = "latest")]
    pub reward_revision: read::Revision,
}

/// The status `rollcall batch` finishes a rollout with after an
/// infrastructure fault.
pub const INFRA_ERROR: &str = "infra_error";

/// What the filters look at.
#[derive(Debug, Clone, Default)]
pub struct SampleMeta {
    pub reward: Option<f64>,
    pub status: Option<String>,
    pub harness: Option<String>,
    pub model: Option<String>,
    pub route: Option<String>,
    pub first_at: i64,
    /// Balanced Adaptive Rollout's verdict (`bar.kept`), when it gave one.
    pub bar_kept: Option<bool>,
}

impl SampleMeta {
    pub fn of(calls: &[&CallRec], info: Option<&RolloutInfo>) -> SampleMeta {
        let first = calls.first();
        let last = calls.last();
        SampleMeta {
            reward: info.and_then(|i| i.reward),
            status: info.map(|i| i.status.clone()),
            harness: info
                .and_then(|i| i.meta_str("harness"))
                .or_else(|| first.and_then(|c| c.user_agent.clone())),
            model: last.and_then(|c| c.model.clone()),
            route: last.and_then(|c| c.route.clone()),
            first_at: first.map_or(0, |c| c.received_at),
            bar_kept: info.and_then(|i| i.bar_kept()),
        }
    }
}

impl Filters {
    pub fn keep(&self, m: &SampleMeta) -> bool {
        if !self.include_infra_errors && m.status.as_deref() == Some(INFRA_ERROR) {
            return false;
        }
        if !self.include_dropped && m.bar_kept == Some(false) {
            return false;
        }
        if self
            .min_reward
            .is_some_and(|min| m.reward.is_none_or(|r| r < min))
        {
            return false;
        }
        if self
            .max_reward
            .is_some_and(|max| m.reward.is_none_or(|r| r > max))
        {
            return false;
        }
        if !self.status.is_empty()
            && !m
                .status
                .as_ref()
                .is_some_and(|s| self.status.iter().any(|w| w == s))
        {
            return false;
        }
        if let Some(h) = &self.harness {
            let h = h.to_lowercase();
            if !m
                .harness
                .as_ref()
                .is_some_and(|x| x.to_lowercase().contains(&h))
            {
                return false;
            }
        }
        if self.model.is_some() && m.model != self.model {
            return false;
        }
        if self.route.is_some() && m.route != self.route {
            return false;
        }
        if self.since.is_some_and(|s| m.first_at < s) || self.until.is_some_and(|u| m.first_at >= u)
        {
            return false;
        }
        true
    }
}

/// Counts of one export, written to `OUT/<kind>_report.json`.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Report {
    pub kind: String,
    pub rollouts: usize,
    pub calls: usize,
    /// Calls whose status is not `ok` (never exported).
    pub skipped_not_ok: usize,
    /// RL: ok calls without token ids (excluded, never re-tokenized).
    pub skipped_no_token_ids: usize,
    /// RL: sampled tokens whose logprob was not recorded (written as NaN).
    pub missing_logprobs: usize,
    /// RL: sampled tokens of scored segments without a teacher logprob
    /// (their call was not scored; written as NaN).
    pub missing_teacher_logprobs: usize,
    pub segments: usize,
    pub mismatches: usize,
    /// Segments dropped by the filters.
    pub filtered: usize,
    /// Segments dropped by `--truncate-failed` (nothing left before the signal).
    pub dropped_by_truncation: usize,
    pub truncated: usize,
    /// RL: samples whose rollout has no reward (dropped by
    /// `--missing-reward drop`, given 0.0 by `zero`).
    pub missing_reward: usize,
    /// RL `--group-size N`: groups dropped for having fewer than N samples.
    pub incomplete_groups: usize,
    /// RL `--group-size N`: samples dropped (those of incomplete groups,
    /// and those past a group's first N).
    pub dropped_by_group_size: usize,
    /// RL `--max-staleness N`: samples with a call more than N policy
    /// versions older than the newest (or with no version recorded).
    pub stale: usize,
    pub samples: usize,
    /// Sample count per rule.
    pub rules: BTreeMap<String, usize>,
    pub files: Vec<String>,
    /// SFT only: its own counts (flattened into the report).
    #[serde(flatten)]
    pub sft: Option<sft::SftCounts>,
}

impl Report {
    pub fn summary(&self) -> String {
        format!(
            "{}: {} samples from {} rollouts ({} calls; {} not ok skipped; {} segments; {} mismatches; {} filtered{})",
            self.kind,
            self.samples,
            self.rollouts,
            self.calls,
            self.skipped_not_ok,
            self.segments,
            self.mismatches,
            self.filtered,
            if self.kind == "rl" {
                let mut t = format!("; {} calls without token ids", self.skipped_no_token_ids);
                if self.missing_reward > 0 {
                    t += &format!("; {} samples without a reward", self.missing_reward);
                }
                if self.incomplete_groups > 0 || self.dropped_by_group_size > 0 {
                    t += &format!(
                        "; {} samples dropped by --group-size ({} incomplete groups)",
                        self.dropped_by_group_size, self.incomplete_groups
                    );
                }
                t
            } else {
                String::new()
            }
        )
    }
}

/// Writes mismatches to `OUT/<kind>_mismatches.jsonl` as they are found.
pub struct MismatchLog {
    w: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
    pub count: usize,
}

impl MismatchLog {
    pub fn create(out: &Path, kind: &str) -> Result<MismatchLog, ExportError> {
        let path = out.join(format!("{kind}_mismatches.jsonl"));
        let f = std::fs::File::create(&path).map_err(|e| write_err(&path, e))?;
        Ok(MismatchLog {
            w: std::io::BufWriter::new(f),
            path,
            count: 0,
        })
    }

    pub fn write(&mut self, mm: &[Mismatch]) -> Result<(), ExportError> {
        for m in mm {
            let line = serde_json::to_string(m).map_err(|e| write_err(&self.path, e))?;
            writeln!(self.w, "{line}").map_err(|e| write_err(&self.path, e))?;
            self.count += 1;
        }
        Ok(())
    }

    pub fn finish(self) -> Result<(), ExportError> {
        self.w
            .into_inner()
            .map_err(|e| write_err(&self.path, e.error()))?;
        Ok(())
    }
}

/// How [`each_rollout`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pass<'a> {
    /// Shown with the progress on stderr, e.g. `export rl`.
    pub label: &'a str,
    /// Finish-metadata key of the group (`group_of`).
    pub group_by: Option<&'a str>,
    /// Drop the JSON text columns (messages, tools, response message) of
    /// calls with token ids as they are read: for the RL export, which
    /// reads only token ids from such calls (half the memory and spill).
    pub tokens_only: bool,
    /// Keep calls marked `side_call` (else they are left out before the
    /// trajectories are rebuilt).
    pub keep_side_calls: bool,
}

/// Run `each` over every rollout of `shards` (its calls sorted by sequence,
/// duplicates dropped, and its latest finish row), in a fixed order:
/// partition, then group (`group_of` with `pass.group_by`), then rollout
/// id, so each group's rollouts come one after another. Progress goes to
/// stderr under `pass.label` when it takes a while. Returns the number of
/// calls read.
pub fn each_rollout(
    shards: &Path,
    out: &Path,
    rollouts: &BTreeMap<String, RolloutInfo>,
    pass: &Pass,
    mut each: impl FnMut(&[CallRec], Option<&RolloutInfo>) -> Result<(), ExportError>,
) -> Result<usize, ExportError> {
    let scratch = out.join(format!(".rollcall-spill-{}", std::process::id()));
    let groups = Groups::new(rollouts, pass.group_by);
    let progress = Progress::new(pass.label);
    let mut parts = Partitions::load(
        shards,
        &scratch,
        partition::ROWS_PER_PARTITION,
        |c| {
            if pass.tokens_only {
                c.keep_tokens_only();
            }
            true
        },
        &groups,
        &progress,
    )?;
    for i in 0..parts.len() {
        for calls in partition::by_group(parts.take(i)?, &groups) {
            let Some(first) = calls.first() else {
                continue;
            };
            let info = rollouts.get(&first.rollout_id);
            let mut calls = latest_attempts(calls);
            if !pass.keep_side_calls {
                calls.retain(|c| !c.side_call);
            }
            if calls.is_empty() {
                continue;
            }
            each(&calls, info)?;
            progress.rollout();
        }
    }
    progress.finish();
    Ok(parts.rows)
}

/// A rollout's calls with every retried call reduced to one attempt: its
/// last successful one, else its last one (`attempt_of` names the first
/// attempt's sequence). Order is kept.
pub fn latest_attempts(calls: Vec<CallRec>) -> Vec<CallRec> {
    if calls.iter().all(|c| c.attempt_of.is_none()) {
        return calls;
    }
    let logical = |c: &CallRec| c.attempt_of.unwrap_or(c.sequence);
    let mut keep: BTreeMap<i64, (i64, bool)> = BTreeMap::new();
    for c in &calls {
        let ok = c.status == "ok";
        let e = keep.entry(logical(c)).or_insert((c.sequence, ok));
        // A later attempt wins unless it failed where an earlier succeeded.
        if c.sequence >= e.0 && (ok || !e.1) {
            *e = (c.sequence, ok);
        }
    }
    calls
        .into_iter()
        .filter(|c| keep.get(&logical(c)).is_some_and(|k| k.0 == c.sequence))
        .collect()
}

/// Create the output directory.
pub fn prepare_out(out: &Path) -> Result<(), ExportError> {
    std::fs::create_dir_all(out).map_err(|e| write_err(out, e))
}

/// Write the report as pretty JSON, and return its summary line.
pub fn write_report(out: &Path, r: &Report) -> Result<String, ExportError> {
    let path = out.join(format!("{}_report.json", r.kind));
    let text = serde_json::to_string_pretty(r).map_err(|e| write_err(&path, e))?;
    std::fs::write(&path, text + "\n").map_err(|e| write_err(&path, e))?;
    Ok(r.summary())
}

/// The group of a rollout: finish metadata `KEY` when `--group-by KEY`, else
/// `group`, else `task`, else the rollout id itself.
pub fn group_of(rollout_id: &str, info: Option<&RolloutInfo>, group_by: Option<&str>) -> String {
    let from_meta = info.and_then(|i| match group_by {
        Some(k) => i.meta_str(k),
        None => i.meta_str("group").or_else(|| i.meta_str("task")),
    });
    from_meta.unwrap_or_else(|| rollout_id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_call_keeps_its_last_successful_attempt() {
        let c = |seq: i64, of: Option<i64>, status: &str| CallRec {
            rollout_id: "r".into(),
            sequence: seq,
            attempt_of: of,
            status: status.into(),
            ..Default::default()
        };
        let kept: Vec<i64> = latest_attempts(vec![
            c(0, None, "failed"),
            c(1, Some(0), "ok"),
            c(2, None, "ok"),
            c(3, None, "ok"),
            c(4, Some(3), "failed"),
        ])
        .iter()
        .map(|c| c.sequence)
        .collect();
        assert_eq!(kept, [1, 2, 3]);
    }

    #[test]
    fn filters() {
        let m = SampleMeta {
            reward: Some(0.5),
            status: Some("success".into()),
            harness: Some("OpenAI/Python 2.8.1".into()),
            model: Some("m".into()),
            route: Some("vllm".into()),
            first_at: 1_000,
            bar_kept: None,
        };
        assert!(Filters::default().keep(&m));
        // Infrastructure faults and samples BAR left out are dropped
        // unless asked for.
        let infra = SampleMeta {
            status: Some(INFRA_ERROR.into()),
            ..m.clone()
        };
        assert!(!Filters::default().keep(&infra));
        let f = Filters {
            include_infra_errors: true,
            ..Default::default()
        };
        assert!(f.keep(&infra));
        let left_out = SampleMeta {
            bar_kept: Some(false),
            ..m.clone()
        };
        assert!(!Filters::default().keep(&left_out));
        let f = Filters {
            include_dropped: true,
            ..Default::default()
        };
        assert!(f.keep(&left_out));
        let kept = SampleMeta {
            bar_kept: Some(true),
            ..m.clone()
        };
        assert!(Filters::default().keep(&kept));
        let f = Filters {
            min_reward: Some(0.6),
            ..Default::default()
        };
        assert!(!f.keep(&m));
        let f = Filters {
            max_reward: Some(0.5),
            status: vec!["success".into()],
            harness: Some("openai/python".into()),
            model: Some("m".into()),
            route: Some("vllm".into()),
            since: Some(1_000),
            until: Some(1_001),
            ..Default::default()
        };
        assert!(f.keep(&m));
        let f = Filters {
            until: Some(1_000),
            ..Default::default()
        };
        assert!(!f.keep(&m));
        let none = SampleMeta::default();
        let f = Filters {
            min_reward: Some(-1.0),
            ..Default::default()
        };
        assert!(
            !f.keep(&none),
            "a missing reward never passes a reward filter"
        );
    }

    #[test]
    fn groups() {
        let info = RolloutInfo {
            metadata: Some(r#"{"task": "t1", "group": 7, "split": "a"}"#.into()),
            ..Default::default()
        };
        assert_eq!(group_of("r", Some(&info), None), "7");
        assert_eq!(group_of("r", Some(&info), Some("split")), "a");
        assert_eq!(group_of("r", Some(&info), Some("nope")), "r");
        let task = RolloutInfo {
            metadata: Some(r#"{"task": "t1"}"#.into()),
            ..Default::default()
        };
        assert_eq!(group_of("r", Some(&task), None), "t1");
        assert_eq!(group_of("r", None, None), "r");
    }
}
