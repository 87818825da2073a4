//! The frame format: how one WAL record is laid out on disk, and how a
//! segment's bytes are read back.
//!
//! Frame: `b"RCW1" | kind u8 | header_len u32 | blob_a_len u32 | blob_b_len u32 |
//! crc32 u32 | header | blob_a | blob_b`, integers little-endian, the
//! CRC over everything after itself. A call frame's header is packed
//! (`header`); a finish frame's is JSON. A torn tail (a frame cut by a crash)
//! fails its length or CRC check; replay then looks for the next frame's
//! magic and goes on from there, so one damaged frame costs only itself.

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

/// A frame part longer than a `u32` length field can say.
#[derive(Debug, thiserror::Error)]
#[error("a write-ahead log frame part of {0} bytes exceeds the 4 GiB frame limit")]
pub struct FrameTooLarge(pub usize);

/// Append one frame to `buf`.
pub fn encode(
    buf: &mut Vec<u8>,
    kind: Kind,
    header: &[u8],
    a: &[u8],
    b: &[u8],
) -> Result<(), FrameTooLarge> {
    let header_len = header.len();
    let write = |buf: &mut Vec<u8>| {
        buf.extend_from_slice(header);
        Ok(())
    };
    encode_with(buf, kind, write, a, b).map_err(|e| match e {
        FrameError::TooLarge(e) => e,
        FrameError::Header(_) => FrameTooLarge(header_len),
    })
}

/// Append one frame whose header is `header` as JSON, serialized straight
/// into `buf` rather than into a buffer of its own first. On an error `buf`
/// is as it was.
pub fn encode_json<T: serde::Serialize>(
    buf: &mut Vec<u8>,
    kind: Kind,
    header: &T,
    a: &[u8],
    b: &[u8],
) -> Result<(), FrameError> {
    encode_with(buf, kind, |buf| serde_json::to_writer(buf, header), a, b)
}

/// Why a frame could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The frame's header could not be serialized.
    #[error("the frame's header could not be serialized: {0}")]
    Header(#[from] serde_json::Error),
    /// A part is too long for its length field.
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
}

/// Append one frame, its header written by `header` straight into `buf`;
/// on an error `buf` is as it was.
pub fn encode_with(
    buf: &mut Vec<u8>,
    kind: Kind,
    header: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>,
    a: &[u8],
    b: &[u8],
) -> Result<(), FrameError> {
    let start = buf.len();
    buf.reserve(FIXED + a.len() + b.len() + 256);
    buf.extend_from_slice(&[0; FIXED]);
    let written = (|| {
        header(buf)?;
        let header_len = buf.len() - start - FIXED;
        let len = |n: usize| u32::try_from(n).map_err(|_| FrameTooLarge(n));
        let lens_of = [len(header_len)?, len(a.len())?, len(b.len())?];
        buf.extend_from_slice(a);
        buf.extend_from_slice(b);
        let mut fixed = [0u8; FIXED];
        fixed[..4].copy_from_slice(MAGIC);
        fixed[4] = kind as u8;
        for (i, n) in lens_of.iter().enumerate() {
            fixed[5 + 4 * i..9 + 4 * i].copy_from_slice(&n.to_le_bytes());
        }
        // The CRC covers the kind and lengths, then the three parts.
        let mut crc = crc32fast::Hasher::new();
        crc.update(&fixed[4..17]);
        crc.update(buf.get(start + FIXED..).unwrap_or_default());
        fixed[17..].copy_from_slice(&crc.finalize().to_le_bytes());
        if let Some(dst) = buf.get_mut(start..start + FIXED) {
            dst.copy_from_slice(&fixed);
        }
        Ok(())
    })();
    if written.is_err() {
        buf.truncate(start);
    }
    written
}

/// Decode the frame at the start of `data`: the frame and its length, or
/// `None` when it is torn, corrupt or not a frame.
fn decode_one(data: &[u8]) -> Option<(Frame, usize)> {
    let fixed = data.get(..FIXED)?;
    if &fixed[..4] != MAGIC {
        return None;
    }
    let u32_at = |i: usize| -> usize {
        u32::from_le_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]) as usize
    };
    let (h, a, b) = (u32_at(5), u32_at(9), u32_at(13));
    let want = u32_at(17) as u32;
    let total = FIXED.checked_add(h)?.checked_add(a)?.checked_add(b)?;
    let body = data.get(FIXED..total)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&fixed[4..17]);
    crc.update(body);
    if crc.finalize() != want {
        return None;
    }
    let kind = match fixed[4] {
        1 => Kind::Begin,
        2 => Kind::End,
        3 => Kind::Finish,
        _ => return None,
    };
    let frame = Frame {
        kind,
        header: body[..h].to_vec(),
        a: body[h..h + a].to_vec(),
        b: body[h + a..].to_vec(),
    };
    Some((frame, total))
}

/// Decode every whole, intact frame. A torn or corrupt one is skipped: the
/// scan resumes at the next frame magic after it. Returns the frames and
/// whether the data was all whole frames.
pub fn decode_all(data: &[u8]) -> (Vec<Frame>, bool) {
    let mut out = Vec::new();
    let mut pos = 0;
    let mut clean = true;
    while pos < data.len() {
        // The zeros of a mapped window the segment never filled (it was
        // not cut to its length: the proxy was killed) end it cleanly.
        if data[pos] == 0 && data[pos..].iter().all(|&b| b == 0) {
            break;
        }
        if let Some((frame, len)) = decode_one(&data[pos..]) {
            out.push(frame);
            pos += len;
            continue;
        }
        clean = false;
        match memchr::memmem::find(&data[pos + 1..], MAGIC) {
            Some(i) => pos += 1 + i,
            None => break,
        }
    }
    (out, clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header serialized in place makes the same bytes as one serialized
    /// first, and a header that cannot be serialized leaves `buf` as it was.
    #[test]
    fn json_headers_in_place_frame_the_same_bytes() {
        let header = serde_json::json!({"call_id": "c\u{e9}", "n": [1, 2.5]});
        let (mut by_bytes, mut in_place) = (b"xy".to_vec(), b"xy".to_vec());
        let h = serde_json::to_vec(&header).unwrap();
        encode(&mut by_bytes, Kind::End, &h, b"resp", b"up").unwrap();
        encode_json(&mut in_place, Kind::End, &header, b"resp", b"up").unwrap();
        assert_eq!(by_bytes, in_place);
        let (frames, clean) = decode_all(&in_place[2..]);
        assert!(clean);
        assert_eq!((frames.len(), frames[0].b.as_slice()), (1, &b"up"[..]));
        let mut bad = std::collections::HashMap::new();
        bad.insert(vec![1u8], 1);
        assert!(encode_json(&mut in_place, Kind::End, &bad, b"r", b"").is_err());
        assert_eq!(in_place, by_bytes);
    }

    #[test]
    fn frames_round_trip_and_torn_tails_stop_replay() {
        let mut buf = Vec::new();
        encode(&mut buf, Kind::Begin, b"{}", b"req", b"").unwrap();
        encode(&mut buf, Kind::End, b"{\"x\":1}", b"resp", b"").unwrap();
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

    fn three() -> (Vec<u8>, usize) {
        let mut buf = Vec::new();
        encode(&mut buf, Kind::Begin, b"{}", b"one", b"").unwrap();
        let first = buf.len();
        encode(&mut buf, Kind::Begin, b"{}", b"two", b"").unwrap();
        encode(&mut buf, Kind::Begin, b"{}", b"three", b"up").unwrap();
        (buf, first)
    }

    /// A segment the proxy was killed while writing ends in its mapped
    /// window's zeros: the end of its frames, cleanly, unless a frame was
    /// torn before them.
    #[test]
    fn a_zero_tail_ends_a_segment_cleanly() {
        let (buf, _) = three();
        let mut zeros = buf.clone();
        zeros.resize(buf.len() + 4096, 0);
        assert_eq!(decode_all(&zeros).0.len(), 3);
        assert!(decode_all(&zeros).1, "a zero tail is a clean end");
        let mut torn = buf[..buf.len() - 2].to_vec();
        torn.resize(buf.len() + 4096, 0);
        assert!(!decode_all(&torn).1, "a torn frame before the zeros is not");
    }

    #[test]
    fn a_damaged_frame_costs_only_itself() {
        let (buf, first) = three();
        let mut bad = buf.clone();
        bad[first + FIXED + 3] ^= 0x40; // inside the second frame's header
        let (frames, clean) = decode_all(&bad);
        assert!(!clean);
        let blobs: Vec<_> = frames.iter().map(|f| f.a.clone()).collect();
        assert_eq!(blobs, vec![b"one".to_vec(), b"three".to_vec()]);
        // Zeroes written over a frame (a torn page) likewise.
        let mut zeroed = buf.clone();
        zeroed[first..first + 10].fill(0);
        assert_eq!(decode_all(&zeroed).0.len(), 2);
        // A frame whose lengths claim more than there is ends the scan.
        let mut huge = buf.clone();
        huge[first + 9..first + 13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_all(&huge).0.len(), 2);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Truncated at any offset, bit-flipped anywhere, or with a zeroed
        /// tail, a segment decodes without panicking, and every frame the
        /// damage did not touch is still read.
        #[test]
        fn corrupted_segments_never_panic(cut in 0usize..200, flip in 0usize..200, bit in 0u8..8, zero in 0usize..200) {
            let (buf, _) = three();
            let n = buf.len();
            let (frames, _) = decode_all(&buf[..cut.min(n)]);
            proptest::prop_assert!(frames.len() <= 3);
            let mut flipped = buf.clone();
            flipped[flip % n] ^= 1 << bit;
            let (frames, _) = decode_all(&flipped);
            proptest::prop_assert!(frames.len() >= 2, "one flipped bit lost more than its frame");
            let mut z = buf.clone();
            let from = n - zero.min(n);
            z[from..].fill(0);
            let whole = decode_all(&buf[..from]).0.len();
            proptest::prop_assert_eq!(decode_all(&z).0.len(), whole);
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut d = data.clone();
            d.splice(0..0, MAGIC.iter().copied());
            let _ = decode_all(&data);
            let _ = decode_all(&d);
        }
    }
}
