//! The segment being written, as memory: its file is extended a window at
//! a time (zeros written), and the window is mapped, so that appending a
//! frame is a copy, not a `write(2)`.
//!
//! A `write(2)` per call start and end cost the response path more than
//! anything else the recorder does (the syscall, the inode's lock and
//! timestamp, and the two serving threads queueing on the WAL's lock while
//! one of them is in the kernel). A copy into a shared mapping is in the
//! page cache as soon as it is made, exactly like a written buffer: it
//! survives the process's SIGKILL, and `fsync` (`msync`) makes it durable.
//! The window's blocks are written (with zeros) before it is mapped, so a
//! full disk is an error at the window's start, never a SIGBUS at a copy,
//! and its pages are in the page cache already: a copy dirties a cached
//! page rather than faulting in an unallocated one (`fallocate`d blocks
//! cost several µs per page at the first copy, about 4 % of the proxy's
//! CPU under load). Once the writer is half way through a window, the
//! next window's zeros are written by a thread of its own (`ahead`), so
//! moving the window is a remap.
//!
//! Only one window is mapped at a time, so the mapping adds at most
//! [`WINDOW`] to the resident set. A segment left by a crash ends in the
//! zeros of its last window; replay reads them as the segment's end.

use super::ahead::{Ahead, Extent};
use memmap2::{MmapMut, MmapOptions};
use std::fs::File;
use std::sync::Arc;

/// Bytes mapped (and allocated) at a time, at most: a segment smaller
/// than this (`shards.wal_segment_bytes`) maps its own size.
pub(super) const WINDOW: u64 = 1 << 20;

/// Window starts are multiples of this: every page size Linux uses.
const ALIGN: u64 = 64 << 10;

pub(super) struct Mapped {
    file: File,
    /// File offset of the mapped window.
    at: u64,
    map: MmapMut,
    /// How far the file is allocated, shared with the `ahead` thread.
    extent: Arc<Extent>,
    /// Bytes mapped at a time.
    window: u64,
    /// About how long the segment grows: nothing is allocated ahead past it.
    segment_bytes: u64,
    /// Allocates the next window; `None` where it could not start (the
    /// writer then allocates every window itself).
    ahead: Option<Ahead>,
    /// The length last asked of `ahead`.
    asked: u64,
}

fn map(file: &File, at: u64, len: u64) -> std::io::Result<MmapMut> {
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: the file is this process's own WAL segment, allocated up to
    // `at + len` before it is mapped and never truncated while mapped; no
    // other process writes it while the proxy runs.
    unsafe { MmapOptions::new().offset(at).len(len).map_mut(file) }
}

impl Mapped {
    /// Map a new, empty segment file of about `segment_bytes`.
    pub(super) fn new(
        file: File,
        segment_bytes: u64,
        ahead: Option<Ahead>,
    ) -> std::io::Result<Mapped> {
        let window = segment_bytes.clamp(ALIGN, WINDOW);
        let extent = Extent::new(file.try_clone()?, 0);
        extent.grow_to(window)?;
        let map = map(&file, 0, window)?;
        Ok(Mapped {
            file,
            at: 0,
            map,
            extent,
            window,
            segment_bytes,
            ahead,
            asked: window,
        })
    }

    /// The thread that allocates ahead, for the next segment.
    pub(super) fn ahead(&self) -> Option<Ahead> {
        self.ahead.clone()
    }

    /// Make `[from, from + len)` writable: move the window (allocating the
    /// file further first, unless that is done already) when it does not
    /// hold the range.
    fn reach(&mut self, from: u64, len: usize) -> std::io::Result<()> {
        let end = from + len as u64;
        if from >= self.at && end <= self.at + self.map.len() as u64 {
            return Ok(());
        }
        let at = from - from % ALIGN;
        let size = (end - at).max(self.window);
        if at + size > self.extent.allocated() {
            self.extent.grow_to(at + size)?;
        }
        self.map = map(&self.file, at, size)?;
        self.at = at;
        Ok(())
    }

    /// Past the middle of the window, ask for the next one to be allocated.
    fn look_ahead(&mut self, end: u64) {
        let mapped_end = self.at + self.map.len() as u64;
        if end < self.at + self.map.len() as u64 / 2 || mapped_end >= self.segment_bytes {
            return;
        }
        let next = mapped_end + self.window;
        if next > self.asked {
            if let Some(ahead) = &self.ahead {
                ahead.ask(&self.extent, next);
            }
            self.asked = next;
        }
    }

    /// Copy `buf` to file offset `from`.
    pub(super) fn write_at(&mut self, from: u64, buf: &[u8]) -> std::io::Result<()> {
        self.reach(from, buf.len())?;
        let start = (from - self.at) as usize;
        let Some(dst) = self.map.get_mut(start..start + buf.len()) else {
            return Err(std::io::Error::other("WAL window does not hold the frame"));
        };
        dst.copy_from_slice(buf);
        self.look_ahead(from + buf.len() as u64);
        Ok(())
    }

    /// Make `[from, from + len)` durable (the range is in the window: it
    /// was just written).
    pub(super) fn sync(&self, from: u64, len: usize) -> std::io::Result<()> {
        match from.checked_sub(self.at) {
            Some(start) if start as usize + len <= self.map.len() => {
                self.map.flush_range(start as usize, len)
            }
            _ => self.file.sync_data(),
        }
    }

    /// Zero `[from, to)` (what a torn write left past the last whole frame)
    /// and make it durable.
    pub(super) fn zero(&mut self, from: u64, to: u64) -> std::io::Result<()> {
        if to <= from {
            return Ok(());
        }
        self.write_at(from, &vec![0; (to - from) as usize])?;
        self.sync(from, (to - from) as usize)
    }

    /// Unmap and cut the file to its `len` whole bytes.
    pub(super) fn finish(self, len: u64) -> std::io::Result<()> {
        let Mapped {
            file, map, extent, ..
        } = self;
        extent.finish();
        drop(map);
        file.set_len(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_land_in_the_file_across_windows() {
        let dir = tempfile::tempdir().unwrap();
        let file = super::super::open_segment(dir.path(), 0).unwrap();
        let path = super::super::segment_path(dir.path(), 0);
        let mut m = Mapped::new(file, 64 << 20, Some(Ahead::start().unwrap())).unwrap();
        let big = vec![7u8; (WINDOW + 10) as usize];
        m.write_at(0, b"abc").unwrap();
        m.write_at(3, &big).unwrap();
        let end = 3 + big.len() as u64;
        m.write_at(end, b"xyz").unwrap();
        m.sync(end, 3).unwrap();
        // Read back while mapped: the page cache is the file.
        let data = std::fs::read(&path).unwrap();
        assert_eq!(&data[..3], b"abc");
        assert_eq!(&data[end as usize..end as usize + 3], b"xyz");
        assert!(data[end as usize + 3..].iter().all(|&b| b == 0));
        m.zero(end, end + 3).unwrap();
        m.finish(end).unwrap();
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len() as u64, end);
        assert!(data[3..].iter().all(|&b| b == 7));
    }

    #[test]
    fn windows_allocated_ahead_hold_every_frame() {
        let dir = tempfile::tempdir().unwrap();
        let file = super::super::open_segment(dir.path(), 0).unwrap();
        let path = super::super::segment_path(dir.path(), 0);
        let mut m = Mapped::new(file, 4 << 20, Some(Ahead::start().unwrap())).unwrap();
        let frame = |i: u64| vec![(i % 251) as u8 + 1; 1000];
        for i in 0..3000u64 {
            m.write_at(i * 1000, &frame(i)).unwrap();
        }
        let end = 3000 * 1000;
        let data = std::fs::read(&path).unwrap();
        for i in 0..3000u64 {
            let at = (i * 1000) as usize;
            assert_eq!(data[at..at + 1000], frame(i)[..], "frame {i}");
        }
        assert!(data[end as usize..].iter().all(|&b| b == 0));
        m.finish(end).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), end);
    }
}
