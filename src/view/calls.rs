//! One rollout's calls, read from the `calls/` files the index says hold
//! them, and from those only the rows that are its own: the `rollout_id`
//! column is read first, then the other columns of just the matching rows
//! (a Parquet row selection). So a rollout's page costs its own rows, not
//! the shards'.

use crate::export::read::{
    bool_at, col, f64s_at, i64_at, ids_at, open_projected, open_selected, revision_of, shard_err,
    shard_files, str_at, CallRec,
};
use crate::export::{latest_attempts, ExportError};
use crate::record::shard::list_shards;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A call as the rollout page shows it: the export's record (what the
/// trajectory logic reads) and what the timeline adds.
#[derive(Debug, Clone, Default)]
pub struct ViewCall {
    pub rec: CallRec,
    pub call_id: String,
    pub upstream_api: Option<String>,
    pub replica: Option<String>,
    pub http_status: Option<i64>,
    pub failure_message: Option<String>,
    pub stream: bool,
    pub attempt: i64,
    pub first_byte_at: Option<i64>,
    pub done_at: Option<i64>,
    pub finish_reason: Option<String>,
    pub token_capture: Option<String>,
    pub reasoning_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
}

/// The columns a [`ViewCall`] is read from.
const COLUMNS: &[&str] = &[
    "rollout_id",
    "sequence",
    "call_id",
    "wire_api",
    "upstream_api",
    "model",
    "route",
    "replica",
    "status",
    "http_status",
    "failure_class",
    "failure_message",
    "stream",
    "side_call",
    "attempt",
    "attempt_of",
    "policy_version",
    "received_at",
    "first_byte_at",
    "done_at",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "messages",
    "tools",
    "response_message",
    "finish_reason",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "user_agent",
    "continued",
    "token_capture",
];

/// A call's bodies as recorded, for the raw view.
#[derive(Debug, Clone, Default)]
pub struct RawCall {
    pub request: Option<String>,
    pub upstream_request: Option<String>,
    pub response: Option<String>,
    /// The response's bytes as the harness got them (a stream's events).
    pub response_raw: Option<String>,
    /// The upstream's own bytes, when they differ (a translated call).
    pub upstream_response_raw: Option<String>,
}

/// One finish row of a rollout (its first finish, or a re-scoring).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Finish {
    pub status: String,
    pub reward: Option<f64>,
    pub metadata: Option<String>,
    pub finished_at: i64,
    pub revision: i64,
}

/// Every finish row of `rollout_id`, oldest first.
pub fn finishes(shards: &Path, rollout_id: &str) -> Result<Vec<Finish>, ExportError> {
    let cols = ["rollout_id", "status", "reward", "metadata", "finished_at"];
    let mut out = vec![];
    for path in shard_files(shards, "rollouts")? {
        for b in rows_of(&path, rollout_id, &cols)? {
            let reward = col(&b, "reward").and_then(|c| c.as_primitive_opt::<Float64Type>());
            for i in 0..b.num_rows() {
                let metadata = text(&b, "metadata", i);
                out.push(Finish {
                    status: text(&b, "status", i).unwrap_or_default(),
                    reward: reward.filter(|r| !r.is_null(i)).map(|r| r.value(i)),
                    revision: revision_of(metadata.as_deref()),
                    metadata,
                    finished_at: int(&b, "finished_at", i).unwrap_or(0),
                });
            }
        }
    }
    out.sort_by_key(|f| (f.finished_at, f.revision));
    Ok(out)
}

/// The teacher's logprobs of each scored call of `rollout_id` (its latest
/// score), by sequence.
pub fn scores(shards: &Path, rollout_id: &str) -> Result<HashMap<i64, Vec<f64>>, ExportError> {
    let cols = ["rollout_id", "sequence", "scored_at", "teacher_logprobs"];
    let mut latest: HashMap<i64, (i64, Vec<f64>)> = HashMap::new();
    let files = list_shards(shards, "scores").map_err(|e| shard_err(&shards.join("scores"), e))?;
    for path in files {
        for b in rows_of(&path, rollout_id, &cols)? {
            for i in 0..b.num_rows() {
                let (Some(seq), Some(lp)) = (
                    int(&b, "sequence", i),
                    f64s_at(col(&b, "teacher_logprobs"), i),
                ) else {
                    continue;
                };
                let at = int(&b, "scored_at", i).unwrap_or(0);
                if latest.get(&seq).is_none_or(|(t, _)| *t <= at) {
                    latest.insert(seq, (at, lp));
                }
            }
        }
    }
    Ok(latest.into_iter().map(|(k, (_, v))| (k, v)).collect())
}

/// The rows of `path` whose `rollout_id` is `rollout_id`, as batches of the
/// root columns `cols` (those that exist).
fn rows_of(path: &Path, rollout_id: &str, cols: &[&str]) -> Result<Vec<RecordBatch>, ExportError> {
    let mut selectors: Vec<RowSelector> = vec![];
    let mut push = |select: bool, n: usize| match selectors.last_mut() {
        Some(last) if last.skip != select => last.row_count += n,
        _ => selectors.push(if select {
            RowSelector::select(n)
        } else {
            RowSelector::skip(n)
        }),
    };
    let mut any = false;
    for batch in open_projected(path, &["rollout_id"])? {
        let b = batch.map_err(|e| shard_err(path, e))?;
        let ids = col(&b, "rollout_id");
        for i in 0..b.num_rows() {
            let hit = str_at(ids, i).is_some_and(|id| id == rollout_id);
            any |= hit;
            push(hit, 1);
        }
    }
    if !any {
        return Ok(vec![]);
    }
    open_selected(path, cols, Some(RowSelection::from(selectors)))?
        .map(|b| b.map_err(|e| shard_err(path, e)))
        .collect()
}

/// A cell of any integer or timestamp type.
fn int(b: &RecordBatch, name: &str, i: usize) -> Option<i64> {
    i64_at(col(b, name), i)
}

fn text(b: &RecordBatch, name: &str, i: usize) -> Option<String> {
    str_at(col(b, name), i)
}

/// A binary cell as text (lossy UTF-8).
fn bytes_text(b: &RecordBatch, name: &str, i: usize) -> Option<String> {
    let c = col(b, name)?;
    if c.is_null(i) {
        return None;
    }
    match c.data_type() {
        DataType::Binary => {
            Some(String::from_utf8_lossy(c.as_binary::<i32>().value(i)).into_owned())
        }
        DataType::LargeBinary => {
            Some(String::from_utf8_lossy(c.as_binary::<i64>().value(i)).into_owned())
        }
        _ => str_at(Some(c), i),
    }
}

fn view_call(b: &RecordBatch, i: usize) -> Option<ViewCall> {
    let rec = CallRec {
        rollout_id: text(b, "rollout_id", i)?,
        sequence: int(b, "sequence", i)?,
        wire_api: text(b, "wire_api", i).unwrap_or_default(),
        model: text(b, "model", i),
        route: text(b, "route", i),
        status: text(b, "status", i).unwrap_or_default(),
        failure_class: text(b, "failure_class", i),
        messages: text(b, "messages", i),
        tools: text(b, "tools", i),
        response_message: text(b, "response_message", i),
        prompt_ids: ids_at(col(b, "prompt_token_ids"), i),
        completion_ids: ids_at(col(b, "completion_token_ids"), i),
        completion_logprobs: f64s_at(col(b, "completion_logprobs"), i),
        user_agent: text(b, "user_agent", i),
        received_at: int(b, "received_at", i).unwrap_or(0),
        prompt_tokens: int(b, "prompt_tokens", i),
        completion_tokens: int(b, "completion_tokens", i),
        policy_version: int(b, "policy_version", i),
        attempt_of: int(b, "attempt_of", i),
        side_call: bool_at(col(b, "side_call"), i),
        continued: text(b, "continued", i),
        history_len: None,
        teacher_logprobs: None,
    };
    Some(ViewCall {
        rec,
        call_id: text(b, "call_id", i).unwrap_or_default(),
        upstream_api: text(b, "upstream_api", i),
        replica: text(b, "replica", i),
        http_status: int(b, "http_status", i),
        failure_message: text(b, "failure_message", i),
        stream: bool_at(col(b, "stream"), i),
        attempt: int(b, "attempt", i).unwrap_or(0),
        first_byte_at: int(b, "first_byte_at", i),
        done_at: int(b, "done_at", i),
        finish_reason: text(b, "finish_reason", i),
        token_capture: text(b, "token_capture", i),
        reasoning_tokens: int(b, "reasoning_tokens", i),
        cached_tokens: int(b, "cached_tokens", i),
    })
}

/// Every call of `rollout_id` in `files`, by sequence then attempt; a row
/// written twice (a WAL replay) is kept once.
pub fn load(files: &[&PathBuf], rollout_id: &str) -> Result<Vec<ViewCall>, ExportError> {
    let mut out = vec![];
    for path in files {
        for b in rows_of(path, rollout_id, COLUMNS)? {
            out.extend((0..b.num_rows()).filter_map(|i| view_call(&b, i)));
        }
    }
    out.sort_by(|a, b| {
        (a.rec.sequence, a.attempt, &a.call_id).cmp(&(b.rec.sequence, b.attempt, &b.call_id))
    });
    out.dedup_by(|a, b| a.call_id == b.call_id && a.rec.sequence == b.rec.sequence);
    Ok(out)
}

/// The calls a rollout's trajectory is rebuilt from, as the exports take
/// them: answered calls, side calls apart, each retried call once.
pub fn trajectory(all: &[ViewCall]) -> Vec<CallRec> {
    latest_attempts(
        all.iter()
            .filter(|c| c.rec.status == "ok" && !c.rec.side_call)
            .map(|c| c.rec.clone())
            .collect(),
    )
}

/// The bodies of call `sequence` of `rollout_id` (its last attempt).
pub fn raw(
    files: &[&PathBuf],
    rollout_id: &str,
    sequence: i64,
) -> Result<Option<RawCall>, ExportError> {
    Ok(raws(files, rollout_id, Some(sequence))?.remove(&sequence))
}

/// The bodies of every call of `rollout_id` (of just `only`, when given),
/// each call's last attempt, by sequence: one read of its rows.
pub fn raws(
    files: &[&PathBuf],
    rollout_id: &str,
    only: Option<i64>,
) -> Result<HashMap<i64, RawCall>, ExportError> {
    let cols = [
        "rollout_id",
        "sequence",
        "attempt",
        "request",
        "upstream_request",
        "response",
        "response_raw",
        "upstream_response_raw",
    ];
    let mut found: HashMap<i64, (i64, RawCall)> = HashMap::new();
    for path in files {
        for b in rows_of(path, rollout_id, &cols)? {
            for i in 0..b.num_rows() {
                let Some(seq) = int(&b, "sequence", i).filter(|s| only.is_none_or(|o| o == *s))
                else {
                    continue;
                };
                let attempt = int(&b, "attempt", i).unwrap_or(0);
                if found.get(&seq).is_some_and(|(a, _)| *a > attempt) {
                    continue;
                }
                let call = RawCall {
                    request: text(&b, "request", i),
                    upstream_request: text(&b, "upstream_request", i),
                    response: text(&b, "response", i),
                    response_raw: bytes_text(&b, "response_raw", i),
                    upstream_response_raw: bytes_text(&b, "upstream_response_raw", i),
                };
                found.insert(seq, (attempt, call));
            }
        }
    }
    Ok(found.into_iter().map(|(k, (_, r))| (k, r)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ShardConfig;
    use crate::export::read::partition_tests::call_row;
    use crate::record::shard::{list_shards, write_now};

    #[test]
    fn only_the_rollouts_own_rows_are_read_and_sorted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = ShardConfig {
            dir: dir.path().to_path_buf(),
            ..ShardConfig::default()
        };
        let mut rows = vec![];
        for s in [2, 0, 1] {
            for r in ["a", "b", "c"] {
                let mut c = call_row(r, s);
                c.request = format!(r#"{{"n":{s},"r":"{r}"}}"#);
                rows.push(c);
            }
        }
        write_now(&cfg, rows).expect("calls");
        let files = list_shards(dir.path(), "calls").expect("list");
        let files: Vec<&PathBuf> = files.iter().collect();
        let b = load(&files, "b").expect("load");
        let seqs: Vec<i64> = b.iter().map(|c| c.rec.sequence).collect();
        assert_eq!(seqs, [0, 1, 2]);
        assert!(b.iter().all(|c| c.rec.rollout_id == "b"));
        let r = raw(&files, "c", 1).expect("raw").expect("found");
        assert_eq!(r.request.as_deref(), Some(r#"{"n":1,"r":"c"}"#));
        assert!(raw(&files, "c", 9).expect("raw").is_none());
        assert!(load(&files, "zzz").expect("load").is_empty());
    }

    #[test]
    fn a_calls_latest_teacher_score_is_the_one_shown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = ShardConfig {
            dir: dir.path().to_path_buf(),
            ..ShardConfig::default()
        };
        let score = |r: &str, seq: i64, lp: f64, at: i64| crate::record::ScoreRow {
            record_id: format!("{r}-{seq}-{at}"),
            rollout_id: r.into(),
            sequence: seq,
            teacher: "t".into(),
            teacher_model: None,
            teacher_logprobs: vec![lp, lp],
            prompt_tokens: 3,
            scored_at: at,
        };
        let rows = vec![
            score("a", 0, -1.0, 10),
            score("a", 0, -2.0, 20),
            score("a", 1, -3.0, 10),
            score("b", 0, -9.0, 30),
        ];
        write_now(&cfg, rows).expect("scores");
        let got = scores(dir.path(), "a").expect("scores");
        assert_eq!(got.len(), 2);
        assert_eq!(got.get(&0), Some(&vec![-2.0, -2.0]));
        assert_eq!(got.get(&1), Some(&vec![-3.0, -3.0]));
        assert!(scores(dir.path(), "nobody").expect("scores").is_empty());
    }
}
