//! A job's finished groups in training shape, as an ordered log that
//! `GET /v1/jobs/{id}/groups?after=CURSOR` reads.
//!
//! ```text
//! batch ── group over ──▶ pending ──▶ Recorder::publish ──▶ new calls/ files read (this job's rows)
//!                                  ──▶ export::rl::rollout_samples per sample ──▶ groups.jsonl (cursor = line)
//! ```
//!
//! A group's samples are built by the RL export's own code
//! ([`crate::export::rl::rollout_samples`]) from the rows in the shards,
//! once, when the group is over; the line is kept in `groups.jsonl` beside
//! the job, so a trainer that restarts asks again with its cursor, and a
//! server that restarts serves the same lines. Until its group is over, a
//! rollout's rows that have been read wait in memory (a job's own rows
//! only, dropped as its groups are written).

use super::JobError;
use crate::export::read::{self, CallRec, RolloutInfo};
use crate::export::rl::{self, RlOptions};
use crate::export::{Filters, Report};
use crate::rollout::summary::{GroupResult, SampleResult};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use tokio::sync::watch;

/// The ordered log of a job's groups (`groups.jsonl`).
pub struct GroupLog {
    path: PathBuf,
    /// Offset and length of each line; line `i` has cursor `i + 1`.
    index: RwLock<Vec<(u64, u32)>>,
    /// Groups already written (a resumed job meets them again).
    ids: Mutex<HashSet<String>>,
    newest: watch::Sender<u64>,
}

impl GroupLog {
    /// Open (or create) the log at `path`, indexing what it holds; a torn
    /// last line (a crash mid-write) is cut.
    pub fn open(path: &Path) -> Result<GroupLog, JobError> {
        let io = |e: std::io::Error| JobError::Io(path.to_owned(), e);
        let mut index = vec![];
        let mut ids = HashSet::new();
        let mut end = 0u64;
        if path.exists() {
            let mut r = BufReader::new(File::open(path).map_err(io)?);
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = r.read_until(b'\n', &mut line).map_err(io)?;
                if n == 0 || line.last() != Some(&b'\n') {
                    break;
                }
                let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                    break;
                };
                if let Some(g) = v.get("group").and_then(Value::as_str) {
                    ids.insert(g.to_owned());
                }
                index.push((end, n as u32));
                end += n as u64;
            }
            let f = OpenOptions::new().write(true).open(path).map_err(io)?;
            f.set_len(end).map_err(io)?;
        }
        let (newest, _) = watch::channel(index.len() as u64);
        Ok(GroupLog {
            path: path.to_owned(),
            index: RwLock::new(index),
            ids: Mutex::new(ids),
            newest,
        })
    }

    pub fn has(&self, group: &str) -> bool {
        self.ids.lock().is_ok_and(|ids| ids.contains(group))
    }

    /// The cursor of the newest line.
    pub fn newest(&self) -> u64 {
        *self.newest.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.newest.subscribe()
    }

    /// Append one group's line (synced: a group a trainer was told of is
    /// on disk).
    pub fn append(&self, group: &str, v: &Value) -> Result<u64, JobError> {
        let io = |e: std::io::Error| JobError::Io(self.path.clone(), e);
        let mut line =
            serde_json::to_vec(v).map_err(|e| JobError::Io(self.path.clone(), e.into()))?;
        line.push(b'\n');
        let mut index = self.index.write().map_err(|_| JobError::Poisoned)?;
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(io)?;
        let off = f.seek(SeekFrom::End(0)).map_err(io)?;
        f.write_all(&line).map_err(io)?;
        f.sync_data().map_err(io)?;
        index.push((off, line.len() as u32));
        let cursor = index.len() as u64;
        drop(index);
        if let Ok(mut ids) = self.ids.lock() {
            ids.insert(group.to_owned());
        }
        self.newest.send_replace(cursor);
        Ok(cursor)
    }

    /// Up to `max` lines after `after`, each with its cursor.
    pub fn read(&self, after: u64, max: usize) -> Result<Vec<(u64, Value)>, JobError> {
        let io = |e: std::io::Error| JobError::Io(self.path.clone(), e);
        let want: Vec<(u64, (u64, u32))> = {
            let index = self.index.read().map_err(|_| JobError::Poisoned)?;
            let from = usize::try_from(after)
                .unwrap_or(usize::MAX)
                .min(index.len());
            index[from..]
                .iter()
                .take(max)
                .enumerate()
                .map(|(k, &loc)| ((from + k + 1) as u64, loc))
                .collect()
        };
        if want.is_empty() {
            return Ok(vec![]);
        }
        let mut f = File::open(&self.path).map_err(io)?;
        let mut out = Vec::with_capacity(want.len());
        for (cursor, (off, len)) in want {
            f.seek(SeekFrom::Start(off)).map_err(io)?;
            let mut buf = vec![0; len as usize];
            f.read_exact(&mut buf).map_err(io)?;
            let v = serde_json::from_slice(&buf)
                .map_err(|e| JobError::Io(self.path.clone(), e.into()))?;
            out.push((cursor, v));
        }
        Ok(out)
    }
}

/// What a job has read of the shards so far: the calls files, and the rows
/// of its rollouts whose groups are not over yet.
#[derive(Default)]
pub struct Scan {
    seen: HashSet<PathBuf>,
    rows: HashMap<String, Vec<CallRec>>,
}

impl Scan {
    /// Read the `calls/` files not read yet, keeping the rows of rollouts
    /// whose ids start with `prefix`. Files last written before `since`
    /// (µs since the epoch) cannot hold them and are passed over.
    pub fn read_new(&mut self, shards: &Path, prefix: &str, since: i64) -> Result<(), JobError> {
        let files = match read::shard_files(shards, "calls") {
            Ok(f) => f,
            Err(crate::export::ExportError::NoDir(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for f in files {
            if self.seen.contains(&f) {
                continue;
            }
            let modified = std::fs::metadata(&f)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(i64::MAX, |d| d.as_micros() as i64);
            if modified >= since {
                read::for_each_call_in(&f, |mut c| {
                    if c.rollout_id.starts_with(prefix) {
                        c.keep_tokens_only();
                        self.rows.entry(c.rollout_id.clone()).or_default().push(c);
                    }
                    Ok(())
                })?;
            }
            self.seen.insert(f);
        }
        Ok(())
    }

    /// Take a rollout's calls, sorted, each retried call reduced to its
    /// latest attempt, side calls left out: what the exports build from.
    fn take(&mut self, rollout: &str) -> Vec<CallRec> {
        let mut calls = self.rows.remove(rollout).unwrap_or_default();
        calls.sort_by_key(|c| c.sequence);
        calls.dedup_by(|a, b| a.sequence == b.sequence);
        let mut calls = crate::export::latest_attempts(calls);
        calls.retain(|c| !c.side_call);
        calls
    }
}

/// One sample in training shape: its segments as the RL export builds
/// them, and how it ended.
fn sample(scan: &mut Scan, s: &SampleResult) -> Value {
    let calls = scan.take(&s.rollout);
    let metadata = (!s.metadata.is_null()).then(|| s.metadata.to_string());
    let info = RolloutInfo {
        status: s.status.map_or("", |st| st.as_str()).to_owned(),
        reward: s.reward,
        metadata: metadata.clone(),
        revision: read::revision_of(metadata.as_deref()),
        ..RolloutInfo::default()
    };
    let opts = RlOptions {
        filters: Filters {
            include_infra_errors: true,
            include_dropped: true,
            ..Filters::default()
        },
        ..RlOptions::default()
    };
    let mut report = Report::default();
    let mut mismatches = vec![];
    let samples = if calls.is_empty() {
        vec![]
    } else {
        rl::rollout_samples(&calls, Some(&info), &opts, &mut report, &mut mismatches)
    };
    let policy_version = samples.iter().filter_map(|x| x.policy_version()).min();
    let segments: Vec<Value> = samples
        .into_iter()
        .map(|x| {
            json!({
                "segment": x.segment,
                "num_turns": x.num_turns,
                "prompt_ids": x.prompt_ids,
                "response_ids": x.response_ids,
                "loss_mask": x.loss_mask,
                // NaN (a token whose logprob was not recorded) is null.
                "logprobs": x.logprobs.iter().map(|l| l.is_finite().then_some(*l)).collect::<Vec<_>>(),
                "token_policy_versions": x.token_policy_versions,
                "sequences": x.sequences,
                "policy_versions": x.policy_versions,
            })
        })
        .collect();
    json!({
        "rollout_id": s.rollout,
        "sample": s.sample,
        "status": s.status,
        "reward": s.reward,
        "reward_revision": info.revision,
        "resolved": s.metadata.get("resolved"),
        "bar": s.bar,
        "policy_version": policy_version,
        "calls": calls.len(),
        "calls_without_token_ids": report.skipped_no_token_ids,
        "calls_not_ok": report.skipped_not_ok,
        "mismatches": mismatches.len(),
        "segments": segments,
    })
}

/// A group over, in training shape (the line `groups.jsonl` keeps).
pub fn build(scan: &mut Scan, g: &GroupResult) -> Value {
    let samples: Vec<Value> = g.samples.iter().map(|s| sample(scan, s)).collect();
    json!({
        "group": g.group,
        "task": g.task,
        "settled": g.settled,
        "positives": g.positives,
        "relaxed": g.relaxed,
        "dropped": g.dropped,
        "finished_at": crate::now_micros(),
        "samples": samples,
    })
}

/// Withhold the samples of `group` sampled more than `max_staleness`
/// versions before `current`: a sample's oldest policy version counts, and
/// one with no version recorded is withheld too (as `export rl
/// --max-staleness` does). Returns how many were withheld.
pub fn withhold_stale(group: &mut Value, current: Option<i64>, max_staleness: i64) -> usize {
    let Some(current) = current else {
        return 0;
    };
    let oldest = current - max_staleness;
    let Some(samples) = group.get_mut("samples").and_then(Value::as_array_mut) else {
        return 0;
    };
    let (keep, stale): (Vec<Value>, Vec<Value>) = std::mem::take(samples)
        .into_iter()
        .partition(|s| s["policy_version"].as_i64().is_some_and(|v| v >= oldest));
    *samples = keep;
    let n = stale.len();
    group["withheld"] = Value::Array(
        stale
            .into_iter()
            .map(|s| {
                json!({
                    "rollout_id": s["rollout_id"],
                    "policy_version": s["policy_version"],
                    "why": format!("sampled under policy version {}, more than {max_staleness} before the current {current}", s["policy_version"]),
                })
            })
            .collect(),
    );
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_order_and_survives_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("groups.jsonl");
        let log = GroupLog::open(&p).unwrap();
        assert_eq!(log.append("g1", &json!({"group": "g1"})).unwrap(), 1);
        assert_eq!(log.append("g2", &json!({"group": "g2"})).unwrap(), 2);
        let got = log.read(1, 10).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 2);
        assert_eq!(got[0].1["group"], "g2");
        // A torn line at the end is cut at the next open.
        OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"{\"group\": \"g3")
            .unwrap();
        let log = GroupLog::open(&p).unwrap();
        assert_eq!(log.newest(), 2);
        assert!(log.has("g1") && log.has("g2") && !log.has("g3"));
        assert_eq!(log.append("g3", &json!({"group": "g3"})).unwrap(), 3);
        assert_eq!(log.read(0, 2).unwrap().len(), 2);
        assert_eq!(log.read(7, 2).unwrap().len(), 0);
    }

    #[test]
    fn stale_samples_are_withheld_and_named() {
        let mut g = json!({"samples": [
            {"rollout_id": "a", "policy_version": 3},
            {"rollout_id": "b", "policy_version": 1},
            {"rollout_id": "c", "policy_version": null},
        ]});
        assert_eq!(withhold_stale(&mut g, Some(4), 1), 2);
        assert_eq!(g["samples"].as_array().unwrap().len(), 1);
        assert_eq!(g["withheld"][0]["rollout_id"], "b");
        assert_eq!(g["withheld"][1]["rollout_id"], "c");
    }
}
