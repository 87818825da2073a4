//! Calls in partitions by the hash of their rollout's group ([`Groups`],
//! [`Partitions`]): in memory when there is one, else spilled to disk; and
//! a partition split into rollouts ordered by (group, rollout id)
//! ([`by_group`]).

use super::spill::{decode, decode_score, encode, encode_score};
use super::{count_calls, for_each_call, for_each_score, CallRec, RolloutInfo, ScoreRec};
use crate::export::progress::Progress;
use crate::export::ExportError;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The group of every rollout ([`crate::export::group_of`]), by rollout id.
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
                    let g = crate::export::group_of(id, Some(info), group_by);
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

/// Calls grouped by partition: in memory when there is one, else in spill
/// files under a scratch directory removed on drop.
pub struct Partitions {
    memory: Option<(Vec<CallRec>, Vec<ScoreRec>)>,
    files: Vec<PathBuf>,
    /// Each partition's teacher scores (`scores/`), beside its calls.
    score_files: Vec<PathBuf>,
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
    /// each call read. The teacher scores go to the same partitions as
    /// their calls, and [`Partitions::take`] joins them.
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
            let mut scores = Vec::new();
            for_each_score(dir, |s| {
                scores.push(s);
                Ok(())
            })?;
            return Ok(Partitions {
                memory: Some((v, scores)),
                files: vec![],
                score_files: vec![],
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
            score_files: (0..n)
                .map(|i| scratch.join(format!("scores-{i:04}.bin")))
                .collect(),
            scratch: Some(scratch.to_path_buf()),
            rows: 0,
        };
        let open = |files: &[PathBuf]| {
            files
                .iter()
                .map(|p| File::create(p).map(|f| BufWriter::with_capacity(32 << 10, f)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(io)
        };
        let mut writers = open(&parts.files)?;
        let mut buf = Vec::new();
        parts.rows = for_each_call(dir, |mut c| {
            progress.call();
            if !keep(&mut c) {
                return Ok(());
            }
            buf.clear();
            encode(&c, &mut buf);
            let part = stable_hash(groups.of(&c.rollout_id)) % n as u64;
            put(&mut writers[part as usize], &buf).map_err(io)
        })?;
        for w in writers {
            w.into_inner().map_err(|e| io(e.into_error()))?;
        }
        let mut writers = open(&parts.score_files)?;
        for_each_score(dir, |s| {
            buf.clear();
            encode_score(&s, &mut buf);
            let part = stable_hash(groups.of(&s.rollout_id)) % n as u64;
            put(&mut writers[part as usize], &buf).map_err(io)
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
    /// duplicate (rollout, sequence) rows dropped, each carrying its latest
    /// teacher score.
    pub fn take(&mut self, i: usize) -> Result<Vec<CallRec>, ExportError> {
        let (mut v, mut scores) = match &mut self.memory {
            Some(m) => std::mem::take(m),
            None => (
                read_spill(&self.files[i], decode)?,
                read_spill(&self.score_files[i], decode_score)?,
            ),
        };
        v.sort_by(|a, b| {
            (a.rollout_id.as_str(), a.sequence).cmp(&(b.rollout_id.as_str(), b.sequence))
        });
        v.dedup_by(|a, b| a.rollout_id == b.rollout_id && a.sequence == b.sequence);
        // The latest score of each call last, so it is the one kept.
        scores.sort_by(|a, b| {
            (a.rollout_id.as_str(), a.sequence, a.scored_at).cmp(&(
                b.rollout_id.as_str(),
                b.sequence,
                b.scored_at,
            ))
        });
        for s in scores {
            let key = (s.rollout_id.as_str(), s.sequence);
            if let Ok(k) = v.binary_search_by(|c| (c.rollout_id.as_str(), c.sequence).cmp(&key)) {
                v[k].teacher_logprobs = Some(s.logprobs);
            }
        }
        Ok(v)
    }
}

/// Append one length-prefixed record to a spill file.
fn put(w: &mut impl Write, record: &[u8]) -> std::io::Result<()> {
    w.write_all(&(record.len() as u32).to_le_bytes())?;
    w.write_all(record)
}

/// The records of one spill file (removed once read).
fn read_spill<T>(path: &Path, decode: fn(&[u8]) -> Option<T>) -> Result<Vec<T>, ExportError> {
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
        v.push(
            decode(&buf).ok_or_else(|| {
                ExportError::Io(format!("{}: corrupt spill record", path.display()))
            })?,
        );
    }
    let _ = std::fs::remove_file(path);
    Ok(v)
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
