//! Reading shards for the exports, in bounded memory.
//!
//! Calls are streamed out of `calls/*.parquet` (only the columns the exports
//! use), hash-partitioned by their rollout's *group*
//! ([`partition::Groups`]: the finish rows are read first) into spill
//! files, and handed back one partition at a time, each sorted by
//! (`rollout_id`, `sequence`) and split into rollouts ordered by (group,
//! `rollout_id`) ([`partition::by_group`]). So every group's rollouts are
//! in one partition and contiguous, however many calls there are. Small
//! inputs (one partition) never touch the disk. Rollout finish rows are
//! few (one per rollout) and are held in a map, latest finish per rollout.
//!
//! This file holds the call and finish rows and the shard readers;
//! [`partition`] holds the partitions and the grouping, `spill` the
//! format of the spill files.

pub mod partition;
#[cfg(test)]
pub(crate) mod partition_tests;
mod spill;

use super::ExportError;
use crate::record::shard::list_shards;
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// One call: the columns the exports read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallRec {
    pub rollout_id: String,
    pub sequence: i64,
    pub wire_api: String,
    pub model: Option<String>,
    pub route: Option<String>,
    pub status: String,
    pub failure_class: Option<String>,
    pub messages: Option<String>,
    pub tools: Option<String>,
    pub response_message: Option<String>,
    pub prompt_ids: Option<Vec<i32>>,
    pub completion_ids: Option<Vec<i32>>,
    pub completion_logprobs: Option<Vec<f64>>,
    pub user_agent: Option<String>,
    pub received_at: i64,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// The policy version the call was sent under (weight sync), when known.
    pub policy_version: Option<i64>,
    /// A retry of the call with this sequence number (an SDK's retry).
    pub attempt_of: Option<i64>,
    /// Outside the agent's trajectory (a harness's title generation, …).
    pub side_call: bool,
    /// Where an `abort` pause cut its stream and it was continued (the
    /// `continued` column's JSON).
    pub continued: Option<String>,
    /// Messages in the call's history, kept when `messages` is dropped on
    /// reading (the RL export's `Pass::tokens_only`).
    pub history_len: Option<i64>,
    /// The teacher's logprob of each completion token (`rollcall score`),
    /// from the latest `scores/` row of the call.
    pub teacher_logprobs: Option<Vec<f64>>,
}

/// One teacher score (a `scores/` row): what the exports join to its call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreRec {
    pub rollout_id: String,
    pub sequence: i64,
    /// Who scored it (the `teacher` column).
    pub teacher: String,
    pub scored_at: i64,
    pub logprobs: Vec<f64>,
}

impl CallRec {
    /// The policy version of each of its completion tokens (`n` of them):
    /// the version it was sent under, and after each continuation the
    /// version that generated the rest.
    pub fn token_policy_versions(&self, n: usize) -> Vec<Option<i64>> {
        let mut out = vec![self.policy_version; n];
        let spans: Vec<crate::record::Continued> = self
            .continued
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or_default();
        for s in spans {
            let from = usize::try_from(s.completion_tokens).unwrap_or(n).min(n);
            for v in &mut out[from..] {
                *v = Some(s.policy_version);
            }
        }
        out
    }

    /// Does the call carry prompt and completion token ids?
    pub fn has_token_ids(&self) -> bool {
        self.prompt_ids.is_some() && self.completion_ids.is_some()
    }

    /// For readers of token ids only (the RL export, the job API's groups):
    /// a call with token ids keeps its history's length and drops its JSON
    /// text (messages, tools, response message), half of its memory.
    pub fn keep_tokens_only(&mut self) {
        if !self.has_token_ids() {
            return;
        }
        self.history_len = self.messages.as_deref().and_then(|m| {
            serde_json::from_str::<Vec<serde::de::IgnoredAny>>(m)
                .ok()
                .map(|v| v.len() as i64)
        });
        (self.messages, self.tools, self.response_message) = (None, None, None);
    }
}

/// The finish row of a rollout that the exports use (the latest, or the
/// one [`Revision`] picks).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutInfo {
    pub status: String,
    pub reward: Option<f64>,
    pub metadata: Option<String>,
    pub finished_at: i64,
    /// Its reward revision: 0 for a finish (`POST .../finish`), N for the
    /// Nth re-scoring (finish metadata `revision.number`).
    pub revision: i64,
    pub record_id: String,
    /// Calls sequenced for the rollout when it finished.
    pub calls: i64,
}

/// Which of a rollout's finish rows a reader uses. A re-scoring
/// (`rollcall reward`, `rollcall judge`) adds a finish row with the next
/// revision number; nothing is overwritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Revision {
    /// The row finished last.
    #[default]
    Latest,
    /// The latest row of revision at most N (0: the reward as the rollout
    /// was finished, before any re-scoring).
    AtMost(i64),
}

impl std::str::FromStr for Revision {
    type Err = String;
    fn from_str(s: &str) -> Result<Revision, String> {
        match s {
            "latest" => Ok(Revision::Latest),
            "original" => Ok(Revision::AtMost(0)),
            n => n
                .parse::<i64>()
                .ok()
                .filter(|&n| n >= 0)
                .map(Revision::AtMost)
                .ok_or_else(|| {
                    format!("expected latest, original or a revision number, not {n:?}")
                }),
        }
    }
}

/// The revision number a finish row's metadata gives (0 when none).
pub fn revision_of(metadata: Option<&str>) -> i64 {
    metadata
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        .and_then(|m| {
            m.pointer("/revision/number")
                .and_then(serde_json::Value::as_i64)
        })
        .unwrap_or(0)
}

impl RolloutInfo {
    /// Balanced Adaptive Rollout's verdict on the rollout (finish metadata
    /// `bar.kept`), when `rollcall batch --adaptive` gave one.
    pub fn bar_kept(&self) -> Option<bool> {
        let m: serde_json::Value = serde_json::from_str(self.metadata.as_deref()?).ok()?;
        m.get("bar")?.get("kept")?.as_bool()
    }

    /// A string field of the finish metadata (numbers and booleans as text).
    pub fn meta_str(&self, key: &str) -> Option<String> {
        let m: serde_json::Value = serde_json::from_str(self.metadata.as_deref()?).ok()?;
        match m.get(key)? {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            v => Some(v.to_string()),
        }
    }
}

const CALL_COLUMNS: &[&str] = &[
    "rollout_id",
    "sequence",
    "wire_api",
    "model",
    "route",
    "status",
    "failure_class",
    "messages",
    "tools",
    "response_message",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "user_agent",
    "received_at",
    "prompt_tokens",
    "completion_tokens",
    "policy_version",
    "attempt_of",
    "side_call",
    "continued",
];

pub(crate) fn shard_err(p: &Path, e: impl std::fmt::Display) -> ExportError {
    ExportError::Shard {
        path: p.display().to_string(),
        message: e.to_string(),
    }
}

/// The shard files of one kind; errors when the directory is missing.
pub fn shard_files(dir: &Path, kind: &str) -> Result<Vec<PathBuf>, ExportError> {
    if !dir.is_dir() {
        return Err(ExportError::NoDir(dir.display().to_string()));
    }
    list_shards(dir, kind).map_err(|e| shard_err(&dir.join(kind), e))
}

/// Open one Parquet file reading only the named root columns that exist.
pub(crate) fn open_projected(
    path: &Path,
    cols: &[&str],
) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader, ExportError> {
    open_selected(path, cols, None)
}

/// [`open_projected`], reading only the rows `rows` selects when given (a
/// Parquet row selection: the other rows' pages are skipped).
pub(crate) fn open_selected(
    path: &Path,
    cols: &[&str],
    rows: Option<parquet::arrow::arrow_reader::RowSelection>,
) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader, ExportError> {
    let file = File::open(path).map_err(|e| shard_err(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| shard_err(path, e))?;
    let schema = builder.parquet_schema();
    let roots: Vec<usize> = schema
        .root_schema()
        .get_fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| cols.contains(&f.name()))
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(schema, roots);
    let mut builder = builder.with_projection(mask).with_batch_size(1024);
    if let Some(rows) = rows {
        builder = builder.with_row_selection(rows);
    }
    builder.build().map_err(|e| shard_err(path, e))
}

pub(crate) fn col<'a>(b: &'a RecordBatch, name: &str) -> Option<&'a ArrayRef> {
    b.column_by_name(name)
}

pub(crate) fn str_at(c: Option<&ArrayRef>, i: usize) -> Option<String> {
    str_ref(c, i).map(str::to_owned)
}

/// A string cell, borrowed from its batch (no copy).
pub(crate) fn str_ref(c: Option<&ArrayRef>, i: usize) -> Option<&str> {
    let c = c?;
    if c.is_null(i) {
        return None;
    }
    match c.data_type() {
        DataType::Utf8 => Some(c.as_string::<i32>().value(i)),
        DataType::LargeUtf8 => Some(c.as_string::<i64>().value(i)),
        _ => None,
    }
}

pub(crate) fn i64_at(c: Option<&ArrayRef>, i: usize) -> Option<i64> {
    let c = c?;
    if c.is_null(i) {
        return None;
    }
    match c.data_type() {
        DataType::Int64 => Some(c.as_primitive::<Int64Type>().value(i)),
        DataType::Int32 => Some(c.as_primitive::<Int32Type>().value(i) as i64),
        DataType::Timestamp(_, _) => Some(c.as_primitive::<TimestampMicrosecondType>().value(i)),
        _ => None,
    }
}

/// A boolean cell; false when null or absent.
pub(crate) fn bool_at(c: Option<&ArrayRef>, i: usize) -> bool {
    c.and_then(|c| c.as_boolean_opt())
        .is_some_and(|c| c.is_valid(i) && c.value(i))
}

pub(crate) fn ids_at(c: Option<&ArrayRef>, i: usize) -> Option<Vec<i32>> {
    let c = c?;
    if c.is_null(i) {
        return None;
    }
    let v = c.as_list_opt::<i32>()?.value(i);
    Some(v.as_primitive_opt::<Int32Type>()?.values().to_vec())
}

pub(crate) fn f64s_at(c: Option<&ArrayRef>, i: usize) -> Option<Vec<f64>> {
    let c = c?;
    if c.is_null(i) {
        return None;
    }
    let v = c.as_list_opt::<i32>()?.value(i);
    let p = v.as_primitive_opt::<Float64Type>()?;
    Some(
        (0..p.len())
            .map(|j| if p.is_null(j) { f64::NAN } else { p.value(j) })
            .collect(),
    )
}

/// Stream every call row of the shards in `dir` to `each`, file by file.
pub fn for_each_call(
    dir: &Path,
    mut each: impl FnMut(CallRec) -> Result<(), ExportError>,
) -> Result<usize, ExportError> {
    let files = shard_files(dir, "calls")?;
    if files.is_empty() {
        return Err(ExportError::NoShards(
            dir.join("calls").display().to_string(),
        ));
    }
    let mut n = 0;
    for path in &files {
        n += for_each_call_in(path, &mut each)?;
    }
    Ok(n)
}

/// Stream the call rows of one `calls/` shard file to `each`.
pub fn for_each_call_in(
    path: &Path,
    mut each: impl FnMut(CallRec) -> Result<(), ExportError>,
) -> Result<usize, ExportError> {
    let mut n = 0;
    for batch in open_projected(path, CALL_COLUMNS)? {
        let b = batch.map_err(|e| shard_err(path, e))?;
        let (Some(rid), Some(seq)) = (col(&b, "rollout_id"), col(&b, "sequence")) else {
            return Err(shard_err(path, "no rollout_id or sequence column"));
        };
        for i in 0..b.num_rows() {
            let (Some(rollout_id), Some(sequence)) = (str_at(Some(rid), i), i64_at(Some(seq), i))
            else {
                continue;
            };
            each(CallRec {
                rollout_id,
                sequence,
                wire_api: str_at(col(&b, "wire_api"), i).unwrap_or_default(),
                model: str_at(col(&b, "model"), i),
                route: str_at(col(&b, "route"), i),
                status: str_at(col(&b, "status"), i).unwrap_or_default(),
                failure_class: str_at(col(&b, "failure_class"), i),
                messages: str_at(col(&b, "messages"), i),
                tools: str_at(col(&b, "tools"), i),
                response_message: str_at(col(&b, "response_message"), i),
                prompt_ids: ids_at(col(&b, "prompt_token_ids"), i),
                completion_ids: ids_at(col(&b, "completion_token_ids"), i),
                completion_logprobs: f64s_at(col(&b, "completion_logprobs"), i),
                user_agent: str_at(col(&b, "user_agent"), i),
                received_at: i64_at(col(&b, "received_at"), i).unwrap_or(0),
                prompt_tokens: i64_at(col(&b, "prompt_tokens"), i),
                completion_tokens: i64_at(col(&b, "completion_tokens"), i),
                policy_version: i64_at(col(&b, "policy_version"), i),
                attempt_of: i64_at(col(&b, "attempt_of"), i),
                side_call: bool_at(col(&b, "side_call"), i),
                history_len: None,
                continued: str_at(col(&b, "continued"), i),
                teacher_logprobs: None,
            })?;
            n += 1;
        }
    }
    Ok(n)
}

/// The few columns of a call that a listing needs: no bodies, no ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallBrief {
    pub rollout_id: String,
    pub sequence: i64,
    pub model: Option<String>,
    pub route: Option<String>,
    pub status: String,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub received_at: i64,
    pub done_at: Option<i64>,
    pub policy_version: Option<i64>,
    pub user_agent: Option<String>,
    pub side_call: bool,
    /// Which of the files [`for_each_call_brief`] was given holds it.
    pub file: usize,
}

/// Stream every call of the `calls/` shard `files` (as [`shard_files`]
/// lists them) as a [`CallBrief`], reading only those columns.
pub fn for_each_call_brief(
    files: &[PathBuf],
    mut each: impl FnMut(CallBrief) -> Result<(), ExportError>,
) -> Result<usize, ExportError> {
    const COLS: &[&str] = &[
        "rollout_id",
        "sequence",
        "model",
        "route",
        "status",
        "prompt_tokens",
        "completion_tokens",
        "received_at",
        "done_at",
        "policy_version",
        "user_agent",
        "side_call",
    ];
    let mut n = 0;
    for (file, path) in files.iter().enumerate() {
        for batch in open_projected(path, COLS)? {
            let b = batch.map_err(|e| shard_err(path, e))?;
            for i in 0..b.num_rows() {
                let (Some(rollout_id), Some(sequence)) = (
                    str_at(col(&b, "rollout_id"), i),
                    i64_at(col(&b, "sequence"), i),
                ) else {
                    continue;
                };
                each(CallBrief {
                    rollout_id,
                    sequence,
                    model: str_at(col(&b, "model"), i),
                    route: str_at(col(&b, "route"), i),
                    status: str_at(col(&b, "status"), i).unwrap_or_default(),
                    prompt_tokens: i64_at(col(&b, "prompt_tokens"), i),
                    completion_tokens: i64_at(col(&b, "completion_tokens"), i),
                    received_at: i64_at(col(&b, "received_at"), i).unwrap_or(0),
                    done_at: i64_at(col(&b, "done_at"), i),
                    policy_version: i64_at(col(&b, "policy_version"), i),
                    user_agent: str_at(col(&b, "user_agent"), i),
                    side_call: bool_at(col(&b, "side_call"), i),
                    file,
                })?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Stream every teacher score of the shards in `dir` (none when there is no
/// `scores/` folder) to `each`.
pub fn for_each_score(
    dir: &Path,
    mut each: impl FnMut(ScoreRec) -> Result<(), ExportError>,
) -> Result<usize, ExportError> {
    let mut n = 0;
    let cols = [
        "rollout_id",
        "sequence",
        "teacher",
        "scored_at",
        "teacher_logprobs",
    ];
    for path in list_shards(dir, "scores").map_err(|e| shard_err(&dir.join("scores"), e))? {
        for batch in open_projected(&path, &cols)? {
            let b = batch.map_err(|e| shard_err(&path, e))?;
            for i in 0..b.num_rows() {
                let (Some(rollout_id), Some(sequence), Some(logprobs)) = (
                    str_at(col(&b, "rollout_id"), i),
                    i64_at(col(&b, "sequence"), i),
                    f64s_at(col(&b, "teacher_logprobs"), i),
                ) else {
                    continue;
                };
                each(ScoreRec {
                    rollout_id,
                    sequence,
                    teacher: str_at(col(&b, "teacher"), i).unwrap_or_default(),
                    scored_at: i64_at(col(&b, "scored_at"), i).unwrap_or(0),
                    logprobs,
                })?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Every rollout's latest finish row (by `finished_at`, then file order).
pub fn read_rollouts(dir: &Path) -> Result<BTreeMap<String, RolloutInfo>, ExportError> {
    read_rollouts_at(dir, Revision::Latest)
}

/// Every rollout's finish row that `pick` picks: the latest by
/// `finished_at` (then file order) of those it allows.
pub fn read_rollouts_at(
    dir: &Path,
    pick: Revision,
) -> Result<BTreeMap<String, RolloutInfo>, ExportError> {
    let mut out: BTreeMap<String, RolloutInfo> = BTreeMap::new();
    for path in shard_files(dir, "rollouts")? {
        let cols = [
            "rollout_id",
            "record_id",
            "status",
            "reward",
            "metadata",
            "finished_at",
            "calls",
        ];
        for batch in open_projected(&path, &cols)? {
            let b = batch.map_err(|e| shard_err(&path, e))?;
            let reward = col(&b, "reward").and_then(|c| c.as_primitive_opt::<Float64Type>());
            for i in 0..b.num_rows() {
                let Some(id) = str_at(col(&b, "rollout_id"), i) else {
                    continue;
                };
                let metadata = str_at(col(&b, "metadata"), i);
                let info = RolloutInfo {
                    status: str_at(col(&b, "status"), i).unwrap_or_default(),
                    reward: reward.filter(|r| !r.is_null(i)).map(|r| r.value(i)),
                    revision: revision_of(metadata.as_deref()),
                    metadata,
                    finished_at: i64_at(col(&b, "finished_at"), i).unwrap_or(0),
                    record_id: str_at(col(&b, "record_id"), i).unwrap_or_default(),
                    calls: i64_at(col(&b, "calls"), i).unwrap_or(0),
                };
                if let Revision::AtMost(n) = pick {
                    if info.revision > n {
                        continue;
                    }
                }
                match out.get(&id) {
                    Some(old) if old.finished_at > info.finished_at => {}
                    _ => {
                        out.insert(id, info);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The newest policy version any call ended under (`policy_version_end`),
/// when the shards record one: what `export rl --max-staleness` measures
/// staleness against.
pub fn latest_policy_version(dir: &Path) -> Result<Option<i64>, ExportError> {
    let mut latest: Option<i64> = None;
    for path in shard_files(dir, "calls")? {
        for batch in open_projected(&path, &["policy_version_end"])? {
            let b = batch.map_err(|e| shard_err(&path, e))?;
            for i in 0..b.num_rows() {
                if let Some(v) = i64_at(col(&b, "policy_version_end"), i) {
                    latest = Some(latest.map_or(v, |l| l.max(v)));
                }
            }
        }
    }
    Ok(latest)
}

/// Total call rows, from the Parquet footers (no data read).
pub fn count_calls(dir: &Path) -> Result<usize, ExportError> {
    let mut n = 0usize;
    for path in shard_files(dir, "calls")? {
        let file = File::open(&path).map_err(|e| shard_err(&path, e))?;
        let b = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| shard_err(&path, e))?;
        n += usize::try_from(b.metadata().file_metadata().num_rows()).unwrap_or(0);
    }
    Ok(n)
}
