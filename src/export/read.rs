//! Reading shards for the exports, in bounded memory.
//!
//! Calls are streamed out of `calls/*.parquet` (only the columns the exports
//! use), hash-partitioned by their rollout's *group* ([`Groups`]: the finish
//! rows are read first) into spill files, and handed back one partition at a
//! time, each sorted by (`rollout_id`, `sequence`) and split into rollouts
//! ordered by (group, `rollout_id`) ([`by_group`]). So every group's
//! rollouts are in one partition and contiguous, however many calls there
//! are. Small inputs (one partition) never touch the disk. Rollout finish
//! rows are few (one per rollout) and are held in a map, latest finish per
//! rollout.

use super::progress::Progress;
use super::ExportError;
use crate::record::shard::list_shards;
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
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
    /// Messages in the call's history, kept when `messages` is dropped on
    /// reading (the RL export's `Pass::tokens_only`).
    pub history_len: Option<i64>,
}

impl CallRec {
    /// Does the call carry prompt and completion token ids?
    pub fn has_token_ids(&self) -> bool {
        self.prompt_ids.is_some() && self.completion_ids.is_some()
    }
}

/// The latest finish row of a rollout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutInfo {
    pub status: String,
    pub reward: Option<f64>,
    pub metadata: Option<String>,
    pub finished_at: i64,
}

impl RolloutInfo {
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
];

fn shard_err(p: &Path, e: impl std::fmt::Display) -> ExportError {
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
fn open_projected(
    path: &Path,
    cols: &[&str],
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
    builder
        .with_projection(mask)
        .with_batch_size(1024)
        .build()
        .map_err(|e| shard_err(path, e))
}

fn col<'a>(b: &'a RecordBatch, name: &str) -> Option<&'a ArrayRef> {
    b.column_by_name(name)
}

fn str_at(c: Option<&ArrayRef>, i: usize) -> Option<String> {
    let c = c?;
    if c.is_null(i) {
        return None;
    }
    match c.data_type() {
        DataType::Utf8 => Some(c.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Some(c.as_string::<i64>().value(i).to_owned()),
        _ => None,
    }
}

fn i64_at(c: Option<&ArrayRef>, i: usize) -> Option<i64> {
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

fn ids_at(c: Option<&ArrayRef>, i: usize) -> Option<Vec<i32>> {
    let c = c?;
    if c.is_null(i) {
        return None;
    }
    let v = c.as_list_opt::<i32>()?.value(i);
    Some(v.as_primitive_opt::<Int32Type>()?.values().to_vec())
}

fn f64s_at(c: Option<&ArrayRef>, i: usize) -> Option<Vec<f64>> {
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
        for batch in open_projected(path, CALL_COLUMNS)? {
            let b = batch.map_err(|e| shard_err(path, e))?;
            let (Some(rid), Some(seq)) = (col(&b, "rollout_id"), col(&b, "sequence")) else {
                return Err(shard_err(path, "no rollout_id or sequence column"));
            };
            for i in 0..b.num_rows() {
                let (Some(rollout_id), Some(sequence)) =
                    (str_at(Some(rid), i), i64_at(Some(seq), i))
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
                    history_len: None,
                })?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Every rollout's latest finish row (by `finished_at`, then file order).
pub fn read_rollouts(dir: &Path) -> Result<BTreeMap<String, RolloutInfo>, ExportError> {
    let mut out: BTreeMap<String, RolloutInfo> = BTreeMap::new();
    for path in shard_files(dir, "rollouts")? {
        let cols = ["rollout_id", "status", "reward", "metadata", "finished_at"];
        for batch in open_projected(&path, &cols)? {
            let b = batch.map_err(|e| shard_err(&path, e))?;
            let reward = col(&b, "reward").and_then(|c| c.as_primitive_opt::<Float64Type>());
            for i in 0..b.num_rows() {
                let Some(id) = str_at(col(&b, "rollout_id"), i) else {
                    continue;
                };
                let info = RolloutInfo {
                    status: str_at(col(&b, "status"), i).unwrap_or_default(),
                    reward: reward.filter(|r| !r.is_null(i)).map(|r| r.value(i)),
                    metadata: str_at(col(&b, "metadata"), i),
                    finished_at: i64_at(col(&b, "finished_at"), i).unwrap_or(0),
                };
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

/// The group of every rollout ([`super::group_of`]), by rollout id.
#[derive(Debug, Default, Clone)]
pub struct Groups(HashMap<String, String>);

impl Groups {
    /// Groups from the finish rows, keyed by finish metadata `group_by`
    /// (default `group`, then `task`).
    pub fn new(rollouts: &BTreeMap<String, RolloutInfo>, group_by: Option<&str>) -> Groups {
        Groups(
            rollouts
                .iter()
                .filter_map(|(id, info)| {
                    let g = super::group_of(id, Some(info), group_by);
                    (g != *id).then(|| (id.clone(), g))
                })
                .collect(),
        )
    }

    /// The group of a rollout: its own id when it has no finish row or no
    /// group key.
    pub fn of<'a>(&'a self, rollout_id: &'a str) -> &'a str {
        self.0.get(rollout_id).map_or(rollout_id, String::as_str)
    }
}

/// FNV-1a: a stable hash, so partitions (and output order) never change
/// between runs.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

// ------------------------------------------------------------ spill format

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_opt_str(out: &mut Vec<u8>, s: &Option<String>) {
    match s {
        Some(s) => {
            out.push(1);
            put_bytes(out, s.as_bytes());
        }
        None => out.push(0),
    }
}

fn put_opt_i64(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_le_bytes());
        }
        None => out.push(0),
    }
}

fn encode(c: &CallRec, out: &mut Vec<u8>) {
    put_bytes(out, c.rollout_id.as_bytes());
    out.extend_from_slice(&c.sequence.to_le_bytes());
    put_bytes(out, c.wire_api.as_bytes());
    put_opt_str(out, &c.model);
    put_opt_str(out, &c.route);
    put_bytes(out, c.status.as_bytes());
    put_opt_str(out, &c.failure_class);
    put_opt_str(out, &c.messages);
    put_opt_str(out, &c.tools);
    put_opt_str(out, &c.response_message);
    for ids in [&c.prompt_ids, &c.completion_ids] {
        match ids {
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                for x in v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            None => out.push(0),
        }
    }
    match &c.completion_logprobs {
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        None => out.push(0),
    }
    put_opt_str(out, &c.user_agent);
    out.extend_from_slice(&c.received_at.to_le_bytes());
    put_opt_i64(out, c.prompt_tokens);
    put_opt_i64(out, c.completion_tokens);
    put_opt_i64(out, c.history_len);
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn opt_string(&mut self) -> Option<Option<String>> {
        match self.u8()? {
            0 => Some(None),
            _ => Some(Some(self.string()?)),
        }
    }
    fn opt_i64(&mut self) -> Option<Option<i64>> {
        match self.u8()? {
            0 => Some(None),
            _ => Some(Some(self.i64()?)),
        }
    }
    fn opt_ids(&mut self) -> Option<Option<Vec<i32>>> {
        if self.u8()? == 0 {
            return Some(None);
        }
        let n = self.u32()? as usize;
        let b = self.take(n * 4)?;
        Some(Some(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }
    fn opt_f64s(&mut self) -> Option<Option<Vec<f64>>> {
        if self.u8()? == 0 {
            return Some(None);
        }
        let n = self.u32()? as usize;
        let b = self.take(n * 8)?;
        Some(Some(
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ))
    }
}

fn decode(b: &[u8]) -> Option<CallRec> {
    let mut c = Cursor(b);
    Some(CallRec {
        rollout_id: c.string()?,
        sequence: c.i64()?,
        wire_api: c.string()?,
        model: c.opt_string()?,
        route: c.opt_string()?,
        status: c.string()?,
        failure_class: c.opt_string()?,
        messages: c.opt_string()?,
        tools: c.opt_string()?,
        response_message: c.opt_string()?,
        prompt_ids: c.opt_ids()?,
        completion_ids: c.opt_ids()?,
        completion_logprobs: c.opt_f64s()?,
        user_agent: c.opt_string()?,
        received_at: c.i64()?,
        prompt_tokens: c.opt_i64()?,
        completion_tokens: c.opt_i64()?,
        history_len: c.opt_i64()?,
    })
}

/// Calls grouped by partition: in memory when there is one, else in spill
/// files under a scratch directory removed on drop.
pub struct Partitions {
    memory: Option<Vec<CallRec>>,
    files: Vec<PathBuf>,
    scratch: Option<PathBuf>,
    pub rows: usize,
}

impl Drop for Partitions {
    fn drop(&mut self) {
        if let Some(s) = &self.scratch {
            let _ = std::fs::remove_dir_all(s);
        }
    }
}

/// Calls per partition: small enough to hold one partition's rollouts.
pub const ROWS_PER_PARTITION: usize = 20_000;

impl Partitions {
    /// Read every call of `dir`, keeping those `keep` accepts (it may also
    /// trim what is kept), into partitions by the hash of their rollout's
    /// group (spilled under `scratch` when there are several), counting
    /// each call read.
    pub fn load(
        dir: &Path,
        scratch: &Path,
        rows_per_partition: usize,
        keep: impl Fn(&mut CallRec) -> bool,
        groups: &Groups,
        progress: &Progress,
    ) -> Result<Partitions, ExportError> {
        let total = count_calls(dir)?;
        let n = total.div_ceil(rows_per_partition.max(1)).clamp(1, 512);
        let io = |e: std::io::Error| ExportError::Io(format!("{}: {e}", scratch.display()));
        if n == 1 {
            let mut v = Vec::new();
            let rows = for_each_call(dir, |mut c| {
                progress.call();
                if keep(&mut c) {
                    v.push(c);
                }
                Ok(())
            })?;
            return Ok(Partitions {
                memory: Some(v),
                files: vec![],
                scratch: None,
                rows,
            });
        }
        std::fs::create_dir_all(scratch).map_err(io)?;
        let mut parts = Partitions {
            memory: None,
            files: (0..n)
                .map(|i| scratch.join(format!("part-{i:04}.bin")))
                .collect(),
            scratch: Some(scratch.to_path_buf()),
            rows: 0,
        };
        let mut writers = parts
            .files
            .iter()
            .map(|p| File::create(p).map(|f| BufWriter::with_capacity(32 << 10, f)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        let mut buf = Vec::new();
        parts.rows = for_each_call(dir, |mut c| {
            progress.call();
            if !keep(&mut c) {
                return Ok(());
            }
            buf.clear();
            encode(&c, &mut buf);
            let w = &mut writers[(stable_hash(groups.of(&c.rollout_id)) % n as u64) as usize];
            w.write_all(&(buf.len() as u32).to_le_bytes())
                .and_then(|()| w.write_all(&buf))
                .map_err(io)
        })?;
        for w in writers {
            w.into_inner().map_err(|e| io(e.into_error()))?;
        }
        Ok(parts)
    }

    pub fn len(&self) -> usize {
        if self.memory.is_some() {
            1
        } else {
            self.files.len()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The calls of partition `i`, sorted by rollout and sequence, with
    /// duplicate (rollout, sequence) rows dropped.
    pub fn take(&mut self, i: usize) -> Result<Vec<CallRec>, ExportError> {
        let mut v = match &mut self.memory {
            Some(m) => std::mem::take(m),
            None => {
                let path = &self.files[i];
                let io = |e: std::io::Error| ExportError::Io(format!("{}: {e}", path.display()));
                let mut r = BufReader::new(File::open(path).map_err(io)?);
                let mut v = Vec::new();
                let mut len = [0u8; 4];
                let mut buf = Vec::new();
                loop {
                    match r.read_exact(&mut len) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                        Err(e) => return Err(io(e)),
                    }
                    buf.resize(u32::from_le_bytes(len) as usize, 0);
                    r.read_exact(&mut buf).map_err(io)?;
                    v.push(decode(&buf).ok_or_else(|| {
                        ExportError::Io(format!("{}: corrupt spill record", path.display()))
                    })?);
                }
                let _ = std::fs::remove_file(path);
                v
            }
        };
        v.sort_by(|a, b| {
            (a.rollout_id.as_str(), a.sequence).cmp(&(b.rollout_id.as_str(), b.sequence))
        });
        v.dedup_by(|a, b| a.rollout_id == b.rollout_id && a.sequence == b.sequence);
        Ok(v)
    }
}

/// Split sorted calls into runs of one rollout each.
pub fn by_rollout(calls: Vec<CallRec>) -> Vec<Vec<CallRec>> {
    let mut out: Vec<Vec<CallRec>> = Vec::new();
    for c in calls {
        match out.last_mut() {
            Some(last) if last[0].rollout_id == c.rollout_id => last.push(c),
            _ => out.push(vec![c]),
        }
    }
    out
}

/// Split a partition's sorted calls into rollouts, ordered by (group,
/// rollout id): each group's rollouts contiguous.
pub fn by_group(calls: Vec<CallRec>, groups: &Groups) -> Vec<Vec<CallRec>> {
    let mut rollouts = by_rollout(calls);
    let id = |r: &[CallRec]| r.first().map_or(String::new(), |c| c.rollout_id.clone());
    rollouts.sort_by_cached_key(|r| {
        let id = id(r);
        (groups.of(&id).to_owned(), id)
    });
    rollouts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spill_records_round_trip() {
        let c = CallRec {
            rollout_id: "r".into(),
            sequence: 7,
            wire_api: "chat_completions".into(),
            model: Some("m".into()),
            status: "ok".into(),
            messages: Some("[]".into()),
            prompt_ids: Some(vec![1, -2, 3]),
            completion_logprobs: Some(vec![-0.5, f64::NAN]),
            received_at: 42,
            completion_tokens: Some(3),
            ..Default::default()
        };
        let mut b = Vec::new();
        encode(&c, &mut b);
        let d = decode(&b).expect("decodes");
        assert_eq!(d.prompt_ids, c.prompt_ids);
        assert!(d
            .completion_logprobs
            .as_ref()
            .is_some_and(|v| v[1].is_nan()));
        assert_eq!(d.completion_tokens, Some(3));
        assert_eq!(d.route, None);
        assert!(decode(&b[..b.len() - 1]).is_none());
    }
}

#[cfg(test)]
pub(crate) mod partition_tests {
    use super::*;
    use crate::config::ShardConfig;
    use crate::record::shard::write_now;
    use crate::record::CallRow;

    pub(crate) fn call_row(rollout: &str, seq: i64) -> CallRow {
        CallRow {
            call_id: format!("{rollout}-{seq}"),
            rollout_id: rollout.into(),
            sequence: seq,
            wire_api: "chat_completions".into(),
            route: None,
            model: Some("m".into()),
            upstream_model: None,
            stream: false,
            status: "ok".into(),
            http_status: Some(200),
            failure_class: None,
            failure_message: None,
            request: "{}".into(),
            upstream_request: None,
            response: None,
            response_raw: None,
            messages: Some("[]".into()),
            tools: None,
            response_message: None,
            tool_calls: None,
            finish_reason: None,
            received_at: seq,
            first_byte_at: None,
            done_at: None,
            prompt_tokens: None,
            completion_tokens: None,
            total_tokens: None,
            cached_tokens: None,
            reasoning_tokens: None,
            token_capture: "ids".into(),
            prompt_token_ids: Some(vec![1, 2, seq as i32]),
            completion_token_ids: Some(vec![3]),
            prompt_logprobs: None,
            completion_logprobs: Some(vec![-0.5]),
            user_agent: None,
            upstream_api: None,
            upstream_response_raw: None,
        }
    }

    #[test]
    fn spilled_partitions_hold_the_same_rollouts_as_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = ShardConfig {
            dir: dir.path().join("shards"),
            ..ShardConfig::default()
        };
        let mut rows = vec![];
        for r in 0..30 {
            for s in (0..4).rev() {
                rows.push(call_row(&format!("r{r:02}"), s));
            }
        }
        rows.push(call_row("r00", 0)); // a duplicate row
        write_now(&cfg, rows).expect("write");
        let collect = |per: usize| {
            let mut p = Partitions::load(
                &cfg.dir,
                &dir.path().join("spill"),
                per,
                |_| true,
                &Groups::default(),
                &Progress::hidden(),
            )
            .expect("load");
            let mut out = vec![];
            for i in 0..p.len() {
                for r in by_rollout(p.take(i).expect("take")) {
                    out.push((
                        r[0].rollout_id.clone(),
                        r.iter().map(|c| c.sequence).collect::<Vec<_>>(),
                    ));
                }
            }
            (p.len(), out)
        };
        let (n1, mut one) = collect(1_000);
        let (n8, many) = collect(16);
        assert_eq!((n1, n8), (1, 8));
        assert!(!dir.path().join("spill").join("part-0000.bin").exists());
        let mut sorted = many.clone();
        sorted.sort();
        one.sort();
        assert_eq!(sorted, one);
        assert_eq!(one.len(), 30);
        assert!(one.iter().all(|(_, s)| s == &vec![0, 1, 2, 3]));
        // The same input gives the same order every time.
        assert_eq!(collect(16).1, many);
        assert!(matches!(
            Partitions::load(
                &dir.path().join("nope"),
                dir.path(),
                1,
                |_| true,
                &Groups::default(),
                &Progress::hidden()
            ),
            Err(ExportError::NoDir(_))
        ));
    }
}
