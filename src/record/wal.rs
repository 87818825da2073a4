//! The write-ahead log: numbered segment files of checksummed frames.
//!
//! Frame: `b"RCW1" | kind u8 | header_len u32 | blob_a_len u32 | blob_b_len u32 |
//! crc32 u32 | header (JSON) | blob_a | blob_b`, integers little-endian, the
//! CRC over everything after itself. A torn tail (a frame cut by a crash)
//! fails its length or CRC check and ends replay of that segment.
//!
//! The writer thread commits in groups: it takes every message queued, writes
//! them with one `write`, optionally `fsync`s, then acknowledges them all. A
//! segment is deleted once every call begun in it, and in every segment
//! before it, is in a published shard.

use super::shard::{ShardItem, ShardSet};
use super::{
    CallBegin, CallMeta, CompletedCall, RecordError, RecorderStats, RolloutFinish, WalMsg,
};
use crate::config::ShardConfig;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

const MAGIC: &[u8; 4] = b"RCW1";
const FIXED: usize = 4 + 1 + 4 + 4 + 4 + 4;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// header: `CallMeta`; a: request; b: upstream request (may be empty)
    Begin = 1,
    /// header: `CallOutcome`; a: response body; b: upstream response (may be empty)
    End = 2,
    /// header: `RolloutFinish`
    Finish = 3,
}

/// A decoded frame.
#[derive(Debug)]
pub struct Frame {
    pub kind: Kind,
    pub header: Vec<u8>,
    pub a: Vec<u8>,
    pub b: Vec<u8>,
}

/// Append one frame to `buf`.
pub fn encode(buf: &mut Vec<u8>, kind: Kind, header: &[u8], a: &[u8], b: &[u8]) {
    let mut crc = crc32fast::Hasher::new();
    let mut lens = [0u8; 13];
    lens[0] = kind as u8;
    lens[1..5].copy_from_slice(&(header.len() as u32).to_le_bytes());
    lens[5..9].copy_from_slice(&(a.len() as u32).to_le_bytes());
    lens[9..13].copy_from_slice(&(b.len() as u32).to_le_bytes());
    crc.update(&lens);
    crc.update(header);
    crc.update(a);
    crc.update(b);
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&lens);
    buf.extend_from_slice(&crc.finalize().to_le_bytes());
    buf.extend_from_slice(header);
    buf.extend_from_slice(a);
    buf.extend_from_slice(b);
}

/// Decode every whole, intact frame; stop at the first torn or corrupt one.
/// Returns the frames and whether the data ended cleanly.
pub fn decode_all(data: &[u8]) -> (Vec<Frame>, bool) {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let rest = &data[pos..];
        if rest.len() < FIXED || &rest[..4] != MAGIC {
            return (out, false);
        }
        let u32_at = |i: usize| {
            u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]) as usize
        };
        let (h, a, b) = (u32_at(5), u32_at(9), u32_at(13));
        let want = u32_at(17) as u32;
        let total = FIXED + h + a + b;
        if rest.len() < total {
            return (out, false);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&rest[4..17]);
        crc.update(&rest[FIXED..total]);
        if crc.finalize() != want {
            return (out, false);
        }
        let kind = match rest[4] {
            1 => Kind::Begin,
            2 => Kind::End,
            3 => Kind::Finish,
            _ => return (out, false),
        };
        let body = &rest[FIXED..total];
        out.push(Frame {
            kind,
            header: body[..h].to_vec(),
            a: body[h..h + a].to_vec(),
            b: body[h + a..].to_vec(),
        });
        pos += total;
    }
    (out, true)
}

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

struct Writer {
    dir: PathBuf,
    cfg: ShardConfig,
    file: File,
    segment: u64,
    segment_bytes: u64,
    /// Calls and finishes begun in each live segment and not yet published.
    unpublished: BTreeMap<u64, u64>,
    /// In-flight calls: their begin record and the segment it is in.
    pending: HashMap<String, (u64, Arc<CallBegin>)>,
    stats: Arc<RecorderStats>,
}

impl Writer {
    fn open_segment(dir: &Path, n: u64) -> std::io::Result<File> {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(dir, n))?;
        sync_dir(dir);
        Ok(f)
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.segment += 1;
        self.file = Self::open_segment(&self.dir, self.segment)?;
        self.segment_bytes = 0;
        self.unpublished.entry(self.segment).or_insert(0);
        self.stats.wal_segments.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Delete the longest prefix of segments whose rows are all published.
    fn collect_garbage(&mut self) {
        while let Some((&seg, &n)) = self.unpublished.first_key_value() {
            if n > 0 || seg >= self.segment {
                break;
            }
            self.unpublished.remove(&seg);
            if let Err(e) = std::fs::remove_file(segment_path(&self.dir, seg)) {
                tracing::warn!(segment = seg, error = %e, "could not delete WAL segment");
            }
            self.stats.wal_segments.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// fsync a directory so that a new or renamed entry survives power loss.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Start the WAL thread (which owns the shard thread).
pub(crate) fn spawn(
    cfg: ShardConfig,
    first_segment: u64,
    mut rx: mpsc::Receiver<WalMsg>,
    wake: mpsc::Sender<WalMsg>,
    stats: Arc<RecorderStats>,
) -> Result<std::thread::JoinHandle<()>, RecordError> {
    let dir = cfg.dir.join("wal");
    std::fs::create_dir_all(&dir)
        .map_err(|e| RecordError::Wal(format!("{}: {e}", dir.display())))?;
    let file =
        Writer::open_segment(&dir, first_segment).map_err(|e| RecordError::Wal(e.to_string()))?;
    let shards = ShardSet::open(&cfg).map_err(|e| RecordError::Shard(e.to_string()))?;
    let (shard_tx, shard_rx) = std::sync::mpsc::sync_channel::<ShardItem>(cfg.queue_capacity);
    let (published_tx, published_rx) = std::sync::mpsc::channel::<Vec<(u64, u64)>>();
    let shard_stats = stats.clone();
    let shard_cfg = cfg.clone();
    let shard_thread = std::thread::Builder::new()
        .name("rollcall-shards".into())
        .spawn(move || {
            super::shard::run(shard_cfg, shards, shard_rx, published_tx, wake, shard_stats)
        })
        .map_err(|e| RecordError::Shard(e.to_string()))?;
    stats.wal_segments.store(1, Ordering::Relaxed);
    let mut w = Writer {
        dir,
        cfg,
        file,
        segment: first_segment,
        segment_bytes: 0,
        unpublished: BTreeMap::from([(first_segment, 0)]),
        pending: HashMap::new(),
        stats,
    };
    std::thread::Builder::new()
        .name("rollcall-wal".into())
        .spawn(move || {
            run(&mut w, &mut rx, &shard_tx, &published_rx);
            drop(shard_tx);
            let _ = shard_thread.join();
            apply_published(&mut w, &published_rx);
            // Everything is published: the current segment may go too.
            if w.pending.is_empty() && w.unpublished.values().all(|&n| n == 0) {
                w.segment += 1;
                w.collect_garbage();
            }
        })
        .map_err(|e| RecordError::Wal(e.to_string()))
}

fn apply_published(w: &mut Writer, published: &std::sync::mpsc::Receiver<Vec<(u64, u64)>>) {
    let mut any = false;
    while let Ok(list) = published.try_recv() {
        any = true;
        for (seg, n) in list {
            if let Some(c) = w.unpublished.get_mut(&seg) {
                *c = c.saturating_sub(n);
            }
        }
    }
    if any {
        w.collect_garbage();
    }
}

const MAX_BATCH: usize = 512;

fn run(
    w: &mut Writer,
    rx: &mut mpsc::Receiver<WalMsg>,
    shard_tx: &std::sync::mpsc::SyncSender<ShardItem>,
    published: &std::sync::mpsc::Receiver<Vec<(u64, u64)>>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut acks = Vec::new();
    let mut forward = Vec::new();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut shutdown = false;
    while !shutdown {
        let Some(first) = rx.blocking_recv() else {
            break;
        };
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        for msg in batch.drain(..) {
            match msg {
                WalMsg::Begin(begin) => {
                    let header = serde_json::to_vec(&begin.meta).unwrap_or_default();
                    let up = begin.upstream_request.as_deref().unwrap_or(&[]);
                    encode(&mut buf, Kind::Begin, &header, &begin.request, up);
                    *w.unpublished.entry(w.segment).or_insert(0) += 1;
                    w.pending
                        .insert(begin.meta.call_id.clone(), (w.segment, begin));
                }
                WalMsg::End {
                    outcome,
                    response,
                    upstream_response,
                    ack,
                } => {
                    let header = serde_json::to_vec(&outcome).unwrap_or_default();
                    let up = upstream_response.as_deref().unwrap_or(&[]);
                    encode(&mut buf, Kind::End, &header, &response, up);
                    match w.pending.remove(&outcome.call_id) {
                        Some((seg, begin)) => forward.push(ShardItem::Call {
                            segment: seg,
                            call: CompletedCall {
                                begin,
                                outcome,
                                response,
                                upstream_response,
                            },
                        }),
                        None => {
                            tracing::error!(call_id = %outcome.call_id, "call ended without a begin record")
                        }
                    }
                    acks.push(ack);
                }
                WalMsg::Finish { finish, ack } => {
                    let header = serde_json::to_vec(&finish).unwrap_or_default();
                    encode(&mut buf, Kind::Finish, &header, &[], &[]);
                    *w.unpublished.entry(w.segment).or_insert(0) += 1;
                    forward.push(ShardItem::Rollout {
                        segment: w.segment,
                        finish,
                    });
                    acks.push(ack);
                }
                WalMsg::Wake => {}
                WalMsg::Shutdown => shutdown = true,
            }
        }
        let result = write_out(w, &buf);
        buf.clear();
        if let Err(e) = &result {
            tracing::error!(error = %e, "write-ahead log write failed");
        }
        // Count rows as unpublished before anyone learns they are acknowledged.
        w.stats
            .unpublished_rows
            .fetch_add(forward.len() as i64, Ordering::Relaxed);
        for ack in acks.drain(..) {
            let _ = ack.send(
                result
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| RecordError::Wal(e.to_string())),
            );
        }
        for item in forward.drain(..) {
            if shard_tx.send(item).is_err() {
                tracing::error!("shard writer stopped; rows stay in the WAL until restart");
            }
        }
        apply_published(w, published);
        if w.segment_bytes >= w.cfg.wal_segment_bytes {
            if let Err(e) = w.rotate() {
                tracing::error!(error = %e, "could not start a new WAL segment");
            }
        }
    }
}

fn write_out(w: &mut Writer, buf: &[u8]) -> std::io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    w.file.write_all(buf)?;
    if w.cfg.wal_fsync {
        w.file.sync_data()?;
    }
    w.segment_bytes += buf.len() as u64;
    w.stats
        .wal_bytes_written
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// What one segment holds, decoded.
pub struct SegmentContents {
    pub begins: Vec<(CallMeta, Bytes, Option<Bytes>)>,
    pub ends: Vec<(super::CallOutcome, Bytes, Option<Bytes>)>,
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
                if let Ok(meta) = serde_json::from_slice(&f.header) {
                    let up = (!f.b.is_empty()).then(|| Bytes::from(f.b));
                    out.begins.push((meta, Bytes::from(f.a), up));
                }
            }
            Kind::End => {
                if let Ok(o) = serde_json::from_slice(&f.header) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_torn_tails_stop_replay() {
        let mut buf = Vec::new();
        encode(&mut buf, Kind::Begin, b"{}", b"req", b"");
        encode(&mut buf, Kind::End, b"{\"x\":1}", b"resp", b"");
        let (frames, clean) = decode_all(&buf);
        assert!(clean);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].a, b"resp");
        for cut in 1..buf.len() {
            let (frames, _) = decode_all(&buf[..cut]);
            assert!(frames.len() <= 1 || cut == buf.len());
        }
        let mut bad = buf.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let (frames, clean) = decode_all(&bad);
        assert_eq!(frames.len(), 1);
        assert!(!clean);
    }
}
