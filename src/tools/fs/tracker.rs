//! What a session knows of the files it read or wrote, for the stale-write checks:
//! a stamp per file (length, mtime, content hash) and the session's record of them.
//! The session's [`Env`](crate::tools::Env) holds the record; nothing here looks a
//! path up.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use dashmap::DashMap;

/// A fast non-cryptographic hash of a file's content, for stale checks: it only has
/// to notice that a file changed between two looks by this process, not resist an
/// adversary (whoever can write the file can just write it). Four independent lanes
/// of eight bytes each with a multiply-rotate mix (independent, so the multiplies
/// overlap), then the tail and the length; stable for the life of the process.
pub fn content_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mix = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(K);
    let word = |chunk: &[u8]| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        u64::from_le_bytes(word)
    };
    let mut lanes = [0u64, 1, 2, 3];
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (lane, chunk) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            *lane = mix(*lane, word(chunk));
        }
    }
    let mut hash = lanes.iter().fold(0u64, |hash, &lane| mix(hash, lane));
    for chunk in blocks.remainder().chunks(8) {
        hash = mix(hash, word(chunk));
    }
    mix(hash, bytes.len() as u64)
}

/// What the session knew of a file when it last read or wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub modified: Option<SystemTime>,
    pub len: u64,
    /// [`content_hash`] of the bytes read or written. mtime alone misses a rewrite of
    /// the same length within one timestamp tick (coarse on many filesystems); the
    /// hash does not, and also forgives a `touch` that changed nothing.
    pub hash: Option<u64>,
}

impl FileStamp {
    /// Whether `current` shows the same content as `self`: same length, and the same
    /// hash when both have one, else the same mtime.
    pub fn matches(&self, current: &FileStamp) -> bool {
        if self.len != current.len {
            return false;
        }
        match (self.hash, current.hash) {
            (Some(seen), Some(now)) => seen == now,
            _ => self.modified == current.modified,
        }
    }
}

/// Per-session record of the files it has read (or written), keyed by the absolute
/// path inside the roots; write_file and edit_file compare against it.
#[derive(Debug, Default)]
pub struct FileTracker {
    seen: DashMap<PathBuf, FileStamp>,
}

impl FileTracker {
    pub fn record(&self, path: PathBuf, stamp: FileStamp) {
        self.seen.insert(path, stamp);
    }

    /// [`FileTracker::record`] by reference: a path seen before is updated in place
    /// (a file read again), a new one is copied in.
    pub fn record_at(&self, path: &Path, stamp: FileStamp) {
        match self.seen.get_mut(path) {
            Some(mut seen) => *seen = stamp,
            None => {
                self.seen.insert(path.to_path_buf(), stamp);
            }
        }
    }

    pub fn get(&self, path: &Path) -> Option<FileStamp> {
        self.seen.get(path).map(|entry| entry.value().clone())
    }

    pub fn forget(&self, path: &Path) {
        self.seen.remove(path);
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}
