//! The response path's handle on the recorder (`Recorder`), what it sends
//! the WAL writer (`WalMsg`), and the owner of the recorder's threads
//! (`RecorderTask`).

use super::{feed, pipeline, replay, wal};
use super::{CallBegin, CallOutcome, RecordError, RecorderStats, RolloutFinish};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// What the call queue carries, from the response path to the WAL writer.
pub(crate) enum WalMsg {
    /// A call's start, with an ack once it is in the WAL.
    Begin(
        Arc<CallBegin>,
        Option<oneshot::Sender<Result<(), RecordError>>>,
    ),
    End {
        outcome: CallOutcome,
        response: Bytes,
        upstream_response: Option<Bytes>,
        ack: oneshot::Sender<Result<(), RecordError>>,
    },
    Finish {
        finish: RolloutFinish,
        ack: oneshot::Sender<Result<(), RecordError>>,
    },
    /// Publish the shards now, once everything before it is in the WAL
    /// (`Recorder::publish`).
    Publish(oneshot::Sender<()>),
    Shutdown,
}

/// A call's end, given back when it could not be written inline (boxed:
/// the rare path).
pub type EndParts = (CallOutcome, Bytes, Option<Bytes>);

/// The wait for room in the shard queue, after an end written inline.
pub type QueueWait<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// The response path's handle on the recorder. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<WalMsg>,
    pub stats: Arc<RecorderStats>,
    /// Inline writes of call starts and ends: with `wal_fsync` off and no
    /// test hook.
    inline: Option<Arc<wal::Inline>>,
    /// The live feed's reader, with `shards.feed = true`.
    pub feed: Option<feed::Feed>,
}

impl Recorder {
    /// Replay what an earlier run left in the WAL, then start the WAL and
    /// shard threads.
    pub fn start(
        cfg: &crate::config::ShardConfig,
    ) -> Result<(Recorder, RecorderTask, replay::Recovered), RecordError> {
        let feed_err = |e: std::io::Error| {
            RecordError::Shard(format!(
                "the feed in {}: {e}",
                cfg.dir.join("feed").display()
            ))
        };
        let (mut writer, feed) = match cfg.feed {
            true => {
                let (w, f) = feed::FeedWriter::open(&cfg.dir.join("feed"), cfg.wal_fsync)
                    .map_err(feed_err)?;
                (Some(w), Some(f))
            }
            false => (None, None),
        };
        let recovered = replay::recover(cfg, writer.as_mut())?;
        let stats = Arc::new(RecorderStats::default());
        let (tx, stages, inline) = pipeline::start(cfg, recovered.next_segment, &stats, writer)?;
        let inline = inline.map(Arc::new);
        Ok((
            Recorder {
                tx: tx.clone(),
                stats,
                inline,
                feed,
            },
            RecorderTask {
                tx,
                stages: Some(stages),
            },
            recovered,
        ))
    }

    /// Log a call's start. Waits only for queue space; the returned future
    /// resolves once the start is in the WAL (or with the write's error), so
    /// a stream's head can wait for it: a call whose head a client saw is
    /// always on disk. Written here and now when inline writes are on
    /// ([`Recorder::inline`]).
    pub async fn begin(
        &self,
        begin: Arc<CallBegin>,
    ) -> Result<impl std::future::Future<Output = Result<(), RecordError>>, RecordError> {
        let done = match self.inline().map(|i| i.begin(&begin)) {
            Some(Ok(())) => None,
            failed => {
                if let Some(Err(e)) = failed {
                    tracing::warn!(error = %e, "inline write-ahead log write failed; the writer thread takes the call's start");
                }
                let (ack, done) = oneshot::channel();
                // Boxed: this path is the rare one with inline writes on,
                // and held inline its state would enlarge every call's.
                Box::pin(self.tx.send(WalMsg::Begin(begin, Some(ack))))
                    .await
                    .map_err(|_| RecordError::Closed)?;
                Some(done)
            }
        };
        Ok(async move {
            match done {
                None => Ok(()),
                Some(done) => done.await.unwrap_or(Err(RecordError::Closed)),
            }
        })
    }

    /// Inline writes, when they can be used now: on (`wal_fsync` off, no
    /// test hook) and the WAL taking writes.
    fn inline(&self) -> Option<&wal::Inline> {
        self.inline.as_deref().filter(|_| !self.stats.wal_failing())
    }

    /// Log a call's end and wait until it is in the WAL.
    pub async fn end(
        &self,
        outcome: CallOutcome,
        response: Bytes,
        upstream_response: Option<Bytes>,
    ) -> Result<(), RecordError> {
        self.submit_end(outcome, response, upstream_response)
            .await?
            .await
    }

    /// Queue a call's end (waiting only for queue space); the returned
    /// future resolves once it is in the WAL, or with the write's error.
    pub async fn submit_end(
        &self,
        outcome: CallOutcome,
        response: Bytes,
        upstream_response: Option<Bytes>,
    ) -> Result<impl std::future::Future<Output = Result<(), RecordError>>, RecordError> {
        let (ack, done) = oneshot::channel();
        self.tx
            .send(WalMsg::End {
                outcome,
                response,
                upstream_response,
                ack,
            })
            .await
            .map_err(|_| RecordError::Closed)?;
        Ok(async move { done.await.map_err(|_| RecordError::Closed)? })
    }

    /// Write a call's end here and now, when that can be done (inline
    /// writes usable, and the call's start known to be in the WAL already,
    /// so the end never precedes it), and hand its row to the shard
    /// writer. Returns the end back when it must go the thread's way
    /// ([`Recorder::submit_end`]); when written, what is left to await:
    /// nothing as a rule, or the wait for room in a full shard queue.
    ///
    /// Not async: the caller's future would hold this one's state, and
    /// each await copies a future whole.
    pub fn end_inline(
        &self,
        outcome: CallOutcome,
        response: Bytes,
        upstream_response: Option<Bytes>,
    ) -> Result<Option<QueueWait<'_>>, Box<EndParts>> {
        let Some(inline) = self.inline() else {
            return Err(Box::new((outcome, response, upstream_response)));
        };
        let row = match inline.end(outcome, response, upstream_response)? {
            Some(row) => inline.try_queue(row),
            None => None,
        };
        Ok(row.map(|row| -> QueueWait<'_> { Box::pin(inline.queue(row)) }))
    }

    /// Log a rollout's outcome and wait until it is in the WAL.
    pub async fn finish(&self, finish: RolloutFinish) -> Result<(), RecordError> {
        let (ack, done) = oneshot::channel();
        self.tx
            .send(WalMsg::Finish { finish, ack })
            .await
            .map_err(|_| RecordError::Closed)?;
        done.await.map_err(|_| RecordError::Closed)?
    }

    /// Publish the open shards now, after every call end and finish
    /// acknowledged before this call: when it returns, their rows are in
    /// published files (a reader such as the job API's groups sees them
    /// without waiting for `shards.max_age_secs`). Rows a failed write
    /// kept in the WAL are not published; they stay there for the next
    /// start, as always.
    pub async fn publish(&self) -> Result<(), RecordError> {
        let (done, published) = oneshot::channel();
        self.tx
            .send(WalMsg::Publish(done))
            .await
            .map_err(|_| RecordError::Closed)?;
        // Dropped unanswered: the batch it came with failed to reach the
        // WAL (its rows are kept for a retry), or the recorder stopped.
        published.await.map_err(|_| {
            RecordError::Shard("the shards were not published: the write-ahead log write before it failed, or recording stopped".into())
        })
    }

    pub fn unpublished_rows(&self) -> i64 {
        self.stats.unpublished_rows.load(Ordering::Relaxed)
    }
}

/// Owns the recorder threads; `shutdown` flushes and publishes everything.
pub struct RecorderTask {
    tx: mpsc::Sender<WalMsg>,
    stages: Option<pipeline::Stages>,
}

impl RecorderTask {
    /// Publish every pending row and stop. Calls still in flight are left in
    /// the WAL and become `incomplete` rows at the next start.
    pub async fn shutdown(mut self) {
        let _ = self.tx.send(WalMsg::Shutdown).await;
        if let Some(stages) = self.stages.take() {
            let _ = tokio::task::spawn_blocking(move || stages.join()).await;
        }
    }
}
