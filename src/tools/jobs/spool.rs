//! A background process's output on disk: one byte stream (stdout and stderr in the
//! order they arrived), addressed by byte offset from the start of the process, kept
//! within a bound by dropping the oldest part.
//!
//! The stream is stored in segment files of half the bound each; when the bytes kept
//! pass the bound, the oldest segment is deleted. What is kept therefore lies between
//! half the bound and the bound (plus one chunk). An offset is a sequence number: it
//! never changes meaning, so a client that saw output up to offset N reads on from N,
//! and learns how much was dropped if N is no longer kept.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One page of a spool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// Valid UTF-8 (cut at character boundaries).
    pub text: String,
    /// Offset of the first byte of `text`.
    pub offset: u64,
    /// Offset right after `text`: where the next read continues.
    pub next_offset: u64,
    /// Bytes asked for that are no longer kept (dropped before `offset`).
    pub dropped: u64,
}

#[derive(Debug)]
struct Segment {
    start: u64,
    len: u64,
    file: File,
    path: PathBuf,
}

#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    name: String,
    /// Bytes kept at most (plus one chunk).
    bound: u64,
    segments: VecDeque<Segment>,
    /// Bytes written since the process started.
    end: u64,
    next_segment: u64,
}

impl Spool {
    /// A spool for `name` in `dir` (which exists, owner-only), keeping about `bound`
    /// bytes.
    pub fn create(dir: &Path, name: &str, bound: u64) -> std::io::Result<Spool> {
        let mut spool = Spool {
            dir: dir.to_owned(),
            name: name.to_owned(),
            bound: bound.max(2),
            segments: VecDeque::new(),
            end: 0,
            next_segment: 0,
        };
        spool.open_segment()?;
        Ok(spool)
    }

    fn open_segment(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(format!("{}.{}", self.name, self.next_segment));
        self.next_segment += 1;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        self.segments.push_back(Segment { start: self.end, len: 0, file, path });
        Ok(())
    }

    /// Appends a chunk; drops the oldest segments when past the bound (of a chunk
    /// larger than the bound, only its end is kept).
    pub fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let half = (self.bound / 2).max(1);
        let mut rest = bytes;
        if rest.len() as u64 > self.bound {
            let skip = rest.len() - usize::try_from(self.bound).unwrap_or(rest.len());
            for old in self.segments.drain(..) {
                let _ = std::fs::remove_file(&old.path);
            }
            self.end += skip as u64;
            rest = &rest[skip..];
        }
        while !rest.is_empty() {
            if self.segments.back().is_none_or(|last| last.len >= half) {
                self.open_segment()?;
            }
            let Some(last) = self.segments.back_mut() else { break };
            let room = usize::try_from(half - last.len).unwrap_or(usize::MAX);
            let (piece, after) = rest.split_at(room.min(rest.len()));
            (&last.file).write_all(piece)?;
            last.len += piece.len() as u64;
            self.end += piece.len() as u64;
            rest = after;
        }
        while self.segments.len() > 1 && self.kept() > self.bound {
            if let Some(old) = self.segments.pop_front() {
                let _ = std::fs::remove_file(&old.path);
            }
        }
        Ok(())
    }

    fn kept(&self) -> u64 {
        self.end - self.start()
    }

    /// The oldest offset still kept.
    pub fn start(&self) -> u64 {
        self.segments.front().map_or(self.end, |first| first.start)
    }

    /// Bytes written since the process started.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Up to `limit` bytes from `offset` (a negative one counts back from the end).
    pub fn read(&self, offset: i64, limit: usize) -> std::io::Result<Page> {
        let asked = if offset < 0 {
            self.end.saturating_sub(offset.unsigned_abs())
        } else {
            offset.unsigned_abs().min(self.end)
        };
        let start = asked.max(self.start());
        let dropped = start - asked;
        let stop = start.saturating_add(limit as u64).min(self.end);
        let mut bytes = Vec::with_capacity((stop - start) as usize);
        for segment in &self.segments {
            let seg_end = segment.start + segment.len;
            if seg_end <= start || segment.start >= stop {
                continue;
            }
            let from = start.max(segment.start);
            let to = stop.min(seg_end);
            let mut buf = vec![0u8; (to - from) as usize];
            segment.file.read_exact_at(&mut buf, from - segment.start)?;
            bytes.extend_from_slice(&buf);
        }
        // Whole characters only: skip a character's tail at the start, keep an
        // incomplete one at the end for the next read.
        let skip = bytes.iter().take(3).take_while(|byte| **byte & 0xc0 == 0x80).count();
        let keep = complete_utf8_len(&bytes[skip..]);
        let text = String::from_utf8_lossy(&bytes[skip..skip + keep]).into_owned();
        Ok(Page {
            text,
            offset: start + skip as u64,
            next_offset: start + (skip + keep) as u64,
            dropped: dropped + skip as u64,
        })
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        for segment in &self.segments {
            let _ = std::fs::remove_file(&segment.path);
        }
    }
}

/// The length of `bytes` without an incomplete UTF-8 character at its end.
fn complete_utf8_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(4) {
        let byte = bytes[len - back];
        if byte & 0xc0 == 0x80 {
            continue;
        }
        let char_len = match byte {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return len,
        };
        return if back < char_len { len - back } else { len };
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_by_offset_and_from_the_tail() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let mut spool =
            Spool::create(dir.path(), "p1", 1 << 20).unwrap_or_else(|err| panic!("{err}"));
        spool.append(b"hello ").unwrap_or_else(|err| panic!("{err}"));
        spool.append(b"world\n").unwrap_or_else(|err| panic!("{err}"));
        let page = spool.read(0, 5).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((page.text.as_str(), page.offset, page.next_offset), ("hello", 0, 5));
        let page = spool.read(5, 100).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((page.text.as_str(), page.next_offset), (" world\n", 12));
        let tail = spool.read(-6, 100).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((tail.text.as_str(), tail.offset), ("world\n", 6));
        let past = spool.read(100, 10).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((past.text.as_str(), past.offset), ("", 12));
    }

    #[test]
    fn the_oldest_output_is_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let mut spool = Spool::create(dir.path(), "p1", 100).unwrap_or_else(|err| panic!("{err}"));
        for line in 0..100 {
            spool
                .append(format!("line {line:04}\n").as_bytes())
                .unwrap_or_else(|err| panic!("{err}"));
        }
        assert_eq!(spool.end(), 1000);
        assert!(spool.start() >= 1000 - 110 && spool.start() <= 950, "{}", spool.start());
        let page = spool.read(0, 20).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(page.offset, spool.start());
        assert_eq!(page.dropped, spool.start());
        assert!(page.text.starts_with("line "), "{:?}", page.text);
        let files = std::fs::read_dir(dir.path()).map(Iterator::count).unwrap_or(0);
        assert!(files <= 3, "{files} segment files kept");
    }

    #[test]
    fn a_chunk_larger_than_the_bound_keeps_its_end() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let mut spool = Spool::create(dir.path(), "p1", 10).unwrap_or_else(|err| panic!("{err}"));
        spool.append(b"0123456789abcdefghij").unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((spool.start(), spool.end()), (10, 20));
        let page = spool.read(0, 100).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((page.text.as_str(), page.dropped), ("abcdefghij", 10));
    }

    #[test]
    fn pages_never_split_a_character() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let mut spool =
            Spool::create(dir.path(), "p1", 1 << 20).unwrap_or_else(|err| panic!("{err}"));
        spool.append("aé€b".as_bytes()).unwrap_or_else(|err| panic!("{err}"));
        let first = spool.read(0, 2).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((first.text.as_str(), first.next_offset), ("a", 1));
        let middle = spool.read(2, 4).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((middle.text.as_str(), middle.offset), ("€", 3));
    }
}
