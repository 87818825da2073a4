//! The feed's journal: the calls of rollouts not finished yet, one line
//! each (`HEAD\tCALL\n`), in segments that rotate and are collected oldest
//! first (see the module above for the whole design).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Where a journal line is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loc {
    pub(super) segment: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) sequence: i64,
    pub(super) attempt: i32,
    pub(super) policy_version: Option<i64>,
}

/// A journal line's head.
#[derive(Serialize, Deserialize)]
pub(super) struct Head {
    pub(super) r: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) c: Option<String>,
    #[serde(default)]
    pub(super) s: i64,
    #[serde(default)]
    pub(super) a: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) v: Option<i64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) d: bool,
}

pub(super) struct Journal {
    pub(super) dir: PathBuf,
    pub(super) segment: u64,
    pub(super) file: File,
    pub(super) len: u64,
    /// Each unfinished rollout's calls, by call id.
    pub(super) pending: HashMap<String, HashMap<String, Loc>>,
    /// Lines of unfinished rollouts in each segment.
    pub(super) live: BTreeMap<u64, usize>,
}

pub(super) fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:06}.jsonl"))
}

impl Journal {
    pub(super) fn open(dir: PathBuf) -> io::Result<Journal> {
        std::fs::create_dir_all(&dir)?;
        let mut segments: Vec<u64> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name();
                name.to_str()?.strip_suffix(".jsonl")?.parse().ok()
            })
            .collect();
        segments.sort_unstable();
        let mut pending: HashMap<String, HashMap<String, Loc>> = HashMap::new();
        for &seg in &segments {
            let path = segment_path(&dir, seg);
            let mut reader = io::BufReader::new(File::open(&path)?);
            let mut offset = 0u64;
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = reader.read_until(b'\n', &mut line)?;
                if n == 0 {
                    break;
                }
                let whole = line.last() == Some(&b'\n');
                let head_end = line.iter().position(|&b| b == b'\t').unwrap_or(line.len());
                match serde_json::from_slice::<Head>(line[..head_end].trim_ascii_end()) {
                    Ok(h) if whole && h.d => {
                        pending.remove(&h.r);
                    }
                    Ok(h) if whole => {
                        if let Some(c) = h.c {
                            let loc = Loc {
                                segment: seg,
                                offset,
                                len: n as u32,
                                sequence: h.s,
                                attempt: h.a,
                                policy_version: h.v,
                            };
                            pending.entry(h.r).or_default().insert(c, loc);
                        }
                    }
                    _ => {
                        // A torn last line (a crash mid-write): cut it.
                        tracing::warn!(segment = %path.display(), offset, "feed journal: cutting a torn line");
                        OpenOptions::new()
                            .write(true)
                            .open(&path)?
                            .set_len(offset)?;
                        break;
                    }
                }
                offset += n as u64;
            }
        }
        let segment = segments.last().map_or(1, |s| s + 1);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(&dir, segment))?;
        let mut j = Journal {
            dir,
            segment,
            file,
            len: 0,
            pending,
            live: BTreeMap::new(),
        };
        j.recount();
        for seg in segments {
            j.live.entry(seg).or_insert(0);
        }
        j.collect()?;
        Ok(j)
    }

    fn recount(&mut self) {
        for n in self.live.values_mut() {
            *n = 0;
        }
        for loc in self.pending.values().flat_map(|c| c.values()) {
            *self.live.entry(loc.segment).or_insert(0) += 1;
        }
    }

    pub(super) fn append(&mut self, line: &[u8]) -> io::Result<(u64, u64)> {
        self.file.write_all(line)?;
        let at = (self.segment, self.len);
        self.len += line.len() as u64;
        Ok(at)
    }

    /// Delete the oldest segments while no unfinished rollout has a line in
    /// them (oldest first, so a tombstone outlives the lines it closes).
    pub(super) fn collect(&mut self) -> io::Result<()> {
        while let Some((&seg, &n)) = self.live.first_key_value() {
            if n > 0 || seg == self.segment {
                break;
            }
            match std::fs::remove_file(segment_path(&self.dir, seg)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.live.remove(&seg);
        }
        Ok(())
    }

    /// Start a new segment, copy the oldest one's live lines into it, and
    /// delete what no longer holds any.
    pub(super) fn rotate(&mut self) -> io::Result<()> {
        self.segment += 1;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(&self.dir, self.segment))?;
        self.len = 0;
        self.live.insert(self.segment, 0);
        if let Some(&oldest) = self.live.keys().next() {
            if oldest != self.segment {
                let old = File::open(segment_path(&self.dir, oldest))?;
                // One pass over the open calls: each line of the oldest
                // segment is copied to the new one and its place updated.
                let Journal {
                    pending,
                    file,
                    len,
                    segment,
                    ..
                } = self;
                for loc in pending.values_mut().flat_map(|c| c.values_mut()) {
                    if loc.segment == oldest {
                        let mut buf = vec![0; loc.len as usize];
                        old.read_exact_at(&mut buf, loc.offset)?;
                        file.write_all(&buf)?;
                        (loc.segment, loc.offset) = (*segment, *len);
                        *len += buf.len() as u64;
                    }
                }
                self.recount();
            }
        }
        self.collect()
    }

    pub(super) fn read(&self, loc: &Loc) -> io::Result<Vec<u8>> {
        let f = File::open(segment_path(&self.dir, loc.segment))?;
        let mut buf = vec![0; loc.len as usize];
        f.read_exact_at(&mut buf, loc.offset)?;
        Ok(buf)
    }
}
