//! The WAL's live state, shared by the writer's thread and the response
//! path: the segment being written, which calls are open, and how many rows
//! each live segment still holds unpublished. One lock guards it all, so a
//! frame's bytes and its booking never part.
//!
//! With `wal_fsync` off, a copy into the mapped segment (`mapped`) is all
//! the writer's thread would do for a call, and handing each start and end
//! to it costs two cross-thread wake-ups per call, far more than the copy.
//! So the
//! response path writes them here, under the lock ([`Inline`]), and hands
//! the finished row straight to the shard queue; the thread then only
//! deletes segments, ends open calls at shutdown, and takes over whatever
//! an inline write could not do (a failed write, rollout finishes, group
//! commit with fsync on).

use super::mapped::Mapped;
use super::segment::open_segment;
use crate::record::shard::ShardItem;
use crate::record::{CallBegin, CallOutcome, CompletedCall, RecorderStats};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// What the lock guards.
pub(crate) struct Log {
    /// The current segment, mapped (`mapped`).
    file: Mapped,
    /// Bytes of whole frames in the current segment: where a failed write
    /// is cut back to.
    pub(super) bytes: u64,
    /// The end of what was copied into the segment, torn frames included.
    written: u64,
    pub(super) segment: u64,
    /// Calls and finishes begun in each live segment and not yet published.
    pub(super) unpublished: BTreeMap<u64, u64>,
    /// In-flight calls: their begin record and the segment it is in. Keyed
    /// by call ids, which rollcall makes (UUIDv7), so a fast hasher will do.
    pub(super) pending: HashMap<String, (u64, Arc<CallBegin>), foldhash::fast::RandomState>,
    /// Set once the writer has stopped taking calls: an inline write then
    /// fails, and the call goes the (closed) thread's way.
    pub(super) closed: bool,
}

pub(crate) type SharedLog = Arc<Mutex<Log>>;

pub(super) fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

impl Log {
    pub(super) fn new(file: Mapped, segment: u64) -> Log {
        Log {
            file,
            bytes: 0,
            written: 0,
            segment,
            unpublished: BTreeMap::from([(segment, 0)]),
            pending: HashMap::default(),
            closed: false,
        }
    }

    /// Append whole frames: a copy into the segment's mapping, then, with
    /// `fsync`, its sync. A failed sync is cut back to the last whole frame
    /// before the lock goes, so the next frame never follows a torn one.
    pub(super) fn append(&mut self, buf: &[u8], fsync: bool) -> std::io::Result<()> {
        self.file.write_at(self.bytes, buf)?;
        self.written = self.written.max(self.bytes + buf.len() as u64);
        if fsync {
            if let Err(e) = self.file.sync(self.bytes, buf.len()) {
                let _ = self.cut_back();
                return Err(e);
            }
        }
        self.bytes += buf.len() as u64;
        Ok(())
    }

    /// Write `buf` as it is, with no booking: the test hook's torn write.
    pub(super) fn write_raw(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.file.write_at(self.bytes, buf)?;
        self.written = self.written.max(self.bytes + buf.len() as u64);
        Ok(())
    }

    /// Cut the segment back to its last whole frame, durably: zero what
    /// follows it.
    pub(super) fn cut_back(&mut self) -> std::io::Result<()> {
        self.file.zero(self.bytes, self.written)?;
        self.written = self.bytes;
        Ok(())
    }

    /// Start the next segment; the last one is cut to its whole frames.
    pub(super) fn rotate(
        &mut self,
        dir: &Path,
        segment_bytes: u64,
        stats: &RecorderStats,
    ) -> std::io::Result<()> {
        let next = Mapped::new(
            open_segment(dir, self.segment + 1)?,
            segment_bytes,
            self.file.ahead(),
        )?;
        let last = std::mem::replace(&mut self.file, next);
        if let Err(e) = last.finish(self.bytes) {
            tracing::warn!(segment = self.segment, error = %e, "could not cut a full WAL segment to its length; replay reads its zeros as its end");
        }
        self.segment += 1;
        self.bytes = 0;
        self.written = 0;
        self.unpublished.entry(self.segment).or_insert(0);
        stats.wal_segments.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A call's start is in the current segment.
    pub(super) fn book_begin(&mut self, begin: Arc<CallBegin>) {
        *self.unpublished.entry(self.segment).or_insert(0) += 1;
        self.pending
            .insert(begin.meta.call_id.clone(), (self.segment, begin));
    }
}

/// Starts and ends written on the response path (see the module's doc).
/// Used only with `wal_fsync` off, no test hook, and while writes succeed;
/// a failed inline write is cut back and the frame goes the thread's way,
/// which owns the failure handling.
pub(crate) struct Inline {
    pub(super) log: SharedLog,
    pub(super) dir: PathBuf,
    pub(super) segment_bytes: u64,
    pub(super) stats: Arc<RecorderStats>,
    /// The shard queue, where a call's row goes once its end is written.
    pub(super) rows: mpsc::Sender<ShardItem>,
}

impl Inline {
    /// Write one frame and book it, under the lock.
    fn write(&self, frame: &[u8], book: impl FnOnce(&mut Log)) -> std::io::Result<()> {
        let mut log = lock(&self.log);
        if log.closed {
            return Err(std::io::Error::other("the write-ahead log has stopped"));
        }
        log.append(frame, false)?;
        book(&mut log);
        if log.bytes >= self.segment_bytes {
            if let Err(e) = log.rotate(&self.dir, self.segment_bytes, &self.stats) {
                tracing::error!(error = %e, "could not start a new WAL segment");
            }
        }
        drop(log);
        self.stats
            .wal_bytes_written
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Write a call's start; `Err` when it could not be (nothing of it
    /// stays).
    pub(crate) fn begin(&self, begin: &Arc<CallBegin>) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(begin.request.len() + 512);
        super::encode_begin(&mut buf, begin);
        self.write(&buf, |log| log.book_begin(begin.clone()))
    }

    /// Write a call's end (its start is in the WAL already). Returns its
    /// row, to be handed to the shard queue ([`Inline::try_queue`]), or `None`
    /// when no start of it was open. Gives the end back when it could not
    /// be written (nothing of it stays).
    ///
    /// Not async: every future awaiting this one (up to the call's) would
    /// hold its state, and each await copies a future whole.
    pub(crate) fn end(
        &self,
        outcome: CallOutcome,
        response: Bytes,
        upstream_response: Option<Bytes>,
    ) -> Result<Option<ShardItem>, Box<crate::record::EndParts>> {
        let mut buf = Vec::with_capacity(response.len() + 512);
        let up = upstream_response.as_deref();
        if super::encode_end(&mut buf, &outcome, &response, up).is_err() {
            return Err(Box::new((outcome, response, upstream_response)));
        }
        let mut open = None;
        let written = self.write(&buf, |log| open = log.pending.remove(&outcome.call_id));
        if let Err(e) = written {
            tracing::warn!(error = %e, "inline write-ahead log write failed; the writer thread takes the call's end");
            return Err(Box::new((outcome, response, upstream_response)));
        }
        let Some((segment, begin)) = open else {
            tracing::error!(call_id = %outcome.call_id, "call ended without a begin record");
            return Ok(None);
        };
        // On disk now, and counted before the caller answers, so that
        // `shard_lag_rows` covers it; if the shard writer has stopped,
        // replay at the next start publishes it.
        self.stats.unpublished_rows.fetch_add(1, Ordering::Relaxed);
        let call = CompletedCall {
            begin,
            outcome,
            response,
            upstream_response,
        };
        Ok(Some(ShardItem::Call { segment, call }))
    }

    /// Hand a row written by [`Inline::end`] to the shard queue if it has
    /// room; returns the row when it is full ([`Inline::queue`] waits).
    pub(crate) fn try_queue(&self, row: ShardItem) -> Option<ShardItem> {
        match self.rows.try_send(row) {
            Ok(()) => None,
            Err(TrySendError::Full(row)) => Some(row),
            Err(TrySendError::Closed(_)) => {
                tracing::error!("shard writer stopped; rows stay in the WAL until restart");
                None
            }
        }
    }

    /// Hand a row to the shard queue, waiting for room there.
    pub(crate) async fn queue(&self, row: ShardItem) {
        if self.rows.send(row).await.is_err() {
            tracing::error!("shard writer stopped; rows stay in the WAL until restart");
        }
    }
}
