//! SFT export: one conversation per trajectory segment, in OpenAI chat
//! format with tools and a loss weight per message, as Parquet and JSONL
//! (`--trainer generic`) or as native nested Parquet for verl
//! (`--trainer verl`), plus the token-exact form (`sft_tokens`) where calls
//! captured token ids.
//!
//! This file holds the options, the samples of a rollout and the export
//! itself; the chat messages and their Arrow column are in [`messages`],
//! the files of each trainer in [`generic`] and [`verl`].

pub mod generic;
pub mod messages;
#[cfg(test)]
mod tests;
pub mod verl;

use super::credit::{self, Signal, StepScores};
use super::read::{self, CallRec, RolloutInfo};
use super::sft_tokens::{self, TokenWriter};
use super::trajectory;
use super::{ExportError, Filters, MismatchLog, Report, SampleMeta};
use generic::SftWriter;
use messages::Msg;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;
use verl::VerlWriter;

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

/// Tool calls of `s` whose arguments are not valid JSON.
fn arguments_not_json(s: &SftSample) -> usize {
    s.messages
        .iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .filter(|c| serde_json::from_str::<Value>(&c.arguments).is_err())
        .count()
}

enum Writer {
    Generic(Box<SftWriter>),
    Verl(VerlWriter),
}

/// `rollcall export sft`.
pub fn export(shards: &Path, out: &Path, opts: &SftOptions) -> Result<Report, ExportError> {
    super::prepare_out(out)?;
    let rollouts = read::read_rollouts_at(shards, opts.filters.reward_revision)?;
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
        keep_side_calls: opts.filters.include_side_calls,
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
