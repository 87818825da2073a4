//! Segment files: numbered `wal-N.log` files under `DIR/wal/`, opened for
//! append by the writer, listed and decoded by replay.

use super::frame::{decode_all, Kind};
use super::header;
use crate::record::{CallMeta, CallOutcome, RolloutFinish};
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

pub fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("wal-{n:016}.log"))
}

/// Segment numbers present in `dir`, ascending.
pub fn list_segments(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name
            .strip_prefix("wal-")
            .and_then(|s| s.strip_suffix(".log"))
        {
            if let Ok(n) = n.parse() {
                out.push(n);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Create segment `n` for writing through a mapping (`mapped`), and make
/// its entry durable.
pub(crate) fn open_segment(dir: &Path, n: u64) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(segment_path(dir, n))?;
    sync_dir(dir);
    Ok(f)
}

/// fsync a directory so that a new or renamed entry survives power loss.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// What one segment holds, decoded.
pub struct SegmentContents {
    pub begins: Vec<(CallMeta, Bytes, Option<Bytes>)>,
    pub ends: Vec<(CallOutcome, Bytes, Option<Bytes>)>,
    pub finishes: Vec<RolloutFinish>,
    pub clean: bool,
}

pub fn read_segment(path: &Path) -> std::io::Result<SegmentContents> {
    let data = std::fs::read(path)?;
    let (frames, clean) = decode_all(&data);
    let mut out = SegmentContents {
        begins: Vec::new(),
        ends: Vec::new(),
        finishes: Vec::new(),
        clean,
    };
    for f in frames {
        match f.kind {
            Kind::Begin => {
                if let Some(meta) = header::read_meta(&f.header) {
                    let up = (!f.b.is_empty()).then(|| Bytes::from(f.b));
                    out.begins.push((meta, Bytes::from(f.a), up));
                }
            }
            Kind::End => {
                if let Some(o) = header::read_outcome(&f.header) {
                    let up = (!f.b.is_empty()).then(|| Bytes::from(f.b));
                    out.ends.push((o, Bytes::from(f.a), up));
                }
            }
            Kind::Finish => {
                if let Ok(fin) = serde_json::from_slice(&f.header) {
                    out.finishes.push(fin);
                }
            }
        }
    }
    Ok(out)
}
