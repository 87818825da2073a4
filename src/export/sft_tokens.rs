//! Token-exact SFT (`OUT/sft_tokens.parquet`): one row per trajectory
//! segment of the calls with token ids, built exactly as RL builds its
//! samples ([`super::rl::interleave`]): `input_ids` is the first call's
//! prompt ids, then each call's completion and the observation tokens
//! between calls, so it equals the last kept call's prompt + completion.
//! Re-rendering the messages with a chat template does not reproduce the
//! ids a model was served (templates drop or reorder tool blocks), so only
//! the captured ids are used; calls without them are excluded and counted.
//!
//! `assistant_masks` is 1 on sampled (completion) tokens, 0 on prompt and
//! observation tokens; `token_weights` is, per token, the loss weight of
//! the call that sampled it (1.0, or its `--step-scores` score) and 0.0
//! elsewhere. Under `--truncate-failed` the sample is cut at the call
//! boundary of the last step kept by the SFT rule: it ends with that call's
//! completion.

use super::credit;
use super::parquet_out::{list_of, ParquetOut};
use super::read::{CallRec, RolloutInfo};
use super::rl;
use super::sft::{SftCounts, SftOptions};
use super::trajectory::{self, Turn};
use super::{write_err, ExportError, Report, SampleMeta};
use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use std::path::PathBuf;
use std::sync::Arc;

/// One token-exact SFT sample.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenSample {
    pub sample_id: String,
    pub rollout_id: String,
    pub segment: i64,
    pub input_ids: Vec<i32>,
    pub assistant_masks: Vec<i32>,
    pub token_weights: Vec<f32>,
    pub reward: Option<f64>,
    pub status: Option<String>,
    pub rule: String,
    pub group: String,
    pub sequences: Vec<i64>,
}

/// Build a rollout's token-exact samples. Counts ok calls without ids into
/// `report.skipped_no_token_ids`, the rest into `counts`.
pub fn rollout_samples(
    calls: &[CallRec],
    info: Option<&RolloutInfo>,
    opts: &SftOptions,
    report: &mut Report,
    counts: &mut SftCounts,
) -> Vec<TokenSample> {
    let ok: Vec<&CallRec> = calls.iter().filter(|c| c.status == "ok").collect();
    let with_ids: Vec<&CallRec> = ok.iter().copied().filter(|c| c.has_token_ids()).collect();
    report.skipped_no_token_ids += ok.len() - with_ids.len();
    if with_ids.is_empty() {
        return vec![];
    }
    let failed: Vec<i64> = calls
        .iter()
        .filter(|c| c.status == "failed")
        .map(|c| c.sequence)
        .collect();
    let turns: Vec<Turn> = with_ids.iter().map(|c| Turn::parse(c)).collect();
    // Mismatches are logged once, by the message-level rebuild.
    let segs = trajectory::segment(&turns, &mut vec![]);
    counts.token_segments += segs.len();
    let rollout_id = calls.first().map_or("", |c| c.rollout_id.as_str());
    let group = super::group_of(rollout_id, info, opts.group_by.as_deref());
    let unresolved = credit::unresolved(info);
    let mut out = vec![];
    for seg in &segs {
        let seg_calls: Vec<&CallRec> = seg.turns.iter().map(|&k| with_ids[k]).collect();
        let meta = SampleMeta::of(&seg_calls, info);
        if !opts.filters.keep(&meta) {
            counts.token_filtered += 1;
            continue;
        }
        let mut kept = seg_calls.len();
        let mut rule = vec![];
        if let (Some(sig), true) = (opts.truncate_failed, unresolved) {
            let (msgs, origin) = trajectory::conversation(&turns, seg);
            let first = seg_calls.first().map_or(0, |c| c.sequence);
            if let Some(keep) = credit::truncation(&msgs, &origin, sig, &failed, first) {
                // The last step kept is the latest call whose answer is kept.
                let last = origin
                    .get(..keep)
                    .unwrap_or(&origin)
                    .iter()
                    .flatten()
                    .max()
                    .copied();
                let Some(last) = last else {
                    counts.token_dropped_by_truncation += 1;
                    continue;
                };
                let n = seg_calls.iter().take_while(|c| c.sequence <= last).count();
                if n == 0 {
                    counts.token_dropped_by_truncation += 1;
                    continue;
                }
                if n < kept {
                    kept = n;
                    counts.token_truncated += 1;
                    rule.push(format!("truncated:{}", sig.name()));
                }
            }
        }
        let seg_calls = &seg_calls[..kept];
        let t = rl::interleave(seg_calls);
        let p = t.prompt_ids.len();
        let mut weights = vec![0.0f32; p + t.response_ids.len()];
        let mut scored = false;
        for (c, r) in seg_calls.iter().zip(&t.completions) {
            let w = match opts
                .step_scores
                .as_ref()
                .and_then(|s| s.get(rollout_id, c.sequence))
            {
                Some(score) => {
                    scored = true;
                    score as f32
                }
                None => 1.0,
            };
            if let Some(span) = weights.get_mut(p + r.start..p + r.end) {
                span.fill(w);
            }
        }
        if scored {
            rule.insert(0, "step_scores".into());
        }
        let mut input_ids = t.prompt_ids;
        input_ids.extend_from_slice(&t.response_ids);
        let mut assistant_masks = vec![0; p];
        assistant_masks.extend_from_slice(&t.loss_mask);
        out.push(TokenSample {
            sample_id: format!("{rollout_id}:{}", seg.index),
            rollout_id: rollout_id.to_owned(),
            segment: seg.index as i64,
            input_ids,
            assistant_masks,
            token_weights: weights,
            reward: meta.reward,
            status: meta.status,
            rule: if rule.is_empty() {
                "full".into()
            } else {
                rule.join("+")
            },
            group: group.clone(),
            sequences: seg_calls.iter().map(|c| c.sequence).collect(),
        });
    }
    counts.token_samples += out.len();
    out
}

/// The schema of `sft_tokens.parquet`.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("sample_id", DataType::Utf8, false),
        Field::new("rollout_id", DataType::Utf8, false),
        Field::new("segment", DataType::Int64, false),
        Field::new("input_ids", list_of(DataType::Int64), false),
        Field::new("assistant_masks", list_of(DataType::Int32), false),
        Field::new("token_weights", list_of(DataType::Float32), false),
        Field::new("reward", DataType::Float64, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("rule", DataType::Utf8, false),
        Field::new("group", DataType::Utf8, false),
        Field::new("sequences", list_of(DataType::Int64), false),
    ]))
}

fn batch(rows: &[TokenSample]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let strs = |f: fn(&TokenSample) -> Option<&str>| -> ArrayRef {
        Arc::new(StringArray::from_iter(rows.iter().map(f)))
    };
    let list = |t: DataType, lens: Vec<usize>, values: ArrayRef| -> ArrayRef {
        Arc::new(ListArray::new(
            Arc::new(Field::new("item", t, true)),
            OffsetBuffer::from_lengths(lens),
            values,
            None,
        ))
    };
    let lens = |f: fn(&TokenSample) -> usize| rows.iter().map(f).collect::<Vec<_>>();
    RecordBatch::try_new(
        schema(),
        vec![
            strs(|r| Some(&r.sample_id)),
            strs(|r| Some(&r.rollout_id)),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.segment))),
            list(
                DataType::Int64,
                lens(|r| r.input_ids.len()),
                Arc::new(Int64Array::from_iter_values(
                    rows.iter()
                        .flat_map(|r| r.input_ids.iter().map(|&x| i64::from(x))),
                )),
            ),
            list(
                DataType::Int32,
                lens(|r| r.assistant_masks.len()),
                Arc::new(Int32Array::from_iter_values(
                    rows.iter().flat_map(|r| r.assistant_masks.iter().copied()),
                )),
            ),
            list(
                DataType::Float32,
                lens(|r| r.token_weights.len()),
                Arc::new(Float32Array::from_iter_values(
                    rows.iter().flat_map(|r| r.token_weights.iter().copied()),
                )),
            ),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.reward))),
            strs(|r| r.status.as_deref()),
            strs(|r| Some(&r.rule)),
            strs(|r| Some(&r.group)),
            list(
                DataType::Int64,
                lens(|r| r.sequences.len()),
                Arc::new(Int64Array::from_iter_values(
                    rows.iter().flat_map(|r| r.sequences.iter().copied()),
                )),
            ),
        ],
    )
}

/// Writes `sft_tokens.parquet`, created at the first sample. An export
/// without token samples removes the file an earlier one left.
pub struct TokenWriter {
    path: PathBuf,
    out: Option<ParquetOut>,
    pending: Vec<TokenSample>,
    pending_tokens: usize,
}

impl TokenWriter {
    pub fn new(path: PathBuf) -> TokenWriter {
        TokenWriter {
            path,
            out: None,
            pending: vec![],
            pending_tokens: 0,
        }
    }

    pub fn push(&mut self, s: TokenSample) -> Result<(), ExportError> {
        self.pending_tokens += s.input_ids.len();
        self.pending.push(s);
        if self.pending.len() >= 256 || self.pending_tokens >= 4 << 20 {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let out = match &mut self.out {
            Some(o) => o,
            None => self
                .out
                .insert(ParquetOut::create(self.path.clone(), schema())?),
        };
        let b = batch(&self.pending).map_err(|e| write_err(&out.path, e))?;
        out.write(&b)?;
        self.pending.clear();
        self.pending_tokens = 0;
        Ok(())
    }

    /// Close the file; whether one was written.
    pub fn finish(mut self) -> Result<bool, ExportError> {
        self.flush()?;
        match self.out.take() {
            Some(o) => {
                o.close()?;
                Ok(true)
            }
            None => {
                match std::fs::remove_file(&self.path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(write_err(&self.path, e)),
                }
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::credit::{Signal, StepScores};
    use serde_json::json;

    fn tok_call(
        seq: i64,
        msgs: serde_json::Value,
        resp: serde_json::Value,
        prompt: Vec<i32>,
        completion: Vec<i32>,
    ) -> CallRec {
        CallRec {
            rollout_id: "r1".into(),
            sequence: seq,
            wire_api: "chat_completions".into(),
            status: "ok".into(),
            messages: Some(msgs.to_string()),
            response_message: Some(resp.to_string()),
            prompt_ids: Some(prompt),
            completion_ids: Some(completion),
            ..Default::default()
        }
    }

    /// Three calls: a tool call that works, one that errors, a last answer.
    fn calls() -> Vec<CallRec> {
        let u = json!({"role": "user", "content": "task"});
        let a0 = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]});
        let t0 = json!({"role": "tool", "tool_call_id": "a", "content": "fine"});
        let a1 = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]});
        let t1 = json!({"role": "tool", "tool_call_id": "b", "content": "Traceback (most recent call last):"});
        let a2 = json!({"role": "assistant", "content": "gave up"});
        vec![
            tok_call(0, json!([u]), a0.clone(), vec![1, 2], vec![3, 4]),
            tok_call(
                1,
                json!([u, a0, t0]),
                a1.clone(),
                vec![1, 2, 3, 4, 5],
                vec![6],
            ),
            tok_call(
                2,
                json!([u, a0, t0, a1, t1]),
                a2,
                vec![1, 2, 3, 4, 5, 6, 7, 8],
                vec![9],
            ),
            // No ids: excluded and counted.
            CallRec {
                prompt_ids: None,
                ..tok_call(
                    3,
                    json!([u]),
                    json!({"role": "assistant", "content": "x"}),
                    vec![],
                    vec![],
                )
            },
        ]
    }

    fn failed_info() -> RolloutInfo {
        RolloutInfo {
            status: "failure".into(),
            reward: Some(0.0),
            ..Default::default()
        }
    }

    #[test]
    fn input_ids_masks_and_weights_follow_the_calls() {
        let scores = StepScores::read(
            "{\"rollout_id\": \"r1\", \"sequence\": 1, \"score\": 0.25}\n".as_bytes(),
            "s",
        )
        .expect("scores");
        let opts = SftOptions {
            step_scores: Some(scores),
            ..Default::default()
        };
        let (mut report, mut counts) = (Report::default(), SftCounts::default());
        let s = rollout_samples(
            &calls(),
            Some(&failed_info()),
            &opts,
            &mut report,
            &mut counts,
        );
        assert_eq!(report.skipped_no_token_ids, 1);
        // Call 3 (no ids) is excluded; its message history starts a second
        // segment only in the message rebuild, not here.
        assert_eq!(s.len(), 1);
        let s = &s[0];
        assert_eq!(s.input_ids, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(s.assistant_masks, vec![0, 0, 1, 1, 0, 1, 0, 0, 1]);
        assert_eq!(
            s.token_weights,
            vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.25, 0.0, 0.0, 1.0]
        );
        assert_eq!(
            (s.rule.as_str(), s.sequences.clone()),
            ("step_scores", vec![0, 1, 2])
        );
        assert_eq!((counts.token_samples, counts.token_segments), (1, 1));
    }

    #[test]
    fn truncation_cuts_at_the_call_boundary_of_the_last_kept_step() {
        let opts = SftOptions {
            truncate_failed: Some(Signal::ToolError),
            ..Default::default()
        };
        let (mut report, mut counts) = (Report::default(), SftCounts::default());
        let s = rollout_samples(
            &calls(),
            Some(&failed_info()),
            &opts,
            &mut report,
            &mut counts,
        );
        assert_eq!(s.len(), 1);
        // The step that issued the failing call (call 1) is kept, with its
        // completion; the error observation and call 2 are cut.
        assert_eq!(s[0].input_ids, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(s[0].assistant_masks, vec![0, 0, 1, 1, 0, 1]);
        assert_eq!(s[0].sequences, vec![0, 1]);
        assert_eq!(s[0].rule, "truncated:tool_error");
        assert_eq!(counts.token_truncated, 1);
        // A resolved rollout is never cut.
        let ok = RolloutInfo {
            status: "success".into(),
            reward: Some(1.0),
            ..Default::default()
        };
        let s = rollout_samples(&calls(), Some(&ok), &opts, &mut report, &mut counts);
        assert_eq!((s[0].input_ids.len(), s[0].rule.as_str()), (9, "full"));
    }

    #[test]
    fn batch_has_the_trainer_columns() {
        let (mut report, mut counts) = (Report::default(), SftCounts::default());
        let s = rollout_samples(
            &calls(),
            None,
            &SftOptions::default(),
            &mut report,
            &mut counts,
        );
        let b = batch(&s).expect("batch");
        for c in [
            "input_ids",
            "assistant_masks",
            "token_weights",
            "sample_id",
            "group",
        ] {
            assert!(b.column_by_name(c).is_some(), "{c}");
        }
        assert_eq!(b.num_rows(), 1);
    }
}
