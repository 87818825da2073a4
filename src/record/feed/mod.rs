//! The live feed for asynchronous trainers (`shards.feed = true`): each
//! rollout, once it finishes, as one entry of an ordered log, with its calls,
//! reward, group and policy versions. `GET /v1/rollouts/feed?after=CURSOR`
//! serves it; a trainer keeps the cursor of the last entry it took and asks
//! again after a restart, so every finished rollout reaches it once.
//!
//! ```text
//! shard writer ── each call row ──▶ journal/NNNNNN.jsonl   (the calls of rollouts not finished yet)
//!              ── each finish ───▶ entries.jsonl + entries.idx ──▶ readers (a watch of the newest cursor)
//! ```
//!
//! - **Journal.** Every call row is appended to the journal as a line
//!   `HEAD\tCALL\n` (HEAD: the rollout, the call's id, sequence, attempt and
//!   policy version; CALL: the call as the entry carries it). At a finish the
//!   rollout's lines are read back, and a tombstone line `{"r":..,"d":true}`
//!   closes them. Segments rotate at [`JOURNAL_SEGMENT_BYTES`]; at each
//!   rotation the oldest segment's lines of unfinished rollouts are copied
//!   forward and it is deleted, so the journal holds about the calls in
//!   flight plus a segment or two.
//! - **Entries.** One JSON line per finish in `entries.jsonl`; the entry's
//!   cursor is its line number (from 1). `entries.idx` holds a fixed-size
//!   record per entry (offset, length, hashes of the finish's record id and of
//!   the rollout id), appended after the line, so that start-up reads the
//!   index and not the entries. A line without its record (a crash between
//!   the two writes) is indexed again at start, and a torn line is cut.
//! - **Crash and replay.** Rows the write-ahead log replays at start reach
//!   the feed again: a call already in the journal is kept once (by call
//!   id), a finish already delivered is not delivered twice (by record id),
//!   and during replay the calls of rollouts already delivered are dropped.
//!   With `shards.wal_fsync`, every feed write is synced too.
//!
//! Not bounded: `entries.jsonl` grows like the shards do (one entry per
//! finished rollout, with its calls), and is kept until removed by hand.

mod journal;
#[cfg(test)]
mod tests;

use super::row::CallRow;
use super::RolloutFinish;
use bytes::Bytes;
use journal::{Head, Journal, Loc};
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

/// A journal segment is closed after this many bytes.
pub const JOURNAL_SEGMENT_BYTES: u64 = 64 << 20;

/// One index record: offset (8), length (4), record-id hash (8), rollout hash (8).
const IDX_RECORD: usize = 28;

/// A stable 64-bit hash (stored in `entries.idx`): SHA-256's first 8 bytes,
/// with the crate the model fetch already uses; a finish is hashed twice.
fn hash(s: &str) -> u64 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(s.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

/// The readers' view of the entries: shared by the shard writer (which
/// appends) and every feed request (which reads).
struct Log {
    entries: PathBuf,
    /// Offset and length of each entry; entry `i` has cursor `i + 1`.
    index: RwLock<Vec<(u64, u32)>>,
    newest: watch::Sender<u64>,
}

/// A reader of the feed.
#[derive(Clone)]
pub struct Feed {
    log: Arc<Log>,
}

impl Feed {
    /// The newest entry's cursor (0: none yet).
    pub fn newest(&self) -> u64 {
        *self.log.newest.borrow()
    }

    /// Wakes when entries are added.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.log.newest.subscribe()
    }

    /// Up to `max` entries after cursor `after`: (cursor, the entry's JSON line).
    pub fn read(&self, after: u64, max: usize) -> io::Result<Vec<(u64, Bytes)>> {
        let spans: Vec<(u64, u64, u32)> = {
            let index = self.log.index.read().unwrap_or_else(|p| p.into_inner());
            let from = usize::try_from(after)
                .unwrap_or(usize::MAX)
                .min(index.len());
            index[from..]
                .iter()
                .take(max)
                .enumerate()
                .map(|(i, &(off, len))| ((from + i + 1) as u64, off, len))
                .collect()
        };
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let file = File::open(&self.log.entries)?;
        spans
            .into_iter()
            .map(|(cursor, off, len)| {
                let mut buf = vec![0; len as usize];
                file.read_exact_at(&mut buf, off)?;
                Ok((cursor, Bytes::from(buf)))
            })
            .collect()
    }
}

/// A call as the feed carries it: the row without its raw bytes, with the
/// JSON columns as JSON.
#[derive(Serialize)]
struct FeedCall<'a> {
    call_id: &'a str,
    sequence: i64,
    attempt: i32,
    attempt_of: Option<i64>,
    side_call: bool,
    status: &'a str,
    http_status: Option<i32>,
    failure_class: Option<&'a str>,
    wire_api: &'a str,
    route: Option<&'a str>,
    model: Option<&'a str>,
    stream: bool,
    messages: Option<Json<'a>>,
    tools: Option<Json<'a>>,
    response_message: Option<Json<'a>>,
    finish_reason: Option<&'a str>,
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    token_capture: &'a str,
    prompt_token_ids: Option<&'a [i32]>,
    completion_token_ids: Option<&'a [i32]>,
    prompt_logprobs: Option<&'a [f64]>,
    completion_logprobs: Option<&'a [f64]>,
    policy_version: Option<i64>,
    policy_version_end: Option<i64>,
    resent: i32,
    replica: Option<&'a str>,
    received_at: i64,
    done_at: Option<i64>,
}

/// A JSON column as the JSON it holds, borrowed from the row (as a string
/// when it is not JSON).
#[derive(Serialize)]
#[serde(untagged)]
enum Json<'a> {
    Raw(&'a RawValue),
    Text(&'a str),
}

fn raw(col: &Option<String>) -> Option<Json<'_>> {
    let s = col.as_deref()?;
    Some(serde_json::from_str(s).map_or(Json::Text(s), Json::Raw))
}

impl<'a> FeedCall<'a> {
    fn of(r: &'a CallRow) -> Self {
        FeedCall {
            call_id: &r.call_id,
            sequence: r.sequence,
            attempt: r.attempt,
            attempt_of: r.attempt_of,
            side_call: r.side_call,
            status: &r.status,
            http_status: r.http_status,
            failure_class: r.failure_class.as_deref(),
            wire_api: &r.wire_api,
            route: r.route.as_deref(),
            model: r.model.as_deref(),
            stream: r.stream,
            messages: raw(&r.messages),
            tools: raw(&r.tools),
            response_message: raw(&r.response_message),
            finish_reason: r.finish_reason.as_deref(),
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            token_capture: &r.token_capture,
            prompt_token_ids: r.prompt_token_ids.as_deref(),
            completion_token_ids: r.completion_token_ids.as_deref(),
            prompt_logprobs: r.prompt_logprobs.as_deref(),
            completion_logprobs: r.completion_logprobs.as_deref(),
            policy_version: r.policy_version,
            policy_version_end: r.policy_version_end,
            resent: r.resent,
            replica: r.replica.as_deref(),
            received_at: r.received_at,
            done_at: r.done_at,
        }
    }
}

/// An entry's fields besides its calls.
#[derive(Serialize)]
struct EntryHead<'a> {
    cursor: u64,
    rollout_id: &'a str,
    record_id: &'a str,
    status: &'a str,
    reward: Option<f64>,
    group: Option<String>,
    metadata: Option<Json<'a>>,
    finished_at: i64,
    /// One per call, in order (null where the route has no gate).
    policy_versions: Vec<Option<i64>>,
}

/// The feed's writer, on the shard writer's thread (and replay's, before).
pub struct FeedWriter {
    log: Arc<Log>,
    journal: Journal,
    entries: File,
    entries_len: u64,
    idx: File,
    delivered: HashSet<u64>,
    delivered_rollouts: HashSet<u64>,
    fsync: bool,
    /// Replay is feeding rows again: drop calls of delivered rollouts.
    replaying: bool,
    /// Rotate the journal's segment after this many bytes.
    segment_bytes: u64,
}

impl FeedWriter {
    /// Open (or create) `dir` and rebuild the index and journal from it.
    pub fn open(dir: &Path, fsync: bool) -> io::Result<(FeedWriter, Feed)> {
        std::fs::create_dir_all(dir)?;
        let entries_path = dir.join("entries.jsonl");
        let mut entries = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&entries_path)?;
        let mut idx = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(dir.join("entries.idx"))?;
        let mut raw_idx = Vec::new();
        idx.read_to_end(&mut raw_idx)?;
        let whole = raw_idx.len() / IDX_RECORD * IDX_RECORD;
        if whole != raw_idx.len() {
            idx.set_len(whole as u64)?;
        }
        let mut index = Vec::new();
        let (mut delivered, mut delivered_rollouts) = (HashSet::new(), HashSet::new());
        let entries_len = entries.metadata()?.len();
        for rec in raw_idx[..whole].chunks_exact(IDX_RECORD) {
            let num = |r: std::ops::Range<usize>| {
                let mut b = [0u8; 8];
                b[..r.len()].copy_from_slice(&rec[r]);
                u64::from_le_bytes(b)
            };
            let (off, len) = (num(0..8), num(8..12) as u32);
            if off + u64::from(len) > entries_len {
                // The index ran ahead of a cut entries file: stop there.
                idx.set_len((index.len() * IDX_RECORD) as u64)?;
                break;
            }
            index.push((off, len));
            delivered.insert(num(12..20));
            delivered_rollouts.insert(num(20..28));
        }
        // Entries written after the last index record: index them again, or
        // cut a torn one.
        let indexed_end = index.last().map_or(0, |&(o, l)| o + u64::from(l));
        let mut w_tail = Vec::new();
        if indexed_end < entries_len {
            entries.seek(SeekFrom::Start(indexed_end))?;
            let mut tail = Vec::new();
            entries.read_to_end(&mut tail)?;
            let mut at = 0usize;
            while let Some(n) = tail[at..].iter().position(|&b| b == b'\n') {
                let line = &tail[at..at + n + 1];
                let v: Option<serde_json::Value> = serde_json::from_slice(line).ok();
                let id = |k: &str| {
                    v.as_ref()
                        .and_then(|v| v.get(k)?.as_str().map(str::to_owned))
                };
                let (Some(rec), Some(rollout)) = (id("record_id"), id("rollout_id")) else {
                    break;
                };
                w_tail.push((indexed_end + at as u64, line.len() as u32, rec, rollout));
                at += n + 1;
            }
            let cut = indexed_end + at as u64;
            if cut < entries_len {
                tracing::warn!(path = %entries_path.display(), cut, "feed: cutting a torn entry");
                entries.set_len(cut)?;
            }
        }
        let journal = Journal::open(dir.join("journal"))?;
        let log = Arc::new(Log {
            entries: entries_path,
            index: RwLock::new(index),
            newest: watch::Sender::new(0),
        });
        let mut w = FeedWriter {
            log: log.clone(),
            journal,
            entries_len: entries.metadata()?.len(),
            entries,
            idx,
            delivered,
            delivered_rollouts,
            fsync,
            replaying: false,
            segment_bytes: JOURNAL_SEGMENT_BYTES,
        };
        for (off, len, rec, rollout) in w_tail {
            w.index_entry(off, len, &rec, &rollout)?;
        }
        let newest = w.log.index.read().map_or(0, |i| i.len() as u64);
        w.log.newest.send_replace(newest);
        Ok((w, Feed { log }))
    }

    fn index_entry(&mut self, off: u64, len: u32, record: &str, rollout: &str) -> io::Result<()> {
        let (rh, oh) = (hash(record), hash(rollout));
        let mut rec = Vec::with_capacity(IDX_RECORD);
        rec.extend_from_slice(&off.to_le_bytes());
        rec.extend_from_slice(&len.to_le_bytes());
        rec.extend_from_slice(&rh.to_le_bytes());
        rec.extend_from_slice(&oh.to_le_bytes());
        self.idx.write_all(&rec)?;
        if self.fsync {
            self.idx.sync_data()?;
        }
        self.delivered.insert(rh);
        self.delivered_rollouts.insert(oh);
        let n = {
            let mut index = self.log.index.write().unwrap_or_else(|p| p.into_inner());
            index.push((off, len));
            index.len() as u64
        };
        self.log.newest.send_replace(n);
        Ok(())
    }

    /// Rows that follow come from replaying the write-ahead log (or not).
    pub fn replaying(&mut self, on: bool) {
        self.replaying = on;
    }

    /// A call's row: into the journal until its rollout finishes.
    pub fn call(&mut self, row: &CallRow) -> io::Result<()> {
        let pending = self.journal.pending.get(&row.rollout_id);
        if pending.is_some_and(|p| p.contains_key(&row.call_id)) {
            return Ok(());
        }
        if self.replaying && self.delivered_rollouts.contains(&hash(&row.rollout_id)) {
            return Ok(());
        }
        let head = Head {
            r: row.rollout_id.clone(),
            c: Some(row.call_id.clone()),
            s: row.sequence,
            a: row.attempt,
            v: row.policy_version,
            d: false,
        };
        let mut line = serde_json::to_vec(&head).map_err(io::Error::other)?;
        line.push(b'\t');
        serde_json::to_writer(&mut line, &FeedCall::of(row)).map_err(io::Error::other)?;
        line.push(b'\n');
        let (segment, offset) = self.journal.append(&line)?;
        if self.fsync {
            self.journal.file.sync_data()?;
        }
        let loc = Loc {
            segment,
            offset,
            len: line.len() as u32,
            sequence: row.sequence,
            attempt: row.attempt,
            policy_version: row.policy_version,
        };
        self.journal
            .pending
            .entry(row.rollout_id.clone())
            .or_default()
            .insert(row.call_id.clone(), loc);
        *self.journal.live.entry(segment).or_insert(0) += 1;
        if self.journal.len >= self.segment_bytes {
            self.journal.rotate()?;
        }
        Ok(())
    }

    /// A rollout's finish: its entry, with the calls the journal holds.
    pub fn finish(&mut self, fin: &RolloutFinish) -> io::Result<()> {
        if self.delivered.contains(&hash(&fin.record_id)) {
            return self.close(&fin.rollout_id);
        }
        let mut calls: Vec<Loc> = self
            .journal
            .pending
            .get(&fin.rollout_id)
            .map(|c| c.values().copied().collect())
            .unwrap_or_default();
        calls.sort_by_key(|l| (l.sequence, l.attempt));
        let cursor = self.log.index.read().map_or(0, |i| i.len() as u64) + 1;
        let metadata = raw(&fin.metadata);
        let group = fin
            .metadata
            .as_deref()
            .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
            .and_then(|m| m.get("group")?.as_str().map(str::to_owned));
        let head = EntryHead {
            cursor,
            rollout_id: &fin.rollout_id,
            record_id: &fin.record_id,
            status: &fin.status,
            reward: fin.reward,
            group,
            metadata,
            finished_at: fin.finished_at,
            policy_versions: calls.iter().map(|l| l.policy_version).collect(),
        };
        let mut line = serde_json::to_vec(&head).map_err(io::Error::other)?;
        line.pop(); // the closing brace: the calls follow
        line.extend_from_slice(b",\"calls\":[");
        for (i, loc) in calls.iter().enumerate() {
            let text = self.journal.read(loc)?;
            let call = text
                .iter()
                .position(|&b| b == b'\t')
                .map_or(&b"null"[..], |t| text[t + 1..].trim_ascii_end());
            if i > 0 {
                line.push(b',');
            }
            line.extend_from_slice(call);
        }
        line.extend_from_slice(b"]}\n");
        let off = self.entries_len;
        self.entries.write_all(&line)?;
        if self.fsync {
            self.entries.sync_data()?;
        }
        self.entries_len += line.len() as u64;
        self.index_entry(off, line.len() as u32, &fin.record_id, &fin.rollout_id)?;
        self.close(&fin.rollout_id)
    }

    /// Close a rollout's journal lines with a tombstone.
    fn close(&mut self, rollout: &str) -> io::Result<()> {
        let Some(calls) = self.journal.pending.remove(rollout) else {
            return Ok(());
        };
        let head = Head {
            r: rollout.to_owned(),
            c: None,
            s: 0,
            a: 0,
            v: None,
            d: true,
        };
        let mut line = serde_json::to_vec(&head).map_err(io::Error::other)?;
        line.push(b'\n');
        self.journal.append(&line)?;
        for loc in calls.values() {
            if let Some(n) = self.journal.live.get_mut(&loc.segment) {
                *n = n.saturating_sub(1);
            }
        }
        self.journal.collect()
    }
}
