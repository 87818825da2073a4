//! A segment's blocks, allocated ahead of the writer.
//!
//! A window of the segment being written (`mapped`) is allocated by writing
//! its zeros before it is mapped. On the 2-core bench VM one 1 MiB window's
//! zeros took 3.3 ms to write (median of 40), and they were written on a
//! serving thread, under the WAL's lock (which the other serving thread
//! then waited on), once every 700 or so calls. Now a thread of its own,
//! `rollcall-wal-ahead`, writes the next window's zeros while the writer
//! fills the current one, and the writer only maps them.
//!
//! A range is zeroed once, before anyone maps it: whoever zeroes holds the
//! extent's lock, and the allocated length grows only after the zeros are
//! written. When the thread is behind (or its queue full), the writer
//! zeroes the range itself, as it always did; a finished segment grows no
//! further, so its cut to length stays the file's end.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Requests the thread holds at most; more are dropped (the writer then
/// zeroes for itself).
const QUEUE: usize = 4;

/// Write zeros over `[from, from + len)` of `file`. Zeros written, not
/// `fallocate`d: the blocks are then allocated (a full disk fails this
/// write, not a copy into the mapping) and the pages already in the page
/// cache, so a copy into the window dirties a cached page instead of
/// faulting in and converting an unwritten extent, which measured several
/// µs per page.
fn zeros(file: &File, from: u64, len: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < from + len {
        let n = (from + len - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// How far one segment file is allocated.
pub(super) struct Extent {
    file: File,
    /// Bytes allocated (zeros written). Grows only under `grow`, after the
    /// zeros are written.
    allocated: AtomicU64,
    /// Held while zeros are written; `true` once the segment is finished.
    grow: Mutex<bool>,
}

impl Extent {
    /// `file` (a handle of its own on the segment) has `allocated` bytes.
    pub(super) fn new(file: File, allocated: u64) -> Arc<Extent> {
        Arc::new(Extent {
            file,
            allocated: AtomicU64::new(allocated),
            grow: Mutex::new(false),
        })
    }

    pub(super) fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Acquire)
    }

    /// Allocate the file up to `end` at least. Waits while another thread
    /// zeroes; does nothing once the segment is finished.
    pub(super) fn grow_to(&self, end: u64) -> std::io::Result<()> {
        let finished = self.grow.lock().unwrap_or_else(|p| p.into_inner());
        let from = self.allocated.load(Ordering::Acquire);
        if *finished || end <= from {
            return Ok(());
        }
        zeros(&self.file, from, end - from)?;
        self.allocated.store(end, Ordering::Release);
        Ok(())
    }

    /// The segment takes no more frames: nothing zeroes past its end from
    /// now on.
    pub(super) fn finish(&self) {
        *self.grow.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }
}

/// The sending end of the thread's queue: each request is an extent and
/// the length to allocate it to. The thread stops when every sender is
/// dropped (the WAL with it).
#[derive(Clone)]
pub(super) struct Ahead {
    tx: SyncSender<(Arc<Extent>, u64)>,
}

impl Ahead {
    /// Start the thread.
    pub(super) fn start() -> std::io::Result<Ahead> {
        let (tx, rx) = sync_channel::<(Arc<Extent>, u64)>(QUEUE);
        std::thread::Builder::new()
            .name("rollcall-wal-ahead".into())
            .spawn(move || {
                for (extent, end) in rx {
                    if let Err(e) = extent.grow_to(end) {
                        // The writer meets the same error when it needs
                        // the range, and handles it as a failed write.
                        tracing::warn!(error = %e, "could not allocate WAL blocks ahead");
                    }
                }
            })?;
        Ok(Ahead { tx })
    }

    /// Ask for `extent` to be allocated to `end`; never waits.
    pub(super) fn ask(&self, extent: &Arc<Extent>, end: u64) {
        // Full or stopped: the writer zeroes the range itself when it
        // needs it.
        let _: Result<(), TrySendError<_>> = self.tx.try_send((extent.clone(), end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_zeroes_ahead_and_a_finished_extent_stays_put() {
        let dir = tempfile::tempdir().unwrap();
        let file = super::super::open_segment(dir.path(), 0).unwrap();
        let extent = Extent::new(file.try_clone().unwrap(), 0);
        let ahead = Ahead::start().unwrap();
        ahead.ask(&extent, 100 << 10);
        // The writer needing the range waits for the thread, or zeroes it.
        extent.grow_to(100 << 10).unwrap();
        assert_eq!(extent.allocated(), 100 << 10);
        assert_eq!(file.metadata().unwrap().len(), 100 << 10);
        extent.grow_to(50).unwrap();
        assert_eq!(extent.allocated(), 100 << 10, "an extent never shrinks");
        extent.finish();
        file.set_len(10).unwrap();
        // What the thread does with a request that comes too late.
        extent.grow_to(300 << 10).unwrap();
        assert_eq!(
            file.metadata().unwrap().len(),
            10,
            "a finished segment grew"
        );
    }
}
