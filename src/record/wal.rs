//! The write-ahead log writer: the pipeline's first stage. It takes call
//! starts, ends and rollout finishes from the call queue, writes them to
//! numbered segment files (`segment`) as checksummed frames (`frame`), and
//! hands the rows on to the shard writer. `super::pipeline` makes its
//! queues and starts it.
//!
//! The segment being written is mapped into memory (`mapped`): a frame is
//! written by copying it there, which puts it in the page cache as a
//! `write` would, without the syscall.
//!
//! The writer commits in groups: it takes every message queued, writes
//! them with one copy, optionally `fsync`s, then acknowledges them all. A
//! failed write is acknowledged as failed (the proxy then answers the harness
//! with an error, `shards.on_wal_error`), the segment is cut back to its last
//! whole frame (or a new segment started when that fails too), and the
//! batch's call starts are written again with the next batch: recording goes
//! on by itself once the disk takes writes again. A segment is deleted once
//! every call begun in it, and in every segment before it, is in a published
//! shard: the shard writer reports each file it publishes on the published
//! queue. On shutdown, calls still open are handed to the shard writer as
//! `incomplete` rows, so a graceful stop leaves no segment behind.
//!
//! With `wal_fsync` off, the response path writes call starts and ends
//! itself (`log::Inline`), under the lock the writer shares with it, and the
//! writer's thread sees only rollout finishes and what an inline write could
//! not do. With fsync on, every frame goes the thread's way, for the group
//! commit.

mod ahead;
mod frame;
mod header;
mod log;
mod mapped;
mod segment;

pub use frame::{decode_all, encode, encode_json, Frame, FrameTooLarge, Kind};
pub(crate) use log::Inline;
use log::{lock, Log, SharedLog};
use segment::open_segment;
pub use segment::{list_segments, read_segment, segment_path, sync_dir, SegmentContents};

use super::pipeline::SegmentRows;
use super::shard::ShardItem;
use super::{
    CallBegin, CallMeta, CallOutcome, CallStatus, CompletedCall, FailureClass, RecordError,
    RecorderStats, WalMsg,
};
use crate::config::{OnWalError, ShardConfig};
use bytes::Bytes;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The WAL writer's state, owned by its thread.
pub(crate) struct Writer {
    dir: PathBuf,
    cfg: ShardConfig,
    /// The current segment, the open calls and the unpublished counts,
    /// shared with [`Inline`].
    log: SharedLog,
    /// Call starts whose frames a failed write lost: written again first.
    rewrite: Vec<Arc<CallBegin>>,
    /// Call ends a failed write lost, by call id: written again with the
    /// next batch (under `on_wal_error = "fail"`, as the failure the harness
    /// was answered with).
    retry: HashMap<String, (u64, CompletedCall)>,
    stats: Arc<RecorderStats>,
    hook: Option<PathBuf>,
    /// Lets the writer wait on its two incoming queues at once; it runs no
    /// tasks of its own.
    waiter: tokio::runtime::Runtime,
}

impl Writer {
    /// Create `DIR/wal/` and open segment `first_segment`: the writer's
    /// state before its thread starts.
    pub(crate) fn open(
        cfg: ShardConfig,
        first_segment: u64,
        stats: Arc<RecorderStats>,
    ) -> Result<Writer, RecordError> {
        let dir = cfg.dir.join("wal");
        std::fs::create_dir_all(&dir)
            .map_err(|e| RecordError::Wal(format!("{}: {e}", dir.display())))?;
        // Without its thread the writer allocates every window itself.
        let ahead = ahead::Ahead::start()
            .inspect_err(
                |e| tracing::warn!(error = %e, "could not start the WAL's allocation thread"),
            )
            .ok();
        let file = open_segment(&dir, first_segment)
            .and_then(|f| mapped::Mapped::new(f, cfg.wal_segment_bytes, ahead))
            .map_err(|e| RecordError::Wal(e.to_string()))?;
        let waiter = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| RecordError::Wal(e.to_string()))?;
        stats.wal_segments.store(1, Ordering::Relaxed);
        let hook = std::env::var_os(HOOK_ENV).map(PathBuf::from);
        Ok(Writer {
            dir,
            cfg,
            log: Arc::new(Mutex::new(Log::new(file, first_segment))),
            rewrite: Vec::new(),
            retry: HashMap::new(),
            stats,
            hook,
            waiter,
        })
    }

    /// Inline writes into this writer's segments, whose rows go to `rows`:
    /// with `wal_fsync` off and no test hook (which must see every write).
    pub(crate) fn inline(&self, rows: mpsc::Sender<ShardItem>) -> Option<Inline> {
        (!self.cfg.wal_fsync && self.hook.is_none()).then(|| Inline {
            log: self.log.clone(),
            dir: self.dir.clone(),
            segment_bytes: self.cfg.wal_segment_bytes,
            stats: self.stats.clone(),
            rows,
        })
    }

    fn rotate(&self, log: &mut Log) {
        if let Err(e) = log.rotate(&self.dir, self.cfg.wal_segment_bytes, &self.stats) {
            tracing::error!(error = %e, "could not start a new WAL segment");
        }
    }

    /// Delete the longest prefix of segments whose rows are all published.
    fn collect_garbage(&self, log: &mut Log) {
        while let Some((&seg, &n)) = log.unpublished.first_key_value() {
            if n > 0 || seg >= log.segment {
                break;
            }
            log.unpublished.remove(&seg);
            // Counted down first: whoever sees the file gone sees the gauge
            // without it.
            self.stats.wal_segments.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = std::fs::remove_file(segment_path(&self.dir, seg)) {
                tracing::warn!(segment = seg, error = %e, "could not delete WAL segment");
            }
        }
    }

    /// After a failed write: cut the segment back to its last whole frame,
    /// or start a new segment when even that fails.
    fn repair(&self) {
        let mut log = lock(&self.log);
        if let Err(e) = log.cut_back() {
            tracing::error!(error = %e, "could not cut the WAL segment back to its last whole frame; starting a new segment");
            self.rotate(&mut log);
        }
    }
}

/// Rows of a published shard are no longer unpublished in their segments.
fn release(log: &mut Log, published: SegmentRows) {
    for (seg, n) in published {
        if let Some(c) = log.unpublished.get_mut(&seg) {
            *c = c.saturating_sub(n);
        }
    }
}

/// The test hook `ROLLCALL_TEST_WAL_HOOK=FILE`: while FILE holds `stall`
/// the writer waits before each write; `fail` makes each write fail, `torn`
/// writes half a batch and then fails. Lets tests stall or break the disk
/// deterministically; unset in production.
pub const HOOK_ENV: &str = "ROLLCALL_TEST_WAL_HOOK";

fn hook_state(hook: &Option<PathBuf>) -> String {
    hook.as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The writer's ends of its queues, made by `super::pipeline`.
pub(crate) struct WalQueues {
    /// Call starts, ends and rollout finishes from the response path.
    pub calls: mpsc::Receiver<WalMsg>,
    /// Rows acknowledged in the WAL, to the shard writer.
    pub rows: mpsc::Sender<ShardItem>,
    /// What the shard writer published, per segment; `None` once the shard
    /// writer has stopped.
    pub published: Option<mpsc::UnboundedReceiver<SegmentRows>>,
}

/// What ended the writer's wait for work. A value handed back from one
/// wait, never stored in bulk: boxing the message would cost an
/// allocation per call on the WAL thread for nothing.
#[allow(clippy::large_enum_variant)]
enum Woken {
    Call(WalMsg),
    Published(SegmentRows),
    /// Every sender of the call queue is gone.
    Closed,
}

impl WalQueues {
    /// Wait for a message on the call queue or the published queue.
    fn wait(&mut self, waiter: &tokio::runtime::Runtime) -> Woken {
        let Self {
            calls, published, ..
        } = self;
        waiter.block_on(async {
            loop {
                tokio::select! {
                    biased;
                    msg = calls.recv() => return msg.map_or(Woken::Closed, Woken::Call),
                    rows = async { published.as_mut()?.recv().await }, if published.is_some() => {
                        match rows {
                            Some(rows) => return Woken::Published(rows),
                            // The shard writer has stopped: wait for calls alone.
                            None => *published = None,
                        }
                    }
                }
            }
        })
    }

    /// A publication already queued, without waiting.
    fn try_published(&mut self) -> Option<SegmentRows> {
        self.published.as_mut()?.try_recv().ok()
    }
}

/// The WAL writer stage: write batches until shutdown (or until the call
/// queue closes), then end the calls still open and wait for the shard
/// writer to publish everything.
pub(crate) fn run(mut w: Writer, mut q: WalQueues) {
    write_batches(&mut w, &mut q);
    // No inline write from here on: what is open now stays open.
    let open: Vec<_> = {
        let mut log = lock(&w.log);
        log.closed = true;
        log.pending.drain().collect()
    };
    // Calls still open at shutdown end here, as incomplete rows, so
    // that their segments can go.
    // Ends a failing disk never took go to the shards as they are
    // (their starts keep the WAL until those rows are published).
    for (_, (segment, call)) in w.retry.drain() {
        w.stats.unpublished_rows.fetch_add(1, Ordering::Relaxed);
        let _ = q.rows.blocking_send(ShardItem::Call { segment, call });
    }
    if !open.is_empty() {
        tracing::warn!(
            calls = open.len(),
            "calls still in flight at shutdown are recorded as incomplete"
        );
    }
    for (_, (segment, begin)) in open {
        let outcome = interrupted(&begin.meta, crate::now_micros());
        let call = CompletedCall {
            begin,
            outcome,
            response: Bytes::new(),
            upstream_response: None,
        };
        w.stats.unpublished_rows.fetch_add(1, Ordering::Relaxed);
        let _ = q.rows.blocking_send(ShardItem::Call { segment, call });
    }
    // `Stop` ends the shard writer once it has published what it holds
    // (the response path holds senders of the row queue too, so the queue
    // never closes by itself); the published queue closes when it has
    // stopped.
    let _ = q.rows.blocking_send(ShardItem::Stop);
    let mut all = Vec::new();
    if let Some(mut published) = q.published.take() {
        while let Some(rows) = published.blocking_recv() {
            all.push(rows);
        }
    }
    let mut log = lock(&w.log);
    for rows in all {
        release(&mut log, rows);
    }
    w.collect_garbage(&mut log);
    // Everything is published: the current segment may go too.
    if log.unpublished.values().all(|&n| n == 0) {
        log.segment += 1;
        w.collect_garbage(&mut log);
    }
}

/// The outcome of a call the proxy stopped before it ended.
pub(crate) fn interrupted(meta: &CallMeta, at: i64) -> CallOutcome {
    CallOutcome {
        call_id: meta.call_id.clone(),
        status: CallStatus::Incomplete,
        http_status: None,
        failure_class: Some(FailureClass::Interrupted),
        failure_message: Some("the proxy stopped while this call was in flight".into()),
        first_byte_at: None,
        done_at: at.max(meta.received_at),
        replica: None,
        repinned: false,
        policy_version: None,
        policy_version_end: None,
        resent: 0,
        continued: Vec::new(),
    }
}

/// Apply what the shard writer published: the publication that woke the
/// writer, if one did, and every one queued since.
fn apply_published(w: &mut Writer, q: &mut WalQueues, woken_by: Option<SegmentRows>) {
    let mut all = woken_by
        .into_iter()
        .chain(std::iter::from_fn(|| q.try_published()))
        .peekable();
    if all.peek().is_none() {
        return;
    }
    let mut log = lock(&w.log);
    for rows in all {
        release(&mut log, rows);
    }
    w.collect_garbage(&mut log);
}

const MAX_BATCH: usize = 512;

/// How often frames a failed write lost are written again.
const RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

type Ack = tokio::sync::oneshot::Sender<Result<(), RecordError>>;

/// What one batch did, applied once its write succeeded or failed.
#[derive(Default)]
struct Batch {
    begun: Vec<Arc<CallBegin>>,
    /// The proxy's acks of the starts in this batch.
    begun_acks: Vec<Ack>,
    /// Ends, with the proxy's ack (none for an end written again).
    ended: Vec<(ShardItem, Option<Ack>)>,
    finished: Vec<(ShardItem, Ack)>,
    /// Publication requests, handed on after the batch's rows.
    publish: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// Take, write and acknowledge batches until shutdown.
fn write_batches(w: &mut Writer, q: &mut WalQueues) {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut msgs = Vec::with_capacity(MAX_BATCH);
    let mut shutdown = false;
    while !shutdown {
        let mut woken_by = None;
        if w.retry.is_empty() && w.rewrite.is_empty() {
            match q.wait(&w.waiter) {
                Woken::Call(first) => msgs.push(first),
                // Shards were published; check which segments can go.
                Woken::Published(rows) => woken_by = Some(rows),
                Woken::Closed => break,
            }
        } else {
            // Frames a failed write lost are tried again every RETRY_WAIT,
            // with whatever else has come.
            std::thread::sleep(RETRY_WAIT);
            match q.calls.try_recv() {
                Ok(m) => msgs.push(m),
                Err(mpsc::error::TryRecvError::Empty) => {}
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        }
        w.stats
            .wal_busy_since
            .store(crate::now_micros(), Ordering::Relaxed);
        while msgs.len() < MAX_BATCH {
            match q.calls.try_recv() {
                Ok(m) => msgs.push(m),
                Err(_) => break,
            }
        }
        hook_wait(&w.hook);
        let mut batch = Batch::default();
        let mut log = lock(&w.log);
        for begin in std::mem::take(&mut w.rewrite) {
            encode_begin(&mut buf, &begin);
            batch.begun.push(begin);
        }
        for msg in msgs.drain(..) {
            match msg {
                WalMsg::Begin(begin, ack) => {
                    encode_begin(&mut buf, &begin);
                    batch.begun_acks.extend(ack);
                    log.book_begin(begin.clone());
                    batch.begun.push(begin);
                }
                WalMsg::End {
                    outcome,
                    response,
                    upstream_response,
                    ack,
                } => {
                    let up = upstream_response.as_deref();
                    if let Err(e) = encode_end(&mut buf, &outcome, &response, up) {
                        let _ = ack.send(Err(RecordError::Wal(e.to_string())));
                        continue;
                    }
                    let open = log.pending.remove(&outcome.call_id).or_else(|| {
                        // An end of a call whose earlier end a failed write lost.
                        w.retry
                            .remove(&outcome.call_id)
                            .map(|(seg, c)| (seg, c.begin))
                    });
                    match open {
                        Some((seg, begin)) => batch.ended.push((
                            ShardItem::Call {
                                segment: seg,
                                call: CompletedCall {
                                    begin,
                                    outcome,
                                    response,
                                    upstream_response,
                                },
                            },
                            Some(ack),
                        )),
                        None => {
                            tracing::error!(call_id = %outcome.call_id, "call ended without a begin record");
                            let _ = ack.send(Ok(()));
                        }
                    }
                }
                WalMsg::Finish { finish, ack } => {
                    let _ = encode_json(&mut buf, Kind::Finish, &finish, &[], &[]);
                    let segment = log.segment;
                    *log.unpublished.entry(segment).or_insert(0) += 1;
                    batch
                        .finished
                        .push((ShardItem::Rollout { segment, finish }, ack));
                }
                WalMsg::Publish(done) => batch.publish.push(done),
                WalMsg::Shutdown => shutdown = true,
            }
        }
        for (_, (segment, call)) in w.retry.drain() {
            let up = call.upstream_response.as_deref();
            let _ = encode_end(&mut buf, &call.outcome, &call.response, up);
            batch.ended.push((ShardItem::Call { segment, call }, None));
        }
        let result = write_out(w, &mut log, &buf);
        buf.clear();
        if result.is_ok() && log.bytes >= w.cfg.wal_segment_bytes {
            w.rotate(&mut log);
        }
        // The shard queue may make the commit wait: not under the lock.
        drop(log);
        match result {
            Ok(()) => commit(w, batch, &q.rows),
            Err(e) => fail(w, batch, &e),
        }
        apply_published(w, q, woken_by);
        w.stats.wal_busy_since.store(0, Ordering::Relaxed);
    }
}

fn encode_begin(buf: &mut Vec<u8>, begin: &CallBegin) {
    let up = begin.upstream_request.as_deref().unwrap_or(&[]);
    // Request bodies are capped far below a frame's limit (config validation).
    let meta = |buf: &mut Vec<u8>| {
        header::meta(buf, &begin.meta);
        Ok(())
    };
    let _ = frame::encode_with(buf, Kind::Begin, meta, &begin.request, up);
}

/// Append a call's end frame to `buf`; on an error `buf` is as it was.
fn encode_end(
    buf: &mut Vec<u8>,
    outcome: &CallOutcome,
    response: &[u8],
    upstream: Option<&[u8]>,
) -> std::io::Result<()> {
    let header = |buf: &mut Vec<u8>| {
        header::outcome(buf, outcome);
        Ok(())
    };
    frame::encode_with(buf, Kind::End, header, response, upstream.unwrap_or(&[]))
        .map_err(std::io::Error::other)
}

/// The batch is in the WAL: acknowledge it and hand its rows on.
fn commit(w: &mut Writer, batch: Batch, shard_tx: &mpsc::Sender<ShardItem>) {
    if w.stats.clear_wal_error() {
        tracing::info!("write-ahead log writes succeed again; recording resumed");
    }
    for ack in batch.begun_acks {
        let _ = ack.send(Ok(()));
    }
    let finished = batch.finished.into_iter().map(|(i, a)| (i, Some(a)));
    let items: Vec<(ShardItem, Option<Ack>)> = batch.ended.into_iter().chain(finished).collect();
    // Count rows as unpublished before anyone learns they are acknowledged.
    w.stats
        .unpublished_rows
        .fetch_add(items.len() as i64, Ordering::Relaxed);
    let mut forward = Vec::with_capacity(items.len());
    for (item, ack) in items {
        if let Some(ack) = ack {
            let _ = ack.send(Ok(()));
        }
        forward.push(item);
    }
    let publish = !batch.publish.is_empty();
    let publications = batch.publish.into_iter().map(ShardItem::Publish);
    for item in forward.into_iter().chain(publications) {
        if shard_tx.blocking_send(item).is_err() {
            tracing::error!("shard writer stopped; rows stay in the WAL until restart");
        }
    }
    if publish {
        // Someone waits for it: the writer must not sit in the idle class.
        w.stats.boost_shard_writer();
    }
}

/// The batch's write failed: nothing of it counts. Ends and finishes are
/// acknowledged as failed; starts and ends are written again with the next
/// batch, an end as the 503 its harness got under `on_wal_error = "fail"`.
fn fail(w: &mut Writer, batch: Batch, e: &std::io::Error) {
    tracing::error!(error = %e, "write-ahead log write failed");
    w.stats.wal_write_failures.fetch_add(1, Ordering::Relaxed);
    w.stats
        .set_wal_error(format!("write-ahead log write failed: {e}"));
    w.repair();
    w.rewrite = batch.begun;
    let err = RecordError::Wal(e.to_string());
    // The starts are written again with the next batch; a stream waiting
    // on one learns now that it is not on disk yet.
    for ack in batch.begun_acks {
        let _ = ack.send(Err(err.clone()));
    }
    for (item, ack) in batch.ended {
        if let ShardItem::Call { segment, mut call } = item {
            // An end written again is already what it will be recorded as.
            if ack.is_some() && w.cfg.on_wal_error == OnWalError::Fail {
                super::as_unrecorded(&mut call, &err);
            }
            w.retry
                .insert(call.outcome.call_id.clone(), (segment, call));
        }
        if let Some(ack) = ack {
            let _ = ack.send(Err(RecordError::Wal(e.to_string())));
        }
    }
    for (item, ack) in batch.finished {
        if let ShardItem::Rollout { segment, .. } = item {
            if let Some(c) = lock(&w.log).unpublished.get_mut(&segment) {
                *c = c.saturating_sub(1);
            }
        }
        let _ = ack.send(Err(RecordError::Wal(e.to_string())));
    }
}

/// While the test hook's file holds `stall`, wait before writing.
fn hook_wait(hook: &Option<PathBuf>) {
    while hook_state(hook) == "stall" {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn write_out(w: &Writer, log: &mut Log, buf: &[u8]) -> std::io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    match hook_state(&w.hook).as_str() {
        "fail" => {
            return Err(std::io::Error::other(
                "injected write failure (ROLLCALL_TEST_WAL_HOOK)",
            ))
        }
        "torn" => {
            log.write_raw(&buf[..buf.len() / 2])?;
            return Err(std::io::Error::other(
                "injected torn write (ROLLCALL_TEST_WAL_HOOK)",
            ));
        }
        _ => {}
    }
    log.append(buf, w.cfg.wal_fsync)?;
    w.stats
        .wal_bytes_written
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    Ok(())
}
