//! `rollcall score`: teacher logprobs for on-policy distillation.
//!
//! ```text
//!  calls/*.parquet ──reader thread──▶ [calls: 4 × concurrency, Block] ──▶ ≤ concurrency
//!                                                                     teacher requests
//!                                                                           │
//!                                    scores/*.parquet ◀── every 512 rows ◀──┘
//! ```
//!
//! Every `ok` call with captured token ids (side calls aside) is scored once
//! per teacher: the teacher's logprob of each completion token given the
//! exact prompt ids, stored as a [`ScoreRow`] beside the call. A call the
//! same teacher already scored is skipped (unless `rescore`), so a run cut
//! short continues where it stopped. Before anything is scored, the
//! teacher's vocabulary is checked against the student's: the teacher's
//! text for a call's prompt ids must hold that call's own messages. A
//! teacher with another vocabulary reads the ids as other text, and is
//! refused.

use super::teacher::Teacher;
use super::RecipeError;
use crate::config::ShardConfig;
use crate::export::read::{count_calls, for_each_call, for_each_score, CallRec};
use crate::export::ExportError;
use crate::record::shard::write_now;
use crate::record::ScoreRow;
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Score rows written per file.
const ROWS_PER_FILE: usize = 512;
/// Calls whose prompt is checked against the teacher's vocabulary.
const VOCAB_CHECKS: usize = 3;
/// What the reader returns when it was told to stop.
const STOP: &str = "rollcall score: reading stopped";

/// What to score.
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    pub shards: PathBuf,
    /// Teacher requests at once.
    pub concurrency: usize,
    /// Score again calls this teacher has scored.
    pub rescore: bool,
    /// Score without checking the teacher's vocabulary (when no call has a
    /// text message to check it with).
    pub skip_vocab_check: bool,
}

/// What a scoring run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ScoreReport {
    pub teacher: String,
    pub teacher_model: Option<String>,
    pub calls_read: usize,
    pub scored: usize,
    pub already_scored: usize,
    /// `ok` calls without token ids (nothing to score).
    pub skipped_no_token_ids: usize,
    pub skipped_not_ok: usize,
    pub failed: usize,
    /// The first few failures' messages.
    pub failures: Vec<String>,
    /// Tokens the teacher read (prompt + completion) and completion tokens scored.
    pub tokens_read: usize,
    pub tokens_scored: usize,
    pub seconds: f64,
    pub files: Vec<String>,
}

/// The call's messages' text: every string content, and every text part.
fn message_texts(messages: &str) -> Vec<String> {
    let Ok(Value::Array(list)) = serde_json::from_str::<Value>(messages) else {
        return vec![];
    };
    let mut out = vec![];
    for m in &list {
        match m.get("content") {
            Some(Value::String(s)) => out.push(s.clone()),
            Some(Value::Array(parts)) => out.extend(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .map(str::to_owned),
            ),
            _ => {}
        }
    }
    out
}

/// A piece of text the prompt must hold: the longest line (of at most 120
/// characters) of the call's messages, when one has 16 or more.
pub fn probe_text(messages: &str) -> Option<String> {
    message_texts(messages)
        .iter()
        .flat_map(|t| t.lines().map(str::trim).collect::<Vec<_>>())
        .map(|l| l.chars().take(120).collect::<String>())
        .filter(|l| l.chars().count() >= 16)
        .max_by_key(|l| l.chars().count())
}

/// Is the call one to score?
fn eligible(c: &CallRec) -> bool {
    c.status == "ok"
        && !c.side_call
        && c.completion_ids.as_ref().is_some_and(|v| !v.is_empty())
        && c.prompt_ids.is_some()
}

/// Check the teacher's vocabulary on the first calls that can show it.
async fn check_vocabulary(teacher: &Teacher, shards: &Path) -> Result<usize, RecipeError> {
    let mut probes: Vec<(CallRec, String)> = vec![];
    let read = for_each_call(shards, |c| {
        if eligible(&c) {
            if let Some(p) = c.messages.as_deref().and_then(probe_text) {
                probes.push((c, p));
                if probes.len() >= VOCAB_CHECKS {
                    return Err(ExportError::Io(STOP.into()));
                }
            }
        }
        Ok(())
    });
    match read {
        Ok(_) => {}
        Err(ExportError::Io(m)) if m == STOP => {}
        Err(e) => return Err(e.into()),
    }
    for (c, probe) in &probes {
        let text = teacher
            .detokenize(c.prompt_ids.as_deref().unwrap_or_default())
            .await?;
        if !text.contains(probe.as_str()) {
            return Err(RecipeError::Vocabulary {
                teacher: teacher.label.clone(),
                rollout_id: c.rollout_id.clone(),
                sequence: c.sequence,
                expected: probe.clone(),
                got: text.chars().take(200).collect(),
            });
        }
    }
    Ok(probes.len())
}

/// Score the shards' calls with `teacher` (see the module docs).
pub async fn score(teacher: &Teacher, opts: &ScoreOptions) -> Result<ScoreReport, RecipeError> {
    let started = Instant::now();
    let mut report = ScoreReport {
        teacher: teacher.label.clone(),
        ..ScoreReport::default()
    };
    let total = count_calls(&opts.shards)?;
    let checked = check_vocabulary(teacher, &opts.shards).await?;
    if checked == 0 && !opts.skip_vocab_check {
        return Err(RecipeError::VocabularyUnverified(teacher.label.clone()));
    }
    let mut done: HashSet<(String, i64)> = HashSet::new();
    if !opts.rescore {
        for_each_score(&opts.shards, |s| {
            if s.teacher == teacher.label {
                done.insert((s.rollout_id, s.sequence));
            }
            Ok(())
        })?;
    }

    let concurrency = opts.concurrency.max(1);
    let (tx, rx) = tokio::sync::mpsc::channel::<CallRec>(4 * concurrency);
    let dir = opts.shards.clone();
    let reader = tokio::task::spawn_blocking(move || {
        for_each_call(&dir, |c| {
            tx.blocking_send(c)
                .map_err(|_| ExportError::Io(STOP.into()))
        })
    });

    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "score {bar:30} {pos}/{len} calls [{elapsed_precise}, {per_sec}] {msg}",
    ) {
        bar.set_style(style);
    }
    let cfg = ShardConfig {
        dir: opts.shards.clone(),
        ..ShardConfig::default()
    };
    let mut counts = Counts::default();
    let calls = tokio_stream_of(rx).filter_map(|c| {
        bar.inc(1);
        let keep = counts.sort(&c, &done);
        async move { keep.then_some(c) }
    });
    let mut results = Box::pin(
        calls
            .map(|c| async move {
                let prompt = c.prompt_ids.clone().unwrap_or_default();
                let completion = c.completion_ids.clone().unwrap_or_default();
                let r = teacher.score(&prompt, &completion).await;
                (c, prompt.len(), r)
            })
            .buffer_unordered(concurrency),
    );
    let mut rows: Vec<ScoreRow> = vec![];
    while let Some((c, prompt_len, r)) = results.next().await {
        match r {
            Ok((lps, model)) => {
                report.scored += 1;
                report.tokens_read += prompt_len + lps.len();
                report.tokens_scored += lps.len();
                if report.teacher_model.is_none() {
                    report.teacher_model.clone_from(&model);
                }
                rows.push(ScoreRow {
                    record_id: uuid::Uuid::now_v7().to_string(),
                    rollout_id: c.rollout_id,
                    sequence: c.sequence,
                    teacher: teacher.label.clone(),
                    teacher_model: model,
                    teacher_logprobs: lps,
                    prompt_tokens: prompt_len as i64,
                    scored_at: crate::now_micros(),
                });
                if rows.len() >= ROWS_PER_FILE {
                    write(&cfg, &mut rows, &mut report)?;
                }
            }
            Err(e) => {
                report.failed += 1;
                if report.failures.len() < 5 {
                    report
                        .failures
                        .push(format!("rollout {} call {}: {e}", c.rollout_id, c.sequence));
                }
            }
        }
        bar.set_message(format!(
            "{} scored, {} failed",
            report.scored, report.failed
        ));
    }
    drop(results);
    write(&cfg, &mut rows, &mut report)?;
    bar.finish_and_clear();
    match reader.await {
        Ok(Ok(n)) => report.calls_read = n,
        Ok(Err(ExportError::Io(m))) if m == STOP => {}
        Ok(Err(e)) => return Err(e.into()),
        Err(e) => return Err(RecipeError::Io(format!("the shard reader failed: {e}"))),
    }
    report.already_scored = counts.already;
    report.skipped_no_token_ids = counts.no_ids;
    report.skipped_not_ok = counts.not_ok;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Calls left out, by reason.
#[derive(Default)]
struct Counts {
    already: usize,
    no_ids: usize,
    not_ok: usize,
}

impl Counts {
    /// Count `c` if it is left out; is it to be scored?
    fn sort(&mut self, c: &CallRec, done: &HashSet<(String, i64)>) -> bool {
        if c.status != "ok" {
            self.not_ok += 1;
        } else if c.side_call {
            // Outside the trajectory: no export carries it, so it is not scored.
        } else if !eligible(c) {
            self.no_ids += 1;
        } else if done.contains(&(c.rollout_id.clone(), c.sequence)) {
            self.already += 1;
        } else {
            return true;
        }
        false
    }
}

/// The receiver as a stream.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Publish the rows held as one `scores/` shard.
fn write(
    cfg: &ShardConfig,
    rows: &mut Vec<ScoreRow>,
    report: &mut ScoreReport,
) -> Result<(), RecipeError> {
    let path = write_now(cfg, std::mem::take(rows)).map_err(|e| RecipeError::Write {
        path: cfg.dir.join("scores").display().to_string(),
        message: e.to_string(),
    })?;
    if let Some(p) = path {
        report.files.push(p.display().to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_the_longest_line_of_the_messages() {
        let m = r#"[{"role":"system","content":"You are a helpful assistant.\nShort"},
            {"role":"user","content":[{"type":"text","text":"Fix the failing test in tests/test_inflect.py please"}]},
            {"role":"assistant","content":null,"tool_calls":[]}]"#;
        assert_eq!(
            probe_text(m).as_deref(),
            Some("Fix the failing test in tests/test_inflect.py please")
        );
        assert_eq!(probe_text(r#"[{"role":"user","content":"hi"}]"#), None);
        assert_eq!(probe_text("not json"), None);
    }
}
