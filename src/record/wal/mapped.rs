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
//! CPU under load).
//!
//! Only one window is mapped at a time, so the mapping adds at most
//! [`WINDOW`] to the resident set. A segment left by a crash ends in the
//! zeros of its last window; replay reads them as the segment's end.

use memmap2::{MmapMut, MmapOptions};
use std::fs::File;

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
    /// Bytes allocated to the file (its length).
    allocated: u64,
    /// Bytes mapped at a time.
    window: u64,
}

fn allocate(file: &File, from: u64, len: u64) -> std::io::Result<()> {
    // Zeros written, not `fallocate`d: the blocks are then allocated (a
    // full disk fails this write, not a copy) and the pages already in
    // the page cache, so a copy into the window dirties a cached page
    // instead of faulting in and converting an unwritten extent, which
    // measured several µs per page.
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

fn map(file: &File, at: u64, len: u64) -> std::io::Result<MmapMut> {
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: the file is this process's own WAL segment, allocated up to
    // `at + len` before it is mapped and never truncated while mapped; no
    // other process writes it while the proxy runs.
    unsafe { MmapOptions::new().offset(at).len(len).map_mut(file) }
}

impl Mapped {
    /// Map a new, empty segment file of about `segment_bytes`.
    pub(super) fn new(file: File, segment_bytes: u64) -> std::io::Result<Mapped> {
        let window = segment_bytes.clamp(ALIGN, WINDOW);
        allocate(&file, 0, window)?;
        let map = map(&file, 0, window)?;
        Ok(Mapped {
            file,
            at: 0,
            map,
            allocated: window,
            window,
        })
    }

    /// Make `[from, from + len)` writable: move the window (allocating the
    /// file further first) when it does not hold the range.
    fn reach(&mut self, from: u64, len: usize) -> std::io::Result<()> {
        let end = from + len as u64;
        if from >= self.at && end <= self.at + self.map.len() as u64 {
            return Ok(());
        }
        let at = from - from % ALIGN;
        let size = (end - at).max(self.window);
        if at + size > self.allocated {
            allocate(&self.file, self.allocated, at + size - self.allocated)?;
            self.allocated = at + size;
        }
        self.map = map(&self.file, at, size)?;
        self.at = at;
        Ok(())
    }

    /// Copy `buf` to file offset `from`.
    pub(super) fn write_at(&mut self, from: u64, buf: &[u8]) -> std::io::Result<()> {
        self.reach(from, buf.len())?;
        let start = (from - self.at) as usize;
        let Some(dst) = self.map.get_mut(start..start + buf.len()) else {
            return Err(std::io::Error::other("WAL window does not hold the frame"));
        };
        dst.copy_from_slice(buf);
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
        let Mapped { file, map, .. } = self;
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
        let mut m = Mapped::new(file, 64 << 20).unwrap();
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
}
